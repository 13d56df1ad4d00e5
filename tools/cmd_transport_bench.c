/* cmd_transport_bench.c: `datahelix transport-bench`, the data plane's transport costs
 * (bench/transport_bench.h, docs/runtime.md). Thin: parse, run, print a table or JSON. */
#include <stdlib.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "datahelix/log.h"
#include "datahelix/error.h"
#include "bench/transport_bench.h"
#include "cli.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: datahelix transport-bench [--json] [--batches N] [--runs R]\n"
        "                                 [--remote-mb M] [--remote-batches N] [--curve]\n"
        "\n"
        "Measures the transport of the data plane on this machine, with a coordinator,\n"
        "DataServers and a client as threads of this process over tcp://127.0.0.1:\n"
        "  local   the delivery overhead per batch, from ready in the local DataServer's\n"
        "          arena to returned by next(), for payloads of 1, 4, 16, 64 and 256 MB\n"
        "          (zero-copy: flat in the size);\n"
        "  remote  the throughput of sidecar -> local DataServer -> client, beside a raw\n"
        "          TCP stream of the same bytes measured in the same run (medians of R\n"
        "          runs, and the ratio); with --curve, each run again right after with\n"
        "          CURVE authentication and encryption on every socket (a key directory\n"
        "          made for the run), and the ratio CURVE / plaintext.\n"
        "\n"
        "options:\n"
        "  --batches N         batches per local payload size (default 30)\n"
        "  --runs R            remote runs, medians reported (default 3)\n"
        "  --remote-mb M       bytes per remote batch, in MB (default 16, a video batch)\n"
        "  --remote-batches N  batches per remote run (default 48)\n"
        "  --curve             also measure the remote part with CURVE on (docs/security.md)\n"
        "  --json              one JSON object: {\"local\":[{\"bytes\",\"overhead_p50_us\",\n"
        "                      \"overhead_p99_us\"}],\"remote_gbps\",\"raw_tcp_gbps\",\n"
        "                      \"remote_ratio\", \"curve_gbps\", \"curve_ratio\"} (the last two\n"
        "                      0 without --curve)\n"
        "  -h, --help          show this help\n"
        "\n"
        "Progress lines go to standard error (daemon log lines too when DH_LOG_LEVEL is\n"
        "set; otherwise warnings only). Exit status: 0, 1 failure, 2 usage error.\n");
}

static void progress(const char *line, void *ctx)
{
    (void)ctx;
    fprintf(stderr, "transport-bench: %s\n", line);
}

int dh_cmd_transport_bench(int argc, char **argv)
{
    enum { OPT_JSON = 256, OPT_BATCHES, OPT_RUNS, OPT_RMB, OPT_RBATCHES, OPT_CURVE };
    static const struct option options[] = {
        {"json", no_argument, NULL, OPT_JSON},
        {"batches", required_argument, NULL, OPT_BATCHES},
        {"runs", required_argument, NULL, OPT_RUNS},
        {"remote-mb", required_argument, NULL, OPT_RMB},
        {"remote-batches", required_argument, NULL, OPT_RBATCHES},
        {"curve", no_argument, NULL, OPT_CURVE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int json = 0, curve = 0;
    unsigned long long batches = 30, runs = 3, rmb = 16, rbatches = 48;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case OPT_JSON:
            json = 1;
            break;
        case OPT_CURVE:
            curve = 1;
            break;
        case OPT_BATCHES:
            if (dh_cli_parse_u64("transport-bench", "--batches", optarg, 2, 100000, &batches))
                return 2;
            break;
        case OPT_RUNS:
            if (dh_cli_parse_u64("transport-bench", "--runs", optarg, 1, 32, &runs))
                return 2;
            break;
        case OPT_RMB:
            if (dh_cli_parse_u64("transport-bench", "--remote-mb", optarg, 1, 1024, &rmb))
                return 2;
            break;
        case OPT_RBATCHES:
            if (dh_cli_parse_u64("transport-bench", "--remote-batches", optarg, 1, 100000,
                                 &rbatches))
                return 2;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (dh_cli_no_extra_args("transport-bench", argc, argv, optind))
        return 2;
    /* the daemons' lifecycle lines would drown the progress: warnings only, unless asked */
    if (!getenv("DH_LOG_LEVEL"))
        dh_log_set_level(DH_LOG_WARN);
    static const uint64_t sizes[] = {1u << 20, 4u << 20, 16u << 20, 64u << 20, 256u << 20};
    dh_transport_options_t o = {.sizes = sizes,
                                .n_sizes = 5,
                                .batches = (size_t)batches,
                                .remote_bytes = (uint64_t)rmb << 20,
                                .remote_batches = (size_t)rbatches,
                                .runs = (int)runs,
                                .curve = curve,
                                .progress = progress};
    dh_transport_report_t r;
    int rc = dh_transport_bench(&o, &r);
    if (rc)
        return dh_cli_fail("transport-bench", rc, "benchmark failed");
    if (json) {
        printf("{\"local\":[");
        for (size_t i = 0; i < r.n_local; i++)
            printf("%s{\"bytes\":%llu,\"overhead_p50_us\":%.2f,\"overhead_p99_us\":%.2f}",
                   i ? "," : "", (unsigned long long)r.local[i].bytes, r.local[i].overhead_p50_us,
                   r.local[i].overhead_p99_us);
        printf("],\"remote_gbps\":%.3f,\"raw_tcp_gbps\":%.3f,\"remote_ratio\":%.3f,"
               "\"curve_gbps\":%.3f,\"curve_ratio\":%.3f}\n",
               r.remote_gbps, r.raw_tcp_gbps, r.remote_ratio, r.curve_gbps, r.curve_ratio);
        return 0;
    }
    printf("local delivery (ready in the arena -> returned by next())\n");
    printf("  %12s %12s %12s\n", "payload MB", "p50 us", "p99 us");
    for (size_t i = 0; i < r.n_local; i++)
        printf("  %12.1f %12.1f %12.1f\n", (double)r.local[i].bytes / 1e6,
               r.local[i].overhead_p50_us, r.local[i].overhead_p99_us);
    printf("remote forwarding (%llu MB batches, medians of %llu runs)\n", rmb, runs);
    printf("  DataHelix %.2f Gb/s, raw TCP %.2f Gb/s, ratio %.2f\n", r.remote_gbps, r.raw_tcp_gbps,
           r.remote_ratio);
    if (curve)
        printf("  with CURVE %.2f Gb/s: %.2fx plaintext (median of the runs' ratios)\n",
               r.curve_gbps, r.curve_ratio);
    return 0;
}
