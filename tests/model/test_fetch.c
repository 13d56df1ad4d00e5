/* Tests of the fetch model (docs/profiles.md, "The fetch model"): it starts from the prior,
 * converges per (server, source) on synthetic completions, falls back from the pair to the
 * source to the prior, follows a cache that warms, adds costs as it estimates, and fails
 * cleanly on bad input and on every allocation failure. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "model/model_lib.h"

#define MIB 1048576.0

static void fetch_model_starts_from_the_prior(void **state)
{
    dh__fetch_config_t cfg;
    dh__fetch_config_default(&cfg);
    cfg.prior_latency_s = 0.03;
    cfg.prior_bytes_per_s = 50e6;
    dh__fetch_model_t *m = NULL;
    assert_int_equal(dh__fetch_model_new(&m, &cfg), 0);
    dh__fetch_estimate_t e;
    dh__fetch_model_estimate(m, "https://data.example.org", 3, &e);
    assert_int_equal(e.from, DH__FETCH_FROM_PRIOR);
    assert_int_equal(e.obs, 0);
    assert_close(e.latency_s, 0.03, 1e-9);
    assert_close(e.bytes_per_s, 50e6, 1e-3);
    assert_int_equal(dh__fetch_model_source(m, "https://data.example.org"), -1);
    double cost[2] = {1.0, 0.0};
    dh__fetch_model_add_costs(m, -1, 4, 100e6, cost, 2); /* 4 x 30 ms + 100 MB / 50 MB/s */
    assert_close(cost[0], 1.0 + 0.12 + 2.0, 1e-9);
    assert_close(cost[1], 0.12 + 2.0, 1e-9);
    dh__fetch_model_destroy(&m);
    assert_null(m);
    dh__fetch_model_destroy(&m); /* safe on NULL */
}

/* The truth of a (server, source) pair in the synthetic cluster below. */
typedef struct truth {
    uint32_t server;
    const char *source;
    double latency_s, bytes_per_s;
} truth_t;

/* Two servers and two sources, each pair its own latency and bandwidth (a sidecar near
 * the bucket, a training node far from it, a CDN close to both), samples of 0.5-16 MiB,
 * each fetch off its line by a lognormal factor (sigma 0.05): after 200 completions of each
 * pair, interleaved, every pair's fit is within 5% of its bandwidth and 5 ms of its
 * latency. */
static void fetch_model_converges_per_server_and_source(void **state)
{
    static const truth_t pairs[4] = {
        {0, "s3://videos", 0.080, 40e6},  /* the training node, far from the bucket */
        {1, "s3://videos", 0.010, 400e6}, /* the sidecar beside it */
        {0, "https://cdn.example.org", 0.020, 200e6},
        {1, "https://cdn.example.org", 0.025, 150e6},
    };
    dh__fetch_model_t *m = NULL;
    assert_int_equal(dh__fetch_model_new(&m, NULL), 0);
    dh_rng_t rng;
    dh_rng_seed(&rng, 34);
    for (int k = 0; k < 200; k++)
        for (int p = 0; p < 4; p++) {
            double bytes = (0.5 + 15.5 * dh_rng_uniform(&rng)) * MIB;
            double t = (pairs[p].latency_s + bytes / pairs[p].bytes_per_s) *
                       exp(0.05 * dh_rng_normal(&rng));
            assert_int_equal(dh__fetch_model_observe(m, pairs[p].source, pairs[p].server, bytes, t),
                             0);
        }
    for (int p = 0; p < 4; p++) {
        dh__fetch_estimate_t e;
        dh__fetch_model_estimate(m, pairs[p].source, pairs[p].server, &e);
        print_message("%s on server %u: latency %.4f s (true %.4f), %.1f MB/s (true %.1f)\n",
                      pairs[p].source, pairs[p].server, e.latency_s, pairs[p].latency_s,
                      e.bytes_per_s / 1e6, pairs[p].bytes_per_s / 1e6);
        assert_int_equal(e.from, DH__FETCH_FROM_SERVER);
        assert_int_equal(e.obs, 200);
        assert_close(e.latency_s, pairs[p].latency_s, 0.005);
        assert_close(e.bytes_per_s / pairs[p].bytes_per_s, 1.0, 0.05);
    }
    /* The costs placement sees: for an 8 MiB sample of the bucket, the sidecar (1) is
     * cheaper than the training node (0) by about what the truth says (0.21 s vs 0.03 s). */
    double cost[2] = {0, 0};
    int32_t src = dh__fetch_model_source(m, "s3://videos");
    assert_true(src >= 0);
    dh__fetch_model_add_costs(m, src, 1, 8 * MIB, cost, 2);
    assert_close(cost[0], 0.080 + 8 * MIB / 40e6, 0.02);
    assert_close(cost[1], 0.010 + 8 * MIB / 400e6, 0.005);
    assert_true(cost[1] < cost[0] / 4);
    dh__fetch_model_destroy(&m);
}

/* Server 0 has fetched from the source, server 1 never has: server 1 gets the source's fit
 * (every server's observations), an unseen source the prior; a pair's own fit is used from
 * min_obs observations on. */
static void fetch_model_falls_back_from_pair_to_source_to_prior(void **state)
{
    dh__fetch_model_t *m = NULL;
    assert_int_equal(dh__fetch_model_new(&m, NULL), 0);
    const char *src = "http://10.0.0.7:8080";
    dh__fetch_estimate_t e;
    for (int k = 0; k < 2; k++)
        assert_int_equal(dh__fetch_model_observe(m, src, 0, 2 * MIB, 1.0), 0);
    dh__fetch_model_estimate(m, src, 0, &e);
    assert_int_equal(e.from, DH__FETCH_FROM_PRIOR); /* 2 < min_obs 3 */
    assert_int_equal(dh__fetch_model_observe(m, src, 0, 6 * MIB, 1.2), 0);
    dh__fetch_model_estimate(m, src, 0, &e);
    assert_int_equal(e.from, DH__FETCH_FROM_SERVER);
    assert_int_equal(e.obs, 3);
    dh__fetch_estimate_t e1;
    dh__fetch_model_estimate(m, src, 1, &e1);
    assert_int_equal(e1.from, DH__FETCH_FROM_SOURCE);
    assert_int_equal(e1.obs, 3);
    /* one server only: the source's fit and the pair's are the same */
    assert_close(e1.latency_s, e.latency_s, 1e-12);
    dh__fetch_model_estimate(m, src, 1000, &e1); /* a server index never seen */
    assert_int_equal(e1.from, DH__FETCH_FROM_SOURCE);
    /* the learned fetch of 2 MiB (1 s observed; the prior, 0.07 s, still weighs 2 of 5
     * observations) is far from the prior's */
    double learned = e.latency_s + 2 * MIB / e.bytes_per_s;
    print_message("2 MiB after 3 observations of 1-1.2 s: %.3f s\n", learned);
    assert_true(learned > 0.5);
    dh__fetch_model_estimate(m, "s3://elsewhere", 0, &e);
    assert_int_equal(e.from, DH__FETCH_FROM_PRIOR);
    /* add_costs chooses as estimate does, per server */
    double cost[3] = {0, 0, 0};
    dh__fetch_model_add_costs(m, dh__fetch_model_source(m, src), 2, 4 * MIB, cost, 3);
    for (uint32_t i = 0; i < 3; i++) {
        dh__fetch_model_estimate(m, src, i, &e);
        assert_close(cost[i], 2 * e.latency_s + 4 * MIB / e.bytes_per_s, 1e-12);
    }
    dh__fetch_model_destroy(&m);
}

/* A server's cache warms: its fetches drop from 100 MB/s + 50 ms to almost nothing. The
 * forgetting follows within 150 observations, and the other server is untouched. */
static void fetch_model_follows_a_cache_that_warms(void **state)
{
    dh__fetch_model_t *m = NULL;
    assert_int_equal(dh__fetch_model_new(&m, NULL), 0);
    const char *src = "s3://shards";
    dh_rng_t rng;
    dh_rng_seed(&rng, 7);
    for (int k = 0; k < 200; k++)
        for (uint32_t s = 0; s < 2; s++) {
            double bytes = (1 + 7 * dh_rng_uniform(&rng)) * MIB;
            assert_int_equal(dh__fetch_model_observe(m, src, s, bytes, 0.05 + bytes / 100e6), 0);
        }
    for (int k = 0; k < 150; k++) {
        double bytes = (1 + 7 * dh_rng_uniform(&rng)) * MIB;
        assert_int_equal(dh__fetch_model_observe(m, src, 0, bytes, 0.001 + bytes / 5e9), 0);
    }
    double cost[2] = {0, 0};
    dh__fetch_model_add_costs(m, dh__fetch_model_source(m, src), 1, 4 * MIB, cost, 2);
    print_message("4 MiB: warm server %.4f s, cold server %.4f s\n", cost[0], cost[1]);
    assert_true(cost[0] < 0.01);
    assert_close(cost[1], 0.05 + 4 * MIB / 100e6, 0.002);
    dh__fetch_model_destroy(&m);
}

static void fetch_model_rejects_bad_values(void **state)
{
    dh__fetch_model_t *m = NULL;
    assert_int_equal(dh__fetch_model_new(&m, NULL), 0);
    assert_int_equal(dh__fetch_model_observe(m, "s3://b", 0, 1e6, NAN), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "s3://b"));
    assert_int_equal(dh__fetch_model_observe(m, "s3://b", 0, -1, 0.5), DH_EINVAL);
    assert_int_equal(dh__fetch_model_observe(m, "s3://b", 0, 1e6, INFINITY), DH_EINVAL);
    assert_int_equal(dh__fetch_model_source(m, "s3://b"), -1); /* nothing learned */
    dh__fetch_model_destroy(&m);
    dh__fetch_config_t cfg;
    dh__fetch_config_default(&cfg);
    cfg.prior_bytes_per_s = 0;
    assert_int_equal(dh__fetch_model_new(&m, &cfg), DH_EINVAL);
    assert_null(m);
    assert_non_null(strstr(dh_last_error(), "bandwidth 0"));
    dh__fetch_config_default(&cfg);
    cfg.forget = 1.5;
    assert_int_equal(dh__fetch_model_new(&m, &cfg), DH_EINVAL);
}

/* Many sources and servers (the tables grow) with each allocation failing in turn. */
static int fetch_model_learn_many(void *ctx)
{
    (void)ctx;
    dh__fetch_model_t *m = NULL;
    int rc = dh__fetch_model_new(&m, NULL);
    char key[32];
    for (int k = 0; rc == 0 && k < 12; k++) {
        snprintf(key, sizeof key, "https://h%d", k);
        rc = dh__fetch_model_observe(m, key, (uint32_t)(k * 3), 1e6, 0.1);
    }
    if (rc == 0) {
        assert_int_equal(dh__fetch_model_source(m, "https://h11"), 11);
    }
    dh__fetch_model_destroy(&m);
    return rc;
}

static void fetch_model_survives_each_allocation_failure(void **state)
{
    assert_true(dh_test_each_allocation_failure(fetch_model_learn_many, NULL) > 12);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(fetch_model_starts_from_the_prior),
    cmocka_unit_test(fetch_model_converges_per_server_and_source),
    cmocka_unit_test(fetch_model_falls_back_from_pair_to_source_to_prior),
    cmocka_unit_test(fetch_model_follows_a_cache_that_warms),
    cmocka_unit_test(fetch_model_rejects_bad_values),
    cmocka_unit_test(fetch_model_survives_each_allocation_failure),
};
DH_TEST_MAIN(tests)
