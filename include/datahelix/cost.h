/* cost.h: the cost model (docs/design.md §4.1). Pure: no I/O, no threads, no clocks.
 *
 * Predicted time until a request is ready if executed on DataServer i:
 *
 *     T_i = C_cpu,i + C_io,i + C_queue,i + C_net,i        miss_i = max(0, T_i - D)
 *
 *   C_cpu   = predicted CPU seconds (speed 1) x the server's speed factor; a request runs on
 *             one worker of the server
 *   C_io    = input bytes / the server's storage bandwidth, plus, for samples read from a
 *             remote source (http, https, s3), the request's predicted fetch seconds on that
 *             server (dh_request_cost_t.fetch_s: learned per server and source from
 *             completions, docs/profiles.md "The fetch model")
 *   C_queue = 0 when the server has a free worker (queue_len < workers), else the predicted
 *             work queued on it / its workers
 *   C_net   = output bytes / the bandwidth of the link from the server's node to the
 *             consumer's node + that link's latency; 0 on the consumer's own node
 *
 * Bandwidths are stored as their inverses (seconds per byte) and queued work already
 * divided by the workers: placement reads every server on every decision, so the divisions
 * are done once, where the state changes (a heartbeat, a dispatch), not n_servers times per
 * decision. At 1,024 servers this halves the decision time.
 *
 * The inputs are a snapshot of server state (the coordinator's book of dispatched work,
 * corrected by heartbeats) and a request's costs. The predicted CPU seconds of a sample come
 * from a dh_cost_model_t, which starts from the profile's cpu_s_est and learns from every
 * completion (per profile key, and a frames x pixels regression for keys not yet seen): the
 * coordinator observes each sample's measured CPU seconds from its executor's COMPLETE.
 */
#ifndef DATAHELIX_COST_H
#define DATAHELIX_COST_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#include "datahelix/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DH_SERVER_LOCAL = 0, DH_SERVER_REMOTE = 1 } dh_server_role_t;

/* What the scheduler knows of one DataServer at decision time. */
typedef struct dh_server_state {
    uint32_t node;          /* node index in the snapshot's link matrix */
    uint8_t role;           /* dh_server_role_t */
    uint8_t alive;          /* 0 once the coordinator declared it dead */
    uint32_t workers;       /* worker slots (> 0 when alive) */
    uint32_t queue_len;     /* requests dispatched to it and not finished */
    uint32_t queue_cap;     /* backpressure: no new request while queue_len >= cap (0 = no cap) */
    double queue_wait_s;    /* predicted seconds of queued and running work (at its speed)
                             * divided by workers: the wait for a worker when all are busy */
    double speed_factor;    /* observed / predicted CPU time (1 = as profiled; > 1 slower) */
    double storage_s_per_B; /* 1 / the bandwidth it reads inputs at (bytes per second) */
} dh_server_state_t;

/* A directed link between two nodes. */
typedef struct dh_link {
    double s_per_B;   /* 1 / bandwidth (bytes per second) */
    double latency_s; /* one-way latency */
} dh_link_t;

/* A link from its bandwidth in bytes per second (> 0) and latency. */
static inline dh_link_t dh_link_make(double bw_Bps, double latency_s)
{
    dh_link_t link = {1.0 / bw_Bps, latency_s};
    return link;
}

/* A snapshot of the cluster: servers and the node-to-node link matrix. Borrowed arrays. */
typedef struct dh_snapshot {
    const dh_server_state_t *servers;
    uint32_t n_servers;
    const dh_link_t *links; /* n_nodes x n_nodes, links[from * n_nodes + to]; diagonal unused */
    uint32_t n_nodes;
} dh_snapshot_t;

/* The costs of one request (a rank's batch, or one microbatch of it). */
typedef struct dh_request_cost {
    double cpu_s;           /* predicted CPU seconds at speed factor 1 */
    double in_bytes;        /* encoded bytes to read from the server's storage (local files) */
    double out_bytes;       /* decoded bytes to deliver */
    double deadline_s;      /* D: seconds from now until the rank needs it */
    uint32_t consumer_node; /* node of the consuming rank */
    int32_t local_server;   /* index of the rank's local DataServer in the snapshot, or -1 */
    /* The predicted seconds of fetching the request's remote bytes on each server (n_servers
     * entries, index = server index; borrowed for the call), added to C_io; NULL when the
     * request reads only local files (every fetch 0). An entry that is negative or NaN
     * counts as 0. The caller computes it from learned estimates (the coordinator's fetch
     * model): placement stays pure, and reads it once per server. */
    const double *fetch_s;
} dh_request_cost_t;

/* ---- Online refinement ------------------------------------------------------------- */

typedef struct dh_cost_model dh_cost_model_t;

/* How a key's ratio (measured / cpu_s_est) is learned. Measurements are noisy per sample
 * (decode time varies with content: --cost-noise 0.3 in the emulation, 10-35% on real clips
 * in `probe --check`) around a per-key bias that is worth learning. A mean over the last
 * key_window observations keeps sigma / sqrt(2 x window - 1) of the per-sample noise in the
 * learned ratio; an EWMA of weight alpha keeps sigma x sqrt(alpha / (2 - alpha)). Measured
 * by simulation (sigma 0.3 per sample and per key, the bench's defaults; median of
 * |predicted / actual - 1| per sample): never learned 0.29, the true bias 0.204, the old
 * EWMA 0.2 0.214 (noise ~0.1 left in the ratio), a window of 50 0.205. A long window alone
 * would follow a drift slowly (half-life ~35 observations), so a drift detector restarts the
 * mean when a quick EWMA (key_alpha) of the log ratio leaves it by more than key_drift_sd of
 * its own noise (estimated online): a 3%-noise step change is then followed within 2% in
 * 30 observations, and sigma-0.3 noise restarted it 0 times in 300 x 400 simulated
 * observations. */
typedef struct dh_cost_model_config {
    double key_alpha;     /* weight of the drift detector's quick EWMA (0.2) */
    uint32_t key_window;  /* observations a key's ratio averages over (50) */
    double key_drift_sd;  /* restart a key's mean when the quick EWMA leaves it by this many
                           * of its noise's standard deviations (4; 0 = never) */
    uint32_t key_min_obs; /* observations before a key's own ratio is used (3) */
    double fit_forget;    /* forgetting factor of the frames x pixels regression (0.99) */
    uint32_t fit_min_obs; /* observations before the regression is used (8) */
} dh_cost_model_config_t;

/* Which evidence a prediction came from. */
typedef enum {
    DH_COST_FROM_PROFILE = 0, /* the row's cpu_s_est x the global ratio (1 before any data) */
    DH_COST_FROM_FIT = 1,     /* the frames x pixels regression */
    DH_COST_FROM_KEY = 2,     /* the row's cpu_s_est x its key's learned ratio */
} dh_cost_source_t;

/* Fills *cfg with the defaults above. */
DH_EXTERN void dh_cost_model_config_default(dh_cost_model_config_t *cfg);

/* Creates a model (cfg NULL = defaults). Returns 0 or DH_ENOMEM. *out is the caller's. */
DH_EXTERN int dh_cost_model_new(dh_cost_model_t **out, const dh_cost_model_config_t *cfg);
DH_EXTERN void dh_cost_model_destroy(dh_cost_model_t **model);

/* Predicted CPU seconds (speed factor 1) to produce the sample of `row`; *source (may be
 * NULL) says which evidence was used. O(1) expected (hash of the profile key). */
DH_EXTERN double dh_cost_model_predict(const dh_cost_model_t *model, const dh_profile_row_t *row,
                                       dh_cost_source_t *source);

/* Learns from one completion: the sample of `row` took measured_cpu_s CPU seconds on a
 * server whose speed factor is server_speed (the measurement is divided by it, so the model
 * stays in "speed 1" units). Returns 0, DH_EINVAL (a negative or non-finite measurement,
 * speed <= 0) or DH_ENOMEM (a new key). */
DH_EXTERN int dh_cost_model_observe(dh_cost_model_t *model, const dh_profile_row_t *row,
                                    double measured_cpu_s, double server_speed);

/* A key's learned ratio (measured / cpu_s_est at speed 1), and in *obs (may be NULL) the
 * observations it rests on since the key was first seen or its mean restarted; NAN (and 0)
 * for a key never observed. O(1) expected. */
DH_EXTERN double dh_cost_model_key_ratio(const dh_cost_model_t *model, const char *profile_key,
                                         uint64_t *obs);

/* Sums the predicted costs of `n` rows into *req (cpu_s, in_bytes, out_bytes); the other
 * fields of *req are left as they are. */
DH_EXTERN void dh_cost_model_request(const dh_cost_model_t *model,
                                     const dh_profile_row_t *const *rows, size_t n,
                                     dh_request_cost_t *req);

/* A server's speed factor after one completion (the coordinator's rule; docs/design.md §4.1,
 * "Online feedback"): measured_s and predicted_s are the measured CPU seconds and the model's
 * prediction x the current speed, summed over the request's samples whose key the model
 * already knew (DH_COST_FROM_KEY) before observing them. The residual measured / predicted
 * (clamped to [0.5, 2]) moves the speed by 5% of the way (EWMA 0.05); the speed stays in
 * [0.05, 20]. Unchanged when either sum is not > 0: what the model does not know yet is the
 * model's to learn, not the server's. Pure, O(1). */
DH_EXTERN double dh_cost_speed_learn(double speed, double measured_s, double predicted_s);

/* The speeds and the model are learned together, and only their product is observed: the
 * model x c with every speed / c predicts the same. The anchor fixes c by the assumption
 * that most servers run as profiled: it divides speeds[0..n) by their median and returns
 * that median, by which the caller multiplies the model (dh_cost_model_scale), so no
 * prediction changes. Returns 1 (nothing done) for n = 0, a median not > 0, or no memory
 * for the O(n) copy it sorts (O(n log n)). */
DH_EXTERN double dh_cost_speed_anchor(double *speeds, size_t n);

/* Multiplies everything the model predicts by factor (> 0): every key's ratio, the global
 * ratio and the regression. O(keys). */
DH_EXTERN void dh_cost_model_scale(dh_cost_model_t *model, double factor);

/* One step of an exponentially weighted mean: returns value + alpha x (sample - value). */
DH_EXTERN double dh_cost_ewma(double value, double sample, double alpha);

#ifdef __cplusplus
}
#endif
#endif
