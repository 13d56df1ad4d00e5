/* test_s3_url.c: s3:// URLs split, virtual-hosted and path-style addressing, and a request
 * built with its URL and signed header lines (anonymous: none). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "dh_test.h"
#include "remote/s3.h"

static void split_bucket_and_key(void **state)
{
    (void)state;
    static const struct {
        const char *url, *bucket, *key;
    } ok[] = {
        {"s3://bucket/key", "bucket", "key"},
        {"s3://my.bucket-1/shards/000.tar", "my.bucket-1", "shards/000.tar"},
        {"s3://bucket/", "bucket", ""},
        {"s3://bucket", "bucket", ""},
        {"s3://bucket/a//b c%20", "bucket", "a//b c%20"},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char *b, *k;
        assert_int_equal(dh__s3_url_split(ok[i].url, &b, &k), 0);
        assert_string_equal(b, ok[i].bucket);
        assert_string_equal(k, ok[i].key);
        dh_free(b);
        dh_free(k);
    }
    static const struct {
        const char *url, *want;
    } bad[] = {
        {"https://bucket/key", "'https://bucket/key': not an s3:// URL"},
        {"s3://ab/key", "'s3://ab/key': a bucket name has 3 to 63 characters, not 2"},
        {"s3:///key", "a bucket name has 3 to 63 characters, not 0"},
        {"s3://Bucket/key", "'s3://Bucket/key': character 6 of the bucket name"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *b, *k;
        assert_int_equal(dh__s3_url_split(bad[i].url, &b, &k), DH_EINVAL);
        assert_null(b);
        assert_null(k);
        if (!strstr(dh_last_error(), bad[i].want))
            fail_msg("'%s' lacks '%s'", dh_last_error(), bad[i].want);
    }
}

static void target(const dh__s3_config_t *c, const char *bucket, const char *key, const char *base,
                   const char *host, const char *path)
{
    dh__s3_target_t t;
    assert_int_equal(dh__s3_target_make(c, bucket, key, &t), 0);
    assert_string_equal(t.base, base);
    assert_string_equal(t.host, host);
    assert_string_equal(t.path, path);
    dh__s3_target_clear(&t);
}

static void addressing_styles(void **state)
{
    (void)state;
    dh__s3_config_t aws = {.region = "eu-west-1"};
    /* AWS: virtual-hosted, unless the bucket cannot be a TLS name label. */
    target(&aws, "bucket", "shards/000.tar", "https://bucket.s3.eu-west-1.amazonaws.com",
           "bucket.s3.eu-west-1.amazonaws.com", "/shards/000.tar");
    target(&aws, "my.bucket", "k", "https://s3.eu-west-1.amazonaws.com",
           "s3.eu-west-1.amazonaws.com", "/my.bucket/k");
    aws.style = DH__S3_STYLE_PATH;
    target(&aws, "bucket", "k", "https://s3.eu-west-1.amazonaws.com", "s3.eu-west-1.amazonaws.com",
           "/bucket/k");
    /* A custom endpoint: path style by default, virtual when asked. */
    dh__s3_config_t custom = {.region = "us-east-1", .endpoint_url = "http://127.0.0.1:9000"};
    target(&custom, "bucket", "a/b.mp4", "http://127.0.0.1:9000", "127.0.0.1:9000",
           "/bucket/a/b.mp4");
    custom.style = DH__S3_STYLE_VIRTUAL;
    custom.endpoint_url = "https://objects.example.test";
    target(&custom, "bucket", "a", "https://bucket.objects.example.test",
           "bucket.objects.example.test", "/a");
    dh__s3_target_t t;
    assert_int_equal(dh__s3_target_make(&custom, "my.bucket", "a", &t), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "s3://my.bucket: the bucket name cannot be"));
}

/* A GET with a Range on a path-style endpoint: the URL carries the key encoded once, the
 * header lines carry Range and the signature. Checked against the signer directly. */
static void request_signed(void **state)
{
    (void)state;
    dh__s3_config_t c = {.access_key_id = "AKIDEXAMPLE",
                         .secret_access_key = "secret",
                         .region = "us-east-1",
                         .endpoint_url = "http://127.0.0.1:9000"};
    dh__s3_pair_t range[] = {{"Range", "bytes=0-9"}};
    dh__s3_request_t r;
    time_t t = 1700000000;
    assert_int_equal(
        dh__s3_request_build(&c, "GET", "bucket", "dir/a b+%.tar", NULL, 0, range, 1, t, &r), 0);
    assert_string_equal(r.url, "http://127.0.0.1:9000/bucket/dir/a%20b%2B%25.tar");
    assert_int_equal(r.n_header_lines, 4);
    assert_string_equal(r.header_lines[0], "Range: bytes=0-9");
    assert_string_equal(r.header_lines[1], "x-amz-date: 20231114T221320Z");
    assert_string_equal(r.header_lines[2], "x-amz-content-sha256: UNSIGNED-PAYLOAD");

    dh__s3_sign_input_t in = {.method = "GET",
                              .host = "127.0.0.1:9000",
                              .path = "/bucket/dir/a b+%.tar",
                              .headers = range,
                              .n_headers = 1,
                              .payload_sha256 = DH__S3_UNSIGNED_PAYLOAD,
                              .content_sha256_header = true,
                              .access_key_id = "AKIDEXAMPLE",
                              .secret_access_key = "secret",
                              .region = "us-east-1",
                              .service = "s3",
                              .time_s = t};
    dh__s3_signed_t s;
    assert_int_equal(dh__s3_sign(&in, &s), 0);
    char want[512];
    snprintf(want, sizeof(want), "Authorization: %s", s.authorization);
    assert_string_equal(r.header_lines[3], want);
    dh__s3_signed_clear(&s);
    dh__s3_request_clear(&r);

    /* A session token is sent; parameters are in the URL, sorted and encoded. */
    c.session_token = "tok/en";
    dh__s3_pair_t q[] = {{"prefix", "a/b c"}, {"list-type", "2"}};
    assert_int_equal(dh__s3_request_build(&c, "GET", "bucket", "", q, 2, NULL, 0, t, &r), 0);
    assert_string_equal(r.url, "http://127.0.0.1:9000/bucket/?list-type=2&prefix=a%2Fb%20c");
    assert_int_equal(r.n_header_lines, 4);
    assert_string_equal(r.header_lines[2], "x-amz-security-token: tok/en");
    dh__s3_request_clear(&r);
}

static void request_anonymous_is_unsigned(void **state)
{
    (void)state;
    dh__s3_config_t c = {.region = "us-west-2"};
    dh__s3_pair_t range[] = {{"Range", "bytes=10-"}};
    dh__s3_request_t r;
    assert_int_equal(
        dh__s3_request_build(&c, "GET", "public-data", "videos/ü.mp4", NULL, 0, range, 1, 0, &r),
        0);
    assert_string_equal(r.url, "https://public-data.s3.us-west-2.amazonaws.com/videos/%C3%BC.mp4");
    assert_int_equal(r.n_header_lines, 1);
    assert_string_equal(r.header_lines[0], "Range: bytes=10-");
    dh__s3_request_clear(&r);
}

static int build_once(void *ctx)
{
    (void)ctx;
    dh__s3_config_t c = {.access_key_id = "A",
                         .secret_access_key = "s",
                         .session_token = "t",
                         .region = "us-east-1",
                         .endpoint_url = "http://127.0.0.1:9000"};
    dh__s3_pair_t range[] = {{"Range", "bytes=0-9"}};
    dh__s3_request_t r;
    int rc = dh__s3_request_build(&c, "GET", "bucket", "k", NULL, 0, range, 1, 0, &r);
    dh__s3_request_clear(&r);
    return rc;
}

static void request_allocation_failures(void **state)
{
    (void)state;
    assert_true(dh_test_each_allocation_failure(build_once, NULL) > 10);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(split_bucket_and_key),
    cmocka_unit_test(addressing_styles),
    cmocka_unit_test(request_signed),
    cmocka_unit_test(request_anonymous_is_unsigned),
    cmocka_unit_test(request_allocation_failures),
};
DH_TEST_MAIN(tests)
