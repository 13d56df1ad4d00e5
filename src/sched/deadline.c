/* deadline.c: the deadline of a rank's next batches, the adaptive prefetch rule, and the
 * byte rules that keep the horizon within the arena (see deadline.h). Pure: no I/O, clocks
 * or threads. */
#include "datahelix/deadline.h"

#include "datahelix/error.h"
#include "core/internal.h"

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

double dh_deadline_rank_budget(uint64_t arena_bytes, uint32_t ranks_on_node)
{
    double share = (double)arena_bytes / (double)(ranks_on_node ? ranks_on_node : 1);
    return share * (1 - DH_DEADLINE_ARENA_MARGIN);
}

uint32_t dh_deadline_byte_horizon(uint32_t horizon, const double *bytes, size_t n,
                                  double held_bytes, double budget)
{
    size_t limit = n < horizon ? n : horizon;
    /* Batch k goes while the bytes up to and including it fit; the first always goes. */
    double sum = held_bytes > 0 ? held_bytes : 0;
    size_t k = 0;
    while (k < limit) {
        double b = bytes[k] > 0 ? bytes[k] : 0; /* NaN and negatives: 0 */
        if (k > 0 && !(sum + b <= budget))
            break;
        sum += b;
        k++;
    }
    return (uint32_t)k;
}

int dh_deadline_arena_size(uint32_t ranks_on_node, uint32_t batch, uint64_t largest_sample,
                           uint64_t need, uint64_t budget, uint64_t *out)
{
    *out = 0;
    if (budget == 0)
        return dh__set_error(DH_EINVAL, "arena budget: 0 bytes");
    uint32_t ranks = ranks_on_node ? ranks_on_node : 1;
    /* one step: every rank of the node holds one batch of its largest samples */
    double step = (double)ranks * (double)batch * (double)largest_sample;
    if (step > (double)budget)
        return dh__set_error(DH_ERANGE,
                             "arena budget of %.1f MiB cannot hold one step: %u ranks on the "
                             "node x batch %u x largest sample %.1f MiB = %.1f MiB; raise it "
                             "(--arena-budget BYTES, config arena_budget_bytes, Python "
                             "arena_budget=, or DH_ARENA_BUDGET) or lower the batch",
                             (double)budget / 1048576.0, ranks, batch,
                             (double)largest_sample / 1048576.0, step / 1048576.0);
    uint64_t size = need && need < budget ? need : budget;
    if ((double)size < step)
        size = (uint64_t)step;
    *out = size;
    return 0;
}
