/* test_s3_list.c: ListObjectsV2 pages and S3 error documents parsed (well-formed, truncated,
 * malformed, hostile), and the paginated listing over a scripted transport: the requests it
 * sends, the token it follows, the errors it stops on. The same listing against a real S3
 * API server is test_s3_server.c. */
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "dh_test.h"
#include "remote/s3.h"

#define HEAD "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define NS "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"

static const char *const PAGE1 =
    HEAD NS "<Name>bucket</Name><Prefix>shards/</Prefix><KeyCount>2</KeyCount>"
            "<MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>"
            "<Contents><Key>shards/000.tar</Key><LastModified>2026-01-01T00:00:00.000Z"
            "</LastModified><ETag>&quot;abc&quot;</ETag><Size>10240</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
            "<Contents><Key>shards/a &amp; b.tar</Key><Size>0</Size></Contents>"
            "<NextContinuationToken>tok/1+=</NextContinuationToken></ListBucketResult>";

static const char *const PAGE2 =
    HEAD NS "<Name>bucket</Name><IsTruncated>false</IsTruncated>"
            "<Contents><Key>shards/\xc3\xbc.tar</Key><Size>18446744073709551615</Size></Contents>"
            "</ListBucketResult>";

static void page_parsed(void **state)
{
    (void)state;
    dh__s3_list_page_t p;
    assert_int_equal(dh__s3_list_page_parse(PAGE1, strlen(PAGE1), "listing", &p), 0);
    assert_int_equal(p.count, 2);
    assert_string_equal(p.objects[0].key, "shards/000.tar");
    assert_int_equal(p.objects[0].size_B, 10240);
    assert_string_equal(p.objects[1].key, "shards/a & b.tar");
    assert_int_equal(p.objects[1].size_B, 0);
    assert_true(p.truncated);
    assert_string_equal(p.next_token, "tok/1+=");
    dh__s3_list_page_clear(&p);
    assert_int_equal(dh__s3_list_page_parse(PAGE2, strlen(PAGE2), "listing", &p), 0);
    assert_int_equal(p.count, 1);
    assert_string_equal(p.objects[0].key, "shards/\xc3\xbc.tar");
    assert_true(p.objects[0].size_B == UINT64_MAX);
    assert_false(p.truncated);
    assert_null(p.next_token);
    dh__s3_list_page_clear(&p);
    /* An empty listing. */
    const char *empty = HEAD NS "<IsTruncated>false</IsTruncated></ListBucketResult>";
    assert_int_equal(dh__s3_list_page_parse(empty, strlen(empty), "listing", &p), 0);
    assert_int_equal(p.count, 0);
    dh__s3_list_page_clear(&p);
}

/* encoding-type=url: keys decoded as botocore does ('+' a space, %2B a '+'); a page without
 * EncodingType keeps its keys as they are. */
static void url_encoded_keys_decoded(void **state)
{
    (void)state;
    const char *page = HEAD NS "<EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
                               "<Contents><Key>odd/a+b%2Bc%25%0A%C3%BC.tar</Key><Size>1</Size>"
                               "</Contents><Contents><Key>plain</Key><Size>2</Size></Contents>"
                               "</ListBucketResult>";
    dh__s3_list_page_t p;
    assert_int_equal(dh__s3_list_page_parse(page, strlen(page), "listing", &p), 0);
    assert_int_equal(p.count, 2);
    assert_string_equal(p.objects[0].key, "odd/a b+c%\n\xc3\xbc.tar");
    assert_string_equal(p.objects[1].key, "plain");
    dh__s3_list_page_clear(&p);
    const char *bad =
        HEAD NS "<EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
                "<Contents><Key>ok</Key><Size>1</Size></Contents>"
                "<Contents><Key>a%2</Key><Size>1</Size></Contents></ListBucketResult>";
    assert_int_equal(dh__s3_list_page_parse(bad, strlen(bad), "listing s3://b/", &p), DH_EPARSE);
    assert_string_equal(dh_last_error(), "listing s3://b/: key 2 of the page is not URL-encoded");
    assert_null(p.objects);
}

static void malformed_pages_fail_named(void **state)
{
    (void)state;
    char cut[1024];
    snprintf(cut, sizeof(cut), "%.*s", (int)(strlen(PAGE1) / 2), PAGE1);
    static const char *const doubly =
        HEAD NS "<IsTruncated>false</IsTruncated>"
                "<Contents><Key>a</Key></Contents></ListBucketResult>";
    const struct {
        const char *body;
        const char *want;
    } cases[] = {
        {cut, "s3://b/p: the reply is not well-formed XML: line 2, column"},
        {"", "s3://b/p: the reply is not well-formed XML"},
        {"not xml at all", "the reply is not well-formed XML: line 1, column 0"},
        {HEAD "<Html><Body>proxy</Body></Html>", "the reply is a <Html>, not a ListBucketResult"},
        {doubly, "s3://b/p: line 2: a <Contents> without its <Size>"},
        {HEAD NS "<IsTruncated>false</IsTruncated><Contents><Size>1</Size></Contents>"
                 "</ListBucketResult>",
         "a <Contents> without its <Key>"},
        {HEAD NS "<IsTruncated>false</IsTruncated><Contents><Key>a</Key><Size>-1</Size>"
                 "</Contents></ListBucketResult>",
         "line 2: a <Size> that is not a number"},
        {HEAD NS "<IsTruncated>true</IsTruncated></ListBucketResult>",
         "says IsTruncated but has no <NextContinuationToken>"},
        {HEAD NS "</ListBucketResult>", "the reply has no <IsTruncated>"},
        {HEAD "<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>",
         "s3://b/p: HTTP 200 with an error document: SlowDown: Reduce your rate"},
        /* An entity expansion bomb: expat refuses it. */
        {HEAD "<!DOCTYPE l [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;\">"
              "<!ENTITY c \"&b;&b;&b;&b;&b;&b;&b;&b;\"><!ENTITY d \"&c;&c;&c;&c;&c;&c;&c;&c;\">"
              "<!ENTITY e \"&d;&d;&d;&d;&d;&d;&d;&d;\"><!ENTITY f \"&e;&e;&e;&e;&e;&e;&e;&e;\">"
              "<!ENTITY g \"&f;&f;&f;&f;&f;&f;&f;&f;\"><!ENTITY h \"&g;&g;&g;&g;&g;&g;&g;&g;\">]>"
              "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&h;</Key>"
              "<Size>1</Size></Contents></ListBucketResult>",
         "s3://b/p: "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dh__s3_list_page_t p;
        int rc = dh__s3_list_page_parse(cases[i].body, strlen(cases[i].body), "s3://b/p", &p);
        if (rc >= 0)
            fail_msg("case %zu parsed", i);
        assert_null(p.objects);
        assert_null(p.next_token);
        if (!strstr(dh_last_error(), cases[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, dh_last_error(), cases[i].want);
    }
}

static void error_documents_named(void **state)
{
    (void)state;
    const char *nsb = HEAD "<Error><Code>NoSuchBucket</Code><Message>The specified bucket does "
                           "not exist</Message><BucketName>nope</BucketName></Error>";
    assert_int_equal(dh__s3_check_response(404, nsb, strlen(nsb), "listing s3://nope/"), DH_ENOENT);
    assert_string_equal(dh_last_error(), "listing s3://nope/: HTTP 404 NoSuchBucket: The "
                                         "specified bucket does not exist");
    const char *sig = "<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature "
                      "we calculated does not match</Message></Error>";
    assert_int_equal(dh__s3_check_response(403, sig, strlen(sig), "s3://b/k"), DH_EAUTH);
    assert_string_equal(dh_last_error(), "s3://b/k: HTTP 403 SignatureDoesNotMatch: The request "
                                         "signature we calculated does not match");
    /* No body (a HEAD), or one that is not an error document: the status alone. */
    assert_int_equal(dh__s3_check_response(404, NULL, 0, "s3://b/k"), DH_ENOENT);
    assert_string_equal(dh_last_error(), "s3://b/k: HTTP 404");
    assert_int_equal(dh__s3_check_response(503, "<html>busy", 10, "s3://b/k"), DH_EIO);
    assert_string_equal(dh_last_error(), "s3://b/k: HTTP 503");
    assert_int_equal(dh__s3_check_response(206, "bytes", 5, "s3://b/k"), 0);
    /* A listing page as an error reply (found by fuzz_s3: it wrote through a NULL page). */
    assert_int_equal(dh__s3_check_response(403, PAGE1, strlen(PAGE1), "s3://b/k"), DH_EAUTH);
    assert_string_equal(dh_last_error(), "s3://b/k: HTTP 403");
}

/* A scripted transport: answers request i with replies[i] and records the URLs. */
typedef struct {
    const char *bodies[4];
    long statuses[4];
    size_t n, calls;
    char urls[4][512];
    bool signed_each;
} script_t;

static int scripted(void *ctx, const char *method, const char *url, const char *const *lines,
                    size_t n_lines, long *status, char **body, size_t *body_len)
{
    script_t *s = ctx;
    assert_string_equal(method, "GET");
    if (s->calls >= s->n)
        return dh__set_error(DH_EIO, "%s: no more scripted replies", url);
    snprintf(s->urls[s->calls], sizeof(s->urls[0]), "%s", url);
    bool auth = false;
    for (size_t i = 0; i < n_lines; i++)
        auth |= strncmp(lines[i], "Authorization: AWS4-HMAC-SHA256 ", 32) == 0;
    s->signed_each &= auth;
    *status = s->statuses[s->calls];
    *body = dh_strdup(s->bodies[s->calls]);
    s->calls++;
    if (!*body)
        return dh__set_error(DH_ENOMEM, "%s: out of memory", url);
    *body_len = strlen(*body);
    return 0;
}

static const dh__s3_config_t CFG = {.access_key_id = "AKID",
                                    .secret_access_key = "secret",
                                    .region = "us-east-1",
                                    .endpoint_url = "http://127.0.0.1:1"};

static void listing_follows_the_token(void **state)
{
    (void)state;
    script_t s = {.bodies = {PAGE1, PAGE2}, .statuses = {200, 200}, .n = 2, .signed_each = true};
    dh__s3_object_t *objects;
    size_t count;
    assert_int_equal(dh__s3_list(&CFG, "bucket", "shards/", 2, scripted, &s, &objects, &count), 0);
    assert_int_equal(s.calls, 2);
    assert_true(s.signed_each);
    assert_string_equal(s.urls[0], "http://127.0.0.1:1/bucket/"
                                   "?encoding-type=url&list-type=2&max-keys=2&prefix=shards%2F");
    assert_string_equal(s.urls[1], "http://127.0.0.1:1/bucket/?continuation-token=tok%2F1%2B%3D"
                                   "&encoding-type=url&list-type=2&max-keys=2&prefix=shards%2F");
    assert_int_equal(count, 3);
    assert_string_equal(objects[0].key, "shards/000.tar");
    assert_string_equal(objects[2].key, "shards/\xc3\xbc.tar");
    dh__s3_objects_free(objects, count);
}

static void listing_stops_on_errors(void **state)
{
    (void)state;
    const char *nsb = "<Error><Code>NoSuchBucket</Code><Message>gone</Message></Error>";
    script_t s = {.bodies = {nsb}, .statuses = {404}, .n = 1, .signed_each = true};
    dh__s3_object_t *objects;
    size_t count;
    assert_int_equal(dh__s3_list(&CFG, "nope", "p/", 0, scripted, &s, &objects, &count), DH_ENOENT);
    assert_string_equal(dh_last_error(), "listing s3://nope/p/: HTTP 404 NoSuchBucket: gone");
    assert_null(objects);
    assert_string_equal(s.urls[0],
                        "http://127.0.0.1:1/nope/?encoding-type=url&list-type=2&prefix=p%2F");
    /* A second page that is cut short: nothing of the first is returned. */
    char cut[64];
    snprintf(cut, sizeof(cut), "%.40s", PAGE2);
    script_t t = {.bodies = {PAGE1, cut}, .statuses = {200, 200}, .n = 2, .signed_each = true};
    assert_int_equal(dh__s3_list(&CFG, "bucket", "", 2, scripted, &t, &objects, &count), DH_EPARSE);
    assert_null(objects);
    assert_int_equal(count, 0);
    /* A server that repeats its token would loop forever. */
    script_t u = {.bodies = {PAGE1, PAGE1}, .statuses = {200, 200}, .n = 2, .signed_each = true};
    assert_int_equal(dh__s3_list(&CFG, "bucket", "", 2, scripted, &u, &objects, &count), DH_EIO);
    assert_non_null(strstr(dh_last_error(), "the same continuation token twice"));
    /* The transport's own failure comes through. */
    script_t v = {.n = 0, .signed_each = true};
    assert_int_equal(dh__s3_list(&CFG, "bucket", "", 2, scripted, &v, &objects, &count), DH_EIO);
    assert_non_null(strstr(dh_last_error(), "no more scripted replies"));
}

static int list_two_pages(void *ctx)
{
    (void)ctx;
    script_t s = {.bodies = {PAGE1, PAGE2}, .statuses = {200, 200}, .n = 2, .signed_each = true};
    dh__s3_object_t *objects;
    size_t count;
    int rc = dh__s3_list(&CFG, "bucket", "shards/", 2, scripted, &s, &objects, &count);
    if (rc == 0)
        dh__s3_objects_free(objects, count);
    return rc;
}

static void listing_allocation_failures(void **state)
{
    (void)state;
    assert_true(dh_test_each_allocation_failure(list_two_pages, NULL) > 20);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(page_parsed),
    cmocka_unit_test(url_encoded_keys_decoded),
    cmocka_unit_test(malformed_pages_fail_named),
    cmocka_unit_test(error_documents_named),
    cmocka_unit_test(listing_follows_the_token),
    cmocka_unit_test(listing_stops_on_errors),
    cmocka_unit_test(listing_allocation_failures),
};
DH_TEST_MAIN(tests)
