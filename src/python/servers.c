/* servers.c: Coordinator and DataServer, dh_coordinator_t and dh_dataserver_t run as threads
 * of this process one at a time (for tests and programs that hold one part; start_cluster and
 * the torchrun job use cluster.c's Cluster): start on __init__, stop on close() or when freed,
 * their counters as dicts.
 */
#include "binding.h"

#include <string.h>

#include "datahelix/runtime.h"

/* ---- Coordinator -------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD dh_coordinator_t *coord;
} CoordinatorObject;

static int Coordinator_init(CoordinatorObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"listen", "policy", "dead_after_ms", "keys_dir", "key_name", NULL};
    dh_coordinator_config_t cfg;
    dh_coordinator_config_default(&cfg);
    const char *policy = NULL;
    unsigned dead_after = cfg.dead_after_ms;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|$zIzz", kwlist, &cfg.listen, &policy,
                                     &dead_after, &cfg.keys_dir, &cfg.key_name))
        return -1;
    if (self->coord) {
        PyErr_SetString(PyExc_RuntimeError, "Coordinator already initialised");
        return -1;
    }
    cfg.dead_after_ms = dead_after;
    if (policy) {
        int rc = dh_policy_from_name(policy, &cfg.place.policy);
        if (rc < 0) {
            dh__py_raise_dh(rc, "Coordinator policy");
            return -1;
        }
    }
    dh_coordinator_t *c = NULL;
    int rc = dh_coordinator_new(&c, &cfg);
    if (rc == 0)
        rc = dh_coordinator_start(c);
    if (rc < 0) {
        dh_coordinator_destroy(&c);
        dh__py_raise_dh(rc, NULL);
        return -1;
    }
    self->coord = c;
    return 0;
}

static void coordinator_close(CoordinatorObject *self)
{
    dh_coordinator_t *c = self->coord;
    self->coord = NULL;
    if (c) {
        PyThreadState *ts = PyEval_SaveThread();
        dh_coordinator_destroy(&c);
        PyEval_RestoreThread(ts);
    }
}

static void Coordinator_dealloc(CoordinatorObject *self)
{
    coordinator_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Coordinator_close(CoordinatorObject *self, PyObject *unused)
{
    coordinator_close(self);
    Py_RETURN_NONE;
}

static PyObject *Coordinator_get_endpoint(CoordinatorObject *self, void *unused)
{
    if (!self->coord)
        Py_RETURN_NONE;
    return PyUnicode_FromString(dh_coordinator_endpoint(self->coord));
}

static PyObject *Coordinator_stats(CoordinatorObject *self, PyObject *unused)
{
    if (!self->coord) {
        PyErr_SetString(PyExc_RuntimeError, "the coordinator is closed");
        return NULL;
    }
    dh_coordinator_stats_t s;
    dh_coordinator_stats(self->coord, &s);
    return dh__py_stats_dict(DH_METRICS_COORDINATOR, &s);
}

static PyObject *Coordinator_metrics_table(PyObject *unused_cls, PyObject *unused)
{
    return dh__py_metrics_table(DH_METRICS_COORDINATOR);
}

static PyMethodDef Coordinator_methods[] = {
    {"close", (PyCFunction)Coordinator_close, METH_NOARGS, "stop and free"},
    {"stats", (PyCFunction)Coordinator_stats, METH_NOARGS, "stats() -> dict of counters"},
    {"metrics_table", (PyCFunction)Coordinator_metrics_table, METH_NOARGS | METH_STATIC,
     "metrics_table() -> the coordinator's stats and metrics table: (key, kind, metric, type, "
     "label, help) rows"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Coordinator_getset[] = {
    {"endpoint", (getter)Coordinator_get_endpoint, NULL, "the endpoint bound", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject dh__py_coordinator_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.Coordinator",
    .tp_basicsize = sizeof(CoordinatorObject),
    .tp_dealloc = (destructor)Coordinator_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Coordinator(listen, *, policy=None, dead_after_ms=1000): a coordinator on a "
              "thread of this process.",
    .tp_methods = Coordinator_methods,
    .tp_getset = Coordinator_getset,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Coordinator_init,
};

/* ---- DataServer --------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD dh_dataserver_t *ds;
} DataServerObject;

static int DataServer_init(DataServerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {
        "coordinator",   "node",          "role",           "workers",     "name",
        "pipeline_json", "pipeline_path", "arena_bytes",    "data_listen", "data_advertise",
        "keys_dir",      "key_name",      "shm_allow_uids", NULL};
    dh_dataserver_config_t cfg;
    dh_dataserver_config_default(&cfg);
    const char *role = "local";
    unsigned workers = cfg.workers;
    unsigned long long arena = cfg.arena_bytes;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "ss|$sIzzzKzzzzz", kwlist, &cfg.coordinator, &cfg.node, &role, &workers,
            &cfg.name, &cfg.pipeline_json, &cfg.pipeline_path, &arena, &cfg.data_listen,
            &cfg.data_advertise, &cfg.keys_dir, &cfg.key_name, &cfg.shm_allow_uids))
        return -1;
    if (self->ds) {
        PyErr_SetString(PyExc_RuntimeError, "DataServer already initialised");
        return -1;
    }
    if (strcmp(role, "local") == 0) {
        cfg.role = DH_DS_LOCAL;
    } else if (strcmp(role, "remote") == 0) {
        cfg.role = DH_DS_REMOTE;
    } else {
        PyErr_Format(PyExc_ValueError, "role must be 'local' or 'remote', not '%s'", role);
        return -1;
    }
    cfg.workers = workers;
    cfg.arena_bytes = arena;
    dh_dataserver_t *s = NULL;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = dh_dataserver_new(&s, &cfg);
    if (rc == 0)
        rc = dh_dataserver_start(s);
    PyEval_RestoreThread(ts);
    if (rc < 0) {
        dh_dataserver_destroy(&s);
        dh__py_raise_dh(rc, NULL);
        return -1;
    }
    self->ds = s;
    return 0;
}

static void dataserver_close(DataServerObject *self)
{
    dh_dataserver_t *s = self->ds;
    self->ds = NULL;
    if (s) {
        PyThreadState *ts = PyEval_SaveThread();
        dh_dataserver_destroy(&s);
        PyEval_RestoreThread(ts);
    }
}

static void DataServer_dealloc(DataServerObject *self)
{
    dataserver_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *DataServer_close(DataServerObject *self, PyObject *unused)
{
    dataserver_close(self);
    Py_RETURN_NONE;
}

static int ds_check(DataServerObject *self)
{
    if (!self->ds) {
        PyErr_SetString(PyExc_RuntimeError, "the DataServer is closed");
        return -1;
    }
    return 0;
}

static PyObject *DataServer_stats(DataServerObject *self, PyObject *unused)
{
    if (ds_check(self) < 0)
        return NULL;
    dh_dataserver_stats_t s;
    dh_dataserver_stats(self->ds, &s);
    return dh__py_stats_dict(DH_METRICS_DATASERVER, &s);
}

PyObject *dh__py_arena_stats_dict(const dh_shm_arena_stats_t *s)
{
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "size_bytes", (unsigned long long)s->size_bytes,
        "slab_size", (unsigned long long)s->slab_size, "slabs_total",
        (unsigned long long)s->slabs_total, "slabs_used", (unsigned long long)s->slabs_used,
        "slabs_reclaimable", (unsigned long long)s->slabs_reclaimable, "allocations_live",
        (unsigned long long)s->allocations_live, "allocations_reclaimable",
        (unsigned long long)s->allocations_reclaimable);
}

static PyObject *DataServer_arena_stats(DataServerObject *self, PyObject *unused)
{
    if (ds_check(self) < 0)
        return NULL;
    dh_shm_arena_stats_t s;
    int rc = dh_dataserver_arena_stats(self->ds, &s);
    if (rc < 0)
        return dh__py_raise_dh(rc, "arena_stats");
    return dh__py_arena_stats_dict(&s);
}

static PyObject *DataServer_get_name(DataServerObject *self, void *unused)
{
    if (ds_check(self) < 0)
        return NULL;
    return PyUnicode_FromString(dh_dataserver_name(self->ds));
}

static PyObject *DataServer_get_endpoint(DataServerObject *self, void *unused)
{
    if (ds_check(self) < 0)
        return NULL;
    return PyUnicode_FromString(dh_dataserver_endpoint(self->ds));
}

static PyObject *DataServer_metrics_table(PyObject *unused_cls, PyObject *unused)
{
    return dh__py_metrics_table(DH_METRICS_DATASERVER);
}

static PyMethodDef DataServer_methods[] = {
    {"close", (PyCFunction)DataServer_close, METH_NOARGS, "stop and free"},
    {"stats", (PyCFunction)DataServer_stats, METH_NOARGS, "stats() -> dict of counters"},
    {"metrics_table", (PyCFunction)DataServer_metrics_table, METH_NOARGS | METH_STATIC,
     "metrics_table() -> the DataServer's stats and metrics table: (key, kind, metric, type, "
     "label, help) rows"},
    {"arena_stats", (PyCFunction)DataServer_arena_stats, METH_NOARGS,
     "arena_stats() -> dict: slabs and allocations of its shared-memory arena"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef DataServer_getset[] = {
    {"name", (getter)DataServer_get_name, NULL, "server name", NULL},
    {"endpoint", (getter)DataServer_get_endpoint, NULL, "data endpoint ('' for a sidecar)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject dh__py_dataserver_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.DataServer",
    .tp_basicsize = sizeof(DataServerObject),
    .tp_dealloc = (destructor)DataServer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DataServer(coordinator, node, *, role='local', workers=2, ...): a DataServer on "
              "threads of this process.",
    .tp_methods = DataServer_methods,
    .tp_getset = DataServer_getset,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)DataServer_init,
};
