/* codec.c: encoder and validating decoder of the wire format (wire.h, docs/wire-protocol.md).
 *
 * Hand-written rather than generated: the format is small, it has no dependency, payloads stay
 * in their own frames (zero-copy), and every bound is checked here where it can be read.
 * The decoder reads from the received frames through a bounds-checked reader: every read
 * checks the bytes left first, every count is checked against the bytes left divided by the
 * smallest encoding of one element before anything is allocated (so a huge count cannot
 * overflow count x size nor make us allocate more than the peer sent), and every string is
 * copied out NUL-terminated after checking it holds no NUL. Cost: O(body + payload frames
 * count); one allocation per string and per array.
 */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/wire.h"
#include "core/internal.h"
#include "wire/internal.h"

static const char *const type_names[DH_MSG_TYPE_MAX + 1] = {
    "type?", "HELLO", "HEARTBEAT", "REQUEST", "DISPATCH", "COMPLETE", "DELIVER", "ERROR", "GOODBYE",
};

const char *dh_msg_type_name(unsigned type)
{
    return type >= 1 && type <= DH_MSG_TYPE_MAX ? type_names[type] : type_names[0];
}

const char *dh__wire_tensor_check(const dh_tensor_t *t, uint64_t limit, uint64_t *nbytes)
{
    uint64_t elem = dh_dtype_size(t->dtype);
    if (elem == 0)
        return "dtype";
    if (t->ndim < 0 || t->ndim > DH_TENSOR_MAX_DIMS)
        return "ndim";
    uint64_t bytes = elem;
    for (int32_t i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || __builtin_mul_overflow(bytes, (uint64_t)t->shape[i], &bytes))
            return "shape";
    *nbytes = bytes;
    if (bytes == 0)
        return NULL; /* an empty tensor reads nothing, whatever its strides */
    /* The last byte any index reaches: elem + sum (shape[i] - 1) x strides[i] x elem. */
    uint64_t extent = elem;
    for (int32_t i = 0; i < t->ndim; i++) {
        if (t->strides[i] < 0)
            return "strides";
        uint64_t step;
        if (__builtin_mul_overflow((uint64_t)t->shape[i] - 1, (uint64_t)t->strides[i], &step) ||
            __builtin_mul_overflow(step, elem, &step) ||
            __builtin_add_overflow(extent, step, &extent))
            return "strides";
    }
    if (extent > (limit > bytes ? limit : bytes))
        return "strides";
    return NULL;
}

/* ---- encoder ---- */

/* Writes into p, or only counts when p is NULL (the sizing pass). */
typedef struct writer {
    uint8_t *p;
    size_t len;
    bool too_big; /* a string longer than UINT32_MAX */
} writer_t;

static void put_bytes(writer_t *w, const void *src, size_t n)
{
    if (w->p && n)
        memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void put_u64(writer_t *w, uint64_t v, int nbytes)
{
    uint8_t b[8];
    for (int i = 0; i < nbytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put_bytes(w, b, (size_t)nbytes);
}

#define put_u8(w, v) put_u64(w, (uint8_t)(v), 1)
#define put_u32(w, v) put_u64(w, (uint32_t)(v), 4)
#define put_i32(w, v) put_u64(w, (uint32_t)(int32_t)(v), 4)
#define put_i64(w, v) put_u64(w, (uint64_t)(int64_t)(v), 8)

static void put_f64(writer_t *w, double v)
{
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof bits);
    put_u64(w, bits, 8);
}

static void put_str(writer_t *w, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n > UINT32_MAX) {
        w->too_big = true;
        n = 0;
    }
    put_u32(w, n);
    put_bytes(w, s, n);
}

static void put_request(writer_t *w, const dh_msg_request_t *m)
{
    put_str(w, m->client_id);
    put_u64(w, m->seq, 8);
    put_u32(w, m->rank);
    put_i64(w, m->deadline_ns);
    put_str(w, m->delivery_node);
    put_u32(w, m->n_samples);
    for (uint32_t i = 0; i < m->n_samples; i++) {
        put_str(w, m->samples[i].id);
        put_u32(w, m->samples[i].frames);
        put_u32(w, m->samples[i].height);
        put_u32(w, m->samples[i].width);
        put_str(w, m->samples[i].uri);
        put_str(w, m->samples[i].key);
        put_f64(w, m->samples[i].cpu_s);
        put_u64(w, m->samples[i].in_bytes, 8);
        put_u64(w, m->samples[i].out_bytes, 8);
        put_i64(w, m->samples[i].tokens);
    }
}

/* One DELIVER tensor: name, dtype, ndim, location, shape, strides in bytes, the handle. */
static void put_tensor(writer_t *w, const dh_wire_tensor_t *wt)
{
    const dh_tensor_t *t = &wt->tensor;
    assert(t->ndim >= 0 && t->ndim <= DH_TENSOR_MAX_DIMS);
    uint64_t elem = dh_dtype_size(t->dtype);
    put_str(w, t->name);
    put_u8(w, t->dtype);
    put_u8(w, t->ndim);
    put_u8(w, wt->location);
    for (int32_t d = 0; d < t->ndim; d++)
        put_u64(w, (uint64_t)t->shape[d], 8);
    for (int32_t d = 0; d < t->ndim; d++) /* wraps for a misused stride: the peer refuses it */
        put_u64(w, (uint64_t)t->strides[d] * elem, 8);
    if (wt->location == DH_WIRE_LOC_SHM) {
        put_u64(w, wt->arena_id, 8);
        put_u64(w, wt->offset, 8);
        put_u64(w, wt->length, 8);
        put_u64(w, wt->generation, 8);
    }
}

static void put_body(writer_t *w, const dh_msg_t *msg)
{
    switch (msg->type) {
    case DH_MSG_HELLO:
        put_u8(w, msg->hello.role);
        put_str(w, msg->hello.node);
        put_u32(w, msg->hello.workers);
        put_u64(w, msg->hello.arena_bytes, 8);
        put_str(w, msg->hello.name);
        put_str(w, msg->hello.endpoint);
        put_str(w, msg->hello.shm_socket);
        put_u32(w, msg->hello.pid);
        put_u32(w, msg->hello.rank);
        break;
    case DH_MSG_HEARTBEAT: {
        const dh_msg_heartbeat_t *m = &msg->heartbeat;
        put_u32(w, m->workers);
        put_u32(w, m->queue_depth);
        put_f64(w, m->queue_work_s);
        put_f64(w, m->speed_factor);
        put_f64(w, m->recent_latency_s);
        put_u32(w, m->n_links);
        for (uint32_t i = 0; i < m->n_links; i++) {
            put_str(w, m->links[i].node);
            put_f64(w, m->links[i].bytes_per_s);
        }
        break;
    }
    case DH_MSG_REQUEST:
        put_request(w, &msg->request);
        break;
    case DH_MSG_DISPATCH:
        put_request(w, &msg->dispatch.request);
        put_str(w, msg->dispatch.server);
        put_str(w, msg->dispatch.target);
        put_str(w, msg->dispatch.target_endpoint);
        break;
    case DH_MSG_COMPLETE: {
        const dh_msg_complete_t *m = &msg->complete;
        put_str(w, m->client_id);
        put_u64(w, m->seq, 8);
        put_u32(w, m->n_samples);
        for (uint32_t i = 0; i < m->n_samples; i++) {
            put_i32(w, m->samples[i].status);
            put_str(w, m->samples[i].error);
        }
        put_f64(w, m->cpu_s);
        put_u64(w, m->bytes, 8);
        put_f64(w, m->queue_s);
        put_u8(w, m->delivered);
        break;
    }
    case DH_MSG_DELIVER: {
        const dh_msg_deliver_t *m = &msg->deliver;
        put_str(w, m->client_id);
        put_u64(w, m->seq, 8);
        put_u32(w, m->n_tensors);
        for (uint32_t i = 0; i < m->n_tensors; i++) {
            put_tensor(w, &m->tensors[i]);
        }
        put_u32(w, m->n_samples);
        for (uint32_t i = 0; i < m->n_samples; i++) {
            put_str(w, m->samples[i].id);
            put_i64(w, m->samples[i].tokens);
            put_i32(w, m->samples[i].status);
            put_str(w, m->samples[i].error);
        }
        put_u64(w, m->ready_ns, 8);
        put_str(w, m->server);
        break;
    }
    case DH_MSG_ERROR:
        put_i32(w, msg->error.code);
        put_str(w, msg->error.message);
        break;
    case DH_MSG_GOODBYE:
        break;
    default:
        assert(!"dh_wire_encode: unknown message type");
    }
}

int dh_wire_encode(const dh_msg_t *msg, uint8_t header[DH_WIRE_HEADER_SIZE], uint8_t **body,
                   size_t *body_len)
{
    assert(msg && header && body && body_len);
    assert(msg->type >= 1 && msg->type <= DH_MSG_TYPE_MAX);
    *body = NULL;
    *body_len = 0;
    writer_t w = {0};
    put_body(&w, msg); /* sizing pass */
    if (w.too_big || w.len > UINT32_MAX)
        return dh__set_error(DH_ERANGE, "%s: body of %zu bytes exceeds the 4 GiB limit",
                             dh_msg_type_name(msg->type), w.len);
    size_t len = w.len;
    uint8_t *buf = dh_malloc(len);
    if (!buf)
        return dh__set_error(DH_ENOMEM, "%s: out of memory for a %zu-byte body",
                             dh_msg_type_name(msg->type), len);
    w = (writer_t){.p = buf};
    put_body(&w, msg);
    assert(w.len == len);

    writer_t h = {.p = header};
    put_bytes(&h, DH_WIRE_MAGIC, 4);
    put_u64(&h, DH_WIRE_VERSION, 2);
    put_u64(&h, msg->type, 2);
    put_u32(&h, len);
    put_u64(&h, msg->sender_seq, 8);
    assert(h.len == DH_WIRE_HEADER_SIZE);
    *body = buf;
    *body_len = len;
    return 0;
}

/* ---- decoder ---- */

typedef struct reader {
    const uint8_t *p;
    size_t len, pos;
    const char *type; /* message type name, for messages */
    const char *elem; /* array being read ("samples"), or NULL */
    uint32_t index;   /* element of it */
} reader_t;

/* Records "TYPE: field 'elem[i].field' at offset N: why" and returns DH_EPARSE. */
__attribute__((format(printf, 3, 4))) static int fail(const reader_t *r, const char *field,
                                                      const char *fmt, ...)
{
    char why[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (r->elem)
        return dh__set_error(DH_EPARSE, "%s: field '%s[%u].%s' at offset %zu: %s", r->type, r->elem,
                             r->index, field, r->pos, why);
    return dh__set_error(DH_EPARSE, "%s: field '%s' at offset %zu: %s", r->type, field, r->pos,
                         why);
}

static int need(const reader_t *r, size_t n, const char *field)
{
    if (r->len - r->pos < n)
        return fail(r, field, "truncated (needs %zu bytes, %zu left)", n, r->len - r->pos);
    return 0;
}

static int get_uint(reader_t *r, const char *field, int nbytes, uint64_t *out)
{
    int rc = need(r, (size_t)nbytes, field);
    if (rc)
        return rc;
    uint64_t v = 0;
    for (int i = 0; i < nbytes; i++)
        v |= (uint64_t)r->p[r->pos + (size_t)i] << (8 * i);
    r->pos += (size_t)nbytes;
    *out = v;
    return 0;
}

static int get_u8(reader_t *r, const char *field, uint8_t *out)
{
    uint64_t v = 0;
    int rc = get_uint(r, field, 1, &v);
    *out = (uint8_t)v;
    return rc;
}

static int get_u32(reader_t *r, const char *field, uint32_t *out)
{
    uint64_t v = 0;
    int rc = get_uint(r, field, 4, &v);
    *out = (uint32_t)v;
    return rc;
}

static int get_u64(reader_t *r, const char *field, uint64_t *out)
{
    return get_uint(r, field, 8, out);
}

static int get_i32(reader_t *r, const char *field, int32_t *out)
{
    uint64_t v = 0;
    int rc = get_uint(r, field, 4, &v);
    uint32_t u = (uint32_t)v;
    memcpy(out, &u, sizeof *out);
    return rc;
}

static int get_i64(reader_t *r, const char *field, int64_t *out)
{
    uint64_t v = 0;
    int rc = get_uint(r, field, 8, &v);
    memcpy(out, &v, sizeof *out);
    return rc;
}

/* A double that must be finite and >= 0 (seconds, bytes per second, a speed factor):
 * a NaN or an infinity from a peer would poison the cost model. */
static int get_f64(reader_t *r, const char *field, double *out)
{
    uint64_t bits = 0;
    int rc = get_u64(r, field, &bits);
    if (rc)
        return rc;
    double v;
    memcpy(&v, &bits, sizeof v);
    if (!isfinite(v) || v < 0) {
        r->pos -= 8;
        return fail(r, field, "%g is not a finite number >= 0", v);
    }
    *out = v;
    return 0;
}

/* A u32 count of elements whose encoding takes at least min_size bytes each: refused when
 * the bytes left cannot hold that many, so count x size never overflows and we never
 * allocate more than the peer sent. */
static int get_count(reader_t *r, const char *field, size_t min_size, uint32_t *out)
{
    int rc = get_u32(r, field, out);
    if (rc)
        return rc;
    size_t left = r->len - r->pos;
    if (*out > left / min_size) {
        r->pos -= 4;
        return fail(r, field, "count %u needs at least %zu bytes x %u, %zu left", *out, min_size,
                    *out, left);
    }
    return 0;
}

/* A u32-length-prefixed string, copied out NUL-terminated (the caller's, dh_free). */
static int get_str(reader_t *r, const char *field, char **out)
{
    uint32_t n;
    int rc = get_u32(r, field, &n);
    if (rc)
        return rc;
    if (n > r->len - r->pos) {
        size_t left = r->len - r->pos;
        r->pos -= 4;
        return fail(r, field, "string length %u exceeds the %zu bytes left", n, left);
    }
    const uint8_t *s = r->p + r->pos;
    if (n && memchr(s, 0, n))
        return fail(r, field, "string holds a NUL byte");
    char *copy = dh_malloc((size_t)n + 1);
    if (!copy)
        return dh__set_error(DH_ENOMEM, "%s: out of memory for field '%s'", r->type, field);
    if (n)
        memcpy(copy, s, n);
    copy[n] = 0;
    r->pos += n;
    *out = copy;
    return 0;
}

/* Allocates a zeroed array of count elements (NULL for 0). */
static int get_array(reader_t *r, const char *field, uint32_t count, size_t size, void **out)
{
    *out = NULL;
    if (count == 0)
        return 0;
    *out = dh_calloc(count, size);
    if (!*out)
        return dh__set_error(DH_ENOMEM, "%s: out of memory for %u elements of '%s'", r->type, count,
                             field);
    return 0;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

/* Smallest encodings of array elements (a string is at least its 4-byte length). */
#define MIN_LINK_SIZE (4 + 8)
#define MIN_SAMPLE_SIZE (4 + 12 + 4 + 4 + 8 + 8 + 8 + 8)
#define MIN_RESULT_SIZE (4 + 8 + 4 + 4)
#define MIN_STATUS_SIZE (4 + 4)
#define MIN_TENSOR_SIZE (4 + 3)

static int get_hello(reader_t *r, dh_msg_hello_t *m)
{
    TRY(get_u8(r, "role", &m->role));
    if (m->role > DH_WIRE_ROLE_CLIENT) {
        r->pos -= 1;
        return fail(r, "role", "unknown role %u", m->role);
    }
    TRY(get_str(r, "node", &m->node));
    TRY(get_u32(r, "workers", &m->workers));
    TRY(get_u64(r, "arena_bytes", &m->arena_bytes));
    TRY(get_str(r, "name", &m->name));
    TRY(get_str(r, "endpoint", &m->endpoint));
    TRY(get_str(r, "shm_socket", &m->shm_socket));
    TRY(get_u32(r, "pid", &m->pid));
    return get_u32(r, "rank", &m->rank);
}

static int get_heartbeat(reader_t *r, dh_msg_heartbeat_t *m)
{
    TRY(get_u32(r, "workers", &m->workers));
    TRY(get_u32(r, "queue_depth", &m->queue_depth));
    TRY(get_f64(r, "queue_work_s", &m->queue_work_s));
    TRY(get_f64(r, "speed_factor", &m->speed_factor));
    TRY(get_f64(r, "recent_latency_s", &m->recent_latency_s));
    uint32_t n;
    TRY(get_count(r, "n_links", MIN_LINK_SIZE, &n));
    TRY(get_array(r, "links", n, sizeof *m->links, (void **)&m->links));
    m->n_links = n;
    r->elem = "links";
    for (r->index = 0; r->index < n; r->index++) {
        TRY(get_str(r, "node", &m->links[r->index].node));
        TRY(get_f64(r, "bytes_per_s", &m->links[r->index].bytes_per_s));
    }
    r->elem = NULL;
    return 0;
}

static int get_request(reader_t *r, dh_msg_request_t *m)
{
    TRY(get_str(r, "client_id", &m->client_id));
    TRY(get_u64(r, "seq", &m->seq));
    TRY(get_u32(r, "rank", &m->rank));
    TRY(get_i64(r, "deadline_ns", &m->deadline_ns));
    TRY(get_str(r, "delivery_node", &m->delivery_node));
    uint32_t n;
    TRY(get_count(r, "n_samples", MIN_SAMPLE_SIZE, &n));
    TRY(get_array(r, "samples", n, sizeof *m->samples, (void **)&m->samples));
    m->n_samples = n;
    r->elem = "samples";
    for (r->index = 0; r->index < n; r->index++) {
        dh_wire_sample_t *s = &m->samples[r->index];
        TRY(get_str(r, "id", &s->id));
        TRY(get_u32(r, "frames", &s->frames));
        TRY(get_u32(r, "height", &s->height));
        TRY(get_u32(r, "width", &s->width));
        TRY(get_str(r, "uri", &s->uri));
        TRY(get_str(r, "key", &s->key));
        TRY(get_f64(r, "cpu_s", &s->cpu_s));
        TRY(get_u64(r, "in_bytes", &s->in_bytes));
        TRY(get_u64(r, "out_bytes", &s->out_bytes));
        TRY(get_i64(r, "tokens", &s->tokens));
        if (s->tokens < 0) {
            r->pos -= 8;
            return fail(r, "tokens", "%lld is negative", (long long)s->tokens);
        }
    }
    r->elem = NULL;
    return 0;
}

static int get_dispatch(reader_t *r, dh_msg_dispatch_t *m)
{
    TRY(get_request(r, &m->request));
    TRY(get_str(r, "server", &m->server));
    TRY(get_str(r, "target", &m->target));
    return get_str(r, "target_endpoint", &m->target_endpoint);
}

static int get_complete(reader_t *r, dh_msg_complete_t *m)
{
    TRY(get_str(r, "client_id", &m->client_id));
    TRY(get_u64(r, "seq", &m->seq));
    uint32_t n;
    TRY(get_count(r, "n_samples", MIN_STATUS_SIZE, &n));
    TRY(get_array(r, "samples", n, sizeof *m->samples, (void **)&m->samples));
    m->n_samples = n;
    r->elem = "samples";
    for (r->index = 0; r->index < n; r->index++) {
        dh_wire_sample_status_t *s = &m->samples[r->index];
        TRY(get_i32(r, "status", &s->status));
        if (s->status > 0) {
            r->pos -= 4;
            return fail(r, "status", "%d is not 0 or a negative error code", s->status);
        }
        TRY(get_str(r, "error", &s->error));
    }
    r->elem = NULL;
    TRY(get_f64(r, "cpu_s", &m->cpu_s));
    TRY(get_u64(r, "bytes", &m->bytes));
    TRY(get_f64(r, "queue_s", &m->queue_s));
    TRY(get_u8(r, "delivered", &m->delivered));
    if (m->delivered > 1) {
        r->pos -= 1;
        return fail(r, "delivered", "%u is not 0 or 1", m->delivered);
    }
    return 0;
}

static int get_tensor(reader_t *r, dh_wire_tensor_t *wt)
{
    dh_tensor_t *t = &wt->tensor;
    char *name = NULL;
    size_t at = r->pos;
    TRY(get_str(r, "name", &name));
    size_t name_len = strlen(name);
    if (name_len >= sizeof t->name) {
        dh_free(name);
        r->pos = at;
        return fail(r, "name", "%zu bytes, at most %zu", name_len, sizeof t->name - 1);
    }
    memcpy(t->name, name, name_len + 1);
    dh_free(name);
    uint8_t dtype, ndim;
    at = r->pos;
    TRY(get_u8(r, "dtype", &dtype));
    uint64_t elem = dh_dtype_size(dtype);
    if (elem == 0) {
        r->pos = at;
        return fail(r, "dtype", "unknown dtype %u", dtype);
    }
    t->dtype = (dh_dtype_t)dtype;
    TRY(get_u8(r, "ndim", &ndim));
    if (ndim > DH_TENSOR_MAX_DIMS) {
        r->pos -= 1;
        return fail(r, "ndim", "%u dimensions, at most %d", ndim, DH_TENSOR_MAX_DIMS);
    }
    t->ndim = ndim;
    TRY(get_u8(r, "location", &wt->location));
    if (wt->location > DH_WIRE_LOC_SHM) {
        r->pos -= 1;
        return fail(r, "location", "unknown location %u", wt->location);
    }
    for (unsigned d = 0; d < ndim; d++) {
        uint64_t extent;
        TRY(get_u64(r, "shape", &extent));
        if (extent > INT64_MAX) {
            r->pos -= 8;
            return fail(r, "shape", "%llu elements overflow", (unsigned long long)extent);
        }
        t->shape[d] = (int64_t)extent;
    }
    for (unsigned d = 0; d < ndim; d++) {
        int64_t bytes;
        TRY(get_i64(r, "strides", &bytes));
        if (bytes < 0 || (uint64_t)bytes % elem != 0) {
            r->pos -= 8;
            return fail(r, "strides", "%lld bytes is not a non-negative multiple of %llu",
                        (long long)bytes, (unsigned long long)elem);
        }
        t->strides[d] = bytes / (int64_t)elem;
    }
    if (wt->location == DH_WIRE_LOC_SHM) {
        TRY(get_u64(r, "arena_id", &wt->arena_id));
        TRY(get_u64(r, "offset", &wt->offset));
        TRY(get_u64(r, "length", &wt->length));
        TRY(get_u64(r, "generation", &wt->generation));
        uint64_t end;
        if (__builtin_add_overflow(wt->offset, wt->length, &end)) {
            r->pos -= 16;
            return fail(r, "length", "offset %llu + length %llu overflows",
                        (unsigned long long)wt->offset, (unsigned long long)wt->length);
        }
    }
    uint64_t nbytes;
    const char *bad =
        dh__wire_tensor_check(t, wt->location == DH_WIRE_LOC_SHM ? wt->length : 0, &nbytes);
    if (bad)
        return fail(r, bad, "shape and strides do not fit the tensor's bytes");
    if (wt->location == DH_WIRE_LOC_SHM && nbytes > wt->length)
        return fail(r, "length", "shared-memory length %llu < the tensor's %llu bytes",
                    (unsigned long long)wt->length, (unsigned long long)nbytes);
    t->nbytes = (size_t)nbytes; /* FRAME: checked against the frame below */
    return 0;
}

static int get_deliver(reader_t *r, dh_msg_deliver_t *m, const dh_wire_frame_t *payloads,
                       size_t n_payloads)
{
    TRY(get_str(r, "client_id", &m->client_id));
    TRY(get_u64(r, "seq", &m->seq));
    uint32_t n;
    TRY(get_count(r, "n_tensors", MIN_TENSOR_SIZE, &n));
    TRY(get_array(r, "tensors", n, sizeof *m->tensors, (void **)&m->tensors));
    m->n_tensors = n;
    r->elem = "tensors";
    size_t frame = 0;
    for (r->index = 0; r->index < n; r->index++) {
        dh_wire_tensor_t *t = &m->tensors[r->index];
        TRY(get_tensor(r, t));
        if (t->location != DH_WIRE_LOC_FRAME)
            continue;
        if (frame >= n_payloads)
            return fail(r, "location", "names payload frame %zu, the message has %zu", frame,
                        n_payloads);
        if ((uint64_t)payloads[frame].size != (uint64_t)t->tensor.nbytes)
            return fail(r, "shape", "tensor of %zu bytes, payload frame %zu has %zu",
                        t->tensor.nbytes, frame, payloads[frame].size);
        t->tensor.data = (void *)payloads[frame].data; /* borrowed, read-only (wire.h) */
        frame++;
    }
    r->elem = NULL;
    if (frame != n_payloads)
        return dh__set_error(DH_EPARSE, "%s: %zu payload frames for %zu FRAME tensors", r->type,
                             n_payloads, frame);
    TRY(get_count(r, "n_samples", MIN_RESULT_SIZE, &n));
    TRY(get_array(r, "samples", n, sizeof *m->samples, (void **)&m->samples));
    m->n_samples = n;
    r->elem = "samples";
    for (r->index = 0; r->index < n; r->index++) {
        dh_wire_sample_result_t *s = &m->samples[r->index];
        TRY(get_str(r, "id", &s->id));
        TRY(get_i64(r, "tokens", &s->tokens));
        if (s->tokens < 0) {
            r->pos -= 8;
            return fail(r, "tokens", "%lld is negative", (long long)s->tokens);
        }
        TRY(get_i32(r, "status", &s->status));
        if (s->status > 0) {
            r->pos -= 4;
            return fail(r, "status", "%d is not 0 or a negative error code", s->status);
        }
        TRY(get_str(r, "error", &s->error));
    }
    r->elem = NULL;
    TRY(get_u64(r, "ready_ns", &m->ready_ns));
    return get_str(r, "server", &m->server);
}

int dh_wire_decode_header(const void *data, size_t size, dh_wire_header_t *out)
{
    if (size != DH_WIRE_HEADER_SIZE)
        return dh__set_error(DH_EPARSE, "header frame of %zu bytes, expected %d", size,
                             DH_WIRE_HEADER_SIZE);
    const uint8_t *p = data;
    if (memcmp(p, DH_WIRE_MAGIC, 4) != 0)
        return dh__set_error(DH_EPARSE,
                             "not a DataHelix message: magic %02x %02x %02x %02x, expected \"%s\"",
                             p[0], p[1], p[2], p[3], DH_WIRE_MAGIC);
    reader_t r = {.p = p, .len = size, .pos = 4, .type = "header"};
    uint64_t version = 0, type = 0, body_len = 0;
    get_uint(&r, "version", 2, &version);
    get_uint(&r, "type", 2, &type);
    get_uint(&r, "body_len", 4, &body_len);
    get_uint(&r, "sender_seq", 8, &out->sender_seq);
    if (version != DH_WIRE_VERSION)
        return dh__set_error(DH_EPARSE,
                             "peer speaks wire protocol version %u, this build speaks version %d",
                             (unsigned)version, DH_WIRE_VERSION);
    if (type < 1 || type > DH_MSG_TYPE_MAX)
        return dh__set_error(DH_EPARSE, "header: unknown message type %u", (unsigned)type);
    out->version = (uint16_t)version;
    out->type = (uint16_t)type;
    out->body_len = (uint32_t)body_len;
    return 0;
}

int dh_wire_decode(const void *header, size_t header_size, const void *body, size_t body_size,
                   const dh_wire_frame_t *payloads, size_t n_payloads, dh_msg_t *out)
{
    assert(out && (payloads || n_payloads == 0));
    memset(out, 0, sizeof *out);
    dh_wire_header_t h;
    int rc = dh_wire_decode_header(header, header_size, &h);
    if (rc)
        return rc;
    const char *name = dh_msg_type_name(h.type);
    if (h.body_len != body_size)
        return dh__set_error(DH_EPARSE, "%s: header says the body is %u bytes, the frame has %zu",
                             name, h.body_len, body_size);
    if (n_payloads && h.type != DH_MSG_DELIVER)
        return dh__set_error(DH_EPARSE, "%s: carries %zu payload frames; only DELIVER may", name,
                             n_payloads);
    if (n_payloads > DH_WIRE_MAX_PAYLOADS)
        return dh__set_error(DH_EPARSE, "%s: %zu payload frames, at most %d", name, n_payloads,
                             DH_WIRE_MAX_PAYLOADS);
    out->type = h.type;
    out->sender_seq = h.sender_seq;
    reader_t r = {.p = body, .len = body_size, .type = name};
    switch (h.type) {
    case DH_MSG_HELLO:
        rc = get_hello(&r, &out->hello);
        break;
    case DH_MSG_HEARTBEAT:
        rc = get_heartbeat(&r, &out->heartbeat);
        break;
    case DH_MSG_REQUEST:
        rc = get_request(&r, &out->request);
        break;
    case DH_MSG_DISPATCH:
        rc = get_dispatch(&r, &out->dispatch);
        break;
    case DH_MSG_COMPLETE:
        rc = get_complete(&r, &out->complete);
        break;
    case DH_MSG_DELIVER:
        rc = get_deliver(&r, &out->deliver, payloads, n_payloads);
        break;
    case DH_MSG_ERROR:
        rc = get_i32(&r, "code", &out->error.code);
        if (rc == 0 && out->error.code >= 0) {
            r.pos -= 4;
            rc = fail(&r, "code", "%d is not a negative error code", out->error.code);
        }
        if (rc == 0)
            rc = get_str(&r, "message", &out->error.message);
        break;
    case DH_MSG_GOODBYE:
        break;
    }
    if (rc == 0 && r.pos != r.len)
        rc = dh__set_error(DH_EPARSE, "%s: %zu trailing bytes after the last field at offset %zu",
                           name, r.len - r.pos, r.pos);
    if (rc)
        dh_msg_clear(out);
    return rc;
}

static void clear_request(dh_msg_request_t *m)
{
    dh_free(m->client_id);
    dh_free(m->delivery_node);
    for (uint32_t i = 0; i < m->n_samples && m->samples; i++) {
        dh_free(m->samples[i].id);
        dh_free(m->samples[i].uri);
        dh_free(m->samples[i].key);
    }
    dh_free(m->samples);
}

void dh_msg_clear(dh_msg_t *msg)
{
    if (!msg)
        return;
    switch (msg->type) {
    case DH_MSG_HELLO:
        dh_free(msg->hello.node);
        dh_free(msg->hello.name);
        dh_free(msg->hello.endpoint);
        dh_free(msg->hello.shm_socket);
        break;
    case DH_MSG_HEARTBEAT:
        for (uint32_t i = 0; i < msg->heartbeat.n_links && msg->heartbeat.links; i++)
            dh_free(msg->heartbeat.links[i].node);
        dh_free(msg->heartbeat.links);
        break;
    case DH_MSG_REQUEST:
        clear_request(&msg->request);
        break;
    case DH_MSG_DISPATCH:
        clear_request(&msg->dispatch.request);
        dh_free(msg->dispatch.server);
        dh_free(msg->dispatch.target);
        dh_free(msg->dispatch.target_endpoint);
        break;
    case DH_MSG_COMPLETE:
        dh_free(msg->complete.client_id);
        for (uint32_t i = 0; i < msg->complete.n_samples && msg->complete.samples; i++)
            dh_free(msg->complete.samples[i].error);
        dh_free(msg->complete.samples);
        break;
    case DH_MSG_DELIVER:
        dh_free(msg->deliver.client_id);
        dh_free(msg->deliver.tensors); /* tensor names are inline (tensor.h) */
        for (uint32_t i = 0; i < msg->deliver.n_samples && msg->deliver.samples; i++) {
            dh_free(msg->deliver.samples[i].id);
            dh_free(msg->deliver.samples[i].error);
        }
        dh_free(msg->deliver.samples);
        dh_free(msg->deliver.server);
        break;
    case DH_MSG_ERROR:
        dh_free(msg->error.message);
        break;
    default:
        break;
    }
    memset(msg, 0, sizeof *msg);
}

int dh_wire_encode_packet(const dh_msg_t *msg, uint8_t **buf, size_t *len)
{
    assert(msg && buf && len);
    *buf = NULL;
    *len = 0;
    if (msg->type == DH_MSG_DELIVER)
        for (uint32_t i = 0; i < msg->deliver.n_tensors; i++)
            if (msg->deliver.tensors[i].location == DH_WIRE_LOC_FRAME)
                return dh__set_error(DH_EINVAL,
                                     "DELIVER: tensor %u is a payload frame; a packet carries "
                                     "shared-memory handles only",
                                     i);
    uint8_t header[DH_WIRE_HEADER_SIZE];
    uint8_t *body = NULL;
    size_t body_len = 0;
    int rc = dh_wire_encode(msg, header, &body, &body_len);
    if (rc)
        return rc;
    uint8_t *out = dh_malloc(DH_WIRE_HEADER_SIZE + body_len);
    if (!out) {
        dh_free(body);
        return dh__set_error(DH_ENOMEM, "%s: out of memory for a %zu-byte packet",
                             dh_msg_type_name(msg->type), DH_WIRE_HEADER_SIZE + body_len);
    }
    memcpy(out, header, DH_WIRE_HEADER_SIZE);
    if (body_len)
        memcpy(out + DH_WIRE_HEADER_SIZE, body, body_len);
    dh_free(body);
    dh__wire_tsan_release(); /* the packet goes to another thread through the kernel */
    *buf = out;
    *len = DH_WIRE_HEADER_SIZE + body_len;
    return 0;
}

int dh_wire_decode_packet(const void *buf, size_t len, dh_msg_t *out)
{
    assert(out && (buf || len == 0));
    memset(out, 0, sizeof *out);
    if (len < DH_WIRE_HEADER_SIZE)
        return dh__set_error(DH_EPARSE, "packet: %zu bytes, shorter than the %d-byte header", len,
                             DH_WIRE_HEADER_SIZE);
    dh__wire_tsan_acquire();
    const uint8_t *p = buf;
    return dh_wire_decode(p, DH_WIRE_HEADER_SIZE, p + DH_WIRE_HEADER_SIZE,
                          len - DH_WIRE_HEADER_SIZE, NULL, 0, out);
}
