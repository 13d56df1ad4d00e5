/* reader.c: an open remote object, or a byte range of one (a tar member), read by position
 * (remote_lib.h). Reads are served from a few windows of whole blocks; a miss fetches the
 * blocks that hold the read, more while the reads run on from where the last ended (the
 * read-ahead doubles per fetch, from one block up to DH_REMOTE_READAHEAD_MAX, and drops back
 * to one block after a seek), never past the block that holds the range's last byte. Every
 * fetch goes through the installed fetch function at block-aligned object offsets, so a
 * cache in front of it sees whole blocks, shared by the members of one shard.
 *
 * Cost: a clip read from start to end costs about log2(size / block) requests; the bytes
 * fetched beyond those read are at most a block at each end of the range, plus the
 * read-ahead past the reader's last read. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/remote_internal.h"

/* The windows a file keeps, up to HELD_MAX bytes in all: an MP4 written without faststart
 * is read at its start, then at its index at the end, then from its start again, and its
 * index (at the end) once more when the reads get there; none of it is fetched twice while
 * the clip's bytes fit. */
#define WINDOWS 16
#define HELD_MAX ((size_t)4 << 20)

typedef struct window {
    uint8_t *data; /* whole blocks of the object from off */
    size_t cap, len;
    int64_t off;
    uint64_t used; /* when last read from (the file's tick): the least recent is refilled */
} window_t;

struct dh__remote_file {
    char *url;
    int64_t start, end;  /* the range of the object read; end -1: to the object's end */
    int64_t object_size; /* -1 until a fetch says */
    dh__remote_interrupt_t interrupt;
    dh__remote_fetch_fn fetch;
    void *fetch_ctx;
    window_t windows[WINDOWS];
    uint64_t tick;
    int64_t next_pos; /* object offset right after the window last read: sequential reads */
    size_t readahead; /* bytes of the next fetch, a multiple of DH_REMOTE_BLOCK */
    uint64_t bytes_read, bytes_fetched;
    uint64_t
        prefix; /* bytes of the range read contiguously from its start (read-ahead learns it) */
};

static int http_fetch(void *ctx, const char *url, int64_t offset, size_t len, void *buf,
                      size_t *got, int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    (void)ctx;
    return dh__http_get_range(url, offset, len, buf, got, total, interrupt);
}

/* Atomic: a DataServer installs the cache's fetch while another's threads may open files
 * (a file keeps the pair it opened with). The context is published before the function. */
static _Atomic(dh__remote_fetch_fn) fetch_fn = http_fetch;
static _Atomic(void *) fetch_ctx;

void dh__remote_set_fetch(dh__remote_fetch_fn fn, void *ctx)
{
    atomic_store_explicit(&fetch_ctx, fn ? ctx : NULL, memory_order_release);
    atomic_store_explicit(&fetch_fn, fn ? fn : http_fetch, memory_order_release);
}

int dh__remote_file_open(dh__remote_file_t **out, const char *url, int64_t start, int64_t end)
{
    *out = NULL;
    char shown[512];
    if (dh__url_scheme(url) == DH_URL_NONE)
        return dh__set_error(DH_EINVAL, "%s: not an http://, https:// or s3:// URL",
                             dh__url_redact(url, shown, sizeof shown));
    if (start < 0 || (end >= 0 && end <= start))
        return dh__set_error(DH_EINVAL, "%s: bad byte range [%" PRId64 ", %" PRId64 ")",
                             dh__url_redact(url, shown, sizeof shown), start, end);
    dh__remote_file_t *f = dh_calloc(1, sizeof *f);
    size_t n = strlen(url) + 1;
    char *copy = dh_malloc(n);
    if (!f || !copy) {
        dh_free(f);
        dh_free(copy);
        return dh__set_error(DH_ENOMEM, "%s: out of memory",
                             dh__url_redact(url, shown, sizeof shown));
    }
    f->url = memcpy(copy, url, n);
    f->start = start;
    f->end = end;
    f->object_size = -1;
    f->fetch = atomic_load_explicit(&fetch_fn, memory_order_acquire);
    f->fetch_ctx = atomic_load_explicit(&fetch_ctx, memory_order_acquire);
    f->next_pos = -1;
    f->readahead = DH_REMOTE_BLOCK;
    *out = f;
    return 0;
}

void dh__remote_file_set_interrupt(dh__remote_file_t *f, const dh__remote_interrupt_t *interrupt)
{
    if (interrupt)
        f->interrupt = *interrupt;
    else
        memset(&f->interrupt, 0, sizeof f->interrupt);
}

/* The object offset reads stop at: the range's end, else the object's end (-1: unknown). */
static int64_t limit_of(const dh__remote_file_t *f)
{
    return f->end >= 0 ? f->end : f->object_size;
}

/* Fetches the whole blocks from the one holding `at` on: at least up to at + want (rounded
 * up to a block), at least the read-ahead, at most to the block holding the limit or to a
 * window already held, into the least recently read window. Returns the window or NULL
 * with the error in *rc. */
static window_t *fetch_window(dh__remote_file_t *f, int64_t at, size_t want, int *rc)
{
    const int64_t block = (int64_t)DH_REMOTE_BLOCK;
    bool sequential = at == f->next_pos;
    f->readahead = !sequential                                   ? DH_REMOTE_BLOCK
                   : f->readahead * 2 <= DH_REMOTE_READAHEAD_MAX ? f->readahead * 2
                                                                 : DH_REMOTE_READAHEAD_MAX;
    int64_t from = at / block * block;
    int64_t to = (at + (int64_t)want + block - 1) / block * block;
    if (to - from < (int64_t)f->readahead)
        to = from + (int64_t)f->readahead;
    int64_t limit = limit_of(f);
    if (limit >= 0) {
        int64_t last = (limit + block - 1) / block * block;
        if (to > last)
            to = last;
    }
    window_t *w = &f->windows[0];
    size_t held = 0;
    for (int i = 0; i < WINDOWS; i++) {
        window_t *o = &f->windows[i];
        if (o->len && o->off > from && o->off < to)
            to = o->off; /* held already */
        if (o->used < w->used)
            w = o; /* an empty window (used 0), else the least recently read */
        held += o->cap;
    }
    size_t len = (size_t)(to - from);
    /* within the bound: the least recently read windows give their memory back */
    while (held - w->cap + len > HELD_MAX) {
        window_t *lru = NULL;
        for (int i = 0; i < WINDOWS; i++)
            if (&f->windows[i] != w && f->windows[i].cap &&
                (!lru || f->windows[i].used < lru->used))
                lru = &f->windows[i];
        if (!lru)
            break;
        held -= lru->cap;
        dh_free(lru->data);
        memset(lru, 0, sizeof *lru);
    }
    if (len > w->cap) {
        uint8_t *grown = dh_realloc(w->data, len);
        if (!grown) {
            char shown[512];
            *rc = dh__set_error(DH_ENOMEM, "%s: out of memory",
                                dh__url_redact(f->url, shown, sizeof shown));
            return NULL;
        }
        w->data = grown;
        w->cap = len;
    }
    w->len = 0;
    w->used = 0;
    size_t got = 0;
    int64_t total = -1;
    *rc = f->fetch(f->fetch_ctx, f->url, from, len, w->data, &got, &total,
                   f->interrupt.callback ? &f->interrupt : NULL);
    if (*rc)
        return NULL;
    f->bytes_fetched += got;
    w->off = from;
    w->len = got;
    if (total >= 0)
        f->object_size = total;
    else if (got < len)
        f->object_size = from + (int64_t)got; /* the object ended inside this fetch */
    if (f->end >= 0 && f->object_size >= 0 && f->end > f->object_size) {
        char shown[512];
        *rc = dh__set_error(
            DH_ERANGE,
            "%s: bytes [%" PRId64 ", %" PRId64 ") lie outside the object (%" PRId64 " bytes)",
            dh__url_redact(f->url, shown, sizeof shown), f->start, f->end, f->object_size);
        return NULL;
    }
    return w;
}

static window_t *window_holding(dh__remote_file_t *f, int64_t at)
{
    for (int i = 0; i < WINDOWS; i++) {
        window_t *w = &f->windows[i];
        if (at >= w->off && at < w->off + (int64_t)w->len)
            return w;
    }
    return NULL;
}

int dh__remote_file_read(dh__remote_file_t *f, int64_t pos, void *buf, size_t len, size_t *got)
{
    *got = 0;
    if (pos < 0 || pos > INT64_MAX - f->start - (int64_t)len)
        return dh__set_error(DH_EINVAL, "remote read: bad position %" PRId64, pos);
    int64_t at = f->start + pos;
    uint8_t *dst = buf;
    while (len > 0) {
        int64_t limit = limit_of(f);
        if (limit >= 0 && at >= limit)
            break;
        if (limit >= 0 && (int64_t)len > limit - at)
            len = (size_t)(limit - at);
        window_t *w = window_holding(f, at);
        if (!w) {
            int rc;
            if (!(w = fetch_window(f, at, len, &rc)))
                return rc;
            if (!window_holding(f, at))
                break; /* the object ends before `at` */
            continue;  /* the limit may be known now */
        }
        size_t off = (size_t)(at - w->off);
        size_t k = w->len - off < len ? w->len - off : len;
        memcpy(dst, w->data + off, k);
        dst += k;
        at += (int64_t)k;
        len -= k;
        *got += k;
        w->used = ++f->tick;
        f->next_pos = w->off + (int64_t)w->len; /* a fetch from here runs on */
    }
    if (pos <= (int64_t)f->prefix && (uint64_t)pos + *got > f->prefix)
        f->prefix = (uint64_t)pos + *got;
    f->bytes_read += *got;
    dh__remote_count_read(*got);
    return 0;
}

int64_t dh__remote_file_size(dh__remote_file_t *f)
{
    if (f->object_size < 0) {
        /* the first blocks of the range: what a demuxer reads next anyway */
        int rc;
        if (!fetch_window(f, f->start, 1, &rc))
            return rc;
        if (f->object_size < 0) {
            int64_t size;
            if ((rc = dh__http_size(f->url, &size, f->interrupt.callback ? &f->interrupt : NULL)))
                return rc;
            f->object_size = size;
        }
    }
    if (f->end >= 0)
        return f->end - f->start;
    return f->object_size > f->start ? f->object_size - f->start : 0;
}

uint64_t dh__remote_file_bytes_read(const dh__remote_file_t *f)
{
    return f->bytes_read;
}

uint64_t dh__remote_file_bytes_fetched(const dh__remote_file_t *f)
{
    return f->bytes_fetched;
}

void dh__remote_file_close(dh__remote_file_t **pf)
{
    if (!pf || !*pf)
        return;
    if ((*pf)->bytes_read) /* what the read-ahead of this source's next ranges fetches */
        dh__remote_readahead_learn((*pf)->url, (*pf)->end >= 0, (*pf)->prefix);
    for (int i = 0; i < WINDOWS; i++)
        dh_free((*pf)->windows[i].data);
    dh_free((*pf)->url);
    dh_free(*pf);
    *pf = NULL;
}
