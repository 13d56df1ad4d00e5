/* values.c: the values the C side owns, handed to python/datahelix so that it re-implements
 * none of them (issue 32, "values the C side owns come from C"): the arena budget
 * (dh_arena_budget_default), the byte-count parser (dh_arena_parse_bytes, the one the CLI's
 * --arena-budget uses), the profile row writer (dh_profile_row_write) and the dtype table
 * (DH_DTYPE_MAP) as _C.DTYPES. The rebalance keys (_C.REBALANCE_KEYS) are rebalance.c's, next
 * to the parse that reads them; module.c registers the functions here in its method table.
 */
#include "binding.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/tensor.h"

/* arena_budget_default() -> the memory budget of an arena this process makes. */
PyObject *dh__py_arena_budget_default(PyObject *m, PyObject *unused)
{
    uint64_t budget;
    Py_BEGIN_ALLOW_THREADS budget = dh_arena_budget_default(); /* reads /proc and the cgroup */
    Py_END_ALLOW_THREADS return PyLong_FromUnsignedLongLong(budget);
}

/* parse_bytes(text, what="size") -> the byte count of `text` as the C side parses it. */
PyObject *dh__py_parse_bytes(PyObject *m, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"text", "what", NULL};
    PyObject *text;
    const char *what = "size";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|s", kwlist, &text, &what))
        return NULL;
    if (!PyUnicode_Check(text)) {
        dh__py_raise_inval("%s: %R is not a byte count (a str such as '8G', '512M', '1048576')",
                           what, text);
        return NULL;
    }
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(text, &len);
    if (!s)
        return NULL;
    uint64_t v;
    dh_clear_error();
    int rc = strlen(s) == (size_t)len ? dh_arena_parse_bytes(s, what, &v)
                                      : DH_EINVAL; /* an embedded NUL: no message yet */
    if (rc < 0) {
        if (!dh_last_error() || !*dh_last_error()) {
            dh__py_raise_inval("%s: %R is not a byte count", what, text);
            return NULL;
        }
        return dh__py_raise_dh(rc, NULL);
    }
    return PyLong_FromUnsignedLongLong(v);
}

/* ---- profile rows ------------------------------------------------------------------- */

/* The row's fields that the writer knows; anything else goes into `extra`. */
static const char *const row_fields[] = {"id",       "uri",       "profile_key", "frames",
                                         "height",   "width",     "tokens_est",  "cpu_s_est",
                                         "in_bytes", "out_bytes", "duration_s",  "fps",
                                         "text_len", "codec",     "node"};

static int row_str(PyObject *d, const char *key, int required, const char **out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    *out = NULL;
    if (!v || (v == Py_None && !required)) {
        if (required)
            dh__py_raise_code(
                DH_ESCHEMA, PyUnicode_FromFormat("profile row: field '%s' is missing", key), NULL);
        return required ? -1 : 0;
    }
    if (!PyUnicode_Check(v)) {
        dh__py_raise_code(DH_ESCHEMA,
                          PyUnicode_FromFormat("profile row: field '%s' must be a str, not %s", key,
                                               Py_TYPE(v)->tp_name),
                          NULL);
        return -1;
    }
    return (*out = PyUnicode_AsUTF8(v)) ? 0 : -1;
}

static int row_int(PyObject *d, const char *key, int required, long long lo, long long hi,
                   long long *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    *out = 0;
    if (!v || (v == Py_None && !required)) {
        if (required)
            dh__py_raise_code(
                DH_ESCHEMA, PyUnicode_FromFormat("profile row: field '%s' is missing", key), NULL);
        return required ? -1 : 0;
    }
    int overflow = 0;
    long long x =
        PyLong_Check(v) && !PyBool_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : -1;
    if (PyErr_Occurred())
        return -1;
    if (!PyLong_Check(v) || PyBool_Check(v) || overflow || x < lo || x > hi) {
        dh__py_raise_code(DH_ESCHEMA,
                          PyUnicode_FromFormat("profile row: field '%s' must be an int in "
                                               "[%lld, %lld], not %R",
                                               key, lo, hi, v),
                          NULL);
        return -1;
    }
    *out = x;
    return 0;
}

static int row_double(PyObject *d, const char *key, int required, double *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    *out = 0;
    if (!v || (v == Py_None && !required)) {
        if (required)
            dh__py_raise_code(
                DH_ESCHEMA, PyUnicode_FromFormat("profile row: field '%s' is missing", key), NULL);
        return required ? -1 : 0;
    }
    if (PyBool_Check(v) || !(PyFloat_Check(v) || PyLong_Check(v))) {
        dh__py_raise_code(DH_ESCHEMA,
                          PyUnicode_FromFormat("profile row: field '%s' must be a number, not %s",
                                               key, Py_TYPE(v)->tp_name),
                          NULL);
        return -1;
    }
    *out = PyFloat_AsDouble(v);
    return PyErr_Occurred() ? -1 : 0;
}

/* The fields of row `d` that the writer does not know, as one compact JSON object (a new
 * str), or Py_None when there are none. */
static PyObject *row_extra(PyObject *d, PyObject *dumps)
{
    PyObject *rest = PyDict_New();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (rest && PyDict_Next(d, &pos, &key, &value)) {
        int known = 0;
        for (size_t i = 0; i < sizeof row_fields / sizeof row_fields[0] && !known; i++)
            known =
                PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, row_fields[i]) == 0;
        if (!known && PyDict_SetItem(rest, key, value) < 0)
            Py_CLEAR(rest);
    }
    if (!rest || PyDict_GET_SIZE(rest) == 0) {
        Py_XDECREF(rest);
        if (!rest)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *call_args = PyTuple_Pack(1, rest);
    PyObject *kw = Py_BuildValue("{s:(ss),s:O}", "separators", ",", ":", "ensure_ascii", Py_False);
    PyObject *text = call_args && kw ? PyObject_Call(dumps, call_args, kw) : NULL;
    Py_XDECREF(call_args);
    Py_XDECREF(kw);
    Py_DECREF(rest);
    return text;
}

/* Writes dict `d` as one row to f. Returns 0 or -1 with an error set. */
static int write_row(FILE *f, PyObject *d, PyObject *dumps, Py_ssize_t index)
{
    if (!PyDict_Check(d)) {
        dh__py_raise_inval("profile row %zd: expected a dict, not %s", index, Py_TYPE(d)->tp_name);
        return -1;
    }
    dh_profile_row_t row = {0};
    long long frames, height, width, tokens, in_bytes, out_bytes, text_len;
    if (row_str(d, "id", 1, &row.id) < 0 || row_str(d, "uri", 1, &row.uri) < 0 ||
        row_str(d, "profile_key", 1, &row.profile_key) < 0 ||
        row_int(d, "frames", 1, 0, INT32_MAX, &frames) < 0 ||
        row_int(d, "height", 1, 0, INT32_MAX, &height) < 0 ||
        row_int(d, "width", 1, 0, INT32_MAX, &width) < 0 ||
        row_int(d, "tokens_est", 1, 0, INT64_MAX, &tokens) < 0 ||
        row_double(d, "cpu_s_est", 1, &row.cpu_s_est) < 0 ||
        row_int(d, "in_bytes", 1, 0, INT64_MAX, &in_bytes) < 0 ||
        row_int(d, "out_bytes", 1, 0, INT64_MAX, &out_bytes) < 0 ||
        row_double(d, "duration_s", 0, &row.duration_s) < 0 ||
        row_double(d, "fps", 0, &row.fps) < 0 ||
        row_int(d, "text_len", 0, 0, INT64_MAX, &text_len) < 0 ||
        row_str(d, "codec", 0, &row.codec) < 0 || row_str(d, "node", 0, &row.node) < 0)
        return -1;
    row.frames = (int32_t)frames;
    row.height = (int32_t)height;
    row.width = (int32_t)width;
    row.tokens_est = tokens;
    row.in_bytes = in_bytes;
    row.out_bytes = out_bytes;
    row.text_len = text_len;
    PyObject *extra = row_extra(d, dumps);
    if (!extra)
        return -1;
    if (extra != Py_None && !(row.extra = PyUnicode_AsUTF8(extra))) {
        Py_DECREF(extra);
        return -1;
    }
    errno = 0;
    int rc = dh_profile_row_write(f, &row);
    Py_DECREF(extra);
    if (rc < 0) {
        errno = errno ? errno : EIO; /* a stdio error that left no errno */
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

/* write_profiles(path, rows) -> the number of rows written to path as JSONL. */
PyObject *dh__py_write_profiles(PyObject *m, PyObject *args)
{
    PyObject *path_obj, *rows;
    if (!PyArg_ParseTuple(args, "O&O", PyUnicode_FSConverter, &path_obj, &rows))
        return NULL;
    PyObject *iter = PyObject_GetIter(rows);
    PyObject *json = iter ? PyImport_ImportModule("json") : NULL;
    PyObject *dumps = json ? PyObject_GetAttrString(json, "dumps") : NULL;
    Py_XDECREF(json);
    FILE *f = NULL;
    if (dumps && !(f = fopen(PyBytes_AS_STRING(path_obj), "w")))
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj);
    Py_ssize_t n = 0;
    PyObject *item;
    while (f && (item = PyIter_Next(iter))) {
        int rc = write_row(f, item, dumps, n);
        Py_DECREF(item);
        if (rc < 0)
            break;
        n++;
    }
    int failed = PyErr_Occurred() != NULL;
    if (f && fclose(f) != 0 && !failed) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj);
        failed = 1;
    }
    Py_XDECREF(dumps);
    Py_XDECREF(iter);
    Py_DECREF(path_obj);
    return failed || !f ? NULL : PyLong_FromSsize_t(n);
}

/* ---- the dtype table ---------------------------------------------------------------- */

/* {name: (wire code, bytes per element, buffer format or "")}, from DH_DTYPE_MAP. */
static PyObject *dtype_table(void)
{
    PyObject *d = PyDict_New();
#define DH__PY_DTYPE(name, code, str, size, dl_code, dl_bits, fmt)                                 \
    if (d && dh__py_dict_set_steal(d, str,                                                         \
                                   Py_BuildValue("(iis#)", code, size, (const char[]){fmt, 0},     \
                                                 (Py_ssize_t)((fmt) != 0))) < 0)                   \
        Py_CLEAR(d);
    DH_DTYPE_MAP(DH__PY_DTYPE)
#undef DH__PY_DTYPE
    return d;
}

/* Adds the module's constants: DTYPES, REBALANCE_KEYS, REBALANCE_SPEC_KEYS. Returns 0 or -1. */
int dh__py_values_add(PyObject *m)
{
    PyObject *dtypes = dtype_table();
    if (!dtypes || PyModule_AddObject(m, "DTYPES", dtypes) < 0) {
        Py_XDECREF(dtypes);
        return -1;
    }
    for (int spec_only = 0; spec_only <= 1; spec_only++) {
        PyObject *keys = dh__py_rebalance_keys(spec_only);
        if (!keys ||
            PyModule_AddObject(m, spec_only ? "REBALANCE_SPEC_KEYS" : "REBALANCE_KEYS", keys) < 0) {
            Py_XDECREF(keys);
            return -1;
        }
    }
    return 0;
}
