/* metrics.h: the stats and Prometheus metrics of the client, the coordinator and the
 * DataServer, described once (docs/operations.md, "Metrics").
 *
 * Each of the three has one table (src/runtime/stats_table.h): a row per number, naming
 * its field in the public stats struct (dh_client_stats_t, dh_coordinator_stats_t,
 * dh_dataserver_stats_t; a binding's stats key is the same name), how it is kept (an
 * atomic counter, nanoseconds counted and seconds reported, or a value the snapshot reads
 * from the state: a gauge, a p95, a learned rate), and its Prometheus name, type, label and
 * HELP text. Rows without a stats field are metrics the daemon feeds from its events and
 * its state (histograms, per-server gauges), or a binding's own number. The daemons serve
 * their metrics from the table; the Python binding builds stats() and renders a rank's
 * metrics from it (dh_metrics_text); a test holds docs/operations.md's metric tables to it.
 */
#ifndef DATAHELIX_METRICS_H
#define DATAHELIX_METRICS_H

#include "datahelix/export.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DH_METRICS_CLIENT = 0,
    DH_METRICS_COORDINATOR = 1,
    DH_METRICS_DATASERVER = 2,
} dh_metrics_of_t;

/* How a row's number is kept. The first four have a field in the stats struct: uint64_t
 * for COUNTER and U64, double for SECONDS and F64. */
typedef enum {
    DH_STAT_COUNTER = 0, /* an atomic counter (or a gauge kept as one), copied by the snapshot */
    DH_STAT_SECONDS = 1, /* counted in nanoseconds, reported in seconds */
    DH_STAT_U64 = 2,     /* not a counter: a value the snapshot reads from the state */
    DH_STAT_F64 = 3,     /* the same, a double (a learned rate, a p95, a budget) */
    DH_STAT_BINDING = 4, /* no field: a binding's own number (Python's stats() has it) */
    DH_STAT_METRIC = 5,  /* no field: a metric fed by the daemon's events or state */
} dh_stat_kind_t;

typedef struct dh_metric_desc {
    const char *key; /* the stats field, and a binding's stats key */
    dh_stat_kind_t kind;
    size_t offset;      /* of the field in the stats struct (kinds with a field), else 0 */
    const char *metric; /* the Prometheus name, or NULL: not served */
    const char *type;   /* "counter", "gauge" or "histogram" (NULL with no metric) */
    /* NULL; a label name ("rule", "server"): the daemon makes the series; or "name=value":
     * this row is that series of a family it shares with the rows next to it */
    const char *label;
    const char *help; /* NULL for a row that shares the family above it */
} dh_metric_desc_t;

/* The table of `of`, its rows in *n. Static; never NULL. */
DH_EXTERN const dh_metric_desc_t *dh_metrics_table(dh_metrics_of_t of, size_t *n);

/* One number to render: a family of one series. */
typedef struct dh_metric_value {
    const char *name, *help, *type; /* type: "counter" or "gauge" */
    double value;
} dh_metric_value_t;

/* The values in Prometheus' text exposition format 0.0.4 (the daemons' own writer): a HELP
 * and a TYPE line and one sample per value, in order, each sample with the n_labels labels
 * (label_names[i]="label_values[i]", escaped, in the order given). A value whose name an
 * earlier one took is left out. Sets *text to a new NUL-terminated buffer (dh_free; "" for
 * no values) and *len (when not NULL) to its length. Returns 0, DH_EINVAL (a name, label
 * name or type that is not valid: the message says which; *text NULL) or DH_ENOMEM. */
DH_EXTERN int dh_metrics_text(const dh_metric_value_t *v, size_t n, const char *const *label_names,
                              const char *const *label_values, size_t n_labels, char **text,
                              size_t *len);

#ifdef __cplusplus
}
#endif

#endif
