/* remote/s3_hooks.c: the S3 half joined to the HTTP client (docs/remote.md, "S3 joined to the
 * reader"): the process's S3 settings (dh__s3_config_load, once, lazily at the first s3://
 * request or when a command sets its options), the scheme hooks that turn s3://bucket/key
 * into the endpoint's URL and sign every try of every request with SigV4, and the listing of
 * a prefix (ListObjectsV2, paginated) over a libcurl transport.
 *
 * Thread-safety: the settings are one process-wide object behind a mutex; the hooks hold it
 * while they build a URL or a signature (microseconds: SHA-256 and five HMACs), never during
 * a transfer. Secrets stay in the settings and in the header values handed to http.c, which
 * never prints them. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/remote_lib.h"
#include "remote/s3.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dh__s3_config_t settings;
static bool loaded;

/* Loads the settings from the environment and the AWS files if no command set them. Called
 * with the lock held. */
static int ensure_loaded(void)
{
    if (loaded)
        return 0;
    dh__s3_options_t o = {0};
    int rc = dh__s3_config_load(&settings, &o);
    if (rc < 0)
        return rc;
    loaded = true;
    return 0;
}

int dh__remote_s3_configure(const dh__remote_s3_settings_t *s)
{
    dh__s3_options_t o = {0};
    if (s) {
        o.endpoint_url = s->endpoint_url && *s->endpoint_url ? s->endpoint_url : NULL;
        o.profile = s->profile && *s->profile ? s->profile : NULL;
        o.anonymous = s->anonymous;
    }
    dh__s3_config_t c;
    int rc = dh__s3_config_load(&c, &o);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&lock);
    if (loaded)
        dh__s3_config_clear(&settings);
    settings = c;
    loaded = true;
    pthread_mutex_unlock(&lock);
    return 0;
}

void dh__remote_s3_forget(void)
{
    pthread_mutex_lock(&lock);
    if (loaded)
        dh__s3_config_clear(&settings);
    loaded = false;
    pthread_mutex_unlock(&lock);
}

/* s3://bucket/key -> the endpoint's URL (the key URI-encoded once, as it is signed). */
static int resolve(void *ctx, const char *url, char **http_url)
{
    (void)ctx;
    char *bucket = NULL, *key = NULL;
    int rc = dh__s3_url_split(url, &bucket, &key);
    if (rc < 0)
        return rc;
    dh__s3_request_t r = {0};
    pthread_mutex_lock(&lock);
    rc = ensure_loaded();
    if (rc == 0) {
        /* the URL alone: built as for anonymous access (the same encoding, no signature) */
        dh__s3_config_t unsigned_cfg = settings;
        unsigned_cfg.access_key_id = NULL;
        rc = dh__s3_request_build(&unsigned_cfg, "GET", bucket, key, NULL, 0, NULL, 0, 0, &r);
    }
    pthread_mutex_unlock(&lock);
    dh_free(bucket);
    dh_free(key);
    if (rc == 0) {
        *http_url = r.url;
        r.url = NULL;
    }
    dh__s3_request_clear(&r);
    return rc;
}

/* The decoded path of a URL (the signer encodes it again, by the same rules that encoded it:
 * resolve's URLs come back byte for byte). */
static char *decode_path(const char *p, size_t len)
{
    char *out = dh_malloc(len + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int hi, lo;
        if (p[i] == '%' && i + 2 < len && (hi = dh__s3_hex_digit(p[i + 1])) >= 0 &&
            (lo = dh__s3_hex_digit(p[i + 2])) >= 0) {
            out[n++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[n++] = p[i];
        }
    }
    out[n] = '\0';
    return out;
}

/* SigV4 headers for one try (its time, UNSIGNED-PAYLOAD); nothing for anonymous access. */
static int sign(void *ctx, const dh__http_request_t *req, dh__http_headers_t *headers)
{
    (void)ctx;
    const dh__url_t *u = req->parsed;
    if (u->query)
        return dh__set_error(DH_EINVAL, "%s: an S3 request with a query string is not signed here",
                             u->host);
    char host[300];
    bool v6 = strchr(u->host, ':') != NULL;
    bool default_port = (u->scheme == DH_URL_HTTP && u->port == 80) ||
                        (u->scheme == DH_URL_HTTPS && u->port == 443);
    if (default_port)
        snprintf(host, sizeof host, v6 ? "[%s]" : "%s", u->host);
    else
        snprintf(host, sizeof host, v6 ? "[%s]:%d" : "%s:%d", u->host, u->port);
    char *path = decode_path(u->path, u->path_len);
    dh__s3_pair_t set[4];
    size_t n_set = 0;
    for (size_t i = 0; i < req->n_headers && n_set < 4; i++)
        set[n_set++] = (dh__s3_pair_t){req->headers[i].name, req->headers[i].value};
    if (!path)
        return dh__set_error(DH_ENOMEM, "signing an S3 request: out of memory");
    dh__s3_signed_t s = {0};
    int rc = 0;
    pthread_mutex_lock(&lock);
    if ((rc = ensure_loaded()) == 0 && settings.access_key_id) {
        dh__s3_sign_input_t in = {
            .method = req->method,
            .host = host,
            .path = path,
            .headers = set,
            .n_headers = n_set,
            .payload_sha256 = DH__S3_UNSIGNED_PAYLOAD,
            .content_sha256_header = true,
            .access_key_id = settings.access_key_id,
            .secret_access_key = settings.secret_access_key,
            .session_token = settings.session_token,
            .region = settings.region,
            .service = "s3",
            .time_s = (time_t)req->unix_time_s,
        };
        rc = dh__s3_sign(&in, &s);
    }
    pthread_mutex_unlock(&lock);
    dh_free(path);
    /* the headers the request has already (Range) come first: add the rest */
    for (size_t i = n_set; rc == 0 && i < s.n_header_lines; i++) {
        char *line = s.header_lines[i], *colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = '\0';
        const char *value = colon + 1;
        while (*value == ' ')
            value++;
        rc = dh__http_add_header(headers, line, value);
    }
    dh__s3_signed_clear(&s);
    return rc;
}

static const dh__remote_scheme_t s3_hooks = {.resolve = resolve, .sign = sign, .ctx = NULL};

const dh__remote_scheme_t *dh__s3_default_hooks(void)
{
    return &s3_hooks;
}

/* ---- listing ---- */

typedef struct {
    char *data;
    size_t len;
    int failed;
} body_t;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    body_t *b = ud;
    char *q = dh_realloc(b->data, b->len + size * n + 1);
    if (!q) {
        b->failed = 1;
        return 0;
    }
    memcpy(q + b->len, p, size * n);
    b->len += size * n;
    q[b->len] = '\0';
    b->data = q;
    return size * n;
}

/* dh__s3_fetch_fn over one libcurl handle (a listing is a few requests per command: no pool).
 * TLS verified, against DH_CA_BUNDLE when set. */
static int curl_fetch(void *ctx, const char *method, const char *url, const char *const *lines,
                      size_t n_lines, long *status, char **body, size_t *body_len)
{
    (void)ctx;
    char shown[512];
    dh__url_redact(url, shown, sizeof shown);
    CURL *c = curl_easy_init();
    if (!c)
        return dh__set_error(DH_ENOMEM, "%s: out of memory", shown);
    struct curl_slist *headers = NULL;
    body_t b = {0};
    for (size_t i = 0; i < n_lines; i++) {
        struct curl_slist *h = curl_slist_append(headers, lines[i]);
        if (!h) {
            curl_slist_free_all(headers);
            curl_easy_cleanup(c);
            return dh__set_error(DH_ENOMEM, "%s: out of memory", shown);
        }
        headers = h;
    }
    dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "datahelix");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(cfg.connect_timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(cfg.retry_budget_s * 1000));
    if (cfg.ca_bundle[0])
        curl_easy_setopt(c, CURLOPT_CAINFO, cfg.ca_bundle);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK || b.failed) {
        dh_free(b.data);
        if (b.failed)
            return dh__set_error(DH_ENOMEM, "%s: out of memory", shown);
        return dh__set_error(DH_EIO, "%s: %s%s%s", shown, curl_easy_strerror(rc),
                             errbuf[0] ? ": " : "", errbuf);
    }
    *body = b.data;
    *body_len = b.len;
    return 0;
}

int dh__remote_s3_list(const char *url, dh__remote_object_t **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    char *bucket = NULL, *prefix = NULL;
    int rc = dh__s3_url_split(url, &bucket, &prefix);
    if (rc < 0)
        return rc;
    dh__s3_config_t c = {0};
    pthread_mutex_lock(&lock);
    rc = ensure_loaded();
    if (rc == 0) { /* a copy: the listing runs without the lock */
        c.access_key_id = settings.access_key_id ? dh_strdup(settings.access_key_id) : NULL;
        c.secret_access_key =
            settings.secret_access_key ? dh_strdup(settings.secret_access_key) : NULL;
        c.session_token = settings.session_token ? dh_strdup(settings.session_token) : NULL;
        c.region = dh_strdup(settings.region);
        c.endpoint_url = settings.endpoint_url ? dh_strdup(settings.endpoint_url) : NULL;
        c.style = settings.style;
        if ((settings.access_key_id && !c.access_key_id) ||
            (settings.secret_access_key && !c.secret_access_key) ||
            (settings.session_token && !c.session_token) || !c.region ||
            (settings.endpoint_url && !c.endpoint_url))
            rc = dh__set_error(DH_ENOMEM, "listing %s: out of memory", url);
    }
    pthread_mutex_unlock(&lock);
    dh__s3_object_t *objects = NULL;
    size_t n = 0;
    if (rc == 0)
        rc = dh__s3_list(&c, bucket, prefix, 0, curl_fetch, NULL, &objects, &n);
    dh__s3_config_clear(&c);
    dh__remote_object_t *o = NULL;
    if (rc == 0 && n > 0 && !(o = dh_calloc(n, sizeof *o)))
        rc = dh__set_error(DH_ENOMEM, "listing %s: out of memory", url);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        size_t len = strlen(bucket) + strlen(objects[i].key) + 8;
        o[i].url = dh_malloc(len);
        if (!o[i].url) {
            rc = dh__set_error(DH_ENOMEM, "listing %s: out of memory", url);
            dh__remote_objects_free(o, i);
            o = NULL;
            break;
        }
        snprintf(o[i].url, len, "s3://%s/%s", bucket, objects[i].key);
        o[i].size_B = objects[i].size_B;
    }
    dh__s3_objects_free(objects, n);
    dh_free(bucket);
    dh_free(prefix);
    if (rc < 0)
        return rc;
    *out = o;
    *count = n;
    return 0;
}

void dh__remote_objects_free(dh__remote_object_t *objects, size_t count)
{
    for (size_t i = 0; objects && i < count; i++)
        dh_free(objects[i].url);
    dh_free(objects);
}
