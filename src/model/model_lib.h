/* model/model_lib.h: what other modules use of src/model beyond include/datahelix
 * (docs/conventions.md, "Names"): the misprediction model of the synthetic workload
 * (noise.c; docs/benchmarks.md, "Misprediction"). A sample's actual cost is its estimate x
 * a mean-one lognormal factor per profile key (sigma cost_bias) x one per sample (sigma
 * cost_noise), its actual tokens the estimate x one per sample (sigma token_noise); each
 * draw a pure function of (seed, key or id), so the DataServer's synthetic pipeline
 * (src/runtime/dataserver_task.c), `datahelix bench` and `datahelix simulate` agree on every
 * sample. And the fetch model (fetch.c; docs/profiles.md, "The fetch model"): what a remote
 * sample costs to fetch on each DataServer, learned per (server, source) from completions,
 * which the coordinator adds to placement's C_io. Internal (dh__): no public API.
 */
#ifndef DH_MODEL_MODEL_LIB_H
#define DH_MODEL_MODEL_LIB_H

#include <stdint.h>

/* The largest sigma of any factor (the pipeline spec's and the CLIs' check). */
#define DH__NOISE_SIGMA_MAX 4.0

typedef struct dh__noise {
    double cost_bias, cost_noise, token_noise; /* sigmas; 0 = the estimate exactly */
    uint64_t seed;
} dh__noise_t;

/* A sample's actual CPU seconds: cpu_s_est x the key's and the sample's factors (id or key
 * NULL count as ""). Pure; any thread. */
double dh__noise_cpu_s(const dh__noise_t *noise, const char *id, const char *key, double cpu_s_est);

/* A sample's actual tokens: tokens_est x its factor, rounded, at least 1 (tokens_est <= 0
 * is returned as is). Pure; any thread. */
int64_t dh__noise_tokens(const dh__noise_t *noise, const char *id, int64_t tokens_est);

/* ---- The fetch model (fetch.c) -------------------------------------------------------- */

typedef struct dh__fetch_config {
    double prior_latency_s;   /* a sample's fetch latency before any observation (0.05) */
    double prior_bytes_per_s; /* its bandwidth before any observation (100e6) */
    double prior_weight;      /* observations the prior counts as (2) */
    double ref_bytes;         /* where the prior's second pseudo-observation sits (4 MiB) */
    double forget;            /* each observation multiplies the older ones' weight (0.98) */
    uint32_t min_obs;         /* observations before a pair's or a source's fit is used (3) */
} dh__fetch_config_t;

typedef enum {
    DH__FETCH_FROM_PRIOR = 0,  /* the configured prior */
    DH__FETCH_FROM_SOURCE = 1, /* the source's fit over every server */
    DH__FETCH_FROM_SERVER = 2, /* the (server, source) pair's own fit */
} dh__fetch_from_t;

typedef struct dh__fetch_estimate {
    double latency_s;   /* per sample */
    double bytes_per_s; /* INFINITY when the learned seconds per byte are 0 */
    uint64_t obs;       /* observations the fit used rests on (0 for the prior) */
    dh__fetch_from_t from;
} dh__fetch_estimate_t;

typedef struct dh__fetch_model dh__fetch_model_t;

/* Fills *cfg with the defaults above. */
void dh__fetch_config_default(dh__fetch_config_t *cfg);

/* A model (cfg NULL: the defaults). Returns 0, DH_EINVAL (a prior not finite, a bandwidth
 * not > 0, forget outside (0, 1]: the message gives them) or DH_ENOMEM. *out is the
 * caller's (dh__fetch_model_destroy, safe on NULL). */
int dh__fetch_model_new(dh__fetch_model_t **out, const dh__fetch_config_t *cfg);
void dh__fetch_model_destroy(dh__fetch_model_t **m);

/* Learns one sample's fetch: `source` (dh__fetch_source_key of its uri; a remote one) on
 * `server` (the caller's index) fetched a sample of sample_bytes (its encoded size) in
 * fetch_s seconds. Updates the pair's fit and the source's. O(sources) to find it.
 * Returns 0, DH_EINVAL (a value not finite or < 0) or DH_ENOMEM (a new source or server:
 * nothing learned). */
int dh__fetch_model_observe(dh__fetch_model_t *m, const char *source, uint32_t server,
                            double sample_bytes, double fetch_s);

/* What the model predicts for a sample of `source` on `server`: the pair's fit, else the
 * source's, else the prior (out->from says which). O(sources). */
void dh__fetch_model_estimate(const dh__fetch_model_t *m, const char *source, uint32_t server,
                              dh__fetch_estimate_t *out);

/* The source's index in the model, for dh__fetch_model_add_costs, or -1 when it has never
 * been observed (its costs are the prior's). O(sources). */
int32_t dh__fetch_model_source(const dh__fetch_model_t *m, const char *source);

/* Adds to fetch_s[i], for each of n_servers servers, the predicted seconds of fetching
 * n_samples samples of `source` (an index, or -1: the prior) totalling `bytes`:
 * n_samples x latency + bytes / bandwidth, from that server's estimate as
 * dh__fetch_model_estimate chooses it. O(n_servers), no allocation. */
void dh__fetch_model_add_costs(const dh__fetch_model_t *m, int32_t source, uint32_t n_samples,
                               double bytes, double *fetch_s, uint32_t n_servers);

#endif
