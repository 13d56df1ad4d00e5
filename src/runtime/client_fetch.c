/* client_fetch.c: a client's fetcher thread (client.c has the threads and the lock).
 *
 * It connects to the rank's local DataServer (its data socket, and its arena socket: the
 * arena's memfd is mapped once, and the connection stays open as the notice channel), and
 * receives DELIVERs on both: each tensor's handle is resolved in the mapped arena (a spilled
 * tensor comes as a frame and is copied), duplicates are dropped, parts are filed in the
 * ring by sequence number, and with fanout > 1 the batch's last part joins the parts into
 * one batch here (dh_collate_rows), so next() does not pay for the copy (emulated: the
 * fetcher then spends emulate_copy_s_per_B per byte joined, the copy of the bytes they stand
 * for, before the batch counts as ready). When the coordinator names another local
 * DataServer, the fetcher reconnects.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/pipeline.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"
#include "runtime/notice.h"
#include "wire/wire_lib.h"

/* Connects the data socket and maps the arena of the DataServer in c->ds (the caller copies
 * it under the lock into `ds`). */
int dh__client_connect_local(dh_client_t *c, const ds_info_t *ds)
{
    int fd = -1, conn = -1;
    int rc = dh__notice_connect(ds->shm_socket, &fd, &conn);
    if (rc)
        return rc;
    dh_shm_arena_t *arena = NULL;
    rc = dh_shm_arena_attach(&arena, fd);
    close(fd);
    if (rc) {
        close(conn);
        return rc;
    }
    /* Name ourselves on the notice channel; without it DELIVERs come over ZeroMQ only. */
    if (dh__notice_name(conn, c->id) != 0) {
        close(conn);
        conn = -1;
    }
    uint64_t id = dh_shm_arena_id(arena);
    bool have = false;
    for (size_t i = 0; i < c->n_arenas; i++)
        if (c->arenas[i]->id == id)
            have = true;
    if (have) {
        dh_shm_arena_destroy(&arena);
    } else {
        if (c->n_arenas == MAX_ARENAS) {
            dh__client_arena_ref_drop(c->arenas[0]);
            memmove(&c->arenas[0], &c->arenas[1], (MAX_ARENAS - 1) * sizeof c->arenas[0]);
            c->n_arenas--;
        }
        arena_ref_t *a = dh_calloc(1, sizeof *a);
        if (!a) {
            dh_shm_arena_destroy(&arena);
            if (conn >= 0)
                close(conn);
            return dh__set_error(DH_ENOMEM, "out of memory for an arena mapping");
        }
        a->arena = arena;
        a->id = id;
        atomic_init(&a->refs, 1);
        c->arenas[c->n_arenas++] = a;
    }
    dh_wire_socket_t *sock = NULL;
    dh_wire_socket_opts_t opts = {.keys = c->keys};
    if ((rc = dh_wire_socket_new(&sock, c->ctx, ZMQ_DEALER, &opts)) ||
        (rc = dh__wire_set_routing_id(sock, c->id)) ||
        (rc = dh_wire_socket_connect(sock, ds->endpoint))) {
        dh_wire_socket_destroy(&sock);
        if (conn >= 0)
            close(conn);
        return rc;
    }
    dh_msg_t m = dh__client_hello(c);
    if ((rc = dh_wire_send(sock, NULL, 0, &m, NULL, 0, 1000))) {
        dh_wire_socket_destroy(&sock);
        if (conn >= 0)
            close(conn);
        return rc;
    }
    dh_wire_socket_destroy(&c->data);
    c->data = sock;
    if (c->notice_fd >= 0)
        close(c->notice_fd);
    c->notice_fd = conn;
    return 0;
}

arena_ref_t *dh__client_arena_by_id(dh_client_t *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_arenas; i++)
        if (c->arenas[i]->id == id)
            return c->arenas[i];
    return NULL;
}

/* Releases the slabs of a DELIVER's tensors `from` onwards, which will not be used (the
 * DataServer handed this client a reference on each). */
static void drop_deliver_from(dh_client_t *c, const dh_msg_deliver_t *m, uint32_t from)
{
    for (uint32_t i = from; i < m->n_tensors; i++) {
        const dh_wire_tensor_t *t = &m->tensors[i];
        arena_ref_t *a =
            t->location == DH_WIRE_LOC_SHM ? dh__client_arena_by_id(c, t->arena_id) : NULL;
        if (a) {
            dh_shm_handle_t h = {t->arena_id, t->offset, t->length, t->generation};
            dh_shm_arena_unref(a->arena, &h);
        }
    }
}

/* Joins the parts' tensors along dimension 0 (dh_collate_rows: the other dimensions padded
 * to the largest) into heap copies that replace parts[0]'s tensors; every part's slabs are
 * given back at once (the copies hold the data), the parts keep their samples. Runs on the
 * fetcher thread when the batch's last part arrives, so next() does not pay for the copy
 * (fanout > 1). A part whose samples all failed comes with no tensors (nothing to map): it
 * keeps its samples' slots as zero rows of every per-sample tensor (dimension 0 = the
 * samples, as frames and mask; a tensor like the synthetic payload gets no rows from it).
 * On failure the parts are left as they were and the message is returned in *why. */
int dh__client_join_parts(part_t *parts, size_t n_parts, uint64_t batch, char *why, size_t why_cap)
{
    part_t *p0 = &parts[0];
    size_t ref = 0; /* the first part with tensors: the names, dtypes and ranks */
    while (ref < n_parts && parts[ref].n_tensors == 0)
        ref++;
    dh_tensor_t out[DH__RT_MAX_TENSORS] = {0};
    int rc = 0;
    size_t n_tensors = ref < n_parts ? parts[ref].n_tensors : 0;
    const dh_tensor_t *column[n_parts ? n_parts : 1]; /* n_parts = fanout <= batch */
    int64_t gap_rows[n_parts ? n_parts : 1];
    for (size_t t = 0; t < n_tensors; t++) {
        const dh_tensor_t *o = &parts[ref].tensors[t];
        bool per_sample = o->shape[0] == (int64_t)parts[ref].n_samples;
        size_t bad = ref;
        for (size_t k = 0; k < n_parts; k++) {
            column[k] = parts[k].n_tensors ? &parts[k].tensors[t] : NULL;
            gap_rows[k] = per_sample && !column[k] ? (int64_t)parts[k].n_samples : 0;
            if (parts[k].n_tensors && parts[k].n_tensors != n_tensors) {
                rc = DH_EINVAL;
                bad = k;
                break;
            }
        }
        if (rc == 0)
            rc = dh_collate_rows(column, gap_rows, n_parts, &out[t], &bad);
        if (rc == DH_EINVAL) {
            rc = DH_EPARSE;
            snprintf(why, why_cap,
                     "batch %llu: part %zu's tensor '%.31s' does not match part %zu's",
                     (unsigned long long)batch, bad, o->name, ref);
            goto fail;
        }
        if (rc) {
            snprintf(why, why_cap, "batch %llu: out of memory joining %zu parts (%zu bytes)",
                     (unsigned long long)batch, n_parts, out[t].nbytes);
            goto fail;
        }
    }
    for (size_t k = 0; k < n_parts; k++)
        dh__client_part_release_tensors(&parts[k]);
    for (size_t t = 0; t < n_tensors; t++) {
        p0->tensors[t] = out[t];
        p0->copies[t] = out[t].data;
    }
    p0->n_tensors = n_tensors;
    return 0;
fail:
    for (size_t t = 0; t < DH__RT_MAX_TENSORS; t++)
        dh_tensor_clear(&out[t]);
    return rc;
}

static void sleep_s(double s)
{
    if (!(s > 0))
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int dh__client_join(dh_client_t *c, part_t *parts, uint32_t n_parts, uint64_t batch, char *why,
                    size_t why_cap)
{
    int rc = dh__client_join_parts(parts, n_parts, batch, why, why_cap);
    if (rc == 0) {
        uint64_t bytes = 0;
        for (size_t t = 0; t < parts[0].n_tensors; t++)
            bytes += parts[0].tensors[t].nbytes;
        dh__count(&c->counters.copy_bytes, bytes);
        /* the emulated copy of the bytes these stand for: the batch is ready after it */
        sleep_s((double)bytes * c->cfg.emulate_copy_s_per_B);
    }
    return rc;
}

int dh__client_part_from_deliver(dh_client_t *c, dh_msg_deliver_t *m, part_t *out,
                                 uint64_t *copied_out)
{
    part_t p = {0};
    p.seq = m->seq;
    uint64_t copied = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dh_wire_tensor_t *t = &m->tensors[i];
        void *ptr = NULL;
        dh_shm_handle_t h = {0};
        if (t->location == DH_WIRE_LOC_FRAME) {
            /* spilled by a DataServer whose arena stayed full: keep a copy of the frame */
            size_t size = t->tensor.nbytes;
            ptr = dh_malloc(size ? size : 1);
            if (!ptr) {
                dh_log_warn("client '%s': batch %llu: out of memory for tensor '%s'; dropped",
                            c->id, (unsigned long long)m->seq, t->tensor.name);
                drop_deliver_from(c, m, i + 1); /* the slabs of the tensors not reached */
                dh__client_part_release(&p);
                return DH_ENOMEM;
            }
            if (size)
                memcpy(ptr, t->tensor.data, size);
            p.copies[i] = ptr;
            copied++;
        } else {
            arena_ref_t *a = dh__client_arena_by_id(c, t->arena_id);
            h = (dh_shm_handle_t){t->arena_id, t->offset, t->length, t->generation};
            if (!a || (p.arena && p.arena != a) || dh_shm_arena_resolve(a->arena, &h, &ptr) != 0) {
                dh_log_warn("client '%s': batch %llu: tensor '%s' is not a valid handle of a "
                            "mapped arena (%s); dropped",
                            c->id, (unsigned long long)m->seq, t->tensor.name,
                            a ? dh_last_error() : "unknown arena");
                drop_deliver_from(c, m, i + 1);
                if (a && !(p.arena && p.arena != a))
                    dh_shm_arena_unref(a->arena, &h);
                dh__client_part_release(&p);
                return DH_EINVAL;
            }
            if (!p.arena) {
                p.arena = a;
                atomic_fetch_add(&a->refs, 1);
            }
        }
        p.handles[i] = h;
        p.tensors[i] = t->tensor; /* the decoded tensor as it is, its data resolved */
        p.tensors[i].data = ptr;
        p.n_tensors++;
    }
    p.n_samples = m->n_samples;
    p.samples = m->samples; /* moved */
    m->samples = NULL;
    m->n_samples = 0;
    snprintf(p.server, NAME_CAP, "%s", m->server ? m->server : "");
    p.ready_ns = m->ready_ns;
    p.received_ns = dh_clock_now_ns();
    p.ready = true;
    *out = p;
    *copied_out = copied;
    return 0;
}

void dh__client_on_deliver(dh_client_t *c, dh_wire_received_t *r)
{
    dh_msg_deliver_t *m = &r->msg.deliver;
    if (m->n_tensors > DH__RT_MAX_TENSORS || strcmp(m->client_id, c->id) != 0) {
        dh_log_warn("client '%s': refused a DELIVER for '%s' with %u tensors", c->id, m->client_id,
                    m->n_tensors);
        drop_deliver_from(c, m, 0);
        return;
    }
    part_t p = {0};
    uint64_t copied = 0;
    if (dh__client_part_from_deliver(c, m, &p, &copied) != 0)
        return;
    if (p.seq & RB_SEQ_BIT) { /* a part moved here from another node (tier 2) */
        dh__count(&c->counters.copied_tensors, copied);
        dh__client_rb_on_moved(c, &p);
        return;
    }

    uint32_t parts = c->cfg.fanout;
    double arena_used = -1;
    if (c->cfg.prefetch_max > c->cfg.prefetch && p.arena) { /* O(slabs): 512 for 512 MiB */
        dh_shm_arena_stats_t as;
        dh_shm_arena_stats(p.arena->arena, &as);
        if (as.slabs_total)
            arena_used = (double)(as.slabs_used - as.slabs_reclaimable) / (double)as.slabs_total;
    }
    pthread_mutex_lock(&c->lock);
    if (arena_used >= 0)
        c->arena_used = arena_used;
    uint64_t lo = c->consumed * parts, hi = c->planned * parts;
    part_t *slot = &c->ring[p.seq % c->ring_size];
    bool dup = p.seq < lo || p.seq >= hi || (slot->ready && slot->seq == p.seq);
    if (!dup) {
        *slot = p;
        dh__count(&c->counters.deliveries, 1);
        dh__count(&c->counters.copied_tensors, copied);
    } else {
        dh__count(&c->counters.duplicates_dropped, 1);
    }
    /* fanout > 1: the batch's last part joins the batch, here rather than in next() */
    part_t *held = NULL;
    uint64_t batch = p.seq / parts;
    bool join = !dup && parts > 1 && !c->rb.on; /* tier 2 joins once the round is applied */
    for (uint32_t k = 0; join && k < parts; k++) {
        part_t *q = &c->ring[(batch * parts + k) % c->ring_size];
        join = q->ready && q->seq == batch * parts + k && !q->joined;
    }
    if (join && !(held = dh_calloc(parts, sizeof *held))) {
        part_t *q0 = &c->ring[(batch * parts) % c->ring_size];
        q0->joined = true;
        q0->join_rc = DH_ENOMEM;
        snprintf(q0->join_error, sizeof q0->join_error,
                 "batch %llu: out of memory joining %u parts", (unsigned long long)batch, parts);
        join = false;
    }
    if (join)
        for (uint32_t k = 0; k < parts; k++) {
            /* moved out; the slots stay ready with their seq, so a duplicate of one of
             * these requests is still seen as one, and next() waits for `joined` */
            part_t *q = &c->ring[(batch * parts + k) % c->ring_size];
            held[k] = *q;
            memset(q, 0, sizeof *q);
            q->ready = true;
            q->seq = batch * parts + k;
        }
    pthread_mutex_unlock(&c->lock);
    if (join) {
        char why[sizeof held->join_error] = "";
        int rc = dh__client_join(c, held, parts, batch, why, sizeof why);
        pthread_mutex_lock(&c->lock);
        for (uint32_t k = 0; k < parts; k++) {
            part_t *q = &c->ring[(batch * parts + k) % c->ring_size];
            *q = held[k];
        }
        part_t *q0 = &c->ring[(batch * parts) % c->ring_size];
        q0->joined = true;
        q0->join_rc = rc;
        snprintf(q0->join_error, sizeof q0->join_error, "%s", why);
        pthread_mutex_unlock(&c->lock);
        dh_free(held);
    }
    /* after the unlock: a waiter woken under the lock would only block on it again */
    if (!dup)
        pthread_cond_broadcast(&c->cond);
    if (dup) {
        dh_log_debug("client '%s': duplicate delivery of request %llu dropped", c->id,
                     (unsigned long long)p.seq);
        dh__client_part_release(&p);
    }
}

/* The notice channel is readable: one DELIVER packet, or the DataServer's end (it died or
 * stopped; the coordinator will name its successor). */
static void notice_receive(dh_client_t *c)
{
    dh_wire_received_t r = {0};
    int got = dh__notice_receive(c->notice_fd, c->id, &r.msg);
    if (got < 0) {
        close(c->notice_fd);
        c->notice_fd = -1;
        return;
    }
    if (got == DH__NOTICE_AGAIN) { /* out of memory: the packet stays queued; a pause, again */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        return;
    }
    if (got == 1 && r.msg.type == DH_MSG_DELIVER) {
        dh__count(&c->counters.notices, 1);
        dh__client_on_deliver(c, &r);
    }
    dh_wire_received_release(&r);
}

/* A DELIVER the DataServer sent before it read this client's GOODBYE holds slabs referenced
 * for this process: unread, they would stay until the process exits (the reclaim frees only
 * a dead holder's), which leaked a slab in a process that keeps its DataServer (an embedded
 * cluster) when a batch was delivered while the loader closed. The DataServer answers GOODBYE
 * on the data socket after every DELIVER it sent there, and writes its notices before it
 * reads the GOODBYE, so once the answer is in, what is left in the notice channel is all. */
void dh__client_drain_after_goodbye(dh_client_t *c)
{
    if (!c->data)
        return;
    uint64_t t0 = dh_clock_now_ns();
    bool answered = false, stalled = false;
    for (;;) {
        long left_ms = 1000 - (long)(dh_clock_elapsed_s(t0, dh_clock_now_ns()) * 1000);
        if (left_ms <= 0 && (!answered || stalled))
            break; /* (a notice left unread for lack of memory: the process's exit frees it) */
        if (answered)
            left_ms = 0; /* the notices already written, then done */
        zmq_pollitem_t items[2] = {{NULL, c->notice_fd, ZMQ_POLLIN, 0},
                                   {dh_wire_socket_handle(c->data), 0, ZMQ_POLLIN, 0}};
        int first = c->notice_fd >= 0 ? 0 : 1, n = answered ? 1 - first : 2 - first;
        if (n <= 0)
            break;
        int ready = zmq_poll(items + first, n, left_ms);
        if (ready < 0 && zmq_errno() == EINTR)
            continue;
        if (ready <= 0)
            break;
        if (first == 0 && (items[0].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) {
            dh_msg_t m = {0};
            int got = dh__notice_receive(c->notice_fd, c->id, &m);
            stalled = got == DH__NOTICE_AGAIN;
            if (got < 0) {
                close(c->notice_fd);
                c->notice_fd = -1;
            } else if (stalled) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            } else if (got == 1) {
                if (m.type == DH_MSG_DELIVER)
                    drop_deliver_from(c, &m.deliver, 0);
                dh_msg_clear(&m);
            }
        }
        if (!answered && (items[1].revents & ZMQ_POLLIN)) {
            dh_wire_received_t r = {0};
            if (dh_wire_recv(c->data, 0, &r) == 0) {
                if (r.msg.type == DH_MSG_DELIVER)
                    drop_deliver_from(c, &r.msg.deliver, 0);
                else if (r.msg.type == DH_MSG_GOODBYE)
                    answered = true;
                dh_wire_received_release(&r);
            }
        }
    }
}

void *dh__client_fetcher_main(void *arg)
{
    dh_client_t *c = arg;
    dh_wire_received_t r = {0};
    uint64_t generation;
    pthread_mutex_lock(&c->lock);
    generation = c->ds.generation;
    pthread_mutex_unlock(&c->lock);
    while (!atomic_load(&c->stop)) {
        pthread_mutex_lock(&c->lock);
        ds_info_t ds = c->ds;
        pthread_mutex_unlock(&c->lock);
        if (ds.generation != generation) {
            if (dh__client_connect_local(c, &ds) == 0) {
                generation = ds.generation;
                dh_log_info("client '%s': connected to local DataServer '%s'", c->id, ds.name);
            } else {
                dh_log_warn("client '%s': cannot connect to local DataServer '%s' (%s): %s", c->id,
                            ds.name, ds.endpoint, dh_last_error());
                struct timespec ts = {0, 100000000};
                nanosleep(&ts, NULL);
                continue;
            }
        }
        zmq_pollitem_t items[3] = {
            {dh_wire_socket_handle(c->data), 0, ZMQ_POLLIN, 0},
            {NULL, c->notice_fd, ZMQ_POLLIN, 0},
            {c->rb.sock ? dh_wire_socket_handle(c->rb.sock) : NULL, -1, ZMQ_POLLIN, 0}};
        /* the tier-2 socket, when there is one, is the last item (without a notice
         * channel, in the second place) */
        int n_items = 1;
        if (c->notice_fd >= 0)
            n_items++;
        if (c->rb.sock) {
            if (n_items == 1)
                items[1] = items[2];
            n_items++;
        }
        if (c->rb.on)
            dh__client_rb_progress(c);
        if (zmq_poll(items, n_items, c->rb.on ? 5 : 50) <= 0)
            continue;
        if (c->rb.sock && (items[n_items - 1].revents & ZMQ_POLLIN)) {
            while (dh_wire_recv(c->rb.sock, 0, &r) == 0) {
                if (r.msg.type == DH_MSG_REBALANCE)
                    dh__client_rb_on_message(c, &r);
                dh_wire_received_release(&r);
            }
        }
        if (c->notice_fd >= 0 && (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            notice_receive(c);
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        int rc = dh_wire_recv(c->data, 0, &r);
        if (rc == DH_EPARSE) {
            dh_log_warn("client '%s': dropped a malformed message: %s", c->id, dh_last_error());
            continue;
        }
        if (rc)
            continue;
        if (r.msg.type == DH_MSG_DELIVER)
            dh__client_on_deliver(c, &r);
        dh_wire_received_release(&r);
    }
    return NULL;
}
