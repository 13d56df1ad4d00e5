/* module.c: datahelix._C, the CPython binding of the public client and runtime API
 * (docs/python.md). Thin on purpose: python/datahelix/ builds the DataLoader on top.
 *
 *   Client       dh_client_t: next() -> Batch (None at the end), stats(), plan(), close()
 *   Batch        dh_client_batch_t: per-sample ids/tokens/errors, tensors() -> Tensor each;
 *                released (slabs back to the arena) when the Batch and every Tensor and
 *                every DLPack capsule or buffer taken from them are gone
 *   Tensor       one tensor of a batch: the buffer protocol and __dlpack__ (CPU), both
 *                zero-copy views of the arena; each holds a reference to its Batch
 *   rebalance    tier 2's Python feature_fn and sort_fn, bridged to the C callbacks (they
 *                run on the client's fetcher thread and take the GIL); PartTensor is a
 *                part's tensor as feature_fn sees it, zero-copy, valid during the call
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
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/rng.h"
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
        {"DATASET", "DatasetError", &PyExc_RuntimeError},
        {"AUTH", "AuthError", &PyExc_PermissionError},
    };
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strcmp(g_errors[i].c_name, names[k].c_name) == 0) {
                g_errors[i].py_name = names[k].py_name;
                g_errors[i].builtin = names[k].builtin;
            }
}

/* The exception class of a negative code (DataHelixError for one outside the table). */
static PyObject *error_type(int rc)
{
    PyObject *type = g_base_error;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == rc && g_errors[i].type)
            type = g_errors[i].type;
    return type;
}

/* Raises the exception of a negative code with the message `msg` (a str, stolen; NULL: an
 * error is already set) and, when `cause` is not NULL, that exception as its __cause__.
 * Returns NULL. */
static PyObject *raise_code(int rc, PyObject *msg, PyObject *cause)
{
    if (!msg)
        return NULL;
    PyObject *type = error_type(rc);
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
    if (cause) {
        Py_INCREF(cause);
        PyException_SetCause(exc, cause); /* steals the reference */
    }
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* Raises the exception of a negative code with dh_last_error()'s message (the sample, the
 * path, the peer), or the table's message when there is none. Returns NULL. */
static PyObject *raise_dh(int rc, const char *what)
{
    const char *detail = dh_last_error();
    if (!detail || !*detail)
        detail = dh_strerror(rc);
    return raise_code(
        rc, what ? PyUnicode_FromFormat("%s: %s", what, detail) : PyUnicode_FromString(detail),
        NULL);
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
        /* without the GIL: the release may wait on client state that a rebalance callback
         * holds on the fetcher thread while it waits for the GIL */
        dh_client_batch_t *b = self->batch;
        self->batch = NULL;
        Py_BEGIN_ALLOW_THREADS dh_client_batch_release(&b);
        Py_END_ALLOW_THREADS g_live_batches--;
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
static void buffer_layout(const dh_tensor_t *t, Py_ssize_t *shape, Py_ssize_t *strides,
                          char *format);

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
        buffer_layout(t, o->shape, o->strides, o->format);
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

/* Per sample: whether it is a pad of an epoch's last step (drop_last=False), in row order. */
static PyObject *Batch_padded(BatchObject *self, PyObject *unused)
{
    const dh_client_batch_t *b = self->batch;
    PyObject *list = PyList_New((Py_ssize_t)b->n_samples);
    for (size_t i = 0; list && i < b->n_samples; i++)
        PyList_SET_ITEM(list, (Py_ssize_t)i, PyBool_FromLong(b->samples[i].padded));
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
    {"padded", (PyCFunction)Batch_padded, METH_NOARGS,
     "padded() -> list of bool, in row order: True for a pad of an epoch's last step "
     "(drop_last=False), a repeat of one of the epoch's first samples"},
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

/* Fills a buffer-protocol view of tensor t for `owner` (which the view keeps alive), with
 * Py_ssize_t shape and BYTE strides and the format string kept by the owner. */
static int fill_buffer(PyObject *owner, const dh_tensor_t *t, Py_ssize_t *shape,
                       Py_ssize_t *strides, char *format, Py_buffer *view, int flags)
{
    if (!format[0]) {
        PyErr_Format(PyExc_BufferError,
                     "tensor '%s': dtype %s has no buffer format (use "
                     "__dlpack__)",
                     t->name, dh_dtype_name(t->dtype));
        return -1;
    }
    view->buf = t->data;
    view->obj = owner;
    Py_INCREF(owner);
    view->len = (Py_ssize_t)t->nbytes;
    view->readonly = 0;
    view->itemsize = (Py_ssize_t)dh_dtype_size(t->dtype);
    view->format = (flags & PyBUF_FORMAT) ? format : NULL;
    view->ndim = (int)t->ndim;
    view->shape = (flags & PyBUF_ND) ? shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

/* The buffer protocol's shape, byte strides and format of tensor t. */
static void buffer_layout(const dh_tensor_t *t, Py_ssize_t *shape, Py_ssize_t *strides,
                          char *format)
{
    Py_ssize_t elem = (Py_ssize_t)dh_dtype_size(t->dtype);
    for (int32_t k = 0; k < t->ndim && k < DH_TENSOR_MAX_DIMS; k++) {
        shape[k] = (Py_ssize_t)t->shape[k];
        strides[k] = (Py_ssize_t)t->strides[k] * elem;
    }
    format[0] = dh_dtype_format(t->dtype);
    format[1] = '\0';
}

static int Tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags)
{
    return fill_buffer((PyObject *)self, tensor_of(self), self->shape, self->strides, self->format,
                       view, flags);
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

/* __dlpack__ of tensor t for `owner`: the capsule's tensor holds a reference to owner,
 * which must keep t (its data, shape and strides) alive. */
static PyObject *dlpack_export(PyObject *owner, const dh_tensor_t *t, PyObject *args,
                               PyObject *kwargs)
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
    Py_INCREF(owner);
    h->managed.manager_ctx = owner;
    h->managed.deleter = dl_deleter;
    PyObject *capsule = PyCapsule_New(&h->managed, "dltensor", dl_capsule_destructor);
    if (!capsule) {
        Py_DECREF(owner);
        PyMem_RawFree(h);
        return NULL;
    }
    return capsule;
}

static PyObject *Tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kwargs)
{
    return dlpack_export((PyObject *)self, tensor_of(self), args, kwargs);
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

/* ---- Tier 2: the rebalance callbacks (docs/rebalancing.md) --------------------------
 *
 * A client made with rebalance={...} hands the C runtime two trampolines, feature_cb and
 * sort_cb, with a bridge (below) as their user data. They run on the client's fetcher
 * thread, so each takes the GIL (PyGILState_Ensure), calls the Python callable and
 * converts its answer; an exception or a bad answer becomes a negative code for the C side
 * and a report (summary, traceback, the exception) kept in the bridge under the GIL, which
 * next() attaches to the error it raises for that code. The bridge owns the callables, the
 * args object, its JSON text and the group table, from the client's creation until it is
 * destroyed (its threads joined: no callback runs after). */

/* A part's tensor as feature_fn sees it: the buffer protocol and __dlpack__ over the part's
 * memory, with no copy, valid only during the call (the views refuse new exports after it;
 * a torch tensor or memoryview already taken still points at the part's memory, which
 * moves on with the part: copy what a feature_fn keeps). */
typedef struct {
    PyObject_HEAD dh_tensor_t tensor; /* a copy of the header; data borrowed */
    int valid;
    Py_ssize_t shape[DH_TENSOR_MAX_DIMS], strides[DH_TENSOR_MAX_DIMS];
    char format[2];
} PartTensorObject;

static int part_check(PartTensorObject *self)
{
    if (!self->valid) {
        PyErr_Format(PyExc_BufferError,
                     "part tensor '%s': a feature_fn view is valid only during the call",
                     self->tensor.name);
        return -1;
    }
    return 0;
}

static void PartTensor_dealloc(PartTensorObject *self)
{
    PyObject_Free(self);
}

static int PartTensor_getbuffer(PartTensorObject *self, Py_buffer *view, int flags)
{
    if (part_check(self) < 0)
        return -1;
    return fill_buffer((PyObject *)self, &self->tensor, self->shape, self->strides, self->format,
                       view, flags);
}

static PyBufferProcs PartTensor_as_buffer = {(getbufferproc)PartTensor_getbuffer, NULL};

static PyObject *PartTensor_dlpack(PartTensorObject *self, PyObject *args, PyObject *kwargs)
{
    if (part_check(self) < 0)
        return NULL;
    return dlpack_export((PyObject *)self, &self->tensor, args, kwargs);
}

static PyObject *PartTensor_get_name(PartTensorObject *self, void *unused)
{
    return PyUnicode_FromString(self->tensor.name);
}

static PyObject *PartTensor_get_dtype(PartTensorObject *self, void *unused)
{
    return PyUnicode_FromString(dh_dtype_name(self->tensor.dtype));
}

static PyObject *PartTensor_get_shape(PartTensorObject *self, void *unused)
{
    PyObject *tup = PyTuple_New(self->tensor.ndim);
    for (int32_t k = 0; tup && k < self->tensor.ndim; k++)
        PyTuple_SET_ITEM(tup, k, PyLong_FromLongLong(self->tensor.shape[k]));
    return tup;
}

static PyObject *PartTensor_get_nbytes(PartTensorObject *self, void *unused)
{
    return PyLong_FromSize_t(self->tensor.nbytes);
}

static PyMethodDef PartTensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))PartTensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(stream=None) -> a 'dltensor' capsule viewing the part's memory"},
    {"__dlpack_device__", (PyCFunction)Tensor_dlpack_device, METH_NOARGS, "(kDLCPU, 0)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PartTensor_getset[] = {
    {"name", (getter)PartTensor_get_name, NULL, "tensor name ('frames', 'mask')", NULL},
    {"dtype", (getter)PartTensor_get_dtype, NULL, "element type ('uint8', 'float32')", NULL},
    {"shape", (getter)PartTensor_get_shape, NULL, "shape tuple", NULL},
    {"nbytes", (getter)PartTensor_get_nbytes, NULL, "bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PartTensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.PartTensor",
    .tp_basicsize = sizeof(PartTensorObject),
    .tp_dealloc = (destructor)PartTensor_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A tensor of a materialized part, as a rebalance feature_fn sees it: buffer "
              "protocol and DLPack, zero-copy, valid only during the call.",
    .tp_as_buffer = &PartTensor_as_buffer,
    .tp_methods = PartTensor_methods,
    .tp_getset = PartTensor_getset,
};

/* Raises InvalidArgumentError (DH_EINVAL, a ValueError) with a formatted message. */
static void raise_inval(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    raise_code(DH_EINVAL, msg, NULL);
}

typedef struct rebalance_bridge {
    PyObject *feature_fn;  /* callable or NULL (the C defaults) */
    PyObject *sort_fn;     /* callable or NULL (the default policy and its gate) */
    PyObject *exchange_fn; /* callable or NULL (DataServers forward cross-node moves) */
    PyObject *args;        /* what sort_fn gets as args (None when not given) */
    char *args_json;       /* json.dumps(args) for the C side, or NULL */
    uint32_t *group_of;    /* ranks entries, or NULL (by node) */
    size_t n_features;     /* the C side's vector length */
    int n_features_auto;   /* 1: not given with a feature_fn: n_features is the maximum, the
                            * entries past the returned ones FEATURE_UNUSED, which
                            * sort_fn's view leaves out */
    /* The first callback failure next() has not reported yet (under the GIL). */
    int error_code;
    PyObject *error_cause;   /* str: what failed ("sort_fn raised ValueError: ..."), for
                              * the runtime's message, which names the round */
    PyObject *error_summary; /* str: the same, naming the round or the part itself */
    PyObject *error_detail;  /* str: the traceback, or NULL */
    PyObject *error_exc;     /* the exception raised by the callable, or NULL */
    unsigned long errors;    /* callback failures so far */
} rebalance_bridge_t;

static void bridge_clear_error(rebalance_bridge_t *br)
{
    br->error_code = 0;
    Py_CLEAR(br->error_cause);
    Py_CLEAR(br->error_summary);
    Py_CLEAR(br->error_detail);
    Py_CLEAR(br->error_exc);
}

static void bridge_free(rebalance_bridge_t **p)
{
    rebalance_bridge_t *br = *p;
    if (!br)
        return;
    *p = NULL;
    bridge_clear_error(br);
    Py_XDECREF(br->feature_fn);
    Py_XDECREF(br->sort_fn);
    Py_XDECREF(br->exchange_fn);
    Py_XDECREF(br->args);
    PyMem_RawFree(br->args_json);
    PyMem_RawFree(br->group_of);
    PyMem_RawFree(br);
}

/* Whether the interpreter is shutting down: a callback then fails without touching Python
 * (a thread that takes the GIL during finalisation does not come back). */
static int py_exiting(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* The unused feature slots of an automatic-length vector: the smallest negative
 * subnormal, finite (the runtime refuses others) and never a measure in practice; compared
 * by its bits, so that a denormals-are-zero mode cannot confuse it with -0. */
static const double FEATURE_UNUSED = -4.9406564584124654e-324;

static int feature_unused(double v)
{
    uint64_t a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, &FEATURE_UNUSED, sizeof b);
    return a == b;
}

/* Records a callback failure (GIL held), and returns DH_EINVAL, the code the C side gets:
 * `cause` (stolen) says what failed, `where` names the round or part for a report without
 * the runtime's message ("rebalance round 3 (group 0): "). The Python error in flight, if
 * any, is taken and its traceback kept. Keeps the first failure until next() reports it. */
static int bridge_fail(rebalance_bridge_t *br, const char *where, PyObject *cause)
{
    int code = DH_EINVAL;
    PyObject *type = NULL, *value = NULL, *tb = NULL, *detail = NULL;
    if (PyErr_Occurred()) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (value && tb)
            PyException_SetTraceback(value, tb);
        PyObject *mod = PyImport_ImportModule("traceback");
        if (mod) {
            PyObject *lines =
                PyObject_CallMethod(mod, "format_exception", "OOO", type ? type : Py_None,
                                    value ? value : Py_None, tb ? tb : Py_None);
            if (lines) {
                PyObject *empty = PyUnicode_FromString("");
                if (empty)
                    detail = PyUnicode_Join(empty, lines);
                Py_XDECREF(empty);
                Py_DECREF(lines);
            }
            Py_DECREF(mod);
        }
        PyErr_Clear();
    }
    br->errors++;
    PyObject *summary = cause ? PyUnicode_FromFormat("%s%U", where, cause) : NULL;
    if (!br->error_code && summary) {
        br->error_code = code;
        br->error_cause = cause;
        br->error_summary = summary;
        br->error_detail = detail;
        br->error_exc = value;
        cause = summary = detail = value = NULL;
    }
    Py_XDECREF(cause);
    Py_XDECREF(summary);
    Py_XDECREF(detail);
    Py_XDECREF(value);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_Clear();
    return code;
}

/* "ValueError: message" of the exception in flight (GIL held), or "an error". */
static PyObject *pending_exception_text(void)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL, *text = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (type && value) {
        PyObject *name = PyObject_GetAttrString(type, "__name__");
        PyObject *str = PyObject_Str(value);
        if (name && str)
            text = PyUnicode_GetLength(str) > 0 ? PyUnicode_FromFormat("%U: %U", name, str)
                                                : PyUnicode_FromFormat("%U", name);
        Py_XDECREF(name);
        Py_XDECREF(str);
    }
    if (!text) {
        PyErr_Clear();
        text = PyUnicode_FromString("an error");
    }
    PyErr_Restore(type, value, tb); /* bridge_fail takes it with its traceback */
    return text;
}

/* The samples of a part as feature_fn sees them: [{"id", "tokens", "error"}]. */
static PyObject *samples_list(const dh_client_sample_t *samples, size_t n_samples)
{
    PyObject *list = PyList_New((Py_ssize_t)n_samples);
    for (size_t i = 0; list && i < n_samples; i++) {
        const dh_client_sample_t *s = &samples[i];
        PyObject *item = Py_BuildValue("{s:s,s:L,s:i}", "id", s->id ? s->id : "", "tokens",
                                       (long long)s->tokens, "error", s->error);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

/* Names a part by its samples' ids (the first few), for an error message. */
static PyObject *part_name(const dh_client_sample_t *samples, size_t n_samples)
{
    PyObject *ids = PyList_New(0);
    for (size_t i = 0; ids && i < n_samples && i < 4; i++) {
        PyObject *id = PyUnicode_FromString(samples[i].id ? samples[i].id : "?");
        if (!id || PyList_Append(ids, id) < 0) {
            Py_XDECREF(id);
            Py_CLEAR(ids);
            break;
        }
        Py_DECREF(id);
    }
    if (!ids)
        return NULL;
    PyObject *text =
        PyUnicode_FromFormat("the part of %zu sample%s %R%s", n_samples, n_samples == 1 ? "" : "s",
                             ids, n_samples > 4 ? " ..." : "");
    Py_DECREF(ids);
    return text;
}

static int feature_call(rebalance_bridge_t *br, const dh_tensor_t *tensors, size_t n_tensors,
                        const dh_client_sample_t *samples, size_t n_samples, double *features,
                        size_t n_features)
{
    PyObject *views = PyDict_New(), *list = NULL, *result = NULL, *seq = NULL;
    int rc = 0;
    for (size_t i = 0; views && i < n_tensors; i++) {
        PartTensorObject *o = PyObject_New(PartTensorObject, &PartTensorType);
        if (!o) {
            Py_CLEAR(views);
            break;
        }
        o->tensor = tensors[i];
        o->valid = 1;
        buffer_layout(&o->tensor, o->shape, o->strides, o->format);
        if (dict_set_steal(views, tensors[i].name, (PyObject *)o) < 0)
            Py_CLEAR(views);
    }
    PyObject *where = views ? part_name(samples, n_samples) : NULL;
    if (where)
        list = samples_list(samples, n_samples);
    if (!list) {
        Py_XDECREF(where);
        Py_XDECREF(views);
        return bridge_fail(br, "", NULL);
    }
    result = PyObject_CallFunctionObjArgs(br->feature_fn, views, list, NULL);
    { /* the views end with the call */
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(views, &pos, &key, &value))
            ((PartTensorObject *)value)->valid = 0;
    }
    if (!result) {
        PyObject *what = pending_exception_text();
        rc = bridge_fail(br, "rebalance ",
                         PyUnicode_FromFormat("feature_fn raised %U on %U", what, where));
        Py_XDECREF(what);
        goto done;
    }
    seq = PySequence_Fast(result, "");
    if (!seq) {
        PyErr_Clear();
        rc = bridge_fail(br, "rebalance ",
                         PyUnicode_FromFormat("feature_fn returned %s on %U, not a sequence of "
                                              "numbers",
                                              Py_TYPE(result)->tp_name, where));
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int bad_len = br->n_features_auto ? (n < 1 || (size_t)n > n_features) : (size_t)n != n_features;
    if (bad_len) {
        rc = bridge_fail(br, "rebalance ",
                         br->n_features_auto
                             ? PyUnicode_FromFormat("feature_fn returned %zd values on %U: "
                                                    "between 1 and %zu are allowed",
                                                    n, where, n_features)
                             : PyUnicode_FromFormat("feature_fn returned %zd values on %U, "
                                                    "n_features is %zu",
                                                    n, where, n_features));
        goto done;
    }
    for (size_t k = 0; k < n_features; k++) {
        if ((Py_ssize_t)k >= n) {
            features[k] = FEATURE_UNUSED;
            continue;
        }
        PyObject *item = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)k);
        double v = PyFloat_AsDouble(item);
        if ((v == -1.0 && PyErr_Occurred()) || !isfinite(v)) {
            PyErr_Clear();
            rc = bridge_fail(br, "rebalance ",
                             PyUnicode_FromFormat("feature_fn returned %R at index %zu on %U, not "
                                                  "a finite number",
                                                  item, k, where));
            goto done;
        }
        features[k] = v;
    }
done:
    Py_XDECREF(where);
    Py_XDECREF(seq);
    Py_XDECREF(result);
    Py_XDECREF(list);
    Py_XDECREF(views);
    return rc;
}

/* The C side's feature_fn: runs feature_fn under the GIL on the fetcher thread. */
static int feature_cb(void *user, const dh_tensor_t *tensors, size_t n_tensors,
                      const dh_client_sample_t *samples, size_t n_samples, double *features,
                      size_t n_features)
{
    if (py_exiting())
        return DH_EINVAL;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = feature_call(user, tensors, n_tensors, samples, n_samples, features, n_features);
    PyGILState_Release(g);
    return rc;
}

/* A round as sort_fn sees it: {"group", "round", "ranks", "parts": [{"rank", "batch",
 * "slot", "n_samples", "tokens", "bytes", "cpu_s", "features"}], "s_per_token",
 * "min_gain", "move_s_per_B", "slack_s"}. */
static PyObject *round_dict(const rebalance_bridge_t *br, const dh_rebalance_round_t *r)
{
    PyObject *ranks = PyList_New((Py_ssize_t)r->n_ranks);
    for (uint32_t i = 0; ranks && i < r->n_ranks; i++) {
        PyObject *v = PyLong_FromUnsignedLong(r->ranks[i]);
        if (!v) {
            Py_CLEAR(ranks);
            break;
        }
        PyList_SET_ITEM(ranks, i, v);
    }
    PyObject *parts = ranks ? PyList_New((Py_ssize_t)r->n_parts) : NULL;
    for (size_t i = 0; parts && i < r->n_parts; i++) {
        const dh_rebalance_part_t *p = &r->parts[i];
        size_t n = r->n_features;
        if (br->n_features_auto && br->feature_fn) /* the slots feature_fn did not fill */
            while (n > 0 && p->features && feature_unused(p->features[n - 1]))
                n--;
        PyObject *feats = PyList_New((Py_ssize_t)(p->features ? n : 0));
        for (size_t k = 0; feats && p->features && k < n; k++) {
            PyObject *v = PyFloat_FromDouble(p->features[k]);
            if (!v) {
                Py_CLEAR(feats);
                break;
            }
            PyList_SET_ITEM(feats, (Py_ssize_t)k, v);
        }
        PyObject *item =
            feats ? Py_BuildValue("{s:I,s:K,s:I,s:I,s:d,s:d,s:d,s:N}", "rank", (unsigned)p->rank,
                                  "batch", (unsigned long long)p->batch, "slot", (unsigned)p->slot,
                                  "n_samples", (unsigned)p->n_samples, "tokens", p->tokens, "bytes",
                                  p->bytes, "cpu_s", p->cpu_s, "features", feats)
                  : NULL;
        if (!item) {
            Py_CLEAR(parts);
            break;
        }
        PyList_SET_ITEM(parts, (Py_ssize_t)i, item);
    }
    if (!parts) {
        Py_XDECREF(ranks);
        return NULL;
    }
    return Py_BuildValue("{s:I,s:K,s:N,s:N,s:d,s:d,s:d,s:d}", "group", (unsigned)r->group, "round",
                         (unsigned long long)r->round, "ranks", ranks, "parts", parts,
                         "s_per_token", r->s_per_token, "min_gain", r->min_gain, "move_s_per_B",
                         r->move_s_per_B, "slack_s", r->slack_s);
}

static int sort_call(rebalance_bridge_t *br, const dh_rebalance_round_t *r, uint32_t *new_rank)
{
    char where[96];
    snprintf(where, sizeof where, "rebalance round %llu (group %u): ", (unsigned long long)r->round,
             (unsigned)r->group);
    PyObject *arg = round_dict(br, r), *result = NULL, *seq = NULL;
    int rc = 0;
    if (!arg) {
        rc = bridge_fail(br, where,
                         PyUnicode_FromString("could not build sort_fn's view of the round"));
        goto done;
    }
    result = PyObject_CallFunctionObjArgs(br->sort_fn, arg, br->args, NULL);
    if (!result) {
        PyObject *what = pending_exception_text();
        rc = bridge_fail(br, where, PyUnicode_FromFormat("sort_fn raised %U", what));
        Py_XDECREF(what);
        goto done;
    }
    if (result == Py_None) {
        rc = 1; /* keep */
        goto done;
    }
    seq = PySequence_Fast(result, "");
    if (!seq || PyUnicode_Check(result) || PyBytes_Check(result)) {
        PyErr_Clear();
        rc = bridge_fail(
            br, where,
            PyUnicode_FromFormat("sort_fn returned %s, not a list of ranks (one per part) or None",
                                 Py_TYPE(result)->tp_name));
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if ((size_t)n != r->n_parts) {
        rc = bridge_fail(
            br, where,
            PyUnicode_FromFormat("sort_fn returned %zd ranks for %zu parts", n, r->n_parts));
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        const dh_rebalance_part_t *p = &r->parts[i];
        PyObject *index = PyBool_Check(item) ? NULL : PyNumber_Index(item);
        long long v = index ? PyLong_AsLongLong(index) : -1;
        Py_XDECREF(index);
        if (!index || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            rc = bridge_fail(
                br, where,
                PyUnicode_FromFormat("sort_fn returned %s for part %zd (batch %llu, rank %u, "
                                     "slot %u), not an int rank",
                                     Py_TYPE(item)->tp_name, i, (unsigned long long)p->batch,
                                     (unsigned)p->rank, (unsigned)p->slot));
            goto done;
        }
        int member = 0;
        for (uint32_t k = 0; k < r->n_ranks && !member; k++)
            member = v >= 0 && (unsigned long long)v == r->ranks[k];
        if (!member) {
            rc = bridge_fail(
                br, where,
                PyUnicode_FromFormat("sort_fn gave part %zd (batch %llu, rank %u, slot %u) "
                                     "rank %lld, not a rank of the group",
                                     i, (unsigned long long)p->batch, (unsigned)p->rank,
                                     (unsigned)p->slot, v));
            goto done;
        }
        new_rank[i] = (uint32_t)v;
    }
done:
    Py_XDECREF(seq);
    Py_XDECREF(result);
    Py_XDECREF(arg);
    return rc;
}

/* The C side's sort_fn: runs sort_fn under the GIL on the fetcher thread. */
static int sort_cb(void *user, const dh_rebalance_round_t *round, uint32_t *new_rank)
{
    if (py_exiting())
        return DH_EINVAL;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = sort_call(user, round, new_rank);
    PyGILState_Release(g);
    return rc;
}

/* Reads an int field of the rebalance dict into *out within [lo, hi]; absent or None keeps
 * *out. Returns 0, or -1 with ValueError/TypeError set. */
static int spec_uint(PyObject *spec, const char *key, long long lo, long long hi, long long *out)
{
    PyObject *v = PyDict_GetItemString(spec, key); /* borrowed */
    if (!v || v == Py_None)
        return 0;
    long long x = PyBool_Check(v) ? -1 : PyLong_AsLongLong(v);
    if (PyBool_Check(v) || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "rebalance['%s'] must be an int, not %s", key,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    if (x < lo || x > hi) {
        raise_inval("rebalance['%s'] must be in [%lld, %lld], not %lld", key, lo, hi, x);
        return -1;
    }
    *out = x;
    return 0;
}

static int spec_double(PyObject *spec, const char *key, double *out)
{
    PyObject *v = PyDict_GetItemString(spec, key);
    if (!v || v == Py_None)
        return 0;
    double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "rebalance['%s'] must be a number, not %s", key,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    if (!(x >= 0) || x == Py_HUGE_VAL) {
        raise_inval("rebalance['%s'] must be finite and >= 0, not %R", key, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int spec_callable(PyObject *spec, const char *key, PyObject **out)
{
    PyObject *v = PyDict_GetItemString(spec, key);
    if (!v || v == Py_None)
        return 0;
    if (!PyCallable_Check(v)) {
        PyErr_Format(PyExc_TypeError, "rebalance['%s'] must be callable or None, not %s", key,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    Py_INCREF(v);
    *out = v;
    return 0;
}

/* groups (a list of lists of ranks) -> group_of[ranks]: the listed groups are 0 .. G-1 in
 * order; a rank in no group gets its own id (G, G+1, ...: alone, it does not rebalance). */
static int spec_groups(PyObject *groups, uint32_t ranks, uint32_t **out)
{
    uint32_t *group_of = PyMem_RawMalloc((size_t)ranks * sizeof *group_of);
    if (!group_of) {
        PyErr_NoMemory();
        return -1;
    }
    const uint32_t unset = UINT32_MAX;
    for (uint32_t r = 0; r < ranks; r++)
        group_of[r] = unset;
    PyObject *outer = PySequence_Fast(groups, "rebalance['groups'] must be a list of lists of "
                                              "ranks, or None");
    if (!outer)
        goto fail;
    Py_ssize_t n_groups = PySequence_Fast_GET_SIZE(outer);
    for (Py_ssize_t g = 0; g < n_groups; g++) {
        PyObject *group = PySequence_Fast_GET_ITEM(outer, g);
        PyObject *inner =
            PyUnicode_Check(group) ? NULL : PySequence_Fast(group, "not a list of ranks");
        if (!inner) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "rebalance['groups'][%zd] must be a list of ranks, not %s", g,
                         Py_TYPE(group)->tp_name);
            Py_DECREF(outer);
            goto fail;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(inner);
        if (n == 0) {
            raise_inval("rebalance['groups'][%zd] is empty", g);
            Py_DECREF(inner);
            Py_DECREF(outer);
            goto fail;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(inner, i);
            long long r = PyBool_Check(item) ? -1 : PyLong_AsLongLong(item);
            const char *why = NULL;
            if (PyBool_Check(item) || (r == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "rebalance['groups'][%zd][%zd] must be an int rank, not %s", g, i,
                             Py_TYPE(item)->tp_name);
            } else if (r < 0 || r >= (long long)ranks) {
                why = "out of range";
                raise_inval("rebalance['groups']: rank %lld is %s [0, %u) (group %zd)", r, why,
                            ranks, g);
            } else if (group_of[r] != unset) {
                raise_inval("rebalance['groups']: rank %lld is listed twice (groups %u and %zd)", r,
                            group_of[r], g);
            } else {
                group_of[r] = (uint32_t)g;
                continue;
            }
            Py_DECREF(inner);
            Py_DECREF(outer);
            goto fail;
        }
        Py_DECREF(inner);
    }
    Py_DECREF(outer);
    uint32_t next_id = (uint32_t)n_groups;
    for (uint32_t r = 0; r < ranks; r++)
        if (group_of[r] == unset)
            group_of[r] = next_id++;
    *out = group_of;
    return 0;
fail:
    PyMem_RawFree(group_of);
    return -1;
}

/* A byte buffer of the C side as a memoryview for the call, released after it (a view
 * kept past the call is refused, not dangling; an export taken from it, e.g. a torch
 * tensor, is the caller's to drop: docs/rebalancing.md). */
static PyObject *bytes_view(void *data, size_t len)
{
    static char empty;
    return PyMemoryView_FromMemory(len ? data : &empty, (Py_ssize_t)len, PyBUF_WRITE);
}

static void view_release(PyObject *view)
{
    if (!view)
        return;
    PyObject *r = PyObject_CallMethod(view, "release", NULL);
    if (!r)
        PyErr_Clear();
    Py_XDECREF(r);
    Py_DECREF(view);
}

static PyObject *counts_list(const size_t *counts, uint32_t n)
{
    PyObject *l = PyList_New(n);
    for (uint32_t k = 0; l && k < n; k++) {
        PyObject *v = PyLong_FromSize_t(counts[k]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, k, v);
    }
    return l;
}

/* The C side's exchange_fn: exchange_fn(round, ranks, send, send_counts, recv, recv_counts)
 * under the GIL on the fetcher thread (send and recv: memoryviews valid during the call). */
static int exchange_cb(void *user, uint32_t group, uint64_t round, const uint32_t *ranks,
                       uint32_t n_ranks, const void *send, const size_t *send_counts, void *recv,
                       const size_t *recv_counts)
{
    rebalance_bridge_t *br = user;
    if (py_exiting())
        return DH_EINVAL;
    PyGILState_STATE g = PyGILState_Ensure();
    char where[96];
    snprintf(where, sizeof where, "rebalance round %llu (group %u): ", (unsigned long long)round,
             (unsigned)group);
    size_t sent = 0, got = 0;
    for (uint32_t k = 0; k < n_ranks; k++) {
        sent += send_counts[k];
        got += recv_counts[k];
    }
    int rc = 0;
    PyObject *rank_list = PyList_New(n_ranks);
    for (uint32_t k = 0; rank_list && k < n_ranks; k++) {
        PyObject *v = PyLong_FromUnsignedLong(ranks[k]);
        if (!v) {
            Py_CLEAR(rank_list);
            break;
        }
        PyList_SET_ITEM(rank_list, k, v);
    }
    PyObject *sc = counts_list(send_counts, n_ranks), *rcv = counts_list(recv_counts, n_ranks);
    PyObject *sv = bytes_view((void *)send, sent), *rv = bytes_view(recv, got);
    PyObject *result = NULL;
    if (!rank_list || !sc || !rcv || !sv || !rv) {
        rc =
            bridge_fail(br, where, PyUnicode_FromString("could not build exchange_fn's arguments"));
    } else {
        result = PyObject_CallFunction(br->exchange_fn, "KOOOOO", (unsigned long long)round,
                                       rank_list, sv, sc, rv, rcv);
        if (!result) {
            PyObject *what = pending_exception_text();
            rc = bridge_fail(br, where, PyUnicode_FromFormat("exchange_fn raised %U", what));
            Py_XDECREF(what);
        }
    }
    Py_XDECREF(result);
    view_release(sv);
    view_release(rv);
    Py_XDECREF(sc);
    Py_XDECREF(rcv);
    Py_XDECREF(rank_list);
    PyGILState_Release(g);
    return rc;
}

/* rebalance=None/False (off), True (the C defaults) or a dict (docs/python.md) -> cfg->rebalance
 * and the bridge behind its callbacks (*out, NULL when off). Returns 0 or -1 with an error
 * set. */
static int rebalance_parse(PyObject *spec, uint32_t ranks, dh_rebalance_config_t *cfg,
                           rebalance_bridge_t **out)
{
    static const char *const keys[] = {
        "feature_fn", "sort_fn",          "groups",  "buffer_size", "min_gain",   "move_s_per_B",
        "n_features", "round_timeout_ms", "late_ms", "args",        "exchange_fn"};
    *out = NULL;
    if (!spec || spec == Py_None || spec == Py_False)
        return 0;
    if (spec == Py_True) {
        cfg->enabled = 1;
        return 0;
    }
    if (!PyDict_Check(spec)) {
        PyErr_Format(PyExc_TypeError, "rebalance must be None, a bool or a dict, not %s",
                     Py_TYPE(spec)->tp_name);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(spec, &pos, &key, &value)) {
        int known = 0;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0] && !known; k++)
            known = PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, keys[k]) == 0;
        if (!known) {
            raise_inval("rebalance: unknown key %R (allowed: args, buffer_size, exchange_fn, "
                        "feature_fn, groups, late_ms, min_gain, move_s_per_B, n_features, "
                        "round_timeout_ms, sort_fn)",
                        key);
            return -1;
        }
    }
    rebalance_bridge_t *br = PyMem_RawCalloc(1, sizeof *br);
    if (!br) {
        PyErr_NoMemory();
        return -1;
    }
    long long buffer_size = cfg->buffer_size, n_features = 0,
              timeout = cfg->round_timeout_ms > 0 ? cfg->round_timeout_ms : 10000,
              late = cfg->late_ms;
    PyObject *groups = PyDict_GetItemString(spec, "groups");
    if (spec_callable(spec, "feature_fn", &br->feature_fn) < 0 ||
        spec_callable(spec, "sort_fn", &br->sort_fn) < 0 ||
        spec_callable(spec, "exchange_fn", &br->exchange_fn) < 0 ||
        spec_uint(spec, "buffer_size", 1, UINT32_MAX, &buffer_size) < 0 ||
        spec_uint(spec, "n_features", 1, DH_REBALANCE_MAX_FEATURES, &n_features) < 0 ||
        spec_uint(spec, "round_timeout_ms", 1, INT32_MAX, &timeout) < 0 ||
        spec_uint(spec, "late_ms", 0, INT32_MAX, &late) < 0 ||
        spec_double(spec, "min_gain", &cfg->min_gain) < 0 ||
        spec_double(spec, "move_s_per_B", &cfg->move_s_per_B) < 0 ||
        (groups && groups != Py_None && spec_groups(groups, ranks, &br->group_of) < 0))
        goto fail;
    if (n_features && !br->feature_fn) {
        raise_inval("rebalance['n_features'] is the length of feature_fn's vector: it needs "
                    "a feature_fn");
        goto fail;
    }
    PyObject *args = PyDict_GetItemString(spec, "args");
    br->args = args ? args : Py_None;
    Py_INCREF(br->args);
    if (br->args != Py_None) {
        PyObject *json = PyImport_ImportModule("json");
        PyObject *text = json ? PyObject_CallMethod(json, "dumps", "O", br->args) : NULL;
        Py_XDECREF(json);
        const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
        if (!utf8) {
            PyObject *what = pending_exception_text();
            PyErr_Clear();
            raise_inval("rebalance['args'] must be JSON-serialisable: %U", what);
            Py_XDECREF(what);
            Py_XDECREF(text);
            goto fail;
        }
        size_t len = strlen(utf8);
        br->args_json = PyMem_RawMalloc(len + 1);
        if (!br->args_json) {
            Py_DECREF(text);
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(br->args_json, utf8, len + 1);
        Py_DECREF(text);
    }
    br->n_features = n_features ? (size_t)n_features : DH_REBALANCE_MAX_FEATURES;
    br->n_features_auto = n_features == 0;
    cfg->enabled = 1;
    cfg->group_of = br->group_of;
    cfg->buffer_size = (uint32_t)buffer_size;
    cfg->round_timeout_ms = (int)timeout;
    cfg->late_ms = (int)late;
    cfg->args = br->args_json;
    if (br->feature_fn) {
        cfg->feature_fn = feature_cb;
        cfg->feature_user = br;
        cfg->n_features = br->n_features;
    }
    if (br->sort_fn) {
        cfg->sort_fn = sort_cb;
        cfg->sort_user = br;
    }
    if (br->exchange_fn) {
        cfg->exchange_fn = exchange_cb;
        cfg->exchange_user = br;
    }
    *out = br;
    return 0;
fail:
    bridge_free(&br);
    return -1;
}

/* After next() failed with rc (GIL held): when a callback failed with that code, raises
 * the error with the runtime's message (which names the round and the part) completed by
 * what the callback did, its traceback, and the user's exception as __cause__; returns 1
 * (the report is consumed). Else 0. The C callbacks cannot pass a message (no public call
 * sets dh_last_error()), so the runtime's says "" or the code's text where the callback's
 * would go, before " (kept)": the cause takes that place. */
static int bridge_raise(rebalance_bridge_t *br, int rc)
{
    if (!br || !br->error_code || br->error_code != rc)
        return 0;
    const char *detail = dh_last_error();
    PyObject *head = NULL;
    if (detail && *detail) {
        const char *kept = strstr(detail, " (kept)"), *tail = kept ? kept : detail + strlen(detail);
        size_t len = (size_t)(tail - detail), fallback = strlen(dh_strerror(rc));
        if (len >= fallback && memcmp(tail - fallback, dh_strerror(rc), fallback) == 0)
            len -= fallback;
        while (len > 0 && (detail[len - 1] == ' ' || detail[len - 1] == ':'))
            len--;
        PyObject *runtime = PyUnicode_DecodeUTF8(detail, (Py_ssize_t)len, "replace");
        head = runtime ? PyUnicode_FromFormat("%U: %U%s", runtime, br->error_cause, tail) : NULL;
        Py_XDECREF(runtime);
    } else {
        head = br->error_summary;
        Py_INCREF(head);
    }
    PyObject *msg = head && br->error_detail
                        ? PyUnicode_FromFormat("%U\n%U", head, br->error_detail)
                        : (Py_XINCREF(head), head);
    Py_XDECREF(head);
    PyObject *cause = br->error_exc;
    Py_XINCREF(cause);
    bridge_clear_error(br);
    raise_code(rc, msg, cause);
    Py_XDECREF(cause);
    return 1;
}

/* RebalanceSpec(spec, ranks): a rebalance dict checked and converted as a Client does it,
 * with its callbacks callable here through the same C trampolines the runtime calls (on
 * this thread, the GIL released around them as on the fetcher thread) and failures raised
 * as next() raises them: to check a feature_fn or a sort_fn offline, and for the tests. */
typedef struct {
    PyObject_HEAD dh_rebalance_config_t cfg;
    rebalance_bridge_t *bridge;
    uint32_t ranks;
} RebalanceSpecObject;

static int RebalanceSpec_init(RebalanceSpecObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"spec", "ranks", NULL};
    PyObject *spec;
    unsigned ranks;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OI", kwlist, &spec, &ranks))
        return -1;
    if (ranks == 0) {
        raise_inval("RebalanceSpec: ranks must be > 0");
        return -1;
    }
    dh_client_config_t defaults;
    dh_client_config_default(&defaults);
    bridge_free(&self->bridge);
    self->cfg = defaults.rebalance;
    self->ranks = ranks;
    return rebalance_parse(spec, ranks, &self->cfg, &self->bridge);
}

static void RebalanceSpec_dealloc(RebalanceSpecObject *self)
{
    bridge_free(&self->bridge);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The C config it gives: enabled, group_of (None: by node), buffer_size, min_gain,
 * move_s_per_B, n_features, args (the JSON text), round_timeout_ms, feature_fn, sort_fn. */
static PyObject *RebalanceSpec_get_config(RebalanceSpecObject *self, void *unused)
{
    const dh_rebalance_config_t *c = &self->cfg;
    PyObject *groups = Py_None;
    Py_INCREF(groups);
    if (c->group_of) {
        Py_DECREF(groups);
        groups = PyList_New(self->ranks);
        for (uint32_t r = 0; groups && r < self->ranks; r++)
            PyList_SET_ITEM(groups, r, PyLong_FromUnsignedLong(c->group_of[r]));
        if (!groups)
            return NULL;
    }
    return Py_BuildValue("{s:O,s:N,s:I,s:d,s:d,s:n,s:z,s:i,s:i,s:O,s:O,s:O}", "enabled",
                         c->enabled ? Py_True : Py_False, "group_of", groups, "buffer_size",
                         (unsigned)c->buffer_size, "min_gain", c->min_gain, "move_s_per_B",
                         c->move_s_per_B, "n_features", (Py_ssize_t)c->n_features, "args", c->args,
                         "round_timeout_ms", c->round_timeout_ms, "late_ms", c->late_ms,
                         "feature_fn", c->feature_fn ? Py_True : Py_False, "sort_fn",
                         c->sort_fn ? Py_True : Py_False, "exchange_fn",
                         c->exchange_fn ? Py_True : Py_False);
}

/* After a trampoline failed: raises as next() would (no runtime message here). */
static PyObject *spec_raise(RebalanceSpecObject *self, int rc)
{
    dh_clear_error();
    if (bridge_raise(self->bridge, rc))
        return NULL;
    return raise_dh(rc, "rebalance");
}

/* The dtype whose buffer format is `format` (byte order and native size prefixes aside;
 * 'l'/'L' as the 64-bit ints they are here), or 0. */
static dh_dtype_t dtype_of_format(const char *format, Py_ssize_t itemsize)
{
    while (*format == '@' || *format == '=' || *format == '<' || *format == '|')
        format++;
    char f = format[0];
    if ((f == 'l' || f == 'L') && itemsize == 8)
        f = f == 'l' ? 'q' : 'Q';
    static const dh_dtype_t all[] = {
#define DH__PY_DTYPE(name, code, str, size, dl_code, dl_bits, fmt) DH_DTYPE_##name,
        DH_DTYPE_MAP(DH__PY_DTYPE)
#undef DH__PY_DTYPE
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (f && dh_dtype_format(all[i]) == f && format[1] == '\0')
            return all[i];
    return (dh_dtype_t)0;
}

/* feature(tensors, samples) -> the feature vector: tensors a dict name -> an object with the
 * buffer protocol (a C-contiguous numpy array, say), samples a list of (id, tokens). */
static PyObject *RebalanceSpec_feature(RebalanceSpecObject *self, PyObject *args)
{
    PyObject *tensors, *samples;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &tensors, &samples))
        return NULL;
    if (!self->cfg.feature_fn) {
        raise_inval("RebalanceSpec.feature: the spec has no feature_fn");
        return NULL;
    }
    Py_ssize_t n_tensors = PyDict_Size(tensors);
    if (n_tensors > 16) {
        raise_inval("RebalanceSpec.feature: at most 16 tensors");
        return NULL;
    }
    dh_tensor_t t[16];
    Py_buffer views[16];
    Py_ssize_t held = 0;
    PyObject *seq = NULL, *out = NULL, *key, *value;
    dh_client_sample_t *smp = NULL;
    Py_ssize_t pos = 0;
    memset(t, 0, sizeof t);
    while (PyDict_Next(tensors, &pos, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key);
        if (!name || PyObject_GetBuffer(value, &views[held], PyBUF_RECORDS_RO) < 0)
            goto done;
        Py_buffer *v = &views[held++];
        dh_tensor_t *x = &t[held - 1];
        dh_tensor_set_name(x, name);
        x->dtype = dtype_of_format(v->format ? v->format : "B", v->itemsize);
        if (!x->dtype || v->ndim > DH_TENSOR_MAX_DIMS || !PyBuffer_IsContiguous(v, 'C')) {
            raise_inval("RebalanceSpec.feature: tensor '%s' must be C-contiguous, of at most %d "
                        "dimensions, with a datahelix dtype (format '%s')",
                        name, DH_TENSOR_MAX_DIMS, v->format ? v->format : "B");
            goto done;
        }
        x->ndim = v->ndim;
        for (int k = 0; k < v->ndim; k++)
            x->shape[k] = v->shape ? v->shape[k] : v->len / v->itemsize;
        dh_tensor_set_contiguous(x);
        x->data = v->buf;
    }
    seq = PySequence_Fast(samples, "samples must be a list of (id, tokens)");
    if (!seq)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    smp = PyMem_Calloc((size_t)n + 1, sizeof *smp);
    if (!smp) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long tokens = 0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sL", &smp[i].id, &tokens))
            goto done;
        smp[i].tokens = tokens;
    }
    double features[DH_REBALANCE_MAX_FEATURES];
    size_t n_features = self->cfg.n_features;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = self->cfg.feature_fn(self->cfg.feature_user, t, (size_t)held, smp,
                                                     (size_t)n, features, n_features);
    Py_END_ALLOW_THREADS if (rc < 0)
    {
        spec_raise(self, rc);
        goto done;
    }
    out = PyList_New((Py_ssize_t)n_features);
    for (size_t k = 0; out && k < n_features; k++)
        PyList_SET_ITEM(out, (Py_ssize_t)k, PyFloat_FromDouble(features[k]));
done:
    PyMem_Free(smp);
    Py_XDECREF(seq);
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    return out;
}

/* A double field of a dict (0 when absent). Returns 0 or -1 with an error set. */
static int dict_double(PyObject *d, const char *key, double *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    *out = 0;
    if (!v)
        return 0;
    *out = PyFloat_AsDouble(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int dict_u64(PyObject *d, const char *key, unsigned long long *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    *out = 0;
    if (!v)
        return 0;
    *out = PyLong_AsUnsignedLongLong(v);
    return *out == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

/* sort(round) -> new ranks (one per part), or None (keep): round as sort_fn sees it
 * ({"group", "round", "ranks", "parts": [{"rank", "batch", "slot", "n_samples", "tokens",
 * "bytes", "cpu_s", "features"}], "s_per_token", "min_gain", "move_s_per_B"}). */
static PyObject *RebalanceSpec_sort(RebalanceSpecObject *self, PyObject *arg)
{
    if (!self->cfg.sort_fn) {
        raise_inval("RebalanceSpec.sort: the spec has no sort_fn");
        return NULL;
    }
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "RebalanceSpec.sort: round must be a dict");
        return NULL;
    }
    PyObject *ranks_seq = NULL, *parts_seq = NULL, *out = NULL;
    uint32_t *ranks = NULL, *new_rank = NULL;
    dh_rebalance_part_t *parts = NULL;
    double *features = NULL;
    dh_rebalance_round_t r = {.args = self->cfg.args, .n_features = self->cfg.n_features};
    unsigned long long u = 0;
    if (dict_u64(arg, "group", &u) < 0)
        goto done;
    r.group = (uint32_t)u;
    if (dict_u64(arg, "round", &u) < 0)
        goto done;
    r.round = u;
    if (dict_double(arg, "s_per_token", &r.s_per_token) < 0 ||
        dict_double(arg, "min_gain", &r.min_gain) < 0 ||
        dict_double(arg, "move_s_per_B", &r.move_s_per_B) < 0)
        goto done;
    PyObject *rk = PyDict_GetItemString(arg, "ranks"), *pt = PyDict_GetItemString(arg, "parts");
    if (!rk || !pt) {
        raise_inval("RebalanceSpec.sort: round needs 'ranks' and 'parts'");
        goto done;
    }
    if (!(ranks_seq = PySequence_Fast(rk, "round['ranks'] must be a list")) ||
        !(parts_seq = PySequence_Fast(pt, "round['parts'] must be a list")))
        goto done;
    r.n_ranks = (uint32_t)PySequence_Fast_GET_SIZE(ranks_seq);
    r.n_parts = (size_t)PySequence_Fast_GET_SIZE(parts_seq);
    if (!r.n_features)
        r.n_features = 3; /* the defaults: tokens, bytes, cpu_s */
    ranks = PyMem_Calloc(r.n_ranks + 1, sizeof *ranks);
    new_rank = PyMem_Calloc(r.n_parts + 1, sizeof *new_rank);
    parts = PyMem_Calloc(r.n_parts + 1, sizeof *parts);
    features = PyMem_Calloc(r.n_parts * r.n_features + 1, sizeof *features);
    if (!ranks || !new_rank || !parts || !features) {
        PyErr_NoMemory();
        goto done;
    }
    for (uint32_t i = 0; i < r.n_ranks; i++) {
        ranks[i] = (uint32_t)PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(ranks_seq, i));
        if (PyErr_Occurred())
            goto done;
    }
    for (size_t i = 0; i < r.n_parts; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(parts_seq, (Py_ssize_t)i);
        dh_rebalance_part_t *q = &parts[i];
        if (!PyDict_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "round['parts'] must hold dicts");
            goto done;
        }
        unsigned long long rank, batch, slot, n_samples;
        if (dict_u64(p, "rank", &rank) < 0 || dict_u64(p, "batch", &batch) < 0 ||
            dict_u64(p, "slot", &slot) < 0 || dict_u64(p, "n_samples", &n_samples) < 0 ||
            dict_double(p, "tokens", &q->tokens) < 0 || dict_double(p, "bytes", &q->bytes) < 0 ||
            dict_double(p, "cpu_s", &q->cpu_s) < 0)
            goto done;
        q->rank = (uint32_t)rank;
        q->batch = batch;
        q->slot = (uint32_t)slot;
        q->n_samples = (uint32_t)n_samples;
        double *f = features + i * r.n_features;
        for (size_t k = 0; k < r.n_features; k++)
            f[k] = self->bridge && self->bridge->n_features_auto ? FEATURE_UNUSED : 0.0;
        PyObject *fv = PyDict_GetItemString(p, "features");
        PyObject *fs = fv ? PySequence_Fast(fv, "a part's 'features' must be a list") : NULL;
        if (fv && !fs)
            goto done;
        for (Py_ssize_t k = 0; fs && k < PySequence_Fast_GET_SIZE(fs) && (size_t)k < r.n_features;
             k++) {
            f[k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fs, k));
            if (f[k] == -1.0 && PyErr_Occurred()) {
                Py_DECREF(fs);
                goto done;
            }
        }
        Py_XDECREF(fs);
        q->features = f;
    }
    r.ranks = ranks;
    r.parts = parts;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = self->cfg.sort_fn(self->cfg.sort_user, &r, new_rank);
    Py_END_ALLOW_THREADS if (rc < 0)
    {
        spec_raise(self, rc);
        goto done;
    }
    if (rc == 1) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    out = PyList_New((Py_ssize_t)r.n_parts);
    for (size_t i = 0; out && i < r.n_parts; i++)
        PyList_SET_ITEM(out, (Py_ssize_t)i, PyLong_FromUnsignedLong(new_rank[i]));
done:
    Py_XDECREF(ranks_seq);
    Py_XDECREF(parts_seq);
    PyMem_Free(ranks);
    PyMem_Free(new_rank);
    PyMem_Free(parts);
    PyMem_Free(features);
    return out;
}

static PyMethodDef RebalanceSpec_methods[] = {
    {"feature", (PyCFunction)RebalanceSpec_feature, METH_VARARGS,
     "feature(tensors, samples) -> the feature vector feature_fn gives the C side"},
    {"sort", (PyCFunction)RebalanceSpec_sort, METH_O,
     "sort(round) -> new ranks (one per part) or None (keep), as the C side gets them"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef RebalanceSpec_getset[] = {
    {"config", (getter)RebalanceSpec_get_config, NULL,
     "dict: the dh_rebalance_config_t this spec gives a client", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RebalanceSpecType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.RebalanceSpec",
    .tp_basicsize = sizeof(RebalanceSpecObject),
    .tp_dealloc = (destructor)RebalanceSpec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RebalanceSpec(spec, ranks): a Client's rebalance= argument, checked and "
              "converted; feature() and sort() call its callbacks as the runtime does.",
    .tp_methods = RebalanceSpec_methods,
    .tp_getset = RebalanceSpec_getset,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RebalanceSpec_init,
};

/* ---- Client ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD dh_client_t *client;
    pthread_mutex_t lock;          /* serialises next/stats/plan/close (taken without the GIL) */
    rebalance_bridge_t *rebalance; /* tier 2's callbacks, or NULL; freed after the client */
    int timeout_ms; /* next()'s limit (next_timeout_ms; -1: none): the C client waits in
                     * slices of at most NEXT_SLICE_MS, so Ctrl-C is seen between them */
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
    rebalance_bridge_t *bridge = NULL;
    if (rebalance_parse(rebalance, ranks, &cfg.rebalance, &bridge) < 0)
        return -1;
    int rc;
    dh_client_t *c = NULL;
    PyThreadState *ts = PyEval_SaveThread();
    rc = dh_client_new(&c, &cfg);
    PyEval_RestoreThread(ts);
    if (rc < 0) {
        bridge_free(&bridge);
        raise_dh(rc, NULL);
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
    bridge_free(&self->rebalance);
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
            return raise_code(DH_EAGAIN,
                              PyUnicode_FromFormat("next(): no batch within the timeout of %d ms "
                                                   "(%s)",
                                                   self->timeout_ms, dh_last_error()),
                              NULL);
        }
    }
    pthread_mutex_unlock(&self->lock);
    if (rc == DH_EEOF)
        Py_RETURN_NONE;
    if (rc < 0 && bridge_raise(self->rebalance, rc))
        return NULL;
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
        dict_set_steal(d, "rebalance_rounds", PyLong_FromUnsignedLongLong(s.rebalance_rounds)) ||
        dict_set_steal(d, "rebalance_applied", PyLong_FromUnsignedLongLong(s.rebalance_applied)) ||
        dict_set_steal(d, "rebalance_kept_by_gate",
                       PyLong_FromUnsignedLongLong(s.rebalance_kept_by_gate)) ||
        dict_set_steal(d, "rebalance_moved_parts",
                       PyLong_FromUnsignedLongLong(s.rebalance_moved_parts)) ||
        dict_set_steal(d, "rebalance_moved_samples",
                       PyLong_FromUnsignedLongLong(s.rebalance_moved_samples)) ||
        dict_set_steal(d, "rebalance_bytes", PyLong_FromUnsignedLongLong(s.rebalance_bytes)) ||
        dict_set_steal(d, "rebalance_bytes_remote",
                       PyLong_FromUnsignedLongLong(s.rebalance_bytes_remote)) ||
        dict_set_steal(d, "rebalance_s_p95", PyFloat_FromDouble(s.rebalance_s_p95)) ||
        dict_set_steal(d, "rebalance_s_max", PyFloat_FromDouble(s.rebalance_s_max)) ||
        dict_set_steal(d, "rebalance_final_s_p95", PyFloat_FromDouble(s.rebalance_final_s_p95)) ||
        dict_set_steal(d, "rebalance_exchanges",
                       PyLong_FromUnsignedLongLong(s.rebalance_exchanges)) ||
        dict_set_steal(d, "rebalance_transfer_s_p95",
                       PyFloat_FromDouble(s.rebalance_transfer_s_p95)) ||
        dict_set_steal(d, "rebalance_transfer_s_total",
                       PyFloat_FromDouble(s.rebalance_transfer_s_total)) ||
        dict_set_steal(d, "rebalance_callback_errors",
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
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "tasks",
        (unsigned long long)s.tasks, "samples", (unsigned long long)s.samples, "sample_errors",
        (unsigned long long)s.sample_errors, "delivered_local",
        (unsigned long long)s.delivered_local, "delivered_forwarded",
        (unsigned long long)s.delivered_forwarded, "forwarded", (unsigned long long)s.forwarded,
        "bytes_forwarded", (unsigned long long)s.bytes_forwarded, "bytes_received",
        (unsigned long long)s.bytes_received, "bytes_cross_node",
        (unsigned long long)s.bytes_cross_node, "arena_waits", (unsigned long long)s.arena_waits,
        "undeliverable", (unsigned long long)s.undeliverable, "arena_spills",
        (unsigned long long)s.arena_spills, "rebalance_sent", (unsigned long long)s.rebalance_sent,
        "output_waits", (unsigned long long)s.output_waits);
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

/* epoch_seed(seed, epoch) -> the base seed of a loader's pass over that epoch (what its Python
 * dataset's workers seed from: dh_rng_epoch_seed). */
static PyObject *mod_epoch_seed(PyObject *m, PyObject *args)
{
    unsigned long long seed, epoch;
    if (!PyArg_ParseTuple(args, "KK", &seed, &epoch))
        return NULL;
    return PyLong_FromUnsignedLongLong(dh_rng_epoch_seed(seed, epoch));
}

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

/* plan(profiles, step, rank, ranks, batch, *, seed=0, shuffle=True, token_plan=1, fanout=1,
 * plan_window=1, drop_last=True) -> the profile rows rank `rank` gets at global step `step`: the
 * client's tier-1 rule (dh_plan_rank_share) without a client, coordinator or DataServer. Reads the
 * profile set each call (without the GIL); a planning script calls it per step and rank. */
static PyObject *mod_plan(PyObject *unused, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"profiles", "step",       "rank",   "ranks",       "batch",     "seed",
                             "shuffle",  "token_plan", "fanout", "plan_window", "drop_last", NULL};
    const char *path;
    unsigned long long step, seed = 0;
    unsigned rank, ranks, batch, fanout = 1, plan_window = 1;
    int shuffle = 1, token_plan = DH_SHARE_TOKEN_BALANCED, drop_last = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sKIII|$KpiIIp", kwlist, &path, &step, &rank,
                                     &ranks, &batch, &seed, &shuffle, &token_plan, &fanout,
                                     &plan_window, &drop_last))
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
                             .min_rows = fanout,
                             .window_steps = plan_window};
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
                                                     shuffle != 0)) &&
                               !(rc = dh_sampler_set_drop_last(sampler, drop_last, ranks))) rc =
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

/* set_log_level(name): the C side's log threshold ("error", "warn", "info", "debug"), for
 * every thread of this process; returns the previous one's name. */
static PyObject *mod_set_log_level(PyObject *m, PyObject *args)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    dh_log_level_t level, before = dh_log_level();
    if (dh_log_level_parse(name, &level) != 0) {
        dh_clear_error();
        return raise_code(DH_EINVAL,
                          PyUnicode_FromFormat("log_level '%s': not one of error, warn, info, "
                                               "debug",
                                               name),
                          NULL);
    }
    dh_log_set_level(level);
    return PyUnicode_FromString(names[before]);
}

static PyMethodDef module_methods[] = {
    {"set_log_level", mod_set_log_level, METH_VARARGS,
     "set_log_level(name) -> the previous level: the C side's log threshold (error, warn, "
     "info, debug) for this process"},
    {"plan", (PyCFunction)(void (*)(void))mod_plan, METH_VARARGS | METH_KEYWORDS,
     "plan(profiles, step, rank, ranks, batch, *, seed=0, shuffle=True, token_plan=1, "
     "fanout=1, plan_window=1, drop_last=True) -> profile rows that rank gets at that step "
     "(no client needed)"},
    {"live_batches", mod_live_batches, METH_NOARGS,
     "live_batches() -> batches of this process not yet released"},
    {"error_table", mod_error_table, METH_NOARGS,
     "error_table() -> [(C name, code, Python class name)] for every C error"},
    {"raise_error", mod_raise_error, METH_VARARGS,
     "raise_error(code, context): raise the exception class of a C error code (tests)"},
    {"epoch_seed", mod_epoch_seed, METH_VARARGS,
     "epoch_seed(seed, epoch) -> the base seed of a pass over that epoch (its Python "
     "workers seed from it)"},
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
    PyTypeObject *types[] = {&BatchType,      &TensorType,     &ClientType,       &CoordinatorType,
                             &DataServerType, &PartTensorType, &RebalanceSpecType};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    const char *names[] = {"Batch",      "Tensor",     "Client",       "Coordinator",
                           "DataServer", "PartTensor", "RebalanceSpec"};
    _Static_assert(sizeof names / sizeof names[0] == sizeof types / sizeof types[0],
                   "a name per type");
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
