/* Tests of the misprediction model (model/model_lib.h): the draws are a pure function of (seed,
 * key or id), mean one, one factor per key shared by its samples, and none at sigma 0. */
#include <math.h>
#include <stdio.h>

#include "dh_test.h"
#include "model/model_lib.h"

static void noise_is_off_at_zero(void **state)
{
    (void)state;
    dh__noise_t none = {0};
    assert_true(dh__noise_cpu_s(&none, "a", "k", 0.25) == 0.25);
    assert_true(dh__noise_tokens(&none, "a", 777) == 777);
    dh__noise_t p = {.cost_bias = 0.3, .cost_noise = 0.3, .token_noise = 0.1, .seed = 7};
    assert_true(dh__noise_tokens(&p, "a", 0) == 0); /* no estimate, nothing to scale */
}

static void noise_is_seeded_mean_one_and_shared_per_key(void **state)
{
    (void)state;
    dh__noise_t p = {.cost_bias = 0.3, .cost_noise = 0.3, .token_noise = 0.1, .seed = 7};
    dh__noise_t bias_only = p;
    bias_only.cost_noise = 0;
    double bias_k = dh__noise_cpu_s(&bias_only, "any", "k", 1.0);
    assert_true(bias_k != 1.0);
    double sample_sum = 0, tok_sum = 0, bias_sum = 0;
    char id[32], key[32];
    for (int i = 0; i < 4000; i++) {
        snprintf(id, sizeof id, "s%d", i);
        double c = dh__noise_cpu_s(&p, id, "k", 1.0);
        assert_true(c == dh__noise_cpu_s(&p, id, "k", 1.0)); /* pure */
        /* one bias per key: every sample of the key shares it */
        assert_true(dh__noise_cpu_s(&bias_only, id, "k", 1.0) == bias_k);
        sample_sum += c / bias_k;
        tok_sum += (double)dh__noise_tokens(&p, id, 1000) / 1000;
        snprintf(key, sizeof key, "f%dx224x224", i);
        bias_sum += dh__noise_cpu_s(&bias_only, "any", key, 1.0);
    }
    /* mean one: the per-sample part, the per-key part across keys, the tokens */
    assert_close(sample_sum / 4000, 1, 0.03);
    assert_close(bias_sum / 4000, 1, 0.03);
    assert_close(tok_sum / 4000, 1, 0.01);
    /* a different seed, different draws */
    dh__noise_t q = p;
    q.seed = 8;
    assert_true(dh__noise_cpu_s(&q, "s1", "k", 1.0) != dh__noise_cpu_s(&p, "s1", "k", 1.0));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(noise_is_off_at_zero),
    cmocka_unit_test(noise_is_seeded_mean_one_and_shared_per_key),
};
DH_TEST_MAIN(tests)
