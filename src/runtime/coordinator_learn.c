/* coordinator_learn.c: what the coordinator learns from an executor's COMPLETE
 * (docs/design.md §4.1, "Online feedback"): the cost model's per-key CPU seconds, each
 * server's speed factor (anchored at their median on the loop's tick), the fetch model's
 * per-(server, source) fetch of remote samples (docs/profiles.md, "The fetch model"), and the
 * record of predicted against actual costs (dh_coordinator_predictions, the telemetry's "complete"
 * lines, the metrics). The loop thread writes under learn_lock; the dh_coordinator_* readers
 * here take it from any thread.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/coordinator_metrics.h"
#include "runtime/descriptor.h"
#include "core/internal.h"

/* The fetch model learns each remote sample's fetch on the server that executed it: its
 * source's line in the sample's encoded size (what placement will know of the next one), from
 * the seconds its executor waited for the bytes. A local sample teaches nothing (its C_io is
 * the server's storage bandwidth), nor a failed one (it may have stopped half-way). A
 * remote sample that waited 0 s (all in the server's cache) is learned as such: that server
 * is cheap for the source. O(samples x sources). */
static void learn_fetch(dh_coordinator_t *c, uint32_t server, const dh_msg_request_t *q,
                        const dh_msg_complete_t *m, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (m->samples[i].status != 0)
            continue;
        char key[DH__FETCH_SOURCE_MAX];
        dh__fetch_source_key(q->samples[i].uri, key);
        if (strcmp(key, DH__FETCH_SOURCE_LOCAL) == 0)
            continue;
        if (dh__fetch_model_observe(c->fetch, key, server, (double)q->samples[i].in_bytes,
                                    m->samples[i].fetch_s) != 0)
            dh_log_debug("coordinator: fetch model: %s", dh_last_error());
    }
}

/* Learns from an executor's COMPLETE (learn_lock held): the cost model observes each
 * sample's measured CPU seconds per profile key, and the server's speed factor learns only
 * what the model cannot explain. Both must not learn the same discrepancy: in the emulation
 * every server truly runs at speed 1 while each key is off by its own bias, so a speed
 * factor that learned measured / predicted would swing with the keys of the requests it
 * happened to run (and then hide them from the model, which divides by it). So the speed
 * factor's residual is measured / (model x speed) over the samples whose key the model
 * already knows (DH_COST_FROM_KEY), taken before this request is observed, clamped and
 * averaged slowly (dh_cost_speed_learn); samples of keys not known yet teach the speed
 * nothing. A truly slower server still shows: its residual stays above 1 on every key, and
 * the model, which divides by the speed, stops absorbing it once the speed has. A sender
 * without per-sample measurements teaches the speed from the request's total.
 * O(samples), one hash look-up each. */
static void learn(dh_coordinator_t *c, server_t *s, const entry_t *e, const dh_msg_complete_t *m)
{
    const dh_msg_request_t *q = &e->msg.request;
    uint32_t n = m->n_samples < q->n_samples ? m->n_samples : q->n_samples;
    double known_measured = 0, known_predicted = 0;
    bool per_sample = false;
    for (uint32_t i = 0; i < n; i++) {
        per_sample |= m->samples[i].cpu_s > 0;
        if (m->samples[i].status != 0 || !(m->samples[i].cpu_s > 0))
            continue; /* failed, or not measured */
        dh_profile_row_t row;
        dh__rt_row_of_sample(&q->samples[i], &row);
        dh_cost_source_t src;
        double pred = dh_cost_model_predict(c->model, &row, &src);
        if (src == DH_COST_FROM_KEY && pred > 0) {
            known_measured += m->samples[i].cpu_s;
            known_predicted += pred * s->speed;
        }
        if (dh_cost_model_observe(c->model, &row, m->samples[i].cpu_s, s->speed) != 0)
            dh_log_debug("coordinator: cost model: %s", dh_last_error());
    }
    learn_fetch(c, (uint32_t)(s - c->servers), q, m, n);
    if (!per_sample) { /* a sender without per-sample measurements */
        known_measured = m->cpu_s;
        known_predicted = e->pred_cpu_s * s->speed;
    }
    s->speed = dh_cost_speed_learn(s->speed, known_measured, known_predicted);
    dh__coord_touch(c, (int32_t)(s - c->servers));
}

/* Keeps the executed request's predicted and actual costs (learn_lock held), and writes them
 * to the telemetry as a "complete" line. */
static void record_prediction(dh_coordinator_t *c, int32_t si, const entry_t *e,
                              const dh_msg_complete_t *m)
{
    dh_prediction_t p = {.rank = e->msg.request.rank,
                         .seq = e->msg.request.seq,
                         .n_samples = e->msg.request.n_samples,
                         .server = (uint32_t)si,
                         .deadline_s = e->deadline_s,
                         .pred_cpu_s = e->pred_c_cpu_s,
                         .profile_cpu_s = e->profile_cpu_s,
                         .actual_cpu_s = m->cpu_s,
                         .pred_ready_s = e->pred_t_s,
                         .actual_ready_s = dh_clock_elapsed_s(e->dispatch_ns, dh_clock_now_ns()),
                         .pred_fetch_s = e->pred_fetch_s};
    for (uint32_t i = 0; i < m->n_samples; i++) {
        p.fetch_s += m->samples[i].fetch_s;
        p.fetch_bytes += m->samples[i].fetch_bytes;
    }
    if (c->n_predictions < DH_COORDINATOR_PREDICTIONS_MAX) {
        /* capacities double from 16: the last growth lands on the maximum exactly */
        if (dh__coord_grow((void **)&c->predictions, &c->cap_predictions, c->n_predictions + 1,
                           sizeof *c->predictions) == 0)
            c->predictions[c->n_predictions++] = p;
        /* else no memory for the record: the run goes on without it */
    } else { /* full: a ring, next_prediction the oldest */
        c->predictions[c->next_prediction] = p;
        c->next_prediction = (c->next_prediction + 1) % DH_COORDINATOR_PREDICTIONS_MAX;
    }
    dh__coord_metrics_prediction(c, &p);
    if (c->telemetry)
        fprintf(c->telemetry,
                "{\"t_s\":%.6f,\"event\":\"complete\",\"client\":\"%s\",\"seq\":%llu,"
                "\"rank\":%u,\"server\":\"%s\",\"samples\":%u,\"deadline_s\":%.6f,"
                "\"pred_cpu_s\":%.6f,\"cpu_s\":%.6f,\"pred_fetch_s\":%.6f,\"fetch_s\":%.6f,"
                "\"fetch_bytes\":%llu,\"pred_t_s\":%.6f,\"t_actual_s\":%.6f}\n",
                dh_clock_elapsed_s(c->start_ns, dh_clock_now_ns()), e->msg.request.client_id,
                (unsigned long long)p.seq, p.rank, c->servers[si].name, p.n_samples, p.deadline_s,
                p.pred_cpu_s, p.actual_cpu_s, p.pred_fetch_s, p.fetch_s,
                (unsigned long long)p.fetch_bytes, p.pred_ready_s, p.actual_ready_s);
}

void dh__coord_learn(dh_coordinator_t *c, int32_t si, const entry_t *e, const dh_msg_complete_t *m)
{
    pthread_mutex_lock(&c->learn_lock);
    learn(c, &c->servers[si], e, m);
    record_prediction(c, si, e, m);
    pthread_mutex_unlock(&c->learn_lock);
}

size_t dh_coordinator_predictions(const dh_coordinator_t *cc, dh_prediction_t *out, size_t cap)
{
    dh_coordinator_t *c = (dh_coordinator_t *)cc; /* the lock only */
    pthread_mutex_lock(&c->learn_lock);
    size_t n = c->n_predictions;
    /* oldest first: the ring starts at next_prediction once it is full */
    size_t first = n == DH_COORDINATOR_PREDICTIONS_MAX ? c->next_prediction : 0;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = c->predictions[(first + i) % DH_COORDINATOR_PREDICTIONS_MAX];
    pthread_mutex_unlock(&c->learn_lock);
    return n;
}

double dh_coordinator_key_ratio(const dh_coordinator_t *cc, const char *profile_key, uint64_t *obs)
{
    dh_coordinator_t *c = (dh_coordinator_t *)cc;
    pthread_mutex_lock(&c->learn_lock);
    double r = dh_cost_model_key_ratio(c->model, profile_key, obs);
    pthread_mutex_unlock(&c->learn_lock);
    return r;
}

double dh__coord_server_speed(const dh_coordinator_t *cc, const char *server)
{
    dh_coordinator_t *c = (dh_coordinator_t *)cc;
    pthread_mutex_lock(&c->learn_lock);
    double speed = NAN;
    for (size_t i = 0; i < c->n_servers; i++)
        if (strcmp(c->servers[i].name, server) == 0)
            speed = c->servers[i].speed;
    pthread_mutex_unlock(&c->learn_lock);
    return speed;
}

int dh__coord_fetch_estimate(const dh_coordinator_t *cc, const char *server, const char *source,
                             dh__fetch_estimate_t *out)
{
    dh_coordinator_t *c = (dh_coordinator_t *)cc;
    int rc = dh__set_error(DH_EUNKNOWN, "coordinator: no server '%s'", server);
    pthread_mutex_lock(&c->learn_lock);
    for (size_t i = 0; i < c->n_servers; i++)
        if (strcmp(c->servers[i].name, server) == 0) {
            dh__fetch_model_estimate(c->fetch, source, (uint32_t)i, out);
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&c->learn_lock);
    return rc;
}

/* Anchors the speed factors at their median over the live executing servers, the model
 * scaled to match (dh_cost_speed_anchor: the model and the speeds share a free common
 * factor, fixed by assuming most servers run as profiled). On the loop's tick (20 ms):
 * O(servers log servers). */
void dh__coord_anchor_speeds(dh_coordinator_t *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_servers; i++)
        n += c->servers[i].alive && c->servers[i].workers > 0;
    if (n < 2)
        return;
    double *speeds = dh_malloc(n * sizeof *speeds);
    if (!speeds)
        return;
    n = 0;
    for (size_t i = 0; i < c->n_servers; i++)
        if (c->servers[i].alive && c->servers[i].workers > 0)
            speeds[n++] = c->servers[i].speed;
    double median = dh_cost_speed_anchor(speeds, n);
    dh_free(speeds);
    if (fabs(median - 1) < 1e-3)
        return; /* not worth touching the model for */
    pthread_mutex_lock(&c->learn_lock);
    for (size_t i = 0; i < c->n_servers; i++) {
        c->servers[i].speed /= median;
        dh__coord_touch(c, (int32_t)i); /* O(N) on the tick, and only when the median moved */
    }
    dh_cost_model_scale(c->model, median);
    pthread_mutex_unlock(&c->learn_lock);
}
