/* runtime/rt.h: internals shared by the coordinator, the DataServer and the client.
 *
 * dataserver_task.c runs one dispatched request through a pipeline (the native video pipeline of
 * pipeline.h, or the synthetic one) into output buffers that a caller-supplied allocator
 * hands out: shared-memory slabs for a local DataServer, heap buffers for a sidecar.
 */
#ifndef DH_RUNTIME_RT_H
#define DH_RUNTIME_RT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "datahelix/pipeline.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "model/model_lib.h"

#define DH__RT_MAX_TENSORS 16

typedef enum { DH__SYNTH_SLEEP = 0, DH__SYNTH_SPIN = 1, DH__SYNTH_NONE = 2 } dh__synth_cost_t;

/* A DataServer's pipeline: {"type": "video", ...pipeline.h fields} or
 * {"type": "synthetic", "cost": "sleep"|"spin"|"none", "cpu_scale": X, "bytes_scale": Y,
 *  "cost_bias": S, "cost_noise": S, "token_noise": S, "noise_seed": N}. */
typedef struct dh__rt_pipeline {
    bool synthetic;
    bool python; /* {"type": "python", ...}: the user's Dataset in worker processes (below) */
    dh_pipeline_spec_t video;
    dh__synth_cost_t cost;
    double cpu_scale;   /* multiplies each sample's cpu_s */
    double bytes_scale; /* multiplies each sample's out_bytes */
    /* Misprediction (synthetic): the fields cost_bias, cost_noise, token_noise and
     * noise_seed of the spec, the model of model/model_lib.h (dh__noise_cpu_s,
     * dh__noise_tokens). 0 (the default) = the estimate exactly. */
    dh__noise_t noise;
    /* Python (dataserver_pyworker.c): "dataset" is "pickle:PATH" (a pickled {"dataset",
     * "collate_fn", "worker_init_fn"} dict, as datahelix.DataLoader writes it) or "MODULE:FACTORY"
     * (an importable callable returning the dataset: `datahelix server --dataset`); "python" the
     * interpreter (default DH_PYTHON_EXE, else python3 on PATH); "path" directories
     * prepended to the workers' PYTHONPATH; "seed" the base of the per-worker seeds;
     * "sample_timeout" the seconds one call of the user's code (__getitem__, sample_spec,
     * load_into, collate_fn, the dataset's loading and worker_init_fn) may run before its
     * process is killed and the sample failed (default 300; 0 = no limit). */
    char py_dataset[1024];
    char py_exe[512];
    char py_path[4096]; /* ':'-joined */
    uint64_t py_seed;
    /* "sample_timeout" (any type but synthetic): python, above; video, the seconds one
     * sample's read and decode may take before the sample fails and its worker thread is
     * abandoned for a new one (dataserver_work.c, "Deadlines"). Default 300; 0 = no limit. */
    double sample_timeout_s;
} dh__rt_pipeline_t;

/* ---- Output budget (dataserver_output_budget.c): tasks' heap memory, process-wide ---- */

typedef struct dh__out_charge dh__out_charge_t;

/* The budget in bytes: DH_OUTPUT_BUDGET, else a quarter of physical memory (read once). */
uint64_t dh__out_budget(void);
/* Bytes reserved now by every charge of the process; the most there have been just after a
 * reservation (the budget, or one task alone larger than it, at most); the threads waiting
 * to reserve. */
uint64_t dh__out_reserved(void);
uint64_t dh__out_peak(void);
void dh__out_peak_reset(void); /* the peak from now on (bench: per system) */
unsigned dh__out_waiting(void);
/* Reserves `bytes` for a task (its predicted peak: dh__rt_task_memory), waiting while the
 * process's reservations would pass the budget (and none is alone) and *stop is 0. Sets *waited
 * when it waited. Returns the charge (one reference), or NULL for 0 bytes or no memory (nothing
 * reserved). */
dh__out_charge_t *dh__out_reserve(uint64_t bytes, atomic_int *stop, bool *waited);
/* Sets the charge's bytes to what its task still holds (never waits; may pass the budget),
 * after the task has run and before its charge is shared. *pc NULL: a new charge is made for
 * bytes > 0. */
void dh__out_settle(dh__out_charge_t **pc, uint64_t bytes);
/* Adds references (one per payload frame that will release it). NULL-safe. */
void dh__out_charge_add(dh__out_charge_t *c, unsigned refs);
/* Drops one reference; the last gives the bytes back. NULL-safe; any thread. */
void dh__out_release(dh__out_charge_t *c);
/* A dh_wire_free_fn for a charged payload: frees data, releases the charge in hint. */
void dh__out_free_payload(void *data, void *hint);

/* Parses a spec from text (json != NULL) or a file (path != NULL), or the video defaults
 * when both are NULL. Returns 0 or DH_EPARSE / DH_ESCHEMA / -errno naming the source. */
int dh__rt_pipeline_load(const char *json, const char *path, dh__rt_pipeline_t *out);

/* One output tensor: the shared tensor (its data is where the bytes are, slab or heap) and
 * the slab holding them. */
typedef struct dh__rt_tensor {
    dh_tensor_t tensor;
    dh_shm_handle_t handle; /* slab: its handle (arena_id 0 for heap) */
} dh__rt_tensor_t;

/* Hands out `nbytes` of output (> 0); returns 0 and fills *data / *handle, or a negative
 * code (the task then fails with it). May block (backpressure). */
typedef int dh__rt_alloc_fn(void *ctx, size_t nbytes, void **data, dh_shm_handle_t *handle);
/* Gives back an output buffer when the task fails after allocating. */
typedef void dh__rt_free_fn(void *ctx, void *data, const dh_shm_handle_t *handle);

/* The result of one task. */
typedef struct dh__rt_result {
    size_t n_tensors;
    dh__rt_tensor_t tensors[DH__RT_MAX_TENSORS];
    uint32_t n_samples;
    dh_wire_sample_result_t *samples; /* dh_malloc'd, with their strings */
    double cpu_s;                     /* measured (synthetic sleep: the emulated seconds) */
    double *sample_cpu_s;             /* n_samples: each sample's measured CPU seconds (video:
                                       * its decode's thread CPU time; synthetic: its slept
                                       * or spun cost), dh_malloc'd; NULL = not measured */
    double read_s;                    /* seconds spent reading inputs (0 = not measured) */
    uint64_t read_bytes;              /* bytes read in them */
    uint64_t bytes;                   /* output bytes */
    uint32_t failed;                  /* samples with errors */
} dh__rt_result_t;

/* Per-worker state (a video decoder). */
typedef struct dh__rt_worker dh__rt_worker_t;
int dh__rt_worker_new(dh__rt_worker_t **out, const dh__rt_pipeline_t *pipeline);
/* Which worker this is (index of n) and the arena memfd its outputs may land in (-1: none,
 * heap outputs only); `stop` ends a wait on user code when set. The python pipeline starts
 * its worker process here; the others ignore it. */
void dh__rt_worker_bind(dh__rt_worker_t *w, uint32_t index, uint32_t n, int arena_fd,
                        const atomic_int *stop);
void dh__rt_worker_destroy(dh__rt_worker_t **w);

/* ---- Deadlines of native tasks (dataserver_work.c, "Deadlines") ----
 * A worker's watch: the video pipeline brackets each sample's blocking part (open, the timed
 * read, FFmpeg's open, demux and decode) with dh__rt_watch_enter / _leave; the DataServer's
 * loop abandons a thread found inside past sample_timeout (dh__rt_watch_expire). Inside, the
 * thread touches only memory it owns (private copies of the sample's id and path, its
 * worker, the result being built), so an abandoned thread that returns frees what it owns
 * and exits. One reference for the server, one for the thread; the last frees it. */
typedef struct dh__rt_watch dh__rt_watch_t;
dh__rt_watch_t *dh__rt_watch_new(void); /* NULL: no memory; two references */
void dh__rt_watch_unref(dh__rt_watch_t *w);
/* The thread enters the blocking part of sample `index` (of its task) that started at
 * since_ns (its deadline counts from there); id, path and op are copied ("open or read",
 * "decode"). */
void dh__rt_watch_enter(dh__rt_watch_t *w, uint32_t index, const char *id, const char *path,
                        const char *op, uint64_t since_ns);
/* It left it: false, or true when it was abandoned meanwhile (then it must touch nothing but
 * what it owns: return DH__RT_ABANDONED up to its thread's start routine). */
bool dh__rt_watch_leave(dh__rt_watch_t *w);
/* The loop: when the thread is inside past timeout_ns at now, marks it abandoned and writes
 * the sample's failure ("sample 'ID' (PATH): OP ran past sample_timeout N s ...") into msg,
 * its id into id and its index into *index; returns true. Else false. */
bool dh__rt_watch_expire(dh__rt_watch_t *w, uint64_t now, uint64_t timeout_ns, uint32_t *index,
                         char *id, size_t id_cap, char *msg, size_t msg_cap);
/* The video worker's watch (NULL: none) and the seconds it allows a sample (0: no limit):
 * also FFmpeg's interrupt callback deadline (decode.c, dh__decode_set_deadline). */
void dh__rt_worker_watch(dh__rt_worker_t *w, dh__rt_watch_t *watch, double timeout_s);
/* dh__rt_execute's code for a task whose thread was abandoned: nothing of it may be used. */
#define DH__RT_ABANDONED (-30999)

/* Runs the samples of a request. A per-sample failure is recorded in the result, never
 * fails the task; returns 0, or DH_ENOMEM / the allocator's code (nothing is kept then). */
int dh__rt_execute(dh__rt_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                   dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx,
                   dh__rt_result_t *out);

/* A task's predicted memory (what dh__out_reserve is asked for): `transient`, the heap it
 * holds only while it runs (the video pipeline's decoded samples, each whole before the
 * batch is written; 0 for the others), and `output`, its batch (the video batch padded to
 * its largest T, H and W). From the samples' frames/height/width when all are given, else
 * their out_bytes (x bytes_scale, synthetic). Pure. */
void dh__rt_task_memory(const dh__rt_pipeline_t *p, const dh_wire_sample_t *samples, uint32_t n,
                        uint64_t *transient, uint64_t *output);

/* Frees the result's sample strings (not the tensor buffers). */
void dh__rt_result_clear(dh__rt_result_t *r);

/* Fills a DELIVER's tensor array from a result's tensors (location SHM when the handle names
 * an arena, else FRAME). `wire` has n entries. */
void dh__rt_wire_tensors(const dh__rt_tensor_t *tensors, size_t n, dh_wire_tensor_t *wire);

#endif
