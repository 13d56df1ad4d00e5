/* client_send.c: a client's sender thread (client.c has the threads and the lock).
 *
 * It plans each batch's share of a global step ahead of next(), at most the prefetch horizon
 * and max_inflight requests ahead, and sends the batch's requests (one per part, fanout) to
 * the coordinator with a deadline predicted from the measured compute windows and the
 * batch's tokens; it also hears the coordinator's HELLO naming this rank's local DataServer
 * (which the fetcher connects to) and its ERRORs (a request refused: next() fails with it).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"
#include "runtime/descriptor.h"

/* docs/design.md §4.2: D(b), the time until the rank calls next() for batch b (lock held). */
static double deadline_s(const dh_client_t *c, uint64_t b)
{
    dh_deadline_model_t m = {.s_per_token = c->s_per_token,
                             .mean_window_s = c->mean_window_s,
                             .tokens = c->tokens_of,
                             .n_tokens = c->tokens_ring};
    double elapsed = c->consumed ? dh_clock_elapsed_s(c->last_return_ns, dh_clock_now_ns()) : 0;
    return dh_deadline_s(&m, b, c->consumed, elapsed);
}

static int send_batch_requests(dh_client_t *c, uint64_t b, double deadline)
{
    /* a rank gets up to the whole window in packing mode: scratch on the heap */
    size_t cap = c->cfg.token_plan == DH_SHARE_TOKEN_PACKED ? (size_t)c->cfg.ranks * c->cfg.batch
                                                            : c->cfg.batch;
    uint32_t *rows = dh_malloc(cap * sizeof *rows), *part_of = dh_malloc(cap * sizeof *part_of);
    double *load = dh_malloc(cap * sizeof *load);
    dh_wire_sample_t *samples = dh_malloc(cap * sizeof *samples);
    int n = rows && part_of && load && samples
                ? dh__client_plan_rank_step(c, c->sampler, c->step0 + b, c->cfg.rank, rows, cap)
                : dh__set_error(DH_ENOMEM, "out of memory for a step's requests");
    int rc = n < 0 ? n : 0;
    if (rc)
        goto done;
    uint32_t parts = c->cfg.fanout;
    if (parts > 1) {
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
    pthread_mutex_lock(&c->lock);
    c->tokens_of[b % c->tokens_ring] = tokens;
    c->requested_of[b % c->tokens_ring] = dh_clock_now_ns();
    pthread_mutex_unlock(&c->lock);
    for (uint32_t p = 0; p < parts; p++) {
        uint32_t k = 0;
        for (int i = 0; i < n; i++) {
            if (part_of[i] != p)
                continue;
            dh__rt_sample_of_row(dh_profile_set_row(c->profiles, rows[i]), &samples[k++]);
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
    dh_free(rows);
    dh_free(part_of);
    dh_free(load);
    dh_free(samples);
    return rc;
}

static void on_coord_message(dh_client_t *c, dh_wire_received_t *r)
{
    if (r->msg.type == DH_MSG_HELLO) {
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

void *dh__client_sender_main(void *arg)
{
    dh_client_t *c = arg;
    dh_wire_received_t r = {0};
    uint32_t per_batch = c->cfg.fanout;
    while (!atomic_load(&c->stop)) {
        if (dh_wire_recv(c->coord, 2, &r) == 0) {
            on_coord_message(c, &r);
            dh_wire_received_release(&r);
        }
        for (;;) {
            pthread_mutex_lock(&c->lock);
            uint64_t b = c->planned;
            /* Requests of batches not yet consumed, counting this one's. */
            uint64_t inflight = (b - c->consumed + 1) * per_batch;
            uint64_t max_inflight =
                c->cfg.max_inflight ? c->cfg.max_inflight : (uint64_t)c->horizon * per_batch;
            bool go = b < c->total && b < c->consumed + c->horizon &&
                      (inflight <= max_inflight || b == c->consumed);
            double d = go ? deadline_s(c, b) : 0;
            pthread_mutex_unlock(&c->lock);
            if (!go || atomic_load(&c->stop))
                break;
            /* The horizon moves before the requests go out, so that a delivery racing the
             * send is inside the fetcher's window. */
            pthread_mutex_lock(&c->lock);
            c->planned++;
            pthread_mutex_unlock(&c->lock);
            while (send_batch_requests(c, b, d) != 0 && !atomic_load(&c->stop))
                dh_wire_recv(c->coord, 100, &r) == 0
                    ? (on_coord_message(c, &r), dh_wire_received_release(&r))
                    : (void)0;
        }
    }
    return NULL;
}
