/* Tests of src/remote/http.c against real servers (servers.h): nginx over HTTP and HTTPS
 * (the test's own CA) for range reads, sizes and keep-alive; fault_server.py for 500 and 429
 * then 200 (retried), a body cut short (resumed from the byte received), 404 and 403 (errors
 * naming the URL, the status and the byte range), a stalled body (interrupted), and the
 * per-scheme hooks (signing, s3:// resolution). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/remote_lib.h"
#include "remote/servers.h"

#define DATA_BYTES 300007 /* not a multiple of anything */

static uint8_t expected[DATA_BYTES];

static void write_data(void)
{
    for (size_t i = 0; i < DATA_BYTES; i++)
        expected[i] = (uint8_t)(i * 131u + (i >> 9));
    char path[700];
    snprintf(path, sizeof path, "%s/data.bin", servers.www);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(expected, 1, DATA_BYTES, f), DATA_BYTES);
    fclose(f);
}

/* Quick retries, the test CA trusted, unless a test says otherwise. */
static void configure(const char *ca)
{
    dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    snprintf(cfg.ca_bundle, sizeof cfg.ca_bundle, "%s", ca ? ca : "");
    cfg.backoff_s = 0.01;
    cfg.backoff_max_s = 0.1;
    assert_int_equal(dh__http_configure(&cfg), 0);
}

static int setup(void **state)
{
    servers_setup(state);
    write_data();
    return 0;
}

static char url_buf[1024];
static const char *url(const char *scheme, int port, const char *path)
{
    snprintf(url_buf, sizeof url_buf, "%s://127.0.0.1:%d/%s", scheme, port, path);
    return url_buf;
}

static void read_ok(const char *u, int64_t offset, size_t len, size_t want_got)
{
    uint8_t *buf = dh_malloc(len ? len : 1);
    size_t got = 99;
    int64_t total = 0;
    int rc = dh__http_get_range(u, offset, len, buf, &got, &total, NULL);
    if (rc != 0)
        print_error("%s [%lld, +%zu): %s\n", u, (long long)offset, len, dh_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(got, want_got);
    if (len)
        assert_int_equal(total, DATA_BYTES);
    if (got)
        assert_memory_equal(buf, expected + offset, got);
    dh_free(buf);
}

static void range_reads_give_the_bytes_over_http_and_https(void **state)
{
    (void)state;
    start_nginx();
    configure(servers.ca);
    const char *schemes[] = {"http", "https"};
    for (int s = 0; s < 2; s++) {
        int port = s ? servers.https_port : servers.http_port;
        char u[1024];
        snprintf(u, sizeof u, "%s", url(schemes[s], port, "data.bin"));
        read_ok(u, 0, 1, 1);
        read_ok(u, 0, 65536, 65536);
        read_ok(u, 123457, 100000, 100000);
        read_ok(u, DATA_BYTES - 10, 65536, 10); /* the object ends first */
        read_ok(u, DATA_BYTES, 100, 0);         /* 416: nothing past the end */
        read_ok(u, 5, 0, 0);
        int64_t size = 0;
        assert_int_equal(dh__http_size(u, &size, NULL), 0);
        assert_int_equal(size, DATA_BYTES);
    }
    /* every range above went as one Range header, none as a whole-object GET */
    wait_lines(servers.nginx_log, 12);
    assert_int_equal(count_lines(servers.nginx_log, NULL), 12);
    assert_int_equal(count_lines(servers.nginx_log, " 200 "), 0);
    assert_true(count_lines(servers.nginx_log, " 206 bytes=123457-223456") == 2);
}

static void https_is_verified(void **state)
{
    (void)state;
    start_nginx();
    configure(NULL); /* the system's CAs: the test's CA is not among them */
    dh__remote_stats_t before, after;
    dh__remote_stats(&before);
    uint8_t buf[16];
    size_t got;
    const char *u = url("https", servers.https_port, "data.bin?X-Amz-Signature=s3cr3t");
    int rc = dh__http_get_range(u, 0, sizeof buf, buf, &got, NULL, NULL);
    assert_int_equal(rc, DH_EIO);
    const char *msg = dh_last_error();
    print_message("refused: %s\n", msg);
    assert_non_null(strstr(msg, "certificate"));
    assert_non_null(strstr(msg, "https://127.0.0.1:"));
    assert_null(strstr(msg, "s3cr3t"));
    assert_non_null(strstr(msg, "bytes 0-15"));
    dh__remote_stats(&after);
    assert_int_equal(after.retries - before.retries, 0); /* not a fault that passes */
    configure(servers.ca);
    assert_int_equal(dh__http_get_range(u, 0, sizeof buf, buf, &got, NULL, NULL), 0);
    assert_memory_equal(buf, expected, sizeof buf);
}

/* nginx logs each request's connection serial number: every read of both URLs goes over one
 * kept-alive connection per scheme. */
static void connections_are_pooled_per_host(void **state)
{
    (void)state;
    start_nginx();
    configure(servers.ca);
    for (int i = 0; i < 20; i++) {
        read_ok(url("http", servers.http_port, "data.bin"), i * 1000, 1000, 1000);
        read_ok(url("https", servers.https_port, "data.bin"), i * 1000, 1000, 1000);
    }
    wait_lines(servers.nginx_log, 40);
    FILE *f = fopen(servers.nginx_log, "r");
    assert_non_null(f);
    long conn, reqs, first_http = -1, first_https = -1;
    int status, n = 0, http_on_first = 0, https_on_first = 0;
    char range[64];
    while (fscanf(f, "%ld %ld %d %63s", &conn, &reqs, &status, range) == 4) {
        bool https = n % 2 == 1;
        long *first = https ? &first_https : &first_http;
        if (*first < 0)
            *first = conn;
        (https ? &https_on_first : &http_on_first)[0] += conn == *first;
        n++;
    }
    fclose(f);
    assert_int_equal(n, 40);
    assert_int_equal(http_on_first, 20);
    assert_int_equal(https_on_first, 20);
    assert_int_not_equal(first_http, first_https);
}

static void *read_many(void *arg)
{
    const char *u = arg;
    static _Thread_local uint8_t buf[20000];
    for (int i = 0; i < 25; i++) {
        size_t got = 0;
        int64_t offset = (int64_t)(i * 7919) % (DATA_BYTES - (int64_t)sizeof buf);
        if (dh__http_get_range(u, offset, sizeof buf, buf, &got, NULL, NULL) != 0 ||
            got != sizeof buf || memcmp(buf, expected + offset, got) != 0)
            return (void *)1;
    }
    return NULL;
}

/* Four threads read at once over the shared pool: every byte right, and the connections
 * opened are at most one per thread (nginx's log), whatever order they run in. */
static void threads_share_the_pool(void **state)
{
    (void)state;
    start_nginx();
    configure(servers.ca);
    char u[2][1024];
    snprintf(u[0], sizeof u[0], "%s", url("http", servers.http_port, "data.bin"));
    snprintf(u[1], sizeof u[1], "%s", url("https", servers.https_port, "data.bin"));
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, read_many, u[i % 2]), 0);
    for (int i = 0; i < 4; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        assert_null(bad);
    }
    wait_lines(servers.nginx_log, 100);
    FILE *f = fopen(servers.nginx_log, "r");
    assert_non_null(f);
    long conn, reqs, seen[128];
    int status, n = 0, distinct = 0;
    char range[64];
    while (fscanf(f, "%ld %ld %d %63s", &conn, &reqs, &status, range) == 4) {
        bool known = false;
        for (int k = 0; k < distinct; k++)
            known |= seen[k] == conn;
        if (!known && distinct < 128)
            seen[distinct++] = conn;
        n++;
    }
    fclose(f);
    print_message("%d requests over %d connections\n", n, distinct);
    assert_int_equal(n, 100);
    assert_true(distinct <= 4);
}

static void server_errors_are_retried(void **state)
{
    (void)state;
    start_fault_server();
    configure(NULL);
    const char *paths[] = {"flaky/data.bin", "busy/data.bin"};
    for (int i = 0; i < 2; i++) {
        dh__remote_stats_t before, after;
        dh__remote_stats(&before);
        read_ok(url("http", servers.fault_port, paths[i]), 1000, 50000, 50000);
        dh__remote_stats(&after);
        assert_int_equal(after.retries - before.retries, 1);
        assert_int_equal(after.requests - before.requests, 2);
    }
    assert_int_equal(count_lines(servers.fault_log, "GET /flaky/data.bin bytes=1000-50999 500"), 1);
    assert_int_equal(count_lines(servers.fault_log, "GET /flaky/data.bin bytes=1000-50999 206"), 1);
    assert_int_equal(count_lines(servers.fault_log, "GET /busy/data.bin bytes=1000-50999 429"), 1);
}

static void a_body_cut_short_is_resumed(void **state)
{
    (void)state;
    start_fault_server();
    configure(NULL);
    dh__remote_stats_t before, after;
    dh__remote_stats(&before);
    read_ok(url("http", servers.fault_port, "cut/data.bin"), 1000, 100000, 100000);
    dh__remote_stats(&after);
    assert_int_equal(after.retries - before.retries, 1);
    /* the retry asks for the second half only: 50000 bytes came before the cut */
    assert_int_equal(count_lines(servers.fault_log, "GET /cut/data.bin bytes=1000-100999 206"), 1);
    assert_int_equal(count_lines(servers.fault_log, "GET /cut/data.bin bytes=51000-100999 206"), 1);
    assert_int_equal(after.bytes_fetched - before.bytes_fetched, 100000);
}

/* A body that stops coming is a timeout after stall_timeout_s, retried for the bytes still
 * missing. */
static void a_stalled_body_times_out_and_is_resumed(void **state)
{
    (void)state;
    start_fault_server();
    dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    cfg.stall_timeout_s = 1;
    cfg.backoff_s = 0.01;
    assert_int_equal(dh__http_configure(&cfg), 0);
    dh__remote_stats_t before, after;
    dh__remote_stats(&before);
    read_ok(url("http", servers.fault_port, "stallonce/data.bin"), 0, 80000, 80000);
    dh__remote_stats(&after);
    assert_int_equal(after.retries - before.retries, 1);
    assert_int_equal(count_lines(servers.fault_log, "GET /stallonce/data.bin bytes=0-79999 206"),
                     1);
    assert_int_equal(
        count_lines(servers.fault_log, "GET /stallonce/data.bin bytes=40000-79999 206"), 1);
}

/* A server that ignores Range answers 200 with the whole object: the bytes before the range
 * are dropped, and the object's size is its Content-Length. */
static void a_server_without_ranges_is_read_through(void **state)
{
    (void)state;
    start_fault_server();
    configure(NULL);
    read_ok(url("http", servers.fault_port, "norange/data.bin"), 123456, 5000, 5000);
    read_ok(url("http", servers.fault_port, "norange/data.bin"), DATA_BYTES - 7, 5000, 7);
    int64_t size = 0;
    assert_int_equal(
        dh__http_size(url("http", servers.fault_port, "norange/data.bin"), &size, NULL), 0);
    assert_int_equal(size, DATA_BYTES);
}

static void missing_and_forbidden_name_url_status_and_range(void **state)
{
    (void)state;
    start_fault_server();
    configure(NULL);
    static const struct {
        const char *path;
        int code;
        const char *status;
    } cases[] = {{"missing/a.mp4?X-Amz-Signature=s3cr3t", -ENOENT, "HTTP 404 NoSuchKey"},
                 {"forbidden/a.mp4", -EACCES, "HTTP 403 AccessDenied"}};
    for (int i = 0; i < 2; i++) {
        dh__remote_stats_t before, after;
        dh__remote_stats(&before);
        uint8_t buf[64];
        size_t got;
        const char *u = url("http", servers.fault_port, cases[i].path);
        int rc = dh__http_get_range(u, 4096, sizeof buf, buf, &got, NULL, NULL);
        const char *msg = dh_last_error();
        print_message("%s\n", msg);
        assert_int_equal(rc, cases[i].code);
        char want[256];
        snprintf(want, sizeof want, "http://127.0.0.1:%d/%.*s", servers.fault_port,
                 (int)strcspn(cases[i].path, "?"), cases[i].path);
        assert_non_null(strstr(msg, want));
        assert_non_null(strstr(msg, cases[i].status));
        assert_non_null(strstr(msg, "bytes 4096-4159"));
        assert_null(strstr(msg, "s3cr3t"));
        dh__remote_stats(&after);
        assert_int_equal(after.retries - before.retries, 0);
        assert_int_equal(after.errors - before.errors, 1);
    }
}

static int stop_flag;
static int stop_when_flagged(void *opaque)
{
    (void)opaque;
    return __atomic_load_n(&stop_flag, __ATOMIC_RELAXED);
}

static void *flag_later(void *arg)
{
    (void)arg;
    /* the interrupt, once the request is waiting on the body (its log line is written) */
    while (count_lines(servers.fault_log, "GET /slow/data.bin") == 0) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELAXED);
    return NULL;
}

static void a_stalled_body_is_interrupted(void **state)
{
    (void)state;
    start_fault_server();
    dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    cfg.stall_timeout_s = 3600; /* only the interrupt can stop it */
    cfg.retry_budget_s = 3600;
    assert_int_equal(dh__http_configure(&cfg), 0);
    pthread_t t;
    stop_flag = 0;
    assert_int_equal(pthread_create(&t, NULL, flag_later, NULL), 0);
    uint8_t buf[1000];
    size_t got;
    dh__remote_interrupt_t intr = {stop_when_flagged, NULL};
    int rc = dh__http_get_range(url("http", servers.fault_port, "slow/data.bin"), 0, sizeof buf,
                                buf, &got, NULL, &intr);
    pthread_join(t, NULL);
    assert_int_equal(rc, DH_EIO);
    assert_non_null(strstr(dh_last_error(), "interrupted"));
    assert_non_null(strstr(dh_last_error(), "/slow/data.bin"));
}

/* The sign hook runs for every try (a 500 then 200 is signed twice) and its header reaches
 * the server; a request of another scheme is not signed. */
static int signs;
static int sign_test(void *ctx, const dh__http_request_t *req, dh__http_headers_t *headers)
{
    assert_ptr_equal(ctx, &signs);
    assert_string_equal(req->method, "GET");
    assert_int_equal(req->n_headers, 1);
    assert_string_equal(req->headers[0].name, "Range");
    assert_true(req->unix_time_s > 1700000000);
    assert_non_null(strstr(req->url, "/signed/data.bin"));
    signs++;
    return dh__http_add_header(headers, "X-Test-Sign", "ok");
}

static void the_sign_hook_runs_for_every_try(void **state)
{
    (void)state;
    start_fault_server();
    configure(NULL);
    uint8_t buf[100];
    size_t got;
    const char *u = url("http", servers.fault_port, "signed/data.bin");
    assert_int_equal(dh__http_get_range(u, 0, sizeof buf, buf, &got, NULL, NULL), -EACCES);
    assert_non_null(strstr(dh_last_error(), "SignatureDoesNotMatch"));
    dh__remote_set_scheme(DH_URL_HTTP, &(dh__remote_scheme_t){NULL, sign_test, &signs});
    signs = 0;
    read_ok(u, 0, 100, 100);
    assert_int_equal(signs, 1);
    dh__remote_set_scheme(DH_URL_HTTP, NULL);
    assert_int_equal(dh__http_get_range(u, 0, sizeof buf, buf, &got, NULL, NULL), -EACCES);
    assert_int_equal(signs, 1);
}

/* s3://bucket/key goes through the S3 hook's resolution; without one it is refused. */
static int resolve_test(void *ctx, const char *s3url, char **http_url)
{
    const int *port = ctx;
    const char *key = strchr(s3url + 5, '/');
    *http_url = dh_malloc(256);
    if (!*http_url)
        return DH_ENOMEM;
    snprintf(*http_url, 256, "http://127.0.0.1:%d/flaky%s", *port, key);
    return 0;
}

static void s3_urls_go_through_the_s3_hooks(void **state)
{
    (void)state;
    start_fault_server();
    configure(NULL);
    uint8_t buf[100];
    size_t got;
    /* without hooks of its own, the S3 module's: a bucket name S3 refuses is named */
    assert_int_equal(
        dh__http_get_range("s3://No_Bucket/data.bin", 0, sizeof buf, buf, &got, NULL, NULL),
        DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "s3://No_Bucket/data.bin"));
    dh__remote_set_scheme(DH_URL_S3,
                          &(dh__remote_scheme_t){resolve_test, NULL, &servers.fault_port});
    read_ok("s3://bucket/data.bin", 7, 100, 100); /* through flaky/: resolved once, tried twice */
    dh__remote_set_scheme(DH_URL_S3, NULL);
}

static void settings_out_of_range_are_refused(void **state)
{
    (void)state;
    dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    cfg.attempts = 0;
    assert_int_equal(dh__http_configure(&cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "attempts"));
    dh__http_config_defaults(&cfg);
    cfg.backoff_max_s = cfg.backoff_s / 2;
    assert_int_equal(dh__http_configure(&cfg), DH_EINVAL);
    dh__http_config_defaults(&cfg);
    cfg.stall_timeout_s = 0.5;
    assert_int_equal(dh__http_configure(&cfg), DH_EINVAL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(range_reads_give_the_bytes_over_http_and_https, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(https_is_verified, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(connections_are_pooled_per_host, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(threads_share_the_pool, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(server_errors_are_retried, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(a_body_cut_short_is_resumed, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(a_stalled_body_times_out_and_is_resumed, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_server_without_ranges_is_read_through, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(missing_and_forbidden_name_url_status_and_range, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_stalled_body_is_interrupted, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(the_sign_hook_runs_for_every_try, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(s3_urls_go_through_the_s3_hooks, setup, servers_teardown),
    cmocka_unit_test(settings_out_of_range_are_refused),
};
DH_TEST_MAIN(tests)
