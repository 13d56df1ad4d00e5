/* s3_list.c: S3's replies read (docs/remote.md, "Listing"): ListObjectsV2 pages parsed with
 * expat into keys and sizes and the continuation token, S3 error documents into errors that
 * name the object, the status, S3's code and message; and the paginated listing of a prefix
 * over a transport callback (dh__s3_fetch_fn), so the room's HTTP client or a test's plugs in.
 *
 * Cost: one expat pass per page (1,000 keys by default, ~300 KB of XML), an allocation per
 * key. expat 2.5 refuses entity expansion attacks (billion laughs) by default and loads no
 * external entity. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <expat.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/s3.h"

#define TEXT_MAX_B ((size_t)1 << 16) /* S3 keys are at most 1,024 bytes; tokens a few hundred */

typedef struct {
    XML_Parser xp;
    const char *what;
    int rc;
    int depth;
    char root[32];
    bool in_contents;
    bool capture;
    char *text;
    size_t text_len;
    /* ListBucketResult */
    dh__s3_list_page_t *page;
    char *key;
    uint64_t size_B;
    bool have_size;
    bool have_truncated;
    bool url_encoded; /* <EncodingType>url</EncodingType>: keys are to be decoded */
    /* Error */
    char *code, *message;
} parser_t;

static int fail(parser_t *p, int rc)
{
    if (p->rc == 0)
        p->rc = rc;
    XML_StopParser(p->xp, XML_FALSE);
    return rc;
}

static void XMLCALL on_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
    (void)attrs;
    parser_t *p = ud;
    if (p->rc)
        return;
    p->depth++;
    dh_free(p->text);
    p->text = NULL;
    p->text_len = 0;
    p->capture = false;
    if (p->depth == 1) {
        snprintf(p->root, sizeof(p->root), "%s", name);
        if (strcmp(name, "ListBucketResult") != 0 && strcmp(name, "Error") != 0)
            fail(p, dh__set_error(DH_EPARSE, "%s: the reply is a <%.32s>, not a ListBucketResult",
                                  p->what, name));
        return;
    }
    /* Without a page (dh__s3_check_response) only an Error document is read. */
    bool list = p->page && strcmp(p->root, "ListBucketResult") == 0;
    if (list && p->depth == 2 && strcmp(name, "Contents") == 0) {
        p->in_contents = true;
        p->key = NULL;
        p->have_size = false;
        return;
    }
    if (list && p->depth == 2)
        p->capture = strcmp(name, "IsTruncated") == 0 ||
                     strcmp(name, "NextContinuationToken") == 0 ||
                     strcmp(name, "EncodingType") == 0;
    else if (list && p->depth == 3 && p->in_contents)
        p->capture = strcmp(name, "Key") == 0 || strcmp(name, "Size") == 0;
    else if (!list && p->depth == 2)
        p->capture = strcmp(name, "Code") == 0 || strcmp(name, "Message") == 0;
    if (p->capture && !(p->text = dh_strdup("")))
        fail(p, DH_ENOMEM);
}

static void XMLCALL on_text(void *ud, const XML_Char *s, int len)
{
    parser_t *p = ud;
    if (p->rc || !p->capture)
        return;
    if (p->text_len + (size_t)len > TEXT_MAX_B) {
        fail(p, dh__set_error(DH_EPARSE, "%s: an element's text is over %zu bytes", p->what,
                              TEXT_MAX_B));
        return;
    }
    char *t = dh_realloc(p->text, p->text_len + (size_t)len + 1);
    if (!t) {
        fail(p, DH_ENOMEM);
        return;
    }
    memcpy(t + p->text_len, s, (size_t)len);
    p->text_len += (size_t)len;
    t[p->text_len] = '\0';
    p->text = t;
}

static char *take_text(parser_t *p)
{
    char *t = p->text;
    p->text = NULL;
    p->text_len = 0;
    return t;
}

static int add_object(parser_t *p)
{
    dh__s3_list_page_t *g = p->page;
    if (g->count == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 64;
        dh__s3_object_t *o = dh_reallocarray(g->objects, cap, sizeof(*o));
        if (!o)
            return DH_ENOMEM;
        g->objects = o;
        g->cap = cap;
    }
    g->objects[g->count].key = p->key;
    g->objects[g->count].size_B = p->size_B;
    g->count++;
    p->key = NULL;
    return 0;
}

static void XMLCALL on_end(void *ud, const XML_Char *name)
{
    parser_t *p = ud;
    if (p->rc)
        return;
    int depth = p->depth--;
    /* Without a page (dh__s3_check_response) only an Error document is read. */
    bool list = p->page && strcmp(p->root, "ListBucketResult") == 0;
    if (list && depth == 2 && p->in_contents && strcmp(name, "Contents") == 0) {
        p->in_contents = false;
        unsigned long line = XML_GetCurrentLineNumber(p->xp);
        if (!p->key || !p->have_size) {
            fail(p, dh__set_error(DH_EPARSE, "%s: line %lu: a <Contents> without its %s", p->what,
                                  line, p->key ? "<Size>" : "<Key>"));
            return;
        }
        if (add_object(p) < 0)
            fail(p, DH_ENOMEM);
        return;
    }
    if (!p->capture)
        return;
    p->capture = false;
    char *t = take_text(p);
    if (!t)
        return;
    if (list && depth == 3 && strcmp(name, "Key") == 0) {
        dh_free(p->key);
        p->key = t;
        return;
    }
    if (list && depth == 3 && strcmp(name, "Size") == 0) {
        char *end = NULL;
        unsigned long long v = strtoull(t, &end, 10);
        bool ok = t[0] >= '0' && t[0] <= '9' && end && *end == '\0';
        dh_free(t);
        if (!ok) {
            fail(p, dh__set_error(DH_EPARSE, "%s: line %lu: a <Size> that is not a number", p->what,
                                  XML_GetCurrentLineNumber(p->xp)));
            return;
        }
        p->size_B = v;
        p->have_size = true;
        return;
    }
    if (list && strcmp(name, "IsTruncated") == 0) {
        p->page->truncated = strcmp(t, "true") == 0;
        p->have_truncated = true;
        dh_free(t);
        return;
    }
    if (list && strcmp(name, "EncodingType") == 0) {
        p->url_encoded = strcmp(t, "url") == 0;
        dh_free(t);
        return;
    }
    if (list && strcmp(name, "NextContinuationToken") == 0) {
        dh_free(p->page->next_token);
        p->page->next_token = t;
        return;
    }
    char **field = strcmp(name, "Code") == 0 ? &p->code : &p->message;
    dh_free(*field);
    *field = t;
}

/* Runs expat over the body. Returns 0, or a code with the message recorded. */
static int parse(parser_t *p, const char *body, size_t len)
{
    /* expat allocates through the library's hook too (docs/conventions.md, "Ownership"). */
    static const XML_Memory_Handling_Suite mem = {dh_malloc, dh_realloc, dh_free};
    p->xp = XML_ParserCreate_MM("UTF-8", &mem, NULL);
    if (!p->xp)
        return dh__set_error(DH_ENOMEM, "%s: out of memory creating the XML parser", p->what);
    XML_SetUserData(p->xp, p);
    XML_SetElementHandler(p->xp, on_start, on_end);
    XML_SetCharacterDataHandler(p->xp, on_text);
    if (len > (size_t)INT32_MAX) {
        XML_ParserFree(p->xp);
        return dh__set_error(DH_EPARSE, "%s: a reply of %zu bytes", p->what, len);
    }
    enum XML_Status st = XML_Parse(p->xp, body, (int)len, XML_TRUE);
    if (st != XML_STATUS_OK && p->rc == 0) {
        enum XML_Error e = XML_GetErrorCode(p->xp);
        p->rc = dh__set_error(e == XML_ERROR_NO_MEMORY ? DH_ENOMEM : DH_EPARSE,
                              "%s: the reply is not well-formed XML: line %lu, column %lu: %s",
                              p->what, (unsigned long)XML_GetCurrentLineNumber(p->xp),
                              (unsigned long)XML_GetCurrentColumnNumber(p->xp), XML_ErrorString(e));
    } else if (p->rc == DH_ENOMEM) {
        dh__set_error(DH_ENOMEM, "%s: out of memory parsing the reply", p->what);
    }
    XML_ParserFree(p->xp);
    p->xp = NULL;
    return p->rc;
}

/* Decodes a key listed with encoding-type=url in place, as botocore does (unquote_plus:
 * '+' is a space, a '+' of the key is %2B). Returns false on a malformed %XX. */
static bool url_decode(char *s)
{
    char *out = s;
    for (const char *in = s; *in; in++) {
        if (*in == '+') {
            *out++ = ' ';
        } else if (*in == '%') {
            int hi = dh__s3_hex_digit(in[1]), lo = hi < 0 ? -1 : dh__s3_hex_digit(in[2]);
            if (hi < 0 || lo < 0)
                return false;
            *out++ = (char)(hi * 16 + lo);
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
    return true;
}

static void parser_clear(parser_t *p)
{
    dh_free(p->text);
    dh_free(p->key);
    dh_free(p->code);
    dh_free(p->message);
}

void dh__s3_list_page_clear(dh__s3_list_page_t *page)
{
    if (!page)
        return;
    dh__s3_objects_free(page->objects, page->count);
    dh_free(page->next_token);
    memset(page, 0, sizeof(*page));
}

void dh__s3_objects_free(dh__s3_object_t *objects, size_t count)
{
    for (size_t i = 0; objects && i < count; i++)
        dh_free(objects[i].key);
    dh_free(objects);
}

static int error_code_of(long status, const char *code)
{
    if (status == 404 ||
        (code && (strcmp(code, "NoSuchKey") == 0 || strcmp(code, "NoSuchBucket") == 0)))
        return DH_ENOENT;
    if (status == 401 || status == 403)
        return DH_EAUTH;
    return DH_EIO;
}

int dh__s3_list_page_parse(const char *body, size_t len, const char *what, dh__s3_list_page_t *out)
{
    memset(out, 0, sizeof(*out));
    parser_t p = {.what = what, .page = out};
    int rc = parse(&p, body, len);
    if (rc == 0 && strcmp(p.root, "Error") == 0)
        rc = dh__set_error(DH_EIO, "%s: HTTP 200 with an error document: %s: %s", what,
                           p.code ? p.code : "(no Code)", p.message ? p.message : "(no Message)");
    else if (rc == 0 && !p.have_truncated)
        rc = dh__set_error(DH_EPARSE, "%s: the reply has no <IsTruncated>", what);
    else if (rc == 0 && out->truncated && !out->next_token)
        rc = dh__set_error(
            DH_EPARSE, "%s: the reply says IsTruncated but has no <NextContinuationToken>", what);
    for (size_t i = 0; rc == 0 && p.url_encoded && i < out->count; i++)
        if (!url_decode(out->objects[i].key))
            rc =
                dh__set_error(DH_EPARSE, "%s: key %zu of the page is not URL-encoded", what, i + 1);
    parser_clear(&p);
    if (rc < 0)
        dh__s3_list_page_clear(out);
    return rc;
}

int dh__s3_check_response(long status, const char *body, size_t body_len, const char *what)
{
    if (status >= 200 && status < 300)
        return 0;
    parser_t p = {.what = what};
    const char *code = NULL, *message = NULL;
    /* The body is only a hint: a reply that is not an error document names the status alone. */
    if (body && body_len && parse(&p, body, body_len) == 0 && strcmp(p.root, "Error") == 0) {
        code = p.code;
        message = p.message;
    }
    int rc = error_code_of(status, code);
    if (code)
        dh__set_error(rc, "%s: HTTP %ld %s: %s", what, status, code,
                      message ? message : "(no Message)");
    else
        dh__set_error(rc, "%s: HTTP %ld", what, status);
    parser_clear(&p);
    return rc;
}

int dh__s3_list_request(const dh__s3_config_t *cfg, const char *bucket, const char *prefix,
                        size_t max_keys, const char *token, time_t time_s, dh__s3_request_t *out)
{
    char max[32];
    snprintf(max, sizeof(max), "%zu", max_keys);
    /* encoding-type=url: a key may hold bytes XML 1.0 cannot carry (control characters);
     * listed URL-encoded, they are decoded by the parser. */
    dh__s3_pair_t params[5] = {
        {"list-type", "2"}, {"prefix", prefix ? prefix : ""}, {"encoding-type", "url"}};
    size_t n = 3;
    if (max_keys)
        params[n++] = (dh__s3_pair_t){"max-keys", max};
    if (token)
        params[n++] = (dh__s3_pair_t){"continuation-token", token};
    return dh__s3_request_build(cfg, "GET", bucket, "", params, n, NULL, 0, time_s, out);
}

int dh__s3_list(const dh__s3_config_t *cfg, const char *bucket, const char *prefix, size_t max_keys,
                dh__s3_fetch_fn fetch, void *fetch_ctx, dh__s3_object_t **objects, size_t *count)
{
    *objects = NULL;
    *count = 0;
    char what[1200];
    snprintf(what, sizeof(what), "listing s3://%s/%s", bucket, prefix ? prefix : "");
    dh__s3_list_page_t all = {0}, page = {0};
    char *token = NULL;
    int rc = 0;
    for (;;) {
        dh__s3_request_t req;
        if ((rc = dh__s3_list_request(cfg, bucket, prefix, max_keys, token, time(NULL), &req)) < 0)
            break;
        long status = 0;
        char *body = NULL;
        size_t body_len = 0;
        rc = fetch(fetch_ctx, "GET", req.url, (const char *const *)req.header_lines,
                   req.n_header_lines, &status, &body, &body_len);
        dh__s3_request_clear(&req);
        if (rc == 0 && (rc = dh__s3_check_response(status, body, body_len, what)) == 0)
            rc = dh__s3_list_page_parse(body ? body : "", body_len, what, &page);
        dh_free(body);
        if (rc < 0)
            break;
        /* Move the page's objects over. */
        if (all.count + page.count > all.cap) {
            size_t cap = all.cap ? all.cap : 64;
            while (cap < all.count + page.count)
                cap *= 2;
            dh__s3_object_t *o = dh_reallocarray(all.objects, cap, sizeof(*o));
            if (!o) {
                rc = dh__set_error(DH_ENOMEM, "%s: out of memory", what);
                break;
            }
            all.objects = o;
            all.cap = cap;
        }
        memcpy(all.objects + all.count, page.objects, page.count * sizeof(*page.objects));
        all.count += page.count;
        page.count = 0;
        if (!page.truncated)
            break;
        if (token && strcmp(token, page.next_token) == 0) {
            rc = dh__set_error(DH_EIO, "%s: the server gave the same continuation token twice",
                               what);
            break;
        }
        dh_free(token);
        token = page.next_token;
        page.next_token = NULL;
        dh__s3_list_page_clear(&page);
    }
    dh__s3_list_page_clear(&page);
    dh_free(token);
    if (rc < 0) {
        dh__s3_list_page_clear(&all);
        return rc;
    }
    *objects = all.objects;
    *count = all.count;
    return 0;
}
