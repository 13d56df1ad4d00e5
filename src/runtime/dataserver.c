/* dataserver.c: a DataServer's life cycle, local or remote sidecar (docs/design.md §2, §5;
 * docs/runtime.md): its config and arena budget, making it (the pipeline, the sockets, the
 * arena and the notice channel of a local one, the advertised endpoint, the worker threads)
 * and taking it apart.
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
 * The rest is in its rooms: the event loop, registration and heartbeats dataserver_loop.c,
 * the clients it serves and local delivery dataserver_deliver.c, the queues and workers
 * dataserver_work.c, links to other DataServers and forwarding dataserver_forward.c, the notice
 * channel notice.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
#include <time.h>
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
#include "runtime/notice.h"
#include "shm/shm_lib.h"
#include "runtime/rt.h"
#include "remote/remote_lib.h"
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
     * take, and on a busy machine what is available now: more would fail at start
     * (docs/shared-memory.md). */
    return dh__shm_budget_default(NULL, memory);
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
    DH__DS_STATS(DH__STAT_READ)
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

/* The cache directory of cfg (docs/remote.md, "The local cache"): both settings or none, a
 * bound of at least two 1 MiB blocks, a directory that can be made and written (a file
 * created and removed there), so a bad --cache-dir fails at start, named, not at the first
 * remote read. */
static int cache_dir_check(const dh_dataserver_config_t *cfg)
{
    bool dir = cfg->cache_dir && cfg->cache_dir[0];
    if (!dir && !cfg->cache_bytes)
        return 0;
    if (!dir)
        return dh__set_error(DH_EINVAL, "DataServer: --cache-bytes without --cache-dir");
    if (!cfg->cache_bytes)
        return dh__set_error(DH_EINVAL,
                             "DataServer: --cache-dir %s without --cache-bytes (the "
                             "bound on its size)",
                             cfg->cache_dir);
    if (cfg->cache_bytes < ((uint64_t)2 << 20))
        return dh__set_error(DH_EINVAL,
                             "DataServer: --cache-bytes %" PRIu64
                             " for %s is below 2 MiB (two blocks of 1 MiB)",
                             cfg->cache_bytes, cfg->cache_dir);
    int rc = dh__make_dirs(cfg->cache_dir);
    if (rc)
        return dh__set_error(rc, "DataServer: --cache-dir %s cannot be made: %s", cfg->cache_dir,
                             dh_last_error());
    char probe[4200];
    int n = snprintf(probe, sizeof probe, "%s/w-probe-%d", cfg->cache_dir, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof probe)
        return dh__set_error(DH_EINVAL, "DataServer: --cache-dir %.200s...: too long",
                             cfg->cache_dir);
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return dh__set_error(-errno, "DataServer: --cache-dir %s cannot be written: %s",
                             cfg->cache_dir, strerror(errno));
    close(fd);
    unlink(probe);
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
    int rc = cache_dir_check(cfg);
    if (rc)
        return rc;
    dh_dataserver_t *s = dh_calloc(1, sizeof *s);
    if (!s)
        return dh__set_error(DH_ENOMEM, "out of memory for a DataServer");
    s->cfg = *cfg;
    s->cfg.cache_dir = NULL;
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
    if (cfg->cache_dir && cfg->cache_dir[0]) {
        if (!(s->cache_dir = dh_strdup(cfg->cache_dir))) {
            rc = dh__set_error(DH_ENOMEM, "out of memory for a DataServer");
            goto fail;
        }
        s->cfg.cache_dir = s->cache_dir;
        /* every remote read of this process goes through it (docs/remote.md) */
        if ((rc = dh__remote_cache_use(s->cache_dir, cfg->cache_bytes)))
            goto fail;
        s->cache_used = true;
    }
    rc = dh__rt_pipeline_load(cfg->pipeline_json, cfg->pipeline_json ? NULL : cfg->pipeline_path,
                              &s->pipeline);
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
    s->slots = dh_calloc(cfg->workers ? cfg->workers : 1, sizeof *s->slots);
    if (!s->slots) {
        rc = dh__set_error(DH_ENOMEM, "out of memory for worker threads");
        goto fail;
    }
    for (uint32_t i = 0; i < cfg->workers; i++) {
        if ((rc = dh__ds_start_worker(s, i)))
            goto fail;
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

/* Joins a slot's worker thread; one inside a sample's read or decode for over STOP_WAIT_NS (its
 * watch, dataserver_work.c, "Deadlines") is abandoned instead: the server does not wait for a
 * read that may never return, and the task it held is freed here (its thread touches it no
 * more). */
#define STOP_WAIT_NS 1000000000ull
static void join_worker(dh_dataserver_t *s, ds_slot_t *slot)
{
    if (!slot->live)
        return;
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 20000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        if (pthread_timedjoin_np(slot->thread, NULL, &until) == 0)
            break;
        char id[256], msg[1600];
        uint32_t k;
        pthread_mutex_lock(&s->lock);
        bool stuck =
            slot->watch && dh__rt_watch_expire(slot->watch, dh_clock_now_ns(), STOP_WAIT_NS, &k, id,
                                               sizeof id, msg, sizeof msg);
        task_t *t = stuck ? slot->task : NULL;
        if (stuck)
            slot->task = NULL;
        pthread_mutex_unlock(&s->lock);
        if (stuck) {
            dh_log_warn("DataServer '%s': stopping: a worker blocked in sample '%s' is left "
                        "behind (abandoned)",
                        s->name, id);
            dh__ds_count_abandoned_at_stop();
            pthread_detach(slot->thread);
            dh__ds_task_free(t);
            break;
        }
    }
    dh__rt_watch_unref(slot->watch);
    slot->watch = NULL;
    slot->live = false;
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
        join_worker(s, &s->slots[i]);
    /* the loop has stopped writing them; its scrapes read the counters and the arena */
    dh__ds_metrics_destroy(s);
    dh_free(s->slots);
    task_t *t;
    while ((t = dh__ds_pop(&s->tasks)))
        dh__ds_task_free(t);
    while ((t = dh__ds_pop(&s->results))) {
        if (t->local_target)
            dh__ds_free_outputs(s, t->result.tensors, t->result.n_tensors);
        else
            for (size_t i = 0; i < t->result.n_tensors; i++)
                dh_free(t->result.tensors[i].tensor.data);
        dh__ds_task_free(t);
    }
    while (s->pending) {
        pending_t *p = s->pending;
        s->pending = p->next;
        if (p->task) {
            dh__ds_free_outputs(s, p->task->result.tensors, p->task->result.n_tensors);
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
    /* what the process's remote reads cost (the benchmark of docs/remote.md reads this) */
    dh__remote_stats_t rs;
    dh__remote_cache_stats_t cs;
    dh__remote_stats(&rs);
    dh__remote_cache_stats(&cs);
    if (rs.requests || s->cache_used)
        dh_log_info("DataServer '%s': remote reads: requests=%llu bytes_fetched=%llu "
                    "bytes_read=%llu cache_hits=%llu cache_misses=%llu ra_queued=%llu "
                    "ra_done=%llu ra_cancelled=%llu ra_dropped=%llu ra_bytes=%llu",
                    s->name, (unsigned long long)rs.requests, (unsigned long long)rs.bytes_fetched,
                    (unsigned long long)rs.bytes_read, (unsigned long long)cs.hits,
                    (unsigned long long)cs.misses, (unsigned long long)cs.ra_queued,
                    (unsigned long long)cs.ra_done, (unsigned long long)cs.ra_cancelled,
                    (unsigned long long)cs.ra_dropped, (unsigned long long)cs.ra_bytes);
    if (s->cache_used)
        dh__remote_cache_release(); /* after the workers: nothing of ours fetches now */
    dh_free(s->cache_dir);
    dh_free(s);
    *ps = NULL;
}
