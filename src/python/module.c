/* module.c: datahelix._C, the CPython binding of the public client and runtime API
 * (docs/python.md). Thin on purpose: python/datahelix/ builds the DataLoader on top.
 *
 *   Client       dh_client_t: next() -> Batch (None at the end), stats(), plan(), close()
 *   Batch        dh_client_batch_t: per-sample ids/tokens/errors, tensors() -> Tensor each;
 *                released (slabs back to the arena) when the Batch and every Tensor and
 *                every DLPack capsule or buffer taken from them are gone
 *   Tensor       one tensor of a batch: the buffer protocol and __dlpack__ (CPU), both
 *                zero-copy views of the arena; each holds a reference to its Batch
 *   Coordinator, DataServer   dh_coordinator_t / dh_dataserver_t run as threads of this
 *                process (for a node's shared DataServer under torchrun, and for tests)
 *   errors       DataHelixError and one subclass per entry of the C error table (error.h)
 *
 * Every call that can block (creating a client, next(), closing) releases the GIL. A
 * client's calls are serialised by its own mutex, since the C client belongs to one thread
 * at a time while Python may call it from several.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlpack/dlpack.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/sampler.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"

/* ---- errors ------------------------------------------------------------------------- */

static PyObject *g_base_error;

typedef struct err_class {
    int code;
    const char *c_name; /* "NOMEM" */
    const char *py_name;
    PyObject **builtin; /* a builtin base besides DataHelixError, or NULL */
    const char *doc;
    PyObject *type;
} err_class_t;

/* One Python class per entry of DH_ERRNO_MAP (error.h). The Python names are spelled out
 * here; tests/python/test_errors.py checks that every C entry has one. */
static err_class_t g_errors[] = {
#define DH__PY_ERR(name, code, msg) {code, #name, NULL, NULL, msg, NULL},
    DH_ERRNO_MAP(DH__PY_ERR)
#undef DH__PY_ERR
};

static void name_errors(void)
{
    static const struct {
        const char *c_name, *py_name;
        PyObject **builtin;
    } names[] = {
        {"NOMEM", "OutOfMemoryError", &PyExc_MemoryError},
        {"INVAL", "InvalidArgumentError", &PyExc_ValueError},
        {"NOENT", "NotFoundError", &PyExc_FileNotFoundError},
        {"ACCES", "PermissionDeniedError", &PyExc_PermissionError},
        {"IO", "MediaError", &PyExc_OSError},
        {"RANGE", "OutOfRangeError", &PyExc_ValueError},
        {"AGAIN", "TimeoutError", &PyExc_TimeoutError},
        {"PARSE", "ParseError", &PyExc_ValueError},
        {"SCHEMA", "SchemaError", &PyExc_ValueError},
        {"NOSERVER", "NoServerError", NULL},
        {"INFEASIBLE", "InfeasibleError", NULL},
        {"TOOBIG", "TooBigError", NULL},
        {"UNKNOWN", "UnknownNameError", &PyExc_LookupError},
        {"EOF", "EndOfInputError", NULL},
    };
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strcmp(g_errors[i].c_name, names[k].c_name) == 0) {
                g_errors[i].py_name = names[k].py_name;
                g_errors[i].builtin = names[k].builtin;
            }
}

/* Raises the exception of a negative code with dh_last_error()'s message (the sample, the
 * path, the peer), or the table's message when there is none. Returns NULL. */
static PyObject *raise_dh(int rc, const char *what)
{
    const char *detail = dh_last_error();
    if (!detail || !*detail)
        detail = dh_strerror(rc);
    PyObject *type = g_base_error;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == rc && g_errors[i].type)
            type = g_errors[i].type;
    PyObject *msg =
        what ? PyUnicode_FromFormat("%s: %s", what, detail) : PyUnicode_FromString(detail);
    if (!msg)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(type, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong(rc);
    PyObject *name = PyUnicode_FromString(dh_err_name(rc));
    if (code && name) {
        PyObject_SetAttrString(exc, "code", code);
        PyObject_SetAttrString(exc, "name", name);
    }
    Py_XDECREF(code);
    Py_XDECREF(name);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* ---- small helpers ------------------------------------------------------------------ */

static int dict_set_steal(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

/* ---- Batch -------------------------------------------------------------------------- */

static _Atomic long g_live_batches; /* batches not yet released (tests: nothing leaks) */

typedef struct {
    PyObject_HEAD dh_client_batch_t *batch;
} BatchObject;

static void Batch_dealloc(BatchObject *self)
{
    if (self->batch) {
        dh_client_batch_release(&self->batch);
        g_live_batches--;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

typedef struct {
    PyObject_HEAD BatchObject
        *owner; /* strong reference: the batch stays held while this tensor lives */
    size_t index;
    /* The buffer protocol's view of the tensor: Py_ssize_t shape and BYTE strides, and the
     * format string (DLPack reads the dh_tensor_t itself). */
    Py_ssize_t shape[DH_TENSOR_MAX_DIMS], strides[DH_TENSOR_MAX_DIMS];
    char format[2];
} TensorObject;

static PyTypeObject TensorType;

static PyObject *Batch_tensors(BatchObject *self, PyObject *unused)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (size_t i = 0; i < self->batch->n_tensors; i++) {
        const dh_tensor_t *t = &self->batch->tensors[i];
        TensorObject *o = PyObject_New(TensorObject, &TensorType);
        if (!o) {
            Py_DECREF(d);
            return NULL;
        }
        Py_INCREF(self);
        o->owner = self;
        o->index = i;
        Py_ssize_t elem = (Py_ssize_t)dh_dtype_size(t->dtype);
        for (int32_t k = 0; k < t->ndim && k < DH_TENSOR_MAX_DIMS; k++) {
            o->shape[k] = (Py_ssize_t)t->shape[k];
            o->strides[k] = (Py_ssize_t)t->strides[k] * elem;
        }
        o->format[0] = dh_dtype_format(t->dtype);
        o->format[1] = '\0';
        if (dict_set_steal(d, t->name, (PyObject *)o) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* Per sample: (id, tokens, error code, error message or None), in row order. */
static PyObject *Batch_samples(BatchObject *self, PyObject *unused)
{
    const dh_client_batch_t *b = self->batch;
    PyObject *list = PyList_New((Py_ssize_t)b->n_samples);
    if (!list)
        return NULL;
    for (size_t i = 0; i < b->n_samples; i++) {
        const dh_client_sample_t *s = &b->samples[i];
        PyObject *item = Py_BuildValue("(sLiz)", s->id ? s->id : "", (long long)s->tokens, s->error,
                                       s->error_message);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static PyObject *Batch_get_info(BatchObject *self, void *unused)
{
    const dh_client_batch_t *b = self->batch;
    return Py_BuildValue("{s:K,s:K,s:I,s:n,s:L,s:s,s:d,s:K,s:K}", "index",
                         (unsigned long long)b->index, "step", (unsigned long long)b->step, "epoch",
                         (unsigned)b->epoch, "failed", (Py_ssize_t)b->failed, "tokens",
                         (long long)b->tokens, "server", b->server ? b->server : "", "wait_s",
                         b->wait_s, "ready_ns", (unsigned long long)b->ready_ns, "requested_ns",
                         (unsigned long long)b->requested_ns);
}

static PyMethodDef Batch_methods[] = {
    {"tensors", (PyCFunction)Batch_tensors, METH_NOARGS,
     "tensors() -> dict of name -> Tensor (zero-copy views; each keeps the batch held)"},
    {"samples", (PyCFunction)Batch_samples, METH_NOARGS,
     "samples() -> list of (id, tokens, error code, error message or None), in row order"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Batch_getset[] = {
    {"info", (getter)Batch_get_info, NULL,
     "dict: index, step, epoch, failed, tokens, server, wait_s, ready_ns, requested_ns", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One batch of a client, held until this object and every Tensor taken from it "
              "are freed.",
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};

/* ---- Tensor ------------------------------------------------------------------------- */

static const dh_tensor_t *tensor_of(const TensorObject *self)
{
    return &self->owner->batch->tensors[self->index];
}

static void Tensor_dealloc(TensorObject *self)
{
    Py_XDECREF(self->owner);
    PyObject_Free(self);
}

static int Tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags)
{
    const dh_tensor_t *t = tensor_of(self);
    if (!self->format[0]) {
        PyErr_Format(PyExc_BufferError,
                     "tensor '%s': dtype %s has no buffer format (use "
                     "__dlpack__)",
                     t->name, dh_dtype_name(t->dtype));
        return -1;
    }
    view->buf = t->data;
    view->obj = (PyObject *)self;
    Py_INCREF(self);
    view->len = (Py_ssize_t)t->nbytes;
    view->readonly = 0;
    view->itemsize = (Py_ssize_t)dh_dtype_size(t->dtype);
    view->format = (flags & PyBUF_FORMAT) ? self->format : NULL;
    view->ndim = (int)t->ndim;
    view->shape = (flags & PyBUF_ND) ? self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyBufferProcs Tensor_as_buffer = {(getbufferproc)Tensor_getbuffer, NULL};

/* DLPack: the managed tensor owns a reference to the TensorObject (hence to the batch); its
 * deleter, called by whoever consumed the capsule (torch.from_dlpack), drops it. Its shape
 * and strides are the batch's dh_tensor_t's own (element strides, as DLPack's), which the
 * reference keeps alive. */
typedef struct {
    DLManagedTensor managed;
} dl_holder_t;

static void dl_deleter(DLManagedTensor *m)
{
    if (!m)
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyMem_RawFree(m);
    PyGILState_Release(g);
}

static void dl_capsule_destructor(PyObject *capsule)
{
    /* Not consumed (still named "dltensor"): the capsule owns the tensor. */
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, "dltensor");
        if (m && m->deleter)
            m->deleter(m);
    } else {
        PyErr_Clear();
    }
}

static PyObject *Tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO", kwlist, &stream, &max_version,
                                     &dl_device, &copy))
        return NULL;
    if (stream != Py_None) {
        PyErr_SetString(PyExc_ValueError, "__dlpack__: a CPU tensor takes no stream");
        return NULL;
    }
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: datahelix tensors are zero-copy views "
                                           "of shared memory; copy=True is not supported");
        return NULL;
    }
    const dh_tensor_t *t = tensor_of(self);
    DLDataType dt = {.lanes = 1};
    if (!dh_dtype_dlpack(t->dtype, &dt.code, &dt.bits)) {
        PyErr_Format(PyExc_BufferError, "tensor '%s': unknown dtype %u", t->name,
                     (unsigned)t->dtype);
        return NULL;
    }
    dl_holder_t *h = PyMem_RawCalloc(1, sizeof *h);
    if (!h)
        return PyErr_NoMemory();
    DLTensor *dl = &h->managed.dl_tensor;
    dl->data = t->data;
    dl->device.device_type = kDLCPU;
    dl->device.device_id = 0;
    dl->ndim = t->ndim;
    dl->dtype = dt;
    dl->shape = (int64_t *)t->shape;
    dl->strides = (int64_t *)t->strides;
    dl->byte_offset = 0;
    Py_INCREF(self);
    h->managed.manager_ctx = self;
    h->managed.deleter = dl_deleter;
    PyObject *capsule = PyCapsule_New(&h->managed, "dltensor", dl_capsule_destructor);
    if (!capsule) {
        Py_DECREF(self);
        PyMem_RawFree(h);
        return NULL;
    }
    return capsule;
}

static PyObject *Tensor_dlpack_device(TensorObject *self, PyObject *unused)
{
    return Py_BuildValue("(ii)", (int)kDLCPU, 0);
}

/* (base, size) of the arena mapping the tensor lies in, or None when it came by copy. */
static PyObject *Tensor_arena(TensorObject *self, PyObject *unused)
{
    const void *base = NULL;
    size_t size = 0;
    int rc = dh_client_tensor_arena(self->owner->batch, self->index, &base, &size);
    if (rc < 0)
        return raise_dh(rc, "Tensor.arena");
    if (rc == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)base, (Py_ssize_t)size);
}

static PyObject *Tensor_get_name(TensorObject *self, void *unused)
{
    return PyUnicode_FromString(tensor_of(self)->name);
}

static PyObject *Tensor_get_dtype(TensorObject *self, void *unused)
{
    return PyUnicode_FromString(dh_dtype_name(tensor_of(self)->dtype));
}

static PyObject *Tensor_get_shape(TensorObject *self, void *unused)
{
    const dh_tensor_t *t = tensor_of(self);
    PyObject *tup = PyTuple_New(t->ndim);
    for (int32_t k = 0; tup && k < t->ndim; k++)
        PyTuple_SET_ITEM(tup, k, PyLong_FromLongLong(t->shape[k]));
    return tup;
}

static PyObject *Tensor_get_data_ptr(TensorObject *self, void *unused)
{
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)tensor_of(self)->data);
}

static PyObject *Tensor_get_nbytes(TensorObject *self, void *unused)
{
    return PyLong_FromSize_t(tensor_of(self)->nbytes);
}

static PyMethodDef Tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(stream=None) -> a 'dltensor' capsule viewing the batch's memory"},
    {"__dlpack_device__", (PyCFunction)Tensor_dlpack_device, METH_NOARGS, "(kDLCPU, 0)"},
    {"arena", (PyCFunction)Tensor_arena, METH_NOARGS,
     "arena() -> (base address, bytes) of the shared-memory arena holding the data, or None "
     "when the tensor came by copy"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Tensor_getset[] = {
    {"name", (getter)Tensor_get_name, NULL, "tensor name ('frames', 'mask')", NULL},
    {"dtype", (getter)Tensor_get_dtype, NULL, "element type ('uint8', 'float32')", NULL},
    {"shape", (getter)Tensor_get_shape, NULL, "shape tuple", NULL},
    {"data_ptr", (getter)Tensor_get_data_ptr, NULL, "address of the first element", NULL},
    {"nbytes", (getter)Tensor_get_nbytes, NULL, "bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_dealloc = (destructor)Tensor_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A tensor of a batch: buffer protocol and DLPack, zero-copy.",
    .tp_as_buffer = &Tensor_as_buffer,
    .tp_methods = Tensor_methods,
    .tp_getset = Tensor_getset,
};

/* ---- Client ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD dh_client_t *client;
    pthread_mutex_t lock; /* serialises next/stats/plan/close (taken without the GIL) */
} ClientObject;

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
                             NULL};
    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    const char *on_error = "raise";
    unsigned long long seed = cfg.seed, max_steps = cfg.max_steps, arena = cfg.arena_bytes;
    unsigned rank = 0, ranks = 1, batch = 0, fanout = cfg.fanout, prefetch = cfg.prefetch,
             max_inflight = cfg.max_inflight, epochs = cfg.epochs, first_epoch = 0,
             workers = cfg.workers, prefetch_max = cfg.prefetch_max, local_ranks = cfg.local_ranks;
    int shuffle = cfg.shuffle, token_plan = cfg.token_plan;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "sIII|$zzzIIIKpIIKisiizzIKzII", kwlist, &cfg.profiles, &rank, &ranks,
            &batch, &cfg.coordinator, &cfg.node, &cfg.client_id, &fanout, &prefetch, &max_inflight,
            &seed, &shuffle, &epochs, &first_epoch, &max_steps, &token_plan, &on_error,
            &cfg.next_timeout_ms, &cfg.connect_timeout_ms, &cfg.pipeline_json, &cfg.pipeline_path,
            &workers, &arena, &cfg.policy, &prefetch_max, &local_ranks))
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
    cfg.max_steps = max_steps;
    cfg.token_plan = token_plan;
    cfg.workers = workers;
    cfg.arena_bytes = arena;
    if (cfg.coordinator && !*cfg.coordinator)
        cfg.coordinator = NULL;
    int rc;
    dh_client_t *c = NULL;
    PyThreadState *ts = PyEval_SaveThread();
    rc = dh_client_new(&c, &cfg);
    PyEval_RestoreThread(ts);
    if (rc < 0) {
        raise_dh(rc, NULL);
        return -1;
    }
    self->client = c;
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
    for (;;) {
        PyThreadState *ts = PyEval_SaveThread();
        rc = dh_client_next(self->client, &b);
        PyEval_RestoreThread(ts);
        if (rc != DH_EAGAIN)
            break;
        /* A timeout: give Ctrl-C a chance, then wait again. */
        if (PyErr_CheckSignals() < 0) {
            pthread_mutex_unlock(&self->lock);
            return NULL;
        }
    }
    pthread_mutex_unlock(&self->lock);
    if (rc == DH_EEOF)
        Py_RETURN_NONE;
    if (rc < 0)
        return raise_dh(rc, NULL);
    BatchObject *o = PyObject_New(BatchObject, &BatchType);
    if (!o) {
        dh_client_batch_release(&b);
        return NULL;
    }
    o->batch = b;
    g_live_batches++;
    return (PyObject *)o;
}

static PyObject *Client_stats(ClientObject *self, PyObject *unused)
{
    client_lock(self);
    if (client_check(self) < 0) {
        pthread_mutex_unlock(&self->lock);
        return NULL;
    }
    dh_client_stats_t s;
    dh_client_stats(self->client, &s);
    pthread_mutex_unlock(&self->lock);
    return Py_BuildValue(
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
    int n = dh_client_plan_rank_step(self->client, step, rank, rows, 4096);
    pthread_mutex_unlock(&self->lock);
    if (n < 0)
        return raise_dh(n, "plan");
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

static PyTypeObject ClientType = {
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

/* ---- Coordinator and DataServer ----------------------------------------------------- */

typedef struct {
    PyObject_HEAD dh_coordinator_t *coord;
} CoordinatorObject;

static int Coordinator_init(CoordinatorObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"listen", "policy", "dead_after_ms", NULL};
    dh_coordinator_config_t cfg;
    dh_coordinator_config_default(&cfg);
    const char *policy = NULL;
    unsigned dead_after = cfg.dead_after_ms;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|$zI", kwlist, &cfg.listen, &policy,
                                     &dead_after))
        return -1;
    if (self->coord) {
        PyErr_SetString(PyExc_RuntimeError, "Coordinator already initialised");
        return -1;
    }
    cfg.dead_after_ms = dead_after;
    if (policy) {
        int rc = dh_policy_from_name(policy, &cfg.place.policy);
        if (rc < 0) {
            raise_dh(rc, "Coordinator policy");
            return -1;
        }
    }
    dh_coordinator_t *c = NULL;
    int rc = dh_coordinator_new(&c, &cfg);
    if (rc == 0)
        rc = dh_coordinator_start(c);
    if (rc < 0) {
        dh_coordinator_destroy(&c);
        raise_dh(rc, NULL);
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
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d}", "requests", (unsigned long long)s.requests,
        "dispatches", (unsigned long long)s.dispatches, "redispatches",
        (unsigned long long)s.redispatches, "completes", (unsigned long long)s.completes,
        "delivered", (unsigned long long)s.delivered, "decisions", (unsigned long long)s.decisions,
        "servers_alive", (unsigned long long)s.servers_alive, "clients",
        (unsigned long long)s.clients, "sched_s", s.sched_s);
}

static PyMethodDef Coordinator_methods[] = {
    {"close", (PyCFunction)Coordinator_close, METH_NOARGS, "stop and free"},
    {"stats", (PyCFunction)Coordinator_stats, METH_NOARGS, "stats() -> dict of counters"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Coordinator_getset[] = {
    {"endpoint", (getter)Coordinator_get_endpoint, NULL, "the endpoint bound", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoordinatorType = {
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

typedef struct {
    PyObject_HEAD dh_dataserver_t *ds;
} DataServerObject;

static int DataServer_init(DataServerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"coordinator",   "node",          "role",        "workers",     "name",
                             "pipeline_json", "pipeline_path", "arena_bytes", "data_listen", NULL};
    dh_dataserver_config_t cfg;
    dh_dataserver_config_default(&cfg);
    const char *role = "local";
    unsigned workers = cfg.workers;
    unsigned long long arena = cfg.arena_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|$sIzzzKz", kwlist, &cfg.coordinator,
                                     &cfg.node, &role, &workers, &cfg.name, &cfg.pipeline_json,
                                     &cfg.pipeline_path, &arena, &cfg.data_listen))
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
        raise_dh(rc, NULL);
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
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "tasks", (unsigned long long)s.tasks,
        "samples", (unsigned long long)s.samples, "sample_errors",
        (unsigned long long)s.sample_errors, "delivered_local",
        (unsigned long long)s.delivered_local, "delivered_forwarded",
        (unsigned long long)s.delivered_forwarded, "forwarded", (unsigned long long)s.forwarded,
        "bytes_forwarded", (unsigned long long)s.bytes_forwarded, "bytes_received",
        (unsigned long long)s.bytes_received, "bytes_cross_node",
        (unsigned long long)s.bytes_cross_node, "arena_waits", (unsigned long long)s.arena_waits,
        "undeliverable", (unsigned long long)s.undeliverable, "arena_spills",
        (unsigned long long)s.arena_spills);
}

static PyObject *DataServer_arena_stats(DataServerObject *self, PyObject *unused)
{
    if (ds_check(self) < 0)
        return NULL;
    dh_shm_arena_stats_t s;
    int rc = dh_dataserver_arena_stats(self->ds, &s);
    if (rc < 0)
        return raise_dh(rc, "arena_stats");
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "size_bytes", (unsigned long long)s.size_bytes,
        "slab_size", (unsigned long long)s.slab_size, "slabs_total",
        (unsigned long long)s.slabs_total, "slabs_used", (unsigned long long)s.slabs_used,
        "slabs_reclaimable", (unsigned long long)s.slabs_reclaimable, "allocations_live",
        (unsigned long long)s.allocations_live, "allocations_reclaimable",
        (unsigned long long)s.allocations_reclaimable);
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

static PyMethodDef DataServer_methods[] = {
    {"close", (PyCFunction)DataServer_close, METH_NOARGS, "stop and free"},
    {"stats", (PyCFunction)DataServer_stats, METH_NOARGS, "stats() -> dict of counters"},
    {"arena_stats", (PyCFunction)DataServer_arena_stats, METH_NOARGS,
     "arena_stats() -> dict: slabs and allocations of its shared-memory arena"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef DataServer_getset[] = {
    {"name", (getter)DataServer_get_name, NULL, "server name", NULL},
    {"endpoint", (getter)DataServer_get_endpoint, NULL, "data endpoint ('' for a sidecar)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DataServerType = {
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

/* ---- module ------------------------------------------------------------------------- */

static PyObject *mod_live_batches(PyObject *m, PyObject *unused)
{
    return PyLong_FromLong(g_live_batches);
}

static PyObject *mod_error_table(PyObject *m, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < sizeof g_errors / sizeof g_errors[0]; i++) {
        PyObject *item = Py_BuildValue("(sis)", g_errors[i].c_name, g_errors[i].code,
                                       g_errors[i].py_name ? g_errors[i].py_name : "");
        if (!item || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

static PyObject *mod_raise_error(PyObject *m, PyObject *args)
{
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "is", &code, &msg))
        return NULL;
    dh_clear_error();
    return raise_dh(code, msg);
}

/* plan(profiles, step, rank, ranks, batch, *, seed=0, shuffle=True, token_plan=1, fanout=1)
 * -> the profile rows rank `rank` gets at global step `step`: the client's tier-1 rule
 * (dh_plan_rank_share) without a client, coordinator or DataServer. Reads the profile set
 * each call (without the GIL); a planning script calls it per step and rank. */
static PyObject *mod_plan(PyObject *unused, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"profiles", "step",    "rank",       "ranks",  "batch",
                             "seed",     "shuffle", "token_plan", "fanout", NULL};
    const char *path;
    unsigned long long step, seed = 0;
    unsigned rank, ranks, batch, fanout = 1;
    int shuffle = 1, token_plan = DH_SHARE_TOKEN_BALANCED;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sKIII|$KpiI", kwlist, &path, &step, &rank,
                                     &ranks, &batch, &seed, &shuffle, &token_plan, &fanout))
        return NULL;
    if (token_plan < 0 || token_plan >= DH_SHARE_MODE_COUNT || ranks == 0 || batch == 0 ||
        fanout == 0 || rank >= ranks) {
        PyErr_Format(PyExc_ValueError,
                     "plan: need 0 <= token_plan < %d, ranks, batch and fanout > 0, rank < ranks "
                     "(got token_plan %d, ranks %u, batch %u, fanout %u, rank %u)",
                     DH_SHARE_MODE_COUNT, token_plan, ranks, batch, fanout, rank);
        return NULL;
    }
    dh_share_config_t cfg = {.mode = (dh_share_mode_t)token_plan,
                             .algo = DH_PLAN_ALGO_DEFAULT,
                             .ranks = ranks,
                             .batch = batch,
                             .min_rows = fanout};
    size_t per_step = (size_t)ranks * batch;
    size_t cap = per_step; /* packing gives one rank at most the whole window */
    uint32_t *rows = PyMem_RawMalloc(cap * sizeof *rows);
    if (!rows)
        return PyErr_NoMemory();
    dh_profile_set_t *set = NULL;
    dh_sampler_t *sampler = NULL;
    size_t n_rows = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS if (!(rc = dh_profile_set_new(&set)) &&
                               !(rc = dh_profile_set_load(set, path)) &&
                               (n_rows = dh_profile_set_count(set)) >= per_step &&
                               !(rc = dh_sampler_new(&sampler, n_rows, per_step, seed,
                                                     shuffle != 0))) rc =
        dh_plan_rank_share(&cfg, sampler, set, step, rank, rows, cap);
    dh_sampler_destroy(&sampler);
    dh_profile_set_destroy(&set);
    Py_END_ALLOW_THREADS if (rc == 0 && n_rows < per_step)
    {
        PyMem_RawFree(rows);
        PyErr_Format(PyExc_ValueError,
                     "plan: %s has %zu profile rows, fewer than ranks x batch = %zu", path, n_rows,
                     per_step);
        return NULL;
    }
    if (rc < 0) {
        PyMem_RawFree(rows);
        return raise_dh(rc, "plan");
    }
    PyObject *list = PyList_New(rc);
    for (int i = 0; list && i < rc; i++)
        PyList_SET_ITEM(list, i, PyLong_FromUnsignedLong(rows[i]));
    PyMem_RawFree(rows);
    return list;
}

static PyMethodDef module_methods[] = {
    {"plan", (PyCFunction)(void (*)(void))mod_plan, METH_VARARGS | METH_KEYWORDS,
     "plan(profiles, step, rank, ranks, batch, *, seed=0, shuffle=True, token_plan=1, "
     "fanout=1) -> profile rows that rank gets at that step (no client needed)"},
    {"live_batches", mod_live_batches, METH_NOARGS,
     "live_batches() -> batches of this process not yet released"},
    {"error_table", mod_error_table, METH_NOARGS,
     "error_table() -> [(C name, code, Python class name)] for every C error"},
    {"raise_error", mod_raise_error, METH_VARARGS,
     "raise_error(code, context): raise the exception class of a C error code (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "datahelix._C",
    .m_doc = "The CPython binding of DataHelix's C client and runtime (see datahelix).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__C(void);
PyMODINIT_FUNC PyInit__C(void)
{
    PyTypeObject *types[] = {&BatchType, &TensorType, &ClientType, &CoordinatorType,
                             &DataServerType};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    const char *names[] = {"Batch", "Tensor", "Client", "Coordinator", "DataServer"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0)
            goto fail;
    }
    g_base_error = PyErr_NewExceptionWithDoc("datahelix.DataHelixError",
                                             "Base class of every DataHelix error. Attributes: "
                                             "code (the C code), name ('DH_EIO').",
                                             NULL, NULL);
    if (!g_base_error || PyModule_AddObject(m, "DataHelixError", g_base_error) < 0)
        goto fail;
    Py_INCREF(g_base_error);
    name_errors();
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        err_class_t *e = &g_errors[i];
        if (!e->py_name)
            continue;
        char qual[128];
        snprintf(qual, sizeof qual, "datahelix.%s", e->py_name);
        PyObject *bases =
            e->builtin ? PyTuple_Pack(2, g_base_error, *e->builtin) : PyTuple_Pack(1, g_base_error);
        if (!bases)
            goto fail;
        e->type = PyErr_NewExceptionWithDoc(qual, e->doc, bases, NULL);
        Py_DECREF(bases);
        if (!e->type)
            goto fail;
        Py_INCREF(e->type);
        if (PyModule_AddObject(m, e->py_name, e->type) < 0)
            goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
