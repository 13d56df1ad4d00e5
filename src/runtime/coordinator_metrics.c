/* coordinator_metrics.c: the coordinator's Prometheus metrics, served on `--metrics-listen`
 * (runtime/metrics.h; every metric and its meaning: docs/operations.md, "Metrics").
 *
 * Every metric is a row of the coordinator's table (stats_table.h: its name, type and HELP,
 * and the stats field it mirrors). Three sources, none invented here:
 *   - the counters of counters.h (requests, dispatches, dead servers, rebalance rounds, ...),
 *     atomics, copied by the registry's collect callback on the scraping thread, so a scrape
 *     sees them as of that moment;
 *   - events of the loop thread: each placement decision by its rule (dh_place_reason_name)
 *     and whether its chosen server's predicted T missed the deadline, the gap before each
 *     heartbeat, and each executed request's predicted against measured costs (the record
 *     dh_coordinator_predictions keeps), written lock-free as they happen;
 *   - the loop's state (its book per server: queue depth, queued predicted CPU seconds, the
 *     learned speed, liveness), which only the loop thread may read: pushed at its 20 ms tick,
 *     O(servers) relaxed stores, so a scrape sees it at most one tick old.
 * A server's series are made when it first appears (the registry's lock, once per server)
 * and kept, by its index, for the coordinator's life: a dead server reads alive 0.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "runtime/coordinator_internal.h"
#include "runtime/coordinator_metrics.h"
#include "runtime/metrics.h"

#define N_REASONS (DH_REASON_NO_CANDIDATE + 1)

typedef struct server_series {
    dh__series_t *alive, *queue_depth, *queued_work, *speed, *silence;
} server_series_t;

struct dh__coord_metrics {
    dh__metrics_t *reg;
    dh__metrics_http_t *http;
    /* by row of DH__COORD_STATS (stats_table.h): the counters' series are mirrored from
     * c->counters by collect(), the others written here */
    dh__metric_t *family[DH__COORD_ROWS];
    dh__series_t *series[DH__COORD_ROWS];
    dh__series_t *decisions[N_REASONS];
    server_series_t *servers; /* by server index */
    size_t n_servers;
};

static const double ratio_bounds[] = {0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4};
static const double error_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                      0.25,  0.5,    1,     2.5,  5,     10};
static const double gap_bounds[] = {0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5};
#define NB(a) (sizeof(a) / sizeof((a)[0]))
#define SERIES(m, key) ((m)->series[DH__COORD_ROW_##key])
#define FAMILY(m, key) ((m)->family[DH__COORD_ROW_##key])

/* The histograms' buckets, by row. */
static const double *bounds(size_t row, size_t *n)
{
    const double *b = row == DH__COORD_ROW_heartbeat_gap ? gap_bounds
                      : row == DH__COORD_ROW_cpu_ratio   ? ratio_bounds
                                                         : error_bounds;
    *n = b == gap_bounds ? NB(gap_bounds) : b == ratio_bounds ? NB(ratio_bounds) : NB(error_bounds);
    return b;
}

/* The registry's collect callback (the scraping thread): the atomic counters. */
static void collect(void *arg)
{
    const dh_coordinator_t *c = arg;
    dh_coordinator_stats_t st;
    dh_coordinator_stats(c, &st);
    dh__stats_metrics_mirror(DH_METRICS_COORDINATOR, &st, c->metrics->series);
}

static int build(struct dh__coord_metrics *m)
{
    int rc = dh__stats_metrics_build(m->reg, DH_METRICS_COORDINATOR, bounds, m->family, m->series);
    for (int i = 0; rc == 0 && i < N_REASONS; i++) /* every rule listed from the start, at 0 */
        if (!(m->decisions[i] = dh__metric_series(FAMILY(m, decisions), dh_place_reason_name(i))))
            rc = DH_ENOMEM;
    return rc;
}

int dh__coord_metrics_start(dh_coordinator_t *c, const char *listen)
{
    struct dh__coord_metrics *m = dh_calloc(1, sizeof *m);
    if (!m)
        return dh__set_error(DH_ENOMEM, "out of memory for the coordinator's metrics");
    c->metrics = m;
    int rc = dh__metrics_new(&m->reg);
    if (rc == 0 && (rc = build(m)) != 0)
        dh__set_error(rc, "out of memory for the coordinator's metrics");
    if (rc == 0) {
        dh__metrics_set_collect(m->reg, collect, c);
        rc = dh__metrics_http_start(&m->http, m->reg, listen, "coordinator");
    }
    if (rc) {
        dh__coord_metrics_destroy(c);
        return rc;
    }
    dh_log_info("coordinator: metrics on %s, port %u: GET /metrics", listen,
                dh__metrics_http_port(m->http));
    return 0;
}

void dh__coord_metrics_destroy(dh_coordinator_t *c)
{
    struct dh__coord_metrics *m = c->metrics;
    if (!m)
        return;
    dh__metrics_http_stop(&m->http); /* no scrape runs past here */
    dh__metrics_destroy(&m->reg);
    dh_free(m->servers);
    dh_free(m);
    c->metrics = NULL;
}

uint16_t dh_coordinator_metrics_port(const dh_coordinator_t *c)
{
    return c->metrics && c->metrics->http ? dh__metrics_http_port(c->metrics->http) : 0;
}

void dh__coord_metrics_decision(dh_coordinator_t *c, int rc, const dh_decision_t *d)
{
    struct dh__coord_metrics *m = c->metrics;
    if (!m)
        return;
    unsigned reason = d->reason < N_REASONS ? (unsigned)d->reason : DH_REASON_NO_CANDIDATE;
    dh__series_add(m->decisions[rc == 0 ? reason : DH_REASON_NO_CANDIDATE], 1);
    if (rc == 0 && d->miss_s > 0)
        dh__series_add(SERIES(m, misses), 1);
}

void dh__coord_metrics_heartbeat(dh_coordinator_t *c, double gap_s)
{
    if (c->metrics)
        dh__series_observe(SERIES(c->metrics, heartbeat_gap), gap_s);
}

void dh__coord_metrics_prediction(dh_coordinator_t *c, const dh_prediction_t *p)
{
    struct dh__coord_metrics *m = c->metrics;
    if (!m)
        return;
    if (p->pred_cpu_s > 0 && isfinite(p->actual_cpu_s))
        dh__series_observe(SERIES(m, cpu_ratio), p->actual_cpu_s / p->pred_cpu_s);
    dh__series_observe(SERIES(m, cpu_abs_error), fabs(p->actual_cpu_s - p->pred_cpu_s));
    if (isfinite(p->pred_ready_s))
        dh__series_observe(SERIES(m, ready_abs_error), fabs(p->actual_ready_s - p->pred_ready_s));
}

void dh__coord_metrics_tick(dh_coordinator_t *c)
{
    struct dh__coord_metrics *m = c->metrics;
    if (!m)
        return;
    if (m->n_servers < c->n_servers) { /* new servers: their series, once */
        server_series_t *s = dh_reallocarray(m->servers, c->n_servers, sizeof *s);
        if (!s)
            return; /* no memory now: the next tick tries again */
        m->servers = s;
        for (size_t i = m->n_servers; i < c->n_servers; i++) {
            const char *name = c->servers[i].name;
            server_series_t x = {dh__metric_series(FAMILY(m, server_alive), name),
                                 dh__metric_series(FAMILY(m, server_queue_depth), name),
                                 dh__metric_series(FAMILY(m, server_queued_work), name),
                                 dh__metric_series(FAMILY(m, server_speed), name),
                                 dh__metric_series(FAMILY(m, server_silence), name)};
            if (!x.alive || !x.queue_depth || !x.queued_work || !x.speed || !x.silence)
                break;
            m->servers[m->n_servers++] = x;
        }
    }
    uint64_t now = dh_clock_now_ns();
    for (size_t i = 0; i < m->n_servers; i++) {
        const server_t *s = &c->servers[i];
        const server_series_t *x = &m->servers[i];
        dh__series_set(x->alive, s->alive ? 1 : 0);
        dh__series_set(x->queue_depth, s->queue_len);
        dh__series_set(x->queued_work, s->queued_cpu_s);
        dh__series_set(x->speed, s->speed);
        dh__series_set(x->silence,
                       now > s->last_seen_ns ? (double)(now - s->last_seen_ns) * 1e-9 : 0);
    }
    dh__series_set(SERIES(m, book), (double)c->n_book);
    dh__series_set(SERIES(m, late), (double)c->n_late);
}
