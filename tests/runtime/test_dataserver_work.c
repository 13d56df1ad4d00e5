/* Tests of the DataServer's workers (src/runtime/dataserver_work.c): sample_timeout on the
 * native (video) pipeline. A sample whose path is a FIFO nobody writes blocks its worker
 * thread in open(2), in the kernel, where no timeout reaches: past sample_timeout the sample
 * fails naming itself, the operation and the time, every other sample arrives, a new thread
 * takes the stuck one's slot, and the stuck thread, once the test opens the FIFO for writing
 * (its open returns), drops what it did and exits without touching the server. A second case
 * stops the server while a thread is stuck: the server does not wait for it. No sleep
 * synchronises anything: the test waits on the client's batches, on the count of abandoned
 * threads (a condition variable), and (second case) polls the server's running count with a
 * deadline. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/runtime.h"
#include "datahelix/synth.h"
#include "runtime/dataserver_internal.h"

#define N_CLIPS 5
#define SPEC "{\"type\":\"video\",\"frames\":4,\"height\":48,\"width\":64,\"sample_timeout\":%s}"

typedef struct cluster {
    char coord_ep[600], data_ep[600], profiles[512], fifo[512], spec[256];
    dh_coordinator_t *coord;
    dh_dataserver_t *ds;
} cluster_t;

/* N_CLIPS small clips and one FIFO ("stuck", third in the list), as a profile file; only the
 * FIFO when fifo_only. */
static void make_data(cluster_t *c, const char *timeout, bool fifo_only)
{
    snprintf(c->profiles, sizeof c->profiles, "%s", dh_test_path("p.jsonl"));
    snprintf(c->fifo, sizeof c->fifo, "%s", dh_test_path("stuck.mp4"));
    unlink(c->fifo);
    assert_int_equal(mkfifo(c->fifo, 0600), 0);
    FILE *f = fopen(c->profiles, "w");
    assert_non_null(f);
    for (int i = 0; i <= N_CLIPS; i++) {
        char path[512], id[32];
        if (fifo_only && i != 2)
            continue;
        if (i == 2) {
            snprintf(path, sizeof path, "%s", c->fifo);
            snprintf(id, sizeof id, "stuck");
        } else {
            char name[32];
            snprintf(name, sizeof name, "clip-%d.mp4", i);
            snprintf(path, sizeof path, "%s", dh_test_path(name));
            snprintf(id, sizeof id, "clip-%d", i);
            dh_synth_clip_t clip = {
                .width = 64, .height = 48, .fps = 8, .duration_s = 1, .seed = (uint64_t)i};
            assert_int_equal(dh_synth_write_clip(path, &clip), 0);
        }
        fprintf(f,
                "{\"id\":\"%s\",\"uri\":\"%s\",\"profile_key\":\"f4x48x64\",\"frames\":4,"
                "\"height\":48,\"width\":64,\"tokens_est\":16,\"cpu_s_est\":0.01,"
                "\"in_bytes\":4096,\"out_bytes\":36864}\n",
                id, path);
    }
    assert_int_equal(fclose(f), 0);
    snprintf(c->spec, sizeof c->spec, SPEC, timeout);
}

static void start(cluster_t *c, uint32_t workers)
{
    snprintf(c->coord_ep, sizeof c->coord_ep, "ipc://%s", dh_test_path("coord.ipc"));
    snprintf(c->data_ep, sizeof c->data_ep, "ipc://%s", dh_test_path("data.ipc"));
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = c->coord_ep;
    assert_int_equal(dh_coordinator_new(&c->coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(c->coord), 0);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = c->coord_ep;
    dc.node = "test-node";
    dc.name = "local";
    dc.workers = workers;
    dc.pipeline_json = c->spec;
    dc.arena_bytes = 16u << 20;
    dc.data_listen = c->data_ep;
    dc.heartbeat_ms = 20;
    assert_int_equal(dh_dataserver_new(&c->ds, &dc), 0);
    assert_int_equal(dh_dataserver_start(c->ds), 0);
}

static dh_client_t *client(cluster_t *c)
{
    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    cfg.coordinator = c->coord_ep;
    cfg.profiles = c->profiles;
    cfg.ranks = 1;
    cfg.batch = 1;
    cfg.seed = 3;
    cfg.node = "test-node";
    cfg.on_error = DH_ON_ERROR_SKIP;
    cfg.next_timeout_ms = 60000;
    cfg.connect_timeout_ms = 10000;
    dh_client_t *cl = NULL;
    int rc = dh_client_new(&cl, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    return cl;
}

static void stop(cluster_t *c)
{
    dh_dataserver_stop(c->ds);
    dh_dataserver_destroy(&c->ds);
    dh_coordinator_stop(c->coord);
    dh_coordinator_destroy(&c->coord);
}

/* Releases a thread blocked opening the FIFO for reading: open it for writing, then close
 * (its read then sees the end). Blocks until that reader is there. */
static void release_fifo(const cluster_t *c)
{
    int fd = open(c->fifo, O_WRONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    close(fd);
}

static void work_stuck_sample_fails_on_time_and_its_slot_comes_back(void **state)
{
    (void)state;
    cluster_t c = {0};
    make_data(&c, "1", false);
    start(&c, 2);
    dh_client_t *cl = client(&c);
    uint64_t t0 = dh_clock_now_ns();
    dh_client_batch_t *b = NULL;
    int rc, batches = 0, good = 0, failed = 0;
    while ((rc = dh_client_next(cl, &b)) == 0) {
        batches++;
        for (size_t i = 0; i < b->n_samples; i++) {
            const dh_client_sample_t *s = &b->samples[i];
            if (!s->error) {
                assert_true(strncmp(s->id, "clip-", 5) == 0);
                good++;
                continue;
            }
            failed++;
            print_message("%s\n", s->error_message);
            assert_string_equal(s->id, "stuck");
            assert_int_equal(s->error, DH_EIO);
            char want[700];
            snprintf(want, sizeof want,
                     "sample 'stuck' (%s): open or read ran past sample_timeout 1 s (no answer "
                     "after 1.",
                     c.fifo);
            assert_non_null(strstr(s->error_message, want));
            assert_non_null(strstr(s->error_message, "worker thread was abandoned"));
        }
        dh_client_batch_release(&b);
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(batches, N_CLIPS + 1);
    assert_int_equal(good, N_CLIPS);
    assert_int_equal(failed, 1);
    assert_true(dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 30);
    /* the slot has a new thread; the stuck one is still blocked, abandoned */
    assert_int_equal(dh__ds_live_workers(c.ds), 2);
    assert_int_equal(dh__ds_abandoned(), 1);
    dh_dataserver_stats_t st;
    dh_dataserver_stats(c.ds, &st);
    assert_int_equal(st.sample_errors, 1);
    dh_client_destroy(&cl);
    /* its open returns: it finds itself abandoned and exits, touching nothing of ours */
    release_fifo(&c);
    assert_int_equal(dh__ds_abandoned_wait(20000), 0);
    assert_int_equal(dh__ds_live_workers(c.ds), 2);
    stop(&c);
    unlink(c.fifo);
}

/* A server stopped while a worker is blocked on the FIFO (sample_timeout far away) does not
 * wait for it: destroy leaves it behind; the test then releases it and waits for it to go. */
static void work_stop_does_not_wait_for_a_stuck_worker(void **state)
{
    (void)state;
    cluster_t c = {0};
    make_data(&c, "600", true);
    start(&c, 1);
    dh_client_t *cl = client(&c);
    /* the only worker takes the only task (the FIFO): wait for that, with a deadline */
    uint64_t since = dh_clock_now_ns();
    for (;;) {
        pthread_mutex_lock(&c.ds->lock);
        uint32_t running = c.ds->running;
        pthread_mutex_unlock(&c.ds->lock);
        if (running == 1)
            break;
        assert_true(dh_clock_elapsed_s(since, dh_clock_now_ns()) < 20);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    uint64_t t0 = dh_clock_now_ns();
    dh_client_destroy(&cl);
    stop(&c); /* within about a second (dataserver.c, STOP_WAIT_NS), not 600 */
    assert_true(dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 20);
    release_fifo(&c);
    assert_int_equal(dh__ds_abandoned_wait(20000), 0);
    unlink(c.fifo);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(work_stuck_sample_fails_on_time_and_its_slot_comes_back),
    cmocka_unit_test(work_stop_does_not_wait_for_a_stuck_worker),
};
DH_TEST_MAIN(tests)
