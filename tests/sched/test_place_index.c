/* Tests of the placement index (src/sched/place_index.c, docs/scheduler.md §2 "The index"):
 * on random snapshots it decides exactly as the exhaustive rule (dh_place) does (return code,
 * server, reason and the bits of T and miss, ties included), before and after incremental
 * updates; it rejects bad input; it survives every allocation failure. */
#include <math.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/place.h"
#include "datahelix/rng.h"

enum { MAX_SERVERS = 1100, MAX_NODES = 40 };

/* How a random snapshot draws its values: continuous, or from a few values so that equal T
 * (exact ties) are common, or with transfer terms so large that distinct T round to one
 * value (ties made by rounding). */
typedef enum { DRAW_CONTINUOUS, DRAW_FEW_VALUES, DRAW_ROUNDING_TIES, DRAW_MODES } draw_t;

typedef struct world {
    dh_server_state_t servers[MAX_SERVERS];
    dh_link_t links[MAX_NODES * MAX_NODES];
    uint32_t n_servers, n_nodes;
    draw_t draw;
} world_t;

static double pick(dh_rng_t *rng, const double *values, uint64_t n)
{
    return values[dh_rng_below(rng, n)];
}

static void draw_server(dh_rng_t *rng, const world_t *w, dh_server_state_t *s)
{
    static const double few_speed[] = {0.5, 1.0, 1.0, 2.0};
    static const double few_storage[] = {1e-9, 2e-9};
    static const double few_wait[] = {0.0, 0.5, 1.0};
    *s = (dh_server_state_t){
        .node = (uint32_t)dh_rng_below(rng, w->n_nodes),
        .role = (uint8_t)dh_rng_below(rng, 2),
        .alive = dh_rng_uniform(rng) > 0.1,
        .workers = (uint32_t)dh_rng_below(rng, 5), /* 0: dead */
        .queue_len = (uint32_t)dh_rng_below(rng, 10),
        .queue_cap = (uint32_t)dh_rng_below(rng, 10), /* 0: no cap */
    };
    switch (w->draw) {
    case DRAW_FEW_VALUES:
        s->speed_factor = pick(rng, few_speed, 4);
        s->storage_s_per_B = pick(rng, few_storage, 2);
        s->queue_wait_s = pick(rng, few_wait, 3);
        break;
    case DRAW_ROUNDING_TIES:
        /* T ~ 1e6 s of transfer plus base terms that differ by less than its ulp (1.2e-10) */
        s->speed_factor = 1.0 + dh_rng_uniform(rng) * 1e-10;
        s->storage_s_per_B = 1e-9;
        s->queue_wait_s = dh_rng_uniform(rng) * 1e-10;
        break;
    default:
        s->speed_factor = 0.05 + dh_rng_uniform(rng) * 3;
        s->storage_s_per_B = 1.0 / (1e8 + dh_rng_uniform(rng) * 2e9);
        s->queue_wait_s = dh_rng_uniform(rng) * 3;
        break;
    }
    if (dh_rng_uniform(rng) < 0.003) /* a state the bounds must not be fooled by */
        s->speed_factor = NAN;
}

static dh_link_t draw_link(dh_rng_t *rng, const world_t *w)
{
    static const double few_bw[] = {1e9, 1e10};
    static const double few_latency[] = {0.0, 1e-4};
    switch (w->draw) {
    case DRAW_FEW_VALUES:
        return dh_link_make(pick(rng, few_bw, 2), pick(rng, few_latency, 2));
    case DRAW_ROUNDING_TIES:
        return (dh_link_t){1e-9, 1e6 + (double)dh_rng_below(rng, 2)};
    default:
        return dh_link_make(1e8 + dh_rng_uniform(rng) * 1e10, dh_rng_uniform(rng) * 1e-3);
    }
}

static void draw_world(dh_rng_t *rng, world_t *w)
{
    /* Mostly small clusters (many snapshots), some of a thousand servers (deep trees). */
    w->n_servers = dh_rng_uniform(rng) < 0.02 ? 500 + (uint32_t)dh_rng_below(rng, 600)
                                              : (uint32_t)dh_rng_below(rng, 80);
    w->n_nodes = 1 + (uint32_t)dh_rng_below(rng, dh_rng_uniform(rng) < 0.1 ? MAX_NODES : 8);
    w->draw = (draw_t)dh_rng_below(rng, DRAW_MODES);
    for (uint32_t i = 0; i < w->n_servers; i++)
        draw_server(rng, w, &w->servers[i]);
    for (uint32_t i = 0; i < w->n_nodes * w->n_nodes; i++)
        w->links[i] = draw_link(rng, w);
}

static void draw_request(dh_rng_t *rng, const world_t *w, dh_request_cost_t *r)
{
    static const double few_cpu[] = {0.0, 0.5, 1.0};
    *r = (dh_request_cost_t){
        .cpu_s = w->draw == DRAW_FEW_VALUES ? pick(rng, few_cpu, 3) : dh_rng_uniform(rng) * 2,
        .in_bytes = dh_rng_uniform(rng) < 0.2 ? 0 : dh_rng_uniform(rng) * 1e8,
        .out_bytes = dh_rng_uniform(rng) < 0.2 ? 0 : dh_rng_uniform(rng) * 1e9,
        .consumer_node = (uint32_t)dh_rng_below(rng, w->n_nodes),
    };
    if (w->draw == DRAW_ROUNDING_TIES) {
        r->cpu_s = 1.0;
        r->in_bytes = 1.0;
        r->out_bytes = 1e6;
    }
    /* Deadlines around the predicted times, so every rule is taken. */
    r->deadline_s =
        w->draw == DRAW_ROUNDING_TIES ? 1e6 + dh_rng_uniform(rng) * 4 : dh_rng_uniform(rng) * 6;
    /* The local server: usually one on the consumer's node, sometimes anywhere, none (-1) or
     * an index outside the snapshot. */
    double u = dh_rng_uniform(rng);
    r->local_server = -1;
    if (u < 0.75) {
        for (uint32_t i = 0; i < w->n_servers; i++)
            if (w->servers[i].node == r->consumer_node) {
                r->local_server = (int32_t)i;
                break;
            }
    } else if (u < 0.9 && w->n_servers) {
        r->local_server = (int32_t)dh_rng_below(rng, w->n_servers);
    } else if (u < 0.95) {
        r->local_server = (int32_t)w->n_servers + 3;
    }
    /* Outside the domain where the index's bounds hold: it must still agree. */
    if (dh_rng_uniform(rng) < 0.01)
        r->in_bytes = -r->in_bytes - 1;
    /* A third of the requests read remote samples: a fetch term per server (not in the
     * index's tree), from a few values (ties) or continuous, now and then negative or NaN
     * (counted as 0). */
    static double fetch[MAX_SERVERS];
    static const double few_fetch[] = {0.0, 0.25, 0.5};
    if (dh_rng_uniform(rng) < 0.3) {
        for (uint32_t i = 0; i < w->n_servers; i++) {
            double v =
                w->draw == DRAW_CONTINUOUS ? dh_rng_uniform(rng) * 2 : pick(rng, few_fetch, 3);
            double odd = dh_rng_uniform(rng);
            fetch[i] = odd < 0.02 ? -v - 1 : odd < 0.04 ? NAN : v;
        }
        r->fetch_s = fetch;
    }
}

static void draw_config(dh_rng_t *rng, dh_place_config_t *cfg)
{
    dh_place_config_default(cfg);
    cfg->policy = (dh_policy_t)dh_rng_below(rng, DH_POLICY_COUNT);
    if (dh_rng_uniform(rng) < 0.5)
        cfg->policy = DH_POLICY_DEADLINE;
    switch (dh_rng_below(rng, 3)) {
    case 0:
        cfg->hysteresis_s = 0;
        cfg->hysteresis_frac = 0;
        break;
    case 1:
        cfg->hysteresis_s = dh_rng_uniform(rng);
        cfg->hysteresis_frac = dh_rng_uniform(rng) * 0.5;
        break;
    default:
        break;
    }
}

static int same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

typedef struct tally {
    long decisions, ties;
    long by_reason[DH_REASON_NO_CANDIDATE + 1];
    long by_rc[3]; /* 0, DH_EAGAIN, DH_ENOSERVER */
} tally_t;

/* One request: the index must decide as dh_place does, with and without its candidates. */
static void check_one(const world_t *w, const dh_place_index_t *idx, const dh_place_config_t *cfg,
                      const dh_request_cost_t *r, tally_t *tally)
{
    static dh_candidate_t cand[MAX_SERVERS];
    dh_snapshot_t snap = {w->servers, w->n_servers, w->links, w->n_nodes};
    dh_decision_t ref = {.candidates = cand}, lean = {0}, got = {0};
    int rc_ref = dh_place(cfg, &snap, r, &ref);
    int rc_lean = dh_place(cfg, &snap, r, &lean);
    int rc_got = dh_place_index_decide(idx, cfg, r, &got);
    if (rc_got != rc_ref || got.server != ref.server || got.reason != ref.reason ||
        !same_bits(got.t_s, ref.t_s) || !same_bits(got.miss_s, ref.miss_s))
        fail_msg("index decided rc %d server %d reason %s T %.17g miss %.17g; dh_place rc %d "
                 "server %d reason %s T %.17g miss %.17g (policy %s, %u servers, %u nodes, "
                 "draw %d, consumer %u, local %d, D %.17g)",
                 rc_got, got.server, dh_place_reason_name(got.reason), got.t_s, got.miss_s, rc_ref,
                 ref.server, dh_place_reason_name(ref.reason), ref.t_s, ref.miss_s,
                 dh_policy_name(cfg->policy), w->n_servers, w->n_nodes, (int)w->draw,
                 r->consumer_node, r->local_server, r->deadline_s);
    /* dh_place's two compiled loops (with and without candidates) agree too. */
    assert_int_equal(rc_lean, rc_ref);
    assert_int_equal(lean.server, ref.server);
    assert_int_equal(lean.reason, ref.reason);
    assert_true(same_bits(lean.t_s, ref.t_s));
    if (rc_ref == 0 && ref.server >= 0) {
        /* the reported T is the chosen candidate's */
        assert_true(same_bits(ref.t_s, cand[ref.server].t_s));
        assert_true(same_bits(ref.miss_s, cand[ref.server].miss_s));
        /* a tie: another eligible server with the same T (it lost on its index) */
        for (uint32_t i = 0; i < w->n_servers; i++)
            if ((int32_t)i != ref.server && cand[i].status == DH_CANDIDATE_OK &&
                cand[i].t_s == ref.t_s) {
                tally->ties++;
                break;
            }
    }
    tally->decisions++;
    tally->by_reason[ref.reason]++;
    tally->by_rc[rc_ref == 0 ? 0 : rc_ref == DH_EAGAIN ? 1 : 2]++;
}

/* Changes a few servers (queues, statuses, speeds, nodes) and links, in the world and
 * through the index's update functions. */
static void mutate(dh_rng_t *rng, world_t *w, dh_place_index_t *idx)
{
    int changes = 1 + (int)dh_rng_below(rng, 8);
    for (int k = 0; k < changes && w->n_servers; k++) {
        uint32_t i = (uint32_t)dh_rng_below(rng, w->n_servers);
        dh_server_state_t *s = &w->servers[i];
        switch (dh_rng_below(rng, 6)) {
        case 0: /* a dispatch */
            s->queue_len++;
            s->queue_wait_s += dh_rng_uniform(rng);
            break;
        case 1: /* a completion */
            if (s->queue_len)
                s->queue_len--;
            s->queue_wait_s *= 0.5;
            break;
        case 2: /* declared dead, or back */
            s->alive = !s->alive;
            break;
        case 3: /* a learned speed */
            s->speed_factor *= 0.9 + 0.2 * dh_rng_uniform(rng);
            break;
        case 4: /* a moved server */
            s->node = (uint32_t)dh_rng_below(rng, w->n_nodes);
            break;
        default: /* redrawn */
            draw_server(rng, w, s);
            break;
        }
        assert_int_equal(dh_place_index_update(idx, i, s), 0);
    }
    if (dh_rng_uniform(rng) < 0.3) {
        uint32_t from = (uint32_t)dh_rng_below(rng, w->n_nodes);
        uint32_t to = (uint32_t)dh_rng_below(rng, w->n_nodes);
        w->links[from * w->n_nodes + to] = draw_link(rng, w);
        assert_int_equal(dh_place_index_set_link(idx, from, to, w->links[from * w->n_nodes + to]),
                         0);
    }
}

/* The property: on 20,000 random snapshots (and 3 incremental updates of each), every
 * decision of the index equals dh_place's, bit for bit. */
static void place_index_equals_exhaustive_rule_on_random_snapshots(void **state)
{
    static world_t w;
    dh_rng_t rng;
    dh_rng_seed(&rng, 2024);
    tally_t tally = {0};
    long snapshots = 0;
    for (int iter = 0; iter < 20000; iter++) {
        draw_world(&rng, &w);
        dh_snapshot_t snap = {w.servers, w.n_servers, w.links, w.n_nodes};
        dh_place_index_t *idx = NULL;
        assert_int_equal(dh_place_index_new(&idx, &snap), 0);
        snapshots++;
        for (int round = 0; round < 4; round++) {
            for (int q = 0; q < 4; q++) {
                dh_place_config_t cfg;
                dh_request_cost_t r;
                draw_config(&rng, &cfg);
                draw_request(&rng, &w, &r);
                check_one(&w, idx, &cfg, &r, &tally);
            }
            mutate(&rng, &w, idx);
        }
        dh_place_index_destroy(&idx);
        assert_null(idx);
    }
    print_message("%ld snapshots, %ld decisions compared, %ld with a tie on T; reasons:", snapshots,
                  tally.decisions, tally.ties);
    for (int k = 0; k <= DH_REASON_NO_CANDIDATE; k++)
        print_message(" %s %ld", dh_place_reason_name((dh_place_reason_t)k), tally.by_reason[k]);
    print_message("\n");
    assert_true(snapshots >= 20000);
    /* Every reason and return code was reached, and ties were common. */
    for (int k = 0; k <= DH_REASON_NO_CANDIDATE; k++)
        assert_true(tally.by_reason[k] > 100);
    for (int k = 0; k < 3; k++)
        assert_true(tally.by_rc[k] > 100);
    assert_true(tally.ties > 1000);
}

/* A cluster whose speeds all drift: the leaves get re-sorted (every n_servers-th such
 * update) and the decisions stay exact throughout. */
static void place_index_stays_exact_as_speeds_drift(void **state)
{
    static world_t w;
    dh_rng_t rng;
    dh_rng_seed(&rng, 5);
    w.n_servers = 300;
    w.n_nodes = 6;
    w.draw = DRAW_CONTINUOUS;
    for (uint32_t i = 0; i < w.n_servers; i++) {
        draw_server(&rng, &w, &w.servers[i]);
        if (isnan(w.servers[i].speed_factor))
            w.servers[i].speed_factor = 1;
    }
    for (uint32_t i = 0; i < w.n_nodes * w.n_nodes; i++)
        w.links[i] = draw_link(&rng, &w);
    dh_snapshot_t snap = {w.servers, w.n_servers, w.links, w.n_nodes};
    dh_place_index_t *idx = NULL;
    assert_int_equal(dh_place_index_new(&idx, &snap), 0);
    tally_t tally = {0};
    for (int step = 0; step < 3000; step++) {
        uint32_t i = (uint32_t)dh_rng_below(&rng, w.n_servers);
        w.servers[i].speed_factor = 0.2 + 3 * dh_rng_uniform(&rng);
        assert_int_equal(dh_place_index_update(idx, i, &w.servers[i]), 0);
        dh_place_config_t cfg;
        dh_request_cost_t r;
        dh_place_config_default(&cfg);
        draw_request(&rng, &w, &r);
        check_one(&w, idx, &cfg, &r, &tally);
    }
    dh_place_index_destroy(&idx);
    assert_int_equal(tally.decisions, 3000);
}

static void place_index_rejects_bad_input(void **state)
{
    dh_server_state_t s[2] = {{.node = 0, .alive = 1, .workers = 1, .speed_factor = 1},
                              {.node = 2, .alive = 1, .workers = 1, .speed_factor = 1}};
    dh_link_t l[4] = {{1e-9, 0}, {1e-9, 0}, {1e-9, 0}, {1e-9, 0}};
    dh_snapshot_t snap = {s, 2, l, 2};
    dh_place_index_t *idx = NULL;
    /* a server on node 2 of 2 */
    assert_int_equal(dh_place_index_new(&idx, &snap), DH_EINVAL);
    assert_null(idx);
    assert_non_null(strstr(dh_last_error(), "server 1"));
    snap.n_nodes = 0;
    assert_int_equal(dh_place_index_new(&idx, &snap), DH_EINVAL);
    s[1].node = 1;
    snap.n_nodes = 2;
    assert_int_equal(dh_place_index_new(&idx, &snap), 0);
    assert_int_equal(dh_place_index_update(idx, 2, &s[0]), DH_EINVAL);
    s[0].node = 5;
    assert_int_equal(dh_place_index_update(idx, 0, &s[0]), DH_EINVAL);
    assert_int_equal(dh_place_index_set_link(idx, 0, 2, l[0]), DH_EINVAL);
    dh_place_config_t cfg;
    dh_place_config_default(&cfg);
    dh_request_cost_t r = {.cpu_s = 1, .consumer_node = 2, .local_server = 0};
    dh_decision_t d = {0};
    assert_int_equal(dh_place_index_decide(idx, &cfg, &r, &d), DH_EINVAL);
    /* an empty snapshot decides as dh_place does: no live server */
    dh_place_index_destroy(&idx);
    snap.n_servers = 0;
    assert_int_equal(dh_place_index_new(&idx, &snap), 0);
    r.consumer_node = 0;
    assert_int_equal(dh_place_index_decide(idx, &cfg, &r, &d), DH_ENOSERVER);
    assert_int_equal(d.server, -1);
    assert_int_equal(d.reason, DH_REASON_NO_CANDIDATE);
    dh_place_index_destroy(&idx);
    dh_place_index_destroy(&idx); /* safe on NULL */
}

static int build_index(void *ctx)
{
    world_t *w = ctx;
    dh_snapshot_t snap = {w->servers, w->n_servers, w->links, w->n_nodes};
    dh_place_index_t *idx = NULL;
    int rc = dh_place_index_new(&idx, &snap);
    if (rc)
        return rc;
    /* updates, the re-sort on drift included, allocate nothing */
    for (uint32_t k = 0; k < w->n_servers; k++) {
        dh_server_state_t s = w->servers[k];
        s.speed_factor += 1;
        if ((rc = dh_place_index_update(idx, k, &s)) != 0)
            break;
    }
    dh_place_index_destroy(&idx);
    return rc;
}

static void place_index_survives_allocation_failures(void **state)
{
    static world_t w;
    dh_rng_t rng;
    dh_rng_seed(&rng, 11);
    w.n_servers = 40;
    w.n_nodes = 4;
    w.draw = DRAW_CONTINUOUS;
    for (uint32_t i = 0; i < w.n_servers; i++)
        draw_server(&rng, &w, &w.servers[i]);
    for (uint32_t i = 0; i < w.n_nodes * w.n_nodes; i++)
        w.links[i] = draw_link(&rng, &w);
    assert_true(dh_test_each_allocation_failure(build_index, &w) >= 10);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(place_index_equals_exhaustive_rule_on_random_snapshots),
    cmocka_unit_test(place_index_stays_exact_as_speeds_drift),
    cmocka_unit_test(place_index_rejects_bad_input),
    cmocka_unit_test(place_index_survives_allocation_failures),
};
DH_TEST_MAIN(tests)
