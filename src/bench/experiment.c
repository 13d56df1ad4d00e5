/* experiment.c: the experiment `bench` and `simulate` share (experiment.h): the option
 * table and its parsing and help, the systems catalogue, the workload's misprediction and
 * the compute model. Each is defined here once; train_bench.c runs it on threads, sim.c in
 * virtual time. */
#include "bench/experiment.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/error.h"

/* ---- the option table ---- */

#define F(field) offsetof(dh_bench_options_t, field)
#define B DH_EXPERIMENT_BENCH
#define BOTH DH_EXPERIMENT_BOTH

/* The shared options (both commands) check what `bench` checked: where the two had drifted
 * (--rebalance-min-gain above 1, a sigma above 4, --time-scale below 1e-6, an explicit
 * --deadline-threshold 0, a number above 1e9), simulate now refuses as bench does. Only the
 * sizes of the cluster and the run may go further in simulate (sim_max): it has no threads
 * or sockets to run out of. */
static const dh_experiment_option_t options[] = {
    /* workload */
    {"dataset", "DIR", DH_EXPERIMENT_STRING, F(dataset), 0, 0, 0, 0, 0, B, "workload",
     "real decode: DIR/profiles.jsonl from `probe` (video pipeline)", 1},
    {"pipeline", "SPEC.json", DH_EXPERIMENT_STRING, F(pipeline), 0, 0, 0, 0, 0, B, "workload",
     "with --dataset: the pipeline spec (default: video defaults)", 1},
    {"mix", "NAME|FILE", DH_EXPERIMENT_STRING, F(mix), 0, 0, 0, 0, 0, BOTH, "workload",
     "emulated: kinetics-s|m|l, kinetics-mixed, openvid-mixed, or a JSON list of "
     "{frames,height,width,...}",
     1},
    {"rows", "N", DH_EXPERIMENT_SIZE, F(emulate_rows), 4096, 0, 1, 1e7, 1 << 26, BOTH, "workload",
     "emulated: samples generated from the mix", 0},
    {"ranks", "R", DH_EXPERIMENT_U32, F(ranks), 8, 0, 1, 64, 1 << 20, BOTH, "workload",
     "ranks (data-parallel trainers)", 0},
    {"batch", "B", DH_EXPERIMENT_U32, F(batch), 4, 0, 1, 4096, 0, BOTH, "workload",
     "samples per rank per step", 0},
    {"steps", "S", DH_EXPERIMENT_U32, F(steps), 100, 0, 1, 1e6, 1 << 24, BOTH, "workload",
     "measured steps", 0},
    {"warmup", "W", DH_EXPERIMENT_U32, F(warmup), 20, 0, 0, 1e6, 1 << 24, BOTH, "workload",
     "warm-up steps before them", 0},
    {"seed", "N", DH_EXPERIMENT_U64, F(seed), 1, 0, 0, 0, 0, BOTH, "workload",
     "sample order, generation and misprediction seed", 0},
    {"systems", "LIST", DH_EXPERIMENT_STRING, F(systems), 0, 0, 0, 0, 0, BOTH, "workload",
     "comma-separated systems (below; default native,pool,helix)", 1},
    /* cluster */
    {"local-servers", "N", DH_EXPERIMENT_U32, F(local_servers), 8, 0, 1, 128, 1 << 24, BOTH,
     "cluster", "local DataServers, one per node; rank r is on node r % N", 0},
    {"remote-servers", "M", DH_EXPERIMENT_U32, F(remote_servers), 16, 0, 0, 128, 1 << 24, BOTH,
     "cluster", "remote sidecars", 0},
    {"cores-per-server", "C", DH_EXPERIMENT_U32, F(cores_per_server), 4, 0, 1, 256, 4096, BOTH,
     "cluster", "workers (virtual cores) per DataServer", 0},
    {"native-cores", "N", DH_EXPERIMENT_U32, F(native_cores), 0, 0, 1, 4096, 1 << 30, BOTH,
     "cluster", "total cores of `native` (default: N x C of the locals)", 1},
    {"prefetch", "P", DH_EXPERIMENT_U32, F(prefetch), 0, 0, 1, 256, 1024, BOTH, "cluster",
     "prefetch depth of the deep systems (default: 16, or the pool's in-flight depth, 2 x "
     "cores per rank, if deeper)",
     1},
    {"prefetch-max", "Q", DH_EXPERIMENT_U32, F(prefetch_max), 0, 0, 1, 1024, 0, BOTH, "cluster",
     "let their prefetch grow up to Q when next() waits (default: fixed at P, as every other "
     "system's depth; deeper for them alone is not an equal-depth comparison)",
     1},
    {"fanout", "F", DH_EXPERIMENT_U32, F(fanout), 0, 0, 1, 64, 4096, BOTH, "cluster",
     "their requests per rank's batch, at most --batch: the parts decode in parallel, the "
     "client joins them by one copy, and packing gives each rank at least F samples "
     "(default: 1, unless one worker cannot decode a batch within the prefetch horizon's "
     "compute; then that many parts, at most the cores per rank, counting only real cores "
     "with --dataset)",
     1},
    {"plan-window", "W", DH_EXPERIMENT_U32, F(plan_window), 1, 0, 1, 1024, 0, BOTH, "cluster",
     "their tier 1 plans W consecutive steps of an epoch together, so a sample may be "
     "consumed up to W - 1 steps from its sampler step (1: each step alone; docs/planner.md, "
     "\"Planning across steps\")",
     1},
    /* tier 2 */
    {"rebalance", NULL, DH_EXPERIMENT_SET_INT, F(rebalance), -1, 1, 0, 0, 0, BOTH, "tier 2",
     "on for every deep system (prefetch-token, cost-ddl, ddlb, helix); default: on for ddlb "
     "and helix only",
     1},
    {"no-rebalance", NULL, DH_EXPERIMENT_SET_INT, F(rebalance), -1, 0, 0, 0, 0, BOTH, "tier 2",
     "off everywhere (ddlb and helix then run as cost-ddl)", 1},
    {"rebalance-buffer", "N", DH_EXPERIMENT_U32, F(rebalance_buffer), 64, 0, 1, 1e6, 0, B, "tier 2",
     "samples per round across the group", 0},
    {"rebalance-min-gain", "G", DH_EXPERIMENT_DOUBLE, F(rebalance_min_gain), 0.05, 0, 0, 1, 0, BOTH,
     "tier 2",
     "the cost gate's margin: a round moves samples only when the projected cut of the "
     "largest rank's compute exceeds the part of the transfer that does not fit before the "
     "round is consumed by G x that compute",
     0},
    {"rebalance-fanout", "auto|batch|own|F", DH_EXPERIMENT_FANOUT, F(rebalance_fanout), 0, 0, 1,
     4096, 0, B, "tier 2",
     "the fanout of the systems with tier 2: tier 2 moves parts (a request's microbatch) "
     "within their step, in exchange, so batch moves single samples (each rank keeps "
     "`batch`), ranks x batch gives one-sample slots (packing kept: a sample may move to an "
     "empty slot), and fanout 1 can only swap whole batches; a batch of several parts costs "
     "a join copy (--link-gbps); own: the system's own fanout (--fanout, else its default); "
     "auto (default): ranks x batch where that join takes at most half the mean step's "
     "compute (emulated), else own (always with --dataset)",
     1},
    /* compute and metrics */
    {"compute", "auto|A,B", DH_EXPERIMENT_COMPUTE, 0, 0, 0, 0, 0, 0, BOTH, "compute and metrics",
     "seconds per token and per step; auto (default): the balanced regime, where the mean "
     "rank's compute summed over steps equals the CPU work / the helix cores (b = 10%)",
     1},
    {"compute-scale", "X", DH_EXPERIMENT_DOUBLE, F(compute_scale), 1, 0, 1e-9, 1e9, 0, BOTH,
     "compute and metrics", "multiplies a and b", 0},
    {"deadline-threshold", "S", DH_EXPERIMENT_DOUBLE, F(deadline_threshold_s), 0, 0, 1e-9, 1e9, 0,
     BOTH, "compute and metrics",
     "a step misses when its input wait exceeds S seconds (default: 10% of the mean step "
     "compute)",
     1},
    {"time-scale", "X", DH_EXPERIMENT_DOUBLE, F(time_scale), 1, 0, 1e-6, 1e9, 0, BOTH,
     "compute and metrics", "emulated: every duration x X, to run shorter", 0},
    {"bytes-scale", "X", DH_EXPERIMENT_DOUBLE, F(bytes_scale), 0.001, 0, 0, 1e9, 0, B,
     "compute and metrics", "emulated: payload bytes x X", 0},
    {"link-gbps", "G", DH_EXPERIMENT_DOUBLE, F(link_gbps), 25, 0, 0, 1e9, 0, BOTH,
     "compute and metrics",
     "the transfer cost, one for every system: each byte that crosses nodes (a DataServer's "
     "link is busy while it forwards) and each byte a system copies (pool's copy on the "
     "training thread, the fanout join on the client's fetcher) costs 8 / (G x 1e9) s, of "
     "emulated bytes (payload / --bytes-scale); Gb/s (a 25 GbE NIC; 0 = free). With "
     "--dataset only links are charged (the copies are real)",
     0},
    {"cost-bias", "S", DH_EXPERIMENT_DOUBLE, F(cost_bias), 0.3, 0, 0, DH__NOISE_SIGMA_MAX, 0, BOTH,
     "compute and metrics",
     "emulated misprediction: each profile key's actual cost is its estimate x a mean-one "
     "lognormal factor of sigma S, drawn once per key",
     0},
    {"cost-noise", "S", DH_EXPERIMENT_DOUBLE, F(cost_noise), 0.3, 0, 0, DH__NOISE_SIGMA_MAX, 0,
     BOTH, "compute and metrics", "... and each sample's x one of sigma S of its own", 0},
    {"token-noise", "S", DH_EXPERIMENT_DOUBLE, F(token_noise), 0.1, 0, 0, DH__NOISE_SIGMA_MAX, 0,
     BOTH, "compute and metrics",
     "each sample's actual tokens: the estimate x a mean-one lognormal factor of sigma S. "
     "Draws are seeded by --seed and the key or sample id (the same for every system); "
     "schedulers see only the estimates; 0 = none",
     0},
    /* output */
    {"trace", "FILE", DH_EXPERIMENT_STRING, F(trace_path), 0, 0, 0, 0, 0, B, "output",
     "a Chrome/Perfetto trace: per rank data wait, compute, barrier; per DataServer each "
     "batch from request to ready",
     1},
};

#undef F
#undef B
#undef BOTH

const dh_experiment_option_t *dh_experiment_options(size_t *count)
{
    *count = sizeof options / sizeof options[0];
    return options;
}

static double upper(const dh_experiment_option_t *o, unsigned command)
{
    return command == DH_EXPERIMENT_SIMULATE && o->sim_max > 0 ? o->sim_max : o->max;
}

static int parse_integer(const dh_experiment_option_t *o, const char *arg, unsigned command,
                         unsigned long long *out)
{
    unsigned long long lo = (unsigned long long)o->min;
    unsigned long long hi =
        o->kind == DH_EXPERIMENT_U64 ? ULLONG_MAX : (unsigned long long)upper(o, command);
    char *end = NULL;
    errno = 0;
    unsigned long long v = 0;
    if (arg && *arg && *arg != '-')
        v = strtoull(arg, &end, 10);
    if (!arg || !*arg || *arg == '-' || errno || *end != '\0' || v < lo || v > hi)
        return dh__set_error(DH_EINVAL, "--%s expects an integer in [%llu, %llu], got '%s'",
                             o->name, lo, hi, arg ? arg : "");
    *out = v;
    return 0;
}

int dh_experiment_option_set(dh_bench_options_t *opt, size_t index, const char *arg,
                             unsigned command)
{
    assert(index < sizeof options / sizeof options[0]);
    const dh_experiment_option_t *o = &options[index];
    char *field = (char *)opt + o->offset;
    unsigned long long u;
    int rc;
    switch (o->kind) {
    case DH_EXPERIMENT_U32:
    case DH_EXPERIMENT_SIZE:
    case DH_EXPERIMENT_U64:
        if ((rc = parse_integer(o, arg, command, &u)))
            return rc;
        if (o->kind == DH_EXPERIMENT_U32)
            *(uint32_t *)field = (uint32_t)u;
        else if (o->kind == DH_EXPERIMENT_SIZE)
            *(size_t *)field = (size_t)u;
        else
            *(uint64_t *)field = (uint64_t)u;
        return 0;
    case DH_EXPERIMENT_DOUBLE: {
        char *end = NULL;
        double v = strtod(arg, &end);
        double hi = upper(o, command);
        if (!end || *end || !(v >= o->min) || v > hi) {
            if (hi < 1e9)
                return dh__set_error(DH_EINVAL, "--%s: expected a number in [%g, %g], got '%s'",
                                     o->name, o->min, hi, arg);
            return dh__set_error(DH_EINVAL, "--%s: expected a number >= %g, got '%s'", o->name,
                                 o->min, arg);
        }
        *(double *)field = v;
        return 0;
    }
    case DH_EXPERIMENT_STRING:
        *(const char **)field = arg;
        return 0;
    case DH_EXPERIMENT_SET_INT:
        *(int *)field = (int)o->value;
        return 0;
    case DH_EXPERIMENT_COMPUTE:
        if (strcmp(arg, "auto") == 0) {
            opt->compute_auto = 1;
            return 0;
        } else {
            char *end = NULL;
            double a = strtod(arg, &end), b = 0;
            if (!end || *end != ',' || (b = strtod(end + 1, &end), *end) || !(a >= 0) || !(b >= 0))
                return dh__set_error(DH_EINVAL,
                                     "--compute: expected 'auto' or 'A,B' (seconds per token, "
                                     "seconds per step), got '%s'",
                                     arg);
            opt->a = a;
            opt->b = b;
            opt->compute_auto = 0;
            return 0;
        }
    case DH_EXPERIMENT_FANOUT:
        if (strcmp(arg, "batch") == 0)
            *(uint32_t *)field = DH_BENCH_FANOUT_BATCH;
        else if (strcmp(arg, "auto") == 0)
            *(uint32_t *)field = 0;
        else if (strcmp(arg, "own") == 0)
            *(uint32_t *)field = DH_BENCH_FANOUT_OWN;
        else if ((rc = parse_integer(o, arg, command, &u)))
            return rc;
        else
            *(uint32_t *)field = (uint32_t)u;
        return 0;
    }
    return dh__set_error(DH_EINVAL, "--%s: unknown kind", o->name);
}

void dh_bench_options_default(dh_bench_options_t *opt)
{
    memset(opt, 0, sizeof *opt);
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        const dh_experiment_option_t *o = &options[i];
        char *field = (char *)opt + o->offset;
        switch (o->kind) {
        case DH_EXPERIMENT_U32:
        case DH_EXPERIMENT_FANOUT: /* 0 = auto: tier2_fanout() */
            *(uint32_t *)field = (uint32_t)o->def;
            break;
        case DH_EXPERIMENT_SIZE:
            *(size_t *)field = (size_t)o->def;
            break;
        case DH_EXPERIMENT_U64:
            *(uint64_t *)field = (uint64_t)o->def;
            break;
        case DH_EXPERIMENT_DOUBLE:
            *(double *)field = o->def;
            break;
        case DH_EXPERIMENT_SET_INT: /* rebalance -1: auto (ddlb and helix) */
            *(int *)field = (int)o->def;
            break;
        case DH_EXPERIMENT_COMPUTE:
            opt->compute_auto = 1;
            break;
        case DH_EXPERIMENT_STRING:
            break;
        }
    }
    opt->systems = "native,pool,helix";
}

/* ---- the systems catalogue ---- */

typedef struct system_row {
    const char *name;
    dh_policy_t policy;
    int rank_local;
    dh_share_mode_t token_plan;
    int copy, deep, tier2;
    const char *help; /* NULL: an alias of the row above, listed with it */
} system_row_t;

static const system_row_t systems[] = {
    {"native", DH_POLICY_LOCAL, 1, DH_SHARE_SAMPLE_COUNT, 0, 0, 0,
     "rank-local loaders: a DataServer per rank, the native budget split evenly, "
     "sample-count batching, prefetch 2 per worker; native-N: the same with N cores in all"},
    {"pool", DH_POLICY_LEAST_REQUEST, 0, DH_SHARE_SAMPLE_COUNT, 1, 0, 0,
     "(= base) shared pool of the helix servers, least-request routing, sample-count "
     "batching, 2 in flight per worker share, batches copied into the consumer on the "
     "training thread (charged like any transfer: --link-gbps)"},
    {"base", DH_POLICY_LEAST_REQUEST, 0, DH_SHARE_SAMPLE_COUNT, 1, 0, 0, NULL},
    {"transport", DH_POLICY_LEAST_REQUEST, 0, DH_SHARE_SAMPLE_COUNT, 0, 0, 0,
     "base with zero-copy shared-memory delivery"},
    {"prefetch-token", DH_POLICY_LEAST_REQUEST, 0, DH_SHARE_TOKEN_PACKED, 0, 1, 0,
     "transport + tier-1 token planning (packing: batch sizes vary, tokens even), deep "
     "prefetch, fanout (--fanout)"},
    {"cost-ddl", DH_POLICY_DEADLINE, 0, DH_SHARE_TOKEN_PACKED, 0, 1, 0,
     "prefetch-token + deadline placement (tier 1 alone)"},
    {"helix", DH_POLICY_DEADLINE, 0, DH_SHARE_TOKEN_PACKED, 0, 1, 1,
     "(= ddlb) cost-ddl + tier 2: the ranks rebalance materialized batches in one group of "
     "all ranks (each on its own node in the paper layout, so a move crosses a link, charged "
     "at --link-gbps, and the cost gate prices it the same)"},
    {"ddlb", DH_POLICY_DEADLINE, 0, DH_SHARE_TOKEN_PACKED, 0, 1, 1, NULL},
};

int dh_bench_system_of(const char *name, const dh_bench_options_t *opt, dh_bench_system_t *out)
{
    memset(out, 0, sizeof *out);
    out->name = name;
    const char *row_name = strncmp(name, "native-", 7) == 0 ? "native" : name;
    const system_row_t *row = NULL;
    for (size_t i = 0; i < sizeof systems / sizeof systems[0] && !row; i++)
        if (strcmp(systems[i].name, row_name) == 0)
            row = &systems[i];
    if (!row)
        return dh__set_error(DH_EINVAL,
                             "bench: --systems: unknown system '%s' (known: native, native-N, "
                             "pool, helix, base, transport, prefetch-token, cost-ddl, ddlb)",
                             name);
    out->policy = row->policy;
    out->rank_local = row->rank_local;
    out->token_plan = row->token_plan;
    out->copy = row->copy;
    out->deep = row->deep;
    out->tier2 = row->tier2;
    if (row_name != name) {
        char *end = NULL;
        unsigned long n = strtoul(name + 7, &end, 10);
        if (!end || *end || n < opt->ranks || n > 4096)
            return dh__set_error(DH_EINVAL,
                                 "bench: --systems: '%s': native-N needs N cores in [%u, "
                                 "4096] (at least one per rank)",
                                 name, opt->ranks);
        out->cores = (uint32_t)n;
    }
    return 0;
}

/* Whether a system runs tier 2: --rebalance auto (-1) the system's own choice, 0 none, 1
 * every deep system. */
int dh_bench_tier2_on(const dh_bench_options_t *opt, const dh_bench_system_t *sp)
{
    if (!sp->deep || opt->rebalance == 0)
        return 0;
    return opt->rebalance > 0 || sp->tier2;
}

/* The fanout of a system with tier 2 (dh_bench_options_t.rebalance_fanout), given its own
 * (`own`), the time the fanout join of a mean batch holds the client's fetcher at the one
 * transfer cost (`join_s`: the batch's emulated bytes / the link; emulated mode) and the
 * mean step's compute.
 *
 * Tier 2 moves parts within their step and in exchange (each rank keeps its number of
 * parts per batch), so at fanout 1 it can only swap whole batches between ranks, which
 * changes no step's largest rank; single samples (fanout = batch) are the finest grain and
 * the cheapest moves. But a batch of several parts is joined by a copy on the fetcher, one
 * batch after another, so where that copy takes a large share of a step the fetcher
 * becomes the bottleneck. Measured at 8 ranks x batch 4, kinetics-mixed, --token-noise 0.3
 * (docs/benchmarks.md, "Tier 2"; a mean batch is ~52 MB emulated, a step 66 ms): at 25
 * Gb/s (join 17 ms, a quarter of the step) ddlb ran 1.04x cost-ddl at fanout = batch
 * against 1.00x at its own fanout (1: every round kept, nothing to gain) and 1.00x at
 * fanout 2 (parts of ~2 samples: the gate kept 93% of the rounds); at 1 Gb/s (join
 * 0.42 s, 6 steps) fanout = batch ran 0.18x, the fetcher joining, while its own fanout ran
 * as cost-ddl. So auto: the batch where the join takes at most half a step, else the
 * system's own. In dataset mode the join is a real copy on the real cores, and fanout =
 * batch makes packing give every rank exactly `batch` samples: real decode, 4 ranks x
 * batch 2 on 2 cores (docs/benchmarks.md, "Real decode"), one run: ddlb at fanout 2 ran
 * 0.93x cost-ddl, balance 0.90 -> 0.84, no round applied. So there auto is the system's
 * own. */
static uint32_t tier2_fanout(const dh_bench_options_t *opt, uint32_t own, double join_s,
                             double mean_step_s)
{
    if (opt->rebalance_fanout == DH_BENCH_FANOUT_OWN)
        return own;
    if (opt->rebalance_fanout == DH_BENCH_FANOUT_BATCH)
        return opt->batch;
    if (opt->rebalance_fanout)
        return opt->rebalance_fanout;
    /* single samples in one-sample slots: tier 1's packing is kept, and a sample may move
     * to another rank's empty slot (measured below 0.95 balance with fanout = batch, which
     * fixes every rank at `batch` samples; 0.96 with slots: docs/benchmarks.md) */
    return !opt->dataset && join_s <= 0.5 * mean_step_s ? opt->ranks * opt->batch : own;
}

/* The deep systems' prefetch: --prefetch, else at least 16 batches and at least the depth
 * the PyTorch-like systems get from the same cores (2 per worker of a rank's share), so
 * at equal budget no system keeps fewer batches in flight than another. */
uint32_t dh_bench_deep_prefetch(const dh_bench_options_t *opt, uint32_t cores)
{
    if (opt->prefetch)
        return opt->prefetch;
    uint32_t per_rank = cores / (opt->ranks ? opt->ranks : 1);
    return 2 * per_rank > 16 ? 2 * per_rank : 16;
}

uint32_t dh_bench_system_fanout(const dh_bench_options_t *opt, const dh_bench_system_t *sp,
                                uint32_t cores_eff, uint32_t cores, double batch_decode_s,
                                double batch_join_s, double mean_step_s)
{
    if (!sp->deep)
        return 1;
    uint32_t fanout = opt->fanout
                          ? opt->fanout
                          : dh_plan_fanout_width(opt->batch, cores_eff / opt->ranks, batch_decode_s,
                                                 dh_bench_deep_prefetch(opt, cores) * mean_step_s);
    /* tier 2 moves parts (a request's microbatch), so its fanout is its grain */
    int tier2 = dh_bench_tier2_on(opt, sp);
    if (tier2)
        fanout = tier2_fanout(opt, fanout, batch_join_s, mean_step_s);
    /* one-sample slots (fanout = ranks x batch): tier 2 with packing, where a sample may
     * move to another rank's empty slot */
    bool slots =
        tier2 && sp->token_plan == DH_SHARE_TOKEN_PACKED && fanout == opt->ranks * opt->batch;
    if (fanout > opt->batch && !slots)
        fanout = opt->batch;
    return fanout;
}

void dh_bench_compute_model(const dh_bench_options_t *opt, double mean_cpu_s, double mean_tokens,
                            uint32_t cores, double *a, double *b)
{
    double ts = opt->dataset ? 1 : opt->time_scale;
    if (opt->compute_auto) {
        double step = (double)opt->ranks * opt->batch * mean_cpu_s * ts / cores;
        *b = 0.1 * step;
        *a = mean_tokens > 0 ? 0.9 * step / (opt->batch * mean_tokens) : 0;
    } else {
        *a = opt->a * ts;
        *b = opt->b * ts;
    }
    *a *= opt->compute_scale;
    *b *= opt->compute_scale;
}

/* ---- the workload ---- */

/* x as the spec's JSON carries it (%.9g, read back by jansson's strtod) */
static double as_in_spec(double x)
{
    char text[64];
    snprintf(text, sizeof text, "%.9g", x);
    return strtod(text, NULL);
}

void dh_experiment_noise(const dh_bench_options_t *opt, dh__noise_t *out)
{
    out->cost_bias = as_in_spec(opt->cost_bias);
    out->cost_noise = as_in_spec(opt->cost_noise);
    out->token_noise = as_in_spec(opt->token_noise);
    out->seed = opt->seed;
}

int dh_experiment_synth_pipeline(const dh_bench_options_t *opt, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     "{\"type\":\"synthetic\",\"cost\":\"sleep\",\"cpu_scale\":%.9g,"
                     "\"bytes_scale\":%.9g,\"cost_bias\":%.9g,\"cost_noise\":%.9g,"
                     "\"token_noise\":%.9g,\"noise_seed\":%llu}",
                     opt->time_scale, opt->bytes_scale, opt->cost_bias, opt->cost_noise,
                     opt->token_noise, (unsigned long long)opt->seed);
    if (n < 0 || (size_t)n >= cap)
        return dh__set_error(DH_EINVAL, "bench: the synthetic pipeline spec is too long");
    return 0;
}

void dh_experiment_model(const dh_bench_options_t *opt, double cpu_s_sum, double tokens_sum,
                         double out_bytes_sum, size_t n, uint32_t cores, dh_experiment_model_t *out)
{
    double mean_cpu_s = cpu_s_sum / (double)n, mean_tokens = tokens_sum / (double)n;
    double ts = opt->dataset ? 1 : opt->time_scale;
    dh_bench_compute_model(opt, mean_cpu_s, mean_tokens, cores, &out->a, &out->b);
    out->mean_step_s = out->a * opt->batch * mean_tokens + out->b;
    out->threshold_s =
        opt->deadline_threshold_s > 0 ? opt->deadline_threshold_s * ts : 0.1 * out->mean_step_s;
    out->batch_decode_s = opt->batch * mean_cpu_s * ts;
    out->join_s = opt->dataset || !(opt->link_gbps > 0)
                      ? 0
                      : opt->batch * out_bytes_sum / (double)n * ts / (opt->link_gbps * 1e9 / 8);
}

/* ---- help ---- */

/* text wrapped at 90 columns, each line indented by `indent`, the first starting at `col` */
static void wrap(FILE *f, const char *text, int col, int indent)
{
    const int width = 90;
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t word = strcspn(p, " ");
        if (!word)
            break;
        if (col > indent && col + 1 + (int)word > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)word, p);
        col += (int)word;
        p += word;
    }
    fputc('\n', f);
}

static void help_line(FILE *f, const char *left, const char *text)
{
    int col = fprintf(f, "  %s", left);
    if (col > 22) { /* no room for a space before the text */
        fprintf(f, "\n%24s", "");
        col = 24;
    } else {
        fprintf(f, "%*s", 24 - col, "");
        col = 24;
    }
    wrap(f, text, col, 24);
}

void dh_experiment_help(FILE *f, unsigned command)
{
    const char *section = NULL;
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        const dh_experiment_option_t *o = &options[i];
        if (!(o->commands & command))
            continue;
        if (!section || strcmp(section, o->section) != 0) {
            fprintf(f, "%s%s:\n", section ? "\n" : "", o->section);
            section = o->section;
        }
        char left[96], text[1200];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        int n = snprintf(text, sizeof text, "%s", o->help);
        if (!o->def_in_help && n > 0 && (size_t)n < sizeof text) {
            /* the default, and where simulate goes further, both bounds: the same text in
             * both commands */
            if (o->sim_max > 0 && o->commands == DH_EXPERIMENT_BOTH)
                snprintf(text + n, sizeof text - (size_t)n,
                         " (%.10g; at most %.10g, simulate %.10g)", o->def, o->max, o->sim_max);
            else
                snprintf(text + n, sizeof text - (size_t)n, " (%.10g)", o->def);
        }
        help_line(f, left, text);
    }
    fprintf(f, "\nsystems (--systems LIST, default native,pool,helix; ablation ladder:\n"
               "base,transport,prefetch-token,cost-ddl,ddlb):\n");
    for (size_t i = 0; i < sizeof systems / sizeof systems[0]; i++)
        if (systems[i].help)
            help_line(f, systems[i].name, systems[i].help);
}
