/* client_send.c: a client's sender thread (client.c has the threads and the lock).
 *
 * It plans each batch's share of a global step ahead of next(), at most the prefetch horizon
 * and max_inflight requests ahead, and no further than the rank's share of its node's arena
 * holds (the batches' decoded bytes, dh_deadline_byte_horizon: requests are admitted against
 * the consuming node's arena at the source), and sends the batch's requests (one per part, fanout)
 * to the coordinator with a deadline predicted from the measured compute windows and the batch's
 * tokens; it also hears the coordinator's HELLO naming this rank's local DataServer (which the
 * fetcher connects to) and its ERRORs (a request refused: next() fails with it).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/rng.h"
#include "datahelix/sampler.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"
#include "runtime/descriptor.h"

/* docs/design.md §4.2: D(b), the time until the rank calls next() for batch b (lock held). */
double dh__client_deadline_s(const dh_client_t *c, uint64_t b)
{
    dh_deadline_model_t m = {.s_per_token = c->s_per_token,
                             .mean_window_s = c->mean_window_s,
                             .tokens = c->tokens_of,
                             .n_tokens = c->tokens_ring};
    double elapsed = c->consumed ? dh_clock_elapsed_s(c->last_return_ns, dh_clock_now_ns()) : 0;
    return dh_deadline_s(&m, b, c->consumed, elapsed);
}

double dh__client_batch_bytes(const dh_client_t *c, const uint32_t *rows, int n)
{
    double sum = 0, elem = 0;
    int64_t t = 0, h = 0, w = 0;
    bool shaped = true;
    for (int i = 0; i < n; i++) {
        const dh_profile_row_t *r = dh_profile_set_row(c->profiles, rows[i]);
        double out = r->out_bytes > 0 ? (double)r->out_bytes : 0;
        sum += out;
        if (r->frames <= 0 || r->height <= 0 || r->width <= 0) {
            shaped = false;
            continue;
        }
        double px = (double)r->frames * r->height * r->width * 3;
        elem = out / px > elem ? out / px : elem; /* the element size: out_bytes per value */
        t = r->frames > t ? r->frames : t;
        h = r->height > h ? r->height : h;
        w = r->width > w ? r->width : w;
    }
    double padded = (double)n * (double)t * (double)h * (double)w * 3 * elem;
    return shaped && padded > sum ? padded : sum;
}

void dh__client_learn_bytes(dh_client_t *c, uint64_t b, double actual)
{
    double est = c->bytes_of[b % c->tokens_ring];
    if (!(est > 0) || !(actual > 0))
        return;
    double r = actual / est;
    /* Up at once, down slowly: an estimate short of the decoded size overfills the arena,
     * one beyond it only prefetches a little less. */
    if (!c->bytes_learned || r > c->bytes_ratio)
        c->bytes_ratio = r;
    else
        c->bytes_ratio = dh_cost_ewma(c->bytes_ratio, r, 0.1);
    c->bytes_learned = true;
}

/* Until a batch has come back through next(), learns the byte ratio from the first one
 * delivered to the ring, so that a prefetch overestimated before any data (emulated
 * payloads are stand-ins of a thousandth) opens up as soon as one batch lands (lock held). */
static void learn_from_ring(dh_client_t *c)
{
    uint32_t parts = c->cfg.fanout;
    for (uint64_t b = c->consumed; b < c->planned && !c->bytes_learned; b++) {
        const part_t *p = &c->ring[(b * parts) % c->ring_size];
        if (!p->ready || p->seq != b * parts || (parts > 1 && (!p->joined || p->join_rc)))
            continue;
        double actual = 0;
        for (size_t t = 0; t < p->n_tensors; t++)
            actual += (double)p->tensors[t].nbytes;
        dh__client_learn_bytes(c, b, actual);
    }
}

/* Whether batch b, estimated at `est` bytes, fits this rank's share of the arena with the
 * batches from the consumption point to b-1 and the batch last returned (lock held). */
static bool bytes_admit(dh_client_t *c, uint64_t b, double est)
{
    c->bytes_of[b % c->tokens_ring] = est;
    if (!c->bytes_learned)
        learn_from_ring(c);
    size_t n = (size_t)(b - c->consumed + 1);
    double sum = c->held_bytes;
    for (size_t i = 0; i < n; i++) {
        /* each of the batch's tensors rounds up to whole slabs: at most one more each */
        c->bytes_scratch[i] = c->bytes_of[(c->consumed + i) % c->tokens_ring] * c->bytes_ratio +
                              c->batch_tensors * c->slab_bytes;
        sum += c->bytes_scratch[i];
    }
    if (c->byte_budget > 0 && dh_deadline_byte_horizon((uint32_t)n, c->bytes_scratch, n,
                                                       c->held_bytes, c->byte_budget) < n)
        return false;
    c->bytes_outstanding = sum;
    if (n > 1 && sum > c->bytes_outstanding_peak) /* the first batch goes however large */
        c->bytes_outstanding_peak = sum;
    return true;
}

/* The next batch's rows, planned once however often its admission is tried. */
typedef struct planned {
    uint64_t b;
    int n; /* rows; < 0: none planned */
    uint32_t *rows;
    size_t cap;
    double bytes;
} planned_t;

static int plan_batch(dh_client_t *c, uint64_t b, planned_t *pl)
{
    if (pl->n >= 0 && pl->b == b)
        return 0;
    pl->n = -1;
    int n = dh__client_plan_rank_step(c, c->sampler, c->step0 + b, c->cfg.rank, pl->rows, pl->cap);
    if (n < 0)
        return n;
    pl->b = b;
    pl->n = n;
    pl->bytes = dh__client_batch_bytes(c, pl->rows, n);
    return 0;
}

/* The part's ring entry holds its delivery (under c->lock). */
static bool part_received(dh_client_t *c, uint64_t seq)
{
    const part_t *e = &c->ring[seq % c->ring_size];
    return e->ready && e->seq == seq;
}

/* Sends batch b's requests, one per part; `again` (the coordinator restarted): only the
 * parts not received yet, and nothing else of the batch's state is touched. */
static int send_batch_requests(dh_client_t *c, uint64_t b, const planned_t *pl, double deadline,
                               bool again)
{
    size_t cap = pl->cap;
    const uint32_t *rows = pl->rows;
    uint32_t *part_of = dh_malloc(cap * sizeof *part_of);
    double *load = dh_malloc(cap * sizeof *load);
    dh_wire_sample_t *samples = dh_malloc(cap * sizeof *samples);
    int n = part_of && load && samples
                ? pl->n
                : dh__set_error(DH_ENOMEM, "out of memory for a step's requests");
    int rc = n < 0 ? n : 0;
    if (rc)
        goto done;
    uint32_t parts = c->cfg.fanout;
    /* slots, or an epoch's short last step (keep_tail) of fewer rows than parts: row i in
     * part i, the parts past the rows empty */
    bool slots = dh__client_slots(c) || (uint32_t)n < parts;
    if (slots) {
        for (int i = 0; i < n; i++) /* row i in slot i; the slots past the rows stay empty */
            part_of[i] = (uint32_t)i;
    } else if (parts > 1) {
        for (int i = 0; i < n; i++)
            load[i] = (double)dh_profile_set_row(c->profiles, rows[i])->tokens_est;
        if ((rc = dh_plan_fanout(load, (size_t)n, parts, part_of)))
            goto done;
    } else {
        for (int i = 0; i < n; i++)
            part_of[i] = 0;
    }
    int64_t tokens = 0;
    for (int i = 0; i < n; i++)
        tokens += dh_profile_set_row(c->profiles, rows[i])->tokens_est;
    /* the base seed of the batch's epoch, with every sample (a Python dataset's workers seed
     * from it: docs/datasets.md, "Randomness") */
    uint64_t epoch = dh_sampler_step_epoch(c->sampler, c->step0 + b, NULL);
    uint64_t pass_seed = dh_rng_epoch_seed(c->cfg.seed, epoch);
    pthread_mutex_lock(&c->lock);
    if (!again) {
        c->tokens_of[b % c->tokens_ring] = tokens;
        c->requested_of[b % c->tokens_ring] = dh_clock_now_ns();
    }
    pthread_mutex_unlock(&c->lock);
    if (slots && !again) { /* the empty slots are there at once: nothing to request */
        pthread_mutex_lock(&c->lock);
        for (uint32_t p = (uint32_t)n; p < parts; p++) {
            part_t *e = &c->ring[(b * parts + p) % c->ring_size];
            memset(e, 0, sizeof *e);
            e->seq = b * parts + p;
            e->ready = true;
        }
        pthread_mutex_unlock(&c->lock);
    }
    for (uint32_t p = 0; p < (slots ? (uint32_t)n : parts); p++) {
        if (again) {
            pthread_mutex_lock(&c->lock);
            bool have = part_received(c, b * parts + p);
            pthread_mutex_unlock(&c->lock);
            if (have)
                continue;
        }
        uint32_t k = 0;
        for (int i = 0; i < n; i++) {
            if (part_of[i] != p)
                continue;
            dh__rt_sample_of_row(dh_profile_set_row(c->profiles, rows[i]), &samples[k]);
            samples[k++].seed = pass_seed;
        }
        dh_msg_t m = {.type = DH_MSG_REQUEST};
        m.request.client_id = c->id;
        m.request.seq = b * parts + p;
        m.request.rank = c->cfg.rank;
        m.request.deadline_ns = (int64_t)(deadline * 1e9);
        m.request.delivery_node = c->node;
        m.request.n_samples = k;
        m.request.samples = samples;
        if ((rc = dh_wire_send(c->coord, NULL, 0, &m, NULL, 0, 1000))) {
            dh_log_warn("client '%s': cannot send request %llu to the coordinator %s: %s", c->id,
                        (unsigned long long)m.request.seq, c->coord_endpoint, dh_last_error());
            goto done;
        }
        dh__count(&c->counters.requests_sent, 1);
    }
done:
    dh_free(part_of);
    dh_free(load);
    dh_free(samples);
    return rc;
}

/* The coordinator restarted (a new incarnation): it forgot every request, so the requests
 * of every batch planned and not received go to it again (a part already under way
 * somewhere may then arrive twice: the fetcher keeps the first). */
static void send_outstanding_again(dh_client_t *c)
{
    planned_t lp = {.n = -1,
                    .cap = c->cfg.token_plan == DH_SHARE_TOKEN_PACKED
                               ? (size_t)c->cfg.ranks * c->cfg.batch
                               : c->cfg.batch};
    lp.rows = dh_malloc(lp.cap * sizeof *lp.rows);
    if (!lp.rows) {
        c->coord_resend = true; /* try again on the next round */
        return;
    }
    pthread_mutex_lock(&c->lock);
    uint64_t from = c->consumed, to = c->planned;
    pthread_mutex_unlock(&c->lock);
    uint64_t sent = 0;
    for (uint64_t b = from; b < to && !atomic_load(&c->stop); b++) {
        uint32_t parts = c->cfg.fanout;
        bool all = true;
        pthread_mutex_lock(&c->lock);
        for (uint32_t p = 0; p < parts && all; p++)
            all = part_received(c, b * parts + p);
        double d = all ? 0 : dh__client_deadline_s(c, b);
        pthread_mutex_unlock(&c->lock);
        if (all)
            continue;
        if (plan_batch(c, b, &lp) == 0 && send_batch_requests(c, b, &lp, d, true) == 0)
            sent++;
        else
            c->coord_resend = true;
    }
    dh_free(lp.rows);
    dh_log_warn("client '%s': the coordinator %s restarted: sent the requests of %llu batches "
                "not received again (batches %llu..%llu)",
                c->id, c->coord_endpoint, (unsigned long long)sent, (unsigned long long)from,
                (unsigned long long)(to ? to - 1 : 0));
}

/* From now on next() fails with `code` and `why` (the first such cause wins; logged once). */
static void refuse_next(dh_client_t *c, int code, const char *why)
{
    pthread_mutex_lock(&c->lock);
    if (!c->refused) {
        c->refused = code;
        snprintf(c->refused_msg, sizeof c->refused_msg, "%s", why);
        dh_log_error("client '%s': %s", c->id, why);
    }
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* The coordinator's liveness, on the sender thread: a HELLO every PING_NS (and at once after
 * "unknown client"), whose answer carries the incarnation; the requests again after a
 * restart; and an error for next() when it stays silent past coordinator_timeout_ms, counted
 * over the time this thread ran to hear it (the sender's loop forgives its own absence,
 * runtime/awake.h). */
#define PING_NS 500000000ull
static void coordinator_liveness(dh_client_t *c)
{
    uint64_t now = dh_clock_now_ns();
    if (c->coord_rehello || now - c->coord_pinged_ns >= PING_NS) {
        dh_msg_t m = dh__client_hello(c);
        (void)dh_wire_send(c->coord, NULL, 0, &m, NULL, 0, 0); /* queued while it is away */
        c->coord_pinged_ns = now;
        c->coord_rehello = false;
    }
    if (c->coord_resend) {
        c->coord_resend = false;
        send_outstanding_again(c);
    }
    int limit = c->cfg.coordinator_timeout_ms;
    uint64_t limit_ns = limit >= 0 ? (uint64_t)limit * 1000000ull : UINT64_MAX;
    char why[2 * NAME_CAP];
    if (c->no_local_since_ns && now - c->no_local_since_ns > limit_ns) {
        snprintf(why, sizeof why,
                 "node '%.100s' has had no live local DataServer for %d ms "
                 "(coordinator_timeout_ms): its DataServer died and none took its place",
                 c->node, limit);
        refuse_next(c, DH_ENOSERVER, why);
    }
    if (c->coord_heard_ns && now - c->coord_heard_ns > limit_ns) {
        snprintf(why, sizeof why,
                 "the coordinator %.120s has not answered for %d ms (coordinator_timeout_ms): "
                 "it is down, or restarted elsewhere",
                 c->coord_endpoint, limit);
        refuse_next(c, DH_EAGAIN, why);
    }
}

static void on_coord_message(dh_client_t *c, dh_wire_received_t *r)
{
    c->coord_heard_ns = dh_clock_now_ns();
    if (r->msg.type == DH_MSG_HELLO) {
        uint64_t inc = r->msg.hello.incarnation;
        if (inc && c->coord_incarnation && inc != c->coord_incarnation)
            c->coord_resend = true;
        if (inc)
            c->coord_incarnation = inc;
        c->no_local_since_ns = 0;
        pthread_mutex_lock(&c->lock);
        bool changed = strcmp(c->ds.endpoint, r->msg.hello.endpoint) != 0 ||
                       strcmp(c->ds.shm_socket, r->msg.hello.shm_socket) != 0;
        if (changed) {
            snprintf(c->ds.name, NAME_CAP, "%s", r->msg.hello.name);
            snprintf(c->ds.endpoint, ENDPOINT_CAP, "%s", r->msg.hello.endpoint);
            snprintf(c->ds.shm_socket, NAME_CAP, "%s", r->msg.hello.shm_socket);
            c->ds.generation++;
        }
        pthread_mutex_unlock(&c->lock);
        if (changed)
            dh_log_info("client '%s': local DataServer is now '%s' (%s)", c->id, r->msg.hello.name,
                        r->msg.hello.endpoint);
    } else if (r->msg.type == DH_MSG_ERROR && r->msg.error.code == DH_EUNKNOWN) {
        /* it does not know us: a restarted coordinator. Register again; its answer (a new
         * incarnation) sends the outstanding requests again. */
        if (!c->coord_rehello)
            dh_log_info("client '%s': the coordinator does not know this client (restarted?): "
                        "registering again",
                        c->id);
        c->coord_rehello = true;
    } else if (r->msg.type == DH_MSG_ERROR && r->msg.error.code == DH_ENOSERVER) {
        /* the answer to a HELLO while this node has no live local DataServer: next() fails
         * when that lasts (coordinator_liveness) */
        if (!c->no_local_since_ns) {
            c->no_local_since_ns = c->coord_heard_ns;
            dh_log_warn("client '%s': coordinator says %s: %s", c->id,
                        dh_err_name(r->msg.error.code), r->msg.error.message);
        }
    } else if (r->msg.type == DH_MSG_ERROR) {
        dh_log_warn("client '%s': coordinator says %s: %s", c->id, dh_err_name(r->msg.error.code),
                    r->msg.error.message);
        /* After registration every ERROR but "no local DataServer" (a late answer to a
         * repeated HELLO) refuses a request, whose batch will not come: next() says so. */
        if (r->msg.error.code != DH_ENOSERVER) {
            pthread_mutex_lock(&c->lock);
            if (!c->refused) {
                c->refused = r->msg.error.code < 0 ? r->msg.error.code : DH_EIO;
                snprintf(c->refused_msg, sizeof c->refused_msg, "%s",
                         r->msg.error.message ? r->msg.error.message : "");
            }
            pthread_cond_broadcast(&c->cond);
            pthread_mutex_unlock(&c->lock);
        }
    }
}

#define SENDER_POLL_MS 2

void *dh__client_sender_main(void *arg)
{
    dh_client_t *c = arg;
    dh_wire_received_t r = {0};
    uint32_t per_batch = c->cfg.fanout;
    /* a rank gets up to the whole window in packing mode: scratch on the heap */
    planned_t pl = {.n = -1,
                    .cap = c->cfg.token_plan == DH_SHARE_TOKEN_PACKED
                               ? (size_t)c->cfg.ranks * c->cfg.batch
                               : c->cfg.batch};
    pl.rows = dh_malloc(pl.cap * sizeof *pl.rows);
    while (!atomic_load(&c->stop)) {
        int got = dh_wire_recv(c->coord, SENDER_POLL_MS, &r);
        uint64_t away = dh__awake_turn(&c->awake, SENDER_POLL_MS * 1000000ull);
        if (away) { /* this thread did not run (stopped, starved): not the coordinator's fault */
            uint64_t now = dh_clock_now_ns();
            c->coord_heard_ns = dh__awake_forgive(c->coord_heard_ns, away, now);
            c->no_local_since_ns = dh__awake_forgive(c->no_local_since_ns, away, now);
        }
        if (got == 0) {
            on_coord_message(c, &r);
            dh_wire_received_release(&r);
        }
        coordinator_liveness(c);
        for (;;) {
            pthread_mutex_lock(&c->lock);
            uint64_t b = c->planned;
            /* Requests of batches not yet consumed, counting this one's. */
            uint64_t inflight = (b - c->consumed + 1) * per_batch;
            uint64_t max_inflight =
                c->cfg.max_inflight ? c->cfg.max_inflight : (uint64_t)c->horizon * per_batch;
            bool must = b == c->consumed || dh__client_rb_must_request(c, b);
            bool go = b < c->total && (b < c->consumed + c->horizon || must) &&
                      (inflight <= max_inflight || must) && !c->refused;
            pthread_mutex_unlock(&c->lock);
            if (!go || atomic_load(&c->stop))
                break;
            int rc = pl.rows ? plan_batch(c, b, &pl)
                             : dh__set_error(DH_ENOMEM, "out of memory for a step's requests");
            if (rc && rc != DH_ENOMEM) { /* a plan that cannot be made: no retry makes it */
                char why[600];
                snprintf(why, sizeof why, "batch %llu (global step %llu) cannot be planned: %s",
                         (unsigned long long)b, (unsigned long long)(c->step0 + b),
                         dh_last_error());
                refuse_next(c, rc, why);
                break;
            }
            /* The horizon moves before the requests go out, so that a delivery racing the
             * send is inside the fetcher's window; a batch whose bytes the rank's share of
             * the arena cannot hold yet waits for next() to consume (never the first). */
            pthread_mutex_lock(&c->lock);
            go = rc != 0 || bytes_admit(c, b, pl.bytes) || dh__client_rb_must_request(c, b);
            double d = go ? dh__client_deadline_s(c, b) : 0;
            if (go)
                c->planned++;
            pthread_mutex_unlock(&c->lock);
            if (!go)
                break;
            while ((rc ? rc : (rc = send_batch_requests(c, b, &pl, d, false))) != 0 &&
                   !atomic_load(&c->stop)) {
                dh_wire_recv(c->coord, 100, &r) == 0
                    ? (on_coord_message(c, &r), dh_wire_received_release(&r))
                    : (void)0;
                if (!pl.rows) /* the scratch itself was out of memory: again (before, never) */
                    pl.rows = dh_malloc(pl.cap * sizeof *pl.rows);
                rc = pl.rows ? plan_batch(c, b, &pl) : rc;
            }
        }
    }
    dh_free(pl.rows);
    return NULL;
}
