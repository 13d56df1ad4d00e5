/* client_test.h: what the client's test files share (test_client.c, test_client_resume.c,
 * test_client_arena.c, test_client_cluster.c): a batch's tensor by name, the check of a
 * synthetic batch's bytes, the embedded client's base configuration, and an epoch run
 * checking each batch against the plan and every row delivered once. Header-only
 * (static functions), included by the tests of tests/runtime after cluster.h. */
#ifndef DH_TESTS_RUNTIME_CLIENT_TEST_H
#define DH_TESTS_RUNTIME_CLIENT_TEST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/tensor.h"

static __attribute__((unused)) const dh_tensor_t *tensor(const dh_client_batch_t *b,
                                                         const char *name)
{
    for (size_t i = 0; i < b->n_tensors; i++)
        if (strcmp(b->tensors[i].name, name) == 0)
            return &b->tensors[i];
    return NULL;
}

/* Each synthetic sample's bytes start with its id. */
static __attribute__((unused)) void check_synthetic(const dh_client_batch_t *b)
{
    const dh_tensor_t *sizes = tensor(b, "sizes");
    const dh_tensor_t *payload = tensor(b, "payload");
    if (!sizes || !payload) {
        print_error("batch %llu from '%s' has %zu tensors:", (unsigned long long)b->index,
                    b->server ? b->server : "?", b->n_tensors);
        for (size_t i = 0; i < b->n_tensors; i++)
            print_error(" '%s' (%zu bytes)", b->tensors[i].name, b->tensors[i].nbytes);
        print_error("\n");
    }
    assert_non_null(sizes);
    assert_non_null(payload);
    assert_int_equal(sizes->dtype, DH_DTYPE_INT64);
    assert_int_equal(sizes->shape[0], (int64_t)b->n_samples);
    const int64_t *sz = sizes->data;
    size_t at = 0;
    for (size_t i = 0; i < b->n_samples; i++) {
        size_t n = strlen(b->samples[i].id);
        assert_true((size_t)sz[i] >= n);
        assert_memory_equal((const char *)payload->data + at, b->samples[i].id, n);
        at += (size_t)sz[i];
    }
    assert_int_equal(at, payload->nbytes);
}

static __attribute__((unused)) void base_config(dh_client_config_t *cfg, const char *profiles,
                                                const char *pipeline)
{
    dh_client_config_default(cfg);
    cfg->profiles = profiles;
    cfg->pipeline_json = pipeline;
    cfg->ranks = 1;
    cfg->batch = 4;
    cfg->seed = 3;
    cfg->node = "test-node";
    cfg->next_timeout_ms = 60000;
    cfg->connect_timeout_ms = 10000;
}

#define SYNTH "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}"

static __attribute__((unused)) dh_profile_set_t *load_rows(const char *profiles, size_t *n)
{
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, profiles), 0);
    *n = dh_profile_set_count(set);
    return set;
}

/* The ids of one epoch: every row of the file exactly once, each batch's in the plan's
 * order, whatever the fanout. */
static __attribute__((unused)) void run_epoch_ids(const char *profiles, uint32_t fanout,
                                                  uint32_t prefetch, uint64_t arena_bytes,
                                                  const char *pipeline)
{
    size_t n = 0;
    dh_profile_set_t *set = load_rows(profiles, &n);
    int *seen = calloc(n, sizeof *seen);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, pipeline);
    cfg.fanout = fanout;
    cfg.prefetch = prefetch;
    if (arena_bytes)
        cfg.arena_bytes = arena_bytes;
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    dh_client_batch_t *b = NULL;
    while ((rc = dh_client_next(c, &b)) == 0) {
        check_synthetic(b);
        /* in the plan's order: the rank's rows split into `fanout` parts by dh_plan_fanout
         * on their tokens (as the client requests them), the parts joined in part order,
         * each part's rows in plan order */
        uint32_t rows[16], part_of[16], order[16];
        double load[16];
        int planned = dh_client_plan_rank_step(c, b->index, 0, rows, 16);
        assert_int_equal(planned, (int)b->n_samples);
        for (int i = 0; i < planned; i++)
            load[i] = (double)dh_profile_set_row(set, rows[i])->tokens_est;
        if (fanout > 1)
            assert_int_equal(dh_plan_fanout(load, (size_t)planned, fanout, part_of), 0);
        else
            memset(part_of, 0, sizeof part_of);
        int at = 0;
        for (uint32_t p = 0; p < fanout; p++)
            for (int i = 0; i < planned; i++)
                if (part_of[i] == p)
                    order[at++] = rows[i];
        assert_int_equal(at, planned);
        for (size_t i = 0; i < b->n_samples; i++)
            if (strcmp(dh_profile_set_row(set, order[i])->id, b->samples[i].id) != 0)
                fail_msg("batch %llu sample %zu: '%s', planned '%s' (fanout %u)",
                         (unsigned long long)b->index, i, b->samples[i].id,
                         dh_profile_set_row(set, order[i])->id, fanout);
        for (size_t i = 0; i < b->n_samples; i++)
            for (size_t k = 0; k < n; k++)
                if (strcmp(dh_profile_set_row(set, k)->id, b->samples[i].id) == 0)
                    seen[k]++;
        dh_client_batch_release(&b);
    }
    if (rc != DH_EEOF)
        print_error("next: %s (%s)\n", dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, DH_EEOF);
    for (size_t k = 0; k < n; k++)
        assert_int_equal(seen[k], 1);
    free(seen);
    dh_client_destroy(&c);
    dh_profile_set_destroy(&set);
}

#endif
