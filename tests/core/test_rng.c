/* Tests of the seeded random generator: determinism and rough uniformity. */
#include "dh_test.h"
#include "datahelix/rng.h"

static void rng_same_seed_same_stream(void **state)
{
    dh_rng_t a, b, c;
    dh_rng_seed(&a, 42);
    dh_rng_seed(&b, 42);
    dh_rng_seed(&c, 43);
    int differ = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = dh_rng_next(&a), y = dh_rng_next(&b), z = dh_rng_next(&c);
        assert_int_equal(x, y);
        differ += x != z;
    }
    assert_true(differ > 90);
}

static void rng_below_is_in_range_and_uniform(void **state)
{
    dh_rng_t r;
    dh_rng_seed(&r, 7);
    int counts[10] = {0};
    for (int i = 0; i < 100000; i++) {
        uint64_t v = dh_rng_below(&r, 10);
        assert_true(v < 10);
        counts[v]++;
    }
    for (int i = 0; i < 10; i++)
        assert_in_range(counts[i], 9500, 10500);
    for (int i = 0; i < 1000; i++) {
        double u = dh_rng_uniform(&r);
        assert_true(u >= 0.0 && u < 1.0);
    }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(rng_same_seed_same_stream),
    cmocka_unit_test(rng_below_is_in_range_and_uniform),
};
DH_TEST_MAIN(tests)
