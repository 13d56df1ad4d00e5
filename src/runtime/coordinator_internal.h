/* runtime/coordinator_internal.h: the coordinator's state and the internals its files
 * share: coordinator.c (life cycle, the loop), coordinator_registry.c (servers and clients),
 * coordinator_book.c (the book of requests), coordinator_learn.c (the cost model, speeds,
 * predictions), coordinator_liveness.c, coordinator_place.c (placing a request: the servers'
 * kept states and the placement index, the DISPATCH, the decision log) and
 * coordinator_rebalance.c (tier 2). One thread: see coordinator.c.
 */
#ifndef DH_RUNTIME_COORDINATOR_INTERNAL_H
#define DH_RUNTIME_COORDINATOR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "datahelix/cost.h"
#include "datahelix/place.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "model/model_lib.h"
#include "runtime/awake.h"
#include "runtime/counters.h"
#include "runtime/stats_table.h"

#define MAX_NODES 64
#define NAME_CAP 128
#define ENDPOINT_CAP 256
#define UNSEEN_RING 64
#define GAP_RING 128 /* heartbeat gaps a server's liveness limit is learned from */

typedef struct server {
    char name[NAME_CAP];
    uint8_t role; /* dh_wire_role_t */
    uint32_t node;
    uint32_t workers;
    uint32_t pid;
    char endpoint[ENDPOINT_CAP];
    char shm_socket[NAME_CAP];
    bool alive;
    uint64_t last_seen_ns;
    /* its last GAP_RING heartbeat gaps (ms) within its limit, and the limit they give
     * (coordinator_liveness.c; 0 until learned) */
    float gap_ms[GAP_RING];
    uint32_t n_gaps;
    uint32_t limit_ms;
    uint32_t queue_len;  /* dispatched, not yet executed (the book) */
    double queued_cpu_s; /* their predicted CPU seconds at speed 1 */
    double speed;        /* learned observed / predicted */
    double storage_s_per_B;
    /* its placement state (c->snap[i]) is stale: a field above that it is computed from
     * changed (dh__coord_touch) */
    bool dirty;
    /* DISPATCHes sent since it registered, and the predicted CPU seconds of the last
     * UNSEEN_RING of them: a heartbeat names how many it had received, the rest are still
     * on their way and are added to its report (on_heartbeat). */
    uint64_t dispatched;
    double unseen_cpu_s[UNSEEN_RING];
} server_t;

typedef struct client {
    char name[NAME_CAP];
    uint32_t node;
    uint32_t rank;
    uint32_t pid;
    int32_t told; /* index of the local DataServer it was told about, or -1 */
} client_t;

#define DH__COORD_LATE_MAX 1024

typedef struct entry {
    dh_msg_t msg; /* the REQUEST, owned */
    int32_t client;
    int32_t server; /* executing server, -1 = to place */
    bool executed;  /* the executor reported COMPLETE (delivered=0) */
    uint64_t arrival_ns;
    double pred_cpu_s, in_bytes, out_bytes; /* pred_cpu_s: the model's, speed 1, set at each
                                             * placement (what the executor's book holds);
                                             * in_bytes: of its local samples only */
    uint32_t n_remote; /* samples from a remote source (their C_io: the fetch model) */
    uint32_t placements;
    /* the last placement's prediction, for the record of predicted vs actual */
    uint64_t dispatch_ns;
    double pred_c_cpu_s, pred_t_s, deadline_s, profile_cpu_s, pred_fetch_s;
} entry_t;

/* The coordinator's counters (counters.h): one per COUNTER or SECONDS row of its table
 * (stats_table.h; servers_alive is a gauge; sched_s_ns: time deciding, refresh and decision). */
typedef struct dh__coord_counters {
    DH__COORD_STATS(DH__STAT_COUNTER_FIELD)
} dh__coord_counters_t;

struct dh_coordinator {
    dh_coordinator_config_t cfg;
    void *ctx;
    bool own_ctx;
    dh_wire_keys_t *keys; /* CURVE (cfg.keys_dir), or NULL */
    int auth_ref;         /* holds ctx's ZAP handler (dh__wire_secure) */
    dh_wire_socket_t *sock;
    char endpoint[ENDPOINT_CAP];
    FILE *telemetry;
    char *telemetry_path;
    atomic_int stop;
    pthread_t thread;
    bool started;

    server_t *servers;
    size_t n_servers, cap_servers;
    client_t *clients;
    size_t n_clients, cap_clients;
    entry_t *book;
    size_t n_book, cap_book;
    /* Delivered requests whose executor's COMPLETE (its measurements) has not come yet: a
     * sidecar reports before it forwards, but the target's delivered COMPLETE arrives on
     * another pipe and may be read first. Kept (the REQUEST owned) until the executor's
     * report, the executor's death or its client's leaving; at most DH__COORD_LATE_MAX, the
     * oldest dropped first. */
    entry_t *late;
    size_t n_late, cap_late;
    char nodes[MAX_NODES][NAME_CAP];
    uint32_t n_nodes;
    dh_link_t links[MAX_NODES * MAX_NODES];

    dh_cost_model_t *model;
    /* The fetch model (src/model/fetch.c): remote samples' fetch seconds per (server index,
     * source), learned from executors' COMPLETEs under learn_lock, read by placement on the
     * loop thread; fetch_cost: placement's per-server scratch (cap_fetch_cost entries). */
    dh__fetch_model_t *fetch;
    double *fetch_cost;
    size_t cap_fetch_cost;
    /* Placement's view of the servers, kept current between decisions (coordinator_place.c):
     * snap[i] is server i's state, refreshed before a decision for the servers touched since
     * (dirty, n_dirty of them; stale_all: refresh all), and pindex decides over a copy of
     * it (NULL with telemetry on, which takes the exhaustive dh_place). local_of[node]: the
     * node's live local DataServer, recomputed when a refresh sees one change. */
    dh_server_state_t *snap;
    dh_candidate_t *cand;
    size_t cap_snap;
    dh_place_index_t *pindex;
    size_t n_indexed; /* servers in snap (and pindex) */
    uint32_t *dirty;
    size_t n_dirty, cap_dirty;
    bool stale_all;
    int32_t local_of[MAX_NODES];
    bool place_check; /* DH_PLACE_CHECK=1: every decision checked against dh_place */
    uint64_t start_ns;
    uint64_t incarnation; /* random id of this process, in the HELLOs it sends (wire.h) */
    bool pending_work;    /* entries to place exist */
    dh__awake_t awake;    /* the loop's own absence (coordinator_liveness.c) */

    dh__coord_counters_t counters; /* any thread (counters.h) */

    /* Learned state read by other threads (dh_coordinator_key_ratio, _server_speed,
     * _predictions): the loop takes learn_lock to change the model, a speed factor, the
     * servers array or the records; it reads them without it (it is the only writer). */
    pthread_mutex_t learn_lock;
    dh_prediction_t *predictions; /* n_predictions kept; a ring once at the maximum */
    size_t n_predictions, cap_predictions, next_prediction;

    struct dh__coord_rb *rb; /* tier 2's open rounds (coordinator_rebalance.c); NULL = none yet */

    struct dh__coord_metrics *metrics; /* --metrics-listen (coordinator_metrics.c); NULL = off */
};

/* ---- coordinator.c ---- */

/* Grows *arr (of *cap elements of elem bytes, zero-filled) to hold need. 0 or DH_ENOMEM. */
int dh__coord_grow(void **arr, size_t *cap, size_t need, size_t elem);

/* Sends msg to the peer named `peer` (its routing id). 0 or a negative code (logged). */
int dh__coord_send_to(dh_coordinator_t *c, const char *peer, const dh_msg_t *msg);

/* Sends the peer an ERROR with this code and text. */
void dh__coord_send_error(dh_coordinator_t *c, const char *peer, int code, const char *text);

/* A message the coordinator could not take in (`what`, failing with rc and dh_last_error()):
 * logged, and failed back to the sender with an ERROR, so nothing waits for it. */
void dh__coord_refuse(dh_coordinator_t *c, const char *peer, int rc, const char *what);

/* Handles up to max messages the coordinator's socket already holds, without waiting.
 * Returns how many. */
size_t dh__coord_drain(dh_coordinator_t *c, size_t max);

/* ---- coordinator_registry.c ---- */

/* The registered DataServer named `name` (its index in *idx when idx is not NULL), or NULL. */
server_t *dh__coord_find_server(dh_coordinator_t *c, const char *name, int32_t *idx);

/* The registered client named `name` (its index in *idx when idx is not NULL), or NULL. */
client_t *dh__coord_find_client(dh_coordinator_t *c, const char *name, int32_t *idx);

/* The index of the live local DataServer of a node, or -1. */
int32_t dh__coord_local_server_of(dh_coordinator_t *c, uint32_t node);

/* Marks server idx dead (why: for the log line) and puts its undelivered requests back in
 * the book to place again. */
void dh__coord_declare_dead(dh_coordinator_t *c, int32_t idx, const char *why);

/* The handlers of a peer's HELLO (a client or a DataServer registers), a DataServer's
 * HEARTBEAT and a peer's GOODBYE (a server leaves: declared dead; a client leaves: its
 * requests are dropped). `peer` is the routing id. */
void dh__coord_on_hello(dh_coordinator_t *c, const char *peer, const dh_msg_hello_t *h);
void dh__coord_on_heartbeat(dh_coordinator_t *c, const char *peer, const dh_msg_heartbeat_t *h);
void dh__coord_on_goodbye(dh_coordinator_t *c, const char *peer);

/* ---- coordinator_book.c ---- */

/* A client's REQUEST: into the book (r->msg is taken), unless already there; refused with
 * an ERROR when the book cannot grow. */
void dh__coord_on_request(dh_coordinator_t *c, const char *peer, dh_wire_received_t *r);

/* A DataServer's COMPLETE: from the executor, the request leaves its queue and is learned
 * from; delivered, it leaves the book (or waits in the late list for its executor's). */
void dh__coord_on_complete(dh_coordinator_t *c, const char *peer, const dh_msg_complete_t *m);

/* Removes the book's entry at pos (its REQUEST freed). */
void dh__coord_book_remove(dh_coordinator_t *c, size_t pos);

/* Drops the late entries of executor `server` (>= 0) or of client `client` (>= 0). */
void dh__coord_drop_late(dh_coordinator_t *c, int32_t server, int32_t client);

/* ---- coordinator_learn.c ---- */

/* Learns from executor si's COMPLETE m for the book's entry e (the cost model, the
 * server's speed) and records the prediction against the measurement. Takes learn_lock. */
/* Whether a sample's uri names a remote source (its dh__fetch_source_key is not "local"). */
bool dh__coord_is_remote(const char *uri);

void dh__coord_learn(dh_coordinator_t *c, int32_t si, const entry_t *e, const dh_msg_complete_t *m);

/* Anchors the speed factors at their median over the live executing servers, the model
 * scaled to match (the loop's tick). */
void dh__coord_anchor_speeds(dh_coordinator_t *c);

/* ---- coordinator_liveness.c ---- */

/* Liveness (docs/runtime.md "Liveness"). A DataServer (re)registered:
 * forget its heartbeat gaps. */
void dh__coord_liveness_reset(server_t *s);

/* Server s was heard from at now (before last_seen_ns is updated): learn its gap. */
void dh__coord_liveness_heard(dh_coordinator_t *c, server_t *s, uint64_t now);

/* The loop's turn began (its poll returned, before what it brought is handled): the time
 * this thread was not running since the last turn is not counted against any server (their
 * last_seen_ns move forward by it). poll_ns: the loop's poll timeout. */
void dh__coord_liveness_turn(dh_coordinator_t *c, uint64_t poll_ns);

/* Declares dead (dh__coord_declare_dead) each live server silent past its limit and not in
 * this process, after draining the socket (dh__coord_drain). Called by the loop's tick. */
void dh__coord_check_liveness(dh_coordinator_t *c);

/* ---- coordinator_place.c ---- */

/* Server idx changed a field its placement state is computed from (node, role, alive,
 * workers, queue_len, queued_cpu_s, speed, storage_s_per_B): every site that changes one
 * calls this, and the next decision refreshes its state. O(1). */
void dh__coord_touch(dh_coordinator_t *c, int32_t idx);

/* Takes request e's predicted work off server idx's queue (its executor reported it, or it
 * never will: delivered first, or re-placed from a dead server), and touches the server. */
void dh__coord_unqueue(dh_coordinator_t *c, int32_t idx, const entry_t *e);

/* DataServer idx dropped a message from the coordinator for lack of memory (its ERROR
 * DH_ENOMEM, `text`): the requests dispatched to it that it has not reported are placed again
 * (one of them is the lost DISPATCH; a copy of another that it still runs is a duplicate
 * its client drops). Logged with text. */
void dh__coord_on_server_dropped(dh_coordinator_t *c, int32_t idx, const char *text);

/* Replaces the link from node `from` to node `to` (c->links and the index). O(nodes). */
void dh__coord_set_link(dh_coordinator_t *c, uint32_t from, uint32_t to, dh_link_t link);

/* Frees placement's state (the index, the dirty list). */
void dh__coord_place_destroy(dh_coordinator_t *c);

/* Places and dispatches every request of the book not yet placed, in arrival order, until
 * one cannot be placed because every candidate is full; sets c->pending_work when some wait. */
void dh__coord_place_pending(dh_coordinator_t *c);

/* ---- coordinator_rebalance.c ---- */

/* A REBALANCE from `peer` (an OFFER; the message may be taken: in->msg is then zeroed). */
void dh__coord_on_rebalance(dh_coordinator_t *c, const char *peer, dh_wire_received_t *in);

/* Ends the rounds whose timeout passed (the loop's tick). */
void dh__coord_rb_tick(dh_coordinator_t *c);

/* Frees tier 2's state. */
void dh__coord_rb_destroy(dh_coordinator_t *c);

/* The speed factor learned for the server named `server` (NAN if no such server). Takes the
 * coordinator's learn lock: call it while the loop runs or after. For tests. */
double dh__coord_server_speed(const dh_coordinator_t *c, const char *server);
/* The fetch model's estimate for a sample of `source` (a dh__fetch_source_key) on the named
 * server (the pair's fit, else the source's, else the prior). Returns 0, or DH_EUNKNOWN
 * for a server never registered. Any thread (takes learn_lock). */
int dh__coord_fetch_estimate(const dh_coordinator_t *c, const char *server, const char *source,
                             dh__fetch_estimate_t *out);

#endif
