/* fuzz_metrics_http.c: the metrics endpoint's request handling (src/runtime/metrics_http.c:
 * libmicrohttpd's request parser, then our handler: GET or HEAD /metrics, 404, 405) on
 * untrusted bytes from a scraper.
 *
 * The endpoint runs unbound (dh__metrics_http_start_unbound: no listening socket, no thread)
 * over a registry of a counter, a labelled gauge and a histogram. Each input is one
 * connection's bytes: written into one end of a socket pair whose other end is handed to the
 * endpoint, the writing side then shut (the scraper sent everything), and the endpoint run on
 * this thread until it closes the connection. Checked: it does close it (within 20,000
 * rounds, and once the scraper's end is closed too: no connection outlives its peer), and
 * every answer it wrote is HTTP ("HTTP/1." first); a 200 answer to a GET holds the metrics.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "datahelix/log.h"
#include "runtime/metrics.h"

static dh__metrics_t *registry;
static dh__metrics_http_t *endpoint;

static void setup(void)
{
    if (endpoint)
        return;
    dh_log_set_level(DH_LOG_ERROR); /* libmicrohttpd's complaints about bad requests: warnings */
    FUZZ_CHECK(dh__metrics_new(&registry) == 0);
    dh__metrics_t *r = registry;
    dh__series_add(DH__COUNTER("dh_fuzz_requests_total", "Requests."), 3);
    dh__metric_t *g = dh__metrics_add(registry, "dh_fuzz_peers", "Peers \"quoted\"\n.",
                                      DH__METRIC_GAUGE, "peer", NULL, 0);
    FUZZ_CHECK(g);
    dh__series_set(dh__metric_series(g, "a\\b\"c"), -1.5);
    static const double bounds[] = {0.001, 0.1, 1};
    dh__series_t *h =
        dh__metrics_one(registry, "dh_fuzz_seconds", "Latency.", DH__METRIC_HISTOGRAM, bounds, 3);
    FUZZ_CHECK(h);
    dh__series_observe(h, 0.05);
    FUZZ_CHECK(dh__metrics_http_start_unbound(&endpoint, registry, "fuzz") == 0);
}

/* Reads what the endpoint wrote into buf (up to cap - 1 bytes kept); 1 at end of file. */
static int drain(int fd, char *buf, size_t *len, size_t cap)
{
    for (;;) {
        char chunk[16384];
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n == 0)
            return 1;
        if (n < 0)
            return 0; /* EAGAIN: nothing more yet */
        size_t keep = (size_t)n < cap - 1 - *len ? (size_t)n : cap - 1 - *len;
        memcpy(buf + *len, chunk, keep);
        *len += keep;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    setup();
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    FUZZ_CHECK(dh__metrics_http_add(endpoint, sv[1]) == 0);
    static char answer[1 << 18];
    size_t len = 0, sent = 0;
    int eof = 0, shut = 0;
    for (int rounds = 0; rounds < 20000 && !eof; rounds++) { /* a few per request */
        while (sent < size) {
            ssize_t n = write(sv[0], data + sent, size - sent);
            if (n <= 0)
                break;
            sent += (size_t)n;
        }
        if (sent == size && !shut) {
            FUZZ_CHECK(shutdown(sv[0], SHUT_WR) == 0);
            shut = 1;
        }
        dh__metrics_http_run(endpoint);
        eof = drain(sv[0], answer, &len, sizeof answer);
    }
    FUZZ_CHECK(eof); /* the endpoint closed the connection */
    close(sv[0]);
    size_t open = 1;
    for (int i = 0; i < 100 && open; i++)
        open = dh__metrics_http_run(endpoint);
    FUZZ_CHECK(open == 0);
    answer[len] = '\0';
    if (len) {
        FUZZ_CHECK(strncmp(answer, "HTTP/1.", 7) == 0);
        if (strncmp(answer + 8, " 200", 4) == 0 && size >= 4 && memcmp(data, "GET ", 4) == 0)
            FUZZ_CHECK(strstr(answer, "dh_fuzz_requests_total 3") != NULL);
    }
    return 0;
}
