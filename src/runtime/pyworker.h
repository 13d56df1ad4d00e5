/* runtime/pyworker.h: the python pipeline (pyworker.c): a DataServer worker thread drives one
 * Python worker process that runs the user's map-style Dataset and writes each batch's arrays
 * straight into the output buffers (docs/datasets.md, "Your own Dataset").
 */
#ifndef DH_RUNTIME_PYWORKER_H
#define DH_RUNTIME_PYWORKER_H

#include <stdatomic.h>
#include <stdint.h>

#include "runtime/rt.h"

typedef struct dh__py_worker dh__py_worker_t;

/* A worker with no process yet (started by bind, or by the first task). */
int dh__py_worker_new(dh__py_worker_t **out, const dh__rt_pipeline_t *pipeline);

/* Worker `index` of `n` (its seed is the pipeline's seed + index), writing arena outputs
 * through `arena_fd` (-1: none); starts its process. `stop` (may be NULL) ends waits. */
void dh__py_worker_bind(dh__py_worker_t *w, uint32_t index, uint32_t n, int arena_fd,
                        const atomic_int *stop);

/* Runs one request in the worker process (dh__rt_execute's contract). A process that dies
 * mid-task is replaced and the task run again once; a second death fails its samples. */
int dh__py_execute(dh__py_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                   dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx,
                   dh__rt_result_t *out);

/* Stops the process (closes its socket; SIGKILL if it has not exited within 0.5 s). */
void dh__py_worker_destroy(dh__py_worker_t **w);

#endif
