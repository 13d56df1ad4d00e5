/* client_rebalance.c: a client's rounds of tier 2 (docs/rebalancing.md; the API is in
 * client.h): the life of a round on this rank, from its OFFER to its final batches.
 *
 * Everything here runs on the fetcher thread, which owns the ring's parts until a batch is
 * final; next() takes a batch only once its round is applied (part 0's `final`).
 *
 *   offer   round r holds batches [r x steps, (r+1) x steps). Once every part of them is in
 *           the ring, the client computes each part's features (feature_fn, else tokens,
 *           bytes, measured decode seconds) and sends an OFFER to the coordinator on its own
 *           socket ("<id>/rb"): the parts' handles, samples and features, its learned
 *           seconds per token, the group's ranks.
 *   decide  the coordinator answers with the ROUND (every member's parts, the same bytes
 *           for every member) or END (every member keeps). Every member runs the same
 *           policy on the same ROUND (client_rebalance_decide.c). Rounds apply in order.
 *   apply   each part leaving this rank gives its ring slot to a part coming in
 *           (client_rebalance_move.c: on one node by a change of the slabs' owner, from
 *           another node through the DataServers or exchange_fn).
 *   final   once every incoming part is in, batches of several parts are joined (as
 *           fanout > 1 always is; on the joiner thread, so the fetcher goes on meanwhile),
 *           the batches become final, and next() may take them.
 * A policy that fails (an error code, a bad assignment) keeps the round: the batches are
 * yielded as planned, and next() reports the error once, naming the round.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/rebalance.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"
#include "wire/wire_lib.h"

static void *joiner_main(void *arg);

int dh__client_rb_init(dh_client_t *c, const dh_client_config_t *cfg)
{
    rb_state_t *rb = &c->rb;
    const dh_rebalance_config_t *rc = &cfg->rebalance;
    memset(rb, 0, sizeof *rb);
    if (!rc->enabled)
        return 0;
    if (rc->buffer_size == 0)
        return dh__set_error(DH_EINVAL, "client: rebalance.buffer_size must be at least 1");
    if (!(rc->min_gain >= 0) || !isfinite(rc->min_gain) || !(rc->move_s_per_B >= 0) ||
        !isfinite(rc->move_s_per_B))
        return dh__set_error(DH_EINVAL,
                             "client: rebalance.min_gain (%g) and move_s_per_B (%g) "
                             "must be finite and >= 0",
                             rc->min_gain, rc->move_s_per_B);
    if (rc->feature_fn && (rc->n_features < 1 || rc->n_features > DH_REBALANCE_MAX_FEATURES))
        return dh__set_error(DH_EINVAL,
                             "client: rebalance.n_features must be in [1, %d] with a feature_fn, "
                             "got %zu",
                             DH_REBALANCE_MAX_FEATURES, rc->n_features);
    if (rc->late_ms < 0)
        return dh__set_error(DH_EINVAL, "client: rebalance.late_ms must be >= 0, got %d",
                             rc->late_ms);
    if (rc->round_timeout_ms <= 0)
        return dh__set_error(DH_EINVAL, "client: rebalance.round_timeout_ms must be > 0, got %d",
                             rc->round_timeout_ms);
    uint32_t first = 0, count = 0;
    if (rc->group_of) {
        rb->group = rc->group_of[cfg->rank];
    } else {
        uint32_t local = cfg->local_ranks ? cfg->local_ranks : cfg->ranks;
        rb->group = cfg->rank / local;
        first = rb->group * local;
        count = first + local <= cfg->ranks ? local : cfg->ranks - first;
    }
    rb->ranks = dh_calloc(cfg->ranks, sizeof *rb->ranks);
    if (!rb->ranks)
        return dh__set_error(DH_ENOMEM, "out of memory for the rebalance group");
    for (uint32_t r = 0; r < cfg->ranks; r++)
        if (rc->group_of ? rc->group_of[r] == rb->group : r >= first && r < first + count)
            rb->ranks[rb->n_ranks++] = r;
    if (rb->n_ranks < 2) {
        dh_log_info("client '%s': rank %u is alone in its rebalance group %u: no tier 2", c->id,
                    cfg->rank, rb->group);
        return 0;
    }
    uint64_t per_round = (uint64_t)rb->n_ranks * cfg->batch;
    rb->steps = (uint32_t)(rc->buffer_size / per_round ? rc->buffer_size / per_round : 1);
    if (rb->steps > cfg->prefetch)
        rb->steps = cfg->prefetch; /* a round must fit the prefetch horizon */
    /* ... and its bytes: a rank holds a round's batches materialized at once, so no more
     * steps than its share of the arena holds batches of the largest samples (at least
     * one). Without this, 64 samples of 720p clips (4 steps of 8 ranks x 2, 590 MB a
     * padded batch) held 15 GB and stalled every rank until the round filled. */
    if (c->byte_budget > 0 && c->largest_batch > 0) {
        double fit = floor(c->byte_budget / c->largest_batch);
        if (fit < rb->steps)
            rb->steps = fit >= 1 ? (uint32_t)fit : 1;
    }
    if (rc->args && !(rb->args = dh_strdup(rc->args)))
        return dh__set_error(DH_ENOMEM, "out of memory for rebalance.args");
    char id[NAME_CAP + 4];
    snprintf(id, sizeof id, "%s/rb", c->id);
    int err;
    dh_wire_socket_opts_t opts = {.keys = c->keys};
    if ((err = dh_wire_socket_new(&rb->sock, c->ctx, ZMQ_DEALER, &opts)) ||
        (err = dh__wire_set_routing_id(rb->sock, id)) ||
        (err = dh_wire_socket_connect(rb->sock, c->coord_endpoint)))
        return err;
    pthread_cond_init(&rb->join_cond, NULL);
    rb->join_cond_made = true;
    if (cfg->fanout > 1) {
        int e = pthread_create(&rb->joiner, NULL, joiner_main, c);
        if (e)
            return dh__set_error(-e, "client: pthread_create (tier-2 joiner): %s", strerror(e));
        rb->joiner_started = true;
    }
    rb->on = true;
    dh_log_info("client '%s': tier 2 on: group %u of %u ranks, rounds of %u steps (%llu "
                "samples), min_gain %g",
                c->id, rb->group, rb->n_ranks, rb->steps,
                (unsigned long long)(rb->steps * per_round), rc->min_gain);
    return 0;
}

void dh__client_rb_stop(dh_client_t *c)
{
    rb_state_t *rb = &c->rb;
    if (!rb->joiner_started)
        return;
    pthread_mutex_lock(&c->lock);
    rb->join_stop = true;
    pthread_cond_signal(&rb->join_cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(rb->joiner, NULL);
    rb->joiner_started = false;
}

void dh__client_rb_destroy(dh_client_t *c)
{
    rb_state_t *rb = &c->rb;
    dh__client_rb_stop(c);
    if (rb->join_cond_made)
        pthread_cond_destroy(&rb->join_cond);
    for (size_t i = 0; i < RB_WINDOW; i++)
        dh_msg_clear(&rb->got[i]);
    for (size_t i = 0; i < rb->n_early; i++)
        dh__client_part_release(&rb->early[i]);
    dh_free(rb->early);
    dh_free(rb->expect);
    dh_free(rb->ranks);
    dh_free(rb->args);
    dh_wire_socket_destroy(&rb->sock);
    memset(rb, 0, sizeof *rb);
}

bool dh__client_rb_must_request(const dh_client_t *c, uint64_t b)
{
    return c->rb.on && b / c->rb.steps == c->consumed / c->rb.steps;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double p95(const double *ring, size_t count)
{
    size_t n = count < RB_DURATIONS ? count : RB_DURATIONS;
    if (!n)
        return 0;
    double sorted[RB_DURATIONS];
    memcpy(sorted, ring, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_double);
    size_t k = (size_t)ceil(0.95 * (double)n);
    return sorted[k ? k - 1 : 0];
}

void dh__client_rb_stats(const dh_client_t *c, dh_client_stats_t *out)
{
    const rb_state_t *rb = &c->rb;
    out->rebalance_s_p95 = p95(rb->durations, rb->n_durations);
    out->rebalance_final_s_p95 = p95(rb->final_durations, rb->n_final);
    out->rebalance_s_max = rb->duration_max;
    out->rebalance_transfer_s_p95 = p95(rb->transfer_durations, rb->n_transfer);
    out->rebalance_transfer_s_total = rb->transfer_total;
}

/* ---- offer ---- */

static uint64_t round_end(const dh_client_t *c, uint64_t r)
{
    uint64_t end = (r + 1) * c->rb.steps;
    return end < c->total ? end : c->total;
}

static part_t *slot_of(dh_client_t *c, uint64_t b, uint32_t k)
{
    return &c->ring[(b * c->cfg.fanout + k) % c->ring_size];
}

/* Whether every part of round r is in the ring (lock held). */
static bool round_ready(dh_client_t *c, uint64_t r)
{
    uint32_t parts = c->cfg.fanout;
    uint64_t end = round_end(c, r);
    if (r * c->rb.steps >= end || end > c->planned)
        return false;
    for (uint64_t b = r * c->rb.steps; b < end; b++)
        for (uint32_t k = 0; k < parts; k++) {
            const part_t *p = slot_of(c, b, k);
            if (!p->ready || p->seq != b * parts + k)
                return false;
        }
    return true;
}

/* Whether a part can move: every tensor in an arena (a spilled one came by copy). */
static bool movable(const part_t *p)
{
    for (size_t t = 0; t < p->n_tensors; t++)
        if (!p->handles[t].arena_id)
            return false;
    return true;
}

static void wire_part_of(const part_t *p, uint32_t rank, uint64_t b, uint32_t k,
                         dh_wire_rb_part_t *w, dh_wire_tensor_t *tensors)
{
    memset(w, 0, sizeof *w);
    w->rank = rank;
    w->batch = b;
    w->slot = k;
    for (uint32_t i = 0; i < p->n_samples; i++) {
        w->tokens += (double)p->samples[i].tokens;
        w->cpu_s += p->samples[i].cpu_s;
    }
    for (size_t t = 0; t < p->n_tensors; t++) {
        const dh_shm_handle_t *h = &p->handles[t];
        tensors[t] = (dh_wire_tensor_t){.tensor = p->tensors[t],
                                        .location = DH_WIRE_LOC_SHM,
                                        .arena_id = h->arena_id,
                                        .offset = h->offset,
                                        .length = h->length,
                                        .generation = h->generation};
        w->bytes += (double)p->tensors[t].nbytes;
    }
    w->n_tensors = (uint32_t)p->n_tensors;
    w->tensors = tensors;
    w->n_samples = p->n_samples;
    w->samples = p->samples;
    w->server = (char *)p->server;
    w->ready_ns = p->ready_ns;
}

/* The user's features of part p, or the defaults. 0 or the feature_fn's code (why set). */
static int features_of(dh_client_t *c, const part_t *p, const dh_wire_rb_part_t *w,
                       dh_wire_real_t *out, size_t n, char *why, size_t why_cap)
{
    const dh_rebalance_config_t *rc = &c->cfg.rebalance;
    if (!rc->feature_fn) {
        out[0].v = w->tokens;
        out[1].v = w->bytes;
        out[2].v = w->cpu_s;
        return 0;
    }
    dh_client_sample_t samples[p->n_samples ? p->n_samples : 1];
    for (uint32_t i = 0; i < p->n_samples; i++)
        samples[i] =
            (dh_client_sample_t){p->samples[i].id, p->samples[i].tokens, p->samples[i].status,
                                 p->samples[i].status ? p->samples[i].error : NULL, 0};
    double f[DH_REBALANCE_MAX_FEATURES] = {0};
    dh_clear_error(); /* what feature_fn sets, it says */
    int err =
        rc->feature_fn(rc->feature_user, p->tensors, p->n_tensors, samples, p->n_samples, f, n);
    for (size_t i = 0; err == 0 && i < n; i++)
        if (!isfinite(f[i]))
            err = dh__set_error(DH_EINVAL, "feature %zu is %g, not a finite number", i, f[i]);
    if (err) {
        snprintf(why, why_cap, "feature_fn failed on batch %llu part %u of rank %u: %s",
                 (unsigned long long)w->batch, w->slot, w->rank, dh_last_error());
        return err < 0 ? err : DH_EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        out[i].v = f[i];
    return 0;
}

/* Sends round r's OFFER. 0 or a negative code (logged; the round then waits for END). */
static int offer(dh_client_t *c, uint64_t r)
{
    rb_state_t *rb = &c->rb;
    uint32_t parts = c->cfg.fanout;
    uint64_t b0 = r * rb->steps, end = round_end(c, r);
    size_t cap = (size_t)(end - b0) * parts;
    size_t nf = c->cfg.rebalance.feature_fn ? c->cfg.rebalance.n_features : RB_DEFAULT_FEATURES;
    dh_wire_rb_part_t *w = dh_calloc(cap, sizeof *w);
    dh_wire_tensor_t *tensors = dh_calloc(cap * DH__RT_MAX_TENSORS, sizeof *tensors);
    dh_wire_real_t *features = dh_calloc(cap * nf, sizeof *features);
    dh_wire_rb_member_t *members = dh_calloc(rb->n_ranks, sizeof *members);
    char why[512] = "";
    int rc = w && tensors && features && members
                 ? 0
                 : dh__set_error(DH_ENOMEM, "out of memory for a rebalance offer");
    size_t n = 0;
    uint64_t ready = 0;
    for (uint64_t b = b0; rc == 0 && b < end; b++)
        for (uint32_t k = 0; k < parts; k++) {
            const part_t *p = slot_of(c, b, k);
            if (p->received_ns > ready)
                ready = p->received_ns;
            if (!movable(p))
                continue;
            wire_part_of(p, c->cfg.rank, b, k, &w[n], &tensors[n * DH__RT_MAX_TENSORS]);
            w[n].features = &features[n * nf];
            w[n].n_features = (uint32_t)nf;
            if (!why[0])
                features_of(c, p, &w[n], w[n].features, nf, why, sizeof why);
            n++;
        }
    if (rc == 0) {
        pthread_mutex_lock(&c->lock);
        double spt = c->s_per_token;
        double lead = dh__client_deadline_s(c, b0);
        pthread_mutex_unlock(&c->lock);
        for (uint32_t i = 0; i < rb->n_ranks; i++) {
            members[i].rank = rb->ranks[i];
            members[i].client_id = (char *)"";
            members[i].node = (char *)"";
            members[i].endpoint = (char *)"";
            members[i].s_per_token = rb->ranks[i] == c->cfg.rank ? spt : 0;
            members[i].lead_s = rb->ranks[i] == c->cfg.rank
                                    ? (lead > 0 ? lead : 0) + c->cfg.rebalance.late_ms / 1e3
                                    : 0;
        }
        dh_msg_t m = {.type = DH_MSG_REBALANCE};
        m.rebalance.kind = DH_RB_OFFER;
        m.rebalance.group = rb->group;
        m.rebalance.round = r;
        m.rebalance.rank = c->cfg.rank;
        m.rebalance.client_id = c->id;
        m.rebalance.seq = (uint64_t)c->cfg.rebalance.round_timeout_ms;
        m.rebalance.reason = why;
        m.rebalance.n_members = rb->n_ranks;
        m.rebalance.members = members;
        m.rebalance.n_parts = (uint32_t)n;
        m.rebalance.parts = w;
        rc = dh_wire_send(rb->sock, NULL, 0, &m, NULL, 0, 1000);
        if (rc)
            dh_log_warn("client '%s': cannot offer rebalance round %llu to the coordinator %s: %s",
                        c->id, (unsigned long long)r, c->coord_endpoint, dh_last_error());
    }
    if (why[0]) { /* this rank's features failed: the round keeps (the coordinator ends it
                   * for everyone), and next() says why */
        pthread_mutex_lock(&c->lock);
        if (!rb->err) {
            rb->err = DH_EINVAL;
            rb->err_batch = b0;
            snprintf(rb->err_msg, sizeof rb->err_msg, "rebalance round %llu: %s (kept)",
                     (unsigned long long)r, why);
        }
        pthread_mutex_unlock(&c->lock);
    }
    (void)ready;
    dh_free(w);
    dh_free(tensors);
    dh_free(features);
    dh_free(members);
    return rc;
}

/* Records the time since `ready` (when a round's parts, and those of the rounds before it,
 * were all materialized). */
static void record(dh_client_t *c, uint64_t ready, double *ring, size_t *n, double *max)
{
    double s = ready ? dh_clock_elapsed_s(ready, dh_clock_now_ns()) : 0;
    pthread_mutex_lock(&c->lock);
    ring[(*n)++ % RB_DURATIONS] = s;
    if (max && s > *max)
        *max = s;
    pthread_mutex_unlock(&c->lock);
}

void dh__client_rb_set_error(dh_client_t *c, uint64_t r, int code, const char *what)
{
    pthread_mutex_lock(&c->lock);
    if (!c->rb.err) {
        c->rb.err = code;
        c->rb.err_batch = r * c->rb.steps;
        snprintf(c->rb.err_msg, sizeof c->rb.err_msg, "rebalance round %llu (group %u): %s",
                 (unsigned long long)r, c->rb.group, what);
    }
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* Records a cross-node transfer's time (rebalance_transfer_s_*). */
void dh__client_rb_record_transfer(dh_client_t *c, double s)
{
    rb_state_t *rb = &c->rb;
    pthread_mutex_lock(&c->lock);
    rb->transfer_durations[rb->n_transfer++ % RB_DURATIONS] = s;
    rb->transfer_total += s;
    pthread_mutex_unlock(&c->lock);
}

/* Joins batch b's parts (several, fanout > 1) and makes it final. The emulated copy is
 * spent here too (the joiner thread's time, not the fetcher's). */
static void join_batch(dh_client_t *c, uint64_t b)
{
    uint32_t parts = c->cfg.fanout;
    part_t held[parts];
    int rc = 0;
    char why[sizeof held[0].join_error] = "";
    if (parts > 1) {
        pthread_mutex_lock(&c->lock);
        for (uint32_t k = 0; k < parts; k++)
            held[k] = *slot_of(c, b, k);
        pthread_mutex_unlock(&c->lock);
        rc = dh__client_join(c, held, parts, b, why, sizeof why);
    }
    uint64_t r = b / c->rb.steps;
    bool last = b + 1 == round_end(c, r);
    pthread_mutex_lock(&c->lock);
    if (parts > 1)
        for (uint32_t k = 0; k < parts; k++)
            *slot_of(c, b, k) = held[k];
    part_t *p0 = slot_of(c, b, 0);
    p0->joined = parts > 1;
    p0->join_rc = rc;
    snprintf(p0->join_error, sizeof p0->join_error, "%s", why);
    p0->final = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (last)
        record(c, c->rb.ready_ns[r % RB_WINDOW], c->rb.final_durations, &c->rb.n_final, NULL);
}

/* The joiner thread (tier 2, fanout > 1): joins the batches of applied rounds in order, so
 * that the fetcher goes on receiving, offering and applying meanwhile. */
static void *joiner_main(void *arg)
{
    dh_client_t *c = arg;
    rb_state_t *rb = &c->rb;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!rb->join_stop && rb->join_next == rb->join_until)
            pthread_cond_wait(&rb->join_cond, &c->lock);
        if (rb->join_stop)
            break;
        uint64_t b = rb->join_next;
        pthread_mutex_unlock(&c->lock);
        join_batch(c, b);
        pthread_mutex_lock(&c->lock);
        rb->join_next++;
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* The round being applied has all its parts: its batches go to be joined (or are final at
 * once with one part each), and the next round may start. */
static void finish(dh_client_t *c)
{
    rb_state_t *rb = &c->rb;
    uint64_t r = rb->applied;
    uint64_t b0 = r * rb->steps, end = round_end(c, r);
    {
        uint64_t ready = rb->ready_ns[r % RB_WINDOW], got = rb->got_ns[r % RB_WINDOW];
        dh_log_debug("client '%s': rebalance round %llu applied: %.4f s after its parts were "
                     "ready (the ROUND %.4f s after them, applied %.4f s after the ROUND, its "
                     "moved parts in %.4f s after that)",
                     c->id, (unsigned long long)r, dh_clock_elapsed_s(ready, dh_clock_now_ns()),
                     got > ready ? dh_clock_elapsed_s(ready, got) : 0,
                     dh_clock_elapsed_s(got, rb->applying_since_ns),
                     dh_clock_elapsed_s(rb->applying_since_ns, dh_clock_now_ns()));
    }
    if (rb->n_expect) /* parts forwarded from other nodes: the time they took */
        dh__client_rb_record_transfer(c,
                                      dh_clock_elapsed_s(rb->applying_since_ns, dh_clock_now_ns()));
    if (c->cfg.fanout > 1) {
        pthread_mutex_lock(&c->lock);
        rb->join_until = end;
        pthread_cond_signal(&rb->join_cond);
        pthread_mutex_unlock(&c->lock);
    } else {
        for (uint64_t b = b0; b < end; b++)
            join_batch(c, b);
    }
    pthread_mutex_lock(&c->lock);
    rb->applied++;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    dh_msg_clear(&rb->got[r % RB_WINDOW]);
    rb->applying = false;
    rb->n_expect = 0;
}

/* Decides and applies round `applied`, whose ROUND or END is here. */
static void start(dh_client_t *c)
{
    rb_state_t *rb = &c->rb;
    uint64_t r = rb->applied;
    dh_msg_rebalance_t *m = &rb->got[r % RB_WINDOW].rebalance;
    dh__count(&c->counters.rebalance_rounds, 1);
    rb->applying = true;
    rb->applying_since_ns = dh_clock_now_ns();
    /* the round's last part materialized, in any member's arena (ready_ns: this host's
     * clock; a value from another host's clock, ahead of ours, counts as now) */
    uint64_t last = 0;
    for (uint32_t i = 0; m->kind == DH_RB_ROUND && i < m->n_parts; i++)
        if (m->parts[i].ready_ns > last)
            last = m->parts[i].ready_ns;
    last = last && last <= rb->applying_since_ns ? last : rb->applying_since_ns;
    /* rounds apply in order: this one waits for the parts of those before it as well */
    if (last > rb->last_ready_ns)
        rb->last_ready_ns = last;
    rb->ready_ns[r % RB_WINDOW] = rb->last_ready_ns;
    if (m->kind == DH_RB_END || (m->reason && m->reason[0])) {
        dh_log_debug("client '%s': rebalance round %llu kept: %s", c->id, (unsigned long long)r,
                     m->reason && m->reason[0] ? m->reason : "ended");
        return;
    }
    rb_decision_t d = {0};
    d.new_rank = dh_calloc(m->n_parts ? m->n_parts : 1, sizeof *d.new_rank);
    if (!d.new_rank) {
        dh__client_rb_set_error(c, r, DH_ENOMEM, "out of memory deciding it (kept)");
        return;
    }
    dh__client_rb_decide(c, m, &d);
    if (d.err) {
        char what[640];
        snprintf(what, sizeof what, "%s (kept)", d.why);
        dh__client_rb_set_error(c, r, d.err, what);
    } else if (d.apply) {
        dh__count(&c->counters.rebalance_applied, 1);
        dh__client_rb_apply(c, m, d.new_rank);
    } else if (d.gate_kept) {
        dh__count(&c->counters.rebalance_kept_by_gate, 1);
    }
    dh_log_debug(
        "client '%s': rebalance round %llu (group %u, %u parts): largest rank %.4f s, "
        "gain %.4f s, transfer %.4f s, cost past the slack %.4f s, min_gain %g: %s, %u parts "
        "move",
        c->id, (unsigned long long)r, m->group, m->n_parts, d.max_before_s, d.gain_s, d.transfer_s,
        d.cost_s, c->cfg.rebalance.min_gain,
        d.err         ? "error"
        : d.apply     ? "applied"
        : d.gate_kept ? "kept by the gate"
                      : "kept",
        d.moved);
    dh_free(d.new_rank);
    record(c, rb->ready_ns[r % RB_WINDOW], rb->durations, &rb->n_durations, &rb->duration_max);
}

void dh__client_rb_on_message(dh_client_t *c, dh_wire_received_t *r)
{
    rb_state_t *rb = &c->rb;
    dh_msg_rebalance_t *m = &r->msg.rebalance;
    if ((m->kind != DH_RB_ROUND && m->kind != DH_RB_END) || m->group != rb->group ||
        m->round < rb->applied || m->round >= rb->offered || rb->got[m->round % RB_WINDOW].type) {
        dh_log_debug("client '%s': REBALANCE kind %u for round %llu of group %u ignored", c->id,
                     m->kind, (unsigned long long)m->round, m->group);
        return;
    }
    rb->got[m->round % RB_WINDOW] = r->msg; /* taken */
    rb->got_ns[m->round % RB_WINDOW] = dh_clock_now_ns();
    memset(&r->msg, 0, sizeof r->msg);
}

void dh__client_rb_progress(dh_client_t *c)
{
    rb_state_t *rb = &c->rb;
    for (;;) { /* offer what is ready */
        pthread_mutex_lock(&c->lock);
        bool go = rb->offered < rb->applied + RB_WINDOW && round_ready(c, rb->offered);
        pthread_mutex_unlock(&c->lock);
        if (!go)
            break;
        offer(c, rb->offered);
        rb->offered++;
    }
    for (;;) {
        if (!rb->applying) {
            if (rb->applied >= rb->offered || !rb->got[rb->applied % RB_WINDOW].type)
                return;
            start(c);
        }
        bool all = true;
        for (size_t i = 0; i < rb->n_expect; i++)
            all &= rb->expect[i].done;
        if (!all) {
            double waited = dh_clock_elapsed_s(rb->applying_since_ns, dh_clock_now_ns());
            if (waited * 1000 < c->cfg.rebalance.round_timeout_ms)
                return;
            char what[160];
            snprintf(what, sizeof what,
                     "parts moved here from another node did not come within %d ms (lost)",
                     c->cfg.rebalance.round_timeout_ms);
            dh__client_rb_set_error(c, rb->applied, DH_EIO, what);
        }
        finish(c);
    }
}
