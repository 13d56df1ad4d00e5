/* remote/remote_lib.h: what the rest of the library (media's AVIO, the s3 module, the cache)
 * uses of the remote module: URLs, the HTTP range reader on libcurl, its hooks and counters
 * (dh__ prefix, not exported; docs/remote.md). No libcurl type crosses this header.
 *
 * Layers, each usable alone:
 *   url.c      parse and redact http://, https://, s3:// URLs (pure);
 *   http.c     one range GET or HEAD with retries and backoff, pooled connections, the
 *              per-scheme hooks (s3:// resolution, signing) and the counters;
 *   reader.c   an open remote file (or a byte range of one: a tar member) read through
 *              block-aligned fetches, with a modest sequential read-ahead; every fetch goes
 *              through one function, dh__http_get_range unless a cache installed its own. */
#ifndef DH_REMOTE_LIB_H
#define DH_REMOTE_LIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- URLs (url.c, pure) ------------------------------------------------------------------ */

typedef enum dh__url_scheme {
    DH_URL_NONE = 0, /* not a URL: a local path (subfile ranges included) */
    DH_URL_HTTP,
    DH_URL_HTTPS,
    DH_URL_S3,
} dh__url_scheme_t;

/* The scheme of a path, by its prefix "http://", "https://" or "s3://" (case-insensitive);
 * DH_URL_NONE for anything else. Pure. */
dh__url_scheme_t dh__url_scheme(const char *path);

/* A URL's parts. path and query point into the parsed string (borrowed: valid while it is). */
typedef struct dh__url {
    dh__url_scheme_t scheme;
    char host[256];    /* lower-cased; an IPv6 literal without its brackets; s3: the bucket */
    int port;          /* the one given, else 80 (http), 443 (https), 0 (s3) */
    bool port_given;   /* the URL named a port */
    const char *path;  /* from the '/' after the authority ("/" when absent); s3: "/KEY" */
    size_t path_len;   /* up to the query or fragment */
    const char *query; /* after '?', NULL when none; up to the fragment */
    size_t query_len;
} dh__url_t;

/* Parses an http, https or s3 URL. Refused with DH_EINVAL and a message naming the URL
 * (redacted): another scheme, an empty host, a bad port, a space or control character, and
 * credentials in the URL ("user:pass@host": they would be printed in every error; use the
 * scheme's hook instead). Pure. */
int dh__url_parse(const char *url, dh__url_t *out);

/* 0 if `url` (a scheme dh__url_scheme knows) names a host or bucket after its "://", else
 * DH_EINVAL with a message naming it. The rest is not checked: an s3:// key may hold any
 * byte (the S3 hooks encode it), and a request says what is wrong with a path. Pure. */
int dh__url_check_host(const char *url);

/* The URL as errors and logs print it: the query string (which may carry a presigned
 * signature, X-Amz-Signature, a token) replaced by "?...". Writes into buf (truncated to
 * size) and returns it. Pure. */
const char *dh__url_redact(const char *url, char *buf, size_t size);

/* ---- HTTP (http.c) ------------------------------------------------------------------------ */

/* The process-wide client's settings. Defaults from the environment: DH_CA_BUNDLE (a PEM file
 * of the CAs to trust instead of the system's), DH_HTTP_ATTEMPTS, DH_HTTP_RETRY_S,
 * DH_HTTP_STALL_S. */
typedef struct dh__http_config {
    char ca_bundle[1024];     /* "" = the system's CAs; peers are always verified */
    int attempts;             /* tries per request, 1..100 (6) */
    double backoff_s;         /* the wait before the first retry, doubled each time (0.05) */
    double backoff_max_s;     /* the longest wait (2) */
    double retry_budget_s;    /* wall time for all tries of one request (60) */
    double connect_timeout_s; /* per connection attempt (10) */
    double stall_timeout_s;   /* no byte received for this long: a timeout, retried (30) */
} dh__http_config_t;

/* Fills cfg with the defaults above, read from the environment now. */
void dh__http_config_defaults(dh__http_config_t *cfg);

/* Replaces the process-wide settings (copied). Thread-safe: requests already under way keep
 * the settings they started with. Returns 0, or DH_EINVAL naming the bad field. */
int dh__http_configure(const dh__http_config_t *cfg);

/* A request as a hook sees it (all borrowed for the call). */
typedef struct dh__http_header {
    const char *name;
    const char *value;
} dh__http_header_t;

typedef struct dh__http_request {
    const char *method;               /* "GET" (the one method sent: sizes come from a range) */
    const char *url;                  /* the http(s) URL requested, query included */
    const dh__url_t *parsed;          /* its parts */
    const dh__http_header_t *headers; /* the headers already set: "Range" for a GET */
    size_t n_headers;
    int64_t unix_time_s; /* this try's wall-clock time (signatures carry it) */
} dh__http_request_t;

/* The headers a hook adds to a request (opaque). */
typedef struct dh__http_headers dh__http_headers_t;

/* Adds "name: value" to a request's headers (in a hook). 0 or DH_ENOMEM, DH_EINVAL for a
 * name or value with a line break. Values never appear in messages or logs. */
int dh__http_add_header(dh__http_headers_t *headers, const char *name, const char *value);

/* The hooks of one scheme. resolve turns a URL of the scheme into the http(s) URL to request
 * (s3://bucket/key -> the endpoint's URL; NULL: the URL is requested as it is, http and
 * https only): 0 and *http_url (dh_malloc'd, freed by the caller), or a negative code with a
 * message. sign adds headers to each try of each request of a URL of the scheme (SigV4's
 * Authorization, x-amz-date, x-amz-content-sha256; NULL: none), called again for every
 * retry with that try's time: 0, or a negative code with a message (the request fails with
 * it). Both are called from any thread that reads: they must be thread-safe. */
typedef struct dh__remote_scheme {
    int (*resolve)(void *ctx, const char *url, char **http_url);
    int (*sign)(void *ctx, const dh__http_request_t *request, dh__http_headers_t *headers);
    void *ctx;
} dh__remote_scheme_t;

/* Installs the hooks of scheme (DH_URL_HTTP, DH_URL_HTTPS or DH_URL_S3), copied; NULL
 * removes them. Without hooks of its own, s3:// takes the S3 module's (s3_hooks.c:
 * dh__remote_s3_configure). Call before reads start (not synchronised with requests in flight). */
void dh__remote_set_scheme(dh__url_scheme_t scheme, const dh__remote_scheme_t *hooks);

/* What stops a request early: FFmpeg's AVIOInterruptCB shape (nonzero = stop). Polled while
 * a transfer waits (libcurl's progress callback, at least once a second) and during backoff. */
typedef struct dh__remote_interrupt {
    int (*callback)(void *opaque);
    void *opaque;
} dh__remote_interrupt_t;

/* Reads bytes [offset, offset + len) of url (http, https, or a scheme with hooks) with one
 * GET "Range: bytes=offset-(offset+len-1)" on a pooled connection, TLS verified. Retried
 * with exponential backoff (dh__http_config_t) on 5xx, 429, a timeout or stall, a refused
 * or reset connection, and a body cut short: a retry asks only for the bytes still missing.
 * *got: the bytes read, len unless the object ends first; *total (may be NULL): the object's
 * size from Content-Range, -1 when the server does not say (a 200 to a range request: the
 * bytes before offset are skipped, not stored). Errors, each naming the URL (redacted), the
 * HTTP status and the byte range: -ENOENT (404, 410), -EACCES (401, 403), -ERANGE (a 416
 * that does not say the object's size; one that does, for a range from its end on, is
 * success with *got 0), DH_EIO (other statuses, retries exhausted, interrupted: "...
 * interrupted"), DH_EINVAL (a bad URL). len 0 is a no-op. Thread-safe. */
int dh__http_get_range(const char *url, int64_t offset, size_t len, void *buf, size_t *got,
                       int64_t *total, const dh__remote_interrupt_t *interrupt);

/* The object's size (a HEAD; Content-Length), with the retries and errors of
 * dh__http_get_range. Thread-safe. */
int dh__http_size(const char *url, int64_t *size, const dh__remote_interrupt_t *interrupt);

/* Process-wide counters since start (relaxed atomics): what the benchmark divides by the
 * bytes the demuxers asked for (docs/remote.md, "Counters"). */
typedef struct dh__remote_stats {
    uint64_t requests;      /* HTTP requests sent (each try counts) */
    uint64_t retries;       /* tries after the first */
    uint64_t bytes_fetched; /* body bytes received (stored or skipped) */
    uint64_t errors;        /* requests that failed for good */
    uint64_t bytes_read;    /* bytes remote files handed their readers (reader.c) */
} dh__remote_stats_t;

void dh__remote_stats(dh__remote_stats_t *out);

/* ---- remote files (reader.c) --------------------------------------------------------------- */

/* Every byte of a remote file is read through this function, in block-aligned ranges:
 * offset a multiple of DH_REMOTE_BLOCK, len a multiple of it (the object's last block may
 * come short: *got < len). Its contract is dh__http_get_range's, which is the default; a
 * cache installs itself in front (dh__remote_set_fetch) and calls dh__http_get_range on a
 * miss. */
#define DH_REMOTE_BLOCK ((size_t)8 << 10)
#define DH_REMOTE_READAHEAD_MAX ((size_t)1 << 20) /* the longest fetch of sequential reads */

typedef int (*dh__remote_fetch_fn)(void *ctx, const char *url, int64_t offset, size_t len,
                                   void *buf, size_t *got, int64_t *total,
                                   const dh__remote_interrupt_t *interrupt);

/* Installs fn (with ctx) as the fetch of every remote file opened from now on; NULL restores
 * dh__http_get_range. Call before reads start. */
void dh__remote_set_fetch(dh__remote_fetch_fn fn, void *ctx);

/* An open remote object, or a byte range of one. One thread at a time. */
typedef struct dh__remote_file dh__remote_file_t;

/* Opens url for reads of its bytes [start, end) (a tar member; start 0 and end -1: the whole
 * object). Makes no request: the size comes with the first read, or from
 * dh__remote_file_size. 0, DH_EINVAL (a bad URL, a bad range), DH_ENOMEM. *out is the
 * caller's (dh__remote_file_close). */
int dh__remote_file_open(dh__remote_file_t **out, const char *url, int64_t start, int64_t end);

/* What stops this file's requests (the decode's sample_timeout); NULL callback = nothing. */
void dh__remote_file_set_interrupt(dh__remote_file_t *f, const dh__remote_interrupt_t *interrupt);

/* The readable size: end - start for a range (checked against the object's size on the
 * first read), else the object's size (a HEAD unless a read already learned it). The size
 * or a negative code (dh__http_size's). */
int64_t dh__remote_file_size(dh__remote_file_t *f);

/* Reads up to len bytes at pos (0 = the range's start) into buf: *got = len unless the range
 * ends first (0 at or past its end). Served from the file's window when it holds them,
 * else one fetch of whole blocks, longer while the reads run sequentially (doubling up to
 * DH_REMOTE_READAHEAD_MAX, never past the range's last block). Errors are the fetch's. */
int dh__remote_file_read(dh__remote_file_t *f, int64_t pos, void *buf, size_t len, size_t *got);

/* Closes and frees; safe on NULL, sets *f = NULL. */
void dh__remote_file_close(dh__remote_file_t **f);

/* Reads a whole object at url (http, https, s3) into *data (dh_malloc'd, the caller's,
 * NUL-terminated past *len): its size, then one range GET. Errors are dh__http_get_range's;
 * DH_ERANGE (naming the URL) for an object larger than max_bytes. Thread-safe. (whole.c) */
int dh__remote_read_whole(const char *url, size_t max_bytes, char **data, size_t *len);

/* ---- S3 (s3_hooks.c, over the S3 half of s3.h) --------------------------------------------- */

/* What a command says of S3 (--s3-endpoint, --s3-profile, --s3-anonymous); NULL or "" falls
 * back on the environment and the AWS files as the AWS CLI does (docs/remote.md, "S3"). */
typedef struct dh__remote_s3_settings {
    const char *endpoint_url; /* NULL: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's */
    const char *profile;      /* NULL: AWS_PROFILE, else "default" */
    bool anonymous;           /* sign nothing (public buckets), whatever keys exist */
} dh__remote_s3_settings_t;

/* Resolves the process's S3 settings and credentials now (errors now, naming the variable,
 * file or profile, never a secret) and replaces those every later s3:// request uses. Without
 * a call, they are resolved from the environment and the AWS files at the first s3:// request
 * (then an error fails that request). s3:// URLs are resolved (path style on a custom
 * endpoint, virtual-hosted on AWS) and each try signed with SigV4 (UNSIGNED-PAYLOAD; nothing
 * for anonymous access) unless other hooks were set with dh__remote_set_scheme. Thread-safe.
 * 0, or dh__s3_config_load's codes. */
int dh__remote_s3_configure(const dh__remote_s3_settings_t *settings);

/* Forgets the settings resolved so far: the next s3:// request resolves them again from the
 * environment and the AWS files (the Python binding, when a DataLoader is made). Thread-safe. */
void dh__remote_s3_forget(void);

/* An object of a listing: its s3:// URL (the caller's) and size. */
typedef struct dh__remote_object {
    char *url;
    uint64_t size_B;
} dh__remote_object_t;

/* Lists every object under an s3://bucket/prefix URL (ListObjectsV2, page after page, signed
 * with the process's settings), in S3's order (by key). *objects is the caller's
 * (dh__remote_objects_free). Errors name the listing, the HTTP status and S3's code
 * ("listing s3://b/p: HTTP 404 NoSuchBucket: ..."): DH_ENOENT, DH_EAUTH, DH_EIO, DH_EPARSE,
 * DH_EINVAL (not an s3:// URL), DH_ENOMEM. */
int dh__remote_s3_list(const char *url, dh__remote_object_t **objects, size_t *count);
void dh__remote_objects_free(dh__remote_object_t *objects, size_t count);

/* Expands WebDataset's (and bash's) braces: `{000..099}` (numeric range, zero padding kept
 * from the wider bound, descending allowed, `{0..10..2}` a step), `{a,b,c}` (alternatives,
 * which may hold braces), several braces (their product, leftmost varying slowest). Returns
 * the count of strings in *out (the caller frees them with dh__brace_free), or DH_EPARSE for
 * a malformed pattern naming its position (an unclosed '{', a stray '}', a brace with
 * neither ',' nor '..', a bound that is not a number), DH_ERANGE past `max_count` strings,
 * DH_ENOMEM. A pattern without braces gives itself. (s3_braces.c) */
long dh__brace_expand(const char *pattern, size_t max_count, char ***out);
void dh__brace_free(char **strings, size_t count);

/* ---- the cache in use (cache_fetch.c) and read-ahead (readahead.c) ------------------------ */

/* The cache's blocks by default: a fetch that covers a missing 64 KiB block whole fetches and
 * stores it whole; one that needs part of it fetches and stores the 8 KiB fragments it needs
 * (docs/remote.md, "The cache in use": the bytes-fetched trade; DH_CACHE_FRAGMENTS=0: whole
 * blocks only). DH_CACHE_BLOCK (bytes, a multiple of 8 KiB up to 1 MiB) sets another size at
 * dh__remote_cache_use. */
#define DH_REMOTE_CACHE_BLOCK ((size_t)64 << 10)
/* Read-ahead of a whole object (a clip at a URL, size unknown): its first bytes, until the
 * source's last reads teach less (dh__remote_readahead_learn). */
#define DH_READAHEAD_HEAD ((size_t)1 << 20)
/* Read-ahead of a byte range (a tar member): at most its first bytes. */
#define DH_READAHEAD_RANGE_MAX ((size_t)8 << 20)

/* Opens the cache directory dir bounded to bytes_max (dh__cache_open with blocks of
 * DH_REMOTE_CACHE_BLOCK, or DH_CACHE_BLOCK's; DH_EINVAL naming it when malformed) and reads every
 * remote file opened from now on through it (installs its fetch with dh__remote_set_fetch).
 * Process-wide and reference counted: a second use of the same dir shares it; another dir is
 * refused (DH_EINVAL naming both: one cache per process). 0 or the open's error. Each successful
 * use is paired with a release. */
int dh__remote_cache_use(const char *dir, uint64_t bytes_max);
/* Drops a use; the last stops read-ahead, restores the plain fetch and closes the cache
 * (waiting for fetches under way). */
void dh__remote_cache_release(void);
/* Whether a cache is in use. */
bool dh__remote_cache_active(void);
/* The block size of the cache in use (DH_REMOTE_CACHE_BLOCK when none). */
size_t dh__remote_cache_block(void);

/* A fetch through the cache in use (the installed fetch; dh__http_get_range's contract for
 * any offset and length; the plain range GET when none is in use). Thread-safe. */
int dh__remote_cache_fetch(const char *url, int64_t offset, size_t len, void *buf, size_t *got,
                           int64_t *total, const dh__remote_interrupt_t *interrupt);

typedef struct dh__remote_cache_stats {
    uint64_t fetches;       /* calls of the cache's fetch (reader fetches and read-ahead's) */
    uint64_t hits, misses;  /* cache blocks found / not found by them */
    uint64_t bytes_network; /* bytes their range GETs received */
    uint64_t put_errors;    /* blocks that could not be stored (no room, I/O): fetched only */
    uint64_t waited_hits;   /* blocks found after waiting for another thread's fetch of them */
    uint64_t requests;      /* range GETs the cache made (tries not counted: http's) */
    uint64_t puts;          /* entries stored (whole blocks and fragments; files made) */
    uint64_t fragment_puts; /* of which 8 KiB fragments of partly needed blocks */
    uint64_t bytes_held, bytes_max, evictions; /* the directory's, and this process's */
    /* read-ahead: ranges queued, fetched, cancelled (by their task, or a stop), dropped
     * (over the byte bound), failed (their fetch's error; the decode meets it again), and
     * the bytes they covered */
    uint64_t ra_queued, ra_done, ra_cancelled, ra_dropped, ra_failed, ra_bytes;
} dh__remote_cache_stats_t;

/* Process-wide counters since start (zero when no cache was ever used). */
void dh__remote_cache_stats(dh__remote_cache_stats_t *out);

/* Queues bytes [start, end) of url (end -1: the object's first DH_READAHEAD_HEAD bytes;
 * longer ranges are cut to DH_READAHEAD_RANGE_MAX) to be fetched into the cache in the
 * background, tagged with tag. No-op without a cache, with DH_READAHEAD_BYTES=0, or when
 * the queue's bytes would pass DH_READAHEAD_BYTES (64 MiB; counted as dropped). Threads:
 * DH_READAHEAD_THREADS (2), started at the first range. 0 or DH_ENOMEM. Thread-safe. */
int dh__remote_readahead(const char *url, int64_t start, int64_t end, uint64_t tag);
/* Notes that a reader of url (a byte range of it when member, else the whole object) read
 * its first `prefix` bytes contiguously: the read-ahead of the source's next ranges fetches
 * as far as the largest of the last 8 (docs/remote.md, "Read-ahead"). Thread-safe. */
void dh__remote_readahead_learn(const char *url, bool member, uint64_t prefix);
/* Forgets what was learned (tests: a source read for the first time). */
void dh__remote_readahead_forget(void);
/* Drops the queued ranges tagged tag and stops its running ones at their next request. */
void dh__remote_readahead_cancel(uint64_t tag);
/* Waits until no range is queued or running (tests). */
void dh__remote_readahead_wait_idle(void);
/* Cancels everything and joins the threads (the cache's last release calls it). */
void dh__remote_readahead_stop(void);

#endif
