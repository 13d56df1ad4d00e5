/* Tests of the seeded, epoch-aware sampler (src/sched/sampler.c). */
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/sampler.h"

#define N 1000

/* The ids of steps [first, first + count) concatenated into out. */
static void take_steps(dh_sampler_t *s, uint64_t first, size_t count, size_t per_step,
                       uint32_t *out)
{
    for (size_t k = 0; k < count; k++)
        assert_int_equal(dh_sampler_step(s, first + k, out + k * per_step), 0);
}

static void sampler_same_seed_same_order(void **state)
{
    static uint32_t a[N], b[N];
    dh_sampler_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(dh_sampler_new(&s1, N, 10, 42, 1), 0);
    assert_int_equal(dh_sampler_new(&s2, N, 10, 42, 1), 0);
    take_steps(s1, 0, 100, 10, a);
    /* Asked out of order (epoch 1 first), the second sampler still agrees on epoch 0. */
    uint32_t scratch[10];
    assert_int_equal(dh_sampler_step(s2, 150, scratch), 0);
    take_steps(s2, 0, 100, 10, b);
    assert_memory_equal(a, b, sizeof a);
    dh_sampler_destroy(&s1);
    dh_sampler_destroy(&s2);
    assert_null(s1);
    dh_sampler_destroy(&s1); /* safe on NULL */
}

static void sampler_different_seeds_and_epochs_differ(void **state)
{
    static uint32_t e0[N], e1[N], other[N];
    dh_sampler_t *s = NULL, *t = NULL;
    assert_int_equal(dh_sampler_new(&s, N, 10, 42, 1), 0);
    assert_int_equal(dh_sampler_new(&t, N, 10, 43, 1), 0);
    assert_int_equal(dh_sampler_steps_per_epoch(s), 100);
    take_steps(s, 0, 100, 10, e0);
    take_steps(s, 100, 100, 10, e1);
    take_steps(t, 0, 100, 10, other);
    assert_true(memcmp(e0, e1, sizeof e0) != 0);
    assert_true(memcmp(e0, other, sizeof e0) != 0);
    /* Each full epoch is a permutation of 0..N-1. */
    static uint8_t seen[N];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < N; i++) {
        assert_true(e1[i] < N);
        assert_int_equal(seen[e1[i]], 0);
        seen[e1[i]] = 1;
    }
    dh_sampler_destroy(&s);
    dh_sampler_destroy(&t);
}

/* With drop_last, an epoch's steps use exactly the first steps x per_step ids of its
 * permutation, each once; the next epoch starts afresh. */
static void sampler_epoch_steps_cover_distinct_prefix(void **state)
{
    enum { n = 103, per_step = 10 };
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, n, per_step, 7, 1), 0);
    size_t steps = dh_sampler_steps_per_epoch(s);
    assert_int_equal(steps, 10);
    uint32_t ids[100], again[100];
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        take_steps(s, epoch * steps, steps, per_step, ids);
        uint8_t seen[n] = {0};
        for (size_t i = 0; i < steps * per_step; i++) {
            assert_true(ids[i] < n);
            assert_int_equal(seen[ids[i]], 0); /* no duplicates within the epoch */
            seen[ids[i]] = 1;
        }
        /* The union is the permutation's prefix: re-deriving the epoch gives the same ids. */
        take_steps(s, epoch * steps, steps, per_step, again);
        assert_memory_equal(ids, again, sizeof ids);
    }
    dh_sampler_destroy(&s);
}

/* The shuffle is uniform over orders: of 3 items, every one of the 6 orders comes up over
 * 300 epochs (about 50 each). A shuffle that always moves every item (Sattolo's: j drawn
 * below i, not up to it) yields only the 2 cyclic orders, and one that never swaps the
 * first two items 3 of the 6; both still look like permutations to the other tests. */
static void sampler_shuffle_reaches_every_order(void **state)
{
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, 3, 3, 42, 1), 0);
    int seen[3][3][3] = {{{0}}};
    for (uint64_t epoch = 0; epoch < 300; epoch++) {
        uint32_t ids[3];
        assert_int_equal(dh_sampler_step(s, epoch, ids), 0); /* one step per epoch */
        assert_true(ids[0] < 3 && ids[1] < 3 && ids[2] < 3);
        seen[ids[0]][ids[1]][ids[2]]++;
    }
    static const uint32_t orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                          {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int k = 0; k < 6; k++)
        if (seen[orders[k][0]][orders[k][1]][orders[k][2]] == 0)
            fail_msg("order %u %u %u never drawn in 300 epochs", orders[k][0], orders[k][1],
                     orders[k][2]);
    dh_sampler_destroy(&s);
}

static void sampler_shuffle_off_is_identity(void **state)
{
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, 25, 4, 99, 0), 0);
    assert_int_equal(dh_sampler_steps_per_epoch(s), 6);
    uint32_t ids[4];
    for (uint64_t step = 0; step < 18; step++) {
        assert_int_equal(dh_sampler_step(s, step, ids), 0);
        for (size_t i = 0; i < 4; i++)
            assert_int_equal(ids[i], (step % 6) * 4 + i);
    }
    dh_sampler_destroy(&s);
}

/* Without drop_last, epoch e of (n, ranks, batch) as torch's DistributedSampler(drop_last=False)
 * gives it: ceil(n / per_step) steps, all full but the last, which holds the tail padded to a
 * multiple of ranks (the same rows on every rank); every id once, the pads (fewer than ranks,
 * the step's last ids) a second time, and they are the epoch's first ids in order. */
static void check_keep_tail(size_t n, uint32_t ranks, uint32_t batch, int shuffle)
{
    size_t per_step = (size_t)ranks * batch;
    dh_sampler_t *s = NULL, *dropping = NULL;
    assert_int_equal(dh_sampler_new(&s, n, per_step, 5, shuffle), 0);
    assert_int_equal(dh_sampler_new(&dropping, n, per_step, 5, shuffle), 0);
    assert_int_equal(dh_sampler_set_drop_last(s, 0, ranks), 0);
    size_t steps = dh_sampler_steps_per_epoch(s);
    assert_int_equal(steps, (n + per_step - 1) / per_step);
    size_t tail = n - (steps - 1) * per_step, padded = (tail + ranks - 1) / ranks * ranks;
    uint32_t *epoch = dh_calloc(steps * per_step, sizeof *epoch);
    int *seen = dh_calloc(n, sizeof *seen);
    assert_non_null(epoch);
    assert_non_null(seen);
    for (uint64_t e = 0; e < 3; e++) {
        memset(seen, 0, n * sizeof *seen);
        size_t total = 0;
        for (size_t k = 0; k < steps; k++) {
            uint64_t step = e * steps + k;
            size_t size = dh_sampler_step_size(s, step), pads = dh_sampler_step_pads(s, step);
            assert_int_equal(size, k + 1 < steps ? per_step : padded);
            assert_int_equal(size % ranks, 0); /* every rank the same rows */
            assert_int_equal(pads, k + 1 < steps ? 0 : padded - tail);
            assert_true(pads < ranks);
            assert_int_equal(dh_sampler_step(s, step, epoch + total), 0);
            for (size_t i = 0; i < size - pads; i++)
                seen[epoch[total + i]]++;
            for (size_t i = 0; i < pads; i++) /* the pads: the epoch's first ids again */
                assert_int_equal(epoch[total + size - pads + i], epoch[i]);
            total += size;
        }
        assert_int_equal(total, n + padded - tail);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(seen[i], 1);
        /* the full steps are drop_last's, id for id */
        uint32_t ids[64];
        assert_true(per_step <= 64);
        for (size_t k = 0; k < n / per_step; k++) {
            assert_int_equal(dh_sampler_step(dropping, e * (n / per_step) + k, ids), 0);
            assert_memory_equal(ids, epoch + k * per_step, per_step * sizeof *ids);
        }
    }
    dh_free(epoch);
    dh_free(seen);
    dh_sampler_destroy(&s);
    dh_sampler_destroy(&dropping);
}

static void sampler_keep_tail_pads_from_the_epoch_start(void **state)
{
    check_keep_tail(13, 2, 2, 1); /* tail 1: one row per rank, one pad */
    check_keep_tail(13, 2, 3, 0); /* tail 1 of 6 */
    check_keep_tail(7, 2, 2, 1);  /* tail 3: a full-size last step with one pad */
    check_keep_tail(58, 4, 4, 1); /* tail 10: 3 rows per rank, 2 pads */
    check_keep_tail(61, 4, 4, 1); /* tail 13: 4 rows per rank, 3 pads */
    check_keep_tail(60, 4, 4, 1); /* tail 12: 3 rows per rank, no pad */
    check_keep_tail(64, 4, 4, 1); /* divisible: as drop_last */
    check_keep_tail(1001, 8, 7, 1);
}

/* n a multiple of per_step, or drop_last set again: no tail step, the same steps as ever. */
static void sampler_drop_last_is_the_default(void **state)
{
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, 13, 4, 5, 1), 0);
    assert_int_equal(dh_sampler_steps_per_epoch(s), 3);
    assert_int_equal(dh_sampler_set_drop_last(s, 0, 2), 0);
    assert_int_equal(dh_sampler_steps_per_epoch(s), 4);
    assert_int_equal(dh_sampler_set_drop_last(s, 1, 2), 0);
    assert_int_equal(dh_sampler_steps_per_epoch(s), 3);
    for (uint64_t step = 0; step < 9; step++) {
        assert_int_equal(dh_sampler_step_size(s, step), 4);
        assert_int_equal(dh_sampler_step_pads(s, step), 0);
    }
    assert_int_equal(dh_sampler_set_drop_last(s, 0, 3), DH_EINVAL); /* 4 ids over 3 ranks */
    assert_int_equal(dh_sampler_set_drop_last(s, 0, 0), DH_EINVAL);
    dh_sampler_destroy(&s);
}

/* The whole of epoch e's order: one step of all n ids. */
static void whole_epoch(size_t n, uint64_t seed, uint64_t epoch, uint32_t *perm)
{
    dh_sampler_t *all = NULL;
    assert_int_equal(dh_sampler_new(&all, n, n, seed, 1), 0);
    assert_int_equal(dh_sampler_step(all, epoch, perm), 0);
    dh_sampler_destroy(&all);
}

/* An epoch cut from sample P (dh_sampler_set_start, an elastic resume): its step k is the
 * window [P + k x per_step, ...) of the same order, as an uninterrupted run with this
 * per_step would take from P; its steps are floor((n - P) / per_step), ceil without
 * drop_last with the tail padded from the epoch's first ids (none of the tail's); the ids
 * before P are in none; the epochs before and after it are the uncut sampler's, the global
 * steps after it moved by its step count. */
static void check_start(size_t n, uint32_t ranks, uint32_t batch, size_t from, int drop_last)
{
    enum { seed = 11, cut = 1 };
    size_t per_step = (size_t)ranks * batch;
    uint32_t *perm = dh_calloc(n, sizeof *perm), *ids = dh_calloc(per_step, sizeof *ids);
    uint32_t *plain_ids = dh_calloc(per_step, sizeof *ids);
    int *seen = dh_calloc(n, sizeof *seen);
    assert_true(perm && ids && plain_ids && seen);
    whole_epoch(n, seed, cut, perm);
    dh_sampler_t *s = NULL, *plain = NULL;
    assert_int_equal(dh_sampler_new(&s, n, per_step, seed, 1), 0);
    assert_int_equal(dh_sampler_new(&plain, n, per_step, seed, 1), 0);
    assert_int_equal(dh_sampler_set_start(s, cut, from), 0);
    assert_int_equal(dh_sampler_set_drop_last(s, drop_last, ranks), 0); /* either order */
    assert_int_equal(dh_sampler_set_drop_last(plain, drop_last, ranks), 0);
    size_t spe = dh_sampler_steps_per_epoch(s), left = n - from;
    size_t steps = drop_last ? left / per_step : (left + per_step - 1) / per_step;
    assert_int_equal(spe, dh_sampler_steps_per_epoch(plain));
    assert_int_equal(dh_sampler_epoch_steps(s, cut), steps);
    assert_int_equal(dh_sampler_epoch_steps(s, cut + 1), spe);
    assert_int_equal(dh_sampler_epoch_first_step(s, cut), cut * spe);
    assert_int_equal(dh_sampler_epoch_first_step(s, cut + 1), cut * spe + steps);
    assert_int_equal(dh_sampler_epoch_first_step(s, cut + 2), cut * spe + steps + spe);
    for (size_t k = 0; k < steps; k++) {
        uint64_t step = cut * spe + k;
        size_t at = from + k * per_step, real = left - k * per_step;
        real = real < per_step ? real : per_step;
        size_t size = dh_sampler_step_size(s, step), pads = dh_sampler_step_pads(s, step);
        size_t index = 99;
        assert_int_equal(dh_sampler_step_epoch(s, step, &index), cut);
        assert_int_equal(index, k);
        assert_int_equal(size - pads, real);
        assert_int_equal(size % ranks, 0);
        assert_true(pads < ranks);
        assert_int_equal(dh_sampler_step(s, step, ids), 0);
        assert_memory_equal(ids, perm + at, real * sizeof *ids); /* the window from P */
        for (size_t i = 0; i < real; i++)
            seen[ids[i]]++;
        for (size_t i = 0; i < pads; i++) { /* the epoch's first ids, none of the step's */
            assert_int_equal(ids[real + i], perm[i]);
            assert_true(i < at);
        }
        /* from a step boundary of per_step, the uncut sampler's steps, id for id */
        if (from % per_step == 0) {
            assert_int_equal(dh_sampler_step(plain, cut * spe + from / per_step + k, plain_ids), 0);
            assert_memory_equal(ids, plain_ids, size * sizeof *ids);
        }
    }
    size_t end = drop_last ? from + steps * per_step : n;
    for (size_t i = 0; i < n; i++) /* the ids from P, once; none before it */
        assert_int_equal(seen[perm[i]], i >= from && i < end);
    /* the epochs around it are the uncut sampler's, at their moved global steps */
    for (uint64_t e = 0; e < 4; e++) {
        if (e == cut)
            continue;
        for (size_t k = 0; k < spe; k++) {
            uint64_t step = dh_sampler_epoch_first_step(s, e) + k;
            assert_int_equal(dh_sampler_step_epoch(s, step, NULL), e);
            assert_int_equal(dh_sampler_step_size(s, step),
                             dh_sampler_step_size(plain, e * spe + k));
            assert_int_equal(dh_sampler_step(s, step, ids), 0);
            assert_int_equal(dh_sampler_step(plain, e * spe + k, plain_ids), 0);
            assert_memory_equal(ids, plain_ids, dh_sampler_step_size(s, step) * sizeof *ids);
        }
    }
    dh_free(perm);
    dh_free(ids);
    dh_free(plain_ids);
    dh_free(seen);
    dh_sampler_destroy(&s);
    dh_sampler_destroy(&plain);
}

static void sampler_start_cuts_an_epoch_from_a_sample(void **state)
{
    for (int drop_last = 0; drop_last < 2; drop_last++) {
        check_start(95, 4, 3, 6, drop_last);  /* 2 x 3 stopped after 1 step, on 4 x 3 */
        check_start(95, 1, 3, 6, drop_last);  /* ... on 1 x 3 */
        check_start(95, 3, 3, 24, drop_last); /* 2 x 3 after 4 steps, on 3 x 3: 24 % 9 */
        check_start(95, 3, 2, 24, drop_last); /* a step boundary: the uncut steps */
        check_start(95, 4, 3, 90, drop_last); /* 5 left: no full step, a padded tail */
        check_start(95, 4, 3, 95, drop_last); /* nothing left */
        check_start(9, 8, 1, 3, drop_last);   /* P < ranks, one tail step: 2 pads <= P */
        check_start(1001, 8, 7, 333, drop_last);
    }
}

/* The 2 x 3 job stopped after step 1 resumes on 4 x 3 ranks at sample 6: the old run's
 * step and the new run's steps are consecutive windows of the order, each sample once. */
static void sampler_start_continues_another_step_size(void **state)
{
    enum { n = 95 };
    uint32_t perm[n], ids[12];
    int seen[n] = {0};
    whole_epoch(n, 3, 0, perm);
    dh_sampler_t *old = NULL, *resumed = NULL;
    assert_int_equal(dh_sampler_new(&old, n, 6, 3, 1), 0);
    assert_int_equal(dh_sampler_new(&resumed, n, 12, 3, 1), 0);
    assert_int_equal(dh_sampler_set_start(resumed, 0, 6), 0);
    assert_int_equal(dh_sampler_step(old, 0, ids), 0);
    size_t at = 0;
    for (size_t i = 0; i < 6; i++, at++)
        assert_int_equal(ids[i], perm[at]);
    assert_int_equal(dh_sampler_epoch_steps(resumed, 0), (n - 6) / 12);
    for (uint64_t k = 0; k < (n - 6) / 12; k++) {
        assert_int_equal(dh_sampler_step(resumed, k, ids), 0);
        for (size_t i = 0; i < 12; i++, at++)
            assert_int_equal(ids[i], perm[at]);
    }
    for (size_t i = 0; i < at; i++)
        assert_int_equal(seen[perm[i]]++, 0);
    assert_int_equal(at, 6 + (n - 6) / 12 * 12);
    /* a new start replaces the last; 0 undoes it; past the epoch is refused */
    assert_int_equal(dh_sampler_set_start(resumed, 0, 0), 0);
    assert_int_equal(dh_sampler_epoch_steps(resumed, 0), n / 12);
    assert_int_equal(dh_sampler_step(resumed, 0, ids), 0);
    assert_memory_equal(ids, perm, sizeof ids);
    assert_int_equal(dh_sampler_set_start(resumed, 0, n + 1), DH_EINVAL);
    assert_string_equal(dh_last_error(), "sampler: epoch 0 cannot start at sample 96 of 95");
    dh_sampler_destroy(&old);
    dh_sampler_destroy(&resumed);
}

static void sampler_rejects_bad_sizes(void **state)
{
    dh_sampler_t *s = (dh_sampler_t *)&s;
    assert_int_equal(dh_sampler_new(&s, 0, 1, 0, 1), DH_EINVAL);
    assert_null(s);
    assert_int_equal(dh_sampler_new(&s, 10, 0, 0, 1), DH_EINVAL);
    assert_int_equal(dh_sampler_new(&s, 10, 11, 0, 1), DH_EINVAL);
    assert_int_equal(dh_sampler_new(&s, 10, 10, 0, 1), 0);
    assert_int_equal(dh_sampler_steps_per_epoch(s), 1);
    dh_sampler_destroy(&s);
}

static int sampler_draw(void *ctx)
{
    dh_sampler_t *s = NULL;
    int rc = dh_sampler_new(&s, 100, 10, 1, 1);
    uint32_t ids[10];
    if (rc == 0)
        rc = dh_sampler_step(s, 12, ids);
    dh_sampler_destroy(&s);
    return rc;
}

static void sampler_survives_each_allocation_failure(void **state)
{
    assert_true(dh_test_each_allocation_failure(sampler_draw, NULL) > 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sampler_same_seed_same_order),
    cmocka_unit_test(sampler_different_seeds_and_epochs_differ),
    cmocka_unit_test(sampler_epoch_steps_cover_distinct_prefix),
    cmocka_unit_test(sampler_shuffle_reaches_every_order),
    cmocka_unit_test(sampler_shuffle_off_is_identity),
    cmocka_unit_test(sampler_keep_tail_pads_from_the_epoch_start),
    cmocka_unit_test(sampler_drop_last_is_the_default),
    cmocka_unit_test(sampler_start_cuts_an_epoch_from_a_sample),
    cmocka_unit_test(sampler_start_continues_another_step_size),
    cmocka_unit_test(sampler_rejects_bad_sizes),
    cmocka_unit_test(sampler_survives_each_allocation_failure),
};
DH_TEST_MAIN(tests)
