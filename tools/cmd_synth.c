/* cmd_synth.c: `datahelix synth`, writes a synthetic video data set (real H.264/MP4 clips
 * plus manifest.jsonl, docs/synth.md) drawn from a workload mix, so the decode pipeline and
 * the benchmarks have video to chew on before any real data set is at hand. Thin: parse,
 * dh_synth_dataset_write with a progress callback, summarise. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/synth.h"
#include "cli.h"

#define CMD "synth"
#define MAX_COUNT 10000000ULL /* 10 M clips: ~6 days of encoding on 2 cores, a sane ceiling */
#define MAX_JOBS 256ULL

static void usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix synth --out DIR --mix MIX --count N [--seed S] [--jobs J]\n"
            "\n"
            "Writes N synthetic video clips (H.264 in MP4, moving textured content with the\n"
            "frame index drawn in the top rows) drawn from a workload mix into DIR/clips/,\n"
            "and DIR/manifest.jsonl with one {id, path, caption, frames, height, width} line\n"
            "per clip (see docs/synth.md). The manifest is written last, so an interrupted\n"
            "run leaves none.\n"
            "\n"
            "options:\n"
            "  -o, --out DIR      output directory, made with its parents if missing (required)\n"
            "  -m, --mix MIX      kinetics-s | kinetics-m | kinetics-l | kinetics-mixed |\n"
            "                     openvid-mixed, or a JSON file holding a list of\n"
            "                     {frames, height, width, duration_s, fps, weight} objects\n"
            "                     (required)\n"
            "  -n, --count N      number of clips, 0..%llu (required)\n"
            "  -s, --seed S       random seed (default 0); the same seed gives the same clips\n"
            "  -j, --jobs J       encoder threads, 0..%llu (default 0: one per CPU); the\n"
            "                     output does not depend on it\n"
            "  -h, --help         show this help\n"
            "\n"
            "Progress goes to standard error (in place on a terminal, else a line about every\n"
            "10%%), then a summary: clips, seconds of video, bytes, elapsed time.\n"
            "Exit status: 0 success, 1 failure, 2 usage error.\n",
            MAX_COUNT, MAX_JOBS);
}

typedef struct progress_state {
    uint64_t start_ns;
    int tty;
    size_t next_line; /* non-tty: clips done at which the next line is due */
} progress_state_t;

/* Called on the main thread after each clip (dh_synth_dataset_write's contract). */
static void on_progress(size_t done, size_t total, void *ctx)
{
    progress_state_t *ps = ctx;
    double elapsed = dh_clock_elapsed_s(ps->start_ns, dh_clock_now_ns());
    double rate = elapsed > 0 ? (double)done / elapsed : 0;
    if (ps->tty) {
        fprintf(stderr, "\rsynth: %zu/%zu clips (%.1f clips/s)", done, total, rate);
        if (done == total)
            fputc('\n', stderr);
        fflush(stderr);
    } else if (done >= ps->next_line || done == total) {
        fprintf(stderr, "synth: %zu/%zu clips (%.1f clips/s)\n", done, total, rate);
        size_t step = total / 10 ? total / 10 : 1;
        ps->next_line = (done / step + 1) * step;
    }
}

int dh_cmd_synth(int argc, char **argv)
{
    static const struct option options[] = {
        {"out", required_argument, NULL, 'o'},
        {"mix", required_argument, NULL, 'm'},
        {"count", required_argument, NULL, 'n'},
        {"seed", required_argument, NULL, 's'},
        {"jobs", required_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out_dir = NULL, *mix_name = NULL;
    unsigned long long count = 0, seed = 0, jobs = 0;
    int have_count = 0, opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "o:m:n:s:j:h", options, NULL)) != -1) {
        switch (opt) {
        case 'o':
            out_dir = optarg;
            break;
        case 'm':
            mix_name = optarg;
            break;
        case 'n':
            if (dh_cli_parse_u64(CMD, "--count", optarg, 0, MAX_COUNT, &count) < 0)
                return 2;
            have_count = 1;
            break;
        case 's':
            if (dh_cli_parse_u64(CMD, "--seed", optarg, 0, UINT64_MAX, &seed) < 0)
                return 2;
            break;
        case 'j':
            if (dh_cli_parse_u64(CMD, "--jobs", optarg, 0, MAX_JOBS, &jobs) < 0)
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
    if (dh_cli_no_extra_args(CMD, argc, argv, optind) < 0)
        return 2;
    if (!out_dir || !*out_dir || !mix_name || !have_count) {
        fprintf(stderr, "datahelix %s: %s is required (see --help)\n", CMD,
                !out_dir || !*out_dir ? "--out"
                : !mix_name           ? "--mix"
                                      : "--count");
        return 2;
    }

    dh_mix_t *mix = NULL;
    int rc = dh_mix_load(mix_name, &mix);
    if (rc < 0)
        return dh_cli_fail(CMD, rc, "cannot load the mix");
    progress_state_t ps = {.start_ns = dh_clock_now_ns(),
                           .tty = isatty(STDERR_FILENO),
                           .next_line = count / 10 ? (size_t)count / 10 : 1};
    dh_synth_totals_t totals;
    rc = dh_synth_dataset_write(out_dir, mix, (size_t)count, seed, (unsigned)jobs, on_progress, &ps,
                                &totals);
    double elapsed = dh_clock_elapsed_s(ps.start_ns, dh_clock_now_ns());
    dh_mix_destroy(&mix);
    if (rc < 0) {
        if (ps.tty)
            fputc('\n', stderr);
        return dh_cli_fail(CMD, rc, "cannot write the data set");
    }
    fprintf(stderr,
            "datahelix %s: wrote %zu clips to %s (mix %s, seed %llu): %.1f s of video, "
            "%" PRId64 " frames, %.1f MB, in %.1f s (%.1f clips/s)\n",
            CMD, totals.clips, out_dir, mix_name, seed, totals.video_s, totals.frames,
            (double)totals.bytes / 1e6, elapsed, elapsed > 0 ? (double)totals.clips / elapsed : 0);
    return 0;
}
