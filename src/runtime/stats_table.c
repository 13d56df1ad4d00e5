/* stats_table.c: the tables of stats_table.h made into data (dh_metrics_table), checked
 * against the public stats structs at compile time, and the registries built from them; and
 * dh_metrics_text, the one Prometheus text writer (metrics.c) for numbers held elsewhere
 * (the Python binding renders a rank's stats() through it).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/metrics.h"
#include "datahelix/runtime.h"
#include "runtime/stats_table.h"

/* ---- the public structs, checked against the tables ---- */

/* A struct of the table's fields, in its order: the public struct must be exactly it (same
 * size, each field at the same offset with the same type). */
#define MIRROR_FIELD(kind, key, ...) MF_##kind(key)
#define MF_COUNTER(key) uint64_t key;
#define MF_SECONDS(key) double key;
#define MF_U64(key) uint64_t key;
#define MF_F64(key) double key;
#define MF_BINDING(key)
#define MF_METRIC(key)

#define IS_U64_COUNTER 1
#define IS_U64_U64 1
#define IS_U64_SECONDS 0
#define IS_U64_F64 0
#define IS_U64_BINDING 0
#define IS_U64_METRIC 0
#define HAS_FIELD_COUNTER 1
#define HAS_FIELD_SECONDS 1
#define HAS_FIELD_U64 1
#define HAS_FIELD_F64 1
#define HAS_FIELD_BINDING 0
#define HAS_FIELD_METRIC 0

#define CHECK_FIELD(kind, key, ...) CF_##kind(key)
#define CF_FIELD(key, u64)                                                                         \
    _Static_assert(offsetof(PUBLIC, key) == offsetof(MIRROR, key),                                 \
                   #key ": the stats struct's fields are not in the table's order");               \
    _Static_assert(_Generic(((PUBLIC *)0)->key, uint64_t                                           \
                            : u64, double                                                          \
                            : !(u64), default : 0),                                                \
                   #key ": the stats struct's field has not the table's type");
#define CF_COUNTER(key) CF_FIELD(key, 1)
#define CF_U64(key) CF_FIELD(key, 1)
#define CF_SECONDS(key) CF_FIELD(key, 0)
#define CF_F64(key) CF_FIELD(key, 0)
#define CF_BINDING(key)
#define CF_METRIC(key)

typedef struct {
    DH__CLIENT_STATS(MIRROR_FIELD)
} client_mirror_t;
typedef struct {
    DH__COORD_STATS(MIRROR_FIELD)
} coord_mirror_t;
typedef struct {
    DH__DS_STATS(MIRROR_FIELD)
} ds_mirror_t;
_Static_assert(sizeof(client_mirror_t) == sizeof(dh_client_stats_t),
               "dh_client_stats_t has fields DH__CLIENT_STATS does not list");
_Static_assert(sizeof(coord_mirror_t) == sizeof(dh_coordinator_stats_t),
               "dh_coordinator_stats_t has fields DH__COORD_STATS does not list");
_Static_assert(sizeof(ds_mirror_t) == sizeof(dh_dataserver_stats_t),
               "dh_dataserver_stats_t has fields DH__DS_STATS does not list");
#define PUBLIC dh_client_stats_t
#define MIRROR client_mirror_t
DH__CLIENT_STATS(CHECK_FIELD)
#undef PUBLIC
#undef MIRROR
#define PUBLIC dh_coordinator_stats_t
#define MIRROR coord_mirror_t
DH__COORD_STATS(CHECK_FIELD)
#undef PUBLIC
#undef MIRROR
#define PUBLIC dh_dataserver_stats_t
#define MIRROR ds_mirror_t
DH__DS_STATS(CHECK_FIELD)
#undef PUBLIC
#undef MIRROR

/* ---- the tables as data ---- */

#define TYPE_COUNTER "counter"
#define TYPE_GAUGE "gauge"
#define TYPE_HISTOGRAM "histogram"
#define TYPE_NONE NULL
#define OFFSET(T, kind, key) OFF_##kind(T, key)
#define OFF_COUNTER(T, key) offsetof(T, key)
#define OFF_SECONDS(T, key) offsetof(T, key)
#define OFF_U64(T, key) offsetof(T, key)
#define OFF_F64(T, key) offsetof(T, key)
#define OFF_BINDING(T, key) 0
#define OFF_METRIC(T, key) 0
#define DESC(T, kind, key, type, label, name, help)                                                \
    {#key, DH_STAT_##kind, OFFSET(T, kind, key), name, TYPE_##type, label, help},
#define CLIENT_DESC(...) DESC(dh_client_stats_t, __VA_ARGS__)
#define COORD_DESC(...) DESC(dh_coordinator_stats_t, __VA_ARGS__)
#define DS_DESC(...) DESC(dh_dataserver_stats_t, __VA_ARGS__)

static const dh_metric_desc_t client_table[] = {DH__CLIENT_STATS(CLIENT_DESC)};
static const dh_metric_desc_t coord_table[] = {DH__COORD_STATS(COORD_DESC)};
static const dh_metric_desc_t ds_table[] = {DH__DS_STATS(DS_DESC)};
#define N(a) (sizeof(a) / sizeof((a)[0]))

const dh_metric_desc_t *dh_metrics_table(dh_metrics_of_t of, size_t *n)
{
    switch (of) {
    case DH_METRICS_COORDINATOR:
        *n = N(coord_table);
        return coord_table;
    case DH_METRICS_DATASERVER:
        *n = N(ds_table);
        return ds_table;
    default:
        *n = N(client_table);
        return client_table;
    }
}

/* ---- the daemons' registries ---- */

static dh__metric_type_t type_of(const char *type)
{
    return strcmp(type, "counter") == 0 ? DH__METRIC_COUNTER
           : strcmp(type, "gauge") == 0 ? DH__METRIC_GAUGE
                                        : DH__METRIC_HISTOGRAM;
}

int dh__stats_metrics_build(dh__metrics_t *r, dh_metrics_of_t of, dh__stats_bounds_fn bounds,
                            dh__metric_t **family, dh__series_t **series)
{
    size_t n;
    const dh_metric_desc_t *t = dh_metrics_table(of, &n);
    for (size_t i = 0; i < n; i++) {
        family[i] = NULL;
        series[i] = NULL;
        if (!t[i].metric)
            continue;
        const char *eq = t[i].label ? strchr(t[i].label, '=') : NULL;
        char label[64] = "";
        if (eq)
            snprintf(label, sizeof label, "%.*s", (int)(eq - t[i].label), t[i].label);
        if (i > 0 && t[i - 1].metric && strcmp(t[i - 1].metric, t[i].metric) == 0) {
            family[i] = family[i - 1]; /* "name=value": a series of the family above */
        } else {
            size_t nb = 0;
            const double *b = type_of(t[i].type) == DH__METRIC_HISTOGRAM ? bounds(i, &nb) : NULL;
            family[i] = dh__metrics_add(r, t[i].metric, t[i].help, type_of(t[i].type),
                                        eq ? label : t[i].label, b, nb);
            if (!family[i])
                return DH_ENOMEM;
        }
        if ((!t[i].label || eq) && !(series[i] = dh__metric_series(family[i], eq ? eq + 1 : NULL)))
            return DH_ENOMEM;
    }
    return 0;
}

void dh__stats_metrics_mirror(dh_metrics_of_t of, const void *stats, dh__series_t *const *series)
{
    size_t n;
    const dh_metric_desc_t *t = dh_metrics_table(of, &n);
    for (size_t i = 0; i < n; i++) {
        if (!series[i] || t[i].kind > DH_STAT_F64)
            continue;
        const char *at = (const char *)stats + t[i].offset;
        uint64_t u;
        double d;
        if (t[i].kind == DH_STAT_COUNTER || t[i].kind == DH_STAT_U64) {
            memcpy(&u, at, sizeof u);
            d = (double)u;
        } else {
            memcpy(&d, at, sizeof d);
        }
        dh__series_set(series[i], d);
    }
}

/* ---- numbers held elsewhere ---- */

int dh_metrics_text(const dh_metric_value_t *v, size_t n, const char *const *label_names,
                    const char *const *label_values, size_t n_labels, char **text, size_t *len)
{
    *text = NULL;
    dh__metrics_t *r = NULL;
    int rc = dh__metrics_new(&r);
    if (rc == 0)
        rc = dh__metrics_set_labels(r, label_names, label_values, n_labels);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        bool counter = v[i].type && strcmp(v[i].type, "counter") == 0;
        if (!dh__metrics_name_ok(v[i].name, true) ||
            (!counter && !(v[i].type && strcmp(v[i].type, "gauge") == 0))) {
            rc = dh__set_error(DH_EINVAL,
                               "metric %s%s: not a valid name, or type '%s' is not "
                               "counter or gauge",
                               v[i].name ? "" : "(null)", v[i].name ? v[i].name : "",
                               v[i].type ? v[i].type : "(null)");
            break;
        }
        if (dh__metrics_find(r, v[i].name))
            continue; /* an earlier value took the name */
        dh__series_t *s = dh__metrics_one(r, v[i].name, v[i].help,
                                          counter ? DH__METRIC_COUNTER : DH__METRIC_GAUGE, NULL, 0);
        if (!s)
            rc = DH_ENOMEM;
        else
            dh__series_set(s, v[i].value);
    }
    if (rc == 0 && !(*text = dh__metrics_render(r, len)))
        rc = DH_ENOMEM;
    dh__metrics_destroy(&r);
    return rc;
}
