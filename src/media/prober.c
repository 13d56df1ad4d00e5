/* prober.c: `probe` over a whole manifest (see probe.h): metadata on several threads, the
 * calibrated CPU model, one profile row per readable clip, and the accuracy check.
 *
 * Cost: metadata reading is ~1 ms of CPU per MP4 clip (header and index only), spread over
 * `jobs` threads, so 100,000 clips take about a minute on 2 cores. Calibration decodes
 * clips_per_bucket clips per resolution bucket twice each, once per machine and spec (then
 * cached). Memory: one small record per entry until the rows are written.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>

#include "datahelix/alloc.h"
#include "datahelix/calibrate.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "datahelix/pipeline.h"
#include "datahelix/probe.h"
#include "datahelix/profile.h"
#include "datahelix/rng.h"
#include "datahelix/stats.h"
#include "core/internal.h"
#include "media/pipeline_internal.h"

/* What probing one entry found. */
typedef struct probed {
    int error;
    char *message;
    const char *reason; /* dh_probe_skip_t.reason */
    char codec[32];
    char bucket[32];
    int32_t src_width, src_height;
    int32_t frames, height, width;
    int64_t tokens, decoded_frames, in_bytes;
    double duration_s, fps;
    dh_decode_features_t features;
} probed_t;

typedef struct probe_job {
    const dh_manifest_t *manifest;
    const dh_pipeline_spec_t *spec;
    probed_t *results;
    atomic_size_t next, done;
} probe_job_t;

static void record_error(probed_t *p, int err)
{
    p->error = err;
    p->message = dh_strdup(dh_last_error()[0] ? dh_last_error() : dh_strerror(err));
}

static void probe_entry(const dh_pipeline_spec_t *spec, const dh_manifest_entry_t *e, probed_t *p)
{
    dh_media_info_t info;
    int rc = dh_media_probe(e->path, &info);
    if (rc != 0) {
        dh__name_tar_sample(rc, e->path, e->id); /* a tar member: sample, member, shard */
        record_error(p, rc);
        p->reason = rc == DH_ENOENT ? "missing" : "unreadable";
        return;
    }
    dh_clip_info_t clip = {.frame_count = info.frame_count,
                           .fps = info.fps,
                           .duration_s = info.duration_s,
                           .width = info.width,
                           .height = info.height};
    dh_sample_overrides_t ovr = {e->frames, e->height, e->width};
    dh_sample_plan_t plan;
    rc = dh_pipeline_plan(spec, &clip, &ovr, e->id, &plan);
    if (rc != 0) {
        dh__set_error(rc, "%s: %s", e->path, dh_last_error());
        record_error(p, rc);
        p->reason = rc == DH_ERANGE ? "too short" : "no frames";
        dh_media_info_clear(&info);
        return;
    }
    p->decoded_frames = dh_decode_frames_needed(info.keyframes, info.n_keyframes, plan.indices,
                                                (size_t)plan.frames);
    snprintf(p->codec, sizeof p->codec, "%s", info.codec);
    dh_calibration_bucket_key(&info, p->bucket, sizeof p->bucket);
    p->src_width = info.width;
    p->src_height = info.height;
    p->frames = plan.frames;
    p->height = plan.height;
    p->width = plan.width;
    p->tokens = plan.tokens;
    p->duration_s = info.duration_s;
    p->fps = info.fps;
    /* Bytes read: the share of the file the decoded frames span, plus the header and index
     * (a 64 KiB allowance), never more than the file. */
    double share = info.frame_count > 0 ? (double)p->decoded_frames / (double)info.frame_count : 1;
    double in = (double)info.file_bytes * (share < 1 ? share : 1) + 65536.0;
    p->in_bytes = (int64_t)(in < (double)info.file_bytes ? in : (double)info.file_bytes);
    p->features.decoded_px = (double)p->decoded_frames * info.width * info.height;
    p->features.output_px = (double)plan.frames * plan.height * plan.width;
    p->features.decoded_bytes = (double)info.file_bytes * (share < 1 ? share : 1);
    dh_sample_plan_clear(&plan);
    dh_media_info_clear(&info);
}

static void *probe_worker(void *arg)
{
    probe_job_t *job = arg;
    size_t n = dh_manifest_count(job->manifest);
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= n)
            break;
        probe_entry(job->spec, dh_manifest_entry(job->manifest, i), &job->results[i]);
        atomic_fetch_add(&job->done, 1);
    }
    return NULL;
}

static unsigned cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Probes every entry on `jobs` threads; the calling thread reports progress. */
static int probe_all(const dh_manifest_t *m, const dh_pipeline_spec_t *spec,
                     const dh_probe_options_t *opt, probed_t *results)
{
    size_t n = dh_manifest_count(m);
    unsigned jobs = opt->jobs ? opt->jobs : cpu_count();
    if (jobs > 64)
        jobs = 64;
    if (jobs > n)
        jobs = n ? (unsigned)n : 1;
    probe_job_t job = {.manifest = m, .spec = spec, .results = results};
    atomic_init(&job.next, 0);
    atomic_init(&job.done, 0);
    pthread_t threads[64];
    unsigned started = 0;
    for (; started < jobs; started++)
        if (pthread_create(&threads[started], NULL, probe_worker, &job) != 0)
            break;
    if (started == 0) /* no thread could start: do the work here */
        probe_worker(&job);
    /* Progress every 100 ms until the workers finish (a report, not a synchronisation:
     * pthread_join below is what waits). */
    while (started && atomic_load(&job.done) < n) {
        if (opt->progress)
            opt->progress("probe", atomic_load(&job.done), n, opt->ctx);
        sleep_ms(100);
    }
    for (unsigned t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
    if (opt->progress)
        opt->progress("probe", n, n, opt->ctx);
    return 0;
}

/* "CPU model|FFmpeg version|spec hash": what a calibration is valid for. */
static void machine_key(const dh_pipeline_spec_t *spec, char *key, size_t size)
{
    char model[256] = "unknown-cpu";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                char *colon = strchr(line, ':');
                if (colon) {
                    snprintf(model, sizeof model, "%s", colon + 2);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        fclose(f);
    }
    char *json = dh_pipeline_spec_to_json(spec);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the spec */
    for (const char *c = json ? json : ""; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    dh_free(json);
    snprintf(key, size, "%s|%s|spec-%016llx", model, LIBAVCODEC_IDENT, (unsigned long long)h);
}

/* CPU seconds of decoding one entry: the smaller of two decodes (the first also warms the
 * page cache and the decoder's allocations). Returns 0 or the decode's error. */
static int time_decode(dh_pipeline_t *pipeline, const dh_manifest_entry_t *e, double *cpu_s)
{
    dh_sample_overrides_t ovr = {e->frames, e->height, e->width};
    double best = INFINITY;
    for (int run = 0; run < 2; run++) {
        dh_sample_t sample;
        uint64_t t0 = dh_clock_thread_cpu_ns();
        int rc = dh_pipeline_decode(pipeline, e->path, &ovr, e->id, &sample);
        double s = dh_clock_elapsed_s(t0, dh_clock_thread_cpu_ns());
        dh_sample_clear(&sample);
        if (rc != 0)
            return rc;
        if (s < best)
            best = s;
    }
    *cpu_s = best > 1e-6 ? best : 1e-6;
    return 0;
}

/* Times up to opt->clips_per_bucket entries of each bucket in `buckets_to_time` (NULL =
 * all buckets) and fits (fit = 1) or adds bucket ratios to *cal. */
static int calibrate(const dh_manifest_t *m, const dh_pipeline_spec_t *spec,
                     const dh_probe_options_t *opt, const probed_t *results, int fit,
                     dh_calibration_t *cal, size_t *decodes)
{
    size_t n = dh_manifest_count(m);
    unsigned per_bucket = opt->clips_per_bucket ? opt->clips_per_bucket : 3;
    size_t *order = dh_calloc(n ? n : 1, sizeof *order);
    dh_decode_features_t *features = dh_calloc(n ? n : 1, sizeof *features);
    const char **buckets = dh_calloc(n ? n : 1, sizeof *buckets);
    double *measured = dh_calloc(n ? n : 1, sizeof *measured);
    dh_pipeline_t *pipeline = NULL;
    int rc = (!order || !features || !buckets || !measured) ? DH_ENOMEM : 0;
    if (rc == 0)
        rc = dh_pipeline_new(&pipeline, spec);
    size_t chosen = 0, timed = 0;
    if (rc == 0) {
        /* A seeded shuffle of the readable entries, then the first per_bucket of each
         * bucket that needs timing: a random but reproducible choice. */
        for (size_t i = 0; i < n; i++)
            if (!results[i].error && (fit || !dh_calibration_has_bucket(cal, results[i].bucket)))
                order[chosen++] = i;
        dh_rng_t rng;
        dh_rng_seed(&rng, opt->seed);
        for (size_t i = chosen; i > 1; i--) {
            size_t j = (size_t)dh_rng_below(&rng, i);
            size_t t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        size_t picked = 0;
        for (size_t i = 0; i < chosen; i++) {
            unsigned same = 0;
            for (size_t j = 0; j < picked; j++)
                same += strcmp(results[order[j]].bucket, results[order[i]].bucket) == 0;
            if (same < per_bucket)
                order[picked++] = order[i];
        }
        for (size_t i = 0; i < picked; i++) {
            const probed_t *p = &results[order[i]];
            if (opt->progress)
                opt->progress("calibrate", i, picked, opt->ctx);
            double cpu_s;
            if (time_decode(pipeline, dh_manifest_entry(m, order[i]), &cpu_s) != 0)
                continue; /* a clip that does not decode says nothing about cost */
            features[timed] = p->features;
            buckets[timed] = p->bucket;
            measured[timed] = cpu_s;
            timed++;
        }
        if (opt->progress)
            opt->progress("calibrate", picked, picked, opt->ctx);
        *decodes = picked;
        if (timed > 0)
            rc = fit ? dh_calibration_fit(features, buckets, measured, timed, cal)
                     : dh_calibration_add_buckets(features, buckets, measured, timed, cal);
    }
    dh_pipeline_destroy(&pipeline);
    dh_free(order);
    dh_free(features);
    dh_free(buckets);
    dh_free(measured);
    return rc;
}

/* Rough text tokens of a caption: one per 4 bytes, as BPE tokenizers give for English. */
/* The caption's tokens: the manifest's "text_tokens" (the user's tokenizer), else one token
 * per 4 bytes. */
static int64_t caption_tokens(const dh_manifest_entry_t *e)
{
    return e->text_tokens >= 0 ? e->text_tokens : (int64_t)((strlen(e->caption) + 3) / 4);
}

static int append_row(dh_profile_set_t *out, const dh_pipeline_spec_t *spec,
                      const dh_manifest_entry_t *e, const probed_t *p, const dh_calibration_t *cal)
{
    char key[64], extra[256];
    snprintf(key, sizeof key, "f%dx%dx%d", p->frames, p->height, p->width);
    snprintf(extra, sizeof extra,
             "{\"src_width\":%d,\"src_height\":%d,\"decoded_frames\":%lld,\"bucket\":\"%s\"}",
             p->src_width, p->src_height, (long long)p->decoded_frames, p->bucket);
    int64_t text_len = caption_tokens(e);
    dh_profile_row_t row = {
        .id = e->id,
        .uri = e->path,
        .profile_key = key,
        .frames = p->frames,
        .height = p->height,
        .width = p->width,
        .tokens_est = p->tokens + text_len,
        .cpu_s_est = dh_calibration_predict(cal, p->bucket, &p->features),
        .in_bytes = p->in_bytes,
        .out_bytes =
            (int64_t)p->frames * p->height * p->width * 3 * (int64_t)dh_dtype_size(spec->dtype),
        .duration_s = p->duration_s,
        .fps = p->fps,
        .text_len = text_len,
        .codec = p->codec,
        .extra = extra,
    };
    return dh_profile_set_add(out, &row);
}

void dh_probe_report_clear(dh_probe_report_t *report)
{
    for (size_t i = 0; i < report->n_skips; i++)
        dh_free(report->skips[i].message);
    dh_free(report->skips);
    dh_free(report->entry_of_row);
    memset(report, 0, sizeof *report);
}

int dh_probe_manifest(const dh_manifest_t *m, const dh_pipeline_spec_t *spec,
                      const dh_probe_options_t *options, dh_profile_set_t *out,
                      dh_probe_report_t *report)
{
    dh_probe_options_t opt = options ? *options : (dh_probe_options_t){0};
    memset(report, 0, sizeof *report);
    size_t n = dh_manifest_count(m);
    probed_t *results = dh_calloc(n ? n : 1, sizeof *results);
    report->entry_of_row = dh_calloc(n ? n : 1, sizeof *report->entry_of_row);
    report->skips = dh_calloc(n ? n : 1, sizeof *report->skips);
    if (!results || !report->entry_of_row || !report->skips) {
        dh_free(results);
        dh_probe_report_clear(report);
        return dh__set_error(DH_ENOMEM, "probe: out of memory for %zu entries", n);
    }
    int rc = probe_all(m, spec, &opt, results);

    /* Calibration: from the cache when it has this machine and spec, timing only what it
     * lacks; else from scratch. */
    if (opt.calibration_path)
        snprintf(report->calibration_path, sizeof report->calibration_path, "%s",
                 opt.calibration_path);
    else
        dh_calibration_default_path(report->calibration_path, sizeof report->calibration_path);
    machine_key(spec, report->machine_key, sizeof report->machine_key);
    dh_calibration_t cal = {0};
    int cached = !opt.recalibrate &&
                 dh_calibration_load(report->calibration_path, report->machine_key, &cal) == 0;
    size_t readable = 0, missing = 0;
    for (size_t i = 0; i < n; i++)
        if (!results[i].error) {
            readable++;
            missing += !dh_calibration_has_bucket(&cal, results[i].bucket);
        }
    report->calibration_cached = cached;
    if (rc == 0 && readable > 0 && (!cached || missing > 0)) {
        rc = calibrate(m, spec, &opt, results, !cached, &cal, &report->calibration_decodes);
        if (rc == 0 && report->calibration_decodes > 0) {
            int save_rc = dh_calibration_save(report->calibration_path, report->machine_key, &cal);
            if (save_rc != 0) /* the estimates stand; only the cache is lost */
                fprintf(stderr, "datahelix probe: warning: %s\n", dh_last_error());
        }
    }

    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (results[i].error) {
            report->skips[report->n_skips++] =
                (dh_probe_skip_t){i, results[i].error, results[i].message, results[i].reason};
            results[i].message = NULL;
            continue;
        }
        rc = append_row(out, spec, dh_manifest_entry(m, i), &results[i], &cal);
        if (rc == 0)
            report->entry_of_row[report->rows++] = i;
    }
    for (size_t i = 0; i < n; i++)
        dh_free(results[i].message);
    dh_free(results);
    return rc;
}

int dh_probe_check(const dh_manifest_t *m, const dh_pipeline_spec_t *spec,
                   const dh_profile_set_t *rows, const size_t *entry_of_row, size_t count,
                   uint64_t seed, dh_probe_progress_fn progress, void *ctx, double *median_rel_err,
                   double *p90_rel_err, size_t *checked)
{
    size_t n = dh_profile_set_count(rows);
    if (count > n)
        count = n;
    *checked = 0;
    size_t *order = dh_calloc(n ? n : 1, sizeof *order);
    double *errors = dh_calloc(count ? count : 1, sizeof *errors);
    dh_pipeline_t *pipeline = NULL;
    int rc = (!order || !errors) ? DH_ENOMEM : dh_pipeline_new(&pipeline, spec);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        dh_rng_t rng;
        dh_rng_seed(&rng, seed);
        for (size_t i = 0; i < count; i++) { /* partial Fisher-Yates: the first count */
            size_t j = i + (size_t)dh_rng_below(&rng, n - i);
            size_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (size_t i = 0; i < count; i++) {
            if (progress)
                progress("check", i, count, ctx);
            const dh_profile_row_t *row = dh_profile_set_row(rows, order[i]);
            double measured;
            if (time_decode(pipeline, dh_manifest_entry(m, entry_of_row[order[i]]), &measured) != 0)
                continue;
            errors[(*checked)++] = fabs(row->cpu_s_est - measured) / measured;
        }
        if (progress)
            progress("check", count, count, ctx);
        if (*checked == 0)
            rc = dh__set_error(DH_EINVAL, "probe check: no clip could be decoded");
        else {
            *median_rel_err = dh_percentile_sorted_inplace(errors, *checked, 50);
            *p90_rel_err = dh_percentile_sorted_inplace(errors, *checked, 90);
        }
    }
    dh_pipeline_destroy(&pipeline);
    dh_free(order);
    dh_free(errors);
    return rc;
}
