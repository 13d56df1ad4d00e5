/* cmd_simulate.c: `datahelix simulate`, the discrete-event simulator of `bench --emulate`
 * (sim/sim.h, docs/simulator.md). Thin: parse, run, print the table and JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/plan.h"
#include "bench/experiment.h"
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
            "bench's options, with the same meaning, defaults and checks (bench/experiment.c;\n"
            "--rebalance-buffer and --rebalance-fanout keep their defaults, --emulate is\n"
            "accepted and implied):\n"
            "\n");
    dh_experiment_help(out, DH_EXPERIMENT_SIMULATE);
    fprintf(out,
            "\n"
            "output:\n"
            "  --json FILE           the report, as bench's\n"
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
        O_JSON = 256,
        O_LAT,
        O_SPEED,
        O_CLIENT_START,
        O_ALGO,
        O_NO_RANK_STEPS,
        O_EMULATE,
        O_GROUP,
        O_INDEX
    };
    struct option longopts[80] = {
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
    };
    dh_cli_experiment_longopts(DH_EXPERIMENT_SIMULATE, longopts, 10,
                               sizeof longopts / sizeof longopts[0]);
    dh_sim_options_t o;
    dh_sim_options_default(&o);
    dh_bench_options_t *b = &o.bench;
    b->mix = NULL;
    b->progress = progress;
    const char *json = NULL;
    double v;
    int c, bad = 0;
    optind = 1;
    while (!bad && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
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
            bad = dh_cli_experiment_option("simulate", DH_EXPERIMENT_SIMULATE, c, optarg, b);
            if (bad > 0) {
                bad = 0;
                break;
            }
            if (bad < 0)
                break;
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
