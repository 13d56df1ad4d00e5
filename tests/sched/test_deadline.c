/* Tests of the deadline and adaptive-prefetch rules (src/sched/deadline.c): the predicted
 * compute of a batch, D(b) and its edge cases, when the prefetch horizon deepens, and the
 * byte rules (a rank's share of the arena, the horizon in bytes, the arena's size). */
#include <stdint.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"

static const int64_t ring[4] = {100, 200, 0, 400}; /* batch b's tokens at b % 4 */

static dh_deadline_model_t model(double s_per_token, double mean_window_s)
{
    return (dh_deadline_model_t){
        .s_per_token = s_per_token, .mean_window_s = mean_window_s, .tokens = ring, .n_tokens = 4};
}

/* With seconds per token measured, a batch with tokens costs s_per_token x tokens; a batch
 * without tokens, or any batch before s_per_token is known, costs the mean window. */
static void compute_is_tokens_or_mean_window(void **state)
{
    dh_deadline_model_t m = model(0.001, 0.5);
    assert_close(dh_deadline_compute_s(&m, 0), 0.1, 1e-12);
    assert_close(dh_deadline_compute_s(&m, 5), 0.2, 1e-12); /* the ring wraps */
    assert_close(dh_deadline_compute_s(&m, 2), 0.5, 0);     /* no tokens */
    m.s_per_token = 0;
    assert_close(dh_deadline_compute_s(&m, 0), 0.5, 0); /* not measured */
    m.s_per_token = -1;
    assert_close(dh_deadline_compute_s(&m, 3), 0.5, 0);
}

/* Nothing returned yet, or a batch already due: the deadline is now. */
static void deadline_is_zero_before_first_return_and_when_due(void **state)
{
    dh_deadline_model_t m = model(0.001, 0.5);
    assert_close(dh_deadline_s(&m, 0, 0, 0), 0, 0);
    assert_close(dh_deadline_s(&m, 7, 0, 0), 0, 0);
    assert_close(dh_deadline_s(&m, 2, 3, 0), 0, 0);
}

/* b == consumed: what is left of the current window (batch consumed-1's); each batch
 * between adds its predicted window. */
static void deadline_adds_windows_of_batches_between(void **state)
{
    dh_deadline_model_t m = model(0.001, 0.5);
    /* consumed 2: the window of batch 1 (0.2 s), 0.05 s of it gone */
    assert_close(dh_deadline_s(&m, 2, 2, 0.05), 0.15, 1e-12);
    /* plus batch 2 (no tokens: 0.5) and batch 3 (0.4) */
    assert_close(dh_deadline_s(&m, 4, 2, 0.05), 0.15 + 0.5 + 0.4, 1e-12);
}

/* A window overrun counts as 0 left, never negative; exactly used up is 0 too. */
static void deadline_overrun_clamps_at_zero(void **state)
{
    dh_deadline_model_t m = model(0.001, 0.5);
    assert_close(dh_deadline_s(&m, 1, 1, 0.1), 0, 1e-12); /* exactly the window */
    assert_close(dh_deadline_s(&m, 1, 1, 3.0), 0, 0);
    assert_close(dh_deadline_s(&m, 2, 1, 3.0), 0.2, 1e-12); /* later batches still count */
}

/* Doubles on a wait or a near miss in steady state, caps at max, and holds while filling,
 * while the arena is half full, when there is no window yet, when max is 0 (fixed) and
 * when batches arrive early. */
static void prefetch_horizon_rule(void **state)
{
    const double w = 0.1; /* compute window, s */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0.05, 0, w, 0.1), 8);   /* waited */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0, 0.05, w, 0.1), 8);   /* near miss */
    assert_int_equal(dh_deadline_prefetch_horizon(12, 16, 20, 0.05, 0, w, 0.1), 16); /* capped */
    assert_int_equal(dh_deadline_prefetch_horizon(16, 16, 20, 0.05, 0, w, 0.1), 16); /* at max */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 3, 0.05, 0, w, 0.1), 4);    /* filling */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0.05, 0, w, 0.5), 4);   /* arena */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0.05, 0, 0, 0.1), 4);   /* no window */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 0, 10, 0.05, 0, w, 0.1), 4);    /* fixed */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0.0005, 0.5, w, 0.1), 4); /* early */
    assert_int_equal(dh_deadline_prefetch_horizon(1u << 31, UINT32_MAX, 1ull << 40, 1, 0, w, 0),
                     UINT32_MAX); /* no overflow */
}

/* The boundaries: batch == horizon is steady state; a wait of exactly 1% of the window and
 * a slack of exactly one window are not misses; an arena just under half full still grows. */
static void prefetch_horizon_edges(void **state)
{
    const double w = 0.1;
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 4, 0.05, 0, w, 0), 8);
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0.01 * w, w, w, 0), 4);
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0.02 * w, w, w, 0), 8);
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0, 0.0999, w, 0), 8);
    assert_int_equal(dh_deadline_prefetch_horizon(4, 16, 10, 0.05, 0, w, 0.4999), 8);
    assert_int_equal(dh_deadline_prefetch_horizon(4, 8, 10, 0.05, 0, w, 0), 8); /* exactly 2x */
    assert_int_equal(dh_deadline_prefetch_horizon(4, 3, 10, 0.05, 0, w, 0), 4); /* max < h */
}

#define MB 1e6
#define MIB 1048576.0

/* A rank's share of its node's arena: capacity / ranks, less the margin; 0 ranks is 1. */
static void rank_budget_is_share_less_margin(void **state)
{
    uint64_t gib = (uint64_t)1 << 30;
    assert_close(dh_deadline_rank_budget(gib, 4), gib / 4.0 * (1 - DH_DEADLINE_ARENA_MARGIN), 1e-6);
    assert_close(dh_deadline_rank_budget(gib, 0), gib * (1 - DH_DEADLINE_ARENA_MARGIN), 1e-6);
    assert_close(dh_deadline_rank_budget(0, 4), 0, 0);
}

/* Decoded samples of 16-60 MB, batch 2: a 512 MiB arena shared by 4 ranks (about 122 MiB
 * each) holds one or two batches, whatever the deadlines ask; a 4 GiB one holds the whole
 * horizon of 8 the deadlines asked for. */
static void byte_horizon_caps_large_samples(void **state)
{
    const double batches[8] = {2 * 60 * MB, 2 * 16 * MB, 2 * 30 * MB, 2 * 60 * MB,
                               2 * 45 * MB, 2 * 16 * MB, 2 * 60 * MB, 2 * 24 * MB};
    double small = dh_deadline_rank_budget((uint64_t)512 << 20, 4);
    assert_int_equal(dh_deadline_byte_horizon(8, batches, 8, 0, small), 1);     /* 120 + 32 > 122 */
    assert_int_equal(dh_deadline_byte_horizon(8, batches + 1, 7, 0, small), 2); /* 32 + 60 */
    double big = dh_deadline_rank_budget((uint64_t)4 << 30, 4);                 /* 1020 MiB */
    assert_int_equal(dh_deadline_byte_horizon(8, batches, 8, 0, big), 8);       /* 622 MB in all */
    assert_int_equal(dh_deadline_byte_horizon(4, batches, 8, 0, big), 4);       /* the deadlines */
    assert_int_equal(dh_deadline_byte_horizon(8, batches, 3, 0, big), 3);       /* known batches */
    /* the batch the rank computes on counts: 900 MB held leaves room for 120 + 32 + 60 */
    assert_int_equal(dh_deadline_byte_horizon(8, batches, 8, 800 * MB, big), 3);
}

/* Exactly at the budget fits; one byte over does not; the first batch always goes (a batch
 * larger than the whole share, a zero or NaN budget); bytes NaN or < 0 count as 0; no
 * horizon or no batches is 0. */
static void byte_horizon_edges(void **state)
{
    const double b[3] = {10, 20, 30};
    assert_int_equal(dh_deadline_byte_horizon(3, b, 3, 0, 60), 3);
    assert_int_equal(dh_deadline_byte_horizon(3, b, 3, 0, 59), 2);
    assert_int_equal(dh_deadline_byte_horizon(3, b, 3, 5, 35), 2); /* held counts */
    assert_int_equal(dh_deadline_byte_horizon(3, b, 3, 0, 5), 1);
    assert_int_equal(dh_deadline_byte_horizon(3, b, 3, 100, 50), 1);
    assert_int_equal(dh_deadline_byte_horizon(3, b, 3, 0, 0), 1);
    assert_int_equal(dh_deadline_byte_horizon(3, b, 3, 0, 0.0 / 0.0), 1);
    const double odd[3] = {10, -5, 0.0 / 0.0};
    assert_int_equal(dh_deadline_byte_horizon(3, odd, 3, 0, 10), 3);
    assert_int_equal(dh_deadline_byte_horizon(0, b, 3, 0, 100), 0);
    assert_int_equal(dh_deadline_byte_horizon(3, b, 0, 0, 100), 0);
}

/* The arena holds what the horizon needs, bounded by the budget, and at least one step;
 * unknown need (0) takes the budget. */
static void arena_size_bounded_by_budget(void **state)
{
    uint64_t out = 1, mib = 1 << 20, s60 = 60 * mib;
    assert_int_equal(dh_deadline_arena_size(4, 2, s60, 2000 * mib, 4096 * mib, &out), 0);
    assert_int_equal(out, 2000 * mib);
    assert_int_equal(dh_deadline_arena_size(4, 2, s60, 9000 * mib, 4096 * mib, &out), 0);
    assert_int_equal(out, 4096 * mib);
    assert_int_equal(dh_deadline_arena_size(4, 2, s60, 0, 4096 * mib, &out), 0);
    assert_int_equal(out, 4096 * mib);
    assert_int_equal(dh_deadline_arena_size(4, 2, s60, 100 * mib, 4096 * mib, &out), 0);
    assert_int_equal(out, 480 * mib); /* one step at least */
    assert_int_equal(dh_deadline_arena_size(4, 2, s60, 0, 480 * mib, &out), 0); /* exactly */
    assert_int_equal(out, 480 * mib);
    assert_int_equal(dh_deadline_arena_size(4, 2, s60, 0, 0, &out), DH_EINVAL);
}

/* A budget that cannot hold one step fails with a message naming the numbers and the
 * options that raise it. */
static void arena_size_budget_too_small_says_why(void **state)
{
    uint64_t out = 1, mib = 1 << 20;
    assert_int_equal(dh_deadline_arena_size(4, 2, 60 * mib, 0, 256 * mib, &out), DH_ERANGE);
    assert_int_equal(out, 0);
    const char *msg = dh_last_error();
    assert_non_null(strstr(msg, "256.0 MiB"));
    assert_non_null(strstr(msg, "4 ranks"));
    assert_non_null(strstr(msg, "batch 2"));
    assert_non_null(strstr(msg, "60.0 MiB"));
    assert_non_null(strstr(msg, "480.0 MiB"));
    assert_non_null(strstr(msg, "--arena-budget"));
    assert_non_null(strstr(msg, "DH_ARENA_BUDGET"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(compute_is_tokens_or_mean_window),
    cmocka_unit_test(deadline_is_zero_before_first_return_and_when_due),
    cmocka_unit_test(deadline_adds_windows_of_batches_between),
    cmocka_unit_test(deadline_overrun_clamps_at_zero),
    cmocka_unit_test(prefetch_horizon_rule),
    cmocka_unit_test(prefetch_horizon_edges),
    cmocka_unit_test(rank_budget_is_share_less_margin),
    cmocka_unit_test(byte_horizon_caps_large_samples),
    cmocka_unit_test(byte_horizon_edges),
    cmocka_unit_test(arena_size_bounded_by_budget),
    cmocka_unit_test(arena_size_budget_too_small_says_why),
};
DH_TEST_MAIN(tests)
