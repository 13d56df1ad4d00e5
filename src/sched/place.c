/* place.c: the placement policies of docs/design.md §4.3 (see place.h for the rule).
 *
 * Cost: one pass over the servers computing T (a handful of flops and two divisions each)
 * and one pass choosing; no allocation. At 1,024 servers this is a few microseconds, which
 * is what lets the coordinator decide per request rather than per batch of requests.
 */
#include <math.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/place.h"
#include "core/internal.h"
#include "sched/place_internal.h"

static const char *const policy_names[DH_POLICY_COUNT] = {"local", "least-request", "deadline"};

static const struct {
    const char *name;
    const char *text;
} reasons[] = {
    [DH_REASON_LOCAL_MEETS] = {"local_meets", "local server meets the deadline"},
    [DH_REASON_REMOTE_GAIN] = {"remote_gain", "remote meets the deadline with a gain over local"},
    [DH_REASON_LEAST_TRANSFER] =
        {"least_transfer", "local misses; least transfer among servers meeting the deadline"},
    [DH_REASON_EARLIEST_FINISH] = {"earliest_finish",
                                   "all miss the deadline; earliest predicted finish"},
    [DH_REASON_LOCAL_POLICY] = {"local_policy", "policy local: the rank's local server"},
    [DH_REASON_LEAST_REQUEST] = {"least_request",
                                 "policy least-request: fewest outstanding requests"},
    [DH_REASON_NO_CANDIDATE] = {"no_candidate", "no eligible server"},
};

void dh_place_config_default(dh_place_config_t *cfg)
{
    cfg->policy = DH_POLICY_DEADLINE;
    cfg->hysteresis_s = 0.005;
    cfg->hysteresis_frac = 0.10;
}

int dh_policy_from_name(const char *name, dh_policy_t *out)
{
    for (int i = 0; i < DH_POLICY_COUNT; i++)
        if (strcmp(name, policy_names[i]) == 0) {
            *out = (dh_policy_t)i;
            return 0;
        }
    return dh__set_error(DH_EUNKNOWN,
                         "unknown placement policy '%s' (expected local, "
                         "least-request or deadline)",
                         name);
}

const char *dh_policy_name(dh_policy_t policy)
{
    return (unsigned)policy < DH_POLICY_COUNT ? policy_names[policy] : "?";
}

const char *dh_place_reason_text(dh_place_reason_t reason)
{
    return (unsigned)reason <= DH_REASON_NO_CANDIDATE ? reasons[reason].text : "?";
}

const char *dh_place_reason_name(dh_place_reason_t reason)
{
    return (unsigned)reason <= DH_REASON_NO_CANDIDATE ? reasons[reason].name : "?";
}

/* Seconds to move the request's output from `node` to the consumer (0 on its own node). */
static inline double net_time(const dh_snapshot_t *snap, const dh_request_cost_t *req,
                              uint32_t node)
{
    if (node == req->consumer_node)
        return 0.0;
    return dh__place_link_s(&snap->links[(size_t)node * snap->n_nodes + req->consumer_node],
                            req->out_bytes);
}

/* Nodes whose transfer time is computed once per decision (a 4 KiB stack table); servers on
 * nodes beyond it compute theirs inline. */
#define NET_TABLE 512

/* The state the scoring loop carries from server to server. */
typedef struct scan_state {
    uint32_t alive, eligible;
    int local_ok;
    double t_local;
    int32_t best_same, best_other; /* fastest eligible non-local: consumer's node / elsewhere */
    double t_best_same, t_best_other;
} scan_state_t;

/* Scores every server (T, miss, status into cand when not NULL) and keeps the minima the
 * rules need. One pass, with no branches on server state except the rarely taken minimum
 * updates: with a changing cluster such branches mispredict often. T uses the
 * division-free state of cost.h; net_table, when not NULL, holds each node's transfer
 * time. Always inlined, so the compiler builds one copy per (cand, net_table) case. */
static inline __attribute__((always_inline)) void
scan_servers(const dh_snapshot_t *snap, const dh_request_cost_t *req, const double *net_table,
             dh_candidate_t *cand, scan_state_t *ss)
{
    static const double reported_penalty[3] = {0.0, INFINITY, 0.0};
    const double cpu_s = req->cpu_s, in_bytes = req->in_bytes, deadline = req->deadline_s;
    const uint32_t consumer = req->consumer_node;
    const int32_t local = req->local_server;
    const uint32_t n = snap->n_servers;
    for (uint32_t i = 0; i < n; i++) {
        const dh_server_state_t *s = &snap->servers[i];
        unsigned st = dh__place_status(s); /* DH_CANDIDATE_{OK,DEAD,FULL} = 0,1,2 */
        ss->alive += st != DH_CANDIDATE_DEAD;
        ss->eligible += st == DH_CANDIDATE_OK;
        double net = net_table ? net_table[s->node] : net_time(snap, req, s->node);
        double t = dh__place_t(cpu_s, in_bytes, s->speed_factor, s->storage_s_per_B,
                               dh__place_fetch_s(req, i), dh__place_queue_s(s), net);
        if (cand) {
            double t_reported = t + reported_penalty[st];
            double miss = t_reported - deadline;
            cand[i].t_s = t_reported;
            cand[i].miss_s = dh__place_keep_if(miss, miss > 0.0);
            cand[i].status = (uint8_t)st;
        }
        if (st == DH_CANDIDATE_OK) {
            if ((int32_t)i == local) {
                ss->local_ok = 1;
                ss->t_local = t;
            } else if (s->node == consumer) {
                if (t < ss->t_best_same) {
                    ss->t_best_same = t;
                    ss->best_same = (int32_t)i;
                }
            } else if (t < ss->t_best_other) {
                ss->t_best_other = t;
                ss->best_other = (int32_t)i;
            }
        }
    }
}

int dh_place(const dh_place_config_t *cfg, const dh_snapshot_t *snap, const dh_request_cost_t *req,
             dh_decision_t *out)
{
    const uint32_t n = snap->n_servers;
    const double deadline = req->deadline_s;
    const int32_t local = req->local_server;
    const int least_request = cfg->policy == DH_POLICY_LEAST_REQUEST;
    dh_candidate_t *cand = out->candidates;

    /* Rule 1 and the scores, in one pass. Transfer takes two values only (0 on the consumer's
     * node, out_bytes elsewhere), so rule 3's "least transfer, then smallest T" needs just
     * the fastest non-local server on the consumer's node and the fastest elsewhere, and
     * rule 2's best remote is the faster of the two. Tracking those minima instead of testing
     * T <= D per server keeps the loop free of unpredictable branches. Strict '<' keeps the
     * lowest index on ties. Transfer times are tabled per node when the table fits the
     * stack (4 KiB). */
    int32_t fewest_req = -1;
    uint32_t req_fewest = 0, workers_fewest = 1;

    scan_state_t ss = {0, 0, 0, INFINITY, -1, -1, INFINITY, INFINITY};
    if (snap->n_nodes <= NET_TABLE) {
        double net_table[NET_TABLE];
        for (uint32_t node = 0; node < snap->n_nodes; node++)
            net_table[node] = net_time(snap, req, node);
        if (cand)
            scan_servers(snap, req, net_table, cand, &ss);
        else
            scan_servers(snap, req, net_table, NULL, &ss);
    } else if (cand) {
        scan_servers(snap, req, NULL, cand, &ss);
    } else {
        scan_servers(snap, req, NULL, NULL, &ss);
    }
    const uint32_t alive = ss.alive, eligible = ss.eligible;
    const int local_ok = ss.local_ok;
    const double t_local = ss.t_local;
    const int32_t best_same = ss.best_same, best_other = ss.best_other;
    const double t_best_same = ss.t_best_same, t_best_other = ss.t_best_other;
    /* least-request: its own pass, so the deadline policy's loop stays lean. Outstanding
     * requests per worker, compared by cross-multiplication (exact); lowest index on ties. */
    if (least_request)
        for (uint32_t i = 0; i < n; i++) {
            const dh_server_state_t *s = &snap->servers[i];
            int ok = s->alive && s->workers && !(s->queue_cap && s->queue_len >= s->queue_cap);
            if (ok && (fewest_req < 0 || (uint64_t)s->queue_len * workers_fewest <
                                             (uint64_t)req_fewest * s->workers)) {
                req_fewest = s->queue_len;
                workers_fewest = s->workers;
                fewest_req = (int32_t)i;
            }
        }

    int rc;
    int local_alive = local >= 0 && (uint32_t)local < n && snap->servers[local].alive;
    if (dh__place_gate(cfg, n, alive, eligible, local, local_alive, local_ok, t_local, deadline,
                       out, &rc))
        return rc;
    if (least_request)
        return dh__place_finish(out, fewest_req,
                                dh__place_server_t(snap, req, (uint32_t)fewest_req), deadline,
                                DH_REASON_LEAST_REQUEST, 0);

    int32_t best_remote = dh__place_better(best_other, t_best_other, best_same, t_best_same);
    double t_remote = best_remote == best_same ? t_best_same : t_best_other;

    /* Rule 2: the local server meets D; a remote must beat it by the hysteresis margin. */
    if (local_ok && t_local <= deadline) {
        double margin = dh__place_margin(cfg, t_local);
        if (best_remote >= 0 && t_remote <= deadline && t_local - t_remote > margin)
            return dh__place_finish(out, best_remote, t_remote, deadline, DH_REASON_REMOTE_GAIN, 0);
        return dh__place_finish(out, local, t_local, deadline, DH_REASON_LOCAL_MEETS, 0);
    }
    /* Rule 3: least transfer among those that meet D (the local one misses here): the
     * consumer's node first (no transfer), then the others. */
    if (best_same >= 0 && t_best_same <= deadline)
        return dh__place_finish(out, best_same, t_best_same, deadline, DH_REASON_LEAST_TRANSFER, 0);
    if (best_other >= 0 && t_best_other <= deadline)
        return dh__place_finish(out, best_other, t_best_other, deadline, DH_REASON_LEAST_TRANSFER,
                                0);
    /* Rule 4: all miss: earliest predicted finish, the local server included. */
    int32_t earliest =
        local_ok ? dh__place_better(local, t_local, best_remote, t_remote) : best_remote;
    return dh__place_finish(out, earliest, earliest == local ? t_local : t_remote, deadline,
                            DH_REASON_EARLIEST_FINISH, 0);
}

int dh__place_gate(const dh_place_config_t *cfg, uint32_t n, uint32_t alive, uint32_t eligible,
                   int32_t local, int local_alive, int local_ok, double t_local, double deadline,
                   dh_decision_t *out, int *rc)
{
    if (alive == 0) {
        *rc = dh__place_finish(
            out, -1, 0, deadline, DH_REASON_NO_CANDIDATE,
            dh__set_error(DH_ENOSERVER, "placement: none of %u servers is alive", n));
        return 1;
    }
    if (cfg->policy == DH_POLICY_LOCAL) {
        if (!local_alive)
            *rc = dh__place_finish(out, -1, 0, deadline, DH_REASON_NO_CANDIDATE,
                                   dh__set_error(DH_ENOSERVER,
                                                 "placement: the rank's local server (%d) "
                                                 "is not alive",
                                                 (int)local));
        else if (!local_ok)
            *rc = dh__place_finish(out, -1, 0, deadline, DH_REASON_NO_CANDIDATE,
                                   dh__set_error(DH_EAGAIN,
                                                 "placement: local server %d is at its queue "
                                                 "cap",
                                                 (int)local));
        else
            *rc = dh__place_finish(out, local, t_local, deadline, DH_REASON_LOCAL_POLICY, 0);
        return 1;
    }
    if (eligible == 0) {
        *rc = dh__place_finish(out, -1, 0, deadline, DH_REASON_NO_CANDIDATE,
                               dh__set_error(DH_EAGAIN,
                                             "placement: all %u live servers are at their "
                                             "queue cap",
                                             alive));
        return 1;
    }
    return 0;
}
