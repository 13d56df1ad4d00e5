/* Tests of the tier-1 planner (src/sched/plan*.c): invariants of every algorithm in both
 * modes over seeded random instances, the quality ordering (default <= greedy, exact <= all,
 * exact == brute force), errors, fanout, allocation failures and the `plan` command. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <jansson.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/rng.h"
#include "core/internal.h"

#define MAX_N 128
#define MAX_R 16

static const dh_plan_algo_t all_algos[] = {DH_PLAN_GREEDY, DH_PLAN_KK, DH_PLAN_SWAP, DH_PLAN_EXACT};

/* Kinetics-mixed-like loads: visual tokens 512 / 2304 / 8192 in equal parts plus a caption
 * of 10..300 tokens; the key is the visual class. */
static void kinetics_instance(dh_rng_t *rng, size_t n, double *load, uint32_t *key)
{
    static const double visual[3] = {512, 2304, 8192};
    for (size_t i = 0; i < n; i++) {
        uint32_t k = (uint32_t)dh_rng_below(rng, 3);
        key[i] = k;
        load[i] = visual[k] + 10 + (double)dh_rng_below(rng, 291);
    }
}

/* Small integer loads (many ties, which exercises the equal-item rules) or spread doubles. */
static void random_instance(dh_rng_t *rng, size_t n, double *load, uint32_t *key)
{
    int small_ints = dh_rng_below(rng, 2) == 0;
    for (size_t i = 0; i < n; i++) {
        load[i] = small_ints ? (double)(1 + dh_rng_below(rng, 6)) : 1 + 999 * dh_rng_uniform(rng);
        key[i] = (uint32_t)dh_rng_below(rng, 3);
    }
}

static double max_load(const double *rank_load, uint32_t ranks)
{
    double m = 0;
    for (uint32_t r = 0; r < ranks; r++)
        m = fmax(m, rank_load[r]);
    return m;
}

/* Every item on a rank, exactly `batch` per rank, rank_load the sum of its items. */
static void check_fixed(const dh_plan_config_t *cfg, const double *load, size_t n,
                        const int32_t *rank_of, const double *rank_load)
{
    uint32_t count[MAX_R] = {0};
    double sum[MAX_R] = {0};
    for (size_t i = 0; i < n; i++) {
        assert_true(rank_of[i] >= 0 && rank_of[i] < (int32_t)cfg->ranks);
        count[rank_of[i]]++;
        sum[rank_of[i]] += load[i];
    }
    for (uint32_t r = 0; r < cfg->ranks; r++) {
        assert_int_equal(count[r], cfg->batch);
        assert_close(rank_load[r], sum[r], 1e-9 * (1 + sum[r]));
    }
}

/* Every rank within the budget; an item is deferred only if it fits on no rank. */
static void check_packing(const dh_plan_config_t *cfg, const double *load, size_t n,
                          const int32_t *rank_of, const double *rank_load)
{
    double sum[MAX_R] = {0};
    for (size_t i = 0; i < n; i++) {
        assert_true(rank_of[i] >= -1 && rank_of[i] < (int32_t)cfg->ranks);
        if (rank_of[i] >= 0)
            sum[rank_of[i]] += load[i];
    }
    for (uint32_t r = 0; r < cfg->ranks; r++) {
        assert_close(rank_load[r], sum[r], 1e-9 * (1 + sum[r]));
        assert_true(sum[r] <= cfg->token_budget * (1 + 1e-12));
    }
    for (size_t i = 0; i < n; i++)
        if (rank_of[i] < 0)
            for (uint32_t r = 0; r < cfg->ranks; r++)
                assert_true(sum[r] + load[i] > cfg->token_budget);
}

/* Plans twice and checks that both plans are identical (determinism). */
static int plan_twice(const dh_plan_config_t *cfg, const double *load, const uint32_t *key,
                      size_t n, size_t carried, int32_t *rank_of, double *rank_load)
{
    int32_t again[MAX_N];
    double again_load[MAX_R];
    int rc = dh_plan_step_carried(cfg, load, key, n, carried, rank_of, rank_load);
    int rc2 = dh_plan_step_carried(cfg, load, key, n, carried, again, again_load);
    assert_int_equal(rc, rc2);
    if (rc == 0) {
        assert_memory_equal(rank_of, again, n * sizeof *again);
        assert_memory_equal(rank_load, again_load, cfg->ranks * sizeof *again_load);
    }
    return rc;
}

static void plan_fixed_batch_invariants_all_algorithms(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 11);
    double load[MAX_N], rank_load[MAX_R];
    uint32_t key[MAX_N];
    int32_t rank_of[MAX_N];
    for (int trial = 0; trial < 300; trial++) {
        dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH};
        cfg.ranks = 1 + (uint32_t)dh_rng_below(&rng, 6);
        cfg.batch = 1 + (uint32_t)dh_rng_below(&rng, 5);
        size_t n = (size_t)cfg.ranks * cfg.batch;
        random_instance(&rng, n, load, key);
        for (size_t a = 0; a < DH_ARRAY_LEN(all_algos); a++) {
            cfg.algo = all_algos[a];
            int rc = plan_twice(&cfg, load, trial % 2 ? key : NULL, n, 0, rank_of, rank_load);
            assert_true(rc == 0 || (rc == DH_ETOOBIG && cfg.algo == DH_PLAN_EXACT));
            check_fixed(&cfg, load, n, rank_of, rank_load);
        }
    }
}

static void plan_token_budget_invariants_all_algorithms(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 12);
    double load[MAX_N], rank_load[MAX_R];
    uint32_t key[MAX_N];
    int32_t rank_of[MAX_N];
    for (int trial = 0; trial < 300; trial++) {
        dh_plan_config_t cfg = {.mode = DH_PLAN_TOKEN_BUDGET};
        cfg.ranks = 1 + (uint32_t)dh_rng_below(&rng, 5);
        size_t n = (size_t)dh_rng_below(&rng, 13);
        random_instance(&rng, n, load, key);
        double largest = 0, total = 0;
        for (size_t i = 0; i < n; i++) {
            largest = fmax(largest, load[i]);
            total += load[i];
        }
        /* From "only the largest fits" to "everything fits on one rank". */
        cfg.token_budget = fmax(1, largest + (total - largest) * dh_rng_uniform(&rng));
        size_t carried = n ? (size_t)dh_rng_below(&rng, n + 1) : 0;
        for (size_t a = 0; a < DH_ARRAY_LEN(all_algos); a++) {
            cfg.algo = all_algos[a];
            int rc = plan_twice(&cfg, load, key, n, carried, rank_of, rank_load);
            assert_true(rc == 0 || (rc == DH_ETOOBIG && cfg.algo == DH_PLAN_EXACT));
            check_packing(&cfg, load, n, rank_of, rank_load);
        }
    }
}

/* The previous step's deferred samples, put first in the window, are placed first. */
static void plan_token_budget_places_carried_items_first(void **state)
{
    double load[] = {6, 7, 3}; /* item 0 was deferred last step */
    int32_t rank_of[3];
    double rank_load[1];
    dh_plan_config_t cfg = {.mode = DH_PLAN_TOKEN_BUDGET, .ranks = 1, .token_budget = 10};
    for (size_t a = 0; a < DH_ARRAY_LEN(all_algos); a++) {
        cfg.algo = all_algos[a];
        /* Without carrying, largest first defers the 6. */
        assert_int_equal(dh_plan_step(&cfg, load, NULL, 3, rank_of, rank_load), 0);
        assert_int_equal(rank_of[0], -1);
        assert_int_equal(rank_of[1], 0);
        /* Carried, the 6 goes first and the 7 waits. */
        assert_int_equal(dh_plan_step_carried(&cfg, load, NULL, 3, 1, rank_of, rank_load), 0);
        assert_int_equal(rank_of[0], 0);
        assert_int_equal(rank_of[1], -1);
        assert_int_equal(rank_of[2], 0);
        assert_close(rank_load[0], 9, 0);
    }
}

/* The paper's greedy takes keys as groups (largest group first) in window order. */
static void plan_greedy_groups_by_key_in_window_order(void **state)
{
    double load[] = {5, 6, 1, 2};
    uint32_t key[] = {0, 0, 1, 1};
    int32_t rank_of[4];
    double rank_load[2];
    dh_plan_config_t cfg = {
        .mode = DH_PLAN_FIXED_BATCH, .ranks = 2, .batch = 2, .algo = DH_PLAN_GREEDY};
    assert_int_equal(dh_plan_step(&cfg, load, key, 4, rank_of, rank_load), 0);
    assert_int_equal(rank_of[0], 0); /* 5 first: window order inside key 0 */
    assert_int_equal(rank_of[1], 1);
    assert_int_equal(rank_of[2], 0);
    assert_int_equal(rank_of[3], 1);
    assert_close(max_load(rank_load, 2), 8, 0);
    cfg.algo = DH_PLAN_SWAP; /* the default recovers the balanced plan */
    assert_int_equal(dh_plan_step(&cfg, load, key, 4, rank_of, rank_load), 0);
    assert_close(max_load(rank_load, 2), 7, 0);
    /* Without keys greedy is largest first (LPT): ties go to the lowest rank. */
    cfg.algo = DH_PLAN_GREEDY;
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 4, rank_of, rank_load), 0);
    assert_int_equal(rank_of[1], 0);
    assert_int_equal(rank_of[0], 1);
    assert_close(max_load(rank_load, 2), 7, 0);
}

static void plan_default_never_worse_than_greedy_or_kk(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 13);
    double load[MAX_N], rank_load[MAX_R];
    uint32_t key[MAX_N];
    int32_t rank_of[MAX_N];
    for (int trial = 0; trial < 400; trial++) {
        dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH};
        cfg.ranks = 1 + (uint32_t)dh_rng_below(&rng, MAX_R);
        cfg.batch = 1 + (uint32_t)dh_rng_below(&rng, MAX_N / cfg.ranks);
        size_t n = (size_t)cfg.ranks * cfg.batch;
        if (trial % 2)
            kinetics_instance(&rng, n, load, key);
        else
            random_instance(&rng, n, load, key);
        double best[3];
        for (int a = 0; a < 3; a++) {
            cfg.algo = all_algos[a];
            assert_int_equal(dh_plan_step(&cfg, load, key, n, rank_of, rank_load), 0);
            best[a] = max_load(rank_load, cfg.ranks);
        }
        assert_true(best[DH_PLAN_SWAP] <= best[DH_PLAN_GREEDY]);
        assert_true(best[DH_PLAN_SWAP] <= best[DH_PLAN_KK]);
        assert_true(best[DH_PLAN_SWAP] >= dh_plan_lower_bound(load, n, cfg.ranks) * (1 - 1e-12));
    }
}

static void plan_exact_not_worse_than_any_heuristic(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 14);
    double load[MAX_N], rank_load[MAX_R];
    uint32_t key[MAX_N];
    int32_t rank_of[MAX_N];
    for (int trial = 0; trial < 300; trial++) {
        dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH};
        cfg.ranks = 1 + (uint32_t)dh_rng_below(&rng, 5);
        cfg.batch = 1 + (uint32_t)dh_rng_below(&rng, 4);
        size_t n = (size_t)cfg.ranks * cfg.batch;
        random_instance(&rng, n, load, key);
        cfg.algo = DH_PLAN_EXACT;
        assert_int_equal(dh_plan_step(&cfg, load, key, n, rank_of, rank_load), 0);
        check_fixed(&cfg, load, n, rank_of, rank_load);
        double exact = max_load(rank_load, cfg.ranks);
        for (int a = 0; a < 3; a++) {
            cfg.algo = all_algos[a];
            assert_int_equal(dh_plan_step(&cfg, load, key, n, rank_of, rank_load), 0);
            assert_true(exact <= max_load(rank_load, cfg.ranks) * (1 + 1e-12));
        }
        assert_true(exact >= dh_plan_lower_bound(load, n, cfg.ranks) * (1 - 1e-12));
    }
}

/* Brute force: the least max load over every assignment of n items to R ranks, with exactly
 * `batch` items per rank (batch 0: no count constraint). R^n leaves. */
static double brute_force(const double *load, size_t n, uint32_t ranks, uint32_t batch)
{
    uint32_t choice[MAX_N] = {0};
    double best = INFINITY;
    for (;;) {
        double sum[MAX_R] = {0};
        uint32_t count[MAX_R] = {0};
        for (size_t i = 0; i < n; i++) {
            sum[choice[i]] += load[i];
            count[choice[i]]++;
        }
        int ok = 1;
        for (uint32_t r = 0; batch && r < ranks; r++)
            ok &= count[r] == batch;
        if (ok)
            best = fmin(best, max_load(sum, ranks));
        size_t i = 0;
        while (i < n && ++choice[i] == ranks)
            choice[i++] = 0;
        if (i == n)
            return n ? best : 0;
    }
}

static void plan_exact_equals_brute_force(void **state)
{
    static const uint32_t shapes[][2] = {{3, 2}, {2, 3}, {3, 3}, {2, 4}, {4, 2}};
    dh_rng_t rng;
    dh_rng_seed(&rng, 15);
    double load[MAX_N], rank_load[MAX_R];
    uint32_t key[MAX_N];
    int32_t rank_of[MAX_N];
    for (int trial = 0; trial < 250; trial++) {
        dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH, .algo = DH_PLAN_EXACT};
        cfg.ranks = shapes[trial % 5][0];
        cfg.batch = shapes[trial % 5][1];
        size_t n = (size_t)cfg.ranks * cfg.batch;
        random_instance(&rng, n, load, key);
        assert_int_equal(dh_plan_step(&cfg, load, key, n, rank_of, rank_load), 0);
        check_fixed(&cfg, load, n, rank_of, rank_load);
        double opt = brute_force(load, n, cfg.ranks, cfg.batch);
        assert_close(max_load(rank_load, cfg.ranks), opt, 1e-9 * opt);
    }
}

/* Token budget with a budget nothing exceeds: exact is the unconstrained optimum. */
static void plan_exact_equals_brute_force_token_budget(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 16);
    double load[MAX_N], rank_load[MAX_R];
    uint32_t key[MAX_N];
    int32_t rank_of[MAX_N];
    for (int trial = 0; trial < 200; trial++) {
        dh_plan_config_t cfg = {.mode = DH_PLAN_TOKEN_BUDGET, .algo = DH_PLAN_EXACT};
        cfg.ranks = 2 + (uint32_t)dh_rng_below(&rng, 2);
        size_t n = 1 + (size_t)dh_rng_below(&rng, 8);
        random_instance(&rng, n, load, key);
        cfg.token_budget = 1e6;
        assert_int_equal(dh_plan_step(&cfg, load, key, n, rank_of, rank_load), 0);
        check_packing(&cfg, load, n, rank_of, rank_load);
        for (size_t i = 0; i < n; i++)
            assert_true(rank_of[i] >= 0);
        double opt = brute_force(load, n, cfg.ranks, 0);
        assert_close(max_load(rank_load, cfg.ranks), opt, 1e-9 * opt);
    }
}

/* On kinetics-like 8 x 2 and 8 x 4 windows the exact solver finishes in most steps and the
 * default is within 3% of it on average (the bar). */
static void plan_default_within_3_percent_of_exact(void **state)
{
    static const uint32_t batches[] = {2, 4};
    dh_rng_t rng;
    dh_rng_seed(&rng, 17);
    double load[MAX_N], rank_load[MAX_R];
    uint32_t key[MAX_N];
    int32_t rank_of[MAX_N];
    for (size_t b = 0; b < DH_ARRAY_LEN(batches); b++) {
        double gap_sum = 0;
        int solved = 0, trials = 60;
        for (int trial = 0; trial < trials; trial++) {
            dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH, .ranks = 8};
            cfg.batch = batches[b];
            size_t n = 8 * (size_t)cfg.batch;
            kinetics_instance(&rng, n, load, key);
            cfg.algo = DH_PLAN_EXACT;
            int rc = dh_plan_step(&cfg, load, key, n, rank_of, rank_load);
            if (rc == DH_ETOOBIG)
                continue;
            assert_int_equal(rc, 0);
            double opt = max_load(rank_load, 8);
            cfg.algo = DH_PLAN_SWAP;
            assert_int_equal(dh_plan_step(&cfg, load, key, n, rank_of, rank_load), 0);
            gap_sum += max_load(rank_load, 8) / opt - 1;
            solved++;
        }
        assert_true(solved >= trials * 9 / 10);
        assert_true(gap_sum / solved <= 0.03);
    }
}

static void plan_rejects_bad_windows_and_configs(void **state)
{
    double load[6] = {1, 2, 3, 4, 5, 6}, rank_load[3];
    int32_t rank_of[6];
    dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH, .ranks = 3, .batch = 2};
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 5, rank_of, rank_load), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "3 x 2"));
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 6, rank_of, rank_load), 0);
    assert_int_equal(dh_plan_step_carried(&cfg, load, NULL, 6, 1, rank_of, rank_load), DH_EINVAL);
    cfg.ranks = 0;
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 0, rank_of, rank_load), DH_EINVAL);
    cfg.ranks = 3;
    cfg.batch = 0;
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 0, rank_of, rank_load), DH_EINVAL);
    cfg.batch = 2;
    load[4] = NAN;
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 6, rank_of, rank_load), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "item 4"));
    load[4] = -1;
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 6, rank_of, rank_load), DH_EINVAL);
    load[4] = 5;
    cfg.mode = DH_PLAN_TOKEN_BUDGET;
    cfg.token_budget = 0;
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 6, rank_of, rank_load), DH_EINVAL);
    cfg.algo = (dh_plan_algo_t)9;
    cfg.token_budget = 100;
    assert_int_equal(dh_plan_step(&cfg, load, NULL, 6, rank_of, rank_load), DH_EINVAL);
}

static void plan_item_over_budget_is_erange(void **state)
{
    double load[] = {3, 4, 12, 1}, rank_load[2];
    int32_t rank_of[4];
    dh_plan_config_t cfg = {.mode = DH_PLAN_TOKEN_BUDGET, .ranks = 2, .token_budget = 10};
    for (size_t a = 0; a < DH_ARRAY_LEN(all_algos); a++) {
        cfg.algo = all_algos[a];
        assert_int_equal(dh_plan_step(&cfg, load, NULL, 4, rank_of, rank_load), DH_ERANGE);
        assert_non_null(strstr(dh_last_error(), "item 2"));
    }
}

static void plan_exact_gives_up_at_node_limit(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 18);
    double load[32], rank_load[8];
    uint32_t key[32];
    int32_t rank_of[32];
    dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH,
                            .ranks = 8,
                            .batch = 4,
                            .algo = DH_PLAN_EXACT,
                            .exact_node_limit = 3};
    int gave_up = 0;
    for (int trial = 0; trial < 50 && !gave_up; trial++) {
        kinetics_instance(&rng, 32, load, key);
        int rc = dh_plan_step(&cfg, load, key, 32, rank_of, rank_load);
        assert_true(rc == 0 || rc == DH_ETOOBIG);
        if (rc == DH_ETOOBIG) {
            gave_up = 1;
            assert_non_null(strstr(dh_last_error(), "gave up"));
            check_fixed(&cfg, load, 32, rank_of, rank_load); /* still the best plan found */
        }
    }
    assert_true(gave_up);
}

static void plan_algo_names_round_trip(void **state)
{
    for (int a = 0; a < DH_PLAN_ALGO_COUNT; a++) {
        dh_plan_algo_t parsed = DH_PLAN_GREEDY;
        assert_int_equal(dh_plan_algo_from_name(dh_plan_algo_name((dh_plan_algo_t)a), &parsed), 0);
        assert_int_equal(parsed, a);
    }
    dh_plan_algo_t parsed;
    assert_int_equal(dh_plan_algo_from_name("lpt", &parsed), DH_EUNKNOWN);
    assert_string_equal(dh_plan_algo_name(DH_PLAN_ALGO_DEFAULT), "swap");
}

static void plan_lower_bound_is_mean_or_largest(void **state)
{
    double a[] = {1, 1, 1, 9};
    assert_close(dh_plan_lower_bound(a, 4, 2), 9, 0);
    double b[] = {4, 4, 4, 4};
    assert_close(dh_plan_lower_bound(b, 4, 2), 8, 0);
}

static void fanout_sizes_differ_by_one_and_cover_all(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 19);
    double load[MAX_N];
    uint32_t key[MAX_N], part_of[MAX_N], again[MAX_N];
    for (int trial = 0; trial < 300; trial++) {
        size_t n = 1 + (size_t)dh_rng_below(&rng, 40);
        uint32_t parts = 1 + (uint32_t)dh_rng_below(&rng, n);
        random_instance(&rng, n, load, key);
        assert_int_equal(dh_plan_fanout(load, n, parts, part_of), 0);
        assert_int_equal(dh_plan_fanout(load, n, parts, again), 0);
        assert_memory_equal(part_of, again, n * sizeof *again);
        size_t count[MAX_N] = {0};
        double sum[MAX_N] = {0}, total = 0, largest = 0;
        for (size_t i = 0; i < n; i++) {
            assert_true(part_of[i] < parts);
            count[part_of[i]]++;
            sum[part_of[i]] += load[i];
            total += load[i];
            largest = fmax(largest, load[i]);
        }
        size_t lo = n, hi = 0;
        double top = 0;
        for (uint32_t p = 0; p < parts; p++) {
            lo = count[p] < lo ? count[p] : lo;
            hi = count[p] > hi ? count[p] : hi;
            top = fmax(top, sum[p]);
        }
        assert_true(hi - lo <= 1);
        /* Balanced: the heaviest part is within one largest item of the mean. */
        assert_true(top <= total / parts + largest + 1e-9);
    }
    assert_int_equal(dh_plan_fanout(load, 3, 0, part_of), DH_EINVAL);
    assert_int_equal(dh_plan_fanout(load, 3, 4, part_of), DH_EINVAL);
}

/* Every allocation of dh_plan_step failing in turn gives DH_ENOMEM, no crash, no leak. */
typedef struct plan_case {
    const dh_plan_config_t *cfg;
    const double *load;
    const uint32_t *key;
} plan_case_t;

static int plan_one_step(void *ctx)
{
    const plan_case_t *c = ctx;
    double rank_load[4];
    int32_t rank_of[16];
    return dh_plan_step(c->cfg, c->load, c->key, 16, rank_of, rank_load);
}

static void plan_step_survives_each_allocation_failure(void **state)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, 20);
    double load[16];
    uint32_t key[16];
    random_instance(&rng, 16, load, key);
    dh_plan_config_t configs[] = {
        {.mode = DH_PLAN_FIXED_BATCH, .algo = DH_PLAN_EXACT, .ranks = 4, .batch = 4},
        {.mode = DH_PLAN_TOKEN_BUDGET, .algo = DH_PLAN_EXACT, .ranks = 4, .token_budget = 3000},
        {.mode = DH_PLAN_TOKEN_BUDGET, .algo = DH_PLAN_KK, .ranks = 4, .token_budget = 3000},
    };
    for (size_t c = 0; c < DH_ARRAY_LEN(configs); c++) {
        plan_case_t pc = {&configs[c], load, key};
        assert_true(dh_test_each_allocation_failure(plan_one_step, &pc) > 0);
    }
}

/* Runs a shell command, returns its exit status and up to cap-1 bytes of its stdout. */
static int run_command(const char *command, char *out, size_t cap)
{
    FILE *p = popen(command, "r");
    assert_non_null(p);
    size_t len = fread(out, 1, cap - 1, p);
    out[len] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void plan_cli_json_reports_every_field(void **state)
{
    const char *cli = getenv("DH_CLI");
    if (!cli || !*cli)
        skip();
    char profiles[1024], command[4096], out[4096];
    snprintf(profiles, sizeof profiles, "%s", dh_test_path("plan-profiles.jsonl"));
    snprintf(command, sizeof command,
             "'%s' gen-profiles --mix kinetics-mixed --count 400 --seed 1 -o '%s' 2>/dev/null", cli,
             profiles);
    assert_int_equal(run_command(command, out, sizeof out), 0);
    snprintf(command, sizeof command,
             "'%s' plan --profiles '%s' --ranks 4 --batch 2 --steps 30 --json", cli, profiles);
    assert_int_equal(run_command(command, out, sizeof out), 0);
    json_error_t err;
    json_t *obj = json_loads(out, 0, &err);
    assert_non_null(obj);
    assert_int_equal(json_integer_value(json_object_get(obj, "ranks")), 4);
    assert_int_equal(json_integer_value(json_object_get(obj, "batch")), 2);
    assert_int_equal(json_integer_value(json_object_get(obj, "steps")), 30);
    assert_string_equal(json_string_value(json_object_get(obj, "algo")), "swap");
    assert_true(json_real_value(json_object_get(obj, "imbalance_mean")) >= 1.0);
    assert_true(json_real_value(json_object_get(obj, "imbalance_p95")) >= 1.0);
    assert_true(json_is_number(json_object_get(obj, "gap_to_bound_mean")));
    assert_true(json_is_number(json_object_get(obj, "gap_to_opt_mean"))); /* 8 items: solved */
    json_decref(obj);
    /* Too big for the exact solver: gap_to_opt_mean is null. */
    snprintf(command, sizeof command,
             "'%s' plan --profiles '%s' --ranks 8 --batch 8 --steps 5 --algo greedy --json", cli,
             profiles);
    assert_int_equal(run_command(command, out, sizeof out), 0);
    obj = json_loads(out, 0, &err);
    assert_non_null(obj);
    assert_true(json_is_null(json_object_get(obj, "gap_to_opt_mean")));
    assert_string_equal(json_string_value(json_object_get(obj, "algo")), "greedy");
    json_decref(obj);
}

static void plan_cli_usage_errors_exit_2(void **state)
{
    const char *cli = getenv("DH_CLI");
    if (!cli || !*cli)
        skip();
    char command[4096], out[4096];
    snprintf(command, sizeof command, "'%s' plan --profiles x.jsonl --batch 2 2>&1", cli);
    assert_int_equal(run_command(command, out, sizeof out), 2);
    assert_non_null(strstr(out, "--ranks"));
    snprintf(command, sizeof command,
             "'%s' plan --profiles x.jsonl --ranks 2 --batch 2 --algo best 2>&1", cli);
    assert_int_equal(run_command(command, out, sizeof out), 2);
    assert_non_null(strstr(out, "--algo"));
    snprintf(command, sizeof command,
             "'%s' plan --profiles /nonexistent.jsonl --ranks 2 --batch 2 2>&1", cli);
    assert_int_equal(run_command(command, out, sizeof out), 1);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(plan_fixed_batch_invariants_all_algorithms),
    cmocka_unit_test(plan_token_budget_invariants_all_algorithms),
    cmocka_unit_test(plan_token_budget_places_carried_items_first),
    cmocka_unit_test(plan_greedy_groups_by_key_in_window_order),
    cmocka_unit_test(plan_default_never_worse_than_greedy_or_kk),
    cmocka_unit_test(plan_exact_not_worse_than_any_heuristic),
    cmocka_unit_test(plan_exact_equals_brute_force),
    cmocka_unit_test(plan_exact_equals_brute_force_token_budget),
    cmocka_unit_test(plan_default_within_3_percent_of_exact),
    cmocka_unit_test(plan_rejects_bad_windows_and_configs),
    cmocka_unit_test(plan_item_over_budget_is_erange),
    cmocka_unit_test(plan_exact_gives_up_at_node_limit),
    cmocka_unit_test(plan_algo_names_round_trip),
    cmocka_unit_test(plan_lower_bound_is_mean_or_largest),
    cmocka_unit_test(fanout_sizes_differ_by_one_and_cover_all),
    cmocka_unit_test(plan_step_survives_each_allocation_failure),
    cmocka_unit_test(plan_cli_json_reports_every_field),
    cmocka_unit_test(plan_cli_usage_errors_exit_2),
};
DH_TEST_MAIN(tests)
