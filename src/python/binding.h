/* binding.h: what the files of datahelix._C share (docs/python.md, "The extension's
 * files"). The extension is the CPython binding of the public client and runtime API, thin on
 * purpose: python/datahelix/ builds the DataLoader on top. One file per concern:
 *
 *   module.c               the module: DataHelixError and one subclass per entry of the C error
 *                          table (error.h), the module-level functions, PyInit__C
 *   batch.c                Batch (dh_client_batch_t) and Tensor, one tensor of a batch: the
 *                          buffer protocol and __dlpack__ (CPU), zero-copy views of the arena
 *   client.c               Client (dh_client_t): next() -> Batch, stats(), plan(), close();
 *                          the stats dicts and a rank's metrics text, from the C tables
 *   cluster.c              Cluster (dh_cluster_t): a coordinator and/or a DataServer started
 *                          and stopped as one in-process cluster (start_cluster, torchrun)
 *   servers.c              Coordinator and DataServer, each alone, as threads of this process
 *   rebalance.c            tier 2's bridge: the rebalance= dict parsed into the C config and the
 *                          bridge that owns the callables; a callback failure raised by next()
 *   rebalance_callbacks.c  the C trampolines that call feature_fn, sort_fn and exchange_fn on
 *                          the client's fetcher thread, and PartTensor, the part feature_fn sees
 *   rebalance_spec.c       RebalanceSpec: a rebalance dict checked offline, its callbacks
 *                          called through the same trampolines
 *   values.c               the values the C side owns, for python/datahelix: the arena budget,
 *                          the byte-count parser, the profile row writer, the dtype table
 *
 * Every call that can block (creating a client, next(), closing) releases the GIL. Names
 * shared between these files are dh__py_* (docs/conventions.md, "Names"); nothing else
 * leaves a file, and the extension exports PyInit__C only (hidden visibility).
 */
#ifndef DH_PYTHON_BINDING_H
#define DH_PYTHON_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/metrics.h"
#include "datahelix/shm.h"

/* ---- errors (module.c) ---------------------------------------------------------------- */

/* Raises the exception of a negative code with the message `msg` (a str, stolen; NULL: an
 * error is already set) and, when `cause` is not NULL, that exception as its __cause__.
 * Returns NULL. */
PyObject *dh__py_raise_code(int rc, PyObject *msg, PyObject *cause);

/* Raises the exception of a negative code with dh_last_error()'s message (the sample, the
 * path, the peer), or the table's message when there is none; `what`, when not NULL, comes
 * first ("plan: ..."). Returns NULL. */
PyObject *dh__py_raise_dh(int rc, const char *what);

/* Raises InvalidArgumentError (DH_EINVAL, a ValueError) with a message formatted as
 * PyUnicode_FromFormat formats it. */
void dh__py_raise_inval(const char *fmt, ...);

/* d[key] = value, value stolen (NULL: an error is already set). Returns 0 or -1. */
static inline int dh__py_dict_set_steal(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

/* ---- stats (client.c) ----------------------------------------------------------------- */

/* A stats() dict from the table of `of` (datahelix/metrics.h) and its public stats struct
 * `stats`: one key per row with a field, in the table's order (ints, seconds and other
 * doubles as floats). A new reference, or NULL with an exception set. */
PyObject *dh__py_stats_dict(dh_metrics_of_t of, const void *stats);

/* The table of `of` as a tuple of (key, kind, metric, type, label, help) rows, kind one of
 * counter, seconds, u64, f64, binding, metric; metric, type, label and help may be None
 * (the metrics_table() static methods of Client, Coordinator and DataServer). */
PyObject *dh__py_metrics_table(dh_metrics_of_t of);

/* A DataServer's arena counters as a dict (servers.c; DataServer and Cluster). New
 * reference, or NULL with an exception set. */
PyObject *dh__py_arena_stats_dict(const dh_shm_arena_stats_t *s);

/* ---- tensor views (batch.c): Tensor's, and PartTensor's (rebalance_callbacks.c) ------- */

/* The buffer protocol's shape, byte strides and format of tensor t (format: 2 chars, "" when
 * the dtype has no buffer format). */
void dh__py_buffer_layout(const dh_tensor_t *t, Py_ssize_t *shape, Py_ssize_t *strides,
                          char *format);

/* Fills a buffer-protocol view of tensor t for `owner` (which the view keeps alive), with the
 * shape, strides and format of dh__py_buffer_layout kept by the owner. Returns 0, or -1 with
 * BufferError set. */
int dh__py_fill_buffer(PyObject *owner, const dh_tensor_t *t, Py_ssize_t *shape,
                       Py_ssize_t *strides, char *format, Py_buffer *view, int flags);

/* __dlpack__(*, stream, max_version, dl_device, copy) of tensor t for `owner`: a "dltensor"
 * capsule whose tensor holds a reference to owner, which must keep t (its data, shape and
 * strides) alive. */
PyObject *dh__py_dlpack_export(PyObject *owner, const dh_tensor_t *t, PyObject *args,
                               PyObject *kwargs);

/* __dlpack_device__() -> (kDLCPU, 0), for any of the tensor types. */
PyObject *dh__py_dlpack_device(PyObject *self, PyObject *unused);

/* ---- Batch (batch.c) ------------------------------------------------------------------ */

/* A Batch object for *batch, which it takes (*batch = NULL; released on failure). Returns
 * the new reference, or NULL with an error set. */
PyObject *dh__py_batch_new(dh_client_batch_t **batch);

/* Batches of this process not yet released (tests: nothing leaks). */
long dh__py_live_batches(void);

/* ---- tier 2's bridge (rebalance.c, rebalance_callbacks.c) ----------------------------- */

/* What a client made with rebalance={...} hands the C runtime as its callbacks' user data.
 * It owns the callables, the args object, its JSON text and the group table, from the
 * client's creation until dh__py_bridge_free (after the client's threads are joined: no
 * callback runs after). Its error fields are read and written under the GIL. */
typedef struct dh__py_bridge {
    PyObject *feature_fn;  /* callable or NULL (the C defaults) */
    PyObject *sort_fn;     /* callable or NULL (the default policy and its gate) */
    PyObject *exchange_fn; /* callable or NULL (DataServers forward cross-node moves) */
    PyObject *args;        /* what sort_fn gets as args (None when not given) */
    char *args_json;       /* json.dumps(args) for the C side, or NULL */
    uint32_t *group_of;    /* ranks entries, or NULL (by node) */
    size_t n_features;     /* the C side's vector length */
    int n_features_auto;   /* 1: not given with a feature_fn: n_features is the maximum, the
                            * entries past the returned ones dh__py_feature_unused, which
                            * sort_fn's view leaves out */
    /* The first callback failure next() has not reported yet (under the GIL). */
    int error_code;
    PyObject *error_cause;   /* str: what failed ("sort_fn raised ValueError: ..."), for
                              * the runtime's message, which names the round */
    PyObject *error_summary; /* str: the same, naming the round or the part itself */
    PyObject *error_detail;  /* str: the traceback, or NULL */
    PyObject *error_exc;     /* the exception raised by the callable, or NULL */
    unsigned long errors;    /* callback failures so far */
} dh__py_bridge_t;

/* The keys of DataLoader(rebalance={...}) as a tuple (_C.REBALANCE_KEYS), or with
 * `spec_only` those the binding's parse reads (_C.REBALANCE_SPEC_KEYS); NULL: an error is
 * set. rebalance.c owns the list. */
PyObject *dh__py_rebalance_keys(int spec_only);

/* rebalance=None/False (off), True (the C defaults) or a dict (docs/python.md) ->
 * cfg->rebalance and the bridge behind its callbacks (*out, NULL when off; the caller's to
 * free). Returns 0 or -1 with an error set. */
int dh__py_rebalance_parse(PyObject *spec, uint32_t ranks, dh_rebalance_config_t *cfg,
                           dh__py_bridge_t **out);

/* Frees the bridge, sets *p = NULL; safe on NULL. GIL held. */
void dh__py_bridge_free(dh__py_bridge_t **p);

/* Records a callback failure (GIL held), and returns DH_EINVAL, the code the C side gets:
 * `cause` (stolen) says what failed, `where` names the round or part for a report without
 * the runtime's message ("rebalance round 3 (group 0): "). The Python error in flight, if
 * any, is taken and its traceback kept. Keeps the first failure until next() reports it. */
int dh__py_bridge_fail(dh__py_bridge_t *br, const char *where, PyObject *cause);

/* "ValueError: message" of the exception in flight (GIL held; the exception stays set), or
 * "an error". */
PyObject *dh__py_pending_exception_text(void);

/* After next() failed with rc (GIL held): when a callback failed with that code, raises its
 * report and returns 1 (consumed); else 0. NULL br: 0. */
int dh__py_bridge_raise(dh__py_bridge_t *br, int rc);

/* The C trampolines (user: the bridge): each takes the GIL, calls the bridge's callable and
 * converts its answer; a failure is recorded with dh__py_bridge_fail. They run on the
 * client's fetcher thread (or a RebalanceSpec's caller, the GIL released). */
int dh__py_feature_cb(void *user, const dh_tensor_t *tensors, size_t n_tensors,
                      const dh_client_sample_t *samples, size_t n_samples, double *features,
                      size_t n_features);
int dh__py_sort_cb(void *user, const dh_rebalance_round_t *round, uint32_t *new_rank);
int dh__py_exchange_cb(void *user, uint32_t group, uint64_t round, const uint32_t *ranks,
                       uint32_t n_ranks, const void *send, const size_t *send_counts, void *recv,
                       const size_t *recv_counts);

/* The unused feature slots of an automatic-length vector (rebalance_callbacks.c says why
 * this value). */
extern const double dh__py_feature_unused;

/* ---- the types, made ready and added by PyInit__C (module.c) -------------------------- */

extern PyTypeObject dh__py_batch_type;          /* batch.c */
extern PyTypeObject dh__py_tensor_type;         /* batch.c */
extern PyTypeObject dh__py_client_type;         /* client.c */
extern PyTypeObject dh__py_cluster_type;        /* cluster.c */
extern PyTypeObject dh__py_coordinator_type;    /* servers.c */
extern PyTypeObject dh__py_dataserver_type;     /* servers.c */
extern PyTypeObject dh__py_part_tensor_type;    /* rebalance_callbacks.c */
extern PyTypeObject dh__py_rebalance_spec_type; /* rebalance_spec.c */

/* ---- the values the C side owns (values.c) ------------------------------------------- */

/* arena_budget_default(), parse_bytes(text, what=), write_profiles(path, rows): entries of
 * module.c's method table. */
PyObject *dh__py_arena_budget_default(PyObject *m, PyObject *unused);
/* remote.c */
PyObject *dh__py_remote_read(PyObject *m, PyObject *args);
PyObject *dh__py_remote_reload_settings(PyObject *m, PyObject *unused);
PyObject *dh__py_parse_bytes(PyObject *m, PyObject *args, PyObject *kwargs);
PyObject *dh__py_write_profiles(PyObject *m, PyObject *args);

/* Adds the module's constants DTYPES, REBALANCE_KEYS and REBALANCE_SPEC_KEYS. Returns 0, or -1
 * with an error set. */
int dh__py_values_add(PyObject *m);

#endif
