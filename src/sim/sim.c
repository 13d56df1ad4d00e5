/* sim/sim.c: see sim.h. The model, event by event (docs/simulator.md, "The model"):
 *
 *   - a rank's sender plans batch b (its share of step b, dh_plan_step_share once per step
 *     for every rank) while b < consumed + horizon, and sends one request per part with the
 *     deadline dh_deadline_s of its measured compute windows (docs/design.md §4.2);
 *   - the coordinator places the requests of its book in arrival order (dh_place on a
 *     snapshot kept up to date incrementally; a pass stops at the first request every
 *     candidate refuses, as coordinator_place.c does), each at its server's FIFO;
 *   - a server's workers run requests one at a time for their samples' actual cost x the
 *     server's true speed; the COMPLETE teaches the cost model and the speed factor;
 *   - a part executed off the rank's node is forwarded on the link (executor, rank's node):
 *     a serial resource, bytes / bandwidth + latency;
 *   - tier 2 (client_rebalance.c): a rank offers a round (buffer / (group x batch) steps)
 *     once all its parts of it are in; the group's last offer decides, dh_rebalance_plan
 *     per step over the parts and empty slots, counts kept; moved samples cross the link
 *     of their sender's node;
 *   - a batch of several parts is joined on the rank's fetcher (a serial resource) at the
 *     one transfer cost; pool's copy on the rank's copy stage (train_prefetch.h: a serial
 *     resource that takes each batch once it is final and the stage holds fewer than
 *     `ahead`, the client's sender counting what the stage took as consumed);
 *   - next() returns when the batch is final (pool: copied); the rank computes a x actual
 *     tokens + b, then meets the others at the barrier.
 * Not modelled: the arena's byte budget (the emulated arenas are sized for the horizon),
 * heartbeat delays in the coordinator's book (it is exact here), message latencies inside
 * a node, server deaths.
 */
#include "sim/sim.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/rebalance.h"
#include "datahelix/rng.h"
#include "datahelix/sampler.h"
#include "datahelix/stats.h"
#include "sim/event.h"
#include "bench/train_prefetch.h"

enum {
    EV_TASK_DONE = 1,
    EV_FORWARDED,
    EV_BATCH_READY,
    EV_COMPUTE_DONE,
    EV_ANCHOR,
    EV_CLIENT_START, /* a rank's client is created: its sender starts prefetching */
    EV_LOOP_START,   /* the training loop starts: every rank calls next() for step 0 */
    EV_COPY_DONE,    /* pool's copy stage has copied a batch */
};

#define ANCHOR_S 0.02 /* the coordinator's speed anchor period (coordinator.c) */

void dh_sim_options_default(dh_sim_options_t *opt)
{
    memset(opt, 0, sizeof *opt);
    dh_bench_options_default(&opt->bench);
    opt->bench.mix = "kinetics-mixed";
    opt->plan_algo = DH_PLAN_ALGO_DEFAULT;
    opt->rank_steps = 1;
}

/* ---- the model's state ---- */

typedef struct sample {
    const dh_profile_row_t *row;
    double act_cpu_s; /* actual, time-scaled */
    double act_tokens;
    double out_bytes; /* emulated (the size the stand-in payload stands for) */
    double in_bytes;
} sample_t;

typedef struct request {
    uint32_t rank, part, n;
    uint64_t batch;
    uint32_t *rows;
    double pred_cpu_s, pred_c_cpu_s, profile_cpu_s, act_cpu_s, bytes;
    double sent_s, deadline_s;
    int32_t server;
    uint32_t next; /* FIFO link (UINT32_MAX = none) */
} request_t;

typedef struct server {
    uint32_t node, workers, busy;
    double true_speed;
    uint32_t q_head, q_tail, q_len;
    double queued_cpu_s, speed; /* the coordinator's book and learned speed */
} server_t;

typedef struct batch {
    uint64_t b; /* UINT64_MAX = slot unused */
    uint32_t parts, parts_ready, samples;
    double sent_s, delivered_s, final_s, ready_s;
    double tokens, bytes, cpu_s;
    double received_s; /* the last part's delivery */
    bool ready;
    bool copied; /* pool: its copy stage is done with it */
} batch_t;

typedef struct rank {
    uint32_t node;
    int32_t local;
    uint64_t planned, consumed;
    uint32_t horizon;
    double s_per_token, mean_window_s, last_return_s, entry_s;
    bool waiting;
    double fetcher_free_s;
    uint64_t taken;                   /* pool: batches its copy stage took from the client */
    bool copying;                     /* pool: the copy stage is busy */
    int64_t *tokens_of;               /* ring (depth + 2): planned batches' estimated tokens */
    batch_t *ring;                    /* ring (depth + 2) */
    double compute_s, wait_s, done_s; /* this step's; done_s: at the barrier */
} rank_t;

typedef struct step_plan {
    uint64_t step; /* UINT64_MAX = unused */
    uint32_t n;
    uint32_t *rows, *owner; /* owner: the rank, after tier 2 */
    uint32_t *off;          /* ranks + 1: CSR over rows sorted by rank (tier 1's share) */
    uint32_t *by_rank;
} step_plan_t;

/* A tier-2 round: rb_steps consecutive steps (client_rebalance.c). */
typedef struct round {
    uint64_t r; /* UINT64_MAX = unused */
    uint32_t done;
    uint8_t *rank_done; /* ranks: offered */
    double lead_min, spt_sum;
    uint32_t spt_n;
    bool decided;
} round_t;

typedef struct link_slot {
    uint64_t key; /* (server + 1) << 32 | node; 0 = empty */
    double busy_s;
} link_slot_t;

typedef struct sim {
    const dh_sim_options_t *o;
    const dh_bench_options_t *opt;
    const dh_bench_system_t *sp;
    dh_bench_system_result_t *res;
    const dh_profile_set_t *set;
    const sample_t *samples;
    dh_sampler_t *sampler;
    dh_share_config_t share;
    double a, b, threshold, ts, link_Bps, copy_s_per_B;
    uint32_t ranks, fanout, prefetch, prefetch_max, depth, ahead; /* ahead: pool's stage */
    uint64_t total, requested_total;
    bool slots, tier2;
    /* cluster */
    server_t *servers;
    dh_server_state_t *snap;
    uint32_t n_servers, n_nodes;
    int32_t *node_server; /* node -> its server or -1 */
    dh_link_t links[4];
    dh_cost_model_t *model;
    dh_place_index_t *index; /* o->place_index: dh_place_index_* instead of dh_place */
    uint32_t *idx_node;
    dh_link_t *idx_links;
    dh_place_config_t place;
    link_slot_t *link_tab;
    size_t link_cap, link_n;
    /* requests */
    request_t *req;
    uint32_t n_req, cap_req, free_req;
    uint32_t book_head, book_tail; /* unplaced, arrival order */
    /* ranks and steps */
    rank_t *rk;
    step_plan_t *steps;
    uint32_t n_steps_ring;
    uint32_t *scratch_rows, *scratch_rank, *fan_part;
    double *fan_load;
    uint32_t rb_steps, rb_empty, n_rounds_ring, rb_group, n_groups;
    round_t *rounds;
    dh_rebalance_item_t *rb_items;
    uint32_t *rb_new, *rb_index;
    size_t rb_cap;
    uint64_t cur_step;
    uint32_t arrived;
    double step_start_s, t_begin, t_end;
    dh_sim_events_t ev;
    double now;
    /* metrics */
    dh_stats_t *waits, *readies, *err_measured, *err_profile, *err_part[2];
    double samples_n, misses, barrier_sum, mean_sum, max_sum, cpu, bound_sum;
    double step_max, step_sum, miss_part[2], count_part[2];
    double *step_tokens;
    size_t step_tokens_n, step_tokens_cap;
    uint64_t decisions, completions, err_stride;
    double sched_s;
    int rc;
} sim_t;

static uint32_t mod_ring(uint64_t b, uint32_t n)
{
    return (uint32_t)(b % n);
}

/* ---- links: serial resources, one per (sending server, receiving node) ---- */

/* Rebuilds the table keeping only the links still busy (busy_s > now): an idle link has no
 * state (a new entry starts free), so the table holds the links in use, not every pair
 * that ever carried a byte (up to servers x nodes: millions at 16,384 x 4,096). At most a
 * quarter full after, so a rebuild is amortised O(1) an insertion. */
static int link_rebuild(sim_t *s)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->link_cap; i++)
        kept += s->link_tab[i].key && s->link_tab[i].busy_s > s->now;
    size_t cap = 1024;
    while (cap < 4 * (kept + 1))
        cap *= 2;
    link_slot_t *t = dh_calloc(cap, sizeof *t);
    if (!t)
        return s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for the links");
    for (size_t i = 0; i < s->link_cap; i++) {
        if (!s->link_tab[i].key || !(s->link_tab[i].busy_s > s->now))
            continue;
        size_t h = (size_t)(dh_rng_mix(s->link_tab[i].key, 0) & (cap - 1));
        while (t[h].key)
            h = (h + 1) & (cap - 1);
        t[h] = s->link_tab[i];
    }
    dh_free(s->link_tab);
    s->link_tab = t;
    s->link_cap = cap;
    s->link_n = kept;
    return 0;
}

static double *link_busy(sim_t *s, uint32_t server, uint32_t node)
{
    if (2 * (s->link_n + 1) > s->link_cap && link_rebuild(s))
        return NULL;
    uint64_t key = ((uint64_t)server + 1) << 32 | node;
    size_t h = (size_t)(dh_rng_mix(key, 0) & (s->link_cap - 1));
    while (s->link_tab[h].key && s->link_tab[h].key != key)
        h = (h + 1) & (s->link_cap - 1);
    if (!s->link_tab[h].key) {
        s->link_tab[h].key = key;
        s->link_tab[h].busy_s = 0;
        s->link_n++;
    }
    return &s->link_tab[h].busy_s;
}

/* When `bytes` sent now from `server` to `node` arrive. */
static double transfer(sim_t *s, uint32_t server, uint32_t node, double bytes)
{
    double *busy = link_busy(s, server, node);
    if (!busy)
        return s->now;
    double start = *busy > s->now ? *busy : s->now;
    double end = start + (s->link_Bps > 0 ? bytes * s->ts / s->link_Bps : 0);
    *busy = end;
    return end + s->o->link_latency_s;
}

/* ---- the snapshot the placement reads (coordinator_place.c, kept incrementally) ---- */

static void snap_sync(sim_t *s, uint32_t i)
{
    const server_t *sv = &s->servers[i];
    dh_server_state_t *st = &s->snap[i];
    st->queue_len = sv->q_len + sv->busy;
    st->queue_wait_s = sv->queued_cpu_s * sv->speed / sv->workers;
    st->speed_factor = sv->speed;
    if (s->index) {
        dh_server_state_t x = *st;
        x.node = s->idx_node[i];
        if (dh_place_index_update(s->index, i, &x))
            s->rc = DH_EINVAL;
    }
}

/* ---- steps: tier 1's plan, once per step for every rank ---- */

static step_plan_t *step_of(sim_t *s, uint64_t step)
{
    step_plan_t *p = &s->steps[mod_ring(step, s->n_steps_ring)];
    if (p->step == step)
        return p;
    /* the slot's old step is consumed by every rank (the ring holds the horizon) */
    int n = dh_plan_step_share(&s->share, s->sampler, s->set, step, s->scratch_rows,
                               s->scratch_rank, (size_t)s->ranks * s->opt->batch * 2);
    if (n < 0) {
        s->rc = n;
        return NULL;
    }
    p->step = step;
    p->n = (uint32_t)n;
    memcpy(p->rows, s->scratch_rows, (size_t)n * sizeof *p->rows);
    memcpy(p->owner, s->scratch_rank, (size_t)n * sizeof *p->owner);
    memset(p->off, 0, (s->ranks + 1) * sizeof *p->off);
    for (int i = 0; i < n; i++)
        p->off[p->owner[i] + 1]++;
    for (uint32_t r = 0; r < s->ranks; r++)
        p->off[r + 1] += p->off[r];
    /* stable: each rank's rows in window order, as dh_plan_rank_share gives them */
    uint32_t *fill = s->scratch_rank + n; /* ranks entries of scratch */
    memcpy(fill, p->off, s->ranks * sizeof *fill);
    for (int i = 0; i < n; i++)
        p->by_rank[fill[p->owner[i]]++] = (uint32_t)i;
    return p;
}

/* ---- requests ---- */

static uint32_t req_new(sim_t *s)
{
    if (s->free_req != UINT32_MAX) {
        uint32_t id = s->free_req;
        s->free_req = s->req[id].next;
        return id;
    }
    if (s->n_req == s->cap_req) {
        uint32_t cap = s->cap_req ? 2 * s->cap_req : 1024;
        request_t *r = dh_reallocarray(s->req, cap, sizeof *r);
        if (!r) {
            s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for requests");
            return UINT32_MAX;
        }
        s->req = r;
        s->cap_req = cap;
    }
    s->req[s->n_req].rows = NULL;
    return s->n_req++;
}

static void req_free(sim_t *s, uint32_t id)
{
    dh_free(s->req[id].rows);
    s->req[id].rows = NULL;
    s->req[id].next = s->free_req;
    s->free_req = id;
}

static void server_start(sim_t *s, uint32_t si, uint32_t id)
{
    server_t *sv = &s->servers[si];
    sv->busy++;
    double run = s->req[id].act_cpu_s * sv->true_speed;
    if (dh__sim_events_push(&s->ev, s->now + run, EV_TASK_DONE, si, id))
        s->rc = DH_ENOMEM;
}

/* One placement decision for request id (coordinator_place.c, place_entry). Returns 0 or
 * DH_EAGAIN / DH_ENOSERVER (it stays in the book). */
static int place_one(sim_t *s, uint32_t id)
{
    request_t *q = &s->req[id];
    const rank_t *rk = &s->rk[q->rank];
    double pred = 0;
    for (uint32_t i = 0; i < q->n; i++)
        pred += dh_cost_model_predict(s->model, s->samples[q->rows[i]].row, NULL);
    dh_request_cost_t rc = {0};
    rc.cpu_s = pred;
    for (uint32_t i = 0; i < q->n; i++) {
        rc.in_bytes += s->samples[q->rows[i]].in_bytes;
        rc.out_bytes += s->samples[q->rows[i]].out_bytes;
    }
    rc.deadline_s = q->deadline_s - (s->now - q->sent_s);
    /* Two nodes suffice while every link is alike: the consumer's (0) and the rest (1). */
    rc.consumer_node = 0;
    rc.local_server = rk->local;
    if (rk->local >= 0 && !s->index)
        s->snap[rk->local].node = 0;
    dh_snapshot_t snap = {s->snap, s->n_servers, s->links, 2};
    dh_decision_t d = {.candidates = NULL};
    uint64_t t0 = dh_clock_now_ns();
    int e;
    if (s->index) { /* local nodes, then one node for every remote server */
        rc.consumer_node = rk->local >= 0 ? s->idx_node[rk->local] : 0;
        e = dh_place_index_decide(s->index, &s->place, &rc, &d);
    } else {
        e = s->o->place ? s->o->place(s->o->place_ctx, &s->place, &snap, &rc, &d)
                        : dh_place(&s->place, &snap, &rc, &d);
    }
    s->sched_s += dh_clock_elapsed_s(t0, dh_clock_now_ns());
    s->decisions++;
    if (rk->local >= 0 && !s->index)
        s->snap[rk->local].node = 1;
    if (e)
        return e;
    server_t *sv = &s->servers[d.server];
    q->server = d.server;
    q->pred_cpu_s = pred;
    q->pred_c_cpu_s = pred * sv->speed;
    sv->queued_cpu_s += pred;
    q->next = UINT32_MAX;
    if (sv->busy < sv->workers) {
        server_start(s, (uint32_t)d.server, id);
    } else {
        if (sv->q_tail != UINT32_MAX)
            s->req[sv->q_tail].next = id;
        else
            sv->q_head = id;
        sv->q_tail = id;
        sv->q_len++;
    }
    snap_sync(s, (uint32_t)d.server);
    return 0;
}

static void place_pending(sim_t *s)
{
    while (s->book_head != UINT32_MAX && s->rc == 0) {
        uint32_t id = s->book_head, next = s->req[id].next;
        if (place_one(s, id) != 0)
            break; /* every candidate at its cap: the rest would wait behind it */
        s->book_head = next;
        if (s->book_head == UINT32_MAX)
            s->book_tail = UINT32_MAX;
    }
}

/* ---- the client's sender (client_send.c) ---- */

static double deadline_of(const sim_t *s, const rank_t *rk, uint64_t b)
{
    dh_deadline_model_t m = {.s_per_token = rk->s_per_token,
                             .mean_window_s = rk->mean_window_s,
                             .tokens = rk->tokens_of,
                             .n_tokens = s->depth + 2};
    double elapsed = rk->consumed ? s->now - rk->last_return_s : 0;
    return dh_deadline_s(&m, b, rk->consumed, elapsed);
}

static void send_batch(sim_t *s, uint32_t r, uint64_t b)
{
    rank_t *rk = &s->rk[r];
    step_plan_t *p = step_of(s, b);
    if (!p)
        return;
    uint32_t lo = p->off[r], n = p->off[r + 1] - lo;
    int64_t tokens = 0;
    double *load = s->fan_load; /* n <= a step's rows: the scratch's size */
    uint32_t *part_of = s->fan_part;
    for (uint32_t i = 0; i < n; i++) {
        const sample_t *x = &s->samples[p->rows[p->by_rank[lo + i]]];
        tokens += x->row->tokens_est;
        load[i] = (double)x->row->tokens_est;
    }
    uint32_t parts = s->slots ? n : (s->fanout < n ? s->fanout : (n ? n : 1));
    if (!s->slots && parts > 1) {
        if ((s->rc = dh_plan_fanout(load, n, parts, part_of)))
            return;
    } else {
        for (uint32_t i = 0; i < n; i++)
            part_of[i] = s->slots ? i : 0;
    }
    rk->tokens_of[mod_ring(b, s->depth + 2)] = tokens;
    double d = deadline_of(s, rk, b);
    batch_t *bt = &rk->ring[mod_ring(b, s->depth + 2)];
    memset(bt, 0, sizeof *bt);
    bt->b = b;
    bt->parts = parts;
    bt->sent_s = s->now;
    for (uint32_t part = 0; part < parts; part++) {
        uint32_t id = req_new(s);
        if (id == UINT32_MAX)
            return;
        request_t *q = &s->req[id];
        memset(q, 0, sizeof *q);
        q->rank = r;
        q->part = part;
        q->batch = b;
        q->sent_s = s->now;
        q->deadline_s = d;
        q->server = -1;
        q->next = UINT32_MAX;
        q->rows = dh_malloc((n ? n : 1) * sizeof *q->rows);
        if (!q->rows) {
            s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for a request");
            return;
        }
        for (uint32_t i = 0; i < n; i++)
            if (part_of[i] == part) {
                const sample_t *x = &s->samples[p->rows[p->by_rank[lo + i]]];
                q->rows[q->n++] = p->rows[p->by_rank[lo + i]];
                q->act_cpu_s += x->act_cpu_s;
                q->bytes += x->out_bytes;
                q->profile_cpu_s += x->row->cpu_s_est > 0 ? x->row->cpu_s_est : 0;
            }
        if (s->book_tail != UINT32_MAX)
            s->req[s->book_tail].next = id;
        else
            s->book_head = id;
        s->book_tail = id;
    }
}

static void sender(sim_t *s, uint32_t r)
{
    rank_t *rk = &s->rk[r];
    uint64_t used = s->sp->copy ? rk->taken : rk->consumed; /* the client's next() calls */
    while (s->rc == 0 && rk->planned < s->requested_total &&
           (rk->planned < used + rk->horizon || rk->planned == used)) {
        send_batch(s, r, rk->planned);
        rk->planned++;
    }
    place_pending(s);
}

/* ---- delivery, tier 2, joins ---- */

static void batch_final(sim_t *s, uint32_t r, batch_t *bt, double final_s)
{
    rank_t *rk = &s->rk[r];
    bt->final_s = final_s;
    double ready = final_s;
    if (bt->parts > 1 || s->slots) { /* the join copy on the fetcher */
        double start = rk->fetcher_free_s > final_s ? rk->fetcher_free_s : final_s;
        ready = start + bt->bytes * s->copy_s_per_B;
        rk->fetcher_free_s = ready;
        s->res->copy_bytes += bt->bytes;
    }
    if (dh__sim_events_push(&s->ev, ready, EV_BATCH_READY, r, bt->b))
        s->rc = DH_ENOMEM;
}

/* Tier 2's decision over one step of a round (client_rebalance.c, decide_default): the
 * step's parts as items in rank order, each rank's samples then its empty slots (slots
 * mode: a rank's batch has ranks x batch slots; a sample swapped with an empty slot is a
 * packing move), part counts kept; moved samples cross their sender's link. Writes each
 * rank's arrival of its incoming moves into final_s. Returns whether it applied, and
 * *proposed whether the policy proposed a gain. */
static bool decide_step(sim_t *s, step_plan_t *p, uint32_t g0, uint32_t g1,
                        const dh_rebalance_params_t *pr, double *final_s, bool *proposed)
{
    uint32_t slots = s->slots ? s->ranks * s->opt->batch : 0;
    /* Limit: at most rb_empty empty slots a rank (all of them while ranks x slots is small),
     * so the round stays O(ranks x batch) at thousands of ranks; a rank rarely takes more
     * than a few samples more than tier 1 gave it. */
    size_t cap = 0;
    for (uint32_t r = g0; r < g1; r++) {
        uint32_t own = p->off[r + 1] - p->off[r];
        uint32_t empty = slots > own ? slots - own : 0;
        cap += own + (empty < s->rb_empty ? empty : s->rb_empty);
    }
    if (cap > s->rb_cap) {
        dh_rebalance_item_t *it = dh_reallocarray(s->rb_items, cap, sizeof *it);
        uint32_t *nr = dh_reallocarray(s->rb_new, cap, sizeof *nr);
        uint32_t *ix = dh_reallocarray(s->rb_index, cap, sizeof *ix);
        if (it)
            s->rb_items = it;
        if (nr)
            s->rb_new = nr;
        if (ix)
            s->rb_index = ix;
        if (!it || !nr || !ix) {
            s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for tier 2");
            return false;
        }
        s->rb_cap = cap;
    }
    size_t n = 0;
    for (uint32_t r = g0; r < g1; r++) {
        uint32_t own = p->off[r + 1] - p->off[r];
        for (uint32_t k = p->off[r]; k < p->off[r + 1]; k++) {
            uint32_t i = p->by_rank[k];
            const sample_t *x = &s->samples[p->rows[i]];
            s->rb_items[n] = (dh_rebalance_item_t){r - g0, x->act_tokens, x->out_bytes};
            s->rb_index[n++] = i;
        }
        uint32_t empty = slots > own ? slots - own : 0;
        for (uint32_t k = 0; k < empty && k < s->rb_empty; k++) {
            s->rb_items[n] = (dh_rebalance_item_t){r - g0, 0, 0};
            s->rb_index[n++] = UINT32_MAX;
        }
    }
    dh_rebalance_verdict_t v;
    if ((s->rc = dh_rebalance_plan(s->rb_items, n, pr, s->rb_new, &v)))
        return false;
    *proposed |= v.gain_s > 0;
    if (!v.applied)
        return false;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = s->rb_index[k];
        if (i == UINT32_MAX || s->rb_new[k] + g0 == p->owner[i])
            continue;
        uint32_t from = p->owner[i], to = s->rb_new[k] + g0;
        const sample_t *x = &s->samples[p->rows[i]];
        s->res->rebalance_moved_samples++;
        s->res->rebalance_moved_parts++;
        s->res->rebalance_bytes += x->out_bytes;
        if (s->rk[from].node != s->rk[to].node && s->rk[from].local >= 0) {
            s->res->rebalance_bytes_remote += x->out_bytes;
            s->res->cross_node_bytes += x->out_bytes;
            double end = transfer(s, (uint32_t)s->rk[from].local, s->rk[to].node, x->out_bytes);
            final_s[to] = end > final_s[to] ? end : final_s[to];
        }
        p->owner[i] = to;
    }
    return true;
}

/* Round r is gathered (every rank's parts of its steps materialized): the same policy every
 * member runs, per step, with the members' mean s_per_token and their least lead as the
 * slack; then each rank's batches of the round become final (moved parts in), in order. */
static void decide_round(sim_t *s, uint32_t g, round_t *rd)
{
    uint32_t g0 = g * s->rb_group, g1 = g0 + s->rb_group < s->ranks ? g0 + s->rb_group : s->ranks;
    rd->decided = true;
    double *final_s = dh_malloc(s->ranks * sizeof *final_s);
    if (!final_s) {
        s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for tier 2");
        return;
    }
    uint64_t b0 = rd->r * s->rb_steps;
    dh_rebalance_params_t pr;
    dh_rebalance_params_default(&pr);
    pr.ranks = g1 - g0;
    pr.keep_counts = 1;
    pr.s_per_token = rd->spt_n ? rd->spt_sum / rd->spt_n : 0;
    bool spans = false;
    for (uint32_t r = g0 + 1; r < g1; r++)
        spans |= s->rk[r].node != s->rk[g0].node;
    if (!(pr.s_per_token > 0) && !spans)
        pr.s_per_token = 1;
    pr.move_s_per_B = spans && s->link_Bps > 0 ? s->ts / s->link_Bps : 0;
    pr.min_gain = s->opt->rebalance_min_gain;
    pr.slack_s = rd->lead_min > 0 ? rd->lead_min : 0;
    bool applied = false, proposed = false;
    s->res->rebalance_rounds++;
    for (uint64_t b = b0; b < b0 + s->rb_steps && s->rc == 0; b++) {
        step_plan_t *p = &s->steps[mod_ring(b, s->n_steps_ring)];
        for (uint32_t r = g0; r < g1; r++)
            final_s[r] = s->now;
        if (p->step == b && pr.s_per_token > 0)
            applied |= decide_step(s, p, g0, g1, &pr, final_s, &proposed);
        /* each rank's batch of this step: what it owns now (moves stay in the group) */
        for (uint32_t r = g0; r < g1; r++) {
            batch_t *bt = &s->rk[r].ring[mod_ring(b, s->depth + 2)];
            bt->tokens = bt->bytes = bt->cpu_s = 0;
            bt->samples = 0;
        }
        for (uint32_t k = p->off[g0]; p->step == b && k < p->off[g1]; k++) {
            uint32_t i = p->by_rank[k];
            batch_t *bt = &s->rk[p->owner[i]].ring[mod_ring(b, s->depth + 2)];
            const sample_t *x = &s->samples[p->rows[i]];
            bt->tokens += x->act_tokens;
            bt->bytes += x->out_bytes;
            bt->cpu_s += x->act_cpu_s;
            bt->samples++;
        }
        for (uint32_t r = g0; r < g1 && s->rc == 0; r++)
            batch_final(s, r, &s->rk[r].ring[mod_ring(b, s->depth + 2)], final_s[r]);
    }
    s->res->rebalance_applied += applied;
    s->res->rebalance_kept_by_gate += !applied && proposed;
    dh_free(final_s);
}

/* Rank r's batch b has all its parts: once all its batches of b's round have, the rank
 * offers the round (its lead and s_per_token), and the last offer decides it. */
static void rank_offers(sim_t *s, uint32_t r, uint64_t b)
{
    uint64_t round = b / s->rb_steps, b0 = round * s->rb_steps;
    rank_t *rk = &s->rk[r];
    for (uint64_t x = b0; x < b0 + s->rb_steps; x++) {
        const batch_t *bt = &rk->ring[mod_ring(x, s->depth + 2)];
        if (bt->b != x || bt->parts_ready < bt->parts)
            return;
    }
    uint32_t g = r / s->rb_group;
    uint32_t members = (g + 1) * s->rb_group < s->ranks ? s->rb_group : s->ranks - g * s->rb_group;
    round_t *rd = &s->rounds[(size_t)g * s->n_rounds_ring + mod_ring(round, s->n_rounds_ring)];
    if (rd->r != round) {
        rd->r = round;
        rd->done = 0;
        rd->lead_min = INFINITY;
        rd->spt_sum = 0;
        rd->spt_n = 0;
        rd->decided = false;
        memset(rd->rank_done, 0, members);
    }
    if (rd->rank_done[r - g * s->rb_group])
        return;
    rd->rank_done[r - g * s->rb_group] = 1;
    double lead = deadline_of(s, rk, b0);
    rd->lead_min = lead < rd->lead_min ? lead : rd->lead_min;
    if (rk->s_per_token > 0) {
        rd->spt_sum += rk->s_per_token;
        rd->spt_n++;
    }
    if (++rd->done == members)
        decide_round(s, g, rd);
}

static void part_delivered(sim_t *s, uint32_t id)
{
    request_t *q = &s->req[id];
    rank_t *rk = &s->rk[q->rank];
    batch_t *bt = &rk->ring[mod_ring(q->batch, s->depth + 2)];
    if (bt->b == q->batch) {
        bt->parts_ready++;
        bt->received_s = s->now;
        for (uint32_t i = 0; i < q->n; i++) {
            const sample_t *x = &s->samples[q->rows[i]];
            bt->tokens += x->act_tokens;
            bt->bytes += x->out_bytes;
            bt->cpu_s += x->act_cpu_s;
            bt->samples++;
        }
        if (bt->parts_ready == bt->parts) {
            bt->delivered_s = s->now;
            if (s->tier2)
                rank_offers(s, q->rank, q->batch);
            else
                batch_final(s, q->rank, bt, s->now);
        }
    }
    req_free(s, id);
}

/* A worker finished request id on server si: COMPLETE (the coordinator learns, the book
 * shrinks), the next queued request starts, the output goes to the rank's node. */
static void task_done(sim_t *s, uint32_t si, uint32_t id)
{
    server_t *sv = &s->servers[si];
    request_t *q = &s->req[id];
    sv->busy--;
    sv->queued_cpu_s -= q->pred_cpu_s;
    if (sv->queued_cpu_s < 0)
        sv->queued_cpu_s = 0;
    if (sv->q_head != UINT32_MAX) {
        uint32_t next = sv->q_head;
        sv->q_head = s->req[next].next;
        if (sv->q_head == UINT32_MAX)
            sv->q_tail = UINT32_MAX;
        sv->q_len--;
        server_start(s, si, next);
    }
    /* learn (coordinator.c, learn): per sample, the key model; the speed from the residual
     * over the keys it already knew */
    double known_measured = 0, known_predicted = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        const sample_t *x = &s->samples[q->rows[i]];
        double measured = x->act_cpu_s * sv->true_speed;
        if (!(measured > 0))
            continue;
        dh_cost_source_t src;
        double pred = dh_cost_model_predict(s->model, x->row, &src);
        if (src == DH_COST_FROM_KEY && pred > 0) {
            known_measured += measured;
            known_predicted += pred * sv->speed;
        }
        (void)dh_cost_model_observe(s->model, x->row, measured, sv->speed);
    }
    sv->speed = dh_cost_speed_learn(sv->speed, known_measured, known_predicted);
    snap_sync(s, si);
    /* predicted against actual, per request */
    double actual = q->act_cpu_s * sv->true_speed;
    /* Memory: the errors of one request in err_stride (a systematic sample, at most ~2^20
     * requests kept whatever the scale) */
    if (q->batch < s->total && actual > 0 && s->completions++ % s->err_stride == 0) {
        double err = fabs(q->pred_c_cpu_s - actual) / actual;
        uint32_t split = (uint32_t)ceil(0.2 * (double)s->total);
        int e = dh_stats_add(s->err_part[q->batch >= split], err);
        if (q->batch >= s->opt->warmup)
            e |= dh_stats_add(s->err_measured, err) |
                 dh_stats_add(s->err_profile, fabs(q->profile_cpu_s * s->ts - actual) / actual);
        if (e)
            s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
    }
    /* delivery: on the rank's node at once, else over the link */
    const rank_t *rk = &s->rk[q->rank];
    if (sv->node == rk->node) {
        part_delivered(s, id);
    } else {
        s->res->cross_node_bytes += q->bytes;
        double at = transfer(s, si, rk->node, q->bytes);
        if (dh__sim_events_push(&s->ev, at, EV_FORWARDED, q->rank, id))
            s->rc = DH_ENOMEM;
    }
    place_pending(s);
}

/* ---- the ranks: pool's copy stage, next(), compute, barrier ---- */

/* Pool's copy stage (train_prefetch.c): takes the next batch from the client once it is
 * final and the stage holds fewer than `ahead` (taken, not yet consumed by the training
 * loop), and copies it at the one transfer cost, one batch at a time. */
static void stage_try(sim_t *s, uint32_t r)
{
    rank_t *rk = &s->rk[r];
    if (!s->sp->copy || rk->copying || rk->taken >= s->total ||
        rk->taken >= rk->consumed + s->ahead)
        return;
    batch_t *bt = &rk->ring[mod_ring(rk->taken, s->depth + 2)];
    if (bt->b != rk->taken || !bt->ready)
        return;
    rk->copying = true;
    rk->taken++;
    if (dh__sim_events_push(&s->ev, s->now + bt->bytes * s->copy_s_per_B, EV_COPY_DONE, r, bt->b))
        s->rc = DH_ENOMEM;
    sender(s, r); /* the client's next() returned: its horizon moves on */
}

static void next_returns(sim_t *s, uint32_t r)
{
    rank_t *rk = &s->rk[r];
    uint64_t b = rk->consumed;
    batch_t *bt = &rk->ring[mod_ring(b, s->depth + 2)];
    rk->waiting = false;
    /* the compute window just measured: from the previous return to this call */
    if (b > 0) {
        double window = rk->entry_s - rk->last_return_s;
        int64_t tokens = rk->tokens_of[mod_ring(b - 1, s->depth + 2)];
        rk->mean_window_s =
            rk->mean_window_s > 0 ? dh_cost_ewma(rk->mean_window_s, window, 0.2) : window;
        if (tokens > 0) {
            double spt = window / (double)tokens;
            rk->s_per_token = rk->s_per_token > 0 ? dh_cost_ewma(rk->s_per_token, spt, 0.2) : spt;
        }
    }
    rk->consumed++;
    rk->last_return_s = s->now;
    double waited = s->now - rk->entry_s;
    double slack = rk->entry_s > bt->received_s ? rk->entry_s - bt->received_s : 0;
    rk->horizon = dh_deadline_prefetch_horizon(rk->horizon, s->prefetch_max, b, waited, slack,
                                               rk->mean_window_s, 0);
    if (rk->horizon > s->res->prefetch_reached)
        s->res->prefetch_reached = rk->horizon;
    double compute = s->a * bt->tokens + s->b;
    rk->wait_s = waited;
    rk->compute_s = compute;
    double busy = compute;
    if (s->sp->copy) /* pool's copy, made by its stage */
        s->res->copy_bytes += bt->bytes;
    /* metrics of the measured steps */
    if (b >= s->opt->warmup && b < s->total) {
        int e = dh_stats_add(s->waits, waited);
        e |= dh_stats_add(s->readies,
                          bt->delivered_s > bt->sent_s ? bt->delivered_s - bt->sent_s : 0);
        if (e)
            s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
        s->samples_n += bt->samples;
        s->misses += waited > s->threshold;
        s->cpu += bt->cpu_s;
        s->step_sum += compute;
        s->step_max = compute > s->step_max ? compute : s->step_max;
        if (s->res->rank_step_s)
            s->res->rank_step_s[(size_t)r * s->opt->steps + (b - s->opt->warmup)] =
                waited + compute;
    }
    uint32_t split = (uint32_t)ceil(0.2 * (double)s->total);
    s->miss_part[b >= split] += waited > s->threshold;
    s->count_part[b >= split]++;
    rk->done_s = s->now + busy;
    if (dh__sim_events_push(&s->ev, s->now + busy, EV_COMPUTE_DONE, r, b))
        s->rc = DH_ENOMEM;
    sender(s, r);
    stage_try(s, r);
}

static void step_begin(sim_t *s)
{
    s->step_start_s = s->now;
    s->arrived = 0;
    s->step_max = s->step_sum = 0;
    for (uint32_t r = 0; r < s->ranks && s->rc == 0; r++) {
        rank_t *rk = &s->rk[r];
        rk->entry_s = s->now;
        batch_t *bt = &rk->ring[mod_ring(s->cur_step, s->depth + 2)];
        if (bt->b == s->cur_step && (s->sp->copy ? bt->copied : bt->ready))
            next_returns(s, r);
        else
            rk->waiting = true;
    }
}

/* The balance bound's step (train_bench.c, balance_bound): the exact plan of the step's
 * actual tokens where it is small, else max(mean, largest sample). */
static void bound_step(sim_t *s, uint64_t step)
{
    step_plan_t *p = &s->steps[mod_ring(step, s->n_steps_ring)];
    if (p->step != step)
        return;
    if (p->n > s->step_tokens_cap) {
        double *t = dh_reallocarray(s->step_tokens, p->n, sizeof *t);
        if (!t) {
            s->rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
            return;
        }
        s->step_tokens = t;
        s->step_tokens_cap = p->n;
    }
    double sum = 0;
    for (uint32_t i = 0; i < p->n; i++)
        sum += s->step_tokens[i] = s->samples[p->rows[i]].act_tokens;
    double largest = dh_plan_lower_bound(s->step_tokens, p->n, s->ranks);
    if (p->n > 0 && p->n <= 64) {
        int32_t *rank_of = dh_malloc(p->n * sizeof *rank_of);
        double *load = dh_malloc(s->ranks * sizeof *load);
        dh_plan_config_t pc = {.mode = DH_PLAN_TOKEN_BUDGET,
                               .algo = DH_PLAN_EXACT,
                               .ranks = s->ranks,
                               .batch = s->opt->batch,
                               .token_budget = sum + 1};
        if (rank_of && load && dh_plan_step(&pc, s->step_tokens, NULL, p->n, rank_of, load) == 0) {
            largest = 0;
            for (uint32_t r = 0; r < s->ranks; r++)
                largest = load[r] > largest ? load[r] : largest;
        }
        dh_free(rank_of);
        dh_free(load);
    }
    s->bound_sum += s->a * largest + s->b;
}

static void compute_done(sim_t *s, uint32_t r)
{
    (void)r;
    if (++s->arrived < s->ranks)
        return;
    /* the barrier: every rank waited for the last one */
    uint64_t step = s->cur_step;
    if (step >= s->opt->warmup && step < s->total) {
        for (uint32_t k = 0; k < s->ranks; k++) {
            double done = s->rk[k].done_s;
            s->barrier_sum += s->now > done ? s->now - done : 0;
        }
        s->mean_sum += s->step_sum / s->ranks;
        s->max_sum += s->step_max;
        bound_step(s, step);
    }
    if (step + 1 == s->opt->warmup)
        s->t_begin = s->now;
    if (step + 1 == s->total) {
        s->t_end = s->now;
        return;
    }
    s->cur_step++;
    step_begin(s);
}

static void batch_ready(sim_t *s, uint32_t r, uint64_t b)
{
    rank_t *rk = &s->rk[r];
    batch_t *bt = &rk->ring[mod_ring(b, s->depth + 2)];
    if (bt->b != b)
        return;
    bt->ready = true;
    bt->ready_s = s->now;
    if (s->sp->copy)
        stage_try(s, r);
    else if (rk->waiting && rk->consumed == b && s->cur_step == b)
        next_returns(s, r);
}

static void copy_done(sim_t *s, uint32_t r, uint64_t b)
{
    rank_t *rk = &s->rk[r];
    batch_t *bt = &rk->ring[mod_ring(b, s->depth + 2)];
    rk->copying = false;
    if (bt->b == b) {
        bt->copied = true;
        if (rk->waiting && rk->consumed == b && s->cur_step == b)
            next_returns(s, r);
    }
    stage_try(s, r);
}

static void anchor(sim_t *s)
{
    double *speeds = dh_malloc(s->n_servers * sizeof *speeds);
    if (!speeds)
        return;
    for (uint32_t i = 0; i < s->n_servers; i++)
        speeds[i] = s->servers[i].speed;
    double median = dh_cost_speed_anchor(speeds, s->n_servers);
    if (median != 1) {
        for (uint32_t i = 0; i < s->n_servers; i++) {
            s->servers[i].speed = speeds[i];
            snap_sync(s, i);
        }
        dh_cost_model_scale(s->model, median);
    }
    dh_free(speeds);
}

/* ---- one system ---- */

static int add_server(sim_t *s, uint32_t node, uint8_t role, uint32_t workers)
{
    uint32_t i = s->n_servers++;
    server_t *sv = &s->servers[i];
    sv->node = node;
    sv->workers = workers ? workers : 1;
    sv->q_head = sv->q_tail = UINT32_MAX;
    sv->speed = 1;
    sv->true_speed = s->o->server_speed_sigma > 0
                         ? dh_rng_lognormal_at(dh_rng_mix(s->opt->seed ^ 0x5eed5eedULL, i),
                                               s->o->server_speed_sigma)
                         : 1;
    dh_server_state_t *st = &s->snap[i];
    memset(st, 0, sizeof *st);
    st->node = 1;
    st->role = role;
    st->alive = 1;
    st->workers = sv->workers;
    st->queue_cap = 4 * sv->workers; /* dh_coordinator_config_default: queue_cap 4 */
    st->speed_factor = 1;
    st->storage_s_per_B = 1.0 / 2e9; /* the assumed 2 GB/s (no reads in the emulation) */
    s->node_server[node] = (int32_t)i;
    return 0;
}

static void sim_free(sim_t *s)
{
    for (uint32_t i = 0; s->req && i < s->n_req; i++)
        dh_free(s->req[i].rows);
    dh_free(s->req);
    for (uint32_t r = 0; s->rk && r < s->ranks; r++) {
        dh_free(s->rk[r].tokens_of);
        dh_free(s->rk[r].ring);
    }
    dh_free(s->rk);
    for (uint32_t i = 0; s->steps && i < s->n_steps_ring; i++) {
        dh_free(s->steps[i].rows);
        dh_free(s->steps[i].owner);
        dh_free(s->steps[i].off);
        dh_free(s->steps[i].by_rank);
    }
    dh_free(s->steps);
    for (size_t i = 0; s->rounds && i < (size_t)s->n_groups * s->n_rounds_ring; i++)
        dh_free(s->rounds[i].rank_done);
    dh_free(s->rounds);
    dh_free(s->rb_items);
    dh_free(s->rb_new);
    dh_free(s->rb_index);
    dh_free(s->scratch_rows);
    dh_free(s->fan_load);
    dh_free(s->fan_part);
    dh_free(s->scratch_rank);
    dh_free(s->servers);
    dh_free(s->snap);
    dh_free(s->node_server);
    dh_free(s->link_tab);
    dh_free(s->step_tokens);
    dh_cost_model_destroy(&s->model);
    dh_place_index_destroy(&s->index);
    dh_free(s->idx_node);
    dh_free(s->idx_links);
    dh_sampler_destroy(&s->sampler);
    dh__sim_events_clear(&s->ev);
    dh_stats_destroy(&s->waits);
    dh_stats_destroy(&s->readies);
    dh_stats_destroy(&s->err_measured);
    dh_stats_destroy(&s->err_profile);
    dh_stats_destroy(&s->err_part[0]);
    dh_stats_destroy(&s->err_part[1]);
}

typedef struct workload {
    const dh_profile_set_t *set;
    const sample_t *samples;
    size_t n;
    double a, b, threshold, mean_step_s, batch_decode_s, join_s;
} workload_t;

static int run_system(const dh_sim_options_t *o, const dh_bench_system_t *sp, const workload_t *w,
                      dh_bench_system_result_t *res)
{
    const dh_bench_options_t *opt = &o->bench;
    memset(res, 0, sizeof *res);
    snprintf(res->name, sizeof res->name, "%s", sp->name);
    sim_t S, *s = &S;
    memset(s, 0, sizeof *s);
    s->o = o;
    s->opt = opt;
    s->sp = sp;
    s->res = res;
    s->set = w->set;
    s->samples = w->samples;
    s->a = w->a;
    s->b = w->b;
    s->threshold = w->threshold;
    s->ts = opt->time_scale;
    s->link_Bps = opt->link_gbps * 1e9 / 8;
    s->copy_s_per_B = s->link_Bps > 0 ? s->ts / s->link_Bps : 0;
    s->ranks = opt->ranks;
    s->total = (uint64_t)opt->warmup + opt->steps;
    s->free_req = s->book_head = s->book_tail = UINT32_MAX;
    /* the cluster: bench's layout (train_bench.c, cluster_start) */
    uint32_t n_servers = sp->rank_local ? opt->ranks : opt->local_servers + opt->remote_servers;
    uint32_t n_nodes = sp->rank_local ? opt->ranks : opt->local_servers + opt->remote_servers;
    if (!sp->rank_local && opt->ranks > n_nodes)
        n_nodes = opt->ranks; /* ranks beyond the local servers share their nodes anyway */
    s->servers = dh_calloc(n_servers, sizeof *s->servers);
    s->snap = dh_calloc(n_servers, sizeof *s->snap);
    s->node_server = dh_malloc(n_nodes * sizeof *s->node_server);
    int rc = 0;
    if (!s->servers || !s->snap || !s->node_server) {
        rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for %u servers", n_servers);
        goto done;
    }
    for (uint32_t i = 0; i < n_nodes; i++)
        s->node_server[i] = -1;
    if (sp->rank_local) {
        uint32_t total = sp->cores           ? sp->cores
                         : opt->native_cores ? opt->native_cores
                                             : opt->local_servers * opt->cores_per_server;
        uint32_t per = total / opt->ranks ? total / opt->ranks : 1;
        for (uint32_t r = 0; r < opt->ranks; r++)
            add_server(s, r, DH_SERVER_LOCAL, per);
    } else {
        for (uint32_t i = 0; i < opt->local_servers; i++)
            add_server(s, i, DH_SERVER_LOCAL, opt->cores_per_server);
        for (uint32_t i = 0; i < opt->remote_servers; i++)
            add_server(s, opt->local_servers + i, DH_SERVER_REMOTE, opt->cores_per_server);
    }
    uint32_t cores = 0;
    for (uint32_t i = 0; i < s->n_servers; i++)
        cores += s->servers[i].workers;
    res->cores = cores;
    res->client_start_s = o->client_start_s;
    /* the coordinator's link table: the learned rate (emulated bytes, time-scaled), 100 us */
    dh_link_t l = dh_link_make(s->link_Bps > 0 ? s->link_Bps / s->ts : 1.25e9, 100e-6);
    for (int i = 0; i < 4; i++)
        s->links[i] = l;
    dh_place_config_default(&s->place);
    s->place.policy = sp->policy;
    if (o->place_index) {
        /* the index's nodes: each local server's, then one for every remote server (all
         * links alike): (locals + 1)^2 links, not nodes^2 */
        uint32_t locals = 0;
        for (uint32_t i = 0; i < s->n_servers; i++)
            locals += s->snap[i].role == DH_SERVER_LOCAL;
        s->idx_node = dh_malloc(s->n_servers * sizeof *s->idx_node);
        s->idx_links = dh_malloc((size_t)(locals + 1) * (locals + 1) * sizeof *s->idx_links);
        if (!s->idx_node || !s->idx_links) {
            rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for the index");
            goto done;
        }
        for (uint32_t i = 0; i < s->n_servers; i++)
            s->idx_node[i] = s->servers[i].node < locals ? s->servers[i].node : locals;
        for (size_t i = 0; i < (size_t)(locals + 1) * (locals + 1); i++)
            s->idx_links[i] = l;
        dh_server_state_t *copy = dh_malloc(s->n_servers * sizeof *copy);
        if (!copy) {
            rc = dh__set_error(DH_ENOMEM, "simulate: out of memory for the index");
            goto done;
        }
        for (uint32_t i = 0; i < s->n_servers; i++) {
            copy[i] = s->snap[i];
            copy[i].node = s->idx_node[i];
        }
        dh_snapshot_t isnap = {copy, s->n_servers, s->idx_links, locals + 1};
        rc = dh_place_index_new(&s->index, &isnap);
        dh_free(copy);
        if (rc)
            goto done;
    }
    if ((rc = dh_cost_model_new(&s->model, NULL)))
        goto done;
    /* the client's configuration (train_bench.c, run_system) */
    s->tier2 = dh_bench_tier2_on(opt, sp);
    s->fanout =
        dh_bench_system_fanout(opt, sp, cores, cores, w->batch_decode_s, w->join_s, w->mean_step_s);
    s->slots =
        s->tier2 && sp->token_plan == DH_SHARE_TOKEN_PACKED && s->fanout == opt->ranks * opt->batch;
    res->fanout = s->fanout;
    res->rebalance = s->tier2;
    if (sp->deep) {
        s->prefetch = dh_bench_deep_prefetch(opt, cores);
        s->prefetch_max = opt->prefetch_max; /* 0: fixed, as bench (train_bench.c) */
        res->prefetch = s->prefetch;
    } else {
        /* PyTorch's prefetch_factor: 2 per worker of the rank's share (train_bench.c); pool's
         * copy stage holds `ahead` of them */
        uint32_t share = cores / opt->ranks;
        res->prefetch = 2 * (share ? share : 1);
        s->ahead = sp->copy ? dh_bench_copy_ahead(res->prefetch) : 0;
        s->prefetch = res->prefetch - s->ahead;
        s->prefetch_max = 0;
    }
    res->prefetch_reached = res->prefetch;
    s->depth = s->prefetch_max > res->prefetch ? s->prefetch_max : res->prefetch;
    s->requested_total = s->total + s->prefetch;
    /* requests expected in the measured window and before it: one a sample with one-sample
     * slots, else fanout a batch */
    uint64_t expected = (uint64_t)opt->ranks * s->total * (s->slots ? opt->batch : s->fanout);
    s->err_stride = expected > (1u << 20) ? expected >> 20 : 1;
    s->share = (dh_share_config_t){.mode = sp->token_plan,
                                   .algo = o->plan_algo,
                                   .ranks = opt->ranks,
                                   .batch = opt->batch,
                                   .min_rows = s->slots ? 1 : s->fanout,
                                   .window_steps = sp->deep ? opt->plan_window : 1};
    if ((rc = dh_sampler_new(&s->sampler, w->n, (size_t)opt->ranks * opt->batch, opt->seed, 1)))
        goto done;
    size_t per_step_cap = (size_t)opt->ranks * opt->batch * 2;
    s->n_steps_ring = s->depth + 4;
    s->steps = dh_calloc(s->n_steps_ring, sizeof *s->steps);
    s->scratch_rows = dh_malloc(per_step_cap * sizeof *s->scratch_rows);
    s->scratch_rank = dh_malloc((per_step_cap + opt->ranks) * sizeof *s->scratch_rank);
    s->rk = dh_calloc(opt->ranks, sizeof *s->rk);
    s->fan_load = dh_malloc(per_step_cap * sizeof *s->fan_load);
    s->fan_part = dh_malloc(per_step_cap * sizeof *s->fan_part);
    if (!s->steps || !s->scratch_rows || !s->scratch_rank || !s->rk || !s->fan_load ||
        !s->fan_part) {
        rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < s->n_steps_ring; i++) {
        step_plan_t *p = &s->steps[i];
        p->step = UINT64_MAX;
        p->rows = dh_malloc(per_step_cap * sizeof *p->rows);
        p->owner = dh_malloc(per_step_cap * sizeof *p->owner);
        p->by_rank = dh_malloc(per_step_cap * sizeof *p->by_rank);
        p->off = dh_malloc((opt->ranks + 1) * sizeof *p->off);
        if (!p->rows || !p->owner || !p->by_rank || !p->off) {
            rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
            goto done;
        }
    }
    for (uint32_t r = 0; r < opt->ranks; r++) {
        rank_t *rk = &s->rk[r];
        rk->node = sp->rank_local ? r : r % opt->local_servers;
        rk->local = s->node_server[rk->node];
        rk->horizon = s->prefetch;
        rk->tokens_of = dh_calloc(s->depth + 2, sizeof *rk->tokens_of);
        rk->ring = dh_calloc(s->depth + 2, sizeof *rk->ring);
        if (!rk->tokens_of || !rk->ring) {
            rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
            goto done;
        }
        for (uint32_t k = 0; k < s->depth + 2; k++)
            rk->ring[k].b = UINT64_MAX;
    }
    /* tier 2's groups: rebalance_group consecutive ranks (0: one group of all, bench's);
     * rounds of buffer / (group x batch) steps, at least 1, within the prefetch */
    s->rb_group =
        o->rebalance_group && o->rebalance_group < opt->ranks ? o->rebalance_group : opt->ranks;
    s->n_groups = (opt->ranks + s->rb_group - 1) / s->rb_group;
    s->rb_steps = opt->rebalance_buffer / (s->rb_group * opt->batch);
    s->rb_steps = s->rb_steps ? s->rb_steps : 1;
    s->rb_steps = s->rb_steps > s->prefetch ? s->prefetch : s->rb_steps;
    s->rb_empty =
        (uint64_t)s->rb_group * opt->ranks * opt->batch <= 65536 ? UINT32_MAX : 2 * opt->batch;
    s->n_rounds_ring = s->n_steps_ring / s->rb_steps + 2;
    s->rounds = dh_calloc((size_t)s->n_groups * s->n_rounds_ring, sizeof *s->rounds);
    if (!s->rounds) {
        rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
        goto done;
    }
    for (size_t i = 0; s->tier2 && i < (size_t)s->n_groups * s->n_rounds_ring; i++) {
        s->rounds[i].r = UINT64_MAX;
        if (!(s->rounds[i].rank_done = dh_calloc(s->rb_group, 1))) {
            rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
            goto done;
        }
    }
    if (o->rank_steps) {
        res->rank_step_s = dh_calloc((size_t)opt->ranks * opt->steps, sizeof *res->rank_step_s);
        if (!res->rank_step_s) {
            rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
            goto done;
        }
    }
    if (dh_stats_new(&s->waits) || dh_stats_new(&s->readies) || dh_stats_new(&s->err_measured) ||
        dh_stats_new(&s->err_profile) || dh_stats_new(&s->err_part[0]) ||
        dh_stats_new(&s->err_part[1])) {
        rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
        goto done;
    }
    /* Time 0: the coordinator and the servers are up. bench then creates its clients one
     * after another (client_start_s each), and each client's sender fills its horizon as
     * soon as it exists (client.c starts the sender in dh_client_new); the training loop
     * starts once the last client is made. So rank r's loader has (ranks - 1 - r) x
     * client_start_s of head start. With client_start_s 0 every sender fills its horizon at
     * time 0 and step 0 begins at once. */
    uint64_t wall0 = dh_clock_now_ns();
    double loop_s = o->client_start_s * opt->ranks;
    if (opt->warmup == 0)
        s->t_begin = loop_s;
    for (uint32_t r = 0; r < opt->ranks && s->rc == 0; r++)
        if (o->client_start_s > 0)
            s->rc = dh__sim_events_push(&s->ev, o->client_start_s * (r + 1), EV_CLIENT_START, r, 0);
        else
            sender(s, r);
    if (s->rc == 0 && sp->policy == DH_POLICY_DEADLINE)
        s->rc = dh__sim_events_push(&s->ev, ANCHOR_S, EV_ANCHOR, 0, 0);
    if (s->rc == 0 && o->client_start_s > 0)
        s->rc = dh__sim_events_push(&s->ev, loop_s, EV_LOOP_START, 0, 0);
    else if (s->rc == 0)
        step_begin(s);
    uint32_t every = opt->steps >= 10 ? opt->steps / 5 : 1;
    uint64_t reported = 0;
    dh_sim_event_t e;
    while (s->rc == 0 && s->t_end == 0 && dh__sim_events_pop(&s->ev, &e)) {
        s->now = e.t_s;
        switch (e.type) {
        case EV_TASK_DONE:
            task_done(s, e.a, (uint32_t)e.b);
            break;
        case EV_FORWARDED:
            part_delivered(s, (uint32_t)e.b);
            break;
        case EV_BATCH_READY:
            batch_ready(s, e.a, e.b);
            break;
        case EV_COPY_DONE:
            copy_done(s, e.a, e.b);
            break;
        case EV_COMPUTE_DONE:
            compute_done(s, e.a);
            break;
        case EV_CLIENT_START:
            sender(s, e.a);
            break;
        case EV_LOOP_START:
            step_begin(s);
            break;
        case EV_ANCHOR:
            anchor(s);
            s->rc = dh__sim_events_push(&s->ev, s->now + ANCHOR_S, EV_ANCHOR, 0, 0);
            break;
        default:
            break;
        }
        if (opt->progress && s->cur_step > opt->warmup &&
            (s->cur_step - opt->warmup) % every == 0 && s->cur_step != reported) {
            reported = s->cur_step;
            char line[256];
            double el = s->now - s->t_begin;
            snprintf(line, sizeof line,
                     "%s: step %llu/%u, %.1f samples/s (virtual), %.1f s of wall time", sp->name,
                     (unsigned long long)(s->cur_step - opt->warmup), opt->steps,
                     el > 0 ? (double)(s->cur_step - opt->warmup) * opt->ranks * opt->batch / el
                            : 0,
                     dh_clock_elapsed_s(wall0, dh_clock_now_ns()));
            opt->progress(line, opt->ctx);
        }
    }
    if ((rc = s->rc))
        goto done;
    if (s->t_end == 0) {
        rc = dh__set_error(DH_EIO, "simulate: %s: the run stalled at step %llu (no event left)",
                           sp->name, (unsigned long long)s->cur_step);
        goto done;
    }
    /* ---- metrics, as train_bench.c computes them ---- */
    size_t n = (size_t)opt->ranks * opt->steps;
    res->wall_s = s->t_end - s->t_begin;
    res->throughput_sps = res->wall_s > 0 ? s->samples_n / res->wall_s : 0;
    res->input_wait_p50_s = dh_stats_percentile(s->waits, 50);
    res->input_wait_p95_s = dh_stats_percentile(s->waits, 95);
    res->input_wait_p99_s = dh_stats_percentile(s->waits, 99);
    res->batch_ready_p95_s = dh_stats_percentile(s->readies, 95);
    res->ddl_miss_rate = n ? s->misses / (double)n : 0;
    res->barrier_wait_mean_s = n ? s->barrier_sum / (double)n : 0;
    res->cpu_work_s = s->cpu;
    res->max_compute_sum_s = s->max_sum;
    res->mean_compute_sum_s = s->mean_sum;
    res->samples = s->samples_n;
    res->bound_cores = cores;
    double bound = res->cpu_work_s / cores;
    if (s->max_sum > bound)
        bound = s->max_sum;
    res->ideal_sps = bound > 0 ? s->samples_n / bound : 0;
    res->efficiency = res->ideal_sps > 0 ? res->throughput_sps / res->ideal_sps : 0;
    res->balance = s->max_sum > 0 ? s->mean_sum / s->max_sum : 0;
    res->balance_bound = s->bound_sum > 0 ? s->mean_sum / s->bound_sum : 0;
    res->sched_us_per_decision = s->decisions ? s->sched_s / (double)s->decisions * 1e6 : 0;
    res->learn_split_step = (uint32_t)ceil(0.2 * (double)s->total);
    res->ddl_miss_rate_first20 = s->count_part[0] ? s->miss_part[0] / s->count_part[0] : 0;
    res->ddl_miss_rate_rest = s->count_part[1] ? s->miss_part[1] / s->count_part[1] : 0;
    res->predictions = (uint32_t)dh_stats_count(s->err_measured);
    res->prediction_error_p50 = dh_stats_percentile(s->err_measured, 50);
    res->prediction_error_p90 = dh_stats_percentile(s->err_measured, 90);
    res->prediction_error_p50_profile = dh_stats_percentile(s->err_profile, 50);
    res->prediction_error_p50_first20 = dh_stats_percentile(s->err_part[0], 50);
    res->prediction_error_p50_rest = dh_stats_percentile(s->err_part[1], 50);
    if (opt->progress) {
        char line[384];
        snprintf(line, sizeof line,
                 "%s: %.1f samples/s (ideal %.1f, efficiency %.2f, balance %.2f), input wait p95 "
                 "%.4f s, misses %.1f%%; %llu decisions, %.2f us each; %.1f s of wall time",
                 sp->name, res->throughput_sps, res->ideal_sps, res->efficiency, res->balance,
                 res->input_wait_p95_s, 100 * res->ddl_miss_rate, (unsigned long long)s->decisions,
                 res->sched_us_per_decision, dh_clock_elapsed_s(wall0, dh_clock_now_ns()));
        opt->progress(line, opt->ctx);
    }
done:
    sim_free(s);
    return rc;
}

static int check_options(const dh_sim_options_t *o)
{
    const dh_bench_options_t *b = &o->bench;
    if (b->dataset || !b->mix)
        return dh__set_error(DH_EINVAL, "simulate: give --mix NAME|FILE (emulated workloads only)");
    if (b->ranks < 1 || b->ranks > (1u << 20) || b->batch < 1 || b->batch > 4096 || b->steps < 1)
        return dh__set_error(DH_EINVAL, "simulate: --ranks in [1, 2^20], --batch in [1, 4096] and "
                                        "--steps >= 1");
    if (b->local_servers < 1 || b->cores_per_server < 1 ||
        (uint64_t)b->local_servers + b->remote_servers > (1u << 24))
        return dh__set_error(DH_EINVAL, "simulate: --local-servers and --cores-per-server must "
                                        "be at least 1, and at most 2^24 servers");
    if (!(b->time_scale > 0) || !(b->compute_scale > 0) || !(b->link_gbps >= 0))
        return dh__set_error(DH_EINVAL, "simulate: --time-scale and --compute-scale must be > 0, "
                                        "--link-gbps >= 0");
    if (!(o->link_latency_s >= 0) || !(o->server_speed_sigma >= 0 && o->server_speed_sigma <= 4))
        return dh__set_error(DH_EINVAL,
                             "simulate: --link-latency-us >= 0, --speed-sigma in [0, 4]");
    if (!(o->client_start_s >= 0 && o->client_start_s <= 60))
        return dh__set_error(DH_EINVAL, "simulate: --client-start-ms in [0, 60000]");
    if (!(b->cost_bias >= 0 && b->cost_bias <= DH__NOISE_SIGMA_MAX) ||
        !(b->cost_noise >= 0 && b->cost_noise <= DH__NOISE_SIGMA_MAX) ||
        !(b->token_noise >= 0 && b->token_noise <= DH__NOISE_SIGMA_MAX))
        return dh__set_error(DH_EINVAL, "simulate: --cost-bias, --cost-noise and --token-noise "
                                        "must be in [0, 4]");
    if (!(b->rebalance_min_gain >= 0 && b->rebalance_min_gain <= 1))
        return dh__set_error(DH_EINVAL, "simulate: --rebalance-min-gain must be in [0, 1], got %g",
                             b->rebalance_min_gain);
    if (b->plan_window < 1 || b->plan_window > 1024)
        return dh__set_error(DH_EINVAL, "simulate: --plan-window must be in [1, 1024]");
    return 0;
}

int dh_sim_run(const dh_sim_options_t *o, dh_bench_report_t *out)
{
    memset(out, 0, sizeof *out);
    int rc = check_options(o);
    if (rc)
        return rc;
    const dh_bench_options_t *opt = &o->bench;
    dh_profile_set_t *set = NULL;
    dh_mix_t *mix = NULL;
    sample_t *samples = NULL;
    if ((rc = dh_profile_set_new(&set)) || (rc = dh_mix_load(opt->mix, &mix)) ||
        (rc = dh_profiles_generate(mix, opt->emulate_rows, opt->seed, set)))
        goto done;
    /* the misprediction the bench's DataServers run, for each sample's actual cost */
    dh__noise_t noise;
    dh_experiment_noise(opt, &noise);
    size_t n = dh_profile_set_count(set);
    out->rows = n;
    if (n < (size_t)opt->ranks * opt->batch) {
        rc = dh__set_error(DH_EINVAL,
                           "simulate: %zu samples, fewer than one step's %u x %u (raise "
                           "--rows)",
                           n, opt->ranks, opt->batch);
        goto done;
    }
    samples = dh_calloc(n, sizeof *samples);
    if (!samples) {
        rc = dh__set_error(DH_ENOMEM, "simulate: out of memory");
        goto done;
    }
    double cpu_sum = 0, tok_sum = 0, out_sum = 0;
    for (size_t i = 0; i < n; i++) {
        const dh_profile_row_t *row = dh_profile_set_row(set, i);
        double est = row->cpu_s_est > 0 ? row->cpu_s_est : 0;
        samples[i].row = row;
        samples[i].act_cpu_s =
            dh__noise_cpu_s(&noise, row->id, row->profile_key, est) * opt->time_scale;
        samples[i].act_tokens = (double)dh__noise_tokens(&noise, row->id, row->tokens_est);
        samples[i].out_bytes = row->out_bytes > 0 ? (double)row->out_bytes : 0;
        samples[i].in_bytes = row->in_bytes > 0 ? (double)row->in_bytes : 0;
        cpu_sum += est;
        tok_sum += row->tokens_est > 0 ? (double)row->tokens_est : 0;
        out_sum += samples[i].out_bytes;
    }
    uint32_t helix_cores = (opt->local_servers + opt->remote_servers) * opt->cores_per_server;
    workload_t w = {.set = set, .samples = samples, .n = n};
    dh_experiment_model_t m;
    dh_experiment_model(opt, cpu_sum, tok_sum, out_sum, n, helix_cores, &m);
    w.a = out->a = m.a;
    w.b = out->b = m.b;
    w.mean_step_s = out->mean_step_compute_s = m.mean_step_s;
    w.threshold = out->deadline_threshold_s = m.threshold_s;
    w.batch_decode_s = m.batch_decode_s;
    w.join_s = m.join_s;
    char list[512];
    snprintf(list, sizeof list, "%s", opt->systems);
    char *save = NULL;
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        if (out->n_systems == DH_BENCH_MAX_SYSTEMS) {
            rc = dh__set_error(DH_EINVAL, "simulate: at most %d systems", DH_BENCH_MAX_SYSTEMS);
            goto done;
        }
        dh_bench_system_t sp;
        if ((rc = dh_bench_system_of(name, opt, &sp)))
            goto done;
        rc = run_system(o, &sp, &w, &out->systems[out->n_systems]);
        out->n_systems++;
        if (rc)
            goto done;
    }
done:
    dh_free(samples);
    dh_mix_destroy(&mix);
    dh_profile_set_destroy(&set);
    return rc;
}
