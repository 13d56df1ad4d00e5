/* coordinator.c: the coordinator's life cycle and its loop (docs/design.md §2, §4.3;
 * docs/runtime.md): making it (its ROUTER socket, telemetry, metrics), the loop that receives
 * each message and hands it to its handler, its tick (liveness, speeds, tier 2, metrics) and
 * placing what the book holds, and stopping it.
 *
 * One thread, one ROUTER socket. Peers are DEALERs whose routing id is their name. The
 * coordinator keeps:
 *   - servers: role, node, workers, endpoints, liveness (last message), the book of work
 *     dispatched to each (queue length, predicted seconds), a learned speed factor;
 *   - clients: rank, node, the local DataServer it was told about;
 *   - the book of requests not yet delivered, in arrival order. A request stays in the book
 *     until its delivering local DataServer reports delivered=1; until then a dead executor
 *     or a dead target puts it back into the "to place" state, so no sample is lost. The
 *     client drops the duplicates this can cause.
 * Placement keeps the servers' states and an index over them (coordinator_place.c): every
 * change to a field a state is computed from calls dh__coord_touch. Tensors never pass
 * through here.
 *
 * The handlers are in their rooms: the registry of servers and clients (HELLO, heartbeats,
 * GOODBYE, a server's death) coordinator_registry.c, the book of requests (REQUEST,
 * COMPLETE) coordinator_book.c, what the coordinator learns from COMPLETEs
 * coordinator_learn.c, placing a request coordinator_place.c, when a silent server is dead
 * coordinator_liveness.c, tier 2's rounds coordinator_rebalance.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/rng.h"
#include "datahelix/place.h"
#include "datahelix/runtime.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/coordinator_metrics.h"
#include "wire/wire_lib.h"

void dh_coordinator_config_default(dh_coordinator_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    dh_place_config_default(&cfg->place);
    cfg->dead_after_ms = 1000;
    cfg->queue_cap = 4;
    cfg->default_link_Bps = 1.25e9;
    cfg->default_latency_s = 100e-6;
    cfg->fetch_latency_s = 0.05;
    cfg->fetch_bytes_per_s = 100e6;
}

int dh__coord_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = dh_reallocarray(*arr, n, elem);
    if (!p)
        return dh__set_error(DH_ENOMEM, "coordinator: out of memory");
    memset((char *)p + *cap * elem, 0, (n - *cap) * elem);
    *arr = p;
    *cap = n;
    return 0;
}

int dh_coordinator_new(dh_coordinator_t **out, const dh_coordinator_config_t *cfg)
{
    *out = NULL;
    if (!cfg || !cfg->listen || !cfg->listen[0])
        return dh__set_error(DH_EINVAL, "coordinator: no endpoint to listen on (--listen)");
    dh_coordinator_t *c = dh_calloc(1, sizeof *c);
    if (!c)
        return dh__set_error(DH_ENOMEM, "out of memory for the coordinator");
    c->cfg = *cfg;
    c->cfg.listen = NULL;
    c->cfg.telemetry_path = NULL;
    c->cfg.metrics_listen = NULL;
    pthread_mutex_init(&c->learn_lock, NULL);
    int rc = 0;
    c->ctx = cfg->zmq_ctx;
    if (!c->ctx) {
        c->ctx = zmq_ctx_new();
        c->own_ctx = true;
        if (!c->ctx) {
            rc = dh__set_error(DH_ENOMEM, "coordinator: zmq_ctx_new failed");
            goto fail;
        }
    }
    for (uint32_t i = 0; i < MAX_NODES * MAX_NODES; i++)
        c->links[i] = dh_link_make(cfg->default_link_Bps > 0 ? cfg->default_link_Bps : 1.25e9,
                                   cfg->default_latency_s);
    if ((rc = dh_cost_model_new(&c->model, NULL)))
        goto fail;
    dh__fetch_config_t fetch_cfg;
    dh__fetch_config_default(&fetch_cfg);
    if (cfg->fetch_latency_s > 0)
        fetch_cfg.prior_latency_s = cfg->fetch_latency_s;
    if (cfg->fetch_bytes_per_s > 0)
        fetch_cfg.prior_bytes_per_s = cfg->fetch_bytes_per_s;
    if ((rc = dh__fetch_model_new(&c->fetch, &fetch_cfg)))
        goto fail;
    c->cfg.keys_dir = c->cfg.key_name = NULL;
    if ((rc = dh__wire_secure(c->ctx, cfg->keys_dir, cfg->key_name, cfg->listen, &c->keys,
                              &c->auth_ref)))
        goto fail;
    dh_wire_socket_opts_t opts = {.keys = c->keys};
    if ((rc = dh_wire_socket_new(&c->sock, c->ctx, ZMQ_ROUTER, &opts)))
        goto fail;
    if ((rc = dh__wire_router_handover(c->sock)) ||
        (rc = dh_wire_socket_bind(c->sock, cfg->listen)))
        goto fail;
    if ((rc = dh__wire_last_endpoint(c->sock, c->endpoint, sizeof c->endpoint)))
        goto fail;
    if (cfg->telemetry_path && cfg->telemetry_path[0]) {
        c->telemetry = fopen(cfg->telemetry_path, "w");
        if (!c->telemetry) {
            rc = dh__set_error(-errno, "coordinator: cannot write telemetry file %s: %s",
                               cfg->telemetry_path, strerror(errno));
            goto fail;
        }
        c->telemetry_path = dh_strdup(cfg->telemetry_path);
        /* whole lines, as they happen: an operator (or a test) tails the file while the
         * job runs, and a coordinator killed mid-job leaves no half line */
        setvbuf(c->telemetry, NULL, _IOLBF, 0);
    }
    if (cfg->metrics_listen && cfg->metrics_listen[0] &&
        (rc = dh__coord_metrics_start(c, cfg->metrics_listen)))
        goto fail;
    const char *check = getenv("DH_PLACE_CHECK");
    c->place_check = check && strcmp(check, "1") == 0;
    c->start_ns = dh_clock_now_ns();
    /* never 0 (what anyone else sends); a restart at the same endpoint draws another */
    c->incarnation =
        dh_rng_mix(c->start_ns ^ ((uint64_t)getpid() << 32), (uint64_t)(uintptr_t)c) | 1;
    *out = c;
    return 0;
fail:
    dh_coordinator_destroy(&c);
    return rc;
}

const char *dh_coordinator_endpoint(const dh_coordinator_t *c)
{
    return c->endpoint;
}

void dh_coordinator_stats(const dh_coordinator_t *c, dh_coordinator_stats_t *out)
{
    memset(out, 0, sizeof *out);
    const dh__coord_counters_t *in = &c->counters;
    DH__COORD_STATS(DH__STAT_READ)
}

int dh__coord_send_to(dh_coordinator_t *c, const char *peer, const dh_msg_t *msg)
{
    int rc = dh_wire_send(c->sock, peer, strlen(peer), msg, NULL, 0, 0);
    if (rc)
        dh_log_debug("coordinator: cannot send %s to '%s': %s", dh_msg_type_name(msg->type), peer,
                     dh_last_error());
    return rc;
}

void dh__coord_send_error(dh_coordinator_t *c, const char *peer, int code, const char *text)
{
    dh_msg_t m = {.type = DH_MSG_ERROR};
    m.error.code = code;
    m.error.message = (char *)text;
    dh__coord_send_to(c, peer, &m);
}

/* A message the coordinator could not take in (no memory for its book, or to register its
 * sender): logged, and failed back to the sender with the error, so nothing waits for it. */
void dh__coord_refuse(dh_coordinator_t *c, const char *peer, int rc, const char *what)
{
    char text[512];
    snprintf(text, sizeof text, "%s from '%s' dropped: %s", what, peer, dh_last_error());
    dh_log_error("coordinator: %s", text);
    dh__coord_send_error(c, peer, rc, text);
}

static void handle(dh_coordinator_t *c, dh_wire_received_t *r)
{
    char peer[NAME_CAP];
    size_t n = r->routing_id_size < NAME_CAP - 1 ? r->routing_id_size : NAME_CAP - 1;
    memcpy(peer, r->routing_id, n);
    peer[n] = '\0';
    switch (r->msg.type) {
    case DH_MSG_HELLO:
        dh__coord_on_hello(c, peer, &r->msg.hello);
        break;
    case DH_MSG_HEARTBEAT:
        dh__coord_on_heartbeat(c, peer, &r->msg.heartbeat);
        break;
    case DH_MSG_REQUEST:
        dh__coord_on_request(c, peer, r);
        break;
    case DH_MSG_COMPLETE:
        dh__coord_on_complete(c, peer, &r->msg.complete);
        break;
    case DH_MSG_GOODBYE:
        dh__coord_on_goodbye(c, peer);
        break;
    case DH_MSG_REBALANCE:
        dh__coord_on_rebalance(c, peer, r);
        break;
    case DH_MSG_ERROR: {
        int32_t si;
        if (r->msg.error.code == DH_ENOMEM && dh__coord_find_server(c, peer, &si))
            dh__coord_on_server_dropped(c, si, r->msg.error.message);
        else
            dh_log_warn("coordinator: '%s' reports %s: %s", peer, dh_err_name(r->msg.error.code),
                        r->msg.error.message);
        break;
    }
    default:
        dh_log_warn("coordinator: unexpected %s from '%s' ignored", dh_msg_type_name(r->msg.type),
                    peer);
    }
}

/* A message that could not be read for lack of memory: one message lost, not the
 * coordinator; its sender is told (a client's next() then fails, naming this, instead of
 * waiting for a batch that is never placed). */
static void drop_unread(dh_coordinator_t *c, dh_wire_received_t *r)
{
    char text[512], peer[NAME_CAP];
    snprintf(text, sizeof text, "coordinator: dropped a message: %s", dh_last_error());
    dh_log_warn("%s", text);
    size_t n = r->routing_id_size < NAME_CAP - 1 ? r->routing_id_size : NAME_CAP - 1;
    memcpy(peer, r->routing_id, n);
    peer[n] = '\0';
    r->routing_id_size = 0;
    if (n)
        dh__coord_send_error(c, peer, DH_ENOMEM, text);
}

size_t dh__coord_drain(dh_coordinator_t *c, size_t max)
{
    dh_wire_received_t r = {0};
    size_t n = 0;
    for (; n < max; n++) {
        int got = dh_wire_recv(c->sock, 0, &r);
        if (got == DH_ENOMEM) {
            drop_unread(c, &r);
            continue;
        }
        if (got)
            break;
        handle(c, &r);
        dh_wire_received_release(&r);
    }
    return n;
}

#define POLL_MS 20 /* the loop's poll: its tick's period at most, when nothing arrives */

int dh_coordinator_run(dh_coordinator_t *c)
{
    dh_log_info("coordinator: listening on %s (policy %s, dead after %u ms)", c->endpoint,
                dh_policy_name(c->cfg.place.policy), c->cfg.dead_after_ms);
    dh_wire_received_t r = {0};
    uint64_t last_tick = 0;
    int rc = 0;
    while (!atomic_load(&c->stop)) {
        int got = dh_wire_recv(c->sock, POLL_MS, &r);
        /* before a heartbeat it brought is handled: its gap excludes our own absence */
        dh__coord_liveness_turn(c, POLL_MS * 1000000ull);
        if (got == 0) {
            handle(c, &r);
            dh_wire_received_release(&r);
            /* Drain what else is queued before placing, so a burst is placed in order. */
            dh__coord_drain(c, 256);
        } else if (got == DH_EPARSE) {
            dh_log_warn("coordinator: dropped a malformed message: %s", dh_last_error());
        } else if (got == DH_ENOMEM) {
            drop_unread(c, &r);
        } else if (got != DH_EAGAIN && got != -EINTR) {
            rc = got;
            dh_log_error("coordinator: receive failed: %s", dh_last_error());
            break;
        }
        uint64_t now = dh_clock_now_ns();
        if (now - last_tick > 20000000ull) {
            last_tick = now;
            dh__coord_check_liveness(c);
            dh__coord_anchor_speeds(c);
            dh__coord_rb_tick(c);
            dh__coord_metrics_tick(c);
            if (c->telemetry)
                fflush(c->telemetry);
        }
        dh__coord_place_pending(c);
    }
    dh_log_info("coordinator: stopping (%zu requests undelivered in the book)", c->n_book);
    return rc;
}

static void *thread_main(void *arg)
{
    dh_coordinator_run(arg);
    return NULL;
}

int dh_coordinator_start(dh_coordinator_t *c)
{
    int e = pthread_create(&c->thread, NULL, thread_main, c);
    if (e)
        return dh__set_error(-e, "coordinator: pthread_create: %s", strerror(e));
    c->started = true;
    return 0;
}

void dh_coordinator_stop(dh_coordinator_t *c)
{
    atomic_store(&c->stop, 1);
}

void dh_coordinator_destroy(dh_coordinator_t **pc)
{
    if (!pc || !*pc)
        return;
    dh_coordinator_t *c = *pc;
    if (c->started) {
        dh_coordinator_stop(c);
        pthread_join(c->thread, NULL);
    }
    dh__coord_metrics_destroy(c); /* its scrapes read the counters below */
    for (size_t i = 0; i < c->n_book; i++)
        dh_msg_clear(&c->book[i].msg);
    dh_free(c->book);
    for (size_t i = 0; i < c->n_late; i++)
        dh_msg_clear(&c->late[i].msg);
    dh_free(c->late);
    dh__coord_rb_destroy(c);
    dh_free(c->predictions);
    pthread_mutex_destroy(&c->learn_lock);
    dh_free(c->servers);
    dh_free(c->clients);
    dh__coord_place_destroy(c);
    dh_free(c->snap);
    dh_free(c->cand);
    dh_cost_model_destroy(&c->model);
    dh__fetch_model_destroy(&c->fetch);
    dh_free(c->fetch_cost);
    dh_wire_socket_destroy(&c->sock);
    dh__wire_secure_end(c->ctx, &c->keys, c->auth_ref);
    if (c->telemetry)
        fclose(c->telemetry);
    dh_free(c->telemetry_path);
    if (c->own_ctx && c->ctx)
        zmq_ctx_term(c->ctx);
    dh_free(c);
    *pc = NULL;
}
