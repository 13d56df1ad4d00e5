/* coordinator.c: the registry, the liveness tracker and the scheduler of a job (docs/design.md §2,
 * §4.3; docs/runtime.md).
 *
 * One thread, one ROUTER socket. Peers are DEALERs whose routing id is their name. The
 * coordinator keeps:
 *   - servers: role, node, workers, endpoints, liveness (last message), the book of work
 *     dispatched to each (queue length, predicted seconds), a learned speed factor;
 *   - clients: rank, node, the local DataServer it was told about;
 *   - the book of requests not yet delivered, in arrival order. A request stays in the book
 *     until its delivering local DataServer reports delivered=1; until then a dead executor
 *     or a dead target puts it back into the "to place" state, so no sample is lost. The
 *     client drops the duplicates this can cause.
 * Placement keeps the servers' states and an index over them (coordinator_place.c): every
 * change below to a field a state is computed from calls dh__coord_touch. The book
 * is an array searched linearly: O(requests in flight) per completion, a few hundred in
 * practice; a hash would be the fix if clusters dh__coord_grow past thousands of ranks.
 * Tensors never pass through here.
 *
 * This file is the loop, the registry (HELLO, heartbeats, liveness, GOODBYE) and the book;
 * placing a request is coordinator_place.c, when a silent server is dead
 * coordinator_liveness.c.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "datahelix/rng.h"
#include "datahelix/place.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/coordinator_metrics.h"
#include "runtime/descriptor.h"
#include "wire/internal.h"

void dh_coordinator_config_default(dh_coordinator_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    dh_place_config_default(&cfg->place);
    cfg->dead_after_ms = 1000;
    cfg->queue_cap = 4;
    cfg->default_link_Bps = 1.25e9;
    cfg->default_latency_s = 100e-6;
}

int dh__coord_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = dh_reallocarray(*arr, n, elem);
    if (!p)
        return dh__set_error(DH_ENOMEM, "coordinator: out of memory");
    memset((char *)p + *cap * elem, 0, (n - *cap) * elem);
    *arr = p;
    *cap = n;
    return 0;
}

static uint32_t node_index(dh_coordinator_t *c, const char *name)
{
    for (uint32_t i = 0; i < c->n_nodes; i++)
        if (strcmp(c->nodes[i], name) == 0)
            return i;
    if (c->n_nodes == MAX_NODES) {
        dh_log_warn("coordinator: more than %d nodes; node '%s' shares the last slot", MAX_NODES,
                    name);
        return MAX_NODES - 1;
    }
    snprintf(c->nodes[c->n_nodes], NAME_CAP, "%s", name);
    return c->n_nodes++;
}

int dh_coordinator_new(dh_coordinator_t **out, const dh_coordinator_config_t *cfg)
{
    *out = NULL;
    if (!cfg || !cfg->listen || !cfg->listen[0])
        return dh__set_error(DH_EINVAL, "coordinator: no endpoint to listen on (--listen)");
    dh_coordinator_t *c = dh_calloc(1, sizeof *c);
    if (!c)
        return dh__set_error(DH_ENOMEM, "out of memory for the coordinator");
    c->cfg = *cfg;
    c->cfg.listen = NULL;
    c->cfg.telemetry_path = NULL;
    c->cfg.metrics_listen = NULL;
    pthread_mutex_init(&c->learn_lock, NULL);
    int rc = 0;
    c->ctx = cfg->zmq_ctx;
    if (!c->ctx) {
        c->ctx = zmq_ctx_new();
        c->own_ctx = true;
        if (!c->ctx) {
            rc = dh__set_error(DH_ENOMEM, "coordinator: zmq_ctx_new failed");
            goto fail;
        }
    }
    for (uint32_t i = 0; i < MAX_NODES * MAX_NODES; i++)
        c->links[i] = dh_link_make(cfg->default_link_Bps > 0 ? cfg->default_link_Bps : 1.25e9,
                                   cfg->default_latency_s);
    if ((rc = dh_cost_model_new(&c->model, NULL)))
        goto fail;
    c->cfg.keys_dir = c->cfg.key_name = NULL;
    if ((rc = dh__wire_secure(c->ctx, cfg->keys_dir, cfg->key_name, cfg->listen, &c->keys,
                              &c->auth_ref)))
        goto fail;
    dh_wire_socket_opts_t opts = {.keys = c->keys};
    if ((rc = dh_wire_socket_new(&c->sock, c->ctx, ZMQ_ROUTER, &opts)))
        goto fail;
    if ((rc = dh__wire_router_handover(c->sock)) ||
        (rc = dh_wire_socket_bind(c->sock, cfg->listen)))
        goto fail;
    if ((rc = dh__wire_last_endpoint(c->sock, c->endpoint, sizeof c->endpoint)))
        goto fail;
    if (cfg->telemetry_path && cfg->telemetry_path[0]) {
        c->telemetry = fopen(cfg->telemetry_path, "w");
        if (!c->telemetry) {
            rc = dh__set_error(-errno, "coordinator: cannot write telemetry file %s: %s",
                               cfg->telemetry_path, strerror(errno));
            goto fail;
        }
        c->telemetry_path = dh_strdup(cfg->telemetry_path);
        /* whole lines, as they happen: an operator (or a test) tails the file while the
         * job runs, and a coordinator killed mid-job leaves no half line */
        setvbuf(c->telemetry, NULL, _IOLBF, 0);
    }
    if (cfg->metrics_listen && cfg->metrics_listen[0] &&
        (rc = dh__coord_metrics_start(c, cfg->metrics_listen)))
        goto fail;
    const char *check = getenv("DH_PLACE_CHECK");
    c->place_check = check && strcmp(check, "1") == 0;
    c->start_ns = dh_clock_now_ns();
    /* never 0 (what anyone else sends); a restart at the same endpoint draws another */
    c->incarnation =
        dh_rng_mix(c->start_ns ^ ((uint64_t)getpid() << 32), (uint64_t)(uintptr_t)c) | 1;
    *out = c;
    return 0;
fail:
    dh_coordinator_destroy(&c);
    return rc;
}

const char *dh_coordinator_endpoint(const dh_coordinator_t *c)
{
    return c->endpoint;
}

void dh_coordinator_stats(const dh_coordinator_t *c, dh_coordinator_stats_t *out)
{
    memset(out, 0, sizeof *out);
    const dh__coord_counters_t *in = &c->counters;
    DH__COORD_COUNTERS(DH__COUNTER_READ)
    out->sched_s = (double)dh__counter_get(&in->sched_ns) * 1e-9;
}

static server_t *find_server(dh_coordinator_t *c, const char *name, int32_t *idx)
{
    for (size_t i = 0; i < c->n_servers; i++)
        if (strcmp(c->servers[i].name, name) == 0) {
            if (idx)
                *idx = (int32_t)i;
            return &c->servers[i];
        }
    return NULL;
}

client_t *dh__coord_find_client(dh_coordinator_t *c, const char *name, int32_t *idx)
{
    for (size_t i = 0; i < c->n_clients; i++)
        if (strcmp(c->clients[i].name, name) == 0) {
            if (idx)
                *idx = (int32_t)i;
            return &c->clients[i];
        }
    return NULL;
}

int32_t dh__coord_local_server_of(dh_coordinator_t *c, uint32_t node)
{
    for (size_t i = 0; i < c->n_servers; i++)
        if (c->servers[i].alive && c->servers[i].role == DH_WIRE_ROLE_LOCAL &&
            c->servers[i].node == node)
            return (int32_t)i;
    return -1;
}

int dh__coord_send_to(dh_coordinator_t *c, const char *peer, const dh_msg_t *msg)
{
    int rc = dh_wire_send(c->sock, peer, strlen(peer), msg, NULL, 0, 0);
    if (rc)
        dh_log_debug("coordinator: cannot send %s to '%s': %s", dh_msg_type_name(msg->type), peer,
                     dh_last_error());
    return rc;
}

static void send_error(dh_coordinator_t *c, const char *peer, int code, const char *text)
{
    dh_msg_t m = {.type = DH_MSG_ERROR};
    m.error.code = code;
    m.error.message = (char *)text;
    dh__coord_send_to(c, peer, &m);
}

/* A message the coordinator could not take in (no memory for its book, or to register its
 * sender): logged, and failed back to the sender with the error, so nothing waits for it. */
static void refuse(dh_coordinator_t *c, const char *peer, int rc, const char *what)
{
    char text[512];
    snprintf(text, sizeof text, "%s from '%s' dropped: %s", what, peer, dh_last_error());
    dh_log_error("coordinator: %s", text);
    send_error(c, peer, rc, text);
}

/* Tells a client which local DataServer serves its node. */
static void tell_client(dh_coordinator_t *c, client_t *cl, int32_t ds)
{
    server_t *s = &c->servers[ds];
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = DH_WIRE_ROLE_LOCAL;
    m.hello.node = c->nodes[s->node];
    m.hello.workers = s->workers;
    m.hello.name = s->name;
    m.hello.endpoint = s->endpoint;
    m.hello.shm_socket = s->shm_socket;
    m.hello.pid = s->pid;
    m.hello.incarnation = c->incarnation;
    if (dh__coord_send_to(c, cl->name, &m) == 0)
        cl->told = ds;
}

static void on_hello(dh_coordinator_t *c, const char *peer, const dh_msg_hello_t *h)
{
    uint64_t now = dh_clock_now_ns();
    if (strcmp(peer, h->name) != 0) {
        dh_log_warn("coordinator: refusing HELLO from '%s' naming itself '%s' (the name must be "
                    "the routing id)",
                    peer, h->name);
        send_error(c, peer, DH_EINVAL, "HELLO name differs from the routing id");
        return;
    }
    if (h->role == DH_WIRE_ROLE_CLIENT) {
        int32_t idx;
        client_t *cl = dh__coord_find_client(c, peer, &idx);
        bool fresh = cl == NULL; /* a known client repeats its HELLO as a liveness check */
        if (!cl) {
            int rc = dh__coord_grow((void **)&c->clients, &c->cap_clients, c->n_clients + 1,
                                    sizeof *c->clients);
            if (rc) {
                refuse(c, peer, rc, "client HELLO");
                return;
            }
            cl = &c->clients[c->n_clients++];
            snprintf(cl->name, NAME_CAP, "%s", peer);
            dh__count(&c->counters.clients, 1);
        }
        int32_t told = fresh ? -1 : cl->told;
        cl->node = node_index(c, h->node);
        cl->rank = h->rank;
        cl->pid = h->pid;
        cl->told = -1;
        int32_t ds = dh__coord_local_server_of(c, cl->node);
        if (ds < 0) {
            char text[256];
            snprintf(text, sizeof text, "no local DataServer registered on node '%s' yet", h->node);
            send_error(c, peer, DH_ENOSERVER, text);
            return;
        }
        if (fresh || told != ds)
            dh_log_info("coordinator: client '%s' (rank %u, node '%s', pid %u) -> local "
                        "DataServer '%s'",
                        peer, h->rank, h->node, h->pid, c->servers[ds].name);
        tell_client(c, cl, ds);
        return;
    }
    int32_t idx;
    server_t *s = find_server(c, peer, &idx);
    bool known = s != NULL;
    if (!s) {
        pthread_mutex_lock(&c->learn_lock); /* the array may move: readers hold the lock */
        int rc = dh__coord_grow((void **)&c->servers, &c->cap_servers, c->n_servers + 1,
                                sizeof *c->servers);
        if (!rc) {
            s = &c->servers[c->n_servers++];
            snprintf(s->name, NAME_CAP, "%s", peer);
            s->speed = 1.0;
        }
        pthread_mutex_unlock(&c->learn_lock);
        if (rc) {
            refuse(c, peer, rc, "DataServer HELLO");
            return;
        }
        idx = (int32_t)c->n_servers - 1;
    }
    s->role = h->role;
    s->node = node_index(c, h->node);
    s->workers = h->workers; /* 0: a delivery-only local DataServer, never a candidate */
    s->pid = h->pid;
    snprintf(s->endpoint, ENDPOINT_CAP, "%s", h->endpoint ? h->endpoint : "");
    snprintf(s->shm_socket, NAME_CAP, "%s", h->shm_socket ? h->shm_socket : "");
    s->last_seen_ns = now;
    dh__coord_liveness_reset(s);
    s->storage_s_per_B = 1.0 / 2e9;
    if (!s->alive)
        dh__count(&c->counters.servers_alive, 1);
    s->alive = true;
    /* A (re)registered server starts with an empty queue: what it had was placed again. A
     * new process counts the DISPATCHes it receives from 0. */
    s->queue_len = 0;
    s->queued_cpu_s = 0;
    s->dispatched = 0;
    dh__coord_touch(c, idx);
    dh_log_info("coordinator: %s DataServer '%s' %s (node '%s', %u workers, pid %u%s%s)",
                h->role == DH_WIRE_ROLE_LOCAL ? "local" : "remote", peer,
                known ? "registered again" : "registered", h->node, s->workers, h->pid,
                s->endpoint[0] ? ", data " : "", s->endpoint);
    if (h->role == DH_WIRE_ROLE_LOCAL)
        for (size_t i = 0; i < c->n_clients; i++)
            if (c->clients[i].node == s->node)
                tell_client(c, &c->clients[i], idx);
    c->pending_work = true;
}

static void drop_late(dh_coordinator_t *c, int32_t server, int32_t client);

void dh__coord_declare_dead(dh_coordinator_t *c, int32_t idx, const char *why)
{
    server_t *s = &c->servers[idx];
    if (!s->alive)
        return;
    s->alive = false;
    drop_late(c, idx, -1); /* its reports will not come */
    s->queue_len = 0;
    s->queued_cpu_s = 0;
    dh__coord_touch(c, idx);
    size_t replaced = 0;
    for (size_t i = 0; i < c->n_book; i++) {
        entry_t *e = &c->book[i];
        bool target_dead = false;
        if (s->role == DH_WIRE_ROLE_LOCAL) {
            client_t *cl = &c->clients[e->client];
            target_dead = cl->node == s->node;
        }
        if (e->server == idx || (target_dead && e->server >= 0)) {
            if (e->server >= 0 && e->server != idx && !e->executed) {
                server_t *x = &c->servers[e->server];
                if (x->queue_len)
                    x->queue_len--;
                x->queued_cpu_s -= e->pred_cpu_s;
                if (x->queued_cpu_s < 0)
                    x->queued_cpu_s = 0;
                dh__coord_touch(c, e->server);
            }
            e->server = -1;
            e->executed = false;
            replaced++;
        }
    }
    dh__count(&c->counters.servers_alive, (uint64_t)-1); /* a gauge: wraps back */
    dh__count(&c->counters.servers_dead_declared, 1);
    dh__count(&c->counters.redispatches, replaced);
    if (strcmp(why, "it said GOODBYE") == 0)
        dh_log_info("coordinator: DataServer '%s' left (GOODBYE); %zu undelivered requests to "
                    "place again",
                    s->name, replaced);
    else
        dh_log_warn("coordinator: DataServer '%s' (pid %u) declared dead: %s; %zu undelivered "
                    "requests to place again",
                    s->name, s->pid, why, replaced);
    if (s->role == DH_WIRE_ROLE_LOCAL)
        for (size_t i = 0; i < c->n_clients; i++)
            if (c->clients[i].told == idx)
                c->clients[i].told = -1;
    c->pending_work = true;
}

/* Corrects the book of server s from its heartbeat (docs/design.md §4.1, "Online feedback").
 * The book drifts: a COMPLETE lost with a connection, a request the server dropped (no
 * memory), a server revived after being declared dead that still runs what it had. The
 * heartbeat says what the server holds that it has not reported COMPLETE for (depth, and
 * their predicted seconds in the coordinator's own units: the DISPATCHes' pred_cpu_s), as of
 * when it was sent. The race: COMPLETEs and heartbeats travel on one socket in order, so
 * every COMPLETE sent before the heartbeat has been applied here, and every one sent after
 * it is counted in the report and will decrement the book when it arrives. DISPATCHes go
 * the other way: those the server had not received when it sent the heartbeat
 * (dispatched - dispatches_seen, the last ones sent) are added back from unseen_cpu_s. Then
 * the report replaces the book. Both sides count DISPATCHes from the server's last HELLO.
 * What stays: a request delivered by its target before its sidecar's COMPLETE arrives is
 * counted once more until the next heartbeat (one period). */
static void correct_book(server_t *s, const dh_msg_heartbeat_t *h)
{
    if (!s->alive)
        return;
    if (h->dispatches_seen > s->dispatched) {
        /* The counts disagree (DISPATCHes sent before a re-registration arrived after it):
         * take the server's count, assuming none in flight, and correct from the next. */
        s->dispatched = h->dispatches_seen;
        return;
    }
    uint64_t unseen = s->dispatched - h->dispatches_seen;
    if (unseen > UNSEEN_RING)
        return; /* more in flight than remembered: keep the book until it catches up */
    double unseen_cpu = 0;
    for (uint64_t k = 0; k < unseen; k++)
        unseen_cpu += s->unseen_cpu_s[(s->dispatched - 1 - k) % UNSEEN_RING];
    s->queue_len = h->queue_depth + (uint32_t)unseen;
    s->queued_cpu_s = h->queue_work_s + unseen_cpu;
}

static void on_heartbeat(dh_coordinator_t *c, const char *peer, const dh_msg_heartbeat_t *h)
{
    int32_t idx;
    server_t *s = find_server(c, peer, &idx);
    if (!s) {
        send_error(c, peer, DH_EUNKNOWN, "unknown DataServer: send HELLO");
        return;
    }
    uint64_t now = dh_clock_now_ns();
    dh__coord_metrics_heartbeat(c, (double)(now - s->last_seen_ns) * 1e-9);
    dh__coord_liveness_heard(c, s, now);
    s->last_seen_ns = now;
    if (!s->alive) {
        /* A stopped process that resumed (SIGCONT): it is usable again, with an empty book
         * (its old requests were placed elsewhere; what it still delivers is dropped by the
         * clients as duplicates). */
        s->alive = true;
        s->queue_len = 0;
        s->queued_cpu_s = 0;
        dh__count(&c->counters.servers_alive, 1);
        dh_log_info("coordinator: DataServer '%s' is back (heartbeat after being declared dead)",
                    s->name);
        if (s->role == DH_WIRE_ROLE_LOCAL)
            for (size_t i = 0; i < c->n_clients; i++)
                if (c->clients[i].node == s->node && c->clients[i].told < 0)
                    tell_client(c, &c->clients[i], idx);
        c->pending_work = true;
    }
    s->workers = h->workers;
    uint32_t booked = s->queue_len;
    correct_book(s, h);
    if (s->queue_len < booked)
        c->pending_work = true; /* room freed: requests waiting in the book may go there */
    /* C_io from the reads the server observed (none measured: the assumed 2 GB/s stays). */
    if (h->read_bytes_per_s > 0)
        s->storage_s_per_B = 1.0 / h->read_bytes_per_s;
    dh__coord_touch(c, idx); /* alive, workers, the book, storage: any may have changed */
    /* recent_latency_s is not used: it is queue wait + execution + delivery of past
     * requests, which C_queue (the corrected book) and C_cpu (the learned model) already
     * predict term by term; adding it would count the queue twice. */
    for (uint32_t i = 0; i < h->n_links; i++) {
        if (!(h->links[i].bytes_per_s > 0))
            continue;
        uint32_t to = node_index(c, h->links[i].node);
        if (to != s->node)
            dh__coord_set_link(c, s->node, to,
                               dh_link_make(h->links[i].bytes_per_s,
                                            h->links[i].latency_s > 0 ? h->links[i].latency_s
                                                                      : c->cfg.default_latency_s));
    }
}

static entry_t *find_entry(dh_coordinator_t *c, const char *client, uint64_t seq, size_t *pos)
{
    for (size_t i = 0; i < c->n_book; i++) {
        entry_t *e = &c->book[i];
        if (e->msg.request.seq == seq && strcmp(e->msg.request.client_id, client) == 0) {
            if (pos)
                *pos = i;
            return e;
        }
    }
    return NULL;
}

static void remove_entry(dh_coordinator_t *c, size_t pos)
{
    dh_msg_clear(&c->book[pos].msg);
    memmove(&c->book[pos], &c->book[pos + 1], (c->n_book - pos - 1) * sizeof *c->book);
    c->n_book--;
}

static void remove_late(dh_coordinator_t *c, size_t pos)
{
    dh_msg_clear(&c->late[pos].msg);
    memmove(&c->late[pos], &c->late[pos + 1], (c->n_late - pos - 1) * sizeof *c->late);
    c->n_late--;
}

/* The book's entry at pos was delivered before its executor reported: it moves to the late
 * list (the REQUEST with it), to be learned from when the report comes. Without memory (or
 * at the bound, the oldest making room) the request simply goes unlearned, as before. */
static void keep_for_executor(dh_coordinator_t *c, size_t pos)
{
    if (c->n_late == DH__COORD_LATE_MAX)
        remove_late(c, 0);
    if (dh__coord_grow((void **)&c->late, &c->cap_late, c->n_late + 1, sizeof *c->late) != 0) {
        remove_entry(c, pos);
        return;
    }
    c->late[c->n_late++] = c->book[pos];
    memmove(&c->book[pos], &c->book[pos + 1], (c->n_book - pos - 1) * sizeof *c->book);
    c->n_book--;
}

/* Drops the late entries of executor `server` (>= 0) or of client `client` (>= 0). */
static void drop_late(dh_coordinator_t *c, int32_t server, int32_t client)
{
    for (size_t i = 0; i < c->n_late;)
        if ((server >= 0 && c->late[i].server == server) ||
            (client >= 0 && c->late[i].client == client))
            remove_late(c, i);
        else
            i++;
}

static void on_request(dh_coordinator_t *c, const char *peer, dh_wire_received_t *r)
{
    dh_msg_request_t *q = &r->msg.request;
    int32_t ci;
    if (!dh__coord_find_client(c, q->client_id, &ci) || strcmp(peer, q->client_id) != 0) {
        /* DH_EUNKNOWN: the client registers again and sends what is outstanding (after a
         * coordinator restart, which forgot every client) instead of failing */
        send_error(c, peer, DH_EUNKNOWN,
                   "REQUEST from a client this coordinator does not know: send HELLO");
        return;
    }
    if (find_entry(c, q->client_id, q->seq, NULL))
        return; /* a repeated request: already in the book */
    int rc = DH_FAULT(DH_FAULT_COORD_BOOK)
                 ? dh__set_error(DH_ENOMEM, "coordinator: out of memory (injected)")
                 : dh__coord_grow((void **)&c->book, &c->cap_book, c->n_book + 1, sizeof *c->book);
    if (rc) {
        char what[64];
        snprintf(what, sizeof what, "request %llu", (unsigned long long)q->seq);
        refuse(c, peer, rc, what);
        return;
    }
    entry_t *e = &c->book[c->n_book++];
    memset(e, 0, sizeof *e);
    e->msg = r->msg; /* ownership moves to the book */
    memset(&r->msg, 0, sizeof r->msg);
    e->client = ci;
    e->server = -1;
    e->arrival_ns = dh_clock_now_ns();
    for (uint32_t i = 0; i < e->msg.request.n_samples; i++) {
        dh_profile_row_t row;
        dh__rt_row_of_sample(&e->msg.request.samples[i], &row);
        e->pred_cpu_s += dh_cost_model_predict(c->model, &row, NULL);
        e->in_bytes += (double)e->msg.request.samples[i].in_bytes;
        e->out_bytes += (double)e->msg.request.samples[i].out_bytes;
    }
    dh__count(&c->counters.requests, 1);
    c->pending_work = true;
}

/* Learns from an executor's COMPLETE (learn_lock held): the cost model observes each
 * sample's measured CPU seconds per profile key, and the server's speed factor learns only
 * what the model cannot explain. Both must not learn the same discrepancy: in the emulation
 * every server truly runs at speed 1 while each key is off by its own bias, so a speed
 * factor that learned measured / predicted would swing with the keys of the requests it
 * happened to run (and then hide them from the model, which divides by it). So the speed
 * factor's residual is measured / (model x speed) over the samples whose key the model
 * already knows (DH_COST_FROM_KEY), taken before this request is observed, clamped and
 * averaged slowly (dh_cost_speed_learn); samples of keys not known yet teach the speed
 * nothing. A truly slower server still shows: its residual stays above 1 on every key, and
 * the model, which divides by the speed, stops absorbing it once the speed has. A sender
 * without per-sample measurements teaches the speed from the request's total.
 * O(samples), one hash look-up each. */
static void learn(dh_coordinator_t *c, server_t *s, const entry_t *e, const dh_msg_complete_t *m)
{
    const dh_msg_request_t *q = &e->msg.request;
    uint32_t n = m->n_samples < q->n_samples ? m->n_samples : q->n_samples;
    double known_measured = 0, known_predicted = 0;
    bool per_sample = false;
    for (uint32_t i = 0; i < n; i++) {
        per_sample |= m->samples[i].cpu_s > 0;
        if (m->samples[i].status != 0 || !(m->samples[i].cpu_s > 0))
            continue; /* failed, or not measured */
        dh_profile_row_t row;
        dh__rt_row_of_sample(&q->samples[i], &row);
        dh_cost_source_t src;
        double pred = dh_cost_model_predict(c->model, &row, &src);
        if (src == DH_COST_FROM_KEY && pred > 0) {
            known_measured += m->samples[i].cpu_s;
            known_predicted += pred * s->speed;
        }
        if (dh_cost_model_observe(c->model, &row, m->samples[i].cpu_s, s->speed) != 0)
            dh_log_debug("coordinator: cost model: %s", dh_last_error());
    }
    if (!per_sample) { /* a sender without per-sample measurements */
        known_measured = m->cpu_s;
        known_predicted = e->pred_cpu_s * s->speed;
    }
    s->speed = dh_cost_speed_learn(s->speed, known_measured, known_predicted);
    dh__coord_touch(c, (int32_t)(s - c->servers));
}

/* Keeps the executed request's predicted and actual costs (learn_lock held), and writes them
 * to the telemetry as a "complete" line. */
static void record_prediction(dh_coordinator_t *c, int32_t si, const entry_t *e,
                              const dh_msg_complete_t *m)
{
    dh_prediction_t p = {.rank = e->msg.request.rank,
                         .seq = e->msg.request.seq,
                         .n_samples = e->msg.request.n_samples,
                         .server = (uint32_t)si,
                         .deadline_s = e->deadline_s,
                         .pred_cpu_s = e->pred_c_cpu_s,
                         .profile_cpu_s = e->profile_cpu_s,
                         .actual_cpu_s = m->cpu_s,
                         .pred_ready_s = e->pred_t_s,
                         .actual_ready_s = dh_clock_elapsed_s(e->dispatch_ns, dh_clock_now_ns())};
    if (c->n_predictions < DH_COORDINATOR_PREDICTIONS_MAX) {
        /* capacities double from 16: the last growth lands on the maximum exactly */
        if (dh__coord_grow((void **)&c->predictions, &c->cap_predictions, c->n_predictions + 1,
                           sizeof *c->predictions) == 0)
            c->predictions[c->n_predictions++] = p;
        /* else no memory for the record: the run goes on without it */
    } else { /* full: a ring, next_prediction the oldest */
        c->predictions[c->next_prediction] = p;
        c->next_prediction = (c->next_prediction + 1) % DH_COORDINATOR_PREDICTIONS_MAX;
    }
    dh__coord_metrics_prediction(c, &p);
    if (c->telemetry)
        fprintf(c->telemetry,
                "{\"t_s\":%.6f,\"event\":\"complete\",\"client\":\"%s\",\"seq\":%llu,"
                "\"rank\":%u,\"server\":\"%s\",\"samples\":%u,\"deadline_s\":%.6f,"
                "\"pred_cpu_s\":%.6f,\"cpu_s\":%.6f,\"pred_t_s\":%.6f,\"t_actual_s\":%.6f}\n",
                dh_clock_elapsed_s(c->start_ns, dh_clock_now_ns()), e->msg.request.client_id,
                (unsigned long long)p.seq, p.rank, c->servers[si].name, p.n_samples, p.deadline_s,
                p.pred_cpu_s, p.actual_cpu_s, p.pred_ready_s, p.actual_ready_s);
}

size_t dh_coordinator_predictions(const dh_coordinator_t *cc, dh_prediction_t *out, size_t cap)
{
    dh_coordinator_t *c = (dh_coordinator_t *)cc; /* the lock only */
    pthread_mutex_lock(&c->learn_lock);
    size_t n = c->n_predictions;
    /* oldest first: the ring starts at next_prediction once it is full */
    size_t first = n == DH_COORDINATOR_PREDICTIONS_MAX ? c->next_prediction : 0;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = c->predictions[(first + i) % DH_COORDINATOR_PREDICTIONS_MAX];
    pthread_mutex_unlock(&c->learn_lock);
    return n;
}

double dh_coordinator_key_ratio(const dh_coordinator_t *cc, const char *profile_key, uint64_t *obs)
{
    dh_coordinator_t *c = (dh_coordinator_t *)cc;
    pthread_mutex_lock(&c->learn_lock);
    double r = dh_cost_model_key_ratio(c->model, profile_key, obs);
    pthread_mutex_unlock(&c->learn_lock);
    return r;
}

double dh_coordinator_server_speed(const dh_coordinator_t *cc, const char *server)
{
    dh_coordinator_t *c = (dh_coordinator_t *)cc;
    pthread_mutex_lock(&c->learn_lock);
    double speed = NAN;
    for (size_t i = 0; i < c->n_servers; i++)
        if (strcmp(c->servers[i].name, server) == 0)
            speed = c->servers[i].speed;
    pthread_mutex_unlock(&c->learn_lock);
    return speed;
}

static void on_complete(dh_coordinator_t *c, const char *peer, const dh_msg_complete_t *m)
{
    int32_t si = -1;
    server_t *s = find_server(c, peer, &si);
    if (s)
        s->last_seen_ns = dh_clock_now_ns();
    dh__count(&c->counters.completes, 1);
    size_t pos;
    entry_t *e = find_entry(c, m->client_id, m->seq, &pos);
    if (!e) {
        /* delivered already: the executor's report that the delivery overtook, or a
         * duplicate, or its client left */
        for (size_t i = 0; s && !m->delivered && i < c->n_late; i++) {
            entry_t *l = &c->late[i];
            if (l->server == si && l->msg.request.seq == m->seq &&
                strcmp(l->msg.request.client_id, m->client_id) == 0) {
                pthread_mutex_lock(&c->learn_lock);
                learn(c, s, l, m);
                record_prediction(c, si, l, m);
                pthread_mutex_unlock(&c->learn_lock);
                remove_late(c, i);
                break;
            }
        }
        return;
    }
    bool from_executor = s && e->server == si && !e->executed;
    if (from_executor) {
        e->executed = true;
        if (s->queue_len)
            s->queue_len--;
        s->queued_cpu_s -= e->pred_cpu_s;
        if (s->queued_cpu_s < 0)
            s->queued_cpu_s = 0;
        dh__coord_touch(c, si);
        pthread_mutex_lock(&c->learn_lock);
        learn(c, s, e, m);
        record_prediction(c, si, e, m);
        pthread_mutex_unlock(&c->learn_lock);
    }
    if (m->delivered) {
        bool unreported = e->server >= 0 && !e->executed;
        if (unreported) {
            server_t *x = &c->servers[e->server];
            if (x->queue_len)
                x->queue_len--;
            x->queued_cpu_s -= e->pred_cpu_s;
            if (x->queued_cpu_s < 0)
                x->queued_cpu_s = 0;
            dh__coord_touch(c, e->server);
        }
        /* delivered before its executor reported (another peer's pipe read first): keep it
         * for the report, which carries the measurements */
        if (unreported && e->server != si && c->servers[e->server].alive)
            keep_for_executor(c, pos);
        else
            remove_entry(c, pos);
        dh__count(&c->counters.delivered, 1);
    }
    c->pending_work = true;
}

static void on_goodbye(dh_coordinator_t *c, const char *peer)
{
    int32_t idx;
    if (find_server(c, peer, &idx)) {
        dh__coord_declare_dead(c, idx, "it said GOODBYE");
        return;
    }
    if (!dh__coord_find_client(c, peer, &idx))
        return;
    size_t dropped = 0;
    for (size_t i = 0; i < c->n_book;) {
        entry_t *e = &c->book[i];
        if (e->client == idx) {
            if (e->server >= 0 && !e->executed) {
                server_t *x = &c->servers[e->server];
                if (x->queue_len)
                    x->queue_len--;
                x->queued_cpu_s -= e->pred_cpu_s;
                if (x->queued_cpu_s < 0)
                    x->queued_cpu_s = 0;
                dh__coord_touch(c, e->server);
            }
            remove_entry(c, i);
            dropped++;
        } else {
            i++;
        }
    }
    drop_late(c, -1, idx);
    dh_log_info("coordinator: client '%s' left (%zu requests dropped)", peer, dropped);
    /* Forgotten, so that a long-lived coordinator's table does not grow with every client
     * that ever came (a DataLoader opens one per epoch): the last client takes its slot,
     * and its requests follow it. None of idx's is left in the book or the late list. */
    int32_t last = (int32_t)c->n_clients - 1;
    if (idx != last) {
        c->clients[idx] = c->clients[last];
        for (size_t i = 0; i < c->n_book; i++)
            if (c->book[i].client == last)
                c->book[i].client = idx;
        for (size_t i = 0; i < c->n_late; i++)
            if (c->late[i].client == last)
                c->late[i].client = idx;
    }
    c->n_clients--;
}

/* Anchors the speed factors at their median over the live executing servers, the model
 * scaled to match (dh_cost_speed_anchor: the model and the speeds share a free common
 * factor, fixed by assuming most servers run as profiled). On the loop's tick (20 ms):
 * O(servers log servers). */
static void anchor_speeds(dh_coordinator_t *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_servers; i++)
        n += c->servers[i].alive && c->servers[i].workers > 0;
    if (n < 2)
        return;
    double *speeds = dh_malloc(n * sizeof *speeds);
    if (!speeds)
        return;
    n = 0;
    for (size_t i = 0; i < c->n_servers; i++)
        if (c->servers[i].alive && c->servers[i].workers > 0)
            speeds[n++] = c->servers[i].speed;
    double median = dh_cost_speed_anchor(speeds, n);
    dh_free(speeds);
    if (fabs(median - 1) < 1e-3)
        return; /* not worth touching the model for */
    pthread_mutex_lock(&c->learn_lock);
    for (size_t i = 0; i < c->n_servers; i++) {
        c->servers[i].speed /= median;
        dh__coord_touch(c, (int32_t)i); /* O(N) on the tick, and only when the median moved */
    }
    dh_cost_model_scale(c->model, median);
    pthread_mutex_unlock(&c->learn_lock);
}

static void handle(dh_coordinator_t *c, dh_wire_received_t *r)
{
    char peer[NAME_CAP];
    size_t n = r->routing_id_size < NAME_CAP - 1 ? r->routing_id_size : NAME_CAP - 1;
    memcpy(peer, r->routing_id, n);
    peer[n] = '\0';
    switch (r->msg.type) {
    case DH_MSG_HELLO:
        on_hello(c, peer, &r->msg.hello);
        break;
    case DH_MSG_HEARTBEAT:
        on_heartbeat(c, peer, &r->msg.heartbeat);
        break;
    case DH_MSG_REQUEST:
        on_request(c, peer, r);
        break;
    case DH_MSG_COMPLETE:
        on_complete(c, peer, &r->msg.complete);
        break;
    case DH_MSG_GOODBYE:
        on_goodbye(c, peer);
        break;
    case DH_MSG_REBALANCE:
        dh__coord_on_rebalance(c, peer, r);
        break;
    case DH_MSG_ERROR:
        dh_log_warn("coordinator: '%s' reports %s: %s", peer, dh_err_name(r->msg.error.code),
                    r->msg.error.message);
        break;
    default:
        dh_log_warn("coordinator: unexpected %s from '%s' ignored", dh_msg_type_name(r->msg.type),
                    peer);
    }
}

size_t dh__coord_drain(dh_coordinator_t *c, size_t max)
{
    dh_wire_received_t r = {0};
    size_t n = 0;
    for (; n < max && dh_wire_recv(c->sock, 0, &r) == 0; n++) {
        handle(c, &r);
        dh_wire_received_release(&r);
    }
    return n;
}

int dh_coordinator_run(dh_coordinator_t *c)
{
    dh_log_info("coordinator: listening on %s (policy %s, dead after %u ms)", c->endpoint,
                dh_policy_name(c->cfg.place.policy), c->cfg.dead_after_ms);
    dh_wire_received_t r = {0};
    uint64_t last_tick = 0;
    int rc = 0;
    while (!atomic_load(&c->stop)) {
        int got = dh_wire_recv(c->sock, 20, &r);
        if (got == 0) {
            handle(c, &r);
            dh_wire_received_release(&r);
            /* Drain what else is queued before placing, so a burst is placed in order. */
            dh__coord_drain(c, 256);
        } else if (got == DH_EPARSE) {
            dh_log_warn("coordinator: dropped a malformed message: %s", dh_last_error());
        } else if (got != DH_EAGAIN && got != -EINTR) {
            rc = got;
            dh_log_error("coordinator: receive failed: %s", dh_last_error());
            break;
        }
        uint64_t now = dh_clock_now_ns();
        if (now - last_tick > 20000000ull) {
            last_tick = now;
            dh__coord_check_liveness(c);
            anchor_speeds(c);
            dh__coord_rb_tick(c);
            dh__coord_metrics_tick(c);
            if (c->telemetry)
                fflush(c->telemetry);
        }
        dh__coord_place_pending(c);
    }
    dh_log_info("coordinator: stopping (%zu requests undelivered in the book)", c->n_book);
    return rc;
}

static void *thread_main(void *arg)
{
    dh_coordinator_run(arg);
    return NULL;
}

int dh_coordinator_start(dh_coordinator_t *c)
{
    int e = pthread_create(&c->thread, NULL, thread_main, c);
    if (e)
        return dh__set_error(-e, "coordinator: pthread_create: %s", strerror(e));
    c->started = true;
    return 0;
}

void dh_coordinator_stop(dh_coordinator_t *c)
{
    atomic_store(&c->stop, 1);
}

void dh_coordinator_destroy(dh_coordinator_t **pc)
{
    if (!pc || !*pc)
        return;
    dh_coordinator_t *c = *pc;
    if (c->started) {
        dh_coordinator_stop(c);
        pthread_join(c->thread, NULL);
    }
    dh__coord_metrics_destroy(c); /* its scrapes read the counters below */
    for (size_t i = 0; i < c->n_book; i++)
        dh_msg_clear(&c->book[i].msg);
    dh_free(c->book);
    for (size_t i = 0; i < c->n_late; i++)
        dh_msg_clear(&c->late[i].msg);
    dh_free(c->late);
    dh__coord_rb_destroy(c);
    dh_free(c->predictions);
    pthread_mutex_destroy(&c->learn_lock);
    dh_free(c->servers);
    dh_free(c->clients);
    dh__coord_place_destroy(c);
    dh_free(c->snap);
    dh_free(c->cand);
    dh_cost_model_destroy(&c->model);
    dh_wire_socket_destroy(&c->sock);
    dh__wire_secure_end(c->ctx, &c->keys, c->auth_ref);
    if (c->telemetry)
        fclose(c->telemetry);
    dh_free(c->telemetry_path);
    if (c->own_ctx && c->ctx)
        zmq_ctx_term(c->ctx);
    dh_free(c);
    *pc = NULL;
}
