/* Tests of a rank's share of a step (dh_plan_rank_share and dh_plan_min_rows in
 * src/sched/plan.c): each mode's rows per rank, that the ranks' shares cover the window
 * exactly once, the minimum-rows rule and its edges, errors and allocation failures. */
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/sampler.h"

#define N 64

/* N rows whose tokens vary widely (a few heavy ones), keys by size class. */
static dh_profile_set_t *rows(void)
{
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    for (int i = 0; i < N; i++) {
        char id[16];
        snprintf(id, sizeof id, "s%d", i);
        int64_t tokens = i % 7 == 0 ? 8192 : 100 + 37 * i;
        dh_profile_row_t r = {.id = id,
                              .uri = "x.mp4",
                              .profile_key = tokens > 4096 ? "big" : "small",
                              .frames = 1,
                              .height = 1,
                              .width = 1,
                              .tokens_est = tokens};
        assert_int_equal(dh_profile_set_add(set, &r), 0);
    }
    return set;
}

static dh_share_config_t share(dh_share_mode_t mode, uint32_t min_rows)
{
    return (dh_share_config_t){
        .mode = mode, .algo = DH_PLAN_ALGO_DEFAULT, .ranks = 4, .batch = 4, .min_rows = min_rows};
}

/* Every rank's share at `step`, counted per window row; returns the largest rank's tokens
 * and checks every row of the window went to exactly one rank. */
static double shares_cover_window(const dh_share_config_t *cfg, const dh_profile_set_t *set,
                                  uint64_t step, int *counts)
{
    dh_sampler_t *s = NULL, *w = NULL;
    assert_int_equal(dh_sampler_new(&s, N, 16, 7, 1), 0);
    assert_int_equal(dh_sampler_new(&w, N, 16, 7, 1), 0);
    uint32_t window[16];
    assert_int_equal(dh_sampler_step(w, step, window), 0);
    int seen[N] = {0};
    double most = 0;
    for (uint32_t r = 0; r < cfg->ranks; r++) {
        uint32_t got[16];
        int n = dh_plan_rank_share(cfg, s, set, step, r, got, 16);
        assert_true(n >= 0);
        counts[r] = n;
        double tokens = 0;
        for (int i = 0; i < n; i++) {
            seen[got[i]]++;
            tokens += (double)dh_profile_set_row(set, got[i])->tokens_est;
        }
        if (tokens > most)
            most = tokens;
    }
    for (int i = 0; i < 16; i++)
        assert_int_equal(seen[window[i]], 1);
    int total = 0;
    for (int i = 0; i < N; i++)
        total += seen[i];
    assert_int_equal(total, 16);
    dh_sampler_destroy(&s);
    dh_sampler_destroy(&w);
    return most;
}

/* Sample-count: rank r takes window rows [r x batch, (r+1) x batch), in order. */
static void sample_count_takes_consecutive_rows(void **state)
{
    dh_profile_set_t *set = rows();
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, N, 16, 3, 1), 0);
    uint32_t window[16], got[4];
    assert_int_equal(dh_sampler_step(s, 2, window), 0);
    dh_share_config_t cfg = share(DH_SHARE_SAMPLE_COUNT, 1);
    for (uint32_t r = 0; r < 4; r++) {
        assert_int_equal(dh_plan_rank_share(&cfg, s, set, 2, r, got, 4), 4);
        assert_memory_equal(got, window + 4 * r, sizeof got);
    }
    dh_sampler_destroy(&s);
    dh_profile_set_destroy(&set);
}

/* Balanced: exactly `batch` rows per rank, the window covered once, and the largest rank
 * carries no more tokens than sample-count batching's. */
static void balanced_gives_batch_rows_and_balances(void **state)
{
    dh_profile_set_t *set = rows();
    int counts[4];
    for (uint64_t step = 0; step < 4; step++) {
        dh_share_config_t b = share(DH_SHARE_TOKEN_BALANCED, 1);
        dh_share_config_t c = share(DH_SHARE_SAMPLE_COUNT, 1);
        double balanced = shares_cover_window(&b, set, step, counts);
        for (int r = 0; r < 4; r++)
            assert_int_equal(counts[r], 4);
        assert_true(balanced <= shares_cover_window(&c, set, step, counts));
    }
    dh_profile_set_destroy(&set);
}

/* Packed: counts vary, every rank gets at least min_rows, the window is covered once. */
static void packed_keeps_min_rows_and_covers_window(void **state)
{
    dh_profile_set_t *set = rows();
    int counts[4];
    for (uint64_t step = 0; step < 4; step++) {
        dh_share_config_t p = share(DH_SHARE_TOKEN_PACKED, 2);
        dh_share_config_t b = share(DH_SHARE_TOKEN_BALANCED, 1);
        double packed = shares_cover_window(&p, set, step, counts);
        for (int r = 0; r < 4; r++)
            assert_true(counts[r] >= 2);
        assert_true(packed <= shares_cover_window(&b, set, step, counts));
    }
    dh_profile_set_destroy(&set);
}

/* A cap smaller than the share truncates it (the first rows, in window order). */
static void cap_truncates_share(void **state)
{
    dh_profile_set_t *set = rows();
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, N, 16, 3, 1), 0);
    uint32_t all[4], two[2];
    dh_share_config_t cfg = share(DH_SHARE_TOKEN_BALANCED, 1);
    assert_int_equal(dh_plan_rank_share(&cfg, s, set, 1, 3, all, 4), 4);
    assert_int_equal(dh_plan_rank_share(&cfg, s, set, 1, 3, two, 2), 2);
    assert_memory_equal(two, all, sizeof two);
    dh_sampler_destroy(&s);
    dh_profile_set_destroy(&set);
}

static void share_rejects_bad_config(void **state)
{
    dh_profile_set_t *set = rows();
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, N, 16, 3, 1), 0);
    uint32_t got[16];
    dh_share_config_t cfg = share(DH_SHARE_TOKEN_BALANCED, 1);
    assert_int_equal(dh_plan_rank_share(&cfg, s, set, 0, 4, got, 16), DH_EINVAL); /* rank */
    assert_non_null(strstr(dh_last_error(), "rank 4 >= ranks 4"));
    cfg.mode = (dh_share_mode_t)DH_SHARE_MODE_COUNT;
    assert_int_equal(dh_plan_rank_share(&cfg, s, set, 0, 0, got, 16), DH_EINVAL);
    cfg = share(DH_SHARE_TOKEN_BALANCED, 1);
    cfg.batch = 0;
    assert_int_equal(dh_plan_rank_share(&cfg, s, set, 0, 0, got, 16), DH_EINVAL);
    dh_sampler_destroy(&s);
    dh_profile_set_destroy(&set);
}

/* The short rank takes the lightest row of the fullest rank; deferred rows stay deferred. */
static void min_rows_moves_lightest_of_fullest(void **state)
{
    int32_t rank_of[6] = {0, 0, 0, 0, -1, 1};
    const double load[6] = {5, 1, 3, 2, 0.5, 9};
    assert_int_equal(dh_plan_min_rows(rank_of, load, 6, 3, 1), 0);
    /* rank 2 was short: took row 1 (load 1) from rank 0; then nobody is short */
    const int32_t want[6] = {0, 2, 0, 0, -1, 1};
    assert_memory_equal(rank_of, want, sizeof want);
}

/* Edges: a rank with exactly min_rows is not short; when the fullest rank has only
 * min_rows there is nothing to give and the plan is left as is. */
static void min_rows_edges(void **state)
{
    int32_t exact[4] = {0, 0, 1, 1};
    const double load[4] = {1, 2, 3, 4};
    assert_int_equal(dh_plan_min_rows(exact, load, 4, 2, 2), 0);
    const int32_t same[4] = {0, 0, 1, 1};
    assert_memory_equal(exact, same, sizeof same);
    int32_t starved[4] = {0, 0, 1, 1};
    assert_int_equal(dh_plan_min_rows(starved, load, 4, 3, 2), 0); /* rank 2 short, none spare */
    assert_memory_equal(starved, same, sizeof same);
    assert_int_equal(dh_plan_min_rows(starved, load, 4, 0, 1), DH_EINVAL);
}

static int share_once(void *ctx)
{
    const dh_profile_set_t *set = ctx;
    dh_sampler_t *s = NULL;
    int rc = dh_sampler_new(&s, N, 16, 3, 1);
    uint32_t got[16];
    dh_share_config_t cfg = share(DH_SHARE_TOKEN_PACKED, 2);
    if (rc == 0)
        rc = dh_plan_rank_share(&cfg, s, set, 5, 1, got, 16);
    dh_sampler_destroy(&s);
    return rc < 0 ? rc : 0;
}

static void share_survives_each_allocation_failure(void **state)
{
    dh_profile_set_t *set = rows();
    assert_true(dh_test_each_allocation_failure(share_once, set) > 0);
    dh_profile_set_destroy(&set);
}

/* A batch is split only when one worker cannot decode it within the prefetch horizon's
 * time, into the fewest parts that can, capped by the rank's cores and the batch. */
static void fanout_splits_only_what_the_horizon_cannot_cover(void **state)
{
    (void)state;
    assert_int_equal(dh_plan_fanout_width(4, 12, 0.8, 1.0), 1); /* covered: no join copy */
    assert_int_equal(dh_plan_fanout_width(4, 12, 1.0, 1.0), 1); /* exactly covered */
    assert_int_equal(dh_plan_fanout_width(4, 12, 1.5, 1.0), 2); /* two parts cover it */
    assert_int_equal(dh_plan_fanout_width(4, 12, 3.5, 1.0), 4); /* at most the batch */
    assert_int_equal(dh_plan_fanout_width(8, 3, 7.0, 1.0), 3);  /* at most the rank's cores */
    assert_int_equal(dh_plan_fanout_width(4, 1, 9.0, 1.0), 1);  /* one core: nothing to gain */
    assert_int_equal(dh_plan_fanout_width(4, 12, 1.0, 0.0), 4); /* no horizon: as wide as allowed */
    assert_int_equal(dh_plan_fanout_width(1, 12, 9.0, 1.0), 1); /* one row */
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sample_count_takes_consecutive_rows),
    cmocka_unit_test(balanced_gives_batch_rows_and_balances),
    cmocka_unit_test(packed_keeps_min_rows_and_covers_window),
    cmocka_unit_test(cap_truncates_share),
    cmocka_unit_test(share_rejects_bad_config),
    cmocka_unit_test(min_rows_moves_lightest_of_fullest),
    cmocka_unit_test(min_rows_edges),
    cmocka_unit_test(share_survives_each_allocation_failure),
    cmocka_unit_test(fanout_splits_only_what_the_horizon_cannot_cover),
};
DH_TEST_MAIN(tests)
