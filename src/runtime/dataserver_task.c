/* dataserver_task.c: runs one dispatched request through a DataServer's pipeline
 * (docs/design.md §6).
 *
 * Video: each sample's file is read once, timed (the read bandwidth C_io learns from), then
 * decoded by the native pipeline (pipeline.h) on this worker thread, the batch is collated
 * (padding and masks), and its tensors are copied once into the output buffers the caller
 * hands out (arena slabs or heap). The copy costs about 1 ms per 10 MB against decode times
 * of 10-1000 ms; collating straight into the slab is left for later (the batch's padded
 * size is known only after every sample is decoded).
 * Synthetic: each sample "costs" its actual cost (x cpu_scale) by sleeping (one 2-core
 * machine then emulates many virtual cores), spinning, or not at all, and produces
 * out_bytes (x bytes_scale) of payload that starts with the sample id (so receivers can
 * check they got the right bytes). A uri starting with "error:" fails that sample, which is
 * how scheduling tests exercise the per-sample error path without video files. The actual
 * cost and tokens are the descriptor's estimates times seeded mean-one lognormal noise
 * (model/model_lib.h; none by default), so schedulers that see only the estimates mispredict. Each
 * sample's measured CPU seconds go into the result (sample_cpu_s): the executor's COMPLETE carries
 * them to the coordinator's cost model.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "media/media_lib.h"
#include "runtime/descriptor.h"
#include "runtime/dataserver_pyworker.h"
#include "runtime/rt.h"

struct dh__rt_worker {
    dh__rt_pipeline_t spec;
    dh_pipeline_t *pipeline; /* video only */
    dh__py_worker_t *py;     /* python only */
    uint8_t *read_buf;       /* video: READ_CHUNK bytes for timing reads, made on first use */
    dh__rt_watch_t *watch;   /* video in a DataServer: its thread's deadlines, or NULL */
    double timeout_s;        /* sample_timeout (0: no limit) */
};

/* Video inputs are read once, timed, before decoding (time_read), at most READ_CAP bytes
 * of each, READ_CHUNK at a time. */
#define READ_CHUNK ((size_t)1 << 20)
#define READ_CAP ((uint64_t)64 << 20)

static int parse_synthetic(json_t *root, const char *source, dh__rt_pipeline_t *out)
{
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "type") == 0)
            continue;
        if (strcmp(key, "cost") == 0) {
            const char *s = json_string_value(value);
            if (s && strcmp(s, "sleep") == 0)
                out->cost = DH__SYNTH_SLEEP;
            else if (s && strcmp(s, "spin") == 0)
                out->cost = DH__SYNTH_SPIN;
            else if (s && strcmp(s, "none") == 0)
                out->cost = DH__SYNTH_NONE;
            else
                return dh__set_error(DH_ESCHEMA,
                                     "%s: field 'cost': expected \"sleep\", \"spin\" or \"none\"",
                                     source);
        } else if (strcmp(key, "cpu_scale") == 0 || strcmp(key, "bytes_scale") == 0) {
            double v = json_number_value(value);
            if (!json_is_number(value) || !(v >= 0) || v > 1e6)
                return dh__set_error(DH_ESCHEMA, "%s: field '%s': expected a number in [0, 1e6]",
                                     source, key);
            if (key[0] == 'c')
                out->cpu_scale = v;
            else
                out->bytes_scale = v;
        } else if (strcmp(key, "cost_bias") == 0 || strcmp(key, "cost_noise") == 0 ||
                   strcmp(key, "token_noise") == 0) {
            double v = json_number_value(value);
            if (!json_is_number(value) || !(v >= 0) || v > DH__NOISE_SIGMA_MAX)
                return dh__set_error(DH_ESCHEMA,
                                     "%s: field '%s': expected a sigma in [0, 4] (0 = no noise)",
                                     source, key);
            if (strcmp(key, "cost_bias") == 0)
                out->noise.cost_bias = v;
            else if (strcmp(key, "cost_noise") == 0)
                out->noise.cost_noise = v;
            else
                out->noise.token_noise = v;
        } else if (strcmp(key, "noise_seed") == 0) {
            if (!json_is_integer(value) || json_integer_value(value) < 0)
                return dh__set_error(DH_ESCHEMA, "%s: field 'noise_seed': expected an integer >= 0",
                                     source);
            out->noise.seed = (uint64_t)json_integer_value(value);
        } else {
            return dh__set_error(DH_ESCHEMA,
                                 "%s: field '%s': unknown field of a synthetic pipeline (known: "
                                 "type, cost, cpu_scale, bytes_scale, cost_bias, cost_noise, "
                                 "token_noise, noise_seed)",
                                 source, key);
        }
    }
    return 0;
}

static int copy_field(const char *source, const char *key, const char *value, char *out, size_t cap)
{
    if (!value || !value[0] || strlen(value) >= cap)
        return dh__set_error(DH_ESCHEMA,
                             "%s: field '%s': expected a non-empty string under %zu bytes", source,
                             key, cap);
    memcpy(out, value, strlen(value) + 1);
    return 0;
}

static int parse_python(json_t *root, const char *source, dh__rt_pipeline_t *out)
{
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        int rc = 0;
        if (strcmp(key, "type") == 0)
            continue;
        if (strcmp(key, "dataset") == 0) {
            rc = copy_field(source, key, json_string_value(value), out->py_dataset,
                            sizeof out->py_dataset);
        } else if (strcmp(key, "python") == 0) {
            rc = copy_field(source, key, json_string_value(value), out->py_exe, sizeof out->py_exe);
        } else if (strcmp(key, "path") == 0) {
            size_t used = 0, i;
            json_t *dir;
            if (!json_is_array(value))
                return dh__set_error(DH_ESCHEMA, "%s: field 'path': expected a list of directories",
                                     source);
            json_array_foreach(value, i, dir)
            {
                const char *d = json_string_value(dir);
                size_t len = d ? strlen(d) : 0;
                if (!d || !len || strchr(d, ':') || used + len + 2 > sizeof out->py_path)
                    return dh__set_error(DH_ESCHEMA,
                                         "%s: field 'path': entry %zu is not a directory name "
                                         "without ':' (or the list is over %zu bytes)",
                                         source, i, sizeof out->py_path);
                if (used)
                    out->py_path[used++] = ':';
                memcpy(out->py_path + used, d, len + 1);
                used += len;
            }
        } else if (strcmp(key, "seed") == 0) {
            if (!json_is_integer(value) || json_integer_value(value) < 0)
                return dh__set_error(DH_ESCHEMA, "%s: field 'seed': expected an integer >= 0",
                                     source);
            out->py_seed = (uint64_t)json_integer_value(value);
        } else if (strcmp(key, "sample_timeout") == 0) {
            if (!json_is_number(value) || !(json_number_value(value) >= 0) ||
                json_number_value(value) > 1e7)
                return dh__set_error(DH_ESCHEMA,
                                     "%s: field 'sample_timeout': expected seconds in [0, 1e7] "
                                     "(0: no limit)",
                                     source);
            out->sample_timeout_s = json_number_value(value);
        } else {
            return dh__set_error(DH_ESCHEMA,
                                 "%s: field '%s': unknown field of a python pipeline (known: "
                                 "type, dataset, python, path, seed, sample_timeout)",
                                 source, key);
        }
        if (rc)
            return rc;
    }
    if (!out->py_dataset[0])
        return dh__set_error(DH_ESCHEMA,
                             "%s: a python pipeline needs 'dataset': \"pickle:PATH\" or "
                             "\"MODULE:FACTORY\"",
                             source);
    return 0;
}

int dh__rt_pipeline_load(const char *json, const char *path, dh__rt_pipeline_t *out)
{
    memset(out, 0, sizeof *out);
    dh_pipeline_spec_defaults(&out->video);
    out->cost = DH__SYNTH_SLEEP;
    out->cpu_scale = 1.0;
    out->bytes_scale = 1.0;
    out->sample_timeout_s = 300;
    if (!json && !path)
        return 0;
    const char *source = json ? "pipeline spec" : path;
    dh__json_track_begin();
    json_error_t jerr;
    json_t *root = json ? json_loads(json, 0, &jerr) : json_load_file(path, 0, &jerr);
    /* jansson reports some failed allocations as syntax errors, or not at all */
    if (dh__json_track_failed() || (!root && json_error_code(&jerr) == json_error_out_of_memory)) {
        json_decref(root);
        return dh__set_error(DH_ENOMEM, "%s: out of memory", source);
    }
    if (!root) {
        if (path && !json && access(path, R_OK) != 0)
            return dh__set_error(-errno, "%s: cannot read the pipeline spec: %s", path,
                                 strerror(errno));
        return dh__set_error(DH_EPARSE, "%s:%d: %s", source, jerr.line, jerr.text);
    }
    int rc = 0;
    if (!json_is_object(root)) {
        rc = dh__set_error(DH_ESCHEMA, "%s: a pipeline spec is a JSON object", source);
        goto done;
    }
    json_t *type = json_object_get(root, "type");
    const char *type_name = type ? json_string_value(type) : "video";
    if (!type_name || (strcmp(type_name, "video") != 0 && strcmp(type_name, "synthetic") != 0 &&
                       strcmp(type_name, "python") != 0)) {
        rc = dh__set_error(DH_ESCHEMA,
                           "%s: field 'type': expected \"video\", \"synthetic\" or \"python\"",
                           source);
        goto done;
    }
    if (strcmp(type_name, "python") == 0) {
        out->python = true;
        rc = parse_python(root, source, out);
        goto done;
    }
    if (strcmp(type_name, "synthetic") == 0) {
        out->synthetic = true;
        rc = parse_synthetic(root, source, out);
        goto done;
    }
    json_object_del(root, "type");
    json_t *timeout = json_object_get(root, "sample_timeout");
    if (timeout) { /* the runtime's (dataserver_work.c), not the decoder's */
        if (!json_is_number(timeout) || !(json_number_value(timeout) >= 0) ||
            json_number_value(timeout) > 1e7) {
            rc = dh__set_error(DH_ESCHEMA,
                               "%s: field 'sample_timeout': expected seconds in [0, 1e7] (0: no "
                               "limit)",
                               source);
            goto done;
        }
        out->sample_timeout_s = json_number_value(timeout);
        json_object_del(root, "sample_timeout");
    }
    char *text = json_dumps(root, JSON_COMPACT);
    if (!text || dh__json_track_failed()) { /* a failed allocation can leave text cut short */
        dh_free(text);
        rc = dh__set_error(DH_ENOMEM, "out of memory for the pipeline spec");
        goto done;
    }
    rc = dh_pipeline_spec_parse(text, strlen(text), source, &out->video);
    dh_free(text);
done:
    json_decref(root);
    return rc;
}

int dh__rt_worker_new(dh__rt_worker_t **out, const dh__rt_pipeline_t *pipeline)
{
    *out = NULL;
    dh__rt_worker_t *w = dh_calloc(1, sizeof *w);
    if (!w)
        return dh__set_error(DH_ENOMEM, "out of memory for a worker");
    w->spec = *pipeline;
    if (pipeline->python) {
        int rc = dh__py_worker_new(&w->py, pipeline);
        if (rc) {
            dh_free(w);
            return rc;
        }
    } else if (!pipeline->synthetic) {
        int rc = dh_pipeline_new(&w->pipeline, &pipeline->video);
        if (rc) {
            dh_free(w);
            return rc;
        }
    }
    *out = w;
    return 0;
}

void dh__rt_worker_bind(dh__rt_worker_t *w, uint32_t index, uint32_t n, int arena_fd,
                        const atomic_int *stop)
{
    if (w && w->py)
        dh__py_worker_bind(w->py, index, n, arena_fd, stop);
}

void dh__rt_worker_watch(dh__rt_worker_t *w, dh__rt_watch_t *watch, double timeout_s)
{
    if (w && w->pipeline && timeout_s > 0) {
        w->watch = watch;
        w->timeout_s = timeout_s;
    }
}

void dh__rt_worker_destroy(dh__rt_worker_t **pw)
{
    if (!pw || !*pw)
        return;
    dh__py_worker_destroy(&(*pw)->py);
    dh_pipeline_destroy(&(*pw)->pipeline);
    dh_free((*pw)->read_buf);
    dh_free(*pw);
    *pw = NULL;
}

void dh__rt_result_clear(dh__rt_result_t *r)
{
    for (uint32_t i = 0; i < r->n_samples && r->samples; i++) {
        dh_free(r->samples[i].id);
        dh_free(r->samples[i].error);
    }
    dh_free(r->samples);
    dh_free(r->sample_cpu_s);
    memset(r, 0, sizeof *r);
}

static void spin_for(double seconds)
{
    uint64_t end = dh_clock_thread_cpu_ns() + (uint64_t)(seconds * 1e9);
    volatile uint64_t x = 0; /* volatile: the busy loop is not optimised away */
    while (dh_clock_thread_cpu_ns() < end)
        for (int i = 0; i < 1000; i++)
            x += (uint64_t)i;
    (void)x; /* read once, so clang does not call it set but unused */
}

static void sleep_for(double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int execute_synthetic(dh__rt_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                             dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx,
                             dh__rt_result_t *out)
{
    uint64_t total = 0;
    uint64_t cpu0 = dh_clock_thread_cpu_ns();
    double emulated = 0;
    uint64_t *sizes = dh_calloc(n ? n : 1, sizeof *sizes);
    if (!sizes)
        return dh__set_error(DH_ENOMEM, "out of memory for a synthetic task");
    for (uint32_t i = 0; i < n; i++) {
        dh_wire_sample_result_t *r = &out->samples[i];
        const char *uri = samples[i].uri ? samples[i].uri : "";
        double cost =
            dh__noise_cpu_s(&w->spec.noise, samples[i].id, samples[i].key, samples[i].cpu_s) *
            w->spec.cpu_scale;
        if (w->spec.cost == DH__SYNTH_SLEEP) {
            sleep_for(cost);
            emulated += cost;
            out->sample_cpu_s[i] = cost;
        } else if (w->spec.cost == DH__SYNTH_SPIN) {
            uint64_t spun0 = dh_clock_thread_cpu_ns();
            spin_for(cost);
            out->sample_cpu_s[i] = (double)(dh_clock_thread_cpu_ns() - spun0) / 1e9;
        }
        if (strncmp(uri, "error:", 6) == 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "sample '%s' (%s): synthetic decode error", r->id, uri);
            r->status = DH_EIO;
            r->error = dh_strdup(msg);
            if (!r->error) {
                dh_free(sizes);
                return dh__set_error(DH_ENOMEM, "out of memory for an error message");
            }
            out->failed++;
            continue;
        }
        sizes[i] = (uint64_t)((double)samples[i].out_bytes * w->spec.bytes_scale);
        total += sizes[i];
        r->tokens = dh__noise_tokens(&w->spec.noise, samples[i].id, samples[i].tokens);
    }
    out->cpu_s = w->spec.cost == DH__SYNTH_SLEEP ? emulated
                                                 : (double)(dh_clock_thread_cpu_ns() - cpu0) / 1e9;
    /* sizes: B int64 (bytes of each sample's payload), then the payload (if any), the
     * samples' bytes back to back. Both join correctly along dimension 0 across microbatches. */
    dh__rt_tensor_t *sizes_out = &out->tensors[out->n_tensors];
    dh_tensor_t *sizes_t = &sizes_out->tensor;
    dh_tensor_set_name(sizes_t, "sizes");
    sizes_t->dtype = DH_DTYPE_INT64;
    sizes_t->ndim = 1;
    sizes_t->shape[0] = n;
    dh_tensor_set_contiguous(sizes_t);
    int rc = alloc(ctx, sizes_t->nbytes ? sizes_t->nbytes : 1, &sizes_t->data, &sizes_out->handle);
    if (rc) {
        dh_free(sizes);
        return rc;
    }
    out->n_tensors++;
    int64_t *sz = sizes_t->data;
    for (uint32_t i = 0; i < n; i++)
        sz[i] = (int64_t)sizes[i];
    if (total > 0) {
        dh__rt_tensor_t *payload_out = &out->tensors[out->n_tensors];
        dh_tensor_t *payload = &payload_out->tensor;
        dh_tensor_set_name(payload, "payload");
        payload->dtype = DH_DTYPE_UINT8;
        payload->ndim = 1;
        payload->shape[0] = (int64_t)total;
        dh_tensor_set_contiguous(payload);
        rc = alloc(ctx, payload->nbytes, &payload->data, &payload_out->handle);
        if (rc) {
            release(ctx, sizes_t->data, &sizes_out->handle);
            out->n_tensors = 0;
            dh_free(sizes);
            return rc;
        }
        out->n_tensors++;
        /* Only the first bytes are written: the id, so a receiver can check the bytes are
         * the sample's. The rest is whatever the buffer held (synthetic data). */
        uint8_t *p = payload->data;
        for (uint32_t i = 0; i < n; i++) {
            size_t len = strlen(out->samples[i].id);
            if (len > sizes[i])
                len = (size_t)sizes[i];
            memcpy(p, out->samples[i].id, len);
            p += sizes[i];
        }
    }
    out->bytes = sizes_t->nbytes + total;
    dh_free(sizes);
    return 0;
}

/* Places a collated tensor in an output buffer: the tensor as it is, its bytes copied once. */
static int place_tensor(const dh_tensor_t *src, dh__rt_alloc_fn *alloc, void *ctx,
                        dh__rt_tensor_t *out)
{
    out->tensor = *src;
    out->tensor.data = NULL;
    if (src->nbytes == 0)
        return 0;
    int rc = alloc(ctx, src->nbytes, &out->tensor.data, &out->handle);
    if (rc)
        return rc;
    memcpy(out->tensor.data, src->data, src->nbytes);
    return 0;
}

/* dh_collate_into's allocator over a task's: the handle says where the frames went. */
typedef struct place_ctx {
    dh__rt_alloc_fn *alloc;
    void *ctx;
    dh_shm_handle_t handle;
} place_ctx_t;

static int place_alloc(void *ctx, size_t nbytes, void **data)
{
    place_ctx_t *pc = ctx;
    return pc->alloc(pc->ctx, nbytes, data, &pc->handle);
}

/* C_io's measurement (docs/design.md §4.1): FFmpeg reads inside the decoder, where reads
 * cannot be timed apart from decoding, so the input is read once here, sequentially and
 * timed, and the decoder then finds it in the page cache. The bandwidth it gives (bytes /
 * wall seconds) is what the heartbeat reports: the disk's for a cold file, memory's for a
 * cached one. Costs one copy of the input (about 0.1 ms per MB, against decode times of
 * 10-1000 ms per sample). A file that cannot be opened is left to the decoder to report. */
static void time_read(dh__rt_worker_t *w, const char *path, double *read_s, uint64_t *read_bytes)
{
    if (!w->read_buf && !(w->read_buf = dh_malloc(READ_CHUNK)))
        return;           /* no scratch: this sample is not timed */
    long long start, end; /* a tar member's byte range, read where it lies */
    const char *file = dh__subfile_range(path, &start, &end);
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    uint64_t cap =
        start >= 0 && end - start < (long long)READ_CAP ? (uint64_t)(end - start) : READ_CAP;
    uint64_t t0 = dh_clock_now_ns(), total = 0;
    ssize_t got;
    while (
        total < cap &&
        (got = pread(fd, w->read_buf, cap - total < READ_CHUNK ? (size_t)(cap - total) : READ_CHUNK,
                     (off_t)(start > 0 ? start : 0) + (off_t)total)) > 0)
        total += (uint64_t)got;
    double elapsed = dh_clock_elapsed_s(t0, dh_clock_now_ns());
    close(fd);
    if (total > 0 && elapsed > 0) {
        *read_s += elapsed;
        *read_bytes += total;
    }
}

static int execute_video(dh__rt_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                         dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx,
                         dh__rt_result_t *out)
{
    uint64_t cpu0 = dh_clock_thread_cpu_ns();
    dh_sample_t *decoded = dh_calloc(n ? n : 1, sizeof *decoded);
    if (!decoded)
        return dh__set_error(DH_ENOMEM, "out of memory for a video task");
    int rc = 0;
    /* What each sample waits for remote bytes: the remote reader adds to this thread's tally
     * (core/internal.h, "The fetch tally"); a local file leaves it 0. Unbound at `done`. */
    dh__fetch_tally_t tally;
    dh__fetch_tally_t *outer_tally = dh__fetch_tally_bind(&tally);
    for (uint32_t i = 0; i < n; i++) {
        dh_sample_overrides_t ov = dh__rt_overrides_of_sample(&samples[i]);
        tally = (dh__fetch_tally_t){0};
        /* Under a deadline (a watch), the blocking part below may be abandoned: it reads
         * only its own copies of the sample's id and path (samples[] is the task's). */
        char *path = dh_strdup(samples[i].uri ? samples[i].uri : "");
        char *id = dh_strdup(samples[i].id ? samples[i].id : "");
        if (!path || !id) {
            dh_free(path);
            dh_free(id);
            rc = dh__set_error(DH_ENOMEM, "out of memory for a video task");
            goto done;
        }
        uint64_t since = dh_clock_now_ns();
        bool abandoned = false;
        if (w->watch) {
            dh__decode_set_deadline(since + (uint64_t)(w->timeout_s * 1e9));
            dh__rt_watch_enter(w->watch, i, id, path, "open or read", since);
        }
        time_read(w, path, &out->read_s, &out->read_bytes);
        if (w->watch && (abandoned = dh__rt_watch_leave(w->watch)) == false)
            dh__rt_watch_enter(w->watch, i, id, path, "decode", since);
        uint64_t sample_cpu0 = dh_clock_thread_cpu_ns();
        int drc = abandoned ? 0 : dh_pipeline_decode(w->pipeline, path, &ov, id, &decoded[i]);
        if (w->watch && !abandoned) {
            abandoned = dh__rt_watch_leave(w->watch);
            dh__decode_set_deadline(0);
            double took = dh_clock_elapsed_s(since, dh_clock_now_ns());
            if (!abandoned && drc < 0 && drc != DH_ENOMEM && took >= w->timeout_s) {
                /* FFmpeg gave up by itself (its interrupt callback): say why */
                char msg[1024];
                snprintf(msg, sizeof msg,
                         "sample '%s' (%s): decode ran past sample_timeout %g s (stopped after "
                         "%.1f s): %s",
                         id, path, w->timeout_s, took,
                         decoded[i].error_message ? decoded[i].error_message : "");
                dh_free(decoded[i].error_message);
                decoded[i].error_message = dh_strdup(msg);
            }
        }
        dh_free(path);
        dh_free(id);
        if (abandoned) { /* the task is someone else's now: only our own memory */
            rc = DH__RT_ABANDONED;
            goto done;
        }
        /* The sample's own CPU time (open, demux, decode, resize); the timed read above and
         * the batch's collate and copy below are in the request's total only. */
        out->sample_cpu_s[i] = (double)(dh_clock_thread_cpu_ns() - sample_cpu0) / 1e9;
        out->samples[i].fetch_s = (double)tally.wait_ns / 1e9;
        out->samples[i].fetch_bytes = tally.bytes;
        if (drc == DH_ENOMEM) {
            rc = drc;
            goto done;
        }
    }
    dh_batch_t *batch = NULL;
    const dh_pipeline_spec_t *spec = dh_pipeline_spec(w->pipeline);
    /* The frames are collated straight into the output (an arena slab, or the heap for
     * another node): one copy of the batch, and no second batch-sized buffer. */
    place_ctx_t pc = {alloc, ctx, {0}};
    rc = dh_collate_into(decoded, n, spec->dtype, spec->layout, place_alloc, &pc, &batch);
    if (rc)
        goto done;
    if (batch->frames.data) { /* an all-failed batch has empty tensors: left out */
        out->tensors[0].tensor = batch->frames;
        out->tensors[0].handle = pc.handle;
        out->n_tensors = 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        dh_wire_sample_result_t *r = &out->samples[i];
        r->tokens = batch->errors[i] ? 0 : batch->tokens[i];
        if (batch->errors[i]) {
            r->status = batch->errors[i];
            r->error = dh_strdup(batch->error_messages[i] ? batch->error_messages[i]
                                                          : dh_strerror(batch->errors[i]));
            if (!r->error) {
                rc = dh__set_error(DH_ENOMEM, "out of memory for an error message");
                break;
            }
            out->failed++;
        }
    }
    if (rc == 0 && batch->mask.nbytes) {
        rc = place_tensor(&batch->mask, alloc, ctx, &out->tensors[out->n_tensors]);
        if (rc == 0)
            out->n_tensors++;
    }
    if (rc) {
        for (size_t t = 0; t < out->n_tensors; t++)
            if (out->tensors[t].tensor.data)
                release(ctx, out->tensors[t].tensor.data, &out->tensors[t].handle);
        out->n_tensors = 0;
        dh_batch_destroy(&batch);
        goto done;
    }
    out->bytes = batch->frames.nbytes + batch->mask.nbytes;
    dh_batch_destroy(&batch);
    out->cpu_s = (double)(dh_clock_thread_cpu_ns() - cpu0) / 1e9;
done:
    dh__fetch_tally_bind(outer_tally);
    for (uint32_t i = 0; i < n; i++) {
        if (rc == DH__RT_ABANDONED) /* the pipeline is no longer ours to touch */
            dh_sample_clear(&decoded[i]);
        else /* the frames were copied into the batch: their buffers serve the next task */
            dh__pipeline_recycle(w->pipeline, &decoded[i]);
    }
    dh_free(decoded);
    return rc;
}

void dh__rt_task_memory(const dh__rt_pipeline_t *p, const dh_wire_sample_t *samples, uint32_t n,
                        uint64_t *transient, uint64_t *output)
{
    double scale = p->synthetic && p->bytes_scale > 0 ? p->bytes_scale : 1.0;
    double sum = 0, largest = 0, t = 0, h = 0, w = 0;
    bool dims = !p->synthetic && !p->python && n > 0;
    for (uint32_t i = 0; i < n; i++) {
        const dh_wire_sample_t *s = &samples[i];
        double b = (double)s->out_bytes * scale;
        if (dims && s->frames && s->height && s->width) {
            b = (double)s->frames * 3 * s->height * s->width *
                (double)dh_dtype_size(p->video.dtype);
            t = fmax(t, s->frames);
            h = fmax(h, s->height);
            w = fmax(w, s->width);
        } else {
            dims = false;
        }
        sum += b;
        largest = fmax(largest, b);
    }
    double batch = dims ? n * t * 3 * h * w * (double)dh_dtype_size(p->video.dtype)
                   : p->synthetic || p->python ? sum
                                               : n * largest; /* padded to the largest */
    double cap = (double)((uint64_t)1 << 62);
    *transient = p->synthetic || p->python ? 0 : (uint64_t)fmin(sum, cap);
    *output = (uint64_t)fmin(batch, cap);
}

int dh__rt_execute(dh__rt_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                   dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx, dh__rt_result_t *out)
{
    memset(out, 0, sizeof *out);
    out->samples = dh_calloc(n ? n : 1, sizeof *out->samples);
    out->sample_cpu_s = dh_calloc(n ? n : 1, sizeof *out->sample_cpu_s);
    if (!out->samples || !out->sample_cpu_s) {
        dh_free(out->samples);
        dh_free(out->sample_cpu_s);
        memset(out, 0, sizeof *out);
        return dh__set_error(DH_ENOMEM, "out of memory for a task's results");
    }
    out->n_samples = n;
    for (uint32_t i = 0; i < n; i++) {
        out->samples[i].id = dh_strdup(samples[i].id ? samples[i].id : "");
        if (!out->samples[i].id) {
            dh__rt_result_clear(out);
            return dh__set_error(DH_ENOMEM, "out of memory for a sample id");
        }
    }
    int rc = w->spec.python      ? dh__py_execute(w->py, samples, n, alloc, release, ctx, out)
             : w->spec.synthetic ? execute_synthetic(w, samples, n, alloc, release, ctx, out)
                                 : execute_video(w, samples, n, alloc, release, ctx, out);
    if (rc) {
        dh__rt_result_clear(out);
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) /* the DELIVER carries them too (tier 2's features) */
        out->samples[i].cpu_s = out->sample_cpu_s[i] > 0 ? out->sample_cpu_s[i] : 0;
    return 0;
}

void dh__rt_wire_tensors(const dh__rt_tensor_t *tensors, size_t n, dh_wire_tensor_t *wire)
{
    for (size_t i = 0; i < n; i++) {
        const dh_shm_handle_t *h = &tensors[i].handle;
        wire[i] = (dh_wire_tensor_t){.tensor = tensors[i].tensor};
        if (h->arena_id) {
            wire[i].location = DH_WIRE_LOC_SHM;
            wire[i].arena_id = h->arena_id;
            wire[i].offset = h->offset;
            wire[i].length = h->length;
            wire[i].generation = h->generation;
        } else {
            wire[i].location = DH_WIRE_LOC_FRAME;
        }
    }
}
