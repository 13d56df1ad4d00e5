/* dataserver_metrics.c: a DataServer's Prometheus metrics, served on `--metrics-listen`
 * (runtime/metrics.h; every metric and its meaning: docs/operations.md, "Metrics").
 *
 * Every metric is a row of the DataServer's table (stats_table.h: its name, type and HELP,
 * and the stats field it mirrors). Sources, none invented here:
 *   - the counters of counters.h (tasks, bytes forwarded, arena waits, spills, ...) and the
 *     workers' busy nanoseconds, atomics, and the arena's allocation records (through a
 *     read-only view, dh_dataserver_arena_stats: no lock the workers take), read by the
 *     registry's collect callback on the scraping thread;
 *   - each finished task's measured CPU seconds against the DISPATCH's prediction, observed
 *     by the loop thread as it drains the results;
 *   - the loop's book (what its heartbeats report: queue depth and queued predicted work),
 *     pushed by the loop thread on each turn, two relaxed stores.
 * The busy fraction is over the interval between two scrapes (libmicrohttpd serves them one
 * at a time, so collect() keeps that interval's start without a lock); a task counts when
 * it ends, so a scrape interval shorter than a task reads lumpy.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "runtime/dataserver_internal.h"
#include "runtime/dataserver_metrics.h"
#include "runtime/metrics.h"

struct dh__ds_metrics {
    dh__metrics_t *reg;
    dh__metrics_http_t *http;
    /* by row of DH__DS_STATS (stats_table.h): the counters' series are mirrored from
     * s->counters by collect(), the others written here */
    dh__metric_t *family[DH__DS_ROWS];
    dh__series_t *series[DH__DS_ROWS];
    /* collect()'s (the scraping thread's): the previous scrape, for the busy fraction */
    uint64_t last_ns, last_busy_ns;
};

static const double ratio_bounds[] = {0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4};
#define SERIES(m, key) ((m)->series[DH__DS_ROW_##key])

static const double *bounds(size_t row, size_t *n) /* cpu_ratio, its one histogram */
{
    (void)row;
    *n = sizeof ratio_bounds / sizeof ratio_bounds[0];
    return ratio_bounds;
}

static void collect(void *arg)
{
    const dh_dataserver_t *s = arg;
    struct dh__ds_metrics *m = s->metrics;
    dh_dataserver_stats_t st;
    dh_dataserver_stats(s, &st);
    dh__stats_metrics_mirror(DH_METRICS_DATASERVER, &st, m->series);

    uint64_t now = dh_clock_now_ns(), busy = dh__counter_get(&s->busy_ns);
    dh__series_set(SERIES(m, busy_s), (double)busy * 1e-9);
    if (m->last_ns && now > m->last_ns && s->cfg.workers)
        dh__series_set(SERIES(m, busy_ratio), (double)(busy - m->last_busy_ns) /
                                                  ((double)(now - m->last_ns) * s->cfg.workers));
    m->last_ns = now;
    m->last_busy_ns = busy;

    dh_shm_arena_stats_t a;
    if (s->arena && dh_dataserver_arena_stats(s, &a) == 0) {
        dh__series_set(SERIES(m, arena_size), (double)a.size_bytes);
        dh__series_set(SERIES(m, arena_used_bytes), (double)a.slabs_used * (double)a.slab_size);
        dh__series_set(SERIES(m, arena_slabs_used), (double)a.slabs_used);
        dh__series_set(SERIES(m, arena_slabs_total), (double)a.slabs_total);
        dh__series_set(SERIES(m, arena_allocations), (double)a.allocations_live);
    }
}

static int build(struct dh__ds_metrics *m, const dh_dataserver_t *s)
{
    int rc = dh__stats_metrics_build(m->reg, DH_METRICS_DATASERVER, bounds, m->family, m->series);
    dh__series_t *info = rc ? NULL : dh__metric_series(m->family[DH__DS_ROW_info], s->name);
    if (!info)
        return DH_ENOMEM;
    dh__series_set(info, 1);
    dh__series_set(SERIES(m, workers), s->cfg.workers);
    return 0;
}

int dh__ds_metrics_start(dh_dataserver_t *s, const char *listen)
{
    struct dh__ds_metrics *m = dh_calloc(1, sizeof *m);
    if (!m)
        return dh__set_error(DH_ENOMEM, "out of memory for the DataServer's metrics");
    s->metrics = m;
    char who[NAME_CAP + 16];
    snprintf(who, sizeof who, "DataServer '%s'", s->name);
    int rc = dh__metrics_new(&m->reg);
    if (rc == 0 && (rc = build(m, s)) != 0)
        dh__set_error(rc, "out of memory for the DataServer's metrics");
    if (rc == 0) {
        dh__metrics_set_collect(m->reg, collect, s);
        rc = dh__metrics_http_start(&m->http, m->reg, listen, who);
    }
    if (rc) {
        dh__ds_metrics_destroy(s);
        return rc;
    }
    dh_log_info("%s: metrics on %s, port %u: GET /metrics", who, listen,
                dh__metrics_http_port(m->http));
    return 0;
}

void dh__ds_metrics_destroy(dh_dataserver_t *s)
{
    struct dh__ds_metrics *m = s->metrics;
    if (!m)
        return;
    dh__metrics_http_stop(&m->http); /* no scrape runs past here */
    dh__metrics_destroy(&m->reg);
    dh_free(m);
    s->metrics = NULL;
}

uint16_t dh_dataserver_metrics_port(const dh_dataserver_t *s)
{
    return s->metrics && s->metrics->http ? dh__metrics_http_port(s->metrics->http) : 0;
}

void dh__ds_metrics_task(dh_dataserver_t *s, const task_t *t)
{
    struct dh__ds_metrics *m = s->metrics;
    double pred = t->msg.dispatch.pred_cpu_s;
    if (m && t->rc == 0 && pred > 0 && isfinite(t->result.cpu_s))
        dh__series_observe(SERIES(m, cpu_ratio), t->result.cpu_s / pred);
}

void dh__ds_metrics_tick(dh_dataserver_t *s)
{
    struct dh__ds_metrics *m = s->metrics;
    if (!m)
        return;
    dh__series_set(SERIES(m, queue_depth), s->booked_tasks);
    dh__series_set(SERIES(m, queued_work), s->booked_cpu_s > 0 ? s->booked_cpu_s : 0);
}
