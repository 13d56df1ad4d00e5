/* client.c: Client, one rank of the data plane (dh_client_t): next() -> Batch (batch.c; None
 * at the end), stats(), plan(), close(). Every call that can block (creating the client,
 * next(), closing) releases the GIL; a client's calls are serialised by its own mutex, since
 * the C client belongs to one thread at a time while Python may call it from several. With
 * rebalance=, the client owns tier 2's bridge (rebalance.c) and frees it after its threads.
 */
#include "binding.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

typedef struct {
    PyObject_HEAD dh_client_t *client;
    pthread_mutex_t lock;       /* serialises next/stats/plan/close (taken without the GIL) */
    dh__py_bridge_t *rebalance; /* tier 2's callbacks, or NULL; freed after the client */
    /* next()'s limit (next_timeout_ms; -1: none): the C client waits in slices of at most
     * NEXT_SLICE_MS, so Ctrl-C is seen between them */
    int timeout_ms;
} ClientObject;

#define NEXT_SLICE_MS 200

static void client_lock(ClientObject *self)
{
    PyThreadState *ts = PyEval_SaveThread();
    pthread_mutex_lock(&self->lock);
    PyEval_RestoreThread(ts);
}

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    ClientObject *self = (ClientObject *)type->tp_alloc(type, 0);
    if (self)
        pthread_mutex_init(&self->lock, NULL);
    return (PyObject *)self;
}

static int Client_init(ClientObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"profiles",
                             "rank",
                             "ranks",
                             "batch",
                             "coordinator",
                             "node",
                             "client_id",
                             "fanout",
                             "prefetch",
                             "max_inflight",
                             "seed",
                             "shuffle",
                             "epochs",
                             "first_epoch",
                             "max_steps",
                             "token_plan",
                             "on_error",
                             "next_timeout_ms",
                             "connect_timeout_ms",
                             "pipeline_json",
                             "pipeline_path",
                             "workers",
                             "arena_bytes",
                             "policy",
                             "prefetch_max",
                             "local_ranks",
                             "rebalance",
                             "plan_window",
                             "first_step",
                             "keys_dir",
                             "key_name",
                             "drop_last",
                             NULL};
    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    const char *on_error = "raise";
    unsigned long long seed = cfg.seed, max_steps = cfg.max_steps, arena = cfg.arena_bytes,
                       first_step = 0;
    unsigned rank = 0, ranks = 1, batch = 0, fanout = cfg.fanout, prefetch = cfg.prefetch,
             max_inflight = cfg.max_inflight, epochs = cfg.epochs, first_epoch = 0,
             workers = cfg.workers, prefetch_max = cfg.prefetch_max, local_ranks = cfg.local_ranks,
             plan_window = 1;
    int shuffle = cfg.shuffle, token_plan = cfg.token_plan, drop_last = !cfg.keep_tail;
    PyObject *rebalance = Py_None;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "sIII|$zzzIIIKpIIKisiizzIKzIIOIKzzp", kwlist, &cfg.profiles, &rank,
            &ranks, &batch, &cfg.coordinator, &cfg.node, &cfg.client_id, &fanout, &prefetch,
            &max_inflight, &seed, &shuffle, &epochs, &first_epoch, &max_steps, &token_plan,
            &on_error, &cfg.next_timeout_ms, &cfg.connect_timeout_ms, &cfg.pipeline_json,
            &cfg.pipeline_path, &workers, &arena, &cfg.policy, &prefetch_max, &local_ranks,
            &rebalance, &plan_window, &first_step, &cfg.keys_dir, &cfg.key_name, &drop_last))
        return -1;
    if (self->client) {
        PyErr_SetString(PyExc_RuntimeError, "Client already initialised");
        return -1;
    }
    if (strcmp(on_error, "raise") == 0) {
        cfg.on_error = DH_ON_ERROR_RAISE;
    } else if (strcmp(on_error, "skip") == 0) {
        cfg.on_error = DH_ON_ERROR_SKIP;
    } else {
        PyErr_Format(PyExc_ValueError, "on_error must be 'raise' or 'skip', not '%s'", on_error);
        return -1;
    }
    self->timeout_ms = cfg.next_timeout_ms < 0 ? -1 : cfg.next_timeout_ms;
    if (cfg.next_timeout_ms < 0 || cfg.next_timeout_ms > NEXT_SLICE_MS)
        cfg.next_timeout_ms = NEXT_SLICE_MS;
    cfg.rank = rank;
    cfg.ranks = ranks;
    cfg.batch = batch;
    cfg.fanout = fanout;
    cfg.prefetch = prefetch;
    cfg.prefetch_max = prefetch_max;
    cfg.local_ranks = local_ranks;
    cfg.max_inflight = max_inflight;
    cfg.seed = seed;
    cfg.shuffle = shuffle;
    cfg.epochs = epochs;
    cfg.first_epoch = first_epoch;
    cfg.first_step = first_step;
    cfg.keep_tail = !drop_last;
    cfg.max_steps = max_steps;
    cfg.token_plan = token_plan;
    cfg.plan_window = plan_window;
    cfg.workers = workers;
    cfg.arena_bytes = arena;
    if (cfg.coordinator && !*cfg.coordinator)
        cfg.coordinator = NULL;
    dh__py_bridge_t *bridge = NULL;
    if (dh__py_rebalance_parse(rebalance, ranks, &cfg.rebalance, &bridge) < 0)
        return -1;
    int rc;
    dh_client_t *c = NULL;
    PyThreadState *ts = PyEval_SaveThread();
    rc = dh_client_new(&c, &cfg);
    PyEval_RestoreThread(ts);
    if (rc < 0) {
        dh__py_bridge_free(&bridge);
        dh__py_raise_dh(rc, NULL);
        return -1;
    }
    self->client = c;
    self->rebalance = bridge;
    return 0;
}

static int client_check(ClientObject *self)
{
    if (!self->client) {
        PyErr_SetString(PyExc_RuntimeError, "the client is closed");
        return -1;
    }
    return 0;
}

static void client_close(ClientObject *self)
{
    dh_client_t *c = self->client;
    self->client = NULL;
    if (c) {
        PyThreadState *ts = PyEval_SaveThread();
        dh_client_destroy(&c);
        PyEval_RestoreThread(ts);
    }
    /* the client's threads are joined: no callback runs any more */
    dh__py_bridge_free(&self->rebalance);
}

static void Client_dealloc(ClientObject *self)
{
    client_close(self);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* next() -> Batch, or None after the last batch. With on_error raise, a failed sample's
 * error is raised (that batch is consumed; the next call goes on). */
static PyObject *Client_next(ClientObject *self, PyObject *unused)
{
    client_lock(self);
    if (client_check(self) < 0) {
        pthread_mutex_unlock(&self->lock);
        return NULL;
    }
    dh_client_batch_t *b = NULL;
    int rc;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        PyThreadState *ts = PyEval_SaveThread();
        rc = dh_client_next(self->client, &b);
        PyEval_RestoreThread(ts);
        if (rc != DH_EAGAIN)
            break;
        /* A slice ended: give Ctrl-C a chance, then wait again, up to the loader's timeout. */
        if (PyErr_CheckSignals() < 0) {
            pthread_mutex_unlock(&self->lock);
            return NULL;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited_ms =
            (double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6;
        if (self->timeout_ms >= 0 && waited_ms >= self->timeout_ms) {
            pthread_mutex_unlock(&self->lock);
            return dh__py_raise_code(
                DH_EAGAIN,
                PyUnicode_FromFormat("next(): no batch within the timeout of %d ms "
                                     "(%s)",
                                     self->timeout_ms, dh_last_error()),
                NULL);
        }
    }
    pthread_mutex_unlock(&self->lock);
    if (rc == DH_EEOF)
        Py_RETURN_NONE;
    if (rc < 0 && dh__py_bridge_raise(self->rebalance, rc))
        return NULL;
    if (rc < 0)
        return dh__py_raise_dh(rc, NULL);
    return dh__py_batch_new(&b);
}

static PyObject *Client_stats(ClientObject *self, PyObject *unused)
{
    client_lock(self);
    if (client_check(self) < 0) {
        pthread_mutex_unlock(&self->lock);
        return NULL;
    }
    dh_client_stats_t s;
    /* without the GIL: a rebalance callback on the fetcher thread may hold the client's
     * state while it waits for the GIL */
    Py_BEGIN_ALLOW_THREADS dh_client_stats(self->client, &s);
    Py_END_ALLOW_THREADS pthread_mutex_unlock(&self->lock);
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:K,s:K}", "batches",
        (unsigned long long)s.batches, "samples", (unsigned long long)s.samples, "samples_failed",
        (unsigned long long)s.samples_failed, "requests_sent", (unsigned long long)s.requests_sent,
        "deliveries", (unsigned long long)s.deliveries, "duplicates_dropped",
        (unsigned long long)s.duplicates_dropped, "bytes_delivered",
        (unsigned long long)s.bytes_delivered, "copied_tensors",
        (unsigned long long)s.copied_tensors, "copy_bytes", (unsigned long long)s.copy_bytes,
        "notices", (unsigned long long)s.notices, "wait_s", s.wait_s, "s_per_token", s.s_per_token,
        "steps_total", (unsigned long long)s.steps_total, "prefetch_now",
        (unsigned long long)s.prefetch_now);
    /* tier 2 (zero when rebalance is off); rebalance_callback_errors: the Python feature_fn
     * and sort_fn calls that raised or returned a bad answer */
    if (!d ||
        dh__py_dict_set_steal(d, "rebalance_rounds",
                              PyLong_FromUnsignedLongLong(s.rebalance_rounds)) ||
        dh__py_dict_set_steal(d, "rebalance_applied",
                              PyLong_FromUnsignedLongLong(s.rebalance_applied)) ||
        dh__py_dict_set_steal(d, "rebalance_kept_by_gate",
                              PyLong_FromUnsignedLongLong(s.rebalance_kept_by_gate)) ||
        dh__py_dict_set_steal(d, "rebalance_moved_parts",
                              PyLong_FromUnsignedLongLong(s.rebalance_moved_parts)) ||
        dh__py_dict_set_steal(d, "rebalance_moved_samples",
                              PyLong_FromUnsignedLongLong(s.rebalance_moved_samples)) ||
        dh__py_dict_set_steal(d, "rebalance_bytes",
                              PyLong_FromUnsignedLongLong(s.rebalance_bytes)) ||
        dh__py_dict_set_steal(d, "rebalance_bytes_remote",
                              PyLong_FromUnsignedLongLong(s.rebalance_bytes_remote)) ||
        dh__py_dict_set_steal(d, "rebalance_s_p95", PyFloat_FromDouble(s.rebalance_s_p95)) ||
        dh__py_dict_set_steal(d, "rebalance_s_max", PyFloat_FromDouble(s.rebalance_s_max)) ||
        dh__py_dict_set_steal(d, "rebalance_final_s_p95",
                              PyFloat_FromDouble(s.rebalance_final_s_p95)) ||
        dh__py_dict_set_steal(d, "rebalance_exchanges",
                              PyLong_FromUnsignedLongLong(s.rebalance_exchanges)) ||
        dh__py_dict_set_steal(d, "rebalance_transfer_s_p95",
                              PyFloat_FromDouble(s.rebalance_transfer_s_p95)) ||
        dh__py_dict_set_steal(d, "rebalance_transfer_s_total",
                              PyFloat_FromDouble(s.rebalance_transfer_s_total)) ||
        dh__py_dict_set_steal(
            d, "rebalance_callback_errors",
            PyLong_FromUnsignedLong(self->rebalance ? self->rebalance->errors : 0))) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

/* plan(step, rank) -> the profile rows rank `rank` gets at global step `step`. */
static PyObject *Client_plan(ClientObject *self, PyObject *args)
{
    unsigned long long step;
    unsigned rank;
    if (!PyArg_ParseTuple(args, "KI", &step, &rank))
        return NULL;
    client_lock(self);
    if (client_check(self) < 0) {
        pthread_mutex_unlock(&self->lock);
        return NULL;
    }
    uint32_t rows[4096];
    int n;
    Py_BEGIN_ALLOW_THREADS n = dh_client_plan_rank_step(self->client, step, rank, rows, 4096);
    Py_END_ALLOW_THREADS pthread_mutex_unlock(&self->lock);
    if (n < 0)
        return dh__py_raise_dh(n, "plan");
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, PyLong_FromUnsignedLong(rows[i]));
    return list;
}

static PyObject *Client_close(ClientObject *self, PyObject *unused)
{
    client_lock(self);
    client_close(self);
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

static PyObject *Client_get_id(ClientObject *self, void *unused)
{
    if (client_check(self) < 0)
        return NULL;
    return PyUnicode_FromString(dh_client_id(self->client));
}

static PyObject *Client_get_coordinator(ClientObject *self, void *unused)
{
    if (client_check(self) < 0)
        return NULL;
    return PyUnicode_FromString(dh_client_coordinator(self->client));
}

static PyMethodDef Client_methods[] = {
    {"next", (PyCFunction)Client_next, METH_NOARGS, "next() -> Batch, or None after the last one"},
    {"stats", (PyCFunction)Client_stats, METH_NOARGS, "stats() -> dict of counters"},
    {"plan", (PyCFunction)Client_plan, METH_VARARGS,
     "plan(step, rank) -> profile rows that rank gets at that step"},
    {"close", (PyCFunction)Client_close, METH_NOARGS,
     "close(): stop the threads and leave; batches still held stay valid"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Client_getset[] = {
    {"id", (getter)Client_get_id, NULL, "client id", NULL},
    {"coordinator", (getter)Client_get_coordinator, NULL, "coordinator endpoint in use", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject dh__py_client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Client(profiles, rank, ranks, batch, *, coordinator=None, ...): one rank of "
              "the data plane (dh_client_t).",
    .tp_methods = Client_methods,
    .tp_getset = Client_getset,
    .tp_new = Client_new,
    .tp_init = (initproc)Client_init,
};
