/* place_internal.h: what the exhaustive placement rule (place.c) and its index
 * (place_index.c) must compute identically, bit for bit: a request's predicted time T on
 * one server, its transfer term, and how a decision is reported.
 *
 * Both files are compiled with -ffp-contract=off (CMakeLists.txt), so no compiler fuses a
 * multiply and an add in one place and not in the other: T is evaluated as written,
 * ((cpu x speed + in x storage) + queue) + net, each step rounded. Every step is monotone
 * (non-decreasing) in its operands when cpu_s, in_bytes and out_bytes are >= 0, which is
 * what lets the index bound T from below with per-subtree minima (place_index.c). The
 * fetch term (a remote sample's C_io, per server: dh_request_cost_t.fetch_s) is added
 * after the storage term, ((cpu x speed + in x storage) + fetch) + queue + net, and is
 * >= 0 (dh__place_fetch_s), so a bound taken with fetch 0 is still a lower bound; with no
 * fetch (NULL) the term is +0.0, which changes no sum: T is bit for bit what it was.
 */
#ifndef DH_SCHED_PLACE_INTERNAL_H
#define DH_SCHED_PLACE_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "datahelix/place.h"

/* x if flag, else +0.0, by masking the bits: compilers turn both `flag ? x : 0` and
 * `flag * x` into branches, which mispredict in the exhaustive loop. */
static inline double dh__place_keep_if(double x, unsigned flag)
{
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= -(uint64_t)(flag != 0);
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* The queue term of T: the server's wait when all its workers are busy, else +0.0. */
static inline double dh__place_queue_s(const dh_server_state_t *s)
{
    return dh__place_keep_if(s->queue_wait_s, s->queue_len >= s->workers);
}

/* Seconds to move out_bytes over a link (the caller takes 0 on the consumer's node). */
static inline double dh__place_link_s(const dh_link_t *link, double out_bytes)
{
    return out_bytes * link->s_per_B + link->latency_s;
}

/* The request's fetch seconds on server i: its fetch_s[i], or +0.0 when it has none, or
 * the entry is negative or NaN (so the term is >= 0 and the index's bounds hold). */
static inline double dh__place_fetch_s(const dh_request_cost_t *req, uint32_t i)
{
    if (!req->fetch_s)
        return 0.0;
    double f = req->fetch_s[i];
    return f > 0.0 ? f : 0.0;
}

/* T, in the one order of evaluation both paths use. */
static inline double dh__place_t(double cpu_s, double in_bytes, double speed_factor,
                                 double storage_s_per_B, double fetch_s, double queue_s,
                                 double net_s)
{
    return cpu_s * speed_factor + in_bytes * storage_s_per_B + fetch_s + queue_s + net_s;
}

/* dh_candidate_status_t of a server: dead (not alive, or no workers), full (at its cap; cap
 * 0 wraps to UINT32_MAX: never full) or eligible. */
static inline unsigned dh__place_status(const dh_server_state_t *s)
{
    unsigned dead = (s->alive == 0) | (s->workers == 0);
    unsigned full = (uint32_t)(s->queue_cap - 1) < s->queue_len;
    return dead | ((full & !dead) << 1);
}

/* Fills the decision: the server (-1 for none), its T and miss (NaN for none), the reason;
 * returns rc. */
static inline int dh__place_finish(dh_decision_t *out, int32_t server, double t_s,
                                   double deadline_s, dh_place_reason_t reason, int rc)
{
    out->server = server;
    out->reason = reason;
    if (server >= 0) {
        double miss = t_s - deadline_s;
        out->t_s = t_s;
        out->miss_s = dh__place_keep_if(miss, miss > 0.0);
    } else {
        out->t_s = __builtin_nan("");
        out->miss_s = __builtin_nan("");
    }
    return rc;
}

/* The better of two (T, index) candidates: smaller T, then lower index; -1 is none. */
static inline int32_t dh__place_better(int32_t a, double ta, int32_t b, double tb)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    if (ta < tb || (ta == tb && a < b))
        return a;
    return b;
}

/* T of snapshot server i (< n_servers) for the request, as the exhaustive scan computes it. */
static inline double dh__place_server_t(const dh_snapshot_t *snap, const dh_request_cost_t *req,
                                        uint32_t i)
{
    const dh_server_state_t *s = &snap->servers[i];
    double net =
        s->node == req->consumer_node
            ? 0.0
            : dh__place_link_s(&snap->links[(size_t)s->node * snap->n_nodes + req->consumer_node],
                               req->out_bytes);
    return dh__place_t(req->cpu_s, req->in_bytes, s->speed_factor, s->storage_s_per_B,
                       dh__place_fetch_s(req, i), dh__place_queue_s(s), net);
}

/* Rule 2's hysteresis: the gain a remote needs over a local server whose T is t_local. */
static inline double dh__place_margin(const dh_place_config_t *cfg, double t_local)
{
    double margin = cfg->hysteresis_frac * t_local;
    return margin < cfg->hysteresis_s ? cfg->hysteresis_s : margin;
}

/* The checks both paths make before the rules, in this order: no live server
 * (DH_ENOSERVER), the local policy (decided here), no eligible server (DH_EAGAIN). Returns 1
 * when they decide (the decision filled, its return code in *rc), 0 to go on to the rules.
 * local_alive: the local index is a snapshot server and alive; local_ok: it is eligible. */
int dh__place_gate(const dh_place_config_t *cfg, uint32_t n, uint32_t alive, uint32_t eligible,
                   int32_t local, int local_alive, int local_ok, double t_local, double deadline,
                   dh_decision_t *out, int *rc);

#endif
