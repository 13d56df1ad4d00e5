/* plan.h: tier-1 token-aware planning (docs/design.md §4.4). Pure: no I/O, no threads, no clocks.
 *
 * For one global step the sampler draws the step's window of samples (so the profile mix
 * of the window is the data set's, never reordered across steps); the planner assigns the
 * window's samples to ranks so that the largest per-rank load (predicted compute, here
 * tokens) is as small as possible:
 *   - fixed-batch mode: every rank gets exactly `batch` samples;
 *   - token-budget mode (packing): every rank stays under `token_budget`; samples that fit
 *     nowhere are deferred to the next step (rank -1), never dropped.
 * Algorithms: `greedy` (the paper's: largest first to the least-loaded rank with room),
 * `kk` (balanced largest differencing, Karmarkar-Karp with cardinality), `swap` (the
 * default: the better of greedy and kk, then improving pairwise swaps), and `exact`
 * (branch and bound, for small instances; used by tests and to report the optimality gap).
 */
#ifndef DATAHELIX_PLAN_H
#define DATAHELIX_PLAN_H

#include "datahelix/export.h"
#include "datahelix/profile.h"
#include "datahelix/sampler.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DH_PLAN_GREEDY = 0,
    DH_PLAN_KK = 1,
    DH_PLAN_SWAP = 2,
    DH_PLAN_EXACT = 3,
} dh_plan_algo_t;

#define DH_PLAN_ALGO_DEFAULT DH_PLAN_SWAP
#define DH_PLAN_ALGO_COUNT 4

typedef enum {
    DH_PLAN_FIXED_BATCH = 0,
    DH_PLAN_TOKEN_BUDGET = 1,
} dh_plan_mode_t;

typedef struct dh_plan_config {
    dh_plan_mode_t mode;
    dh_plan_algo_t algo;
    uint32_t ranks;            /* > 0 */
    uint32_t batch;            /* fixed-batch: samples per rank (> 0) */
    double token_budget;       /* token-budget: max load per rank (> 0) */
    uint64_t exact_node_limit; /* exact: search nodes before giving up (0 = default 2e6) */
} dh_plan_config_t;

/* Parses "greedy", "kk", "swap", "exact". Returns 0 or DH_EUNKNOWN. */
DH_EXTERN int dh_plan_algo_from_name(const char *name, dh_plan_algo_t *out);

/* Name of an algorithm (static storage). */
DH_EXTERN const char *dh_plan_algo_name(dh_plan_algo_t algo);

/* Plans one step. load[i] is item i's predicted load (tokens), key[i] its profile key index
 * (may be NULL). Writes rank_of[i] (0..ranks-1, or -1 = deferred in token-budget mode) and,
 * if rank_load is not NULL, each rank's total load (ranks entries).
 * Fixed-batch: n must equal ranks x batch (else DH_EINVAL).
 * Token-budget: an item heavier than the budget alone is DH_ERANGE (message names its index).
 * Exact: DH_ETOOBIG when the instance exceeds the node limit, or has more than 4096 items
 * (rank_of and rank_load then hold the best plan found, at least as good as `swap`'s).
 * A load that is negative, NaN or infinite is DH_EINVAL (message names its index).
 * Returns 0, DH_EINVAL, DH_ERANGE, DH_ETOOBIG or DH_ENOMEM. Deterministic: the same input
 * gives the same plan. Cost: greedy O(n log n + n R); kk O(n log n + B log B + B R^2) in
 * fixed-batch mode (B = n / R), O(n log n + n R^2) in token-budget mode; swap adds
 * O(iterations x (n + R B^2)); exact is exponential (bounded by the node limit).
 * Thread-safe (no shared state; allocates its scratch through dh_malloc). */
DH_EXTERN int dh_plan_step(const dh_plan_config_t *cfg, const double *load, const uint32_t *key,
                           size_t n, int32_t *rank_of, double *rank_load);

/* Token-budget mode with carried-over samples: the same as dh_plan_step, except that the first
 * n_carried items (the previous step's deferred samples, which the caller puts at the front of
 * this step's window) are placed before every other item, largest first. A carried sample is
 * thus deferred again only if it does not fit even when placed first, and no sample waits
 * behind newer ones. In fixed-batch mode n_carried must be 0 (else DH_EINVAL): the window is
 * exactly ranks x batch. dh_plan_step(...) is dh_plan_step_carried(..., 0, ...). */
DH_EXTERN int dh_plan_step_carried(const dh_plan_config_t *cfg, const double *load,
                                   const uint32_t *key, size_t n, size_t n_carried,
                                   int32_t *rank_of, double *rank_load);

/* Lower bound on the largest rank load of any fixed-batch plan: max(total / ranks, largest
 * item). */
DH_EXTERN double dh_plan_lower_bound(const double *load, size_t n, uint32_t ranks);

/* Microbatch fanout: splits one rank's batch of n items into `parts` requests of sizes that
 * differ by at most one, balancing load. Writes part_of[i] in 0..parts-1.
 * Returns 0, DH_EINVAL (parts == 0 or parts > n) or DH_ENOMEM. */
DH_EXTERN int dh_plan_fanout(const double *load, size_t n, uint32_t parts, uint32_t *part_of);

/* How a step's window of ranks x batch rows is shared among the ranks (the client's
 * `token_plan`). */
typedef enum {
    DH_SHARE_SAMPLE_COUNT = 0,   /* sample-count batching, as rank-local loaders do: rank r
                                  * takes rows [r x batch, (r+1) x batch) in sampler order */
    DH_SHARE_TOKEN_BALANCED = 1, /* token-balanced, exactly `batch` rows per rank (default) */
    DH_SHARE_TOKEN_PACKED = 2,   /* packing: the window is split by tokens alone (per-rank
                                  * counts free, every rank at least `min_rows` rows) */
} dh_share_mode_t;

#define DH_SHARE_MODE_COUNT 3

typedef struct dh_share_config {
    dh_share_mode_t mode;
    dh_plan_algo_t algo;   /* the balanced and packed modes' algorithm */
    uint32_t ranks;        /* > 0 */
    uint32_t batch;        /* rows per rank per step (> 0); the window is ranks x batch */
    uint32_t min_rows;     /* packed mode: the fewest rows a rank gets (the client's fanout) */
    uint32_t window_steps; /* 0 or 1: each step's window planned alone. W > 1 (balanced and
                            * packed modes): W consecutive steps of an epoch (from a
                            * multiple of W; the epoch's last window may be shorter) are
                            * planned together, so a sample may be consumed up to W - 1
                            * steps from its sampler step (dh_plan_rank_share) */
} dh_share_config_t;

/* The profile rows (indices into `profiles`) that `rank` gets at global step `step`, in
 * window order: the sampler draws the step's window (it must have per_step = ranks x batch),
 * or with window_steps W > 1 the W steps' windows around it (see dh_plan_window_share),
 * the rows' tokens_est are the loads, their key_index the keys, and the window is shared by
 * cfg->mode. A sampler without drop_last (sampler.h) ends each epoch with a short step: its
 * padded tail is shared alone, with batch = its ids / ranks (docs/planner.md, "The epoch's
 * tail"). Writes up to cap rows and returns how many (batch, except in packed mode and in
 * such a tail step), or
 * DH_EINVAL (rank >= ranks, ranks or batch 0, an unknown mode), DH_ENOMEM, or the sampler's
 * or planner's error. The exact algorithm's DH_ETOOBIG is not an error: its best plan is
 * used. Deterministic; not thread-safe on one sampler (dh_sampler_step caches an epoch). */
DH_EXTERN int dh_plan_rank_share(const dh_share_config_t *cfg, dh_sampler_t *sampler,
                                 const dh_profile_set_t *profiles, uint64_t step, uint32_t rank,
                                 uint32_t *rows, size_t cap);

/* Every rank's share of global step `step` at once, as dh_plan_rank_share gives each rank's
 * (one plan instead of one per rank: what a caller that drives all the ranks, such as the
 * simulator, needs): writes the step's rows in window order to rows[] and each one's rank
 * to rank_of[], and returns how many (ranks x batch unless window_steps > 1 moved some), or
 * DH_ERANGE when more than cap, or dh_plan_rank_share's errors. For every rank r, the rows
 * with rank_of r are, in order, exactly what dh_plan_rank_share returns for r. */
DH_EXTERN int dh_plan_step_share(const dh_share_config_t *cfg, dh_sampler_t *sampler,
                                 const dh_profile_set_t *profiles, uint64_t step, uint32_t *rows,
                                 uint32_t *rank_of, size_t cap);

/* Planning across steps (window_steps = W > 1): the n = W x ranks x batch items of W
 * consecutive windows (load[], in window order: step 0's ranks x batch items, then step
 * 1's...) go to W x ranks bins (step t, rank r) so that the sum over the W steps of each
 * step's largest rank load is small: largest first, each item to the least-loaded bin with
 * room (ties: fewer items, then its own step, then the lower step and rank), a bin holding
 * at most `batch` items in balanced mode (every bin then exactly `batch`) and ranks x batch in
 * packed mode; then each step's items are planned again by cfg->algo and the better of the
 * two plans of that step is kept (packed: every rank at least min_rows rows). A per-step
 * plan cannot balance better than the best partition of the sampler's step, which a single
 * heavy sample may cap (docs/planner.md, "Planning across steps"); this one evens the
 * steps' compositions first. Writes step_of[i] (0..W-1) and rank_of[i]. Deterministic.
 * Returns 0, DH_EINVAL (a bad config, n not W x ranks x batch, a bad load) or DH_ENOMEM.
 * Cost O(n log n + n W ranks) plus W per-step plans. */
DH_EXTERN int dh_plan_window_share(const dh_share_config_t *cfg, uint32_t steps, const double *load,
                                   const uint32_t *key, size_t n, uint32_t *step_of,
                                   int32_t *rank_of);

/* Packing may leave a rank fewer than min_rows rows: gives it the lightest row of the rank
 * with the most rows (the lowest such rank) until none is short or no rank has more than
 * min_rows. rank_of[i] is item i's rank (or -1, left alone). Deterministic.
 * Returns 0, DH_EINVAL (ranks 0) or DH_ENOMEM (rank_of unchanged). */
DH_EXTERN int dh_plan_min_rows(int32_t *rank_of, const double *load, size_t n, uint32_t ranks,
                               uint32_t min_rows);

/* Microbatch fanout: how many requests (parts) a rank's batch is split into. F parts decode
 * on up to F workers at once, so the batch is ready sooner, but the client joins them by a
 * copy of the whole batch (and packing gives a rank at least F rows). Splitting pays only
 * when one worker cannot decode the batch within the time the prefetch horizon covers:
 * returns ceil(batch_decode_s / horizon_s) when batch_decode_s > horizon_s, at most
 * cores_per_rank (the workers a rank's batches can spread over) and batch, else 1.
 * batch_decode_s: the batch's predicted CPU seconds (batch x the mean estimate);
 * horizon_s: prefetch depth x the mean step's compute. Pure. */
DH_EXTERN uint32_t dh_plan_fanout_width(uint32_t batch, uint32_t cores_per_rank,
                                        double batch_decode_s, double horizon_s);

#ifdef __cplusplus
}
#endif
#endif
