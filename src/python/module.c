/* module.c: the module datahelix._C itself: its exception classes, DataHelixError and one
 * subclass per entry of the C error table (error.h), which every file raises through
 * dh__py_raise_code; the module-level functions (plan, epoch_seed, set_log_level, the tests'
 * hooks, and values.c's); and PyInit__C, which readies the types the other files define and
 * adds them, with values.c's constants.
 * The map of the extension's files is binding.h's first comment (docs/python.md).
 */
#include "binding.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/log.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/rng.h"
#include "datahelix/sampler.h"

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
PyObject *dh__py_raise_code(int rc, PyObject *msg, PyObject *cause)
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
PyObject *dh__py_raise_dh(int rc, const char *what)
{
    const char *detail = dh_last_error();
    if (!detail || !*detail)
        detail = dh_strerror(rc);
    return dh__py_raise_code(
        rc, what ? PyUnicode_FromFormat("%s: %s", what, detail) : PyUnicode_FromString(detail),
        NULL);
}

/* Raises InvalidArgumentError (DH_EINVAL, a ValueError) with a formatted message. */
void dh__py_raise_inval(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    dh__py_raise_code(DH_EINVAL, msg, NULL);
}

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
    return PyLong_FromLong(dh__py_live_batches());
}

/* alloc_live(): dh_alloc_live(), the library's live allocations (dh_malloc less dh_free)
 * in this process; a leak check for tests. */
static PyObject *mod_alloc_live(PyObject *m, PyObject *unused)
{
    return PyLong_FromLong(dh_alloc_live());
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
    return dh__py_raise_dh(code, msg);
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
        return dh__py_raise_dh(rc, "plan");
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
        return dh__py_raise_code(
            DH_EINVAL,
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
    {"alloc_live", mod_alloc_live, METH_NOARGS,
     "alloc_live() -> the library's live allocations in this process (dh_malloc less dh_free; "
     "a leak check for tests)"},
    {"error_table", mod_error_table, METH_NOARGS,
     "error_table() -> [(C name, code, Python class name)] for every C error"},
    {"raise_error", mod_raise_error, METH_VARARGS,
     "raise_error(code, context): raise the exception class of a C error code (tests)"},
    {"epoch_seed", mod_epoch_seed, METH_VARARGS,
     "epoch_seed(seed, epoch) -> the base seed of a pass over that epoch (its Python "
     "workers seed from it)"},
    /* values.c: the values the C side owns */
    {"arena_budget_default", dh__py_arena_budget_default, METH_NOARGS,
     "arena_budget_default($module, /)\n--\n\nThe memory budget in bytes of an arena this process "
     "makes "
     "(dh_arena_budget_default): DH_ARENA_BUDGET when set and valid, else a quarter of physical "
     "memory or of the memory cgroup's limit, whichever is lower, and at most half of the memory "
     "available now"},
    {"parse_bytes", (PyCFunction)(void (*)(void))dh__py_parse_bytes, METH_VARARGS | METH_KEYWORDS,
     "parse_bytes($module, /, text, what='size')\n--\n\nA byte count as the C side and the CLI "
     "parse it "
     "(dh_arena_parse_bytes): digits with an optional K, M or G suffix (KiB, MiB, GiB, either "
     "case), > 0; anything else raises InvalidArgumentError naming `what`"},
    {"write_profiles", dh__py_write_profiles, METH_VARARGS,
     "write_profiles($module, path, rows, /)\n--\n\nWrites each dict of `rows` as one "
     "profiles.jsonl line to path by the C writer (dh_profile_row_write), fields it does "
     "not know verbatim; returns the number of rows. A bad row raises SchemaError"},
    /* remote.c */
    {"remote_read", dh__py_remote_read, METH_VARARGS,
     "remote_read($module, url, /)\n--\n\nThe bytes of the object at an http://, https:// or "
     "s3:// URL, read whole through the C remote reader (its S3 settings, TLS trust and "
     "retries); a missing object raises NotFoundError, a refused one PermissionDeniedError "
     "or the class of the C error, naming the URL and the HTTP status"},
    {"remote_reload_settings", dh__py_remote_reload_settings, METH_NOARGS,
     "remote_reload_settings($module, /)\n--\n\nThe remote reader's settings taken from the "
     "environment as it is now: DH_CA_BUNDLE and DH_HTTP_* at once, the AWS variables and "
     "files at the next s3:// request (process-wide; every DataLoader does it when made)"},
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
    PyTypeObject *types[] = {&dh__py_batch_type,          &dh__py_tensor_type,
                             &dh__py_client_type,         &dh__py_coordinator_type,
                             &dh__py_dataserver_type,     &dh__py_part_tensor_type,
                             &dh__py_rebalance_spec_type, &dh__py_cluster_type};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    const char *names[] = {"Batch",      "Tensor",     "Client",        "Coordinator",
                           "DataServer", "PartTensor", "RebalanceSpec", "Cluster"};
    _Static_assert(sizeof names / sizeof names[0] == sizeof types / sizeof types[0],
                   "a name per type");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0)
            goto fail;
    }
    if (dh__py_values_add(m) < 0)
        goto fail;
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
