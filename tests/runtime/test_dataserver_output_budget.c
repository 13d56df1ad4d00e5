/* test_dataserver_output_budget.c: the process's budget for DataServer tasks' heap memory
 * (src/runtime/dataserver_output_budget.c): a reservation waits while the budget is taken and goes
 * on when memory is given back, one task alone always passes, a stop ends the wait, settling
 * shrinks (or makes) a charge without waiting, and payload frames hold it until the last is
 * freed. Each case runs in its own process (CTest), so each sets DH_OUTPUT_BUDGET before
 * the budget is first read. Waits are on conditions (the count of waiting threads), never
 * on sleeps. */
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "runtime/rt.h"

static void budget_of(const char *bytes)
{
    setenv("DH_OUTPUT_BUDGET", bytes, 1);
}

typedef struct waiter {
    uint64_t bytes;
    atomic_int *stop;
    dh__out_charge_t *charge;
    bool waited;
    atomic_int done;
} waiter_t;

static void *reserve_main(void *arg)
{
    waiter_t *w = arg;
    w->charge = dh__out_reserve(w->bytes, w->stop, &w->waited);
    atomic_store(&w->done, 1);
    return NULL;
}

/* Waits for a condition, failing after 10 s (a broken budget must fail, not hang). */
#define WAIT_FOR(cond)                                                                             \
    do {                                                                                           \
        uint64_t until_ = dh_clock_now_ns() + 10000000000ull;                                      \
        while (!(cond)) {                                                                          \
            if (dh_clock_now_ns() > until_)                                                        \
                fail_msg("not within 10 s: %s", #cond);                                            \
            sched_yield();                                                                         \
        }                                                                                          \
    } while (0)

static void until_waiting(unsigned n)
{
    WAIT_FOR(dh__out_waiting() == n);
}

static void join(pthread_t t, waiter_t *w)
{
    WAIT_FOR(atomic_load(&w->done));
    pthread_join(t, NULL);
}

static void a_reservation_waits_for_memory_given_back(void **state)
{
    budget_of("1000");
    assert_int_equal(dh__out_budget(), 1000);
    atomic_int stop = 0;
    bool waited = true;
    dh__out_charge_t *a = dh__out_reserve(700, &stop, &waited);
    assert_non_null(a);
    assert_false(waited);
    assert_int_equal(dh__out_reserved(), 700);
    waiter_t w = {.bytes = 400, .stop = &stop};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reserve_main, &w), 0);
    until_waiting(1); /* 700 + 400 > 1000: it waits */
    assert_int_equal(atomic_load(&w.done), 0);
    dh__out_release(a);
    join(t, &w);
    assert_true(w.waited);
    assert_int_equal(dh__out_reserved(), 400);
    assert_int_equal(dh__out_waiting(), 0);
    dh__out_release(w.charge);
    assert_int_equal(dh__out_reserved(), 0);
    assert_int_equal(dh__out_peak(), 700);
}

static void one_task_alone_passes_and_a_stop_ends_the_wait(void **state)
{
    budget_of("1000");
    atomic_int stop = 0;
    bool waited = true;
    dh__out_charge_t *big = dh__out_reserve(5000, &stop, &waited); /* alone: never waits */
    assert_false(waited);
    assert_int_equal(dh__out_peak(), 5000);
    waiter_t w = {.bytes = 1, .stop = &stop};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reserve_main, &w), 0);
    until_waiting(1);
    atomic_store(&stop, 1); /* the server stops: the wait ends within its 100 ms tick */
    join(t, &w);
    assert_true(w.waited);
    dh__out_release(w.charge);
    dh__out_release(big);
    assert_int_equal(dh__out_reserved(), 0);
    assert_null(dh__out_reserve(0, &stop, &waited)); /* nothing to reserve */
}

static void settling_shrinks_a_charge_and_wakes_waiters(void **state)
{
    budget_of("1000");
    atomic_int stop = 0;
    bool waited;
    /* a task's peak (decoded samples + its batch) ... */
    dh__out_charge_t *c = dh__out_reserve(900, &stop, &waited);
    waiter_t w = {.bytes = 500, .stop = &stop};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reserve_main, &w), 0);
    until_waiting(1);
    /* ... settled to the batch it holds on the heap when it has run */
    dh__out_settle(&c, 300);
    join(t, &w);
    assert_int_equal(dh__out_reserved(), 800);
    /* two payload frames hold the charge: the bytes come back with the last */
    dh__out_charge_add(c, 2);
    dh__out_release(c); /* the task's own reference */
    void *f1 = dh_malloc(16), *f2 = dh_malloc(16);
    dh__out_free_payload(f1, c);
    assert_int_equal(dh__out_reserved(), 800);
    dh__out_free_payload(f2, c);
    assert_int_equal(dh__out_reserved(), 500);
    /* settling up never waits, even past the budget */
    dh__out_settle(&w.charge, 1500);
    assert_int_equal(dh__out_reserved(), 1500);
    /* a task that reserved nothing (unknown sizes) but holds heap: a charge is made */
    dh__out_charge_t *none = NULL;
    dh__out_settle(&none, 0);
    assert_null(none);
    dh__out_settle(&none, 100);
    assert_non_null(none);
    assert_int_equal(dh__out_reserved(), 1600);
    dh__out_release(none);
    dh__out_release(w.charge);
    assert_int_equal(dh__out_reserved(), 0);
}

static void a_task_reserves_its_decoded_samples_and_padded_batch(void **state)
{
    dh__rt_pipeline_t p;
    memset(&p, 0, sizeof p);
    p.video.dtype = DH_DTYPE_UINT8;
    dh_wire_sample_t s[2] = {
        {.frames = 60, .height = 720, .width = 1280, .out_bytes = 165888000},
        {.frames = 48, .height = 1280, .width = 720, .out_bytes = 132710400},
    };
    uint64_t transient, output;
    dh__rt_task_memory(&p, s, 2, &transient, &output);
    assert_int_equal(transient, 165888000ull + 132710400ull);
    /* portrait and landscape pad to 1280 x 1280, 60 frames */
    assert_int_equal(output, 2ull * 60 * 3 * 1280 * 1280);
    p.video.dtype = DH_DTYPE_FLOAT32;
    dh__rt_task_memory(&p, s, 2, &transient, &output);
    assert_int_equal(output, 4ull * 2 * 60 * 3 * 1280 * 1280);
    /* landscape only: H and W padded each to its own largest */
    dh_wire_sample_t wide[2] = {
        {.frames = 2, .height = 100, .width = 200},
        {.frames = 3, .height = 120, .width = 150},
    };
    dh__rt_task_memory(&p, wide, 2, &transient, &output);
    assert_int_equal(output, 4ull * 2 * 3 * 3 * 120 * 200);
    /* a size unknown: that sample's out_bytes, the batch padded to the largest sample */
    s[1].frames = 0;
    dh__rt_task_memory(&p, s, 2, &transient, &output);
    assert_int_equal(output, 2ull * 4 * 60 * 3 * 720 * 1280);
    assert_int_equal(transient, 4ull * 60 * 3 * 720 * 1280 + 132710400ull);
    /* synthetic: stand-in bytes, no decoded samples held */
    p.synthetic = true;
    p.bytes_scale = 0.5;
    dh__rt_task_memory(&p, s, 2, &transient, &output);
    assert_int_equal(transient, 0);
    assert_int_equal(output, (165888000ull + 132710400ull) / 2);
    dh__rt_task_memory(&p, s, 0, &transient, &output);
    assert_int_equal(transient + output, 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(a_reservation_waits_for_memory_given_back),
    cmocka_unit_test(one_task_alone_passes_and_a_stop_ends_the_wait),
    cmocka_unit_test(settling_shrinks_a_charge_and_wakes_waiters),
    cmocka_unit_test(a_task_reserves_its_decoded_samples_and_padded_batch),
};

DH_TEST_MAIN(tests)
