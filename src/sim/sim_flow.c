/* sim_flow.c: a request's way through the modelled cluster (sim_state.h; docs/simulator.md,
 * "The model"): the links as serial resources, the coordinator's placement over an
 * incrementally kept snapshot, tier 1's plan per step, the client's sender, and delivery
 * with tier 2's rounds and the fanout join. Virtual time; one thread. */
#include "sim/sim_state.h"

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

void dh__sim_snap_sync(sim_t *s, uint32_t i)
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
    step_plan_t *p = &s->steps[dh__sim_mod_ring(step, s->n_steps_ring)];
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
    dh__sim_snap_sync(s, (uint32_t)d.server);
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
    rk->tokens_of[dh__sim_mod_ring(b, s->depth + 2)] = tokens;
    double d = deadline_of(s, rk, b);
    batch_t *bt = &rk->ring[dh__sim_mod_ring(b, s->depth + 2)];
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

void dh__sim_sender(sim_t *s, uint32_t r)
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
        step_plan_t *p = &s->steps[dh__sim_mod_ring(b, s->n_steps_ring)];
        for (uint32_t r = g0; r < g1; r++)
            final_s[r] = s->now;
        if (p->step == b && pr.s_per_token > 0)
            applied |= decide_step(s, p, g0, g1, &pr, final_s, &proposed);
        /* each rank's batch of this step: what it owns now (moves stay in the group) */
        for (uint32_t r = g0; r < g1; r++) {
            batch_t *bt = &s->rk[r].ring[dh__sim_mod_ring(b, s->depth + 2)];
            bt->tokens = bt->bytes = bt->cpu_s = 0;
            bt->samples = 0;
        }
        for (uint32_t k = p->off[g0]; p->step == b && k < p->off[g1]; k++) {
            uint32_t i = p->by_rank[k];
            batch_t *bt = &s->rk[p->owner[i]].ring[dh__sim_mod_ring(b, s->depth + 2)];
            const sample_t *x = &s->samples[p->rows[i]];
            bt->tokens += x->act_tokens;
            bt->bytes += x->out_bytes;
            bt->cpu_s += x->act_cpu_s;
            bt->samples++;
        }
        for (uint32_t r = g0; r < g1 && s->rc == 0; r++)
            batch_final(s, r, &s->rk[r].ring[dh__sim_mod_ring(b, s->depth + 2)], final_s[r]);
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
        const batch_t *bt = &rk->ring[dh__sim_mod_ring(x, s->depth + 2)];
        if (bt->b != x || bt->parts_ready < bt->parts)
            return;
    }
    uint32_t g = r / s->rb_group;
    uint32_t members = (g + 1) * s->rb_group < s->ranks ? s->rb_group : s->ranks - g * s->rb_group;
    round_t *rd =
        &s->rounds[(size_t)g * s->n_rounds_ring + dh__sim_mod_ring(round, s->n_rounds_ring)];
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

void dh__sim_part_delivered(sim_t *s, uint32_t id)
{
    request_t *q = &s->req[id];
    rank_t *rk = &s->rk[q->rank];
    batch_t *bt = &rk->ring[dh__sim_mod_ring(q->batch, s->depth + 2)];
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
void dh__sim_task_done(sim_t *s, uint32_t si, uint32_t id)
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
    /* learn (coordinator_learn.c, learn): per sample, the key model; the speed from the residual
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
    dh__sim_snap_sync(s, si);
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
        dh__sim_part_delivered(s, id);
    } else {
        s->res->cross_node_bytes += q->bytes;
        double at = transfer(s, si, rk->node, q->bytes);
        if (dh__sim_events_push(&s->ev, at, EV_FORWARDED, q->rank, id))
            s->rc = DH_ENOMEM;
    }
    place_pending(s);
}
