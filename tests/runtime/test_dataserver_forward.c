/* test_dataserver_forward.c: a sidecar's forwarding never stalls its loop (dataserver_forward.c,
 * "The loop never waits on a link"). The test plays the coordinator itself (a ROUTER the sidecar, a
 * DataServer thread of this process, registers with) and hands the sidecar DISPATCHes whose
 * target is a ROUTER that never reads: after its pipes and the TCP buffers fill, the link's
 * socket would block. The sidecar must go on heartbeating at its period (before, each send
 * to a full link waited up to 1 s on the loop, and the gaps let the coordinator declare a
 * live server dead), and drop what its link has not taken within the stall limit, counting
 * it undeliverable. Every wait is a receive with a timeout.
 *
 * A tier-2 REBALANCE SEND hands the local DataServer the client's references on every
 * tensor of a part (dataserver_forward.c, dh__ds_rebalance_send): a failure at any tensor (out of
 * memory for its copy, a bad handle) must drop the references on every tensor, and count
 * the part undeliverable. The test calls the loop's function directly on a DataServer that
 * is not started (no thread but the test's touches it), failing each allocation in turn and
 * each tensor's handle in turn, and checks that every slab of the arena comes back. */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "cluster.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/runtime.h"
#include "datahelix/shm.h"
#include "datahelix/tensor.h"
#include "datahelix/wire.h"
#include "runtime/dataserver_internal.h"
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

/* ---- tier 2: no slab leaks when a part fails half-way ---- */

#define PART_TENSORS 4
#define TENSOR_BYTES ((size_t)3 << 20) /* three slabs of 1 MiB each */

/* How tensor `at` of a part fails: */
typedef enum {
    FAIL_NONE,
    FAIL_ALLOCATION,      /* allocation number `at` of the server fails */
    FAIL_STALE_HANDLE,    /* its handle does not validate (-ESTALE) */
    FAIL_OVERSIZED_TENSOR /* its handle is valid, its tensor longer than the allocation */
} fail_t;

typedef struct leak_world {
    void *ctx;
    dh_wire_socket_t *target; /* the receiving node's DataServer (this test) */
    char target_ep[128];
    dh_dataserver_t *ds; /* the sending node's local DataServer, not started */
    unsigned sent;       /* parts sent so far */
} leak_world_t;

static void leak_world_start(leak_world_t *w)
{
    memset(w, 0, sizeof *w);
    w->ctx = zmq_ctx_new();
    assert_non_null(w->ctx);
    snprintf(w->target_ep, sizeof w->target_ep, "inproc://forward-leak-target-%d", (int)getpid());
    assert_int_equal(dh_wire_socket_new(&w->target, w->ctx, ZMQ_ROUTER, NULL), 0);
    assert_int_equal(dh_wire_socket_bind(w->target, w->target_ep), 0);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = "inproc://forward-leak-coordinator-nobody";
    dc.role = DH_DS_LOCAL;
    dc.node = "train-a";
    dc.name = "local-a";
    dc.workers = 0;
    dc.arena_bytes = 64u << 20;
    dc.pipeline_json = "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":1}";
    dc.zmq_ctx = w->ctx;
    assert_int_equal(dh_dataserver_new(&w->ds, &dc), 0);
}

static void leak_world_stop(leak_world_t *w)
{
    dh_dataserver_destroy(&w->ds);
    dh_wire_socket_destroy(&w->target);
    assert_int_equal(zmq_ctx_term(w->ctx), 0);
}

/* Every slab of the arena is free (released allocations collected). */
static void assert_arena_empty(leak_world_t *w)
{
    dh_shm_arena_collect(w->ds->arena);
    dh_shm_arena_stats_t st;
    dh_shm_arena_stats(w->ds->arena, &st);
    assert_int_equal(st.allocations_live, 0);
    assert_int_equal(st.slabs_used, 0);
}

/* A client's REBALANCE SEND of one part of PART_TENSORS arena tensors, the client's
 * reference on each handed over, failing as `fail` and `at` say (a stale handle: the test
 * drops that reference itself, the server cannot name the allocation). *made: the server's
 * allocations. Returns whether the part was forwarded (the test receives it), else it was
 * counted undeliverable; either way every slab of the arena has come back. */
static bool send_part(leak_world_t *w, fail_t fail, uint32_t at, long *made)
{
    dh_shm_handle_t handles[PART_TENSORS];
    dh_wire_tensor_t wire[PART_TENSORS];
    for (uint32_t k = 0; k < PART_TENSORS; k++) {
        void *ptr = NULL;
        assert_int_equal(
            dh_shm_arena_alloc(w->ds->arena, TENSOR_BYTES, getpid(), &handles[k], &ptr), 0);
        memset(ptr, (int)k + 1, TENSOR_BYTES);
        dh_wire_tensor_t *t = &wire[k];
        memset(t, 0, sizeof *t);
        dh_tensor_set_name(&t->tensor, "payload");
        t->tensor.dtype = DH_DTYPE_UINT8;
        t->tensor.ndim = 1;
        t->tensor.shape[0] = (int64_t)TENSOR_BYTES;
        dh_tensor_set_contiguous(&t->tensor);
        t->location = DH_WIRE_LOC_SHM;
        t->arena_id = handles[k].arena_id;
        t->offset = handles[k].offset;
        t->length = handles[k].length;
        t->generation = handles[k].generation;
    }
    if (fail == FAIL_STALE_HANDLE)
        wire[at].generation += 1000; /* fails validation: resolve says -ESTALE */
    if (fail == FAIL_OVERSIZED_TENSOR)
        wire[at].tensor.nbytes = TENSOR_BYTES + 1;
    dh_wire_rb_part_t part = {.rank = 0, .n_tensors = PART_TENSORS, .tensors = wire};
    dh_msg_rebalance_t m = {.kind = DH_RB_SEND,
                            .client_id = "rank-1",
                            .node = "train-b",
                            .endpoint = w->target_ep,
                            .seq = 1000 + w->sent,
                            .reason = "",
                            .n_parts = 1,
                            .parts = &part};
    dh_dataserver_stats_t before, after;
    dh_dataserver_stats(w->ds, &before);
    dh_alloc_reset_count();
    dh_alloc_fail_after(fail == FAIL_ALLOCATION ? (long)at : -1);
    dh__ds_rebalance_send(w->ds, "rank-0", &m);
    dh_alloc_fail_after(-1);
    if (made)
        *made = dh_alloc_count();
    dh_dataserver_stats(w->ds, &after);
    w->sent++;
    if (fail == FAIL_STALE_HANDLE) /* the client's reference on the allocation it named wrongly */
        assert_int_equal(dh_shm_arena_unref(w->ds->arena, &handles[at]), 0);
    uint64_t forwarded = after.forwarded - before.forwarded;
    uint64_t undeliverable = after.undeliverable - before.undeliverable;
    assert_int_equal(forwarded + undeliverable, 1); /* every part is accounted for */
    if (forwarded) { /* it reached the target whole, copied out of the arena */
        dh_wire_received_t r = {0};
        assert_int_equal(dh_wire_recv(w->target, 5000, &r), 0);
        assert_int_equal(r.msg.type, DH_MSG_DELIVER);
        assert_int_equal(r.msg.deliver.seq, 1000 + w->sent - 1);
        assert_int_equal(r.msg.deliver.n_tensors, PART_TENSORS);
        for (uint32_t k = 0; k < PART_TENSORS; k++) {
            const dh_wire_tensor_t *t = &r.msg.deliver.tensors[k];
            assert_int_equal(t->location, DH_WIRE_LOC_FRAME);
            assert_int_equal(t->tensor.nbytes, TENSOR_BYTES);
            assert_int_equal(((const unsigned char *)t->tensor.data)[TENSOR_BYTES - 1], k + 1);
        }
        dh_wire_received_release(&r);
    }
    /* the arena's slabs all came back: no reference of the part is left anywhere */
    assert_arena_empty(w);
    return forwarded != 0;
}

static void rebalance_send_releases_every_slab_on_failure(void **state)
{
    (void)state;
    leak_world_t w;
    leak_world_start(&w);
    /* the link to the target is made on first use: once, before the counts below */
    assert_true(send_part(&w, FAIL_NONE, 0, NULL));
    long live = dh_alloc_live();

    /* allocation N fails, for each N until a run completes: the first PART_TENSORS are the
     * copies of the tensors (tensor N fails), the rest are the delivery's (held, encoded,
     * sent); each failure drops the part, counted undeliverable, and gives back its slabs */
    long failures = 0;
    for (uint32_t n = 0;; n++) {
        long made = 0;
        bool delivered = send_part(&w, FAIL_ALLOCATION, n, &made);
        if (n < PART_TENSORS)
            assert_false(delivered);             /* the copy of tensor n failed */
        assert_int_equal(dh_alloc_live(), live); /* the copies made before are freed */
        if (made <= (long)n) {                   /* nothing failed: the run completed */
            assert_true(delivered);
            break;
        }
        if (!delivered)
            failures++;
    }
    assert_true(failures >= PART_TENSORS);

    /* a bad handle at each tensor: the others' references are dropped all the same */
    for (uint32_t at = 0; at < PART_TENSORS; at++) {
        assert_false(send_part(&w, FAIL_STALE_HANDLE, at, NULL));
        assert_false(send_part(&w, FAIL_OVERSIZED_TENSOR, at, NULL));
        assert_int_equal(dh_alloc_live(), live);
    }
    assert_true(send_part(&w, FAIL_NONE, 0, NULL)); /* and the link still works */
    leak_world_stop(&w);
}

/* The other end: a forwarded DELIVER of PART_TENSORS frames that fails at tensor `at` (a
 * tensor that is not a payload frame, or one larger than the whole arena) is refused,
 * counted undeliverable, and the slabs placed for the tensors before it come back. */
static void place_forwarded_releases_every_slab_on_failure(void **state)
{
    (void)state;
    leak_world_t w;
    leak_world_start(&w);
    static unsigned char frame[4096];
    for (int oversized = 0; oversized < 2; oversized++)
        for (uint32_t at = 0; at < PART_TENSORS; at++) {
            dh_wire_tensor_t wire[PART_TENSORS];
            for (uint32_t k = 0; k < PART_TENSORS; k++) {
                dh_wire_tensor_t *t = &wire[k];
                memset(t, 0, sizeof *t);
                dh_tensor_set_name(&t->tensor, "payload");
                t->tensor.dtype = DH_DTYPE_UINT8;
                t->tensor.ndim = 1;
                t->tensor.shape[0] = (int64_t)sizeof frame;
                dh_tensor_set_contiguous(&t->tensor);
                t->location = DH_WIRE_LOC_FRAME;
                t->tensor.data = frame;
            }
            if (oversized) /* never read: its placement fails first (DH_ERANGE) */
                wire[at].tensor.nbytes = (size_t)1 << 30;
            else
                wire[at].location = DH_WIRE_LOC_SHM;
            dh_wire_received_t r = {0};
            r.msg.type = DH_MSG_DELIVER;
            r.msg.deliver.client_id = "rank-0";
            r.msg.deliver.seq = at;
            r.msg.deliver.n_tensors = PART_TENSORS;
            r.msg.deliver.tensors = wire;
            r.msg.deliver.server = "sidecar";
            dh_dataserver_stats_t before, after;
            dh_dataserver_stats(w.ds, &before);
            /* since 0: past every grace, so it is placed (or refused) now */
            assert_true(dh__ds_place_forwarded(w.ds, &r, "sidecar", 0));
            dh_dataserver_stats(w.ds, &after);
            assert_int_equal(after.undeliverable - before.undeliverable, 1);
            assert_arena_empty(&w);
        }
    leak_world_stop(&w);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sidecar_heartbeats_while_its_link_is_full),
    cmocka_unit_test(rebalance_send_releases_every_slab_on_failure),
    cmocka_unit_test(place_forwarded_releases_every_slab_on_failure),
};
DH_TEST_MAIN(tests)
