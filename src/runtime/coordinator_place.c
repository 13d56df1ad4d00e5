/* coordinator_place.c: placing the coordinator's requests (coordinator.c keeps the book).
 *
 * Placement keeps every server's state (c->snap) and a placement index over it
 * (dh_place_index_*, sched/; docs/scheduler.md, "The index") current between decisions: each
 * site of coordinator*.c that changes a field a state is computed from calls
 * dh__coord_touch, and before a decision only the touched servers are refreshed (O(log N)
 * each in the index); a registration rebuilds both (O(N log N), rare). For each request of
 * the book not yet placed the index picks the executor (the same decision as dh_place on a
 * snapshot of every server, without scoring each), the request goes to it as a DISPATCH
 * naming the local DataServer that delivers to the rank (and carrying the request's
 * predicted CPU seconds, which the server reports back in its heartbeats). With telemetry on,
 * each decision is logged as a JSON line with every candidate's T, an O(N) table the index
 * does not make: the exhaustive dh_place decides then, on the same kept states.
 * DH_PLACE_CHECK=1 checks every decision against dh_place on a snapshot rebuilt from every
 * server (the tests run with it). A request that no server can take now stays in the book
 * for the next pass. A request with samples from a remote source (http, https, s3) carries
 * their predicted fetch per server (the fetch model, learned per (server, source) in
 * coordinator_learn.c) into placement's C_io: O(servers) more for such a request.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/place.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/coordinator_metrics.h"
#include "runtime/descriptor.h"
#include "core/internal.h"

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
    if (rc == 0) /* the chosen server's C_cpu, fetch and T: its "complete" line has the
                  * actuals */
        fprintf(f,
                "\"server\":\"%s\",\"pred_cpu_s\":%.6f,\"pred_fetch_s\":%.6f,"
                "\"pred_t_s\":%.6f,",
                c->servers[d->server].name, req->cpu_s * c->servers[d->server].speed,
                req->fetch_s && req->fetch_s[d->server] > 0 ? req->fetch_s[d->server] : 0.0,
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

/* Server i's placement state, from what the coordinator knows of it. */
static void server_state(const dh_coordinator_t *c, size_t i, dh_server_state_t *st)
{
    const server_t *s = &c->servers[i];
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

void dh__coord_touch(dh_coordinator_t *c, int32_t idx)
{
    server_t *s = &c->servers[idx];
    if (s->dirty)
        return;
    s->dirty = true;
    if ((size_t)idx < c->n_indexed && c->n_dirty < c->cap_dirty)
        c->dirty[c->n_dirty++] = (uint32_t)idx;
    else
        c->stale_all = true; /* registered since the last build: the next decision rebuilds */
}

void dh__coord_unqueue(dh_coordinator_t *c, int32_t idx, const entry_t *e)
{
    server_t *s = &c->servers[idx];
    if (s->queue_len)
        s->queue_len--;
    s->queued_cpu_s -= e->pred_cpu_s;
    if (s->queued_cpu_s < 0)
        s->queued_cpu_s = 0;
    dh__coord_touch(c, idx);
}

void dh__coord_set_link(dh_coordinator_t *c, uint32_t from, uint32_t to, dh_link_t link)
{
    c->links[from * MAX_NODES + to] = link;
    if (c->pindex && dh_place_index_set_link(c->pindex, from, to, link) != 0)
        c->stale_all = true;
}

void dh__coord_place_destroy(dh_coordinator_t *c)
{
    dh_place_index_destroy(&c->pindex);
    dh_free(c->dirty);
    c->dirty = NULL;
}

/* local_of from the kept states, the lowest index first (as dh__coord_local_server_of).
 * O(N): only when a refresh sees a server's liveness, role or node change. */
static void find_locals(dh_coordinator_t *c)
{
    for (uint32_t n = 0; n < MAX_NODES; n++)
        c->local_of[n] = -1;
    for (size_t i = c->n_indexed; i-- > 0;)
        if (c->snap[i].alive && c->snap[i].role == DH_SERVER_LOCAL && c->snap[i].node < MAX_NODES)
            c->local_of[c->snap[i].node] = (int32_t)i;
}

/* Brings the kept states (and the index) up to date: the touched servers, O(log N) each, or
 * after a registration every server and a new index (O(N log N + nodes^2), rare). Returns 0
 * or DH_ENOMEM. Without memory for the index, the states are kept and dh_place decides
 * until a later rebuild succeeds. */
static int refresh(dh_coordinator_t *c)
{
    if (c->n_servers == c->n_indexed && !c->stale_all) {
        bool locals = false;
        for (size_t k = 0; k < c->n_dirty; k++) {
            uint32_t i = c->dirty[k];
            dh_server_state_t st, *old = &c->snap[i];
            server_state(c, i, &st);
            locals |= st.alive != old->alive || st.role != old->role || st.node != old->node;
            *old = st;
            c->servers[i].dirty = false;
            if (c->pindex && dh_place_index_update(c->pindex, i, &st) != 0) {
                dh_place_index_destroy(&c->pindex); /* cannot happen: nodes < MAX_NODES */
                c->stale_all = true;
            }
        }
        c->n_dirty = 0;
        if (locals)
            find_locals(c);
        return 0;
    }
    if (dh__coord_grow((void **)&c->snap, &c->cap_snap, c->n_servers, sizeof *c->snap) ||
        dh__coord_grow((void **)&c->dirty, &c->cap_dirty, c->n_servers, sizeof *c->dirty))
        return DH_ENOMEM;
    dh_candidate_t *cand = dh_reallocarray(c->cand, c->cap_snap, sizeof *cand);
    if (!cand)
        return DH_ENOMEM;
    c->cand = cand;
    for (size_t i = 0; i < c->n_servers; i++) {
        server_state(c, i, &c->snap[i]);
        c->servers[i].dirty = false;
    }
    c->n_dirty = 0;
    c->n_indexed = c->n_servers;
    c->stale_all = false;
    find_locals(c);
    dh_place_index_destroy(&c->pindex);
    if (!c->telemetry) {
        dh_snapshot_t snap = {c->snap, (uint32_t)c->n_servers, c->links, MAX_NODES};
        if (dh_place_index_new(&c->pindex, &snap) != 0) {
            dh_log_debug("coordinator: no placement index for now: %s", dh_last_error());
            c->stale_all = true; /* try again at the next decision */
        }
    }
    return 0;
}

static bool same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static bool same_state(const dh_server_state_t *a, const dh_server_state_t *b)
{
    return a->node == b->node && a->role == b->role && a->alive == b->alive &&
           a->workers == b->workers && a->queue_len == b->queue_len &&
           a->queue_cap == b->queue_cap && same_bits(a->queue_wait_s, b->queue_wait_s) &&
           same_bits(a->speed_factor, b->speed_factor) &&
           same_bits(a->storage_s_per_B, b->storage_s_per_B);
}

/* DH_PLACE_CHECK=1: the decision made again as before the index, by dh_place on a snapshot
 * rebuilt from every server, and each kept state compared with the rebuilt one. A difference
 * means a site that changes a server did not call dh__coord_touch (or the index decided
 * otherwise): logged, then abort, so that a test fails loudly. O(N) per decision. */
static void check_decision(dh_coordinator_t *c, const dh_request_cost_t *req,
                           const dh_decision_t *d, int rc)
{
    size_t n = c->n_servers;
    dh_server_state_t *fresh = dh_malloc((n ? n : 1) * sizeof *fresh);
    if (!fresh)
        return; /* no memory for the check: the decision stands unchecked */
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        server_state(c, i, &fresh[i]);
        if (!same_state(&fresh[i], &c->snap[i])) {
            dh_log_error("coordinator: DH_PLACE_CHECK: server '%s' (%zu): kept state differs "
                         "from its fields (queue %u/%u, wait %.9g s; fields say %u/%u, %.9g s): "
                         "a change without dh__coord_touch",
                         c->servers[i].name, i, c->snap[i].queue_len, c->snap[i].queue_cap,
                         c->snap[i].queue_wait_s, fresh[i].queue_len, fresh[i].queue_cap,
                         fresh[i].queue_wait_s);
            ok = false;
        }
    }
    int32_t local = dh__coord_local_server_of(c, req->consumer_node);
    if (local != req->local_server) {
        dh_log_error("coordinator: DH_PLACE_CHECK: node %u's local DataServer is %d, kept %d",
                     req->consumer_node, local, req->local_server);
        ok = false;
    }
    dh_snapshot_t snap = {fresh, (uint32_t)n, c->links, MAX_NODES};
    dh_decision_t want = {.candidates = NULL};
    int want_rc = dh_place(&c->cfg.place, &snap, req, &want);
    if (want_rc != rc || want.server != d->server || want.reason != d->reason ||
        !same_bits(want.t_s, d->t_s) || !same_bits(want.miss_s, d->miss_s)) {
        dh_log_error("coordinator: DH_PLACE_CHECK: decided rc %d, server %d (%s), T %.17g, "
                     "miss %.17g; dh_place on every server: rc %d, server %d (%s), T %.17g, "
                     "miss %.17g",
                     rc, d->server, dh_place_reason_name(d->reason), d->t_s, d->miss_s, want_rc,
                     want.server, dh_place_reason_name(want.reason), want.t_s, want.miss_s);
        ok = false;
    }
    dh_free(fresh);
    if (!ok)
        abort();
}

/* Sources of one request grouped before their costs are added (more distinct sources in one
 * request add their samples one at a time: the same sums, more passes over the servers). */
#define FETCH_GROUPS 8

typedef struct fetch_group {
    int32_t source; /* -1: never observed, the prior (the same for all such sources) */
    uint32_t samples;
    double bytes;
} fetch_group_t;

/* The predicted fetch seconds of the entry's remote samples on each server, in c->fetch_cost
 * (n_servers entries): per sample, its source's latency + its bytes / bandwidth from each
 * server's estimate (dh__fetch_model_add_costs). NULL for an entry of local files only, or
 * without memory for the scratch (placement then sees no fetch, as before the model).
 * O(samples x sources) to find the sources, O(servers) per distinct source. */
static const double *fetch_costs(dh_coordinator_t *c, const entry_t *e)
{
    size_t n = c->n_servers;
    if (e->n_remote == 0 || n == 0 ||
        dh__coord_grow((void **)&c->fetch_cost, &c->cap_fetch_cost, n, sizeof *c->fetch_cost))
        return NULL;
    memset(c->fetch_cost, 0, n * sizeof *c->fetch_cost);
    fetch_group_t group[FETCH_GROUPS];
    size_t n_groups = 0;
    const dh_msg_request_t *q = &e->msg.request;
    for (uint32_t i = 0; i < q->n_samples; i++) {
        char key[DH__FETCH_SOURCE_MAX];
        dh__fetch_source_key(q->samples[i].uri, key);
        if (strcmp(key, DH__FETCH_SOURCE_LOCAL) == 0)
            continue;
        int32_t source = dh__fetch_model_source(c->fetch, key);
        double bytes = (double)q->samples[i].in_bytes;
        size_t g = 0;
        while (g < n_groups && group[g].source != source)
            g++;
        if (g == n_groups && n_groups == FETCH_GROUPS) {
            dh__fetch_model_add_costs(c->fetch, source, 1, bytes, c->fetch_cost, (uint32_t)n);
            continue;
        }
        if (g == n_groups)
            group[n_groups++] = (fetch_group_t){source, 0, 0};
        group[g].samples++;
        group[g].bytes += bytes;
    }
    for (size_t g = 0; g < n_groups; g++)
        dh__fetch_model_add_costs(c->fetch, group[g].source, group[g].samples, group[g].bytes,
                                  c->fetch_cost, (uint32_t)n);
    return c->fetch_cost;
}

bool dh__coord_is_remote(const char *uri)
{
    char key[DH__FETCH_SOURCE_MAX];
    dh__fetch_source_key(uri, key);
    return strcmp(key, DH__FETCH_SOURCE_LOCAL) != 0;
}

/* Places one entry and dispatches it. Returns 0 (dispatched), or DH_EAGAIN / DH_ENOSERVER
 * (stays in the book to place later). */
static int place_entry(dh_coordinator_t *c, entry_t *e)
{
    client_t *cl = &c->clients[e->client];
    uint64_t t0 = dh_clock_now_ns();
    if (refresh(c))
        return DH_EAGAIN;
    uint64_t refresh_ns = dh_clock_now_ns() - t0;
    int32_t target = cl->node < MAX_NODES ? c->local_of[cl->node] : -1;
    if (target < 0)
        return DH_ENOSERVER; /* nowhere to deliver until the node's DataServer is back */
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
    req.fetch_s = fetch_costs(c, e);
    dh_decision_t d = {.candidates = c->pindex ? NULL : c->cand};
    t0 = dh_clock_now_ns();
    int rc;
    if (c->pindex) {
        rc = dh_place_index_decide(c->pindex, &c->cfg.place, &req, &d);
    } else { /* telemetry on (every candidate's T), or no memory for the index: O(N) */
        dh_snapshot_t snap = {c->snap, (uint32_t)c->n_servers, c->links, MAX_NODES};
        rc = dh_place(&c->cfg.place, &snap, &req, &d);
    }
    dh__count(&c->counters.decisions, 1);
    dh__count(&c->counters.sched_s_ns, refresh_ns + (dh_clock_now_ns() - t0));
    dh__coord_metrics_decision(c, rc, &d);
    if (c->place_check)
        check_decision(c, &req, &d, rc);
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
    e->pred_t_s = d.t_s;
    e->pred_fetch_s =
        req.fetch_s && req.fetch_s[d.server] > 0 ? req.fetch_s[d.server] : 0; /* as placement */
    e->profile_cpu_s = profile;
    s->queue_len++;
    s->queued_cpu_s += pred;
    s->unseen_cpu_s[s->dispatched % UNSEEN_RING] = pred;
    s->dispatched++;
    dh__coord_touch(c, d.server);
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
