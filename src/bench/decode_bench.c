/* decode_bench.c: `datahelix decode-bench` (see decode_bench.h, docs/pipeline.md).
 *
 * Fairness rules: the same clips, the same sampled frame indices and output size for all
 * three; one thread each (the process is pinned to one CPU, and children inherit it);
 * bilinear scaling in all three (libswscale underneath each). DataHelix and PyAV seek to
 * the keyframe before a sampled frame when one lies ahead and decode forward; the ffmpeg
 * CLI decodes the whole clip and keeps the sampled frames with its select filter, which is
 * how the CLI is used for this. The ffmpeg and PyAV outputs are counted (bytes, frames) to
 * check they produced what was asked. Wall time per round: DataHelix's in-process loop,
 * each ffmpeg process start to exit, and PyAV's own loop (interpreter start excluded).
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
#include "core/internal.h"

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

/* The data set for this mix, made once under work_dir. */
static int ensure_dataset(const dh_decode_bench_config_t *cfg, char *manifest, size_t size)
{
    char dir[1024];
    const char *base = strrchr(cfg->mix, '/');
    snprintf(dir, sizeof dir, "%s/%s-n%zu-s%llu", cfg->work_dir, base ? base + 1 : cfg->mix,
             cfg->clips, (unsigned long long)cfg->seed);
    snprintf(manifest, size, "%s/manifest.jsonl", dir);
    if (access(manifest, R_OK) == 0)
        return 0;
    dh_mix_t *mix = NULL;
    int rc = dh__make_dirs(cfg->work_dir);
    if (rc == 0)
        rc = dh_mix_load(cfg->mix, &mix);
    if (rc)
        return rc;
    int verbose = cfg->verbose;
    rc = dh_synth_dataset(dir, mix, cfg->clips, cfg->seed, 0, synth_progress, &verbose);
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
        dh_sample_clear(&sample);
        if (rc) {
            dh_pipeline_destroy(&pipeline);
            return -1;
        }
    }
    double s = dh_clock_elapsed_s(t0, dh_clock_now_ns());
    dh_pipeline_destroy(&pipeline);
    return s;
}

/* Runs ffmpeg on one clip, counting the bytes it writes. Returns the bytes, or -1. */
static long long ffmpeg_clip(const clip_plan_t *p)
{
    size_t cap = 64 + (size_t)p->frames * 24 + 256;
    char *filter = dh_malloc(cap);
    if (!filter)
        return -1;
    int len = snprintf(filter, cap, "select='");
    for (int32_t f = 0; f < p->frames; f++)
        len += snprintf(filter + len, cap - (size_t)len, "%seq(n\\,%lld)", f ? "+" : "",
                        (long long)p->indices[f]);
    snprintf(filter + len, cap - (size_t)len, "',crop=%d:%d:%d:%d,scale=%d:%d:flags=bilinear",
             p->crop_w, p->crop_h, p->crop_x, p->crop_y, p->width, p->height);
    int fds[2];
    if (pipe(fds) != 0) {
        dh_free(filter);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, STDERR_FILENO);
        execlp("ffmpeg", "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads",
               "1", "-filter_threads", "1", "-i", p->entry->path, "-vf", filter, "-fps_mode",
               "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    dh_free(filter);
    long long bytes = 0;
    char buf[1 << 16];
    ssize_t r;
    while ((r = read(fds[0], buf, sizeof buf)) > 0 || (r < 0 && errno == EINTR))
        bytes += r > 0 ? r : 0;
    close(fds[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
        return -1;
    return bytes;
}

static double run_ffmpeg(const clip_plan_t *plans, size_t n)
{
    uint64_t t0 = dh_clock_now_ns();
    for (size_t i = 0; i < n; i++) {
        long long want = (long long)plans[i].frames * plans[i].width * plans[i].height * 3;
        if (ffmpeg_clip(&plans[i]) != want)
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

/* Runs the PyAV script once; returns its clips/s, or -1 with the reason in err. */
static double run_pyav(const dh_decode_bench_config_t *cfg, const char *plan_path, char *err,
                       size_t err_size)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' 2>&1", cfg->python ? cfg->python : "python3",
             cfg->pyav_script, plan_path);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(err, err_size, "cannot run %.200s", cfg->pyav_script);
        return -1;
    }
    char out[4096] = "";
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    int status = pclose(p);
    json_error_t jerr;
    json_t *j = status == 0 ? json_loads(out, JSON_DECODE_ANY, &jerr) : NULL;
    json_t *v = j ? json_object_get(j, "clips_per_s") : NULL;
    double cps = v && json_is_number(v) ? json_number_value(v) : -1;
    json_decref(j);
    if (cps <= 0)
        snprintf(err, err_size, "%s", out[0] ? strtok(out, "\n") : "PyAV script failed");
    return cps;
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
    char manifest_path[1100];
    int rc = ensure_dataset(cfg, manifest_path, sizeof manifest_path);
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
           *py = dh_calloc(runs, sizeof *py);
    if (!plans || !ours || !ff || !py) {
        rc = DH_ENOMEM;
        goto out;
    }
    if ((rc = plan_clips(m, &spec, plans, &out->frames)) != 0)
        goto out;
    out->clips = n;
    char plan_path[1200];
    snprintf(plan_path, sizeof plan_path, "%s.pyav-plan.jsonl", manifest_path);
    int have_pyav = cfg->pyav_script && access(cfg->pyav_script, R_OK) == 0;
    if (!have_pyav)
        snprintf(out->pyav_error, sizeof out->pyav_error, "no PyAV script at %s",
                 cfg->pyav_script ? cfg->pyav_script : "(none)");
    else if ((rc = write_pyav_plan(plan_path, plans, n)) != 0) {
        dh__set_error(rc, "%s: cannot write: %s", plan_path, strerror(-rc));
        goto out;
    }
    dh__pin_to_current_cpu(); /* best effort: timings are noisier without */
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
        if (have_pyav)
            py[r] = run_pyav(cfg, plan_path, out->pyav_error, sizeof out->pyav_error);
    }
    out->datahelix_clips_per_s = median(ours, runs);
    out->ffmpeg_clips_per_s = median(ff, runs);
    out->pyav_clips_per_s = median(py, runs);
    if (out->pyav_clips_per_s > 0)
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
    dh_manifest_destroy(&m);
    return rc;
}
