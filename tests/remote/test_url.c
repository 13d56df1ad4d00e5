/* Tests of src/remote/url.c: URL parts, refusals, and redaction of query strings. */
#include <string.h>

#include "datahelix/error.h"
#include "core/internal.h"
#include "dh_test.h"
#include "remote/remote_lib.h"

static void parses_http_https_and_s3(void **state)
{
    (void)state;
    dh__url_t u;
    const char *url = "HTTPS://Data.Example.COM/shards/000.tar?X-Amz-Signature=abc#frag";
    assert_int_equal(dh__url_parse(url, &u), 0);
    assert_int_equal(u.scheme, DH_URL_HTTPS);
    assert_string_equal(u.host, "data.example.com");
    assert_int_equal(u.port, 443);
    assert_false(u.port_given);
    assert_int_equal(u.path_len, strlen("/shards/000.tar"));
    assert_memory_equal(u.path, "/shards/000.tar", u.path_len);
    assert_int_equal(u.query_len, strlen("X-Amz-Signature=abc"));
    assert_memory_equal(u.query, "X-Amz-Signature=abc", u.query_len);

    assert_int_equal(dh__url_parse("http://127.0.0.1:8080", &u), 0);
    assert_int_equal(u.scheme, DH_URL_HTTP);
    assert_int_equal(u.port, 8080);
    assert_true(u.port_given);
    assert_int_equal(u.path_len, 1);
    assert_memory_equal(u.path, "/", 1);
    assert_null(u.query);

    assert_int_equal(dh__url_parse("http://[::1]:9000/a.mp4", &u), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 9000);

    assert_int_equal(dh__url_parse("s3://my-bucket/videos/a b.mp4", &u), DH_EINVAL);
    assert_int_equal(dh__url_parse("s3://my-bucket/videos/a.mp4", &u), 0);
    assert_int_equal(u.scheme, DH_URL_S3);
    assert_string_equal(u.host, "my-bucket");
    assert_int_equal(u.port, 0);
    assert_memory_equal(u.path, "/videos/a.mp4", u.path_len);
}

static void scheme_is_told_by_prefix(void **state)
{
    (void)state;
    assert_int_equal(dh__url_scheme("http://h/x"), DH_URL_HTTP);
    assert_int_equal(dh__url_scheme("Https://h/x"), DH_URL_HTTPS);
    assert_int_equal(dh__url_scheme("s3://b/k"), DH_URL_S3);
    assert_int_equal(dh__url_scheme("/data/x.mp4"), DH_URL_NONE);
    assert_int_equal(dh__url_scheme("subfile,,start,0,end,9,,:http://h/x"), DH_URL_NONE);
    assert_int_equal(dh__url_scheme("ftp://h/x"), DH_URL_NONE);
    assert_int_equal(dh__url_scheme("httpx://h/x"), DH_URL_NONE);
}

static void bad_urls_are_refused_by_name(void **state)
{
    (void)state;
    static const struct {
        const char *url, *why;
    } bad[] = {
        {"ftp://h/x", "scheme"},        {"http:///x", "no host"},     {"s3:///key", "no bucket"},
        {"http://h:0/x", "port"},       {"http://h:65536/x", "port"}, {"http://h:12a/x", "port"},
        {"http://h:/x", "port"},        {"http://[::1/x", "IPv6"},    {"http://[::1]x/y", "IPv6"},
        {"s3://bucket:99/k", "bucket"}, {"http://h/a\tb", "control"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dh__url_t u;
        int rc = dh__url_parse(bad[i].url, &u);
        if (rc != DH_EINVAL || !strstr(dh_last_error(), bad[i].why))
            print_error("%s: rc %d, %s\n", bad[i].url, rc, dh_last_error());
        assert_int_equal(rc, DH_EINVAL);
        assert_non_null(strstr(dh_last_error(), bad[i].why));
    }
}

/* A manifest's URL path must name a host or bucket; what follows is the server's to judge. */
static void a_url_without_host_is_told(void **state)
{
    (void)state;
    static const char *const bad[] = {"s3://", "https://", "s3:///key", "http://?q", "http:/"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(dh__url_check_host(bad[i]), DH_EINVAL);
        assert_non_null(strstr(dh_last_error(), "names no host or bucket"));
    }
    assert_int_equal(dh__url_check_host("s3://b/a key with spaces.mp4"), 0);
    assert_int_equal(dh__url_check_host("https://mp4"), 0);
}

static void credentials_in_a_url_are_refused_unprinted(void **state)
{
    (void)state;
    dh__url_t u;
    assert_int_equal(dh__url_parse("https://user:hunter2@h/x?sig=s3cr3t", &u), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "credentials"));
    assert_null(strstr(dh_last_error(), "s3cr3t"));
    assert_null(strstr(dh_last_error(), "hunter2"));
    assert_non_null(strstr(dh_last_error(), "https://...@h/x?..."));
}

static void redaction_drops_the_query(void **state)
{
    (void)state;
    char buf[128];
    assert_string_equal(dh__url_redact("https://h/a.mp4?X-Amz-Signature=abc&t=1", buf, sizeof buf),
                        "https://h/a.mp4?...");
    assert_string_equal(dh__url_redact("https://h/a.mp4", buf, sizeof buf), "https://h/a.mp4");
    assert_string_equal(dh__url_redact("https://h/a.mp4#x", buf, sizeof buf), "https://h/a.mp4#x");
    assert_string_equal(dh__url_redact("https://h/a.mp4", buf, 8), "https:/");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(parses_http_https_and_s3),
    cmocka_unit_test(scheme_is_told_by_prefix),
    cmocka_unit_test(bad_urls_are_refused_by_name),
    cmocka_unit_test(a_url_without_host_is_told),
    cmocka_unit_test(credentials_in_a_url_are_refused_unprinted),
    cmocka_unit_test(redaction_drops_the_query),
};
DH_TEST_MAIN(tests)
