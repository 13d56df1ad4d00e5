/* test_link.c: the DataServer's emulated network (dh_dataserver_config_t.emulate_link_Bps,
 * dataserver_forward.c). A coordinator, a delivery-only local DataServer on one node and a sidecar
 * on another run as threads of this process, so every batch is executed by the sidecar and
 * forwarded over its one link: a delivery reaches the rank's DataServer no earlier than
 * its emulated bytes / the link's rate after it was requested (the sidecar produced it
 * after that), and two deliveries on the link take turns, so the later one arrives no
 * earlier than both transmissions after the first request. */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "cluster.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"

#define BYTES_SCALE 0.002
#define LINK_BPS 4e8 /* emulated bytes per second: a batch (~90 MB emulated) takes ~0.2 s */
#define SYNTH "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}"

typedef struct world {
    void *ctx;
    dh_coordinator_t *coord;
    dh_dataserver_t *local, *sidecar;
    dh_client_t *client;
} world_t;

/* The world: every request runs on the sidecar (node-b, `workers` workers, the emulated
 * link) and is forwarded to the rank's local DataServer (node-a, delivery only). */
static void world_start(world_t *w, uint32_t workers, uint32_t prefetch, uint64_t steps)
{
    memset(w, 0, sizeof *w);
    w->ctx = zmq_ctx_new();
    assert_non_null(w->ctx);
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://link-coordinator-%s", cl_test_tag());
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = ep;
    cc.zmq_ctx = w->ctx;
    cc.place.policy = DH_POLICY_LEAST_REQUEST;
    assert_int_equal(dh_coordinator_new(&w->coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(w->coord), 0);

    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = dh_coordinator_endpoint(w->coord);
    dc.zmq_ctx = w->ctx;
    dc.pipeline_json = SYNTH;
    dc.emulate_link_Bps = LINK_BPS;
    char data_ep[96];
    snprintf(data_ep, sizeof data_ep, "inproc://link-data-%s", cl_test_tag());
    dc.data_listen = data_ep;
    dc.node = "node-a";
    dc.name = "local-a";
    dc.workers = 0; /* delivery only: the sidecar executes everything */
    dc.arena_bytes = (uint64_t)32 << 20;
    assert_int_equal(dh_dataserver_new(&w->local, &dc), 0);
    assert_int_equal(dh_dataserver_start(w->local), 0);
    dc.role = DH_DS_REMOTE;
    dc.node = "node-b";
    dc.name = "sidecar-b";
    dc.workers = workers;
    dc.data_listen = NULL;
    assert_int_equal(dh_dataserver_new(&w->sidecar, &dc), 0);
    assert_int_equal(dh_dataserver_start(w->sidecar), 0);
    uint64_t t0 = dh_clock_now_ns();
    for (;;) {
        dh_coordinator_stats_t st;
        dh_coordinator_stats(w->coord, &st);
        if (st.servers_alive >= 2)
            break;
        assert_true(dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 10);
        cl_nap_ms(2);
    }

    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    cfg.coordinator = dh_coordinator_endpoint(w->coord);
    cfg.zmq_ctx = w->ctx;
    cfg.profiles = cl_write_profiles("p.jsonl", 32);
    cfg.node = "node-a";
    cfg.ranks = 1;
    cfg.batch = 4;
    cfg.seed = 3;
    cfg.prefetch = prefetch;
    cfg.max_steps = steps;
    cfg.next_timeout_ms = 60000;
    cfg.connect_timeout_ms = 10000;
    int rc = dh_client_new(&w->client, &cfg);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
}

static void world_stop(world_t *w)
{
    dh_client_destroy(&w->client);
    dh_dataserver_stop(w->local);
    dh_dataserver_stop(w->sidecar);
    dh_dataserver_destroy(&w->sidecar);
    dh_dataserver_destroy(&w->local);
    dh_coordinator_destroy(&w->coord);
    zmq_ctx_term(w->ctx);
}

/* The sidecar's stats once it has counted n forwards (it counts a forward after handing it
 * to the socket, so the client may hold the batch a moment before). */
static dh_dataserver_stats_t forwarded_stats(world_t *w, uint64_t n)
{
    dh_dataserver_stats_t st;
    uint64_t t0 = dh_clock_now_ns();
    for (;;) {
        dh_dataserver_stats(w->sidecar, &st);
        if (st.forwarded >= n || dh_clock_elapsed_s(t0, dh_clock_now_ns()) > 10)
            return st;
        cl_nap_ms(1);
    }
}

/* A batch's transmission time on the link: its payload bytes stand for / BYTES_SCALE. */
static double transmission_s(const dh_client_batch_t *b)
{
    double bytes = 0;
    for (size_t t = 0; t < b->n_tensors; t++)
        bytes += (double)b->tensors[t].nbytes;
    return bytes / BYTES_SCALE / LINK_BPS;
}

static void link_holds_a_delivery_for_its_transmission(void **state)
{
    world_t w;
    world_start(&w, 1, 1, 1);
    dh_client_batch_t *b = NULL;
    assert_int_equal(dh_client_next(w.client, &b), 0);
    assert_string_equal(b->server, "sidecar-b");
    double took = dh_clock_elapsed_s(b->requested_ns, b->ready_ns), need = transmission_s(b);
    if (!(b->ready_ns > b->requested_ns && took >= need))
        print_error("arrived %.4f s after the request; its transmission takes %.4f s\n", took,
                    need);
    assert_true(b->ready_ns > b->requested_ns && took >= need);
    assert_true(need > 0.01); /* a transmission worth measuring */
    dh_client_batch_release(&b);
    /* the forward crossed nodes: all of its bytes count as such */
    dh_dataserver_stats_t st = forwarded_stats(&w, 1);
    assert_int_equal(st.forwarded, 1);
    assert_true(st.bytes_forwarded > 0);
    assert_int_equal(st.bytes_cross_node, st.bytes_forwarded);
    world_stop(&w);
    cl_assert_no_leftovers();
}

static void link_serialises_deliveries(void **state)
{
    world_t w;
    world_start(&w, 2, 2, 2); /* two workers: both batches produced at about once */
    dh_client_batch_t *b[2] = {NULL, NULL};
    assert_int_equal(dh_client_next(w.client, &b[0]), 0);
    assert_int_equal(dh_client_next(w.client, &b[1]), 0);
    uint64_t first_request =
        b[0]->requested_ns < b[1]->requested_ns ? b[0]->requested_ns : b[1]->requested_ns;
    uint64_t last_arrival = b[0]->ready_ns > b[1]->ready_ns ? b[0]->ready_ns : b[1]->ready_ns;
    double took = dh_clock_elapsed_s(first_request, last_arrival);
    double both = transmission_s(b[0]) + transmission_s(b[1]);
    if (!(took >= both))
        print_error("the later batch arrived %.4f s after the first request; the two "
                    "transmissions take %.4f s\n",
                    took, both);
    assert_true(took >= both);
    dh_client_batch_release(&b[0]);
    dh_client_batch_release(&b[1]);
    dh_dataserver_stats_t st = forwarded_stats(&w, 2);
    assert_int_equal(st.forwarded, 2);
    world_stop(&w);
    cl_assert_no_leftovers();
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(link_holds_a_delivery_for_its_transmission),
    cmocka_unit_test(link_serialises_deliveries),
};
DH_TEST_MAIN(tests)
