/* synth_dataset.c: a synthetic data set's parallel jobs (synth.h, docs/synth.md):
 * dh_synth_dataset_encoded checks every clip first (synth_manifest.c draws them), encodes
 * with `jobs` pthreads pulling clip numbers from an atomic counter, reports progress from
 * the calling thread, and writes manifest.jsonl last.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/synth.h"
#include "core/internal.h"
#include "synth/synth_internal.h"

/* Shared between the workers and the calling thread. */
typedef struct dataset_run {
    const char *out_dir;
    const dh__synth_clip_plan_t *plans;
    size_t count;
    atomic_size_t next;   /* next clip number to take */
    atomic_bool stop;     /* a clip failed: take no more */
    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t changed;
    size_t done;
    unsigned running; /* workers still running */
    uint64_t bytes;
    size_t failed_clip; /* lowest failed clip number, count if none */
    int failed_rc;
    char failed_msg[1024]; /* its message (dh_last_error is per thread) */
} dataset_run_t;

static void *dataset_worker(void *arg)
{
    dataset_run_t *run = arg;
    size_t dir_len = strlen(run->out_dir);
    char *path = dh_malloc(dir_len + 32);
    for (;;) {
        size_t i = atomic_fetch_add(&run->next, 1);
        if (i >= run->count || atomic_load(&run->stop))
            break;
        int rc;
        struct stat st = {0};
        if (!path)
            rc = dh__set_error(DH_ENOMEM, "%s/clips/v%07zu.mp4: out of memory", run->out_dir, i);
        else {
            snprintf(path, dir_len + 32, "%s/clips/v%07zu.mp4", run->out_dir, i);
            rc = dh_synth_write_clip_encoded(path, &run->plans[i].clip, run->plans[i].encoding);
            if (rc == 0 && stat(path, &st) != 0)
                rc = dh__set_error(-errno, "%s: cannot stat: %s", path, strerror(errno));
        }
        pthread_mutex_lock(&run->lock);
        if (rc < 0) {
            atomic_store(&run->stop, true);
            if (i < run->failed_clip) {
                run->failed_clip = i;
                run->failed_rc = rc;
                snprintf(run->failed_msg, sizeof run->failed_msg, "%s", dh_last_error());
            }
        } else {
            run->done++;
            run->bytes += (uint64_t)st.st_size;
        }
        pthread_cond_signal(&run->changed);
        pthread_mutex_unlock(&run->lock);
        if (rc < 0)
            break;
    }
    dh_free(path);
    pthread_mutex_lock(&run->lock);
    run->running--;
    pthread_cond_signal(&run->changed);
    pthread_mutex_unlock(&run->lock);
    return NULL;
}

/* Number of online CPUs, at least 1. */
static unsigned cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (unsigned)n;
}

#define SYNTH_MAX_JOBS 256

int dh_synth_dataset_write(const char *out_dir, const dh_mix_t *mix, size_t count, uint64_t seed,
                           unsigned jobs, dh_synth_progress_fn progress, void *ctx,
                           dh_synth_totals_t *totals)
{
    return dh_synth_dataset_encoded(out_dir, mix, count, seed, jobs, DH_SYNTH_ENC_FLAT_B, progress,
                                    ctx, totals);
}

int dh_synth_dataset_encoded(const char *out_dir, const dh_mix_t *mix, size_t count, uint64_t seed,
                             unsigned jobs, dh_synth_encoding_t encoding,
                             dh_synth_progress_fn progress, void *ctx, dh_synth_totals_t *totals)
{
    assert(out_dir && mix);
    if (totals)
        *totals = (dh_synth_totals_t){0};
    if (mix->count == 0)
        return dh__set_error(DH_EINVAL, "mix %s: no entries", mix->name ? mix->name : "?");
    if (!dh_synth_encoding_name(encoding))
        return dh__set_error(DH_EINVAL, "%s: encoding %d: expected a dh_synth_encoding_t", out_dir,
                             (int)encoding);
    double total_weight = 0;
    for (size_t e = 0; e < mix->count; e++) {
        if (!(mix->entries[e].weight > 0) || !isfinite(mix->entries[e].weight))
            return dh__set_error(DH_EINVAL, "mix %s: entry [%zu]: weight must be > 0",
                                 mix->name ? mix->name : "?", e);
        total_weight += mix->entries[e].weight;
    }

    int rc;
    size_t dir_len = strlen(out_dir);
    char *clips_dir = dh_malloc(dir_len + sizeof "/clips");
    char *manifest = dh_malloc(dir_len + sizeof "/manifest.jsonl");
    dh__synth_clip_plan_t *plans = dh_calloc(count ? count : 1, sizeof *plans);
    pthread_t *threads = NULL;
    unsigned started = 0;
    dataset_run_t run = {.out_dir = out_dir, .plans = plans, .count = count, .failed_clip = count};
    if (!clips_dir || !manifest || !plans) {
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory planning %zu clips", out_dir, count);
        goto out;
    }
    sprintf(clips_dir, "%s/clips", out_dir);
    sprintf(manifest, "%s/manifest.jsonl", out_dir);

    /* Check every clip before creating anything: a mix entry the encoder refuses (a side
     * under 16 pixels...) fails fast, naming the first clip it would have made. */
    for (size_t i = 0; i < count; i++) {
        dh__synth_plan_clip(mix, total_weight, seed, i, &plans[i]);
        plans[i].encoding = encoding;
        int64_t frames;
        int gop;
        char name[64];
        snprintf(name, sizeof name, "clips/v%07zu.mp4 (mix entry [%zu])", i, plans[i].entry);
        if ((rc = dh__synth_clip_check(name, &plans[i].clip, &frames, &gop)) < 0)
            goto out;
    }
    if ((rc = dh__make_parent_dirs(out_dir)) < 0 || (rc = dh__synth_make_dir(out_dir)) < 0 ||
        (rc = dh__synth_make_dir(clips_dir)) < 0)
        goto out;
    if (unlink(manifest) != 0 && errno != ENOENT) {
        rc = dh__set_error(-errno, "%s: cannot remove the old manifest: %s", manifest,
                           strerror(errno));
        goto out;
    }

    if (jobs == 0)
        jobs = cpu_count();
    if (jobs > SYNTH_MAX_JOBS)
        jobs = SYNTH_MAX_JOBS;
    if (jobs > count)
        jobs = count ? (unsigned)count : 1;
    threads = dh_calloc(jobs, sizeof *threads);
    if (!threads) {
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory starting %u jobs", out_dir, jobs);
        goto out;
    }
    pthread_mutex_init(&run.lock, NULL);
    pthread_cond_init(&run.changed, NULL);
    atomic_init(&run.next, 0);
    atomic_init(&run.stop, false);
    int create_rc = 0;
    for (; started < jobs; started++) {
        pthread_mutex_lock(&run.lock);
        run.running++;
        pthread_mutex_unlock(&run.lock);
        if ((create_rc = pthread_create(&threads[started], NULL, dataset_worker, &run)) != 0) {
            pthread_mutex_lock(&run.lock);
            run.running--;
            pthread_mutex_unlock(&run.lock);
            break;
        }
    }
    if (started == 0) {
        rc = dh__set_error(-create_rc, "%s: cannot start an encoder thread: %s", out_dir,
                           strerror(create_rc));
    } else {
        /* Fewer threads than asked for is slower, not wrong. Report progress here, on the
         * calling thread, one call per finished clip. */
        size_t reported = 0;
        pthread_mutex_lock(&run.lock);
        for (;;) {
            if (reported < run.done) {
                size_t done = run.done;
                pthread_mutex_unlock(&run.lock);
                while (progress && reported < done)
                    progress(++reported, count, ctx);
                reported = done;
                pthread_mutex_lock(&run.lock);
                continue;
            }
            if (run.running == 0)
                break;
            pthread_cond_wait(&run.changed, &run.lock);
        }
        pthread_mutex_unlock(&run.lock);
        rc = 0;
    }
    for (unsigned t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
    pthread_cond_destroy(&run.changed);
    pthread_mutex_destroy(&run.lock);
    if (rc < 0)
        goto out;
    if (run.failed_clip < count) {
        rc = dh__set_error(run.failed_rc, "%s", run.failed_msg);
        goto out;
    }
    if ((rc = dh__synth_manifest_write(out_dir, plans, mix, count)) < 0)
        goto out;
    if (totals) {
        totals->clips = count;
        totals->bytes = run.bytes;
        for (size_t i = 0; i < count; i++) {
            totals->frames += plans[i].frames;
            totals->video_s += (double)plans[i].frames / plans[i].clip.fps;
        }
    }
out:
    dh_free(threads);
    dh_free(plans);
    dh_free(manifest);
    dh_free(clips_dir);
    return rc;
}

int dh_synth_dataset(const char *out_dir, const dh_mix_t *mix, size_t count, uint64_t seed,
                     unsigned jobs, dh_synth_progress_fn progress, void *ctx)
{
    return dh_synth_dataset_write(out_dir, mix, count, seed, jobs, progress, ctx, NULL);
}
