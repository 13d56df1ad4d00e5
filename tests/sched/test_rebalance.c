/* Tests of tier 2's default policy and cost gate (src/sched/rebalance.c): swaps keep the
 * per-rank counts and lower the largest rank, moves (packing) may change counts, the gate
 * keeps the assignment when the transfer costs more than the gain, the decision is the same
 * for the same inputs, a balanced round is kept, and bad inputs are named. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "datahelix/rebalance.h"

/* 2 ranks x 2 samples: rank 0 holds 900 + 700 tokens, rank 1 100 + 300 */
static const dh_rebalance_item_t skewed[4] = {
    {0, 900, 1e6}, {0, 700, 1e6}, {1, 100, 1e6}, {1, 300, 1e6}};

static void counts(const uint32_t *rank, size_t n, uint32_t ranks, uint32_t *out)
{
    memset(out, 0, ranks * sizeof *out);
    for (size_t i = 0; i < n; i++)
        out[rank[i]]++;
}

static double max_load(const dh_rebalance_item_t *items, const uint32_t *rank, size_t n,
                       uint32_t ranks)
{
    double load[8] = {0};
    for (size_t i = 0; i < n; i++)
        load[rank[i]] += items[i].tokens;
    double m = 0;
    for (uint32_t r = 0; r < ranks; r++)
        m = fmax(m, load[r]);
    return m;
}

/* Fixed batch: swaps only, so each rank keeps 2 samples; the largest rank falls from 1600
 * to 1000 tokens (900 + 100 against 700 + 300) and the gate lets it through (no transfer
 * cost on one node). */
static void swaps_keep_counts_and_lower_the_largest_rank(void **state)
{
    (void)state;
    dh_rebalance_params_t p;
    dh_rebalance_params_default(&p);
    p.ranks = 2;
    p.s_per_token = 1e-3;
    uint32_t nr[4];
    dh_rebalance_verdict_t v;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), 0);
    uint32_t c[2];
    counts(nr, 4, 2, c);
    assert_int_equal(c[0], 2);
    assert_int_equal(c[1], 2);
    assert_true(v.applied);
    assert_true(fabs(v.max_before_s - 1.6) < 1e-9);
    assert_true(fabs(v.max_after_s - 1.0) < 1e-9);
    assert_true(fabs(max_load(skewed, nr, 4, 2) - 1000) < 1e-9);
    assert_true(fabs(v.gain_s - 0.6) < 1e-9);
    assert_int_equal(v.moved, 2);
    assert_true(v.cost_s == 0);
}

/* Packing: single moves, counts may change; 4 ranks, one holding everything. */
static void moves_balance_when_counts_may_change(void **state)
{
    (void)state;
    dh_rebalance_item_t items[8];
    for (int i = 0; i < 8; i++)
        items[i] = (dh_rebalance_item_t){0, 100, 10};
    dh_rebalance_params_t p;
    dh_rebalance_params_default(&p);
    p.ranks = 4;
    p.keep_counts = 0;
    uint32_t nr[8];
    dh_rebalance_verdict_t v;
    assert_int_equal(dh_rebalance_plan(items, 8, &p, nr, &v), 0);
    uint32_t c[4];
    counts(nr, 8, 4, c);
    for (int r = 0; r < 4; r++)
        assert_int_equal(c[r], 2);
    assert_true(v.applied);
    assert_int_equal(v.moved, 6);
    assert_true(fabs(v.max_after_s - 200) < 1e-9);
    /* with counts kept there is nothing to swap with: kept */
    p.keep_counts = 1;
    assert_int_equal(dh_rebalance_plan(items, 8, &p, nr, &v), 0);
    assert_false(v.applied);
    assert_int_equal(v.moved, 0);
}

/* The gate: the same proposal is kept when its transfer costs more than its gain plus the
 * margin, and applied when it does not. The proposal's inputs are reported either way. */
static void gate_keeps_the_assignment_when_moving_costs_more(void **state)
{
    (void)state;
    dh_rebalance_params_t p;
    dh_rebalance_params_default(&p);
    p.ranks = 2;
    p.s_per_token = 1e-3; /* gain 0.6 s, margin 0.05 x 1.6 = 0.08 s */
    uint32_t nr[4];
    dh_rebalance_verdict_t v;
    /* a swap moves 2 x 1 MB through each rank's link: 2 MB at 1 GB/s = 2 ms: applied */
    p.move_s_per_B = 1e-9;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), 0);
    assert_true(v.applied);
    assert_true(fabs(v.cost_s - 2e-3) < 1e-12);
    /* at 4 MB/s the same 2 MB cost 0.5 s: 0.6 - 0.5 > 0.08, still applied */
    p.move_s_per_B = 2.5e-7;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), 0);
    assert_true(v.applied);
    /* at 3.2 MB/s they cost 0.625 s, more than the gain: kept */
    p.move_s_per_B = 3.125e-7;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), 0);
    assert_false(v.applied);
    assert_int_equal(v.moved, 0);
    assert_true(fabs(v.gain_s - 0.6) < 1e-9 && fabs(v.cost_s - 0.625) < 1e-9);
    for (int i = 0; i < 4; i++)
        assert_int_equal(nr[i], skewed[i].rank);
    /* with 0.5 s of slack before the batch is consumed only 0.125 s of it lands on the
     * critical path: applied */
    p.slack_s = 0.5;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), 0);
    assert_true(v.applied);
    assert_true(fabs(v.transfer_s - 0.625) < 1e-9 && fabs(v.cost_s - 0.125) < 1e-9);
    p.slack_s = 0;
    /* the margin alone: with min_gain above the gain's share, kept */
    p.move_s_per_B = 0;
    p.min_gain = 0.5; /* 0.8 s > 0.6 s */
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), 0);
    assert_false(v.applied);
}

/* Balanced rounds and empty rounds are kept; the same inputs give the same decision. */
static void balanced_rounds_are_kept_and_decisions_repeat(void **state)
{
    (void)state;
    const dh_rebalance_item_t even[4] = {{0, 500, 1}, {0, 500, 1}, {1, 400, 1}, {1, 600, 1}};
    dh_rebalance_params_t p;
    dh_rebalance_params_default(&p);
    p.ranks = 2;
    uint32_t nr[4];
    dh_rebalance_verdict_t v, w;
    assert_int_equal(dh_rebalance_plan(even, 4, &p, nr, &v), 0);
    assert_false(v.applied);
    assert_true(v.gain_s == 0);
    assert_int_equal(dh_rebalance_plan(NULL, 0, &p, nr, &v), 0);
    assert_false(v.applied);
    /* 64 samples over 8 ranks, tokens from a fixed pattern: twice the same */
    dh_rebalance_item_t many[64];
    for (int i = 0; i < 64; i++)
        many[i] = (dh_rebalance_item_t){(uint32_t)(i % 8), (double)((i * 7919) % 1000), 1e5};
    p.ranks = 8;
    uint32_t first[64], second[64];
    assert_int_equal(dh_rebalance_plan(many, 64, &p, first, &v), 0);
    assert_int_equal(dh_rebalance_plan(many, 64, &p, second, &w), 0);
    assert_memory_equal(first, second, sizeof first);
    assert_true(v.max_after_s <= v.max_before_s);
    assert_true(fabs(max_load(many, first, 64, 8) - v.max_after_s) < 1e-9);
}

/* Fixed counts, several large items: the plan reaches the even split (11 tokens on each of
 * 3 ranks, 2 items each), whatever the start, and keeps every rank's count. */
static void fixed_counts_reach_the_even_split(void **state)
{
    (void)state;
    const dh_rebalance_item_t start[6] = {{0, 8, 1}, {0, 7, 1}, {1, 6, 1},
                                          {1, 5, 1}, {2, 4, 1}, {2, 3, 1}};
    dh_rebalance_params_t p;
    dh_rebalance_params_default(&p);
    p.ranks = 3;
    p.min_gain = 0;
    uint32_t nr[6], c[3];
    dh_rebalance_verdict_t v;
    assert_int_equal(dh_rebalance_plan(start, 6, &p, nr, &v), 0);
    assert_true(v.applied);
    assert_true(fabs(v.max_before_s - 15) < 1e-9);
    assert_true(fabs(v.max_after_s - 11) < 1e-9);
    counts(nr, 6, 3, c);
    for (int r = 0; r < 3; r++)
        assert_int_equal(c[r], 2);
}

static void bad_inputs_are_named(void **state)
{
    (void)state;
    dh_rebalance_params_t p;
    dh_rebalance_params_default(&p);
    uint32_t nr[4];
    dh_rebalance_verdict_t v;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), DH_EINVAL); /* ranks 0 */
    assert_non_null(strstr(dh_last_error(), "ranks"));
    p.ranks = 1;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "item 2: rank 1 of 1"));
    p.ranks = 2;
    p.s_per_token = 0;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "s_per_token"));
    p.s_per_token = 1;
    p.slack_s = -1;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "slack_s"));
    p.slack_s = 0;
    p.move_s_per_B = -1;
    assert_int_equal(dh_rebalance_plan(skewed, 4, &p, nr, &v), DH_EINVAL);
    p.move_s_per_B = 0;
    dh_rebalance_item_t bad[1] = {{0, NAN, 1}};
    assert_int_equal(dh_rebalance_plan(bad, 1, &p, nr, &v), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "item 0"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(swaps_keep_counts_and_lower_the_largest_rank),
    cmocka_unit_test(moves_balance_when_counts_may_change),
    cmocka_unit_test(gate_keeps_the_assignment_when_moving_costs_more),
    cmocka_unit_test(balanced_rounds_are_kept_and_decisions_repeat),
    cmocka_unit_test(fixed_counts_reach_the_even_split),
    cmocka_unit_test(bad_inputs_are_named),
};
DH_TEST_MAIN(tests)
