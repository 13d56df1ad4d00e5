/* Tests of a rank's share of a step (dh_plan_rank_share, dh_plan_step_share,
 * dh_plan_window_share and
 * dh_plan_min_rows in src/sched/plan_share.c): each mode's rows per rank, that the ranks' shares
 * cover the window (or the window of steps) exactly once, the minimum-rows rule and its
 * edges, planning across steps, errors and allocation failures. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/sampler.h"

#define N 64

/* n rows whose tokens vary widely (a few heavy ones), keys by size class. */
static dh_profile_set_t *rows_n(int n)
{
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    for (int i = 0; i < n; i++) {
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

static dh_profile_set_t *rows(void)
{
    return rows_n(N);
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

/* ---- planning across steps (window_steps > 1, dh_plan_window_share) ---- */

/* The instance that motivated it: a real-decode epoch of kinetics-mixed (48 clips: 21 of
 * 8218 tokens, 17 of 2330, 10 of 537) over 6 steps of 4 ranks x 2. A step holding five
 * large clips cannot be split better than two on one rank, so step by step the sum of the
 * steps' largest rank is at least that of the best per-step partitions; across the epoch
 * the large clips are spread one a rank. */
static void kinetics_epoch(double *load)
{
    /* sampler-like order: the three sizes interleaved unevenly, five L in step 0 */
    static const int cls[48] = {2, 2, 2, 2, 2, 1, 0, 1, 2, 2, 2, 1, 1, 0, 0, 1,
                                2, 2, 2, 2, 1, 1, 1, 0, 2, 2, 2, 1, 1, 0, 0, 0,
                                2, 2, 2, 1, 1, 1, 0, 0, 2, 2, 1, 1, 1, 1, 0, 0};
    static const double size[3] = {537, 2330, 8218};
    for (int i = 0; i < 48; i++)
        load[i] = size[cls[i]];
}

/* Sum over steps of each step's largest rank load, and checks of the plan's shape: every
 * item in one (step, rank), balanced bins exactly `batch`, packed ranks at least min_rows
 * and at most ranks x batch. */
static double window_cost(const dh_share_config_t *cfg, uint32_t steps, const double *load,
                          size_t n, const uint32_t *step_of, const int32_t *rank_of)
{
    double bin[64] = {0};
    int count[64] = {0};
    assert_true(steps * cfg->ranks <= 64);
    for (size_t i = 0; i < n; i++) {
        assert_true(step_of[i] < steps);
        assert_true(rank_of[i] >= 0 && (uint32_t)rank_of[i] < cfg->ranks);
        bin[step_of[i] * cfg->ranks + (uint32_t)rank_of[i]] += load[i];
        count[step_of[i] * cfg->ranks + (uint32_t)rank_of[i]]++;
    }
    double sum = 0;
    for (uint32_t t = 0; t < steps; t++) {
        double mx = 0;
        for (uint32_t r = 0; r < cfg->ranks; r++) {
            int k = count[t * cfg->ranks + r];
            if (cfg->mode == DH_SHARE_TOKEN_BALANCED)
                assert_int_equal(k, (int)cfg->batch);
            else
                assert_true(k >= (int)cfg->min_rows && k <= (int)(cfg->ranks * cfg->batch));
            if (bin[t * cfg->ranks + r] > mx)
                mx = bin[t * cfg->ranks + r];
        }
        sum += mx;
    }
    return sum;
}

static void window_spreads_heavy_samples_across_steps(void **state)
{
    (void)state;
    double load[48];
    kinetics_epoch(load);
    uint32_t step_of[48];
    int32_t rank_of[48];
    for (int mode = DH_SHARE_TOKEN_BALANCED; mode <= DH_SHARE_TOKEN_PACKED; mode++) {
        dh_share_config_t cfg = {.mode = (dh_share_mode_t)mode,
                                 .algo = DH_PLAN_EXACT,
                                 .ranks = 4,
                                 .batch = 2,
                                 .min_rows = 1,
                                 .window_steps = 6};
        /* step by step: the exact per-step plans (the bound of any plan keeping each item
         * in its step) */
        double per_step = 0;
        for (uint32_t t = 0; t < 6; t++) {
            uint32_t so[8];
            int32_t ro[8];
            assert_int_equal(dh_plan_window_share(&cfg, 1, load + 8 * t, NULL, 8, so, ro), 0);
            per_step += window_cost(&cfg, 1, load + 8 * t, 8, so, ro);
        }
        assert_int_equal(dh_plan_window_share(&cfg, 6, load, NULL, 48, step_of, rank_of), 0);
        double across = window_cost(&cfg, 6, load, 48, step_of, rank_of);
        double total = 0;
        for (int i = 0; i < 48; i++)
            total += load[i];
        print_message("mode %d: sum of steps' largest rank %.0f per step, %.0f across 6 steps "
                      "(the mean rank's sum %.0f)\n",
                      mode, per_step, across, total / 4);
        assert_true(across < per_step);
        assert_true(across <= 1.03 * total / 4); /* 0.97 balance of tokens; per step 0.80 */
        /* deterministic */
        uint32_t step2[48];
        int32_t rank2[48];
        assert_int_equal(dh_plan_window_share(&cfg, 6, load, NULL, 48, step2, rank2), 0);
        assert_memory_equal(step_of, step2, sizeof step2);
        assert_memory_equal(rank_of, rank2, sizeof rank2);
    }
}

/* Many light items: packed bins hold at most ranks x batch rows (a client's share), and the
 * per-step re-plan may not pile a step's rows on one rank beyond that. */
static void window_keeps_rows_within_the_share(void **state)
{
    (void)state;
    double load[64];
    for (int i = 0; i < 64; i++)
        load[i] = i < 2 ? 10000 : 1 + i % 3;
    uint32_t step_of[64];
    int32_t rank_of[64];
    dh_share_config_t cfg = {.mode = DH_SHARE_TOKEN_PACKED,
                             .algo = DH_PLAN_ALGO_DEFAULT,
                             .ranks = 2,
                             .batch = 4,
                             .min_rows = 2,
                             .window_steps = 8};
    assert_int_equal(dh_plan_window_share(&cfg, 8, load, NULL, 64, step_of, rank_of), 0);
    (void)window_cost(&cfg, 8, load, 64, step_of, rank_of);
}

static void window_rejects_bad_input(void **state)
{
    (void)state;
    double load[16] = {1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t step_of[16];
    int32_t rank_of[16];
    dh_share_config_t cfg = {.mode = DH_SHARE_SAMPLE_COUNT, .ranks = 2, .batch = 4};
    assert_int_equal(dh_plan_window_share(&cfg, 2, load, NULL, 16, step_of, rank_of), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "balanced or packed"));
    cfg.mode = DH_SHARE_TOKEN_BALANCED;
    assert_int_equal(dh_plan_window_share(&cfg, 3, load, NULL, 16, step_of, rank_of), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "16 items, expected 3 steps x 8"));
    load[5] = -1;
    assert_int_equal(dh_plan_window_share(&cfg, 2, load, NULL, 16, step_of, rank_of), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "item 5"));
    cfg.ranks = 0;
    assert_int_equal(dh_plan_window_share(&cfg, 2, load, NULL, 16, step_of, rank_of), DH_EINVAL);
}

/* Through dh_plan_rank_share: over an epoch of 4 steps with windows of 3 (the last window is
 * the epoch's fourth step alone), every row of the epoch goes to one rank at one step; the
 * steps of a window hold that window's rows (none crosses into another window or epoch). */
static void window_shares_cover_the_epoch_once(void **state)
{
    (void)state;
    dh_profile_set_t *set = rows();
    for (int mode = DH_SHARE_TOKEN_BALANCED; mode <= DH_SHARE_TOKEN_PACKED; mode++) {
        dh_share_config_t cfg = share((dh_share_mode_t)mode, 1);
        cfg.window_steps = 3;
        dh_sampler_t *s = NULL, *w = NULL;
        assert_int_equal(dh_sampler_new(&s, N, 16, 7, 1), 0);
        assert_int_equal(dh_sampler_new(&w, N, 16, 7, 1), 0);
        for (uint64_t epoch = 0; epoch < 2; epoch++) {
            int seen[N] = {0};
            int window_of[N];
            for (uint64_t k = 0; k < 4; k++) {
                uint32_t ids[16];
                assert_int_equal(dh_sampler_step(w, epoch * 4 + k, ids), 0);
                for (int i = 0; i < 16; i++)
                    window_of[ids[i]] = (int)(k / 3);
            }
            for (uint64_t k = 0; k < 4; k++)
                for (uint32_t r = 0; r < cfg.ranks; r++) {
                    uint32_t got[16];
                    int n = dh_plan_rank_share(&cfg, s, set, epoch * 4 + k, r, got, 16);
                    assert_true(n >= 1);
                    if (mode == DH_SHARE_TOKEN_BALANCED)
                        assert_int_equal(n, 4);
                    for (int i = 0; i < n; i++) {
                        seen[got[i]]++;
                        assert_int_equal(window_of[got[i]], (int)(k / 3));
                    }
                }
            for (int i = 0; i < N; i++)
                assert_int_equal(seen[i], 1);
        }
        dh_sampler_destroy(&s);
        dh_sampler_destroy(&w);
    }
    dh_profile_set_destroy(&set);
}

/* An epoch cut from sample P (dh_sampler_set_start: an elastic resume at a position that is
 * not a step boundary) is planned from P: plan windows of W steps count from its first
 * step, each takes exactly the sampler windows of its steps (the positions [P + t x 16,
 * P + (t + W) x 16) of the epoch's order), every sample from P once, none before P but the
 * tail's pads (drop_last 0), and balanced mode still gives every rank `batch` rows. */
static void check_cut_epoch_shares(dh_share_mode_t mode, uint32_t window_steps, size_t from,
                                   int drop_last)
{
    enum { cut = 1, per_step = 16 };
    dh_profile_set_t *set = rows();
    dh_share_config_t cfg = share(mode, 1);
    cfg.window_steps = window_steps;
    uint32_t perm[N];
    int pos[N], seen[N] = {0};
    dh_sampler_t *s = NULL, *all = NULL;
    assert_int_equal(dh_sampler_new(&all, N, N, 7, 1), 0);
    assert_int_equal(dh_sampler_step(all, cut, perm), 0);
    for (int i = 0; i < N; i++)
        pos[perm[i]] = i;
    assert_int_equal(dh_sampler_new(&s, N, per_step, 7, 1), 0);
    assert_int_equal(dh_sampler_set_drop_last(s, drop_last, cfg.ranks), 0);
    assert_int_equal(dh_sampler_set_start(s, cut, from), 0);
    size_t steps = dh_sampler_epoch_steps(s, cut), full = (N - from) / per_step;
    uint64_t first = dh_sampler_epoch_first_step(s, cut);
    uint32_t w = window_steps > 1 ? window_steps : 1;
    int pads = 0;
    for (size_t k = 0; k < steps; k++) {
        /* the positions the step's plan window holds (the tail: its own) */
        size_t lo = k < full ? from + k / w * w * per_step : from + full * per_step;
        size_t end = k < full ? (k / w + 1) * w : full + 1, hi = from + end * per_step;
        hi = hi < N ? hi : N;
        hi = k < full && end > full ? from + full * per_step : hi;
        for (uint32_t r = 0; r < cfg.ranks; r++) {
            uint32_t got[per_step];
            int n = dh_plan_rank_share(&cfg, s, set, first + k, r, got, per_step);
            assert_true(n >= 1);
            if (mode == DH_SHARE_TOKEN_BALANCED && k < full)
                assert_int_equal(n, cfg.batch);
            for (int i = 0; i < n; i++) {
                size_t at = (size_t)pos[got[i]];
                if (at < from) { /* a pad of the tail step */
                    assert_true(k == full && !drop_last);
                    pads++;
                    continue;
                }
                assert_true(at >= lo && at < hi);
                seen[got[i]]++;
            }
        }
    }
    size_t end = drop_last ? from + full * per_step : N;
    for (size_t i = 0; i < N; i++)
        assert_int_equal(seen[perm[i]], i >= from && i < end);
    assert_int_equal((size_t)pads, steps > full ? dh_sampler_step_pads(s, first + full) : 0);
    dh_sampler_destroy(&s);
    dh_sampler_destroy(&all);
    dh_profile_set_destroy(&set);
}

static void cut_epoch_is_planned_from_its_first_sample(void **state)
{
    (void)state;
    static const size_t froms[] = {6, 21, 32, 60};
    for (int mode = DH_SHARE_TOKEN_BALANCED; mode <= DH_SHARE_TOKEN_PACKED; mode++)
        for (uint32_t w = 1; w <= 3; w++)
            for (size_t f = 0; f < sizeof froms / sizeof *froms; f++)
                for (int drop_last = 0; drop_last < 2; drop_last++)
                    check_cut_epoch_shares((dh_share_mode_t)mode, w, froms[f], drop_last);
}

static int window_share_once(void *arg)
{
    dh_profile_set_t *set = arg;
    dh_share_config_t cfg = share(DH_SHARE_TOKEN_PACKED, 1);
    cfg.window_steps = 4;
    dh_sampler_t *s = NULL;
    uint32_t got[16];
    int rc = dh_sampler_new(&s, N, 16, 7, 1);
    if (rc == 0)
        rc = dh_plan_rank_share(&cfg, s, set, 5, 1, got, 16);
    dh_sampler_destroy(&s);
    return rc < 0 ? rc : 0;
}

static void window_share_survives_each_allocation_failure(void **state)
{
    dh_profile_set_t *set = rows();
    assert_true(dh_test_each_allocation_failure(window_share_once, set) > 0);
    dh_profile_set_destroy(&set);
}

/* dh_plan_step_share gives, in one plan, every rank's share as dh_plan_rank_share does
 * rank by rank: the same rows in the same order, in every mode and across steps (W 3);
 * too small a cap is DH_ERANGE. */
static void step_share_matches_rank_shares(void **state)
{
    (void)state;
    dh_profile_set_t *set = rows();
    const dh_share_mode_t modes[] = {DH_SHARE_SAMPLE_COUNT, DH_SHARE_TOKEN_BALANCED,
                                     DH_SHARE_TOKEN_PACKED};
    for (int window = 1; window <= 3; window += 2)
        for (size_t m = 0; m < 3; m++) {
            dh_share_config_t cfg = share(modes[m], 2);
            cfg.window_steps = (uint32_t)window;
            dh_sampler_t *s = NULL;
            assert_int_equal(dh_sampler_new(&s, N, 16, 5, 1), 0);
            for (uint64_t step = 0; step < 6; step++) {
                uint32_t all[48], rank_of[48];
                int n = dh_plan_step_share(&cfg, s, set, step, all, rank_of, 48);
                assert_true(n > 0);
                int seen = 0;
                for (uint32_t r = 0; r < 4; r++) {
                    uint32_t got[48];
                    int k = dh_plan_rank_share(&cfg, s, set, step, r, got, 48);
                    assert_true(k >= 0);
                    int j = 0;
                    for (int i = 0; i < n; i++)
                        if (rank_of[i] == r) {
                            assert_true(j < k);
                            assert_int_equal(all[i], got[j++]);
                        }
                    assert_int_equal(j, k);
                    seen += k;
                }
                assert_int_equal(seen, n);
            }
            uint32_t few[4], few_rank[4];
            assert_int_equal(dh_plan_step_share(&cfg, s, set, 0, few, few_rank, 4), DH_ERANGE);
            dh_sampler_destroy(&s);
        }
    dh_profile_set_destroy(&set);
}

/* Without drop_last (dh_sampler_set_drop_last), the epoch's short last step is shared like
 * the others: every rank the same rows (tail padded / ranks; packing at least min_rows),
 * the ranks' shares over the epoch hold every sample once and the pads twice, the balanced
 * tail is the planner's plan of the tail window with that batch, the count tail the window
 * in order, and dh_plan_step_share agrees. Windows of steps (W > 1) leave the tail alone. */
static void check_tail_shares(int n, dh_share_mode_t mode, uint32_t window_steps)
{
    dh_profile_set_t *set = rows_n(n);
    dh_share_config_t cfg = share(mode, 2);
    cfg.window_steps = window_steps;
    dh_sampler_t *s = NULL, *w = NULL;
    assert_int_equal(dh_sampler_new(&s, (size_t)n, 16, 9, 1), 0);
    assert_int_equal(dh_sampler_new(&w, (size_t)n, 16, 9, 1), 0);
    assert_int_equal(dh_sampler_set_drop_last(s, 0, 4), 0);
    assert_int_equal(dh_sampler_set_drop_last(w, 0, 4), 0);
    size_t steps = dh_sampler_steps_per_epoch(s);
    assert_int_equal(steps, (size_t)(n + 15) / 16);
    int seen[N] = {0};
    uint64_t last = 2 * steps - 1; /* epoch 1's tail */
    for (uint64_t step = steps; step <= last; step++) {
        size_t size = dh_sampler_step_size(w, step);
        /* a tail is planned alone (a full last step may share a window of steps) */
        bool alone = size != 16 || dh_sampler_step_pads(w, step) || window_steps == 1;
        uint32_t got[4][16], all_rows[64], all_ranks[64];
        int count[4];
        for (uint32_t r = 0; r < 4; r++) {
            count[r] = dh_plan_rank_share(&cfg, s, set, step, r, got[r], 16);
            assert_true(count[r] >= 0);
            if (mode != DH_SHARE_TOKEN_PACKED)
                assert_int_equal(count[r], size / 4);
            else if (alone)
                assert_true((size_t)count[r] >= (size / 4 < 2 ? size / 4 : 2));
            for (int i = 0; i < count[r]; i++)
                seen[got[r][i]]++;
        }
        int all = dh_plan_step_share(&cfg, s, set, step, all_rows, all_ranks, 64);
        assert_int_equal(all, count[0] + count[1] + count[2] + count[3]);
        if (alone) /* packing across steps may move rows, but not into the tail */
            assert_int_equal(all, size);
        for (uint32_t r = 0, at[4] = {0}; r < 4; r++)
            for (int i = 0; i < all; i++)
                if (all_ranks[i] == r)
                    assert_int_equal(all_rows[i], got[r][at[r]++]);
        if (step != last)
            continue;
        uint32_t window[16];
        assert_int_equal(dh_sampler_step(w, step, window), 0);
        size_t pads = dh_sampler_step_pads(w, step);
        for (size_t i = 0; i < pads; i++) /* the pads: seen twice over the epoch */
            seen[window[size - pads + i]]--;
        if (mode == DH_SHARE_SAMPLE_COUNT) {
            for (uint32_t r = 0; r < 4; r++)
                assert_memory_equal(got[r], window + r * (size / 4), (size / 4) * sizeof *window);
        } else if (mode == DH_SHARE_TOKEN_BALANCED && alone) {
            double load[16], plan_load[4], most = 0, plan_most = 0;
            uint32_t key[16];
            int32_t rank_of[16];
            for (size_t i = 0; i < size; i++) {
                load[i] = (double)dh_profile_set_row(set, window[i])->tokens_est;
                key[i] = dh_profile_set_row(set, window[i])->key_index;
            }
            dh_plan_config_t pc = {.mode = DH_PLAN_FIXED_BATCH,
                                   .algo = DH_PLAN_ALGO_DEFAULT,
                                   .ranks = 4,
                                   .batch = (uint32_t)(size / 4)};
            assert_int_equal(dh_plan_step(&pc, load, key, size, rank_of, plan_load), 0);
            for (uint32_t r = 0; r < 4; r++) {
                double tokens = 0;
                for (int i = 0; i < count[r]; i++)
                    tokens += (double)dh_profile_set_row(set, got[r][i])->tokens_est;
                most = tokens > most ? tokens : most;
                plan_most = plan_load[r] > plan_most ? plan_load[r] : plan_most;
            }
            assert_close(most, plan_most, 0);
        }
    }
    for (int i = 0; i < n; i++)
        assert_int_equal(seen[i], 1);
    dh_sampler_destroy(&s);
    dh_sampler_destroy(&w);
    dh_profile_set_destroy(&set);
}

static void tail_step_is_shared_alike_and_covers_the_epoch(void **state)
{
    static const int sizes[] = {58, 61, 60, 63, 64}; /* tails 10, 13, 12, 15 and none */
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (int mode = 0; mode < DH_SHARE_MODE_COUNT; mode++)
            for (uint32_t window_steps = 1; window_steps <= 3; window_steps++)
                check_tail_shares(sizes[k], (dh_share_mode_t)mode, window_steps);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sample_count_takes_consecutive_rows),
    cmocka_unit_test(step_share_matches_rank_shares),
    cmocka_unit_test(balanced_gives_batch_rows_and_balances),
    cmocka_unit_test(packed_keeps_min_rows_and_covers_window),
    cmocka_unit_test(cap_truncates_share),
    cmocka_unit_test(share_rejects_bad_config),
    cmocka_unit_test(min_rows_moves_lightest_of_fullest),
    cmocka_unit_test(min_rows_edges),
    cmocka_unit_test(share_survives_each_allocation_failure),
    cmocka_unit_test(fanout_splits_only_what_the_horizon_cannot_cover),
    cmocka_unit_test(window_spreads_heavy_samples_across_steps),
    cmocka_unit_test(window_keeps_rows_within_the_share),
    cmocka_unit_test(window_rejects_bad_input),
    cmocka_unit_test(window_shares_cover_the_epoch_once),
    cmocka_unit_test(cut_epoch_is_planned_from_its_first_sample),
    cmocka_unit_test(window_share_survives_each_allocation_failure),
    cmocka_unit_test(tail_step_is_shared_alike_and_covers_the_epoch),
};
DH_TEST_MAIN(tests)
