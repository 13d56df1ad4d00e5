/* rebalance_clips.c: the clips rebalance-bench moves: their size and their arena's,
 * their stamped bytes, their tensors and names; with the few helpers every part of it uses
 * (exact reads and writes on a socket, an error's context). No state.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "bench/rebalance_bench_internal.h"

uint64_t dh__rebalance_clip_bytes(const dh_rebalance_bench_options_t *opt)
{
    return (uint64_t)opt->frames * opt->height * opt->width * CHANNELS;
}

/* Bytes of an arena holding every clip in slabs of the default size, header included. */
uint64_t dh__rebalance_arena_bytes(const dh_rebalance_bench_options_t *opt)
{
    const uint64_t slab = DH_SHM_DEFAULT_SLAB_SIZE;
    uint64_t per_clip = (dh__rebalance_clip_bytes(opt) + slab - 1) / slab;
    return ((uint64_t)opt->clips * per_clip + 2) * slab;
}

/* Sets rc's message to "<context>: <the current message>". (dh__set_error formats into the
 * buffer dh_last_error() returns, so the current message is copied out first.) */
int dh__rebalance_with_context(int rc, const char *fmt, ...)
{
    char prev[512], context[512];
    snprintf(prev, sizeof prev, "%s", dh_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    return dh__set_error(rc, "%s: %s", context, prev);
}

/* A clip's stamp: written at its start, middle and end, the rest filled with its top byte,
 * so a receiver can tell the clip (and a copy gone wrong) from a few bytes. */
uint64_t dh__rebalance_clip_tag(uint64_t seed, uint32_t clip)
{
    return dh_rng_mix(seed ^ 0x72656261u, (uint64_t)clip + 1);
}

static size_t clip_middle(size_t len)
{
    return (len / 2) & ~(size_t)7;
}

void dh__rebalance_clip_fill(uint8_t *p, size_t len, uint64_t tag)
{
    memset(p, (int)(tag >> 56), len);
    memcpy(p, &tag, 8);
    memcpy(p + clip_middle(len), &tag, 8);
    memcpy(p + len - 8, &tag, 8);
}

bool dh__rebalance_clip_intact(const uint8_t *p, size_t len, uint64_t tag)
{
    uint64_t a, b, c;
    memcpy(&a, p, 8);
    memcpy(&b, p + clip_middle(len), 8);
    memcpy(&c, p + len - 8, 8);
    const uint8_t fill = (uint8_t)(tag >> 56);
    return a == tag && b == tag && c == tag && p[clip_middle(len) - 1] == fill &&
           p[len - 9] == fill;
}

/* A clip's tensor: "clip<index>", uint8 frames x height x width x 3, contiguous; with the
 * handle for a shared-memory one, a payload frame otherwise. */
void dh__rebalance_clip_tensor(dh_wire_tensor_t *w, const dh_rebalance_bench_options_t *opt,
                               uint32_t clip, const dh_shm_handle_t *h)
{
    memset(w, 0, sizeof *w);
    snprintf(w->tensor.name, sizeof w->tensor.name, "clip%" PRIu32, clip);
    w->tensor.dtype = DH_DTYPE_UINT8;
    w->tensor.ndim = 4;
    w->tensor.shape[0] = opt->frames;
    w->tensor.shape[1] = opt->height;
    w->tensor.shape[2] = opt->width;
    w->tensor.shape[3] = CHANNELS;
    dh_tensor_set_contiguous(&w->tensor);
    if (h) {
        w->location = DH_WIRE_LOC_SHM;
        w->arena_id = h->arena_id;
        w->offset = h->offset;
        w->length = h->length;
        w->generation = h->generation;
    } else {
        w->location = DH_WIRE_LOC_FRAME;
    }
}

dh_shm_handle_t dh__rebalance_handle_of(const dh_wire_tensor_t *w)
{
    return (dh_shm_handle_t){w->arena_id, w->offset, w->length, w->generation};
}

/* The clip index a name "clip<index>" names, or -1 when it names none of the run's clips. */
long dh__rebalance_clip_index(const char *name, uint32_t clips)
{
    if (strncmp(name, "clip", 4) != 0 || name[4] < '0' || name[4] > '9')
        return -1;
    char *end = NULL;
    unsigned long v = strtoul(name + 4, &end, 10);
    return *end == '\0' && v < clips ? (long)v : -1;
}

/* A received clip tensor of the run's shape and dtype, in the expected location; returns
 * its index or -1. */
long dh__rebalance_clip_of_tensor(const dh_wire_tensor_t *w,
                                  const dh_rebalance_bench_options_t *opt, uint8_t location)
{
    const dh_tensor_t *t = &w->tensor;
    if (w->location != location || t->dtype != DH_DTYPE_UINT8 || t->ndim != 4 ||
        t->shape[0] != opt->frames || t->shape[1] != opt->height || t->shape[2] != opt->width ||
        t->shape[3] != CHANNELS || t->nbytes != dh__rebalance_clip_bytes(opt))
        return -1;
    return dh__rebalance_clip_index(t->name, opt->clips);
}

int dh__rebalance_read_exact(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? DH_EEOF : -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* To a socket: a rank already gone is -EPIPE, not a SIGPIPE. */
int dh__rebalance_send_exact(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? DH_EIO : -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}
