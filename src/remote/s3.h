/* remote/s3.h: the S3 half of the remote room (docs/remote.md, "S3"), internal to src/remote/
 * and its tests: SigV4 request signing (s3_sign.c), credentials and settings as AWS tools take
 * them (s3_config.c, s3_ini.c), s3:// addressing (s3_url.c), ListObjectsV2 and S3 error
 * documents (s3_list.c), and WebDataset's brace patterns (s3_braces.c).
 *
 * Nothing here does I/O on the network: a request is built (URL and header lines, signed) and
 * handed to a transport, the `dh__s3_fetch_fn` callback, which the HTTP client of the room
 * implements. Every function is pure over its arguments except dh__s3_config_load (the
 * environment and the AWS files) and dh__s3_list (the callback). No object is shared between
 * threads; all are safe to use from any one thread at a time.
 *
 * Secrets: a secret access key or session token is never written to an error message, a log
 * line or a returned string other than the header lines a request must carry
 * (x-amz-security-token); errors name the file and line, the variable or the profile. */
#ifndef DH_REMOTE_S3_H
#define DH_REMOTE_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "remote/remote_lib.h"

/* SHA-256 of the empty payload, and the payload hash S3 accepts without hashing (GETs). */
#define DH__S3_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define DH__S3_UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"

/* A header or query parameter as the caller means it: raw (not URI-encoded) text. */
typedef struct dh__s3_pair {
    const char *name;
    const char *value; /* "" for a parameter with no value (`?lifecycle`) */
} dh__s3_pair_t;

/* ---- SigV4 (s3_sign.c) ------------------------------------------------------------------ */

/* What is signed. `path` is the decoded path ("/bucket/a b.tar"): the signer URI-encodes it
 * once, by S3's rules (every byte but A-Z a-z 0-9 - . _ ~ and '/' as %XX; never
 * double-encoded, never normalized), and the URL that is sent must carry that same encoding
 * (dh__s3_uri_encode; dh__s3_request_build does both). `params` are decoded too; they are
 * encoded ('/' included) and sorted by name then value. `headers` are extra headers to sign
 * and send (Range); their names are compared without case, values trimmed and inner runs of
 * spaces collapsed. The Host header is signed from `host` ("bucket.s3.us-east-1.amazonaws.com",
 * "127.0.0.1:9000": with the port when it is not the scheme's default) and never sent by us:
 * the transport sends it from the URL. */
typedef struct dh__s3_sign_input {
    const char *method; /* "GET" */
    const char *host;
    const char *path;
    const dh__s3_pair_t *params;
    size_t n_params;
    const dh__s3_pair_t *headers;
    size_t n_headers;
    const char *payload_sha256; /* lower-case hex, or DH__S3_UNSIGNED_PAYLOAD */
    bool content_sha256_header; /* sign and send x-amz-content-sha256 (S3 requires it; the
                                   generic SigV4 test suite has none) */
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token; /* NULL: none; else signed and sent as x-amz-security-token */
    const char *region;        /* "us-east-1" */
    const char *service;       /* "s3" */
    time_t time_s;             /* the signing time, UTC seconds since the epoch */
} dh__s3_sign_input_t;

/* What signing gives back. All strings are the caller's (dh__s3_signed_clear frees them). */
typedef struct dh__s3_signed {
    char *canonical_request;
    char *string_to_sign;
    char *signature;     /* 64 lower-case hex digits */
    char *authorization; /* the Authorization header's value */
    char *query;         /* the canonical query string, also the URL's query ("" if none) */
    char *encoded_path;  /* the canonical URI, also the URL's path */
    /* The header lines to send, "Name: value": the input's headers, x-amz-date,
     * x-amz-content-sha256 (when asked for), x-amz-security-token (when a token is given)
     * and Authorization. Host is not among them. */
    char **header_lines;
    size_t n_header_lines;
} dh__s3_signed_t;

/* Signs `in` (AWS4-HMAC-SHA256). Returns 0, DH_ENOMEM, or DH_EINVAL for a header name or
 * value that cannot be sent (a control character, an empty name). */
int dh__s3_sign(const dh__s3_sign_input_t *in, dh__s3_signed_t *out);
void dh__s3_signed_clear(dh__s3_signed_t *s);

/* URI-encodes `len` bytes of `s` by SigV4's rules ('/' kept when keep_slash). Returns a new
 * string (the caller's), or NULL when out of memory (error recorded). */
char *dh__s3_uri_encode(const char *s, size_t len, bool keep_slash);
/* The value of one hex digit (either case), -1 if `c` is none: for undoing %XX. */
int dh__s3_hex_digit(char c);

/* Lower-case hex SHA-256 of `len` bytes into hex[65]. Returns 0 or DH_ENOMEM. */
int dh__s3_sha256_hex(const void *data, size_t len, char hex[65]);

/* ---- Settings and credentials (s3_config.c over s3_ini.c) ---------------------------------- */

typedef enum {
    DH__S3_STYLE_AUTO = 0, /* virtual-hosted on AWS (path style for a bucket name that is not
                              a DNS label), path style on a custom endpoint */
    DH__S3_STYLE_PATH,     /* ENDPOINT/bucket/key */
    DH__S3_STYLE_VIRTUAL,  /* bucket.ENDPOINT/key */
} dh__s3_style_t;

/* What the command line may say; each NULL or zero field falls back on the environment and
 * the AWS files as the AWS CLI does (docs/remote.md, "Credentials"). */
typedef struct dh__s3_options {
    const char *profile;      /* --s3-profile; NULL: AWS_PROFILE, else "default" */
    const char *endpoint_url; /* --s3-endpoint; NULL: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL,
                                 the profile's endpoint_url (or its `s3 =` endpoint_url) */
    const char *region;       /* NULL: AWS_REGION, AWS_DEFAULT_REGION, the profile's region,
                                 else us-east-1 */
    dh__s3_style_t style;     /* AUTO: the profile's `s3 = addressing_style`, else AUTO */
    bool anonymous;           /* sign nothing (public buckets), whatever credentials exist */
} dh__s3_options_t;

/* Settings resolved for requests. Strings are owned by the struct (dh__s3_config_clear). */
typedef struct dh__s3_config {
    char *access_key_id; /* NULL: anonymous, requests are not signed */
    char *secret_access_key;
    char *session_token; /* NULL: none */
    char *region;        /* never NULL */
    char *endpoint_url;  /* "scheme://host[:port]" without a trailing '/', or NULL: AWS */
    dh__s3_style_t style;
    char *source; /* where the keys came from, for messages: "environment (AWS_ACCESS_KEY_ID)",
                     "profile 'dev' in /home/u/.aws/credentials", "anonymous" */
} dh__s3_config_t;

/* Resolves settings and credentials: the options, then AWS_ACCESS_KEY_ID /
 * AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (unless a profile was named in the options), then
 * the profile (AWS_PROFILE or "default") of AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials)
 * and of AWS_CONFIG_FILE (~/.aws/config, section `[profile NAME]`, `[default]`). No keys
 * anywhere and no profile asked for: anonymous. Errors (each naming the variable, the file
 * and line, or the profile, never a secret): DH_EPARSE (a malformed line of a file),
 * DH_ENOENT (a named profile that no file has), DH_ESCHEMA (a key without its secret),
 * DH_EINVAL (an endpoint URL that is not http(s)://host[:port]), DH_ENOMEM. */
int dh__s3_config_load(dh__s3_config_t *out, const dh__s3_options_t *opts);
void dh__s3_config_clear(dh__s3_config_t *c);

/* The AWS INI format (s3_ini.c): `[section]`, `key = value`, full-line comments (# or ;),
 * and a key with an empty value followed by indented `sub = value` lines (a nested section,
 * `s3 =\n  endpoint_url = ...`), whose keys read as "key.sub" ("s3.endpoint_url"). Section
 * and key names are kept as written, keys compared without case. */
typedef struct dh__ini_entry {
    char *section;
    char *key;
    char *value;
    size_t line;
} dh__ini_entry_t;

typedef struct dh__ini {
    dh__ini_entry_t *entries;
    size_t count, cap;
} dh__ini_t;

/* Parses `len` bytes of text; `path` names the source in errors ("PATH:LINE: ..."; a line's
 * text is never quoted, it may hold a secret). Returns 0, DH_EPARSE or DH_ENOMEM. */
int dh__ini_parse(const char *text, size_t len, const char *path, dh__ini_t *out);
/* Reads and parses a file: 0, DH_ENOENT when it does not exist (no message: the AWS files
 * are optional), DH_EIO, DH_EPARSE, DH_ENOMEM. */
int dh__ini_load(const char *path, dh__ini_t *out);
/* The value of `key` in `section`, the last one written wins (as in botocore); NULL if none.
 * `line`, when not NULL, gets its line. Borrowed from `ini`. */
const char *dh__ini_get(const dh__ini_t *ini, const char *section, const char *key, size_t *line);
/* Whether `section` has a header in the file. */
bool dh__ini_has_section(const dh__ini_t *ini, const char *section);
void dh__ini_clear(dh__ini_t *ini);

/* ---- Addressing (s3_url.c) ---------------------------------------------------------------- */

/* Splits "s3://bucket/key" (key may be empty: "s3://bucket/", "s3://bucket"). The bucket must
 * be 3-63 characters of a-z 0-9 . - (and '_' , which some S3-compatible servers allow).
 * Returns 0, DH_EINVAL naming the URL, DH_ENOMEM; *bucket and *key are the caller's. */
int dh__s3_url_split(const char *url, char **bucket, char **key);

/* Where a request for `key` of `bucket` goes under `cfg`: host (for the signature), the
 * decoded path, and the base URL (scheme://host) it is sent to. */
typedef struct dh__s3_target {
    char *base; /* "https://bucket.s3.us-east-1.amazonaws.com", "http://127.0.0.1:9000" */
    char *host; /* "bucket.s3.us-east-1.amazonaws.com", "127.0.0.1:9000" */
    char *path; /* decoded: "/key" (virtual) or "/bucket/key" (path style) */
} dh__s3_target_t;

int dh__s3_target_make(const dh__s3_config_t *cfg, const char *bucket, const char *key,
                       dh__s3_target_t *out);
void dh__s3_target_clear(dh__s3_target_t *t);

/* A request ready for a transport: the full URL and the header lines to send. */
typedef struct dh__s3_request {
    char *url;
    char **header_lines; /* "Name: value" */
    size_t n_header_lines;
} dh__s3_request_t;

/* Builds a request for `key` of `bucket` (key "" for the bucket itself): addressing by
 * dh__s3_target_make, signing by dh__s3_sign with UNSIGNED-PAYLOAD (GET, HEAD) or the
 * empty payload's hash (other methods: no body is sent by this path) at `time_s`, or no
 * signature for an anonymous config. `params` and `headers` as in dh__s3_sign_input_t.
 * Returns 0, DH_EINVAL, DH_ENOMEM. */
int dh__s3_request_build(const dh__s3_config_t *cfg, const char *method, const char *bucket,
                         const char *key, const dh__s3_pair_t *params, size_t n_params,
                         const dh__s3_pair_t *headers, size_t n_headers, time_t time_s,
                         dh__s3_request_t *out);
void dh__s3_request_clear(dh__s3_request_t *r);

/* ---- Responses and listing (s3_list.c) ----------------------------------------------------- */

/* The transport: performs `method` on `url` with the header lines, and returns the HTTP
 * status and the body (allocated with dh_malloc, the caller's, NUL-terminated past
 * *body_len). Returns 0 when a response came back (whatever its status), or a negative code
 * with a message naming the URL (connection refused, timeout). */
typedef int (*dh__s3_fetch_fn)(void *ctx, const char *method, const char *url,
                               const char *const *header_lines, size_t n_header_lines, long *status,
                               char **body, size_t *body_len);

/* Turns a response that is not 2xx into an error: the S3 error document's Code and Message
 * (`<Error><Code>NoSuchKey</Code><Message>...</Message></Error>`) when the body has one,
 * else the status alone, with `what` ("s3://bucket/key", "listing s3://bucket/prefix") and
 * the status: "s3://b/k: HTTP 404 NoSuchKey: The specified key does not exist.". Returns
 * DH_ENOENT (404, NoSuchKey, NoSuchBucket), DH_EAUTH (401, 403), DH_EIO (other statuses),
 * or 0 for a 2xx status (nothing recorded). */
int dh__s3_check_response(long status, const char *body, size_t body_len, const char *what);

typedef struct dh__s3_object {
    char *key;
    uint64_t size_B;
} dh__s3_object_t;

/* One page of a ListObjectsV2 reply. */
typedef struct dh__s3_list_page {
    dh__s3_object_t *objects;
    size_t count, cap;
    bool truncated;   /* IsTruncated */
    char *next_token; /* NextContinuationToken, NULL when none */
} dh__s3_list_page_t;

/* Parses a 200 reply's body (expat). `what` names the listing in errors. A document that is
 * not XML, is cut short, is not a ListBucketResult, has a Contents without a Key or a Size
 * that is not a number, or says IsTruncated without a NextContinuationToken: DH_EPARSE with
 * expat's line and column where it has them. An <Error> document: as
 * dh__s3_check_response for status 200 would not see it, DH_EIO with its code. Keys of a
 * page that says <EncodingType>url</EncodingType> are decoded ('+' a space, %XX a byte); a
 * malformed %XX is DH_EPARSE. */
int dh__s3_list_page_parse(const char *body, size_t len, const char *what, dh__s3_list_page_t *out);
void dh__s3_list_page_clear(dh__s3_list_page_t *page);

/* The ListObjectsV2 request of one page (`?list-type=2&prefix=...&encoding-type=url
 * &max-keys=N&continuation-token=...`, max_keys 0: the server's default of 1000, token NULL: the
 * first page), signed at time_s. Returns as dh__s3_request_build. */
int dh__s3_list_request(const dh__s3_config_t *cfg, const char *bucket, const char *prefix,
                        size_t max_keys, const char *token, time_t time_s, dh__s3_request_t *out);

/* Lists every object of `bucket` under `prefix`, page after page through `fetch` (each
 * request signed at the time it is sent), into *objects (count *count; the caller frees them
 * with dh__s3_objects_free). Stops with an error on a non-2xx reply
 * (dh__s3_check_response), a malformed page, or a continuation token that repeats. */
int dh__s3_list(const dh__s3_config_t *cfg, const char *bucket, const char *prefix, size_t max_keys,
                dh__s3_fetch_fn fetch, void *fetch_ctx, dh__s3_object_t **objects, size_t *count);
void dh__s3_objects_free(dh__s3_object_t *objects, size_t count);

/* ---- Brace patterns (s3_braces.c): dh__brace_expand, declared in remote_lib.h ---------- */

/* ---- Joined to the HTTP client (s3_hooks.c) ------------------------------------------------ */

/* The hooks http.c uses for s3:// when none were set with dh__remote_set_scheme: resolution
 * and SigV4 signing with the process's settings (dh__remote_s3_configure, else the
 * environment's, loaded at the first use). */
const dh__remote_scheme_t *dh__s3_default_hooks(void);

#endif
