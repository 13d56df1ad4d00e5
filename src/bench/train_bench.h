/* bench/train_bench.h: `datahelix bench`, the emulated synchronous training loop (docs/design.md
 * §8, docs/benchmarks.md).
 *
 * R ranks are threads of this process, each with a real client of the data plane; the
 * coordinator and the DataServers of each system run as threads too, over inproc://
 * endpoints of one ZeroMQ context (local delivery still goes through the shared-memory
 * arena and its notice channel). Each rank takes a batch from its client (input wait),
 * "computes" for a x tokens + b seconds (a sleep: the emulated accelerator leaves the CPU to
 * the data plane), then meets the others at a barrier (the all-reduce).
 *
 * Systems (one run, side by side, the same samples and seed):
 *   native       rank-local loaders: one local DataServer per rank with the CPU budget
 *                split evenly, `local` placement, sample-count batching, prefetch
 *                2 x workers (PyTorch's prefetch_factor)
 *   native-N     the same with N cores in all (N / ranks per rank)
 *   pool, base   one shared pool (the helix servers), least-request routing, sample-count
 *                batching, 2 batches in flight per worker of the rank's share, and a copy
 *                of every batch into the consumer on a prefetch thread of the rank (the
 *                object-store hop of a Ray actor pool, fetched as Ray Data's prefetch
 *                threads do; train_prefetch.h), within the same depth
 *   transport    base with zero-copy delivery
 *   prefetch-token  transport + tier-1 token planning, prefetch P, microbatch fanout F
 *   cost-ddl     prefetch-token + deadline placement (tier 1 alone)
 *   ddlb, helix  cost-ddl + tier 2: every rank's client rebalances materialized batches
 *                (client.h, "Tier 2") in one load-balance group of all the bench's ranks
 *                (in the emulated paper layout every rank has its own node, so a move
 *                crosses a link, charged like any forwarding); the gate's move cost is
 *                the same 8 / (link_gbps x 1e9) s per emulated byte
 * One transfer-cost model for every system (link_gbps): a byte that crosses nodes holds the
 * forwarding DataServer's link (dh_dataserver_config_t.emulate_link_Bps), a byte a system
 * copies holds the copying thread (pool's copy: the rank's prefetch thread; the fanout
 * join: the client's fetcher, dh_client_config_t.emulate_copy_s_per_B), each for the same
 * 8 / (link_gbps x 1e9) seconds per emulated byte (the payload / bytes_scale).
 * Emulated mode runs the synthetic pipeline (sleeping each sample's actual CPU seconds, so
 * one machine emulates many virtual cores; actual = estimate x seeded noise, see
 * cost_bias below); dataset mode decodes real clips.
 */
#ifndef DH_BENCH_TRAIN_BENCH_H
#define DH_BENCH_TRAIN_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench/experiment.h"

typedef struct dh_bench_system_result {
    char name[32];
    uint32_t cores;            /* worker threads (virtual cores) of the system */
    uint32_t fanout;           /* requests per rank's batch */
    uint32_t prefetch;         /* the prefetch depth it started with (batches per rank) */
    uint32_t prefetch_reached; /* the deepest prefetch horizon of a rank at the end */
    double throughput_sps;
    double input_wait_p50_s, input_wait_p95_s, input_wait_p99_s;
    double batch_ready_p95_s;
    double ddl_miss_rate;
    double barrier_wait_mean_s;
    double sched_us_per_decision;
    double ideal_sps, efficiency, balance;
    double balance_bound; /* the best balance of any plan keeping each sample in its
                           * step, per-rank counts free: each measured step's samples
                           * partitioned exactly by their actual tokens (see
                           * docs/benchmarks.md, "The balance bound") */
    double wall_s;
    double peak_rss_mb;         /* the bench process's peak resident memory when this system's run
                                 * ended (getrusage: a running maximum over the systems so far) */
    double peak_pss_mb;         /* the most memory the process held during this system's run
                                 * (proportional set size, sampled every 100 ms or less often,
                                 * at most 2% of a core: train_run.h; an arena page mapped
                                 * twice counts once) */
    double pss_sampler_cpu_s;   /* CPU seconds the Pss sampler's readings took (train_run.h) */
    double task_budget_mb;      /* the DataServers' task memory budget (DH_OUTPUT_BUDGET) */
    double task_heap_peak_mb;   /* the most of it reserved at once during this run: at most the
                                 * budget, or one task alone larger than it */
    double client_start_s;      /* the mean time to create one client (dh_client_new), from the
                                 * first call to the training loop's start: the clients are
                                 * made one after another and each prefetches from its
                                 * creation, so rank r's loader starts (ranks - 1 - r) x this
                                 * ahead of the loop (simulate: the value it modelled) */
    double cpu_work_s;          /* actual CPU seconds of the samples consumed in the measured steps
                                 * (emulated: their actual costs x time_scale) */
    double cpu_before_window_s; /* of cpu_work_s, at most this much could have run before the
                                 * window opened: batches ready before its first barrier, and
                                 * of those requested before it, the part the time since their
                                 * request allows. A deep buffer filled in the warm-up lets a
                                 * system run above ideal_sps by up to this much work */
    double max_compute_sum_s;   /* the largest rank's compute, summed per step */
    double mean_compute_sum_s;  /* the mean rank's compute, summed per step */
    double samples;             /* consumed in the measured steps */
    /* The process's CPU seconds (user, system) and minor page faults over the measured window
     * (getrusage between its first and last barrier), per sample consumed in it: everything
     * the process ran (decode, copies, first touch of fresh pages, clients, ranks), so
     * comparable between systems where the other load on the machine is not */
    double window_user_s_per_sample, window_sys_s_per_sample, window_minflt_per_sample;
    uint32_t bound_cores; /* cores of the ideal bound: cores, capped at the real CPUs
                           * in dataset mode. ideal_sps = samples / max(cpu_work_s /
                           * bound_cores, max_compute_sum_s); balance = mean / max */
    /* Transfers over the whole run (warm-up included), emulated bytes (payload /
     * bytes_scale): */
    double cross_node_bytes; /* forwarded from a DataServer to another node's */
    double copy_bytes;       /* copied by the system: fanout joins and pool's copy */
    /* Tier 2 over the whole run (0 where it is off): rounds are group-wide (rank 0's
     * counts: rounds, applied, kept by the gate); the samples and parts moved and their
     * bytes are summed over the receiving ranks (bytes emulated, like cross_node_bytes;
     * _remote: those forwarded across nodes); rebalance_s_p95 is the largest rank's p95 of
     * the time from a round's last part materialized to its decision applied,
     * rebalance_final_s_p95 the same to its batches final (moved parts arrived, joined). */
    int rebalance;
    uint64_t rebalance_rounds, rebalance_applied, rebalance_kept_by_gate;
    uint64_t rebalance_moved_samples, rebalance_moved_parts;
    double rebalance_bytes, rebalance_bytes_remote;
    double rebalance_s_p95, rebalance_final_s_p95;
    double *rank_step_s; /* ranks x steps: each rank's step time (wait + compute), for plots */
    /* ---- online feedback: predicted vs actual (dh_coordinator_predictions) ----
     * A request's error is |predicted - actual| / actual CPU seconds; its step is its seq /
     * fanout. prediction_error_*: over the requests of the measured steps. The learning split
     * is over every step the model sees, warm-up included (it learns from the first
     * completion): *_first20 over steps [0, learn_split_step), learn_split_step = ceil(20% of
     * warm-up + steps), *_rest over the steps after. Cold start (an empty pipeline) also
     * falls in the first 20%: compare with --cost-bias 0, where there is nothing to learn. */
    double prediction_error_p50, prediction_error_p90;
    double prediction_error_p50_profile; /* the same requests predicted from the profile
                                          * alone (the descriptors' cpu_s): what learning
                                          * buys, on the same requests */
    double ready_error_p50; /* the same for T (predicted ready time) vs DISPATCH-to-COMPLETE */
    double prediction_error_p50_first20, prediction_error_p50_rest;
    double ddl_miss_rate_first20, ddl_miss_rate_rest;
    uint32_t learn_split_step;
    uint32_t predictions; /* requests with a record in the measured steps */
} dh_bench_system_result_t;

typedef struct dh_bench_report {
    dh_bench_system_result_t systems[DH_BENCH_MAX_SYSTEMS];
    size_t n_systems;
    double a, b;                 /* the compute model used */
    double deadline_threshold_s; /* the one used */
    double mean_step_compute_s;
    size_t rows;
} dh_bench_report_t;

/* Runs every system of opt->systems in turn. Returns 0, DH_EINVAL (options: the message
 * names the option), profile / pipeline errors, or the first runtime error (the message
 * names the system and rank). */
int dh_bench_run(const dh_bench_options_t *opt, dh_bench_report_t *out);

/* Frees what a report holds. */
void dh_bench_report_clear(dh_bench_report_t *r);

/* The report as one JSON object (the shape of docs/benchmarks.md). */
int dh_bench_write_json(FILE *f, const dh_bench_options_t *opt, const dh_bench_report_t *r);

/* The table: one row per system, with ratios against native and pool when present. */
void dh_bench_print_table(FILE *f, const dh_bench_report_t *r);

#endif
