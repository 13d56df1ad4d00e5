/* coordinator_metrics.c: the coordinator's Prometheus metrics, served on `--metrics-listen`
 * (runtime/metrics.h; every metric and its meaning: docs/operations.md, "Metrics").
 *
 * Three sources, none invented here:
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
    dh__series_t *decisions[N_REASONS];
    dh__series_t *misses, *heartbeat_gap, *cpu_ratio, *cpu_abs_error, *ready_abs_error;
    dh__series_t *book, *late;
    /* mirrored from c->counters by collect() */
    dh__series_t *requests, *dispatches, *redispatches, *completes, *delivered, *servers_alive,
        *servers_dead, *client_hellos, *rebalance_rounds, *sched_s;
    dh__metric_t *f_alive, *f_depth, *f_work, *f_speed, *f_silence;
    server_series_t *servers; /* by server index */
    size_t n_servers;
};

static const double ratio_bounds[] = {0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4};
static const double error_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                      0.25,  0.5,    1,     2.5,  5,     10};
static const double gap_bounds[] = {0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5};
#define NB(a) (sizeof(a) / sizeof((a)[0]))

/* The registry's collect callback (the scraping thread): the atomic counters. */
static void collect(void *arg)
{
    const dh_coordinator_t *c = arg;
    struct dh__coord_metrics *m = c->metrics;
    dh_coordinator_stats_t st;
    dh_coordinator_stats(c, &st);
    dh__series_set(m->requests, (double)st.requests);
    dh__series_set(m->dispatches, (double)st.dispatches);
    dh__series_set(m->redispatches, (double)st.redispatches);
    dh__series_set(m->completes, (double)st.completes);
    dh__series_set(m->delivered, (double)st.delivered);
    dh__series_set(m->servers_alive, (double)st.servers_alive);
    dh__series_set(m->servers_dead, (double)st.servers_dead_declared);
    dh__series_set(m->client_hellos, (double)st.clients);
    dh__series_set(m->rebalance_rounds, (double)st.rebalance_rounds);
    dh__series_set(m->sched_s, st.sched_s);
}

static int build(struct dh__coord_metrics *m)
{
    dh__metrics_t *r = m->reg;
    dh__metric_t *dec = dh__metrics_add(
        r, "datahelix_coordinator_decisions_total",
        "Placement decisions by the rule that chose the server (dh_place_reason_name; "
        "no_candidate: none could take it now, tried again later).",
        DH__METRIC_COUNTER, "rule", NULL, 0);
    if (!dec)
        return DH_ENOMEM;
    for (int i = 0; i < N_REASONS; i++) /* every rule listed from the start, at 0 */
        if (!(m->decisions[i] = dh__metric_series(dec, dh_place_reason_name(i))))
            return DH_ENOMEM;
    m->misses = DH__COUNTER("datahelix_coordinator_deadline_misses_total",
                            "Decisions whose chosen server's predicted ready time T was past the "
                            "request's deadline (a predicted miss).");
    m->requests = DH__COUNTER("datahelix_coordinator_requests_total", "REQUESTs received.");
    m->dispatches = DH__COUNTER("datahelix_coordinator_dispatches_total", "DISPATCHes sent.");
    m->redispatches = DH__COUNTER("datahelix_coordinator_redispatches_total",
                                  "Requests placed again because their server was declared dead.");
    m->completes = DH__COUNTER("datahelix_coordinator_completes_total",
                               "COMPLETE reports received (executors' and deliverers').");
    m->delivered = DH__COUNTER("datahelix_coordinator_delivered_total",
                               "Requests delivered to their rank (ended in the book).");
    m->servers_alive = DH__GAUGE("datahelix_coordinator_servers_alive", "DataServers alive now.");
    m->servers_dead =
        DH__COUNTER("datahelix_coordinator_servers_declared_dead_total",
                    "DataServers declared dead: silent past --dead-after-ms, or gone (GOODBYE, a "
                    "broken connection).");
    m->client_hellos = DH__COUNTER("datahelix_coordinator_client_registrations_total",
                                   "Clients (ranks) registered, a re-registration counted again.");
    m->rebalance_rounds =
        DH__COUNTER("datahelix_coordinator_rebalance_rounds_total",
                    "Tier-2 rebalance rounds gathered and sent to their members.");
    m->sched_s = DH__COUNTER("datahelix_coordinator_sched_seconds_total",
                             "Seconds spent in the placement rule (dh_place).");
    m->book = DH__GAUGE("datahelix_coordinator_book_requests",
                        "Requests in the book: received and not yet delivered.");
    m->late = DH__GAUGE("datahelix_coordinator_late_reports_requests",
                        "Delivered requests waiting for their executor's report (at most 1024).");
    m->heartbeat_gap =
        dh__metrics_one(r, "datahelix_coordinator_heartbeat_gap_seconds",
                        "Seconds between a DataServer's heartbeat and its previous message "
                        "(nominally the heartbeat period, 0.1 s by default; longer gaps are "
                        "missed heartbeats).",
                        DH__METRIC_HISTOGRAM, gap_bounds, NB(gap_bounds));
    m->cpu_ratio = dh__metrics_one(
        r, "datahelix_coordinator_cpu_actual_over_predicted_ratio",
        "Per executed request: measured CPU seconds / predicted C_cpu (the cost model's "
        "prediction x the server's speed factor at placement).",
        DH__METRIC_HISTOGRAM, ratio_bounds, NB(ratio_bounds));
    m->cpu_abs_error =
        dh__metrics_one(r, "datahelix_coordinator_cpu_prediction_abs_error_seconds",
                        "Per executed request: |measured CPU seconds - predicted C_cpu|.",
                        DH__METRIC_HISTOGRAM, error_bounds, NB(error_bounds));
    m->ready_abs_error =
        dh__metrics_one(r, "datahelix_coordinator_ready_prediction_abs_error_seconds",
                        "Per executed request: |actual - predicted ready time T| (DISPATCH to the "
                        "executor's COMPLETE).",
                        DH__METRIC_HISTOGRAM, error_bounds, NB(error_bounds));
    m->f_alive = dh__metrics_add(r, "datahelix_coordinator_server_alive",
                                 "1 while the DataServer is alive, 0 once declared dead.",
                                 DH__METRIC_GAUGE, "server", NULL, 0);
    m->f_depth = dh__metrics_add(
        r, "datahelix_coordinator_server_queue_depth",
        "Requests the coordinator's book holds for the server: dispatched, not yet executed "
        "(corrected by its heartbeats).",
        DH__METRIC_GAUGE, "server", NULL, 0);
    m->f_work =
        dh__metrics_add(r, "datahelix_coordinator_server_queued_work_seconds",
                        "Predicted CPU seconds (speed 1) of the requests in the server's queue.",
                        DH__METRIC_GAUGE, "server", NULL, 0);
    m->f_speed = dh__metrics_add(r, "datahelix_coordinator_server_speed_factor",
                                 "The server's learned speed factor (measured / predicted CPU).",
                                 DH__METRIC_GAUGE, "server", NULL, 0);
    m->f_silence = dh__metrics_add(r, "datahelix_coordinator_server_silence_seconds",
                                   "Seconds since the server's last message.", DH__METRIC_GAUGE,
                                   "server", NULL, 0);
    if (!m->misses || !m->requests || !m->dispatches || !m->redispatches || !m->completes ||
        !m->delivered || !m->servers_alive || !m->servers_dead || !m->client_hellos ||
        !m->rebalance_rounds || !m->sched_s || !m->book || !m->late || !m->heartbeat_gap ||
        !m->cpu_ratio || !m->cpu_abs_error || !m->ready_abs_error || !m->f_alive || !m->f_depth ||
        !m->f_work || !m->f_speed || !m->f_silence)
        return DH_ENOMEM;
    return 0;
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
        dh__series_add(m->misses, 1);
}

void dh__coord_metrics_heartbeat(dh_coordinator_t *c, double gap_s)
{
    if (c->metrics)
        dh__series_observe(c->metrics->heartbeat_gap, gap_s);
}

void dh__coord_metrics_prediction(dh_coordinator_t *c, const dh_prediction_t *p)
{
    struct dh__coord_metrics *m = c->metrics;
    if (!m)
        return;
    if (p->pred_cpu_s > 0 && isfinite(p->actual_cpu_s))
        dh__series_observe(m->cpu_ratio, p->actual_cpu_s / p->pred_cpu_s);
    dh__series_observe(m->cpu_abs_error, fabs(p->actual_cpu_s - p->pred_cpu_s));
    if (isfinite(p->pred_ready_s))
        dh__series_observe(m->ready_abs_error, fabs(p->actual_ready_s - p->pred_ready_s));
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
            server_series_t x = {
                dh__metric_series(m->f_alive, name), dh__metric_series(m->f_depth, name),
                dh__metric_series(m->f_work, name), dh__metric_series(m->f_speed, name),
                dh__metric_series(m->f_silence, name)};
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
    dh__series_set(m->book, (double)c->n_book);
    dh__series_set(m->late, (double)c->n_late);
}
