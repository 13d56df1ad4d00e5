/* test_client_resume.c: an embedded client (client.h) started mid-run, as a resumed training
 * run starts it: at a step (first_step) it delivers exactly the batches an uninterrupted run
 * delivers from there, epochs crossed; at a sample (first_sample) it takes the windows from
 * there, and a first_sample past the epoch is a configuration error. */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "client_test.h"
#include "cluster.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/mix.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/sampler.h"
#include "datahelix/wire.h"
#include "runtime/rt.h"

/* Mid-epoch resume (first_step): a client started k batches into its run (epochs 2, so the
 * resume crosses an epoch boundary) delivers exactly the batches an uninterrupted one
 * delivers from its k-th on, with their global steps and epochs. */
static void embedded_resume_at_first_step_continues_the_run(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 24); /* 6 steps an epoch */
    enum { RUN = 12, K = 5 };
    char full[RUN][4][32];
    uint64_t step_of[RUN];
    for (int pass = 0; pass < 2; pass++) {
        dh_client_config_t cfg;
        base_config(&cfg, profiles, SYNTH);
        cfg.epochs = 2;
        cfg.first_epoch = 1;
        cfg.plan_window = 2;
        cfg.first_step = pass ? K : 0;
        dh_client_t *c = NULL;
        assert_int_equal(dh_client_new(&c, &cfg), 0);
        dh_client_stats_t st;
        dh_client_stats(c, &st);
        assert_int_equal(st.steps_total, pass ? RUN - K : RUN);
        dh_client_batch_t *b = NULL;
        int at = pass ? K : 0, rc;
        while ((rc = dh_client_next(c, &b)) == 0) {
            assert_true(at < RUN);
            assert_int_equal(b->n_samples, 4);
            if (!pass) {
                step_of[at] = b->step;
                for (int i = 0; i < 4; i++)
                    snprintf(full[at][i], sizeof full[at][i], "%s", b->samples[i].id);
            } else {
                assert_int_equal(b->step, step_of[at]);
                assert_int_equal(b->epoch, (uint32_t)(step_of[at] / 6));
                for (int i = 0; i < 4; i++)
                    assert_string_equal(b->samples[i].id, full[at][i]);
            }
            at++;
            dh_client_batch_release(&b);
        }
        assert_int_equal(rc, DH_EEOF);
        assert_int_equal(at, RUN);
        dh_client_destroy(&c);
    }
    assert_int_equal(step_of[0], 6); /* first_epoch 1 */
}

/* Elastic resume at a sample (first_sample): epoch 1 cut from sample 6 (not a step boundary
 * of 4) delivers the windows [6 + 4k, 10 + 4k) of its order, floor(18 / 4) of them, plan
 * windows (plan_window 2) counted from there; epoch 2 follows at global step 6 + 4 with its
 * usual steps; first_step counts the cut epoch's steps; a sample past the epoch is refused. */
static void embedded_resume_at_first_sample_takes_the_windows_from_there(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 24); /* 6 steps an epoch */
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, profiles), 0);
    dh_sampler_t *all = NULL;
    uint32_t perm[2][24];
    assert_int_equal(dh_sampler_new(&all, 24, 24, 3, 1), 0);
    for (int e = 0; e < 2; e++)
        assert_int_equal(dh_sampler_step(all, 1 + (uint64_t)e, perm[e]), 0);
    dh_sampler_destroy(&all);
    for (uint64_t first_step = 0; first_step < 3; first_step += 2) {
        dh_client_config_t cfg;
        base_config(&cfg, profiles, SYNTH);
        cfg.epochs = 2;
        cfg.first_epoch = 1;
        cfg.plan_window = 2;
        cfg.first_sample = 6;
        cfg.first_step = first_step;
        dh_client_t *c = NULL;
        assert_int_equal(dh_client_new(&c, &cfg), 0);
        dh_client_stats_t st;
        dh_client_stats(c, &st);
        assert_int_equal(st.steps_total, 4 + 6 - first_step);
        dh_client_batch_t *b = NULL;
        uint64_t at = first_step;
        char got[10][4][32];
        int rc;
        while ((rc = dh_client_next(c, &b)) == 0) {
            assert_true(at < 10);
            assert_int_equal(b->step, 6 + at);
            assert_int_equal(b->epoch, at < 4 ? 1 : 2);
            assert_int_equal(b->n_samples, 4);
            for (size_t i = 0; i < 4; i++)
                snprintf(got[at][i], sizeof got[at][i], "%s", b->samples[i].id);
            at++;
            dh_client_batch_release(&b);
        }
        /* each plan window of 2 steps takes its 8 positions (its steps share them by plan) */
        for (uint64_t w = first_step; w < 10; w += 2) {
            int epoch = w < 4 ? 0 : 1, found = 0;
            size_t from = w < 4 ? 6 + w * 4 : (w - 4) * 4;
            for (uint64_t t = w; t < w + 2; t++)
                for (size_t i = 0; i < 4; i++)
                    for (size_t j = 0; j < 8; j++)
                        found += strcmp(got[t][i],
                                        dh_profile_set_row(set, perm[epoch][from + j])->id) == 0;
            assert_int_equal(found, 8);
        }
        assert_int_equal(rc, DH_EEOF);
        assert_int_equal(at, 10);
        dh_client_destroy(&c);
    }
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    cfg.first_sample = 25;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "first_sample 25 is past the epoch's 24 samples"));
    dh_profile_set_destroy(&set);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(embedded_resume_at_first_step_continues_the_run),
        cmocka_unit_test(embedded_resume_at_first_sample_takes_the_windows_from_there),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
