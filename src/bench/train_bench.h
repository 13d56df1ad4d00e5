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

#include "datahelix/place.h"
#include "datahelix/plan.h"

#define DH_BENCH_MAX_SYSTEMS 12

/* dh_bench_options_t.rebalance_fanout: the batch (every part a single sample), or the
 * system's own fanout. */
#define DH_BENCH_FANOUT_BATCH UINT32_MAX
#define DH_BENCH_FANOUT_OWN (UINT32_MAX - 1)

typedef struct dh_bench_options {
    uint32_t ranks, batch, steps, warmup;
    const char *dataset;  /* probe directory (profiles.jsonl), real decode; or NULL */
    const char *pipeline; /* dataset mode: pipeline spec path (NULL = video defaults) */
    const char *mix;      /* emulated mode: built-in mix name or JSON file */
    size_t emulate_rows;  /* emulated mode: rows generated from the mix (4096) */
    uint32_t local_servers, remote_servers, cores_per_server;
    uint32_t native_cores;       /* total cores of `native`; 0 = local_servers x cores_per_server */
    int compute_auto;            /* a from the balanced regime (see dh_bench_run) */
    double a, b;                 /* seconds per token, seconds per step (when !compute_auto) */
    double compute_scale;        /* multiplies a and b (1) */
    double deadline_threshold_s; /* a step misses when its input wait exceeds this; 0 =
                                  * 10% of the mean step compute */
    double time_scale;           /* emulated: every duration (costs and compute) x this (1) */
    double bytes_scale;          /* emulated: payload bytes x this (0.001) */
    double link_gbps;            /* the transfer cost of every system, Gb/s (25, a 25 GbE
                                  * NIC; 0 = free): every byte crossing nodes and every
                                  * byte copied costs 8 / (link_gbps x 1e9) s per emulated
                                  * byte (see the top; dataset mode: links only, its copies
                                  * are real) */
    /* emulated misprediction: each sample's actual cost is its estimate x a mean-one
     * lognormal factor per profile key (sigma cost_bias, 0.3) x one per sample (sigma
     * cost_noise, 0.3); its actual tokens the estimate x one per sample (sigma token_noise,
     * 0.1); every draw a pure function of (seed, key or sample id), the same for every
     * system; 0 = the estimates exactly. Schedulers see only the estimates. */
    double cost_bias, cost_noise, token_noise;
    uint32_t prefetch;     /* prefetch depth of the deep systems (prefetch-token, cost-ddl,
                            * ddlb, helix); 0 (the default) = at least 16 and at least the
                            * PyTorch-like systems' depth on the same cores, 2 x cores per
                            * rank (24 at 96 cores for 8 ranks) */
    uint32_t prefetch_max; /* their adaptive prefetch limit (0, the default: fixed at
                            * prefetch, as every other system's depth is; deeper only
                            * for them, so not an equal-depth comparison) */
    uint32_t fanout;       /* their microbatch fanout: requests per rank's batch, at
                            * most batch; 0 (default) = dh_plan_fanout_width (plan.h:
                            * 1 unless one worker cannot decode a batch within the
                            * prefetch horizon; cores per rank capped at the real cores
                            * with --dataset) */
    /* Tier 2 (rebalancing of materialized batches, client.h):
     * rebalance -1 (default): on for ddlb and helix only; 0: off everywhere; 1: on for
     * every deep system (prefetch-token, cost-ddl, ddlb, helix). */
    uint32_t plan_window; /* the deep systems' tier 1 across steps: W consecutive steps of
                           * an epoch planned together (1, the default: each step alone;
                           * dh_client_config_t.plan_window) */
    int rebalance;
    uint32_t rebalance_buffer; /* samples per round across the group (64) */
    double rebalance_min_gain; /* the gate's margin, a fraction of the largest rank's
                                * compute (0.05) */
    uint32_t rebalance_fanout; /* the fanout of a system with tier 2 on (tier 2 moves
                                * parts, a request's microbatch): 0 (the default) = auto,
                                * emulated: ranks x batch (one-sample slots) where the
                                * fanout join of a batch takes at most half a step at the
                                * transfer cost, else the system's own; dataset: the
                                * system's own (train_bench.c, tier2_fanout);
                                * DH_BENCH_FANOUT_BATCH = the batch; DH_BENCH_FANOUT_OWN =
                                * the system's own (--fanout, else its default); else N,
                                * at most batch */
    uint64_t seed;
    const char *systems; /* comma-separated list (see above) */
    const char *trace_path;
    const char *work_dir; /* for generated profiles (NULL = /tmp) */
    void (*progress)(const char *line, void *ctx);
    void *ctx;
} dh_bench_options_t;

void dh_bench_options_default(dh_bench_options_t *opt);

/* A system of --systems, as the harness runs it (docs/benchmarks.md, "Systems"); the
 * simulator (src/sim/) models the same ones from the same description. */
typedef struct dh_bench_system {
    const char *name;
    dh_policy_t policy;
    int rank_local; /* one local DataServer per rank (native) */
    dh_share_mode_t token_plan;
    int copy;       /* copy every batch out of the arena (object-store hop) */
    int deep;       /* prefetch opt->prefetch and microbatch fanout (else PyTorch-like) */
    int tier2;      /* tier 2 (rebalancing) under --rebalance auto: ddlb, helix */
    uint32_t cores; /* native-N: N; 0 = the default budget */
} dh_bench_system_t;

/* The system named `name` (borrowed: out->name points into it). Returns 0 or DH_EINVAL
 * naming it. */
int dh_bench_system_of(const char *name, const dh_bench_options_t *opt, dh_bench_system_t *out);

/* Whether the system runs tier 2 under opt->rebalance. */
int dh_bench_tier2_on(const dh_bench_options_t *opt, const dh_bench_system_t *sp);

/* The deep systems' prefetch depth on `cores` cores in all (--prefetch, else at least 16 and
 * at least 2 x the cores per rank). */
uint32_t dh_bench_deep_prefetch(const dh_bench_options_t *opt, uint32_t cores);

/* The system's fanout (requests per rank's batch): 1 unless deep; else --fanout or
 * dh_plan_fanout_width over cores_eff / ranks (the bound's cores) and the horizon of
 * dh_bench_deep_prefetch(cores), then tier 2's grain (ranks x batch: one-sample slots).
 * batch_decode_s: batch x the mean estimated CPU (time-scaled); batch_join_s: the fanout
 * join of a mean batch at the one transfer cost; mean_step_s: the mean step's compute. */
uint32_t dh_bench_system_fanout(const dh_bench_options_t *opt, const dh_bench_system_t *sp,
                                uint32_t cores_eff, uint32_t cores, double batch_decode_s,
                                double batch_join_s, double mean_step_s);

/* The compute model a x tokens + b (seconds, time-scaled): --compute a,b, or the balanced
 * regime from the estimates' means over `cores` (docs/benchmarks.md, "Compute"); both x
 * compute_scale. */
void dh_bench_compute_model(const dh_bench_options_t *opt, double mean_cpu_s, double mean_tokens,
                            uint32_t cores, double *a, double *b);

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
    double peak_rss_mb;        /* the bench process's peak resident memory when this system's run
                                * ended (getrusage: a running maximum over the systems so far) */
    double peak_pss_mb;        /* the most memory the process held during this system's run
                                * (proportional set size, sampled every 100 ms: an arena page
                                * mapped twice counts once) */
    double task_budget_mb;     /* the DataServers' task memory budget (DH_OUTPUT_BUDGET) */
    double task_heap_peak_mb;  /* the most of it reserved at once during this run: at most the
                                * budget, or one task alone larger than it */
    double client_start_s;     /* the mean time to create one client (dh_client_new), from the
                                * first call to the training loop's start: the clients are
                                * made one after another and each prefetches from its
                                * creation, so rank r's loader starts (ranks - 1 - r) x this
                                * ahead of the loop (simulate: the value it modelled) */
    double cpu_work_s;         /* actual CPU seconds of the samples consumed in the measured steps
                                * (emulated: their actual costs x time_scale) */
    double max_compute_sum_s;  /* the largest rank's compute, summed per step */
    double mean_compute_sum_s; /* the mean rank's compute, summed per step */
    double samples;            /* consumed in the measured steps */
    uint32_t bound_cores;      /* cores of the ideal bound: cores, capped at the real CPUs
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
