/* test_client_cluster.c: a client with its coordinator and DataServer started apart from it
 * (in-process daemons on their own endpoints, not embedded mode): a named server that is gone
 * is asked again, a departed client's batches are dropped quietly, and an epoch is delivered
 * over CURVE. */
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

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(client_asks_again_when_named_server_is_gone),
        cmocka_unit_test(dataserver_drops_a_departed_clients_batches_quietly),
        cmocka_unit_test(cluster_over_curve_delivers_the_epoch),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
