/* batch.c: a client's batch as Python sees it. Batch holds a dh_client_batch_t; its tensors()
 * are Tensor objects, zero-copy views of the arena through the buffer protocol and __dlpack__
 * (CPU), each holding a reference to its Batch. The batch is released (slabs back to the
 * arena) when the Batch and every Tensor and every DLPack capsule or buffer taken from them
 * are gone. The buffer and DLPack exports are shared with PartTensor
 * (rebalance_callbacks.c); Client.next() (client.c) makes the Batch objects.
 */
#include "binding.h"

#include <dlpack/dlpack.h>

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

static PyObject *Batch_tensors(BatchObject *self, PyObject *unused)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (size_t i = 0; i < self->batch->n_tensors; i++) {
        const dh_tensor_t *t = &self->batch->tensors[i];
        TensorObject *o = PyObject_New(TensorObject, &dh__py_tensor_type);
        if (!o) {
            Py_DECREF(d);
            return NULL;
        }
        Py_INCREF(self);
        o->owner = self;
        o->index = i;
        dh__py_buffer_layout(t, o->shape, o->strides, o->format);
        if (dh__py_dict_set_steal(d, t->name, (PyObject *)o) < 0) {
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

PyTypeObject dh__py_batch_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One batch of a client, held until this object and every Tensor taken from it "
              "are freed.",
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};

PyObject *dh__py_batch_new(dh_client_batch_t **batch)
{
    dh_client_batch_t *b = *batch;
    *batch = NULL;
    BatchObject *o = PyObject_New(BatchObject, &dh__py_batch_type);
    if (!o) {
        dh_client_batch_release(&b);
        return NULL;
    }
    o->batch = b;
    g_live_batches++;
    return (PyObject *)o;
}

long dh__py_live_batches(void)
{
    return g_live_batches;
}

/* ---- Tensor: the buffer protocol and DLPack ----------------------------------------- */

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
int dh__py_fill_buffer(PyObject *owner, const dh_tensor_t *t, Py_ssize_t *shape,
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
void dh__py_buffer_layout(const dh_tensor_t *t, Py_ssize_t *shape, Py_ssize_t *strides,
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
    return dh__py_fill_buffer((PyObject *)self, tensor_of(self), self->shape, self->strides,
                              self->format, view, flags);
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
PyObject *dh__py_dlpack_export(PyObject *owner, const dh_tensor_t *t, PyObject *args,
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
    return dh__py_dlpack_export((PyObject *)self, tensor_of(self), args, kwargs);
}

PyObject *dh__py_dlpack_device(PyObject *self, PyObject *unused)
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
        return dh__py_raise_dh(rc, "Tensor.arena");
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
    {"__dlpack_device__", dh__py_dlpack_device, METH_NOARGS, "(kDLCPU, 0)"},
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

PyTypeObject dh__py_tensor_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "datahelix._C.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_dealloc = (destructor)Tensor_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A tensor of a batch: buffer protocol and DLPack, zero-copy.",
    .tp_as_buffer = &Tensor_as_buffer,
    .tp_methods = Tensor_methods,
    .tp_getset = Tensor_getset,
};
