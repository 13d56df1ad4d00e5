/* spares.c: output buffers a pipeline keeps for its next samples (dh__pipeline_recycle).
 *
 * A sample's frame buffer is tens of MB (64 x 448 x 448 x 3 is 38 MB): malloc maps fresh
 * zero pages for it, and the kernel faults each one in on first touch (docs/pipeline.md,
 * "Profile, before and after"). A buffer handed back here is reused warm by a later sample
 * of the same pipeline whose frames fit it, without being wasted on one far smaller. */
#include <string.h>

#include "datahelix/alloc.h"
#include "media/pipeline_internal.h"

void dh__spares_clear(dh__spares_t *s)
{
    for (int i = 0; i < s->count; i++)
        dh_free(s->buf[i].data);
    memset(s, 0, sizeof *s);
}

void *dh__spares_take(dh__spares_t *s, size_t need)
{
    int best = -1;
    for (int i = 0; i < s->count; i++) {
        size_t cap = s->buf[i].cap;
        /* the smallest that fits, and not more than twice the need */
        if (cap >= need && cap / 2 <= need && (best < 0 || cap < s->buf[best].cap))
            best = i;
    }
    if (best < 0)
        return dh_malloc(need);
    void *data = s->buf[best].data;
    s->bytes -= s->buf[best].cap;
    s->buf[best] = s->buf[--s->count];
    return data;
}

void dh__spares_give(dh__spares_t *s, void *data, size_t cap)
{
    if (!data)
        return;
    if (cap > DH_SPARES_MAX_BYTES) { /* too large to keep on its own */
        dh_free(data);
        return;
    }
    /* full: the oldest go until this one fits */
    while (s->count == DH_SPARES_MAX || cap > DH_SPARES_MAX_BYTES - s->bytes) {
        dh_free(s->buf[0].data);
        s->bytes -= s->buf[0].cap;
        memmove(&s->buf[0], &s->buf[1], (size_t)(s->count - 1) * sizeof s->buf[0]);
        s->count--;
    }
    s->buf[s->count].data = data;
    s->buf[s->count].cap = cap;
    s->count++;
    s->bytes += cap;
}
