/* Tests of the error table, dh_strerror, dh_err_name and the thread-local last error. */
#include <string.h>

#include "dh_config.h"
#include "dh_test.h"
#include "datahelix/error.h"
#include "core/internal.h"

static void error_names_match_table(void **state)
{
    assert_string_equal(dh_err_name(DH_ENOMEM), "DH_ENOMEM");
    assert_string_equal(dh_err_name(DH_EPARSE), "DH_EPARSE");
    assert_string_equal(dh_err_name(DH_ETOOBIG), "DH_ETOOBIG");
    assert_string_equal(dh_err_name(0), "DH_OK");
    assert_string_equal(dh_err_name(12345), "DH_E?");
#ifdef HAVE_STRERRORNAME_NP
    /* System errors outside the table keep their errno name. */
    assert_string_equal(dh_err_name(-ENOTDIR), "ENOTDIR");
#else
    assert_string_equal(dh_err_name(-ENOTDIR), "DH_E?");
#endif
}

static void error_codes_are_distinct_and_negative(void **state)
{
    int codes[] = {
#define XX(name, code, msg) code,
        DH_ERRNO_MAP(XX)
#undef XX
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        assert_true(codes[i] < 0);
        for (size_t j = i + 1; j < n; j++)
            assert_int_not_equal(codes[i], codes[j]);
    }
}

static void strerror_gives_messages(void **state)
{
    assert_string_equal(dh_strerror(DH_ENOMEM), "out of memory");
    assert_string_equal(dh_strerror(DH_EPARSE), "malformed input");
    assert_string_equal(dh_strerror(0), "success");
    /* A system error outside the table still has the system's text. */
    assert_string_equal(dh_strerror(-EPIPE), strerror(EPIPE));
}

static void last_error_records_message(void **state)
{
    dh_clear_error();
    assert_string_equal(dh_last_error(), "");
    int rc = dh__set_error(DH_EPARSE, "%s:%d: field '%s'", "a.jsonl", 7, "id");
    assert_int_equal(rc, DH_EPARSE);
    assert_string_equal(dh_last_error(), "a.jsonl:7: field 'id'");
    dh_clear_error();
    assert_string_equal(dh_last_error(), "");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(error_names_match_table),
    cmocka_unit_test(error_codes_are_distinct_and_negative),
    cmocka_unit_test(strerror_gives_messages),
    cmocka_unit_test(last_error_records_message),
};
DH_TEST_MAIN(tests)
