/* cmd_decode_bench.c: `datahelix decode-bench`, DataHelix's decode pipeline against the
 * ffmpeg CLI, PyAV (plain and with the same frame skipping), decord, SPDL and torchcodec,
 * per core, side by side, with a pixel check (src/bench/decode_bench.c). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "datahelix/alloc.h"
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
        "usage: datahelix decode-bench [--mix NAME[@ENC]|FILE.json[@ENC]] [--clips N] [--runs R]\n"
        "                              [--seed S] [--dir DIR] [--pyav-script FILE]\n"
        "                              [--peer-script FILE] [--python EXE] [--json]\n\n"
        "Per-core throughput (clips/s) of producing each clip's sampled frames at its\n"
        "target size (uniform sampling, short-side+center-crop, uint8 RGB), side by side in\n"
        "one run: DataHelix's pipeline; the ffmpeg CLI, one process over all clips (one\n"
        "-threads 1 -i input and one rawvideo output per clip, at most %d clips a process,\n"
        "so the process start is paid once per round, not per clip; select + crop +\n"
        "bilinear scale; it decodes every frame); PyAV\n"
        "(bench/decode/pyav_decode.py, bilinear reformat) plain, and PyAV with\n"
        "skip_frame=NONREF on the packets of frames not sampled (pyav_skip: the skipping\n"
        "DataHelix does); decord (VideoReader(path, width, height, num_threads=1).get_batch),\n"
        "SPDL (spdl.io.demux_video + sample_decode_video, bilinear scale filter) and\n"
        "torchcodec (VideoDecoder(num_ffmpeg_threads=1).get_frames_at), each by\n"
        "bench/decode/peer_decode.py, one thread, the same frames. A peer that cannot run\n"
        "(not installed: pip install -r bench/decode/requirements.txt; an import error, e.g.\n"
        "torchcodec without a CUDA build of torch) is a column with the reason, not a number.\n"
        "A pixel check first compares the frames of the first %d clips against PyAV's (mean\n"
        "absolute difference, of 255). The process is pinned to one CPU.\n"
        "Medians over the runs, and the ratios DataHelix / peer. Data sets are made once with\n"
        "`synth` under DIR and reused; ENC is the synth encoding: flat-b (the default, three\n"
        "non-reference B-frames per reference), x264-default (x264's B-frame defaults,\n"
        "b-pyramid=normal) or no-b (no B-frames).\n\n"
        "options:\n"
        "  -m, --mix NAME      one mix (default: every built-in mix, then kinetics-mixed@%s\n"
        "                      and kinetics-mixed@%s)\n"
        "  -n, --clips N       clips per data set (default 24)\n"
        "  -r, --runs R        rounds, medians reported (default 5)\n"
        "  -s, --seed S        data set seed (default 1)\n"
        "  -d, --dir DIR       where data sets are made (default out/decode-bench)\n"
        "      --pyav-script F the PyAV side (default %s/bench/decode/pyav_decode.py)\n"
        "      --peer-script F decord, SPDL, torchcodec (default\n"
        "                      %s/bench/decode/peer_decode.py)\n"
        "      --python EXE    interpreter for both (default $DH_PYTHON_EXE, else python3)\n"
        "      --json          with --mix, one object {\"mix\", \"encoding\", \"clips\",\n"
        "                      \"frames\", \"datahelix_clips_per_s\", \"ffmpeg_clips_per_s\",\n"
        "                      \"pyav_clips_per_s\", \"pyav_skip_clips_per_s\",\n"
        "                      \"ratio_vs_ffmpeg\", \"ratio_vs_pyav\", \"ratio_vs_pyav_skip\",\n"
        "                      \"ffmpeg_method\", \"pixel_check_clips\", \"pixel_mad_vs_pyav\",\n"
        "                      \"pixel_mad_ffmpeg_vs_pyav\", \"peers\": {\"decord\": ...,\n"
        "                      \"spdl\": ..., \"torchcodec\": ...}} (a MAD is -1 when not\n"
        "                      measured); a peer is {\"clips_per_s\", \"ratio\" (DataHelix /\n"
        "                      peer), \"mad_vs_pyav\"} or {\"reason\"}; without --mix, a\n"
        "                      JSON list of them\n"
        "  -h, --help          this text\n",
        DH_DECODE_BENCH_FFMPEG_BATCH, DH_DECODE_BENCH_CHECK_CLIPS, "x264-default", "no-b",
        DH_SOURCE_DIR, DH_SOURCE_DIR);
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0.0;
}

/* The "peers" object of the --json report (compact; the caller dh_frees it), or NULL. */
static char *peers_json(const dh_decode_bench_result_t *r)
{
    json_t *peers = json_object();
    for (size_t p = 0; peers && p < DH_DECODE_BENCH_PEERS; p++) {
        const dh_decode_bench_peer_t *peer = &r->peers[p];
        json_t *o = peer->reason[0]
                        ? json_pack("{s:s}", "reason", peer->reason)
                        : json_pack("{s:f,s:f,s:f}", "clips_per_s", peer->clips_per_s, "ratio",
                                    ratio(r->datahelix_clips_per_s, peer->clips_per_s),
                                    "mad_vs_pyav", peer->mad_vs_pyav);
        json_object_set_new(peers, peer->name, o ? o : json_null());
    }
    char *text = peers ? json_dumps(peers, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(peers);
    return text;
}

/* The peers' cells of a table row: clips/s, or "-" when the peer has a reason. */
static void print_peer_cells(const dh_decode_bench_result_t *r)
{
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++) {
        if (r->peers[p].reason[0])
            printf(" %9s", "-");
        else
            printf(" %9.2f", r->peers[p].clips_per_s);
    }
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++) {
        if (r->peers[p].reason[0] || r->peers[p].mad_vs_pyav < 0)
            printf(" %7s", "-");
        else
            printf(" %7.2f", r->peers[p].mad_vs_pyav);
    }
    printf("\n");
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++)
        if (r->peers[p].reason[0])
            printf("  %s: %s\n", r->peers[p].name, r->peers[p].reason);
}

int dh_cmd_decode_bench(int argc, char **argv)
{
    enum { OPT_PYAV = 256, OPT_PEERS, OPT_PYTHON, OPT_JSON };
    static const struct option options[] = {{"mix", required_argument, NULL, 'm'},
                                            {"clips", required_argument, NULL, 'n'},
                                            {"runs", required_argument, NULL, 'r'},
                                            {"seed", required_argument, NULL, 's'},
                                            {"dir", required_argument, NULL, 'd'},
                                            {"pyav-script", required_argument, NULL, OPT_PYAV},
                                            {"peer-script", required_argument, NULL, OPT_PEERS},
                                            {"python", required_argument, NULL, OPT_PYTHON},
                                            {"json", no_argument, NULL, OPT_JSON},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    dh_decode_bench_config_t cfg = {.clips = 24,
                                    .runs = 5,
                                    .seed = 1,
                                    .work_dir = "out/decode-bench",
                                    .pyav_script = DH_SOURCE_DIR "/bench/decode/pyav_decode.py",
                                    .peer_script = DH_SOURCE_DIR "/bench/decode/peer_decode.py",
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
        case OPT_PEERS:
            cfg.peer_script = optarg;
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
    /* Every built-in mix as synth makes it, then the mixed one with x264's B-frame defaults
     * and without B-frames. */
    const char *const *builtin = dh_mix_builtin_names();
    size_t nb = 0;
    while (builtin[nb])
        nb++;
    const char **mixes = calloc(nb + 3, sizeof *mixes);
    if (!mixes)
        return dh_cli_fail(CMD, DH_ENOMEM, "out of memory");
    if (one_mix) {
        mixes[0] = one_mix;
    } else {
        for (size_t i = 0; i < nb; i++)
            mixes[i] = builtin[i];
        mixes[nb] = "kinetics-mixed@x264-default";
        mixes[nb + 1] = "kinetics-mixed@no-b";
    }
    if (!json)
        printf("%-28s %5s %6s %11s %9s %9s %9s %9s %9s %9s %7s %9s %9s %9s %7s %7s %7s\n", "mix",
               "clips", "frames", "datahelix/s", "ffmpeg/s", "pyav/s", "pyavskip/s", "vs ffmpeg",
               "vs pyav", "vs skip", "MAD", "decord/s", "spdl/s", "tcodec/s", "MADdec", "MADspdl",
               "MADtc");
    else if (!one_mix)
        printf("[");
    fflush(stdout);
    for (size_t i = 0; mixes[i]; i++) {
        dh_decode_bench_result_t r;
        cfg.mix = mixes[i];
        int rc = dh_decode_bench_run(&cfg, &r);
        if (rc != 0) {
            free(mixes);
            return dh_cli_fail(CMD, rc, "benchmark failed");
        }
        if (r.pyav_error[0])
            fprintf(stderr, "datahelix %s: no PyAV column for %s: %s\n", CMD, r.mix, r.pyav_error);
        if (json) {
            char *peers = peers_json(&r);
            printf("%s{\"mix\":\"%s\",\"encoding\":\"%s\",\"clips\":%zu,\"frames\":%zu,"
                   "\"datahelix_clips_per_s\":%.3f,\"ffmpeg_clips_per_s\":%.3f,"
                   "\"pyav_clips_per_s\":%.3f,\"pyav_skip_clips_per_s\":%.3f,"
                   "\"ratio_vs_ffmpeg\":%.3f,\"ratio_vs_pyav\":%.3f,\"ratio_vs_pyav_skip\":%.3f,"
                   "\"ffmpeg_method\":\"%s\",\"pixel_check_clips\":%zu,"
                   "\"pixel_mad_vs_pyav\":%.3f,\"pixel_mad_ffmpeg_vs_pyav\":%.3f,\"peers\":%s}",
                   i ? "," : "", r.mix, r.encoding, r.clips, r.frames, r.datahelix_clips_per_s,
                   r.ffmpeg_clips_per_s, r.pyav_clips_per_s, r.pyav_skip_clips_per_s,
                   ratio(r.datahelix_clips_per_s, r.ffmpeg_clips_per_s),
                   ratio(r.datahelix_clips_per_s, r.pyav_clips_per_s),
                   ratio(r.datahelix_clips_per_s, r.pyav_skip_clips_per_s), r.ffmpeg_method,
                   r.check_clips, r.pixel_mad_vs_pyav, r.pixel_mad_ffmpeg_vs_pyav,
                   peers ? peers : "null");
            dh_free(peers); /* jansson allocates through dh_malloc (the bench installs it) */
        } else {
            printf("%-28s %5zu %6zu %11.2f %9.2f %9.2f %10.2f %8.2fx %8.2fx %8.2fx %7.2f", r.mix,
                   r.clips, r.frames, r.datahelix_clips_per_s, r.ffmpeg_clips_per_s,
                   r.pyav_clips_per_s, r.pyav_skip_clips_per_s,
                   ratio(r.datahelix_clips_per_s, r.ffmpeg_clips_per_s),
                   ratio(r.datahelix_clips_per_s, r.pyav_clips_per_s),
                   ratio(r.datahelix_clips_per_s, r.pyav_skip_clips_per_s), r.pixel_mad_vs_pyav);
            print_peer_cells(&r);
        }
        fflush(stdout);
    }
    free(mixes);
    if (json)
        printf(one_mix ? "\n" : "]\n");
    else
        printf(
            "\nclips/s per core, medians of %u runs; ratios are DataHelix / peer. ffmpeg: %s\n"
            "(one process over all clips, every frame decoded). pyav skip: PyAV with\n"
            "skip_frame=NONREF on unsampled packets. MAD: mean |DataHelix - PyAV| of 255 over\n"
            "the first %d clips' frames (-1: no PyAV). decord, spdl, tcodec (torchcodec): clips/s\n"
            "and MAD against PyAV the same way; \"-\" and a line below the row say why a peer\n"
            "has no number.\n",
            cfg.runs, DH_DECODE_BENCH_FFMPEG_METHOD, DH_DECODE_BENCH_CHECK_CLIPS);
    return 0;
}
