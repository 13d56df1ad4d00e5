/* dataserver_loop.c: a DataServer's event loop (dataserver.c has the threads and sockets):
 * one poll over the coordinator's socket, the workers' eventfd, the data socket, the notice
 * channel and the links; registration (HELLO, and again when the coordinator does not know
 * it) and heartbeats that report its book of DISPATCHes; each DISPATCH queued for the
 * workers, each finished task delivered here or forwarded with its COMPLETE; the data
 * socket's messages (clients' HELLO and GOODBYE, sidecars' DELIVERs, REBALANCE SEND);
 * reclaiming the slabs of dead clients every 200 ms. Loop thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/runtime.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/dataserver_internal.h"
#include "runtime/dataserver_metrics.h"
#include "runtime/inprocess.h"
#include "runtime/notice.h"
#include "runtime/rt.h"
#include "wire/wire_lib.h"

static int send_coord(dh_dataserver_t *s, const dh_msg_t *m)
{
    int rc = dh_wire_send(s->coord, NULL, 0, m, NULL, 0, 100);
    if (rc)
        dh_log_warn("DataServer '%s': cannot send %s to the coordinator %s: %s", s->name,
                    dh_msg_type_name(m->type), s->coord_endpoint, dh_last_error());
    return rc;
}

static void send_hello(dh_dataserver_t *s)
{
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = s->cfg.role == DH_DS_LOCAL ? DH_WIRE_ROLE_LOCAL : DH_WIRE_ROLE_REMOTE;
    m.hello.node = s->node;
    m.hello.workers = s->cfg.workers;
    m.hello.arena_bytes = s->arena ? s->cfg.arena_bytes : 0;
    m.hello.name = s->name;
    m.hello.endpoint = s->data_endpoint;
    m.hello.shm_socket = s->notice.name;
    m.hello.pid = (uint32_t)getpid();
    s->dispatches_seen = 0; /* counted per registration, as the coordinator counts them */
    send_coord(s, &m);
}

static void send_heartbeat(dh_dataserver_t *s)
{
    dh_wire_link_bw_t links[MAX_LINKS];
    uint32_t n = 0;
    for (size_t i = 0; i < s->n_links; i++)
        if (s->links[i].bytes_per_s > 0 && s->links[i].node[0]) {
            links[n].node = s->links[i].node;
            links[n].bytes_per_s = s->links[i].bytes_per_s;
            links[n].latency_s = s->links[i].latency_s;
            n++;
        }
    dh_msg_t m = {.type = DH_MSG_HEARTBEAT};
    pthread_mutex_lock(&s->lock);
    m.heartbeat.workers = s->cfg.workers;
    m.heartbeat.recent_latency_s = s->latency_ewma_s;
    m.heartbeat.read_bytes_per_s = s->read_bytes_per_s;
    pthread_mutex_unlock(&s->lock);
    /* In the coordinator's terms (what its book holds for us), so it can correct its book. */
    m.heartbeat.queue_depth = s->booked_tasks;
    m.heartbeat.queue_work_s = s->booked_cpu_s > 0 ? s->booked_cpu_s : 0;
    m.heartbeat.dispatches_seen = s->dispatches_seen;
    m.heartbeat.speed_factor = 1.0;
    m.heartbeat.n_links = n;
    m.heartbeat.links = links;
    send_coord(s, &m);
}

/* The heartbeat's clock. Its period is kept from the loop's wake-ups, not added to them: the
 * poll waits at most until the next one is due (a full period after a wake-up for other work
 * made gaps of up to two periods), and the loop sends it when due both before and after the
 * work a wake-up brought, so a heartbeat never waits behind a run of messages that a starved
 * thread processes several times slower (docs/runtime.md, "Liveness"). */
static long heartbeat_in_ms(const dh_dataserver_t *s, uint64_t last_hb)
{
    uint64_t period = (uint64_t)s->cfg.heartbeat_ms * 1000000ull, now = dh_clock_now_ns();
    if (now - last_hb >= period)
        return 0;
    return (long)((period - (now - last_hb) + 999999) / 1000000);
}

/* Sends the heartbeat when due (and records when in *last_hb). 0, or the failed auth check's
 * code: refused keys (or no coordinator there) do not heal, so the loop ends, saying which,
 * rather than retry forever. */
static int heartbeat_if_due(dh_dataserver_t *s, uint64_t *last_hb)
{
    uint64_t now = dh_clock_now_ns();
    if (now - *last_hb < (uint64_t)s->cfg.heartbeat_ms * 1000000ull)
        return 0;
    *last_hb = now;
    int rc = dh__wire_auth_check(s->coord);
    if (rc) {
        dh_log_error("DataServer '%s': %s", s->name, dh_last_error());
        return rc;
    }
    send_heartbeat(s);
    return 0;
}

void dh__ds_send_complete(dh_dataserver_t *s, const char *client_id, uint64_t seq,
                          const dh__rt_result_t *r, double cpu_s, double queue_s, int delivered,
                          dh_wire_socket_t *to, const char *routing_id)
{
    dh_wire_sample_status_t st[r ? r->n_samples + 1 : 1];
    dh_msg_t m = {.type = DH_MSG_COMPLETE};
    m.complete.client_id = (char *)client_id;
    m.complete.seq = seq;
    if (r) {
        for (uint32_t i = 0; i < r->n_samples; i++) {
            st[i].status = r->samples[i].status;
            st[i].error = r->samples[i].error ? r->samples[i].error : "";
            st[i].cpu_s = r->sample_cpu_s && r->sample_cpu_s[i] > 0 ? r->sample_cpu_s[i] : 0;
            st[i].fetch_s = r->samples[i].fetch_s > 0 ? r->samples[i].fetch_s : 0;
            st[i].fetch_bytes = r->samples[i].fetch_bytes;
        }
        m.complete.n_samples = r->n_samples;
        m.complete.samples = st;
        m.complete.bytes = r->bytes;
    }
    m.complete.cpu_s = cpu_s > 0 ? cpu_s : 0;
    m.complete.queue_s = queue_s > 0 ? queue_s : 0;
    m.complete.delivered = (uint8_t)delivered;
    if (to)
        dh_wire_send(to, routing_id, routing_id ? strlen(routing_id) : 0, &m, NULL, 0, 0);
    else
        send_coord(s, &m);
}

void dh__ds_unbook(dh_dataserver_t *s, task_t *t)
{
    if (!t->booked)
        return;
    t->booked = false;
    if (s->booked_tasks)
        s->booked_tasks--;
    s->booked_cpu_s -= t->booked_cpu_s;
    if (s->booked_tasks == 0 || s->booked_cpu_s < 0)
        s->booked_cpu_s = 0; /* no drift from rounding once empty */
}

static void drain_results(dh_dataserver_t *s)
{
    uint64_t counter;
    ssize_t n = read(s->wake_fd, &counter, sizeof counter);
    (void)n;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        task_t *t = dh__ds_pop(&s->results);
        pthread_mutex_unlock(&s->lock);
        if (!t)
            break;
        const dh_msg_dispatch_t *d = &t->msg.dispatch;
        dh__ds_metrics_task(s, t);
        if (t->local_target) {
            if (!dh__ds_finish_local(s, t, dh_clock_now_ns())) {
                pending_t *p = dh_calloc(1, sizeof *p);
                if (p) {
                    p->task = t;
                    p->since_ns = dh_clock_now_ns();
                    dh__ds_add_pending(s, p);
                    continue;
                }
                dh__ds_free_outputs(s, t->result.tensors, t->result.n_tensors);
                dh__count(&s->counters.undeliverable, 1); /* no memory to keep it pending */
            }
        } else {
            /* The measurements first: the target's delivered=1 COMPLETE, which ends the
             * request in the coordinator's book, must not overtake them (the coordinator
             * learns from this one only while the request is in its book). */
            dh__ds_unbook(s, t);
            dh__ds_send_complete(s, d->request.client_id, d->request.seq, &t->result,
                                 t->result.cpu_s, t->queue_s, 0, NULL, NULL);
            dh__ds_forward_result(s, t);
        }
        dh__ds_unbook(s, t); /* dropped (no memory to keep it pending): no longer ours */
        dh__ds_task_free(t);
    }
}

/* A message from the coordinator this server could not take for lack of memory (it could
 * not be read, or a DISPATCH found no memory for its task): the coordinator is told
 * (ERROR DH_ENOMEM), and places again the requests it dispatched here that this server has
 * not reported (docs/wire-protocol.md, "Errors"), instead of their clients waiting out
 * next()'s timeout. Counted as a DISPATCH seen: the coordinator sends a DataServer DISPATCHes
 * and, rarely, an ERROR. */
static void tell_coord_dropped(dh_dataserver_t *s, const char *what)
{
    char text[512];
    snprintf(text, sizeof text, "DataServer '%s': dropped a message from the coordinator: %s",
             s->name, what);
    dh_log_warn("%s", text);
    s->dispatches_seen++;
    dh_msg_t m = {.type = DH_MSG_ERROR};
    m.error.code = DH_ENOMEM;
    m.error.message = text;
    send_coord(s, &m);
}

static void on_coord_message(dh_dataserver_t *s, dh_wire_received_t *r)
{
    if (r->msg.type == DH_MSG_DISPATCH) {
        task_t *t = dh_calloc(1, sizeof *t);
        if (!t) {
            tell_coord_dropped(s, "DISPATCH: out of memory for its task");
            return;
        }
        s->dispatches_seen++;
        t->msg = r->msg;
        memset(&r->msg, 0, sizeof r->msg);
        t->enqueued_ns = dh_clock_now_ns();
        double cpu = t->msg.dispatch.pred_cpu_s;
        if (!(cpu > 0)) /* a coordinator without a prediction: the descriptors' estimates */
            for (uint32_t i = 0; i < t->msg.dispatch.request.n_samples; i++)
                cpu += t->msg.dispatch.request.samples[i].cpu_s;
        t->booked = true;
        t->booked_cpu_s = cpu;
        s->booked_tasks++;
        s->booked_cpu_s += cpu;
        pthread_mutex_lock(&s->lock);
        dh__ds_push(&s->tasks, t);
        pthread_cond_signal(&s->task_cond);
        pthread_mutex_unlock(&s->lock);
        if (s->cache_used) /* its bytes fetched while the queue ahead of it decodes */
            dh__ds_readahead(s, t);
    } else if (r->msg.type == DH_MSG_ERROR) {
        if (r->msg.error.code == DH_EUNKNOWN) {
            dh_log_info("DataServer '%s': the coordinator does not know us; registering again",
                        s->name);
            send_hello(s);
        } else {
            dh_log_warn("DataServer '%s': coordinator says %s: %s", s->name,
                        dh_err_name(r->msg.error.code), r->msg.error.message);
        }
    } else {
        dh_log_warn("DataServer '%s': unexpected %s from the coordinator ignored", s->name,
                    dh_msg_type_name(r->msg.type));
    }
}

static void on_data_message(dh_dataserver_t *s, dh_wire_received_t *r)
{
    char peer[NAME_CAP];
    size_t n = r->routing_id_size < NAME_CAP - 1 ? r->routing_id_size : NAME_CAP - 1;
    memcpy(peer, r->routing_id, n);
    peer[n] = '\0';
    switch (r->msg.type) {
    case DH_MSG_HELLO: {
        pthread_mutex_lock(&s->lock);
        known_client_t *kc = dh__ds_find_client(s, peer);
        if (!kc && s->n_clients < MAX_CLIENTS)
            kc = &s->clients[s->n_clients++];
        if (kc) {
            snprintf(kc->name, NAME_CAP, "%s", peer);
            kc->pid = r->msg.hello.pid;
            kc->since_ns = dh_clock_now_ns();
        }
        pthread_mutex_unlock(&s->lock);
        dh__ds_set_left(s, peer, false);
        dh_log_info("DataServer '%s': client '%s' (pid %u) connected", s->name, peer,
                    r->msg.hello.pid);
        dh__ds_retry_pending(s);
        break;
    }
    case DH_MSG_DELIVER: {
        uint64_t now = dh_clock_now_ns();
        uint64_t due = dh__ds_ingress_due(s, &r->msg.deliver, now);
        if (due > now + 500000 || !dh__ds_place_forwarded(s, r, peer, now)) {
            pending_t *p = dh_calloc(1, sizeof *p);
            if (!p) { /* dropped: place_forwarded kept none of its slabs */
                dh__count(&s->counters.undeliverable, 1);
                break;
            }
            p->forwarded = *r; /* the frames move with it */
            memset(r, 0, sizeof *r);
            snprintf(p->sidecar, NAME_CAP, "%s", peer);
            p->since_ns = due > now ? due : now;
            p->due_ns = due > now + 500000 ? due : 0;
            dh__ds_add_pending(s, p);
        }
        break;
    }
    case DH_MSG_REBALANCE:
        if (r->msg.rebalance.kind == DH_RB_SEND)
            dh__ds_rebalance_send(s, peer, &r->msg.rebalance);
        else
            dh_log_warn("DataServer '%s': unexpected REBALANCE kind %u from '%s' ignored", s->name,
                        r->msg.rebalance.kind, peer);
        break;
    case DH_MSG_GOODBYE: {
        pthread_mutex_lock(&s->lock);
        for (size_t i = 0; i < s->n_clients; i++)
            if (strcmp(s->clients[i].name, peer) == 0) {
                s->clients[i] = s->clients[--s->n_clients];
                break;
            }
        pthread_mutex_unlock(&s->lock);
        dh__ds_set_left(s, peer, true);
        dh_log_info("DataServer '%s': client '%s' left", s->name, peer);
        /* the answer follows every DELIVER sent to it: the client drops those until it
         * comes (dh__client_drain_after_goodbye); a coordinator's GOODBYE is not on this
         * socket */
        dh_msg_t bye = {.type = DH_MSG_GOODBYE};
        if (dh_wire_send(s->data, peer, strlen(peer), &bye, NULL, 0, 0) != 0)
            dh_log_debug("DataServer '%s': no answer to '%s''s GOODBYE: %s", s->name, peer,
                         dh_last_error());
        break;
    }
    default:
        dh_log_warn("DataServer '%s': unexpected %s from '%s' ignored", s->name,
                    dh_msg_type_name(r->msg.type), peer);
    }
}

int dh_dataserver_run(dh_dataserver_t *s)
{
    dh__inprocess_enter(s->name); /* a coordinator of this process never times it out */
    char limit[64] = "";
    if (s->pipeline.python)
        snprintf(limit, sizeof limit, ", one worker process each, sample_timeout %g s)",
                 s->pipeline.sample_timeout_s);
    else if (!s->pipeline.synthetic)
        snprintf(limit, sizeof limit, " (sample_timeout %g s)", s->pipeline.sample_timeout_s);
    /* the arena's size: a default one follows the memory available at the start (§2a of
     * docs/shared-memory.md), and a small one explains waits and spills */
    char arena[96] = "";
    if (s->arena) {
        dh_shm_arena_stats_t as;
        dh_shm_arena_stats(s->arena, &as);
        snprintf(arena, sizeof arena, ", arena %.1f MiB (%llu slabs)",
                 (double)as.slabs_total * (double)as.slab_size / 1048576.0,
                 (unsigned long long)as.slabs_total);
    }
    dh_log_info(
        "DataServer '%s': %s on node '%s', %u workers, %s pipeline%s%s%s%s%s%s, "
        "coordinator %s",
        s->name, s->cfg.role == DH_DS_LOCAL ? "local" : "remote sidecar", s->node, s->cfg.workers,
        s->pipeline.python      ? "python"
        : s->pipeline.synthetic ? "synthetic"
                                : "video",
        s->pipeline.python ? " (dataset " : "", s->pipeline.python ? s->pipeline.py_dataset : "",
        limit, s->data_endpoint[0] ? ", data " : "", s->data_endpoint, arena, s->coord_endpoint);
    send_hello(s);
    uint64_t last_hb = dh_clock_now_ns(), last_reclaim = last_hb;
    dh_wire_received_t r = {0};
    int rc = 0;
    while (!atomic_load(&s->stop)) {
        zmq_pollitem_t items[4 + MAX_LINKS + DH__NOTICE_MAX];
        int n = 0;
        items[n++] = (zmq_pollitem_t){dh_wire_socket_handle(s->coord), 0, ZMQ_POLLIN, 0};
        items[n++] = (zmq_pollitem_t){NULL, s->wake_fd, ZMQ_POLLIN, 0};
        int data_at = -1, fd_at = -1, links_at = n;
        if (s->data) {
            data_at = n;
            items[n++] = (zmq_pollitem_t){dh_wire_socket_handle(s->data), 0, ZMQ_POLLIN, 0};
            fd_at = n;
            items[n++] = (zmq_pollitem_t){NULL, s->notice.listen_fd, ZMQ_POLLIN, 0};
        }
        links_at = n;
        for (size_t i = 0; i < s->n_links; i++)
            items[n++] = (zmq_pollitem_t){
                dh_wire_socket_handle(s->links[i].sock), 0,
                (short)(ZMQ_POLLIN | (dh__ds_link_wants_out(&s->links[i]) ? ZMQ_POLLOUT : 0)), 0};
        int notice_at = n;
        size_t n_notice = s->notice.n_conns;
        for (size_t i = 0; i < n_notice; i++)
            items[n++] = (zmq_pollitem_t){NULL, s->notice.conns[i].fd, ZMQ_POLLIN, 0};
        long timeout = dh__ds_links_timeout_ms(s, s->pending ? 1 : heartbeat_in_ms(s, last_hb));
        if (zmq_poll(items, n, timeout) < 0 && zmq_errno() != EINTR) {
            rc = -zmq_errno();
            dh_log_error("DataServer '%s': zmq_poll: %s", s->name, zmq_strerror(zmq_errno()));
            break;
        }
        /* before the work this wake-up brought, and again after it (below) */
        if ((rc = heartbeat_if_due(s, &last_hb)))
            break;
        if (items[0].revents & ZMQ_POLLIN)
            for (int i = 0; i < 256; i++) {
                int got = dh_wire_recv(s->coord, 0, &r);
                if (got == DH_ENOMEM) {
                    tell_coord_dropped(s, dh_last_error());
                    continue;
                }
                if (got)
                    break;
                on_coord_message(s, &r);
                dh_wire_received_release(&r);
            }
        if (items[1].revents & ZMQ_POLLIN)
            drain_results(s);
        if (data_at >= 0 && (items[data_at].revents & ZMQ_POLLIN))
            for (int i = 0; i < 256; i++) {
                int got = dh_wire_recv(s->data, 0, &r);
                if (got == DH_EPARSE) {
                    dh_log_warn("DataServer '%s': dropped a malformed message: %s", s->name,
                                dh_last_error());
                    continue;
                }
                if (got)
                    break;
                on_data_message(s, &r);
                dh_wire_received_release(&r);
            }
        for (size_t i = n_notice; i-- > 0;) /* backwards: a close moves the last one here */
            if (items[notice_at + (int)i].revents & (ZMQ_POLLIN | ZMQ_POLLERR))
                dh__notice_server_read(&s->notice, i);
        if (fd_at >= 0 && (items[fd_at].revents & ZMQ_POLLIN))
            dh__notice_server_accept(&s->notice, dh_shm_arena_fd(s->arena));
        for (size_t i = 0; i < s->n_links; i++)
            if (items[links_at + (int)i].revents & ZMQ_POLLIN)
                while (dh_wire_recv(s->links[i].sock, 0, &r) == 0) {
                    dh__ds_on_link_message(s, &s->links[i], &r);
                    dh_wire_received_release(&r);
                }
        dh__ds_links_send_due(s);
        dh__ds_watch_workers(s); /* sample_timeout of native tasks (dataserver_work.c) */
        if (s->pending)
            dh__ds_retry_pending(s);
        dh__ds_metrics_tick(s);
        if ((rc = heartbeat_if_due(s, &last_hb)))
            break;
        uint64_t now = dh_clock_now_ns();
        if (s->arena && now - last_reclaim > 200000000ull) {
            last_reclaim = now;
            pthread_mutex_lock(&s->arena_lock);
            size_t dropped = dh_shm_arena_reclaim_dead(s->arena);
            pthread_mutex_unlock(&s->arena_lock);
            if (dropped)
                dh_log_info("DataServer '%s': reclaimed %zu batches held by dead clients", s->name,
                            dropped);
        }
    }
    dh_msg_t bye = {.type = DH_MSG_GOODBYE};
    dh_wire_send(s->coord, NULL, 0, &bye, NULL, 0, 0);
    dh_dataserver_stats_t st;
    dh_dataserver_stats(s, &st);
    dh_log_info("DataServer '%s': stopping: %llu tasks, %llu samples (%llu failed), delivered "
                "%llu own + %llu forwarded batches, bytes received %llu, forwarded %llu batches, "
                "bytes forwarded %llu, arena waits %llu, spills %llu, undeliverable %llu, output "
                "budget waits %llu",
                s->name, (unsigned long long)st.tasks, (unsigned long long)st.samples,
                (unsigned long long)st.sample_errors, (unsigned long long)st.delivered_local,
                (unsigned long long)st.delivered_forwarded, (unsigned long long)st.bytes_received,
                (unsigned long long)st.forwarded, (unsigned long long)st.bytes_forwarded,
                (unsigned long long)st.arena_waits, (unsigned long long)st.arena_spills,
                (unsigned long long)st.undeliverable, (unsigned long long)st.output_waits);
    dh__inprocess_leave(s->name);
    return rc;
}

static void *loop_main(void *arg)
{
    dh_dataserver_run(arg);
    return NULL;
}

int dh_dataserver_start(dh_dataserver_t *s)
{
    int e = pthread_create(&s->loop_thread, NULL, loop_main, s);
    if (e)
        return dh__set_error(-e, "DataServer: pthread_create: %s", strerror(e));
    s->started = true;
    return 0;
}

void dh_dataserver_stop(dh_dataserver_t *s)
{
    atomic_store(&s->stop, 1);
}
