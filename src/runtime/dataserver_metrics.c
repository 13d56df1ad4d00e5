/* dataserver_metrics.c: a DataServer's Prometheus metrics, served on `--metrics-listen`
 * (runtime/metrics.h; every metric and its meaning: docs/operations.md, "Metrics").
 *
 * Sources, none invented here:
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
    dh__series_t *tasks, *samples, *sample_errors, *delivered_own, *delivered_forwarded, *forwarded,
        *bytes_forwarded, *bytes_received, *bytes_cross_node, *arena_waits, *arena_spills,
        *undeliverable, *rebalance_sent;
    dh__series_t *queue_depth, *queued_work, *workers, *busy_s, *busy_ratio;
    dh__series_t *arena_size, *arena_used_bytes, *arena_slabs_used, *arena_slabs_total,
        *arena_allocations;
    dh__series_t *cpu_ratio;
    /* collect()'s (the scraping thread's): the previous scrape, for the busy fraction */
    uint64_t last_ns, last_busy_ns;
};

static const double ratio_bounds[] = {0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4};

static void collect(void *arg)
{
    const dh_dataserver_t *s = arg;
    struct dh__ds_metrics *m = s->metrics;
    dh_dataserver_stats_t st;
    dh_dataserver_stats(s, &st);
    dh__series_set(m->tasks, (double)st.tasks);
    dh__series_set(m->samples, (double)st.samples);
    dh__series_set(m->sample_errors, (double)st.sample_errors);
    dh__series_set(m->delivered_own, (double)st.delivered_local);
    dh__series_set(m->delivered_forwarded, (double)st.delivered_forwarded);
    dh__series_set(m->forwarded, (double)st.forwarded);
    dh__series_set(m->bytes_forwarded, (double)st.bytes_forwarded);
    dh__series_set(m->bytes_received, (double)st.bytes_received);
    dh__series_set(m->bytes_cross_node, (double)st.bytes_cross_node);
    dh__series_set(m->arena_waits, (double)st.arena_waits);
    dh__series_set(m->arena_spills, (double)st.arena_spills);
    dh__series_set(m->undeliverable, (double)st.undeliverable);
    dh__series_set(m->rebalance_sent, (double)st.rebalance_sent);

    uint64_t now = dh_clock_now_ns(), busy = dh__counter_get(&s->busy_ns);
    dh__series_set(m->busy_s, (double)busy * 1e-9);
    if (m->last_ns && now > m->last_ns && s->cfg.workers)
        dh__series_set(m->busy_ratio, (double)(busy - m->last_busy_ns) /
                                          ((double)(now - m->last_ns) * s->cfg.workers));
    m->last_ns = now;
    m->last_busy_ns = busy;

    dh_shm_arena_stats_t a;
    if (s->arena && dh_dataserver_arena_stats(s, &a) == 0) {
        dh__series_set(m->arena_size, (double)a.size_bytes);
        dh__series_set(m->arena_used_bytes, (double)a.slabs_used * (double)a.slab_size);
        dh__series_set(m->arena_slabs_used, (double)a.slabs_used);
        dh__series_set(m->arena_slabs_total, (double)a.slabs_total);
        dh__series_set(m->arena_allocations, (double)a.allocations_live);
    }
}

static int build(struct dh__ds_metrics *m, const dh_dataserver_t *s)
{
    dh__metrics_t *r = m->reg;
    dh__metric_t *info =
        dh__metrics_add(r, "datahelix_dataserver_info",
                        "1, labelled with the DataServer's name (node-role-pid by default).",
                        DH__METRIC_GAUGE, "server", NULL, 0);
    dh__series_t *info_s = info ? dh__metric_series(info, s->name) : NULL;
    if (!info_s)
        return DH_ENOMEM;
    dh__series_set(info_s, 1);
    m->tasks = DH__COUNTER("datahelix_dataserver_tasks_total", "Requests its workers executed.");
    m->samples = DH__COUNTER("datahelix_dataserver_samples_total", "Samples its workers executed.");
    m->sample_errors = DH__COUNTER("datahelix_dataserver_sample_errors_total",
                                   "Samples that failed (decode error, a raising dataset).");
    dh__metric_t *delivered = dh__metrics_add(
        r, "datahelix_dataserver_batches_delivered_total",
        "Batches placed in its arena for its node's ranks, by source: its own workers (own) "
        "or another DataServer's forwarding (forwarded).",
        DH__METRIC_COUNTER, "source", NULL, 0);
    if (!delivered || !(m->delivered_own = dh__metric_series(delivered, "own")) ||
        !(m->delivered_forwarded = dh__metric_series(delivered, "forwarded")))
        return DH_ENOMEM;
    m->forwarded = DH__COUNTER("datahelix_dataserver_forwarded_batches_total",
                               "Batches it sent to another DataServer (a sidecar's results, tier-2 "
                               "moves).");
    m->bytes_forwarded = DH__COUNTER("datahelix_dataserver_forwarded_bytes_total",
                                     "Payload bytes it sent to another DataServer.");
    m->bytes_cross_node = DH__COUNTER("datahelix_dataserver_cross_node_bytes_total",
                                      "Of the forwarded bytes, those sent to another node.");
    m->bytes_received = DH__COUNTER("datahelix_dataserver_received_bytes_total",
                                    "Payload bytes received from other DataServers.");
    m->arena_waits = DH__COUNTER("datahelix_dataserver_arena_waits_total",
                                 "Times a batch waited for arena space (backpressure).");
    m->arena_spills = DH__COUNTER("datahelix_dataserver_arena_spills_total",
                                  "Tensors sent by copy after the arena stayed full for 50 ms.");
    m->undeliverable = DH__COUNTER("datahelix_dataserver_undeliverable_total",
                                   "Batches dropped because their client was gone.");
    m->rebalance_sent = DH__COUNTER("datahelix_dataserver_rebalance_sent_total",
                                    "Tier-2 parts its clients moved to another node.");
    m->queue_depth =
        DH__GAUGE("datahelix_dataserver_queue_depth",
                  "Requests it holds whose executor COMPLETE it has not sent (queued, "
                  "running, or waiting for their client): what its heartbeat reports.");
    m->queued_work = DH__GAUGE("datahelix_dataserver_queued_work_seconds",
                               "Predicted CPU seconds (speed 1) of those requests.");
    m->workers = DH__GAUGE("datahelix_dataserver_workers", "Worker threads.");
    m->busy_s = DH__COUNTER("datahelix_dataserver_worker_busy_seconds_total",
                            "Wall seconds workers spent executing tasks (counted as each ends).");
    m->busy_ratio = DH__GAUGE("datahelix_dataserver_worker_busy_ratio",
                              "Fraction of the workers' time spent executing tasks since the "
                              "previous scrape (0 at the first).");
    m->arena_size = DH__GAUGE("datahelix_dataserver_arena_size_bytes",
                              "Its shared-memory arena's size (0 for a sidecar, which has none).");
    m->arena_used_bytes = DH__GAUGE("datahelix_dataserver_arena_used_bytes",
                                    "Bytes of the arena's slabs in allocations not yet collected.");
    m->arena_slabs_used =
        DH__GAUGE("datahelix_dataserver_arena_slabs_used", "Arena slabs in allocations not yet "
                                                           "collected.");
    m->arena_slabs_total = DH__GAUGE("datahelix_dataserver_arena_slabs", "Slabs in the arena.");
    m->arena_allocations = DH__GAUGE("datahelix_dataserver_arena_allocations_live",
                                     "Arena allocations still referenced (batches ranks hold).");
    m->cpu_ratio = dh__metrics_one(
        r, "datahelix_dataserver_cpu_actual_over_predicted_ratio",
        "Per executed request: measured CPU seconds / the DISPATCH's predicted "
        "CPU seconds at speed 1 (a server slower than speed 1 reads above 1).",
        DH__METRIC_HISTOGRAM, ratio_bounds, sizeof ratio_bounds / sizeof ratio_bounds[0]);
    if (!m->tasks || !m->samples || !m->sample_errors || !m->forwarded || !m->bytes_forwarded ||
        !m->bytes_cross_node || !m->bytes_received || !m->arena_waits || !m->arena_spills ||
        !m->undeliverable || !m->rebalance_sent || !m->queue_depth || !m->queued_work ||
        !m->workers || !m->busy_s || !m->busy_ratio || !m->arena_size || !m->arena_used_bytes ||
        !m->arena_slabs_used || !m->arena_slabs_total || !m->arena_allocations || !m->cpu_ratio)
        return DH_ENOMEM;
    dh__series_set(m->workers, s->cfg.workers);
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
        dh__series_observe(m->cpu_ratio, t->result.cpu_s / pred);
}

void dh__ds_metrics_tick(dh_dataserver_t *s)
{
    struct dh__ds_metrics *m = s->metrics;
    if (!m)
        return;
    dh__series_set(m->queue_depth, s->booked_tasks);
    dh__series_set(m->queued_work, s->booked_cpu_s > 0 ? s->booked_cpu_s : 0);
}
