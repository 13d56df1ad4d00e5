/* Tests of the allocator hook and allocation fault injection. */
#include <stdint.h>
#include <stdlib.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/stats.h"

static long custom_calls;
static void *counting_malloc(size_t n)
{
    custom_calls++;
    return malloc(n);
}

static void alloc_hook_is_used(void **state)
{
    dh_allocator_t a = {counting_malloc, realloc, free};
    dh_alloc_set(&a);
    custom_calls = 0;
    void *p = dh_malloc(16);
    assert_non_null(p);
    assert_int_equal(custom_calls, 1);
    dh_free(p);
    dh_alloc_set(NULL);
    p = dh_malloc(16);
    assert_int_equal(custom_calls, 1);
    dh_free(p);
}

static void alloc_fail_after_fails_exactly_one(void **state)
{
    dh_alloc_reset_count();
    dh_alloc_fail_after(2);
    void *a = dh_malloc(8), *b = dh_malloc(8), *c = dh_malloc(8), *d = dh_malloc(8);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(c);
    assert_non_null(d);
    dh_free(a);
    dh_free(b);
    dh_free(d);
    assert_int_equal(dh_alloc_count(), 4);
    dh_alloc_fail_after(-1);
}

static void calloc_overflow_fails(void **state)
{
    assert_null(dh_calloc(SIZE_MAX / 2, 4));
    assert_null(dh_reallocarray(NULL, SIZE_MAX / 2, 4));
    char *s = dh_strndup("abcdef", 3);
    assert_string_equal(s, "abc");
    dh_free(s);
}

/* Every allocation of the stats collector failing in turn gives DH_ENOMEM, no crash and
 * no leak (the allocation-failure run of docs/conventions.md "Tests"). */
static int stats_fill(void *ctx)
{
    dh_stats_t *s = NULL;
    int rc = dh_stats_new(&s);
    for (int i = 0; rc == 0 && i < 1000; i++)
        rc = dh_stats_add(s, i);
    dh_stats_destroy(&s);
    return rc;
}

static void stats_survives_each_allocation_failure(void **state)
{
    assert_true(dh_test_each_allocation_failure(stats_fill, NULL) > 1);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(alloc_hook_is_used),
    cmocka_unit_test(alloc_fail_after_fails_exactly_one),
    cmocka_unit_test(calloc_overflow_fails),
    cmocka_unit_test(stats_survives_each_allocation_failure),
};
DH_TEST_MAIN(tests)
