/* decode_bench.c: `datahelix decode-bench` (see decode_bench.h, docs/pipeline.md).
 *
 * Fairness rules: the same clips, the same sampled frame indices and output size for all;
 * one thread each (the process is pinned to one CPU, and children inherit it); bilinear
 * scaling in all (libswscale underneath each). DataHelix and PyAV seek to the keyframe
 * before a sampled frame when one lies ahead and decode forward; DataHelix and the second
 * PyAV column (pyav_skip) do not decode non-reference frames that are not sampled. The
 * ffmpeg CLI runs as one process over all clips (several -i inputs, one rawvideo output
 * each, so one process start per round, not per clip), decodes every frame (the CLI has no
 * per-frame skip) and keeps the sampled ones with its select filter. The ffmpeg and PyAV
 * outputs are counted (bytes, frames) to check they produced what was asked, and a pixel
 * check compares the frames themselves (mean absolute difference against PyAV's) on the
 * first clips. Wall time per round: DataHelix's in-process loop, the ffmpeg process from
 * start to exit, and PyAV's own loop (interpreter start excluded). The peers (decord, SPDL,
 * torchcodec: decode_peers.c) read the same plan as PyAV, are timed like it, and their
 * frames are checked against PyAV's in the same pixel check.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "datahelix/mix.h"
#include "datahelix/pipeline.h"
#include "datahelix/probe.h"
#include "datahelix/stats.h"
#include "datahelix/synth.h"
#include "bench/decode_bench.h"
#include "bench/decode_peers.h"
#include "core/internal.h"
#include "media/media_lib.h"

typedef struct clip_plan {
    const dh_manifest_entry_t *entry;
    int32_t frames, height, width;          /* output */
    int32_t crop_x, crop_y, crop_w, crop_h; /* source rectangle kept (centre crop) */
    int32_t src_w, src_h;
    int64_t *indices;
    int64_t *keyframes;
    size_t n_keyframes;
} clip_plan_t;

static void synth_progress(size_t done, size_t total, void *ctx)
{
    if (*(int *)ctx && (done == total || done % 10 == 0))
        fprintf(stderr, "\rdecode-bench: making clips %zu/%zu", done, total);
    if (*(int *)ctx && done == total)
        fputc('\n', stderr);
}

/* The data set for this mix (NAME[@ENCODING]), made once under work_dir; today's encoding
 * keeps the directory name it always had. */
static int ensure_dataset(const dh_decode_bench_config_t *cfg, char *manifest, size_t size,
                          dh_decode_bench_result_t *out)
{
    char name[1024];
    dh_synth_encoding_t enc = DH_SYNTH_ENC_FLAT_B;
    const char *at = strrchr(cfg->mix, '@'), *slash = strrchr(cfg->mix, '/');
    if (at && (!slash || slash < at)) {
        snprintf(name, sizeof name, "%.*s", (int)(at - cfg->mix), cfg->mix);
        int rc = dh_synth_encoding_parse(at + 1, &enc);
        if (rc)
            return dh__set_error(rc, "mix %s: %s", cfg->mix, dh_last_error());
    } else {
        snprintf(name, sizeof name, "%s", cfg->mix);
    }
    snprintf(out->encoding, sizeof out->encoding, "%s", dh_synth_encoding_name(enc));
    char dir[1200];
    const char *base = strrchr(name, '/');
    snprintf(dir, sizeof dir, "%s/%s-n%zu-s%llu%s%s", cfg->work_dir, base ? base + 1 : name,
             cfg->clips, (unsigned long long)cfg->seed, enc ? "-" : "",
             enc ? dh_synth_encoding_name(enc) : "");
    snprintf(manifest, size, "%s/manifest.jsonl", dir);
    if (access(manifest, R_OK) == 0)
        return 0;
    dh_mix_t *mix = NULL;
    int rc = dh__make_dirs(cfg->work_dir);
    if (rc == 0)
        rc = dh_mix_load(name, &mix);
    if (rc)
        return rc;
    int verbose = cfg->verbose;
    rc = dh_synth_dataset_encoded(dir, mix, cfg->clips, cfg->seed, 0, enc, synth_progress, &verbose,
                                  NULL);
    dh_mix_destroy(&mix);
    return rc;
}

/* The source rectangle short-side+center-crop keeps: the largest centred region with the
 * output's aspect ratio. */
static void centre_crop(int32_t src_w, int32_t src_h, int32_t out_w, int32_t out_h, clip_plan_t *p)
{
    double scale = fmax((double)out_w / src_w, (double)out_h / src_h);
    int32_t w = (int32_t)lround(out_w / scale), h = (int32_t)lround(out_h / scale);
    p->crop_w = w < src_w ? w : src_w;
    p->crop_h = h < src_h ? h : src_h;
    p->crop_x = (src_w - p->crop_w) / 2;
    p->crop_y = (src_h - p->crop_h) / 2;
}

static int plan_clips(const dh_manifest_t *m, const dh_pipeline_spec_t *spec, clip_plan_t *plans,
                      size_t *frames_total)
{
    *frames_total = 0;
    for (size_t i = 0; i < dh_manifest_count(m); i++) {
        clip_plan_t *p = &plans[i];
        p->entry = dh_manifest_entry(m, i);
        dh_media_info_t info;
        int rc = dh_media_probe(p->entry->path, &info);
        if (rc)
            return rc;
        dh_clip_info_t clip = {info.frame_count, info.fps, info.duration_s, info.width,
                               info.height};
        dh_sample_overrides_t ovr = {p->entry->frames, p->entry->height, p->entry->width};
        dh_sample_plan_t plan;
        rc = dh_pipeline_plan(spec, &clip, &ovr, p->entry->id, &plan);
        if (rc) {
            dh_media_info_clear(&info);
            return rc;
        }
        p->frames = plan.frames;
        p->height = plan.height;
        p->width = plan.width;
        p->indices = plan.indices; /* taken over from the plan */
        p->src_w = info.width;
        p->src_h = info.height;
        p->keyframes = info.keyframes; /* taken over from the info */
        p->n_keyframes = info.n_keyframes;
        centre_crop(info.width, info.height, plan.width, plan.height, p);
        *frames_total += (size_t)plan.frames;
    }
    return 0;
}

static double run_datahelix(const dh_pipeline_spec_t *spec, clip_plan_t *plans, size_t n)
{
    dh_pipeline_t *pipeline = NULL;
    if (dh_pipeline_new(&pipeline, spec) != 0)
        return -1;
    uint64_t t0 = dh_clock_now_ns();
    for (size_t i = 0; i < n; i++) {
        dh_sample_t sample;
        dh_sample_overrides_t ovr = {plans[i].entry->frames, plans[i].entry->height,
                                     plans[i].entry->width};
        int rc =
            dh_pipeline_decode(pipeline, plans[i].entry->path, &ovr, plans[i].entry->id, &sample);
        dh__pipeline_recycle(pipeline, &sample); /* as the data server does after its collate */
        if (rc) {
            dh_pipeline_destroy(&pipeline);
            return -1;
        }
    }
    double s = dh_clock_elapsed_s(t0, dh_clock_now_ns());
    dh_pipeline_destroy(&pipeline);
    return s;
}

/* ffmpeg's select + crop + scale filter for one clip (dh_free it), or NULL. */
static char *ffmpeg_filter(const clip_plan_t *p)
{
    size_t cap = 64 + (size_t)p->frames * 24 + 256;
    char *filter = dh_malloc(cap);
    if (!filter)
        return NULL;
    int len = snprintf(filter, cap, "select='");
    for (int32_t f = 0; f < p->frames; f++)
        len += snprintf(filter + len, cap - (size_t)len, "%seq(n\\,%lld)", f ? "+" : "",
                        (long long)p->indices[f]);
    snprintf(filter + len, cap - (size_t)len, "',crop=%d:%d:%d:%d,scale=%d:%d:flags=bilinear",
             p->crop_w, p->crop_h, p->crop_x, p->crop_y, p->width, p->height);
    return filter;
}

/* Runs one ffmpeg process over clips [0, n) of `plans`: one `-threads 1 -i CLIP` input per
 * clip and one rawvideo output per clip, all to its stdout, which is read here. Counts the
 * bytes; when `keep` is not NULL, the first keep_cap bytes are copied there. Returns the
 * bytes, or -1. */
static long long ffmpeg_run(const clip_plan_t *plans, size_t n, uint8_t *keep, size_t keep_cap)
{
    static const char *const head[] = {
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-filter_threads", "1"};
    static const char *const tail[] = {"-fps_mode", "passthrough", "-f",    "rawvideo",
                                       "-pix_fmt",  "rgb24",       "pipe:1"};
    size_t argc = DH_ARRAY_LEN(head) + n * (4 + 4 + DH_ARRAY_LEN(tail)) + 1;
    char **argv = dh_calloc(argc, sizeof *argv);
    char **owned = dh_calloc(2 * n + 1, sizeof *owned); /* filters and map specifiers */
    long long bytes = -1;
    int fds[2] = {-1, -1};
    if (!argv || !owned)
        goto out;
    size_t a = 0;
    for (size_t i = 0; i < DH_ARRAY_LEN(head); i++)
        argv[a++] = (char *)head[i];
    for (size_t i = 0; i < n; i++) {
        argv[a++] = "-threads";
        argv[a++] = "1";
        argv[a++] = "-i";
        argv[a++] = (char *)plans[i].entry->path;
    }
    for (size_t i = 0; i < n; i++) {
        char *map = dh_malloc(32);
        owned[2 * i] = map;
        owned[2 * i + 1] = ffmpeg_filter(&plans[i]);
        if (!map || !owned[2 * i + 1])
            goto out;
        snprintf(map, 32, "%zu:v:0", i);
        argv[a++] = "-map";
        argv[a++] = map;
        argv[a++] = "-vf";
        argv[a++] = owned[2 * i + 1];
        for (size_t k = 0; k < DH_ARRAY_LEN(tail); k++)
            argv[a++] = (char *)tail[k];
    }
    argv[a] = NULL;
    if (pipe(fds) != 0)
        goto out;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, STDERR_FILENO);
        execvp("ffmpeg", argv);
        _exit(127);
    }
    close(fds[1]);
    fds[1] = -1;
    long long got = 0;
    char buf[1 << 16];
    ssize_t r;
    while ((r = read(fds[0], buf, sizeof buf)) > 0 || (r < 0 && errno == EINTR)) {
        if (r <= 0)
            continue;
        if (keep && (size_t)got < keep_cap) {
            size_t k = keep_cap - (size_t)got < (size_t)r ? keep_cap - (size_t)got : (size_t)r;
            memcpy(keep + got, buf, k);
        }
        got += r;
    }
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status))
        bytes = got;
out:
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    for (size_t i = 0; owned && i < 2 * n; i++)
        dh_free(owned[i]);
    dh_free(owned);
    dh_free(argv);
    return bytes;
}

static long long clip_bytes(const clip_plan_t *p)
{
    return (long long)p->frames * p->width * p->height * 3;
}

/* The ffmpeg column: one process per DH_DECODE_BENCH_FFMPEG_BATCH clips (one for the
 * default 24), so the process start is paid once, not per clip. Returns seconds, or -1. */
static double run_ffmpeg(const clip_plan_t *plans, size_t n)
{
    uint64_t t0 = dh_clock_now_ns();
    for (size_t i = 0; i < n; i += DH_DECODE_BENCH_FFMPEG_BATCH) {
        size_t k = n - i < DH_DECODE_BENCH_FFMPEG_BATCH ? n - i : DH_DECODE_BENCH_FFMPEG_BATCH;
        long long want = 0;
        for (size_t j = i; j < i + k; j++)
            want += clip_bytes(&plans[j]);
        if (ffmpeg_run(&plans[i], k, NULL, 0) != want)
            return -1;
    }
    return dh_clock_elapsed_s(t0, dh_clock_now_ns());
}

/* The plan file PyAV reads: one JSON object per clip. */
static int write_pyav_plan(const char *path, const clip_plan_t *plans, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    for (size_t i = 0; i < n; i++) {
        const clip_plan_t *p = &plans[i];
        double scale = fmax((double)p->width / p->src_w, (double)p->height / p->src_h);
        int32_t sw = (int32_t)lround(p->src_w * scale), sh = (int32_t)lround(p->src_h * scale);
        sw = sw < p->width ? p->width : sw;
        sh = sh < p->height ? p->height : sh;
        fprintf(f, "{\"path\":\"%s\",\"indices\":[", p->entry->path);
        for (int32_t k = 0; k < p->frames; k++)
            fprintf(f, "%s%lld", k ? "," : "", (long long)p->indices[k]);
        fprintf(f, "],\"keyframes\":[");
        for (size_t k = 0; k < p->n_keyframes; k++)
            fprintf(f, "%s%lld", k ? "," : "", (long long)p->keyframes[k]);
        fprintf(f,
                "],\"scaled_width\":%d,\"scaled_height\":%d,\"crop_x\":%d,\"crop_y\":%d,"
                "\"width\":%d,\"height\":%d}\n",
                sw, sh, (sw - p->width) / 2, (sh - p->height) / 2, p->width, p->height);
    }
    return fclose(f) == 0 ? 0 : -errno;
}

/* Runs the PyAV script once (with `extra` arguments, may be ""); returns its clips/s, or -1
 * with the reason in err. */
static double run_pyav(const dh_decode_bench_config_t *cfg, const char *plan_path,
                       const char *extra, char *err, size_t err_size)
{
    return dh__decode_script_run(cfg->python, cfg->pyav_script, plan_path, extra, err, err_size);
}

/* Sum of |a[i] - b[i]| over n bytes. */
static double abs_diff_sum(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (uint64_t)abs((int)a[i] - (int)b[i]);
    return (double)sum;
}

/* The pixel check (untimed): the first DH_DECODE_BENCH_CHECK_CLIPS clips through every
 * decoder, PyAV's frames as the reference; fills out->check_clips, the two MADs and the
 * peers' (the peers run even without PyAV: then their MADs stay -1). */
static int pixel_check(const dh_decode_bench_config_t *cfg, const dh_pipeline_spec_t *spec,
                       const clip_plan_t *plans, size_t n, const char *manifest_path, int have_pyav,
                       dh_decode_bench_result_t *out)
{
    size_t k = n < DH_DECODE_BENCH_CHECK_CLIPS ? n : DH_DECODE_BENCH_CHECK_CLIPS;
    char plan_path[1400], dump_path[1400], extra[1500];
    snprintf(plan_path, sizeof plan_path, "%s.check-plan.jsonl", manifest_path);
    snprintf(dump_path, sizeof dump_path, "%s.check-pyav.rgb", manifest_path);
    snprintf(extra, sizeof extra, "--dump '%s'", dump_path);
    int rc = write_pyav_plan(plan_path, plans, k);
    if (rc)
        return dh__set_error(rc, "%s: cannot write: %s", plan_path, strerror(-rc));
    if (!have_pyav ||
        run_pyav(cfg, plan_path, extra, out->pyav_error, sizeof out->pyav_error) <= 0) {
        dh__decode_peers_check(cfg, plan_path, NULL, out);
        unlink(plan_path);
        unlink(dump_path);
        return 0; /* no PyAV: the MADs stay -1 */
    }
    FILE *dump = fopen(dump_path, "rb");
    dh_pipeline_t *pipeline = NULL;
    uint8_t *ref = NULL, *ff = NULL;
    double ours_sum = 0, ff_sum = 0;
    size_t total = 0;
    int ff_ok = 1;
    rc = dump ? dh_pipeline_new(&pipeline, spec)
              : dh__set_error(DH_EIO, "%s: cannot read", dump_path);
    for (size_t i = 0; rc == 0 && i < k; i++) {
        size_t bytes = (size_t)clip_bytes(&plans[i]);
        ref = dh_malloc(bytes ? bytes : 1);
        ff = dh_malloc(bytes ? bytes : 1);
        if (!ref || !ff) {
            rc = DH_ENOMEM;
            break;
        }
        if (fread(ref, 1, bytes, dump) != bytes) {
            rc = dh__set_error(DH_EIO, "%s: short PyAV dump", dump_path);
            break;
        }
        dh_sample_t sample;
        dh_sample_overrides_t ovr = {plans[i].entry->frames, plans[i].entry->height,
                                     plans[i].entry->width};
        rc = dh_pipeline_decode(pipeline, plans[i].entry->path, &ovr, plans[i].entry->id, &sample);
        if (rc == 0 && sample.frames.nbytes != bytes)
            rc = dh__set_error(DH_EIO, "%s: DataHelix produced %zu bytes, PyAV %zu",
                               plans[i].entry->path, sample.frames.nbytes, bytes);
        if (rc == 0)
            ours_sum += abs_diff_sum(sample.frames.data, ref, bytes);
        dh__pipeline_recycle(pipeline, &sample); /* the next clip's frames reuse its buffer */
        if (ff_ok && ffmpeg_run(&plans[i], 1, ff, bytes) == (long long)bytes)
            ff_sum += abs_diff_sum(ff, ref, bytes);
        else
            ff_ok = 0;
        total += bytes;
        dh_free(ref);
        dh_free(ff);
        ref = ff = NULL;
    }
    dh_free(ref);
    dh_free(ff);
    dh_pipeline_destroy(&pipeline);
    if (dump)
        fclose(dump);
    if (rc == 0)
        dh__decode_peers_check(cfg, plan_path, dump_path, out);
    unlink(plan_path);
    unlink(dump_path);
    if (rc == 0 && total > 0) {
        out->check_clips = k;
        out->pixel_mad_vs_pyav = ours_sum / (double)total;
        out->pixel_mad_ffmpeg_vs_pyav = ff_ok ? ff_sum / (double)total : -1;
    }
    return rc;
}

static double median(double *v, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] > 0)
            v[k++] = v[i];
    return k ? dh_percentile_sorted_inplace(v, k, 50) : 0.0;
}

int dh_decode_bench_run(const dh_decode_bench_config_t *cfg, dh_decode_bench_result_t *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->mix, sizeof out->mix, "%s", cfg->mix);
    snprintf(out->ffmpeg_method, sizeof out->ffmpeg_method, "%s", DH_DECODE_BENCH_FFMPEG_METHOD);
    out->pixel_mad_vs_pyav = -1;
    out->pixel_mad_ffmpeg_vs_pyav = -1;
    char manifest_path[1300];
    int rc = ensure_dataset(cfg, manifest_path, sizeof manifest_path, out);
    if (rc)
        return rc;
    dh__json_use_allocator();
    dh_manifest_t *m = NULL;
    if ((rc = dh_manifest_load(manifest_path, &m)) != 0)
        return rc;
    size_t n = dh_manifest_count(m);
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.layout = DH_LAYOUT_THWC; /* packed RGB, what ffmpeg and PyAV produce */
    spec.dtype = DH_DTYPE_UINT8;
    clip_plan_t *plans = dh_calloc(n ? n : 1, sizeof *plans);
    unsigned runs = cfg->runs ? cfg->runs : 5;
    double *ours = dh_calloc(runs, sizeof *ours), *ff = dh_calloc(runs, sizeof *ff),
           *py = dh_calloc(runs, sizeof *py), *pys = dh_calloc(runs, sizeof *pys),
           *peers = dh_calloc((size_t)runs * DH_DECODE_BENCH_PEERS, sizeof *peers);
    dh__decode_peers_init(cfg, out);
    if (!plans || !ours || !ff || !py || !pys || !peers) {
        rc = DH_ENOMEM;
        goto out;
    }
    if ((rc = plan_clips(m, &spec, plans, &out->frames)) != 0)
        goto out;
    out->clips = n;
    char plan_path[1400];
    snprintf(plan_path, sizeof plan_path, "%s.pyav-plan.jsonl", manifest_path);
    int have_pyav = cfg->pyav_script && access(cfg->pyav_script, R_OK) == 0;
    if (!have_pyav)
        snprintf(out->pyav_error, sizeof out->pyav_error, "no PyAV script at %s",
                 cfg->pyav_script ? cfg->pyav_script : "(none)");
    if ((rc = write_pyav_plan(plan_path, plans, n)) != 0) { /* PyAV's and the peers' plan */
        dh__set_error(rc, "%s: cannot write: %s", plan_path, strerror(-rc));
        goto out;
    }
    dh__pin_to_current_cpu(); /* best effort: timings are noisier without */
    if ((rc = pixel_check(cfg, &spec, plans, n, manifest_path, have_pyav, out)) != 0)
        goto out;
    for (unsigned r = 0; r < runs; r++) {
        if (cfg->verbose)
            fprintf(stderr, "decode-bench: %s round %u/%u\n", cfg->mix, r + 1, runs);
        double s = run_datahelix(&spec, plans, n);
        if (s < 0) {
            rc = dh__set_error(DH_EIO, "decode-bench: DataHelix failed on %s: %s", cfg->mix,
                               dh_last_error());
            goto out;
        }
        ours[r] = (double)n / s;
        s = run_ffmpeg(plans, n);
        ff[r] = s > 0 ? (double)n / s : 0;
        if (have_pyav) {
            py[r] = run_pyav(cfg, plan_path, "", out->pyav_error, sizeof out->pyav_error);
            pys[r] =
                run_pyav(cfg, plan_path, "--skip-nonref", out->pyav_error, sizeof out->pyav_error);
        }
        dh__decode_peers_round(cfg, plan_path, out, peers, r, runs);
    }
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++) {
        dh_decode_bench_peer_t *peer = &out->peers[p];
        peer->clips_per_s = peer->reason[0] ? 0 : median(&peers[p * runs], runs);
        if (peer->reason[0])
            peer->mad_vs_pyav = -1;
        else if (peer->clips_per_s <= 0)
            snprintf(peer->reason, sizeof peer->reason, "no round produced a number");
    }
    out->datahelix_clips_per_s = median(ours, runs);
    out->ffmpeg_clips_per_s = median(ff, runs);
    out->pyav_clips_per_s = median(py, runs);
    out->pyav_skip_clips_per_s = median(pys, runs);
    if (out->pyav_clips_per_s > 0 && out->pyav_skip_clips_per_s > 0 && out->pixel_mad_vs_pyav >= 0)
        out->pyav_error[0] = '\0';
out:
    for (size_t i = 0; plans && i < n; i++) {
        dh_free(plans[i].indices);
        dh_free(plans[i].keyframes);
    }
    dh_free(plans);
    dh_free(ours);
    dh_free(ff);
    dh_free(py);
    dh_free(pys);
    dh_free(peers);
    dh_manifest_destroy(&m);
    return rc;
}
