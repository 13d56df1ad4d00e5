/* Tests of the cost model's online refinement (docs/design.md §4.1): it starts from the profile,
 * learns per key, converges after a drift, fits frames x pixels for unseen keys, and fails
 * cleanly on bad input and on every allocation failure. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"

static dh_profile_row_t row(const char *key, int frames, int side, double cpu_est)
{
    dh_profile_row_t r;
    memset(&r, 0, sizeof r);
    r.id = "s0";
    r.uri = "synthetic://s0.mp4";
    r.profile_key = key;
    r.frames = frames;
    r.height = r.width = side;
    r.cpu_s_est = cpu_est;
    r.tokens_est = 512;
    r.in_bytes = 1000;
    r.out_bytes = (int64_t)frames * side * side * 3;
    return r;
}

static void cost_model_starts_from_profile(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_profile_row_t r = row("f16x224x224", 16, 224, 0.25);
    dh_cost_source_t src;
    assert_close(dh_cost_model_predict(m, &r, &src), 0.25, 1e-12);
    assert_int_equal(src, DH_COST_FROM_PROFILE);
    dh_cost_model_destroy(&m);
    assert_null(m);
}

static void cost_model_learns_key_ratio(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_profile_row_t r = row("f16x224x224", 16, 224, 0.25);
    for (int i = 0; i < 3; i++)
        assert_int_equal(dh_cost_model_observe(m, &r, 0.5, 1.0), 0);
    dh_cost_source_t src;
    assert_close(dh_cost_model_predict(m, &r, &src), 0.5, 1e-9);
    assert_int_equal(src, DH_COST_FROM_KEY);
    /* The ratio, not the absolute time, is learned: a longer clip of the key costs more. */
    dh_profile_row_t longer = r;
    longer.cpu_s_est = 0.5;
    assert_close(dh_cost_model_predict(m, &longer, NULL), 1.0, 1e-9);
    dh_cost_model_destroy(&m);
}

/* The true cost of a key drifts (the machine got busier, a codec changed): the model
 * follows, within 2% after 30 observations of the new regime. */
static void cost_model_converges_on_drift(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_rng_t rng;
    dh_rng_seed(&rng, 5);
    const char *keys[3] = {"f16x224x224", "f32x336x336", "f64x448x448"};
    const double est[3] = {0.1, 0.4, 1.6};
    double truth[3] = {1.5, 1.2, 0.8}; /* true ratio to the estimate, before the drift */
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) {
            truth[0] = 0.6;
            truth[1] = 2.5;
            truth[2] = 1.1;
        }
        for (int i = 0; i < (phase ? 30 : 200); i++)
            for (int k = 0; k < 3; k++) {
                dh_profile_row_t r = row(keys[k], 16 << k, 224 + 112 * k, est[k]);
                /* 3% measurement noise */
                double measured = est[k] * truth[k] * (1 + 0.03 * dh_rng_normal(&rng));
                assert_int_equal(dh_cost_model_observe(m, &r, measured, 1.0), 0);
            }
        for (int k = 0; k < 3; k++) {
            dh_profile_row_t r = row(keys[k], 16 << k, 224 + 112 * k, est[k]);
            double predicted = dh_cost_model_predict(m, &r, NULL);
            double want = est[k] * truth[k];
            if (fabs(predicted - want) > 0.02 * want)
                fail_msg("phase %d key %s: predicted %.4f, true %.4f", phase, keys[k], predicted,
                         want);
        }
    }
    dh_cost_model_destroy(&m);
}

/* Mean-one lognormal noise of sigma s (the emulation's misprediction draws). */
static double lognormal(dh_rng_t *rng, double s)
{
    return exp(s * dh_rng_normal(rng) - s * s / 2);
}

/* The emulation's defaults: each key off by its own bias, each sample by sigma-0.3 noise.
 * The key's mean averages the noise over its window (cost.h): the learned ratio ends within
 * 10% of the bias, where the old EWMA of weight 0.2 kept ~10% noise of its own, and no
 * drift restart throws the average away (the ratio stays within 10% at every check). */
static void cost_model_learns_bias_under_sample_noise(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_rng_t rng;
    dh_rng_seed(&rng, 11);
    const char *keys[3] = {"f16x224x224", "f32x336x336", "f64x448x448"};
    const double bias[3] = {1.35, 0.72, 1.08};
    for (int i = 0; i < 400; i++)
        for (int k = 0; k < 3; k++) {
            dh_profile_row_t r = row(keys[k], 16 << k, 224 + 112 * k, 0.1 * (k + 1));
            double measured = r.cpu_s_est * bias[k] * lognormal(&rng, 0.3);
            assert_int_equal(dh_cost_model_observe(m, &r, measured, 1.0), 0);
            if (i >= 100 && i % 10 == 0) {
                uint64_t obs = 0;
                double ratio = dh_cost_model_key_ratio(m, keys[k], &obs);
                if (fabs(ratio / bias[k] - 1) > 0.1)
                    fail_msg("key %s after %d: ratio %.4f, bias %.4f (%llu obs)", keys[k], i, ratio,
                             bias[k], (unsigned long long)obs);
            }
        }
    uint64_t obs = 0;
    assert_true(isnan(dh_cost_model_key_ratio(m, "never", &obs)));
    assert_int_equal(obs, 0);
    dh_cost_model_destroy(&m);
}

/* The coordinator's rule (coordinator_learn.c learn, anchor_speeds): the model observes every
 * sample divided by the server's speed; the speed learns the residual over samples whose
 * key is already known; the speeds are anchored at their median (the model scaled to
 * match), without which the pair could trade any common factor. Four servers, requests of two
 * random samples of three biased keys, sigma-0.3 noise. With every server truly at speed 1 the
 * speeds stay within 10% of 1 while the keys converge to their biases; with server 3 truly twice as
 * slow, its speed goes to ~2 and the keys are still learned (the model does not absorb the slow
 * server). */
static void simulate_feedback(double slow_speed, double speeds[4], double ratios[3])
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_rng_t rng;
    dh_rng_seed(&rng, 3);
    const char *keys[3] = {"f16x224x224", "f32x336x336", "f64x448x448"};
    const double bias[3] = {1.4, 0.7, 1.1};
    for (int s = 0; s < 4; s++)
        speeds[s] = 1.0;
    for (int i = 0; i < 2000; i++) {
        int server = i % 4;
        double truth = server == 3 ? slow_speed : 1.0;
        double measured_known = 0, predicted_known = 0;
        for (int j = 0; j < 2; j++) {
            int k = (int)dh_rng_below(&rng, 3);
            dh_profile_row_t r = row(keys[k], 16 << k, 224 + 112 * k, 0.1 * (k + 1));
            double measured = r.cpu_s_est * bias[k] * truth * lognormal(&rng, 0.3);
            dh_cost_source_t src;
            double pred = dh_cost_model_predict(m, &r, &src);
            if (src == DH_COST_FROM_KEY) {
                measured_known += measured;
                predicted_known += pred * speeds[server];
            }
            assert_int_equal(dh_cost_model_observe(m, &r, measured, speeds[server]), 0);
        }
        speeds[server] = dh_cost_speed_learn(speeds[server], measured_known, predicted_known);
        dh_cost_model_scale(m, dh_cost_speed_anchor(speeds, 4));
    }
    for (int k = 0; k < 3; k++)
        ratios[k] = dh_cost_model_key_ratio(m, keys[k], NULL) / bias[k];
    dh_cost_model_destroy(&m);
}

static void cost_speed_stays_near_one_while_keys_learn(void **state)
{
    double speeds[4], ratios[3];
    simulate_feedback(1.0, speeds, ratios);
    for (int s = 0; s < 4; s++)
        if (fabs(speeds[s] - 1) > 0.1)
            fail_msg("server %d: speed %.4f, truly 1", s, speeds[s]);
    for (int k = 0; k < 3; k++)
        if (fabs(ratios[k] - 1) > 0.1)
            fail_msg("key %d: learned / bias %.4f", k, ratios[k]);
}

static void cost_speed_learns_a_slow_server_apart_from_the_keys(void **state)
{
    double speeds[4], ratios[3];
    simulate_feedback(2.0, speeds, ratios);
    for (int s = 0; s < 4; s++) {
        double want = s == 3 ? 2.0 : 1.0;
        if (fabs(speeds[s] / want - 1) > 0.15)
            fail_msg("server %d: speed %.4f, truly %.1f", s, speeds[s], want);
    }
    for (int k = 0; k < 3; k++)
        if (fabs(ratios[k] - 1) > 0.15)
            fail_msg("key %d: learned / bias %.4f", k, ratios[k]);
    /* the anchor: speeds over their median, the model scaled by it (nothing predicts
     * differently) */
    double s5[5] = {0.5, 2.0, 1.0, 4.0, 1.0}, two[2] = {1.0, 3.0};
    assert_close(dh_cost_speed_anchor(s5, 5), 1.0, 0);
    assert_close(dh_cost_speed_anchor(two, 2), 2.0, 0);
    assert_close(two[0], 0.5, 0);
    assert_close(two[1], 1.5, 0);
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_profile_row_t r = row("k", 16, 224, 1.0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(dh_cost_model_observe(m, &r, 1.5, 1.0), 0);
    dh_cost_model_scale(m, 2.0);
    assert_close(dh_cost_model_predict(m, &r, NULL), 3.0, 1e-9);
    dh_cost_model_destroy(&m);
    /* the rule itself: clamped residuals, no change without evidence */
    assert_close(dh_cost_speed_learn(1.0, 10.0, 1.0), 1.05, 1e-12); /* residual 2 at most */
    assert_close(dh_cost_speed_learn(1.0, 0.0, 1.0), 1.0, 0);
    assert_close(dh_cost_speed_learn(1.3, 1.0, 0.0), 1.3, 0);
}

/* Keys never seen are predicted by the frames x pixels fit, which beats a wrong profile. */
static void cost_model_fit_predicts_unseen_key(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    /* True cost: 0.01 s + 20 ns per output pixel-frame. */
    int frames[4] = {8, 16, 32, 64}, sides[4] = {160, 224, 336, 448};
    for (int rep = 0; rep < 5; rep++)
        for (int i = 0; i < 4; i++) {
            char key[32];
            snprintf(key, sizeof key, "f%dx%d", frames[i], sides[i]);
            dh_profile_row_t r = row(key, frames[i], sides[i], 0.05);
            double truth = 0.01 + 2e-8 * frames[i] * sides[i] * sides[i];
            assert_int_equal(dh_cost_model_observe(m, &r, truth, 1.0), 0);
        }
    dh_profile_row_t unseen = row("f24x288", 24, 288, 0.05 /* a wrong estimate */);
    dh_cost_source_t src;
    double predicted = dh_cost_model_predict(m, &unseen, &src);
    assert_int_equal(src, DH_COST_FROM_FIT);
    assert_close(predicted, 0.01 + 2e-8 * 24 * 288 * 288, 1e-3);
    dh_cost_model_destroy(&m);
}

static void cost_model_normalizes_by_server_speed(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_profile_row_t r = row("k", 16, 224, 1.0);
    /* 2 s measured on a server twice as slow as profiled: 1 s at speed 1. */
    for (int i = 0; i < 5; i++)
        assert_int_equal(dh_cost_model_observe(m, &r, 2.0, 2.0), 0);
    assert_close(dh_cost_model_predict(m, &r, NULL), 1.0, 1e-9);
    dh_cost_model_destroy(&m);
}

static void cost_model_rejects_bad_measurement(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_profile_row_t r = row("k", 16, 224, 1.0);
    r.id = "clip-42";
    assert_int_equal(dh_cost_model_observe(m, &r, -1.0, 1.0), DH_EINVAL);
    assert_true(strstr(dh_last_error(), "clip-42") != NULL);
    assert_int_equal(dh_cost_model_observe(m, &r, NAN, 1.0), DH_EINVAL);
    assert_int_equal(dh_cost_model_observe(m, &r, 1.0, 0.0), DH_EINVAL);
    uint64_t obs = 1;
    assert_true(isnan(dh_cost_model_key_ratio(m, "k", &obs)));
    assert_int_equal(obs, 0);
    dh_cost_source_t src;
    assert_close(dh_cost_model_predict(m, &r, &src), 1.0, 1e-12);
    assert_int_equal(src, DH_COST_FROM_PROFILE);
    dh_cost_model_destroy(&m);
}

static void cost_model_request_sums_rows(void **state)
{
    dh_cost_model_t *m = NULL;
    assert_int_equal(dh_cost_model_new(&m, NULL), 0);
    dh_profile_row_t a = row("a", 16, 224, 0.5), b = row("b", 32, 336, 1.5);
    const dh_profile_row_t *rows[2] = {&a, &b};
    dh_request_cost_t req = {.deadline_s = 7};
    dh_cost_model_request(m, rows, 2, &req);
    assert_close(req.cpu_s, 2.0, 1e-12);
    assert_close(req.in_bytes, 2000, 0);
    assert_close(req.out_bytes, (double)(a.out_bytes + b.out_bytes), 0);
    assert_close(req.deadline_s, 7, 0);
    dh_cost_model_destroy(&m);
}

/* Many keys (the table grows) with each allocation failing in turn: a clean DH_ENOMEM,
 * no crash, no leak. */
static int cost_model_learn_many_keys(void *ctx)
{
    char(*keys)[16] = ctx;
    dh_cost_model_t *m = NULL;
    int rc = dh_cost_model_new(&m, NULL);
    for (int k = 0; rc == 0 && k < 40; k++) {
        dh_profile_row_t r = row(keys[k], 16, 224, 1.0);
        rc = dh_cost_model_observe(m, &r, 1.0, 1.0);
    }
    if (rc == 0) { /* what was learned still predicts */
        dh_profile_row_t r = row(keys[39], 16, 224, 1.0);
        assert_close(dh_cost_model_predict(m, &r, NULL), 1.0, 1e-9);
    }
    dh_cost_model_destroy(&m);
    return rc;
}

static void cost_model_survives_each_allocation_failure(void **state)
{
    char keys[40][16];
    for (int k = 0; k < 40; k++)
        snprintf(keys[k], sizeof keys[k], "key%d", k);
    /* 40 keys make the table grow several times. */
    assert_true(dh_test_each_allocation_failure(cost_model_learn_many_keys, keys) > 40);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(cost_model_starts_from_profile),
    cmocka_unit_test(cost_model_learns_key_ratio),
    cmocka_unit_test(cost_model_converges_on_drift),
    cmocka_unit_test(cost_model_learns_bias_under_sample_noise),
    cmocka_unit_test(cost_speed_stays_near_one_while_keys_learn),
    cmocka_unit_test(cost_speed_learns_a_slow_server_apart_from_the_keys),
    cmocka_unit_test(cost_model_fit_predicts_unseen_key),
    cmocka_unit_test(cost_model_normalizes_by_server_speed),
    cmocka_unit_test(cost_model_rejects_bad_measurement),
    cmocka_unit_test(cost_model_request_sums_rows),
    cmocka_unit_test(cost_model_survives_each_allocation_failure),
};
DH_TEST_MAIN(tests)
