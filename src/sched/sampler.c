/* sampler.c: the seeded, epoch-aware sample order of docs/design.md §4.4 (see sampler.h).
 *
 * Epoch e is a Fisher-Yates shuffle of 0..n-1 driven by xoshiro256** seeded with
 * dh_rng_mix(seed, e), so any epoch can be rebuilt from (seed, e) alone, on any machine, and
 * every rank of a job derives the same order without talking. The current epoch's
 * permutation is cached (4 bytes per sample); moving to another epoch rebuilds it in O(n).
 * Without drop_last (dh_sampler_set_drop_last) an epoch has one more, short step: its tail,
 * padded as torch's DistributedSampler(drop_last=False) pads, with ids from the epoch's start.
 * Pure: no I/O, clocks or threads.
 */
#include <assert.h>
#include <stdbool.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/sampler.h"
#include "core/internal.h"

struct dh_sampler {
    size_t n, per_step, steps_per_epoch;
    size_t tail, tail_size; /* drop_last 0: the last step's real ids, and with its pads */
    uint64_t seed;
    int shuffle;
    uint64_t epoch; /* epoch held in perm (valid when have_epoch) */
    int have_epoch;
    uint32_t *perm; /* n ids */
};

int dh_sampler_new(dh_sampler_t **out, size_t n, size_t per_step, uint64_t seed, int shuffle)
{
    *out = NULL;
    if (n == 0 || n > UINT32_MAX)
        return dh__set_error(DH_EINVAL, "sampler: %zu samples (need 1..%u)", n, UINT32_MAX);
    if (per_step == 0 || per_step > n)
        return dh__set_error(DH_EINVAL, "sampler: %zu ids per step for %zu samples", per_step, n);
    dh_sampler_t *s = dh_calloc(1, sizeof *s);
    if (!s)
        return DH_ENOMEM;
    s->perm = dh_calloc(n, sizeof *s->perm);
    if (!s->perm) {
        dh_free(s);
        return DH_ENOMEM;
    }
    s->n = n;
    s->per_step = per_step;
    s->steps_per_epoch = n / per_step; /* drop_last: the epoch's tail is not used */
    s->seed = seed;
    s->shuffle = shuffle != 0;
    *out = s;
    return 0;
}

void dh_sampler_destroy(dh_sampler_t **sampler)
{
    if (!sampler || !*sampler)
        return;
    dh_free((*sampler)->perm);
    dh_free(*sampler);
    *sampler = NULL;
}

int dh_sampler_set_drop_last(dh_sampler_t *sampler, int drop_last, uint32_t ranks)
{
    assert(sampler);
    dh_sampler_t *s = sampler;
    if (ranks == 0 || s->per_step % ranks != 0)
        return dh__set_error(DH_EINVAL, "sampler: %zu ids per step do not split over %u ranks",
                             s->per_step, ranks);
    s->steps_per_epoch = s->n / s->per_step;
    s->tail = s->tail_size = 0;
    if (!drop_last && s->n % s->per_step) {
        /* DistributedSampler pads the epoch to ceil(n / ranks) x ranks ids; as the full steps
         * are multiples of ranks, that is the tail padded to ceil(tail / ranks) x ranks */
        s->tail = s->n % s->per_step;
        s->tail_size = (s->tail + ranks - 1) / ranks * ranks;
        s->steps_per_epoch++;
    }
    return 0;
}

size_t dh_sampler_steps_per_epoch(const dh_sampler_t *sampler)
{
    return sampler->steps_per_epoch;
}

/* Whether `step` is its epoch's short last step (drop_last 0, n not a multiple). */
static bool is_tail(const dh_sampler_t *s, uint64_t step)
{
    return s->tail && step % s->steps_per_epoch == s->steps_per_epoch - 1;
}

size_t dh_sampler_step_size(const dh_sampler_t *sampler, uint64_t step)
{
    return is_tail(sampler, step) ? sampler->tail_size : sampler->per_step;
}

size_t dh_sampler_step_pads(const dh_sampler_t *sampler, uint64_t step)
{
    return is_tail(sampler, step) ? sampler->tail_size - sampler->tail : 0;
}

/* Builds epoch e's permutation in place. O(n). */
static void build_epoch(dh_sampler_t *s, uint64_t epoch)
{
    for (size_t i = 0; i < s->n; i++)
        s->perm[i] = (uint32_t)i;
    if (s->shuffle) {
        dh_rng_t rng;
        dh_rng_seed(&rng, dh_rng_mix(s->seed, epoch));
        for (size_t i = s->n - 1; i > 0; i--) {
            size_t j = (size_t)dh_rng_below(&rng, (uint64_t)i + 1);
            uint32_t tmp = s->perm[i];
            s->perm[i] = s->perm[j];
            s->perm[j] = tmp;
        }
    }
    s->epoch = epoch;
    s->have_epoch = 1;
}

int dh_sampler_step(dh_sampler_t *sampler, uint64_t step, uint32_t *ids)
{
    assert(sampler && ids);
    uint64_t epoch = step / sampler->steps_per_epoch;
    size_t first = (size_t)(step % sampler->steps_per_epoch) * sampler->per_step;
    if (!sampler->have_epoch || sampler->epoch != epoch)
        build_epoch(sampler, epoch);
    size_t real = is_tail(sampler, step) ? sampler->tail : sampler->per_step;
    for (size_t i = 0; i < real; i++)
        ids[i] = sampler->perm[first + i];
    /* the pads: the epoch's first ids again (fewer than ranks <= per_step <= n of them) */
    for (size_t i = real; i < dh_sampler_step_size(sampler, step); i++)
        ids[i] = sampler->perm[i - real];
    return 0;
}
