/* deadline.h: when a rank needs its next batches, and how far ahead to ask for them
 * (docs/design.md §4.2). Pure: the caller measures the clock and passes seconds in.
 *
 * A batch's compute window is predicted from its tokens (seconds per token, measured) or,
 * without that, from the mean measured window. The deadline D(b) of batch b is what is left
 * of the current window plus the predicted windows of the batches between. The adaptive
 * prefetch rule deepens the horizon of batches requested ahead when the rank waits. The byte
 * rules keep that horizon within the rank's share of its node's arena (decoded samples of
 * tens of MB fill an arena in a few batches) and size the arena from a memory budget.
 */
#ifndef DATAHELIX_DEADLINE_H
#define DATAHELIX_DEADLINE_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the client has measured of its rank's compute. */
typedef struct dh_deadline_model {
    double s_per_token;    /* seconds of compute per token (EWMA); <= 0 = not measured */
    double mean_window_s;  /* mean compute window between two next() calls (EWMA) */
    const int64_t *tokens; /* ring of the planned batches' tokens: batch b at b % n_tokens */
    size_t n_tokens;       /* > 0 */
} dh_deadline_model_t;

/* Predicted compute seconds of batch b: s_per_token x its tokens when both are > 0, else
 * mean_window_s. */
DH_EXTERN double dh_deadline_compute_s(const dh_deadline_model_t *m, uint64_t b);

/* D(b): seconds until the rank calls next() for batch b, given that `consumed` batches were
 * returned, the last one elapsed_s ago: the predicted window of batch consumed-1 less
 * elapsed_s (at least 0), plus the predicted windows of batches consumed..b-1. 0 before the
 * first return (consumed 0) and for a batch already due (b < consumed). */
DH_EXTERN double dh_deadline_s(const dh_deadline_model_t *m, uint64_t b, uint64_t consumed,
                               double elapsed_s);

/* Adaptive prefetch: the horizon after next() returned batch `batch`. Doubles `horizon` (up
 * to max) when, in steady state (batch >= horizon), with a compute window known
 * (window_s > 0) and the local arena under half full (arena_used < 0.5), next() waited more
 * than 1% of the window (waited_s) or the batch arrived less than a window before it was
 * asked for (slack_s < window_s). Else, or when max <= horizon, returns horizon. */
DH_EXTERN uint32_t dh_deadline_prefetch_horizon(uint32_t horizon, uint32_t max, uint64_t batch,
                                                double waited_s, double slack_s, double window_s,
                                                double arena_used);

/* ---- the horizon in bytes (docs/runtime.md, "Prefetch in bytes") ---- */

/* Share of an arena kept back from the ranks' byte budgets: slab rounding (each tensor of a
 * batch takes whole slabs) and estimates a little short of the decoded size. */
#define DH_DEADLINE_ARENA_MARGIN 0.05

/* The bytes one rank's prefetch may hold in its node's arena: arena_bytes / ranks_on_node,
 * less DH_DEADLINE_ARENA_MARGIN of it. ranks_on_node 0 counts as 1. */
DH_EXTERN double dh_deadline_rank_budget(uint64_t arena_bytes, uint32_t ranks_on_node);

/* The horizon in batches that the byte budget allows: the largest k in [1, min(horizon, n)]
 * with held_bytes + bytes[0] + ... + bytes[k-1] <= budget, where bytes[i] is the decoded
 * size of the i-th batch from the consumption point on (requested or about to be), and
 * held_bytes what the rank holds in the arena besides (the batch it computes on). Never
 * below 1 (one batch always goes, however large); 0 only when horizon or n is 0. A budget
 * <= 0 or NaN admits one batch; bytes that are NaN or < 0 count as 0. */
DH_EXTERN uint32_t dh_deadline_byte_horizon(uint32_t horizon, const double *bytes, size_t n,
                                            double held_bytes, double budget);

/* The arena size for a node: `need` (what the horizon needs, e.g. ranks on the node x
 * horizon x largest batch; 0 = unknown: the budget), bounded by `budget`. One step (the
 * node's ranks x batch x largest sample) must fit: else DH_ERANGE with a message naming the
 * numbers and the options that raise the budget (--arena-budget, arena_budget_bytes,
 * DH_ARENA_BUDGET). Returns 0 and *out = max(min(need, budget), one step), or DH_EINVAL
 * (budget 0). */
DH_EXTERN int dh_deadline_arena_size(uint32_t ranks_on_node, uint32_t batch,
                                     uint64_t largest_sample, uint64_t need, uint64_t budget,
                                     uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
