/* coordinator_place.c: placing the coordinator's requests (coordinator.c keeps the book).
 *
 * For each request of the book not yet placed: a snapshot of every server's state is
 * rebuilt (O(servers)), the pure scheduler picks the executor (dh_place, sched/), the
 * request goes to it as a DISPATCH naming the local DataServer that delivers to the rank
 * (and carrying the request's predicted CPU seconds, which the server reports back in its
 * heartbeats), and with telemetry on each decision is logged as a JSON line with its
 * candidates and the chosen server's predicted C_cpu and T. A
 * request that no server can take now stays in the book for the next pass.
 */
#include <math.h>
#include <stdio.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/place.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/coordinator_metrics.h"
#include "runtime/descriptor.h"

static void write_telemetry(dh_coordinator_t *c, const entry_t *e, const dh_request_cost_t *req,
                            const dh_decision_t *d, int rc)
{
    FILE *f = c->telemetry;
    const dh_msg_request_t *q = &e->msg.request;
    fprintf(f,
            "{\"t_s\":%.6f,\"client\":\"%s\",\"seq\":%llu,\"rank\":%u,\"policy\":\"%s\","
            "\"deadline_s\":%.6f,\"cpu_s\":%.6f,\"out_bytes\":%.0f,\"placement\":%u,",
            dh_clock_elapsed_s(c->start_ns, dh_clock_now_ns()), q->client_id,
            (unsigned long long)q->seq, q->rank, dh_policy_name(c->cfg.place.policy),
            req->deadline_s, req->cpu_s, req->out_bytes, e->placements);
    if (rc == 0) /* the chosen server's C_cpu and T: its "complete" line has the actuals */
        fprintf(f, "\"server\":\"%s\",\"pred_cpu_s\":%.6f,\"pred_t_s\":%.6f,",
                c->servers[d->server].name, req->cpu_s * c->servers[d->server].speed,
                c->cand[d->server].t_s);
    else
        fprintf(f, "\"server\":null,\"error\":\"%s\",", dh_err_name(rc));
    fprintf(f, "\"reason\":\"%s\",\"candidates\":[", dh_place_reason_name(d->reason));
    static const char *const status[] = {"ok", "dead", "full"};
    for (size_t i = 0; i < c->n_servers; i++) {
        /* a dead server's T is infinite, which JSON cannot say: null */
        char t[32] = "null", miss[32] = "null";
        if (isfinite(c->cand[i].t_s))
            snprintf(t, sizeof t, "%.6f", c->cand[i].t_s);
        if (isfinite(c->cand[i].miss_s))
            snprintf(miss, sizeof miss, "%.6f", c->cand[i].miss_s);
        fprintf(f, "%s{\"server\":\"%s\",\"t_s\":%s,\"miss_s\":%s,\"status\":\"%s\"}", i ? "," : "",
                c->servers[i].name, t, miss, status[c->cand[i].status < 3 ? c->cand[i].status : 0]);
    }
    fprintf(f, "]}\n");
}

/* Places one entry and dispatches it. Returns 0 (dispatched), or DH_EAGAIN / DH_ENOSERVER
 * (stays in the book to place later). */
static int place_entry(dh_coordinator_t *c, entry_t *e)
{
    client_t *cl = &c->clients[e->client];
    int32_t target = dh__coord_local_server_of(c, cl->node);
    if (target < 0)
        return DH_ENOSERVER; /* nowhere to deliver until the node's DataServer is back */
    if (dh__coord_grow((void **)&c->snap, &c->cap_snap, c->n_servers, sizeof *c->snap))
        return DH_EAGAIN;
    dh_candidate_t *cand = dh_reallocarray(c->cand, c->cap_snap, sizeof *cand);
    if (!cand)
        return DH_EAGAIN;
    c->cand = cand;
    for (size_t i = 0; i < c->n_servers; i++) {
        const server_t *s = &c->servers[i];
        dh_server_state_t *st = &c->snap[i];
        st->node = s->node;
        st->role = s->role == DH_WIRE_ROLE_LOCAL ? DH_SERVER_LOCAL : DH_SERVER_REMOTE;
        st->alive = s->alive;
        st->workers = s->workers ? s->workers : 1;
        st->queue_len = s->queue_len;
        st->queue_cap = c->cfg.queue_cap ? c->cfg.queue_cap * s->workers : 0;
        if (s->workers == 0) { /* delivery only: always "full" */
            st->queue_len = 1;
            st->queue_cap = 1;
        }
        st->speed_factor = s->speed;
        st->queue_wait_s = s->queued_cpu_s * s->speed / (s->workers ? s->workers : 1);
        st->storage_s_per_B = s->storage_s_per_B;
    }
    dh_snapshot_t snap = {c->snap, (uint32_t)c->n_servers, c->links, MAX_NODES};
    /* Predicted now, from what the model has learned by this decision (a request may wait in
     * the book while completions teach it). O(samples). */
    double pred = 0, profile = 0;
    for (uint32_t i = 0; i < e->msg.request.n_samples; i++) {
        dh_profile_row_t row;
        dh__rt_row_of_sample(&e->msg.request.samples[i], &row);
        pred += dh_cost_model_predict(c->model, &row, NULL);
        profile += e->msg.request.samples[i].cpu_s;
    }
    dh_request_cost_t req = {0};
    req.cpu_s = pred;
    req.in_bytes = e->in_bytes;
    req.out_bytes = e->out_bytes;
    req.deadline_s = (double)e->msg.request.deadline_ns / 1e9 -
                     dh_clock_elapsed_s(e->arrival_ns, dh_clock_now_ns());
    req.consumer_node = cl->node;
    req.local_server = target;
    dh_decision_t d = {.candidates = c->cand};
    uint64_t t0 = dh_clock_now_ns();
    int rc = dh_place(&c->cfg.place, &snap, &req, &d);
    dh__count(&c->counters.decisions, 1);
    dh__count(&c->counters.sched_ns, dh_clock_now_ns() - t0);
    dh__coord_metrics_decision(c, rc, &d);
    if (c->telemetry && (rc == 0 || e->placements == 0))
        write_telemetry(c, e, &req, &d, rc);
    if (rc)
        return rc;
    server_t *s = &c->servers[d.server];
    server_t *t = &c->servers[target];
    dh_msg_t m = {.type = DH_MSG_DISPATCH};
    m.dispatch.request = e->msg.request;
    m.dispatch.request.deadline_ns = (int64_t)(req.deadline_s * 1e9);
    m.dispatch.server = s->name;
    m.dispatch.target = t->name;
    m.dispatch.target_endpoint = t->endpoint;
    m.dispatch.pred_cpu_s = pred;
    if (dh__coord_send_to(c, s->name, &m) != 0) {
        dh__coord_declare_dead(c, d.server, "its connection is gone");
        return DH_EAGAIN;
    }
    e->server = d.server;
    e->executed = false;
    e->placements++;
    e->pred_cpu_s = pred;
    e->dispatch_ns = dh_clock_now_ns();
    e->deadline_s = req.deadline_s;
    e->pred_c_cpu_s = pred * s->speed;
    e->pred_t_s = c->cand[d.server].t_s;
    e->profile_cpu_s = profile;
    s->queue_len++;
    s->queued_cpu_s += pred;
    s->unseen_cpu_s[s->dispatched % UNSEEN_RING] = pred;
    s->dispatched++;
    dh__count(&c->counters.dispatches, 1);
    return 0;
}

void dh__coord_place_pending(dh_coordinator_t *c)
{
    if (!c->pending_work)
        return;
    c->pending_work = false;
    for (size_t i = 0; i < c->n_book; i++) {
        entry_t *e = &c->book[i];
        if (e->server >= 0)
            continue;
        int rc = place_entry(c, e);
        if (rc == DH_EAGAIN && e->server < 0) {
            /* Every candidate is at its cap: later requests would only wait behind it. */
            c->pending_work = true;
            break;
        }
        if (rc)
            c->pending_work = true;
    }
}
