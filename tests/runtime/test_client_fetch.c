/* test_client_fetch.c: the fetcher's filing of DELIVERs (client_fetch.c), driven directly:
 * a client made by hand (no threads, no sockets: its ring, lock, counters and one mapping of
 * an arena this test creates, as its local DataServer would) is handed DELIVERs of handles
 * allocated in that arena, exactly what a DataServer's loop sends. A duplicate (a request
 * executed twice after a fault, docs/runtime.md "Failures") or a seq outside the window is
 * dropped, its slabs go back to the arena at once, and it is counted (duplicates_dropped);
 * the copy filed first is kept. Without the check the second copy overwrote the slot: the
 * ledgers still passed, but the first copy's slabs leaked and the counters lied (issue 17). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/shm.h"
#include "datahelix/tensor.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"

#define SLAB ((size_t)64 << 10)
#define ARENA_SIZE ((size_t)1 << 20)

typedef struct rig {
    dh_shm_arena_t *server; /* the DataServer's end: creates and allocates */
    dh_client_t *c;         /* the client, with its own mapping of the arena */
} rig_t;

/* A client with `planned` batches requested, none consumed, fanout `fanout`, a ring of 4
 * batches, and the arena mapped (attached through the memfd, as the notice channel hands
 * it over). */
static void rig_new(rig_t *rig, uint32_t fanout, uint64_t planned)
{
    memset(rig, 0, sizeof *rig);
    assert_int_equal(dh_shm_arena_new(&rig->server, ARENA_SIZE, SLAB), 0);
    dh_client_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    dh_client_config_default(&c->cfg);
    c->cfg.fanout = fanout;
    c->cfg.prefetch = 4;
    c->cfg.prefetch_max = 0;
    snprintf(c->id, sizeof c->id, "%s", "test-node-rank0");
    c->notice_fd = -1;
    c->ring_size = 4 * (size_t)fanout;
    c->ring = calloc(c->ring_size, sizeof *c->ring);
    assert_non_null(c->ring);
    c->planned = planned;
    assert_int_equal(pthread_mutex_init(&c->lock, NULL), 0);
    assert_int_equal(pthread_cond_init(&c->cond, NULL), 0);
    arena_ref_t *a = dh_calloc(1, sizeof *a);
    assert_non_null(a);
    assert_int_equal(dh_shm_arena_attach(&a->arena, dh_shm_arena_fd(rig->server)), 0);
    a->id = dh_shm_arena_id(a->arena);
    atomic_init(&a->refs, 1);
    c->arenas[0] = a;
    c->n_arenas = 1;
    rig->c = c;
}

static void rig_destroy(rig_t *rig)
{
    dh_client_t *c = rig->c;
    for (size_t i = 0; i < c->ring_size; i++)
        dh__client_part_release(&c->ring[i]);
    free(c->ring);
    for (size_t i = 0; i < c->n_arenas; i++)
        dh__client_arena_ref_drop(c->arenas[i]);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
    dh_shm_arena_destroy(&rig->server);
}

/* A request's result as the DataServer sends it: one "payload" tensor of `text` in a fresh
 * allocation held for the client (this pid), and one sample. */
typedef struct delivery {
    dh_wire_tensor_t tensor;
    dh_shm_handle_t handle;
    dh_wire_received_t r;
} delivery_t;

static void deliver_to(rig_t *rig, const char *client_id, uint64_t seq, const char *text,
                       delivery_t *d)
{
    memset(d, 0, sizeof *d);
    size_t len = strlen(text);
    void *ptr = NULL;
    assert_int_equal(dh_shm_arena_alloc(rig->server, len, getpid(), &d->handle, &ptr), 0);
    memcpy(ptr, text, len);
    dh_tensor_t *t = &d->tensor.tensor;
    dh_tensor_set_name(t, "payload");
    t->dtype = DH_DTYPE_UINT8;
    t->ndim = 1;
    t->shape[0] = (int64_t)len;
    dh_tensor_set_contiguous(t);
    d->tensor.location = DH_WIRE_LOC_SHM;
    d->tensor.arena_id = d->handle.arena_id;
    d->tensor.offset = d->handle.offset;
    d->tensor.length = d->handle.length;
    d->tensor.generation = d->handle.generation;
    dh_msg_deliver_t *m = &d->r.msg.deliver;
    d->r.msg.type = DH_MSG_DELIVER;
    m->client_id = (char *)client_id;
    m->seq = seq;
    m->n_tensors = 1;
    m->tensors = &d->tensor;
    m->n_samples = 1;
    m->samples = dh_calloc(1, sizeof *m->samples); /* moved into the part when filed */
    assert_non_null(m->samples);
    m->samples[0].id = dh_strdup(text);
    m->samples[0].error = dh_strdup("");
    assert_non_null(m->samples[0].id);
    m->server = "local";
    dh__client_on_deliver(rig->c, &d->r);
    /* what was not moved is the message's: a dropped DELIVER's samples stay here */
    if (m->samples) {
        dh_free(m->samples[0].id);
        dh_free(m->samples[0].error);
        dh_free(m->samples);
    }
}

static void deliver(rig_t *rig, uint64_t seq, const char *text, delivery_t *d)
{
    deliver_to(rig, rig->c->id, seq, text, d);
}

static dh_shm_arena_stats_t arena_stats(const rig_t *rig)
{
    dh_shm_arena_stats_t s;
    dh_shm_arena_stats(rig->server, &s);
    return s;
}

static dh_client_stats_t client_stats(const rig_t *rig)
{
    dh_client_stats_t s;
    dh_client_stats(rig->c, &s);
    return s;
}

/* The part filed under seq: ready, with that seq, and its payload is `text`. */
static void expect_filed(const rig_t *rig, uint64_t seq, const char *text)
{
    const part_t *p = &rig->c->ring[seq % rig->c->ring_size];
    assert_true(p->ready);
    assert_int_equal(p->seq, seq);
    assert_int_equal(p->n_tensors, 1);
    assert_int_equal(p->tensors[0].nbytes, strlen(text));
    assert_memory_equal(p->tensors[0].data, text, strlen(text));
    assert_int_equal(p->n_samples, 1);
    assert_string_equal(p->samples[0].id, text);
}

/* The same request delivered twice (a request placed again after a fault, executed by both
 * servers): the first copy is kept, the second is dropped, its slabs released, and counted. */
static void duplicate_deliver_is_dropped_and_its_slabs_released(void **state)
{
    rig_t rig;
    rig_new(&rig, 1, 2);
    delivery_t first, second;
    deliver(&rig, 0, "first copy", &first);
    assert_int_equal(arena_stats(&rig).allocations_live, 1);
    assert_int_equal(client_stats(&rig).deliveries, 1);

    deliver(&rig, 0, "second copy", &second);
    /* dropped: the slot keeps the first copy */
    expect_filed(&rig, 0, "first copy");
    /* released: the arena holds only the first copy again; the second's handle is stale */
    dh_shm_arena_stats_t s = arena_stats(&rig);
    assert_int_equal(s.allocations_live, 1);
    assert_int_equal(s.slabs_used - s.slabs_reclaimable, 1);
    assert_int_equal(dh_shm_arena_refcount(rig.server, &first.handle), 1);
    assert_int_equal(dh_shm_arena_refcount(rig.server, &second.handle), -ESTALE);
    /* counted, and not as a delivery */
    dh_client_stats_t cs = client_stats(&rig);
    assert_int_equal(cs.duplicates_dropped, 1);
    assert_int_equal(cs.deliveries, 1);

    /* the first copy is released with its slot, and nothing is left held */
    rig_destroy(&rig);
}

/* A DELIVER for a batch already consumed (below the window) or never requested (at or past
 * its end): dropped, released, counted; the window's slots are untouched. */
static void deliver_outside_the_window_is_dropped_and_its_slabs_released(void **state)
{
    rig_t rig;
    rig_new(&rig, 1, 3);
    delivery_t kept, late, early;
    deliver(&rig, 1, "batch one", &kept);
    rig.c->consumed = 1; /* next() returned batch 0: seq 0 is below the window now */
    deliver(&rig, 0, "batch zero again", &late);
    deliver(&rig, 3, "batch three", &early); /* planned = 3: seq 3 was never requested */
    expect_filed(&rig, 1, "batch one");
    assert_false(rig.c->ring[0].ready);
    assert_false(rig.c->ring[3].ready);
    dh_shm_arena_stats_t s = arena_stats(&rig);
    assert_int_equal(s.allocations_live, 1);
    assert_int_equal(dh_shm_arena_refcount(rig.server, &late.handle), -ESTALE);
    assert_int_equal(dh_shm_arena_refcount(rig.server, &early.handle), -ESTALE);
    dh_client_stats_t cs = client_stats(&rig);
    assert_int_equal(cs.duplicates_dropped, 2);
    assert_int_equal(cs.deliveries, 1);
    rig_destroy(&rig);
}

/* Fanout 2: the batch's last part joins the parts into one copy and gives their slabs back;
 * a duplicate of a part that arrives after the join is still seen as one (its slot keeps
 * its seq), dropped and released, and the joined batch is unchanged. */
static void duplicate_part_after_the_join_is_dropped(void **state)
{
    rig_t rig;
    rig_new(&rig, 2, 1);
    delivery_t p0, p1, again;
    deliver(&rig, 0, "AAAA", &p0);
    deliver(&rig, 1, "BBBBBB", &p1);
    const part_t *q0 = &rig.c->ring[0];
    assert_true(q0->joined);
    assert_int_equal(q0->join_rc, 0);
    assert_int_equal(q0->tensors[0].nbytes, 10);
    assert_memory_equal(q0->tensors[0].data, "AAAABBBBBB", 10);
    assert_int_equal(arena_stats(&rig).allocations_live, 0); /* joined: slabs given back */

    deliver(&rig, 1, "CCCCCC", &again);
    assert_int_equal(arena_stats(&rig).allocations_live, 0);
    assert_int_equal(dh_shm_arena_refcount(rig.server, &again.handle), -ESTALE);
    assert_int_equal(rig.c->ring[1].n_tensors, 0);
    assert_int_equal(q0->tensors[0].nbytes, 10);
    assert_memory_equal(q0->tensors[0].data, "AAAABBBBBB", 10);
    dh_client_stats_t cs = client_stats(&rig);
    assert_int_equal(cs.duplicates_dropped, 1);
    assert_int_equal(cs.deliveries, 2);
    rig_destroy(&rig);
}

/* A DELIVER addressed to another client (a DataServer's bug, or a stale routing id) is
 * refused: not filed, not counted as a delivery, and its slabs go back at once (else they
 * stayed held until this client died). */
static void deliver_for_another_client_is_refused_and_released(void **state)
{
    rig_t rig;
    rig_new(&rig, 1, 2);
    delivery_t stray;
    deliver_to(&rig, "test-node-rank1", 0, "not mine", &stray);
    assert_false(rig.c->ring[0].ready);
    assert_int_equal(arena_stats(&rig).allocations_live, 0);
    assert_int_equal(dh_shm_arena_refcount(rig.server, &stray.handle), -ESTALE);
    assert_int_equal(client_stats(&rig).deliveries, 0);
    rig_destroy(&rig);
}

/* A DELIVER of PART_TENSORS tensors that fails at tensor `at` (out of memory for the copy
 * of a spilled frame, or a stale handle; the others are the client's references on arena
 * allocations): not filed, and every slab of the arena comes back, those of the tensors
 * after `at` too (before, an out-of-memory left them held by this live client, which
 * reclaim_dead never frees). */
#define PART_TENSORS 4

static void deliver_failing_at(rig_t *rig, uint32_t at, bool stale)
{
    static const char frame[] = "a spilled frame";
    dh_wire_tensor_t wire[PART_TENSORS];
    dh_shm_handle_t handles[PART_TENSORS];
    for (uint32_t k = 0; k < PART_TENSORS; k++) {
        dh_wire_tensor_t *w = &wire[k];
        memset(w, 0, sizeof *w);
        dh_tensor_set_name(&w->tensor, "payload");
        w->tensor.dtype = DH_DTYPE_UINT8;
        w->tensor.ndim = 1;
        w->tensor.shape[0] = 100;
        dh_tensor_set_contiguous(&w->tensor);
        if (k == at && !stale) { /* spilled: its bytes come in the message */
            w->location = DH_WIRE_LOC_FRAME;
            w->tensor.shape[0] = (int64_t)sizeof frame;
            dh_tensor_set_contiguous(&w->tensor);
            w->tensor.data = (void *)frame;
            continue;
        }
        void *ptr = NULL;
        assert_int_equal(dh_shm_arena_alloc(rig->server, 100, getpid(), &handles[k], &ptr), 0);
        w->location = DH_WIRE_LOC_SHM;
        w->arena_id = handles[k].arena_id;
        w->offset = handles[k].offset;
        w->length = handles[k].length;
        w->generation = handles[k].generation + (k == at ? 1000 : 0);
    }
    dh_wire_received_t r = {0};
    r.msg.type = DH_MSG_DELIVER;
    dh_msg_deliver_t *m = &r.msg.deliver;
    m->client_id = rig->c->id;
    m->seq = 0;
    m->n_tensors = PART_TENSORS;
    m->tensors = wire;
    m->server = "local";
    long live = dh_alloc_live();
    dh_alloc_fail_after(stale ? -1 : 0); /* the copy of the spilled frame is the first */
    dh__client_on_deliver(rig->c, &r);
    dh_alloc_fail_after(-1);
    assert_int_equal(dh_alloc_live(), live);
    if (stale) /* the server cannot name that allocation: the test drops its reference */
        assert_int_equal(dh_shm_arena_unref(rig->server, &handles[at]), 0);
    assert_false(rig->c->ring[0].ready);
    assert_int_equal(client_stats(rig).deliveries, 0);
    dh_shm_arena_collect(rig->server);
    dh_shm_arena_stats_t s = arena_stats(rig);
    assert_int_equal(s.allocations_live, 0);
    assert_int_equal(s.slabs_used, 0);
}

static void deliver_failing_at_each_tensor_releases_every_slab(void **state)
{
    rig_t rig;
    rig_new(&rig, 1, 2);
    for (uint32_t at = 0; at < PART_TENSORS; at++) {
        deliver_failing_at(&rig, at, false);
        deliver_failing_at(&rig, at, true);
    }
    rig_destroy(&rig);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(duplicate_deliver_is_dropped_and_its_slabs_released),
        cmocka_unit_test(deliver_outside_the_window_is_dropped_and_its_slabs_released),
        cmocka_unit_test(duplicate_part_after_the_join_is_dropped),
        cmocka_unit_test(deliver_for_another_client_is_refused_and_released),
        cmocka_unit_test(deliver_failing_at_each_tensor_releases_every_slab),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
