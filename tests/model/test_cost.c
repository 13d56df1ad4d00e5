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
    assert_int_equal(dh_cost_model_observations(m), 0);
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
    assert_int_equal(dh_cost_model_observations(m), 0);
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
    cmocka_unit_test(cost_model_fit_predicts_unseen_key),
    cmocka_unit_test(cost_model_normalizes_by_server_speed),
    cmocka_unit_test(cost_model_rejects_bad_measurement),
    cmocka_unit_test(cost_model_request_sums_rows),
    cmocka_unit_test(cost_model_survives_each_allocation_failure),
};
DH_TEST_MAIN(tests)
