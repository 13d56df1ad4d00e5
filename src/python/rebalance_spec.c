/* rebalance_spec.c: RebalanceSpec, tier 2's rebalance dict outside a client
 * (docs/rebalancing.md). It holds what a Client would (the C config and the bridge, from the
 * parse of rebalance.c) and calls the trampolines of rebalance_callbacks.c with C arguments
 * it builds from Python values, so nothing here repeats their checks.
 */
#include "binding.h"

#include <string.h>

/* RebalanceSpec(spec, ranks): a rebalance dict checked and converted as a Client does it,
 * with its callbacks callable here through the same C trampolines the runtime calls (on
 * this thread, the GIL released around them as on the fetcher thread) and failures raised
 * as next() raises them: to check a feature_fn or a sort_fn offline, and for the tests. */
typedef struct {
    PyObject_HEAD dh_rebalance_config_t cfg;
    dh__py_bridge_t *bridge;
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
        dh__py_raise_inval("RebalanceSpec: ranks must be > 0");
        return -1;
    }
    dh_client_config_t defaults;
    dh_client_config_default(&defaults);
    dh__py_bridge_free(&self->bridge);
    self->cfg = defaults.rebalance;
    self->ranks = ranks;
    return dh__py_rebalance_parse(spec, ranks, &self->cfg, &self->bridge);
}

static void RebalanceSpec_dealloc(RebalanceSpecObject *self)
{
    dh__py_bridge_free(&self->bridge);
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
    if (dh__py_bridge_raise(self->bridge, rc))
        return NULL;
    return dh__py_raise_dh(rc, "rebalance");
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
        dh__py_raise_inval("RebalanceSpec.feature: the spec has no feature_fn");
        return NULL;
    }
    Py_ssize_t n_tensors = PyDict_Size(tensors);
    if (n_tensors > 16) {
        dh__py_raise_inval("RebalanceSpec.feature: at most 16 tensors");
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
            dh__py_raise_inval(
                "RebalanceSpec.feature: tensor '%s' must be C-contiguous, of at most %d "
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
        dh__py_raise_inval("RebalanceSpec.sort: the spec has no sort_fn");
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
        dh__py_raise_inval("RebalanceSpec.sort: round needs 'ranks' and 'parts'");
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
            f[k] = self->bridge && self->bridge->n_features_auto ? dh__py_feature_unused : 0.0;
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

PyTypeObject dh__py_rebalance_spec_type = {
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
