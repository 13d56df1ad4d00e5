/* train_metrics.c: what `bench` measures from one system's run (train_run.h): the trace
 * events, the online prediction errors against the actual costs, the balance bound of each
 * measured step, and the memory sampler (a thread reading the process's PSS every 100 ms, or
 * less often where a reading costs more than 2% of that: train_run.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/stats.h"
#include "bench/train_run.h"

void dh__train_trace_system(FILE *f, int *first, size_t sys, const run_t *run,
                            const rank_ctx_t *ranks, uint64_t t0)
{
    const dh_bench_options_t *opt = run->opt;
    unsigned pid_r = (unsigned)(2 * sys + 1), pid_s = (unsigned)(2 * sys + 2);
    fprintf(f,
            "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"args\":{\"name\":\"%s "
            "ranks\"}},{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"args\":{\"name\":"
            "\"%s DataServers\"}}",
            *first ? "" : ",\n", pid_r, run->spec->name, pid_s, run->spec->name);
    *first = 0;
    for (size_t i = 0; i < run->n_server_names; i++)
        fprintf(f,
                ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%zu,\"args\":{"
                "\"name\":\"%s\"}}",
                pid_s, i, run->server_names[i]);
    uint32_t total = opt->warmup + opt->steps;
    for (uint32_t r = 0; r < opt->ranks; r++) {
        fprintf(f,
                ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%u,\"args\":{"
                "\"name\":\"rank %u\"}}",
                pid_r, r, r);
        for (uint32_t s = 0; s < total; s++) {
            const step_rec_t *st = &ranks[r].steps[s];
            if (!st->start_ns)
                continue;
            double ts = (double)(st->start_ns - t0) / 1e3;
            double w = st->wait_s * 1e6, c = st->compute_s * 1e6, b = st->barrier_s * 1e6;
            fprintf(f,
                    ",\n{\"ph\":\"X\",\"name\":\"data wait\",\"pid\":%u,\"tid\":%u,\"ts\":%.1f,"
                    "\"dur\":%.1f,\"args\":{\"step\":%u}}",
                    pid_r, r, ts, w, s);
            fprintf(f,
                    ",\n{\"ph\":\"X\",\"name\":\"compute\",\"pid\":%u,\"tid\":%u,\"ts\":%.1f,"
                    "\"dur\":%.1f,\"args\":{\"step\":%u}}",
                    pid_r, r, ts + w, c, s);
            fprintf(f,
                    ",\n{\"ph\":\"X\",\"name\":\"barrier\",\"pid\":%u,\"tid\":%u,\"ts\":%.1f,"
                    "\"dur\":%.1f,\"args\":{\"step\":%u}}",
                    pid_r, r, ts + w + c, b, s);
            if (st->server >= 0 && st->req_ns && st->ready_ns > st->req_ns)
                fprintf(f,
                        ",\n{\"ph\":\"X\",\"name\":\"rank %u step %u\",\"pid\":%u,\"tid\":%d,"
                        "\"ts\":%.1f,\"dur\":%.1f,\"args\":{\"samples\":%u,\"cpu_s\":%.4f}}",
                        r, s, pid_s, st->server, (double)(st->req_ns - t0) / 1e3,
                        (double)(st->ready_ns - st->req_ns) / 1e3, st->samples, st->cpu_s);
        }
    }
}

/* ---- online feedback: predicted vs actual (see the result's fields) ---- */

int dh__train_prediction_metrics(const dh_bench_options_t *opt, const dh_coordinator_t *coord,
                                 const rank_ctx_t *ranks, uint32_t fanout, double threshold,
                                 dh_bench_system_result_t *res)
{
    uint32_t total = opt->warmup + opt->steps;
    uint32_t split = (uint32_t)ceil(0.2 * total);
    res->learn_split_step = split;
    double miss[2] = {0, 0}, count[2] = {0, 0};
    for (uint32_t s = 0; s < total; s++)
        for (uint32_t r = 0; r < opt->ranks; r++) {
            miss[s >= split] += ranks[r].steps[s].wait_s > threshold;
            count[s >= split]++;
        }
    res->ddl_miss_rate_first20 = count[0] ? miss[0] / count[0] : 0;
    res->ddl_miss_rate_rest = count[1] ? miss[1] / count[1] : 0;
    size_t n = dh_coordinator_predictions(coord, NULL, 0);
    dh_prediction_t *p = dh_calloc(n ? n : 1, sizeof *p);
    dh_stats_t *measured = NULL, *profile = NULL, *ready = NULL, *part[2] = {NULL, NULL};
    int rc = 0;
    if (!p || dh_stats_new(&measured) || dh_stats_new(&profile) || dh_stats_new(&ready) ||
        dh_stats_new(&part[0]) || dh_stats_new(&part[1])) {
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
        goto out;
    }
    /* the coordinator still runs (the clients prefetch past the window): it may keep more
     * records by now than p holds; only the first n were copied */
    size_t kept = dh_coordinator_predictions(coord, p, n);
    if (kept < n)
        n = kept;
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint64_t step = p[i].seq / (fanout ? fanout : 1);
        if (step >= total || !(p[i].actual_cpu_s > 0))
            continue; /* prefetched past the last step, or nothing measured */
        double err = fabs(p[i].pred_cpu_s - p[i].actual_cpu_s) / p[i].actual_cpu_s;
        if (dh_stats_add(part[step >= split], err))
            rc = DH_ENOMEM;
        if (step >= opt->warmup) {
            if (dh_stats_add(measured, err) ||
                dh_stats_add(profile,
                             fabs(p[i].profile_cpu_s - p[i].actual_cpu_s) / p[i].actual_cpu_s))
                rc = DH_ENOMEM;
            if (p[i].actual_ready_s > 0 &&
                dh_stats_add(ready,
                             fabs(p[i].pred_ready_s - p[i].actual_ready_s) / p[i].actual_ready_s))
                rc = DH_ENOMEM;
        }
    }
    if (rc) {
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
        goto out;
    }
    res->predictions = (uint32_t)dh_stats_count(measured);
    res->prediction_error_p50 = dh_stats_percentile(measured, 50);
    res->prediction_error_p90 = dh_stats_percentile(measured, 90);
    res->prediction_error_p50_profile = dh_stats_percentile(profile, 50);
    res->ready_error_p50 = dh_stats_percentile(ready, 50);
    res->prediction_error_p50_first20 = dh_stats_percentile(part[0], 50);
    res->prediction_error_p50_rest = dh_stats_percentile(part[1], 50);
out:
    dh_free(p);
    dh_stats_destroy(&measured);
    dh_stats_destroy(&profile);
    dh_stats_destroy(&ready);
    dh_stats_destroy(&part[0]);
    dh_stats_destroy(&part[1]);
    return rc;
}

/* ---- the balance bound ---- */

/* res->balance_bound: the best balance any plan can reach that keeps every sample in the step
 * it was consumed in (tier 1's window; tier 2 moves samples within their step), with the
 * per-rank counts free (packing) and the compute model a x tokens + b. Per measured step the
 * samples all ranks consumed are partitioned among the ranks by the exact planner on their
 * actual tokens; where it gives up (DH_ETOOBIG, large windows) the step's largest rank is
 * taken as max(total / ranks, largest sample), a lower bound, so the figure stays an upper
 * bound on the balance. A step whose tokens were not all recorded (out of memory) leaves the
 * bound at 0 (unknown). */
int dh__train_balance_bound(const dh_bench_options_t *opt, const rank_ctx_t *ranks, double a,
                            double b, double mean_sum, dh_bench_system_result_t *res)
{
    uint32_t total = opt->warmup + opt->steps;
    size_t cap = 0;
    for (uint32_t s = opt->warmup; s < total; s++) {
        size_t n = 0;
        for (uint32_t r = 0; r < opt->ranks; r++)
            n += ranks[r].steps[s].samples;
        if (n > cap)
            cap = n;
    }
    res->balance_bound = 0;
    if (cap == 0)
        return 0;
    double *load = dh_malloc(cap * sizeof *load);
    int32_t *rank_of = dh_malloc(cap * sizeof *rank_of);
    double *rank_load = dh_malloc(opt->ranks * sizeof *rank_load);
    int rc = 0;
    if (!load || !rank_of || !rank_load) {
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory");
        goto done;
    }
    double opt_sum = 0;
    for (uint32_t s = opt->warmup; s < total; s++) {
        size_t n = 0;
        for (uint32_t r = 0; r < opt->ranks; r++) {
            const step_rec_t *st = &ranks[r].steps[s];
            if (st->samples && !st->tok)
                goto done; /* unknown */
            for (uint32_t i = 0; i < st->samples; i++)
                load[n++] = st->tok[i];
        }
        double sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += load[i];
        double largest = dh_plan_lower_bound(load, n, opt->ranks);
        if (n > 0) {
            dh_plan_config_t pc = {.mode = DH_PLAN_TOKEN_BUDGET,
                                   .algo = DH_PLAN_EXACT,
                                   .ranks = opt->ranks,
                                   .batch = opt->batch,
                                   .token_budget = sum + 1};
            int e = dh_plan_step(&pc, load, NULL, n, rank_of, rank_load);
            if (e == 0) {
                largest = 0;
                for (uint32_t r = 0; r < opt->ranks; r++)
                    if (rank_load[r] > largest)
                        largest = rank_load[r];
            } else if (e != DH_ETOOBIG) {
                rc = e;
                goto done;
            }
        }
        opt_sum += a * largest + b;
    }
    res->balance_bound = opt_sum > 0 ? mean_sum / opt_sum : 0;
done:
    dh_free(load);
    dh_free(rank_of);
    dh_free(rank_load);
    return rc;
}

static double pss_mb(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "re");
    if (!f)
        return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Pss: %lf kB", &kb) == 1)
            break;
    fclose(f);
    return kb / 1024.0;
}

double dh__train_mem_pause_s(double read_cpu_s)
{
    double pause = read_cpu_s > 0 ? read_cpu_s * (1 / DH__TRAIN_MEM_DUTY - 1) : 0;
    return pause > DH__TRAIN_MEM_PAUSE_MIN_S ? pause : DH__TRAIN_MEM_PAUSE_MIN_S;
}

static void *mem_sampler_main(void *arg)
{
    mem_sampler_t *m = arg;
    while (!atomic_load(&m->stop)) {
        uint64_t c0 = dh_clock_thread_cpu_ns();
        double mb = m->read_mb();
        double cost = (double)(dh_clock_thread_cpu_ns() - c0) / 1e9;
        double pause = dh__train_mem_pause_s(cost);
        m->cpu_s += cost;
        if (mb > m->peak_mb)
            m->peak_mb = mb;
        atomic_fetch_add(&m->readings, 1);
        /* in steps of the shortest pause, so that stopping never waits longer */
        for (double slept = 0; slept < pause && !atomic_load(&m->stop);
             slept += DH__TRAIN_MEM_PAUSE_MIN_S) {
            struct timespec ts = {0, (long)(DH__TRAIN_MEM_PAUSE_MIN_S * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

void dh__train_mem_sampler_start_with(mem_sampler_t *m, double (*read_mb)(void))
{
    memset(m, 0, sizeof *m);
    atomic_init(&m->stop, 0);
    atomic_init(&m->readings, 0);
    m->read_mb = read_mb;
    m->started = pthread_create(&m->thread, NULL, mem_sampler_main, m) == 0;
}

void dh__train_mem_sampler_start(mem_sampler_t *m)
{
    dh__train_mem_sampler_start_with(m, pss_mb);
}

double dh__train_mem_sampler_stop(mem_sampler_t *m)
{
    if (!m->started)
        return 0;
    atomic_store(&m->stop, 1);
    pthread_join(m->thread, NULL);
    m->started = false;
    uint64_t c0 = dh_clock_thread_cpu_ns();
    double mb = m->read_mb(); /* the last moment too */
    m->cpu_s += (double)(dh_clock_thread_cpu_ns() - c0) / 1e9;
    return mb > m->peak_mb ? mb : m->peak_mb;
}
