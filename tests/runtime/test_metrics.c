/* test_metrics.c: the Prometheus registry and its text exposition (src/runtime/metrics.c) and
 * its HTTP endpoint (src/runtime/metrics_http.c): the exact text of counters, gauges and
 * histograms, escaping, bucket edges, writers racing a render, allocation failure, and
 * GET /metrics over a real socket (404 elsewhere, 405 for another method, a bound port);
 * and an in-process coordinator and DataServer (coordinator_metrics.c, dataserver_metrics.c)
 * scraped without pause while a client pulls an epoch through them: under ThreadSanitizer
 * (`make test-tsan`) this is the race check of the scrape against the loops and workers. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/metrics.h"
#include "datahelix/runtime.h"
#include "dh_test.h"
#include "core/internal.h"
#include "runtime/metrics.h"

static void renders_counter_gauge_and_histogram_exactly(void **state)
{
    (void)state;
    dh__metrics_t *m = NULL;
    assert_int_equal(dh__metrics_new(&m), 0);
    dh__metric_t *dec = dh__metrics_add(m, "datahelix_test_decisions_total", "Decisions by rule.",
                                        DH__METRIC_COUNTER, "rule", NULL, 0);
    dh__metric_t *depth = dh__metrics_add(m, "datahelix_test_queue_depth", "Requests queued.",
                                          DH__METRIC_GAUGE, NULL, NULL, 0);
    const double bounds[] = {0.5, 1, 2};
    dh__metric_t *ratio = dh__metrics_add(m, "datahelix_test_ratio", "Actual over predicted.",
                                          DH__METRIC_HISTOGRAM, NULL, bounds, 3);
    assert_non_null(dec);
    assert_non_null(depth);
    assert_non_null(ratio);
    dh__series_add(dh__metric_series(dec, "local_meets"), 3);
    dh__series_add(dh__metric_series(dec, "remote_gain"), 1);
    dh__series_add(dh__metric_series(dec, "local_meets"), 2);
    dh__series_set(dh__metric_series(depth, NULL), 7);
    dh__series_add(dh__metric_series(depth, NULL), -2.5);
    dh__series_t *r = dh__metric_series(ratio, NULL);
    dh__series_observe(r, 0.25); /* bucket 0.5 */
    dh__series_observe(r, 1);    /* a value on a bound goes into that bound's bucket */
    dh__series_observe(r, 1.5);  /* bucket 2 */
    dh__series_observe(r, 9);    /* +Inf */
    dh__series_observe(r, NAN);  /* ignored */
    size_t len = 0;
    char *text = dh__metrics_render(m, &len);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    assert_string_equal(text, "# HELP datahelix_test_decisions_total Decisions by rule.\n"
                              "# TYPE datahelix_test_decisions_total counter\n"
                              "datahelix_test_decisions_total{rule=\"local_meets\"} 5\n"
                              "datahelix_test_decisions_total{rule=\"remote_gain\"} 1\n"
                              "# HELP datahelix_test_queue_depth Requests queued.\n"
                              "# TYPE datahelix_test_queue_depth gauge\n"
                              "datahelix_test_queue_depth 4.5\n"
                              "# HELP datahelix_test_ratio Actual over predicted.\n"
                              "# TYPE datahelix_test_ratio histogram\n"
                              "datahelix_test_ratio_bucket{le=\"0.5\"} 1\n"
                              "datahelix_test_ratio_bucket{le=\"1\"} 2\n"
                              "datahelix_test_ratio_bucket{le=\"2\"} 3\n"
                              "datahelix_test_ratio_bucket{le=\"+Inf\"} 4\n"
                              "datahelix_test_ratio_sum 11.75\n"
                              "datahelix_test_ratio_count 4\n");
    dh_free(text);
    dh__metrics_destroy(&m);
    assert_null(m);
    dh__metrics_destroy(&m); /* safe on NULL */
}

static void escapes_label_values_help_and_specials(void **state)
{
    (void)state;
    dh__metrics_t *m = NULL;
    assert_int_equal(dh__metrics_new(&m), 0);
    dh__metric_t *f = dh__metrics_add(m, "datahelix_test_x", "Back\\slash and\nnewline.",
                                      DH__METRIC_GAUGE, "server", NULL, 0);
    dh__series_set(dh__metric_series(f, "a\"b\\c\nd"), INFINITY);
    dh__series_set(dh__metric_series(f, "nan"), NAN);
    dh__series_set(dh__metric_series(f, "neg"), -INFINITY);
    const double b[] = {1};
    dh__metric_t *h =
        dh__metrics_add(m, "datahelix_test_h", "Labelled.", DH__METRIC_HISTOGRAM, "server", b, 1);
    dh__series_observe(dh__metric_series(h, "s1"), 0.5);
    char *text = dh__metrics_render(m, NULL);
    assert_non_null(text);
    assert_string_equal(text, "# HELP datahelix_test_x Back\\\\slash and\\nnewline.\n"
                              "# TYPE datahelix_test_x gauge\n"
                              "datahelix_test_x{server=\"a\\\"b\\\\c\\nd\"} +Inf\n"
                              "datahelix_test_x{server=\"nan\"} NaN\n"
                              "datahelix_test_x{server=\"neg\"} -Inf\n"
                              "# HELP datahelix_test_h Labelled.\n"
                              "# TYPE datahelix_test_h histogram\n"
                              "datahelix_test_h_bucket{server=\"s1\",le=\"1\"} 1\n"
                              "datahelix_test_h_bucket{server=\"s1\",le=\"+Inf\"} 1\n"
                              "datahelix_test_h_sum{server=\"s1\"} 0.5\n"
                              "datahelix_test_h_count{server=\"s1\"} 1\n");
    dh_free(text);
    dh__metrics_destroy(&m);
}

/* ---- writers racing renders ---- */

typedef struct race {
    dh__series_t *counter;
    dh__series_t *hist;
} race_t;

#define RACE_ADDS 20000

static void *race_writer(void *arg)
{
    race_t *r = arg;
    for (int i = 0; i < RACE_ADDS; i++) {
        dh__series_add(r->counter, 1);
        dh__series_observe(r->hist, (double)(i % 3));
    }
    return NULL;
}

static void collect_count(void *arg)
{
    (*(int *)arg)++;
}

static void writers_racing_renders_lose_nothing(void **state)
{
    (void)state;
    dh__metrics_t *m = NULL;
    assert_int_equal(dh__metrics_new(&m), 0);
    int collected = 0;
    dh__metrics_set_collect(m, collect_count, &collected);
    dh__metric_t *c =
        dh__metrics_add(m, "datahelix_test_total", "Adds.", DH__METRIC_COUNTER, NULL, NULL, 0);
    const double b[] = {0.5, 1.5};
    dh__metric_t *h =
        dh__metrics_add(m, "datahelix_test_h", "Obs.", DH__METRIC_HISTOGRAM, NULL, b, 2);
    race_t r = {dh__metric_series(c, NULL), dh__metric_series(h, NULL)};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, race_writer, &r), 0);
    int renders = 0;
    for (int i = 0; i < 50; i++) {
        char *text = dh__metrics_render(m, NULL);
        assert_non_null(text);
        /* a histogram read mid-write stays consistent: its _count is its +Inf bucket */
        unsigned long long inf = 0, count = 0;
        const char *p = strstr(text, "le=\"+Inf\"} ");
        assert_non_null(p);
        sscanf(p + strlen("le=\"+Inf\"} "), "%llu", &inf);
        p = strstr(text, "datahelix_test_h_count ");
        assert_non_null(p);
        sscanf(p + strlen("datahelix_test_h_count "), "%llu", &count);
        assert_int_equal(inf, count);
        dh_free(text);
        renders++;
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(collected, renders);
    assert_close(dh__series_value(r.counter), 4.0 * RACE_ADDS, 0);
    char *text = dh__metrics_render(m, NULL);
    char want[128];
    snprintf(want, sizeof want, "datahelix_test_h_count %d\n", 4 * RACE_ADDS);
    assert_non_null(strstr(text, want));
    /* i % 3 over 0..RACE_ADDS-1, four times: 0s in le=0.5, 0s and 1s in le=1.5 */
    int zeros = (RACE_ADDS + 2) / 3, ones = (RACE_ADDS + 1) / 3;
    snprintf(want, sizeof want, "datahelix_test_h_bucket{le=\"0.5\"} %d\n", 4 * zeros);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "datahelix_test_h_bucket{le=\"1.5\"} %d\n", 4 * (zeros + ones));
    assert_non_null(strstr(text, want));
    dh_free(text);
    dh__metrics_destroy(&m);
}

/* ---- allocation failure ---- */

static int build_and_render(void *ctx)
{
    (void)ctx;
    dh__metrics_t *m = NULL;
    int rc = dh__metrics_new(&m);
    if (rc)
        return rc;
    const double b[] = {1, 2};
    dh__metric_t *c =
        dh__metrics_add(m, "datahelix_a_total", "A.", DH__METRIC_COUNTER, "rule", NULL, 0);
    dh__metric_t *h =
        c ? dh__metrics_add(m, "datahelix_b", "B.", DH__METRIC_HISTOGRAM, NULL, b, 2) : NULL;
    dh__series_t *s = h ? dh__metric_series(c, "one") : NULL;
    char *text = NULL;
    if (s) {
        dh__series_add(s, 1);
        text = dh__metrics_render(m, NULL);
    }
    rc = text ? 0 : DH_ENOMEM;
    dh_free(text);
    dh__metrics_destroy(&m);
    return rc;
}

static void allocation_failures_are_enomem_without_leaks(void **state)
{
    (void)state;
    assert_true(dh_test_each_allocation_failure(build_and_render, NULL) > 5);
}

/* ---- the HTTP endpoint ---- */

/* Sends `request` to 127.0.0.1:port and returns the whole response (static buffer). */
static const char *http(uint16_t port, const char *request)
{
    static _Thread_local char resp[65536]; /* the scraper thread and the test both call it */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    size_t n = strlen(request);
    assert_int_equal(write(fd, request, n), (ssize_t)n);
    size_t got = 0;
    ssize_t k;
    while (got < sizeof resp - 1 && (k = read(fd, resp + got, sizeof resp - 1 - got)) > 0)
        got += (size_t)k;
    resp[got] = '\0';
    close(fd);
    return resp;
}

static void http_serves_get_metrics_only(void **state)
{
    (void)state;
    dh__metrics_t *m = NULL;
    assert_int_equal(dh__metrics_new(&m), 0);
    dh__metric_t *c =
        dh__metrics_add(m, "datahelix_test_total", "Adds.", DH__METRIC_COUNTER, NULL, NULL, 0);
    dh__series_add(dh__metric_series(c, NULL), 42);
    dh__metrics_http_t *h = NULL;
    assert_int_equal(dh__metrics_http_start(&h, m, "127.0.0.1:0", "test"), 0);
    uint16_t port = dh__metrics_http_port(h);
    assert_true(port > 0);
    const char *r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.0 200") ? r : strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(r, "\r\n\r\n# HELP datahelix_test_total Adds.\n"));
    assert_non_null(strstr(r, "\ndatahelix_test_total 42\n"));
    r = http(port, "GET / HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(r, " 404 "));
    r = http(port, "GET /metricsx HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(r, " 404 "));
    r = http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    assert_non_null(strstr(r, " 405 "));

    /* the port is taken now: a second endpoint on it fails with the errno */
    char listen[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", port);
    dh__metrics_http_t *h2 = NULL;
    assert_int_equal(dh__metrics_http_start(&h2, m, listen, "test"), -EADDRINUSE);
    assert_null(h2);
    dh__metrics_http_stop(&h);
    assert_null(h);
    dh__metrics_http_stop(&h); /* safe on NULL */
    dh__metrics_destroy(&m);
}

/* Fault site 27 (faults build; skipped otherwise): each step of answering a GET /metrics
 * fails in turn: the render (answered 500 "out of memory rendering the metrics"), the
 * response (the connection closed without an answer). No crash, no connection or fd left
 * (the endpoint runs unbound, served on this thread, so its fds are counted), and the same
 * endpoint answers 200 with the metrics after. Two hits per request (the render, then the
 * response of the 200). */
static dh__metrics_http_t *fault_http;

static int scrape_unbound(void *arg)
{
    (void)arg;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(dh__metrics_http_add(fault_http, sv[1]), 0);
    static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    assert_int_equal(write(sv[0], req, sizeof req - 1), (ssize_t)(sizeof req - 1));
    static char resp[65536];
    size_t got = 0;
    int eof = 0;
    for (int rounds = 0; rounds < 20000 && !eof; rounds++) {
        dh__metrics_http_run(fault_http);
        ssize_t k;
        while ((k = read(sv[0], resp + got, sizeof resp - 1 - got)) > 0)
            got += (size_t)k;
        eof = k == 0;
    }
    assert_true(eof); /* answered or closed: never left hanging */
    close(sv[0]);
    size_t open = 1;
    for (int i = 0; i < 100 && open; i++)
        open = dh__metrics_http_run(fault_http);
    assert_int_equal(open, 0);
    resp[got] = '\0';
    if (strstr(resp, " 200 ") && strstr(resp, "\ndatahelix_test_total 42\n"))
        return 0;
    if (got == 0)
        return dh__set_error(DH_EIO, "GET /metrics: the connection closed without an answer");
    assert_non_null(strstr(resp, " 500 "));
    assert_non_null(strstr(resp, "out of memory rendering the metrics"));
    return dh__set_error(DH_ENOMEM, "GET /metrics: 500 out of memory rendering the metrics");
}

static void http_fails_cleanly_at_every_hit(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    dh__metrics_t *m = NULL;
    assert_int_equal(dh__metrics_new(&m), 0);
    dh__metric_t *c =
        dh__metrics_add(m, "datahelix_test_total", "Adds.", DH__METRIC_COUNTER, NULL, NULL, 0);
    dh__series_add(dh__metric_series(c, NULL), 42);
    assert_int_equal(dh__metrics_http_start_unbound(&fault_http, m, "test"), 0);
    assert_int_equal(
        dh_test_each_fault(DH_FAULT_METRICS_HTTP, "GET /metrics", scrape_unbound, NULL), 2);
    dh__metrics_http_stop(&fault_http);
    dh__metrics_destroy(&m);
}

static void http_refuses_a_listen_that_is_not_host_port(void **state)
{
    (void)state;
    dh__metrics_t *m = NULL;
    assert_int_equal(dh__metrics_new(&m), 0);
    static const char *const bad[] = {"9464",     "127.0.0.1",       ":9464",     "127.0.0.1:",
                                      "host:12x", "127.0.0.1:70000", "[::1:9464", "[::1]9464"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dh__metrics_http_t *h = NULL;
        assert_int_equal(dh__metrics_http_start(&h, m, bad[i], "test"), DH_EINVAL);
        assert_null(h);
        assert_non_null(strstr(dh_last_error(), "--metrics-listen"));
    }
    dh__metrics_destroy(&m);
}

/* ---- the daemons' metrics, scraped while they work ---- */

typedef struct scraper {
    uint16_t ports[2];
    atomic_int stop;
    atomic_int scrapes;
} scraper_t;

static void *scrape_main(void *arg)
{
    scraper_t *sc = arg;
    while (!atomic_load(&sc->stop))
        for (int i = 0; i < 2; i++) {
            const char *r = http(sc->ports[i], "GET /metrics HTTP/1.0\r\n\r\n");
            if (strstr(r, " 200 "))
                sc->scrapes++;
        }
    return NULL;
}

/* The value of the sample line that starts with `line` ("name{labels} "), or -1. */
static double sample(const char *text, const char *line)
{
    char want[256];
    snprintf(want, sizeof want, "\n%s ", line);
    const char *p = strstr(text, want);
    return p ? strtod(p + strlen(want), NULL) : -1;
}

static void daemons_serve_metrics_while_a_client_runs(void **state)
{
    (void)state;
    const char *profiles = cl_write_profiles("p.jsonl", 32); /* 8 batches of 4 */
    char coord_ep[600], data_ep[600];
    snprintf(coord_ep, sizeof coord_ep, "ipc://%s", dh_test_path("coord.ipc"));
    snprintf(data_ep, sizeof data_ep, "ipc://%s", dh_test_path("data.ipc"));
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = coord_ep;
    cc.metrics_listen = "127.0.0.1:0";
    dh_coordinator_t *coord = NULL;
    assert_int_equal(dh_coordinator_new(&coord, &cc), 0);
    assert_int_equal(dh_coordinator_start(coord), 0);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = coord_ep;
    dc.node = "test-node";
    dc.name = "local";
    dc.workers = 2;
    dc.pipeline_json = "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}";
    dc.arena_bytes = 16u << 20;
    dc.data_listen = data_ep;
    dc.heartbeat_ms = 20;
    dc.metrics_listen = "127.0.0.1:0";
    dh_dataserver_t *ds = NULL;
    assert_int_equal(dh_dataserver_new(&ds, &dc), 0);
    assert_int_equal(dh_dataserver_start(ds), 0);
    scraper_t sc = {.ports = {dh_coordinator_metrics_port(coord), dh_dataserver_metrics_port(ds)}};
    assert_true(sc.ports[0] > 0 && sc.ports[1] > 0 && sc.ports[0] != sc.ports[1]);
    pthread_t scraper;
    assert_int_equal(pthread_create(&scraper, NULL, scrape_main, &sc), 0);

    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    cfg.coordinator = coord_ep;
    cfg.profiles = profiles;
    cfg.ranks = 1;
    cfg.batch = 4;
    cfg.seed = 3;
    cfg.node = "test-node";
    cfg.next_timeout_ms = 60000;
    cfg.connect_timeout_ms = 10000;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    int batches = 0, rc;
    while ((rc = dh_client_next(c, &b)) == 0) {
        batches++;
        dh_client_batch_release(&b);
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(batches, 8);
    dh_client_destroy(&c);
    /* every executor report in: the last delivery's COMPLETE may trail the batch */
    dh_coordinator_stats_t cs;
    for (int i = 0; i < 2000; i++) {
        dh_coordinator_stats(coord, &cs);
        if (cs.delivered >= 8)
            break;
        cl_nap_ms(5);
    }
    /* The epoch can be over within a heartbeat period (CI: 10 ms): wait for the scrapes
     * racing the loops, and for a heartbeat to have reached the coordinator. */
    for (int i = 0; i < 2000; i++) {
        char *probe = strdup(http(sc.ports[0], "GET /metrics HTTP/1.0\r\n\r\n"));
        double beats = sample(probe, "datahelix_coordinator_heartbeat_gap_seconds_count");
        free(probe);
        if (atomic_load(&sc.scrapes) > 2 && beats > 0)
            break;
        cl_nap_ms(5);
    }
    atomic_store(&sc.stop, 1);
    pthread_join(scraper, NULL);
    assert_true(atomic_load(&sc.scrapes) > 2);

    char *text = strdup(http(sc.ports[0], "GET /metrics HTTP/1.0\r\n\r\n"));
    double decided = 0;
    static const char *const rules[] = {"local_meets", "remote_gain", "least_transfer",
                                        "earliest_finish"};
    for (size_t i = 0; i < 4; i++) {
        char line[128];
        snprintf(line, sizeof line, "datahelix_coordinator_decisions_total{rule=\"%s\"}", rules[i]);
        decided += sample(text, line);
    }
    assert_close(decided, 8, 0); /* one decision each: nothing was ever full or dead */
    assert_close(sample(text, "datahelix_coordinator_dispatches_total"), 8, 0);
    assert_close(sample(text, "datahelix_coordinator_delivered_total"), 8, 0);
    assert_close(sample(text, "datahelix_coordinator_server_alive{server=\"local\"}"), 1, 0);
    assert_true(sample(text, "datahelix_coordinator_heartbeat_gap_seconds_count") > 0);
    assert_close(sample(text, "datahelix_coordinator_cpu_prediction_abs_error_seconds_count"), 8,
                 0);
    free(text);
    text = strdup(http(sc.ports[1], "GET /metrics HTTP/1.0\r\n\r\n"));
    assert_close(sample(text, "datahelix_dataserver_tasks_total"), 8, 0);
    assert_close(sample(text, "datahelix_dataserver_samples_total"), 32, 0);
    assert_close(sample(text, "datahelix_dataserver_batches_delivered_total{source=\"own\"}"), 8,
                 0);
    assert_close(sample(text, "datahelix_dataserver_arena_size_bytes"), 16u << 20, 0);
    assert_close(sample(text, "datahelix_dataserver_workers"), 2, 0);
    assert_true(sample(text, "datahelix_dataserver_worker_busy_seconds_total") > 0);
    assert_close(sample(text, "datahelix_dataserver_queue_depth"), 0, 0);
    free(text);
    dh_dataserver_destroy(&ds);
    dh_coordinator_destroy(&coord);
    cl_assert_no_leftovers();
}

/* dh_metrics_text: numbers held elsewhere (a rank's stats()), each sample with the common
 * labels first, values in the fewest digits that read back; a repeated name is left out, a
 * bad name, label or type is DH_EINVAL. */
static void renders_values_with_common_labels(void **state)
{
    (void)state;
    const dh_metric_value_t v[] = {
        {"datahelix_client_batches_total", "Batches.", "counter", 3},
        {"datahelix_client_wait_seconds_total", "Stall \\ s.", "counter", 0.1},
        {"datahelix_client_batches_total", "again", "gauge", 9},
        {"datahelix_client_prefetch_batches", "Horizon.", "gauge", 4},
    };
    const char *names[] = {"job", "rank"}, *values[] = {"x", "a\"b"};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(dh_metrics_text(v, 4, names, values, 2, &text, &len), 0);
    assert_string_equal(text, "# HELP datahelix_client_batches_total Batches.\n"
                              "# TYPE datahelix_client_batches_total counter\n"
                              "datahelix_client_batches_total{job=\"x\",rank=\"a\\\"b\"} 3\n"
                              "# HELP datahelix_client_wait_seconds_total Stall \\\\ s.\n"
                              "# TYPE datahelix_client_wait_seconds_total counter\n"
                              "datahelix_client_wait_seconds_total{job=\"x\",rank=\"a\\\"b\"} 0.1\n"
                              "# HELP datahelix_client_prefetch_batches Horizon.\n"
                              "# TYPE datahelix_client_prefetch_batches gauge\n"
                              "datahelix_client_prefetch_batches{job=\"x\",rank=\"a\\\"b\"} 4\n");
    assert_int_equal(len, strlen(text));
    dh_free(text);
    assert_int_equal(dh_metrics_text(NULL, 0, NULL, NULL, 0, &text, NULL), 0);
    assert_string_equal(text, "");
    dh_free(text);
    const dh_metric_value_t bad_name = {"not-valid", "", "gauge", 1};
    assert_int_equal(dh_metrics_text(&bad_name, 1, NULL, NULL, 0, &text, NULL), DH_EINVAL);
    assert_null(text);
    const dh_metric_value_t bad_type = {"ok_name", "", "histogram", 1};
    assert_int_equal(dh_metrics_text(&bad_type, 1, NULL, NULL, 0, &text, NULL), DH_EINVAL);
    const char *le[] = {"le"};
    assert_int_equal(dh_metrics_text(v, 1, le, values, 1, &text, NULL), DH_EINVAL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(renders_counter_gauge_and_histogram_exactly),
    cmocka_unit_test(renders_values_with_common_labels),
    cmocka_unit_test(escapes_label_values_help_and_specials),
    cmocka_unit_test(writers_racing_renders_lose_nothing),
    cmocka_unit_test(allocation_failures_are_enomem_without_leaks),
    cmocka_unit_test(http_serves_get_metrics_only),
    cmocka_unit_test(http_refuses_a_listen_that_is_not_host_port),
    cmocka_unit_test(http_fails_cleanly_at_every_hit),
    cmocka_unit_test(daemons_serve_metrics_while_a_client_runs),
};
DH_TEST_MAIN(tests)
