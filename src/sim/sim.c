/* sim/sim.c: `datahelix simulate`'s entry (sim.h): one system's run over the event queue
 * and dh_sim_run over the systems; the model, event by event (docs/simulator.md, "The model"):
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
#include "sim/sim_state.h"

void dh_sim_options_default(dh_sim_options_t *opt)
{
    memset(opt, 0, sizeof *opt);
    dh_bench_options_default(&opt->bench);
    opt->bench.mix = "kinetics-mixed";
    opt->plan_algo = DH_PLAN_ALGO_DEFAULT;
    opt->rank_steps = 1;
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
            dh__sim_sender(s, r);
    if (s->rc == 0 && sp->policy == DH_POLICY_DEADLINE)
        s->rc = dh__sim_events_push(&s->ev, ANCHOR_S, EV_ANCHOR, 0, 0);
    if (s->rc == 0 && o->client_start_s > 0)
        s->rc = dh__sim_events_push(&s->ev, loop_s, EV_LOOP_START, 0, 0);
    else if (s->rc == 0)
        dh__sim_step_begin(s);
    uint32_t every = opt->steps >= 10 ? opt->steps / 5 : 1;
    uint64_t reported = 0;
    dh_sim_event_t e;
    while (s->rc == 0 && s->t_end == 0 && dh__sim_events_pop(&s->ev, &e)) {
        s->now = e.t_s;
        switch (e.type) {
        case EV_TASK_DONE:
            dh__sim_task_done(s, e.a, (uint32_t)e.b);
            break;
        case EV_FORWARDED:
            dh__sim_part_delivered(s, (uint32_t)e.b);
            break;
        case EV_BATCH_READY:
            dh__sim_batch_ready(s, e.a, e.b);
            break;
        case EV_COPY_DONE:
            dh__sim_copy_done(s, e.a, e.b);
            break;
        case EV_COMPUTE_DONE:
            dh__sim_compute_done(s, e.a);
            break;
        case EV_CLIENT_START:
            dh__sim_sender(s, e.a);
            break;
        case EV_LOOP_START:
            dh__sim_step_begin(s);
            break;
        case EV_ANCHOR:
            dh__sim_anchor(s);
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
