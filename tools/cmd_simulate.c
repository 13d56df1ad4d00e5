/* cmd_simulate.c: `datahelix simulate`, the discrete-event simulator of `bench --emulate`
 * (sim/sim.h, docs/simulator.md). Thin: parse, run, print the table and JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/plan.h"
#include "bench/train_bench.h"
#include "cli.h"
#include "sim/sim.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix simulate --mix NAME|FILE.json [options]\n"
            "\n"
            "Simulates `datahelix bench --emulate` in virtual time: the same workload, systems,\n"
            "compute model and metrics (and the same JSON), with the runtime's planner,\n"
            "placement, cost model, deadline/prefetch rules and tier-2 policy linked in, over a\n"
            "modelled cluster (docs/simulator.md). One thread; no sleeping, so thousands of\n"
            "ranks and DataServers fit on one core.\n"
            "\n"
            "bench's options, with the same meaning and defaults:\n"
            "  --mix NAME|FILE --rows N --ranks R --batch B --steps S --warmup W --seed N\n"
            "  --systems LIST (native,pool,helix; also native-N, base, transport,\n"
            "  prefetch-token, cost-ddl, ddlb) --local-servers N --remote-servers M\n"
            "  --cores-per-server C --native-cores N --prefetch P --prefetch-max Q\n"
            "  --fanout F --plan-window W --rebalance --no-rebalance --rebalance-min-gain G\n"
            "  --compute auto|A,B --compute-scale X --deadline-threshold S --time-scale X\n"
            "  --link-gbps G --cost-bias S --cost-noise S --token-noise S --json FILE\n"
            "(--rebalance-fanout is always auto; --emulate is accepted and implied)\n"
            "\n"
            "the model's own:\n"
            "  --link-latency-us U   one-way latency of every link (0, as the emulation)\n"
            "  --speed-sigma S       each server's true speed: a mean-one lognormal of sigma S\n"
            "                        per server, which the coordinator must learn (0)\n"
            "  --client-start-ms M   the time bench takes to create one client: rank r's\n"
            "                        prefetch starts (ranks - 1 - r) x M before the training\n"
            "                        loop, as in bench, whose JSON reports it per system as\n"
            "                        client_start_s (0: every client at the loop's start)\n"
            "  --plan-algo NAME      tier 1's algorithm: greedy, kk, swap (the client's\n"
            "                        default), exact\n"
            "  --no-rank-steps       leave rank_step_s (ranks x steps numbers) out of the JSON\n"
            "  --rebalance-group G   tier 2 in groups of G consecutive ranks (0: one group of\n"
            "                        all ranks, as bench; its policy is O(G^3) a round)\n"
            "  --place-index         place with the indexed rule (dh_place_index_*, the same\n"
            "                        decisions as dh_place in O(log N)-ish; docs/scheduler.md):\n"
            "                        what large clusters need (docs/simulator.md, \"Scale\")\n"
            "  -h, --help            show this help\n"
            "\n"
            "The table goes to standard output, progress to standard error. Exit status: 0,\n"
            "1 failure, 2 usage error.\n");
}

static void progress(const char *line, void *ctx)
{
    (void)ctx;
    fprintf(stderr, "simulate: %s\n", line);
}

static int num(const char *opt, const char *text, double min, double *out)
{
    char *end = NULL;
    double v = strtod(text, &end);
    if (!end || *end || !(v >= min) || v > 1e12) {
        fprintf(stderr, "datahelix simulate: %s: expected a number >= %g, got '%s'\n", opt, min,
                text);
        return -1;
    }
    *out = v;
    return 0;
}

static int u32(const char *opt, const char *text, unsigned long long min, unsigned long long max,
               uint32_t *out)
{
    unsigned long long v;
    if (dh_cli_parse_u64("simulate", opt, text, min, max, &v))
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int dh_cmd_simulate(int argc, char **argv)
{
    enum {
        O_MIX = 256,
        O_ROWS,
        O_RANKS,
        O_BATCH,
        O_STEPS,
        O_WARMUP,
        O_SEED,
        O_SYSTEMS,
        O_LOCAL,
        O_REMOTE,
        O_CORES,
        O_NATIVE,
        O_PREFETCH,
        O_PREFETCH_MAX,
        O_FANOUT,
        O_WINDOW,
        O_REB,
        O_NO_REB,
        O_GAIN,
        O_COMPUTE,
        O_CSCALE,
        O_THRESH,
        O_TSCALE,
        O_LINK,
        O_BIAS,
        O_NOISE,
        O_TNOISE,
        O_JSON,
        O_LAT,
        O_SPEED,
        O_CLIENT_START,
        O_ALGO,
        O_NO_RANK_STEPS,
        O_EMULATE,
        O_GROUP,
        O_INDEX
    };
    static const struct option longopts[] = {
        {"mix", required_argument, 0, O_MIX},
        {"rows", required_argument, 0, O_ROWS},
        {"ranks", required_argument, 0, O_RANKS},
        {"batch", required_argument, 0, O_BATCH},
        {"steps", required_argument, 0, O_STEPS},
        {"warmup", required_argument, 0, O_WARMUP},
        {"seed", required_argument, 0, O_SEED},
        {"systems", required_argument, 0, O_SYSTEMS},
        {"local-servers", required_argument, 0, O_LOCAL},
        {"remote-servers", required_argument, 0, O_REMOTE},
        {"cores-per-server", required_argument, 0, O_CORES},
        {"native-cores", required_argument, 0, O_NATIVE},
        {"prefetch", required_argument, 0, O_PREFETCH},
        {"prefetch-max", required_argument, 0, O_PREFETCH_MAX},
        {"fanout", required_argument, 0, O_FANOUT},
        {"plan-window", required_argument, 0, O_WINDOW},
        {"rebalance", no_argument, 0, O_REB},
        {"no-rebalance", no_argument, 0, O_NO_REB},
        {"rebalance-min-gain", required_argument, 0, O_GAIN},
        {"compute", required_argument, 0, O_COMPUTE},
        {"compute-scale", required_argument, 0, O_CSCALE},
        {"deadline-threshold", required_argument, 0, O_THRESH},
        {"time-scale", required_argument, 0, O_TSCALE},
        {"link-gbps", required_argument, 0, O_LINK},
        {"cost-bias", required_argument, 0, O_BIAS},
        {"cost-noise", required_argument, 0, O_NOISE},
        {"token-noise", required_argument, 0, O_TNOISE},
        {"json", required_argument, 0, O_JSON},
        {"link-latency-us", required_argument, 0, O_LAT},
        {"speed-sigma", required_argument, 0, O_SPEED},
        {"client-start-ms", required_argument, 0, O_CLIENT_START},
        {"plan-algo", required_argument, 0, O_ALGO},
        {"no-rank-steps", no_argument, 0, O_NO_RANK_STEPS},
        {"emulate", no_argument, 0, O_EMULATE},
        {"rebalance-group", required_argument, 0, O_GROUP},
        {"place-index", no_argument, 0, O_INDEX},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    dh_sim_options_t o;
    dh_sim_options_default(&o);
    dh_bench_options_t *b = &o.bench;
    b->mix = NULL;
    b->progress = progress;
    const char *json = NULL;
    unsigned long long u64;
    double v;
    int c, bad = 0;
    optind = 1;
    while (!bad && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_MIX:
            b->mix = optarg;
            break;
        case O_ROWS:
            bad = dh_cli_parse_u64("simulate", "--rows", optarg, 1, 1ull << 26, &u64);
            b->emulate_rows = (size_t)u64;
            break;
        case O_RANKS:
            bad = u32("--ranks", optarg, 1, 1u << 20, &b->ranks);
            break;
        case O_BATCH:
            bad = u32("--batch", optarg, 1, 4096, &b->batch);
            break;
        case O_STEPS:
            bad = u32("--steps", optarg, 1, 1u << 24, &b->steps);
            break;
        case O_WARMUP:
            bad = u32("--warmup", optarg, 0, 1u << 24, &b->warmup);
            break;
        case O_SEED:
            bad = dh_cli_parse_u64("simulate", "--seed", optarg, 0, UINT64_MAX, &u64);
            b->seed = u64;
            break;
        case O_SYSTEMS:
            b->systems = optarg;
            break;
        case O_LOCAL:
            bad = u32("--local-servers", optarg, 1, 1u << 24, &b->local_servers);
            break;
        case O_REMOTE:
            bad = u32("--remote-servers", optarg, 0, 1u << 24, &b->remote_servers);
            break;
        case O_CORES:
            bad = u32("--cores-per-server", optarg, 1, 4096, &b->cores_per_server);
            break;
        case O_NATIVE:
            bad = u32("--native-cores", optarg, 1, 1u << 30, &b->native_cores);
            break;
        case O_PREFETCH:
            bad = u32("--prefetch", optarg, 1, 1024, &b->prefetch);
            break;
        case O_PREFETCH_MAX:
            bad = u32("--prefetch-max", optarg, 1, 1024, &b->prefetch_max);
            break;
        case O_FANOUT:
            bad = u32("--fanout", optarg, 1, 4096, &b->fanout);
            break;
        case O_WINDOW:
            bad = u32("--plan-window", optarg, 1, 1024, &b->plan_window);
            break;
        case O_REB:
            b->rebalance = 1;
            break;
        case O_NO_REB:
            b->rebalance = 0;
            break;
        case O_GAIN:
            bad = num("--rebalance-min-gain", optarg, 0, &b->rebalance_min_gain);
            break;
        case O_COMPUTE:
            if (strcmp(optarg, "auto") == 0) {
                b->compute_auto = 1;
            } else if (sscanf(optarg, "%lf,%lf", &b->a, &b->b) == 2 && b->a >= 0 && b->b >= 0) {
                b->compute_auto = 0;
            } else {
                fprintf(stderr, "datahelix simulate: --compute: expected auto or A,B\n");
                bad = 1;
            }
            break;
        case O_CSCALE:
            bad = num("--compute-scale", optarg, 1e-9, &b->compute_scale);
            break;
        case O_THRESH:
            bad = num("--deadline-threshold", optarg, 0, &b->deadline_threshold_s);
            break;
        case O_TSCALE:
            bad = num("--time-scale", optarg, 1e-9, &b->time_scale);
            break;
        case O_LINK:
            bad = num("--link-gbps", optarg, 0, &b->link_gbps);
            break;
        case O_BIAS:
            bad = num("--cost-bias", optarg, 0, &b->cost_bias);
            break;
        case O_NOISE:
            bad = num("--cost-noise", optarg, 0, &b->cost_noise);
            break;
        case O_TNOISE:
            bad = num("--token-noise", optarg, 0, &b->token_noise);
            break;
        case O_JSON:
            json = optarg;
            break;
        case O_LAT:
            bad = num("--link-latency-us", optarg, 0, &v);
            o.link_latency_s = v * 1e-6;
            break;
        case O_SPEED:
            bad = num("--speed-sigma", optarg, 0, &o.server_speed_sigma);
            break;
        case O_CLIENT_START:
            bad = num("--client-start-ms", optarg, 0, &v);
            o.client_start_s = v * 1e-3;
            break;
        case O_ALGO:
            if (dh_plan_algo_from_name(optarg, &o.plan_algo) != 0) {
                fprintf(stderr, "datahelix simulate: --plan-algo: unknown '%s'\n", optarg);
                bad = 1;
            }
            break;
        case O_NO_RANK_STEPS:
            o.rank_steps = 0;
            break;
        case O_GROUP:
            bad = u32("--rebalance-group", optarg, 0, 1u << 20, &o.rebalance_group);
            break;
        case O_INDEX:
            o.place_index = 1;
            break;
        case O_EMULATE:
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (bad)
        return 2;
    if (dh_cli_no_extra_args("simulate", argc, argv, optind))
        return 2;
    if (!b->mix) {
        fprintf(stderr, "datahelix simulate: --mix NAME|FILE is required\n");
        usage(stderr);
        return 2;
    }
    dh_bench_report_t r;
    int rc = dh_sim_run(&o, &r);
    if (rc) {
        dh_bench_report_clear(&r);
        return dh_cli_fail("simulate", rc, "the simulation failed");
    }
    dh_bench_print_table(stdout, &r);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f || dh_bench_write_json(f, b, &r) != 0) {
            if (f)
                fclose(f);
            fprintf(stderr, "datahelix simulate: cannot write %s\n", json);
            dh_bench_report_clear(&r);
            return 1;
        }
        if (fclose(f) != 0) {
            fprintf(stderr, "datahelix simulate: cannot write %s\n", json);
            dh_bench_report_clear(&r);
            return 1;
        }
    }
    dh_bench_report_clear(&r);
    return 0;
}
