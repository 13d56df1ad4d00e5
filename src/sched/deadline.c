/* deadline.c: the deadline of a rank's next batches and the adaptive prefetch rule
 * (see deadline.h). Pure: no I/O, clocks or threads. */
#include "datahelix/deadline.h"

double dh_deadline_compute_s(const dh_deadline_model_t *m, uint64_t b)
{
    int64_t tokens = m->n_tokens ? m->tokens[b % m->n_tokens] : 0;
    if (m->s_per_token > 0 && tokens > 0)
        return m->s_per_token * (double)tokens;
    return m->mean_window_s;
}

double dh_deadline_s(const dh_deadline_model_t *m, uint64_t b, uint64_t consumed, double elapsed_s)
{
    if (consumed == 0 || b < consumed)
        return 0;
    double d = dh_deadline_compute_s(m, consumed - 1) - elapsed_s;
    if (d < 0)
        d = 0;
    for (uint64_t j = consumed; j < b; j++)
        d += dh_deadline_compute_s(m, j);
    return d;
}

uint32_t dh_deadline_prefetch_horizon(uint32_t horizon, uint32_t max, uint64_t batch,
                                      double waited_s, double slack_s, double window_s,
                                      double arena_used)
{
    /* In steady state (past the first horizon's batches, which wait for the pipeline to
     * fill), a wait of more than 1% of the compute window, or a batch that arrived less than
     * a window before it was asked for, means batches take longer from request to ready
     * than the horizon covers: double it. Not when the arena is half full already: then the
     * batches in flight are what holds the decode back (workers wait for slabs, then
     * spill), and more would only add to it. */
    if (max <= horizon || batch < horizon || !(window_s > 0) || !(arena_used < 0.5))
        return horizon;
    if (!(waited_s > 0.01 * window_s) && !(slack_s < window_s))
        return horizon;
    return horizon <= max - horizon ? 2 * horizon : max;
}
