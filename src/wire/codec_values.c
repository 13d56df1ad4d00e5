/* codec_values.c: the wire format's values, one at a time (docs/wire-protocol.md): how an
 * integer, a float, a string, an array's count and a DELIVER tensor are written, and read
 * back through the bounds-checked reader; codec.c builds every message out of these.
 *
 * Every read checks the bytes left first, every count is checked against the bytes left
 * divided by the smallest encoding of one element before anything is allocated (so a huge
 * count cannot overflow count x size nor make us allocate more than the peer sent), and
 * every string is copied out NUL-terminated after checking it holds no NUL. A refused value
 * names its message, its field (and array element) and its offset. Cost: O(bytes read);
 * one allocation per string and per array. Shared with codec.c through codec_internal.h.
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
#include "wire/codec_internal.h"
#include "wire/internal.h"

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

/* ---- the writer ---- */

void dh__wire_put_bytes(dh__wire_writer_t *w, const void *src, size_t n)
{
    if (w->p && n)
        memcpy(w->p + w->len, src, n);
    w->len += n;
}

void dh__wire_put_u64(dh__wire_writer_t *w, uint64_t v, int nbytes)
{
    uint8_t b[8];
    for (int i = 0; i < nbytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    dh__wire_put_bytes(w, b, (size_t)nbytes);
}

void dh__wire_put_f64(dh__wire_writer_t *w, double v)
{
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof bits);
    dh__wire_put_u64(w, bits, 8);
}

void dh__wire_put_str(dh__wire_writer_t *w, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n > UINT32_MAX) {
        w->too_big = true;
        n = 0;
    }
    dh__wire_put_u32(w, n);
    dh__wire_put_bytes(w, s, n);
}

/* One DELIVER tensor: name, dtype, ndim, location, shape, strides in bytes, the handle. */
void dh__wire_put_tensor(dh__wire_writer_t *w, const dh_wire_tensor_t *wt)
{
    const dh_tensor_t *t = &wt->tensor;
    assert(t->ndim >= 0 && t->ndim <= DH_TENSOR_MAX_DIMS);
    uint64_t elem = dh_dtype_size(t->dtype);
    dh__wire_put_str(w, t->name);
    dh__wire_put_u8(w, t->dtype);
    dh__wire_put_u8(w, t->ndim);
    dh__wire_put_u8(w, wt->location);
    for (int32_t d = 0; d < t->ndim; d++)
        dh__wire_put_u64(w, (uint64_t)t->shape[d], 8);
    for (int32_t d = 0; d < t->ndim; d++) /* wraps for a misused stride: the peer refuses it */
        dh__wire_put_u64(w, (uint64_t)t->strides[d] * elem, 8);
    if (wt->location == DH_WIRE_LOC_SHM) {
        dh__wire_put_u64(w, wt->arena_id, 8);
        dh__wire_put_u64(w, wt->offset, 8);
        dh__wire_put_u64(w, wt->length, 8);
        dh__wire_put_u64(w, wt->generation, 8);
    }
}

/* ---- the reader ---- */

/* Records "TYPE: field 'elem[i].field' at offset N: why" and returns DH_EPARSE. */
__attribute__((format(printf, 3, 4))) static int fail(const dh__wire_reader_t *r, const char *field,
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

/* Steps back over the `width` bytes just read, so the offset names the field, and fails. */
__attribute__((format(printf, 4, 5))) static int refuse(dh__wire_reader_t *r, size_t width,
                                                        const char *field, const char *fmt, ...)
{
    char why[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    r->pos -= width;
    return fail(r, field, "%s", why);
}

static int need(const dh__wire_reader_t *r, size_t n, const char *field)
{
    if (r->len - r->pos < n)
        return fail(r, field, "truncated (needs %zu bytes, %zu left)", n, r->len - r->pos);
    return 0;
}

int dh__wire_get_uint(dh__wire_reader_t *r, const char *field, int nbytes, uint64_t *out)
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

int dh__wire_get_u8(dh__wire_reader_t *r, const char *field, uint8_t *out)
{
    uint64_t v = 0;
    int rc = dh__wire_get_uint(r, field, 1, &v);
    *out = (uint8_t)v;
    return rc;
}

int dh__wire_get_u32(dh__wire_reader_t *r, const char *field, uint32_t *out)
{
    uint64_t v = 0;
    int rc = dh__wire_get_uint(r, field, 4, &v);
    *out = (uint32_t)v;
    return rc;
}

int dh__wire_get_u64(dh__wire_reader_t *r, const char *field, uint64_t *out)
{
    return dh__wire_get_uint(r, field, 8, out);
}

static int get_i32(dh__wire_reader_t *r, const char *field, int32_t *out)
{
    uint64_t v = 0;
    int rc = dh__wire_get_uint(r, field, 4, &v);
    uint32_t u = (uint32_t)v;
    memcpy(out, &u, sizeof *out);
    return rc;
}

int dh__wire_get_i64(dh__wire_reader_t *r, const char *field, int64_t *out)
{
    uint64_t v = 0;
    int rc = dh__wire_get_uint(r, field, 8, &v);
    memcpy(out, &v, sizeof *out);
    return rc;
}

/* A double that must be finite and >= 0 (seconds, bytes per second, a speed factor):
 * a NaN or an infinity from a peer would poison the cost model. */
int dh__wire_get_f64(dh__wire_reader_t *r, const char *field, double *out)
{
    uint64_t bits = 0;
    int rc = dh__wire_get_u64(r, field, &bits);
    if (rc)
        return rc;
    double v;
    memcpy(&v, &bits, sizeof v);
    if (!isfinite(v) || v < 0)
        return refuse(r, 8, field, "%g is not a finite number >= 0", v);
    *out = v;
    return 0;
}

/* A double that must be finite, of any sign (a feature of a user's feature function). */
int dh__wire_get_finite(dh__wire_reader_t *r, const char *field, double *out)
{
    uint64_t bits = 0;
    int rc = dh__wire_get_u64(r, field, &bits);
    if (rc)
        return rc;
    double v;
    memcpy(&v, &bits, sizeof v);
    if (!isfinite(v))
        return refuse(r, 8, field, "%g is not a finite number", v);
    *out = v;
    return 0;
}

/* The checked integers: a value outside the field's range is refused. */
int dh__wire_get_rbkind(dh__wire_reader_t *r, const char *field, uint8_t *out)
{
    int rc = dh__wire_get_u8(r, field, out);
    return (rc || *out <= DH_RB_SEND) ? rc : refuse(r, 1, field, "unknown REBALANCE kind %u", *out);
}

int dh__wire_get_role(dh__wire_reader_t *r, const char *field, uint8_t *out)
{
    int rc = dh__wire_get_u8(r, field, out);
    return (rc || *out <= DH_WIRE_ROLE_CLIENT) ? rc : refuse(r, 1, field, "unknown role %u", *out);
}

int dh__wire_get_flag(dh__wire_reader_t *r, const char *field, uint8_t *out)
{
    int rc = dh__wire_get_u8(r, field, out);
    return (rc || *out <= 1) ? rc : refuse(r, 1, field, "%u is not 0 or 1", *out);
}

int dh__wire_get_status(dh__wire_reader_t *r, const char *field, int32_t *out)
{
    int rc = get_i32(r, field, out);
    return (rc || *out <= 0) ? rc
                             : refuse(r, 4, field, "%d is not 0 or a negative error code", *out);
}

int dh__wire_get_errcode(dh__wire_reader_t *r, const char *field, int32_t *out)
{
    int rc = get_i32(r, field, out);
    return (rc || *out < 0) ? rc : refuse(r, 4, field, "%d is not a negative error code", *out);
}

int dh__wire_get_tokens(dh__wire_reader_t *r, const char *field, int64_t *out)
{
    int rc = dh__wire_get_i64(r, field, out);
    return (rc || *out >= 0) ? rc : refuse(r, 8, field, "%lld is negative", (long long)*out);
}

/* A u32 count of elements whose encoding takes at least min_size bytes each: refused when
 * the bytes left cannot hold that many, so count x size never overflows and we never
 * allocate more than the peer sent. */
static int get_count(dh__wire_reader_t *r, const char *field, size_t min_size, uint32_t *out)
{
    int rc = dh__wire_get_u32(r, field, out);
    if (rc)
        return rc;
    size_t left = r->len - r->pos;
    if (*out > left / min_size)
        return refuse(r, 4, field, "count %u needs at least %zu bytes x %u, %zu left", *out,
                      min_size, *out, left);
    return 0;
}

/* A u32-length-prefixed string, copied out NUL-terminated (the caller's, dh_free). */
int dh__wire_get_str(dh__wire_reader_t *r, const char *field, char **out)
{
    uint32_t n;
    int rc = dh__wire_get_u32(r, field, &n);
    if (rc)
        return rc;
    if (n > r->len - r->pos)
        return refuse(r, 4, field, "string length %u exceeds the %zu bytes left", n,
                      r->len - r->pos);
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

/* An array's count (count_field) and a zeroed allocation of that many elements of `size`
 * bytes, at least min_size each on the wire (NULL for 0). *n is set once *out holds them. */
int dh__wire_get_array(dh__wire_reader_t *r, const char *count_field, const char *field,
                       size_t min_size, size_t size, uint32_t *n, void **out)
{
    uint32_t count;
    TRY(get_count(r, count_field, min_size, &count));
    *out = NULL;
    if (count && !(*out = dh_calloc(count, size)))
        return dh__set_error(DH_ENOMEM, "%s: out of memory for %u elements of '%s'", r->type, count,
                             field);
    *n = count;
    return 0;
}

static int get_tensor(dh__wire_reader_t *r, dh_wire_tensor_t *wt)
{
    dh_tensor_t *t = &wt->tensor;
    char *name = NULL;
    size_t at = r->pos;
    TRY(dh__wire_get_str(r, "name", &name));
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
    TRY(dh__wire_get_u8(r, "dtype", &dtype));
    uint64_t elem = dh_dtype_size(dtype);
    if (elem == 0) {
        r->pos = at;
        return fail(r, "dtype", "unknown dtype %u", dtype);
    }
    t->dtype = (dh_dtype_t)dtype;
    TRY(dh__wire_get_u8(r, "ndim", &ndim));
    if (ndim > DH_TENSOR_MAX_DIMS) {
        r->pos -= 1;
        return fail(r, "ndim", "%u dimensions, at most %d", ndim, DH_TENSOR_MAX_DIMS);
    }
    t->ndim = ndim;
    TRY(dh__wire_get_u8(r, "location", &wt->location));
    if (wt->location > DH_WIRE_LOC_SHM) {
        r->pos -= 1;
        return fail(r, "location", "unknown location %u", wt->location);
    }
    for (unsigned d = 0; d < ndim; d++) {
        uint64_t extent;
        TRY(dh__wire_get_u64(r, "shape", &extent));
        if (extent > INT64_MAX) {
            r->pos -= 8;
            return fail(r, "shape", "%llu elements overflow", (unsigned long long)extent);
        }
        t->shape[d] = (int64_t)extent;
    }
    for (unsigned d = 0; d < ndim; d++) {
        int64_t bytes;
        TRY(dh__wire_get_i64(r, "strides", &bytes));
        if (bytes < 0 || (uint64_t)bytes % elem != 0) {
            r->pos -= 8;
            return fail(r, "strides", "%lld bytes is not a non-negative multiple of %llu",
                        (long long)bytes, (unsigned long long)elem);
        }
        t->strides[d] = bytes / (int64_t)elem;
    }
    if (wt->location == DH_WIRE_LOC_SHM) {
        TRY(dh__wire_get_u64(r, "arena_id", &wt->arena_id));
        TRY(dh__wire_get_u64(r, "offset", &wt->offset));
        TRY(dh__wire_get_u64(r, "length", &wt->length));
        TRY(dh__wire_get_u64(r, "generation", &wt->generation));
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

/* A TENSORS element: the tensor, and for a FRAME one the next payload frame, which must hold
 * exactly its bytes (the data is borrowed from it). */
int dh__wire_get_frame_tensor(dh__wire_reader_t *r, dh_wire_tensor_t *t)
{
    TRY(get_tensor(r, t));
    if (t->location != DH_WIRE_LOC_FRAME)
        return 0;
    if (r->frame >= r->n_payloads)
        return fail(r, "location", "names payload frame %zu, the message has %zu", r->frame,
                    r->n_payloads);
    if ((uint64_t)r->payloads[r->frame].size != (uint64_t)t->tensor.nbytes)
        return fail(r, "shape", "tensor of %zu bytes, payload frame %zu has %zu", t->tensor.nbytes,
                    r->frame, r->payloads[r->frame].size);
    t->tensor.data = (void *)r->payloads[r->frame++].data; /* borrowed, read-only (wire.h) */
    return 0;
}

/* After the tensors: every payload frame was taken by one. */
int dh__wire_all_frames_taken(const dh__wire_reader_t *r)
{
    if (r->frame != r->n_payloads)
        return dh__set_error(DH_EPARSE, "%s: %zu payload frames for %zu FRAME tensors", r->type,
                             r->n_payloads, r->frame);
    return 0;
}
