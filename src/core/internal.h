/* core/internal.h: cross-file internals of the core module (dh__ prefix). */
#ifndef DH_CORE_INTERNAL_H
#define DH_CORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Records a formatted message as this thread's last error and returns err, so callers can
 * write `return dh__set_error(DH_EPARSE, "%s:%zu: ...", path, line);`. */
int dh__set_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- jansson allocation (json_alloc.c) ----
 * jansson's allocations go through dh_malloc/dh_free (so the allocation-failure tests reach
 * into it), with a per-thread flag that records a failed allocation: jansson reports some
 * out-of-memory conditions as syntax errors, or not at all. A thread may also lend jansson
 * a scratch block that its allocations are bump-allocated from (frees inside it are no-ops);
 * the profile loader does this per line, which cut its load time by 13%. */

/* Installs the allocator once (idempotent, thread-safe). Call before any jansson use. */
void dh__json_use_allocator(void);

/* Installs the allocator and clears this thread's failure flag. */
void dh__json_track_begin(void);

/* True if a jansson allocation failed on this thread since dh__json_track_begin(). */
bool dh__json_track_failed(void);

struct json_t;
struct json_error_t;

/* Starts tracking (dh__json_track_begin) and loads the JSON file at `path`, duplicate keys
 * refused. A file that cannot be opened: -errno, with a message "PATH: cannot open: ...".
 * Otherwise 0 and *root the document (the caller's, json_decref), or NULL with the parse
 * error in *jerr for the caller to report in its own words. */
int dh__json_load_file(const char *path, struct json_t **root, struct json_error_t *jerr);

/* jansson's result of parsing `source` (a path or the caller's name for the text), checked:
 * an allocation failure since dh__json_track_begin() is DH_ENOMEM (root released), no root
 * is DH_EPARSE naming source, line, column and jansson's text; else 0 (root still the
 * caller's). */
int dh__json_check(struct json_t *root, const struct json_error_t *jerr, const char *source);

typedef struct dh__json_scratch {
    char *block;
    size_t cap, used; /* the owner resets used to 0 when all objects from it are released */
} dh__json_scratch_t;

#define DH__JSON_SCRATCH_SIZE ((size_t)64 << 10)

/* Makes `scratch` (or NULL for none) this thread's jansson scratch; returns the previous one.
 * Every jansson object made while it is set must be released before it is reset or freed. */
dh__json_scratch_t *dh__json_scratch_set(dh__json_scratch_t *scratch);

/* A numbered fault site (fault.h): true when a test armed this site to fail now. Compiles
 * to 0 unless built with DH_ENABLE_FAULTS. Use: `if (DH_FAULT(DH_FAULT_PROFILE_READ) ||
 * ferror(f))` so the injected failure takes the real failure's path. */
int dh__fault_fire(int site);
#ifdef DH_ENABLE_FAULTS
#define DH_FAULT(site) dh__fault_fire(site)
#else
#define DH_FAULT(site) 0
#endif

/* mkdir -p dir (mode 0755). Returns 0, or -errno / DH_ERANGE with a message naming the
 * folder that could not be made. */
int dh__make_dirs(const char *dir);

/* mkdir -p of the folder holding path (nothing for a bare file name). */
int dh__make_parent_dirs(const char *path);

/* Pins the calling thread (and the children it forks) to the CPU it runs on, for
 * single-core benchmarks. Returns 0 or -errno (-ENOSYS where unsupported). */
int dh__pin_to_current_cpu(void);

/* ---- The fetch tally (core/fetch.c; docs/remote.md, "The fetch tally") ----
 * What the thread executing a sample waited for remote bytes. The DataServer's worker binds
 * one (zeroed) around each sample it executes and reads it after; every range GET of the
 * remote module (dh__http_get_range, remote/http.c) notes its wall time and bytes on the
 * thread that made it, so the sample's result carries fetch_s and fetch_bytes. Local files
 * never call it: their tally stays 0. Not shared between threads: a read-ahead thread binds
 * none, so what it fetches counts nowhere. */
typedef struct dh__fetch_tally {
    uint64_t wait_ns; /* wall time waited for remote bytes */
    uint64_t bytes;   /* bytes fetched from the remote source (not from the local cache) */
} dh__fetch_tally_t;

/* Makes `tally` the calling thread's (NULL: none) and returns the one bound before. */
dh__fetch_tally_t *dh__fetch_tally_bind(dh__fetch_tally_t *tally);

/* Adds to the calling thread's tally, if one is bound (else nothing). O(1), no lock. */
void dh__fetch_note(uint64_t wait_ns, uint64_t bytes);

/* The source a sample's bytes come from, the key the coordinator learns fetch costs under:
 * "scheme://host[:port]" of an http, https or s3 URL (scheme and host lower-cased, user
 * information left out, so no password reaches a key), DH__FETCH_SOURCE_LOCAL for anything
 * else (a path, a tar member's range, file://, the emulation's synthetic://). Writes
 * a NUL-terminated key of at most DH__FETCH_SOURCE_MAX - 1 bytes (longer ones cut there)
 * and returns its length. uri NULL counts as a path. Pure, any thread. */
#define DH__FETCH_SOURCE_MAX 272
#define DH__FETCH_SOURCE_LOCAL "local"
size_t dh__fetch_source_key(const char *uri, char out[DH__FETCH_SOURCE_MAX]);

#define DH_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
