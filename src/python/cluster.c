/* cluster.c: Cluster, the in-process cluster (include/datahelix/cluster.h) as one Python
 * object: a coordinator (or one joined) and at most one DataServer as threads of this process,
 * made and started in __init__ (the GIL released), stopped on close() or when freed, each
 * part's counters as dicts. What start_cluster, the torchrun job and the loader's persistent
 * workers start (python/datahelix/cluster.py, loader.py).
 */
#include "binding.h"

#include <string.h>

#include "datahelix/cluster.h"
#include "datahelix/runtime.h"

typedef struct {
    PyObject_HEAD dh_cluster_t *cluster;
} ClusterObject;

static int Cluster_init(ClusterObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"listen",         "advertise",     "join",
                             "policy",         "dead_after_ms", "node",
                             "name",           "role",          "workers",
                             "arena_bytes",    "data_listen",   "data_advertise",
                             "shm_allow_uids", "pipeline_json", "pipeline_path",
                             "keys_dir",       "key_name",      NULL};
    dh_cluster_config_t cfg;
    dh_cluster_config_default(&cfg);
    dh_cluster_server_t server;
    dh_cluster_server_default(&server);
    dh_dataserver_config_t ds_default;
    dh_dataserver_config_default(&ds_default);
    const char *listen = "tcp://127.0.0.1:*", *policy = NULL, *role = "local";
    unsigned dead_after = 0, workers = ds_default.workers;
    unsigned long long arena = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "|$zzzzIzzsIKzzzzzzz", kwlist, &listen, &cfg.advertise, &cfg.join,
            &policy, &dead_after, &server.node, &server.name, &role, &workers, &arena,
            &server.data_listen, &server.data_advertise, &server.shm_allow_uids, &cfg.pipeline_json,
            &cfg.pipeline_path, &cfg.keys_dir, &cfg.key_name))
        return -1;
    if (self->cluster) {
        PyErr_SetString(PyExc_RuntimeError, "Cluster already initialised");
        return -1;
    }
    if (policy) {
        int rc = dh_policy_from_name(policy, &cfg.policy);
        if (rc < 0) {
            dh__py_raise_dh(rc, "Cluster policy");
            return -1;
        }
    }
    if (strcmp(role, "local") == 0) {
        server.role = DH_DS_LOCAL;
    } else if (strcmp(role, "remote") == 0) {
        server.role = DH_DS_REMOTE;
    } else {
        dh__py_raise_inval("Cluster role must be 'local' or 'remote', not '%s'", role);
        return -1;
    }
    if (cfg.join && cfg.join[0] && !(server.node && server.node[0])) {
        dh__py_raise_inval("Cluster join='%s' without node: a cluster that joins a "
                           "coordinator runs a DataServer (give node=)",
                           cfg.join);
        return -1;
    }
    cfg.listen = listen;
    cfg.dead_after_ms = dead_after;
    server.workers = workers;
    server.arena_bytes = arena;
    cfg.servers = &server;
    cfg.n_servers = server.node && server.node[0] ? 1 : 0;
    dh_cluster_t *c = NULL;
    PyThreadState *ts = PyEval_SaveThread();
    int rc = dh_cluster_new(&c, &cfg);
    if (rc == 0)
        rc = dh_cluster_start(c);
    if (rc < 0)
        dh_cluster_destroy(&c);
    PyEval_RestoreThread(ts);
    if (rc < 0) {
        dh__py_raise_dh(rc, NULL);
        return -1;
    }
    self->cluster = c;
    return 0;
}

static void cluster_close(ClusterObject *self)
{
    dh_cluster_t *c = self->cluster;
    self->cluster = NULL;
    if (c) {
        PyThreadState *ts = PyEval_SaveThread();
        dh_cluster_destroy(&c);
        PyEval_RestoreThread(ts);
    }
}

static void Cluster_dealloc(ClusterObject *self)
{
    cluster_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Cluster_close(ClusterObject *self, PyObject *unused)
{
    cluster_close(self);
    Py_RETURN_NONE;
}

static PyObject *Cluster_enter(ClusterObject *self, PyObject *unused)
{
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Cluster_exit(ClusterObject *self, PyObject *args)
{
    cluster_close(self);
    Py_RETURN_FALSE;
}

static int cluster_check(ClusterObject *self)
{
    if (!self->cluster) {
        PyErr_SetString(PyExc_RuntimeError, "the cluster is closed");
        return -1;
    }
    return 0;
}

/* The cluster's coordinator, or NULL with an exception set (closed, or joined one). */
static dh_coordinator_t *coordinator_of(ClusterObject *self)
{
    if (cluster_check(self) < 0)
        return NULL;
    dh_coordinator_t *co = dh_cluster_coordinator(self->cluster);
    if (!co)
        PyErr_Format(PyExc_RuntimeError, "this cluster joined the coordinator %s: it runs none",
                     dh_cluster_endpoint(self->cluster));
    return co;
}

/* The cluster's DataServer, or NULL with an exception set (closed, or a coordinator only). */
static dh_dataserver_t *server_of(ClusterObject *self)
{
    if (cluster_check(self) < 0)
        return NULL;
    if (dh_cluster_count(self->cluster) == 0) {
        PyErr_SetString(PyExc_RuntimeError, "this cluster runs no DataServer (no node=)");
        return NULL;
    }
    return dh_cluster_server(self->cluster, 0);
}

static PyObject *Cluster_coordinator_stats(ClusterObject *self, PyObject *unused)
{
    dh_coordinator_t *co = coordinator_of(self);
    if (!co)
        return NULL;
    dh_coordinator_stats_t s;
    dh_coordinator_stats(co, &s);
    return dh__py_stats_dict(DH_METRICS_COORDINATOR, &s);
}

static PyObject *Cluster_server_stats(ClusterObject *self, PyObject *unused)
{
    dh_dataserver_t *ds = server_of(self);
    if (!ds)
        return NULL;
    dh_dataserver_stats_t s;
    dh_dataserver_stats(ds, &s);
    return dh__py_stats_dict(DH_METRICS_DATASERVER, &s);
}

static PyObject *Cluster_server_arena_stats(ClusterObject *self, PyObject *unused)
{
    dh_dataserver_t *ds = server_of(self);
    if (!ds)
        return NULL;
    dh_shm_arena_stats_t s;
    int rc = dh_dataserver_arena_stats(ds, &s);
    if (rc < 0)
        return dh__py_raise_dh(rc, "arena_stats");
    return dh__py_arena_stats_dict(&s);
}

static PyObject *Cluster_wait_registered(ClusterObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"timeout_ms", "coordinator", NULL};
    unsigned timeout_ms = 10000;
    PyObject *other = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|I$O", kwlist, &timeout_ms, &other))
        return NULL;
    if (cluster_check(self) < 0)
        return NULL;
    const dh_coordinator_t *co;
    if (other == Py_None) {
        co = coordinator_of(self);
    } else if (PyObject_TypeCheck(other, &dh__py_cluster_type)) {
        co = coordinator_of((ClusterObject *)other);
    } else {
        dh__py_raise_inval("Cluster.wait_registered coordinator must be a Cluster of this "
                           "process, not %s",
                           Py_TYPE(other)->tp_name);
        return NULL;
    }
    if (!co)
        return NULL;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = dh_cluster_wait_registered(self->cluster, co, timeout_ms);
    PyEval_RestoreThread(ts);
    if (rc < 0)
        return dh__py_raise_dh(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Cluster_get_endpoint(ClusterObject *self, void *unused)
{
    if (!self->cluster)
        Py_RETURN_NONE;
    return PyUnicode_FromString(dh_cluster_endpoint(self->cluster));
}

static PyObject *Cluster_get_has_coordinator(ClusterObject *self, void *unused)
{
    return PyBool_FromLong(self->cluster && dh_cluster_coordinator(self->cluster));
}

static PyObject *Cluster_get_has_server(ClusterObject *self, void *unused)
{
    return PyBool_FromLong(self->cluster && dh_cluster_count(self->cluster) > 0);
}

static PyObject *Cluster_get_closed(ClusterObject *self, void *unused)
{
    return PyBool_FromLong(self->cluster == NULL);
}

static PyObject *Cluster_get_server_name(ClusterObject *self, void *unused)
{
    dh_dataserver_t *ds = server_of(self);
    return ds ? PyUnicode_FromString(dh_dataserver_name(ds)) : NULL;
}

static PyObject *Cluster_get_server_endpoint(ClusterObject *self, void *unused)
{
    dh_dataserver_t *ds = server_of(self);
    return ds ? PyUnicode_FromString(dh_dataserver_endpoint(ds)) : NULL;
}

static PyMethodDef Cluster_methods[] = {
    {"close", (PyCFunction)Cluster_close, METH_NOARGS,
     "stop and free every part (safe to call again)"},
    {"__enter__", (PyCFunction)Cluster_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Cluster_exit, METH_VARARGS, NULL},
    {"coordinator_stats", (PyCFunction)Cluster_coordinator_stats, METH_NOARGS,
     "coordinator_stats() -> dict of the coordinator's counters"},
    {"server_stats", (PyCFunction)Cluster_server_stats, METH_NOARGS,
     "server_stats() -> dict of the DataServer's counters"},
    {"server_arena_stats", (PyCFunction)Cluster_server_arena_stats, METH_NOARGS,
     "server_arena_stats() -> dict: slabs and allocations of the DataServer's arena"},
    {"wait_registered", (PyCFunction)(void (*)(void))Cluster_wait_registered,
     METH_VARARGS | METH_KEYWORDS,
     "wait_registered(timeout_ms=10000, *, coordinator=None): until the coordinator (this "
     "cluster's, or another Cluster's that this one joined) has the DataServer's HELLO"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Cluster_getset[] = {
    {"endpoint", (getter)Cluster_get_endpoint, NULL,
     "the coordinator's endpoint (None once closed)", NULL},
    {"has_coordinator", (getter)Cluster_get_has_coordinator, NULL,
     "whether it runs a coordinator (False: it joined one, or is closed)", NULL},
    {"has_server", (getter)Cluster_get_has_server, NULL,
     "whether it runs a DataServer (False once closed)", NULL},
    {"closed", (getter)Cluster_get_closed, NULL, "whether close() has run", NULL},
    {"server_name", (getter)Cluster_get_server_name, NULL, "the DataServer's name", NULL},
    {"server_endpoint", (getter)Cluster_get_server_endpoint, NULL,
     "the DataServer's data endpoint ('' for a sidecar)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject dh__py_cluster_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.Cluster",
    .tp_basicsize = sizeof(ClusterObject),
    .tp_dealloc = (destructor)Cluster_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Cluster(*, listen='tcp://127.0.0.1:*', join=None, node=None, workers=2, ...): a "
              "coordinator (unless join=) and a DataServer (when node=) on threads of this "
              "process, through dh_cluster_new (include/datahelix/cluster.h).",
    .tp_methods = Cluster_methods,
    .tp_getset = Cluster_getset,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Cluster_init,
};
