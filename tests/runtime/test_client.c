/* test_client.c: the client with its coordinator and local DataServer as threads of this
 * process (embedded mode, client.h), so that the sanitizers (ASan+UBSan, and TSan in `make
 * test-tsan`) see every thread of the client and the DataServer: delivery in order,
 * exactly once, zero-copy (data in the arena), microbatch fanout joined, a batch that
 * outlives its client, a full arena (backpressure), real video with a corrupt clip, and
 * configuration errors. */
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

static const dh_tensor_t *tensor(const dh_client_batch_t *b, const char *name)
{
    for (size_t i = 0; i < b->n_tensors; i++)
        if (strcmp(b->tensors[i].name, name) == 0)
            return &b->tensors[i];
    return NULL;
}

/* Each synthetic sample's bytes start with its id. */
static void check_synthetic(const dh_client_batch_t *b)
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

static void base_config(dh_client_config_t *cfg, const char *profiles, const char *pipeline)
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

static void embedded_epoch_in_order_exactly_once(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    dh_client_batch_t *b = NULL;
    uint64_t index = 0;
    while ((rc = dh_client_next(c, &b)) == 0) {
        assert_int_equal(b->index, index);
        assert_int_equal(b->n_samples, 4);
        assert_int_equal(b->failed, 0);
        check_synthetic(b);
        dh_client_batch_release(&b);
        index++;
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(index, 16);
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    assert_int_equal(st.batches, 16);
    assert_int_equal(st.samples, 64);
    assert_int_equal(st.duplicates_dropped, 0);
    /* every batch was in the arena, so every notice came on the notice channel */
    assert_int_equal(st.notices, st.deliveries);
    assert_int_equal(st.copied_tensors, 0);
    dh_client_destroy(&c);
    cl_assert_no_leftovers();
}

/* Every client of a process has an id of its own (the first one the plain
 * node-rankR-PID): a DataLoader opens a client per epoch, and a DataServer drops the batches
 * of a name that said GOODBYE, so a next-epoch client under its predecessor's name lost an
 * early batch and waited for it forever (tests/soak/memsoak.py found it). A client_id given
 * is kept. */
static void clients_of_one_process_have_ids_of_their_own(void **state)
{
    (void)state;
    const char *profiles = cl_write_profiles("p.jsonl", 8);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    dh_client_t *a = NULL, *b = NULL;
    assert_int_equal(dh_client_new(&a, &cfg), 0);
    char first[256];
    snprintf(first, sizeof first, "%s", dh_client_id(a));
    char plain[256];
    snprintf(plain, sizeof plain, "test-node-rank0-%d", (int)getpid());
    assert_string_equal(first, plain);
    dh_client_destroy(&a);
    assert_int_equal(dh_client_new(&b, &cfg), 0);
    assert_string_not_equal(dh_client_id(b), first);
    assert_int_equal(strncmp(dh_client_id(b), plain, strlen(plain)), 0);
    dh_client_destroy(&b);
    cfg.client_id = "mine";
    assert_int_equal(dh_client_new(&a, &cfg), 0);
    assert_string_equal(dh_client_id(a), "mine");
    dh_client_destroy(&a);
    cl_assert_no_leftovers();
}

/* next() gives up after next_timeout_ms, measured on the monotonic clock, with DH_EAGAIN
 * naming the batch. Each synthetic sample sleeps its profile's cpu_s (about 1 s a batch here),
 * so batch 0 cannot be ready within 50 ms. */
static void next_times_out_with_eagain(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, "{\"type\":\"synthetic\",\"cost\":\"sleep\"}");
    cfg.next_timeout_ms = 50;
    cfg.prefetch = 1;
    cfg.max_steps = 1;
    cfg.workers = 1;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    uint64_t t0 = dh_clock_now_ns();
    int rc = dh_client_next(c, &b);
    double waited = dh_clock_elapsed_s(t0, dh_clock_now_ns());
    assert_int_equal(rc, DH_EAGAIN);
    assert_null(b);
    assert_non_null(strstr(dh_last_error(), "batch 0 not ready within 50 ms"));
    assert_true(waited >= 0.05);
    dh_client_destroy(&c);
    cl_assert_no_leftovers();
}

/* The profile set of a file, and its row count. */
static dh_profile_set_t *load_rows(const char *profiles, size_t *n)
{
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, profiles), 0);
    *n = dh_profile_set_count(set);
    return set;
}

/* The ids of one epoch: every row of the file exactly once, each batch's in the plan's
 * order, whatever the fanout. */
static void run_epoch_ids(const char *profiles, uint32_t fanout, uint32_t prefetch,
                          uint64_t arena_bytes, const char *pipeline)
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

static void embedded_every_sample_once(void **state)
{
    run_epoch_ids(cl_write_profiles("p.jsonl", 48), 1, 4, 0, SYNTH);
    cl_assert_no_leftovers();
}

static void embedded_fanout_joins_microbatches(void **state)
{
    run_epoch_ids(cl_write_profiles("p.jsonl", 48), 2, 3, 0, SYNTH);
    run_epoch_ids(cl_write_profiles("p.jsonl", 48), 4, 2, 0, SYNTH);
    cl_assert_no_leftovers();
}

/* The fetcher joins a batch's parts as the last one arrives and gives their slabs back at
 * once: every batch of an epoch held at the same time (~64 MB of parts) fits a 16 MiB arena
 * with nothing spilled, and no joined tensor lies in the arena. */
static void embedded_fanout_join_gives_slabs_back(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 32);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.1}");
    cfg.fanout = 2;
    cfg.prefetch = 1;
    cfg.arena_bytes = (uint64_t)32 << 20;
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    dh_client_batch_t *held[8] = {0};
    size_t n = 0, bytes = 0;
    while (n < 8 && (rc = dh_client_next(c, &held[n])) == 0) {
        check_synthetic(held[n]);
        for (size_t t = 0; t < held[n]->n_tensors; t++) {
            const void *base = NULL;
            size_t size = 0;
            assert_int_equal(dh_client_tensor_arena(held[n], t, &base, &size), 0);
            bytes += held[n]->tensors[t].nbytes;
        }
        n++;
    }
    assert_int_equal(n, 8);
    assert_true(bytes > (size_t)40 << 20); /* more than the arena holds */
    dh_client_batch_t *none = NULL;
    assert_int_equal(dh_client_next(c, &none), DH_EEOF);
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    assert_int_equal(st.copied_tensors, 0); /* no part was spilled for want of slabs */
    for (size_t i = 0; i < n; i++)
        dh_client_batch_release(&held[i]);
    dh_client_destroy(&c);
    cl_assert_no_leftovers();
}

/* The emulated join copy: with fanout 2 the fetcher joins a batch's parts, counts the bytes
 * it copied (copy_bytes: the joined tensors' bytes, knob or not) and, with
 * emulate_copy_s_per_B, spends that many seconds per byte before the batch is ready: next()
 * returns no earlier than the charge after the client began. */
static void embedded_join_copy_is_charged_and_counted(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    const double s_per_B = 2e-6; /* a batch of ~200 KB of payload: ~0.4 s */
    for (int charged = 0; charged < 2; charged++) {
        dh_client_config_t cfg;
        base_config(&cfg, profiles, SYNTH);
        cfg.fanout = 2;
        cfg.prefetch = 1;
        cfg.max_steps = 1;
        cfg.emulate_copy_s_per_B = charged ? s_per_B : 0;
        uint64_t t0 = dh_clock_now_ns();
        dh_client_t *c = NULL;
        int rc = dh_client_new(&c, &cfg);
        if (rc)
            print_error("%s\n", dh_last_error());
        assert_int_equal(rc, 0);
        dh_client_batch_t *b = NULL;
        assert_int_equal(dh_client_next(c, &b), 0);
        double took = dh_clock_elapsed_s(t0, dh_clock_now_ns());
        check_synthetic(b);
        uint64_t bytes = 0;
        for (size_t t = 0; t < b->n_tensors; t++)
            bytes += b->tensors[t].nbytes;
        dh_client_stats_t st;
        dh_client_stats(c, &st);
        assert_true(bytes > 0);
        assert_int_equal(st.copy_bytes, bytes); /* one batch, joined once */
        if (charged) {
            if (!(took >= (double)bytes * s_per_B))
                print_error("next() returned %.4f s after the start; the copy of %llu bytes "
                            "is charged %.4f s\n",
                            took, (unsigned long long)bytes, (double)bytes * s_per_B);
            assert_true(took >= (double)bytes * s_per_B);
        }
        dh_client_batch_release(&b);
        dh_client_destroy(&c);
    }
    cl_assert_no_leftovers();
}

/* Adaptive prefetch: a consumer faster than its DataServer waits at next(); each wait past
 * the first horizon doubles the horizon, up to prefetch_max, and the epoch is still
 * delivered in order, exactly once. With prefetch_max 0 the horizon stays put. */
static uint64_t horizon_after_epoch(const char *profiles, uint32_t prefetch_max)
{
    dh_client_config_t cfg;
    base_config(&cfg, profiles,
                "{\"type\":\"synthetic\",\"cost\":\"sleep\",\"cpu_scale\":0.01,"
                "\"bytes_scale\":0.002}");
    cfg.prefetch = 1;
    cfg.prefetch_max = prefetch_max;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    uint64_t index = 0;
    int rc;
    while ((rc = dh_client_next(c, &b)) == 0) {
        assert_int_equal(b->index, index++);
        check_synthetic(b);
        dh_client_batch_release(&b);
        cl_nap_ms(1); /* the compute window */
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(index, 16);
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    assert_int_equal(st.samples, 64);
    assert_int_equal(st.duplicates_dropped, 0);
    dh_client_destroy(&c);
    return st.prefetch_now;
}

static void adaptive_prefetch_deepens_when_next_waits(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    assert_int_equal(horizon_after_epoch(profiles, 8), 8);
    assert_int_equal(horizon_after_epoch(profiles, 0), 1);
    cl_assert_no_leftovers();
}

/* Prefetch in bytes: a client asked to prefetch 16 batches from an arena that holds a few
 * of them never has more bytes requested and not yet returned (with the batch it holds)
 * than its share of the arena, and still gets every batch in order; its share is the
 * arena's capacity / local_ranks, less the margin. */
static void prefetch_keeps_to_its_share_of_the_arena(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    for (uint32_t local = 1; local <= 2; local++) {
        dh_client_config_t cfg;
        base_config(&cfg, profiles,
                    "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.05}");
        cfg.prefetch = 16;
        cfg.arena_bytes = ((uint64_t)24 << 20) * local; /* the same share for each */
        cfg.local_ranks = local;
        dh_client_t *c = NULL;
        int rc = dh_client_new(&c, &cfg);
        if (rc)
            print_error("%s\n", dh_last_error());
        assert_int_equal(rc, 0);
        dh_client_batch_t *b = NULL;
        uint64_t index = 0;
        double epoch_bytes = 0;
        while ((rc = dh_client_next(c, &b)) == 0) {
            assert_int_equal(b->index, index++);
            check_synthetic(b);
            for (size_t t = 0; t < b->n_tensors; t++)
                epoch_bytes += (double)b->tensors[t].nbytes;
            cl_nap_ms(2); /* the compute window: the prefetch runs ahead meanwhile */
            dh_client_batch_release(&b);
        }
        assert_int_equal(rc, DH_EEOF);
        assert_int_equal(index, 16);
        dh_client_stats_t st;
        dh_client_stats(c, &st);
        double share = (double)(cfg.arena_bytes / local) * (1 - DH_DEADLINE_ARENA_MARGIN);
        assert_true(st.byte_budget <= share && st.byte_budget > 0.9 * share);
        assert_true(epoch_bytes > 2 * st.byte_budget); /* 16 batches ahead would not fit */
        assert_true(st.bytes_outstanding_peak > 0);
        assert_true(st.bytes_outstanding_peak <= st.byte_budget);
        dh_client_destroy(&c);
    }
    cl_assert_no_leftovers();
}

/* Embedded mode sizes its arena from the data: the horizon (prefetch x batch x the largest
 * sample), bounded by the budget; a budget that cannot hold one batch fails, naming the
 * numbers and the option. */
static void embedded_arena_sized_from_data_within_budget(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    size_t n = 0;
    dh_profile_set_t *set = load_rows(profiles, &n);
    int64_t largest = 0;
    for (size_t i = 0; i < n; i++)
        if (dh_profile_set_row(set, i)->out_bytes > largest)
            largest = dh_profile_set_row(set, i)->out_bytes;
    dh_profile_set_destroy(&set);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    cfg.prefetch = 2;
    cfg.arena_budget_bytes = (uint64_t)8 << 30;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    double need = 2.0 * 4 * (double)largest; /* prefetch x batch x largest, the margin back */
    assert_true(st.byte_budget >= 0.99 * need && st.byte_budget < need + (8 << 20));
    dh_client_destroy(&c);

    cfg.arena_budget_bytes = (uint64_t)64 << 20; /* less than 4 x largest (~37 MiB) */
    assert_int_equal(dh_client_new(&c, &cfg), DH_ERANGE);
    assert_null(c);
    assert_non_null(strstr(dh_last_error(), "cannot hold one step"));
    assert_non_null(strstr(dh_last_error(), "batch 4"));
    assert_non_null(strstr(dh_last_error(), "--arena-budget"));
    cl_assert_no_leftovers();
}

static void embedded_full_arena_is_backpressure(void **state)
{
    /* ~0.5-4 MB per sample with 8 batches of prefetch in a 16 MiB arena: workers wait for
     * slabs that next() releases, and every batch still comes in order. */
    run_epoch_ids(cl_write_profiles("p.jsonl", 32), 1, 8, (uint64_t)16 << 20,
                  "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.1}");
    cl_assert_no_leftovers();
}

/* An embedded client whose arena cannot be had fails in dh_client_new, before its epoch,
 * naming the arena's size and the limit (docs/shared-memory.md §2a). */
static void embedded_arena_that_cannot_be_had_fails_at_start(void **state)
{
    (void)state;
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    cfg.arena_bytes = (uint64_t)1 << 49; /* 512 TiB */
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc != DH_ENOMEM || !strstr(dh_last_error(), "562949953421312 bytes"))
        print_error("dh_client_new: %s (%s)\n", dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, DH_ENOMEM);
    assert_null(c);
    assert_non_null(strstr(dh_last_error(), "562949953421312 bytes"));
    assert_non_null(strstr(dh_last_error(), "exceed"));
    cl_assert_no_leftovers();
}

static void embedded_zero_copy_and_batch_outlives_client(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    assert_int_equal(dh_client_next(c, &b), 0);
    /* the payload lies in the arena mapping (a memfd), not on the heap */
    const dh_tensor_t *payload = tensor(b, "payload");
    assert_non_null(payload);
    char line[512];
    int in_arena = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    assert_non_null(maps);
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)payload->data >= lo &&
            (unsigned long)payload->data < hi && strstr(line, "memfd:datahelix-arena"))
            in_arena = 1;
    }
    fclose(maps);
    assert_int_equal(in_arena, 1);
    dh_client_destroy(&c);
    check_synthetic(b); /* still mapped: the batch holds the arena */
    dh_client_batch_release(&b);
    assert_null(b);
    cl_assert_no_leftovers();
}

/* Packing (DH_SHARE_TOKEN_PACKED): over an epoch every row goes to exactly one rank, every rank
 * gets at least `fanout` rows a step, and the largest rank's tokens summed over steps are below
 * sample-count batching's and fixed-batch planning's. */
static long long packed_epoch(const char *profiles, dh_share_mode_t token_plan, uint32_t fanout,
                              uint32_t plan_window)
{
    size_t n = 0;
    dh_profile_set_t *set = load_rows(profiles, &n);
    int *seen = calloc(n, sizeof *seen);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    cfg.ranks = 4;
    cfg.fanout = fanout;
    cfg.token_plan = token_plan;
    cfg.plan_window = plan_window;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    uint32_t rows[64];
    long long max_sum = 0;
    for (uint64_t step = 0; step < n / 16; step++) {
        long long mx = 0;
        for (uint32_t r = 0; r < 4; r++) {
            int k = dh_client_plan_rank_step(c, step, r, rows, 64);
            assert_true(k >= (int)fanout);
            if (token_plan != DH_SHARE_TOKEN_PACKED)
                assert_int_equal(k, 4);
            long long tokens = 0;
            for (int i = 0; i < k; i++) {
                seen[rows[i]]++;
                tokens += dh_profile_set_row(set, rows[i])->tokens_est;
            }
            if (tokens > mx)
                mx = tokens;
        }
        max_sum += mx;
    }
    for (size_t k = 0; k < n; k++)
        assert_int_equal(seen[k], 1);
    free(seen);
    dh_client_destroy(&c);
    dh_profile_set_destroy(&set);
    cl_assert_no_leftovers();
    return max_sum;
}

static void packing_plans_every_row_once_and_balances_tokens(void **state)
{
    const char *profiles = cl_write_profiles("packing.jsonl", 256);
    long long none = packed_epoch(profiles, DH_SHARE_SAMPLE_COUNT, 1, 1);
    long long fixed = packed_epoch(profiles, DH_SHARE_TOKEN_BALANCED, 1, 1);
    long long packed = packed_epoch(profiles, DH_SHARE_TOKEN_PACKED, 2, 1);
    assert_true(fixed < none);
    assert_true(packed < fixed);
}

/* Tier 1 across steps (plan_window): over an epoch every row still goes to exactly one rank
 * at one step (16 steps in windows of 5: the last window is one step), every rank gets at
 * least `fanout` rows a step, and the largest rank's tokens summed over the steps fall below
 * the same mode's step-by-step plans. */
static void plan_window_plans_every_row_once_and_balances_across_steps(void **state)
{
    const char *profiles = cl_write_profiles("window.jsonl", 256);
    long long fixed = packed_epoch(profiles, DH_SHARE_TOKEN_BALANCED, 1, 1);
    long long fixed_w = packed_epoch(profiles, DH_SHARE_TOKEN_BALANCED, 1, 5);
    long long packed = packed_epoch(profiles, DH_SHARE_TOKEN_PACKED, 2, 1);
    long long packed_w = packed_epoch(profiles, DH_SHARE_TOKEN_PACKED, 2, 5);
    print_message("largest rank's tokens over the epoch: fixed %lld, across steps %lld; packed "
                  "%lld, across steps %lld\n",
                  fixed, fixed_w, packed, packed_w);
    assert_true(fixed_w < fixed);
    assert_true(packed_w < packed);
}

/* Site 3 (faults build; skipped otherwise): the coordinator cannot book a request (out of
 * memory; DH_FAULT_COORD_BOOK) at each request of an epoch (4 batches) in turn. It is failed
 * back to the client, whose next() returns DH_ENOMEM naming the request instead of waiting
 * for its batch; nothing is left
 * allocated or open after the client (and its embedded cluster) is gone. The complete run
 * delivers the whole epoch. */
static const char *book_profiles;

static int epoch_with_a_refused_request(void *arg)
{
    (void)arg;
    dh_client_config_t cfg;
    base_config(&cfg, book_profiles, SYNTH);
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    int rc, got = 0;
    while ((rc = dh_client_next(c, &b)) == 0) {
        got++;
        dh_client_batch_release(&b);
    }
    if (rc == DH_EEOF) {
        assert_int_equal(got, 4);
        rc = 0;
    } else {
        assert_int_equal(rc, DH_ENOMEM);
        assert_null(b);
        /* (the batch next() waits for when the refusal comes: a refused request fails the
         * run, whichever batch it was for; the message names the request) */
        assert_non_null(strstr(dh_last_error(), " will not come: "));
        assert_non_null(strstr(dh_last_error(), "request "));
        assert_non_null(strstr(dh_last_error(), "out of memory"));
    }
    dh_client_destroy(&c);
    cl_assert_no_leftovers();
    return rc;
}

static void coordinator_refused_request_fails_next(void **state)
{
    if (!dh_fault_enabled())
        skip();
    book_profiles = cl_write_profiles("refused.jsonl", 16);
    assert_true(dh_test_each_fault(DH_FAULT_COORD_BOOK,
                                   "will not come: ", epoch_with_a_refused_request, NULL) >= 4);
}

/* A step that cannot be planned (here: an algorithm the planner does not know) fails next()
 * naming the batch and the planner's error, instead of the sender planning it again for
 * ever while next() waits. */
static void a_plan_that_cannot_be_made_fails_next(void **state)
{
    const char *profiles = cl_write_profiles("unplannable.jsonl", 16);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    cfg.plan_algo = (dh_plan_algo_t)99;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    uint64_t t0 = dh_clock_now_ns();
    assert_int_equal(dh_client_next(c, &b), DH_EINVAL);
    assert_true(dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 30); /* not the 60 s timeout */
    assert_null(b);
    assert_non_null(strstr(dh_last_error(), "batch 0 (global step 0) cannot be planned"));
    assert_non_null(strstr(dh_last_error(), "unknown algorithm 99"));
    dh_client_destroy(&c);
    cl_assert_no_leftovers();
}

static void client_config_errors_name_the_field(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    dh_client_config_t cfg;
    dh_client_t *c = NULL;
    base_config(&cfg, profiles, SYNTH);
    cfg.rank = 2;
    cfg.ranks = 2;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "rank 2"));
    base_config(&cfg, profiles, SYNTH);
    cfg.fanout = 5;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "fanout"));
    base_config(&cfg, profiles, SYNTH);
    cfg.prefetch = 8;
    cfg.prefetch_max = 4;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "prefetch_max"));
    base_config(&cfg, profiles, SYNTH);
    cfg.emulate_copy_s_per_B = -1;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "emulate_copy_s_per_B"));
    base_config(&cfg, profiles, SYNTH);
    cfg.batch = 17;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "fewer than one step"));
    base_config(&cfg, dh_test_path("missing.jsonl"), SYNTH);
    assert_true(dh_client_new(&c, &cfg) < 0);
    assert_non_null(strstr(dh_last_error(), "missing.jsonl"));
    base_config(&cfg, profiles, "{\"type\":\"synthetic\",\"cost\":\"burn\"}");
    assert_int_equal(dh_client_new(&c, &cfg), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "cost"));
    base_config(&cfg, profiles, SYNTH);
    cfg.coordinator = "tcp://127.0.0.1:1"; /* nobody there */
    cfg.connect_timeout_ms = 300;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EAGAIN);
    assert_non_null(strstr(dh_last_error(), "tcp://127.0.0.1:1"));
    assert_null(c);
    cl_assert_no_leftovers();
}

/* An in-process coordinator on `ep`, started (ctx: shared ZeroMQ context or NULL). */
static dh_coordinator_t *start_coordinator(const char *ep, uint32_t dead_after_ms, void *ctx)
{
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = ep;
    if (dead_after_ms)
        cc.dead_after_ms = dead_after_ms;
    cc.zmq_ctx = ctx;
    dh_coordinator_t *coord = NULL;
    assert_int_equal(dh_coordinator_new(&coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(coord), 0);
    return coord;
}

/* An in-process local DataServer of node "test-node", started. */
static dh_dataserver_t *start_local_server(const char *coord_ep, const char *data_ep,
                                           const char *name, uint32_t workers, const char *pipeline)
{
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = coord_ep;
    dc.node = "test-node";
    dc.name = name;
    dc.workers = workers;
    dc.pipeline_json = pipeline;
    dc.arena_bytes = 16u << 20;
    dc.data_listen = data_ep;
    dc.heartbeat_ms = 50;
    dh_dataserver_t *ds = NULL;
    assert_int_equal(dh_dataserver_new(&ds, &dc), 0);
    assert_int_equal(dh_dataserver_start(ds), 0);
    return ds;
}

/* Waits until the coordinator counts `alive` live DataServers. */
static void wait_servers_alive(dh_coordinator_t *coord, uint64_t alive)
{
    dh_coordinator_stats_t cs;
    for (int i = 0; i < 2000; i++) {
        dh_coordinator_stats(coord, &cs);
        if (cs.servers_alive == alive)
            break;
        cl_nap_ms(5);
    }
    assert_int_equal(cs.servers_alive, alive);
}

static void *destroy_main(void *arg)
{
    dh_client_destroy((dh_client_t **)arg);
    return NULL;
}

/* The coordinator names a local DataServer that is gone (listed until it misses its
 * heartbeats): the client asks again until it is given the live one, and every socket of
 * the asks that failed is closed, so dh_client_destroy returns (a socket left open made
 * zmq_ctx_term wait forever: a rank that had finished hung at exit in fresh-clone CI). */
static void client_asks_again_when_named_server_is_gone(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    char coord_ep[600], data_ep[600], ghost_shm[64];
    snprintf(coord_ep, sizeof coord_ep, "ipc://%s", dh_test_path("coord.ipc"));
    snprintf(data_ep, sizeof data_ep, "ipc://%s", dh_test_path("data.ipc"));
    snprintf(ghost_shm, sizeof ghost_shm, "datahelix-test-ghost-%d", (int)getpid());
    void *ctx = zmq_ctx_new();
    assert_non_null(ctx);
    dh_coordinator_t *coord = start_coordinator(coord_ep, 600, ctx);
    /* the ghost: registers as the node's local DataServer once, then is silent; nobody
     * listens on its fd-passing socket, so connecting to it is refused */
    dh_wire_socket_t *ghost = NULL;
    assert_int_equal(dh_wire_socket_new(&ghost, ctx, ZMQ_DEALER, NULL), 0);
    assert_int_equal(
        zmq_setsockopt(dh_wire_socket_handle(ghost), ZMQ_ROUTING_ID, "ghost", strlen("ghost")), 0);
    assert_int_equal(dh_wire_socket_connect(ghost, coord_ep), 0);
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = DH_WIRE_ROLE_LOCAL;
    m.hello.node = "test-node";
    m.hello.name = "ghost";
    m.hello.workers = 1;
    m.hello.endpoint = "ipc:///nonexistent/ghost";
    m.hello.shm_socket = ghost_shm;
    m.hello.pid = (uint32_t)getpid();
    assert_int_equal(dh_wire_send(ghost, NULL, 0, &m, NULL, 0, 1000), 0);
    wait_servers_alive(coord, 1);
    /* the live one registers second, so the ghost is named first */
    dh_dataserver_t *ds = start_local_server(coord_ep, data_ep, "live", 1, SYNTH);
    /* both registered: the live one alive, the ghost alive or (a slow start on a loaded
     * machine outlasting its 600 ms of silence) already declared dead */
    dh_coordinator_stats_t cs;
    for (int i = 0; i < 2000; i++) {
        dh_coordinator_stats(coord, &cs);
        if (cs.servers_alive + cs.servers_dead_declared >= 2 && cs.servers_alive >= 1)
            break;
        cl_nap_ms(5);
    }
    assert_true(cs.servers_alive + cs.servers_dead_declared >= 2 && cs.servers_alive >= 1);

    dh_client_config_t cfg;
    base_config(&cfg, profiles, NULL);
    cfg.coordinator = coord_ep;
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    dh_coordinator_stats(coord, &cs);
    assert_true(cs.servers_dead_declared >= 1); /* it waited out the ghost */
    dh_client_batch_t *b = NULL;
    uint64_t batches = 0;
    while ((rc = dh_client_next(c, &b)) == 0) {
        assert_string_equal(b->server, "live");
        check_synthetic(b);
        dh_client_batch_release(&b);
        batches++;
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(batches, 4);
    /* destroy on a thread, so that a hang is a failure with a reason, not a time-out */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, destroy_main, &c), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    int e = pthread_timedjoin_np(t, NULL, &until);
    if (e)
        print_error("dh_client_destroy did not return within 20 s (a ZeroMQ socket of a failed "
                    "ask left open keeps zmq_ctx_term waiting)\n");
    assert_int_equal(e, 0);
    dh_dataserver_destroy(&ds);
    dh_wire_socket_destroy(&ghost);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
    cl_assert_no_leftovers();
}

/* With a key directory, the coordinator, a local DataServer and a sidecar sharing one ZeroMQ
 * context (one ZAP handler, counted) and a client in its own: every tcp:// socket speaks
 * CURVE, the sidecar's batches are forwarded over it, and the epoch arrives whole. Under TSan
 * (make test-tsan) this covers the ZAP thread and the handler registry. */
static void cluster_over_curve_delivers_the_epoch(void **state)
{
    (void)state;
    const char *profiles = cl_write_profiles("p.jsonl", 32);
    char keys[600], prefix[700];
    snprintf(keys, sizeof keys, "%s", dh_test_path("keys"));
    assert_int_equal(mkdir(keys, 0700), 0);
    snprintf(prefix, sizeof prefix, "%s/server", keys);
    assert_int_equal(dh_wire_keygen(prefix, NULL), 0);
    snprintf(prefix, sizeof prefix, "%s/rank", keys);
    assert_int_equal(dh_wire_keygen(prefix, NULL), 0);
    void *ctx = zmq_ctx_new();
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = "tcp://127.0.0.1:*";
    cc.zmq_ctx = ctx;
    cc.keys_dir = keys;
    dh_coordinator_t *coord = NULL;
    assert_int_equal(dh_coordinator_new(&coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(coord), 0);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = dh_coordinator_endpoint(coord);
    dc.node = "test-node";
    dc.name = "local";
    dc.workers = 0; /* delivery only: every batch crosses tcp from the sidecar */
    dc.pipeline_json = SYNTH;
    dc.arena_bytes = 16u << 20;
    dc.heartbeat_ms = 50;
    dc.zmq_ctx = ctx;
    dc.keys_dir = keys;
    dh_dataserver_t *local = NULL, *sidecar = NULL;
    assert_int_equal(dh_dataserver_new(&local, &dc), 0);
    assert_int_equal(dh_dataserver_start(local), 0);
    dc.role = DH_DS_REMOTE;
    dc.node = "spare";
    dc.name = "sidecar";
    dc.workers = 2;
    assert_int_equal(dh_dataserver_new(&sidecar, &dc), 0);
    assert_int_equal(dh_dataserver_start(sidecar), 0);
    wait_servers_alive(coord, 2);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, NULL);
    cfg.coordinator = dh_coordinator_endpoint(coord);
    cfg.keys_dir = keys;
    cfg.key_name = "rank";
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    dh_client_batch_t *b = NULL;
    uint64_t batches = 0;
    while ((rc = dh_client_next(c, &b)) == 0) {
        assert_string_equal(b->server, "sidecar");
        check_synthetic(b);
        dh_client_batch_release(&b);
        batches++;
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(batches, 8);
    dh_client_destroy(&c);
    dh_dataserver_destroy(&sidecar);
    dh_dataserver_destroy(&local);
    dh_coordinator_destroy(&coord);
    assert_int_equal(zmq_ctx_term(ctx), 0);
    cl_assert_no_leftovers();
}

/* A client that leaves with requests in flight (it prefetched past what it consumed): the
 * DataServer drops those batches at once, counts them, and says so only at debug level (it
 * used to hold them 5 s and then warn "dropped batch ... Host unreachable" for each). */
static void dataserver_drops_a_departed_clients_batches_quietly(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    char coord_ep[600], data_ep[600], log_path[600];
    snprintf(coord_ep, sizeof coord_ep, "ipc://%s", dh_test_path("coord.ipc"));
    snprintf(data_ep, sizeof data_ep, "ipc://%s", dh_test_path("data.ipc"));
    snprintf(log_path, sizeof log_path, "%s", dh_test_path("stderr.log"));
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *log = fopen(log_path, "w");
    assert_non_null(log);
    dup2(fileno(log), STDERR_FILENO);
    dh_coordinator_t *coord = start_coordinator(coord_ep, 0, NULL);
    /* 1-20 ms a sample: still executing when the client goes */
    dh_dataserver_t *ds = start_local_server(
        coord_ep, data_ep, "local", 2,
        "{\"type\":\"synthetic\",\"cost\":\"sleep\",\"cpu_scale\":0.02,\"bytes_scale\":0.002}");
    dh_client_config_t cfg;
    base_config(&cfg, profiles, NULL);
    cfg.coordinator = coord_ep;
    cfg.prefetch = 8;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    assert_int_equal(dh_client_next(c, &b), 0);
    /* The prefetch opens once a delivered batch shows its bytes (prefetch in bytes): go
     * when more batches are in flight. */
    dh_client_stats_t cs = {0};
    for (uint64_t t0 = dh_clock_now_ns(); dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 10;) {
        dh_client_stats(c, &cs);
        if (cs.requests_sent >= 3)
            break;
        cl_nap_ms(1);
    }
    assert_true(cs.requests_sent >= 3);
    dh_client_batch_release(&b);
    dh_client_destroy(&c);
    uint64_t gone = dh_clock_now_ns();
    dh_dataserver_stats_t st = {0};
    while (dh_clock_elapsed_s(gone, dh_clock_now_ns()) < 10) {
        dh_dataserver_stats(ds, &st);
        if (st.undeliverable > 0)
            break;
        cl_nap_ms(5);
    }
    double after_s = dh_clock_elapsed_s(gone, dh_clock_now_ns());
    dh_dataserver_destroy(&ds);
    dh_coordinator_destroy(&coord);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    fclose(log);
    char *text = cl_read(log_path);
    if (st.undeliverable == 0 || after_s > 4 || strstr(text, "dropped batch")) {
        print_error("undeliverable %llu after %.2f s; log:\n", (unsigned long long)st.undeliverable,
                    after_s);
        cl_print_log(text);
    }
    assert_true(st.undeliverable > 0);
    assert_true(after_s < 4); /* not held for the 5 s grace of a client not yet connected */
    assert_null(strstr(text, "dropped batch"));
    free(text);
    cl_assert_no_leftovers();
}

static void run_cli(const char *name, char *const argv[])
{
    cl_proc_t p;
    cl_spawn(&p, name, argv);
    cl_expect_exit(&p, 0, 240000);
}

/* Real decode in embedded mode: 4 clips synthesised and probed, one then truncated. With
 * skip it yields its batch with that sample flagged (error naming the path); with raise
 * next() fails with that message and the next batch still comes. */
static void embedded_video_with_corrupt_clip(void **state)
{
    char dir[512], manifest[600], profiles[600], cache[600];
    snprintf(dir, sizeof dir, "%s", dh_test_path("video"));
    snprintf(manifest, sizeof manifest, "%s/manifest.jsonl", dir);
    snprintf(profiles, sizeof profiles, "%s/profiles.jsonl", dir);
    snprintf(cache, sizeof cache, "%s/calibration.json", dir);
    char *synth[] = {"datahelix", "synth", "--out",  dir, "--mix", "kinetics-s",
                     "--count",   "4",     "--seed", "2", NULL};
    run_cli("synth", synth);
    setenv("DH_CALIBRATION_CACHE", cache, 1);
    char *probe[] = {"datahelix", "probe", manifest, "-o", profiles, NULL};
    run_cli("probe", probe);
    /* truncate the clip of the first profile row */
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, profiles), 0);
    assert_int_equal(dh_profile_set_count(set), 4);
    char broken[1024];
    snprintf(broken, sizeof broken, "%s", dh_profile_set_row(set, 0)->uri);
    dh_profile_set_destroy(&set);
    assert_int_equal(truncate(broken, 2000), 0);

    /* mode 0: skip; 1: raise; 2: skip with batch 2 in two parts, so the corrupt clip's part
     * comes with no tensors and the join keeps its slot as zero rows */
    for (int mode = 0; mode < 3; mode++) {
        dh_client_config_t cfg;
        base_config(&cfg, profiles, NULL); /* the video pipeline's defaults */
        cfg.batch = mode == 2 ? 2 : 1;
        cfg.fanout = mode == 2 ? 2 : 1;
        cfg.on_error = mode == 1 ? DH_ON_ERROR_RAISE : DH_ON_ERROR_SKIP;
        dh_client_t *c = NULL;
        int rc = dh_client_new(&c, &cfg);
        if (rc)
            print_error("%s\n", dh_last_error());
        assert_int_equal(rc, 0);
        int ok = 0, failed = 0;
        dh_client_batch_t *b = NULL;
        while ((rc = dh_client_next(c, &b)) != DH_EEOF) {
            if (rc) {
                assert_int_equal(mode, 1);
                assert_non_null(strstr(dh_last_error(), broken));
                failed++;
                continue;
            }
            if (b->failed && mode == 2) {
                size_t bad = b->samples[0].error ? 0 : 1;
                assert_int_equal(b->failed, 1);
                assert_non_null(strstr(b->samples[bad].error_message, broken));
                const dh_tensor_t *px = tensor(b, "frames"), *mask = tensor(b, "mask");
                assert_non_null(px);
                assert_non_null(mask);
                assert_int_equal(px->shape[0], 2);
                assert_int_equal(mask->shape[0], 2);
                /* the good sample's frames are there, the failed one's slot is zeros */
                const uint8_t *m = mask->data;
                size_t row = (size_t)mask->strides[0], good = 0, zero = 0;
                for (size_t i = 0; i < (size_t)mask->shape[1]; i++) {
                    good += m[(1 - bad) * row + i];
                    zero += m[bad * row + i];
                }
                assert_true(good > 0);
                assert_int_equal(zero, 0);
                failed++;
            } else if (b->failed) {
                assert_int_equal(mode, 0);
                assert_non_null(strstr(b->samples[0].error_message, broken));
                failed++;
            } else {
                const dh_tensor_t *px = tensor(b, "frames");
                assert_non_null(px);
                assert_int_equal(px->dtype, DH_DTYPE_UINT8);
                assert_int_equal(px->ndim, 5); /* B x T x 3 x H x W */
                assert_int_equal(px->shape[0], mode == 2 ? 2 : 1);
                assert_int_equal(px->shape[2], 3);
                assert_true(b->tokens > 0);
                ok++;
            }
            dh_client_batch_release(&b);
        }
        assert_int_equal(ok, mode == 2 ? 1 : 3);
        assert_int_equal(failed, 1);
        dh_client_destroy(&c);
    }
    unsetenv("DH_CALIBRATION_CACHE");
    cl_assert_no_leftovers();
}

/* ---- allocation failure ---------------------------------------------------------------- */

static const char *alloc_profiles;

/* An embedded client (its coordinator and DataServer threads of this process) started, one
 * batch taken, everything ended. */
static int start_one_batch_end(void *ctx)
{
    (void)ctx;
    dh_client_config_t cfg;
    base_config(&cfg, alloc_profiles, SYNTH);
    cfg.max_steps = 1;
    cfg.workers = 1;
    cfg.prefetch = 1;
    cfg.next_timeout_ms = 2000;
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        return rc;
    dh_client_batch_t *b = NULL;
    rc = dh_client_next(c, &b);
    if (rc == 0) {
        check_synthetic(b);
        dh_client_batch_release(&b);
    }
    dh_client_destroy(&c);
    return rc;
}

/* The client, its coordinator and its DataServer under allocation failure (a faults build
 * only: a few hundred runs): allocation n of a run fails, for n = 0, 1, ... until a run
 * makes no more than n (the threads' allocations count too, so which one fails is the
 * run's interleaving). Every run ends with the batch, or with DH_ENOMEM saying "out of
 * memory" (start-up, or next() told by the coordinator that it dropped the request it could
 * not read); nothing is left allocated or open, nothing crashes, and no batch is lost: a
 * DISPATCH the DataServer could not take (unreadable, or no memory for its task) is told to
 * the coordinator, which places the request again, so the run serves its batch instead of
 * next() waiting out next_timeout_ms (DH_EAGAIN "not ready within", which fails the test;
 * docs/testing.md, "Fault injection"). */
static void embedded_client_survives_each_allocation_failure(void **state)
{
    if (!dh_fault_enabled())
        skip();
    alloc_profiles = cl_write_profiles("alloc.jsonl", 4);
    long lost = 0, failed = 0, n = 0;
    for (;; n++) {
        long live = dh_alloc_live(), fds = dh_test_open_fds();
        dh_alloc_reset_count();
        dh_alloc_fail_after(n);
        int rc = start_one_batch_end(NULL);
        long made = dh_alloc_count();
        dh_alloc_fail_after(-1);
        if (dh_alloc_live() != live || dh_test_open_fds() != fds)
            print_error("allocation %ld failing: %ld allocations, %ld fds leaked\n", n,
                        dh_alloc_live() - live, dh_test_open_fds() - fds);
        assert_int_equal(dh_alloc_live(), live);
        assert_int_equal(dh_test_open_fds(), fds);
        if (rc == DH_EAGAIN && strstr(dh_last_error(), "batch 0 not ready within")) {
            print_message("allocation %ld: lost: %s\n", n, dh_last_error());
            lost++;
        } else if (rc) {
            if (rc != DH_ENOMEM || !strstr(dh_last_error(), "out of memory"))
                print_error("allocation %ld failing: %s (%s)\n", n, dh_err_name(rc),
                            dh_last_error());
            assert_int_equal(rc, DH_ENOMEM);
            assert_non_null(strstr(dh_last_error(), "out of memory"));
            failed++;
        }
        if (n >= made) {
            assert_int_equal(rc, 0);
            break;
        }
    }
    print_message("%ld runs: %ld failed with DH_ENOMEM, %ld lost their batch\n", n + 1, failed,
                  lost);
    assert_int_equal(lost, 0); /* (before the DataServer told its drops: 33 of 224 runs) */
    cl_assert_no_leftovers();
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(embedded_client_survives_each_allocation_failure),
        cmocka_unit_test(embedded_epoch_in_order_exactly_once),
        cmocka_unit_test(next_times_out_with_eagain),
        cmocka_unit_test(clients_of_one_process_have_ids_of_their_own),
        cmocka_unit_test(embedded_every_sample_once),
        cmocka_unit_test(embedded_fanout_joins_microbatches),
        cmocka_unit_test(embedded_fanout_join_gives_slabs_back),
        cmocka_unit_test(embedded_join_copy_is_charged_and_counted),
        cmocka_unit_test(adaptive_prefetch_deepens_when_next_waits),
        cmocka_unit_test(embedded_full_arena_is_backpressure),
        cmocka_unit_test(embedded_resume_at_first_step_continues_the_run),
        cmocka_unit_test(embedded_resume_at_first_sample_takes_the_windows_from_there),
        cmocka_unit_test(prefetch_keeps_to_its_share_of_the_arena),
        cmocka_unit_test(embedded_arena_sized_from_data_within_budget),
        cmocka_unit_test(embedded_zero_copy_and_batch_outlives_client),
        cmocka_unit_test(embedded_arena_that_cannot_be_had_fails_at_start),
        cmocka_unit_test(packing_plans_every_row_once_and_balances_tokens),
        cmocka_unit_test(plan_window_plans_every_row_once_and_balances_across_steps),
        cmocka_unit_test(coordinator_refused_request_fails_next),
        cmocka_unit_test(a_plan_that_cannot_be_made_fails_next),
        cmocka_unit_test(client_config_errors_name_the_field),
        cmocka_unit_test(client_asks_again_when_named_server_is_gone),
        cmocka_unit_test(dataserver_drops_a_departed_clients_batches_quietly),
        cmocka_unit_test(cluster_over_curve_delivers_the_epoch),
        cmocka_unit_test(embedded_video_with_corrupt_clip),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
