/* test_s3_braces.c: WebDataset's brace patterns: ranges with their zero padding, steps and
 * descending order, alternatives (nested too), several braces, and errors at a position. */
#include <stdio.h>
#include <string.h>

#include "datahelix/error.h"
#include "dh_test.h"
#include "remote/s3.h"

/* Expands and compares with `want`, names joined by ' '. */
static void expands_to(const char *pattern, const char *want)
{
    char **names = NULL;
    long n = dh__brace_expand(pattern, 100000, &names);
    if (n < 0)
        fail_msg("'%s': %s", pattern, dh_last_error());
    char got[4096] = "";
    for (long i = 0; i < n; i++) {
        strncat(got, names[i], sizeof(got) - strlen(got) - 1);
        if (i + 1 < n)
            strncat(got, " ", sizeof(got) - strlen(got) - 1);
    }
    dh__brace_free(names, (size_t)n);
    if (strcmp(got, want) != 0)
        fail_msg("'%s' gave '%s', not '%s'", pattern, got, want);
}

static void ranges_keep_padding(void **state)
{
    (void)state;
    expands_to("s3://b/shards/{000..003}.tar",
               "s3://b/shards/000.tar s3://b/shards/001.tar s3://b/shards/002.tar "
               "s3://b/shards/003.tar");
    expands_to("x{8..11}", "x8 x9 x10 x11");
    expands_to("x{08..11}", "x08 x09 x10 x11");
    expands_to("x{3..1}", "x3 x2 x1");
    expands_to("x{0..10..5}", "x0 x5 x10");
    expands_to("x{-1..1}", "x-1 x0 x1");
    expands_to("x{5..5}", "x5");
}

static void ranges_count(void **state)
{
    (void)state;
    char **names = NULL;
    long n = dh__brace_expand("s3://bucket/shards/{000..099}.tar", 1000, &names);
    assert_int_equal(n, 100);
    assert_string_equal(names[0], "s3://bucket/shards/000.tar");
    assert_string_equal(names[99], "s3://bucket/shards/099.tar");
    dh__brace_free(names, (size_t)n);
}

static void alternatives_and_products(void **state)
{
    (void)state;
    expands_to("{a,b}", "a b");
    expands_to("pre-{a,,c}-post", "pre-a-post pre--post pre-c-post");
    expands_to("{train,val}-{0..1}.tar", "train-0.tar train-1.tar val-0.tar val-1.tar");
    expands_to("{a,b{1..2},c}", "a b1 b2 c");
    expands_to("{x,y}{1,2}{p,q}", "x1p x1q x2p x2q y1p y1q y2p y2q");
    expands_to("no-braces.tar", "no-braces.tar");
    expands_to("", "");
}

static void malformed_patterns_name_the_position(void **state)
{
    (void)state;
    static const struct {
        const char *pattern;
        int rc;
        const char *want;
    } cases[] = {
        {"shards/{000..099.tar", DH_EPARSE, "position 8: a '{' that is never closed"},
        {"shards/000}.tar", DH_EPARSE, "position 11: a '}' that closes no '{'"},
        {"a{x}b", DH_EPARSE, "position 2: a brace with neither ',' nor '..' inside"},
        {"a{}b", DH_EPARSE, "position 2: a brace with neither"},
        {"{a..9}", DH_EPARSE, "position 2: range start is not a number"},
        {"{1..z}", DH_EPARSE, "position 5: range end is not a number"},
        {"{1..9..0}", DH_EPARSE, "position 8: range step is not a non-zero number"},
        {"{a,b}{x", DH_EPARSE, "position 6: a '{' that is never closed"},
        {"{0..2000000}", DH_ERANGE, "gives more than 1000 names"},
        {"{0..99}{0..99}", DH_ERANGE, "more than 1000 names"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char **names = (char **)1;
        long n = dh__brace_expand(cases[i].pattern, 1000, &names);
        if (n != cases[i].rc)
            fail_msg("'%s': %ld, not %d", cases[i].pattern, n, cases[i].rc);
        assert_null(names);
        if (!strstr(dh_last_error(), cases[i].want))
            fail_msg("'%s': '%s' lacks '%s'", cases[i].pattern, dh_last_error(), cases[i].want);
    }
}

static int expand_once(void *ctx)
{
    (void)ctx;
    char **names = NULL;
    long n = dh__brace_expand("s3://b/{train,val{0..2}}/{00..03}.tar", 1000, &names);
    if (n < 0)
        return (int)n;
    dh__brace_free(names, (size_t)n);
    return n == 16 ? 0 : DH_EINVAL;
}

static void braces_allocation_failures(void **state)
{
    (void)state;
    assert_true(dh_test_each_allocation_failure(expand_once, NULL) > 16);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(ranges_keep_padding),
    cmocka_unit_test(ranges_count),
    cmocka_unit_test(alternatives_and_products),
    cmocka_unit_test(malformed_patterns_name_the_position),
    cmocka_unit_test(braces_allocation_failures),
};
DH_TEST_MAIN(tests)
