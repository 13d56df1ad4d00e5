/* cmd_decode_bench.c: `datahelix decode-bench`, DataHelix's decode pipeline against the
 * ffmpeg CLI and PyAV, per core, side by side (src/bench/decode_bench.c). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "bench/decode_bench.h"
#include "cli.h"

#define CMD "decode-bench"

#ifndef DH_SOURCE_DIR
#define DH_SOURCE_DIR "."
#endif

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: datahelix decode-bench [--mix NAME|FILE.json] [--clips N] [--runs R]\n"
        "                              [--seed S] [--dir DIR] [--pyav-script FILE]\n"
        "                              [--python EXE] [--json]\n\n"
        "Per-core throughput (clips/s) of producing each clip's sampled frames at its\n"
        "target size (uniform sampling, short-side+center-crop, uint8 RGB), side by side in\n"
        "one run: DataHelix's pipeline, the ffmpeg CLI (-threads 1, select + crop + bilinear\n"
        "scale) and PyAV (bench/decode/pyav_decode.py, bilinear reformat). The process is\n"
        "pinned to one CPU. Medians over the runs, and the ratios. Data sets are made once\n"
        "with `synth` under DIR and reused.\n\n"
        "options:\n"
        "  -m, --mix NAME      one mix (default: every built-in mix)\n"
        "  -n, --clips N       clips per data set (default 24)\n"
        "  -r, --runs R        rounds, medians reported (default 5)\n"
        "  -s, --seed S        data set seed (default 1)\n"
        "  -d, --dir DIR       where data sets are made (default out/decode-bench)\n"
        "      --pyav-script F the PyAV side (default %s/bench/decode/pyav_decode.py)\n"
        "      --python EXE    interpreter for it (default $DH_PYTHON_EXE, else python3)\n"
        "      --json          with --mix, one object {\"mix\", \"datahelix_clips_per_s\",\n"
        "                      \"ffmpeg_clips_per_s\", \"pyav_clips_per_s\", \"ratio_vs_ffmpeg\",\n"
        "                      \"ratio_vs_pyav\"}; without, a JSON list of them\n"
        "  -h, --help          this text\n",
        DH_SOURCE_DIR);
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0.0;
}

int dh_cmd_decode_bench(int argc, char **argv)
{
    enum { OPT_PYAV = 256, OPT_PYTHON, OPT_JSON };
    static const struct option options[] = {{"mix", required_argument, NULL, 'm'},
                                            {"clips", required_argument, NULL, 'n'},
                                            {"runs", required_argument, NULL, 'r'},
                                            {"seed", required_argument, NULL, 's'},
                                            {"dir", required_argument, NULL, 'd'},
                                            {"pyav-script", required_argument, NULL, OPT_PYAV},
                                            {"python", required_argument, NULL, OPT_PYTHON},
                                            {"json", no_argument, NULL, OPT_JSON},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    dh_decode_bench_config_t cfg = {.clips = 24,
                                    .runs = 5,
                                    .seed = 1,
                                    .work_dir = "out/decode-bench",
                                    .pyav_script = DH_SOURCE_DIR "/bench/decode/pyav_decode.py",
                                    .python = getenv("DH_PYTHON_EXE"),
                                    .verbose = 1};
    if (!cfg.python || !*cfg.python)
        cfg.python = "python3";
    const char *one_mix = NULL;
    unsigned long long v;
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:r:s:d:h", options, NULL)) != -1) {
        switch (c) {
        case 'm':
            one_mix = optarg;
            break;
        case 'n':
            if (dh_cli_parse_u64(CMD, "--clips", optarg, 1, 100000, &v) < 0)
                return 2;
            cfg.clips = (size_t)v;
            break;
        case 'r':
            if (dh_cli_parse_u64(CMD, "--runs", optarg, 1, 1000, &v) < 0)
                return 2;
            cfg.runs = (unsigned)v;
            break;
        case 's':
            if (dh_cli_parse_u64(CMD, "--seed", optarg, 0, ~0ull, &v) < 0)
                return 2;
            cfg.seed = v;
            break;
        case 'd':
            cfg.work_dir = optarg;
            break;
        case OPT_PYAV:
            cfg.pyav_script = optarg;
            break;
        case OPT_PYTHON:
            cfg.python = optarg;
            break;
        case OPT_JSON:
            json = 1;
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
    const char *const *names = dh_mix_builtin_names();
    const char *single[2] = {one_mix, NULL};
    const char *const *mixes = one_mix ? single : names;
    if (!json)
        printf("%-16s %5s %6s %12s %12s %12s %10s %10s\n", "mix", "clips", "frames", "datahelix/s",
               "ffmpeg/s", "pyav/s", "vs ffmpeg", "vs pyav");
    else if (!one_mix)
        printf("[");
    fflush(stdout);
    for (size_t i = 0; mixes[i]; i++) {
        dh_decode_bench_result_t r;
        cfg.mix = mixes[i];
        int rc = dh_decode_bench_run(&cfg, &r);
        if (rc != 0)
            return dh_cli_fail(CMD, rc, "benchmark failed");
        if (r.pyav_error[0])
            fprintf(stderr, "datahelix %s: no PyAV column for %s: %s\n", CMD, r.mix, r.pyav_error);
        if (json) {
            printf("%s{\"mix\":\"%s\",\"clips\":%zu,\"frames\":%zu,\"datahelix_clips_per_s\":%.3f,"
                   "\"ffmpeg_clips_per_s\":%.3f,\"pyav_clips_per_s\":%.3f,\"ratio_vs_ffmpeg\":%.3f,"
                   "\"ratio_vs_pyav\":%.3f}",
                   i ? "," : "", r.mix, r.clips, r.frames, r.datahelix_clips_per_s,
                   r.ffmpeg_clips_per_s, r.pyav_clips_per_s,
                   ratio(r.datahelix_clips_per_s, r.ffmpeg_clips_per_s),
                   ratio(r.datahelix_clips_per_s, r.pyav_clips_per_s));
        } else {
            printf("%-16s %5zu %6zu %12.2f %12.2f %12.2f %9.2fx %9.2fx\n", r.mix, r.clips, r.frames,
                   r.datahelix_clips_per_s, r.ffmpeg_clips_per_s, r.pyav_clips_per_s,
                   ratio(r.datahelix_clips_per_s, r.ffmpeg_clips_per_s),
                   ratio(r.datahelix_clips_per_s, r.pyav_clips_per_s));
        }
        fflush(stdout);
    }
    if (json)
        printf(one_mix ? "\n" : "]\n");
    else
        printf("\nclips/s per core, medians of %u runs; ratios are DataHelix / peer.\n", cfg.runs);
    return 0;
}
