/* s3_url.c: where an S3 request goes (docs/remote.md, "Addressing"): `s3://bucket/key` split,
 * virtual-hosted style on AWS (`https://bucket.s3.REGION.amazonaws.com/key`), path style
 * (`ENDPOINT/bucket/key`) on a custom endpoint (--s3-endpoint, AWS_ENDPOINT_URL), either one
 * when asked; and the request of a method on a key, its URL and signed header lines
 * (s3_sign.c), ready for a transport.
 *
 * Cost: string work only, a few allocations per request. */
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/s3.h"

static bool bucket_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

int dh__s3_url_split(const char *url, char **bucket, char **key)
{
    *bucket = *key = NULL;
    if (strncmp(url, "s3://", 5) != 0)
        return dh__set_error(DH_EINVAL, "'%s': not an s3:// URL", url);
    const char *b = url + 5;
    const char *slash = strchr(b, '/');
    size_t n = slash ? (size_t)(slash - b) : strlen(b);
    if (n < 3 || n > 63)
        return dh__set_error(DH_EINVAL, "'%s': a bucket name has 3 to 63 characters, not %zu", url,
                             n);
    for (size_t i = 0; i < n; i++)
        if (!bucket_char(b[i]))
            return dh__set_error(DH_EINVAL,
                                 "'%s': character %zu of the bucket name is not one of "
                                 "a-z 0-9 . - _",
                                 url, 5 + i + 1);
    *bucket = dh_malloc(n + 1);
    *key = dh_strdup(slash ? slash + 1 : "");
    if (!*bucket || !*key) {
        dh_free(*bucket);
        dh_free(*key);
        *bucket = *key = NULL;
        return dh__set_error(DH_ENOMEM, "'%s': out of memory", url);
    }
    memcpy(*bucket, b, n);
    (*bucket)[n] = '\0';
    return 0;
}

void dh__s3_target_clear(dh__s3_target_t *t)
{
    if (!t)
        return;
    dh_free(t->base);
    dh_free(t->host);
    dh_free(t->path);
    memset(t, 0, sizeof(*t));
}

/* A bucket that can be a DNS label of a TLS name: no '.', no '_', no upper case. */
static bool virtual_ok(const char *bucket)
{
    return !strpbrk(bucket, "._") && bucket[0] != '-' && bucket[strlen(bucket) - 1] != '-';
}

static char *join(const char *a, const char *b, const char *c, const char *d)
{
    size_t n = strlen(a) + strlen(b) + strlen(c) + strlen(d);
    char *s = dh_malloc(n + 1);
    if (s)
        snprintf(s, n + 1, "%s%s%s%s", a, b, c, d);
    return s;
}

int dh__s3_target_make(const dh__s3_config_t *cfg, const char *bucket, const char *key,
                       dh__s3_target_t *out)
{
    memset(out, 0, sizeof(*out));
    const char *scheme = "https://", *host = NULL;
    char aws_host[128];
    if (cfg->endpoint_url) {
        scheme = strncmp(cfg->endpoint_url, "https://", 8) == 0 ? "https://" : "http://";
        host = cfg->endpoint_url + strlen(scheme);
    } else {
        snprintf(aws_host, sizeof(aws_host), "s3.%s.amazonaws.com", cfg->region);
        host = aws_host;
    }
    if (cfg->style == DH__S3_STYLE_VIRTUAL && !virtual_ok(bucket))
        return dh__set_error(DH_EINVAL,
                             "s3://%s: the bucket name cannot be a host name label "
                             "(virtual-hosted style); use path style",
                             bucket);
    bool is_virtual = cfg->style == DH__S3_STYLE_VIRTUAL ||
                      (cfg->style == DH__S3_STYLE_AUTO && !cfg->endpoint_url && virtual_ok(bucket));
    if (is_virtual) {
        out->host = join(bucket, ".", host, "");
        out->path = join("/", key, "", "");
    } else {
        out->host = join(host, "", "", "");
        out->path = join("/", bucket, "/", key);
    }
    if (out->host)
        out->base = join(scheme, out->host, "", "");
    if (!out->host || !out->path || !out->base) {
        dh__s3_target_clear(out);
        return dh__set_error(DH_ENOMEM, "s3://%s: out of memory", bucket);
    }
    return 0;
}

void dh__s3_request_clear(dh__s3_request_t *r)
{
    if (!r)
        return;
    dh_free(r->url);
    for (size_t i = 0; i < r->n_header_lines; i++)
        dh_free(r->header_lines[i]);
    dh_free(r->header_lines);
    memset(r, 0, sizeof(*r));
}

int dh__s3_request_build(const dh__s3_config_t *cfg, const char *method, const char *bucket,
                         const char *key, const dh__s3_pair_t *params, size_t n_params,
                         const dh__s3_pair_t *headers, size_t n_headers, time_t time_s,
                         dh__s3_request_t *out)
{
    memset(out, 0, sizeof(*out));
    dh__s3_target_t t;
    int rc = dh__s3_target_make(cfg, bucket, key, &t);
    if (rc < 0)
        return rc;
    bool body_less = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    dh__s3_sign_input_t in = {
        .method = method,
        .host = t.host,
        .path = t.path,
        .params = params,
        .n_params = n_params,
        .headers = headers,
        .n_headers = n_headers,
        .payload_sha256 = body_less ? DH__S3_UNSIGNED_PAYLOAD : DH__S3_EMPTY_SHA256,
        .content_sha256_header = true,
        .access_key_id = cfg->access_key_id,
        .secret_access_key = cfg->secret_access_key,
        .session_token = cfg->session_token,
        .region = cfg->region,
        .service = "s3",
        .time_s = time_s,
    };
    dh__s3_signed_t s = {0};
    if (cfg->access_key_id) {
        if ((rc = dh__s3_sign(&in, &s)) < 0)
            goto done;
    } else {
        /* Anonymous: the same encoding, no signature; only the caller's headers are sent.
         * Signing with an empty key gives that encoding without a second code path. */
        in.access_key_id = in.secret_access_key = "";
        in.session_token = NULL;
        in.content_sha256_header = false;
        if ((rc = dh__s3_sign(&in, &s)) < 0)
            goto done;
        for (size_t i = n_headers; i < s.n_header_lines; i++) {
            dh_free(s.header_lines[i]);
            s.header_lines[i] = NULL;
        }
        s.n_header_lines = n_headers;
    }
    out->url = join(t.base, s.encoded_path, s.query[0] ? "?" : "", s.query);
    if (!out->url) {
        rc = dh__set_error(DH_ENOMEM, "s3://%s/%s: out of memory", bucket, key);
        goto done;
    }
    out->header_lines = s.header_lines;
    out->n_header_lines = s.n_header_lines;
    s.header_lines = NULL;
    s.n_header_lines = 0;
done:
    dh__s3_signed_clear(&s);
    dh__s3_target_clear(&t);
    if (rc < 0)
        dh__s3_request_clear(out);
    return rc;
}
