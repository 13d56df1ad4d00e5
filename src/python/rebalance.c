/* rebalance.c: tier 2's bridge (docs/rebalancing.md), its life from the rebalance= argument
 * to the error next() raises.
 *
 * A client made with rebalance={...} hands the C runtime trampolines (feature, sort,
 * exchange: rebalance_callbacks.c) with a bridge as their user data. dh__py_rebalance_parse
 * checks the dict and fills the C config and the bridge. The trampolines run on the client's
 * fetcher thread, so each takes the GIL; an exception or a bad answer becomes a negative
 * code for the C side and a report (summary, traceback, the exception) kept in the bridge
 * under the GIL (dh__py_bridge_fail), which next() attaches to the error it raises for that
 * code (dh__py_bridge_raise). The bridge owns the callables, the args object, its JSON text
 * and the group table, from the client's creation until it is freed (its threads joined: no
 * callback runs after). RebalanceSpec (rebalance_spec.c) uses the same parse and report.
 */
#include "binding.h"

#include <string.h>

/* ---- the bridge's life and its failures --------------------------------------------- */

static void bridge_clear_error(dh__py_bridge_t *br)
{
    br->error_code = 0;
    Py_CLEAR(br->error_cause);
    Py_CLEAR(br->error_summary);
    Py_CLEAR(br->error_detail);
    Py_CLEAR(br->error_exc);
}

void dh__py_bridge_free(dh__py_bridge_t **p)
{
    dh__py_bridge_t *br = *p;
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

/* Records a callback failure (GIL held), and returns DH_EINVAL, the code the C side gets:
 * `cause` (stolen) says what failed, `where` names the round or part for a report without
 * the runtime's message ("rebalance round 3 (group 0): "). The Python error in flight, if
 * any, is taken and its traceback kept. Keeps the first failure until next() reports it. */
int dh__py_bridge_fail(dh__py_bridge_t *br, const char *where, PyObject *cause)
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
PyObject *dh__py_pending_exception_text(void)
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
    PyErr_Restore(type, value, tb); /* dh__py_bridge_fail takes it with its traceback */
    return text;
}

/* ---- rebalance= parsed -------------------------------------------------------------- */

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
        dh__py_raise_inval("rebalance['%s'] must be in [%lld, %lld], not %lld", key, lo, hi, x);
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
        dh__py_raise_inval("rebalance['%s'] must be finite and >= 0, not %R", key, v);
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
            dh__py_raise_inval("rebalance['groups'][%zd] is empty", g);
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
                dh__py_raise_inval("rebalance['groups']: rank %lld is %s [0, %u) (group %zd)", r,
                                   why, ranks, g);
            } else if (group_of[r] != unset) {
                dh__py_raise_inval(
                    "rebalance['groups']: rank %lld is listed twice (groups %u and %zd)", r,
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

/* ---- the rebalance= dict's keys ------------------------------------------------------ */

/* Every key of DataLoader(rebalance={...}), the one list (_C.REBALANCE_KEYS, the order of
 * docs/rebalancing.md). `spec`: the binding's parse below reads it; the others are the
 * DataLoader's (python/datahelix/rebalance.py turns client_ranks into groups, fanout into the
 * loader's fanout, process_group into an exchange_fn) and never reach the parse
 * (_C.REBALANCE_SPEC_KEYS: the spec ones). allow_unencrypted_exchange is both: the DataLoader
 * checks it (_exchange.py) and the parse hands it to the C client, which refuses an
 * exchange_fn with CURVE keys without it (client.c), for a _C.Client made directly too. */
static const struct {
    const char *name;
    int spec;
} rebalance_keys[] = {
    {"feature_fn", 1},
    {"sort_fn", 1},
    {"client_ranks", 0},
    {"groups", 1},
    {"buffer_size", 1},
    {"min_gain", 1},
    {"args", 1},
    {"n_features", 1},
    {"move_s_per_B", 1},
    {"round_timeout_ms", 1},
    {"late_ms", 1},
    {"fanout", 0},
    {"process_group", 0},
    {"exchange_fn", 1},
    {"allow_unencrypted_exchange", 1},
};

PyObject *dh__py_rebalance_keys(int spec_only)
{
    PyObject *list = PyList_New(0);
    for (size_t k = 0; list && k < sizeof rebalance_keys / sizeof rebalance_keys[0]; k++) {
        if (spec_only && !rebalance_keys[k].spec)
            continue;
        PyObject *name = PyUnicode_FromString(rebalance_keys[k].name);
        if (!name || PyList_Append(list, name) < 0)
            Py_CLEAR(list);
        Py_XDECREF(name);
    }
    PyObject *tuple = list ? PyList_AsTuple(list) : NULL;
    Py_XDECREF(list);
    return tuple;
}

/* The spec keys, sorted and comma-separated, for the unknown-key message (a new str). */
static PyObject *spec_keys_text(void)
{
    PyObject *keys = dh__py_rebalance_keys(1);
    PyObject *list = keys ? PySequence_List(keys) : NULL;
    Py_XDECREF(keys);
    if (!list || PyList_Sort(list) < 0) {
        Py_XDECREF(list);
        return NULL;
    }
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *text = sep ? PyUnicode_Join(sep, list) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(list);
    return text;
}

/* rebalance=None/False (off), True (the C defaults) or a dict (docs/python.md) -> cfg->rebalance
 * and the bridge behind its callbacks (*out, NULL when off). Returns 0 or -1 with an error
 * set. */
int dh__py_rebalance_parse(PyObject *spec, uint32_t ranks, dh_rebalance_config_t *cfg,
                           dh__py_bridge_t **out)
{
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
        for (size_t k = 0; k < sizeof rebalance_keys / sizeof rebalance_keys[0] && !known; k++)
            known = rebalance_keys[k].spec && PyUnicode_Check(key) &&
                    PyUnicode_CompareWithASCIIString(key, rebalance_keys[k].name) == 0;
        if (!known) {
            PyObject *allowed = spec_keys_text();
            if (allowed) {
                dh__py_raise_inval("rebalance: unknown key %R (allowed: %U)", key, allowed);
                Py_DECREF(allowed);
            }
            return -1;
        }
    }
    dh__py_bridge_t *br = PyMem_RawCalloc(1, sizeof *br);
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
    PyObject *allow = PyDict_GetItemString(spec, "allow_unencrypted_exchange");
    if (allow && allow != Py_None && !PyBool_Check(allow)) {
        dh__py_raise_inval("rebalance['allow_unencrypted_exchange'] must be True or False, not %R",
                           allow);
        goto fail;
    }
    if (n_features && !br->feature_fn) {
        dh__py_raise_inval("rebalance['n_features'] is the length of feature_fn's vector: it needs "
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
            PyObject *what = dh__py_pending_exception_text();
            PyErr_Clear();
            dh__py_raise_inval("rebalance['args'] must be JSON-serialisable: %U", what);
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
        cfg->feature_fn = dh__py_feature_cb;
        cfg->feature_user = br;
        cfg->n_features = br->n_features;
    }
    if (br->sort_fn) {
        cfg->sort_fn = dh__py_sort_cb;
        cfg->sort_user = br;
    }
    if (br->exchange_fn) {
        cfg->exchange_fn = dh__py_exchange_cb;
        cfg->exchange_user = br;
    }
    cfg->allow_unencrypted_exchange = allow == Py_True; /* the C client's guard (client.c) */
    *out = br;
    return 0;
fail:
    dh__py_bridge_free(&br);
    return -1;
}

/* ---- next()'s report ---------------------------------------------------------------- */

/* After next() failed with rc (GIL held): when a callback failed with that code, raises
 * the error with the runtime's message (which names the round and the part) completed by
 * what the callback did, its traceback, and the user's exception as __cause__; returns 1
 * (the report is consumed). Else 0. The C callbacks cannot pass a message (no public call
 * sets dh_last_error()), so the runtime's says "" or the code's text where the callback's
 * would go, before " (kept)": the cause takes that place. */
int dh__py_bridge_raise(dh__py_bridge_t *br, int rc)
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
    dh__py_raise_code(rc, msg, cause);
    Py_XDECREF(cause);
    return 1;
}
