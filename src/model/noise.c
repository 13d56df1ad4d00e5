/* model/noise.c: the misprediction model (model/model_lib.h): seeded mean-one lognormal factors
 * of a sample's cost and tokens, pure functions of (seed, key or id, stream). */
#include "model/model_lib.h"

#include <math.h>

#include "datahelix/rng.h"

/* Streams of the misprediction draws: each a pure function of (seed, name, stream). */
enum { NOISE_KEY_COST = 1, NOISE_SAMPLE_COST = 2, NOISE_SAMPLE_TOKENS = 3 };

static uint64_t stream_seed(const dh__noise_t *noise, const char *name, uint64_t stream)
{
    return dh_rng_mix(dh_rng_mix(noise->seed, dh_rng_hash(name)), stream);
}

double dh__noise_cpu_s(const dh__noise_t *noise, const char *id, const char *key, double cpu_s_est)
{
    if (!(noise->cost_bias > 0) && !(noise->cost_noise > 0))
        return cpu_s_est;
    return cpu_s_est *
           dh_rng_lognormal_at(stream_seed(noise, key ? key : "", NOISE_KEY_COST),
                               noise->cost_bias) *
           dh_rng_lognormal_at(stream_seed(noise, id ? id : "", NOISE_SAMPLE_COST),
                               noise->cost_noise);
}

int64_t dh__noise_tokens(const dh__noise_t *noise, const char *id, int64_t tokens_est)
{
    if (!(noise->token_noise > 0) || tokens_est <= 0)
        return tokens_est;
    double t = (double)tokens_est *
               dh_rng_lognormal_at(stream_seed(noise, id ? id : "", NOISE_SAMPLE_TOKENS),
                                   noise->token_noise);
    return t < 1 ? 1 : (int64_t)llround(t);
}
