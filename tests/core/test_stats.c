/* Tests of the percentile statistics. */
#include "dh_test.h"
#include "datahelix/stats.h"

static void stats_percentiles_interpolate(void **state)
{
    dh_stats_t *s = NULL;
    assert_int_equal(dh_stats_new(&s), 0);
    for (int i = 100; i >= 1; i--) /* unsorted input */
        assert_int_equal(dh_stats_add(s, i), 0);
    assert_int_equal(dh_stats_count(s), 100);
    assert_close(dh_stats_mean(s), 50.5, 1e-12);
    assert_close(dh_stats_percentile(s, 0), 1, 0);
    assert_close(dh_stats_percentile(s, 100), 100, 0);
    assert_close(dh_stats_percentile(s, 50), 50.5, 1e-12);
    assert_close(dh_stats_percentile(s, 95), 95.05, 1e-9);
    assert_close(dh_stats_percentile(s, 99), 99.01, 1e-9);
    assert_close(dh_stats_max(s), 100, 0);
    /* Appending after a percentile query re-sorts. */
    assert_int_equal(dh_stats_add(s, 0), 0);
    assert_close(dh_stats_percentile(s, 0), 0, 0);
    dh_stats_destroy(&s);
    assert_null(s);
    dh_stats_destroy(&s); /* safe on NULL */
}

static void stats_empty_is_zero(void **state)
{
    dh_stats_t *s = NULL;
    assert_int_equal(dh_stats_new(&s), 0);
    assert_close(dh_stats_percentile(s, 50), 0, 0);
    assert_close(dh_stats_mean(s), 0, 0);
    assert_int_equal(dh_stats_add(s, 7), 0);
    assert_close(dh_stats_percentile(s, 99), 7, 0);
    dh_stats_destroy(&s);
}

static void percentile_of_array(void **state)
{
    double v[] = {5, 1, 4, 2, 3};
    assert_close(dh_percentile_sorted_inplace(v, 5, 50), 3, 0);
    assert_close(v[0], 1, 0);
    assert_close(dh_percentile_sorted_inplace(v, 5, 25), 2, 0);
    assert_close(dh_percentile_sorted_inplace(v, 0, 25), 0, 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(stats_percentiles_interpolate),
    cmocka_unit_test(stats_empty_is_zero),
    cmocka_unit_test(percentile_of_array),
};
DH_TEST_MAIN(tests)
