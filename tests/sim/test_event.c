/* Tests of the simulator's event queue (sim/event.c): events come out in time order, ties
 * in insertion order, and the heap survives growth and interleaved pushes and pops. */
#include <stdlib.h>

#include "dh_test.h"
#include "sim/event.h"

static void events_come_out_in_time_order(void **state)
{
    (void)state;
    dh_sim_events_t q = {0};
    srand(7);
    for (uint32_t i = 0; i < 5000; i++)
        assert_int_equal(dh__sim_events_push(&q, (double)(rand() % 1000), 0, i, 0), 0);
    dh_sim_event_t e, last = {-1, 0, 0, 0, 0};
    size_t n = 0;
    while (dh__sim_events_pop(&q, &e)) {
        assert_true(e.t_s > last.t_s || (e.t_s == last.t_s && e.seq > last.seq));
        last = e;
        n++;
    }
    assert_int_equal(n, 5000);
    assert_int_equal(dh__sim_events_pop(&q, &e), 0);
    dh__sim_events_clear(&q);
}

static void ties_keep_insertion_order(void **state)
{
    (void)state;
    dh_sim_events_t q = {0};
    for (uint32_t i = 0; i < 100; i++)
        assert_int_equal(dh__sim_events_push(&q, 1.0, 0, i, 0), 0);
    dh_sim_event_t e;
    for (uint32_t i = 0; i < 100; i++) {
        assert_int_equal(dh__sim_events_pop(&q, &e), 1);
        assert_int_equal(e.a, i);
    }
    dh__sim_events_clear(&q);
}

static void interleaved_push_pop_stays_ordered(void **state)
{
    (void)state;
    dh_sim_events_t q = {0};
    double now = 0;
    srand(3);
    dh_sim_event_t e;
    for (int round = 0; round < 20000; round++) {
        if (q.n == 0 || rand() % 3) {
            assert_int_equal(dh__sim_events_push(&q, now + rand() % 50, 1, 0, 0), 0);
        } else {
            assert_int_equal(dh__sim_events_pop(&q, &e), 1);
            assert_true(e.t_s >= now);
            now = e.t_s;
        }
    }
    dh__sim_events_clear(&q);
    assert_int_equal(q.n, 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(events_come_out_in_time_order),
    cmocka_unit_test(ties_keep_insertion_order),
    cmocka_unit_test(interleaved_push_pop_stays_ordered),
};
DH_TEST_MAIN(tests)
