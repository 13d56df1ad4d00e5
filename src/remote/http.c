/* http.c: one HTTP(S) range GET with retries, on libcurl (remote_lib.h, docs/remote.md).
 *
 * One process-wide client: a libcurl share of connections, DNS answers and TLS sessions, so
 * every reader of every thread reuses the keep-alive connection to a host (a decode opens a
 * clip, reads its header and GOPs, closes it, and the next clip on the same host costs no
 * new TCP or TLS handshake). Each request runs on its own easy handle, in the caller's
 * thread (no thread of ours). A try that fails for a reason that may pass (5xx, 429, a
 * timeout or stall, a refused or reset connection, a body cut short) is retried after an
 * exponential backoff, bounded by a count and a wall-time budget; a retry asks only for the
 * bytes still missing. Hooks per scheme (s3:// resolution, request signing) are called for
 * every try. Counters are relaxed atomics.
 *
 * Secrets: hook-added header values are never printed; URLs are printed redacted
 * (dh__url_redact: no query string); an error body is reduced to its S3 <Code>. */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/remote_internal.h"
#include "remote/s3.h"

/* ---- the client: settings, share, hooks, counters --------------------------------------- */

static pthread_once_t client_once = PTHREAD_ONCE_INIT;
static CURLSH *share;
static pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static dh__http_config_t config;
static dh__remote_scheme_t hooks[DH_URL_S3 + 1];
static bool hooks_set[DH_URL_S3 + 1];
static _Atomic uint64_t n_requests, n_retries, n_bytes, n_errors;
static _Atomic uint64_t n_read; /* reader.c's, dh__remote_count_read */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ctx)
{
    (void)h, (void)access, (void)ctx;
    pthread_mutex_lock(&share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ctx)
{
    (void)h, (void)ctx;
    pthread_mutex_unlock(&share_locks[data]);
}

static void client_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&share_locks[i], NULL);
    share = curl_share_init();
    if (share) {
        curl_share_setopt(share, CURLSHOPT_LOCKFUNC, share_lock);
        curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, share_unlock);
        curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
        curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
        curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    }
    pthread_mutex_lock(&config_lock);
    dh__http_config_defaults(&config);
    pthread_mutex_unlock(&config_lock);
}

static double env_number(const char *name, double fallback, double lo, double hi)
{
    const char *v = getenv(name);
    char *end;
    double x = v && *v ? strtod(v, &end) : fallback;
    if (!v || !*v || *end || !(x >= lo && x <= hi))
        return fallback; /* a bad value keeps the default (dh__http_configure checks its own) */
    return x;
}

void dh__http_config_defaults(dh__http_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    const char *ca = getenv("DH_CA_BUNDLE");
    snprintf(cfg->ca_bundle, sizeof cfg->ca_bundle, "%s", ca ? ca : "");
    cfg->attempts = (int)env_number("DH_HTTP_ATTEMPTS", 6, 1, 100);
    cfg->backoff_s = 0.05;
    cfg->backoff_max_s = 2.0;
    cfg->retry_budget_s = env_number("DH_HTTP_RETRY_S", 60, 0.001, 86400);
    cfg->connect_timeout_s = 10;
    cfg->stall_timeout_s = env_number("DH_HTTP_STALL_S", 30, 1, 86400);
}

int dh__http_configure(const dh__http_config_t *cfg)
{
    const char *bad = NULL;
    if (cfg->attempts < 1 || cfg->attempts > 100)
        bad = "attempts (1..100)";
    else if (!(cfg->backoff_s >= 0) || !(cfg->backoff_max_s >= cfg->backoff_s))
        bad = "backoff_s, backoff_max_s (0 <= backoff_s <= backoff_max_s)";
    else if (!(cfg->retry_budget_s > 0) || !(cfg->connect_timeout_s > 0))
        bad = "retry_budget_s, connect_timeout_s (> 0)";
    else if (!(cfg->stall_timeout_s >= 1))
        bad = "stall_timeout_s (>= 1: libcurl counts whole seconds)";
    else if (!memchr(cfg->ca_bundle, '\0', sizeof cfg->ca_bundle))
        bad = "ca_bundle (not terminated)";
    if (bad)
        return dh__set_error(DH_EINVAL, "HTTP settings: field %s out of range", bad);
    pthread_once(&client_once, client_init);
    pthread_mutex_lock(&config_lock);
    config = *cfg;
    pthread_mutex_unlock(&config_lock);
    return 0;
}

void dh__remote_set_scheme(dh__url_scheme_t scheme, const dh__remote_scheme_t *h)
{
    if (scheme < DH_URL_HTTP || scheme > DH_URL_S3)
        return;
    hooks_set[scheme] = h != NULL;
    if (h)
        hooks[scheme] = *h;
    else
        memset(&hooks[scheme], 0, sizeof hooks[scheme]);
}

void dh__remote_stats(dh__remote_stats_t *out)
{
    out->requests = atomic_load_explicit(&n_requests, memory_order_relaxed);
    out->retries = atomic_load_explicit(&n_retries, memory_order_relaxed);
    out->bytes_fetched = atomic_load_explicit(&n_bytes, memory_order_relaxed);
    out->errors = atomic_load_explicit(&n_errors, memory_order_relaxed);
    out->bytes_read = atomic_load_explicit(&n_read, memory_order_relaxed);
}

void dh__remote_count_read(uint64_t n)
{
    atomic_fetch_add_explicit(&n_read, n, memory_order_relaxed);
}

/* ---- headers a hook adds ----------------------------------------------------------------- */

struct dh__http_headers {
    struct curl_slist *list;
};

int dh__http_add_header(dh__http_headers_t *headers, const char *name, const char *value)
{
    if (strpbrk(name, "\r\n:") || !*name || strpbrk(value, "\r\n"))
        return dh__set_error(DH_EINVAL, "HTTP header '%s': a bad name or a line break in its value",
                             strpbrk(name, "\r\n") ? "?" : name);
    size_t n = strlen(name) + 2 + strlen(value) + 1;
    char *line = dh_malloc(n);
    if (!line)
        return dh__set_error(DH_ENOMEM, "HTTP header '%s': out of memory", name);
    snprintf(line, n, "%s: %s", name, value);
    struct curl_slist *grown = curl_slist_append(headers->list, line);
    dh_free(line);
    if (!grown)
        return dh__set_error(DH_ENOMEM, "HTTP header '%s': out of memory", name);
    headers->list = grown;
    return 0;
}

/* ---- one transfer ------------------------------------------------------------------------ */

typedef struct xfer {
    CURL *h;
    char *buf;      /* where the wanted bytes go (NULL: none wanted) */
    size_t len;     /* bytes wanted */
    size_t stored;  /* bytes stored so far, over every try */
    int64_t from;   /* the first byte this try asks for */
    int64_t skip;   /* body bytes to drop first (a 200 answering a range request) */
    int64_t total;  /* the object's size from Content-Range or, for a 200, Content-Length */
    long status;    /* of the current response */
    char code[64];  /* an S3 error body's <Code>, if any */
    char body[512]; /* the start of an error body, for <Code> */
    size_t body_len;
    const dh__remote_interrupt_t *interrupt;
} xfer_t;

static size_t on_header(char *line, size_t size, size_t n, void *opaque)
{
    xfer_t *x = opaque;
    size_t len = size * n;
    long long a, b, t;
    if (len > 5 && strncmp(line, "HTTP/", 5) == 0) { /* a new response (after a 100, ...) */
        const char *sp = memchr(line, ' ', len);
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->body_len = 0;
        /* a 200 to a range request sends the object from byte 0: drop the bytes before */
        x->skip = x->status == 200 ? x->from : 0;
        return len;
    }
    char buf[160];
    if (len >= sizeof buf || len < 15)
        return len;
    memcpy(buf, line, len);
    buf[len] = '\0';
    if (strncasecmp(buf, "Content-Range:", 14) == 0) {
        if (sscanf(buf + 14, " bytes %lld-%lld/%lld", &a, &b, &t) == 3 ||
            sscanf(buf + 14, " bytes */%lld", &t) == 1)
            x->total = t;
    } else if (strncasecmp(buf, "Content-Length:", 15) == 0 && x->status == 200 &&
               sscanf(buf + 15, " %lld", &t) == 1) {
        x->total = t; /* a whole-object answer: its length is the object's */
    }
    return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *opaque)
{
    xfer_t *x = opaque;
    size_t len = size * n, used = 0;
    atomic_fetch_add_explicit(&n_bytes, len, memory_order_relaxed);
    if (x->status != 200 && x->status != 206) { /* keep the start of an error body */
        size_t room = sizeof x->body - 1 - x->body_len;
        size_t k = len < room ? len : room;
        memcpy(x->body + x->body_len, data, k);
        x->body_len += k;
        x->body[x->body_len] = '\0';
        return len;
    }
    if (x->skip > 0) {
        used = (int64_t)len < x->skip ? len : (size_t)x->skip;
        x->skip -= (int64_t)used;
    }
    size_t want = x->len - x->stored, have = len - used;
    size_t k = have < want ? have : want;
    if (k)
        memcpy(x->buf + x->stored, data + used, k);
    x->stored += k;
    /* more than asked (a server that ignores the range's end): stop here, the bytes are in */
    return x->stored == x->len && have > k ? 0 : len;
}

static int on_progress(void *opaque, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    const xfer_t *x = opaque;
    return x->interrupt && x->interrupt->callback && x->interrupt->callback(x->interrupt->opaque);
}

static bool retryable_status(long status)
{
    return status == 429 || (status >= 500 && status <= 599);
}

static bool retryable_curl(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return true;
    default:
        return false;
    }
}

static int code_of_status(long status)
{
    if (status == 404 || status == 410)
        return -ENOENT;
    if (status == 401 || status == 403)
        return -EACCES;
    if (status == 416)
        return -ERANGE;
    return DH_EIO;
}

/* Sleeps up to wait_s, in slices, stopping early when interrupted: true if interrupted. */
static bool backoff(double wait_s, const dh__remote_interrupt_t *interrupt)
{
    uint64_t until = dh_clock_now_ns() + (uint64_t)(wait_s * 1e9);
    for (;;) {
        if (interrupt && interrupt->callback && interrupt->callback(interrupt->opaque))
            return true;
        uint64_t now = dh_clock_now_ns();
        if (now >= until)
            return false;
        uint64_t slice = until - now < 20000000u ? until - now : 20000000u;
        struct timespec ts = {0, (long)slice};
        nanosleep(&ts, NULL);
    }
}

/* The S3 error code of an XML error body ("<Code>NoSuchKey</Code>"), else "". Only the code:
 * a SignatureDoesNotMatch body quotes the canonical request, headers included. */
static void error_code(xfer_t *x)
{
    x->code[0] = '\0';
    const char *a = strstr(x->body, "<Code>"), *b = a ? strstr(a, "</Code>") : NULL;
    if (a && b && b - a - 6 < (ptrdiff_t)sizeof x->code) {
        snprintf(x->code, sizeof x->code, "%.*s", (int)(b - a - 6), a + 6);
        for (char *c = x->code; *c; c++)
            if ((unsigned char)*c < ' ' || (unsigned char)*c > '~')
                *c = '?';
    }
}

/* The headers of one try: Range (GET), then the scheme's hook. */
static int try_headers(const char *method, const char *http_url, const dh__url_t *parsed,
                       const char *range, const dh__remote_scheme_t *h, dh__http_headers_t *out)
{
    int rc;
    if (range && (rc = dh__http_add_header(out, "Range", range)))
        return rc;
    if (!h || !h->sign)
        return 0;
    dh__http_header_t set[1] = {{"Range", range}};
    dh__http_request_t req = {.method = method,
                              .url = http_url,
                              .parsed = parsed,
                              .headers = set,
                              .n_headers = range ? 1 : 0,
                              .unix_time_s = (int64_t)time(NULL)};
    return h->sign(h->ctx, &req, out);
}

static CURL *easy_for(const dh__http_config_t *cfg, xfer_t *x, char *errbuf)
{
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_SHARE, share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_USERAGENT, "datahelix");
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(cfg->connect_timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)cfg->stall_timeout_s);
    if (cfg->ca_bundle[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, cfg->ca_bundle);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    return h;
}

/* The hooks of a scheme: those set, else for s3:// the S3 module's (s3_hooks.c). */
static const dh__remote_scheme_t *hooks_of(dh__url_scheme_t scheme)
{
    if (hooks_set[scheme])
        return &hooks[scheme];
    return scheme == DH_URL_S3 ? dh__s3_default_hooks() : NULL;
}

/* Resolves url through its scheme's hook: *http_url is url itself or a dh_malloc'd one. */
static int resolve(const char *url, dh__url_scheme_t scheme, char **http_url, char **owned)
{
    *owned = NULL;
    *http_url = (char *)url;
    const dh__remote_scheme_t *h = hooks_of(scheme);
    if (!h || !h->resolve)
        return 0;
    int rc = h->resolve(h->ctx, url, owned);
    if (rc == 0)
        *http_url = *owned;
    return rc;
}

/* GET of [offset, offset + len) (len 0 with buf NULL: only the size, from bytes 0-0). */
static int request(const char *url, int64_t offset, size_t len, void *buf, size_t *got,
                   int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    pthread_once(&client_once, client_init);
    dh__http_config_t cfg;
    pthread_mutex_lock(&config_lock);
    cfg = config;
    pthread_mutex_unlock(&config_lock);
    char shown[512];
    dh__url_redact(url, shown, sizeof shown);
    dh__url_scheme_t scheme = dh__url_scheme(url);
    if (scheme == DH_URL_NONE)
        return dh__set_error(DH_EINVAL, "%s: not an http://, https:// or s3:// URL", shown);
    char *http_url, *owned;
    int rc = resolve(url, scheme, &http_url, &owned);
    dh__url_t parsed;
    if (rc == 0)
        rc = dh__url_parse(http_url, &parsed);
    if (rc == 0 && parsed.scheme == DH_URL_S3)
        rc = dh__set_error(DH_EINVAL, "%s: the S3 hook resolved it to another s3:// URL", shown);
    if (rc) {
        dh_free(owned);
        return rc;
    }
    const dh__remote_scheme_t *h = hooks_of(scheme);
    bool size_only = buf == NULL;
    xfer_t x = {.buf = buf, .len = size_only ? 1 : len, .total = -1, .interrupt = interrupt};
    char scratch[1];
    if (size_only)
        x.buf = scratch;
    uint64_t started = dh_clock_now_ns();
    char errbuf[CURL_ERROR_SIZE];
    int last = 0;
    char why[600] = "";
    for (int attempt = 1;; attempt++) {
        /* this try asks for the bytes still missing */
        int64_t from = offset + (int64_t)x.stored, to = offset + (int64_t)x.len - 1;
        char range[64];
        snprintf(range, sizeof range, "bytes=%" PRId64 "-%" PRId64, from, to);
        dh__http_headers_t headers = {NULL};
        errbuf[0] = '\0';
        x.status = 0;
        x.body_len = 0;
        x.body[0] = '\0';
        x.skip = 0;
        CURL *e = easy_for(&cfg, &x, errbuf);
        if (!e) {
            rc = dh__set_error(DH_ENOMEM, "%s: out of memory", shown);
            break;
        }
        if ((rc = try_headers("GET", http_url, &parsed, range, h, &headers))) {
            curl_easy_cleanup(e);
            curl_slist_free_all(headers.list);
            break;
        }
        double left_s = cfg.retry_budget_s - dh_clock_elapsed_s(started, dh_clock_now_ns());
        curl_easy_setopt(e, CURLOPT_URL, http_url);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.list);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, left_s > 0.001 ? (long)(left_s * 1000) : 1L);
        atomic_fetch_add_explicit(&n_requests, 1, memory_order_relaxed);
        if (attempt > 1)
            atomic_fetch_add_explicit(&n_retries, 1, memory_order_relaxed);
        x.from = from;
        CURLcode cc = curl_easy_perform(e);
        long status = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(e);
        curl_slist_free_all(headers.list);
        if (cc == CURLE_ABORTED_BY_CALLBACK) {
            rc = dh__set_error(DH_EIO,
                               "%s: bytes %" PRId64 "-%" PRId64 ": interrupted (the "
                               "sample's time is up) after %d %s",
                               shown, from, to, attempt, attempt == 1 ? "try" : "tries");
            break;
        }
        bool complete = cc == CURLE_OK || (cc == CURLE_WRITE_ERROR && x.stored == x.len);
        if (complete && (status == 200 || status == 206)) {
            rc = 0;
            break; /* all asked, or the object ended first (a short body that curl checked) */
        }
        if (complete && status == 416 && x.total >= 0 && from >= x.total) {
            rc = 0; /* the range starts at or past the end: nothing to read */
            break;
        }
        bool retry;
        if (complete) {
            error_code(&x);
            last = code_of_status(status);
            snprintf(why, sizeof why, "HTTP %ld%s%s", status, x.code[0] ? " " : "", x.code);
            retry = retryable_status(status);
        } else {
            last = DH_EIO;
            snprintf(why, sizeof why, "%s%s%s", curl_easy_strerror(cc), errbuf[0] ? ": " : "",
                     errbuf);
            if (status)
                snprintf(why + strlen(why), sizeof why - strlen(why), " (HTTP %ld)", status);
            retry = retryable_curl(cc);
        }
        double elapsed = dh_clock_elapsed_s(started, dh_clock_now_ns());
        double wait = cfg.backoff_s * (double)(1u << (attempt < 20 ? attempt - 1 : 19));
        if (wait > cfg.backoff_max_s)
            wait = cfg.backoff_max_s;
        if (!retry || attempt >= cfg.attempts || elapsed + wait >= cfg.retry_budget_s) {
            rc = dh__set_error(last, "%s: %s for bytes %" PRId64 "-%" PRId64 " after %d %s%s",
                               shown, why, from, to, attempt, attempt == 1 ? "try" : "tries",
                               retry ? " (retries exhausted)" : "");
            break;
        }
        if (backoff(wait, interrupt)) {
            rc = dh__set_error(DH_EIO,
                               "%s: interrupted (the sample's time is up) while waiting "
                               "to retry bytes %" PRId64 "-%" PRId64 " after %s",
                               shown, from, to, why);
            break;
        }
    }
    dh_free(owned);
    if (rc) {
        atomic_fetch_add_explicit(&n_errors, 1, memory_order_relaxed);
        return rc;
    }
    if (got)
        *got = size_only ? 0 : x.stored;
    if (total)
        *total = x.total;
    return 0;
}

int dh__http_get_range(const char *url, int64_t offset, size_t len, void *buf, size_t *got,
                       int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    *got = 0;
    if (total)
        *total = -1;
    if (len == 0)
        return 0;
    if (offset < 0 || (uint64_t)len > (uint64_t)INT64_MAX - (uint64_t)offset)
        return dh__set_error(DH_EINVAL, "range read: bad range at %" PRId64, offset);
    /* the wait and the bytes go to this thread's fetch tally, if a sample bound one (a
     * decode worker: its result's fetch_s/fetch_bytes, which the coordinator learns from;
     * core/internal.h) */
    uint64_t started = dh_clock_now_ns();
    int rc = request(url, offset, len, buf, got, total, interrupt);
    dh__fetch_note(dh_clock_now_ns() - started, *got);
    return rc;
}

int dh__http_size(const char *url, int64_t *size, const dh__remote_interrupt_t *interrupt)
{
    int64_t total = -1;
    int rc = request(url, 0, 0, NULL, NULL, &total, interrupt);
    if (rc)
        return rc;
    if (total < 0) {
        char shown[512];
        return dh__set_error(DH_EIO,
                             "%s: the server does not say the object's size "
                             "(no Content-Range or Content-Length)",
                             dh__url_redact(url, shown, sizeof shown));
    }
    *size = total;
    return 0;
}
