/* model/model_lib.h: what other modules use of src/model beyond include/datahelix
 * (docs/conventions.md, "Names"): the misprediction model of the synthetic workload
 * (noise.c; docs/benchmarks.md, "Misprediction"). A sample's actual cost is its estimate x
 * a mean-one lognormal factor per profile key (sigma cost_bias) x one per sample (sigma
 * cost_noise), its actual tokens the estimate x one per sample (sigma token_noise); each
 * draw a pure function of (seed, key or id), so the DataServer's synthetic pipeline
 * (src/runtime/dataserver_task.c), `datahelix bench` and `datahelix simulate` agree on every
 * sample. Internal (dh__): no public API.
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

#endif
