/* test_rebalance.c: tier 2 in the runtime (client_rebalance.c, coordinator_rebalance.c, the
 * DataServer's REBALANCE SEND). A coordinator, one local DataServer per node and one client
 * per rank run as threads of this process (each rank consumes on its own thread: a round
 * needs every member's parts). Every test checks the ledger: over the epoch, each step's
 * samples are yielded exactly once across the ranks, and each rank yields what the
 * decision gave it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "cluster.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/mix.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "core/internal.h"

#define RANKS 2
#define BATCH 2
#define ROWS 64
#define STEPS (ROWS / (RANKS * BATCH))
#define SYNTH "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.001,\"token_noise\":0.3}"

typedef struct world {
    void *ctx;
    dh_coordinator_t *coord;
    dh_dataserver_t *ds[RANKS];
    size_t n_ds;
    dh_client_t *client[RANKS];
    /* what each rank yielded: ids per step */
    char ids[RANKS][STEPS][8][64];
    size_t n_ids[RANKS][STEPS];
    int errors[RANKS]; /* next() errors seen (a policy error is said once) */
    char error_msg[RANKS][512];
    int fatal[RANKS];
} world_t;

static bool packing;     /* the next world plans with packing, in one-sample slots */
static double out_scale; /* the next world's clients' out_bytes_scale (0: unknown) */

typedef struct rank_arg {
    world_t *w;
    uint32_t rank;
} rank_arg_t;

/* nodes: 1 (both ranks share node-0's DataServer and arena) or RANKS (one node each);
 * rb[r]: rank r's tier-2 configuration. */
static void world_start_each(world_t *w, size_t nodes, const dh_rebalance_config_t *rb)
{
    memset(w, 0, sizeof *w);
    w->ctx = zmq_ctx_new();
    assert_non_null(w->ctx);
    char ep[128];
    snprintf(ep, sizeof ep, "inproc://rb-coordinator-%s", cl_test_tag());
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = ep;
    cc.zmq_ctx = w->ctx;
    assert_int_equal(dh_coordinator_new(&w->coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(w->coord), 0);
    for (size_t i = 0; i < nodes; i++) {
        dh_dataserver_config_t dc;
        dh_dataserver_config_default(&dc);
        dc.coordinator = dh_coordinator_endpoint(w->coord);
        dc.zmq_ctx = w->ctx;
        dc.pipeline_json = SYNTH;
        char data_ep[128], node[32], name[32];
        snprintf(data_ep, sizeof data_ep, "inproc://rb-data-%zu-%s", i, cl_test_tag());
        snprintf(node, sizeof node, "node-%zu", i);
        snprintf(name, sizeof name, "local-%zu", i);
        dc.data_listen = data_ep;
        dc.node = node;
        dc.name = name;
        dc.workers = 2;
        dc.arena_bytes = (uint64_t)64 << 20;
        assert_int_equal(dh_dataserver_new(&w->ds[i], &dc), 0);
        assert_int_equal(dh_dataserver_start(w->ds[i]), 0);
    }
    w->n_ds = nodes;
    uint64_t t0 = dh_clock_now_ns();
    for (;;) {
        dh_coordinator_stats_t st;
        dh_coordinator_stats(w->coord, &st);
        if (st.servers_alive >= nodes)
            break;
        assert_true(dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 10);
        cl_nap_ms(2);
    }
    const char *profiles = cl_write_profiles("p.jsonl", ROWS);
    for (uint32_t r = 0; r < RANKS; r++) {
        dh_client_config_t cfg;
        dh_client_config_default(&cfg);
        cfg.coordinator = dh_coordinator_endpoint(w->coord);
        cfg.zmq_ctx = w->ctx;
        cfg.profiles = profiles;
        char node[32];
        snprintf(node, sizeof node, "node-%zu", nodes == 1 ? (size_t)0 : (size_t)r);
        cfg.node = node;
        cfg.rank = r;
        cfg.ranks = RANKS;
        cfg.local_ranks = nodes == 1 ? RANKS : 1;
        cfg.batch = BATCH;
        cfg.fanout = BATCH; /* one sample per part: single samples move */
        if (packing) {      /* slots: a sample may move to another rank's empty slot */
            cfg.token_plan = DH_SHARE_TOKEN_PACKED;
            cfg.fanout = RANKS * BATCH;
        }
        cfg.seed = 7;
        cfg.prefetch = 4;
        cfg.epochs = 1;
        cfg.next_timeout_ms = 60000;
        cfg.connect_timeout_ms = 10000;
        cfg.out_bytes_scale = out_scale;
        cfg.rebalance = rb[r];
        /* the consumers here ask for every batch at once: without a wait allowance every
         * round would end ungathered (the default: a round adds no wait) */
        if (!cfg.rebalance.late_ms)
            cfg.rebalance.late_ms = 30000;
        int rc = dh_client_new(&w->client[r], &cfg);
        if (rc)
            print_error("%s\n", dh_last_error());
        assert_int_equal(rc, 0);
    }
}

/* The same tier-2 configuration on every rank. */
static void world_start(world_t *w, size_t nodes, const dh_rebalance_config_t *rb)
{
    dh_rebalance_config_t each[RANKS];
    for (uint32_t r = 0; r < RANKS; r++)
        each[r] = *rb;
    world_start_each(w, nodes, each);
}

/* The synthetic payload starts each sample's bytes with its id: the bytes a rank yields
 * are the samples it says (whichever way they moved). */
static void check_payload(const dh_client_batch_t *b)
{
    const dh_tensor_t *sizes = NULL, *payload = NULL;
    for (size_t t = 0; t < b->n_tensors; t++) {
        if (strcmp(b->tensors[t].name, "sizes") == 0)
            sizes = &b->tensors[t];
        else if (strcmp(b->tensors[t].name, "payload") == 0)
            payload = &b->tensors[t];
    }
    if (!b->n_samples)
        return;
    assert_non_null(sizes);
    assert_non_null(payload);
    assert_int_equal(sizes->shape[0], (int64_t)b->n_samples);
    const int64_t *sz = sizes->data;
    const char *at = payload->data;
    int64_t off = 0;
    for (size_t i = 0; i < b->n_samples; i++) {
        size_t len = strlen(b->samples[i].id);
        if ((int64_t)len > sz[i])
            len = (size_t)sz[i];
        assert_true(off + sz[i] <= payload->shape[0]);
        assert_memory_equal(at + off, b->samples[i].id, len);
        off += sz[i];
    }
}

static void *consume(void *arg)
{
    rank_arg_t *a = arg;
    world_t *w = a->w;
    uint32_t r = a->rank;
    for (;;) {
        dh_client_batch_t *b = NULL;
        int rc = dh_client_next(w->client[r], &b);
        if (rc == DH_EEOF)
            break;
        if (rc) {
            if (++w->errors[r] == 1)
                snprintf(w->error_msg[r], sizeof w->error_msg[r], "%s", dh_last_error());
            if (w->errors[r] > STEPS) {
                w->fatal[r] = rc;
                break;
            }
            continue;
        }
        uint64_t s = b->index;
        check_payload(b);
        for (size_t i = 0; i < b->n_samples && s < STEPS && i < 8; i++)
            snprintf(w->ids[r][s][w->n_ids[r][s]++], 64, "%s", b->samples[i].id);
        cl_nap_ms(1 + (int)(b->tokens / 20000)); /* "compute": a rate to learn */
        dh_client_batch_release(&b);
    }
    return NULL;
}

static void world_run(world_t *w)
{
    pthread_t t[RANKS];
    rank_arg_t a[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        a[r] = (rank_arg_t){w, r};
        assert_int_equal(pthread_create(&t[r], NULL, consume, &a[r]), 0);
    }
    for (uint32_t r = 0; r < RANKS; r++)
        pthread_join(t[r], NULL);
    for (uint32_t r = 0; r < RANKS; r++)
        assert_int_equal(w->fatal[r], 0);
}

static void world_stop(world_t *w)
{
    for (uint32_t r = 0; r < RANKS; r++)
        dh_client_destroy(&w->client[r]);
    for (size_t i = 0; i < w->n_ds; i++) {
        dh_dataserver_stop(w->ds[i]);
        dh_dataserver_destroy(&w->ds[i]);
    }
    dh_coordinator_destroy(&w->coord);
    zmq_ctx_term(w->ctx);
}

/* The ids rank r was planned at step s. */
static size_t planned(world_t *w, uint32_t r, uint64_t s, char out[8][64])
{
    uint32_t rows[8];
    int n = dh_client_plan_rank_step(w->client[0], s, r, rows, 8);
    assert_true(n > 0);
    /* the profile's row ids: read them back from the file */
    static dh_profile_set_t *set;
    if (!set) {
        assert_int_equal(dh_profile_set_new(&set), 0);
        assert_int_equal(dh_profile_set_load(set, dh_test_path("p.jsonl")), 0);
    }
    for (int i = 0; i < n; i++)
        snprintf(out[i], 64, "%s", dh_profile_set_row(set, rows[i])->id);
    return (size_t)n;
}

static bool has(char ids[][64], size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0)
            return true;
    return false;
}

/* Every step: the ranks together yielded exactly the planned samples, each once. Returns
 * how many samples were yielded by another rank than planned. */
static size_t check_ledger(world_t *w)
{
    size_t moved = 0;
    for (uint64_t s = 0; s < STEPS; s++) {
        char plan[RANKS][8][64];
        size_t n_plan[RANKS], total = 0, got = 0;
        for (uint32_t r = 0; r < RANKS; r++) {
            n_plan[r] = planned(w, r, s, plan[r]);
            total += n_plan[r];
            got += w->n_ids[r][s];
            /* each rank keeps its number of samples (one sample per part), but with packing */
            if (!packing)
                assert_int_equal(w->n_ids[r][s], n_plan[r]);
        }
        assert_int_equal(got, total);
        for (uint32_t r = 0; r < RANKS; r++)
            for (size_t i = 0; i < w->n_ids[r][s]; i++) {
                const char *id = w->ids[r][s][i];
                size_t seen = 0;
                for (uint32_t q = 0; q < RANKS; q++)
                    for (size_t k = 0; k < w->n_ids[q][s]; k++)
                        seen += strcmp(w->ids[q][s][k], id) == 0;
                assert_int_equal(seen, 1); /* exactly once */
                bool mine = has(plan[r], n_plan[r], id), anyone = false;
                for (uint32_t q = 0; q < RANKS; q++)
                    anyone |= has(plan[q], n_plan[q], id);
                assert_true(anyone);
                moved += !mine;
            }
    }
    return moved;
}

/* A user policy: every part goes to the other rank (counts kept: both hold as many). */
static int swap_all(void *user, const dh_rebalance_round_t *round, uint32_t *new_rank)
{
    int *calls = user;
    __atomic_add_fetch(calls, 1, __ATOMIC_RELAXED);
    for (size_t i = 0; i < round->n_parts; i++)
        new_rank[i] = round->parts[i].rank == round->ranks[0] ? round->ranks[1] : round->ranks[0];
    return 0;
}

static void check_swapped(world_t *w)
{
    for (uint64_t s = 0; s < STEPS; s++)
        for (uint32_t r = 0; r < RANKS; r++) {
            char plan[8][64];
            size_t n = planned(w, RANKS - 1 - r, s, plan);
            assert_int_equal(w->n_ids[r][s], n);
            for (size_t i = 0; i < n; i++)
                assert_true(has(w->ids[r][s], n, plan[i]));
        }
}

static void rebalance_user_policy_is_obeyed_on_one_node(void **state)
{
    world_t *w = calloc(1, sizeof *w);
    int calls = 0;
    dh_rebalance_config_t rb;
    dh_client_config_t d;
    dh_client_config_default(&d);
    rb = d.rebalance;
    rb.enabled = 1;
    rb.buffer_size = 8; /* 2 steps a round */
    rb.sort_fn = swap_all;
    rb.sort_user = &calls;
    world_start(w, 1, &rb);
    world_run(w);
    check_swapped(w);
    assert_int_equal(check_ledger(w), (size_t)ROWS);
    dh_client_stats_t st;
    dh_client_stats(w->client[0], &st);
    assert_int_equal(st.rebalance_rounds, STEPS / 2);
    assert_int_equal(st.rebalance_applied, STEPS / 2);
    assert_int_equal(st.rebalance_moved_samples, ROWS / RANKS);
    assert_int_equal(st.rebalance_bytes_remote, 0); /* ownership handoff only */
    assert_true(st.rebalance_bytes > 0);
    assert_int_equal(calls, RANKS * STEPS / 2); /* every member decides every round */
    world_stop(w);
    free(w);
}

static void rebalance_user_policy_moves_bytes_across_nodes(void **state)
{
    world_t *w = calloc(1, sizeof *w);
    int calls = 0;
    dh_client_config_t d;
    dh_client_config_default(&d);
    dh_rebalance_config_t rb = d.rebalance;
    rb.enabled = 1;
    rb.group_of = (const uint32_t[RANKS]){0, 0}; /* one group over both nodes */
    rb.buffer_size = 4;
    rb.sort_fn = swap_all;
    rb.sort_user = &calls;
    world_start(w, RANKS, &rb);
    world_run(w);
    check_swapped(w);
    assert_int_equal(check_ledger(w), (size_t)ROWS);
    dh_client_stats_t st;
    dh_client_stats(w->client[1], &st);
    assert_int_equal(st.rebalance_rounds, STEPS);
    assert_true(st.rebalance_bytes_remote > 0);
    assert_int_equal(st.rebalance_bytes_remote, st.rebalance_bytes);
    dh_dataserver_stats_t ds;
    dh_dataserver_stats(w->ds[0], &ds);
    assert_int_equal(ds.rebalance_sent, ROWS / RANKS);
    world_stop(w);
    free(w);
}

/* An in-process all_to_all between the two ranks' fetcher threads: each deposits what it
 * sends, waits for the other's, takes its share, and waits until the other has taken its
 * own (the send buffers are the callers'). */
typedef struct a2a {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    const char *send[RANKS];
    size_t counts[RANKS][RANKS]; /* [from][to] */
    uint64_t round[RANKS];
    int posted, taken, calls[RANKS], fail_round;
    unsigned long generation;
} a2a_t;

typedef struct a2a_arg {
    a2a_t *x;
    uint32_t rank;
} a2a_arg_t;

static void a2a_wait(a2a_t *x, int *counter)
{
    unsigned long gen = x->generation;
    if (++*counter == RANKS) {
        *counter = 0;
        x->generation++;
        pthread_cond_broadcast(&x->cond);
    } else {
        while (gen == x->generation)
            pthread_cond_wait(&x->cond, &x->lock);
    }
}

static int a2a_exchange(void *user, uint32_t group, uint64_t round, const uint32_t *ranks,
                        uint32_t n_ranks, const void *send, const size_t *send_counts, void *recv,
                        const size_t *recv_counts)
{
    a2a_arg_t *a = user;
    a2a_t *x = a->x;
    uint32_t me = a->rank;
    (void)group;
    if (n_ranks != RANKS || ranks[0] != 0 || ranks[1] != 1)
        return DH_EINVAL;
    pthread_mutex_lock(&x->lock);
    x->calls[me]++;
    x->send[me] = send;
    x->round[me] = round;
    for (uint32_t k = 0; k < RANKS; k++)
        x->counts[me][k] = send_counts[k];
    a2a_wait(x, &x->posted);
    int rc = x->round[0] == x->round[1] ? 0 : DH_EINVAL; /* the same round on both */
    size_t at = 0;
    for (uint32_t k = 0; k < RANKS && rc == 0; k++) {
        if (recv_counts[k] != x->counts[k][me]) {
            rc = DH_EINVAL; /* what it expects is what the other sends */
            break;
        }
        size_t off = 0;
        for (uint32_t j = 0; j < me; j++)
            off += x->counts[k][j];
        memcpy((char *)recv + at, x->send[k] + off, recv_counts[k]);
        at += recv_counts[k];
    }
    a2a_wait(x, &x->taken);
    if ((int)round == x->fail_round && me == 1)
        rc = DH_EIO; /* the transport failed on rank 1 */
    pthread_mutex_unlock(&x->lock);
    return rc;
}

/* Two ranks on two nodes whose every round swaps all parts (swap_all), the cross-node
 * bytes going through a2a_exchange, which fails on rank 1 in round fail_round (-1: never);
 * runs the epoch. a2a_world_free undoes it. */
static world_t *a2a_world(int fail_round, int *calls, a2a_t **out_x, a2a_arg_t *args)
{
    world_t *w = calloc(1, sizeof *w);
    a2a_t *x = calloc(1, sizeof *x);
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->cond, NULL);
    x->fail_round = fail_round;
    dh_client_config_t d;
    dh_client_config_default(&d);
    dh_rebalance_config_t rb[RANKS];
    static const uint32_t one_group[RANKS] = {0, 0};
    for (uint32_t r = 0; r < RANKS; r++) {
        args[r] = (a2a_arg_t){x, r};
        rb[r] = d.rebalance;
        rb[r].enabled = 1;
        rb[r].group_of = one_group;
        rb[r].buffer_size = 4;
        rb[r].sort_fn = swap_all;
        rb[r].sort_user = calls;
        rb[r].exchange_fn = a2a_exchange;
        rb[r].exchange_user = &args[r];
    }
    world_start_each(w, RANKS, rb);
    world_run(w);
    *out_x = x;
    return w;
}

static void a2a_world_free(world_t *w, a2a_t *x)
{
    world_stop(w);
    pthread_cond_destroy(&x->cond);
    pthread_mutex_destroy(&x->lock);
    free(x);
    free(w);
}

/* With an exchange_fn (what rebalance={"process_group": pg} gives in Python), the bytes of
 * cross-node moves go through it, not through the DataServers; the ledger holds. */
static void rebalance_exchange_fn_carries_cross_node_moves(void **state)
{
    int calls = 0;
    a2a_t *x = NULL;
    a2a_arg_t args[RANKS];
    world_t *w = a2a_world(-1, &calls, &x, args);
    check_swapped(w);
    assert_int_equal(check_ledger(w), (size_t)ROWS);
    for (uint32_t r = 0; r < RANKS; r++) {
        dh_client_stats_t st;
        dh_client_stats(w->client[r], &st);
        assert_int_equal(st.rebalance_rounds, STEPS);
        assert_int_equal(st.rebalance_exchanges, STEPS); /* every round crossed */
        assert_int_equal(x->calls[r], STEPS);
        assert_true(st.rebalance_bytes_remote > 0);
        assert_int_equal(st.rebalance_bytes_remote, st.rebalance_bytes);
        assert_true(st.rebalance_transfer_s_total > 0);
        assert_true(st.rebalance_transfer_s_p95 <= st.rebalance_transfer_s_total);
        dh_dataserver_stats_t ds;
        dh_dataserver_stats(w->ds[r], &ds);
        assert_int_equal(ds.rebalance_sent, 0); /* no DataServer forwarded a part */
    }
    a2a_world_free(w, x);
}

/* An exchange_fn that fails loses the parts it was to bring, and next() says so once,
 * naming the round; the other rounds deliver. */
static void rebalance_exchange_fn_failure_names_the_round(void **state)
{
    int calls = 0;
    a2a_t *x = NULL;
    a2a_arg_t args[RANKS];
    world_t *w = a2a_world(2, &calls, &x, args);
    assert_int_equal(w->errors[0], 0);
    assert_int_equal(w->errors[1], 1);
    assert_non_null(strstr(w->error_msg[1], "rebalance round 2 (group 0): exchange_fn failed"));
    /* rank 1 lost round 2's parts (its step 2); every other step is whole */
    for (uint64_t s = 0; s < STEPS; s++)
        assert_int_equal(w->n_ids[1][s], s == 2 ? 0 : BATCH);
    a2a_world_free(w, x);
}

/* The default policy on one node (moves cost nothing): it balances each step's tokens,
 * and its decisions are the same from run to run. */
static void rebalance_default_policy_is_deterministic(void **state)
{
    dh_client_config_t d;
    dh_client_config_default(&d);
    dh_rebalance_config_t rb = d.rebalance;
    rb.enabled = 1;
    rb.min_gain = 0;
    world_t *w[2];
    for (int run = 0; run < 2; run++) {
        w[run] = calloc(1, sizeof *w[run]);
        world_start(w[run], 1, &rb);
        world_run(w[run]);
        assert_true(check_ledger(w[run]) > 0);
        dh_client_stats_t st;
        dh_client_stats(w[run]->client[0], &st);
        assert_true(st.rebalance_applied > 0);
        if (run == 1)
            for (uint32_t r = 0; r < RANKS; r++)
                for (uint64_t s = 0; s < STEPS; s++) {
                    assert_int_equal(w[1]->n_ids[r][s], w[0]->n_ids[r][s]);
                    for (size_t i = 0; i < w[1]->n_ids[r][s]; i++)
                        assert_true(has(w[0]->ids[r][s], w[0]->n_ids[r][s], w[1]->ids[r][s][i]));
                }
    }
    for (int run = 0; run < 2; run++) {
        world_stop(w[run]);
        free(w[run]);
    }
}

/* Across nodes, a link too slow for any move to pay: the gate keeps every round. */
static void rebalance_gate_keeps_when_the_link_is_slow(void **state)
{
    world_t *w = calloc(1, sizeof *w);
    dh_client_config_t d;
    dh_client_config_default(&d);
    dh_rebalance_config_t rb = d.rebalance;
    rb.enabled = 1;
    rb.group_of = (const uint32_t[RANKS]){0, 0};
    rb.move_s_per_B = 1; /* a second per byte */
    world_start(w, RANKS, &rb);
    world_run(w);
    assert_int_equal(check_ledger(w), 0);
    dh_client_stats_t st;
    dh_client_stats(w->client[0], &st);
    assert_true(st.rebalance_rounds > 0);
    assert_int_equal(st.rebalance_applied, 0);
    assert_true(st.rebalance_kept_by_gate > 0);
    assert_int_equal(st.rebalance_moved_parts, 0);
    world_stop(w);
    free(w);
}

/* A policy that breaks the rules (every part to one rank): each round keeps, next() says
 * so once per round, naming it, and no sample is lost. */
static int all_to_first(void *user, const dh_rebalance_round_t *round, uint32_t *new_rank)
{
    for (size_t i = 0; i < round->n_parts; i++)
        new_rank[i] = round->ranks[0];
    return 0;
}

/* A policy that gives the first part to a rank that is not in the group. */
static int one_to_a_stranger(void *user, const dh_rebalance_round_t *round, uint32_t *new_rank)
{
    for (size_t i = 0; i < round->n_parts; i++)
        new_rank[i] = i ? round->parts[i].rank : 99;
    return 0;
}

/* A round holds its batches materialized at once, so it has no more steps than the rank's
 * share of the arena holds batches of the largest samples. Here the clients are told that
 * a profile byte stands for `scale` decoded bytes, chosen so that a batch of the largest
 * samples is 12 MiB against a share of 30.4 MiB (64 MiB among 2 ranks, less 5%): rounds of
 * 2 steps, where the buffer (16 samples) alone would give 4. A policy that keeps every part
 * where it is records how many batches each round it sees spans. */
static atomic_uint round_batches_min = UINT32_MAX, round_batches_max;

static int record_round(void *user, const dh_rebalance_round_t *round, uint32_t *new_rank)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < round->n_parts; i++) {
        new_rank[i] = round->parts[i].rank;
        lo = round->parts[i].batch < lo ? round->parts[i].batch : lo;
        hi = round->parts[i].batch > hi ? round->parts[i].batch : hi;
    }
    unsigned n = round->n_parts ? (unsigned)(hi - lo + 1) : 0;
    for (unsigned m = atomic_load(&round_batches_min); n < m;)
        atomic_compare_exchange_weak(&round_batches_min, &m, n);
    for (unsigned m = atomic_load(&round_batches_max); n > m;)
        atomic_compare_exchange_weak(&round_batches_max, &m, n);
    return 0;
}

static void rebalance_rounds_fit_the_ranks_share_of_the_arena(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", ROWS);
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, profiles), 0);
    double largest = 0;
    for (size_t i = 0; i < dh_profile_set_count(set); i++)
        if (dh_profile_set_row(set, i)->out_bytes > largest)
            largest = (double)dh_profile_set_row(set, i)->out_bytes;
    dh_profile_set_destroy(&set);
    assert_true(largest > 0);
    for (int known = 0; known < 2; known++) {
        out_scale = known ? 6.0 * 1048576 / largest : 0; /* BATCH x largest x scale = 12 MiB */
        atomic_store(&round_batches_min, UINT32_MAX);
        atomic_store(&round_batches_max, 0);
        world_t *w = calloc(1, sizeof *w);
        dh_client_config_t d;
        dh_client_config_default(&d);
        dh_rebalance_config_t rb = d.rebalance;
        rb.enabled = 1;
        rb.buffer_size = 16;
        rb.sort_fn = record_round;
        world_start(w, 1, &rb);
        world_run(w);
        assert_int_equal(check_ledger(w), 0);
        world_stop(w);
        free(w);
        /* unknown sizes: the buffer's 4 steps; known: 2, to fit the arena */
        assert_int_equal(atomic_load(&round_batches_max), known ? 2 : 4);
        assert_int_equal(atomic_load(&round_batches_min), known ? 2 : 4);
    }
    out_scale = 0;
}

static void rebalance_policy_error_names_the_round_and_keeps(void **state)
{
    /* each rule its own message: a rank's part count changed, a part to a rank not in the
     * group (whose counts then change as well: the first check must name it) */
    const dh_rebalance_sort_fn policies[] = {all_to_first, one_to_a_stranger};
    const char *const says[] = {"parts move in exchange", "is given to rank 99, not in the group"};
    for (size_t i = 0; i < 2; i++) {
        world_t *w = calloc(1, sizeof *w);
        dh_client_config_t d;
        dh_client_config_default(&d);
        dh_rebalance_config_t rb = d.rebalance;
        rb.enabled = 1;
        rb.sort_fn = policies[i];
        world_start(w, 1, &rb);
        world_run(w);
        for (uint32_t r = 0; r < RANKS; r++) {
            assert_int_equal(w->errors[r], STEPS / 4); /* rounds of 4 steps (buffer 16) */
            assert_non_null(strstr(w->error_msg[r], "rebalance round 0"));
            assert_non_null(strstr(w->error_msg[r], "kept"));
            if (!strstr(w->error_msg[r], says[i]))
                fail_msg("policy %zu: '%s' does not say '%s'", i, w->error_msg[r], says[i]);
        }
        assert_int_equal(check_ledger(w), 0);
        world_stop(w);
        free(w);
    }
}

/* Packing in one-sample slots (fanout = ranks x batch): a sample may move to another rank's
 * empty slot, so a rank's count changes; each step's samples are still yielded exactly
 * once. */
static void rebalance_packing_moves_samples_between_counts(void **state)
{
    world_t *w = calloc(1, sizeof *w);
    dh_client_config_t d;
    dh_client_config_default(&d);
    dh_rebalance_config_t rb = d.rebalance;
    rb.enabled = 1;
    rb.min_gain = 0;
    packing = true;
    world_start(w, 1, &rb);
    world_run(w);
    assert_true(check_ledger(w) > 0);
    dh_client_stats_t st;
    dh_client_stats(w->client[0], &st);
    assert_true(st.rebalance_applied > 0);
    size_t changed = 0;
    for (uint64_t s = 0; s < STEPS; s++) {
        char plan[8][64];
        changed += planned(w, 0, s, plan) != w->n_ids[0][s];
    }
    assert_true(changed > 0); /* decisions do not depend on timing here (late_ms) */
    packing = false;
    world_stop(w);
    free(w);
}

/* Once the clients are gone, every node's arena holds nothing: each slab a part took came
 * back (waits on the arena's records, for a DataServer that drops what it still held for a
 * client that left). A reference leaked to a live holder (this process) never comes back. */
static void clients_gone_arenas_empty(world_t *w)
{
    for (uint32_t r = 0; r < RANKS; r++)
        dh_client_destroy(&w->client[r]);
    for (size_t i = 0; i < w->n_ds; i++) {
        uint64_t t0 = dh_clock_now_ns();
        dh_shm_arena_stats_t st;
        for (;;) {
            assert_int_equal(dh_dataserver_arena_stats(w->ds[i], &st), 0);
            if (st.allocations_live == 0 || dh_clock_elapsed_s(t0, dh_clock_now_ns()) > 5)
                break;
            cl_nap_ms(5);
        }
        assert_int_equal(st.allocations_live, 0);
    }
}

/* A round whose moves fail half-way gives back every slab of the parts (issue 33): a part
 * that cannot be handed to the local DataServer (site 4, DH_FAULT_RB_SEND: before, its sender
 * forgot it with its references), and a part of this node whose handle is refused at one of
 * its tensors (site 5, DH_FAULT_RB_TAKE_OVER: before, the sender's references stayed). Each
 * is swept (faults build only): at every hit, the round's error reaches next() naming what
 * failed, and every node's arena is empty once the clients are gone; no allocation or fd is
 * left after the world stops; the complete run has no error. */
typedef struct sweep_arg {
    int one_node;
} sweep_arg_t;

static int rebalance_world(void *arg)
{
    int one_node = ((sweep_arg_t *)arg)->one_node;
    world_t *w = calloc(1, sizeof *w);
    assert_non_null(w);
    int calls = 0;
    dh_client_config_t d;
    dh_client_config_default(&d);
    dh_rebalance_config_t rb = d.rebalance;
    rb.enabled = 1;
    rb.buffer_size = 8; /* 2 steps a round */
    rb.sort_fn = swap_all;
    rb.sort_user = &calls;
    rb.round_timeout_ms = 1000; /* how long a receiver waits for a part that never comes */
    static const uint32_t one_group[RANKS] = {0, 0}; /* one group over both nodes */
    if (!one_node)
        rb.group_of = one_group;
    world_start(w, one_node ? 1 : RANKS, &rb);
    world_run(w);
    int errors = w->errors[0] + w->errors[1];
    char msg[2 * sizeof w->error_msg[0] + 32]; /* both ranks' first errors (the sender's and
                                                * the receiver's "did not come") */
    snprintf(msg, sizeof msg, "rank 0: %s; rank 1: %s", w->errors[0] ? w->error_msg[0] : "-",
             w->errors[1] ? w->error_msg[1] : "-");
    clients_gone_arenas_empty(w);
    world_stop(w);
    free(w);
    return errors ? dh__set_error(DH_EIO, "%s", msg) : 0;
}

static void rebalance_failed_send_gives_back_its_slabs(void **state)
{
    if (!dh_fault_enabled())
        skip();
    sweep_arg_t a = {.one_node = 0};
    long hits = dh_test_each_fault(DH_FAULT_RB_SEND, "cannot hand a part to the local DataServer",
                                   rebalance_world, &a);
    print_message("site 4: %ld hits\n", hits);
}

static void rebalance_failed_take_over_gives_back_its_slabs(void **state)
{
    if (!dh_fault_enabled())
        skip();
    sweep_arg_t a = {.one_node = 1};
    long hits = dh_test_each_fault(
        DH_FAULT_RB_TAKE_OVER, "a part of this node could not change owner", rebalance_world, &a);
    print_message("site 5: %ld hits\n", hits);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(rebalance_user_policy_is_obeyed_on_one_node),
    cmocka_unit_test(rebalance_user_policy_moves_bytes_across_nodes),
    cmocka_unit_test(rebalance_exchange_fn_carries_cross_node_moves),
    cmocka_unit_test(rebalance_exchange_fn_failure_names_the_round),
    cmocka_unit_test(rebalance_default_policy_is_deterministic),
    cmocka_unit_test(rebalance_gate_keeps_when_the_link_is_slow),
    cmocka_unit_test(rebalance_policy_error_names_the_round_and_keeps),
    cmocka_unit_test(rebalance_rounds_fit_the_ranks_share_of_the_arena),
    cmocka_unit_test(rebalance_packing_moves_samples_between_counts),
    cmocka_unit_test(rebalance_failed_send_gives_back_its_slabs),
    cmocka_unit_test(rebalance_failed_take_over_gives_back_its_slabs),
};
DH_TEST_MAIN(tests)
