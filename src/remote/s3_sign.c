/* s3_sign.c: AWS Signature Version 4 (AWS4-HMAC-SHA256) of one request, with libcrypto's
 * SHA-256 and HMAC (docs/remote.md, "Signing"): the canonical request, the string to sign, the
 * signing key derived from the secret, date, region and service, and the headers to send.
 * Checked against AWS's published SigV4 test suite and the S3 documentation's worked examples
 * (tests/remote/test_s3_sign.c).
 *
 * Cost: a few small allocations and five HMACs per request, microseconds; the signing key is
 * derived anew each time (caching it per day and region would save four HMACs).
 * Limit: no chunked (streaming) payload signing and no presigned (query) signatures. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/s3.h"

/* A growable string; `failed` latches an allocation failure so callers check once. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed;
} buf_t;

static void buf_add(buf_t *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = dh_realloc(b->data, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_str(buf_t *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

/* Hands the string over (an empty one if nothing was added), or NULL after a failure. */
static char *buf_take(buf_t *b)
{
    if (!b->failed && !b->data)
        buf_add(b, "", 0);
    if (b->failed) {
        dh_free(b->data);
        b->data = NULL;
        return NULL;
    }
    char *s = b->data;
    b->data = NULL;
    return s;
}

static bool unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

static void encode_into(buf_t *b, const char *s, size_t len, bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (unreserved(c) || (keep_slash && c == '/')) {
            buf_add(b, (const char *)&c, 1);
        } else {
            char esc[3] = {'%', hex[c >> 4], hex[c & 15]};
            buf_add(b, esc, 3);
        }
    }
}

int dh__s3_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

char *dh__s3_uri_encode(const char *s, size_t len, bool keep_slash)
{
    buf_t b = {0};
    encode_into(&b, s, len, keep_slash);
    char *out = buf_take(&b);
    if (!out)
        dh__set_error(DH_ENOMEM, "s3: out of memory encoding a URI");
    return out;
}

static void to_hex(const unsigned char *bytes, size_t n, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[bytes[i] >> 4];
        hex[2 * i + 1] = digits[bytes[i] & 15];
    }
    hex[2 * n] = '\0';
}

int dh__s3_sha256_hex(const void *data, size_t len, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL) || md_len != 32)
        return dh__set_error(DH_ENOMEM, "s3: SHA-256 failed (libcrypto)");
    to_hex(md, md_len, hex);
    return 0;
}

static int hmac(const unsigned char *key, size_t key_len, const char *msg, unsigned char out[32])
{
    unsigned int out_len = 0;
    if (!HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), out,
              &out_len) ||
        out_len != 32)
        return dh__set_error(DH_ENOMEM, "s3: HMAC-SHA256 failed (libcrypto)");
    return 0;
}

/* A header in canonical form: lower-case name, value trimmed with inner runs of blanks
 * collapsed to one space. `order` keeps the input order among equal names. */
typedef struct {
    char *name;
    char *value;
    size_t order;
} canon_header_t;

static int header_cmp(const void *pa, const void *pb)
{
    const canon_header_t *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    if (c)
        return c;
    return a->order < b->order ? -1 : a->order > b->order;
}

typedef struct {
    char *name; /* encoded */
    char *value;
} canon_param_t;

static int param_cmp(const void *pa, const void *pb)
{
    const canon_param_t *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    return c ? c : strcmp(a->value, b->value);
}

static char *canon_value(const char *v)
{
    buf_t b = {0};
    while (*v == ' ' || *v == '\t')
        v++;
    bool space = false;
    for (; *v; v++) {
        if (*v == ' ' || *v == '\t') {
            space = true;
            continue;
        }
        if (space)
            buf_add(&b, " ", 1);
        space = false;
        buf_add(&b, v, 1);
    }
    return buf_take(&b);
}

static bool sendable(const char *s, bool name)
{
    if (name && !*s)
        return false;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\t' && !name)
            continue;
        if (c < 0x20 || c == 0x7f || (name && (c == ':' || c == ' ')))
            return false;
    }
    return true;
}

void dh__s3_signed_clear(dh__s3_signed_t *s)
{
    if (!s)
        return;
    dh_free(s->canonical_request);
    dh_free(s->string_to_sign);
    dh_free(s->signature);
    dh_free(s->authorization);
    dh_free(s->query);
    dh_free(s->encoded_path);
    for (size_t i = 0; i < s->n_header_lines; i++)
        dh_free(s->header_lines[i]);
    dh_free(s->header_lines);
    memset(s, 0, sizeof(*s));
}

static char *header_line(const char *name, const char *value)
{
    buf_t b = {0};
    buf_str(&b, name);
    buf_add(&b, ": ", 2);
    buf_str(&b, value);
    return buf_take(&b);
}

int dh__s3_sign(const dh__s3_sign_input_t *in, dh__s3_signed_t *out)
{
    assert(in->method && in->host && in->path && in->payload_sha256 && in->access_key_id &&
           in->secret_access_key && in->region && in->service);
    assert(in->n_params == 0 || in->params);
    assert(in->n_headers == 0 || in->headers);
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < in->n_headers; i++)
        if (!sendable(in->headers[i].name, true) || !sendable(in->headers[i].value, false))
            return dh__set_error(DH_EINVAL,
                                 "s3: header '%s' cannot be sent (empty name, or a "
                                 "control character in its name or value)",
                                 sendable(in->headers[i].name, true) ? in->headers[i].name : "?");
    int rc = DH_ENOMEM;
    char amz_date[17], day[9];
    struct tm tm;
    gmtime_r(&in->time_s, &tm);
    strftime(amz_date, sizeof(amz_date), "%Y%m%dT%H%M%SZ", &tm);
    memcpy(day, amz_date, 8);
    day[8] = '\0';

    size_t n_canon = in->n_headers + 4;
    canon_header_t *hs = dh_calloc(n_canon, sizeof(*hs));
    canon_param_t *ps = dh_calloc(in->n_params ? in->n_params : 1, sizeof(*ps));
    buf_t creq = {0}, signed_names = {0}, sts = {0}, auth = {0}, query = {0};
    size_t nh = 0;
    if (!hs || !ps)
        goto done;

    /* The headers: the caller's, then host, x-amz-date and the optional two. */
    for (size_t i = 0; i < in->n_headers; i++, nh++) {
        hs[nh].name = dh_strdup(in->headers[i].name);
        hs[nh].value = canon_value(in->headers[i].value);
        hs[nh].order = nh;
        if (!hs[nh].name || !hs[nh].value) {
            nh++;
            goto done;
        }
        for (char *c = hs[nh].name; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c - 'A' + 'a');
    }
    const char *ours[4][2] = {
        {"host", in->host},
        {"x-amz-date", amz_date},
        {"x-amz-content-sha256", in->content_sha256_header ? in->payload_sha256 : NULL},
        {"x-amz-security-token", in->session_token}};
    for (size_t i = 0; i < 4; i++) {
        if (!ours[i][1])
            continue;
        hs[nh].name = dh_strdup(ours[i][0]);
        hs[nh].value = canon_value(ours[i][1]);
        hs[nh].order = nh;
        nh++;
        if (!hs[nh - 1].name || !hs[nh - 1].value)
            goto done;
    }
    qsort(hs, nh, sizeof(*hs), header_cmp);

    /* The query: each name and value encoded ('/' too), sorted by name, then value. */
    for (size_t i = 0; i < in->n_params; i++) {
        ps[i].name = dh__s3_uri_encode(in->params[i].name, strlen(in->params[i].name), false);
        ps[i].value = dh__s3_uri_encode(in->params[i].value, strlen(in->params[i].value), false);
        if (!ps[i].name || !ps[i].value)
            goto done;
    }
    qsort(ps, in->n_params, sizeof(*ps), param_cmp);
    for (size_t i = 0; i < in->n_params; i++) {
        if (i)
            buf_add(&query, "&", 1);
        buf_str(&query, ps[i].name);
        buf_add(&query, "=", 1);
        buf_str(&query, ps[i].value);
    }

    /* The canonical request. Equal names become one line, values joined by ','. */
    buf_str(&creq, in->method);
    buf_add(&creq, "\n", 1);
    encode_into(&creq, in->path, strlen(in->path), true);
    size_t path_end = creq.len;
    buf_add(&creq, "\n", 1);
    buf_str(&creq, query.data ? query.data : "");
    buf_add(&creq, "\n", 1);
    for (size_t i = 0; i < nh; i++) {
        bool same = i > 0 && strcmp(hs[i].name, hs[i - 1].name) == 0;
        if (same) {
            buf_add(&creq, ",", 1);
        } else {
            if (i > 0)
                buf_add(&creq, "\n", 1);
            buf_str(&creq, hs[i].name);
            buf_add(&creq, ":", 1);
            if (signed_names.len)
                buf_add(&signed_names, ";", 1);
            buf_str(&signed_names, hs[i].name);
        }
        buf_str(&creq, hs[i].value);
    }
    buf_add(&creq, "\n\n", 2);
    buf_str(&creq, signed_names.data ? signed_names.data : "");
    buf_add(&creq, "\n", 1);
    buf_str(&creq, in->payload_sha256);
    if (creq.failed || signed_names.failed || query.failed)
        goto done;
    out->encoded_path = dh_malloc(path_end - strlen(in->method));
    if (!out->encoded_path)
        goto done;
    memcpy(out->encoded_path, creq.data + strlen(in->method) + 1,
           path_end - strlen(in->method) - 1);
    out->encoded_path[path_end - strlen(in->method) - 1] = '\0';

    /* The string to sign, and the signing key: HMAC chain over date, region, service. */
    char creq_hash[65];
    if ((rc = dh__s3_sha256_hex(creq.data, creq.len, creq_hash)) < 0)
        goto done;
    rc = DH_ENOMEM;
    buf_str(&sts, "AWS4-HMAC-SHA256\n");
    buf_str(&sts, amz_date);
    buf_add(&sts, "\n", 1);
    buf_str(&sts, day);
    buf_add(&sts, "/", 1);
    buf_str(&sts, in->region);
    buf_add(&sts, "/", 1);
    buf_str(&sts, in->service);
    buf_str(&sts, "/aws4_request\n");
    buf_str(&sts, creq_hash);
    if (sts.failed)
        goto done;

    size_t secret_len = strlen(in->secret_access_key);
    unsigned char *k0 = dh_malloc(secret_len + 4);
    if (!k0)
        goto done;
    memcpy(k0, "AWS4", 4);
    memcpy(k0 + 4, in->secret_access_key, secret_len);
    unsigned char k_date[32], k_region[32], k_service[32], k_signing[32], sig[32];
    rc = hmac(k0, secret_len + 4, day, k_date);
    OPENSSL_cleanse(k0, secret_len + 4); /* the secret does not linger in freed memory */
    dh_free(k0);
    if (rc < 0 || (rc = hmac(k_date, 32, in->region, k_region)) < 0 ||
        (rc = hmac(k_region, 32, in->service, k_service)) < 0 ||
        (rc = hmac(k_service, 32, "aws4_request", k_signing)) < 0 ||
        (rc = hmac(k_signing, 32, sts.data, sig)) < 0)
        goto done;
    rc = DH_ENOMEM;
    char sig_hex[65];
    to_hex(sig, 32, sig_hex);

    buf_str(&auth, "AWS4-HMAC-SHA256 Credential=");
    buf_str(&auth, in->access_key_id);
    buf_add(&auth, "/", 1);
    buf_str(&auth, day);
    buf_add(&auth, "/", 1);
    buf_str(&auth, in->region);
    buf_add(&auth, "/", 1);
    buf_str(&auth, in->service);
    buf_str(&auth, "/aws4_request, SignedHeaders=");
    buf_str(&auth, signed_names.data);
    buf_str(&auth, ", Signature=");
    buf_str(&auth, sig_hex);

    /* The lines to send: the caller's headers as given, then ours (Host comes from the URL). */
    out->header_lines = dh_calloc(in->n_headers + 4, sizeof(char *));
    if (!out->header_lines)
        goto done;
    for (size_t i = 0; i < in->n_headers; i++)
        if (!(out->header_lines[out->n_header_lines++] =
                  header_line(in->headers[i].name, in->headers[i].value)))
            goto done;
    for (size_t i = 1; i < 4; i++)
        if (ours[i][1] &&
            !(out->header_lines[out->n_header_lines++] = header_line(ours[i][0], ours[i][1])))
            goto done;
    out->signature = dh_strdup(sig_hex);
    out->authorization = buf_take(&auth);
    if (!out->signature || !out->authorization)
        goto done;
    if (!(out->header_lines[out->n_header_lines++] =
              header_line("Authorization", out->authorization)))
        goto done;
    out->canonical_request = buf_take(&creq);
    out->string_to_sign = buf_take(&sts);
    out->query = buf_take(&query);
    if (!out->canonical_request || !out->string_to_sign || !out->query)
        goto done;
    rc = 0;

done:
    for (size_t i = 0; hs && i < nh; i++) {
        dh_free(hs[i].name);
        dh_free(hs[i].value);
    }
    for (size_t i = 0; i < in->n_params; i++) {
        dh_free(ps ? ps[i].name : NULL);
        dh_free(ps ? ps[i].value : NULL);
    }
    dh_free(hs);
    dh_free(ps);
    dh_free(creq.data);
    dh_free(signed_names.data);
    dh_free(sts.data);
    dh_free(auth.data);
    dh_free(query.data);
    if (rc < 0) {
        dh__s3_signed_clear(out);
        if (rc == DH_ENOMEM)
            dh__set_error(DH_ENOMEM, "s3: out of memory signing a %s request", in->method);
    }
    return rc;
}
