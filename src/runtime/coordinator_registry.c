/* coordinator_registry.c: the coordinator's registry of DataServers and clients
 * (docs/runtime.md): a peer's HELLO registers it (a client is told its node's local
 * DataServer, and told again when another registers), a DataServer's heartbeat keeps it
 * alive and corrects its book of queued work, and a GOODBYE, or its death by silence
 * (coordinator_liveness.c), takes it out, putting its undelivered requests back to be
 * placed again. Loop thread (coordinator.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/place.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/coordinator_metrics.h"

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

server_t *dh__coord_find_server(dh_coordinator_t *c, const char *name, int32_t *idx)
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

void dh__coord_on_hello(dh_coordinator_t *c, const char *peer, const dh_msg_hello_t *h)
{
    uint64_t now = dh_clock_now_ns();
    if (strcmp(peer, h->name) != 0) {
        dh_log_warn("coordinator: refusing HELLO from '%s' naming itself '%s' (the name must be "
                    "the routing id)",
                    peer, h->name);
        dh__coord_send_error(c, peer, DH_EINVAL, "HELLO name differs from the routing id");
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
                dh__coord_refuse(c, peer, rc, "client HELLO");
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
            dh__coord_send_error(c, peer, DH_ENOSERVER, text);
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
    server_t *s = dh__coord_find_server(c, peer, &idx);
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
            dh__coord_refuse(c, peer, rc, "DataServer HELLO");
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

void dh__coord_declare_dead(dh_coordinator_t *c, int32_t idx, const char *why)
{
    server_t *s = &c->servers[idx];
    if (!s->alive)
        return;
    s->alive = false;
    dh__coord_drop_late(c, idx, -1); /* its reports will not come */
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
            if (e->server >= 0 && e->server != idx && !e->executed)
                dh__coord_unqueue(c, e->server, e);
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

void dh__coord_on_server_dropped(dh_coordinator_t *c, int32_t idx, const char *text)
{
    server_t *s = &c->servers[idx];
    if (!s->alive)
        return;
    size_t replaced = 0;
    for (size_t i = 0; i < c->n_book; i++) {
        entry_t *e = &c->book[i];
        if (e->server != idx || e->executed)
            continue;
        dh__coord_unqueue(c, idx, e);
        e->server = -1;
        replaced++;
    }
    dh__coord_touch(c, idx);
    dh__count(&c->counters.redispatches, replaced);
    dh_log_warn("coordinator: %s; %zu requests dispatched to it and not reported placed again",
                text, replaced);
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

void dh__coord_on_heartbeat(dh_coordinator_t *c, const char *peer, const dh_msg_heartbeat_t *h)
{
    int32_t idx;
    server_t *s = dh__coord_find_server(c, peer, &idx);
    if (!s) {
        dh__coord_send_error(c, peer, DH_EUNKNOWN, "unknown DataServer: send HELLO");
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

void dh__coord_on_goodbye(dh_coordinator_t *c, const char *peer)
{
    int32_t idx;
    if (dh__coord_find_server(c, peer, &idx)) {
        dh__coord_declare_dead(c, idx, "it said GOODBYE");
        return;
    }
    if (!dh__coord_find_client(c, peer, &idx))
        return;
    size_t dropped = 0;
    for (size_t i = 0; i < c->n_book;) {
        entry_t *e = &c->book[i];
        if (e->client == idx) {
            if (e->server >= 0 && !e->executed)
                dh__coord_unqueue(c, e->server, e);
            dh__coord_book_remove(c, i);
            dropped++;
        } else {
            i++;
        }
    }
    dh__coord_drop_late(c, -1, idx);
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
