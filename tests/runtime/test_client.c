/* test_client.c: the client with its coordinator and local DataServer as threads of this
 * process (embedded mode, client.h), so that the sanitizers (ASan+UBSan, and TSan in `make
 * test-tsan`) see every thread of the client and the DataServer: delivery in order,
 * exactly once, microbatch fanout joined, packing, a request or a plan that fails next(),
 * real video with a corrupt clip, allocation failure, and configuration errors. Resume, the
 * arena and prefetch, and daemons started apart are test_client_resume.c,
 * test_client_arena.c and test_client_cluster.c (helpers: client_test.h). */
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
        cmocka_unit_test(packing_plans_every_row_once_and_balances_tokens),
        cmocka_unit_test(plan_window_plans_every_row_once_and_balances_across_steps),
        cmocka_unit_test(coordinator_refused_request_fails_next),
        cmocka_unit_test(a_plan_that_cannot_be_made_fails_next),
        cmocka_unit_test(client_config_errors_name_the_field),
        cmocka_unit_test(embedded_video_with_corrupt_clip),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
