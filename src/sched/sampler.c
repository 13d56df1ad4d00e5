/* sampler.c: the seeded, epoch-aware sample order of docs/design.md §4.4 (see sampler.h).
 *
 * Epoch e is a Fisher-Yates shuffle of 0..n-1 driven by xoshiro256** seeded with
 * dh_rng_mix(seed, e), so any epoch can be rebuilt from (seed, e) alone, on any machine, and
 * every rank of a job derives the same order without talking. The current epoch's
 * permutation is cached (4 bytes per sample); moving to another epoch rebuilds it in O(n).
 * Without drop_last (dh_sampler_set_drop_last) an epoch has one more, short step: its tail,
 * padded as torch's DistributedSampler(drop_last=False) pads, with ids from the epoch's start.
 * One epoch may be cut from a sample offset (dh_sampler_set_start: an elastic resume); it
 * then has its own step count, and the global steps of the epochs after it move with it.
 * Pure: no I/O, clocks or threads.
 */
#include <assert.h>
#include <stdbool.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/sampler.h"
#include "core/internal.h"

/* How one epoch is cut into steps: from sample `from` of its order, `steps` steps of
 * per_step ids, the last one (tail != 0) holding `tail` ids and tail_size - tail pads. */
typedef struct cut {
    size_t from, steps, tail, tail_size;
} cut_t;

struct dh_sampler {
    size_t n, per_step, steps_per_epoch;
    size_t tail, tail_size; /* drop_last 0: the last step's real ids, and with its pads */
    int drop_last;
    uint32_t ranks;
    int has_start;        /* dh_sampler_set_start: epoch start_epoch is cut from `start` */
    uint64_t start_epoch; /* (its global steps begin at start_epoch x steps_per_epoch) */
    cut_t start;
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
    s->drop_last = 1;
    s->ranks = 1;
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

/* The cut of an epoch from sample `from` (<= n) under the sampler's drop_last: full steps,
 * and without drop_last a short padded last one for what is left. */
static cut_t cut_from(const dh_sampler_t *s, size_t from)
{
    size_t left = s->n - from;
    cut_t c = {.from = from, .steps = left / s->per_step};
    if (!s->drop_last && left % s->per_step) {
        /* DistributedSampler pads the epoch to ceil(n / ranks) x ranks ids; as the full steps
         * are multiples of ranks, that is the tail padded to ceil(tail / ranks) x ranks */
        c.tail = left % s->per_step;
        c.tail_size = (c.tail + s->ranks - 1) / s->ranks * s->ranks;
        c.steps++;
    }
    return c;
}

/* Recomputes the cuts after a setting changed. */
static void recut(dh_sampler_t *s)
{
    cut_t c = cut_from(s, 0);
    s->steps_per_epoch = c.steps;
    s->tail = c.tail;
    s->tail_size = c.tail_size;
    if (s->has_start)
        s->start = cut_from(s, s->start.from);
}

int dh_sampler_set_drop_last(dh_sampler_t *sampler, int drop_last, uint32_t ranks)
{
    assert(sampler);
    dh_sampler_t *s = sampler;
    if (ranks == 0 || s->per_step % ranks != 0)
        return dh__set_error(DH_EINVAL, "sampler: %zu ids per step do not split over %u ranks",
                             s->per_step, ranks);
    s->drop_last = drop_last != 0;
    s->ranks = ranks;
    recut(s);
    return 0;
}

int dh_sampler_set_start(dh_sampler_t *sampler, uint64_t epoch, size_t first_sample)
{
    assert(sampler);
    dh_sampler_t *s = sampler;
    if (first_sample > s->n)
        return dh__set_error(DH_EINVAL, "sampler: epoch %llu cannot start at sample %zu of %zu",
                             (unsigned long long)epoch, first_sample, s->n);
    if (epoch > UINT64_MAX / 2 / s->steps_per_epoch)
        return dh__set_error(DH_EINVAL, "sampler: epoch %llu is too far to start at a sample",
                             (unsigned long long)epoch);
    s->has_start = first_sample != 0;
    s->start_epoch = epoch;
    s->start.from = first_sample;
    recut(s);
    return 0;
}

size_t dh_sampler_steps_per_epoch(const dh_sampler_t *sampler)
{
    return sampler->steps_per_epoch;
}

/* Where global step `step` is: its epoch, its index in it, and that epoch's cut. */
typedef struct where {
    uint64_t epoch;
    size_t index;
    cut_t cut;
} where_t;

static where_t locate(const dh_sampler_t *s, uint64_t step)
{
    where_t w = {
        .cut = {
            .from = 0, .steps = s->steps_per_epoch, .tail = s->tail, .tail_size = s->tail_size}};
    uint64_t spe = s->steps_per_epoch, at = s->has_start ? s->start_epoch * spe : UINT64_MAX;
    if (step < at) {
        w.epoch = step / spe;
        w.index = (size_t)(step % spe);
    } else if (step - at < s->start.steps) {
        w.epoch = s->start_epoch;
        w.index = (size_t)(step - at);
        w.cut = s->start;
    } else {
        uint64_t rest = step - at - s->start.steps;
        w.epoch = s->start_epoch + 1 + rest / spe;
        w.index = (size_t)(rest % spe);
    }
    return w;
}

size_t dh_sampler_epoch_steps(const dh_sampler_t *sampler, uint64_t epoch)
{
    return sampler->has_start && epoch == sampler->start_epoch ? sampler->start.steps
                                                               : sampler->steps_per_epoch;
}

uint64_t dh_sampler_epoch_first_step(const dh_sampler_t *sampler, uint64_t epoch)
{
    const dh_sampler_t *s = sampler;
    uint64_t first = epoch * s->steps_per_epoch;
    if (s->has_start && epoch > s->start_epoch)
        first = first - s->steps_per_epoch + s->start.steps;
    return first;
}

uint64_t dh_sampler_step_epoch(const dh_sampler_t *sampler, uint64_t step, size_t *index)
{
    where_t w = locate(sampler, step);
    if (index)
        *index = w.index;
    return w.epoch;
}

/* Whether the step at `w` is its epoch's short last step (drop_last 0, not a multiple). */
static bool is_tail(where_t w)
{
    return w.cut.tail && w.index == w.cut.steps - 1;
}

size_t dh_sampler_step_size(const dh_sampler_t *sampler, uint64_t step)
{
    where_t w = locate(sampler, step);
    return is_tail(w) ? w.cut.tail_size : sampler->per_step;
}

size_t dh_sampler_step_pads(const dh_sampler_t *sampler, uint64_t step)
{
    where_t w = locate(sampler, step);
    return is_tail(w) ? w.cut.tail_size - w.cut.tail : 0;
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
    where_t w = locate(sampler, step);
    size_t first = w.cut.from + w.index * sampler->per_step;
    if (!sampler->have_epoch || sampler->epoch != w.epoch)
        build_epoch(sampler, w.epoch);
    size_t real = is_tail(w) ? w.cut.tail : sampler->per_step;
    size_t size = is_tail(w) ? w.cut.tail_size : sampler->per_step;
    /* the pads: the epoch's first ids again (fewer than ranks of them), before the step's:
     * an epoch cut from 0 has per_step >= ranks ids before its tail (n >= per_step); one cut
     * from P >= ranks too, and for P < ranks, its tail step holds n - P ids with n >= per_step,
     * so its pads ((P - n) mod ranks) are P - (n mod ranks) <= P of them */
    assert(size - real <= first);
    for (size_t i = 0; i < real; i++)
        ids[i] = sampler->perm[first + i];
    for (size_t i = real; i < size; i++)
        ids[i] = sampler->perm[i - real];
    return 0;
}
