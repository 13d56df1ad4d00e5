/* test_forward.c: a sidecar's forwarding never stalls its loop (forward.c, "The loop never
 * waits on a link"). The test plays the coordinator itself (a ROUTER the sidecar, a
 * DataServer thread of this process, registers with) and hands the sidecar DISPATCHes whose
 * target is a ROUTER that never reads: after its pipes and the TCP buffers fill, the link's
 * socket would block. The sidecar must go on heartbeating at its period (before, each send
 * to a full link waited up to 1 s on the loop, and the gaps let the coordinator declare a
 * live server dead), and drop what its link has not taken within the stall limit, counting
 * it undeliverable. Every wait is a receive with a timeout. */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "cluster.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "wire/internal.h"

#define HEARTBEAT_MS 50
#define DISPATCHES 64
#define SAMPLE_BYTES (1u << 20)

static void sidecar_heartbeats_while_its_link_is_full(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    assert_non_null(ctx);
    /* the coordinator (this test) */
    dh_wire_socket_t *coord = NULL;
    char coord_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://forward-test-coord-%d", (int)getpid());
    assert_int_equal(dh_wire_socket_new(&coord, ctx, ZMQ_ROUTER, NULL), 0);
    assert_int_equal(dh_wire_socket_bind(coord, coord_ep), 0);
    /* the target that never reads, with the smallest queue */
    dh_wire_socket_t *target = NULL;
    char target_ep[128];
    assert_int_equal(dh_wire_socket_new(&target, ctx, ZMQ_ROUTER, NULL), 0);
    int one = 1;
    assert_int_equal(zmq_setsockopt(dh_wire_socket_handle(target), ZMQ_RCVHWM, &one, sizeof one),
                     0);
    assert_int_equal(
        zmq_setsockopt(dh_wire_socket_handle(target), ZMQ_RCVBUF, &(int){4096}, sizeof(int)), 0);
    assert_int_equal(dh_wire_socket_bind(target, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(dh__wire_last_endpoint(target, target_ep, sizeof target_ep), 0);

    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = coord_ep;
    dc.role = DH_DS_REMOTE;
    dc.node = "spare";
    dc.name = "sidecar";
    dc.workers = 2;
    dc.pipeline_json = "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":1}";
    dc.heartbeat_ms = HEARTBEAT_MS;
    dc.zmq_ctx = ctx;
    dh_dataserver_t *ds = NULL;
    assert_int_equal(dh_dataserver_new(&ds, &dc), 0);
    assert_int_equal(dh_dataserver_start(ds), 0);

    /* its HELLO */
    dh_wire_received_t r = {0};
    assert_int_equal(dh_wire_recv(coord, 10000, &r), 0);
    assert_int_equal(r.msg.type, DH_MSG_HELLO);
    char peer[256];
    size_t peer_len = r.routing_id_size;
    memcpy(peer, r.routing_id, peer_len);
    dh_wire_received_release(&r);

    /* DISPATCHes of 1 MiB samples to the target */
    for (uint32_t i = 0; i < DISPATCHES; i++) {
        char id[32];
        snprintf(id, sizeof id, "s%u", i);
        dh_wire_sample_t sample = {
            .id = id, .uri = "synthetic", .key = "", .out_bytes = SAMPLE_BYTES, .tokens = 1};
        dh_msg_t m = {.type = DH_MSG_DISPATCH};
        m.dispatch.request = (dh_msg_request_t){.client_id = "rank-0",
                                                .seq = i,
                                                .deadline_ns = 1000000000,
                                                .delivery_node = "train",
                                                .n_samples = 1,
                                                .samples = &sample};
        m.dispatch.server = "sidecar";
        m.dispatch.target = "target";
        m.dispatch.target_endpoint = target_ep;
        assert_int_equal(dh_wire_send(coord, peer, peer_len, &m, NULL, 0, 1000), 0);
    }

    /* Heartbeats for 3 s (the stall limit three times over): no gap near the old 1 s wait */
    uint64_t start = dh_clock_now_ns(), last = start, worst_gap = 0;
    unsigned heartbeats = 0, completes = 0;
    while (dh_clock_elapsed_s(start, dh_clock_now_ns()) < 3.0) {
        int rc = dh_wire_recv(coord, 2000, &r);
        assert_int_equal(rc, 0);
        if (r.msg.type == DH_MSG_HEARTBEAT) {
            uint64_t now = dh_clock_now_ns();
            if (now - last > worst_gap)
                worst_gap = now - last;
            last = now;
            heartbeats++;
        } else if (r.msg.type == DH_MSG_COMPLETE) {
            completes++;
        }
        dh_wire_received_release(&r);
    }
    dh_dataserver_stats_t st;
    dh_dataserver_stats(ds, &st);
    print_message("heartbeats %u, worst gap %.0f ms, executed %llu, forwarded %llu, "
                  "undeliverable %llu\n",
                  heartbeats, (double)worst_gap / 1e6, (unsigned long long)st.tasks,
                  (unsigned long long)st.forwarded, (unsigned long long)st.undeliverable);
    assert_int_equal(completes, DISPATCHES); /* every request ran */
    /* the link filled: some were not taken and were dropped after the stall limit */
    assert_true(st.forwarded < DISPATCHES);
    assert_true(st.undeliverable >= 1);
    /* a loop that waited 1 s on the link would leave a gap of 1 s or more */
    assert_true(worst_gap < 900000000ull);
    assert_true(heartbeats >= 3000 / HEARTBEAT_MS / 4);

    dh_dataserver_destroy(&ds);
    dh_wire_socket_destroy(&target);
    dh_wire_socket_destroy(&coord);
    assert_int_equal(zmq_ctx_term(ctx), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sidecar_heartbeats_while_its_link_is_full),
};
DH_TEST_MAIN(tests)
