/* place.h: placement of a request on a DataServer (docs/design.md §4.3). Pure: no I/O, no threads,
 * no clocks; the runtime, the benchmark harness and the tests call the same functions.
 *
 * Policies, selectable by name:
 *   local          the rank's local DataServer only (rank-local loaders)
 *   least-request  the live server with the fewest outstanding requests per worker (a Ray
 *                  actor pool)
 *   deadline       the rule below, over the cost model of cost.h
 *
 * The deadline rule:
 *   1. drop candidates that are dead or at their queue cap (backpressure);
 *   2. if the rank's local server meets D (T <= D), keep it local, unless a remote
 *      candidate meets D with a gain T_local - T_remote above the hysteresis threshold
 *      max(hysteresis_s, hysteresis_frac x T_local), so decisions do not flap;
 *   3. else, among candidates that meet D, the one with the least transfer (bytes between
 *      nodes), then the smallest T;
 *   4. else (all miss), the earliest predicted finish.
 * Ties break on the lower server index, so the same input always gives the same decision.
 * Every decision returns every candidate's T, miss and status, and the reason.
 */
#ifndef DATAHELIX_PLACE_H
#define DATAHELIX_PLACE_H

#include "datahelix/export.h"

#include <stdint.h>

#include "datahelix/cost.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DH_POLICY_LOCAL = 0,
    DH_POLICY_LEAST_REQUEST = 1,
    DH_POLICY_DEADLINE = 2,
} dh_policy_t;

#define DH_POLICY_COUNT 3

typedef enum {
    DH_REASON_LOCAL_MEETS = 0,     /* rule 2: the local server meets D */
    DH_REASON_REMOTE_GAIN = 1,     /* rule 2: local meets D, a remote gains above hysteresis */
    DH_REASON_LEAST_TRANSFER = 2,  /* rule 3: local misses; least transfer among those meeting */
    DH_REASON_EARLIEST_FINISH = 3, /* rule 4: all miss; earliest predicted finish */
    DH_REASON_LOCAL_POLICY = 4,    /* policy local */
    DH_REASON_LEAST_REQUEST = 5,   /* policy least-request */
    DH_REASON_NO_CANDIDATE = 6,    /* nothing eligible (see the return code) */
} dh_place_reason_t;

typedef enum {
    DH_CANDIDATE_OK = 0,   /* eligible */
    DH_CANDIDATE_DEAD = 1, /* excluded: declared dead */
    DH_CANDIDATE_FULL = 2, /* excluded: at its queue cap (backpressure) */
} dh_candidate_status_t;

typedef struct dh_candidate {
    double t_s;     /* predicted time until ready (T) */
    double miss_s;  /* max(0, T - D) */
    uint8_t status; /* dh_candidate_status_t */
} dh_candidate_t;

typedef struct dh_place_config {
    dh_policy_t policy;
    double hysteresis_s;    /* absolute gain a remote needs over a local that meets D */
    double hysteresis_frac; /* ... or this fraction of the local T, whichever is larger */
} dh_place_config_t;

typedef struct dh_decision {
    int32_t server; /* chosen server index, or -1 */
    dh_place_reason_t reason;
    double t_s;                 /* the chosen server's T (NaN when server is -1) */
    double miss_s;              /* its max(0, T - D) (NaN when server is -1) */
    dh_candidate_t *candidates; /* caller's buffer of n_servers entries, filled (may be NULL) */
} dh_decision_t;

/* Fills *cfg with the defaults: deadline policy, hysteresis 5 ms or 10% of local T. */
DH_EXTERN void dh_place_config_default(dh_place_config_t *cfg);

/* Parses "local", "least-request", "deadline". Returns 0 or DH_EUNKNOWN. */
DH_EXTERN int dh_policy_from_name(const char *name, dh_policy_t *out);
DH_EXTERN const char *dh_policy_name(dh_policy_t policy);

/* Short text for a reason ("local meets deadline"). Static storage. */
DH_EXTERN const char *dh_place_reason_text(dh_place_reason_t reason);
/* Identifier for a reason ("local_meets"), for telemetry. Static storage. */
DH_EXTERN const char *dh_place_reason_name(dh_place_reason_t reason);

/* Chooses the server for one request under cfg->policy. Fills out->server, out->reason and,
 * if out->candidates is not NULL, one entry per snapshot server (index = server index).
 * Also fills out->t_s and out->miss_s, the chosen server's T and miss.
 * Returns 0; DH_ENOSERVER when no server is alive (or, for `local`, the rank has no live
 * local server); DH_EAGAIN when live candidates exist but all are at their cap
 * (backpressure: retry when a completion frees a slot). Cost: O(n_servers), no allocation.
 * Deterministic. Thread-safe on distinct outputs (reads the snapshot only). */
DH_EXTERN int dh_place(const dh_place_config_t *cfg, const dh_snapshot_t *snap,
                       const dh_request_cost_t *req, dh_decision_t *out);

/* ---- The index: the same decisions without a scan per decision ---------------------- */

/* A placement index (docs/scheduler.md §2, "The index"): a copy of a snapshot's servers and
 * links, kept in a tournament tree of per-subtree minima, that decides exactly as dh_place
 * would on that copy (same return code, server, reason, T and miss, ties included) without
 * scoring every server. The caller keeps it current with dh_place_index_update (one server)
 * and dh_place_index_set_link. One thread, like a snapshot; decide only reads it. */
typedef struct dh_place_index dh_place_index_t;

/* Builds an index over a copy of *snap (the arrays are not kept). Cost O(N log N + nodes^2);
 * memory 16 B per node pair (a copy of the links, by consumer) and ~120 B per server. *out
 * is the caller's (dh_place_index_destroy). Returns 0, DH_ENOMEM, or DH_EINVAL (no nodes, or
 * a server's node outside n_nodes). */
DH_EXTERN int dh_place_index_new(dh_place_index_t **out, const dh_snapshot_t *snap);
DH_EXTERN void dh_place_index_destroy(dh_place_index_t **idx);

/* Replaces server's state with a copy of *state (a dispatch, a completion, a heartbeat).
 * O(log N); O(N + nodes) when the server moves to another node; every n_servers-th update
 * that changes a speed or storage factor re-sorts the leaves (O(N log N)). Returns 0 or
 * DH_EINVAL (server or node out of range). */
DH_EXTERN int dh_place_index_update(dh_place_index_t *idx, uint32_t server,
                                    const dh_server_state_t *state);

/* Replaces the link from node `from` to node `to`. O(nodes). Returns 0 or DH_EINVAL. */
DH_EXTERN int dh_place_index_set_link(dh_place_index_t *idx, uint32_t from, uint32_t to,
                                      dh_link_t link);

/* dh_place on the index's copy, with the same results (return code, out->server, reason, t_s,
 * miss_s). out->candidates must be NULL (a per-server table is O(N): use dh_place for one).
 * Cost: O(servers on the consumer's node) plus the tree vertices whose lower bound on T does
 * not exceed the answer; least-request and local O(1); every leaf, O(N), when a request cost
 * is negative or not finite. Returns DH_EINVAL besides dh_place's codes when the consumer's
 * node is outside the index's nodes. No allocation. */
DH_EXTERN int dh_place_index_decide(const dh_place_index_t *idx, const dh_place_config_t *cfg,
                                    const dh_request_cost_t *req, dh_decision_t *out);

#ifdef __cplusplus
}
#endif
#endif
