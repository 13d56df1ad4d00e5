/* test_s3_ini.c: the AWS INI format: sections, keys, comments, nested `s3 =` sections, the
 * last value winning, and errors that name PATH:LINE without quoting the line. */
#include <string.h>

#include "datahelix/error.h"
#include "dh_test.h"
#include "remote/s3.h"

static const char *const SAMPLE = "# a comment\n"
                                  "[default]\n"
                                  "aws_access_key_id = AKIDDEFAULT\n"
                                  "aws_secret_access_key=secret/with=equals\n"
                                  "\n"
                                  "; another comment\n"
                                  "[profile dev]\r\n"
                                  "region = eu-west-1   \n"
                                  "s3 =\n"
                                  "  endpoint_url = http://127.0.0.1:9000\n"
                                  "  addressing_style = path\n"
                                  "output = json\n"
                                  "REGION = eu-west-3\n"
                                  "note = a # not a comment\n";

static void ini_reads_sections_keys_and_nesting(void **state)
{
    (void)state;
    dh__ini_t ini;
    assert_int_equal(dh__ini_parse(SAMPLE, strlen(SAMPLE), "mem", &ini), 0);
    assert_string_equal(dh__ini_get(&ini, "default", "aws_access_key_id", NULL), "AKIDDEFAULT");
    assert_string_equal(dh__ini_get(&ini, "default", "aws_secret_access_key", NULL),
                        "secret/with=equals");
    size_t line = 0;
    /* Keys compare without case; the last one written wins (line 13). */
    assert_string_equal(dh__ini_get(&ini, "profile dev", "region", &line), "eu-west-3");
    assert_int_equal(line, 13);
    assert_string_equal(dh__ini_get(&ini, "profile dev", "s3.endpoint_url", &line),
                        "http://127.0.0.1:9000");
    assert_int_equal(line, 10);
    assert_string_equal(dh__ini_get(&ini, "profile dev", "s3.addressing_style", NULL), "path");
    /* After a non-indented key the nesting ends. */
    assert_string_equal(dh__ini_get(&ini, "profile dev", "output", NULL), "json");
    assert_null(dh__ini_get(&ini, "profile dev", "s3.output", NULL));
    assert_string_equal(dh__ini_get(&ini, "profile dev", "note", NULL), "a # not a comment");
    assert_null(dh__ini_get(&ini, "default", "region", NULL));
    assert_null(dh__ini_get(&ini, "dev", "region", NULL));
    assert_true(dh__ini_has_section(&ini, "profile dev"));
    assert_false(dh__ini_has_section(&ini, "dev"));
    dh__ini_clear(&ini);
}

/* An empty section still exists (a profile that only names itself). */
static void ini_empty_section_exists(void **state)
{
    (void)state;
    const char *text = "[empty]\n[other]\nk = v\n";
    dh__ini_t ini;
    assert_int_equal(dh__ini_parse(text, strlen(text), "mem", &ini), 0);
    assert_true(dh__ini_has_section(&ini, "empty"));
    assert_null(dh__ini_get(&ini, "empty", "k", NULL));
    dh__ini_clear(&ini);
}

/* Each malformed line fails with PATH:LINE and what is wrong, never the line's text. */
static void ini_errors_name_path_and_line(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *want;
    } cases[] = {
        {"[default]\nsecretvalue123\n", "creds:2: expected 'key = value' or '[section]'"},
        {"secretvalue123 = x\n", "creds:1: a key before any '[section]'"},
        {"[default\nk = v\n", "creds:1: a section header without its ']'"},
        {"[default]\n[ ]\n", "creds:2: an empty section name"},
        {"[default]\n = secretvalue123\n", "creds:2: a value without a key"},
        {"[default]\nk = v\n  sub = secretvalue123\n", "creds:3: an indented line"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dh__ini_t ini;
        assert_int_equal(dh__ini_parse(cases[i].text, strlen(cases[i].text), "creds", &ini),
                         DH_EPARSE);
        const char *msg = dh_last_error();
        if (!strstr(msg, cases[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, msg, cases[i].want);
        assert_null(strstr(msg, "secretvalue123"));
        assert_null(ini.entries);
    }
    dh__ini_t ini;
    const char nul[] = "[default]\nk = a\0b\n";
    assert_int_equal(dh__ini_parse(nul, sizeof(nul) - 1, "creds", &ini), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "creds:2: a NUL byte"));
}

static void ini_load_missing_file_is_enoent(void **state)
{
    (void)state;
    dh__ini_t ini;
    assert_int_equal(dh__ini_load(dh_test_path("no-such-credentials"), &ini), DH_ENOENT);
    const char *path = dh_test_path("credentials");
    dh_test_write_file(path, "[default]\naws_access_key_id = A\n");
    assert_int_equal(dh__ini_load(path, &ini), 0);
    assert_string_equal(dh__ini_get(&ini, "default", "aws_access_key_id", NULL), "A");
    dh__ini_clear(&ini);
}

static int parse_sample(void *ctx)
{
    (void)ctx;
    dh__ini_t ini;
    int rc = dh__ini_parse(SAMPLE, strlen(SAMPLE), "mem", &ini);
    dh__ini_clear(&ini);
    return rc;
}

static void ini_allocation_failures(void **state)
{
    (void)state;
    assert_true(dh_test_each_allocation_failure(parse_sample, NULL) > 10);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(ini_reads_sections_keys_and_nesting),
    cmocka_unit_test(ini_empty_section_exists),
    cmocka_unit_test(ini_errors_name_path_and_line),
    cmocka_unit_test(ini_load_missing_file_is_enoent),
    cmocka_unit_test(ini_allocation_failures),
};
DH_TEST_MAIN(tests)
