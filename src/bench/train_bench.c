/* train_bench.c: `datahelix bench`, the experiment of bench/experiment.h run on threads of
 * this process against a real in-process cluster (train_bench.h), with its report. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/mix.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/stats.h"
#include "bench/progress.h"
#include "bench/train_bench.h"
#include "bench/train_cluster.h"
#include "bench/train_prefetch.h"
#include "bench/train_run.h"
#include "runtime/rt.h"

#define MAX_RANKS 64

/* The transfer cost: bytes per second of --link-gbps (0 = free). */
static double link_Bps(const dh_bench_options_t *opt)
{
    return opt->link_gbps * 1e9 / 8;
}

/* Payload bytes as the bytes they stand for (emulated: / bytes_scale). */
static double emulated(const dh_bench_options_t *opt, double bytes)
{
    return opt->dataset || opt->bytes_scale <= 0 ? bytes : bytes / opt->bytes_scale;
}

static int cmp_ref(const void *a, const void *b)
{
    return strcmp(((const row_ref_t *)a)->id, ((const row_ref_t *)b)->id);
}

static double cpu_of(const row_ref_t *refs, size_t n, const char *id)
{
    row_ref_t key = {.id = id};
    const row_ref_t *r = bsearch(&key, refs, n, sizeof *refs, cmp_ref);
    return r ? r->cpu_s : 0;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int server_index(run_t *run, const char *name)
{
    if (!name || !name[0])
        return -1;
    pthread_mutex_lock(&run->names_lock);
    int found = -1;
    for (size_t i = 0; i < run->n_server_names; i++)
        if (strcmp(run->server_names[i], name) == 0)
            found = (int)i;
    if (found < 0 && run->n_server_names < DH_BENCH_MAX_SERVERS) {
        snprintf(run->server_names[run->n_server_names], sizeof run->server_names[0], "%s", name);
        found = (int)run->n_server_names++;
    }
    pthread_mutex_unlock(&run->names_lock);
    return found;
}

/* A progress line to the caller's callback (bench/progress.h). */
#define progress(opt, ...) dh__bench_progress((opt)->progress, (opt)->ctx, __VA_ARGS__)

/* The process's CPU seconds and minor page faults so far into slot i of the run's. */
static void usage_at(run_t *run, int i)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return;
    run->user_s[i] = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
    run->sys_s[i] = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    run->minflt[i] = (double)ru.ru_minflt;
}

static void *rank_main(void *arg)
{
    rank_ctx_t *rc = arg;
    run_t *run = rc->run;
    const dh_bench_options_t *opt = run->opt;
    uint32_t total = opt->warmup + opt->steps;
    if (opt->warmup == 0) {
        rc->window_in_ns = dh_clock_now_ns();
        pthread_barrier_wait(&run->barrier);
        if (rc->rank == 0) {
            run->t_begin = dh_clock_now_ns();
            usage_at(run, 0);
        }
    }
    for (uint32_t s = 0; s < total; s++) {
        step_rec_t *st = &rc->steps[s];
        dh_client_batch_t *b = NULL;
        dh_bench_copied_t *cp = NULL; /* pool: the batch its prefetch stage copied */
        uint64_t t0 = dh_clock_now_ns();
        int e;
        do {
            e = rc->stage ? dh_bench_prefetch_next(rc->stage, &cp) : dh_client_next(rc->client, &b);
        } while (e == DH_EAGAIN);
        b = cp ? &cp->batch : b;
        uint64_t t1 = dh_clock_now_ns();
        if (e) {
            rc->rc = e;
            snprintf(rc->error, sizeof rc->error, "rank %u, step %u: %s", rc->rank, s,
                     dh_last_error());
            /* keep meeting the barrier so the others finish; compute nothing */
            pthread_barrier_wait(&run->barrier);
            continue;
        }
        st->start_ns = t0;
        st->wait_s = dh_clock_elapsed_s(t0, t1);
        st->ready_ns = b->ready_ns;
        st->req_ns = b->requested_ns;
        st->ready_s = b->ready_ns > b->requested_ns && b->requested_ns
                          ? dh_clock_elapsed_s(b->requested_ns, b->ready_ns)
                          : 0;
        st->samples = (uint32_t)b->n_samples;
        st->server = server_index(run, b->server);
        st->tok = b->n_samples ? dh_malloc(b->n_samples * sizeof *st->tok) : NULL;
        for (size_t i = 0; st->tok && i < b->n_samples; i++)
            st->tok[i] = b->samples[i].tokens > 0 ? (double)b->samples[i].tokens : 0;
        for (size_t i = 0; i < b->n_samples; i++)
            st->cpu_s += cpu_of(run->refs, run->n_refs, b->samples[i].id);
        double compute = run->a * (double)b->tokens + run->b;
        st->compute_s = compute;
        uint64_t c0 = dh_clock_now_ns();
        /* pool: copied and charged by its prefetch stage, off this thread (train_prefetch.h) */
        rc->copy_bytes += cp ? emulated(opt, cp->bytes) : 0;
        cp ? dh_bench_copied_release(&cp) : dh_client_batch_release(&b);
        sleep_s(compute - dh_clock_elapsed_s(c0, dh_clock_now_ns()));
        uint64_t t2 = dh_clock_now_ns();
        pthread_barrier_wait(&run->barrier);
        uint64_t t3 = dh_clock_now_ns();
        st->barrier_s = dh_clock_elapsed_s(t2, t3);
        if (s + 1 == opt->warmup)
            rc->window_in_ns = t2;
        if (s + 1 == total)
            rc->window_out_ns = t3;
        if (rc->rank == 0) {
            if (s + 1 == opt->warmup) {
                run->t_begin = t3;
                usage_at(run, 0);
            }
            if (s + 1 == total) {
                run->t_end = t3;
                usage_at(run, 1);
            }
            uint32_t every = opt->steps >= 10 ? opt->steps / 5 : 1;
            if (s + 1 > opt->warmup && (s + 1 - opt->warmup) % every == 0) {
                double el = dh_clock_elapsed_s(run->t_begin, t3);
                double sps =
                    el > 0 ? (double)(s + 1 - opt->warmup) * opt->ranks * opt->batch / el : 0;
                progress(opt, "%s: step %u/%u, %.1f samples/s", run->spec->name,
                         s + 1 - opt->warmup, opt->steps, sps);
            }
        }
    }
    return NULL;
}

/* Of a measured step's CPU work in the run's seconds (cpu_s x scale), the most that could
 * have run before the window opened at t_begin: all of it for a batch ready by then; for one
 * requested before and ready after, each sample on one worker for the time since the request. */
static double cpu_before(const step_rec_t *st, uint64_t t_begin, double scale)
{
    double work = st->cpu_s * scale;
    if (!st->req_ns || st->req_ns >= t_begin)
        return 0;
    if (st->ready_ns && st->ready_ns <= t_begin)
        return work;
    double most = dh_clock_elapsed_s(st->req_ns, t_begin) * st->samples;
    return work < most ? work : most;
}

/* Trace events of one system (Chrome / Perfetto JSON, microseconds). */
static int run_system(const dh_bench_options_t *opt, const dh_bench_system_t *sp,
                      const char *profiles, const char *pipeline_json, const row_ref_t *refs,
                      size_t n_refs, double a, double b, double threshold, double batch_decode_s,
                      double batch_join_s, double mean_step_s, uint32_t real_cores,
                      dh_bench_system_result_t *res, FILE *trace, int *trace_first,
                      size_t sys_index, uint64_t trace_t0)
{
    memset(res, 0, sizeof *res);
    snprintf(res->name, sizeof res->name, "%s", sp->name);
    mem_sampler_t mem;
    dh__train_mem_sampler_start(&mem);
    dh__out_peak_reset();
    res->task_budget_mb = (double)dh__out_budget() / 1048576.0;
    dh_bench_cluster_t cl;
    int rc = dh_bench_cluster_start(&cl, opt, sp, pipeline_json);
    if (rc) {
        dh_bench_cluster_stop(&cl);
        dh__train_mem_sampler_stop(&mem);
        return rc;
    }
    res->cores = cl.cores;
    uint32_t cores_eff = real_cores && real_cores < cl.cores ? real_cores : cl.cores;
    run_t run = {.opt = opt, .spec = sp, .refs = refs, .n_refs = n_refs, .a = a, .b = b};
    pthread_mutex_init(&run.names_lock, NULL);
    pthread_barrier_init(&run.barrier, NULL, opt->ranks);
    uint32_t total = opt->warmup + opt->steps;
    uint32_t *group_of = NULL; /* tier 2's groups (below) */
    rank_ctx_t *ranks = dh_calloc(opt->ranks, sizeof *ranks);
    if (!ranks) {
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
        goto done;
    }
    uint32_t per_rank_workers = sp->rank_local ? cl.cores / opt->ranks : 0;
    /* Fanout: a batch's parts decode in parallel only on cores the other ranks' batches
     * leave free, and cost a join copy (at the one transfer cost) and (packing) at least
     * `fanout` rows per rank; so split only what the prefetch horizon cannot cover
     * (dh_plan_fanout_width, from the estimates). On 2 real cores for 4 ranks fanout 2 cost 8% of
     * throughput (docs/benchmarks.md). */
    int tier2 = dh_bench_tier2_on(opt, sp);
    uint32_t fanout = dh_bench_system_fanout(opt, sp, cores_eff, cl.cores, batch_decode_s,
                                             batch_join_s, mean_step_s);
    res->fanout = fanout;
    res->rebalance = tier2;
    /* one load-balance group of all the bench's ranks (group id 0): in the emulated paper
     * layout every rank has its own node, so the group spans nodes */
    group_of = tier2 ? dh_calloc(opt->ranks, sizeof *group_of) : NULL;
    if (tier2 && !group_of) {
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
        goto done;
    }
    /* The clients are created one after another, and each one's sender starts prefetching
     * as it is created, so rank r's loader runs (ranks - 1 - r) creations ahead of the
     * training loop; their mean duration is reported for the simulator to replay
     * (client_start_s; docs/simulator.md, "The model"). */
    uint64_t clients_t0 = dh_clock_now_ns();
    for (uint32_t r = 0; r < opt->ranks; r++) {
        ranks[r].run = &run;
        ranks[r].rank = r;
        ranks[r].steps = dh_calloc(total, sizeof *ranks[r].steps);
        if (!ranks[r].steps) {
            rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
            goto done;
        }
        char node[64];
        snprintf(node, sizeof node, "node-%u", sp->rank_local ? r : r % opt->local_servers);
        dh_client_config_t cfg;
        dh_client_config_default(&cfg);
        cfg.coordinator = dh_coordinator_endpoint(cl.coord);
        cfg.zmq_ctx = cl.ctx;
        cfg.profiles = profiles;
        cfg.node = node;
        cfg.rank = r;
        cfg.ranks = opt->ranks;
        cfg.batch = opt->batch;
        cfg.seed = opt->seed;
        cfg.epochs = 0;
        cfg.max_steps = 0; /* set below, past the last measured step */
        cfg.token_plan = sp->token_plan;
        cfg.plan_window = sp->deep ? opt->plan_window : 1;
        /* the ranks of this rank's node share its local DataServer's arena */
        cfg.local_ranks =
            sp->rank_local ? 1 : (opt->ranks + opt->local_servers - 1) / opt->local_servers;
        cfg.on_error = DH_ON_ERROR_SKIP;
        cfg.next_timeout_ms = 120000;
        /* real decode: the profiles' out_bytes are the bytes (tier 2 fits its rounds to the
         * arena); emulated payloads are stand-ins, and the arena is sized for them */
        cfg.out_bytes_scale = opt->dataset ? 1 : 0;
        /* the join copy (fanout > 1) at the one transfer cost, per payload byte */
        if (!opt->dataset && opt->link_gbps > 0 && opt->bytes_scale > 0)
            cfg.emulate_copy_s_per_B = opt->time_scale / (opt->bytes_scale * link_Bps(opt));
        if (tier2) {
            cfg.rebalance.enabled = 1;
            cfg.rebalance.group_of = group_of;
            cfg.rebalance.buffer_size = opt->rebalance_buffer;
            cfg.rebalance.min_gain = opt->rebalance_min_gain;
            /* the gate's price of a move across nodes: the one transfer cost, per payload
             * byte (emulated: a byte stands for 1 / bytes_scale, time-scaled), as the
             * join copy's above; 0 = free */
            cfg.rebalance.move_s_per_B = opt->link_gbps <= 0 ? 0
                                         : opt->dataset      ? 1 / link_Bps(opt)
                                         : opt->bytes_scale > 0
                                             ? opt->time_scale / (opt->bytes_scale * link_Bps(opt))
                                             : opt->time_scale / link_Bps(opt);
        }
        if (sp->deep) {
            cfg.prefetch = dh_bench_deep_prefetch(opt, cl.cores);
            /* 0: fixed, the others' equal (docs/benchmarks.md, "Systems") */
            cfg.prefetch_max = opt->prefetch_max;
            res->prefetch = cfg.prefetch;
            cfg.fanout = fanout;
        } else {
            /* PyTorch's prefetch_factor: 2 batches in flight per worker of the rank; a pool
             * keeps as many in flight per rank as its share of the workers would under the
             * same rule (a tuned actor pool keeps every actor busy) */
            uint32_t share = sp->rank_local ? per_rank_workers : cl.cores / opt->ranks;
            res->prefetch = 2 * (share ? share : 1);
            /* pool's copy stage holds some of them (train_prefetch.h) */
            cfg.prefetch = res->prefetch - (sp->copy ? dh_bench_copy_ahead(res->prefetch) : 0);
            cfg.fanout = 1;
        }
        /* Steady state to the end: the client keeps requesting past the last measured step
         * (those batches are never consumed), so the pipeline does not drain inside the
         * window and a deep prefetch cannot borrow work from after it. */
        cfg.max_steps = total + cfg.prefetch;
        if ((rc = dh_client_new(&ranks[r].client, &cfg)) ||
            (sp->copy && (rc = dh_bench_prefetch_new(&ranks[r].stage, ranks[r].client, total,
                                                     dh_bench_copy_ahead(res->prefetch),
                                                     cfg.emulate_copy_s_per_B)))) {
            dh__set_error(rc, "bench: %s: rank %u: %s", sp->name, r, dh_last_error());
            goto done;
        }
    }
    res->client_start_s = dh_clock_elapsed_s(clients_t0, dh_clock_now_ns()) / opt->ranks;
    pthread_t threads[MAX_RANKS];
    for (uint32_t r = 0; r < opt->ranks; r++)
        pthread_create(&threads[r], NULL, rank_main, &ranks[r]);
    for (uint32_t r = 0; r < opt->ranks; r++) {
        pthread_join(threads[r], NULL);
        dh_bench_prefetch_destroy(&ranks[r].stage);
    }
    for (uint32_t r = 0; r < opt->ranks; r++) { /* the window (train_run.h) */
        if (r == 0 || ranks[r].window_in_ns > run.t_begin)
            run.t_begin = ranks[r].window_in_ns;
        if (r == 0 || ranks[r].window_out_ns < run.t_end)
            run.t_end = ranks[r].window_out_ns;
    }
    for (uint32_t r = 0; r < opt->ranks; r++)
        if (ranks[r].rc) {
            rc = dh__set_error(ranks[r].rc, "bench: %s: %s", sp->name, ranks[r].error);
            goto done;
        }

    /* ---- metrics over the measured steps ---- */
    size_t n = (size_t)opt->ranks * opt->steps;
    dh_stats_t *waits = NULL, *readies = NULL;
    res->rank_step_s = dh_calloc(n, sizeof *res->rank_step_s);
    if (!res->rank_step_s || dh_stats_new(&waits) || dh_stats_new(&readies)) {
        dh_stats_destroy(&waits);
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
        goto done;
    }
    double samples = 0, misses = 0, barrier_sum = 0, mean_sum = 0, max_sum = 0, cpu = 0;
    double before = 0; /* CPU work that could have run before the window (train_bench.h) */
    for (uint32_t s = opt->warmup; s < total; s++) {
        double mx = 0, sum = 0;
        for (uint32_t r = 0; r < opt->ranks; r++) {
            const step_rec_t *st = &ranks[r].steps[s];
            if (dh_stats_add(waits, st->wait_s) || dh_stats_add(readies, st->ready_s))
                rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
            res->rank_step_s[(size_t)r * opt->steps + (s - opt->warmup)] =
                st->wait_s + st->compute_s;
            samples += st->samples;
            misses += st->wait_s > threshold;
            barrier_sum += st->barrier_s;
            cpu += st->cpu_s;
            before += cpu_before(st, run.t_begin, opt->dataset ? 1 : opt->time_scale);
            sum += st->compute_s;
            if (st->compute_s > mx)
                mx = st->compute_s;
        }
        mean_sum += sum / opt->ranks;
        max_sum += mx;
    }
    res->wall_s = dh_clock_elapsed_s(run.t_begin, run.t_end);
    struct rusage ru; /* the process's peak so far: the arenas' pages in use are most of it */
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        res->peak_rss_mb = (double)ru.ru_maxrss / 1024.0;
    res->throughput_sps = res->wall_s > 0 ? samples / res->wall_s : 0;
    /* the whole process over the window: workers, loop, clients, ranks (per consumed sample) */
    if (samples > 0) {
        res->window_user_s_per_sample = (run.user_s[1] - run.user_s[0]) / samples;
        res->window_sys_s_per_sample = (run.sys_s[1] - run.sys_s[0]) / samples;
        res->window_minflt_per_sample = (run.minflt[1] - run.minflt[0]) / samples;
    }
    res->input_wait_p50_s = dh_stats_percentile(waits, 50);
    res->input_wait_p95_s = dh_stats_percentile(waits, 95);
    res->input_wait_p99_s = dh_stats_percentile(waits, 99);
    res->batch_ready_p95_s = dh_stats_percentile(readies, 95);
    dh_stats_destroy(&waits);
    dh_stats_destroy(&readies);
    if (rc)
        goto done;
    res->ddl_miss_rate = n ? misses / (double)n : 0;
    res->barrier_wait_mean_s = n ? barrier_sum / (double)n : 0;
    /* CPU work in the run's seconds (emulated costs are slept x time_scale) */
    res->cpu_work_s = cpu * (opt->dataset ? 1 : opt->time_scale);
    res->cpu_before_window_s = before;
    res->max_compute_sum_s = max_sum;
    res->mean_compute_sum_s = mean_sum;
    res->samples = samples;
    res->bound_cores = cores_eff;
    double bound = res->cpu_work_s / cores_eff;
    if (max_sum > bound)
        bound = max_sum;
    res->ideal_sps = bound > 0 ? samples / bound : 0;
    res->efficiency = res->ideal_sps > 0 ? res->throughput_sps / res->ideal_sps : 0;
    res->balance = max_sum > 0 ? mean_sum / max_sum : 0;
    if ((rc = dh__train_balance_bound(opt, ranks, run.a, run.b, mean_sum, res)))
        goto done;
    dh_coordinator_stats_t cs;
    dh_coordinator_stats(cl.coord, &cs);
    res->sched_us_per_decision = cs.decisions ? cs.sched_s / (double)cs.decisions * 1e6 : 0;
    if ((rc = dh__train_prediction_metrics(opt, cl.coord, ranks, fanout, threshold, res)))
        goto done;
    if (trace)
        dh__train_trace_system(trace, trace_first, sys_index, &run, ranks, trace_t0);
    for (uint32_t r = 0; r < opt->ranks; r++) {
        dh_client_stats_t st;
        dh_client_stats(ranks[r].client, &st);
        uint32_t now =
            (uint32_t)st.prefetch_now + (sp->copy ? dh_bench_copy_ahead(res->prefetch) : 0);
        res->prefetch_reached = now > res->prefetch_reached ? now : res->prefetch_reached;
    }
    /* transfers: what crossed nodes, what was copied (joins, pool's copies) */
    for (size_t i = 0; i < dh_cluster_count(cl.cluster); i++) {
        dh_dataserver_stats_t ds;
        dh_dataserver_stats(dh_cluster_server(cl.cluster, i), &ds);
        res->cross_node_bytes += emulated(opt, (double)ds.bytes_cross_node);
    }
    for (uint32_t r = 0; r < opt->ranks; r++) {
        dh_client_stats_t st;
        dh_client_stats(ranks[r].client, &st);
        res->copy_bytes += emulated(opt, (double)st.copy_bytes) + ranks[r].copy_bytes;
        /* tier 2: rounds are group-wide (rank 0's count); moves summed over receivers */
        if (r == 0) {
            res->rebalance_rounds = st.rebalance_rounds;
            res->rebalance_applied = st.rebalance_applied;
            res->rebalance_kept_by_gate = st.rebalance_kept_by_gate;
        }
        res->rebalance_moved_samples += st.rebalance_moved_samples;
        res->rebalance_moved_parts += st.rebalance_moved_parts;
        res->rebalance_bytes += emulated(opt, (double)st.rebalance_bytes);
        res->rebalance_bytes_remote += emulated(opt, (double)st.rebalance_bytes_remote);
        if (st.rebalance_s_p95 > res->rebalance_s_p95)
            res->rebalance_s_p95 = st.rebalance_s_p95;
        if (st.rebalance_final_s_p95 > res->rebalance_final_s_p95)
            res->rebalance_final_s_p95 = st.rebalance_final_s_p95;
    }
    progress(opt,
             "%s: %.1f samples/s (ideal %.1f, efficiency %.2f, balance %.2f of at most %.2f), "
             "input wait p95 %.3f s, misses %.0f%%, prefetch %u",
             sp->name, res->throughput_sps, res->ideal_sps, res->efficiency, res->balance,
             res->balance_bound, res->input_wait_p95_s, 100 * res->ddl_miss_rate,
             res->prefetch_reached);
    progress(opt,
             "%s: the process over the measured steps, a sample: %.4f CPU s user, %.4f "
             "system, %.0f minor page faults",
             sp->name, res->window_user_s_per_sample, res->window_sys_s_per_sample,
             res->window_minflt_per_sample);
    if (tier2)
        progress(opt,
                 "%s: tier 2: %llu rounds, %llu applied, %llu kept by the gate; %llu samples "
                 "in %llu parts moved (%.1f MB), decision p95 %.4f s, final p95 %.4f s",
                 sp->name, (unsigned long long)res->rebalance_rounds,
                 (unsigned long long)res->rebalance_applied,
                 (unsigned long long)res->rebalance_kept_by_gate,
                 (unsigned long long)res->rebalance_moved_samples,
                 (unsigned long long)res->rebalance_moved_parts, res->rebalance_bytes / 1e6,
                 res->rebalance_s_p95, res->rebalance_final_s_p95);
    progress(opt,
             "%s: CPU prediction error p50 %.3f p90 %.3f (profile alone: p50 %.3f); learning: "
             "first %u steps misses %.1f%% error p50 %.3f, rest misses %.1f%% error p50 %.3f",
             sp->name, res->prediction_error_p50, res->prediction_error_p90,
             res->prediction_error_p50_profile, res->learn_split_step,
             100 * res->ddl_miss_rate_first20, res->prediction_error_p50_first20,
             100 * res->ddl_miss_rate_rest, res->prediction_error_p50_rest);
done:
    for (uint32_t r = 0; ranks && r < opt->ranks; r++) {
        dh_bench_prefetch_destroy(&ranks[r].stage);
        dh_client_destroy(&ranks[r].client);
        for (uint32_t s = 0; ranks[r].steps && s < opt->warmup + opt->steps; s++)
            dh_free(ranks[r].steps[s].tok);
        dh_free(ranks[r].steps);
    }
    dh_free(ranks);
    dh_free(group_of);
    res->peak_pss_mb = dh__train_mem_sampler_stop(&mem); /* before the arenas go */
    res->pss_sampler_cpu_s = mem.cpu_s;
    res->task_heap_peak_mb = (double)dh__out_peak() / 1048576.0;
    if (rc == 0 && opt->dataset)
        progress(opt,
                 "%s: memory: peak %.0f MB held by the process (Pss; its readings took %.2f "
                 "CPU s), of which tasks' heap %.0f MB at most (budget %.0f MB, "
                 "DH_OUTPUT_BUDGET)",
                 sp->name, res->peak_pss_mb, res->pss_sampler_cpu_s, res->task_heap_peak_mb,
                 res->task_budget_mb);
    dh_bench_cluster_stop(&cl);
    pthread_barrier_destroy(&run.barrier);
    pthread_mutex_destroy(&run.names_lock);
    return rc;
}

/* ---- the whole run ---- */

static int check_options(const dh_bench_options_t *o)
{
    if (o->ranks < 1 || o->ranks > MAX_RANKS)
        return dh__set_error(DH_EINVAL, "bench: --ranks must be in [1, %d]", MAX_RANKS);
    if (o->batch < 1 || o->steps < 1)
        return dh__set_error(DH_EINVAL, "bench: --batch and --steps must be at least 1");
    if (!o->dataset == !o->mix)
        return dh__set_error(DH_EINVAL, "bench: give exactly one of --dataset DIR and --emulate "
                                        "--mix NAME");
    if (o->local_servers < 1 || o->cores_per_server < 1)
        return dh__set_error(DH_EINVAL,
                             "bench: --local-servers and --cores-per-server must be at least 1");
    if ((size_t)o->local_servers + o->remote_servers + o->ranks > DH_BENCH_MAX_SERVERS)
        return dh__set_error(DH_EINVAL, "bench: at most %d DataServers", DH_BENCH_MAX_SERVERS);
    if (!(o->compute_scale > 0) || !(o->time_scale > 0))
        return dh__set_error(DH_EINVAL, "bench: --compute-scale and --time-scale must be > 0");
    if (!(o->cost_bias >= 0 && o->cost_bias <= 4) || !(o->cost_noise >= 0 && o->cost_noise <= 4) ||
        !(o->token_noise >= 0 && o->token_noise <= 4))
        return dh__set_error(
            DH_EINVAL, "bench: --cost-bias, --cost-noise and --token-noise must be in [0, 4]");
    if (!(o->link_gbps >= 0 && o->link_gbps <= 1e6))
        return dh__set_error(DH_EINVAL, "bench: --link-gbps must be in [0, 1e6] Gb/s, got %g",
                             o->link_gbps);
    if (!o->compute_auto && (o->a < 0 || o->b < 0))
        return dh__set_error(DH_EINVAL, "bench: --compute a,b must be >= 0");
    if (o->rebalance < -1 || o->rebalance > 1)
        return dh__set_error(DH_EINVAL, "bench: rebalance must be -1 (auto), 0 or 1, got %d",
                             o->rebalance);
    if (o->plan_window < 1 || o->plan_window > 1024)
        return dh__set_error(DH_EINVAL, "bench: --plan-window must be in [1, 1024], got %u",
                             o->plan_window);
    if (o->rebalance_buffer < 1 || o->rebalance_buffer > 1000000)
        return dh__set_error(DH_EINVAL, "bench: --rebalance-buffer must be in [1, 1000000], got %u",
                             o->rebalance_buffer);
    if (!(o->rebalance_min_gain >= 0 && o->rebalance_min_gain <= 1))
        return dh__set_error(DH_EINVAL, "bench: --rebalance-min-gain must be in [0, 1], got %g",
                             o->rebalance_min_gain);
    return 0;
}

int dh_bench_run(const dh_bench_options_t *opt, dh_bench_report_t *out)
{
    memset(out, 0, sizeof *out);
    int rc = check_options(opt);
    if (rc)
        return rc;
    char profiles[1024];
    char pipeline_json[512];
    dh__noise_t noise = {0};
    const char *pj = NULL;
    bool generated = false;
    dh_profile_set_t *set = NULL;
    row_ref_t *refs = NULL;
    FILE *trace = NULL;
    if ((rc = dh_profile_set_new(&set)))
        return rc;
    if (opt->dataset) {
        snprintf(profiles, sizeof profiles, "%s/profiles.jsonl", opt->dataset);
        if ((rc = dh_profile_set_load(set, profiles)))
            goto done;
    } else {
        dh_mix_t *mix = NULL;
        if ((rc = dh_mix_load(opt->mix, &mix)))
            goto done;
        rc = dh_profiles_generate(mix, opt->emulate_rows, opt->seed, set);
        dh_mix_destroy(&mix);
        if (rc)
            goto done;
        snprintf(profiles, sizeof profiles, "%s/datahelix-bench-%d.jsonl",
                 opt->work_dir ? opt->work_dir : "/tmp", (int)getpid());
        if ((rc = dh_profile_set_write(set, profiles)))
            goto done;
        generated = true;
        if ((rc = dh_experiment_synth_pipeline(opt, pipeline_json, sizeof pipeline_json)))
            goto done;
        pj = pipeline_json;
        /* the same model the DataServers run: the bench knows each sample's actual cost */
        dh_experiment_noise(opt, &noise);
    }
    size_t n = dh_profile_set_count(set);
    out->rows = n;
    if (n < (size_t)opt->ranks * opt->batch) {
        rc = dh__set_error(DH_EINVAL, "bench: %s: %zu samples, fewer than one step's %u x %u",
                           profiles, n, opt->ranks, opt->batch);
        goto done;
    }
    refs = dh_calloc(n, sizeof *refs);
    if (!refs) {
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
        goto done;
    }
    /* cpu_sum, tok_sum: the estimates (the workload as its user would size it) */
    double cpu_sum = 0, tok_sum = 0, out_sum = 0;
    for (size_t i = 0; i < n; i++) {
        const dh_profile_row_t *row = dh_profile_set_row(set, i);
        double est = row->cpu_s_est > 0 ? row->cpu_s_est : 0;
        refs[i].id = row->id;
        refs[i].cpu_s =
            opt->dataset ? est : dh__noise_cpu_s(&noise, row->id, row->profile_key, est);
        cpu_sum += est;
        tok_sum += row->tokens_est > 0 ? (double)row->tokens_est : 0;
        out_sum += row->out_bytes > 0 ? (double)row->out_bytes : 0;
    }
    qsort(refs, n, sizeof *refs, cmp_ref);
    double mean_cpu = cpu_sum / (double)n, mean_tok = tok_sum / (double)n;
    /* Compute model. Balanced regime: the mean rank's compute summed over steps equals the
     * CPU work divided by the helix system's cores, so per step the mean rank computes
     * ranks x batch x mean CPU / cores; b takes a tenth of it, a x tokens the rest. Sized
     * from the estimates (as a user would); each step then computes a x its actual tokens. */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t real_cores = opt->dataset ? (uint32_t)(online > 0 ? online : 1) : 0;
    uint32_t helix_cores = (opt->local_servers + opt->remote_servers) * opt->cores_per_server;
    uint32_t cores_for_auto = real_cores && real_cores < helix_cores ? real_cores : helix_cores;
    if (real_cores && helix_cores > 4 * real_cores)
        dh_log_warn("bench: %u decode workers (%u servers x %u cores) on %u real cores: real "
                    "decode oversubscribes the CPUs %.0fx, so every system's batches queue for "
                    "CPU time (minutes for a few steps) and daemons compete with the workers; "
                    "give --local-servers, --remote-servers and --cores-per-server that fit the "
                    "machine (e.g. --local-servers 1 --remote-servers 0 --cores-per-server %u)",
                    helix_cores, opt->local_servers + opt->remote_servers, opt->cores_per_server,
                    real_cores, (double)helix_cores / real_cores, 2 * real_cores);
    double ts = opt->dataset ? 1 : opt->time_scale;
    dh_experiment_model_t m;
    dh_experiment_model(opt, cpu_sum, tok_sum, out_sum, n, cores_for_auto, &m);
    double a = m.a, b = m.b, threshold = m.threshold_s;
    out->a = a;
    out->b = b;
    out->mean_step_compute_s = m.mean_step_s;
    out->deadline_threshold_s = threshold;
    progress(opt,
             "%zu samples (mean %.3f CPU s, %.0f tokens); compute %.3g s/token + %.3g s: "
             "%.3f s per mean step; miss threshold %.3f s",
             n, mean_cpu * ts, mean_tok, a, b, out->mean_step_compute_s, threshold);

    if (opt->trace_path) {
        trace = fopen(opt->trace_path, "w");
        if (!trace) {
            rc = dh__set_error(-errno, "bench: cannot write --trace %s: %s", opt->trace_path,
                               strerror(errno));
            goto done;
        }
        fprintf(trace, "{\"traceEvents\":[\n");
    }
    int trace_first = 1;
    uint64_t t0 = dh_clock_now_ns();
    char list[512];
    snprintf(list, sizeof list, "%s", opt->systems);
    char *save = NULL;
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        if (out->n_systems == DH_BENCH_MAX_SYSTEMS) {
            rc = dh__set_error(DH_EINVAL, "bench: at most %d systems", DH_BENCH_MAX_SYSTEMS);
            goto done;
        }
        dh_bench_system_t sp;
        if ((rc = dh_bench_system_of(name, opt, &sp)))
            goto done;
        progress(opt, "%s: starting", name);
        rc = run_system(opt, &sp, profiles, pj, refs, n, a, b, threshold, m.batch_decode_s,
                        m.join_s, out->mean_step_compute_s, real_cores,
                        &out->systems[out->n_systems], trace, &trace_first, out->n_systems, t0);
        out->n_systems++;
        if (rc)
            goto done;
    }
done:
    if (trace) {
        fprintf(trace, "\n],\"displayTimeUnit\":\"ms\"}\n");
        if (fclose(trace) != 0 && !rc)
            rc = dh__set_error(-EIO, "bench: cannot write --trace %s", opt->trace_path);
    }
    if (generated)
        unlink(profiles);
    dh_free(refs);
    dh_profile_set_destroy(&set);
    return rc;
}
