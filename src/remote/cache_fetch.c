/* remote/cache_fetch.c: the local cache in use (remote_lib.h, "The cache in use";
 * docs/remote.md). A process opens one cache directory (dh__remote_cache_use, reference
 * counted: every DataServer of the process with --cache-dir shares it) and installs
 * cache_fetch as the fetch of every remote file (dh__remote_set_fetch). A fetch, whatever
 * its range, looks up the cache blocks (64 KiB, DH_CACHE_BLOCK) that hold it, fetches each
 * run of missing blocks with one range GET, stores them, and hands back the bytes asked for.
 *
 * Keys: the URL without its query string (a presigned URL's signature changes from one
 * signing to the next; the object does not). The object's size is a small entry of its own
 * (block index SIZE_INDEX), written when a GET first tells it, so a fetch served wholly from
 * the cache still reports the size. Objects are taken as immutable (shards, clips): nothing
 * revalidates a cached block against the server (no ETag check).
 *
 * Thread-safe: the cache is; the counters are relaxed atomics; a read-write lock keeps the
 * cache open while a fetch uses it (release takes it for writing). Two threads missing the
 * same blocks make one request: the second waits for the first's (the in-flight claims). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/cache_internal.h"
#include "remote/remote_internal.h"

#define SIZE_INDEX UINT64_MAX

static struct {
    pthread_mutex_t mu;  /* refs, dir; held while opening and closing */
    pthread_rwlock_t rw; /* cache: read by fetches, written by use/release */
    dh__cache_t *cache;
    char *dir;
    uint64_t bytes_max;
    unsigned refs;
    _Atomic uint64_t hits, misses, bytes_network, gets, put_errors, waited_hits;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .rw = PTHREAD_RWLOCK_INITIALIZER};

#define COUNT(field, n) atomic_fetch_add_explicit(&g.field, (n), memory_order_relaxed)

/* The key: the URL up to its query or fragment. */
static int key_of(const char *url, char *key, size_t size)
{
    size_t n = strcspn(url, "?#");
    if (n + 1 > size || n + 1 > DH__CACHE_KEY_MAX) {
        char shown[512];
        return dh__set_error(DH_EINVAL, "%s: URL too long for the cache's key (%zu bytes)",
                             dh__url_redact(url, shown, sizeof shown), n);
    }
    memcpy(key, url, n);
    key[n] = '\0';
    return 0;
}

static int64_t cached_size(dh__cache_t *c, const char *key)
{
    uint8_t b[8];
    size_t len = sizeof b;
    if (dh__cache_get(c, key, SIZE_INDEX, b, &len) != 1 || len != sizeof b)
        return -1;
    int64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (int64_t)((uint64_t)v << 8 | b[i]);
    return v;
}

static void cache_size(dh__cache_t *c, const char *key, int64_t size)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)size >> (56 - 8 * i));
    if (dh__cache_put(c, key, SIZE_INDEX, b, sizeof b) < 0)
        COUNT(put_errors, 1);
}

/* Blocks being fetched, so that two threads missing the same blocks (a decode and the
 * read-ahead of its sample) make one request: a fetch claims its run of missing blocks;
 * one that finds part of its run claimed waits until that claim is released, then looks
 * the blocks up again. A full table claims nothing (both fetch). */
#define INFLIGHT 64
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct {
        bool used;
        uint64_t key, first, last;
    } e[INFLIGHT];
} fl = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static uint64_t key_hash(const char *key)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

/* 0 and *slot (-1: not recorded) when [first, last] of key is claimed for this thread; 1
 * after waiting for another claim that overlapped it; DH_EIO when the interrupt fired while
 * waiting. */
static int claim(uint64_t key, uint64_t first, uint64_t last,
                 const dh__remote_interrupt_t *interrupt, int *slot)
{
    *slot = -1;
    pthread_mutex_lock(&fl.mu);
    bool waited = false;
    for (;;) {
        int busy = -1, free_slot = -1;
        for (int i = 0; i < INFLIGHT; i++) {
            if (!fl.e[i].used) {
                if (free_slot < 0)
                    free_slot = i;
            } else if (fl.e[i].key == key && fl.e[i].first <= last && first <= fl.e[i].last) {
                busy = i;
            }
        }
        if (busy < 0) {
            if (waited) {
                pthread_mutex_unlock(&fl.mu);
                return 1;
            }
            if (free_slot >= 0) {
                fl.e[free_slot].used = true;
                fl.e[free_slot].key = key;
                fl.e[free_slot].first = first;
                fl.e[free_slot].last = last;
                *slot = free_slot;
            }
            pthread_mutex_unlock(&fl.mu);
            return 0;
        }
        if (interrupt && interrupt->callback && interrupt->callback(interrupt->opaque)) {
            pthread_mutex_unlock(&fl.mu);
            return dh__set_error(DH_EIO, "cached fetch: interrupted while another fetch of the "
                                         "same blocks ran");
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000; /* the interrupt polled every 100 ms */
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&fl.cv, &fl.mu, &ts);
        waited = true;
    }
}

static void release(int slot)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&fl.mu);
    fl.e[slot].used = false;
    pthread_cond_broadcast(&fl.cv);
    pthread_mutex_unlock(&fl.mu);
}

/* Fetch [offset, offset + len) of url through cache c (see the file's comment). */
static int fetch_cached(dh__cache_t *c, const char *url, int64_t offset, size_t len, void *buf,
                        size_t *got, int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    char key[DH__CACHE_KEY_MAX];
    int rc = key_of(url, key, sizeof key);
    if (rc)
        return rc;
    const int64_t B = (int64_t)dh__cache_block_bytes(c);
    const uint64_t kh = key_hash(key);
    int64_t size = cached_size(c, key);
    if (size >= 0 && offset >= size) {
        if (total)
            *total = size;
        return 0;
    }
    int64_t end = offset + (int64_t)len;
    if (size >= 0 && end > size)
        end = size;
    uint64_t first = (uint64_t)(offset / B), last = (uint64_t)((end - 1) / B);
    size_t n = (size_t)(last - first + 1);
    uint8_t *span = dh_malloc(n * (size_t)B);
    size_t *have = dh_calloc(n, sizeof *have); /* bytes of each block held; 0: missing */
    if (!span || !have) {
        dh_free(span);
        dh_free(have);
        char shown[512];
        return dh__set_error(DH_ENOMEM, "%s: out of memory for a cached fetch",
                             dh__url_redact(url, shown, sizeof shown));
    }
    for (size_t i = 0; i < n; i++) {
        size_t bl = (size_t)B;
        int r = dh__cache_get(c, key, first + i, span + i * (size_t)B, &bl);
        if (r == 1 && bl > 0) {
            have[i] = bl;
            COUNT(hits, 1);
            if (bl < (size_t)B && size < 0) /* a short block ends the object */
                size = (int64_t)(first + i) * B + (int64_t)bl;
        } else {
            COUNT(misses, 1);
        }
    }
    bool size_new = false;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (have[i])
            continue;
        size_t j = i;
        while (j + 1 < n && !have[j + 1])
            j++;
        int slot = -1;
        if ((rc = claim(kh, first + i, first + j, interrupt, &slot)) == 1) {
            /* another thread fetched some of them meanwhile: look again */
            rc = 0;
            for (size_t k = i; k <= j; k++) {
                size_t bl = (size_t)B;
                if (dh__cache_get(c, key, first + k, span + k * (size_t)B, &bl) == 1 && bl > 0) {
                    have[k] = bl;
                    COUNT(waited_hits, 1);
                }
            }
            i--; /* the run again, from its first block still missing */
            continue;
        }
        if (rc)
            break;
        int64_t from = (int64_t)(first + i) * B;
        size_t want = (j - i + 1) * (size_t)B;
        size_t r_got = 0;
        int64_t r_total = -1;
        rc = dh__http_get_range(url, from, want, span + i * (size_t)B, &r_got, &r_total, interrupt);
        if (rc) {
            release(slot);
            break;
        }
        COUNT(bytes_network, r_got);
        if (r_total >= 0 && size < 0) {
            size = r_total;
            size_new = true;
        } else if (r_total < 0 && r_got < want && size < 0) {
            size = from + (int64_t)r_got;
        }
        for (size_t k = i; k <= j; k++) {
            size_t at = (k - i) * (size_t)B;
            if (at >= r_got)
                break;
            size_t bl = r_got - at < (size_t)B ? r_got - at : (size_t)B;
            /* a short block is stored only when it is the object's last */
            if (bl == (size_t)B || (size >= 0 && (int64_t)(first + k) * B + (int64_t)bl == size)) {
                have[k] = bl;
                if (dh__cache_put(c, key, first + k, span + k * (size_t)B, bl) < 0)
                    COUNT(put_errors, 1);
            }
        }
        if (r_got < want && !(size >= 0 && from + (int64_t)r_got >= size))
            have[j] = 0; /* cut short without the object ending: not held */
        release(slot);
        i = j;
    }
    if (rc == 0 && size_new)
        cache_size(c, key, size);
    if (rc == 0) {
        /* the bytes of [offset, end) held contiguously from the first block */
        size_t off = (size_t)(offset - (int64_t)first * B);
        size_t avail = 0;
        for (size_t i = 0; i < n; i++) {
            avail += have[i];
            if (have[i] < (size_t)B)
                break;
        }
        size_t k = avail > off ? avail - off : 0;
        if (k > len)
            k = len;
        memcpy(buf, span + off, k);
        *got = k;
        if (total)
            *total = size;
    }
    dh_free(span);
    dh_free(have);
    return rc;
}

static int cache_fetch(void *ctx, const char *url, int64_t offset, size_t len, void *buf,
                       size_t *got, int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    (void)ctx;
    *got = 0;
    if (total)
        *total = -1;
    if (len == 0)
        return 0;
    COUNT(gets, 1);
    pthread_rwlock_rdlock(&g.rw);
    int rc = g.cache ? fetch_cached(g.cache, url, offset, len, buf, got, total, interrupt)
                     : dh__http_get_range(url, offset, len, buf, got, total, interrupt);
    pthread_rwlock_unlock(&g.rw);
    return rc;
}

int dh__remote_cache_fetch(const char *url, int64_t offset, size_t len, void *buf, size_t *got,
                           int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    return cache_fetch(NULL, url, offset, len, buf, got, total, interrupt);
}

/* DH_CACHE_BLOCK: the cache's block size in bytes, a multiple of DH_REMOTE_BLOCK from 8 KiB
 * to 1 MiB (default DH_REMOTE_CACHE_BLOCK). */
static int block_setting(size_t *block)
{
    const char *v = getenv("DH_CACHE_BLOCK");
    if (!v || !*v)
        return 0;
    char *e;
    unsigned long long n = strtoull(v, &e, 10);
    if (*e || n < DH_REMOTE_BLOCK || n > ((size_t)1 << 20) || n % DH_REMOTE_BLOCK)
        return dh__set_error(DH_EINVAL,
                             "DH_CACHE_BLOCK=%s: expected a multiple of 8192 bytes from 8192 to "
                             "1048576",
                             v);
    *block = (size_t)n;
    return 0;
}

size_t dh__remote_cache_block(void)
{
    pthread_rwlock_rdlock(&g.rw);
    size_t b = g.cache ? dh__cache_block_bytes(g.cache) : DH_REMOTE_CACHE_BLOCK;
    pthread_rwlock_unlock(&g.rw);
    return b;
}

int dh__remote_cache_use(const char *dir, uint64_t bytes_max)
{
    pthread_mutex_lock(&g.mu);
    int rc = 0;
    if (g.refs) {
        if (strcmp(g.dir, dir) != 0)
            rc = dh__set_error(DH_EINVAL,
                               "cache directory %s: this process reads through %s already (one "
                               "cache per process)",
                               dir, g.dir);
        else
            g.refs++;
        pthread_mutex_unlock(&g.mu);
        return rc;
    }
    char *copy = dh_strdup(dir);
    dh__cache_t *c = NULL;
    size_t block = DH_REMOTE_CACHE_BLOCK;
    if (!copy)
        rc = dh__set_error(DH_ENOMEM, "cache directory %s: out of memory", dir);
    else
        rc = block_setting(&block);
    if (!rc)
        rc = dh__cache_open(&c, dir, bytes_max, block);
    if (rc) {
        dh_free(copy);
        pthread_mutex_unlock(&g.mu);
        return rc;
    }
    pthread_rwlock_wrlock(&g.rw);
    g.cache = c;
    pthread_rwlock_unlock(&g.rw);
    g.dir = copy;
    g.bytes_max = bytes_max;
    g.refs = 1;
    dh__remote_set_fetch(cache_fetch, NULL);
    pthread_mutex_unlock(&g.mu);
    return 0;
}

void dh__remote_cache_release(void)
{
    pthread_mutex_lock(&g.mu);
    if (g.refs && --g.refs == 0) {
        dh__remote_readahead_stop(); /* its threads fetch through the cache */
        dh__remote_set_fetch(NULL, NULL);
        pthread_rwlock_wrlock(&g.rw);
        dh__cache_t *c = g.cache;
        g.cache = NULL;
        pthread_rwlock_unlock(&g.rw);
        dh__cache_close(&c);
        dh_free(g.dir);
        g.dir = NULL;
    }
    pthread_mutex_unlock(&g.mu);
}

bool dh__remote_cache_active(void)
{
    pthread_rwlock_rdlock(&g.rw);
    bool on = g.cache != NULL;
    pthread_rwlock_unlock(&g.rw);
    return on;
}

void dh__remote_cache_stats(dh__remote_cache_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->fetches = atomic_load_explicit(&g.gets, memory_order_relaxed);
    out->hits = atomic_load_explicit(&g.hits, memory_order_relaxed);
    out->misses = atomic_load_explicit(&g.misses, memory_order_relaxed);
    out->bytes_network = atomic_load_explicit(&g.bytes_network, memory_order_relaxed);
    out->put_errors = atomic_load_explicit(&g.put_errors, memory_order_relaxed);
    out->waited_hits = atomic_load_explicit(&g.waited_hits, memory_order_relaxed);
    dh__remote_readahead_counts(out);
    pthread_rwlock_rdlock(&g.rw);
    if (g.cache) {
        dh__cache_stats_t cs;
        if (dh__cache_stats(g.cache, &cs) == 0) {
            out->bytes_held = cs.bytes;
            out->bytes_max = cs.bytes_max;
            out->evictions = cs.evictions;
        }
    }
    pthread_rwlock_unlock(&g.rw);
}
