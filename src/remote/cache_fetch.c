/* remote/cache_fetch.c: the local cache in use (remote_lib.h, "The cache in use";
 * docs/remote.md). A process opens one cache directory (dh__remote_cache_use, reference
 * counted: every DataServer of the process with --cache-dir shares it) and installs
 * cache_fetch as the fetch of every remote file (dh__remote_set_fetch). A fetch, whatever
 * its range, looks up the cache blocks (64 KiB, DH_CACHE_BLOCK) that hold it, and for a
 * block it needs only part of and does not hold, the 8 KiB fragments of that part; it
 * fetches each run of missing blocks and fragments with one range GET, stores them (a block
 * it covers whole as a block, the others as fragments), and hands back the bytes asked for.
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
    bool fragments; /* DH_CACHE_FRAGMENTS: partly needed blocks fetched as 8 KiB fragments */
    _Atomic uint64_t hits, misses, bytes_network, gets, put_errors, waited_hits, requests, puts,
        fragment_puts;
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

/* Fragments: a cache block that a fetch needs only part of (a demuxer's read after a seek)
 * is fetched and stored as the 8 KiB pieces (DH_REMOTE_BLOCK, the reader's blocks) it
 * needs, each an entry of its own under FRAG_BIT | (object offset / 8 KiB); a block the
 * fetch covers whole is fetched and stored whole, as before. DH_CACHE_FRAGMENTS=0: whole
 * blocks only (the old scheme, for comparison). */
#define FRAG_BIT ((uint64_t)1 << 63)

/* One fetch's plan, in fragments of F bytes over the cache blocks [first, first + n). */
typedef struct plan {
    dh__cache_t *c;
    const char *key;
    int64_t B, F;
    size_t per;        /* fragments per block */
    uint64_t first;    /* the first cache block */
    size_t n, nf;      /* blocks, fragments */
    uint8_t *span;     /* n * B bytes */
    size_t *have;      /* bytes of each fragment held; 0: missing */
    bool *whole;       /* per block: fetched and stored whole (the fetch covers it) */
    size_t f_lo, f_hi; /* the fragments the fetch needs, [f_lo, f_hi) */
    int64_t size;      /* the object's, -1 unknown */
} plan_t;

/* Marks the fragments of block k as held from a block entry of bl bytes. */
static void plan_block_held(plan_t *p, size_t k, size_t bl)
{
    for (size_t j = 0; j < p->per; j++) {
        size_t at = j * (size_t)p->F;
        p->have[k * p->per + j] = bl > at ? (bl - at < (size_t)p->F ? bl - at : (size_t)p->F) : 0;
    }
    if (bl < (size_t)p->B && p->size < 0) /* a short block ends the object */
        p->size = (int64_t)(p->first + k) * p->B + (int64_t)bl;
}

/* Looks up block k whole, else (unless it is to be fetched whole) the fragments of it the
 * fetch needs and does not hold. Counts into `hit` (hits or waited_hits); a miss is a block
 * to fetch whole, or a fragment to fetch. */
static void plan_lookup(plan_t *p, size_t k, _Atomic uint64_t *hit, bool count_misses)
{
    size_t bl = (size_t)p->B;
    int r = dh__cache_get(p->c, p->key, p->first + k, p->span + k * (size_t)p->B, &bl);
    if (r == 1 && bl > 0) {
        plan_block_held(p, k, bl);
        atomic_fetch_add_explicit(hit, 1, memory_order_relaxed);
        return;
    }
    if (p->whole[k]) {
        if (count_misses)
            COUNT(misses, 1);
        return;
    }
    for (size_t j = 0; j < p->per; j++) {
        size_t f = k * p->per + j;
        if (f < p->f_lo || f >= p->f_hi || p->have[f])
            continue;
        uint64_t index = FRAG_BIT | ((p->first * p->per) + f);
        size_t flen = (size_t)p->F;
        r = dh__cache_get(p->c, p->key, index, p->span + f * (size_t)p->F, &flen);
        if (r == 1 && flen > 0) {
            p->have[f] = flen;
            atomic_fetch_add_explicit(hit, 1, memory_order_relaxed);
            if (flen < (size_t)p->F && p->size < 0)
                p->size = (int64_t)((p->first * p->per) + f) * p->F + (int64_t)flen;
        } else if (count_misses) {
            COUNT(misses, 1);
        }
    }
}

/* Stores what a GET brought for fragments [a, b]: whole blocks where the block is to be
 * stored whole and all of it is held, else each fragment fetched (a short one only when it
 * is the object's last). */
static void plan_store(plan_t *p, size_t a, size_t b)
{
    for (size_t k = a / p->per; k <= b / p->per; k++) {
        if (p->whole[k]) {
            size_t bl = 0;
            for (size_t j = 0; j < p->per; j++) {
                size_t h = p->have[k * p->per + j];
                bl += h;
                if (h < (size_t)p->F)
                    break;
            }
            int64_t block_end = (int64_t)(p->first + k) * p->B + (int64_t)bl;
            if (bl == (size_t)p->B || (bl > 0 && p->size >= 0 && block_end == p->size)) {
                if (dh__cache_put(p->c, p->key, p->first + k, p->span + k * (size_t)p->B, bl) < 0)
                    COUNT(put_errors, 1);
                COUNT(puts, 1);
            }
            continue;
        }
        for (size_t f = k * p->per; f < (k + 1) * p->per; f++) {
            if (f < a || f > b || !p->have[f])
                continue;
            int64_t frag_end = (int64_t)((p->first * p->per) + f) * p->F + (int64_t)p->have[f];
            if (p->have[f] < (size_t)p->F && !(p->size >= 0 && frag_end == p->size))
                continue;
            uint64_t index = FRAG_BIT | ((p->first * p->per) + f);
            if (dh__cache_put(p->c, p->key, index, p->span + f * (size_t)p->F, p->have[f]) < 0)
                COUNT(put_errors, 1);
            COUNT(puts, 1);
            COUNT(fragment_puts, 1);
        }
    }
}

/* Fetch [offset, offset + len) of url through cache c (see the file's comment). */
static int fetch_cached(dh__cache_t *c, const char *url, int64_t offset, size_t len, void *buf,
                        size_t *got, int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    char key[DH__CACHE_KEY_MAX];
    int rc = key_of(url, key, sizeof key);
    if (rc)
        return rc;
    plan_t p = {.c = c, .key = key, .B = (int64_t)dh__cache_block_bytes(c)};
    p.F = g.fragments && p.B % (int64_t)DH_REMOTE_BLOCK == 0 ? (int64_t)DH_REMOTE_BLOCK : p.B;
    p.per = (size_t)(p.B / p.F);
    const uint64_t kh = key_hash(key);
    p.size = cached_size(c, key);
    if (p.size >= 0 && offset >= p.size) {
        if (total)
            *total = p.size;
        return 0;
    }
    int64_t end = offset + (int64_t)len;
    if (p.size >= 0 && end > p.size)
        end = p.size;
    p.first = (uint64_t)(offset / p.B);
    uint64_t last = (uint64_t)((end - 1) / p.B);
    p.n = (size_t)(last - p.first + 1);
    p.nf = p.n * p.per;
    p.f_lo = (size_t)((offset - (int64_t)p.first * p.B) / p.F);
    p.f_hi = (size_t)((end - (int64_t)p.first * p.B + p.F - 1) / p.F);
    p.span = dh_malloc(p.n * (size_t)p.B);
    p.have = dh_calloc(p.nf, sizeof *p.have);
    p.whole = dh_calloc(p.n, sizeof *p.whole);
    if (!p.span || !p.have || !p.whole) {
        dh_free(p.span);
        dh_free(p.have);
        dh_free(p.whole);
        char shown[512];
        return dh__set_error(DH_ENOMEM, "%s: out of memory for a cached fetch",
                             dh__url_redact(url, shown, sizeof shown));
    }
    for (size_t k = 0; k < p.n; k++) {
        /* whole: the fetch needs all of the block (or all of it up to the object's end) */
        int64_t b0 = (int64_t)(p.first + k) * p.B, b1 = b0 + p.B;
        p.whole[k] = p.per == 1 || (offset <= b0 && (end >= b1 || (p.size >= 0 && end == p.size)));
        plan_lookup(&p, k, &g.hits, true);
    }
    bool size_new = false;
    for (size_t i = p.f_lo; i < p.f_hi && rc == 0; i++) {
        if (p.have[i])
            continue;
        size_t j = i;
        while (j + 1 < p.f_hi && !p.have[j + 1])
            j++;
        /* a block stored whole is fetched whole: the run out to its edges */
        while (i > 0 && p.whole[i / p.per] && i % p.per && !p.have[i - 1])
            i--;
        while (j + 1 < p.nf && p.whole[j / p.per] && (j + 1) % p.per && !p.have[j + 1])
            j++;
        uint64_t f0 = p.first * p.per;
        int slot = -1;
        if ((rc = claim(kh, f0 + i, f0 + j, interrupt, &slot)) == 1) {
            /* another thread fetched some of them meanwhile: look again */
            rc = 0;
            for (size_t k = i / p.per; k <= j / p.per; k++)
                plan_lookup(&p, k, &g.waited_hits, false);
            i--; /* the run again, from its first fragment still missing */
            continue;
        }
        if (rc)
            break;
        int64_t from = (int64_t)(f0 + i) * p.F;
        size_t want = (j - i + 1) * (size_t)p.F;
        size_t r_got = 0;
        int64_t r_total = -1;
        rc = dh__http_get_range(url, from, want, p.span + i * (size_t)p.F, &r_got, &r_total,
                                interrupt);
        if (rc) {
            release(slot);
            break;
        }
        COUNT(bytes_network, r_got);
        COUNT(requests, 1);
        if (r_total >= 0 && p.size < 0) {
            p.size = r_total;
            size_new = true;
        } else if (r_total < 0 && r_got < want && p.size < 0) {
            p.size = from + (int64_t)r_got;
        }
        for (size_t k = i; k <= j; k++) {
            size_t at = (k - i) * (size_t)p.F;
            p.have[k] = r_got > at ? (r_got - at < (size_t)p.F ? r_got - at : (size_t)p.F) : 0;
        }
        plan_store(&p, i, j);
        bool ended = p.size >= 0 && from + (int64_t)r_got >= p.size;
        if (r_got < want && !ended) {
            /* cut short without the object ending: the short fragment is not held */
            size_t k = i + r_got / (size_t)p.F;
            if (k <= j)
                p.have[k] = 0;
        }
        release(slot);
        i = j;
    }
    if (rc == 0 && size_new)
        cache_size(c, key, p.size);
    if (rc == 0) {
        /* the bytes of [offset, end) held contiguously from the fragment holding offset */
        size_t off = (size_t)(offset - (int64_t)p.first * p.B);
        size_t avail = p.f_lo * (size_t)p.F;
        for (size_t i = p.f_lo; i < p.nf; i++) {
            avail += p.have[i];
            if (p.have[i] < (size_t)p.F)
                break;
        }
        size_t k = avail > off ? avail - off : 0;
        if (k > len)
            k = len;
        memcpy(buf, p.span + off, k);
        *got = k;
        if (total)
            *total = p.size;
    }
    dh_free(p.span);
    dh_free(p.have);
    dh_free(p.whole);
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

/* DH_CACHE_FRAGMENTS: 1 (default) or 0 (whole blocks only, the old scheme). */
static int fragments_setting(bool *on)
{
    const char *v = getenv("DH_CACHE_FRAGMENTS");
    *on = true;
    if (!v || !*v)
        return 0;
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return dh__set_error(DH_EINVAL, "DH_CACHE_FRAGMENTS=%s: expected 0 or 1", v);
    *on = v[0] == '1';
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
    bool fragments = true;
    if (!copy)
        rc = dh__set_error(DH_ENOMEM, "cache directory %s: out of memory", dir);
    else
        rc = block_setting(&block);
    if (!rc)
        rc = fragments_setting(&fragments);
    if (!rc)
        rc = dh__cache_open(&c, dir, bytes_max, block);
    if (rc) {
        dh_free(copy);
        pthread_mutex_unlock(&g.mu);
        return rc;
    }
    pthread_rwlock_wrlock(&g.rw);
    g.cache = c;
    g.fragments = fragments;
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
    out->requests = atomic_load_explicit(&g.requests, memory_order_relaxed);
    out->puts = atomic_load_explicit(&g.puts, memory_order_relaxed);
    out->fragment_puts = atomic_load_explicit(&g.fragment_puts, memory_order_relaxed);
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
