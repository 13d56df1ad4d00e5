/* rebalance_callbacks.c: tier 2's trampolines (docs/rebalancing.md), the C callbacks that
 * call a client's Python feature_fn, sort_fn and exchange_fn. They run on the client's
 * fetcher thread (or on a RebalanceSpec's caller, the GIL released), so each takes the GIL
 * (PyGILState_Ensure), converts the C arguments, calls the callable and checks and converts
 * its answer; a failure is recorded in the bridge (rebalance.c) and becomes a negative code.
 * PartTensor is a part's tensor as feature_fn sees it, zero-copy, valid during the call.
 */
#include "binding.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- PartTensor --------------------------------------------------------------------- */

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
    return dh__py_fill_buffer((PyObject *)self, &self->tensor, self->shape, self->strides,
                              self->format, view, flags);
}

static PyBufferProcs PartTensor_as_buffer = {(getbufferproc)PartTensor_getbuffer, NULL};

static PyObject *PartTensor_dlpack(PartTensorObject *self, PyObject *args, PyObject *kwargs)
{
    if (part_check(self) < 0)
        return NULL;
    return dh__py_dlpack_export((PyObject *)self, &self->tensor, args, kwargs);
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
    {"__dlpack_device__", dh__py_dlpack_device, METH_NOARGS, "(kDLCPU, 0)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PartTensor_getset[] = {
    {"name", (getter)PartTensor_get_name, NULL, "tensor name ('frames', 'mask')", NULL},
    {"dtype", (getter)PartTensor_get_dtype, NULL, "element type ('uint8', 'float32')", NULL},
    {"shape", (getter)PartTensor_get_shape, NULL, "shape tuple", NULL},
    {"nbytes", (getter)PartTensor_get_nbytes, NULL, "bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject dh__py_part_tensor_type = {
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

/* ---- feature_fn and sort_fn --------------------------------------------------------- */

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
const double dh__py_feature_unused = -4.9406564584124654e-324;

static int feature_unused(double v)
{
    uint64_t a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, &dh__py_feature_unused, sizeof b);
    return a == b;
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

static int feature_call(dh__py_bridge_t *br, const dh_tensor_t *tensors, size_t n_tensors,
                        const dh_client_sample_t *samples, size_t n_samples, double *features,
                        size_t n_features)
{
    PyObject *views = PyDict_New(), *list = NULL, *result = NULL, *seq = NULL;
    int rc = 0;
    for (size_t i = 0; views && i < n_tensors; i++) {
        PartTensorObject *o = PyObject_New(PartTensorObject, &dh__py_part_tensor_type);
        if (!o) {
            Py_CLEAR(views);
            break;
        }
        o->tensor = tensors[i];
        o->valid = 1;
        dh__py_buffer_layout(&o->tensor, o->shape, o->strides, o->format);
        if (dh__py_dict_set_steal(views, tensors[i].name, (PyObject *)o) < 0)
            Py_CLEAR(views);
    }
    PyObject *where = views ? part_name(samples, n_samples) : NULL;
    if (where)
        list = samples_list(samples, n_samples);
    if (!list) {
        Py_XDECREF(where);
        Py_XDECREF(views);
        return dh__py_bridge_fail(br, "", NULL);
    }
    result = PyObject_CallFunctionObjArgs(br->feature_fn, views, list, NULL);
    { /* the views end with the call */
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(views, &pos, &key, &value))
            ((PartTensorObject *)value)->valid = 0;
    }
    if (!result) {
        PyObject *what = dh__py_pending_exception_text();
        rc = dh__py_bridge_fail(br, "rebalance ",
                                PyUnicode_FromFormat("feature_fn raised %U on %U", what, where));
        Py_XDECREF(what);
        goto done;
    }
    seq = PySequence_Fast(result, "");
    if (!seq) {
        PyErr_Clear();
        rc = dh__py_bridge_fail(
            br, "rebalance ",
            PyUnicode_FromFormat("feature_fn returned %s on %U, not a sequence of "
                                 "numbers",
                                 Py_TYPE(result)->tp_name, where));
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int bad_len = br->n_features_auto ? (n < 1 || (size_t)n > n_features) : (size_t)n != n_features;
    if (bad_len) {
        rc = dh__py_bridge_fail(br, "rebalance ",
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
            features[k] = dh__py_feature_unused;
            continue;
        }
        PyObject *item = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)k);
        double v = PyFloat_AsDouble(item);
        if ((v == -1.0 && PyErr_Occurred()) || !isfinite(v)) {
            PyErr_Clear();
            rc = dh__py_bridge_fail(
                br, "rebalance ",
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
int dh__py_feature_cb(void *user, const dh_tensor_t *tensors, size_t n_tensors,
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
static PyObject *round_dict(const dh__py_bridge_t *br, const dh_rebalance_round_t *r)
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

static int sort_call(dh__py_bridge_t *br, const dh_rebalance_round_t *r, uint32_t *new_rank)
{
    char where[96];
    snprintf(where, sizeof where, "rebalance round %llu (group %u): ", (unsigned long long)r->round,
             (unsigned)r->group);
    PyObject *arg = round_dict(br, r), *result = NULL, *seq = NULL;
    int rc = 0;
    if (!arg) {
        rc = dh__py_bridge_fail(
            br, where, PyUnicode_FromString("could not build sort_fn's view of the round"));
        goto done;
    }
    result = PyObject_CallFunctionObjArgs(br->sort_fn, arg, br->args, NULL);
    if (!result) {
        PyObject *what = dh__py_pending_exception_text();
        rc = dh__py_bridge_fail(br, where, PyUnicode_FromFormat("sort_fn raised %U", what));
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
        rc = dh__py_bridge_fail(
            br, where,
            PyUnicode_FromFormat("sort_fn returned %s, not a list of ranks (one per part) or None",
                                 Py_TYPE(result)->tp_name));
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if ((size_t)n != r->n_parts) {
        rc = dh__py_bridge_fail(
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
            rc = dh__py_bridge_fail(
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
            rc = dh__py_bridge_fail(
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
int dh__py_sort_cb(void *user, const dh_rebalance_round_t *round, uint32_t *new_rank)
{
    if (py_exiting())
        return DH_EINVAL;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = sort_call(user, round, new_rank);
    PyGILState_Release(g);
    return rc;
}

/* ---- exchange_fn -------------------------------------------------------------------- */

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
int dh__py_exchange_cb(void *user, uint32_t group, uint64_t round, const uint32_t *ranks,
                       uint32_t n_ranks, const void *send, const size_t *send_counts, void *recv,
                       const size_t *recv_counts)
{
    dh__py_bridge_t *br = user;
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
        rc = dh__py_bridge_fail(br, where,
                                PyUnicode_FromString("could not build exchange_fn's arguments"));
    } else {
        result = PyObject_CallFunction(br->exchange_fn, "KOOOOO", (unsigned long long)round,
                                       rank_list, sv, sc, rv, rcv);
        if (!result) {
            PyObject *what = dh__py_pending_exception_text();
            rc = dh__py_bridge_fail(br, where, PyUnicode_FromFormat("exchange_fn raised %U", what));
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
