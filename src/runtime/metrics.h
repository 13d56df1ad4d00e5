/* runtime/metrics.h: a registry of Prometheus metrics and its text exposition (private to the
 * library; docs/operations.md, "Metrics").
 *
 * A registry holds families (a name, a HELP text, a type: counter, gauge or histogram, and at
 * most one label name), each with one series per label value. The daemon's threads write a
 * series through atomics and never wait: a series is a double kept as its bits in a relaxed
 * atomic uint64 (a counter adds with a compare-and-swap loop, a gauge stores), a histogram
 * one atomic count per bucket and an atomic sum. The registry's mutex guards only the lists
 * (adding a family or a series, which a daemon does at start and when a server registers)
 * and the rendering, so the rendering of a scrape never blocks a writer of an existing
 * series. A pointer to a series stays valid until the registry is destroyed.
 *
 * Rendering follows the text exposition format 0.0.4: a HELP and a TYPE line per family,
 * then its samples; label values and HELP texts escaped; a histogram's buckets cumulative
 * with le="+Inf", _sum and _count (its _count is the +Inf bucket of the same reading, so a
 * scrape taken while observations land stays consistent). A snapshot reads each series on
 * its own, as counters.h's snapshots do.
 *
 * Threads: _new, _destroy and _add_* belong to one thread (the owner's, before another
 * thread renders); _series, the writers and _render may be called from any thread.
 */
#ifndef DH_RUNTIME_METRICS_H
#define DH_RUNTIME_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    DH__METRIC_COUNTER = 0,
    DH__METRIC_GAUGE = 1,
    DH__METRIC_HISTOGRAM = 2,
} dh__metric_type_t;

typedef struct dh__metrics dh__metrics_t;
typedef struct dh__metric dh__metric_t; /* a family */
typedef struct dh__series dh__series_t; /* one label value's series of a family */

/* Called at the start of every _render, on the rendering thread, before the registry's lock
 * is taken: sets series from sources any thread may read (atomic counters). */
typedef void (*dh__metrics_collect_fn)(void *arg);

/* Makes an empty registry. 0 or DH_ENOMEM. *out is the caller's (dh__metrics_destroy). */
int dh__metrics_new(dh__metrics_t **out);

/* Frees the registry, its families and series; sets *m = NULL. Safe on NULL. No thread may
 * use it or one of its series any more. */
void dh__metrics_destroy(dh__metrics_t **m);

/* Sets the collect callback (NULL: none). Call before any thread renders. */
void dh__metrics_set_collect(dh__metrics_t *m, dh__metrics_collect_fn fn, void *arg);

/* Labels every sample of the registry carries, first, in this order (names[i]="values[i]",
 * the values escaped), e.g. a rank's {rank="0"}: replaces those set before (n 0: none).
 * Call before any thread renders. 0, DH_EINVAL (a name that is not a valid label name, or
 * "le"; the message names it) or DH_ENOMEM. */
int dh__metrics_set_labels(dh__metrics_t *m, const char *const *names, const char *const *values,
                           size_t n);

/* Whether `name` is a valid metric name (metric: [a-zA-Z_:][a-zA-Z0-9_:]*) or label name
 * (no colon, and not "le"). */
bool dh__metrics_name_ok(const char *name, bool metric);

/* The family named `name`, or NULL. Any thread. */
const dh__metric_t *dh__metrics_find(dh__metrics_t *m, const char *name);

/* Adds a family. `name` must be a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) and not yet
 * in the registry, `label` NULL (one series, made now) or a valid label name; a histogram
 * takes n_bounds > 0 strictly increasing finite upper bounds (the +Inf bucket is implied;
 * copied), the others none. Misuse asserts. Returns the family (owned by the registry), or
 * NULL with DH_ENOMEM set. */
dh__metric_t *dh__metrics_add(dh__metrics_t *m, const char *name, const char *help,
                              dh__metric_type_t type, const char *label, const double *bounds,
                              size_t n_bounds);

/* The series of a family for a label value (NULL for a family without a label), made on its
 * first use (under the registry's lock: keep the pointer where a loop writes it often).
 * Returns it (owned by the registry), or NULL with DH_ENOMEM set. Any thread. */
dh__series_t *dh__metric_series(dh__metric_t *f, const char *label_value);

/* A family of one series (no label) and that series: its series, or NULL (DH_ENOMEM set).
 * DH__COUNTER / DH__GAUGE (registry `r` in scope) are the common cases. */
dh__series_t *dh__metrics_one(dh__metrics_t *r, const char *name, const char *help,
                              dh__metric_type_t type, const double *bounds, size_t n_bounds);
#define DH__COUNTER(name, help) dh__metrics_one(r, name, help, DH__METRIC_COUNTER, NULL, 0)
#define DH__GAUGE(name, help) dh__metrics_one(r, name, help, DH__METRIC_GAUGE, NULL, 0)

/* Counter: adds v (>= 0). Gauge: adds v (any sign). Any thread, lock-free. */
void dh__series_add(dh__series_t *s, double v);

/* Gauge, or a counter mirrored from a monotonic source: the value becomes v. Any thread. */
void dh__series_set(dh__series_t *s, double v);

/* Histogram: one observation (NaN is ignored). Any thread, lock-free. */
void dh__series_observe(dh__series_t *s, double v);

/* The value of a counter or gauge series now. Any thread. */
double dh__series_value(const dh__series_t *s);

/* Renders every family in the exposition format 0.0.4, in the order they were added, into
 * a new NUL-terminated buffer (its length without the NUL in *len when len is not NULL).
 * Runs the collect callback first. Returns the buffer (the caller's: dh_free), or NULL with
 * DH_ENOMEM set. Any thread. */
char *dh__metrics_render(dh__metrics_t *m, size_t *len);

/* ---- the HTTP endpoint (metrics_http.c) ---- */

typedef struct dh__metrics_http dh__metrics_http_t;

/* Serves GET /metrics (the registry rendered, Content-Type text/plain; version=0.0.4) on
 * HOST:PORT (a name or a numeric address, an IPv6 one in brackets: "[::1]:9464"; PORT 0 picks
 * a free one) from one thread of libmicrohttpd's; any other path is 404, any other method
 * on /metrics 405. `who` names the daemon in messages. Returns 0, DH_EINVAL (not HOST:PORT,
 * or the host does not resolve; the message names it), -errno when it cannot bind
 * (-EADDRINUSE ...), or DH_ENOMEM. *out is the caller's (dh__metrics_http_stop); the
 * registry is borrowed and must outlive it. */
int dh__metrics_http_start(dh__metrics_http_t **out, dh__metrics_t *m, const char *listen,
                           const char *who);

/* The same endpoint with no socket to listen on and no thread (the fuzz target,
 * tests/fuzz/fuzz_metrics_http.c): dh__metrics_http_add hands it one end of a connected
 * stream socket (taken: libmicrohttpd closes it; 0, or DH_EIO when refused), and each
 * dh__metrics_http_run serves, on the caller's thread, what has arrived on its connections
 * (reads requests, answers, closes the finished ones) and returns how many are still open.
 * Stopped with dh__metrics_http_stop. 0 or DH_ENOMEM. */
int dh__metrics_http_start_unbound(dh__metrics_http_t **out, dh__metrics_t *m, const char *who);
int dh__metrics_http_add(dh__metrics_http_t *h, int fd);
size_t dh__metrics_http_run(dh__metrics_http_t *h);

/* The TCP port bound. */
uint16_t dh__metrics_http_port(const dh__metrics_http_t *h);

/* Stops serving (joins its thread), frees; sets *h = NULL. Safe on NULL. */
void dh__metrics_http_stop(dh__metrics_http_t **h);

#endif
