/* client_rebalance_move.c: applying a tier-2 round's assignment to this rank's ring
 * (docs/rebalancing.md). Each part leaving this rank gives its ring slot to a part coming in
 * (in slot order, per batch). On one node the incoming part's slabs change owner: this
 * client takes a reference for itself (dh_shm_arena_ref_for) and drops the sender's, which
 * the sender no longer holds; no byte is copied. From another node, the sender's DataServer
 * forwards the bytes (REBALANCE SEND, dataserver_forward.c) and the part arrives as a DELIVER
 * under RB_SEQ_BIT | round << 24 | its index; or, with an exchange_fn (a torch.distributed
 * all_to_all from Python), every member packs its cross-node parts by destination and calls
 * it once per round that moves any: the parts come back as bytes this client owns. Fetcher
 * thread (client_rebalance.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"

/* Forgets a part that left this rank: its slabs are the receiver's now (on one node) or
 * the local DataServer's to drop (across nodes); only this client's own things go. */
static void forget(part_t *p)
{
    for (size_t t = 0; t < p->n_tensors; t++) {
        dh_free(p->copies[t]);
        p->copies[t] = NULL;
    }
    dh__client_arena_ref_drop(p->arena);
    for (uint32_t i = 0; i < p->n_samples && p->samples; i++) {
        dh_free(p->samples[i].id);
        dh_free(p->samples[i].error);
    }
    dh_free(p->samples);
    uint64_t seq = p->seq;
    memset(p, 0, sizeof *p);
    p->seq = seq;
    p->ready = true; /* the slot stays taken: a duplicate of its request is still one */
}

/* Gives a part taken from a round its samples and what else the round says of it, and
 * makes it ready. */
static void adopt_samples(part_t *p, const dh_wire_rb_part_t *w)
{
    p->samples = dh_calloc(w->n_samples ? w->n_samples : 1, sizeof *p->samples);
    for (uint32_t i = 0; p->samples && i < w->n_samples; i++) {
        p->samples[i] = w->samples[i];
        p->samples[i].id = dh_strdup(w->samples[i].id ? w->samples[i].id : "");
        p->samples[i].error = dh_strdup(w->samples[i].error ? w->samples[i].error : "");
        p->n_samples++;
    }
    snprintf(p->server, NAME_CAP, "%s", w->server ? w->server : "");
    p->ready_ns = w->ready_ns;
    p->received_ns = dh_clock_now_ns();
    p->ready = true;
}

/* Takes over a part of this node from the round (its slabs change owner). 0 or a code. */
static int take_over(dh_client_t *c, const dh_wire_rb_part_t *w, part_t *slot)
{
    part_t p = {0};
    p.seq = slot->seq;
    size_t t = 0;
    int rc = 0;
    for (; t < w->n_tensors && t < DH__RT_MAX_TENSORS; t++) {
        const dh_wire_tensor_t *x = &w->tensors[t];
        arena_ref_t *a = dh__client_arena_by_id(c, x->arena_id);
        dh_shm_handle_t h = {x->arena_id, x->offset, x->length, x->generation};
        void *ptr = NULL;
        if (!a || (p.arena && p.arena != a) ||
            (rc = DH_FAULT(DH_FAULT_RB_TAKE_OVER)
                      ? dh__set_error(-ESTALE, "shm handle refused (injected)")
                      : dh_shm_arena_ref_for(a->arena, &h, getpid())) != 0) {
            rc = rc ? rc : DH_EINVAL;
            break;
        }
        dh_shm_arena_resolve(a->arena, &h, &ptr);
        if (!p.arena) {
            p.arena = a;
            atomic_fetch_add(&a->refs, 1);
        }
        p.handles[t] = h;
        p.tensors[t] = x->tensor;
        p.tensors[t].data = ptr;
        p.n_tensors++;
    }
    if (rc) {
        dh__client_part_release(&p); /* the references taken so far */
        /* and the sender's on every tensor: it forgot the part, and it is alive, so
         * reclaim_dead would never free them (a bad handle fails its unref harmlessly) */
        for (uint32_t k = 0; k < w->n_tensors; k++) {
            const dh_wire_tensor_t *x = &w->tensors[k];
            arena_ref_t *a = dh__client_arena_by_id(c, x->arena_id);
            dh_shm_handle_t h = {x->arena_id, x->offset, x->length, x->generation};
            if (a)
                dh_shm_arena_unref(a->arena, &h);
        }
        return rc;
    }
    /* the sender's references, which it no longer holds */
    for (size_t k = 0; k < p.n_tensors; k++)
        dh_shm_arena_unref(p.arena->arena, &p.handles[k]);
    adopt_samples(&p, w);
    *slot = p;
    return 0;
}

/* Waits for the part coming as seq into ring slot `slot`, or takes it at once if it came
 * early (lock held). 0 or DH_ENOMEM. */
static int expect(dh_client_t *c, uint64_t seq, size_t slot)
{
    rb_state_t *rb = &c->rb;
    for (size_t i = 0; i < rb->n_early; i++)
        if (rb->early[i].seq == seq) {
            part_t *dst = &c->ring[slot];
            uint64_t keep = dst->seq;
            *dst = rb->early[i];
            dst->seq = keep;
            rb->early[i] = rb->early[--rb->n_early];
            return 0;
        }
    if (rb->n_expect == rb->cap_expect) {
        size_t cap = rb->cap_expect ? 2 * rb->cap_expect : 16;
        rb_expect_t *e = dh_realloc(rb->expect, cap * sizeof *e);
        if (!e)
            return DH_ENOMEM;
        rb->expect = e;
        rb->cap_expect = cap;
    }
    rb->expect[rb->n_expect++] = (rb_expect_t){seq, slot, false};
    return 0;
}

void dh__client_rb_on_moved(dh_client_t *c, part_t *p)
{
    rb_state_t *rb = &c->rb;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < rb->n_expect; i++)
        if (rb->expect[i].seq == p->seq && !rb->expect[i].done) {
            part_t *dst = &c->ring[rb->expect[i].slot];
            uint64_t keep = dst->seq;
            *dst = *p;
            dst->seq = keep;
            rb->expect[i].done = true;
            pthread_mutex_unlock(&c->lock);
            return;
        }
    pthread_mutex_unlock(&c->lock);
    if (rb->n_early == rb->cap_early) {
        size_t cap = rb->cap_early ? 2 * rb->cap_early : 16;
        part_t *e = dh_realloc(rb->early, cap * sizeof *e);
        if (!e) {
            dh__client_part_release(p);
            dh__client_rb_set_error(c, rb->applied, DH_ENOMEM,
                                    "out of memory keeping a moved part");
            return;
        }
        rb->early = e;
        rb->cap_early = cap;
    }
    rb->early[rb->n_early++] = *p;
}

static int send_part(dh_client_t *c, const dh_msg_rebalance_t *m, uint32_t i,
                     const dh_wire_rb_member_t *to)
{
    dh_msg_t s = {.type = DH_MSG_REBALANCE};
    s.rebalance.kind = DH_RB_SEND;
    s.rebalance.group = m->group;
    s.rebalance.round = m->round;
    s.rebalance.rank = c->cfg.rank;
    s.rebalance.client_id = to->client_id;
    s.rebalance.node = to->node;
    s.rebalance.endpoint = to->endpoint;
    s.rebalance.seq = RB_SEQ_BIT | (m->round << 24) | i;
    s.rebalance.reason = (char *)"";
    s.rebalance.n_parts = 1;
    s.rebalance.parts = &m->parts[i];
    if (DH_FAULT(DH_FAULT_RB_SEND))
        return dh__set_error(DH_EIO, "send REBALANCE: injected failure");
    return dh_wire_send(c->data, NULL, 0, &s, NULL, 0, 1000);
}

/* Whether part i of the round carries data (an empty slot carries none). */
static bool carries(const dh_wire_rb_part_t *p)
{
    return p->n_samples || p->n_tensors;
}

static size_t part_bytes(const dh_wire_rb_part_t *p)
{
    size_t n = 0;
    for (uint32_t t = 0; t < p->n_tensors; t++)
        n += p->tensors[t].tensor.nbytes;
    return n;
}

/* Whether part i moves across nodes under the decision. */
static bool crosses(const dh_msg_rebalance_t *m, const uint32_t *new_rank, uint32_t i)
{
    const dh_wire_rb_part_t *p = &m->parts[i];
    if (new_rank[i] == p->rank || !carries(p))
        return false;
    int a = dh__client_rb_member_of(m, p->rank), b = dh__client_rb_member_of(m, new_rank[i]);
    return a >= 0 && b >= 0 && strcmp(m->members[a].node, m->members[b].node) != 0;
}

/* The bytes of a round's cross-node moves, exchanged by the user's exchange_fn: what this
 * rank sends, packed by destination, and where each incoming part lies in what it gets. */
typedef struct exchange {
    bool on; /* the round moves a part across nodes: every member calls exchange_fn */
    int rc;  /* exchange_fn's (or packing's) code */
    char *send, *recv;
    size_t *send_counts, *recv_counts; /* per member */
    size_t *in_off;                    /* per part: its offset in recv (incoming ones) */
} exchange_t;

static void exchange_free(exchange_t *x)
{
    dh_free(x->send);
    dh_free(x->recv);
    dh_free(x->send_counts);
    dh_free(x->recv_counts);
    dh_free(x->in_off);
    memset(x, 0, sizeof *x);
}

/* Packs this rank's outgoing cross-node parts (read from its ring, which the fetcher
 * thread alone writes) and calls exchange_fn. x->rc says how it went. */
static void exchange(dh_client_t *c, const dh_msg_rebalance_t *m, const uint32_t *new_rank,
                     exchange_t *x)
{
    const dh_rebalance_config_t *rc = &c->cfg.rebalance;
    uint32_t me = c->cfg.rank, n = m->n_parts, k = m->n_members;
    for (uint32_t i = 0; i < n && !x->on; i++)
        x->on = crosses(m, new_rank, i);
    if (!x->on)
        return;
    x->send_counts = dh_calloc(k, sizeof *x->send_counts);
    x->recv_counts = dh_calloc(k, sizeof *x->recv_counts);
    x->in_off = dh_calloc(n ? n : 1, sizeof *x->in_off);
    uint32_t ranks[k];
    size_t sent = 0, got = 0;
    if (!x->send_counts || !x->recv_counts || !x->in_off) {
        x->rc = DH_ENOMEM;
        return;
    }
    for (uint32_t j = 0; j < k; j++)
        ranks[j] = m->members[j].rank;
    for (uint32_t i = 0; i < n; i++) {
        if (!crosses(m, new_rank, i))
            continue;
        if (m->parts[i].rank == me)
            x->send_counts[dh__client_rb_member_of(m, new_rank[i])] += part_bytes(&m->parts[i]);
        if (new_rank[i] == me)
            x->recv_counts[dh__client_rb_member_of(m, m->parts[i].rank)] +=
                part_bytes(&m->parts[i]);
    }
    size_t send_at[k], recv_at[k];
    for (uint32_t j = 0; j < k; j++) {
        send_at[j] = sent;
        recv_at[j] = got;
        sent += x->send_counts[j];
        got += x->recv_counts[j];
    }
    x->send = dh_malloc(sent ? sent : 1);
    x->recv = dh_malloc(got ? got : 1);
    if (!x->send || !x->recv) {
        x->rc = DH_ENOMEM;
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!crosses(m, new_rank, i))
            continue;
        const dh_wire_rb_part_t *w = &m->parts[i];
        if (new_rank[i] == me) {
            uint32_t from = (uint32_t)dh__client_rb_member_of(m, w->rank);
            x->in_off[i] = recv_at[from];
            recv_at[from] += part_bytes(w);
        }
        if (w->rank != me)
            continue;
        uint32_t to = (uint32_t)dh__client_rb_member_of(m, new_rank[i]);
        const part_t *p = &c->ring[(w->batch * c->cfg.fanout + w->slot) % c->ring_size];
        for (uint32_t t = 0; t < w->n_tensors; t++) {
            size_t len = w->tensors[t].tensor.nbytes;
            if (t >= p->n_tensors || p->tensors[t].nbytes != len || (len && !p->tensors[t].data)) {
                x->rc =
                    dh__set_error(DH_EINVAL, "part %u's tensor %u is not what it offered", i, t);
                return;
            }
            if (len)
                memcpy(x->send + send_at[to], p->tensors[t].data, len);
            send_at[to] += len;
        }
    }
    uint64_t t0 = dh_clock_now_ns();
    x->rc = rc->exchange_fn(rc->exchange_user, m->group, m->round, ranks, k, x->send,
                            x->send_counts, x->recv, x->recv_counts);
    dh__client_rb_record_transfer(c, dh_clock_elapsed_s(t0, dh_clock_now_ns()));
    dh__count(&c->counters.rebalance_exchanges, 1);
    dh_log_debug("client '%s': rebalance round %llu: exchange_fn sent %zu bytes and received "
                 "%zu in %.4f s: %d",
                 c->id, (unsigned long long)m->round, sent, got,
                 dh_clock_elapsed_s(t0, dh_clock_now_ns()), x->rc);
}

/* Takes a part that came through exchange_fn (its bytes at `bytes`) into a ring slot: its
 * tensors are copies this client owns. 0 or DH_ENOMEM. */
static int take_bytes(const dh_wire_rb_part_t *w, const char *bytes, part_t *slot)
{
    part_t p = {0};
    p.seq = slot->seq;
    size_t off = 0;
    for (uint32_t t = 0; t < w->n_tensors && t < DH__RT_MAX_TENSORS; t++) {
        size_t len = w->tensors[t].tensor.nbytes;
        p.copies[t] = dh_malloc(len ? len : 1);
        if (!p.copies[t]) {
            dh__client_part_release(&p);
            return DH_ENOMEM;
        }
        memcpy(p.copies[t], bytes + off, len);
        off += len;
        p.tensors[t] = w->tensors[t].tensor;
        p.tensors[t].data = p.copies[t];
        p.n_tensors++;
    }
    adopt_samples(&p, w);
    *slot = p;
    return 0;
}

/* Applies round r's decision to this rank's ring. */
void dh__client_rb_apply(dh_client_t *c, const dh_msg_rebalance_t *m, const uint32_t *new_rank)
{
    uint32_t me = c->cfg.rank, n = m->n_parts;
    int mi = dh__client_rb_member_of(m, me);
    const char *my_node = mi >= 0 ? m->members[mi].node : "";
    int err = 0;
    const char *what = NULL;
    exchange_t x = {0};
    if (c->cfg.rebalance.exchange_fn)
        exchange(c, m, new_rank, &x);
    if (x.rc) {
        err = x.rc < 0 ? x.rc : DH_EIO; /* the callback's code: a report may go with it */
        what = "exchange_fn failed: the parts it was to bring are lost";
    }
    /* the sender thread reads ring slots under the lock (learn_from_ring) */
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i;
        while (j < n && m->parts[j].batch == m->parts[i].batch)
            j++;
        uint32_t next_in = i;
        for (uint32_t y = i; y < j; y++) {
            const dh_wire_rb_part_t *out = &m->parts[y];
            if (out->rank != me || new_rank[y] == me)
                continue;
            /* slot out->slot goes; the next incoming part of this batch takes it */
            while (next_in < j && !(new_rank[next_in] == me && m->parts[next_in].rank != me))
                next_in++;
            size_t slot = (size_t)((out->batch * c->cfg.fanout + out->slot) % c->ring_size);
            const dh_wire_rb_member_t *to = &m->members[dh__client_rb_member_of(m, new_rank[y])];
            bool same_node = strcmp(to->node, my_node) == 0;
            if (!same_node && carries(out)) {
                if (x.on) /* its bytes went through exchange_fn: its slabs go back */
                    dh__client_part_release_tensors(&c->ring[slot]);
                else if (send_part(c, m, y, to)) {
                    /* the DataServer never got the references to drop: they go here */
                    dh__client_part_release_tensors(&c->ring[slot]);
                    if (!err) {
                        err = DH_EIO;
                        what = "cannot hand a part to the local DataServer";
                    }
                }
            }
            forget(&c->ring[slot]);
            if (next_in == j) {
                err = err ? err : DH_EINVAL;
                what = what ? what : "a part left with none to take its place";
                continue;
            }
            const dh_wire_rb_part_t *in = &m->parts[next_in];
            const dh_wire_rb_member_t *from = &m->members[dh__client_rb_member_of(m, in->rank)];
            if (carries(in)) {
                dh__count(&c->counters.rebalance_moved_parts, 1);
                dh__count(&c->counters.rebalance_moved_samples, in->n_samples);
                dh__count(&c->counters.rebalance_bytes, (uint64_t)in->bytes);
            }
            if (!carries(in)) {
                /* an empty slot comes: the slot stays empty (forgotten above) */
            } else if (strcmp(from->node, my_node) == 0) {
                int rc = take_over(c, in, &c->ring[slot]);
                if (rc && !err) {
                    err = rc;
                    what = "a part of this node could not change owner";
                }
            } else if (x.on) {
                dh__count(&c->counters.rebalance_bytes_remote, (uint64_t)in->bytes);
                int rc = x.rc ? 0 : take_bytes(in, x.recv + x.in_off[next_in], &c->ring[slot]);
                if (rc && !err) {
                    err = rc;
                    what = "out of memory for a part exchange_fn brought";
                }
            } else {
                dh__count(&c->counters.rebalance_bytes_remote, (uint64_t)in->bytes);
                if (expect(c, RB_SEQ_BIT | (m->round << 24) | next_in, slot) && !err) {
                    err = DH_ENOMEM;
                    what = "out of memory waiting for a moved part";
                }
            }
            next_in++;
        }
        i = j;
    }
    pthread_mutex_unlock(&c->lock);
    exchange_free(&x);
    if (err)
        dh__client_rb_set_error(c, m->round, err, what);
}
