/* client.c: one training rank's client (docs/design.md §2, §4.2, §4.4, §5; docs/runtime.md).
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
 *
 * This file is the client's life cycle (config, creation, embedded servers, destroy),
 * next() and the batches it returns (its planning calls: client_plan.c); the sender thread is
 * client_send.c, the fetcher thread client_fetch.c.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
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
#include "datahelix/place.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/sampler.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"
#include "wire/wire_lib.h"

void dh__client_arena_ref_drop(arena_ref_t *a)
{
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
        dh_shm_arena_destroy(&a->arena);
        dh_free(a);
    }
}

/* Gives back a part's slabs and copies, keeping its samples (a joined batch's parts). */
void dh__client_part_release_tensors(part_t *p)
{
    for (size_t i = 0; i < p->n_tensors; i++) {
        if (p->handles[i].arena_id && p->arena)
            dh_shm_arena_unref(p->arena->arena, &p->handles[i]);
        dh_free(p->copies[i]);
        p->copies[i] = NULL;
        p->handles[i] = (dh_shm_handle_t){0};
    }
    dh__client_arena_ref_drop(p->arena);
    p->arena = NULL;
    p->n_tensors = 0;
}

void dh__client_part_release(part_t *p)
{
    dh__client_part_release_tensors(p);
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
    cfg->coordinator_timeout_ms = 60000;
    cfg->connect_timeout_ms = 30000;
    cfg->workers = 2;
    cfg->arena_bytes = 0; /* what the horizon needs, within arena_budget_bytes */
    cfg->rebalance.buffer_size = 64;
    cfg->rebalance.min_gain = 0.05;
    cfg->rebalance.move_s_per_B = 8 / 25e9; /* a 25 Gb/s link */
    cfg->rebalance.round_timeout_ms = 10000;
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
    memset(out, 0, sizeof *out);
    const dh__client_counters_t *in = &c->counters;
    DH__CLIENT_STATS(DH__STAT_READ)
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    out->s_per_token = c->s_per_token;
    out->steps_total = c->total;
    out->prefetch_now = c->horizon;
    out->bytes_outstanding = c->bytes_outstanding;
    out->bytes_outstanding_peak = c->bytes_outstanding_peak;
    out->byte_budget = c->byte_budget;
    dh__client_rb_stats(c, out);
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
}

/* ---- planning (pure calls) ---- */

bool dh__client_slots(const dh_client_t *c)
{
    return c->cfg.fanout > c->cfg.batch;
}

/* ---- creation ---- */

dh_msg_t dh__client_hello(dh_client_t *c)
{
    dh_msg_t m = {.type = DH_MSG_HELLO};
    m.hello.role = DH_WIRE_ROLE_CLIENT;
    m.hello.node = c->node;
    m.hello.name = c->id;
    m.hello.pid = (uint32_t)getpid();
    m.hello.rank = c->cfg.rank;
    return m;
}

static int register_with_coordinator(dh_client_t *c)
{
    int rc;
    /* Asking again (the named DataServer was gone) replaces the socket of the last ask: one
     * left open would keep zmq_ctx_term, and so dh_client_destroy, waiting forever. */
    dh_wire_socket_destroy(&c->coord);
    dh_wire_socket_opts_t opts = {.keys = c->keys};
    if ((rc = dh_wire_socket_new(&c->coord, c->ctx, ZMQ_DEALER, &opts)) ||
        (rc = dh__wire_set_routing_id(c->coord, c->id)))
        return rc;
    dh__wire_set_peer_role(c->coord, "coordinator");
    if ((rc = dh_wire_socket_connect(c->coord, c->coord_endpoint)))
        return rc;
    uint64_t start = dh_clock_now_ns();
    dh_wire_received_t r = {0};
    char last[256] = "no answer";
    long pause_ms = 5; /* after an answer that is not yet a DataServer: 5, 10, ... 200 ms */
    for (;;) {
        dh_msg_t m = dh__client_hello(c);
        dh_wire_send(c->coord, NULL, 0, &m, NULL, 0, 200);
        rc = dh_wire_recv(c->coord, 200, &r);
        if (rc == 0 && r.msg.type == DH_MSG_HELLO) {
            c->coord_incarnation = r.msg.hello.incarnation;
            c->coord_heard_ns = c->coord_pinged_ns = dh_clock_now_ns();
            snprintf(c->ds.name, NAME_CAP, "%s", r.msg.hello.name);
            snprintf(c->ds.endpoint, ENDPOINT_CAP, "%s", r.msg.hello.endpoint);
            snprintf(c->ds.shm_socket, NAME_CAP, "%s", r.msg.hello.shm_socket);
            c->ds.generation = 1;
            dh_wire_received_release(&r);
            return 0;
        }
        bool answered = rc == 0;
        if (rc == 0 && r.msg.type == DH_MSG_ERROR)
            snprintf(last, sizeof last, "%s", r.msg.error.message);
        dh_wire_received_release(&r);
        if (rc == DH_EAUTH || rc == -EPROTO) /* refused keys, or no coordinator: no retry heals */
            return rc;
        if (c->cfg.connect_timeout_ms >= 0 &&
            dh_clock_elapsed_s(start, dh_clock_now_ns()) * 1000 > c->cfg.connect_timeout_ms) {
            /* Name the cause: nothing listens (refused, unknown host), something else does,
             * or the coordinator is there and has no DataServer for this node. */
            if ((rc = dh__wire_diagnose(c->coord, 1000))) {
                char why[512]; /* copied: the message is rewritten from the same buffer */
                snprintf(why, sizeof why, "%s", dh_last_error());
                return dh__set_error(rc, "client '%s': %s; waited connect_timeout %d ms", c->id,
                                     why, c->cfg.connect_timeout_ms);
            }
            return dh__set_error(DH_EAGAIN,
                                 "client '%s': the coordinator %s gave no local DataServer for "
                                 "node '%s' within %d ms (%s)",
                                 c->id, c->coord_endpoint, c->node, c->cfg.connect_timeout_ms,
                                 last);
        }
        /* An answer comes at once ("no local DataServer for this node" while it registers):
         * without a pause this loop sent HELLOs as fast as the coordinator answered them
         * (about 60,000 allocations in 100 ms, found by the allocation sweep). Back off,
         * doubling to the 200 ms a silent round takes. A late reply is drained by the next
         * round's receive. */
        if (answered) {
            struct timespec pause = {.tv_sec = 0, .tv_nsec = pause_ms * 1000000L};
            nanosleep(&pause, NULL);
            pause_ms = pause_ms * 2 > 200 ? 200 : pause_ms * 2;
        }
    }
}

/* The embedded DataServer's arena: arena_bytes when set, else what the prefetch horizon
 * needs (its depth x batch x the largest sample's out_bytes; the one rank of this node),
 * bounded by the memory budget, which must hold one batch (dh_deadline_arena_size). */
static int embedded_arena_bytes(dh_client_t *c, uint64_t *out)
{
    if (c->cfg.arena_bytes) {
        *out = c->cfg.arena_bytes;
        return 0;
    }
    uint64_t largest = 0;
    for (size_t i = 0; i < dh_profile_set_count(c->profiles); i++) {
        int64_t b = dh_profile_set_row(c->profiles, i)->out_bytes;
        largest = b > 0 && (uint64_t)b > largest ? (uint64_t)b : largest;
    }
    uint32_t depth = c->cfg.prefetch_max > c->cfg.prefetch ? c->cfg.prefetch_max : c->cfg.prefetch;
    /* packing may give a rank more rows than batch: the horizon's bytes, not its rows */
    double need = (double)depth * c->cfg.batch * (double)largest / (1 - DH_DEADLINE_ARENA_MARGIN);
    uint64_t budget =
        c->cfg.arena_budget_bytes ? c->cfg.arena_budget_bytes : dh_arena_budget_default();
    /* a floor of 64 MiB: the arena also holds what the pipeline adds (masks, metadata) */
    uint64_t want = need < (double)((uint64_t)64 << 20) ? (uint64_t)64 << 20 : (uint64_t)need;
    int rc = dh_deadline_arena_size(1, c->cfg.batch, largest, want, budget, out);
    if (rc) {
        char why[512]; /* copied: the message is rewritten from the same buffer */
        snprintf(why, sizeof why, "%s", dh_last_error());
        return dh__set_error(rc, "client: %s", why);
    }
    return 0;
}

static int start_embedded(dh_client_t *c, const dh_client_config_t *cfg)
{
    static atomic_uint counter;
    unsigned n = atomic_fetch_add(&counter, 1);
    dh_cluster_config_t cc;
    dh_cluster_config_default(&cc);
    cc.zmq_ctx = c->ctx;
    if (cfg->policy && dh_policy_from_name(cfg->policy, &cc.policy) != 0)
        return dh__set_error(DH_EINVAL, "client: unknown placement policy '%s'", cfg->policy);
    cc.pipeline_path = cfg->pipeline_path;
    cc.pipeline_json = cfg->pipeline_json;
    char name[NAME_CAP + 32];
    snprintf(name, sizeof name, "%.100s-embedded-%u", c->node, n);
    dh_cluster_server_t server = {
        .role = DH_DS_LOCAL,
        .node = c->node,
        .name = name,
        .workers = c->cfg.workers ? c->cfg.workers : 2,
    };
    int rc = embedded_arena_bytes(c, &server.arena_bytes);
    if (rc)
        return rc;
    cc.servers = &server;
    cc.n_servers = 1;
    /* no wait for its HELLO: the client's own HELLO waits until the coordinator names it */
    if ((rc = dh_cluster_new(&c->embedded, &cc)) || (rc = dh_cluster_start(c->embedded)))
        return rc;
    snprintf(c->coord_endpoint, sizeof c->coord_endpoint, "%s", dh_cluster_endpoint(c->embedded));
    if (!c->cfg.out_bytes_scale) { /* its pipeline says how big the outputs are */
        dh__rt_pipeline_t p;
        if (dh__rt_pipeline_load(cfg->pipeline_json, cfg->pipeline_path, &p) == 0)
            c->cfg.out_bytes_scale = p.synthetic ? p.bytes_scale : 1;
    }
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
    /* Tier 2 with packing may take more parts than rows (slots): a rank's batch has `fanout`
     * slots of one sample each, the rows it was planned filling the first and the rest
     * empty, so a sample can move to another rank's empty slot (a packing move). */
    bool slots = cfg->rebalance.enabled && cfg->token_plan == DH_SHARE_TOKEN_PACKED;
    uint32_t most = slots ? cfg->ranks * cfg->batch : cfg->batch;
    if (cfg->fanout == 0 || (cfg->fanout > cfg->batch && cfg->fanout != most))
        return dh__set_error(
            DH_EINVAL, "client: fanout must be in [1, batch=%u]%s, got %u", cfg->batch,
            slots ? ", or ranks x batch (one-sample slots for tier 2)" : "", cfg->fanout);
    if (cfg->keep_tail && cfg->rebalance.enabled)
        return dh__set_error(DH_EINVAL, "client: keep_tail (drop_last=False) does not work with "
                                        "tier 2 (rebalance): its rounds trade full batches");
    /* No side door around CURVE (docs/security.md, "What travels where"): exchange_fn
     * carries the tier-2 payloads that move across nodes outside the encrypted data plane. */
    if (cfg->rebalance.enabled && cfg->rebalance.exchange_fn && cfg->keys_dir && cfg->keys_dir[0] &&
        !cfg->rebalance.allow_unencrypted_exchange)
        return dh__set_error(DH_EINVAL,
                             "client: rebalance.exchange_fn with CURVE keys (keys_dir '%s') "
                             "carries the tier-2 payloads that move across nodes outside "
                             "CURVE, unencrypted; leave it NULL (the DataServers then forward "
                             "them over CURVE) or opt in with "
                             "rebalance.allow_unencrypted_exchange = 1 (docs/security.md)",
                             cfg->keys_dir);
    if (cfg->prefetch == 0 || cfg->prefetch > 1024)
        return dh__set_error(DH_EINVAL, "client: prefetch must be in [1, 1024], got %u",
                             cfg->prefetch);
    if (cfg->prefetch_max && (cfg->prefetch_max < cfg->prefetch || cfg->prefetch_max > 1024))
        return dh__set_error(DH_EINVAL,
                             "client: prefetch_max must be 0 or in [prefetch=%u, 1024], got %u",
                             cfg->prefetch, cfg->prefetch_max);
    if (!(cfg->emulate_copy_s_per_B >= 0 && cfg->emulate_copy_s_per_B < 1))
        return dh__set_error(DH_EINVAL, "client: emulate_copy_s_per_B must be in [0, 1), got %g",
                             cfg->emulate_copy_s_per_B);
    return 0;
}

/* The prefetch's byte budget: this rank's share of the arena it mapped at creation (its
 * slabs), among local_ranks (or all ranks). A share short of one batch of the largest
 * samples is said once: the horizon is then one batch, and workers may wait for slabs. */
static void set_byte_budget(dh_client_t *c)
{
    uint64_t capacity = 0;
    for (size_t i = 0; i < c->n_arenas; i++) {
        dh_shm_arena_stats_t as;
        dh_shm_arena_stats(c->arenas[i]->arena, &as);
        if (as.slabs_total * as.slab_size > capacity) {
            capacity = as.slabs_total * as.slab_size;
            c->slab_bytes = (double)as.slab_size;
        }
    }
    if (!capacity)
        return;
    uint32_t local = c->cfg.local_ranks ? c->cfg.local_ranks : c->cfg.ranks;
    c->byte_budget = dh_deadline_rank_budget(capacity, local);
    uint64_t largest = 0;
    for (size_t i = 0; i < dh_profile_set_count(c->profiles); i++) {
        int64_t b = dh_profile_set_row(c->profiles, i)->out_bytes;
        largest = b > 0 && (uint64_t)b > largest ? (uint64_t)b : largest;
    }
    double step = (double)c->cfg.batch * (double)largest;
    c->largest_batch = step * c->cfg.out_bytes_scale; /* 0: not known */
    if (step > c->byte_budget)
        dh_log_warn("client '%s': its share of the local arena (%.1f MiB of %.1f MiB among %u "
                    "ranks) is less than one batch of the largest samples (batch %u x %.1f "
                    "MiB): one batch at a time; give the DataServer a larger arena "
                    "(--arena-budget / --arena-mb)",
                    c->id, c->byte_budget / 1048576.0, (double)capacity / 1048576.0, local,
                    c->cfg.batch, (double)largest / 1048576.0);
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
    if (cfg->client_id && cfg->client_id[0]) {
        snprintf(c->id, sizeof c->id, "%s", cfg->client_id);
    } else {
        /* Unique per client, not only per process: a DataLoader opens a client per epoch,
         * and a DataServer remembers a name that said GOODBYE (it drops that name's late
         * batches), so a new client under its predecessor's name could have a batch that
         * came before its own HELLO dropped as the old one's, and wait for it forever
         * (found by tests/soak/memsoak.py). The first client of a process keeps the plain
         * name. */
        static atomic_uint opened;
        unsigned n = atomic_fetch_add(&opened, 1);
        if (n == 0)
            snprintf(c->id, sizeof c->id, "%.96s-rank%u-%d", c->node, cfg->rank, (int)getpid());
        else
            snprintf(c->id, sizeof c->id, "%.96s-rank%u-%d.%u", c->node, cfg->rank, (int)getpid(),
                     n);
    }
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
        (rc = dh_sampler_new(&c->plan_sampler, n, per_step, cfg->seed, cfg->shuffle)) ||
        (rc = dh_sampler_set_drop_last(c->sampler, !cfg->keep_tail, cfg->ranks)) ||
        (rc = dh_sampler_set_drop_last(c->plan_sampler, !cfg->keep_tail, cfg->ranks)))
        goto fail;
    if (cfg->first_sample > n) {
        rc = dh__set_error(DH_EINVAL, "%s: first_sample %llu is past the epoch's %zu samples",
                           cfg->profiles, (unsigned long long)cfg->first_sample, n);
        goto fail;
    }
    if ((rc = dh_sampler_set_start(c->sampler, cfg->first_epoch, (size_t)cfg->first_sample)) ||
        (rc = dh_sampler_set_start(c->plan_sampler, cfg->first_epoch, (size_t)cfg->first_sample)))
        goto fail;
    c->steps_per_epoch = dh_sampler_steps_per_epoch(c->sampler);
    c->step0 = dh_sampler_epoch_first_step(c->sampler, cfg->first_epoch) + cfg->first_step;
    /* the epochs' steps: the first may be cut from first_sample, the others are alike */
    c->total = cfg->epochs ? dh_sampler_epoch_steps(c->sampler, cfg->first_epoch) +
                                 (uint64_t)c->steps_per_epoch * (cfg->epochs - 1)
                           : UINT64_MAX;
    if (cfg->max_steps && cfg->max_steps < c->total)
        c->total = cfg->max_steps;
    if (c->total != UINT64_MAX) /* resumed: what is left of the run */
        c->total = cfg->first_step < c->total ? c->total - cfg->first_step : 0;
    uint32_t depth = cfg->prefetch_max > cfg->prefetch ? cfg->prefetch_max : cfg->prefetch;
    c->horizon = cfg->prefetch;
    c->ring_size = (size_t)depth * cfg->fanout;
    c->tokens_ring = (size_t)depth + 2;
    c->ring = dh_calloc(c->ring_size, sizeof *c->ring);
    c->tokens_of = dh_calloc(c->tokens_ring, sizeof *c->tokens_of);
    c->requested_of = dh_calloc(c->tokens_ring, sizeof *c->requested_of);
    c->bytes_of = dh_calloc(c->tokens_ring, sizeof *c->bytes_of);
    c->bytes_scratch = dh_calloc(c->tokens_ring, sizeof *c->bytes_scratch);
    c->bytes_ratio = 1;
    c->batch_tensors = 2;
    if (!c->ring || !c->tokens_of || !c->requested_of || !c->bytes_of || !c->bytes_scratch) {
        rc = dh__set_error(DH_ENOMEM, "out of memory for the prefetch ring");
        goto fail;
    }
    c->ctx = cfg->zmq_ctx ? cfg->zmq_ctx : zmq_ctx_new();
    if (!c->ctx) {
        rc = dh__set_error(DH_ENOMEM, "client: zmq_ctx_new failed");
        goto fail;
    }
    c->cfg.keys_dir = c->cfg.key_name = NULL;
    if (cfg->keys_dir && cfg->keys_dir[0] &&
        (rc = dh_wire_keys_load(&c->keys, cfg->keys_dir, cfg->key_name)))
        goto fail;
    if (c->keys && cfg->rebalance.enabled && cfg->rebalance.exchange_fn)
        dh_log_warn("client '%s': rebalance.allow_unencrypted_exchange: tier-2 payloads that "
                    "move across nodes cross in plaintext through exchange_fn, outside the "
                    "CURVE encryption of '%s' (docs/security.md)",
                    c->id, cfg->keys_dir);
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
        rc = dh__client_connect_local(c, &c->ds);
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
    set_byte_budget(c);
    if ((rc = dh__client_rb_init(c, cfg)))
        goto fail;
    dh_log_info("client '%s': rank %u/%u, node '%s', %llu batches of %u (fanout %u, prefetch "
                "%u, %.0f MiB of the arena), local DataServer '%s'",
                c->id, cfg->rank, cfg->ranks, c->node, (unsigned long long)c->total, cfg->batch,
                cfg->fanout, cfg->prefetch, c->byte_budget / 1048576.0, c->ds.name);
    c->last_return_ns = dh_clock_now_ns();
    int e = pthread_create(&c->fetcher, NULL, dh__client_fetcher_main, c);
    if (e == 0) {
        e = pthread_create(&c->sender, NULL, dh__client_sender_main, c);
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
fail : {
    /* destroy says GOODBYE, which may fail and record its own message: keep the cause's */
    char why[1024];
    snprintf(why, sizeof why, "%s", dh_last_error());
    dh_client_destroy(&c);
    return dh__set_error(rc, "%s", why);
}
}

/* ---- next ---- */

static void batch_free(batch_impl_t *b)
{
    for (size_t i = 0; i < b->n_parts; i++)
        dh__client_part_release(&b->parts[i]);
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
            if (!s->ready || s->seq != b * parts + p ||
                (p == 0 && (c->rb.on ? !s->final : parts > 1 && !s->joined)))
                all = false;
        }
        if (c->rb.err && c->rb.err_batch <= b) { /* a round's policy failed: said once */
            int err = c->rb.err;
            c->rb.err = 0;
            pthread_mutex_unlock(&c->lock);
            return dh__set_error(err, "client '%s': %s", c->id, c->rb.err_msg);
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
    dh__count(&c->counters.wait_s_ns, now - entry);
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
    bi->pub.epoch = (uint32_t)dh_sampler_step_epoch(c->sampler, c->step0 + b, NULL);
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
    if ((rc = dh__client_mark_pads(c, bi->pub.step, bi->pub.samples, bi->pub.n_samples)))
        goto fail;
    if (taken[0].join_rc) { /* fanout > 1 and the parts could not be joined */
        rc = dh__set_error(taken[0].join_rc, "client '%s': %s", c->id, taken[0].join_error);
        goto fail;
    }
    /* one part, or parts[0] holds the joined batch (the others only their samples) */
    bi->pub.n_tensors = taken[0].n_tensors;
    bi->pub.tensors = taken[0].tensors; /* the batch owns its parts: no copy */
    size_t bytes = 0;
    double in_arena = 0; /* in whole slabs */
    for (size_t t = 0; t < bi->pub.n_tensors; t++) {
        bytes += bi->pub.tensors[t].nbytes;
        if (taken[0].handles[t].arena_id && c->slab_bytes > 0)
            in_arena += ceil((double)bi->pub.tensors[t].nbytes / c->slab_bytes) * c->slab_bytes;
    }
    pthread_mutex_lock(&c->lock);
    dh__client_learn_bytes(c, b, (double)bytes);
    c->batch_tensors = (uint32_t)bi->pub.n_tensors;
    c->held_bytes = parts == 1 ? in_arena : 0; /* joined batches are off the arena */
    pthread_mutex_unlock(&c->lock);
    dh__count(&c->counters.batches, 1);
    dh__count(&c->counters.samples, bi->pub.n_samples);
    dh__count(&c->counters.samples_failed, bi->pub.failed);
    dh__count(&c->counters.bytes_delivered, bytes);
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
    dh__client_rb_stop(c);
    dh_msg_t bye = {.type = DH_MSG_GOODBYE};
    if (c->coord)
        dh_wire_send(c->coord, NULL, 0, &bye, NULL, 0, 0);
    if (c->data && dh_wire_send(c->data, NULL, 0, &bye, NULL, 0, 0) == 0)
        dh__client_drain_after_goodbye(c);
    for (size_t i = 0; c->ring && i < c->ring_size; i++)
        if (c->ring[i].ready)
            dh__client_part_release(&c->ring[i]);
    dh_free(c->ring);
    dh_free(c->tokens_of);
    dh_free(c->requested_of);
    dh_free(c->bytes_of);
    dh_free(c->bytes_scratch);
    dh__client_rb_destroy(c);
    dh_wire_socket_destroy(&c->coord);
    dh_wire_socket_destroy(&c->data);
    if (c->notice_fd >= 0)
        close(c->notice_fd);
    for (size_t i = 0; i < c->n_arenas; i++)
        dh__client_arena_ref_drop(c->arenas[i]);
    dh_cluster_destroy(&c->embedded);
    dh_wire_keys_destroy(&c->keys);
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
