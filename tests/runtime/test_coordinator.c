/* Tests of the coordinator's online feedback (coordinator_learn.c; docs/design.md §4.1, "Online
 * feedback"): from completions it learns each profile key's bias while every server's speed
 * factor stays near its true 1, it keeps a record of predicted against actual per executed
 * request, and a heartbeat corrects its book of queued work, counting the DISPATCHes still
 * on their way. Real coordinator and DataServers as threads; the book is seen through
 * placement (a server whose book is full gets nothing). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <zmq.h>

#include "cluster.h"
#include "dh_test.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/rt.h"

#define NOISY                                                                                      \
    "{\"type\":\"synthetic\",\"cost\":\"sleep\",\"cpu_scale\":0.02,\"bytes_scale\":0.001,"         \
    "\"cost_bias\":0.3,\"cost_noise\":0.3,\"noise_seed\":9}"

static dh_coordinator_t *start_coordinator(const char *ep, void *ctx)
{
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = ep;
    cc.dead_after_ms = 60000; /* a loaded machine must not fake a death */
    cc.zmq_ctx = ctx;
    dh_coordinator_t *coord = NULL;
    assert_int_equal(dh_coordinator_new(&coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(coord), 0);
    return coord;
}

static dh_dataserver_t *start_server(const char *coord_ep, void *ctx, dh_ds_role_t role,
                                     const char *node, const char *name, const char *data_ep)
{
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = coord_ep;
    dc.role = role;
    dc.node = node;
    dc.name = name;
    dc.workers = 2;
    dc.pipeline_json = NOISY;
    dc.arena_bytes = 16u << 20;
    dc.data_listen = data_ep;
    dc.heartbeat_ms = 50;
    dc.zmq_ctx = ctx;
    dh_dataserver_t *ds = NULL;
    assert_int_equal(dh_dataserver_new(&ds, &dc), 0);
    assert_int_equal(dh_dataserver_start(ds), 0);
    return ds;
}

/* Noisy emulation (a bias per key, noise per sample, both sigma 0.3, costs x 0.02): after
 * ~300 samples every key's learned ratio is within 15% of 0.02 x its bias, both servers'
 * speeds within 15% of 1 (they truly run at 1), and every executed request has a record. */
static void coordinator_learns_key_bias_not_server_speed(void **state)
{
    void *ctx = zmq_ctx_new();
    char coord_ep[128], data_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://coord-learn-%d", (int)getpid());
    snprintf(data_ep, sizeof data_ep, "inproc://data-learn-%d", (int)getpid());
    dh_coordinator_t *coord = start_coordinator(coord_ep, ctx);
    dh_dataserver_t *local =
        start_server(coord_ep, ctx, DH_DS_LOCAL, "test-node", "local", data_ep);
    dh_dataserver_t *remote = start_server(coord_ep, ctx, DH_DS_REMOTE, "spare", "remote", NULL);

    const char *profiles = dh_test_path("p.jsonl");
    dh_mix_t *mix = NULL;
    assert_int_equal(dh_mix_load("kinetics-mixed", &mix), 0);
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profiles_generate(mix, 320, 5, set), 0);
    assert_int_equal(dh_profile_set_write(set, profiles), 0);
    dh_mix_destroy(&mix);

    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    cfg.coordinator = coord_ep;
    cfg.zmq_ctx = ctx;
    cfg.profiles = profiles;
    cfg.node = "test-node";
    cfg.ranks = 1;
    cfg.batch = 4;
    cfg.seed = 3;
    cfg.epochs = 1;
    cfg.next_timeout_ms = 60000;
    dh_client_t *client = NULL;
    assert_int_equal(dh_client_new(&client, &cfg), 0);
    size_t batches = 0;
    for (;;) {
        dh_client_batch_t *b = NULL;
        int rc = dh_client_next(client, &b);
        if (rc == DH_EEOF)
            break;
        if (rc)
            print_error("next: %s\n", dh_last_error());
        assert_int_equal(rc, 0);
        dh_client_batch_release(&b);
        batches++;
    }
    assert_int_equal(batches, 80);

    dh__rt_pipeline_t spec;
    assert_int_equal(dh__rt_pipeline_load(NOISY, NULL, &spec), 0);
    dh__rt_pipeline_t bias_only = spec;
    bias_only.noise.cost_noise = 0;
    for (size_t i = 0; i < dh_profile_set_count(set); i++) {
        const char *key = dh_profile_set_row(set, i)->profile_key;
        uint64_t obs = 0;
        double ratio = dh_coordinator_key_ratio(coord, key, &obs);
        double want = 0.02 * dh__noise_cpu_s(&bias_only.noise, "any", key, 1.0);
        if (!(fabs(ratio / want - 1) <= 0.15))
            fail_msg("key %s: learned %.5f from %llu observations, true %.5f", key, ratio,
                     (unsigned long long)obs, want);
    }
    assert_true(isnan(dh_coordinator_key_ratio(coord, "never-seen", NULL)));
    const char *names[2] = {"local", "remote"};
    for (int s = 0; s < 2; s++) {
        double speed = dh__coord_server_speed(coord, names[s]);
        if (!(fabs(speed - 1) <= 0.15))
            fail_msg("server %s: speed %.4f, truly 1", names[s], speed);
    }
    assert_true(isnan(dh__coord_server_speed(coord, "nobody")));

    /* the last COMPLETE may still be on its way when the client has its batch */
    size_t n = 0;
    for (int i = 0; i < 2000 && (n = dh_coordinator_predictions(coord, NULL, 0)) < 80; i++)
        cl_nap_ms(5);
    if (n < 80)
        print_error("%zu records for 80 batches\n", n);
    assert_true(n >= 80); /* one request per batch, at least */
    dh_prediction_t *p = calloc(n, sizeof *p);
    assert_int_equal(dh_coordinator_predictions(coord, p, n), n);
    size_t close_enough = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(p[i].rank, 0);
        assert_true(p[i].n_samples >= 1 && p[i].n_samples <= 4);
        assert_true(p[i].pred_cpu_s > 0 && p[i].actual_cpu_s > 0 && p[i].profile_cpu_s > 0);
        assert_true(p[i].pred_ready_s > 0 && p[i].actual_ready_s > 0);
        close_enough += fabs(p[i].pred_cpu_s / p[i].actual_cpu_s - 1) < 0.5;
    }
    /* learned: most requests are predicted within 50% (noise 0.3 per sample remains) */
    assert_true(close_enough > n / 2);
    free(p);

    dh_client_destroy(&client);
    dh_dataserver_destroy(&local);
    dh_dataserver_destroy(&remote);
    dh_coordinator_destroy(&coord);
    dh_profile_set_destroy(&set);
    zmq_ctx_term(ctx);
}

static dh_wire_socket_t *dealer(void *ctx, const char *id, const char *ep)
{
    dh_wire_socket_t *s = NULL;
    assert_int_equal(dh_wire_socket_new(&s, ctx, ZMQ_DEALER, NULL), 0);
    assert_int_equal(zmq_setsockopt(dh_wire_socket_handle(s), ZMQ_ROUTING_ID, id, strlen(id)), 0);
    assert_int_equal(dh_wire_socket_connect(s, ep), 0);
    return s;
}

/* Waits (up to 10 s) for `want` DISPATCHes to reach the fake server, then counts any more
 * that come within 300 ms of quiet; returns how many came in all. */
static int count_dispatches(dh_wire_socket_t *s, int want)
{
    int n = 0;
    dh_wire_received_t r = {0};
    uint64_t t0 = dh_clock_now_ns();
    for (;;) {
        int timeout_ms = n < want ? 100 : 300;
        if (dh_wire_recv(s, timeout_ms, &r) == 0) {
            if (r.msg.type == DH_MSG_DISPATCH) {
                assert_true(r.msg.dispatch.pred_cpu_s > 0);
                n++;
            }
            dh_wire_received_release(&r);
        } else if (n >= want || dh_clock_elapsed_s(t0, dh_clock_now_ns()) > 10) {
            return n;
        }
    }
}

static void heartbeat(dh_wire_socket_t *s, uint32_t depth, uint64_t seen)
{
    dh_msg_t m = {.type = DH_MSG_HEARTBEAT};
    m.heartbeat.workers = 1;
    m.heartbeat.queue_depth = depth;
    m.heartbeat.queue_work_s = 0.1 * depth;
    m.heartbeat.speed_factor = 1;
    m.heartbeat.dispatches_seen = seen;
    assert_int_equal(dh_wire_send(s, NULL, 0, &m, NULL, 0, 1000), 0);
}

static void hello_server(dh_wire_socket_t *s, const char *name, uint8_t role, const char *node,
                         uint32_t workers)
{
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = role;
    m.hello.node = (char *)node;
    m.hello.name = (char *)name;
    m.hello.workers = workers;
    m.hello.endpoint = role == DH_WIRE_ROLE_LOCAL ? "inproc://nowhere" : "";
    m.hello.shm_socket = role == DH_WIRE_ROLE_LOCAL ? "nowhere" : "";
    assert_int_equal(dh_wire_send(s, NULL, 0, &m, NULL, 0, 1000), 0);
}

/* A fake client on test-node that says HELLO, then sends n one-sample REQUESTs (seq 0..n-1,
 * each predicted cpu_s). */
static dh_wire_socket_t *fake_client(void *ctx, const char *ep, int n, double cpu_s)
{
    dh_wire_socket_t *cl = dealer(ctx, "fake-client", ep);
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = DH_WIRE_ROLE_CLIENT;
    m.hello.node = "test-node";
    m.hello.name = "fake-client";
    assert_int_equal(dh_wire_send(cl, NULL, 0, &m, NULL, 0, 1000), 0);
    for (uint64_t seq = 0; seq < (uint64_t)n; seq++) {
        char id[32];
        snprintf(id, sizeof id, "s%llu", (unsigned long long)seq);
        dh_wire_sample_t sample = {.id = id, .uri = "synthetic://x", .key = "k", .cpu_s = cpu_s};
        dh_msg_t q = {.type = DH_MSG_REQUEST};
        q.request.client_id = "fake-client";
        q.request.seq = seq;
        q.request.deadline_ns = 1000000000;
        q.request.delivery_node = "test-node";
        q.request.n_samples = 1;
        q.request.samples = &sample;
        assert_int_equal(dh_wire_send(cl, NULL, 0, &q, NULL, 0, 1000), 0);
    }
    return cl;
}

/* Waits (up to 10 s) until `n` servers are alive. */
static void wait_alive(dh_coordinator_t *coord, uint64_t n)
{
    dh_coordinator_stats_t cs;
    for (int i = 0; i < 2000; i++) {
        dh_coordinator_stats(coord, &cs);
        if (cs.servers_alive == n)
            return;
        cl_nap_ms(5);
    }
    assert_int_equal(cs.servers_alive, n);
}

/* A server whose COMPLETEs never come (lost) fills its book to the cap (4 per worker) and
 * gets nothing more. Its heartbeat saying it holds nothing, but naming only the DISPATCHes
 * it had seen before them, changes nothing (they are still on their way); once it has seen
 * all 4 and holds nothing, the book is corrected and it gets 4 more. */
static void coordinator_heartbeat_corrects_its_book(void **state)
{
    void *ctx = zmq_ctx_new();
    char coord_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://coord-book-%d", (int)getpid());
    dh_coordinator_t *coord = start_coordinator(coord_ep, ctx);
    dh_wire_socket_t *ds = dealer(ctx, "fake-ds", coord_ep);
    hello_server(ds, "fake-ds", DH_WIRE_ROLE_LOCAL, "test-node", 1);
    wait_alive(coord, 1);
    dh_wire_socket_t *cl = fake_client(ctx, coord_ep, 12, 0.1);
    assert_int_equal(count_dispatches(ds, 4), 4);
    heartbeat(ds, 0, 0); /* stale: sent before any DISPATCH arrived */
    assert_int_equal(count_dispatches(ds, 0), 0);
    heartbeat(ds, 0, 4); /* all 4 seen, none held: their COMPLETEs were lost */
    assert_int_equal(count_dispatches(ds, 4), 4);
    heartbeat(ds, 2, 8); /* holds 2 of the new 4: room for 2 */
    assert_int_equal(count_dispatches(ds, 2), 2);

    dh_wire_socket_destroy(&cl);
    dh_wire_socket_destroy(&ds);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
}

/* A COMPLETE for (client, seq) of one sample: the executor's report (delivered 0, measured)
 * or the delivering server's (delivered 1; measured too when it executed it itself). */
static void complete(dh_wire_socket_t *s, const char *client, uint64_t seq, bool delivered,
                     bool measured)
{
    dh_wire_sample_status_t st = {.status = 0, .error = "", .cpu_s = measured ? 0.05 : 0};
    dh_msg_t m = {.type = DH_MSG_COMPLETE};
    m.complete.client_id = (char *)client;
    m.complete.seq = seq;
    m.complete.n_samples = 1;
    m.complete.samples = &st;
    m.complete.cpu_s = measured ? 0.05 : 0;
    m.complete.delivered = delivered;
    assert_int_equal(dh_wire_send(s, NULL, 0, &m, NULL, 0, 1000), 0);
}

/* Waits (up to 10 s) until the coordinator has counted `n` deliveries. */
static void wait_delivered(dh_coordinator_t *coord, uint64_t n)
{
    dh_coordinator_stats_t cs;
    for (int i = 0; i < 2000; i++) {
        dh_coordinator_stats(coord, &cs);
        if (cs.delivered >= n)
            return;
        cl_nap_ms(5);
    }
    fail_msg("the coordinator counted %llu deliveries, not %llu", (unsigned long long)cs.delivered,
             (unsigned long long)n);
}

/* A sidecar reports a request (its measurements) before it forwards the batch, but the
 * target's delivered COMPLETE comes on another pipe and may be read first. The coordinator
 * still learns from the report that comes after the delivery: every executed request has its
 * record, whatever the order. Here every delivery is made to be read first. */
static void coordinator_learns_from_a_report_the_delivery_overtook(void **state)
{
    void *ctx = zmq_ctx_new();
    char coord_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://coord-late-%d", (int)getpid());
    dh_coordinator_t *coord = start_coordinator(coord_ep, ctx);
    dh_wire_socket_t *local = dealer(ctx, "fake-local", coord_ep);
    dh_wire_socket_t *remote = dealer(ctx, "fake-remote", coord_ep);
    hello_server(local, "fake-local", DH_WIRE_ROLE_LOCAL, "test-node", 1);
    hello_server(remote, "fake-remote", DH_WIRE_ROLE_REMOTE, "spare", 4);
    wait_alive(coord, 2);
    enum { N = 8 }; /* the local's book holds 4 (one worker): the rest go to the sidecar */
    dh_wire_socket_t *cl = fake_client(ctx, coord_ep, N, 0.05);
    /* each DISPATCH answered as it comes: by the local (executed and delivered) or, for
     * the sidecar's, the local's delivery first, read by the coordinator, then the report */
    int got = 0, by_sidecar = 0;
    uint64_t t0 = dh_clock_now_ns();
    while (got < N && dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 10) {
        dh_wire_received_t r = {0};
        for (int k = 0; k < 2; k++) {
            dh_wire_socket_t *srv = k == 0 ? local : remote;
            if (dh_wire_recv(srv, 20, &r) != 0)
                continue;
            if (r.msg.type == DH_MSG_DISPATCH) {
                uint64_t seq = r.msg.dispatch.request.seq;
                got++;
                if (srv == local) {
                    complete(local, "fake-client", seq, true, true);
                } else {
                    by_sidecar++;
                    complete(local, "fake-client", seq, true, false);
                    wait_delivered(coord, (uint64_t)got);
                    complete(remote, "fake-client", seq, false, true);
                }
                if (srv == local)
                    wait_delivered(coord, (uint64_t)got);
            }
            dh_wire_received_release(&r);
        }
    }
    assert_int_equal(got, N);
    assert_true(by_sidecar > 0);
    size_t n = 0;
    for (int i = 0; i < 2000 && (n = dh_coordinator_predictions(coord, NULL, 0)) < N; i++)
        cl_nap_ms(5);
    if (n != N)
        print_error("%zu records for %d executed requests (%d by the sidecar)\n", n, N, by_sidecar);
    assert_int_equal(n, N);

    dh_wire_socket_destroy(&cl);
    dh_wire_socket_destroy(&local);
    dh_wire_socket_destroy(&remote);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
}

/* Answers every DISPATCH waiting at fake server k as its executor and deliverer (a COMPLETE
 * with delivered=1, measured); counts them in seen[k]. */
static void answer_dispatches(dh_wire_socket_t *s, uint64_t *seen)
{
    dh_wire_received_t r = {0};
    while (dh_wire_recv(s, 0, &r) == 0) {
        if (r.msg.type == DH_MSG_DISPATCH) {
            (*seen)++;
            complete(s, r.msg.dispatch.request.client_id, r.msg.dispatch.request.seq, true, true);
        }
        dh_wire_received_release(&r);
    }
}

/* n one-sample REQUESTs (seq seq0..) of 8 MiB clips in an S3 bucket, 50 ms of CPU each. */
static void remote_requests(dh_wire_socket_t *cl, uint64_t seq0, int n)
{
    for (uint64_t seq = seq0; seq < seq0 + (uint64_t)n; seq++) {
        char id[32], uri[64];
        snprintf(id, sizeof id, "r%llu", (unsigned long long)seq);
        snprintf(uri, sizeof uri, "s3://clips/r%llu.mp4", (unsigned long long)seq);
        dh_wire_sample_t sample = {
            .id = id, .uri = uri, .key = "k", .cpu_s = 0.05, .in_bytes = 8u << 20};
        dh_msg_t q = {.type = DH_MSG_REQUEST};
        q.request.client_id = "fake-client";
        q.request.seq = seq;
        q.request.deadline_ns = 1000000000;
        q.request.delivery_node = "test-node";
        q.request.n_samples = 1;
        q.request.samples = &sample;
        assert_int_equal(dh_wire_send(cl, NULL, 0, &q, NULL, 0, 1000), 0);
    }
}

/* Waits for `want` DISPATCHes at the two fake servers (10 s at most), then answers them
 * all as executor and deliverer, each sample's fetch that server's: fetch_s[k] seconds for
 * 8 MiB. Counts them per server in got[k]. */
static void answer_with_fetch(dh_wire_socket_t *const srv[2], const double fetch_s[2], int want,
                              int got[2])
{
    enum { MAX = 16 };
    uint64_t seqs[MAX];
    int at[MAX];
    uint64_t t0 = dh_clock_now_ns();
    int n = 0;
    assert_true(want <= MAX);
    while (n < want && dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 10) {
        for (int k = 0; k < 2 && n < want; k++) {
            dh_wire_received_t r = {0};
            if (dh_wire_recv(srv[k], 20, &r) != 0)
                continue;
            if (r.msg.type == DH_MSG_DISPATCH) {
                seqs[n] = r.msg.dispatch.request.seq;
                at[n++] = k;
            }
            dh_wire_received_release(&r);
        }
    }
    assert_int_equal(n, want);
    for (int i = 0; i < n; i++) {
        int k = at[i];
        dh_wire_sample_status_t st = {.status = 0,
                                      .error = "",
                                      .cpu_s = 0.05,
                                      .fetch_s = fetch_s[k],
                                      .fetch_bytes = 8u << 20};
        dh_msg_t m = {.type = DH_MSG_COMPLETE};
        m.complete.client_id = "fake-client";
        m.complete.seq = seqs[i];
        m.complete.n_samples = 1;
        m.complete.samples = &st;
        m.complete.cpu_s = 0.05;
        m.complete.delivered = 1;
        assert_int_equal(dh_wire_send(srv[k], NULL, 0, &m, NULL, 0, 1000), 0);
        got[k]++;
    }
}

/* Costs that include the fetch (issue 34): clips in s3://clips; the rank's local DataServer
 * fetches them slowly (0.8 s per 8 MiB clip: far from the bucket), a sidecar on another
 * node quickly (0.02 s: beside it). First 8 requests at once: the local server takes 4 (one
 * per worker, with the prior's fetch everywhere), the rest go to the sidecar, whose T has no
 * queue wait, so both learn (an untried server is predicted with the source's fit over the
 * others, so only such overflow teaches the model about it); the coordinator's fetch model then
 * holds each pair's own estimate, and later requests go to the sidecar, which the
 * prior alone (the same fetch everywhere) would not do: the local server meets D and is
 * kept. */
static void coordinator_learns_fetch_and_places_near_the_data(void **state)
{
    void *ctx = zmq_ctx_new();
    char coord_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://coord-fetch-%d", (int)getpid());
    dh_coordinator_t *coord = start_coordinator(coord_ep, ctx);
    dh_wire_socket_t *srv[2] = {dealer(ctx, "fake-local", coord_ep),
                                dealer(ctx, "fake-sidecar", coord_ep)};
    hello_server(srv[0], "fake-local", DH_WIRE_ROLE_LOCAL, "test-node", 4);
    hello_server(srv[1], "fake-sidecar", DH_WIRE_ROLE_REMOTE, "near-the-bucket", 4);
    wait_alive(coord, 2);
    dh_wire_socket_t *cl = dealer(ctx, "fake-client", coord_ep);
    dh_msg_t hello = {.type = DH_MSG_HELLO};
    hello.hello.role = DH_WIRE_ROLE_CLIENT;
    hello.hello.node = "test-node";
    hello.hello.name = "fake-client";
    assert_int_equal(dh_wire_send(cl, NULL, 0, &hello, NULL, 0, 1000), 0);
    const double fetch_s[2] = {0.8, 0.02};

    /* Before any completion: the prior, for both */
    dh__fetch_estimate_t e;
    assert_int_equal(dh__coord_fetch_estimate(coord, "fake-local", "s3://clips", &e), 0);
    assert_int_equal(e.from, DH__FETCH_FROM_PRIOR);
    assert_int_equal(dh__coord_fetch_estimate(coord, "nobody", "s3://clips", &e), DH_EUNKNOWN);

    /* Learning: 8 requests at once, 4 to the local server, 4 overflow to the sidecar; then
     * 8 more, which go where the first taught. */
    int got[2] = {0, 0};
    for (int round = 0; round < 2; round++) {
        remote_requests(cl, (uint64_t)round * 8, 8);
        answer_with_fetch(srv, fetch_s, 8, got);
        wait_delivered(coord, (uint64_t)(round + 1) * 8);
    }
    print_message("learning: %d at the local server, %d at the sidecar\n", got[0], got[1]);
    assert_true(got[0] >= 3 && got[1] >= 3);
    double cost[2];
    const char *names[2] = {"fake-local", "fake-sidecar"};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(dh__coord_fetch_estimate(coord, names[k], "s3://clips", &e), 0);
        assert_int_equal(e.from, DH__FETCH_FROM_SERVER);
        cost[k] = e.latency_s + (8u << 20) / e.bytes_per_s;
        print_message("%s: %d requests, learned fetch of 8 MiB %.3f s (true %.3f)\n", names[k],
                      got[k], cost[k], fetch_s[k]);
    }
    assert_true(cost[0] > 0.4); /* the prior's 0.13 s pulled toward 0.8 */
    assert_true(cost[1] < 0.1);

    /* Placing: one request at a time, answered before the next; each goes to the sidecar
     * (remote gain: T 0.07 s there, 0.85 s or more at the local server, which still meets
     * D = 1 s and would be kept without the fetch). */
    int placed[2] = {0, 0};
    for (int i = 0; i < 6; i++) {
        remote_requests(cl, 16 + (uint64_t)i, 1);
        answer_with_fetch(srv, fetch_s, 1, placed);
        wait_delivered(coord, 17 + (uint64_t)i);
    }
    assert_int_equal(placed[0], 0);
    assert_int_equal(placed[1], 6);
    /* the record of the last one: the sidecar's predicted and reported fetch */
    dh_prediction_t p[64];
    size_t n = dh_coordinator_predictions(coord, p, 64);
    assert_true(n >= 22);
    assert_close(p[n - 1].fetch_s, 0.02, 1e-12);
    assert_int_equal(p[n - 1].fetch_bytes, 8u << 20);
    assert_true(p[n - 1].pred_fetch_s > 0 && p[n - 1].pred_fetch_s < 0.1);

    dh_wire_socket_destroy(&cl);
    dh_wire_socket_destroy(&srv[0]);
    dh_wire_socket_destroy(&srv[1]);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
}

/* Placement among many servers (docs/scheduler.md, "The index"): 1,024 fake DataServers on
 * 64 nodes (one local per node, the rest remote) and 4 clients on 4 of the nodes. In 32
 * rounds each client sends 16 one-sample requests, every one is placed, executed and
 * delivered (each fake server answers what it gets), and then 64 servers send a heartbeat
 * (queue, read bandwidth and a link to another node, all changing), one remote and one local
 * DataServer of a node without clients leave (GOODBYE) and come back (HELLO). Under ctest
 * DH_PLACE_CHECK=1 also checks each decision against dh_place on a snapshot rebuilt from
 * every server. Prints the coordinator's time per decision (sched_s / decisions): a
 * benchmark's number, not asserted. */
static void coordinator_places_among_many_servers(void **state)
{
    enum { SERVERS = 1024, NODES = 64, CLIENTS = 4, ROUNDS = 32, PER_ROUND = 16 };
    struct rlimit lim; /* a socket is a file descriptor or two */
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 4 * SERVERS) {
        lim.rlim_cur = lim.rlim_max < 4 * SERVERS ? lim.rlim_max : 4 * SERVERS;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    void *ctx = zmq_ctx_new();
    assert_int_equal(zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 4 * SERVERS), 0);
    char coord_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://coord-many-%d", (int)getpid());
    dh_coordinator_t *coord = start_coordinator(coord_ep, ctx);
    static dh_wire_socket_t *srv[SERVERS];
    static char names[SERVERS][16], nodes[NODES][16];
    static uint64_t seen[SERVERS];
    for (int n = 0; n < NODES; n++)
        snprintf(nodes[n], sizeof nodes[n], "n%d", n);
    for (int i = 0; i < SERVERS; i++) {
        snprintf(names[i], sizeof names[i], "%c%d", i < NODES ? 'L' : 'R', i);
        srv[i] = dealer(ctx, names[i], coord_ep);
        hello_server(srv[i], names[i], i < NODES ? DH_WIRE_ROLE_LOCAL : DH_WIRE_ROLE_REMOTE,
                     nodes[i % NODES], 4);
        seen[i] = 0;
    }
    wait_alive(coord, SERVERS);
    dh_wire_socket_t *cl[CLIENTS];
    for (int k = 0; k < CLIENTS; k++) {
        char name[16];
        snprintf(name, sizeof name, "client%d", k);
        cl[k] = dealer(ctx, name, coord_ep);
        dh_msg_t m = {.type = DH_MSG_HELLO};
        m.hello.role = DH_WIRE_ROLE_CLIENT;
        m.hello.node = nodes[k];
        m.hello.name = name;
        m.hello.rank = (uint32_t)k;
        assert_int_equal(dh_wire_send(cl[k], NULL, 0, &m, NULL, 0, 1000), 0);
    }
    uint64_t sent = 0, rng = 7;
    for (int round = 0; round < ROUNDS; round++) {
        for (int k = 0; k < CLIENTS; k++)
            for (int j = 0; j < PER_ROUND; j++) {
                char name[16], id[32], key[16];
                snprintf(name, sizeof name, "client%d", k);
                snprintf(id, sizeof id, "s%d-%d", round, j);
                snprintf(key, sizeof key, "k%d", j % 5);
                dh_wire_sample_t sample = {.id = id,
                                           .uri = "synthetic://x",
                                           .key = key,
                                           .cpu_s = 0.01 * (1 + j % 7),
                                           .in_bytes = 100000u * (1 + j % 3),
                                           .out_bytes = 1000000};
                dh_msg_t q = {.type = DH_MSG_REQUEST};
                q.request.client_id = name;
                q.request.seq = (uint64_t)(round * PER_ROUND + j);
                q.request.deadline_ns = 20000000 * (1 + j % 4);
                q.request.delivery_node = nodes[k];
                q.request.n_samples = 1;
                q.request.samples = &sample;
                assert_int_equal(dh_wire_send(cl[k], NULL, 0, &q, NULL, 0, 1000), 0);
                sent++;
            }
        dh_coordinator_stats_t cs;
        uint64_t t0 = dh_clock_now_ns();
        for (;;) {
            for (int i = 0; i < SERVERS; i++)
                answer_dispatches(srv[i], &seen[i]);
            dh_coordinator_stats(coord, &cs);
            if (cs.delivered >= sent)
                break;
            if (dh_clock_elapsed_s(t0, dh_clock_now_ns()) > 30)
                fail_msg("round %d: %llu of %llu requests delivered", round,
                         (unsigned long long)cs.delivered, (unsigned long long)sent);
        }
        /* quiet: nothing in flight. Heartbeats, then a departure and a return. */
        for (int h = 0; h < 64; h++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int i = (int)((rng >> 33) % SERVERS);
            int to = (i + 1 + (int)((rng >> 20) % (NODES - 1))) % NODES; /* not its own */
            dh_wire_link_bw_t link = {.node = nodes[to],
                                      .bytes_per_s = 1e9 * (1 + (double)((rng >> 40) % 10)),
                                      .latency_s = 1e-5 * (double)(1 + (rng >> 50) % 20)};
            dh_msg_t m = {.type = DH_MSG_HEARTBEAT};
            m.heartbeat.workers = 4;
            m.heartbeat.speed_factor = 1;
            m.heartbeat.dispatches_seen = seen[i];
            m.heartbeat.read_bytes_per_s = 1e9 * (1 + (double)((rng >> 44) % 3));
            m.heartbeat.n_links = 1;
            m.heartbeat.links = &link;
            assert_int_equal(dh_wire_send(srv[i], NULL, 0, &m, NULL, 0, 1000), 0);
        }
        int leaver = round % 2 ? NODES + (int)((rng >> 35) % (SERVERS - NODES))
                               : CLIENTS + (int)((rng >> 35) % (NODES - CLIENTS));
        dh_msg_t bye = {.type = DH_MSG_GOODBYE};
        assert_int_equal(dh_wire_send(srv[leaver], NULL, 0, &bye, NULL, 0, 1000), 0);
        wait_alive(coord, SERVERS - 1);
        hello_server(srv[leaver], names[leaver],
                     leaver < NODES ? DH_WIRE_ROLE_LOCAL : DH_WIRE_ROLE_REMOTE,
                     nodes[leaver % NODES], 4);
        seen[leaver] = 0; /* a new registration counts DISPATCHes from 0 */
        wait_alive(coord, SERVERS);
    }
    dh_coordinator_stats_t cs;
    dh_coordinator_stats(coord, &cs);
    assert_int_equal(cs.delivered, sent);
    assert_true(cs.decisions >= sent);
    uint64_t used = 0;
    for (int i = 0; i < SERVERS; i++)
        used += seen[i] > 0;
    print_message("coordinator, %d servers on %d nodes: %llu decisions, %.2f us each "
                  "(sched_s / decisions); %llu servers executed a request\n",
                  SERVERS, NODES, (unsigned long long)cs.decisions,
                  cs.sched_s / (double)cs.decisions * 1e6, (unsigned long long)used);

    for (int k = 0; k < CLIENTS; k++)
        dh_wire_socket_destroy(&cl[k]);
    for (int i = 0; i < SERVERS; i++)
        dh_wire_socket_destroy(&srv[i]);
    dh_coordinator_destroy(&coord);
    zmq_ctx_term(ctx);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(coordinator_learns_key_bias_not_server_speed),
    cmocka_unit_test(coordinator_learns_from_a_report_the_delivery_overtook),
    cmocka_unit_test(coordinator_heartbeat_corrects_its_book),
    cmocka_unit_test(coordinator_places_among_many_servers),
    cmocka_unit_test(coordinator_learns_fetch_and_places_near_the_data),
};
DH_TEST_MAIN(tests)
