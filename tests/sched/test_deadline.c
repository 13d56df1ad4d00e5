/* Tests of the deadline and adaptive-prefetch rules (src/sched/deadline.c): the predicted
 * compute of a batch, D(b) and its edge cases, and when the prefetch horizon deepens. */
#include <stdint.h>

#include "dh_test.h"
#include "datahelix/deadline.h"

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

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(compute_is_tokens_or_mean_window),
    cmocka_unit_test(deadline_is_zero_before_first_return_and_when_due),
    cmocka_unit_test(deadline_adds_windows_of_batches_between),
    cmocka_unit_test(deadline_overrun_clamps_at_zero),
    cmocka_unit_test(prefetch_horizon_rule),
    cmocka_unit_test(prefetch_horizon_edges),
};
DH_TEST_MAIN(tests)
