/* test_s3_server.c: the S3 half against a real S3 API server on a loopback port: moto's
 * server (`python -m moto.server`; no S3-compatible server installs from Debian or PyPI here
 * and starts within seconds: docs/testing.md, "Object storage"), with IAM authentication on,
 * so that it recomputes each request's SigV4 signature and refuses a wrong one. Each case
 * starts its own server (s3_server_setup.py fills it: a bucket, 14 objects, a user and key)
 * and its teardown stops it. The transport is a few lines of libcurl here; the room's HTTP
 * client plugs into the same callback. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "dh_test.h"
#include "remote/moto_server.h"
#include "remote/s3.h"

/* ---- the test's transport: libcurl, one handle per request ---- */

typedef struct {
    char *data;
    size_t len;
} body_t;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    body_t *b = ud;
    char *q = dh_realloc(b->data, b->len + size * n + 1);
    if (!q)
        return 0;
    memcpy(q + b->len, p, size * n);
    b->len += size * n;
    q[b->len] = '\0';
    b->data = q;
    return size * n;
}

static int curl_fetch(void *ctx, const char *method, const char *url, const char *const *lines,
                      size_t n_lines, long *status, char **body, size_t *body_len)
{
    (void)ctx;
    CURL *c = curl_easy_init();
    struct curl_slist *headers = NULL;
    for (size_t i = 0; i < n_lines; i++)
        headers = curl_slist_append(headers, lines[i]);
    body_t b = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) {
        dh_free(b.data);
        return dh__set_error(DH_EIO, "%s: %s", url, curl_easy_strerror(rc));
    }
    *body = b.data;
    *body_len = b.len;
    return 0;
}

/* Settings as a user gives them: keys in the environment, --s3-endpoint. */
static void load_config(dh__s3_config_t *c, const char *secret)
{
    setenv("AWS_ACCESS_KEY_ID", server.key_id, 1);
    setenv("AWS_SECRET_ACCESS_KEY", secret, 1);
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_PROFILE");
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("HOME", dh_test_path("home-none"), 1);
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_CONFIG_FILE");
    dh__s3_options_t o = {.endpoint_url = server.endpoint};
    assert_int_equal(dh__s3_config_load(c, &o), 0);
    assert_int_equal(c->style, DH__S3_STYLE_AUTO); /* path style: a custom endpoint */
}

/* GETs `key` (with a Range when range is not NULL); returns the status and body. */
static long get(const dh__s3_config_t *c, const char *key, const char *range, char **body,
                size_t *len)
{
    dh__s3_pair_t h[] = {{"Range", range}};
    dh__s3_request_t r;
    assert_int_equal(
        dh__s3_request_build(c, "GET", "dh-test", key, NULL, 0, h, range ? 1 : 0, time(NULL), &r),
        0);
    long status = 0;
    int rc = curl_fetch(NULL, "GET", r.url, (const char *const *)r.header_lines, r.n_header_lines,
                        &status, body, len);
    if (rc < 0)
        fail_msg("%s", dh_last_error());
    dh__s3_request_clear(&r);
    return status;
}

static void list_pages_and_range_reads(void **state)
{
    (void)state;
    dh__s3_config_t c;
    load_config(&c, server.secret);
    /* 12 keys under shards/ at 5 a page: three pages, two continuation tokens. */
    dh__s3_object_t *objects;
    size_t count;
    int rc = dh__s3_list(&c, "dh-test", "shards/", 5, curl_fetch, NULL, &objects, &count);
    if (rc < 0)
        fail_msg("%s", dh_last_error());
    assert_int_equal(count, 12);
    for (size_t i = 0; i < count; i++) {
        char want[32];
        snprintf(want, sizeof(want), "shards/%03zu.tar", i);
        assert_string_equal(objects[i].key, want);
        assert_int_equal(objects[i].size_B, 1000);
    }
    dh__s3_objects_free(objects, count);
    /* The whole bucket, one page of 1000: the odd keys are listed as they were written (one
     * holds a byte XML cannot carry: it comes URL-encoded and is decoded). */
    assert_int_equal(dh__s3_list(&c, "dh-test", "", 0, curl_fetch, NULL, &objects, &count), 0);
    assert_int_equal(count, 14);
    assert_string_equal(objects[0].key, "odd/a b+c%.tar");
    assert_string_equal(objects[1].key, "odd/ctl\x01.tar");
    dh__s3_objects_free(objects, count);

    /* A byte range, signed: exactly those bytes (byte j of shard i is (i*31 + j) % 251). */
    char *body = NULL;
    size_t len = 0;
    long status = get(&c, "shards/003.tar", "bytes=100-199", &body, &len);
    if (status != 206)
        fail_msg("HTTP %ld: %.*s", status, (int)len, body ? body : "");
    assert_int_equal(len, 100);
    for (size_t j = 0; j < len; j++)
        assert_int_equal((unsigned char)body[j], (3 * 31 + 100 + j) % 251);
    dh_free(body);
    /* A key that needs encoding (space, '+', '%'), encoded once in the URL and signature. */
    status = get(&c, "odd/a b+c%.tar", "bytes=0-9", &body, &len);
    if (status != 206)
        fail_msg("HTTP %ld: %.*s", status, (int)len, body ? body : "");
    assert_int_equal(len, 10);
    for (size_t j = 0; j < len; j++)
        assert_int_equal((unsigned char)body[j], (99 * 31 + j) % 251);
    dh_free(body);

    /* Virtual-hosted style: http://dh-test.localhost:PORT/key (curl resolves *.localhost to
     * the loopback; moto takes the bucket from the Host's first label). */
    char *port = strrchr(server.endpoint, ':');
    char localhost[64];
    snprintf(localhost, sizeof(localhost), "http://localhost%s", port);
    dh_free(c.endpoint_url);
    c.endpoint_url = dh_strdup(localhost);
    c.style = DH__S3_STYLE_VIRTUAL;
    dh__s3_target_t t;
    assert_int_equal(dh__s3_target_make(&c, "dh-test", "shards/005.tar", &t), 0);
    char want_base[96];
    snprintf(want_base, sizeof(want_base), "http://dh-test.localhost%s", port);
    assert_string_equal(t.base, want_base);
    dh__s3_target_clear(&t);
    status = get(&c, "shards/005.tar", "bytes=990-", &body, &len);
    if (status != 206)
        fail_msg("HTTP %ld: %.*s", status, (int)len, body ? body : "");
    assert_int_equal(len, 10);
    for (size_t j = 0; j < len; j++)
        assert_int_equal((unsigned char)body[j], (5 * 31 + 990 + j) % 251);
    dh_free(body);
    assert_int_equal(dh__s3_list(&c, "dh-test", "shards/01", 0, curl_fetch, NULL, &objects, &count),
                     0);
    assert_int_equal(count, 2);
    assert_string_equal(objects[1].key, "shards/011.tar");
    dh__s3_objects_free(objects, count);
    dh__s3_config_clear(&c);
}

static void wrong_secret_missing_key_and_bucket_are_named(void **state)
{
    (void)state;
    dh__s3_config_t c;
    /* A wrong secret: the server recomputes the signature and refuses it. */
    load_config(&c, "wrong-secret-0123456789");
    char *body = NULL;
    size_t len = 0;
    long status = get(&c, "shards/000.tar", "bytes=0-9", &body, &len);
    assert_int_equal(status, 403);
    assert_int_equal(dh__s3_check_response(status, body, len, "s3://dh-test/shards/000.tar"),
                     DH_EAUTH);
    assert_non_null(strstr(dh_last_error(), "s3://dh-test/shards/000.tar: HTTP 403 "
                                            "SignatureDoesNotMatch: "));
    assert_null(strstr(dh_last_error(), "wrong-secret"));
    dh_free(body);
    dh__s3_object_t *objects;
    size_t count;
    assert_int_equal(dh__s3_list(&c, "dh-test", "shards/", 5, curl_fetch, NULL, &objects, &count),
                     DH_EAUTH);
    assert_non_null(strstr(dh_last_error(), "listing s3://dh-test/shards/: HTTP 403 "
                                            "SignatureDoesNotMatch"));
    dh__s3_config_clear(&c);

    /* Anonymous: refused by a bucket that is not public. */
    dh__s3_config_t anon = {.region = "us-east-1", .endpoint_url = server.endpoint};
    status = get(&anon, "shards/000.tar", NULL, &body, &len);
    assert_int_equal(dh__s3_check_response(status, body, len, "s3://dh-test/shards/000.tar"),
                     DH_EAUTH);
    dh_free(body);

    /* The right key: a missing object is 404 NoSuchKey, a missing bucket NoSuchBucket. */
    load_config(&c, server.secret);
    status = get(&c, "shards/999.tar", "bytes=0-9", &body, &len);
    assert_int_equal(status, 404);
    assert_int_equal(dh__s3_check_response(status, body, len, "s3://dh-test/shards/999.tar"),
                     DH_ENOENT);
    assert_non_null(strstr(dh_last_error(), "s3://dh-test/shards/999.tar: HTTP 404 NoSuchKey: "));
    dh_free(body);
    assert_int_equal(dh__s3_list(&c, "no-such-bucket", "", 0, curl_fetch, NULL, &objects, &count),
                     DH_ENOENT);
    assert_non_null(strstr(dh_last_error(), "listing s3://no-such-bucket/: HTTP 404 "
                                            "NoSuchBucket: "));
    dh__s3_config_clear(&c);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(list_pages_and_range_reads, start_server, stop_server),
    cmocka_unit_test_setup_teardown(wrong_secret_missing_key_and_bucket_are_named, start_server,
                                    stop_server),
};
DH_TEST_MAIN(tests)
