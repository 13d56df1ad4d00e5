/* client.c: one training rank's client (DESIGN §2, §4.2, §4.4, §5; docs/runtime.md).
 *
 * Threads: the caller's (dh_client_next), a sender (coordinator DEALER: HELLO, REQUEST,
 * GOODBYE; receives the local DataServer's address) and a fetcher (data DEALER to the local
 * DataServer, and the notice channel: the arena socket's connection, kept open, on which the
 * DataServer sends a DELIVER of arena handles as one packet; both receive DELIVER). They
 * share `lock`: the consumption point, the ring of delivered parts and the local
 * DataServer's address; `cond` wakes next() when a part arrives (broadcast after the unlock).
 *
 * Ordering and exactly-once: request seq = batch x fanout + part. The ring holds the parts of
 * the batches between the consumption point and the prefetch horizon; a DELIVER for a seq
 * outside that range or already filled is a duplicate (a re-dispatched request delivered
 * twice) and its slabs are released at once.
 *
 * Arena mappings are reference counted (arena_ref_t): the client holds one per attached
 * arena, each delivered part one more; a batch released after the client is gone unmaps the
 * arena when its last part goes.
 */
#include <assert.h>
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
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/sampler.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/descriptor.h"
#include "runtime/notice.h"
#include "runtime/rt.h"

#define NAME_CAP 128
#define ENDPOINT_CAP 256
#define MAX_ARENAS 8

typedef struct arena_ref {
    dh_shm_arena_t *arena;
    uint64_t id;
    atomic_int refs;
} arena_ref_t;

static void arena_ref_drop(arena_ref_t *a)
{
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
        dh_shm_arena_destroy(&a->arena);
        dh_free(a);
    }
}

typedef struct part {
    bool ready;
    uint64_t seq;
    size_t n_tensors;
    dh_tensor_t tensors[DH__RT_MAX_TENSORS];
    dh_shm_handle_t handles[DH__RT_MAX_TENSORS];
    void *copies[DH__RT_MAX_TENSORS]; /* tensors that came as payload frames (spilled) */
    arena_ref_t *arena;
    uint32_t n_samples;
    dh_wire_sample_result_t *samples; /* owned (moved from the decoded message) */
    char server[NAME_CAP];
    uint64_t ready_ns, received_ns;
    /* fanout > 1, in the batch's first part: its tensors are the joined batch (copies in
     * copies[]; the other parts keep only their samples), or join_rc says why not */
    bool joined;
    int join_rc;
    char join_error[256];
} part_t;

/* Gives back a part's slabs and copies, keeping its samples (a joined batch's parts). */
static void part_release_tensors(part_t *p)
{
    for (size_t i = 0; i < p->n_tensors; i++) {
        if (p->handles[i].arena_id && p->arena)
            dh_shm_arena_unref(p->arena->arena, &p->handles[i]);
        dh_free(p->copies[i]);
        p->copies[i] = NULL;
        p->handles[i] = (dh_shm_handle_t){0};
    }
    arena_ref_drop(p->arena);
    p->arena = NULL;
    p->n_tensors = 0;
}

static void part_release(part_t *p)
{
    part_release_tensors(p);
    for (uint32_t i = 0; i < p->n_samples && p->samples; i++) {
        dh_free(p->samples[i].id);
        dh_free(p->samples[i].error);
    }
    dh_free(p->samples);
    memset(p, 0, sizeof *p);
}

/* What the user gets: the public batch first, then what it owns. */
typedef struct batch_impl {
    dh_client_batch_t pub;
    size_t n_parts;
    part_t *parts;
    char server[NAME_CAP];
} batch_impl_t;

typedef struct ds_info {
    char name[NAME_CAP];
    char endpoint[ENDPOINT_CAP];
    char shm_socket[NAME_CAP];
    uint64_t generation;
} ds_info_t;

struct dh_client {
    dh_client_config_t cfg;
    char id[NAME_CAP];
    char node[NAME_CAP];
    char coord_endpoint[ENDPOINT_CAP];
    dh_profile_set_t *profiles;
    dh_sampler_t *sampler;      /* sender thread */
    dh_sampler_t *plan_sampler; /* dh_client_plan_rank_step */
    pthread_mutex_t plan_lock;
    size_t steps_per_epoch;
    uint64_t step0; /* global step of batch 0: first_epoch x steps_per_epoch */
    uint64_t total;

    void *ctx;
    dh_coordinator_t *embedded_coord;
    dh_dataserver_t *embedded_ds;
    dh_wire_socket_t *coord; /* sender thread after start */
    dh_wire_socket_t *data;  /* fetcher thread after start */
    int notice_fd;           /* fetcher thread after start; -1: none */
    arena_ref_t *arenas[MAX_ARENAS];
    size_t n_arenas; /* fetcher thread after start */

    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t consumed; /* batches returned by next() */
    uint64_t planned;  /* batches requested */
    uint64_t delivered_parts_inflight;
    part_t *ring;      /* max(prefetch, prefetch_max) x fanout parts */
    uint32_t horizon;  /* batches requested ahead of next(): prefetch, deepened up to
                        * prefetch_max when next() waits */
    double arena_used; /* adaptive prefetch: share of the local arena's slabs in use, as
                        * of the last delivery (the horizon deepens only below half) */
    size_t ring_size;
    int64_t *tokens_of; /* ring of planned batches' tokens */
    size_t tokens_ring;
    uint64_t *requested_of; /* send time of each batch's requests, ring like tokens_of */
    ds_info_t ds;           /* the local DataServer, from the coordinator */
    double s_per_token, mean_window_s;
    uint64_t last_return_ns;
    dh_client_stats_t stats;
    /* A request the coordinator dropped: its ERROR's code (0: none) and message, with which
     * next() fails rather than wait for a batch that will not come. */
    int refused;
    char refused_msg[2 * NAME_CAP];

    atomic_int stop;
    pthread_t sender, fetcher;
    bool threads_started;
};

void dh_client_config_default(dh_client_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->ranks = 1;
    cfg->batch = 1;
    cfg->fanout = 1;
    cfg->prefetch = 4;
    cfg->shuffle = 1;
    cfg->epochs = 1;
    cfg->plan_algo = DH_PLAN_ALGO_DEFAULT;
    cfg->token_plan = DH_SHARE_TOKEN_BALANCED;
    cfg->on_error = DH_ON_ERROR_RAISE;
    cfg->next_timeout_ms = -1;
    cfg->connect_timeout_ms = 30000;
    cfg->workers = 2;
    cfg->arena_bytes = (uint64_t)256 << 20;
}

const char *dh_client_id(const dh_client_t *c)
{
    return c->id;
}

const char *dh_client_coordinator(const dh_client_t *c)
{
    return c->coord_endpoint;
}

void dh_client_stats(const dh_client_t *c, dh_client_stats_t *out)
{
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    *out = c->stats;
    out->s_per_token = c->s_per_token;
    out->steps_total = c->total;
    out->prefetch_now = c->horizon;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
}

/* ---- planning (pure calls) ---- */

/* The profile rows `rank` gets at `step`, in window order (dh_plan_rank_share under the
 * client's config). Returns the count or < 0. */
static int plan_rank_step(dh_client_t *c, dh_sampler_t *sampler, uint64_t step, uint32_t rank,
                          uint32_t *rows, size_t cap)
{
    dh_share_config_t sc = {.mode = c->cfg.token_plan,
                            .algo = c->cfg.plan_algo,
                            .ranks = c->cfg.ranks,
                            .batch = c->cfg.batch,
                            .min_rows = c->cfg.fanout};
    return dh_plan_rank_share(&sc, sampler, c->profiles, step, rank, rows, cap);
}

int dh_client_plan_rank_step(dh_client_t *c, uint64_t step, uint32_t rank, uint32_t *rows,
                             size_t cap)
{
    if (rank >= c->cfg.ranks)
        return dh__set_error(DH_EINVAL, "rank %u >= ranks %u", rank, c->cfg.ranks);
    pthread_mutex_lock(&c->plan_lock);
    int rc = plan_rank_step(c, c->plan_sampler, step, rank, rows, cap);
    pthread_mutex_unlock(&c->plan_lock);
    return rc;
}

/* ---- the sender ---- */

/* DESIGN §4.2: D(b), the time until the rank calls next() for batch b (lock held). */
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
                ? plan_rank_step(c, c->sampler, c->step0 + b, c->cfg.rank, rows, cap)
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
        pthread_mutex_lock(&c->lock);
        c->stats.requests_sent++;
        pthread_mutex_unlock(&c->lock);
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

static void *sender_main(void *arg)
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

/* ---- the fetcher ---- */

/* Connects the data socket and maps the arena of the DataServer in c->ds (the caller copies
 * it under the lock into `ds`). */
static int connect_local(dh_client_t *c, const ds_info_t *ds)
{
    int fd = -1, conn = -1;
    int rc = dh__notice_connect(ds->shm_socket, &fd, &conn);
    if (rc)
        return rc;
    dh_shm_arena_t *arena = NULL;
    rc = dh_shm_arena_attach(&arena, fd);
    close(fd);
    if (rc) {
        close(conn);
        return rc;
    }
    /* Name ourselves on the notice channel; without it DELIVERs come over ZeroMQ only. */
    if (dh__notice_name(conn, c->id) != 0) {
        close(conn);
        conn = -1;
    }
    uint64_t id = dh_shm_arena_id(arena);
    bool have = false;
    for (size_t i = 0; i < c->n_arenas; i++)
        if (c->arenas[i]->id == id)
            have = true;
    if (have) {
        dh_shm_arena_destroy(&arena);
    } else {
        if (c->n_arenas == MAX_ARENAS) {
            arena_ref_drop(c->arenas[0]);
            memmove(&c->arenas[0], &c->arenas[1], (MAX_ARENAS - 1) * sizeof c->arenas[0]);
            c->n_arenas--;
        }
        arena_ref_t *a = dh_calloc(1, sizeof *a);
        if (!a) {
            dh_shm_arena_destroy(&arena);
            if (conn >= 0)
                close(conn);
            return dh__set_error(DH_ENOMEM, "out of memory for an arena mapping");
        }
        a->arena = arena;
        a->id = id;
        atomic_init(&a->refs, 1);
        c->arenas[c->n_arenas++] = a;
    }
    dh_wire_socket_t *sock = NULL;
    if ((rc = dh_wire_socket_new(&sock, c->ctx, ZMQ_DEALER, NULL)) ||
        (rc = dh__wire_set_routing_id(sock, c->id)) ||
        (rc = dh_wire_socket_connect(sock, ds->endpoint))) {
        dh_wire_socket_destroy(&sock);
        if (conn >= 0)
            close(conn);
        return rc;
    }
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = DH_WIRE_ROLE_CLIENT;
    m.hello.node = c->node;
    m.hello.name = c->id;
    m.hello.pid = (uint32_t)getpid();
    m.hello.rank = c->cfg.rank;
    if ((rc = dh_wire_send(sock, NULL, 0, &m, NULL, 0, 1000))) {
        dh_wire_socket_destroy(&sock);
        if (conn >= 0)
            close(conn);
        return rc;
    }
    dh_wire_socket_destroy(&c->data);
    c->data = sock;
    if (c->notice_fd >= 0)
        close(c->notice_fd);
    c->notice_fd = conn;
    return 0;
}

static arena_ref_t *arena_by_id(dh_client_t *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_arenas; i++)
        if (c->arenas[i]->id == id)
            return c->arenas[i];
    return NULL;
}

/* Releases the slabs of a DELIVER that will not be used. */
static void drop_deliver(dh_client_t *c, const dh_msg_deliver_t *m)
{
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dh_wire_tensor_t *t = &m->tensors[i];
        arena_ref_t *a = t->location == DH_WIRE_LOC_SHM ? arena_by_id(c, t->arena_id) : NULL;
        if (a) {
            dh_shm_handle_t h = {t->arena_id, t->offset, t->length, t->generation};
            dh_shm_arena_unref(a->arena, &h);
        }
    }
}

/* Joins the parts' tensors along dimension 0 (dh_collate_rows: the other dimensions padded
 * to the largest) into heap copies that replace parts[0]'s tensors; every part's slabs are
 * given back at once (the copies hold the data), the parts keep their samples. Runs on the
 * fetcher thread when the batch's last part arrives, so next() does not pay for the copy
 * (fanout > 1). A part whose samples all failed comes with no tensors (nothing to map): it
 * keeps its samples' slots as zero rows of every per-sample tensor (dimension 0 = the
 * samples, as frames and mask; a tensor like the synthetic payload gets no rows from it).
 * On failure the parts are left as they were and the message is returned in *why. */
static int join_parts(part_t *parts, size_t n_parts, uint64_t batch, char *why, size_t why_cap)
{
    part_t *p0 = &parts[0];
    size_t ref = 0; /* the first part with tensors: the names, dtypes and ranks */
    while (ref < n_parts && parts[ref].n_tensors == 0)
        ref++;
    dh_tensor_t out[DH__RT_MAX_TENSORS] = {0};
    int rc = 0;
    size_t n_tensors = ref < n_parts ? parts[ref].n_tensors : 0;
    const dh_tensor_t *column[n_parts ? n_parts : 1]; /* n_parts = fanout <= batch */
    int64_t gap_rows[n_parts ? n_parts : 1];
    for (size_t t = 0; t < n_tensors; t++) {
        const dh_tensor_t *o = &parts[ref].tensors[t];
        bool per_sample = o->shape[0] == (int64_t)parts[ref].n_samples;
        size_t bad = ref;
        for (size_t k = 0; k < n_parts; k++) {
            column[k] = parts[k].n_tensors ? &parts[k].tensors[t] : NULL;
            gap_rows[k] = per_sample && !column[k] ? (int64_t)parts[k].n_samples : 0;
            if (parts[k].n_tensors && parts[k].n_tensors != n_tensors) {
                rc = DH_EINVAL;
                bad = k;
                break;
            }
        }
        if (rc == 0)
            rc = dh_collate_rows(column, gap_rows, n_parts, &out[t], &bad);
        if (rc == DH_EINVAL) {
            rc = DH_EPARSE;
            snprintf(why, why_cap,
                     "batch %llu: part %zu's tensor '%.31s' does not match part %zu's",
                     (unsigned long long)batch, bad, o->name, ref);
            goto fail;
        }
        if (rc) {
            snprintf(why, why_cap, "batch %llu: out of memory joining %zu parts (%zu bytes)",
                     (unsigned long long)batch, n_parts, out[t].nbytes);
            goto fail;
        }
    }
    for (size_t k = 0; k < n_parts; k++)
        part_release_tensors(&parts[k]);
    for (size_t t = 0; t < n_tensors; t++) {
        p0->tensors[t] = out[t];
        p0->copies[t] = out[t].data;
    }
    p0->n_tensors = n_tensors;
    return 0;
fail:
    for (size_t t = 0; t < DH__RT_MAX_TENSORS; t++)
        dh_tensor_clear(&out[t]);
    return rc;
}

static void on_deliver(dh_client_t *c, dh_wire_received_t *r)
{
    dh_msg_deliver_t *m = &r->msg.deliver;
    uint64_t now = dh_clock_now_ns();
    if (m->n_tensors > DH__RT_MAX_TENSORS || strcmp(m->client_id, c->id) != 0) {
        dh_log_warn("client '%s': refused a DELIVER for '%s' with %u tensors", c->id, m->client_id,
                    m->n_tensors);
        drop_deliver(c, m);
        return;
    }
    part_t p = {0};
    p.seq = m->seq;
    uint64_t copied = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dh_wire_tensor_t *t = &m->tensors[i];
        void *ptr = NULL;
        dh_shm_handle_t h = {0};
        if (t->location == DH_WIRE_LOC_FRAME) {
            /* spilled by a DataServer whose arena stayed full: keep a copy of the frame */
            size_t size = t->tensor.nbytes;
            ptr = dh_malloc(size ? size : 1);
            if (!ptr) {
                dh_log_warn("client '%s': batch %llu: out of memory for tensor '%s'; dropped",
                            c->id, (unsigned long long)m->seq, t->tensor.name);
                part_release(&p);
                return;
            }
            if (size)
                memcpy(ptr, t->tensor.data, size);
            p.copies[i] = ptr;
            copied++;
        } else {
            arena_ref_t *a = arena_by_id(c, t->arena_id);
            h = (dh_shm_handle_t){t->arena_id, t->offset, t->length, t->generation};
            if (!a || (p.arena && p.arena != a) || dh_shm_arena_resolve(a->arena, &h, &ptr) != 0) {
                dh_log_warn("client '%s': batch %llu: tensor '%s' is not a valid handle of a "
                            "mapped arena (%s); dropped",
                            c->id, (unsigned long long)m->seq, t->tensor.name,
                            a ? dh_last_error() : "unknown arena");
                for (uint32_t k = i + 1; k < m->n_tensors; k++) {
                    const dh_wire_tensor_t *u = &m->tensors[k];
                    arena_ref_t *ua =
                        u->location == DH_WIRE_LOC_SHM ? arena_by_id(c, u->arena_id) : NULL;
                    dh_shm_handle_t uh = {u->arena_id, u->offset, u->length, u->generation};
                    if (ua)
                        dh_shm_arena_unref(ua->arena, &uh);
                }
                if (a && !(p.arena && p.arena != a))
                    dh_shm_arena_unref(a->arena, &h);
                part_release(&p);
                return;
            }
            if (!p.arena) {
                p.arena = a;
                atomic_fetch_add(&a->refs, 1);
            }
        }
        p.handles[i] = h;
        p.tensors[i] = t->tensor; /* the decoded tensor as it is, its data resolved */
        p.tensors[i].data = ptr;
        p.n_tensors++;
    }
    p.n_samples = m->n_samples;
    p.samples = m->samples; /* moved */
    m->samples = NULL;
    m->n_samples = 0;
    snprintf(p.server, NAME_CAP, "%s", m->server ? m->server : "");
    p.ready_ns = m->ready_ns;
    p.received_ns = now;
    p.ready = true;

    uint32_t parts = c->cfg.fanout;
    double arena_used = -1;
    if (c->cfg.prefetch_max > c->cfg.prefetch && p.arena) { /* O(slabs): 512 for 512 MiB */
        dh_shm_arena_stats_t as;
        dh_shm_arena_stats(p.arena->arena, &as);
        if (as.slabs_total)
            arena_used = (double)(as.slabs_used - as.slabs_reclaimable) / (double)as.slabs_total;
    }
    pthread_mutex_lock(&c->lock);
    if (arena_used >= 0)
        c->arena_used = arena_used;
    uint64_t lo = c->consumed * parts, hi = c->planned * parts;
    part_t *slot = &c->ring[p.seq % c->ring_size];
    bool dup = p.seq < lo || p.seq >= hi || (slot->ready && slot->seq == p.seq);
    if (!dup) {
        *slot = p;
        c->stats.deliveries++;
        c->stats.copied_tensors += copied;
    } else {
        c->stats.duplicates_dropped++;
    }
    /* fanout > 1: the batch's last part joins the batch, here rather than in next() */
    part_t *held = NULL;
    uint64_t batch = p.seq / parts;
    bool join = !dup && parts > 1;
    for (uint32_t k = 0; join && k < parts; k++) {
        part_t *q = &c->ring[(batch * parts + k) % c->ring_size];
        join = q->ready && q->seq == batch * parts + k && !q->joined;
    }
    if (join && !(held = dh_calloc(parts, sizeof *held))) {
        part_t *q0 = &c->ring[(batch * parts) % c->ring_size];
        q0->joined = true;
        q0->join_rc = DH_ENOMEM;
        snprintf(q0->join_error, sizeof q0->join_error,
                 "batch %llu: out of memory joining %u parts", (unsigned long long)batch, parts);
        join = false;
    }
    if (join)
        for (uint32_t k = 0; k < parts; k++) {
            /* moved out; the slots stay ready with their seq, so a duplicate of one of
             * these requests is still seen as one, and next() waits for `joined` */
            part_t *q = &c->ring[(batch * parts + k) % c->ring_size];
            held[k] = *q;
            memset(q, 0, sizeof *q);
            q->ready = true;
            q->seq = batch * parts + k;
        }
    pthread_mutex_unlock(&c->lock);
    if (join) {
        char why[sizeof held->join_error] = "";
        int rc = join_parts(held, parts, batch, why, sizeof why);
        pthread_mutex_lock(&c->lock);
        for (uint32_t k = 0; k < parts; k++) {
            part_t *q = &c->ring[(batch * parts + k) % c->ring_size];
            *q = held[k];
        }
        part_t *q0 = &c->ring[(batch * parts) % c->ring_size];
        q0->joined = true;
        q0->join_rc = rc;
        snprintf(q0->join_error, sizeof q0->join_error, "%s", why);
        pthread_mutex_unlock(&c->lock);
        dh_free(held);
    }
    /* after the unlock: a waiter woken under the lock would only block on it again */
    if (!dup)
        pthread_cond_broadcast(&c->cond);
    if (dup) {
        dh_log_debug("client '%s': duplicate delivery of request %llu dropped", c->id,
                     (unsigned long long)p.seq);
        part_release(&p);
    }
}

/* The notice channel is readable: one DELIVER packet, or the DataServer's end (it died or
 * stopped; the coordinator will name its successor). */
static void notice_receive(dh_client_t *c)
{
    dh_wire_received_t r = {0};
    int got = dh__notice_receive(c->notice_fd, c->id, &r.msg);
    if (got < 0) {
        close(c->notice_fd);
        c->notice_fd = -1;
        return;
    }
    if (got == 1 && r.msg.type == DH_MSG_DELIVER) {
        pthread_mutex_lock(&c->lock);
        c->stats.notices++;
        pthread_mutex_unlock(&c->lock);
        on_deliver(c, &r);
    }
    dh_wire_received_release(&r);
}

static void *fetcher_main(void *arg)
{
    dh_client_t *c = arg;
    dh_wire_received_t r = {0};
    uint64_t generation;
    pthread_mutex_lock(&c->lock);
    generation = c->ds.generation;
    pthread_mutex_unlock(&c->lock);
    while (!atomic_load(&c->stop)) {
        pthread_mutex_lock(&c->lock);
        ds_info_t ds = c->ds;
        pthread_mutex_unlock(&c->lock);
        if (ds.generation != generation) {
            if (connect_local(c, &ds) == 0) {
                generation = ds.generation;
                dh_log_info("client '%s': connected to local DataServer '%s'", c->id, ds.name);
            } else {
                dh_log_warn("client '%s': cannot connect to local DataServer '%s' (%s): %s", c->id,
                            ds.name, ds.endpoint, dh_last_error());
                struct timespec ts = {0, 100000000};
                nanosleep(&ts, NULL);
                continue;
            }
        }
        zmq_pollitem_t items[2] = {{dh_wire_socket_handle(c->data), 0, ZMQ_POLLIN, 0},
                                   {NULL, c->notice_fd, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, c->notice_fd >= 0 ? 2 : 1, 50) <= 0)
            continue;
        if (c->notice_fd >= 0 && (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            notice_receive(c);
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        int rc = dh_wire_recv(c->data, 0, &r);
        if (rc == DH_EPARSE) {
            dh_log_warn("client '%s': dropped a malformed message: %s", c->id, dh_last_error());
            continue;
        }
        if (rc)
            continue;
        if (r.msg.type == DH_MSG_DELIVER)
            on_deliver(c, &r);
        dh_wire_received_release(&r);
    }
    return NULL;
}

/* ---- creation ---- */

static int register_with_coordinator(dh_client_t *c)
{
    int rc;
    /* Asking again (the named DataServer was gone) replaces the socket of the last ask: one
     * left open would keep zmq_ctx_term, and so dh_client_destroy, waiting forever. */
    dh_wire_socket_destroy(&c->coord);
    if ((rc = dh_wire_socket_new(&c->coord, c->ctx, ZMQ_DEALER, NULL)) ||
        (rc = dh__wire_set_routing_id(c->coord, c->id)) ||
        (rc = dh_wire_socket_connect(c->coord, c->coord_endpoint)))
        return rc;
    uint64_t start = dh_clock_now_ns();
    dh_wire_received_t r = {0};
    char last[256] = "no answer";
    for (;;) {
        dh_msg_t m = {.type = DH_MSG_HELLO};
        m.hello.role = DH_WIRE_ROLE_CLIENT;
        m.hello.node = c->node;
        m.hello.name = c->id;
        m.hello.pid = (uint32_t)getpid();
        m.hello.rank = c->cfg.rank;
        dh_wire_send(c->coord, NULL, 0, &m, NULL, 0, 200);
        rc = dh_wire_recv(c->coord, 200, &r);
        if (rc == 0 && r.msg.type == DH_MSG_HELLO) {
            snprintf(c->ds.name, NAME_CAP, "%s", r.msg.hello.name);
            snprintf(c->ds.endpoint, ENDPOINT_CAP, "%s", r.msg.hello.endpoint);
            snprintf(c->ds.shm_socket, NAME_CAP, "%s", r.msg.hello.shm_socket);
            c->ds.generation = 1;
            dh_wire_received_release(&r);
            return 0;
        }
        if (rc == 0 && r.msg.type == DH_MSG_ERROR)
            snprintf(last, sizeof last, "%s", r.msg.error.message);
        dh_wire_received_release(&r);
        if (c->cfg.connect_timeout_ms >= 0 &&
            dh_clock_elapsed_s(start, dh_clock_now_ns()) * 1000 > c->cfg.connect_timeout_ms)
            return dh__set_error(DH_EAGAIN,
                                 "client '%s': the coordinator %s gave no local DataServer for "
                                 "node '%s' within %d ms (%s)",
                                 c->id, c->coord_endpoint, c->node, c->cfg.connect_timeout_ms,
                                 last);
        /* Drain a late reply before asking again (the loop waits 200 ms a round). */
    }
}

static int start_embedded(dh_client_t *c, const dh_client_config_t *cfg)
{
    static atomic_uint counter;
    unsigned n = atomic_fetch_add(&counter, 1);
    char coord_ep[128], data_ep[128];
    snprintf(coord_ep, sizeof coord_ep, "inproc://datahelix-coordinator-%u", n);
    snprintf(data_ep, sizeof data_ep, "inproc://datahelix-data-%u", n);
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = coord_ep;
    cc.zmq_ctx = c->ctx;
    if (cfg->policy && dh_policy_from_name(cfg->policy, &cc.place.policy) != 0)
        return dh__set_error(DH_EINVAL, "client: unknown placement policy '%s'", cfg->policy);
    int rc = dh_coordinator_new(&c->embedded_coord, &cc);
    if (rc)
        return rc;
    snprintf(c->coord_endpoint, sizeof c->coord_endpoint, "%s", coord_ep);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = coord_ep;
    dc.node = c->node;
    dc.workers = c->cfg.workers ? c->cfg.workers : 2;
    dc.pipeline_path = cfg->pipeline_path;
    dc.pipeline_json = cfg->pipeline_json;
    dc.arena_bytes = c->cfg.arena_bytes;
    dc.data_listen = data_ep;
    dc.zmq_ctx = c->ctx;
    char name[NAME_CAP + 32];
    snprintf(name, sizeof name, "%.100s-embedded-%u", c->node, n);
    dc.name = name;
    if ((rc = dh_dataserver_new(&c->embedded_ds, &dc)))
        return rc;
    if ((rc = dh_coordinator_start(c->embedded_coord)) ||
        (rc = dh_dataserver_start(c->embedded_ds)))
        return rc;
    return 0;
}

static int check_config(const dh_client_config_t *cfg)
{
    if (!cfg->profiles || !cfg->profiles[0])
        return dh__set_error(DH_EINVAL, "client: no profile file (profiles)");
    if (cfg->ranks == 0 || cfg->rank >= cfg->ranks)
        return dh__set_error(DH_EINVAL, "client: rank %u must be below ranks %u", cfg->rank,
                             cfg->ranks);
    if (cfg->batch == 0 || cfg->batch > 4096)
        return dh__set_error(DH_EINVAL, "client: batch must be in [1, 4096], got %u", cfg->batch);
    if ((unsigned)cfg->token_plan >= DH_SHARE_MODE_COUNT)
        return dh__set_error(DH_EINVAL,
                             "client: token_plan must be 0 (sample count), 1 (token-balanced, "
                             "fixed batch) or 2 (token-balanced packing), got %d",
                             (int)cfg->token_plan);
    if (cfg->fanout == 0 || cfg->fanout > cfg->batch)
        return dh__set_error(DH_EINVAL, "client: fanout must be in [1, batch=%u], got %u",
                             cfg->batch, cfg->fanout);
    if (cfg->prefetch == 0 || cfg->prefetch > 1024)
        return dh__set_error(DH_EINVAL, "client: prefetch must be in [1, 1024], got %u",
                             cfg->prefetch);
    if (cfg->prefetch_max && (cfg->prefetch_max < cfg->prefetch || cfg->prefetch_max > 1024))
        return dh__set_error(DH_EINVAL,
                             "client: prefetch_max must be 0 or in [prefetch=%u, 1024], got %u",
                             cfg->prefetch, cfg->prefetch_max);
    return 0;
}

int dh_client_new(dh_client_t **out, const dh_client_config_t *cfg)
{
    *out = NULL;
    int rc = check_config(cfg);
    if (rc)
        return rc;
    dh_client_t *c = dh_calloc(1, sizeof *c);
    if (!c)
        return dh__set_error(DH_ENOMEM, "out of memory for a client");
    c->cfg = *cfg;
    c->notice_fd = -1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->plan_lock, NULL);
    /* next() waits with a deadline on CLOCK_MONOTONIC: a wall-clock step (NTP, a suspended
     * VM) neither ends the wait early nor stretches it. */
    pthread_condattr_t cond_attr;
    pthread_condattr_init(&cond_attr);
    pthread_condattr_setclock(&cond_attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &cond_attr);
    pthread_condattr_destroy(&cond_attr);
    if (cfg->node && cfg->node[0])
        snprintf(c->node, sizeof c->node, "%s", cfg->node);
    else
        dh__wire_hostname(c->node, sizeof c->node);
    if (cfg->client_id && cfg->client_id[0])
        snprintf(c->id, sizeof c->id, "%s", cfg->client_id);
    else
        snprintf(c->id, sizeof c->id, "%.96s-rank%u-%d", c->node, cfg->rank, (int)getpid());
    c->cfg.node = c->node;
    c->cfg.client_id = c->id;
    c->cfg.coordinator = NULL;
    c->cfg.profiles = NULL;
    c->cfg.pipeline_path = NULL;
    c->cfg.pipeline_json = NULL;
    c->cfg.policy = NULL;

    if ((rc = dh_profile_set_new(&c->profiles)) ||
        (rc = dh_profile_set_load(c->profiles, cfg->profiles)))
        goto fail;
    size_t n = dh_profile_set_count(c->profiles);
    size_t per_step = (size_t)cfg->ranks * cfg->batch;
    if (n < per_step) {
        rc = dh__set_error(DH_EINVAL, "%s: %zu samples, fewer than one step's %u ranks x %u",
                           cfg->profiles, n, cfg->ranks, cfg->batch);
        goto fail;
    }
    if ((rc = dh_sampler_new(&c->sampler, n, per_step, cfg->seed, cfg->shuffle)) ||
        (rc = dh_sampler_new(&c->plan_sampler, n, per_step, cfg->seed, cfg->shuffle)))
        goto fail;
    c->steps_per_epoch = dh_sampler_steps_per_epoch(c->sampler);
    c->step0 = (uint64_t)c->steps_per_epoch * cfg->first_epoch;
    c->total = cfg->epochs ? (uint64_t)c->steps_per_epoch * cfg->epochs : UINT64_MAX;
    if (cfg->max_steps && cfg->max_steps < c->total)
        c->total = cfg->max_steps;
    uint32_t depth = cfg->prefetch_max > cfg->prefetch ? cfg->prefetch_max : cfg->prefetch;
    c->horizon = cfg->prefetch;
    c->ring_size = (size_t)depth * cfg->fanout;
    c->tokens_ring = (size_t)depth + 2;
    c->ring = dh_calloc(c->ring_size, sizeof *c->ring);
    c->tokens_of = dh_calloc(c->tokens_ring, sizeof *c->tokens_of);
    c->requested_of = dh_calloc(c->tokens_ring, sizeof *c->requested_of);
    if (!c->ring || !c->tokens_of || !c->requested_of) {
        rc = dh__set_error(DH_ENOMEM, "out of memory for the prefetch ring");
        goto fail;
    }
    c->ctx = cfg->zmq_ctx ? cfg->zmq_ctx : zmq_ctx_new();
    if (!c->ctx) {
        rc = dh__set_error(DH_ENOMEM, "client: zmq_ctx_new failed");
        goto fail;
    }
    if (cfg->coordinator && cfg->coordinator[0]) {
        snprintf(c->coord_endpoint, sizeof c->coord_endpoint, "%s", cfg->coordinator);
    } else if ((rc = start_embedded(c, cfg))) {
        goto fail;
    }
    /* The server the coordinator names may have just died (it is listed until it misses
     * its heartbeats, or die while we connect): a refused or reset arena socket means ask
     * again, within connect_timeout. */
    for (uint64_t t0 = dh_clock_now_ns();;) {
        if ((rc = register_with_coordinator(c)))
            goto fail;
        rc = connect_local(c, &c->ds);
        if (rc == 0)
            break;
        bool gone = rc == -ECONNREFUSED || rc == -ENOENT || rc == -ECONNRESET || rc == -EPIPE ||
                    rc == DH_EEOF;
        if (!gone || (cfg->connect_timeout_ms >= 0 &&
                      dh_clock_elapsed_s(t0, dh_clock_now_ns()) * 1000 > cfg->connect_timeout_ms))
            goto fail;
        dh_log_warn("client '%s': %s; asking the coordinator again", c->id, dh_last_error());
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    dh_log_info("client '%s': rank %u/%u, node '%s', %llu batches of %u (fanout %u, prefetch "
                "%u), local DataServer '%s'",
                c->id, cfg->rank, cfg->ranks, c->node, (unsigned long long)c->total, cfg->batch,
                cfg->fanout, cfg->prefetch, c->ds.name);
    c->last_return_ns = dh_clock_now_ns();
    int e = pthread_create(&c->fetcher, NULL, fetcher_main, c);
    if (e == 0) {
        e = pthread_create(&c->sender, NULL, sender_main, c);
        if (e) {
            atomic_store(&c->stop, 1);
            pthread_join(c->fetcher, NULL);
        }
    }
    if (e) {
        rc = dh__set_error(-e, "client: pthread_create: %s", strerror(e));
        goto fail;
    }
    c->threads_started = true;
    *out = c;
    return 0;
fail:
    dh_client_destroy(&c);
    return rc;
}

/* ---- next ---- */

static void batch_free(batch_impl_t *b)
{
    for (size_t i = 0; i < b->n_parts; i++)
        part_release(&b->parts[i]);
    dh_free(b->parts);
    dh_free(b->pub.samples);
    dh_free(b);
}

int dh_client_tensor_arena(const dh_client_batch_t *pub, size_t t, const void **base, size_t *size)
{
    const batch_impl_t *b = (const batch_impl_t *)pub;
    *base = NULL;
    *size = 0;
    if (t >= pub->n_tensors)
        return dh__set_error(DH_EINVAL, "batch %llu has %zu tensors, not %zu",
                             (unsigned long long)pub->index, pub->n_tensors, t + 1);
    if (b->n_parts != 1 || !b->parts[0].arena || !b->parts[0].handles[t].arena_id)
        return 0;
    dh_shm_arena_mapping(b->parts[0].arena->arena, base, size);
    return 1;
}

void dh_client_batch_release(dh_client_batch_t **pb)
{
    if (!pb || !*pb)
        return;
    batch_free((batch_impl_t *)*pb);
    *pb = NULL;
}

int dh_client_next(dh_client_t *c, dh_client_batch_t **out)
{
    *out = NULL;
    uint64_t entry = dh_clock_now_ns();
    uint32_t parts = c->cfg.fanout;
    pthread_mutex_lock(&c->lock);
    if (c->consumed >= c->total) {
        pthread_mutex_unlock(&c->lock);
        return DH_EEOF;
    }
    uint64_t b = c->consumed;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline); /* the condvar's clock (dh_client_new) */
    if (c->cfg.next_timeout_ms >= 0) {
        deadline.tv_sec += c->cfg.next_timeout_ms / 1000;
        deadline.tv_nsec += (long)(c->cfg.next_timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    for (;;) {
        bool all = true;
        for (uint32_t p = 0; p < parts; p++) {
            part_t *s = &c->ring[(b * parts + p) % c->ring_size];
            if (!s->ready || s->seq != b * parts + p || (parts > 1 && p == 0 && !s->joined))
                all = false;
        }
        if (all)
            break;
        if (c->refused) {
            pthread_mutex_unlock(&c->lock);
            return dh__set_error(c->refused, "client '%s': batch %llu will not come: %s", c->id,
                                 (unsigned long long)b, c->refused_msg);
        }
        if (c->cfg.next_timeout_ms >= 0) {
            if (pthread_cond_timedwait(&c->cond, &c->lock, &deadline) == ETIMEDOUT) {
                pthread_mutex_unlock(&c->lock);
                return dh__set_error(DH_EAGAIN,
                                     "client '%s': batch %llu not ready within %d ms (local "
                                     "DataServer '%s')",
                                     c->id, (unsigned long long)b, c->cfg.next_timeout_ms,
                                     c->ds.name);
            }
        } else {
            pthread_cond_wait(&c->cond, &c->lock);
        }
    }
    batch_impl_t *bi = dh_calloc(1, sizeof *bi);
    part_t *taken = bi ? dh_calloc(parts, sizeof *taken) : NULL;
    if (!bi || !taken) {
        pthread_mutex_unlock(&c->lock);
        dh_free(bi);
        return dh__set_error(DH_ENOMEM, "out of memory for a batch");
    }
    for (uint32_t p = 0; p < parts; p++) {
        part_t *s = &c->ring[(b * parts + p) % c->ring_size];
        taken[p] = *s;
        memset(s, 0, sizeof *s);
    }
    /* The compute window just measured: from the previous return to this call. */
    if (b > 0) {
        double window = dh_clock_elapsed_s(c->last_return_ns, entry);
        int64_t tokens = c->tokens_of[(b - 1) % c->tokens_ring];
        c->mean_window_s =
            c->mean_window_s > 0 ? dh_cost_ewma(c->mean_window_s, window, 0.2) : window;
        if (tokens > 0) {
            double spt = window / (double)tokens;
            c->s_per_token = c->s_per_token > 0 ? dh_cost_ewma(c->s_per_token, spt, 0.2) : spt;
        }
    }
    uint64_t requested_ns = c->requested_of[b % c->tokens_ring];
    c->consumed++;
    uint64_t now = dh_clock_now_ns();
    c->last_return_ns = now;
    double waited = dh_clock_elapsed_s(entry, now);
    c->stats.wait_s += waited;
    uint64_t arrived_ns = 0;
    for (uint32_t p = 0; p < parts; p++)
        if (taken[p].received_ns > arrived_ns)
            arrived_ns = taken[p].received_ns;
    double window_s = c->mean_window_s;
    double slack_s = arrived_ns && entry > arrived_ns ? dh_clock_elapsed_s(arrived_ns, entry) : 0;
    uint32_t was = c->horizon;
    c->horizon = dh_deadline_prefetch_horizon(c->horizon, c->cfg.prefetch_max, b, waited, slack_s,
                                              window_s, c->arena_used);
    uint32_t grown = c->horizon != was ? c->horizon : 0;
    pthread_mutex_unlock(&c->lock);
    if (grown)
        dh_log_info("client '%s': batch %llu waited %.3f s (compute window %.3f s): prefetch "
                    "%u batches ahead now (at most %u)",
                    c->id, (unsigned long long)b, waited, window_s, grown, c->cfg.prefetch_max);

    bi->parts = taken;
    bi->n_parts = parts;
    bi->pub.index = b;
    bi->pub.step = c->step0 + b;
    bi->pub.epoch = (uint32_t)(c->steps_per_epoch ? (c->step0 + b) / c->steps_per_epoch : 0);
    bi->pub.wait_s = waited;
    bi->pub.requested_ns = requested_ns;
    for (uint32_t p = 0; p < parts; p++)
        if (taken[p].ready_ns > bi->pub.ready_ns)
            bi->pub.ready_ns = taken[p].ready_ns;
    snprintf(bi->server, NAME_CAP, "%s", taken[0].server);
    bi->pub.server = bi->server;
    size_t n_samples = 0;
    for (uint32_t p = 0; p < parts; p++)
        n_samples += taken[p].n_samples;
    bi->pub.samples = dh_calloc(n_samples ? n_samples : 1, sizeof *bi->pub.samples);
    int rc = 0;
    if (!bi->pub.samples) {
        rc = dh__set_error(DH_ENOMEM, "out of memory for a batch");
        goto fail;
    }
    for (uint32_t p = 0; p < parts; p++)
        for (uint32_t i = 0; i < taken[p].n_samples; i++) {
            const dh_wire_sample_result_t *r = &taken[p].samples[i];
            dh_client_sample_t *o = &bi->pub.samples[bi->pub.n_samples++];
            o->id = r->id;
            o->tokens = r->tokens;
            o->error = r->status;
            o->error_message = r->status ? r->error : NULL;
            bi->pub.tokens += r->tokens;
            if (r->status)
                bi->pub.failed++;
        }
    if (taken[0].join_rc) { /* fanout > 1 and the parts could not be joined */
        rc = dh__set_error(taken[0].join_rc, "client '%s': %s", c->id, taken[0].join_error);
        goto fail;
    }
    /* one part, or parts[0] holds the joined batch (the others only their samples) */
    bi->pub.n_tensors = taken[0].n_tensors;
    bi->pub.tensors = taken[0].tensors; /* the batch owns its parts: no copy */
    size_t bytes = 0;
    for (size_t t = 0; t < bi->pub.n_tensors; t++)
        bytes += bi->pub.tensors[t].nbytes;
    pthread_mutex_lock(&c->lock);
    c->stats.batches++;
    c->stats.samples += bi->pub.n_samples;
    c->stats.samples_failed += bi->pub.failed;
    c->stats.bytes_delivered += bytes;
    pthread_mutex_unlock(&c->lock);
    if (bi->pub.failed && c->cfg.on_error == DH_ON_ERROR_RAISE) {
        for (size_t i = 0; i < bi->pub.n_samples; i++)
            if (bi->pub.samples[i].error) {
                rc = dh__set_error(bi->pub.samples[i].error, "%s",
                                   bi->pub.samples[i].error_message
                                       ? bi->pub.samples[i].error_message
                                       : dh_strerror(bi->pub.samples[i].error));
                break;
            }
        goto fail;
    }
    *out = &bi->pub;
    return 0;
fail:
    batch_free(bi);
    return rc;
}

void dh_client_destroy(dh_client_t **pc)
{
    if (!pc || !*pc)
        return;
    dh_client_t *c = *pc;
    atomic_store(&c->stop, 1);
    if (c->threads_started) {
        pthread_join(c->sender, NULL);
        pthread_join(c->fetcher, NULL);
    }
    dh_msg_t bye = {.type = DH_MSG_GOODBYE};
    if (c->coord)
        dh_wire_send(c->coord, NULL, 0, &bye, NULL, 0, 0);
    if (c->data)
        dh_wire_send(c->data, NULL, 0, &bye, NULL, 0, 0);
    for (size_t i = 0; c->ring && i < c->ring_size; i++)
        if (c->ring[i].ready)
            part_release(&c->ring[i]);
    dh_free(c->ring);
    dh_free(c->tokens_of);
    dh_free(c->requested_of);
    dh_wire_socket_destroy(&c->coord);
    dh_wire_socket_destroy(&c->data);
    if (c->notice_fd >= 0)
        close(c->notice_fd);
    for (size_t i = 0; i < c->n_arenas; i++)
        arena_ref_drop(c->arenas[i]);
    dh_dataserver_destroy(&c->embedded_ds);
    dh_coordinator_destroy(&c->embedded_coord);
    if (c->ctx && !c->cfg.zmq_ctx)
        zmq_ctx_term(c->ctx);
    dh_sampler_destroy(&c->sampler);
    dh_sampler_destroy(&c->plan_sampler);
    dh_profile_set_destroy(&c->profiles);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->plan_lock);
    pthread_cond_destroy(&c->cond);
    dh_free(c);
    *pc = NULL;
}
