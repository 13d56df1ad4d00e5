/* rng.h: a small, seeded, reproducible random generator (xoshiro256** seeded by
 * splitmix64). Pure: the state is a value the caller owns, so planners and samplers stay
 * deterministic for a seed, on every platform. */
#ifndef DATAHELIX_RNG_H
#define DATAHELIX_RNG_H

#include "datahelix/export.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_rng {
    uint64_t s[4];
} dh_rng_t;

/* Seeds the generator; any seed (0 included) is valid. */
DH_EXTERN void dh_rng_seed(dh_rng_t *rng, uint64_t seed);

/* Next 64 random bits. */
DH_EXTERN uint64_t dh_rng_next(dh_rng_t *rng);

/* Uniform integer in [0, bound) without modulo bias; bound > 0. */
DH_EXTERN uint64_t dh_rng_below(dh_rng_t *rng, uint64_t bound);

/* Uniform double in [0, 1). */
DH_EXTERN double dh_rng_uniform(dh_rng_t *rng);

/* Standard normal (Box-Muller). */
DH_EXTERN double dh_rng_normal(dh_rng_t *rng);

/* Mixes several words into one seed (for seed x epoch x step streams). */
DH_EXTERN uint64_t dh_rng_mix(uint64_t a, uint64_t b);

/* The base seed of a loader's pass over `epoch` (as torch's DataLoader draws one per
 * iterator): a pure function of (seed, epoch), in [0, 2^62) so that base + worker id stays
 * an int64 (Python workers seed random, NumPy and torch from it; docs/datasets.md,
 * "Randomness"). Different epochs give different seeds; the same pair the same seed. */
DH_EXTERN uint64_t dh_rng_epoch_seed(uint64_t seed, uint64_t epoch);

/* A 64-bit hash of a string (FNV-1a, then mixed), to seed a draw by a name such as a sample
 * id or a profile key; NULL hashes as "". */
DH_EXTERN uint64_t dh_rng_hash(const char *s);

/* A mean-one lognormal factor, a pure function of seed: exp(sigma z - sigma^2 / 2) with z
 * the first standard normal of a generator seeded with seed, so its expectation is 1 and
 * the same seed gives the same factor in any order, on every platform. Exactly 1 when
 * sigma <= 0. */
DH_EXTERN double dh_rng_lognormal_at(uint64_t seed, double sigma);

#ifdef __cplusplus
}
#endif
#endif
