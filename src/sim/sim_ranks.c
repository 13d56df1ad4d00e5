/* sim_ranks.c: the modelled ranks (sim_state.h; docs/simulator.md, "The model"): pool's
 * copy stage, next() returning a final batch, compute of a x actual tokens + b, the
 * barrier with its balance bound, and the coordinator's speed anchor. Virtual time; one
 * thread. */
#include "sim/sim_state.h"

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
    batch_t *bt = &rk->ring[dh__sim_mod_ring(rk->taken, s->depth + 2)];
    if (bt->b != rk->taken || !bt->ready)
        return;
    rk->copying = true;
    rk->taken++;
    if (dh__sim_events_push(&s->ev, s->now + bt->bytes * s->copy_s_per_B, EV_COPY_DONE, r, bt->b))
        s->rc = DH_ENOMEM;
    dh__sim_sender(s, r); /* the client's next() returned: its horizon moves on */
}

static void next_returns(sim_t *s, uint32_t r)
{
    rank_t *rk = &s->rk[r];
    uint64_t b = rk->consumed;
    batch_t *bt = &rk->ring[dh__sim_mod_ring(b, s->depth + 2)];
    rk->waiting = false;
    /* the compute window just measured: from the previous return to this call */
    if (b > 0) {
        double window = rk->entry_s - rk->last_return_s;
        int64_t tokens = rk->tokens_of[dh__sim_mod_ring(b - 1, s->depth + 2)];
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
    dh__sim_sender(s, r);
    stage_try(s, r);
}

void dh__sim_step_begin(sim_t *s)
{
    s->step_start_s = s->now;
    s->arrived = 0;
    s->step_max = s->step_sum = 0;
    for (uint32_t r = 0; r < s->ranks && s->rc == 0; r++) {
        rank_t *rk = &s->rk[r];
        rk->entry_s = s->now;
        batch_t *bt = &rk->ring[dh__sim_mod_ring(s->cur_step, s->depth + 2)];
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
    step_plan_t *p = &s->steps[dh__sim_mod_ring(step, s->n_steps_ring)];
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

void dh__sim_compute_done(sim_t *s, uint32_t r)
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
    dh__sim_step_begin(s);
}

void dh__sim_batch_ready(sim_t *s, uint32_t r, uint64_t b)
{
    rank_t *rk = &s->rk[r];
    batch_t *bt = &rk->ring[dh__sim_mod_ring(b, s->depth + 2)];
    if (bt->b != b)
        return;
    bt->ready = true;
    bt->ready_s = s->now;
    if (s->sp->copy)
        stage_try(s, r);
    else if (rk->waiting && rk->consumed == b && s->cur_step == b)
        next_returns(s, r);
}

void dh__sim_copy_done(sim_t *s, uint32_t r, uint64_t b)
{
    rank_t *rk = &s->rk[r];
    batch_t *bt = &rk->ring[dh__sim_mod_ring(b, s->depth + 2)];
    rk->copying = false;
    if (bt->b == b) {
        bt->copied = true;
        if (rk->waiting && rk->consumed == b && s->cur_step == b)
            next_returns(s, r);
    }
    stage_try(s, r);
}

void dh__sim_anchor(sim_t *s)
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
            dh__sim_snap_sync(s, i);
        }
        dh_cost_model_scale(s->model, median);
    }
    dh_free(speeds);
}
