/* runtime/dataserver_pyworker.h: the python pipeline (dataserver_pyworker.c): a DataServer worker
 * thread drives one Python worker process that runs the user's map-style Dataset and writes each
 * batch's arrays straight into the output buffers (docs/datasets.md, "Your own Dataset").
 */
#ifndef DH_RUNTIME_DATASERVER_PYWORKER_H
#define DH_RUNTIME_DATASERVER_PYWORKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "runtime/rt.h"

typedef struct dh__py_worker dh__py_worker_t;

/* A worker with no process yet (started by bind, or by the first task). */
int dh__py_worker_new(dh__py_worker_t **out, const dh__rt_pipeline_t *pipeline);

/* Worker `index` of `n` (its seed is the pipeline's seed + index), writing arena outputs
 * through `arena_fd` (-1: none); starts its process. `stop` (may be NULL) ends waits. */
void dh__py_worker_bind(dh__py_worker_t *w, uint32_t index, uint32_t n, int arena_fd,
                        const atomic_int *stop);

/* Runs one request in the worker process (dh__rt_execute's contract). A process that dies
 * mid-task is replaced and the task run again once; a second death fails its samples. A call
 * of the user's code that runs past the pipeline's sample_timeout fails its sample (all of
 * the batch's for collate_fn, the dataset's loading or worker_init_fn): the process is killed
 * and a new one runs the task again without it. */
int dh__py_execute(dh__py_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                   dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx,
                   dh__rt_result_t *out);

/* The process's messages, parsed with no process (dataserver_pyworker.c's receive path, and the
 * fuzz target tests/fuzz/fuzz_pyworker.c). index and pid name the worker in messages.
 * dh__py_msg_parse: buf[0..len) as one message: a JSON object with a string "op" into *out
 * (the caller's: json_decref), else DH_EPARSE with *out NULL.
 * dh__py_take_alloc: an alloc message into out, which holds out->n_samples entries in
 * samples[] and sample_cpu_s[] (the caller's, zeroed; an error string set here is the
 * caller's, dh_free): each sample's tokens, cpu_s and error (DH_EDATASET, counted in failed),
 * then the tensors' names, dtypes and shapes (contiguous; no buffers). 0; DH_EPARSE when
 * "samples" is not a list of n_samples; DH_EDATASET when the tensors cannot be carried (out of
 * dtypes, names, dimensions or bytes: out->tensors is then partly filled); DH_ENOMEM.
 * dh__py_take_samples: only the samples part (a done message's "samples"). */
struct json_t;
int dh__py_msg_parse(const char *buf, size_t len, uint32_t index, int pid, struct json_t **out);
int dh__py_take_alloc(struct json_t *msg, uint32_t index, dh__rt_result_t *out);
int dh__py_take_samples(struct json_t *list, uint32_t index, dh__rt_result_t *out);

/* Stops the process (closes its socket; SIGKILL if it has not exited within 0.5 s). */
void dh__py_worker_destroy(dh__py_worker_t **w);

/* dataserver_pyworker_proc.c: starts `python -m datahelix._worker` (exe "" = $DH_PYTHON_EXE, else
 * python3) with its end of a new SOCK_SEQPACKET pair as fd 3 and `py_path` (':'-joined)
 * before its PYTHONPATH; sets *pid and *sock (ours, CLOEXEC). 0, or a code with a message. */
int dh__py_proc_spawn(const char *exe, const char *py_path, uint32_t index, pid_t *pid, int *sock);
/* Reaps `pid` (0: none), SIGKILL first when kill_now, else after 0.5 s if it has not exited;
 * writes how it ended ("killed by signal 9", "exited with status 1") to how. */
void dh__py_proc_end(pid_t pid, bool kill_now, char *how, size_t cap);

#endif
