/* Tests of the placement benchmark harness: it runs, its snapshots exercise every rule of
 * the deadline policy (so the benchmark measures realistic decisions, not one easy path),
 * and it is deterministic in what it decides. Timings are not asserted: see place-bench. */
#include "dh_test.h"
#include "datahelix/error.h"
#include "bench/place_bench.h"

static void place_bench_exercises_every_rule(void **state)
{
    dh_place_bench_result_t r;
    assert_int_equal(
        dh_place_bench_run(128, 20000, 1, DH_POLICY_DEADLINE, DH_PLACE_BENCH_EXHAUSTIVE, &r), 0);
    assert_int_equal(r.decisions, 20000);
    assert_true(r.decisions_per_s > 0);
    assert_true(r.p50_us <= r.p99_us);
    assert_true(r.p99_us <= r.max_us);
    assert_true(r.by_reason[DH_REASON_LOCAL_MEETS] > 0);
    assert_true(r.by_reason[DH_REASON_REMOTE_GAIN] > 0);
    assert_true(r.by_reason[DH_REASON_LEAST_TRANSFER] > 0);
    assert_true(r.by_reason[DH_REASON_EARLIEST_FINISH] > 0);
}

static void place_bench_decisions_are_deterministic(void **state)
{
    dh_place_bench_result_t a, b;
    assert_int_equal(
        dh_place_bench_run(64, 5000, 7, DH_POLICY_DEADLINE, DH_PLACE_BENCH_EXHAUSTIVE, &a), 0);
    assert_int_equal(
        dh_place_bench_run(64, 5000, 7, DH_POLICY_DEADLINE, DH_PLACE_BENCH_EXHAUSTIVE, &b), 0);
    for (int i = 0; i <= DH_REASON_NO_CANDIDATE; i++)
        assert_int_equal(a.by_reason[i], b.by_reason[i]);
}

/* The indexed path makes the exhaustive path's decisions, decision for decision (the hash
 * covers each server, reason and T), under every policy, so its timings are of the same work. */
static void place_bench_paths_decide_the_same(void **state)
{
    for (int policy = 0; policy < DH_POLICY_COUNT; policy++) {
        dh_place_bench_result_t a, b;
        assert_int_equal(
            dh_place_bench_run(256, 4000, 3, (dh_policy_t)policy, DH_PLACE_BENCH_EXHAUSTIVE, &a),
            0);
        assert_int_equal(
            dh_place_bench_run(256, 4000, 3, (dh_policy_t)policy, DH_PLACE_BENCH_INDEXED, &b), 0);
        assert_int_equal(a.decisions_hash, b.decisions_hash);
        for (int i = 0; i <= DH_REASON_NO_CANDIDATE; i++)
            assert_int_equal(a.by_reason[i], b.by_reason[i]);
        assert_true(b.build_ms >= 0);
    }
}

static void place_bench_rejects_bad_sizes(void **state)
{
    dh_place_bench_result_t r;
    assert_int_equal(
        dh_place_bench_run(1, 10, 1, DH_POLICY_DEADLINE, DH_PLACE_BENCH_EXHAUSTIVE, &r), DH_EINVAL);
    assert_int_equal(dh_place_bench_run(8, 0, 1, DH_POLICY_DEADLINE, DH_PLACE_BENCH_EXHAUSTIVE, &r),
                     DH_EINVAL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(place_bench_exercises_every_rule),
    cmocka_unit_test(place_bench_decisions_are_deterministic),
    cmocka_unit_test(place_bench_paths_decide_the_same),
    cmocka_unit_test(place_bench_rejects_bad_sizes),
};
DH_TEST_MAIN(tests)
