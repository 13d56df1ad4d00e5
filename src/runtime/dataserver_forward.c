/* dataserver_forward.c: a DataServer's links to other DataServers, and the deliveries that wait.
 *
 * A remote sidecar (or a local DataServer executing for another node's rank) forwards each
 * finished task to the local DataServer of its target rank over a link (a DEALER per target
 * endpoint, made on first use), the tensors as zero-copy payload frames; the target's
 * COMPLETE ack times the transfer. The local DataServer places a forwarded DELIVER's frames
 * into its arena once and hands the client the handles. A delivery that cannot go out yet
 * (the client has not connected, the arena is full) waits in the pending list, retried by
 * the loop. Threads: the loop's (see dataserver.c).
 *
 * The loop never waits on a link: every delivery goes into its link's FIFO (held_t, encoded
 * once, payloads still zero-copy) and leaves when the link's socket takes it without
 * blocking (ZMQ_POLLOUT; the loop polls for it). A DEALER blocks when its peer's pipe is full
 * (ZMQ_SNDHWM messages queued to a slow or stopped target); before, each such send waited
 * up to 1 s on the loop, and a run of them starved the heartbeats the loop also sends, so
 * the coordinator could declare a busy, live server dead. A delivery its link has not taken
 * for FORWARD_STALL_MS is dropped (warned, counted undeliverable; the coordinator re-places
 * what never completes), as the 1 s send timeout dropped it before.
 *
 * Emulated network (cfg.emulate_link_Bps > 0): a link to another node is a serial
 * resource. A delivery handed to it starts its transmission when the link is free (the
 * previous delivery's transmission is over) and takes emulated bytes / emulate_link_Bps
 * (emulated bytes: the payload / the synthetic pipeline's bytes_scale, the size it stands
 * for); it is held, encoded, in the link's FIFO and sent when its transmission is over, so
 * it reaches the target no earlier. The loop never sleeps for it: its poll wakes for the
 * next one due (dh__ds_links_timeout_ms, rounded up to the millisecond).
 *
 * Ingress: the receiving node's link is a serial resource too, shared by every DataServer
 * that forwards to it (what makes many sidecars saturate a training node's NIC, the
 * paper's rd sweep). A forwarded delivery is placed when its transmission on it is over:
 * it started when its sender's did (arrival - its duration) or when the ingress came free,
 * whichever is later (dh__ds_ingress_due); alone on the link that is at once, behind other
 * senders' deliveries it waits in the pending list. Acks go out after placing, so a
 * sender's link estimate sees the queueing.
 *
 * Link estimates (heartbeat, the coordinator's C_net): each ack gives a sample (x = the
 * delivery's emulated bytes, y = ack time - transmission start). Exponentially weighted
 * means (weight 0.2) of x, y, x^2, xy fit y = latency + x / bandwidth by least squares once
 * 4 samples with sizes varying (coefficient of variation >= 0.1) are in; when the sizes do
 * not vary, or the fit has a negative slope or intercept, bandwidth is mean x / mean y and
 * latency 0 (not measured: the coordinator uses its default). Only deliveries over 64 KiB
 * (emulated) are samples. Bandwidth is in emulated bytes per second, the unit of the
 * descriptors' out_bytes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/runtime.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/dataserver_internal.h"
#include "runtime/rt.h"
#include "wire/wire_lib.h"

/* How long a delivery may wait for its link's socket to take it (see the top). */
#define FORWARD_STALL_MS 1000
/* Deliveries a link's socket queues (ZMQ_SNDHWM; ZeroMQ's default is 1,000): a target that
 * stops reading holds at most this many of a sidecar's batches in ZeroMQ; the rest wait in
 * the link's FIFO and leave it within FORWARD_STALL_MS, sent or dropped. */
#define LINK_SNDHWM 16

static link_t *link_for(dh_dataserver_t *s, const char *endpoint)
{
    for (size_t i = 0; i < s->n_links; i++)
        if (strcmp(s->links[i].endpoint, endpoint) == 0)
            return &s->links[i];
    if (s->n_links == MAX_LINKS) {
        dh_log_error("DataServer '%s': more than %d target DataServers; cannot reach %s", s->name,
                     MAX_LINKS, endpoint);
        return NULL;
    }
    link_t *l = &s->links[s->n_links];
    memset(l, 0, sizeof *l);
    snprintf(l->endpoint, ENDPOINT_CAP, "%s", endpoint);
    dh_wire_socket_opts_t opts = {.keys = s->keys};
    int hwm = LINK_SNDHWM;
    if (dh_wire_socket_new(&l->sock, s->ctx, ZMQ_DEALER, &opts) ||
        zmq_setsockopt(dh_wire_socket_handle(l->sock), ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        dh__wire_set_routing_id(l->sock, s->name) || dh_wire_socket_connect(l->sock, endpoint)) {
        dh_log_error("DataServer '%s': cannot connect to target %s: %s", s->name, endpoint,
                     dh_last_error());
        dh_wire_socket_destroy(&l->sock);
        return NULL;
    }
    s->n_links++;
    return l;
}

static uint64_t emulated_bytes(const dh_dataserver_t *s, uint64_t bytes)
{
    if (s->pipeline.synthetic && s->pipeline.bytes_scale > 0)
        return (uint64_t)((double)bytes / s->pipeline.bytes_scale + 0.5);
    return bytes;
}

uint64_t dh__ds_ingress_due(dh_dataserver_t *s, const dh_msg_deliver_t *m, uint64_t now)
{
    if (!(s->cfg.emulate_link_Bps > 0))
        return now;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        bytes += m->tensors[i].tensor.nbytes;
    uint64_t dur =
        (uint64_t)((double)emulated_bytes(s, bytes) / s->cfg.emulate_link_Bps * 1e9 + 0.5);
    /* The sender held it for its own transmission, which ended now: alone on this link, it
     * was coming in over the same span, so it is placed at once. */
    uint64_t start = now > dur ? now - dur : 0;
    if (s->ingress_free_ns > start)
        start = s->ingress_free_ns;
    s->ingress_free_ns = start + dur;
    return start + dur;
}

/* A delivery went out on link l: remembers it for the ack, counts it. */
static void sent(dh_dataserver_t *s, link_t *l, uint64_t seq, uint64_t bytes, uint64_t emu,
                 uint64_t start_ns)
{
    size_t slot = seq % 64;
    l->sent_at_ns[slot] = start_ns;
    l->sent_seq[slot] = seq;
    l->sent_bytes[slot] = emu;
    dh__count(&s->counters.forwarded, 1);
    dh__count(&s->counters.bytes_forwarded, bytes);
    if (l->node[0] && strcmp(l->node, s->node) != 0)
        dh__count(&s->counters.bytes_cross_node, bytes);
}

static void free_payloads(dh_wire_payload_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i].free_fn)
            p[i].free_fn(p[i].data, p[i].hint);
}

static void held_free(held_t *h)
{
    free_payloads(h->payloads, h->n_payloads);
    dh_free(h->body);
    dh_free(h);
}

/* Hands a DELIVER to link l's FIFO. Emulated (a link to another node with
 * cfg.emulate_link_Bps): its transmission starts when the link is free and it is due when
 * that is over; otherwise it is due now. Takes the payloads. Returns 0, or a negative code
 * (nothing held; the payloads freed). */
static int hold(dh_dataserver_t *s, link_t *l, const dh_msg_t *m, dh_wire_payload_t *payloads,
                size_t np, uint64_t bytes, bool emulate)
{
    held_t *h = dh_calloc(1, sizeof *h);
    int rc = h ? dh_wire_encode(m, h->header, &h->body, &h->body_len)
               : dh__set_error(DH_ENOMEM, "out of memory holding a delivery");
    if (rc) {
        free_payloads(payloads, np);
        dh_free(h);
        return rc;
    }
    memcpy(h->payloads, payloads, np * sizeof *payloads);
    h->n_payloads = np;
    h->seq = m->deliver.seq;
    h->bytes = bytes;
    h->emulated_bytes = emulated_bytes(s, bytes);
    uint64_t now = dh_clock_now_ns();
    if (emulate) {
        h->start_ns = l->busy_until_ns > now ? l->busy_until_ns : now;
        h->due_ns = h->start_ns +
                    (uint64_t)((double)h->emulated_bytes / s->cfg.emulate_link_Bps * 1e9 + 0.5);
        l->busy_until_ns = h->due_ns;
    } else {
        h->start_ns = h->due_ns = now;
    }
    if (l->held_tail)
        l->held_tail->next = h;
    else
        l->held = h;
    l->held_tail = h;
    return 0;
}

/* Sends a held delivery whose transmission is over, on a link whose socket takes it now. */
static void send_held(dh_dataserver_t *s, link_t *l, held_t *h)
{
    dh_wire_frame_t frames[DH__RT_MAX_TENSORS];
    for (size_t i = 0; i < h->n_payloads; i++)
        frames[i] = (dh_wire_frame_t){h->payloads[i].data, h->payloads[i].size};
    dh_msg_t m;
    int rc = dh_wire_decode(h->header, sizeof h->header, h->body, h->body_len, frames,
                            h->n_payloads, &m);
    if (rc == 0) {
        rc = dh_wire_send(l->sock, NULL, 0, &m, h->payloads, h->n_payloads, 0);
        h->n_payloads = 0; /* taken by dh_wire_send in every case */
        dh_msg_clear(&m);
    }
    if (rc) {
        dh_log_warn("DataServer '%s': cannot forward request %llu to %s: %s", s->name,
                    (unsigned long long)h->seq, l->endpoint, dh_last_error());
        dh__count(&s->counters.undeliverable, 1);
    } else {
        sent(s, l, h->seq, h->bytes, h->emulated_bytes, h->start_ns);
    }
    held_free(h);
}

long dh__ds_links_timeout_ms(const dh_dataserver_t *s, long timeout)
{
    uint64_t now = dh_clock_now_ns();
    for (const pending_t *p = s->pending; p; p = p->next) {
        if (p->task || !p->due_ns)
            continue;
        long ms = p->due_ns <= now ? 0 : (long)((p->due_ns - now + 999999) / 1000000);
        if (ms < timeout)
            timeout = ms;
    }
    for (size_t i = 0; i < s->n_links; i++) {
        const held_t *h = s->links[i].held;
        if (!h)
            continue;
        uint64_t due = h->due_ns;
        if (s->links[i].blocked_since_ns) /* the poll wakes on POLLOUT; else at the stall */
            due = s->links[i].blocked_since_ns + (uint64_t)FORWARD_STALL_MS * 1000000;
        long ms = due <= now ? 0 : (long)((due - now + 999999) / 1000000);
        if (ms < timeout)
            timeout = ms;
    }
    return timeout;
}

/* Whether link l's socket takes a message now without blocking. */
static bool link_writable(link_t *l)
{
    int events = 0;
    size_t len = sizeof events;
    return zmq_getsockopt(dh_wire_socket_handle(l->sock), ZMQ_EVENTS, &events, &len) == 0 &&
           (events & ZMQ_POLLOUT);
}

bool dh__ds_link_wants_out(const link_t *l)
{
    return l->blocked_since_ns != 0;
}

void dh__ds_links_send_due(dh_dataserver_t *s)
{
    for (size_t i = 0; i < s->n_links; i++) {
        link_t *l = &s->links[i];
        for (;;) {
            uint64_t now = dh_clock_now_ns();
            held_t *h = l->held;
            if (!h || h->due_ns > now)
                break;
            if (!link_writable(l)) {
                if (!l->blocked_since_ns)
                    l->blocked_since_ns = now;
                if (now - l->blocked_since_ns < (uint64_t)FORWARD_STALL_MS * 1000000)
                    break; /* the loop polls for POLLOUT on it */
                dh_log_warn("DataServer '%s': cannot forward request %llu to %s: not taken for "
                            "%d ms (the target is gone or not keeping up)",
                            s->name, (unsigned long long)h->seq, l->endpoint, FORWARD_STALL_MS);
                dh__count(&s->counters.undeliverable, 1);
                l->held = h->next;
                if (!l->held)
                    l->held_tail = NULL;
                held_free(h);
                l->blocked_since_ns = now; /* the next one gets its own wait */
                continue;
            }
            l->blocked_since_ns = 0;
            l->held = h->next;
            if (!l->held)
                l->held_tail = NULL;
            send_held(s, l, h);
        }
        if (!l->held)
            l->blocked_since_ns = 0;
    }
}

void dh__ds_link_close(dh_dataserver_t *s, link_t *l)
{
    while (l->held) {
        held_t *h = l->held;
        l->held = h->next;
        dh__count(&s->counters.undeliverable, 1);
        held_free(h);
    }
    l->held_tail = NULL;
    dh_wire_socket_destroy(&l->sock);
}

/* A sidecar's finished task: the frames go to the target's DataServer. */
void dh__ds_forward_result(dh_dataserver_t *s, task_t *t)
{
    const dh_msg_dispatch_t *d = &t->msg.dispatch;
    dh__rt_result_t *r = &t->result;
    link_t *l = link_for(s, d->target_endpoint);
    dh_wire_tensor_t wire[DH__RT_MAX_TENSORS];
    dh_wire_payload_t payloads[DH__RT_MAX_TENSORS];
    dh__rt_wire_tensors(r->tensors, r->n_tensors, wire);
    size_t np = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < r->n_tensors; i++) {
        payloads[np].data = r->tensors[i].tensor.data;
        payloads[np].size = r->tensors[i].tensor.nbytes;
        payloads[np].free_fn = dh__out_free_payload; /* each frame holds the task's charge */
        payloads[np].hint = t->charge;
        dh__out_charge_add(t->charge, 1);
        bytes += r->tensors[i].tensor.nbytes;
        r->tensors[i].tensor.data = NULL; /* the socket owns it now */
        np++;
    }
    if (!l) {
        free_payloads(payloads, np);
        dh__count(&s->counters.undeliverable, 1);
        return;
    }
    /* the link's peer node: the heartbeat reports the link under it, the coordinator's
     * links are between nodes */
    const char *node = d->request.delivery_node;
    if (node && node[0])
        snprintf(l->node, NAME_CAP, "%s", node);
    dh_msg_t m = {.type = DH_MSG_DELIVER};
    m.deliver.client_id = d->request.client_id;
    m.deliver.seq = d->request.seq;
    m.deliver.n_tensors = (uint32_t)r->n_tensors;
    m.deliver.tensors = wire;
    m.deliver.n_samples = r->n_samples;
    m.deliver.samples = r->samples;
    m.deliver.ready_ns = t->ready_ns;
    m.deliver.server = s->name;
    uint64_t now = dh_clock_now_ns();
    /* Stopping: one try, no wait (the target may have stopped first; a 1 s wait per
     * finished task made the stop slow and printed a WARN for each); the stop line counts
     * what was not forwarded as undeliverable. */
    bool stopping = atomic_load(&s->stop) != 0;
    if (!stopping) { /* into the link's FIFO: out when the socket takes it (the top) */
        bool emulate = s->cfg.emulate_link_Bps > 0 && l->node[0] && strcmp(l->node, s->node) != 0;
        int rc = hold(s, l, &m, payloads, np, bytes, emulate);
        if (rc) {
            dh_log_warn("DataServer '%s': cannot forward request %s/%llu to %s: %s", s->name,
                        d->request.client_id, (unsigned long long)d->request.seq,
                        d->target_endpoint, dh_last_error());
            dh__count(&s->counters.undeliverable, 1);
        } else
            dh__ds_links_send_due(s);
        return;
    }
    int rc = dh_wire_send(l->sock, NULL, 0, &m, payloads, np, 0);
    if (rc) {
        if (stopping) {
            dh__count(&s->counters.undeliverable, 1);
            dh_log_debug("DataServer '%s': stopping: request %s/%llu not forwarded to %s: %s",
                         s->name, d->request.client_id, (unsigned long long)d->request.seq,
                         d->target_endpoint, dh_last_error());
        } else {
            dh_log_warn("DataServer '%s': cannot forward request %s/%llu to %s: %s", s->name,
                        d->request.client_id, (unsigned long long)d->request.seq,
                        d->target_endpoint, dh_last_error());
        }
        return;
    }
    sent(s, l, d->request.seq, bytes, emulated_bytes(s, bytes), now);
}

/* A sidecar's DELIVER: copy the frames into the arena once, then notify the client.
 * Returns true when done with (delivered, dropped or refused), false to retry later (the
 * arena is full, or the client has not connected yet). */
bool dh__ds_place_forwarded(dh_dataserver_t *s, dh_wire_received_t *r, const char *sidecar,
                            uint64_t since_ns)
{
    dh_msg_deliver_t *m = &r->msg.deliver;
    dh__rt_tensor_t tensors[DH__RT_MAX_TENSORS];
    if (m->n_tensors > DH__RT_MAX_TENSORS) {
        dh_log_warn("DataServer '%s': refused a DELIVER from '%s' with %u tensors (at most %d)",
                    s->name, sidecar, m->n_tensors, DH__RT_MAX_TENSORS);
        dh__count(&s->counters.undeliverable, 1);
        return true;
    }
    bool stopping = atomic_load(&s->stop) != 0;
    if (dh__ds_client_left(s, m->client_id)) { /* gone: nothing to place, nobody to tell */
        dh__count(&s->counters.undeliverable, 1);
        dh_log_debug("DataServer '%s': dropped batch %s/%llu from '%s': the client has left",
                     s->name, m->client_id, (unsigned long long)m->seq, sidecar);
        return true;
    }
    if (!dh__ds_find_client(s, m->client_id) &&
        dh_clock_now_ns() - since_ns < UNREACHABLE_GRACE_NS && !stopping)
        return false;
    size_t n = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dh_wire_tensor_t *w = &m->tensors[i];
        const size_t size = w->tensor.nbytes;
        dh__rt_tensor_t *t = &tensors[n];
        memset(t, 0, sizeof *t);
        if (w->location != DH_WIRE_LOC_FRAME) {
            dh_log_warn("DataServer '%s': refused a DELIVER from '%s': tensor '%s' is not a "
                        "payload frame",
                        s->name, sidecar, w->tensor.name);
            dh__ds_unref_tensors(s, tensors, n);
            dh__count(&s->counters.undeliverable, 1);
            return true;
        }
        t->tensor = w->tensor;
        t->tensor.data = NULL;
        if (size) {
            pthread_mutex_lock(&s->arena_lock);
            int rc = dh_shm_arena_alloc(s->arena, size, 0, &t->handle, &t->tensor.data);
            pthread_mutex_unlock(&s->arena_lock);
            if (rc == DH_EAGAIN && !stopping && dh_clock_now_ns() - since_ns < SPILL_AFTER_NS) {
                dh__ds_unref_tensors(s, tensors, n);
                if (since_ns == 0 || dh_clock_now_ns() - since_ns < 1000000ull) {
                    dh__count(&s->counters.arena_waits, 1);
                }
                return false;
            }
            if (rc == DH_EAGAIN && !stopping) {
                /* still full: the client gets a copy of the frame (see SPILL_AFTER_NS) */
                memset(&t->handle, 0, sizeof t->handle);
                t->tensor.data = w->tensor.data; /* read only: dh__ds_deliver_to_client copies it */
                dh__ds_count_spill(s, size, since_ns);
                bytes += size;
                n++;
                continue;
            }
            if (rc) {
                dh_log_warn("DataServer '%s': cannot place %zu bytes from '%s': %s", s->name, size,
                            sidecar, dh_last_error());
                dh__ds_unref_tensors(s, tensors, n);
                dh__count(&s->counters.undeliverable, 1);
                return true;
            }
            memcpy(t->tensor.data, w->tensor.data, size);
            bytes += size;
        }
        n++;
    }
    uint64_t ready = dh_clock_now_ns();
    int rc = dh__ds_deliver_to_client(s, m->client_id, m->seq, tensors, n, m->samples, m->n_samples,
                                      ready, m->server);
    if (rc) {
        dh__ds_unref_tensors(s, tensors, n);
        if (rc == -EHOSTUNREACH && dh_clock_now_ns() - since_ns < UNREACHABLE_GRACE_NS && !stopping)
            return false;
        dh__count(&s->counters.undeliverable, 1);
    } else {
        dh__count(&s->counters.delivered_forwarded, 1);
        dh__count(&s->counters.bytes_received, bytes);
    }
    dh__rt_result_t res = {0};
    res.n_samples = m->n_samples;
    res.samples = m->samples;
    res.bytes = bytes;
    /* The ack lets the sidecar measure the link; the coordinator ends the request. */
    dh__ds_send_complete(s, m->client_id, m->seq, &res, 0, 0, 1, s->data, sidecar);
    dh__ds_send_complete(s, m->client_id, m->seq, &res, 0, 0, 1, NULL, NULL);
    return true;
}

void dh__ds_add_pending(dh_dataserver_t *s, pending_t *p)
{
    p->next = NULL;
    pending_t **pp = &s->pending;
    while (*pp)
        pp = &(*pp)->next;
    *pp = p;
}

void dh__ds_retry_pending(dh_dataserver_t *s)
{
    pending_t **pp = &s->pending;
    uint64_t now = dh_clock_now_ns();
    while (*pp) {
        pending_t *p = *pp;
        if (!p->task && p->due_ns > now) { /* still coming in on the emulated ingress */
            pp = &p->next;
            continue;
        }
        bool done = p->task ? dh__ds_finish_local(s, p->task, p->since_ns)
                            : dh__ds_place_forwarded(s, &p->forwarded, p->sidecar, p->since_ns);
        if (!done) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        if (p->task)
            dh__ds_task_free(p->task);
        dh_wire_received_release(&p->forwarded);
        dh_free(p);
    }
}

/* One ack's sample (x emulated bytes, y seconds since the transmission started) into the
 * link's estimates (see the top). */
static void link_observe(link_t *l, double x, double y)
{
    const double w = 0.2;
    if (l->fit_n == 0) {
        l->fit_x = x;
        l->fit_y = y;
        l->fit_xx = x * x;
        l->fit_xy = x * y;
    } else {
        l->fit_x = dh_cost_ewma(l->fit_x, x, w);
        l->fit_y = dh_cost_ewma(l->fit_y, y, w);
        l->fit_xx = dh_cost_ewma(l->fit_xx, x * x, w);
        l->fit_xy = dh_cost_ewma(l->fit_xy, x * y, w);
    }
    l->fit_n++;
    double slope = l->fit_y / l->fit_x, latency = 0; /* seconds per byte */
    double var = l->fit_xx - l->fit_x * l->fit_x;
    if (l->fit_n >= 4 && var >= 0.01 * l->fit_x * l->fit_x) {
        double b = (l->fit_xy - l->fit_x * l->fit_y) / var;
        double c = l->fit_y - b * l->fit_x;
        if (b > 0 && c >= 0) {
            slope = b;
            latency = c;
        }
    }
    l->bytes_per_s = 1.0 / slope;
    l->latency_s = latency;
}

void dh__ds_on_link_message(dh_dataserver_t *s, link_t *l, dh_wire_received_t *r)
{
    (void)s;
    if (r->msg.type != DH_MSG_COMPLETE)
        return;
    size_t slot = r->msg.complete.seq % 64;
    if (l->sent_seq[slot] != r->msg.complete.seq || !l->sent_at_ns[slot])
        return;
    double dt = dh_clock_elapsed_s(l->sent_at_ns[slot], dh_clock_now_ns());
    l->sent_at_ns[slot] = 0;
    if (dt > 0 && l->sent_bytes[slot] > (1u << 16))
        link_observe(l, (double)l->sent_bytes[slot], dt);
}

/* Tier 2 (docs/rebalancing.md): a client of this node hands parts of a round to a client on
 * another node. Each part's tensors are read out of this arena into payload frames (the
 * client's reference to its slabs is this server's to drop, which it does at once: the
 * frames are copies, so nothing on the link points into the arena), and the part goes as a
 * DELIVER for the receiver under seq + i, over the link to the receiver's DataServer like a
 * sidecar's forward: the same emulated link, the same placement at the other end. A part
 * that fails (at any tensor, or on its link) still has every reference dropped, and is
 * counted undeliverable (docs/runtime.md "Failures"). */
void dh__ds_rebalance_send(dh_dataserver_t *s, const char *peer, const dh_msg_rebalance_t *m)
{
    link_t *l = m->endpoint && m->endpoint[0] ? link_for(s, m->endpoint) : NULL;
    if (l && m->node && m->node[0])
        snprintf(l->node, NAME_CAP, "%s", m->node);
    for (uint32_t i = 0; i < m->n_parts; i++) {
        const dh_wire_rb_part_t *p = &m->parts[i];
        dh_wire_tensor_t wire[DH__RT_MAX_TENSORS];
        dh_wire_payload_t payloads[DH__RT_MAX_TENSORS];
        size_t np = 0;
        uint64_t bytes = 0;
        int rc = p->n_tensors <= DH__RT_MAX_TENSORS ? 0 : DH_EINVAL;
        for (uint32_t k = 0; k < p->n_tensors && rc == 0; k++) {
            const dh_wire_tensor_t *t = &p->tensors[k];
            dh_shm_handle_t h = {t->arena_id, t->offset, t->length, t->generation};
            void *src = NULL;
            size_t size = t->tensor.nbytes;
            void *copy = dh_malloc(size ? size : 1);
            if (!copy) {
                rc = DH_ENOMEM;
                break;
            }
            if (t->location != DH_WIRE_LOC_SHM || dh_shm_arena_resolve(s->arena, &h, &src) != 0 ||
                size > t->length) {
                dh_free(copy);
                rc = DH_EINVAL;
                break;
            }
            if (size)
                memcpy(copy, src, size);
            dh_shm_arena_unref(s->arena, &h); /* the client's reference, handed to us */
            wire[k] = *t;
            wire[k].location = DH_WIRE_LOC_FRAME;
            wire[k].tensor.data = copy;
            payloads[np++] = (dh_wire_payload_t){copy, size, dh__ds_free_payload, NULL};
            bytes += size;
        }
        if (rc == 0 && !l)
            rc = DH_EINVAL;
        if (rc) {
            dh_log_warn("DataServer '%s': cannot move part %u of rebalance round %llu from '%s' "
                        "to '%s' (%s): %s",
                        s->name, i, (unsigned long long)m->round, peer, m->client_id, m->endpoint,
                        rc == DH_ENOMEM ? "out of memory" : "bad handle or target");
            /* The client handed over a reference on every tensor of the part and forgot
             * them: those not yet copied and dropped (np onwards, or all of a part with too
             * many) are dropped here, or they would stay held by a live client, which
             * reclaim_dead never frees. A bad handle fails its unref harmlessly. */
            for (uint32_t k = (uint32_t)np; k < p->n_tensors; k++) {
                const dh_wire_tensor_t *t = &p->tensors[k];
                dh_shm_handle_t h = {t->arena_id, t->offset, t->length, t->generation};
                if (t->location == DH_WIRE_LOC_SHM)
                    dh_shm_arena_unref(s->arena, &h);
            }
            free_payloads(payloads, np);
            dh__count(&s->counters.undeliverable, 1);
            continue;
        }
        dh_msg_t d = {.type = DH_MSG_DELIVER};
        d.deliver.client_id = m->client_id;
        d.deliver.seq = m->seq + i;
        d.deliver.n_tensors = p->n_tensors;
        d.deliver.tensors = wire;
        d.deliver.n_samples = p->n_samples;
        d.deliver.samples = p->samples;
        d.deliver.ready_ns = p->ready_ns;
        d.deliver.server = p->server;
        dh__count(&s->counters.rebalance_sent, 1);
        bool emulate = s->cfg.emulate_link_Bps > 0 && l->node[0] && strcmp(l->node, s->node) != 0;
        if ((rc = hold(s, l, &d, payloads, np, bytes, emulate))) {
            dh_log_warn("DataServer '%s': cannot move a rebalanced part to %s: %s", s->name,
                        m->endpoint, dh_last_error());
            dh__count(&s->counters.undeliverable, 1);
        }
    }
    dh__ds_links_send_due(s);
}
