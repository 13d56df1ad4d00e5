/* sim/event.c: see event.h. */
#include "sim/event.h"

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"

static int before(const dh_sim_event_t *x, const dh_sim_event_t *y)
{
    return x->t_s < y->t_s || (x->t_s == y->t_s && x->seq < y->seq);
}

int dh__sim_events_push(dh_sim_events_t *q, double t_s, uint32_t type, uint32_t a, uint64_t b)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 1024;
        dh_sim_event_t *h = dh_reallocarray(q->heap, cap, sizeof *h);
        if (!h)
            return dh__set_error(DH_ENOMEM, "simulate: out of memory for the event queue");
        q->heap = h;
        q->cap = cap;
    }
    dh_sim_event_t e = {t_s, q->next_seq++, type, a, b};
    size_t i = q->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&e, &q->heap[parent]))
            break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = e;
    return 0;
}

int dh__sim_events_pop(dh_sim_events_t *q, dh_sim_event_t *out)
{
    if (q->n == 0)
        return 0;
    *out = q->heap[0];
    dh_sim_event_t last = q->heap[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n)
            break;
        if (c + 1 < q->n && before(&q->heap[c + 1], &q->heap[c]))
            c++;
        if (!before(&q->heap[c], &last))
            break;
        q->heap[i] = q->heap[c];
        i = c;
    }
    if (q->n)
        q->heap[i] = last;
    return 1;
}

void dh__sim_events_clear(dh_sim_events_t *q)
{
    dh_free(q->heap);
    q->heap = NULL;
    q->n = q->cap = 0;
}
