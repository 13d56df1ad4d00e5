/* test_s3_sign.c: SigV4 against AWS's published vectors. The suite cases are those of AWS's
 * Signature Version 4 test suite (aws-sig-v4-test-suite, as kept in awslabs/aws-c-auth's
 * tests/aws-signing-test-suite/v4/<case>/: request.txt, header-canonical-request.txt,
 * header-string-to-sign.txt, header-signature.txt); the S3 cases are the worked examples of
 * the S3 API reference, "Signature Calculations for the Authorization Header" (GET Object with
 * a Range, PUT Object, GET Bucket Lifecycle, Get Bucket (List Objects)). No expected value
 * here was computed by this code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "dh_test.h"
#include "remote/s3.h"

#define SUITE_KEY "AKIDEXAMPLE"
#define SUITE_SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define S3_KEY "AKIAIOSFODNN7EXAMPLE"
#define S3_SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

static time_t utc(int y, int mo, int d, int h, int mi, int s)
{
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = s};
    return timegm(&tm);
}

/* A suite request: host example.amazonaws.com, us-east-1, service "service", the empty
 * payload's hash, no x-amz-content-sha256 header (the suite signs none). */
static dh__s3_sign_input_t suite(const char *method, const char *path)
{
    return (dh__s3_sign_input_t){.method = method,
                                 .host = "example.amazonaws.com",
                                 .path = path,
                                 .payload_sha256 = DH__S3_EMPTY_SHA256,
                                 .access_key_id = SUITE_KEY,
                                 .secret_access_key = SUITE_SECRET,
                                 .region = "us-east-1",
                                 .service = "service",
                                 .time_s = utc(2015, 8, 30, 12, 36, 0)};
}

static dh__s3_sign_input_t s3_doc(const char *method, const char *path)
{
    return (dh__s3_sign_input_t){.method = method,
                                 .host = "examplebucket.s3.amazonaws.com",
                                 .path = path,
                                 .payload_sha256 = DH__S3_EMPTY_SHA256,
                                 .content_sha256_header = true,
                                 .access_key_id = S3_KEY,
                                 .secret_access_key = S3_SECRET,
                                 .region = "us-east-1",
                                 .service = "s3",
                                 .time_s = utc(2013, 5, 24, 0, 0, 0)};
}

/* Signs and checks the signature and SignedHeaders; returns the result for more checks. */
static dh__s3_signed_t check(const dh__s3_sign_input_t *in, const char *signed_headers,
                             const char *signature)
{
    dh__s3_signed_t s;
    int rc = dh__s3_sign(in, &s);
    if (rc != 0)
        fail_msg("sign: %s", dh_last_error());
    assert_string_equal(s.signature, signature);
    char want[512];
    snprintf(want, sizeof(want),
             "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", in->access_key_id,
             strcmp(in->service, "s3") == 0 ? "20130524/us-east-1/s3/aws4_request"
                                            : "20150830/us-east-1/service/aws4_request",
             signed_headers, signature);
    assert_string_equal(s.authorization, want);
    return s;
}

static void get_vanilla(void **state)
{
    (void)state;
    dh__s3_sign_input_t in = suite("GET", "/");
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
    assert_string_equal(s.canonical_request,
                        "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
                        "host;x-amz-date\n" DH__S3_EMPTY_SHA256);
    assert_string_equal(s.string_to_sign,
                        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/"
                        "aws4_request\n"
                        "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
    assert_string_equal(s.query, "");
    assert_string_equal(s.encoded_path, "/");
    dh__s3_signed_clear(&s);
}

static void post_vanilla(void **state)
{
    (void)state;
    dh__s3_sign_input_t in = suite("POST", "/");
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
    assert_string_equal(s.string_to_sign,
                        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/"
                        "aws4_request\n"
                        "553f88c9e4d10fc9e109e2aeb65f030801b70c2f6468faca261d401ae622fc87");
    dh__s3_signed_clear(&s);
}

static void post_vanilla_query(void **state)
{
    (void)state;
    dh__s3_pair_t q[] = {{"Param1", "value1"}};
    dh__s3_sign_input_t in = suite("POST", "/");
    in.params = q;
    in.n_params = 1;
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11");
    dh__s3_signed_clear(&s);
}

static void get_unreserved(void **state)
{
    (void)state;
    const char *path = "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    dh__s3_sign_input_t in = suite("GET", path);
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f");
    assert_string_equal(s.encoded_path, path);
    dh__s3_signed_clear(&s);
}

static void get_utf8(void **state)
{
    (void)state;
    dh__s3_sign_input_t in = suite("GET", "/\xe1\x88\xb4");
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85");
    assert_string_equal(s.encoded_path, "/%E1%88%B4");
    assert_string_equal(s.string_to_sign,
                        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/"
                        "aws4_request\n"
                        "2a0a97d02205e45ce2e994789806b19270cfbbb0921b278ccf58f5249ac42102");
    dh__s3_signed_clear(&s);
}

static void get_vanilla_empty_query_key(void **state)
{
    (void)state;
    dh__s3_pair_t q[] = {{"Param1", "value1"}};
    dh__s3_sign_input_t in = suite("GET", "/");
    in.params = q;
    in.n_params = 1;
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb");
    assert_string_equal(s.query, "Param1=value1");
    dh__s3_signed_clear(&s);
}

static void get_vanilla_query_order_key_case(void **state)
{
    (void)state;
    dh__s3_pair_t q[] = {{"Param2", "value2"}, {"Param1", "value1"}};
    dh__s3_sign_input_t in = suite("GET", "/");
    in.params = q;
    in.n_params = 2;
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
    assert_string_equal(s.query, "Param1=value1&Param2=value2");
    dh__s3_signed_clear(&s);
}

static void get_vanilla_query_order_encoded(void **state)
{
    (void)state;
    dh__s3_pair_t q[] = {{"Param-3", "Value3"}, {"Param", "Value2"}, {"\xe1\x88\xb4", "Value1"}};
    dh__s3_sign_input_t in = suite("GET", "/");
    in.params = q;
    in.n_params = 3;
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac");
    assert_string_equal(s.query, "%E1%88%B4=Value1&Param=Value2&Param-3=Value3");
    dh__s3_signed_clear(&s);
}

static void get_vanilla_utf8_query(void **state)
{
    (void)state;
    dh__s3_pair_t q[] = {{"\xe1\x88\xb4", "bar"}};
    dh__s3_sign_input_t in = suite("GET", "/");
    in.params = q;
    in.n_params = 1;
    dh__s3_signed_t s = check(&in, "host;x-amz-date",
                              "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04");
    dh__s3_signed_clear(&s);
}

static void get_header_value_trim(void **state)
{
    (void)state;
    dh__s3_pair_t h[] = {{"My-Header1", " value1"}, {"My-Header2", "\"a   b   c\""}};
    dh__s3_sign_input_t in = suite("GET", "/");
    in.headers = h;
    in.n_headers = 2;
    dh__s3_signed_t s = check(&in, "host;my-header1;my-header2;x-amz-date",
                              "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736");
    dh__s3_signed_clear(&s);
}

static void get_header_key_duplicate(void **state)
{
    (void)state;
    dh__s3_pair_t h[] = {
        {"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}};
    dh__s3_sign_input_t in = suite("GET", "/");
    in.headers = h;
    in.n_headers = 3;
    dh__s3_signed_t s = check(&in, "host;my-header1;x-amz-date",
                              "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea");
    dh__s3_signed_clear(&s);
}

static void get_vanilla_with_session_token(void **state)
{
    (void)state;
    const char *token = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";
    dh__s3_sign_input_t in = suite("GET", "/");
    in.session_token = token;
    dh__s3_signed_t s = check(&in, "host;x-amz-date;x-amz-security-token",
                              "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8");
    bool sent = false;
    for (size_t i = 0; i < s.n_header_lines; i++)
        sent |= strcmp(s.header_lines[i],
                       "x-amz-security-token: "
                       "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267") == 0;
    assert_true(sent);
    dh__s3_signed_clear(&s);
}

/* The S3 reference's GET Object example: the first 10 bytes of test.txt. */
static void s3_get_object_range(void **state)
{
    (void)state;
    dh__s3_pair_t h[] = {{"Range", "bytes=0-9"}};
    dh__s3_sign_input_t in = s3_doc("GET", "/test.txt");
    in.headers = h;
    in.n_headers = 1;
    dh__s3_signed_t s = check(&in, "host;range;x-amz-content-sha256;x-amz-date",
                              "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
    assert_string_equal(s.canonical_request,
                        "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
                        "x-amz-content-sha256:" DH__S3_EMPTY_SHA256 "\n"
                        "x-amz-date:20130524T000000Z\n\n"
                        "host;range;x-amz-content-sha256;x-amz-date\n" DH__S3_EMPTY_SHA256);
    assert_string_equal(s.string_to_sign,
                        "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
    /* What is sent: Range as given, x-amz-date, x-amz-content-sha256, Authorization; no Host. */
    assert_int_equal(s.n_header_lines, 4);
    assert_string_equal(s.header_lines[0], "Range: bytes=0-9");
    assert_string_equal(s.header_lines[1], "x-amz-date: 20130524T000000Z");
    assert_string_equal(s.header_lines[2], "x-amz-content-sha256: " DH__S3_EMPTY_SHA256);
    assert_true(strncmp(s.header_lines[3], "Authorization: AWS4-HMAC-SHA256 ", 32) == 0);
    dh__s3_signed_clear(&s);
}

/* The S3 reference's PUT Object example: a key with '$', a body, two more headers. */
static void s3_put_object(void **state)
{
    (void)state;
    char body_hash[65];
    assert_int_equal(dh__s3_sha256_hex("Welcome to Amazon S3.", 21, body_hash), 0);
    assert_string_equal(body_hash,
                        "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
    dh__s3_pair_t h[] = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                         {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
    dh__s3_sign_input_t in = s3_doc("PUT", "/test$file.text");
    in.headers = h;
    in.n_headers = 2;
    in.payload_sha256 = body_hash;
    dh__s3_signed_t s = check(&in, "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
                              "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
    assert_string_equal(s.encoded_path, "/test%24file.text");
    assert_string_equal(s.string_to_sign,
                        "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                        "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
    dh__s3_signed_clear(&s);
}

/* GET Bucket Lifecycle: a parameter with no value signs as "lifecycle=". */
static void s3_get_lifecycle(void **state)
{
    (void)state;
    dh__s3_pair_t q[] = {{"lifecycle", ""}};
    dh__s3_sign_input_t in = s3_doc("GET", "/");
    in.params = q;
    in.n_params = 1;
    dh__s3_signed_t s = check(&in, "host;x-amz-content-sha256;x-amz-date",
                              "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
    assert_string_equal(s.query, "lifecycle=");
    dh__s3_signed_clear(&s);
}

/* Get Bucket (List Objects): parameters sorted (max-keys before prefix). */
static void s3_list_objects(void **state)
{
    (void)state;
    dh__s3_pair_t q[] = {{"prefix", "J"}, {"max-keys", "2"}};
    dh__s3_sign_input_t in = s3_doc("GET", "/");
    in.params = q;
    in.n_params = 2;
    dh__s3_signed_t s = check(&in, "host;x-amz-content-sha256;x-amz-date",
                              "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
    assert_string_equal(s.query, "max-keys=2&prefix=J");
    dh__s3_signed_clear(&s);
}

/* S3's rules: a key is encoded once, '/' kept in paths and encoded in parameters, '%' of a
 * key is a character (never taken as an escape), '+' and ' ' encoded. */
static void uri_encoding_rules(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        bool keep_slash;
        const char *out;
    } cases[] = {
        {"/dir/a b+c.tar", true, "/dir/a%20b%2Bc.tar"},
        {"/a%20b", true, "/a%2520b"},
        {"a/b", false, "a%2Fb"},
        {"-._~AZaz09", false, "-._~AZaz09"},
        {"*()!'=&", false, "%2A%28%29%21%27%3D%26"},
        {"\xe1\x88\xb4", true, "%E1%88%B4"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *e = dh__s3_uri_encode(cases[i].in, strlen(cases[i].in), cases[i].keep_slash);
        assert_non_null(e);
        assert_string_equal(e, cases[i].out);
        dh_free(e);
    }
}

/* A header that cannot be sent is refused, naming it. */
static void header_refused(void **state)
{
    (void)state;
    dh__s3_pair_t h[] = {{"X-Evil", "a\r\nInjected: yes"}};
    dh__s3_sign_input_t in = suite("GET", "/");
    in.headers = h;
    in.n_headers = 1;
    dh__s3_signed_t s;
    assert_int_equal(dh__s3_sign(&in, &s), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "X-Evil"));
}

/* No secret in any message or output but the signature itself. */
static void secret_not_in_output(void **state)
{
    (void)state;
    dh__s3_sign_input_t in = s3_doc("GET", "/test.txt");
    dh__s3_signed_t s;
    assert_int_equal(dh__s3_sign(&in, &s), 0);
    assert_null(strstr(s.canonical_request, "bPxRfiCY"));
    assert_null(strstr(s.string_to_sign, "bPxRfiCY"));
    for (size_t i = 0; i < s.n_header_lines; i++)
        assert_null(strstr(s.header_lines[i], "bPxRfiCY"));
    dh__s3_signed_clear(&s);
}

static int sign_once(void *ctx)
{
    (void)ctx;
    dh__s3_pair_t h[] = {{"Range", "bytes=0-9"}};
    dh__s3_pair_t q[] = {{"prefix", "J"}, {"max-keys", "2"}};
    dh__s3_sign_input_t in = s3_doc("GET", "/test.txt");
    in.headers = h;
    in.n_headers = 1;
    in.params = q;
    in.n_params = 2;
    in.session_token = "token";
    dh__s3_signed_t s;
    int rc = dh__s3_sign(&in, &s);
    dh__s3_signed_clear(&s);
    return rc;
}

static void sign_allocation_failures(void **state)
{
    (void)state;
    assert_true(dh_test_each_allocation_failure(sign_once, NULL) > 10);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(get_vanilla),
    cmocka_unit_test(post_vanilla),
    cmocka_unit_test(post_vanilla_query),
    cmocka_unit_test(get_unreserved),
    cmocka_unit_test(get_utf8),
    cmocka_unit_test(get_vanilla_empty_query_key),
    cmocka_unit_test(get_vanilla_query_order_key_case),
    cmocka_unit_test(get_vanilla_query_order_encoded),
    cmocka_unit_test(get_vanilla_utf8_query),
    cmocka_unit_test(get_header_value_trim),
    cmocka_unit_test(get_header_key_duplicate),
    cmocka_unit_test(get_vanilla_with_session_token),
    cmocka_unit_test(s3_get_object_range),
    cmocka_unit_test(s3_put_object),
    cmocka_unit_test(s3_get_lifecycle),
    cmocka_unit_test(s3_list_objects),
    cmocka_unit_test(uri_encoding_rules),
    cmocka_unit_test(header_refused),
    cmocka_unit_test(secret_not_in_output),
    cmocka_unit_test(sign_allocation_failures),
};
DH_TEST_MAIN(tests)
