/* client.h: one training rank's view of the data plane (docs/design.md §2, §4.2, §5;
 * docs/runtime.md).
 *
 * A client plans every global step with the tier-1 planner over one seeded, epoch-aware
 * sample order (the same on every rank, so the ranks' shares partition each epoch), and
 * requests its own share ahead of use:
 *   - a sender thread issues REQUESTs to the coordinator, at most `prefetch` batches ahead
 *     (and no more decoded bytes than the rank's share of its node's arena)
 *     of next() and `max_inflight` requests in flight, each with a deadline predicted from
 *     the measured compute windows and the batches' tokens (docs/design.md §4.2);
 *   - a fetcher thread receives DELIVERs from the rank's local DataServer (handles into its
 *     shared-memory arena), drops duplicates, and files them by sequence number;
 *   - dh_client_next() yields batches in request order, blocking only when the next one is
 *     not ready yet.
 * With no coordinator endpoint the client runs in embedded mode: a coordinator and a local
 * DataServer start as threads of this process.
 *
 * Threading: dh_client_next, _stats and _destroy belong to one thread (the training loop).
 * dh_client_batch_release is thread-safe and may run after the client is destroyed: a batch
 * keeps the arena mapping it points into alive until it is released.
 */
#ifndef DATAHELIX_CLIENT_H
#define DATAHELIX_CLIENT_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#include "datahelix/plan.h"
#include "datahelix/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DH_ON_ERROR_RAISE = 0, /* next() fails with the first failed sample's error */
    DH_ON_ERROR_SKIP = 1,  /* next() yields the batch; failed samples are flagged and counted */
} dh_on_error_t;

typedef struct dh_client_sample {
    const char *id;
    int64_t tokens;            /* tokens the pipeline produced (0 for a failed sample) */
    int error;                 /* 0 or a negative DH_E* code */
    const char *error_message; /* NULL, or names the sample, its path and the cause */
    int padded; /* 1: a pad of an epoch's last step (keep_tail), a repeat of one of the
                 * epoch's first samples that only evens the ranks' batches: leave it out of
                 * the loss */
} dh_client_sample_t;

/* ---- Tier 2: rebalancing of materialized batches (docs/rebalancing.md) ----
 *
 * The ranks of a load-balance group meet in rounds. A round holds the group's batches of
 * `steps` consecutive global steps (steps = max(1, buffer_size / (group ranks x batch)), at
 * most the prefetch depth), once every part of them is materialized in the arenas and
 * before next() yields any of them: each rank computes its parts' features (feature_fn, or
 * the defaults), the coordinator gathers them and gives every member the same round, every
 * member derives the same decision from it (sort_fn, or the default policy and its cost
 * gate), and the parts change hands: on one node a part's slabs change owner (no pixel
 * copy), across nodes the owner's local DataServer forwards its bytes to the receiver's
 * over the data path. The unit that moves is a part (a request's microbatch: fanout parts
 * per batch; fanout = batch moves single samples). A moved part stays in its global step
 * and takes the place of a part the receiver gives up (each rank keeps its number of parts
 * per batch), so batches stay in order and every sample is yielded exactly once. */

#define DH_REBALANCE_MAX_FEATURES 16

/* One part of a round, as a policy sees it. */
typedef struct dh_rebalance_part {
    uint32_t rank;          /* the rank that holds it now */
    uint64_t batch;         /* its batch index (the same on every rank for one step) */
    uint32_t slot;          /* its part index in that rank's batch (0 .. fanout-1) */
    uint32_t n_samples;     /* samples in it */
    double tokens;          /* actual tokens of its samples */
    double bytes;           /* its tensors' bytes (what moving it across nodes carries) */
    double cpu_s;           /* measured decode seconds of its samples (0: not measured) */
    const double *features; /* n_features values: feature_fn's, else {tokens, bytes, cpu_s} */
} dh_rebalance_part_t;

/* A round, as every member of the group sees it (identical on every member). */
typedef struct dh_rebalance_round {
    uint32_t group;        /* the group's id */
    uint64_t round;        /* the round number (batches round x steps ...) */
    const uint32_t *ranks; /* the group's ranks, ascending */
    uint32_t n_ranks;
    const dh_rebalance_part_t *parts; /* ordered by (batch, rank, slot) */
    size_t n_parts;
    size_t n_features;
    double s_per_token;  /* the members' mean learned compute seconds per token (0: none) */
    double min_gain;     /* the config's */
    double move_s_per_B; /* seconds per byte of a move across nodes; 0 when the group is on
                          * one node (a move is then a change of owner) */
    double slack_s;      /* the least time any member has left before it consumes the
                          * round's first batch (moves done by then delay nothing) */
    const char *args;    /* the config's args (NULL: none) */
} dh_rebalance_round_t;

/* A user feature function: fills features[0 .. n_features) for one materialized part, on
 * the rank that holds it (the fetcher thread). The tensors are zero-copy views of the part
 * (the collated rows of its samples). Returns 0, or a negative DH_E* code (the round is
 * then kept by every member, and next() fails with that code under on_error raise). */
typedef int (*dh_rebalance_feature_fn)(void *user, const dh_tensor_t *tensors, size_t n_tensors,
                                       const dh_client_sample_t *samples, size_t n_samples,
                                       double *features, size_t n_features);

/* A user assignment policy: given the round, writes new_rank[i] for every part (a rank of
 * the group), and returns 0 to apply it or 1 to keep the current assignment, or a negative
 * DH_E* code (an error: kept, as above). An assignment must keep each rank's number of
 * parts in each batch (parts move within their step, in exchange); one that does not is
 * refused as an error naming the round. Must be deterministic: every member runs it. */
typedef int (*dh_rebalance_sort_fn)(void *user, const dh_rebalance_round_t *round,
                                    uint32_t *new_rank);

/* A user exchange of the bytes a round moves across nodes, e.g. one all_to_all over a
 * torch.distributed process group (Python: rebalance={"process_group": pg}). Without it, a
 * DataServer forwards each such part to the receiver's node (REBALANCE SEND). It is a
 * collective: every member of the group calls it, on its fetcher thread and in round
 * order, for each applied round that moves a part across nodes (every member derives the
 * same decision, so all call it for the same rounds; a member with nothing to send or
 * receive calls it with zero counts). ranks: the group's ranks, ascending (n_ranks). send:
 * this rank's outgoing bytes packed by destination (ranks' order), send_counts[k] of them
 * for ranks[k]; recv: to be filled with recv_counts[k] bytes from ranks[k], in the same
 * order (each destination's bytes are its parts' tensors, by part index, then tensor).
 * Returns 0, or a negative DH_E* code: the parts coming to this rank in that round are then
 * lost, and next() fails naming the round. */
typedef int (*dh_rebalance_exchange_fn)(void *user, uint32_t group, uint64_t round,
                                        const uint32_t *ranks, uint32_t n_ranks, const void *send,
                                        const size_t *send_counts, void *recv,
                                        const size_t *recv_counts);

typedef struct dh_rebalance_config {
    int enabled;              /* 0: no tier 2 (the default) */
    const uint32_t *group_of; /* `ranks` entries: each rank's group id (a rank alone in its
                               * group does not rebalance); NULL = by node: ranks
                               * [r - r % local_ranks, + local_ranks) (torchrun's order) */
    uint32_t buffer_size;     /* samples per round across the group (64) */
    double min_gain;          /* the gate's margin, a fraction of the largest rank's
                               * compute (0.05) */
    double move_s_per_B;      /* seconds per byte moved across nodes (3.2e-10: 25 Gb/s) */
    size_t n_features;        /* with feature_fn: its vector's length (1 .. 16) */
    dh_rebalance_feature_fn feature_fn; /* NULL = {tokens, bytes, cpu_s} */
    void *feature_user;
    dh_rebalance_sort_fn sort_fn; /* NULL = the default policy (rebalance.h) per batch,
                                   * part counts kept, and its cost gate */
    void *sort_user;
    const char *args;     /* handed to sort_fn (e.g. JSON text); copied at creation */
    int round_timeout_ms; /* the coordinator ends a round that has not heard from every
                           * member within this (every member keeps): 10000 */
    int late_ms;          /* how long past its own deadline (the time its next() asks for the
                           * round's first batch) a member lets its round be gathered: the
                           * coordinator ends a round not gathered by then (every member
                           * keeps), so a round adds no wait to the training loop. 0 (the
                           * default); more makes the decisions independent of timing (the
                           * tests), at the cost of waiting */
    dh_rebalance_exchange_fn exchange_fn; /* NULL: DataServers forward cross-node moves */
    void *exchange_user;
    int allow_unencrypted_exchange; /* with keys_dir, an exchange_fn is refused (DH_EINVAL:
                                     * its payloads travel outside CURVE) unless this is 1;
                                     * then a warning is logged (docs/security.md) */
} dh_rebalance_config_t;

typedef struct dh_client_config {
    const char *coordinator;  /* endpoint; NULL or "" = embedded mode */
    const char *profiles;     /* profile JSONL (probe or gen-profiles output); required */
    const char *node;         /* this rank's node (its local DataServer's); NULL = hostname */
    const char *client_id;    /* NULL = "<node>-rank<R>-<pid>", ".<N>" added for the
                               * process's N-th client after its first (docs/runtime.md) */
    uint32_t rank, ranks;     /* rank < ranks */
    uint32_t batch;           /* samples per rank per step (> 0) */
    uint32_t fanout;          /* requests per batch (microbatches), 1..batch (1) */
    uint32_t prefetch;        /* batches requested ahead of next() (4) */
    uint32_t prefetch_max;    /* adaptive prefetch: a next() that waits, or a batch that
                               * arrives less than a compute window early (past the first
                               * horizon, the local arena under half full), doubles the
                               * horizon, up to this; 0 = fixed at prefetch (default) */
    uint32_t max_inflight;    /* requests in flight; 0 = horizon x fanout */
    uint64_t seed;            /* sample order seed */
    int shuffle;              /* 1 = shuffle each epoch (default), 0 = file order */
    uint32_t epochs;          /* epochs to deliver (1); with max_steps, whichever ends first */
    uint32_t first_epoch;     /* the first of them (0): batch 0 is global step
                               * first_epoch x steps-per-epoch (a loader's set_epoch) */
    uint64_t max_steps;       /* 0 = no limit besides epochs */
    int keep_tail;            /* 0 (default): drop_last, an epoch's tail that does not fill
                               * a step is left out. 1: torch's drop_last=False, as
                               * DistributedSampler: the epoch ends with one short step, its
                               * tail shared by every rank alike and padded with the epoch's
                               * first samples (each marked `padded`; sampler.h); steps per
                               * epoch ceil(n / (ranks x batch)). Not with tier 2 (rebalance) */
    uint64_t first_step;      /* mid-epoch resume: batches of this client's run already
                               * delivered (0): it starts at global step first_epoch x
                               * steps-per-epoch + first_step and delivers what was left of
                               * its epochs / max_steps, the batches an uninterrupted run
                               * would have (docs/python.md, "Resume") */
    uint64_t first_sample;    /* elastic resume (0): epoch first_epoch is cut into steps from
                               * this sample of its order (0..n) instead of its first, its
                               * step k the window [first_sample + k x ranks x batch, ...);
                               * first_step counts its steps, and plan windows start there
                               * (dh_sampler_set_start; docs/python.md, "Elastic resume") */
    dh_plan_algo_t plan_algo; /* tier-1 algorithm (DH_PLAN_ALGO_DEFAULT) */
    /* Tier-1 planning of each step's window of ranks x batch rows (plan.h):
     * DH_SHARE_TOKEN_BALANCED (1): exactly `batch` rows per rank, by tokens (default);
     * DH_SHARE_TOKEN_PACKED (2): per-rank counts free (packing: the window is split by
     *   tokens alone, every rank getting at least `fanout` rows; batches vary in size);
     * DH_SHARE_SAMPLE_COUNT (0): as rank-local loaders do, rank r takes rows
     *   [r x batch, (r+1) x batch) in sampler order. */
    dh_share_mode_t token_plan;
    uint32_t plan_window; /* tier 1 across steps (balanced and packed modes): 0 or 1 (the
                           * default) plans each step's window alone; W > 1 plans W
                           * consecutive steps of an epoch together, so a sample may be
                           * consumed up to W - 1 steps from its sampler step
                           * (dh_plan_window_share; docs/planner.md) */
    dh_on_error_t on_error;
    int next_timeout_ms;         /* next() gives up with DH_EAGAIN after this (-1 = never) */
    int coordinator_timeout_ms;  /* the coordinator silent this long (it answers the
                                  * client's HELLO every 500 ms): next() fails with DH_EAGAIN
                                  * saying so (60000; -1 = never). A coordinator restarted
                                  * at the same endpoint within it gets the requests again;
                                  * and this node without a live local DataServer this long
                                  * fails next() with DH_ENOSERVER */
    int connect_timeout_ms;      /* creation waits this long for the coordinator (30000) */
    void *zmq_ctx;               /* borrowed ZeroMQ context (NULL = its own); needed to reach
                                  * inproc:// endpoints of servers in this process */
    double emulate_copy_s_per_B; /* emulated copy cost (0 = off, the default): the fetcher
                                  * thread spends this many seconds per byte it joins
                                  * (fanout > 1) after the join, so the batch is ready
                                  * that much later; `datahelix bench` sets it from
                                  * --link-gbps for payloads that stand for larger ones */
    /* Embedded mode only. */
    const char *pipeline_path; /* the local DataServer's pipeline spec (NULL = video) */
    const char *pipeline_json; /* or its text */
    uint32_t workers;          /* its worker threads (2) */
    uint64_t arena_bytes;      /* its arena; 0 (default) = what the prefetch horizon needs:
                                * max(prefetch, prefetch_max) x batch x the largest sample's
                                * out_bytes, bounded by arena_budget_bytes */
    const char *policy;        /* placement policy name (NULL = "deadline") */
    /* Prefetch in bytes (docs/runtime.md): the batches requested and not yet returned by
     * next() (their decoded size, from the descriptors' out_bytes), with the batch last
     * returned, stay within this rank's share of its local DataServer's arena: the arena's
     * capacity / local_ranks, less a margin (dh_deadline_rank_budget). One batch is always
     * requested, however large. */
    uint32_t local_ranks;            /* ranks sharing the local DataServer's arena; 0 = ranks
                                      * (all on one node: safe, but a smaller share than needed
                                      * when ranks span nodes) */
    uint64_t arena_budget_bytes;     /* embedded mode: the memory the arena may take; 0 =
                                      * dh_arena_budget_default() (env DH_ARENA_BUDGET, else a
                                      * quarter of physical memory or of the
                                      * memory cgroup's limit, the lower) */
    double out_bytes_scale;          /* decoded bytes per byte of the profiles' out_bytes, when
                                      * known: 1 for real decode, the synthetic pipeline's
                                      * bytes_scale; 0 (default) = unknown (embedded mode
                                      * reads it from its pipeline). Tier 2 fits its rounds to
                                      * this rank's share of the arena only when known. */
    dh_rebalance_config_t rebalance; /* tier 2 (off by default) */
    const char *keys_dir;            /* CURVE key directory: tcp:// connections authenticate with
                                      * key_name and encrypt (docs/security.md); NULL = plaintext */
    const char *key_name;            /* this rank's key in keys_dir (NULL = "server") */
} dh_client_config_t;

/* Fills *cfg with the defaults above (profiles NULL: must be set). */
DH_EXTERN void dh_client_config_default(dh_client_config_t *cfg);

typedef struct dh_client_batch {
    uint64_t index; /* batch number of this client, from 0 */
    uint64_t step;  /* global step (index + first_epoch x steps per epoch + first_step;
                     * dh_sampler_epoch_first_step when first_sample cuts an epoch) */
    uint32_t epoch;
    /* The batch's tensors (tensor.h: element strides): "frames" and "mask" (video), "sizes"
     * and "payload" (synthetic). `data` points into the local DataServer's shared-memory
     * arena (fanout 1: zero-copy) or into a buffer of the batch (fanout > 1: the parts are
     * joined by one copy, made by the client's fetcher thread as the last part arrives, not
     * in next()). Valid until the batch is released. */
    size_t n_tensors;
    dh_tensor_t *tensors;
    size_t n_samples;
    dh_client_sample_t *samples; /* in the batch's row order */
    size_t failed;               /* samples with an error */
    int64_t tokens;              /* sum over samples */
    const char *server;          /* the DataServer that executed (part 0 of) the batch */
    double wait_s;               /* time next() blocked for this batch */
    uint64_t ready_ns;           /* dh_clock_now_ns() of the delivering DataServer when the
                                  * last part was ready in its arena (same host only) */
    uint64_t requested_ns;       /* dh_clock_now_ns() when the sender sent its request */
} dh_client_batch_t;

typedef struct dh_client dh_client_t;

/* Makes a client: loads the profiles, starts the embedded coordinator and DataServer when
 * there is no endpoint, registers with the coordinator, connects to the local DataServer
 * and maps its arena, and starts the sender and fetcher threads (requests begin at once).
 * Returns 0, DH_EINVAL (config: the message names the field), profile load errors (the
 * message names the file and line), DH_EAGAIN (no coordinator or local DataServer answered
 * within connect_timeout_ms: the message names the endpoint), -errno, DH_ENOMEM.
 * *out is the caller's (dh_client_destroy). */
DH_EXTERN int dh_client_new(dh_client_t **out, const dh_client_config_t *cfg);

/* The next batch in order. Returns 0 and *out (the caller's: dh_client_batch_release);
 * DH_EEOF after the last batch; DH_EAGAIN when next_timeout_ms passed (call again); with
 * on_error raise, the first failed sample's code (DH_EIO, -ENOENT ...) with dh_last_error()
 * naming the sample and path: that batch is consumed and released, the next call goes on.
 * Measures the compute window since the previous return (the deadline model). */
DH_EXTERN int dh_client_next(dh_client_t *c, dh_client_batch_t **out);

/* Whether tensor `t` of a batch lies in a shared-memory arena (zero-copy): returns 1 and
 * this process's mapping of that arena in *base and *size (the tensor's data is inside it), or
 * 0 when the tensor came by copy (fanout > 1 joins parts into a buffer; a spilled tensor),
 * or DH_EINVAL for t out of range. Thread-safe while the batch is held. */
DH_EXTERN int dh_client_tensor_arena(const dh_client_batch_t *b, size_t t, const void **base,
                                     size_t *size);

/* Releases a batch: its slabs go back to the arena. Safe on NULL; sets *b = NULL.
 * Thread-safe; may be called after dh_client_destroy. */
DH_EXTERN void dh_client_batch_release(dh_client_batch_t **b);

typedef struct dh_client_stats {
    uint64_t batches, samples, samples_failed;
    uint64_t requests_sent, deliveries;
    uint64_t duplicates_dropped; /* DELIVERs dropped: a seq outside the window or already
                                    filled (a request executed twice after a fault); their
                                    slabs go back to the arena at once */
    uint64_t bytes_delivered;    /* tensor bytes of delivered batches */
    uint64_t copied_tensors;     /* tensors that came by copy, not in the arena (a full arena) */
    uint64_t copy_bytes;         /* bytes the fanout join copied (payload bytes, not emulated) */
    uint64_t notices;            /* deliveries that came on the local notice channel (the rest
                                    came over ZeroMQ: sidecar frames, spills, a full channel) */
    double wait_s;               /* total time next() blocked */
    double s_per_token;          /* learned compute seconds per token (0 before data) */
    uint64_t steps_total;        /* batches this client will deliver */
    uint64_t prefetch_now;       /* the prefetch horizon now (prefetch, or deeper once grown) */
    /* Prefetch in bytes: estimated decoded bytes of the batches requested and not yet
     * returned, plus the batch last returned (as of the last admission, and the most at
     * any admission of a batch beyond the first in flight, which goes however large), and
     * the budget they are held to (0 = no arena known: no byte limit). */
    double bytes_outstanding, bytes_outstanding_peak, byte_budget;
    /* Tier 2 (rebalance.enabled): rounds this rank took part in (decided: applied, kept by
     * the gate or the policy, or ended by the coordinator), those that moved parts, those
     * the cost gate kept; the parts and samples this rank received, and their bytes (on one
     * node handed over, across nodes forwarded: rebalance_bytes_remote); the time from the
     * round's last part materialized (in any member's arena: this host's clock; rounds apply
     * in order, so the parts of the rounds before it count too) to the decision applied
     * here: its moves handed over or sent (p95 and max over the rounds so far); and to the
     * round's batches final: the parts from other nodes arrived, the batches joined
     * (rebalance_final_s_p95). Rounds that brought parts from other nodes: those whose
     * bytes came through exchange_fn (rebalance_exchanges), and the time their bytes took
     * (p95 and total over those rounds: the exchange_fn call, or from the decision applied
     * to the last forwarded part in). */
    uint64_t rebalance_rounds, rebalance_applied, rebalance_kept_by_gate;
    uint64_t rebalance_moved_parts, rebalance_moved_samples;
    uint64_t rebalance_bytes, rebalance_bytes_remote;
    double rebalance_s_p95, rebalance_s_max, rebalance_final_s_p95;
    uint64_t rebalance_exchanges;
    double rebalance_transfer_s_p95, rebalance_transfer_s_total;
} dh_client_stats_t;

DH_EXTERN void dh_client_stats(const dh_client_t *c, dh_client_stats_t *out);

/* The client id (borrowed). */
DH_EXTERN const char *dh_client_id(const dh_client_t *c);

/* The coordinator endpoint used (the embedded one in embedded mode). Borrowed. */
DH_EXTERN const char *dh_client_coordinator(const dh_client_t *c);

/* Stops the threads, leaves the coordinator (GOODBYE), stops embedded servers, frees.
 * Batches not yet released stay valid. Sets *c = NULL. Safe on NULL. */
DH_EXTERN void dh_client_destroy(dh_client_t **c);

/* The sample ids rank `rank` receives at global step `step` under cfg's plan (what
 * dh_client_next will yield), for tests and ledgers: writes up to cap indices into the
 * profile set (row numbers) and returns how many (cfg->batch; with DH_SHARE_TOKEN_PACKED the
 * count varies; with keep_tail an epoch's last step has fewer, pads included), or a negative
 * code. dh_plan_rank_share (plan.h) is the same rule without a
 * client. */
DH_EXTERN int dh_client_plan_rank_step(dh_client_t *c, uint64_t step, uint32_t rank, uint32_t *rows,
                                       size_t cap);

#ifdef __cplusplus
}
#endif
#endif
