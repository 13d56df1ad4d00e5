/* Tests of the seeded random generator: determinism, rough uniformity, the mean-one
 * lognormal draw. */
#include <math.h>

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

/* The mean-one lognormal: pure in its seed, exactly 1 at sigma 0, mean 1 and median
 * exp(-sigma^2 / 2) otherwise; the string hash tells names apart. */
static void rng_lognormal_at_is_pure_and_mean_one(void **state)
{
    assert_true(dh_rng_lognormal_at(5, 0) == 1.0);
    assert_true(dh_rng_lognormal_at(5, 0.3) == dh_rng_lognormal_at(5, 0.3));
    assert_true(dh_rng_hash("a") != dh_rng_hash("b"));
    assert_true(dh_rng_hash(NULL) == dh_rng_hash(""));
    double sum = 0;
    int below = 0;
    for (uint64_t i = 0; i < 20000; i++) {
        double f = dh_rng_lognormal_at(dh_rng_mix(9, i), 0.3);
        assert_true(f > 0);
        sum += f;
        below += f < exp(-0.045);
    }
    assert_true(fabs(sum / 20000 - 1) < 0.01);
    assert_in_range(below, 9600, 10400);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(rng_same_seed_same_stream),
    cmocka_unit_test(rng_below_is_in_range_and_uniform),
    cmocka_unit_test(rng_lognormal_at_is_pure_and_mean_one),
};
DH_TEST_MAIN(tests)
