/* bench_report.c: the report of `bench` and `simulate` (train_bench.h,
 * dh_bench_report_t): its JSON (the shape of docs/benchmarks.md) and its table, with the
 * ratios against native and pool. No threads; writes only to the caller's FILE. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "bench/train_bench.h"

void dh_bench_report_clear(dh_bench_report_t *r)
{
    for (size_t i = 0; i < r->n_systems; i++)
        dh_free(r->systems[i].rank_step_s);
    memset(r, 0, sizeof *r);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

int dh_bench_write_json(FILE *f, const dh_bench_options_t *o, const dh_bench_report_t *r)
{
    char fanout_text[16]; /* "auto", "batch", "own" or N, as --rebalance-fanout takes it */
    if (o->rebalance_fanout == 0 || o->rebalance_fanout == DH_BENCH_FANOUT_BATCH ||
        o->rebalance_fanout == DH_BENCH_FANOUT_OWN)
        snprintf(fanout_text, sizeof fanout_text, "\"%s\"",
                 o->rebalance_fanout == 0                     ? "auto"
                 : o->rebalance_fanout == DH_BENCH_FANOUT_OWN ? "own"
                                                              : "batch");
    else
        snprintf(fanout_text, sizeof fanout_text, "%u", o->rebalance_fanout);
    fprintf(f, "{\"config\":{\"mode\":\"%s\",\"source\":", o->dataset ? "dataset" : "emulate");
    json_str(f, o->dataset ? o->dataset : o->mix);
    fprintf(f,
            ",\"ranks\":%u,\"batch\":%u,\"steps\":%u,\"warmup\":%u,\"local_servers\":%u,"
            "\"remote_servers\":%u,\"cores_per_server\":%u,\"native_cores\":%u,\"a\":%.9g,"
            "\"b\":%.9g,\"compute_scale\":%.9g,\"deadline_threshold_s\":%.6g,\"time_scale\":%.9g,"
            "\"bytes_scale\":%.9g,\"link_gbps\":%.9g,\"cost_bias\":%.9g,\"cost_noise\":%.9g,"
            "\"token_noise\":%.9g,\"prefetch\":%u,\"prefetch_max\":%u,"
            "\"fanout\":%u,\"plan_window\":%u,\"rebalance\":%d,\"rebalance_buffer\":%u,"
            "\"rebalance_min_gain\":%.9g,\"rebalance_fanout\":%s,\"seed\":%llu,"
            "\"rows\":%zu,"
            "\"systems\":",
            o->ranks, o->batch, o->steps, o->warmup, o->local_servers, o->remote_servers,
            o->cores_per_server,
            o->native_cores ? o->native_cores : o->local_servers * o->cores_per_server, r->a, r->b,
            o->compute_scale, r->deadline_threshold_s, o->dataset ? 1 : o->time_scale,
            o->dataset ? 1 : o->bytes_scale, o->link_gbps, o->dataset ? 0 : o->cost_bias,
            o->dataset ? 0 : o->cost_noise, o->dataset ? 0 : o->token_noise, o->prefetch,
            o->prefetch_max, o->fanout, o->plan_window, o->rebalance, o->rebalance_buffer,
            o->rebalance_min_gain, fanout_text, (unsigned long long)o->seed, r->rows);
    json_str(f, o->systems);
    fprintf(f, "},\"systems\":{");
    for (size_t i = 0; i < r->n_systems; i++) {
        const dh_bench_system_result_t *s = &r->systems[i];
        fprintf(f, "%s", i ? "," : "");
        json_str(f, s->name);
        fprintf(f,
                ":{\"throughput_sps\":%.9g,\"input_wait_p50_s\":%.6g,\"input_wait_p95_s\":%.6g,"
                "\"input_wait_p99_s\":%.6g,\"batch_ready_p95_s\":%.6g,\"ddl_miss_rate\":%.6g,"
                "\"barrier_wait_mean_s\":%.6g,"
                "\"sched_us_per_decision\":%.6g,\"ideal_sps\":%.9g,\"efficiency\":%.9g,"
                "\"balance\":%.9g,\"balance_bound\":%.9g,\"cores\":%u,\"cpu_work_s\":%.9g,"
                "\"cpu_before_window_s\":%.9g,\"max_"
                "compute_sum_s\":%.9g,"
                "\"mean_compute_sum_s\":%.9g,\"samples\":%.0f,\"bound_cores\":%u,\"fanout\":%u,"
                "\"prefetch\":%u,\"prefetch_reached\":%u,\"wall_s\":%.9g,\"peak_rss_mb\":%.1f",
                s->throughput_sps, s->input_wait_p50_s, s->input_wait_p95_s, s->input_wait_p99_s,
                s->batch_ready_p95_s, s->ddl_miss_rate, s->barrier_wait_mean_s,
                s->sched_us_per_decision, s->ideal_sps, s->efficiency, s->balance, s->balance_bound,
                s->cores, s->cpu_work_s, s->cpu_before_window_s, s->max_compute_sum_s,
                s->mean_compute_sum_s, s->samples, s->bound_cores, s->fanout, s->prefetch,
                s->prefetch_reached, s->wall_s, s->peak_rss_mb);
        fprintf(f,
                ",\"peak_pss_mb\":%.1f,\"pss_sampler_cpu_s\":%.3f,\"task_budget_mb\":%.1f,"
                "\"task_heap_peak_mb\":%.1f",
                s->peak_pss_mb, s->pss_sampler_cpu_s, s->task_budget_mb, s->task_heap_peak_mb);
        fprintf(f, ",\"client_start_s\":%.6g", s->client_start_s);
        fprintf(f,
                ",\"window_user_s_per_sample\":%.6g,\"window_sys_s_per_sample\":%.6g,"
                "\"window_minflt_per_sample\":%.6g",
                s->window_user_s_per_sample, s->window_sys_s_per_sample,
                s->window_minflt_per_sample);
        /* transfers */
        fprintf(f, ",\"cross_node_bytes\":%.6g,\"copy_bytes\":%.6g", s->cross_node_bytes,
                s->copy_bytes);
        /* tier 2 (zeros where it is off) */
        fprintf(f,
                ",\"rebalance\":%s,\"rebalance_rounds\":%llu,\"rebalance_applied\":%llu,"
                "\"rebalance_kept_by_gate\":%llu,\"rebalance_moved_samples\":%llu,"
                "\"rebalance_moved_parts\":%llu,\"rebalance_bytes\":%.6g,"
                "\"rebalance_bytes_remote\":%.6g,\"rebalance_s_p95\":%.6g,"
                "\"rebalance_final_s_p95\":%.6g",
                s->rebalance ? "true" : "false", (unsigned long long)s->rebalance_rounds,
                (unsigned long long)s->rebalance_applied,
                (unsigned long long)s->rebalance_kept_by_gate,
                (unsigned long long)s->rebalance_moved_samples,
                (unsigned long long)s->rebalance_moved_parts, s->rebalance_bytes,
                s->rebalance_bytes_remote, s->rebalance_s_p95, s->rebalance_final_s_p95);
        fprintf(f,
                ",\"prediction_error_p50\":%.6g,\"prediction_error_p90\":%.6g,"
                "\"prediction_error_p50_profile\":%.6g,\"ready_error_p50\":%.6g,"
                "\"prediction_error_p50_first20\":%.6g,\"prediction_error_p50_rest\":%.6g,"
                "\"ddl_miss_rate_first20\":%.6g,\"ddl_miss_rate_rest\":%.6g,"
                "\"learn_split_step\":%u,\"predictions\":%u",
                s->prediction_error_p50, s->prediction_error_p90, s->prediction_error_p50_profile,
                s->ready_error_p50, s->prediction_error_p50_first20, s->prediction_error_p50_rest,
                s->ddl_miss_rate_first20, s->ddl_miss_rate_rest, s->learn_split_step,
                s->predictions);
        fprintf(f, ",\"rank_step_s\":[");
        for (uint32_t rk = 0; s->rank_step_s && rk < o->ranks; rk++) {
            fprintf(f, "%s[", rk ? "," : "");
            for (uint32_t st = 0; st < o->steps; st++)
                fprintf(f, "%s%.5g", st ? "," : "", s->rank_step_s[(size_t)rk * o->steps + st]);
            fprintf(f, "]");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "}}\n");
    return ferror(f) ? dh__set_error(-EIO, "bench: cannot write the JSON report") : 0;
}

static const dh_bench_system_result_t *find(const dh_bench_report_t *r, const char *name)
{
    for (size_t i = 0; i < r->n_systems; i++)
        if (strcmp(r->systems[i].name, name) == 0)
            return &r->systems[i];
    return NULL;
}

/* One ratio line: "helix (96 cores) / pool (96 cores)  1.56x". */
static void print_ratio(FILE *f, const dh_bench_system_result_t *s,
                        const dh_bench_system_result_t *t)
{
    char left[96];
    snprintf(left, sizeof left, "%s (%u cores) / %s (%u cores)", s->name, s->cores, t->name,
             t->cores);
    fprintf(f, "  %-46s %6.2fx\n", left, s->throughput_sps / t->throughput_sps);
}

void dh_bench_print_table(FILE *f, const dh_bench_report_t *r)
{
    fprintf(f, "%-15s %5s %9s %8s %8s %8s %7s %6s %8s %8s %5s %5s %10s %10s\n", "system", "cores",
            "samples/s", "wait p50", "wait p95", "wait p99", "ready95", "miss", "barrier",
            "sched us", "eff", "bal", "x-node MB", "copy MB");
    for (size_t i = 0; i < r->n_systems; i++) {
        const dh_bench_system_result_t *s = &r->systems[i];
        fprintf(f,
                "%-15s %5u %9.1f %8.3f %8.3f %8.3f %7.3f %5.0f%% %8.3f %8.1f %5.2f %5.2f %10.1f "
                "%10.1f\n",
                s->name, s->cores, s->throughput_sps, s->input_wait_p50_s, s->input_wait_p95_s,
                s->input_wait_p99_s, s->batch_ready_p95_s, 100 * s->ddl_miss_rate,
                s->barrier_wait_mean_s, s->sched_us_per_decision, s->efficiency, s->balance,
                s->cross_node_bytes / 1e6, s->copy_bytes / 1e6);
        if (s->rebalance)
            fprintf(f,
                    "  tier 2: %llu rounds (%llu applied, %llu kept by the gate), %llu samples "
                    "in %llu parts moved, %.1f MB, decision p95 %.3f s, final p95 %.3f s\n",
                    (unsigned long long)s->rebalance_rounds,
                    (unsigned long long)s->rebalance_applied,
                    (unsigned long long)s->rebalance_kept_by_gate,
                    (unsigned long long)s->rebalance_moved_samples,
                    (unsigned long long)s->rebalance_moved_parts, s->rebalance_bytes / 1e6,
                    s->rebalance_s_p95, s->rebalance_final_s_p95);
    }
    /* Ratios of one system (helix, else ddlb, else cost-ddl, else the last) to every other,
     * each labelled with both systems' cores: the equal-budget ones first (docs/design.md
     * §8). */
    const dh_bench_system_result_t *subj = find(r, "helix");
    if (!subj)
        subj = find(r, "ddlb");
    if (!subj)
        subj = find(r, "cost-ddl");
    if (!subj && r->n_systems)
        subj = &r->systems[r->n_systems - 1];
    for (int equal = 1; subj && equal >= 0; equal--) {
        int header = 0;
        for (size_t i = 0; i < r->n_systems; i++) {
            const dh_bench_system_result_t *t = &r->systems[i];
            if (t == subj || !(t->throughput_sps > 0) || (t->cores == subj->cores) != equal)
                continue;
            if (!header++)
                fprintf(f, "%s\n",
                        equal ? "throughput ratios at equal CPU budget:"
                              : "throughput ratios across budgets (not like for like):");
            print_ratio(f, subj, t);
        }
    }
    for (size_t i = 0; i < r->n_systems; i++)
        if (r->systems[i].efficiency > 1.02)
            fprintf(f,
                    "note: %s ran above its ideal bound (efficiency %.2f): the measured steps "
                    "drew on batches prefetched before them; use more --steps / --warmup or "
                    "less --prefetch for a steady-state figure\n",
                    r->systems[i].name, r->systems[i].efficiency);
}
