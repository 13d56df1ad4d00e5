/* dataserver.c: a DataServer, local or remote sidecar (docs/design.md §2, §5; docs/runtime.md).
 *
 * Threads: one event loop (the caller of dh_dataserver_run, or the thread of _start) that
 * owns every socket, and `workers` worker threads that run the pipeline. They talk through
 * two mutex-protected FIFOs (tasks in, results out) and an eventfd that wakes the loop, the
 * "documented thread-safe queue" of docs/conventions.md. ZeroMQ's PUSH would hand a task to a busy
 * worker's pipe; a shared FIFO gives it to whichever worker is free.
 *
 * Sockets of the loop:
 *   coord    DEALER -> the coordinator (HELLO, HEARTBEAT, COMPLETE; receives DISPATCH)
 *   data     ROUTER, local role: clients (HELLO, then DELIVER of handles to them) and
 *            sidecars (DELIVER with tensor frames from them, COMPLETE acks back)
 *   notice   AF_UNIX abstract SOCK_SEQPACKET listening socket, local role (notice.c): hands
 *            the arena's memfd to a client that connects (SCM_RIGHTS); the connection stays
 *            open as that client's notice channel: the client names itself on it, and a
 *            DELIVER of arena handles goes to it as one packet (dh_wire_encode_packet), two
 *            thread hops instead of ZeroMQ's four; anything else (spilled frames, a full
 *            channel) goes over `data`
 *   links    DEALERs, remote role: one per target local DataServer
 * The arena is allocated by workers and by the loop; a mutex around alloc / collect /
 * reclaim makes them one logical owner (shm.h's "creator's owner thread" rule). A full arena
 * blocks the worker (it retries every millisecond): backpressure, never a crash.
 *
 * This file is the event loop and the DataServer's life cycle: registration and heartbeats,
 * the clients it serves and local delivery. The queues and workers are dataserver_work.c,
 * links to other DataServers and forwarding forward.c, the notice channel notice.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
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
#include "shm/shm_lib.h"
#include "runtime/rt.h"
#include "wire/wire_lib.h"

void dh_dataserver_config_default(dh_dataserver_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->role = DH_DS_LOCAL;
    cfg->workers = 2;
    cfg->arena_bytes = 0; /* the budget: dh_arena_budget_default() */
    cfg->data_listen = "tcp://127.0.0.1:*";
    cfg->heartbeat_ms = 100;
}

int dh_arena_parse_bytes(const char *text, const char *what, uint64_t *out)
{
    *out = 0;
    const char *p = text ? text : "";
    uint64_t v = 0;
    if (*p < '0' || *p > '9')
        return dh__set_error(DH_EINVAL, "%s: '%s' is not a byte count (e.g. 8G, 512M, 1048576)",
                             what, p);
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return dh__set_error(DH_EINVAL, "%s: '%s' is too large", what, text);
        v = v * 10 + (uint64_t)(*p - '0');
    }
    unsigned shift = 0;
    if (*p == 'k' || *p == 'K')
        shift = 10;
    else if (*p == 'm' || *p == 'M')
        shift = 20;
    else if (*p == 'g' || *p == 'G')
        shift = 30;
    if (shift)
        p++;
    if (*p || v == 0)
        return dh__set_error(DH_EINVAL, "%s: '%s' is not a byte count > 0 (e.g. 8G, 512M, 1048576)",
                             what, text);
    if (shift && v > UINT64_MAX >> shift)
        return dh__set_error(DH_EINVAL, "%s: '%s' is too large", what, text);
    *out = v << shift;
    return 0;
}

uint64_t dh_arena_budget_default(void)
{
    const char *env = getenv("DH_ARENA_BUDGET");
    uint64_t v = 0;
    if (env && env[0]) {
        if (dh_arena_parse_bytes(env, "DH_ARENA_BUDGET", &v) == 0)
            return v;
        dh_log_warn("%s; using the default (a quarter of physical memory)", dh_last_error());
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t memory = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)16 << 30;
    /* In a container the cgroup's limit, not the host's memory, is what the arena may
     * take: a quarter of the host would fail at start (docs/shared-memory.md). */
    dh__shm_memory_t mem;
    dh__shm_memory_probe(NULL, &mem);
    if (mem.cgroup_limit_bytes < memory)
        memory = mem.cgroup_limit_bytes;
    return memory / 4;
}

const char *dh_dataserver_name(const dh_dataserver_t *s)
{
    return s->name;
}

const char *dh_dataserver_endpoint(const dh_dataserver_t *s)
{
    return s->data_endpoint;
}

void dh_dataserver_stats(const dh_dataserver_t *s, dh_dataserver_stats_t *out)
{
    memset(out, 0, sizeof *out);
    const dh__ds_counters_t *in = &s->counters;
    DH__DS_COUNTERS(DH__COUNTER_READ)
}

int dh_dataserver_arena_stats(const dh_dataserver_t *s, dh_shm_arena_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!s->arena)
        return dh__set_error(DH_EINVAL, "DataServer %s: a sidecar has no arena", s->name);
    /* The creator's own allocator state belongs to the server thread; an attached view
     * reads only the shared records, atomically. */
    dh_shm_arena_t *view = NULL;
    int rc = dh_shm_arena_attach(&view, dh_shm_arena_fd(s->arena));
    if (rc < 0)
        return rc;
    dh_shm_arena_stats(view, out);
    dh_shm_arena_destroy(&view);
    return 0;
}

/* ---- the loop ---- */

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

bool dh__ds_client_left(const dh_dataserver_t *s, const char *name)
{
    for (size_t i = 0; i < s->n_left; i++)
        if (strcmp(s->left[i], name) == 0)
            return true;
    return false;
}

static void set_left(dh_dataserver_t *s, const char *name, bool left)
{
    for (size_t i = 0; i < s->n_left; i++)
        if (strcmp(s->left[i], name) == 0) {
            memmove(s->left[i], s->left[i + 1], (s->n_left - i - 1) * sizeof s->left[0]);
            s->n_left--;
            break;
        }
    if (!left)
        return;
    if (s->n_left == LEFT_CAP) {
        memmove(s->left[0], s->left[1], (LEFT_CAP - 1) * sizeof s->left[0]);
        s->n_left--;
    }
    snprintf(s->left[s->n_left++], NAME_CAP, "%s", name);
}

known_client_t *dh__ds_find_client(dh_dataserver_t *s, const char *name)
{
    for (size_t i = 0; i < s->n_clients; i++)
        if (strcmp(s->clients[i].name, name) == 0)
            return &s->clients[i];
    return NULL;
}

void dh__ds_free_payload(void *data, void *hint)
{
    dh__wire_tsan_acquire(); /* maybe on a ZeroMQ I/O thread */
    dh_free(data);
}

/* Sends a client the DELIVER of handles for a batch in the arena. Returns 0, or
 * -EHOSTUNREACH when the client is not connected (the caller decides to wait or drop). */
int dh__ds_deliver_to_client(dh_dataserver_t *s, const char *client_id, uint64_t seq,
                             const dh__rt_tensor_t *tensors, size_t n_tensors,
                             const dh_wire_sample_result_t *samples, uint32_t n_samples,
                             uint64_t ready_ns, const char *executor)
{
    known_client_t *kc = dh__ds_find_client(s, client_id);
    if (kc && kc->pid)
        for (size_t i = 0; i < n_tensors; i++)
            if (tensors[i].handle.arena_id &&
                dh_shm_arena_ref_for(s->arena, &tensors[i].handle, (pid_t)kc->pid) == 0)
                dh_shm_arena_unref(s->arena, &tensors[i].handle);
    dh_wire_tensor_t wire[DH__RT_MAX_TENSORS];
    dh__rt_wire_tensors(tensors, n_tensors, wire);
    dh_wire_payload_t frames[DH__RT_MAX_TENSORS];
    size_t n_frames = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        if (tensors[i].handle.arena_id)
            continue;
        /* a spilled tensor: a copy goes as a payload frame (the caller keeps its buffer) */
        const dh_tensor_t *t = &tensors[i].tensor;
        void *copy = dh_malloc(t->nbytes ? t->nbytes : 1);
        if (!copy) {
            for (size_t k = 0; k < n_frames; k++)
                dh_free(frames[k].data);
            return dh__set_error(DH_ENOMEM, "out of memory for a %zu-byte payload frame",
                                 t->nbytes);
        }
        if (t->nbytes)
            memcpy(copy, t->data, t->nbytes);
        frames[n_frames++] = (dh_wire_payload_t){copy, t->nbytes, dh__ds_free_payload, NULL};
    }
    dh_msg_t m = {.type = DH_MSG_DELIVER};
    m.deliver.client_id = (char *)client_id;
    m.deliver.seq = seq;
    m.deliver.n_tensors = (uint32_t)n_tensors;
    m.deliver.tensors = wire;
    m.deliver.n_samples = n_samples;
    m.deliver.samples = (dh_wire_sample_result_t *)samples;
    m.deliver.ready_ns = ready_ns;
    m.deliver.server = (char *)executor;
    if (n_frames == 0 && dh__notice_server_send(&s->notice, client_id, &m))
        return 0;
    return dh_wire_send(s->data, client_id, strlen(client_id), &m, frames, n_frames, 0);
}

/* Gives back a local task's outputs: slabs are unreferenced, spilled buffers freed. */
static void free_outputs(dh_dataserver_t *s, const dh__rt_tensor_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].handle.arena_id)
            dh_shm_arena_unref(s->arena, &t[i].handle);
        else
            dh_free(t[i].tensor.data);
    }
}

void dh__ds_unref_tensors(dh_dataserver_t *s, const dh__rt_tensor_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].handle.arena_id)
            dh_shm_arena_unref(s->arena, &t[i].handle);
}

/* Returns true when the task is done with (delivered or dropped), false to keep it pending. */
bool dh__ds_finish_local(dh_dataserver_t *s, task_t *t, uint64_t since_ns)
{
    const dh_msg_dispatch_t *d = &t->msg.dispatch;
    dh__rt_result_t *r = &t->result;
    bool left = dh__ds_client_left(s, d->request.client_id);
    int rc = left ? -EHOSTUNREACH
                  : dh__ds_deliver_to_client(s, d->request.client_id, d->request.seq, r->tensors,
                                             r->n_tensors, r->samples, r->n_samples, t->ready_ns,
                                             s->name);
    bool stopping = atomic_load(&s->stop) != 0;
    if (rc == -EHOSTUNREACH && !left && dh_clock_now_ns() - since_ns < UNREACHABLE_GRACE_NS &&
        !stopping)
        return false;
    if (rc) {
        free_outputs(s, r->tensors, r->n_tensors);
        dh__count(&s->counters.undeliverable, 1);
        /* prefetched past what the client consumed, or unsent as we stop (the stop line
         * counts them as undeliverable): expected, not a loss */
        if (left || (stopping && rc == -EHOSTUNREACH))
            dh_log_debug("DataServer '%s': dropped batch %s/%llu: %s", s->name,
                         d->request.client_id, (unsigned long long)d->request.seq,
                         left ? "the client has left" : "stopping, the client is gone");
        else
            dh_log_warn("DataServer '%s': dropped batch %s/%llu: %s", s->name, d->request.client_id,
                        (unsigned long long)d->request.seq, dh_last_error());
    } else {
        for (size_t i = 0; i < r->n_tensors; i++)
            if (!r->tensors[i].handle.arena_id) { /* spilled: the frame was a copy */
                dh_free(r->tensors[i].tensor.data);
                r->tensors[i].tensor.data = NULL;
            }
        dh__count(&s->counters.delivered_local, 1);
    }
    dh__ds_unbook(s, t);
    dh__ds_send_complete(s, d->request.client_id, d->request.seq, r, r->cpu_s, t->queue_s, 1, NULL,
                         NULL);
    return true;
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
                free_outputs(s, t->result.tensors, t->result.n_tensors);
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

static void on_coord_message(dh_dataserver_t *s, dh_wire_received_t *r)
{
    if (r->msg.type == DH_MSG_DISPATCH) {
        s->dispatches_seen++;
        task_t *t = dh_calloc(1, sizeof *t);
        if (!t) {
            dh_log_error("DataServer '%s': out of memory for a task", s->name);
            return;
        }
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
        set_left(s, peer, false);
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
        set_left(s, peer, true);
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
                 s->pipeline.py_sample_timeout_s);
    dh_log_info(
        "DataServer '%s': %s on node '%s', %u workers, %s pipeline%s%s%s%s%s, "
        "coordinator %s",
        s->name, s->cfg.role == DH_DS_LOCAL ? "local" : "remote sidecar", s->node, s->cfg.workers,
        s->pipeline.python      ? "python"
        : s->pipeline.synthetic ? "synthetic"
                                : "video",
        s->pipeline.python ? " (dataset " : "", s->pipeline.python ? s->pipeline.py_dataset : "",
        limit, s->data_endpoint[0] ? ", data " : "", s->data_endpoint, s->coord_endpoint);
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
        long timeout = dh__ds_links_timeout_ms(s, s->pending ? 1 : (long)s->cfg.heartbeat_ms);
        if (zmq_poll(items, n, timeout) < 0 && zmq_errno() != EINTR) {
            rc = -zmq_errno();
            dh_log_error("DataServer '%s': zmq_poll: %s", s->name, zmq_strerror(zmq_errno()));
            break;
        }
        if (items[0].revents & ZMQ_POLLIN)
            for (int i = 0; i < 256 && dh_wire_recv(s->coord, 0, &r) == 0; i++) {
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
        if (s->pending)
            dh__ds_retry_pending(s);
        dh__ds_metrics_tick(s);
        uint64_t now = dh_clock_now_ns();
        if (now - last_hb >= (uint64_t)s->cfg.heartbeat_ms * 1000000ull) {
            last_hb = now;
            if ((rc = dh__wire_auth_check(s->coord))) {
                /* refused keys (or no coordinator there) do not heal: fail, saying which,
                 * rather than retry forever */
                dh_log_error("DataServer '%s': %s", s->name, dh_last_error());
                break;
            }
            send_heartbeat(s);
        }
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

/* This machine's address on the route to a tcp:// endpoint's host (the source address a
 * datagram to it would carry; nothing is sent), into out. 0, or -1 when there is none. */
static int route_address(const char *endpoint, char *out, size_t cap)
{
    if (strncmp(endpoint, "tcp://", 6) != 0)
        return -1;
    char host[256];
    const char *h = endpoint + 6, *colon = strrchr(h, ':');
    if (!colon || (size_t)(colon - h) >= sizeof host)
        return -1;
    memcpy(host, h, (size_t)(colon - h));
    host[colon - h] = '\0';
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
        return -1;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    int ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
             getsockname(fd, (struct sockaddr *)&local, &len) == 0 &&
             inet_ntop(AF_INET, &local.sin_addr, out, (socklen_t)cap) != NULL;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return ok ? 0 : -1;
}

/* The data endpoint others are told (HELLO): `advertise` (an endpoint, or a host that takes
 * the bound port), else the bound one with a wildcard host (0.0.0.0, *) replaced by the
 * address on the route to the coordinator, so a sidecar on another machine can reach it. */
static int advertise_endpoint(dh_dataserver_t *s, const char *advertise)
{
    char *ep = s->data_endpoint;
    const char *colon = strrchr(ep, ':');
    bool tcp = strncmp(ep, "tcp://", 6) == 0 && colon && colon > ep + 6;
    char host[256] = "", out[ENDPOINT_CAP];
    if (advertise && advertise[0]) {
        if (strstr(advertise, "://")) {
            snprintf(ep, ENDPOINT_CAP, "%s", advertise);
            return 0;
        }
        if (!tcp)
            return dh__set_error(DH_EINVAL,
                                 "DataServer: --advertise %s: a host needs a tcp:// data "
                                 "endpoint to take the port of (bound: %s)",
                                 advertise, ep);
        snprintf(host, sizeof host, "%s", advertise);
    } else if (tcp && (strncmp(ep + 6, "0.0.0.0:", 8) == 0 || strncmp(ep + 6, "*:", 2) == 0)) {
        if (route_address(s->coord_endpoint, host, sizeof host) != 0)
            snprintf(host, sizeof host, "127.0.0.1");
    } else {
        return 0;
    }
    int n = snprintf(out, sizeof out, "tcp://%s%s", host, colon);
    if (n < 0 || (size_t)n >= sizeof out)
        return dh__set_error(DH_EINVAL, "DataServer: advertised endpoint too long");
    memcpy(ep, out, (size_t)n + 1);
    return 0;
}

int dh_dataserver_new(dh_dataserver_t **out, const dh_dataserver_config_t *cfg)
{
    *out = NULL;
    if (!cfg->coordinator || !cfg->coordinator[0])
        return dh__set_error(DH_EINVAL, "DataServer: no coordinator endpoint (--coordinator)");
    if (!cfg->node || !cfg->node[0])
        return dh__set_error(DH_EINVAL, "DataServer: no node name (--node)");
    if (cfg->workers > 1024 || (cfg->workers == 0 && cfg->role != DH_DS_LOCAL))
        return dh__set_error(DH_EINVAL,
                             "DataServer: --workers must be in [1, 1024] (0 only for a local "
                             "delivery-only server), got %u",
                             cfg->workers);
    if (!(cfg->emulate_link_Bps >= 0) || isinf(cfg->emulate_link_Bps))
        return dh__set_error(DH_EINVAL,
                             "DataServer: emulate_link_Bps must be finite and >= 0, got %g",
                             cfg->emulate_link_Bps);
    dh_dataserver_t *s = dh_calloc(1, sizeof *s);
    if (!s)
        return dh__set_error(DH_ENOMEM, "out of memory for a DataServer");
    s->cfg = *cfg;
    dh__notice_server_init(&s->notice, s->name);
    s->wake_fd = -1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->arena_lock, NULL);
    pthread_cond_init(&s->task_cond, NULL);
    snprintf(s->node, sizeof s->node, "%s", cfg->node);
    snprintf(s->coord_endpoint, sizeof s->coord_endpoint, "%s", cfg->coordinator);
    if (cfg->name && cfg->name[0])
        snprintf(s->name, sizeof s->name, "%s", cfg->name);
    else
        snprintf(s->name, sizeof s->name, "%s-%s-%d", cfg->node,
                 cfg->role == DH_DS_LOCAL ? "local" : "remote", (int)getpid());
    s->cfg.coordinator = s->coord_endpoint;
    s->cfg.node = s->node;
    s->cfg.name = s->name;
    s->cfg.pipeline_json = NULL;
    s->cfg.pipeline_path = NULL;
    s->cfg.data_listen = NULL;
    s->cfg.data_advertise = NULL;
    s->cfg.shm_allow_uids = NULL;
    s->cfg.metrics_listen = NULL;
    int rc = dh__rt_pipeline_load(cfg->pipeline_json,
                                  cfg->pipeline_json ? NULL : cfg->pipeline_path, &s->pipeline);
    if (rc)
        goto fail;
    s->ctx = cfg->zmq_ctx;
    if (!s->ctx) {
        s->ctx = zmq_ctx_new();
        s->own_ctx = true;
        if (!s->ctx) {
            rc = dh__set_error(DH_ENOMEM, "DataServer: zmq_ctx_new failed");
            goto fail;
        }
    }
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        rc = dh__set_error(-errno, "DataServer: eventfd: %s", strerror(errno));
        goto fail;
    }
    s->cfg.keys_dir = s->cfg.key_name = NULL;
    const char *listen =
        cfg->data_listen && cfg->data_listen[0] ? cfg->data_listen : "tcp://127.0.0.1:*";
    if ((rc = dh__wire_secure(s->ctx, cfg->keys_dir, cfg->key_name,
                              cfg->role == DH_DS_LOCAL ? listen : NULL, &s->keys, &s->auth_ref)))
        goto fail;
    dh_wire_socket_opts_t opts = {.keys = s->keys};
    if (cfg->role == DH_DS_LOCAL) {
        const char *allow = cfg->shm_allow_uids ? cfg->shm_allow_uids : getenv("DH_SHM_ALLOW_UIDS");
        if ((rc = dh__notice_server_allow(&s->notice, allow,
                                          cfg->shm_allow_uids
                                              ? "DataServer: shm_allow_uids (--shm-allow-uid)"
                                              : "DataServer: DH_SHM_ALLOW_UIDS")))
            goto fail;
        /* The arena's memfd is sparse: a budget-sized default costs memory only as far as
         * batches fill it, and each rank's prefetch keeps to its share (client_send.c). */
        uint64_t bytes = cfg->arena_bytes          ? cfg->arena_bytes
                         : cfg->arena_budget_bytes ? cfg->arena_budget_bytes
                                                   : dh_arena_budget_default();
        if ((rc = dh_shm_arena_new(&s->arena, (size_t)bytes, 0)))
            goto fail;
        s->cfg.arena_bytes = bytes;
        if ((rc = dh_wire_socket_new(&s->data, s->ctx, ZMQ_ROUTER, &opts)))
            goto fail;
        if ((rc = dh__wire_router_handover(s->data)))
            goto fail;
        if ((rc = dh_wire_socket_bind(s->data, listen)))
            goto fail;
        if ((rc = dh__wire_last_endpoint(s->data, s->data_endpoint, sizeof s->data_endpoint)))
            goto fail;
        if ((rc = advertise_endpoint(s, cfg->data_advertise)))
            goto fail;
        if ((rc = dh__notice_server_listen(&s->notice)))
            goto fail;
    }
    if ((rc = dh_wire_socket_new(&s->coord, s->ctx, ZMQ_DEALER, &opts)) ||
        (rc = dh__wire_set_routing_id(s->coord, s->name)))
        goto fail;
    dh__wire_set_peer_role(s->coord, "coordinator");
    if ((rc = dh_wire_socket_connect(s->coord, s->coord_endpoint)))
        goto fail;
    s->threads = dh_calloc(cfg->workers ? cfg->workers : 1, sizeof *s->threads);
    if (!s->threads) {
        rc = dh__set_error(DH_ENOMEM, "out of memory for worker threads");
        goto fail;
    }
    for (uint32_t i = 0; i < cfg->workers; i++) {
        worker_arg_t *a = dh_malloc(sizeof *a);
        if (!a) {
            rc = dh__set_error(DH_ENOMEM, "out of memory for worker threads");
            goto fail;
        }
        a->s = s;
        a->index = i;
        int e = pthread_create(&s->threads[i], NULL, dh__ds_worker_main, a);
        if (e) {
            dh_free(a);
            rc = dh__set_error(-e, "DataServer: pthread_create: %s", strerror(e));
            goto fail;
        }
        s->n_threads++;
    }
    if (cfg->metrics_listen && cfg->metrics_listen[0] &&
        (rc = dh__ds_metrics_start(s, cfg->metrics_listen)))
        goto fail;
    *out = s;
    return 0;
fail:
    dh_dataserver_destroy(&s);
    return rc;
}

void dh_dataserver_destroy(dh_dataserver_t **ps)
{
    if (!ps || !*ps)
        return;
    dh_dataserver_t *s = *ps;
    atomic_store(&s->stop, 1);
    if (s->started)
        pthread_join(s->loop_thread, NULL);
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->task_cond);
    pthread_mutex_unlock(&s->lock);
    for (uint32_t i = 0; i < s->n_threads; i++)
        pthread_join(s->threads[i], NULL);
    /* the loop has stopped writing them; its scrapes read the counters and the arena */
    dh__ds_metrics_destroy(s);
    dh_free(s->threads);
    task_t *t;
    while ((t = dh__ds_pop(&s->tasks)))
        dh__ds_task_free(t);
    while ((t = dh__ds_pop(&s->results))) {
        if (t->local_target)
            free_outputs(s, t->result.tensors, t->result.n_tensors);
        else
            for (size_t i = 0; i < t->result.n_tensors; i++)
                dh_free(t->result.tensors[i].tensor.data);
        dh__ds_task_free(t);
    }
    while (s->pending) {
        pending_t *p = s->pending;
        s->pending = p->next;
        if (p->task) {
            free_outputs(s, p->task->result.tensors, p->task->result.n_tensors);
            dh__ds_task_free(p->task);
        }
        dh_wire_received_release(&p->forwarded);
        dh_free(p);
    }
    for (size_t i = 0; i < s->n_links; i++)
        dh__ds_link_close(s, &s->links[i]);
    dh_wire_socket_destroy(&s->coord);
    dh_wire_socket_destroy(&s->data);
    dh__wire_secure_end(s->ctx, &s->keys, s->auth_ref);
    dh__notice_server_close(&s->notice);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    dh_shm_arena_destroy(&s->arena);
    if (s->own_ctx && s->ctx)
        zmq_ctx_term(s->ctx);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->arena_lock);
    pthread_cond_destroy(&s->task_cond);
    dh_free(s);
    *ps = NULL;
}
