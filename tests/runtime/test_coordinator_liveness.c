/* Tests of coordinator_liveness.c (docs/runtime.md, "Liveness"): a DataServer whose loop runs
 * in the coordinator's process is never declared dead by timing, even with the CPU saturated
 * by busy loops and a limit below its heartbeat period; another server's limit follows the
 * heartbeat gaps it has shown; and a server that goes silent (as after kill -9) is still
 * declared dead, within the capped limit, even when its HELLO carries this process's pid; and
 * a loop stopped (SIGSTOP) counts that time as its own absence (runtime/awake.h), which the
 * coordinator does not count as any server's silence. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "cluster.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"

#define SYNTH "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}"

/* 4 x the CPUs of busy-loop processes; each dies with this one (and after 60 s at most). */
static size_t saturate(pid_t *pids, size_t cap)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = (size_t)(cpus > 0 ? cpus : 1) * 4;
    n = n < cap ? n : cap;
    for (size_t i = 0; i < n; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            alarm(60);
            for (volatile unsigned long x = 0;; x++)
                ;
        }
    }
    return n;
}

static void unsaturate(pid_t *pids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
    for (size_t i = 0; i < n; i++)
        waitpid(pids[i], NULL, 0);
}

static dh_coordinator_t *start_coordinator(const char *ep, uint32_t dead_after_ms, void *ctx)
{
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = ep;
    cc.dead_after_ms = dead_after_ms;
    cc.zmq_ctx = ctx;
    dh_coordinator_t *coord = NULL;
    assert_int_equal(dh_coordinator_new(&coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(coord), 0);
    return coord;
}

static void wait_stats(dh_coordinator_t *coord, uint64_t alive, uint64_t dead, int timeout_ms,
                       dh_coordinator_stats_t *cs)
{
    uint64_t t0 = dh_clock_now_ns();
    do {
        dh_coordinator_stats(coord, cs);
        if (cs->servers_alive == alive && cs->servers_dead_declared == dead)
            return;
        cl_nap_ms(5);
    } while (dh_clock_elapsed_s(t0, dh_clock_now_ns()) * 1000 < timeout_ms);
    print_error("servers alive %llu (want %llu), declared dead %llu (want %llu)\n",
                (unsigned long long)cs->servers_alive, (unsigned long long)alive,
                (unsigned long long)cs->servers_dead_declared, (unsigned long long)dead);
    fail();
}

/* The embedded layout (coordinator and local DataServer as threads of one process, over
 * inproc://) with a 40 ms limit, below the DataServer's 100 ms heartbeat period, and the CPU
 * saturated: before, the server was declared dead at every period ("silent for 1044 ms
 * (limit 1000 ms)" on a loaded machine) and its requests placed again. Now it is never, and
 * nothing runs twice. */
static void in_process_server_survives_a_saturated_cpu(void **state)
{
    (void)state;
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    char coord_ep[128], data_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://liveness-coord-%s", cl_test_tag());
    snprintf(data_ep, sizeof data_ep, "inproc://liveness-data-%s", cl_test_tag());
    pid_t busy[256];
    size_t n_busy = saturate(busy, 256);
    void *ctx = zmq_ctx_new();
    dh_coordinator_t *coord = start_coordinator(coord_ep, 40, ctx);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = coord_ep;
    dc.node = "test-node";
    dc.name = "embedded";
    dc.workers = 2;
    dc.pipeline_json = SYNTH;
    dc.arena_bytes = 16u << 20;
    dc.data_listen = data_ep;
    dc.heartbeat_ms = 100;
    dc.zmq_ctx = ctx;
    dh_dataserver_t *ds = NULL;
    assert_int_equal(dh_dataserver_new(&ds, &dc), 0);
    assert_int_equal(dh_dataserver_start(ds), 0);
    dh_coordinator_stats_t cs;
    wait_stats(coord, 1, 0, 20000, &cs);

    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    cfg.profiles = profiles;
    cfg.ranks = 1;
    cfg.batch = 4;
    cfg.node = "test-node";
    cfg.coordinator = coord_ep;
    cfg.next_timeout_ms = 60000;
    cfg.zmq_ctx = ctx;
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    /* the epoch, and at least 25 limits (10 heartbeat periods) of observation */
    uint64_t t0 = dh_clock_now_ns();
    dh_client_batch_t *b = NULL;
    uint64_t batches = 0;
    while ((rc = dh_client_next(c, &b)) == 0) {
        dh_client_batch_release(&b);
        batches++;
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(batches, 16);
    while (dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 1.0)
        cl_nap_ms(50);
    dh_coordinator_stats(coord, &cs);
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    unsaturate(busy, n_busy);
    assert_int_equal(cs.servers_dead_declared, 0);
    assert_int_equal(cs.servers_alive, 1);
    assert_int_equal(cs.redispatches, 0);
    assert_int_equal(st.duplicates_dropped, 0);
    dh_client_destroy(&c);
    dh_dataserver_destroy(&ds);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
    cl_assert_no_leftovers();
}

/* A fake remote DataServer on a DEALER: HELLO (with this process's pid, as a server of another
 * process in a pid namespace could have), then heartbeats `gap_ms` apart. */
static dh_wire_socket_t *ghost_hello(void *ctx, const char *coord_ep)
{
    dh_wire_socket_t *g = NULL;
    assert_int_equal(dh_wire_socket_new(&g, ctx, ZMQ_DEALER, NULL), 0);
    assert_int_equal(
        zmq_setsockopt(dh_wire_socket_handle(g), ZMQ_ROUTING_ID, "ghost", strlen("ghost")), 0);
    assert_int_equal(dh_wire_socket_connect(g, coord_ep), 0);
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = DH_WIRE_ROLE_REMOTE;
    m.hello.node = "elsewhere";
    m.hello.name = "ghost";
    m.hello.workers = 1;
    m.hello.pid = (uint32_t)getpid();
    assert_int_equal(dh_wire_send(g, NULL, 0, &m, NULL, 0, 1000), 0);
    return g;
}

static void ghost_beats(dh_wire_socket_t *g, int beats, int gap_ms)
{
    for (int i = 0; i < beats; i++) {
        cl_nap_ms(gap_ms);
        dh_msg_t m = {.type = DH_MSG_HEARTBEAT};
        m.heartbeat.workers = 1;
        assert_int_equal(dh_wire_send(g, NULL, 0, &m, NULL, 0, 1000), 0);
    }
}

/* Heartbeats 150 ms apart teach a 300 ms limit to wait 4 x 150 = 600 ms: a 450 ms gap (a
 * declared death before) passes; then silence, as after kill -9, is declared dead within
 * the cap (10 x 300 ms), though its HELLO carried this process's pid (its loop is not here). */
static void limit_follows_the_gaps_and_silence_is_still_death(void **state)
{
    (void)state;
    char coord_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://liveness-ghost-%s", cl_test_tag());
    void *ctx = zmq_ctx_new();
    dh_coordinator_t *coord = start_coordinator(coord_ep, 300, ctx);
    dh_wire_socket_t *g = ghost_hello(ctx, coord_ep);
    dh_coordinator_stats_t cs;
    wait_stats(coord, 1, 0, 20000, &cs);
    ghost_beats(g, 33, 150);
    ghost_beats(g, 1, 450);
    dh_coordinator_stats(coord, &cs);
    assert_int_equal(cs.servers_dead_declared, 0);
    uint64_t silent_from = dh_clock_now_ns();
    wait_stats(coord, 0, 1, 10000, &cs);
    double took_s = dh_clock_elapsed_s(silent_from, dh_clock_now_ns());
    assert_true(took_s >= 0.5); /* the learned 600 ms, not the configured 300 */
    assert_true(took_s < 3.0 + 1.0);
    dh_wire_socket_destroy(&g);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
    cl_assert_no_leftovers();
}

/* A server under load from its first heartbeat on (a DataServer started on a saturated
 * machine): gaps of 150 ms against a 300 ms limit raise it to 4 x 150 = 600 ms at once, so a
 * 450 ms gap among its first few passes (before, the limit followed only after 32 gaps, and
 * this gap was a death); and it keeps rising with the gaps (4 x 450 ms), so silence is still
 * death within the cap (10 x 300 ms). */
static void limit_rises_from_the_first_gaps(void **state)
{
    (void)state;
    char coord_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://liveness-early-%s", cl_test_tag());
    void *ctx = zmq_ctx_new();
    dh_coordinator_t *coord = start_coordinator(coord_ep, 300, ctx);
    dh_wire_socket_t *g = ghost_hello(ctx, coord_ep);
    dh_coordinator_stats_t cs;
    wait_stats(coord, 1, 0, 20000, &cs);
    ghost_beats(g, 2, 150);
    ghost_beats(g, 1, 450);
    dh_coordinator_stats(coord, &cs);
    assert_int_equal(cs.servers_dead_declared, 0);
    uint64_t silent_from = dh_clock_now_ns();
    wait_stats(coord, 0, 1, 10000, &cs);
    double took_s = dh_clock_elapsed_s(silent_from, dh_clock_now_ns());
    assert_true(took_s >= 1.5); /* 4 x the 450 ms gap */
    assert_true(took_s < 3.0 + 1.0);
    dh_wire_socket_destroy(&g);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
    cl_assert_no_leftovers();
}

/* The limit's rules on one server's record, with no sockets and no clock (the heard times
 * are given): a gap longer than the limit at the time (a stop the server came back from) is
 * not learned; the limit rises at once to 4 x a gap, and follows the p99 of the gaps once 32
 * were seen; either way it is capped at 10 x dead_after_ms. */
static void limit_rules_on_a_record(void **state)
{
    (void)state;
    dh_coordinator_t *c = calloc(1, sizeof *c);
    server_t *s = calloc(1, sizeof *s);
    assert_non_null(c);
    assert_non_null(s);
    c->cfg.dead_after_ms = 100; /* cap: 1000 ms */
    s->alive = true;
    uint64_t now = 1000000000ull;
    s->last_seen_ns = now;
#define HEARD(gap_ms)                                                                              \
    do {                                                                                           \
        now += (uint64_t)(gap_ms)*1000000ull;                                                      \
        dh__coord_liveness_heard(c, s, now);                                                       \
        s->last_seen_ns = now;                                                                     \
    } while (0)
    HEARD(60);
    assert_int_equal(s->n_gaps, 1);
    assert_int_equal(s->limit_ms, 240);
    HEARD(5000); /* past the 240 ms limit: a stop, not learned */
    assert_int_equal(s->n_gaps, 1);
    assert_int_equal(s->limit_ms, 240);
    HEARD(200);
    assert_int_equal(s->limit_ms, 800);
    for (int i = 0; i < 28; i++) {
        HEARD(400); /* 4 x 400 = 1600: capped */
        assert_int_equal(s->limit_ms, 1000);
    }
    assert_int_equal(s->n_gaps, 30);
    HEARD(400);
    HEARD(400); /* the 32nd gap: the limit follows the p99 (400 ms), 4 x that capped */
    assert_int_equal(s->n_gaps, 32);
    assert_int_equal(s->limit_ms, 1000);
#undef HEARD
    free(s);
    free(c);
}

/* runtime/awake.h, what the coordinator's and the client's loops count as their own absence:
 * a child process runs a loop of 20 ms sleeps (its poll) and reports its summed absence
 * after every turn; stopped (SIGSTOP) for STOP_MS, it counts at least most of that. */
#define STOP_MS 600
static void a_stopped_loop_counts_its_absence(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(60);
        dh__awake_t a = {0};
        for (;;) {
            usleep(20000);
            dh__awake_turn(&a, 20000000ull);
            if (write(fds[1], &a.absent_ns, sizeof a.absent_ns) != sizeof a.absent_ns)
                _exit(1);
        }
    }
    close(fds[1]);
    uint64_t absent = 0;
    for (int turns = 0; turns < 3; turns++) /* running: its first turns */
        assert_int_equal(read(fds[0], &absent, sizeof absent), (ssize_t)sizeof absent);
    uint64_t before = absent;
    assert_int_equal(kill(pid, SIGSTOP), 0);
    usleep(STOP_MS * 1000); /* a deliberate interval: the stop */
    assert_int_equal(kill(pid, SIGCONT), 0);
    /* the turn that was stopped reports it; the pipe holds at most a few turns before it */
    uint64_t deadline = dh_clock_now_ns() + 10000000000ull;
    while (absent - before < (uint64_t)(STOP_MS * 3 / 4) * 1000000ull &&
           dh_clock_now_ns() < deadline)
        assert_int_equal(read(fds[0], &absent, sizeof absent), (ssize_t)sizeof absent);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(fds[0]);
    print_message("absence counted over a %d ms stop: %.0f ms\n", STOP_MS,
                  (double)(absent - before) / 1e6);
    assert_true(absent - before >= (uint64_t)(STOP_MS * 3 / 4) * 1000000ull);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(in_process_server_survives_a_saturated_cpu),
        cmocka_unit_test(limit_follows_the_gaps_and_silence_is_still_death),
        cmocka_unit_test(limit_rises_from_the_first_gaps),
        cmocka_unit_test(limit_rules_on_a_record),
        cmocka_unit_test(a_stopped_loop_counts_its_absence),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
