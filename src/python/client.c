/* client.c: Client, one rank of the data plane (dh_client_t): next() -> Batch (batch.c; None
 * at the end), stats(), plan(), close(); the stats dicts of the three tables (datahelix/metrics.h)
 * and a rank's metrics text rendered by the daemons' writer. Every call that can block (creating
 * the client, next(), closing) releases the GIL; a client's calls are serialised by its own mutex,
 * since the C client belongs to one thread at a time while Python may call it from several. With
 * rebalance=, the client owns tier 2's bridge (rebalance.c) and frees it after its threads.
 */
#include "binding.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "datahelix/alloc.h"

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
                             "first_sample",
                             NULL};
    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    const char *on_error = "raise";
    unsigned long long seed = cfg.seed, max_steps = cfg.max_steps, arena = cfg.arena_bytes,
                       first_step = 0, first_sample = 0;
    unsigned rank = 0, ranks = 1, batch = 0, fanout = cfg.fanout, prefetch = cfg.prefetch,
             max_inflight = cfg.max_inflight, epochs = cfg.epochs, first_epoch = 0,
             workers = cfg.workers, prefetch_max = cfg.prefetch_max, local_ranks = cfg.local_ranks,
             plan_window = 1;
    int shuffle = cfg.shuffle, token_plan = cfg.token_plan, drop_last = !cfg.keep_tail;
    PyObject *rebalance = Py_None;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "sIII|$zzzIIIKpIIKisiizzIKzIIOIKzzpK", kwlist, &cfg.profiles, &rank,
            &ranks, &batch, &cfg.coordinator, &cfg.node, &cfg.client_id, &fanout, &prefetch,
            &max_inflight, &seed, &shuffle, &epochs, &first_epoch, &max_steps, &token_plan,
            &on_error, &cfg.next_timeout_ms, &cfg.connect_timeout_ms, &cfg.pipeline_json,
            &cfg.pipeline_path, &workers, &arena, &cfg.policy, &prefetch_max, &local_ranks,
            &rebalance, &plan_window, &first_step, &cfg.keys_dir, &cfg.key_name, &drop_last,
            &first_sample))
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
    cfg.first_sample = first_sample;
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
    /* rebalance_callback_errors (the table's BINDING row): the Python feature_fn and
     * sort_fn calls that raised or returned a bad answer */
    PyObject *d = dh__py_stats_dict(DH_METRICS_CLIENT, &s);
    if (d && dh__py_dict_set_steal(
                 d, "rebalance_callback_errors",
                 PyLong_FromUnsignedLong(self->rebalance ? self->rebalance->errors : 0))) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyObject *dh__py_stats_dict(dh_metrics_of_t of, const void *stats)
{
    size_t n;
    const dh_metric_desc_t *t = dh_metrics_table(of, &n);
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        const char *at = (const char *)stats + t[i].offset;
        uint64_t u;
        double f;
        PyObject *v = NULL;
        if (t[i].kind == DH_STAT_COUNTER || t[i].kind == DH_STAT_U64) {
            memcpy(&u, at, sizeof u);
            v = PyLong_FromUnsignedLongLong(u);
        } else if (t[i].kind == DH_STAT_SECONDS || t[i].kind == DH_STAT_F64) {
            memcpy(&f, at, sizeof f);
            v = PyFloat_FromDouble(f);
        } else {
            continue; /* BINDING (the caller's), METRIC: no field */
        }
        if (dh__py_dict_set_steal(d, t[i].key, v))
            Py_CLEAR(d);
    }
    return d;
}

PyObject *dh__py_metrics_table(dh_metrics_of_t of)
{
    static const char *const kinds[] = {"counter", "seconds", "u64", "f64", "binding", "metric"};
    size_t n;
    const dh_metric_desc_t *t = dh_metrics_table(of, &n);
    PyObject *out = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *row = Py_BuildValue("(sszzzz)", t[i].key, kinds[t[i].kind], t[i].metric,
                                      t[i].type, t[i].label, t[i].help);
        if (!row)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, (Py_ssize_t)i, row);
    }
    return out;
}

static PyObject *Client_metrics_table(PyObject *unused_cls, PyObject *unused)
{
    return dh__py_metrics_table(DH_METRICS_CLIENT);
}

/* The row of the client's table named `key` with a metric, or NULL. */
static const dh_metric_desc_t *client_row(const char *key)
{
    size_t n;
    const dh_metric_desc_t *t = dh_metrics_table(DH_METRICS_CLIENT, &n);
    for (size_t i = 0; i < n; i++)
        if (t[i].metric && strcmp(t[i].key, key) == 0)
            return &t[i];
    return NULL;
}

/* The str() of each of `objs` (a sequence) kept in `keep`, its UTF-8 in out[]. 0 or -1. */
static int utf8_of(PyObject *objs, Py_ssize_t n, PyObject *keep, const char **out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyObject_Str(PySequence_Fast_GET_ITEM(objs, i));
        if (!s || PyList_Append(keep, s) < 0 || !(out[i] = PyUnicode_AsUTF8(s))) {
            Py_XDECREF(s);
            return -1;
        }
        Py_DECREF(s);
    }
    return 0;
}

/* Client.render_metrics(stats, labels=None) -> str: a stats() dict in Prometheus' text
 * format through the daemons' writer (dh_metrics_text): per number (booleans as 0 or 1,
 * other values skipped) its table row's name, type and HELP; a key the table does not know
 * is a gauge datahelix_client_<key> (characters outside [A-Za-z0-9_] as _). Every sample
 * carries `labels`, sorted by name. */
static PyObject *Client_render_metrics(PyObject *unused_cls, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stats", "labels", NULL};
    PyObject *stats, *labels = Py_None, *items = NULL, *label_items = NULL, *out = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O", kwlist, &stats, &labels))
        return NULL;
    PyObject *keep = PyList_New(0);
    Py_ssize_t n = 0, n_labels = 0;
    dh_metric_value_t *v = NULL;
    const char **names = NULL;
    if (!keep || !(items = PyMapping_Items(stats)))
        goto done;
    n = PyList_GET_SIZE(items);
    if (labels != Py_None) {
        if (!(label_items = PyMapping_Items(labels)) || PyList_Sort(label_items) < 0)
            goto done;
        n_labels = PyList_GET_SIZE(label_items);
    }
    v = PyMem_Calloc((size_t)n + 1, sizeof *v);
    names = PyMem_Calloc(2 * (size_t)n_labels + 1, sizeof *names);
    if (!v || !names) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_labels; i++) {
        PyObject *kv = PySequence_Fast(PyList_GET_ITEM(label_items, i), "labels: not a pair");
        int rc = kv && PySequence_Fast_GET_SIZE(kv) == 2 ? 0 : -1;
        const char *pair[2];
        if (rc == 0)
            rc = utf8_of(kv, 2, keep, pair);
        Py_XDECREF(kv);
        if (rc < 0)
            goto done;
        names[i] = pair[0];
        names[n_labels + i] = pair[1];
    }
    size_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *kv = PySequence_Fast(PyList_GET_ITEM(items, i), "stats: not a pair");
        if (!kv)
            goto done;
        PyObject *value = PySequence_Fast_GET_ITEM(kv, 1);
        const char *key;
        if (!(PyLong_Check(value) || PyFloat_Check(value))) {
            Py_DECREF(kv);
            continue; /* not a number */
        }
        double x = PyFloat_AsDouble(value); /* an int too; a bool is one */
        int rc = x == -1.0 && PyErr_Occurred() ? -1 : utf8_of(kv, 1, keep, &key);
        Py_DECREF(kv);
        if (rc < 0)
            goto done;
        const dh_metric_desc_t *row = client_row(key);
        dh_metric_value_t *e = &v[count++];
        e->value = x;
        if (row) {
            e->name = row->metric;
            e->help = row->help;
            e->type = row->type;
            continue;
        }
        /* a new bytes object is ours to write until shared: the name made valid in place */
        PyObject *name = PyBytes_FromFormat("datahelix_client_%s", key);
        PyObject *help = PyUnicode_FromFormat("DataLoader.stats()['%s'].", key);
        if (!name || !help || PyList_Append(keep, name) < 0 || PyList_Append(keep, help) < 0) {
            Py_XDECREF(name);
            Py_XDECREF(help);
            goto done;
        }
        Py_DECREF(name);
        Py_DECREF(help);
        for (char *c = PyBytes_AS_STRING(name); *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '_'))
                *c = '_';
        e->name = PyBytes_AS_STRING(name);
        e->help = PyUnicode_AsUTF8(help);
        e->type = "gauge";
    }
    size_t len;
    char *text;
    int rc = dh_metrics_text(v, count, names, names + n_labels, (size_t)n_labels, &text, &len);
    if (rc) {
        dh__py_raise_dh(rc, "render_metrics");
        goto done;
    }
    out = PyUnicode_FromStringAndSize(text, (Py_ssize_t)len);
    dh_free(text);
done:
    PyMem_Free(v);
    PyMem_Free(names);
    Py_XDECREF(items);
    Py_XDECREF(label_items);
    Py_XDECREF(keep);
    return out;
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
    {"metrics_table", (PyCFunction)Client_metrics_table, METH_NOARGS | METH_STATIC,
     "metrics_table() -> the client's stats and metrics table: (key, kind, metric, type, "
     "label, help) rows"},
    {"render_metrics", (PyCFunction)(void (*)(void))Client_render_metrics,
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "render_metrics(stats, labels=None) -> str: a stats() dict in Prometheus' text format"},
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
