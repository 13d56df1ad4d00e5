/* metrics.c: the registry of Prometheus metrics and its text exposition (runtime/metrics.h;
 * the metrics themselves are listed in docs/operations.md, "Metrics").
 *
 * Writers are lock-free (relaxed atomics on a double's bits); the mutex guards the family
 * list, each family's series array (an array of pointers, so a series never moves) and a
 * rendering. A rendering of F families and S series costs O(S x buckets) formatting, a few
 * microseconds for the daemons' hundred-odd lines, under the lock; a writer that makes a
 * new series waits that long at most.
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "runtime/metrics.h"

struct dh__series {
    const struct dh__metric *family;
    char *label_value;        /* NULL for a family without a label */
    _Atomic uint64_t value;   /* counter, gauge: the double's bits */
    _Atomic uint64_t sum;     /* histogram: the double's bits */
    _Atomic uint64_t *counts; /* histogram: per bucket (not cumulative), n_bounds + 1 */
};

struct dh__metric {
    dh__metrics_t *registry;
    char *name, *help, *label;
    dh__metric_type_t type;
    double *bounds;
    size_t n_bounds;
    dh__series_t **series;
    size_t n_series, cap_series;
};

struct dh__metrics {
    pthread_mutex_t lock;
    dh__metric_t **families;
    size_t n_families, cap_families;
    dh__metrics_collect_fn collect;
    void *collect_arg;
    char *labels; /* the labels of every sample, rendered (k="v",...), or NULL */
};

static uint64_t bits_of(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static double double_of(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, bits_of(double_of(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

static bool valid_name(const char *s, bool colon)
{
    if (!s || !*s || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s; s++) {
        char ch = *s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || (colon && ch == ':')))
            return false;
    }
    return true;
}

int dh__metrics_new(dh__metrics_t **out)
{
    *out = NULL;
    dh__metrics_t *m = dh_calloc(1, sizeof *m);
    if (!m)
        return dh__set_error(DH_ENOMEM, "out of memory for a metrics registry");
    pthread_mutex_init(&m->lock, NULL);
    *out = m;
    return 0;
}

static void series_free(dh__series_t *s)
{
    if (!s)
        return;
    dh_free(s->label_value);
    dh_free((void *)s->counts);
    dh_free(s);
}

static void family_free(dh__metric_t *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_series; i++)
        series_free(f->series[i]);
    dh_free(f->series);
    dh_free(f->name);
    dh_free(f->help);
    dh_free(f->label);
    dh_free(f->bounds);
    dh_free(f);
}

void dh__metrics_destroy(dh__metrics_t **pm)
{
    if (!pm || !*pm)
        return;
    dh__metrics_t *m = *pm;
    for (size_t i = 0; i < m->n_families; i++)
        family_free(m->families[i]);
    dh_free(m->families);
    dh_free(m->labels);
    pthread_mutex_destroy(&m->lock);
    dh_free(m);
    *pm = NULL;
}

void dh__metrics_set_collect(dh__metrics_t *m, dh__metrics_collect_fn fn, void *arg)
{
    m->collect = fn;
    m->collect_arg = arg;
}

bool dh__metrics_name_ok(const char *name, bool metric)
{
    return valid_name(name, metric) && (metric || strcmp(name, "le") != 0);
}

const dh__metric_t *dh__metrics_find(dh__metrics_t *m, const char *name)
{
    const dh__metric_t *found = NULL;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->n_families && !found; i++)
        if (strcmp(m->families[i]->name, name) == 0)
            found = m->families[i];
    pthread_mutex_unlock(&m->lock);
    return found;
}

/* Grows an array of pointers to hold one more. true, or false when out of memory. */
static bool grow(void ***arr, size_t *cap, size_t n)
{
    if (n < *cap)
        return true;
    size_t cap2 = *cap ? *cap * 2 : 8;
    void **a = dh_reallocarray(*arr, cap2, sizeof *a);
    if (!a)
        return false;
    *arr = a;
    *cap = cap2;
    return true;
}

static dh__series_t *series_new(const dh__metric_t *f, const char *label_value)
{
    dh__series_t *s = dh_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->family = f;
    if (label_value && !(s->label_value = dh_strdup(label_value))) {
        series_free(s);
        return NULL;
    }
    if (f->type == DH__METRIC_HISTOGRAM &&
        !(s->counts = dh_calloc(f->n_bounds + 1, sizeof *s->counts))) {
        series_free(s);
        return NULL;
    }
    return s;
}

/* The series for label_value, made when missing. Under f->registry->lock. */
static dh__series_t *series_locked(dh__metric_t *f, const char *label_value)
{
    for (size_t i = 0; i < f->n_series; i++) {
        const char *v = f->series[i]->label_value;
        if ((!v && !label_value) || (v && label_value && strcmp(v, label_value) == 0))
            return f->series[i];
    }
    if (!grow((void ***)&f->series, &f->cap_series, f->n_series))
        return NULL;
    dh__series_t *s = series_new(f, label_value);
    if (s)
        f->series[f->n_series++] = s;
    return s;
}

dh__metric_t *dh__metrics_add(dh__metrics_t *m, const char *name, const char *help,
                              dh__metric_type_t type, const char *label, const double *bounds,
                              size_t n_bounds)
{
    assert(valid_name(name, true));
    assert(!label || (valid_name(label, false) && strcmp(label, "le") != 0));
    assert((type == DH__METRIC_HISTOGRAM) == (n_bounds > 0));
    for (size_t i = 0; i < n_bounds; i++)
        assert(isfinite(bounds[i]) && (i == 0 || bounds[i] > bounds[i - 1]));
    dh__metric_t *f = dh_calloc(1, sizeof *f);
    if (!f)
        goto oom;
    f->registry = m;
    f->type = type;
    f->n_bounds = n_bounds;
    if (!(f->name = dh_strdup(name)) || !(f->help = dh_strdup(help ? help : "")) ||
        (label && !(f->label = dh_strdup(label))))
        goto oom;
    if (n_bounds) {
        if (!(f->bounds = dh_calloc(n_bounds, sizeof *f->bounds)))
            goto oom;
        memcpy(f->bounds, bounds, n_bounds * sizeof *bounds);
    }
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->n_families; i++)
        assert(strcmp(m->families[i]->name, name) != 0);
    bool ok = grow((void ***)&m->families, &m->cap_families, m->n_families) &&
              (label || series_locked(f, NULL));
    if (ok)
        m->families[m->n_families++] = f;
    pthread_mutex_unlock(&m->lock);
    if (!ok)
        goto oom;
    return f;
oom:
    family_free(f);
    dh__set_error(DH_ENOMEM, "out of memory for metric %s", name);
    return NULL;
}

dh__series_t *dh__metrics_one(dh__metrics_t *r, const char *name, const char *help,
                              dh__metric_type_t type, const double *bounds, size_t n_bounds)
{
    dh__metric_t *f = dh__metrics_add(r, name, help, type, NULL, bounds, n_bounds);
    return f ? dh__metric_series(f, NULL) : NULL;
}

dh__series_t *dh__metric_series(dh__metric_t *f, const char *label_value)
{
    assert((f->label == NULL) == (label_value == NULL));
    pthread_mutex_lock(&f->registry->lock);
    dh__series_t *s = series_locked(f, label_value);
    pthread_mutex_unlock(&f->registry->lock);
    if (!s)
        dh__set_error(DH_ENOMEM, "out of memory for a series of metric %s", f->name);
    return s;
}

void dh__series_add(dh__series_t *s, double v)
{
    atomic_add_double(&s->value, v);
}

void dh__series_set(dh__series_t *s, double v)
{
    atomic_store_explicit(&s->value, bits_of(v), memory_order_relaxed);
}

double dh__series_value(const dh__series_t *s)
{
    return double_of(atomic_load_explicit((_Atomic uint64_t *)&s->value, memory_order_relaxed));
}

void dh__series_observe(dh__series_t *s, double v)
{
    if (isnan(v))
        return;
    /* The bucket of v: the first bound >= v, or the +Inf one past the last. O(log buckets);
     * the bounds never change after the family is added. */
    const dh__metric_t *f = s->family;
    size_t lo = 0, hi = f->n_bounds;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v <= f->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_add_double(&s->sum, v);
    atomic_fetch_add_explicit(&s->counts[lo], 1, memory_order_relaxed);
}

/* ---- rendering ---- */

typedef struct buf {
    char *data;
    size_t len, cap;
    bool failed;
} buf_t;

static void put(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf_t *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 > b->len + (size_t)n + 1 ? b->cap * 2 : b->len + (size_t)n + 1;
        char *d = dh_realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
}

/* Text with `\` and newline escaped, and `"` too when quoted (a label value). */
static void put_escaped(buf_t *b, const char *s, bool quoted)
{
    for (; *s; s++) {
        if (*s == '\\')
            put(b, "\\\\");
        else if (*s == '\n')
            put(b, "\\n");
        else if (quoted && *s == '"')
            put(b, "\\\"");
        else
            put(b, "%c", *s);
    }
}

/* A sample value: Go's float formatting accepts %.17g, and the three specials are spelled
 * as the format wants them. */
static void put_value(buf_t *b, double v)
{
    if (isnan(v)) {
        put(b, "NaN");
    } else if (isinf(v)) {
        put(b, v > 0 ? "+Inf" : "-Inf");
    } else { /* the fewest digits that read back as v (0.1, not 0.10000000000000001) */
        char text[40];
        for (int digits = 15; digits <= 17; digits++) {
            snprintf(text, sizeof text, "%.*g", digits, v);
            if (strtod(text, NULL) == v)
                break;
        }
        put(b, "%s", text);
    }
}

int dh__metrics_set_labels(dh__metrics_t *m, const char *const *names, const char *const *values,
                           size_t n)
{
    buf_t b = {.data = dh_malloc(64), .cap = 64};
    if (!b.data)
        return dh__set_error(DH_ENOMEM, "out of memory for a registry's labels");
    b.data[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!dh__metrics_name_ok(names[i], false) || !values[i]) {
            dh_free(b.data);
            return dh__set_error(DH_EINVAL, "label '%s': not a valid label name",
                                 names[i] ? names[i] : "(null)");
        }
        put(&b, "%s%s=\"", i ? "," : "", names[i]);
        put_escaped(&b, values[i], true);
        put(&b, "\"");
    }
    if (b.failed) {
        dh_free(b.data);
        return dh__set_error(DH_ENOMEM, "out of memory for a registry's labels");
    }
    dh_free(m->labels);
    m->labels = n ? b.data : NULL;
    if (!n)
        dh_free(b.data);
    return 0;
}

/* name{label="value",le="..."} with whichever labels there are. */
static void put_sample_name(buf_t *b, const dh__metric_t *f, const char *suffix,
                            const dh__series_t *s, const char *le)
{
    const char *common = f->registry->labels, *sep = "";
    put(b, "%s%s", f->name, suffix);
    if (!f->label && !le && !common)
        return;
    put(b, "{");
    if (common) {
        put(b, "%s", common);
        sep = ",";
    }
    if (f->label) {
        put(b, "%s%s=\"", sep, f->label);
        put_escaped(b, s->label_value, true);
        put(b, "\"");
        sep = ",";
    }
    if (le)
        put(b, "%sle=\"%s\"", sep, le);
    put(b, "}");
}

static void render_family(buf_t *b, const dh__metric_t *f)
{
    static const char *const type_name[] = {"counter", "gauge", "histogram"};
    put(b, "# HELP %s ", f->name);
    put_escaped(b, f->help, false);
    put(b, "\n# TYPE %s %s\n", f->name, type_name[f->type]);
    for (size_t i = 0; i < f->n_series; i++) {
        const dh__series_t *s = f->series[i];
        if (f->type != DH__METRIC_HISTOGRAM) {
            put_sample_name(b, f, "", s, NULL);
            put(b, " ");
            put_value(b, dh__series_value(s));
            put(b, "\n");
            continue;
        }
        uint64_t cumulative = 0;
        for (size_t k = 0; k <= f->n_bounds; k++) {
            cumulative += atomic_load_explicit(&s->counts[k], memory_order_relaxed);
            char le[40];
            if (k < f->n_bounds)
                snprintf(le, sizeof le, "%.17g", f->bounds[k]);
            else
                snprintf(le, sizeof le, "+Inf");
            put_sample_name(b, f, "_bucket", s, le);
            put(b, " %llu\n", (unsigned long long)cumulative);
        }
        put_sample_name(b, f, "_sum", s, NULL);
        put(b, " ");
        put_value(
            b, double_of(atomic_load_explicit((_Atomic uint64_t *)&s->sum, memory_order_relaxed)));
        put(b, "\n");
        put_sample_name(b, f, "_count", s, NULL);
        put(b, " %llu\n", (unsigned long long)cumulative);
    }
}

char *dh__metrics_render(dh__metrics_t *m, size_t *len)
{
    if (m->collect)
        m->collect(m->collect_arg);
    buf_t b = {.data = dh_malloc(4096), .cap = 4096};
    if (!b.data) {
        dh__set_error(DH_ENOMEM, "out of memory rendering metrics");
        return NULL;
    }
    b.data[0] = '\0';
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->n_families; i++)
        render_family(&b, m->families[i]);
    pthread_mutex_unlock(&m->lock);
    if (b.failed) {
        dh_free(b.data);
        dh__set_error(DH_ENOMEM, "out of memory rendering metrics");
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.data;
}
