/* Tests of placement (docs/design.md §4.3): each rule of the deadline policy, the baselines,
 * backpressure, determinism, and rule invariants over random snapshots. */
#include <math.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "datahelix/place.h"
#include "datahelix/rng.h"
#include "sched/place_internal.h"

/* Two nodes, 10 GB/s links with 1 ms latency. The consumer is on node 0. */
static dh_link_t links[4] = {{1e-10, 0}, {1e-10, 0.001}, {1e-10, 0.001}, {1e-10, 0}};

static dh_server_state_t server(uint32_t node, double speed)
{
    dh_server_state_t s = {.node = node,
                           .role = node ? DH_SERVER_REMOTE : DH_SERVER_LOCAL,
                           .alive = 1,
                           .workers = 4,
                           .queue_len = 0,
                           .queue_cap = 8,
                           .queue_wait_s = 0,
                           .speed_factor = speed,
                           .storage_s_per_B = 1e-12};
    return s;
}

/* A request with 1 s of CPU at speed 1, no input cost, 10 MB out (1 ms on a link). */
static dh_request_cost_t request(double deadline_s)
{
    dh_request_cost_t r = {.cpu_s = 1.0,
                           .in_bytes = 0,
                           .out_bytes = 1e7,
                           .deadline_s = deadline_s,
                           .consumer_node = 0,
                           .local_server = 0};
    return r;
}

static int place(dh_policy_t policy, dh_server_state_t *servers, uint32_t n,
                 const dh_request_cost_t *req, dh_decision_t *d, dh_candidate_t *cand)
{
    dh_place_config_t cfg;
    dh_place_config_default(&cfg);
    cfg.policy = policy;
    dh_snapshot_t snap = {servers, n, links, 2};
    d->candidates = cand;
    return dh_place(&cfg, &snap, req, d);
}

static void place_local_kept_when_it_meets_deadline(void **state)
{
    /* local T = 0.5; remote T = 0.45 + 0.002: a gain of 0.048 < 10% of 0.5. */
    dh_server_state_t s[2] = {server(0, 0.5), server(1, 0.45)};
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[2];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_REASON_LOCAL_MEETS);
}

/* Rule 2 is T <= D: a local server whose predicted ready time equals the deadline exactly
 * meets it and is kept (a strict '<' would send the request to the faster remote). Its T is
 * read from a first decision's candidates, then used as the deadline. */
static void place_local_meeting_the_deadline_exactly_is_kept(void **state)
{
    dh_server_state_t s[2] = {server(0, 0.5), server(1, 0.45)};
    dh_request_cost_t r = request(10.0);
    dh_decision_t d;
    dh_candidate_t c[2];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    double t_local = c[0].t_s;
    assert_true(t_local > 0 && c[1].t_s < t_local); /* the remote is faster */
    r.deadline_s = t_local;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_close(c[0].t_s, t_local, 0);
    assert_close(c[0].miss_s, 0, 0);
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_REASON_LOCAL_MEETS);
    /* a hair later than D, it misses: the remote (which meets D) takes it */
    r.deadline_s = nextafter(t_local, 0);
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 1);
}

static void place_remote_chosen_when_gain_beats_hysteresis(void **state)
{
    dh_server_state_t s[2] = {server(0, 0.9), server(1, 0.3)};
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, NULL), 0);
    assert_int_equal(d.server, 1);
    assert_int_equal(d.reason, DH_REASON_REMOTE_GAIN);
}

static void place_hysteresis_threshold_is_what_keeps_local(void **state)
{
    dh_server_state_t s[2] = {server(0, 0.5), server(1, 0.45)};
    dh_request_cost_t r = request(1.0);
    dh_place_config_t cfg = {DH_POLICY_DEADLINE, 0.0, 0.0};
    dh_snapshot_t snap = {s, 2, links, 2};
    dh_decision_t d = {0};
    /* Without hysteresis the same snapshot goes remote: the threshold made the difference. */
    assert_int_equal(dh_place(&cfg, &snap, &r, &d), 0);
    assert_int_equal(d.server, 1);
    assert_int_equal(d.reason, DH_REASON_REMOTE_GAIN);
    /* An absolute threshold larger than the gain keeps it local again. */
    cfg.hysteresis_s = 0.1;
    assert_int_equal(dh_place(&cfg, &snap, &r, &d), 0);
    assert_int_equal(d.server, 0);
}

static void place_remote_chosen_when_local_misses(void **state)
{
    dh_server_state_t s[2] = {server(0, 2.0), server(1, 0.8)};
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[2];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 1);
    assert_int_equal(d.reason, DH_REASON_LEAST_TRANSFER);
    assert_close(c[0].miss_s, 1.0, 1e-9);
    assert_close(c[1].miss_s, 0.0, 0);
}

static void place_least_transfer_among_those_meeting(void **state)
{
    /* Local misses. Server 1 (other node) is fastest; server 2 is a sidecar on the
     * consumer's node: slower but moves no bytes between nodes. Both meet D. */
    dh_server_state_t s[3] = {server(0, 3.0), server(1, 0.2), server(0, 0.7)};
    s[2].role = DH_SERVER_REMOTE;
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, NULL), 0);
    assert_int_equal(d.server, 2);
    assert_int_equal(d.reason, DH_REASON_LEAST_TRANSFER);
    /* With equal transfer the smaller T wins. */
    s[2].node = 1;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, NULL), 0);
    assert_int_equal(d.server, 1);
}

static void place_earliest_finish_when_all_miss(void **state)
{
    dh_server_state_t s[3] = {server(0, 3.0), server(1, 2.0), server(1, 1.5)};
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[3];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), 0);
    assert_int_equal(d.server, 2);
    assert_int_equal(d.reason, DH_REASON_EARLIEST_FINISH);
    for (int i = 0; i < 3; i++)
        assert_true(c[i].miss_s > 0);
}

static void place_backpressure_excludes_full_servers(void **state)
{
    dh_server_state_t s[3] = {server(0, 2.0), server(1, 0.2), server(1, 0.6)};
    s[1].queue_len = s[1].queue_cap; /* the fastest one is full */
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[3];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), 0);
    assert_int_equal(d.server, 2);
    assert_int_equal(c[1].status, DH_CANDIDATE_FULL);
    assert_int_equal(c[2].status, DH_CANDIDATE_OK);
    /* All full: backpressure, not a crash and not a dead cluster. */
    s[0].queue_len = s[0].queue_cap;
    s[2].queue_len = s[2].queue_cap;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), DH_EAGAIN);
    assert_int_equal(d.server, -1);
    assert_int_equal(d.reason, DH_REASON_NO_CANDIDATE);
    assert_int_equal(place(DH_POLICY_LEAST_REQUEST, s, 3, &r, &d, c), DH_EAGAIN);
}

/* Full means queue_len >= queue_cap: one below the cap is still eligible (and, fastest,
 * chosen), and a cap of 0 means no cap. */
static void place_queue_one_below_cap_is_eligible(void **state)
{
    dh_server_state_t s[3] = {server(0, 2.0), server(1, 0.2), server(1, 0.6)};
    s[1].queue_len = s[1].queue_cap - 1;
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[3];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), 0);
    assert_int_equal(c[1].status, DH_CANDIDATE_OK);
    assert_int_equal(d.server, 1);
    s[1].queue_len = s[1].queue_cap;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), 0);
    assert_int_equal(c[1].status, DH_CANDIDATE_FULL);
    s[1].queue_cap = 0;
    s[1].queue_len = 1000;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), 0);
    assert_int_equal(c[1].status, DH_CANDIDATE_OK);
    assert_int_equal(d.server, 1);
}

static void place_dead_servers_excluded(void **state)
{
    dh_server_state_t s[3] = {server(0, 2.0), server(1, 0.2), server(1, 0.6)};
    s[1].alive = 0;
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[3];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), 0);
    assert_int_equal(d.server, 2);
    assert_int_equal(c[1].status, DH_CANDIDATE_DEAD);
    s[0].alive = s[2].alive = 0;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 3, &r, &d, c), DH_ENOSERVER);
    assert_int_equal(d.server, -1);
    assert_true(strstr(dh_last_error(), "alive") != NULL);
}

static void place_queue_delays_a_busy_server(void **state)
{
    /* The local server is fast but its workers are all busy with 8 s of queued work. */
    dh_server_state_t s[2] = {server(0, 0.2), server(1, 0.5)};
    s[0].queue_len = 4;
    s[0].queue_wait_s = 8.0 / 4;
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[2];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_close(c[0].t_s, 0.2 + 8.0 / 4, 1e-9);
    assert_int_equal(d.server, 1);
}

static void place_ties_break_on_lowest_index(void **state)
{
    dh_server_state_t s[4] = {server(0, 3.0), server(1, 0.5), server(1, 0.5), server(1, 0.5)};
    dh_request_cost_t r = request(1.0);
    dh_decision_t d1, d2;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 4, &r, &d1, NULL), 0);
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 4, &r, &d2, NULL), 0);
    assert_int_equal(d1.server, 1);
    assert_int_equal(d2.server, d1.server);
    assert_int_equal(place(DH_POLICY_LEAST_REQUEST, s, 4, &r, &d1, NULL), 0);
    assert_int_equal(d1.server, 0);
}

/* Bytes the request moves between nodes if run on server i: 0 on the consumer's node. */
static double transfer_bytes(const dh_snapshot_t *snap, const dh_request_cost_t *req, uint32_t i)
{
    return snap->servers[i].node == req->consumer_node ? 0.0 : req->out_bytes;
}

/* The candidates' T is the one computation of place_internal.h (dh__place_server_t), which
 * the index path shares: cpu x speed + in x storage + queue + net. A dead server (here: no
 * workers) is reported with T = +inf. */
static void place_candidates_match_server_t(void **state)
{
    dh_server_state_t s[4] = {server(0, 1.3), server(1, 0.7), server(1, 1.0), server(1, 1.0)};
    s[1].storage_s_per_B = 1e-8;
    s[2].queue_len = 5;
    s[2].queue_wait_s = 2.0 / 4;
    s[3].workers = 0; /* no workers: dead */
    dh_request_cost_t r = request(1.0);
    r.in_bytes = 5e7;
    dh_snapshot_t snap = {s, 4, links, 2};
    dh_decision_t d;
    dh_candidate_t c[4];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 4, &r, &d, c), 0);
    for (uint32_t i = 0; i < 3; i++) {
        double t = dh__place_server_t(&snap, &r, i);
        assert_true(c[i].t_s == t);
        assert_close(c[i].miss_s, fmax(0, t - r.deadline_s), 1e-12);
    }
    /* Server 0 (the consumer's node): cpu 1.3 + io 5e-5, no queue, no transfer. */
    assert_close(c[0].t_s, 1.3 + 5e-5, 1e-12);
    /* Server 1: cpu 0.7 + io 0.5 + net 1e7/1e10 + 1 ms. */
    assert_close(c[1].t_s, 0.7 + 0.5 + 0.002, 1e-12);
    /* Server 2: all 4 workers busy (5 queued): its wait 0.5 is added. */
    assert_close(c[2].t_s, 1.0 + 5e-5 + 0.5 + 0.002, 1e-12);
    assert_int_equal(c[3].status, DH_CANDIDATE_DEAD);
    assert_true(isinf(c[3].t_s) && c[3].t_s > 0);
    assert_true(isinf(c[3].miss_s) && c[3].miss_s > 0);
    assert_int_equal(d.server, 1); /* all miss D = 1: the earliest finish */
    assert_int_equal(d.reason, DH_REASON_EARLIEST_FINISH);
    assert_close(transfer_bytes(&snap, &r, 0), 0, 0);
    assert_close(transfer_bytes(&snap, &r, 1), 1e7, 0);
}

static void place_least_request_counts_per_worker(void **state)
{
    dh_server_state_t s[3] = {server(0, 1), server(1, 1), server(1, 1)};
    s[0].queue_len = 3; /* 3 per 4 workers */
    s[1].queue_len = 2;
    s[1].workers = 2;   /* 1 per worker */
    s[2].queue_len = 1; /* 1 per 4 workers: fewest */
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    assert_int_equal(place(DH_POLICY_LEAST_REQUEST, s, 3, &r, &d, NULL), 0);
    assert_int_equal(d.server, 2);
    assert_int_equal(d.reason, DH_REASON_LEAST_REQUEST);
}

static void place_local_policy_stays_local(void **state)
{
    dh_server_state_t s[2] = {server(0, 5.0), server(1, 0.1)};
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    assert_int_equal(place(DH_POLICY_LOCAL, s, 2, &r, &d, NULL), 0);
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_REASON_LOCAL_POLICY);
    s[0].queue_len = s[0].queue_cap;
    assert_int_equal(place(DH_POLICY_LOCAL, s, 2, &r, &d, NULL), DH_EAGAIN);
    s[0].alive = 0;
    assert_int_equal(place(DH_POLICY_LOCAL, s, 2, &r, &d, NULL), DH_ENOSERVER);
    r.local_server = -1;
    s[0].alive = 1;
    assert_int_equal(place(DH_POLICY_LOCAL, s, 2, &r, &d, NULL), DH_ENOSERVER);
}

static void place_policy_names_round_trip(void **state)
{
    for (int i = 0; i < DH_POLICY_COUNT; i++) {
        dh_policy_t p;
        assert_int_equal(dh_policy_from_name(dh_policy_name((dh_policy_t)i), &p), 0);
        assert_int_equal(p, i);
    }
    dh_policy_t p;
    assert_int_equal(dh_policy_from_name("fastest", &p), DH_EUNKNOWN);
    assert_true(strstr(dh_last_error(), "fastest") != NULL);
    for (int r = 0; r <= DH_REASON_NO_CANDIDATE; r++) {
        assert_string_not_equal(dh_place_reason_name((dh_place_reason_t)r), "?");
        assert_string_not_equal(dh_place_reason_text((dh_place_reason_t)r), "?");
    }
}

/* The decision carries the chosen server's T and miss (the same bits as its candidate entry),
 * and NaN for both when nothing is chosen. */
static void place_decision_reports_chosen_t_and_miss(void **state)
{
    dh_server_state_t s[2] = {server(0, 0.5), server(1, 3.0)};
    dh_request_cost_t r = request(1.0);
    dh_decision_t d;
    dh_candidate_t c[2];
    r.local_server = 1; /* local on node 1 misses D; server 0 meets it */
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 0);
    assert_memory_equal(&d.t_s, &c[0].t_s, sizeof d.t_s);
    assert_memory_equal(&d.miss_s, &c[0].miss_s, sizeof d.miss_s);
    assert_int_equal(place(DH_POLICY_LOCAL, s, 2, &r, &d, c), 0);
    assert_memory_equal(&d.t_s, &c[1].t_s, sizeof d.t_s);
    assert_true(d.miss_s > 1.9 && d.miss_s == c[1].miss_s);
    s[0].alive = s[1].alive = 0;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), DH_ENOSERVER);
    assert_true(isnan(d.t_s) && isnan(d.miss_s));
}

/* Over random snapshots, every deadline decision satisfies what its reason claims. */
/* A remote sample (issue 34): the rank's local server is far from the data (its learned
 * fetch 0.8 s), a sidecar on another node near it (0.05 s). The fetch is C_io: the sidecar
 * is chosen where, without the fetch, the local server meets D and is kept. */
static void place_prefers_the_server_whose_fetch_is_cheaper(void **state)
{
    dh_server_state_t s[2] = {server(0, 1.0), server(1, 1.0)};
    dh_request_cost_t r = request(0.5);
    r.cpu_s = 0.1;
    dh_decision_t d;
    dh_candidate_t c[2];
    /* local files only: both meet D, the local one is kept */
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_REASON_LOCAL_MEETS);
    double t_local = c[0].t_s, t_sidecar = c[1].t_s;

    const double fetch[2] = {0.8, 0.05};
    r.fetch_s = fetch;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 1);
    assert_int_equal(d.reason, DH_REASON_LEAST_TRANSFER); /* the local one misses D now */
    assert_close(c[0].t_s, t_local + 0.8, 1e-12);
    assert_close(c[1].t_s, t_sidecar + 0.05, 1e-12);
    assert_close(d.t_s, c[1].t_s, 0);
    assert_close(c[0].miss_s, t_local + 0.8 - 0.5, 1e-12);

    /* both meet a later D: the sidecar's gain (0.75 s) beats the hysteresis */
    r.deadline_s = 2.0;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 1);
    assert_int_equal(d.reason, DH_REASON_REMOTE_GAIN);

    /* the sidecar far from the data instead: the local server is kept */
    const double fetch_far[2] = {0.05, 0.8};
    r.fetch_s = fetch_far;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_REASON_LOCAL_MEETS);
}

/* A fetch entry that is negative or NaN counts as 0 (the term stays >= 0, as the index's
 * bounds need): every T is bit for bit the T without a fetch. */
static void place_fetch_entries_below_zero_or_nan_count_as_zero(void **state)
{
    dh_server_state_t s[2] = {server(0, 1.0), server(1, 1.0)};
    dh_request_cost_t r = request(0.5);
    dh_decision_t d;
    dh_candidate_t c[2], none[2];
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, none), 0);
    const double odd[2] = {-3.0, NAN};
    r.fetch_s = odd;
    assert_int_equal(place(DH_POLICY_DEADLINE, s, 2, &r, &d, c), 0);
    assert_true(memcmp(&c[0].t_s, &none[0].t_s, sizeof(double)) == 0);
    assert_true(memcmp(&c[1].t_s, &none[1].t_s, sizeof(double)) == 0);
}

static void place_rules_hold_on_random_snapshots(void **state)
{
    enum { N = 24, NODES = 4 };
    dh_link_t l[NODES * NODES];
    dh_server_state_t s[N];
    dh_candidate_t c[N];
    dh_rng_t rng;
    dh_rng_seed(&rng, 99);
    dh_place_config_t cfg;
    dh_place_config_default(&cfg);
    int seen[DH_REASON_NO_CANDIDATE + 1] = {0};
    for (int iter = 0; iter < 20000; iter++) {
        for (int i = 0; i < NODES * NODES; i++)
            l[i] = dh_link_make(1e8 + dh_rng_uniform(&rng) * 1e10, dh_rng_uniform(&rng) * 1e-3);
        for (uint32_t i = 0; i < N; i++) {
            s[i] = server(i % NODES, 0.5 + dh_rng_uniform(&rng));
            s[i].alive = dh_rng_uniform(&rng) > 0.05;
            s[i].queue_len = (uint32_t)dh_rng_below(&rng, 10);
            s[i].queue_wait_s = s[i].queue_len * dh_rng_uniform(&rng) / s[i].workers;
            s[i].storage_s_per_B = 1.0 / (1e8 + dh_rng_uniform(&rng) * 1e9);
        }
        dh_request_cost_t r = {.cpu_s = 0.2 + dh_rng_uniform(&rng),
                               .in_bytes = dh_rng_uniform(&rng) * 1e8,
                               .out_bytes = dh_rng_uniform(&rng) * 1e9,
                               .deadline_s = dh_rng_uniform(&rng) * 3,
                               .consumer_node = (uint32_t)dh_rng_below(&rng, NODES),
                               .local_server = 0};
        r.local_server = (int32_t)r.consumer_node; /* server i sits on node i % NODES */
        dh_snapshot_t snap = {s, N, l, NODES};
        dh_decision_t d = {.candidates = c};
        int rc = dh_place(&cfg, &snap, &r, &d);
        seen[d.reason]++;
        if (rc != 0) {
            assert_int_equal(d.server, -1);
            for (int i = 0; i < N; i++)
                assert_int_not_equal(c[i].status, DH_CANDIDATE_OK);
            continue;
        }
        assert_int_equal(c[d.server].status, DH_CANDIDATE_OK);
        double tl = c[r.local_server].t_s;
        int local_ok = c[r.local_server].status == DH_CANDIDATE_OK;
        switch (d.reason) {
        case DH_REASON_LOCAL_MEETS:
            assert_int_equal(d.server, r.local_server);
            assert_true(tl <= r.deadline_s);
            break;
        case DH_REASON_REMOTE_GAIN:
            assert_true(local_ok && tl <= r.deadline_s);
            assert_true(c[d.server].t_s <= r.deadline_s);
            assert_true(tl - c[d.server].t_s > fmax(cfg.hysteresis_s, cfg.hysteresis_frac * tl));
            break;
        case DH_REASON_LEAST_TRANSFER:
            assert_true(!local_ok || tl > r.deadline_s);
            assert_true(c[d.server].t_s <= r.deadline_s);
            for (uint32_t i = 0; i < N; i++)
                if (c[i].status == DH_CANDIDATE_OK && c[i].t_s <= r.deadline_s)
                    assert_true(transfer_bytes(&snap, &r, i) >=
                                transfer_bytes(&snap, &r, (uint32_t)d.server));
            break;
        case DH_REASON_EARLIEST_FINISH:
            for (uint32_t i = 0; i < N; i++)
                if (c[i].status == DH_CANDIDATE_OK) {
                    assert_true(c[i].t_s > r.deadline_s);
                    assert_true(c[i].t_s >= c[d.server].t_s);
                }
            break;
        default:
            fail_msg("unexpected reason %d", d.reason);
        }
    }
    /* The random cases exercised every rule. */
    assert_true(seen[DH_REASON_LOCAL_MEETS] > 0);
    assert_true(seen[DH_REASON_REMOTE_GAIN] > 0);
    assert_true(seen[DH_REASON_LEAST_TRANSFER] > 0);
    assert_true(seen[DH_REASON_EARLIEST_FINISH] > 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(place_local_kept_when_it_meets_deadline),
    cmocka_unit_test(place_local_meeting_the_deadline_exactly_is_kept),
    cmocka_unit_test(place_remote_chosen_when_gain_beats_hysteresis),
    cmocka_unit_test(place_hysteresis_threshold_is_what_keeps_local),
    cmocka_unit_test(place_remote_chosen_when_local_misses),
    cmocka_unit_test(place_least_transfer_among_those_meeting),
    cmocka_unit_test(place_earliest_finish_when_all_miss),
    cmocka_unit_test(place_backpressure_excludes_full_servers),
    cmocka_unit_test(place_queue_one_below_cap_is_eligible),
    cmocka_unit_test(place_dead_servers_excluded),
    cmocka_unit_test(place_queue_delays_a_busy_server),
    cmocka_unit_test(place_ties_break_on_lowest_index),
    cmocka_unit_test(place_candidates_match_server_t),
    cmocka_unit_test(place_least_request_counts_per_worker),
    cmocka_unit_test(place_local_policy_stays_local),
    cmocka_unit_test(place_policy_names_round_trip),
    cmocka_unit_test(place_decision_reports_chosen_t_and_miss),
    cmocka_unit_test(place_rules_hold_on_random_snapshots),
    cmocka_unit_test(place_prefers_the_server_whose_fetch_is_cheaper),
    cmocka_unit_test(place_fetch_entries_below_zero_or_nan_count_as_zero),
};
DH_TEST_MAIN(tests)
