/* rng.c: xoshiro256** seeded by splitmix64 (public-domain algorithms by Blackman and
 * Vigna). Deterministic across platforms, so a seed names one plan everywhere. */
#include <math.h>

#include "datahelix/rng.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void dh_rng_seed(dh_rng_t *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

uint64_t dh_rng_next(dh_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t dh_rng_below(dh_rng_t *rng, uint64_t bound)
{
    /* Rejection sampling on the top of the range: no modulo bias. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do {
        r = dh_rng_next(rng);
    } while (r >= limit);
    return r % bound;
}

double dh_rng_uniform(dh_rng_t *rng)
{
    return (double)(dh_rng_next(rng) >> 11) * 0x1.0p-53;
}

double dh_rng_normal(dh_rng_t *rng)
{
    double u1 = dh_rng_uniform(rng), u2 = dh_rng_uniform(rng);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t dh_rng_mix(uint64_t a, uint64_t b)
{
    uint64_t x = a ^ rotl(b, 32) ^ 0x5851f42d4c957f2dull;
    return splitmix64(&x) ^ b;
}

uint64_t dh_rng_epoch_seed(uint64_t seed, uint64_t epoch)
{
    /* a stream of its own ("pass"), apart from the sampler's permutation of (seed, epoch) */
    return dh_rng_mix(dh_rng_mix(seed, 0x70617373ull), epoch) & (((uint64_t)1 << 62) - 1);
}

uint64_t dh_rng_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; s && *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return splitmix64(&h);
}

double dh_rng_lognormal_at(uint64_t seed, double sigma)
{
    if (!(sigma > 0))
        return 1.0;
    dh_rng_t rng;
    dh_rng_seed(&rng, seed);
    return exp(sigma * dh_rng_normal(&rng) - 0.5 * sigma * sigma);
}
