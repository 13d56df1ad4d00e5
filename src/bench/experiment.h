/* bench/experiment.h: the experiment both `datahelix bench` (train_bench.h) and `datahelix
 * simulate` (sim/sim.h) run, defined once (docs/benchmarks.md, docs/simulator.md): its
 * options (dh_bench_options_t) and their table (name, field, default, range, help: both
 * CLIs parse and document the shared ones from it), the systems catalogue, the workload's
 * misprediction (model/model_lib.h) and the compute model. No threads, no I/O but the help text
 * to the caller's FILE.
 */
#ifndef DH_BENCH_EXPERIMENT_H
#define DH_BENCH_EXPERIMENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "datahelix/place.h"
#include "datahelix/plan.h"
#include "model/model_lib.h"

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
 * simulator (src/sim/) models the same ones from the same row of the catalogue
 * (experiment.c). */
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

/* ---- the workload ---- */

/* The misprediction model of the emulated workload (the one the DataServers' synthetic
 * pipeline runs: each sigma as the spec's JSON carries it, %.9g). */
void dh_experiment_noise(const dh_bench_options_t *opt, dh__noise_t *out);

/* The synthetic pipeline spec of emulated mode (rt.h's {"type":"synthetic",...}) into buf.
 * Returns 0, or DH_EINVAL if it does not fit. */
int dh_experiment_synth_pipeline(const dh_bench_options_t *opt, char *buf, size_t cap);

/* What both runs derive from the workload's means (the estimates) and the options. */
typedef struct dh_experiment_model {
    double a, b;           /* compute: a x tokens + b seconds (dh_bench_compute_model) */
    double mean_step_s;    /* a x batch x mean tokens + b */
    double threshold_s;    /* a step misses when its input wait exceeds this */
    double batch_decode_s; /* batch x the mean estimated CPU (time-scaled) */
    double join_s;         /* the fanout join of a mean batch at the one transfer cost (0 in
                            * dataset mode or at --link-gbps 0) */
} dh_experiment_model_t;

/* The model from the sums of the estimates over the n samples (CPU seconds, tokens, payload
 * bytes) over `cores` (the balanced regime's budget). n > 0. */
void dh_experiment_model(const dh_bench_options_t *opt, double cpu_s_sum, double tokens_sum,
                         double out_bytes_sum, size_t n, uint32_t cores,
                         dh_experiment_model_t *out);

/* ---- the option table ---- */

/* The commands an option belongs to. */
#define DH_EXPERIMENT_BENCH 1u
#define DH_EXPERIMENT_SIMULATE 2u
#define DH_EXPERIMENT_BOTH (DH_EXPERIMENT_BENCH | DH_EXPERIMENT_SIMULATE)

typedef enum dh_experiment_kind {
    DH_EXPERIMENT_U32,     /* an integer in [min, max] */
    DH_EXPERIMENT_SIZE,    /* the same, a size_t */
    DH_EXPERIMENT_U64,     /* the same, a uint64_t */
    DH_EXPERIMENT_DOUBLE,  /* a number in [min, max] */
    DH_EXPERIMENT_STRING,  /* the argument itself (borrowed from argv) */
    DH_EXPERIMENT_SET_INT, /* no argument: sets an int field to `value` */
    DH_EXPERIMENT_COMPUTE, /* auto or A,B (compute_auto, a, b) */
    DH_EXPERIMENT_FANOUT   /* auto, batch, own or N in [min, max] (rebalance_fanout) */
} dh_experiment_kind_t;

typedef struct dh_experiment_option {
    const char *name; /* the long option, without "--" */
    const char *arg;  /* the argument's name in the help (NULL: none) */
    dh_experiment_kind_t kind;
    size_t offset;       /* of the field in dh_bench_options_t */
    double def;          /* the field's default (numbers, SET_INT's field; strings: none) */
    double value;        /* SET_INT: the value it sets */
    double min, max;     /* the accepted range (bench's) */
    double sim_max;      /* simulate's upper bound where it may exceed bench's (0: max) */
    unsigned commands;   /* DH_EXPERIMENT_BENCH and/or DH_EXPERIMENT_SIMULATE */
    const char *section; /* the help's heading */
    const char *help;    /* the help text (wrapped when printed); the default and the range
                          * of a number are appended unless def_in_help */
    int def_in_help;
} dh_experiment_option_t;

/* The table (static storage) and its length. */
const dh_experiment_option_t *dh_experiment_options(size_t *count);

/* Sets the field of table entry `index` from `arg` (NULL for SET_INT), checked against the
 * range of `command`. Returns 0, or DH_EINVAL with a message naming the option. */
int dh_experiment_option_set(dh_bench_options_t *opt, size_t index, const char *arg,
                             unsigned command);

/* The help of every option of `command`, under their headings, and the systems catalogue:
 * shared options print the same text in both commands. */
void dh_experiment_help(FILE *f, unsigned command);

#endif
