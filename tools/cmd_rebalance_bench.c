/* cmd_rebalance_bench.c: `datahelix rebalance-bench`, the cost of redistributing decoded
 * samples between ranks (bench/rebalance_bench.h, docs/benchmarks.md). Thin: parse, run,
 * print a table or JSON. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/log.h"
#include "bench/rebalance_bench.h"
#include "cli.h"

#define CMD "rebalance-bench"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix rebalance-bench [--json] [--clips N] [--ranks R] [--frames F]\n"
            "                                 [--height H] [--width W] [--rounds K]\n"
            "                                 [--move-fraction X] [--seed S] [--on-node-only]\n"
            "\n"
            "Measures the redistribution of decoded clips (F x H x W x 3 uint8) between ranks,\n"
            "tier 2's data movement (issue 14), on this machine:\n"
            "  on-node  N clips in one shared-memory arena held by R ranks, each a process\n"
            "           attached to it. A round: the coordinator (this process) gathers every\n"
            "           rank's handles over ZeroMQ (tcp://127.0.0.1), picks a seeded move that\n"
            "           keeps per-rank counts, and sends each receiver the handles it takes\n"
            "           over; the receiver takes the sender's reference, resolves each clip and\n"
            "           checks its bytes. Timed from the round's first message to the last\n"
            "           receiver's report; p50 and p95 over K rounds after a warm-up. A move\n"
            "           is a change of owner: a moved clip found anywhere but its original\n"
            "           slab counts as a pixel copy (expected 0).\n"
            "  cross    the same clips from that arena to a second one across a loopback\n"
            "           \"node\" boundary: one ZeroMQ message per clip over tcp://127.0.0.1\n"
            "           (the slab as a zero-copy frame, one copy into the receiver's arena),\n"
            "           beside a plain TCP socket carrying the same bytes in the same run;\n"
            "           medians over K rounds after a warm-up, in GB/s (1e9 bytes/s), and the\n"
            "           median of their per-round ratio.\n"
            "\n"
            "options:\n"
            "  --clips N            clips (default 64, at most %d, and 8 GB in all)\n"
            "  --ranks R            ranks, one process each (default 8, 2..%d)\n"
            "  --frames F           frames per clip (default 16)\n"
            "  --height H           pixels (default 224)\n"
            "  --width W            pixels (default 224)\n"
            "  --rounds K           timed rounds of each part (default 20)\n"
            "  --move-fraction X    share of the clips moved each round, 0..1 (default 1):\n"
            "                       they trade the slots they leave, so every rank keeps\n"
            "                       its count (and each changes owner unless one rank held\n"
            "                       over half of them; onnode_moved counts the changes)\n"
            "  --seed S             seed of the moves (default 1)\n"
            "  --on-node-only       skip the cross part (its fields are then 0)\n"
            "  --json               one JSON object: clips, clip_bytes, ranks, rounds,\n"
            "                       move_fraction, seed, onnode_p50_ms, onnode_p95_ms,\n"
            "                       onnode_moved, onnode_pixel_copies, onnode_handoffs_verified,\n"
            "                       cross_gbps_p50, raw_tcp_gbps_p50, cross_vs_raw,\n"
            "                       cross_p50_ms, raw_tcp_p50_ms\n"
            "  -h, --help           show this help\n"
            "\n"
            "Progress lines go to standard error. Exit status: 0, 1 failure, 2 usage error.\n",
            DH_REBALANCE_BENCH_MAX_CLIPS, DH_REBALANCE_BENCH_MAX_RANKS);
}

static void progress(const char *line, void *ctx)
{
    (void)ctx;
    fprintf(stderr, CMD ": %s\n", line);
}

static int parse_u32(const char *option, const char *text, unsigned long long min,
                     unsigned long long max, uint32_t *out)
{
    unsigned long long v;
    if (dh_cli_parse_u64(CMD, option, text, min, max, &v))
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int dh_cmd_rebalance_bench(int argc, char **argv)
{
    enum {
        OPT_JSON = 256,
        OPT_CLIPS,
        OPT_RANKS,
        OPT_FRAMES,
        OPT_HEIGHT,
        OPT_WIDTH,
        OPT_ROUNDS,
        OPT_MOVE,
        OPT_SEED,
        OPT_ONNODE
    };
    static const struct option options[] = {{"json", no_argument, NULL, OPT_JSON},
                                            {"clips", required_argument, NULL, OPT_CLIPS},
                                            {"ranks", required_argument, NULL, OPT_RANKS},
                                            {"frames", required_argument, NULL, OPT_FRAMES},
                                            {"height", required_argument, NULL, OPT_HEIGHT},
                                            {"width", required_argument, NULL, OPT_WIDTH},
                                            {"rounds", required_argument, NULL, OPT_ROUNDS},
                                            {"move-fraction", required_argument, NULL, OPT_MOVE},
                                            {"seed", required_argument, NULL, OPT_SEED},
                                            {"on-node-only", no_argument, NULL, OPT_ONNODE},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    dh_rebalance_bench_options_t o;
    dh_rebalance_bench_options_default(&o);
    int json = 0, opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        int bad = 0;
        switch (opt) {
        case OPT_JSON:
            json = 1;
            break;
        case OPT_CLIPS:
            bad = parse_u32("--clips", optarg, 1, DH_REBALANCE_BENCH_MAX_CLIPS, &o.clips);
            break;
        case OPT_RANKS:
            bad = parse_u32("--ranks", optarg, 2, DH_REBALANCE_BENCH_MAX_RANKS, &o.ranks);
            break;
        case OPT_FRAMES:
            bad = parse_u32("--frames", optarg, 1, 4096, &o.frames);
            break;
        case OPT_HEIGHT:
            bad = parse_u32("--height", optarg, 1, 8192, &o.height);
            break;
        case OPT_WIDTH:
            bad = parse_u32("--width", optarg, 1, 8192, &o.width);
            break;
        case OPT_ROUNDS:
            bad = parse_u32("--rounds", optarg, 1, 10000, &o.rounds);
            break;
        case OPT_MOVE: {
            char *end = NULL;
            errno = 0;
            double v = strtod(optarg, &end);
            if (errno || end == optarg || *end || !isfinite(v) || v < 0 || v > 1) {
                fprintf(stderr,
                        "datahelix " CMD ": --move-fraction: '%s' is not a number in "
                        "[0, 1]\n",
                        optarg);
                bad = -1;
            }
            o.move_fraction = v;
            break;
        }
        case OPT_SEED: {
            unsigned long long seed;
            bad = dh_cli_parse_u64(CMD, "--seed", optarg, 0, UINT64_MAX, &seed);
            o.seed = seed;
            break;
        }
        case OPT_ONNODE:
            o.skip_cross = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (bad)
            return 2;
    }
    if (dh_cli_no_extra_args(CMD, argc, argv, optind))
        return 2;
    if (dh_rebalance_bench_check(&o)) { /* sizes valid one by one, not together */
        fprintf(stderr, "datahelix " CMD ": %s\n", dh_last_error());
        return 2;
    }
    if (!getenv("DH_LOG_LEVEL"))
        dh_log_set_level(DH_LOG_WARN);
    o.progress = progress;
    dh_rebalance_bench_report_t r;
    int rc = dh_rebalance_bench_run(&o, &r);
    if (rc)
        return dh_cli_fail(CMD, rc, "benchmark failed");
    if (json)
        return dh_rebalance_bench_write_json(stdout, &r) ? 1 : 0;
    printf("redistribution of %u clips of %ux%ux%ux3 uint8 (%.2f MB each) among %u ranks\n",
           r.clips, o.frames, o.height, o.width, (double)r.clip_bytes / 1e6, r.ranks);
    printf("  on-node (ownership handoff), %u rounds, %u clips moved per round\n", r.rounds,
           r.onnode_moved);
    printf("    %-28s %10.3f ms\n", "round p50", r.onnode_p50_ms);
    printf("    %-28s %10.3f ms\n", "round p95", r.onnode_p95_ms);
    printf("    %-28s %10llu\n", "handoffs verified",
           (unsigned long long)r.onnode_handoffs_verified);
    printf("    %-28s %10llu\n", "pixel copies", (unsigned long long)r.onnode_pixel_copies);
    if (o.skip_cross)
        return 0;
    printf("  cross-node over tcp://127.0.0.1, medians of %u rounds\n", r.rounds);
    printf("    %-28s %10.2f GB/s %10.1f ms\n", "DataHelix (ZeroMQ frames)", r.cross_gbps_p50,
           r.cross_p50_ms);
    printf("    %-28s %10.2f GB/s %10.1f ms\n", "raw TCP", r.raw_tcp_gbps_p50, r.raw_tcp_p50_ms);
    printf("    %-28s %10.2f\n", "DataHelix / raw TCP", r.cross_vs_raw);
    return 0;
}
