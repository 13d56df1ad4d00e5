/* remote/readahead.c: the next requests' byte ranges fetched into the local cache in the
 * background (remote_lib.h, "Read-ahead"; docs/remote.md). A DataServer hands over each
 * queued task's remote samples (a URL and a byte range: a tar member, or a clip's head) with
 * the task as a tag; a few threads (DH_READAHEAD_THREADS, 8) fetch them through the cache,
 * oldest first, while the workers decode. The queue is bounded in bytes
 * (DH_READAHEAD_BYTES, 64 MiB; 0 turns read-ahead off): a range that does not fit is
 * dropped, not waited for. dh__remote_readahead_cancel(tag) drops a task's queued ranges and
 * stops its running ones at their next block (their requests' interrupt). Without a cache
 * (dh__remote_cache_use) nothing is queued: the bytes would have nowhere to go. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "core/internal.h"
#include "remote/remote_internal.h"

#define THREADS_MAX 16
/* Fetches wait on the network, not the CPU: on a 50 ms link 2 threads kept a cold epoch
 * at 0.55x local disk, 8 at 0.77x (docs/benchmarks.md, "Remote shards") */
#define THREADS_DEFAULT 8
#define CHUNK ((size_t)1 << 20) /* one fetch of a range: 16 cache blocks */

typedef struct item {
    struct item *next;
    char *url;
    int64_t start, end; /* object offsets [start, end) */
    int64_t align;      /* fetched from start and to end rounded to this: a cache block, or
                         * a reader block for a head cut short by what was learned */
    uint64_t tag;
    atomic_bool cancel;
} item_t;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    item_t *head, *tail;
    uint64_t queued_bytes; /* of the items queued and running */
    item_t *running[THREADS_MAX];
    pthread_t threads[THREADS_MAX];
    int n_threads;
    bool stop, configured;
    uint64_t bytes_max;
    int threads_max;
    uint64_t queued, done, cancelled, dropped, failed, bytes;
} ra = {.mu = PTHREAD_MUTEX_INITIALIZER,
        .work = PTHREAD_COND_INITIALIZER,
        .idle = PTHREAD_COND_INITIALIZER};

/* What the last reads of a source needed: per source (dh__fetch_source_key: scheme and
 * host or bucket) and kind (a tar member, a whole clip), the prefix the last LEARN_LAST
 * readers read from their range's start, contiguously (dh__remote_readahead_learn, at a
 * remote file's close). A range of a taught source is read ahead only as far as the largest
 * of them: a long clip of which a few frames are sampled gets its head (an MP4's index and
 * what follows it), a short clip read whole gets all of it. */
#define LEARN_SOURCES 32
#define LEARN_LAST 8
static struct {
    pthread_mutex_t mu;
    struct {
        char source[DH__FETCH_SOURCE_MAX];
        bool member;
        unsigned n, next;
        uint64_t prefix[LEARN_LAST];
        uint64_t used;
    } e[LEARN_SOURCES];
    uint64_t tick;
} learn = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The slot of (source, member); a new one (the least recently used) when `make`; -1. */
static int learn_slot(const char *source, bool member, bool make)
{
    int lru = 0;
    for (int i = 0; i < LEARN_SOURCES; i++) {
        if (learn.e[i].n && learn.e[i].member == member && strcmp(learn.e[i].source, source) == 0)
            return i;
        if (learn.e[i].used < learn.e[lru].used)
            lru = i;
    }
    if (!make)
        return -1;
    memset(&learn.e[lru], 0, sizeof learn.e[lru]);
    snprintf(learn.e[lru].source, sizeof learn.e[lru].source, "%s", source);
    learn.e[lru].member = member;
    return lru;
}

void dh__remote_readahead_learn(const char *url, bool member, uint64_t prefix)
{
    char source[DH__FETCH_SOURCE_MAX];
    dh__fetch_source_key(url, source);
    pthread_mutex_lock(&learn.mu);
    int i = learn_slot(source, member, true);
    learn.e[i].prefix[learn.e[i].next] = prefix;
    learn.e[i].next = (learn.e[i].next + 1) % LEARN_LAST;
    if (learn.e[i].n < LEARN_LAST)
        learn.e[i].n++;
    learn.e[i].used = ++learn.tick;
    pthread_mutex_unlock(&learn.mu);
}

void dh__remote_readahead_forget(void)
{
    pthread_mutex_lock(&learn.mu);
    memset(learn.e, 0, sizeof learn.e);
    pthread_mutex_unlock(&learn.mu);
}

/* The bytes from a range's start that the last reads of url's source needed, rounded up
 * to a reader block; -1 when none was learned. */
static int64_t learned_head(const char *url, bool member)
{
    char source[DH__FETCH_SOURCE_MAX];
    dh__fetch_source_key(url, source);
    int64_t head = -1;
    pthread_mutex_lock(&learn.mu);
    int i = learn_slot(source, member, false);
    if (i >= 0) {
        uint64_t m = 0;
        for (unsigned k = 0; k < learn.e[i].n; k++)
            m = learn.e[i].prefix[k] > m ? learn.e[i].prefix[k] : m;
        head = (int64_t)((m + DH_REMOTE_BLOCK - 1) / DH_REMOTE_BLOCK * DH_REMOTE_BLOCK);
        learn.e[i].used = ++learn.tick;
    }
    pthread_mutex_unlock(&learn.mu);
    return head;
}

static void configure(void)
{
    if (ra.configured)
        return;
    ra.configured = true;
    ra.bytes_max = (uint64_t)64 << 20;
    ra.threads_max = THREADS_DEFAULT;
    const char *v = getenv("DH_READAHEAD_BYTES");
    if (v && *v) {
        char *e;
        unsigned long long n = strtoull(v, &e, 10);
        if (*e == '\0')
            ra.bytes_max = n;
        else
            dh_log_warn("DH_READAHEAD_BYTES=%s is not a number of bytes: read-ahead keeps 64 MiB",
                        v);
    }
    v = getenv("DH_READAHEAD_THREADS");
    if (v && *v) {
        int n = atoi(v);
        if (n >= 1 && n <= THREADS_MAX)
            ra.threads_max = n;
        else
            dh_log_warn("DH_READAHEAD_THREADS=%s is not in [1, %d]: read-ahead keeps %d threads", v,
                        THREADS_MAX, THREADS_DEFAULT);
    }
}

static uint64_t item_bytes(const item_t *it)
{
    return (uint64_t)(it->end - it->start);
}

static int interrupted(void *opaque)
{
    item_t *it = opaque;
    return atomic_load(&it->cancel);
}

static void fetch_item(item_t *it, uint8_t *buf)
{
    const int64_t B = it->align;
    dh__remote_interrupt_t intr = {interrupted, it};
    int64_t at = it->start / B * B;
    uint64_t got_all = 0;
    while (at < it->end && !atomic_load(&it->cancel)) {
        int64_t stop = (it->end + B - 1) / B * B; /* the range's last block, no further */
        size_t want = stop - at < (int64_t)CHUNK ? (size_t)(stop - at) : CHUNK;
        size_t got = 0;
        int rc = dh__remote_cache_fetch(it->url, at, want, buf, &got, NULL, &intr);
        if (rc) {
            pthread_mutex_lock(&ra.mu);
            if (!atomic_load(&it->cancel))
                ra.failed++;
            pthread_mutex_unlock(&ra.mu);
            break;
        }
        got_all += got;
        if (got < want)
            break; /* the object ends */
        at += (int64_t)got;
    }
    pthread_mutex_lock(&ra.mu);
    ra.bytes += got_all;
    if (atomic_load(&it->cancel))
        ra.cancelled++;
    else
        ra.done++;
    pthread_mutex_unlock(&ra.mu);
}

static void *thread_main(void *arg)
{
    int index = (int)(intptr_t)arg;
    uint8_t *buf = dh_malloc(CHUNK);
    pthread_mutex_lock(&ra.mu);
    for (;;) {
        while (!ra.head && !ra.stop)
            pthread_cond_wait(&ra.work, &ra.mu);
        if (ra.stop)
            break;
        item_t *it = ra.head;
        ra.head = it->next;
        if (!ra.head)
            ra.tail = NULL;
        ra.running[index] = it;
        pthread_mutex_unlock(&ra.mu);
        if (buf)
            fetch_item(it, buf);
        pthread_mutex_lock(&ra.mu);
        ra.running[index] = NULL;
        ra.queued_bytes -= item_bytes(it);
        dh_free(it->url);
        dh_free(it);
        pthread_cond_broadcast(&ra.idle);
    }
    pthread_mutex_unlock(&ra.mu);
    dh_free(buf);
    return NULL;
}

int dh__remote_readahead(const char *url, int64_t start, int64_t end, uint64_t tag)
{
    if (!dh__remote_cache_active())
        return 0;
    if (start < 0)
        start = 0;
    bool member = end >= 0;
    if (end < 0 || end - start > (int64_t)DH_READAHEAD_RANGE_MAX)
        end = start + (int64_t)(end < 0 ? DH_READAHEAD_HEAD : DH_READAHEAD_RANGE_MAX);
    int64_t align = (int64_t)dh__remote_cache_block();
    int64_t head = learned_head(url, member);
    if (head >= 0 && 2 * head < end - start) { /* (a range read mostly whole: all of it) */
        end = start + (head > 0 ? head : (int64_t)DH_REMOTE_BLOCK);
        align = (int64_t)DH_REMOTE_BLOCK; /* fragments at the edges: only what is needed */
    }
    if (end <= start)
        return 0;
    pthread_mutex_lock(&ra.mu);
    configure();
    uint64_t n = (uint64_t)(end - start);
    if (ra.stop || ra.bytes_max == 0 || ra.queued_bytes + n > ra.bytes_max) {
        if (ra.bytes_max)
            ra.dropped++;
        pthread_mutex_unlock(&ra.mu);
        return 0;
    }
    item_t *it = dh_calloc(1, sizeof *it);
    char *copy = dh_strdup(url);
    if (!it || !copy) {
        pthread_mutex_unlock(&ra.mu);
        dh_free(it);
        dh_free(copy);
        return dh__set_error(DH_ENOMEM, "read-ahead: out of memory");
    }
    it->url = copy;
    it->start = start;
    it->end = end;
    it->align = align;
    it->tag = tag;
    while (ra.n_threads < ra.threads_max) {
        if (pthread_create(&ra.threads[ra.n_threads], NULL, thread_main,
                           (void *)(intptr_t)ra.n_threads) != 0)
            break;
        ra.n_threads++;
    }
    if (ra.n_threads == 0) {
        pthread_mutex_unlock(&ra.mu);
        dh_free(it->url);
        dh_free(it);
        return dh__set_error(DH_EIO, "read-ahead: cannot start a thread");
    }
    if (ra.tail)
        ra.tail->next = it;
    else
        ra.head = it;
    ra.tail = it;
    ra.queued_bytes += n;
    ra.queued++;
    pthread_cond_signal(&ra.work);
    pthread_mutex_unlock(&ra.mu);
    return 0;
}

void dh__remote_readahead_cancel(uint64_t tag)
{
    pthread_mutex_lock(&ra.mu);
    item_t **pp = &ra.head, *prev = NULL;
    while (*pp) {
        item_t *it = *pp;
        if (it->tag == tag) {
            *pp = it->next;
            if (ra.tail == it)
                ra.tail = prev;
            ra.queued_bytes -= item_bytes(it);
            ra.cancelled++;
            dh_free(it->url);
            dh_free(it);
        } else {
            prev = it;
            pp = &it->next;
        }
    }
    for (int i = 0; i < ra.n_threads; i++)
        if (ra.running[i] && ra.running[i]->tag == tag)
            atomic_store(&ra.running[i]->cancel, true);
    pthread_cond_broadcast(&ra.idle);
    pthread_mutex_unlock(&ra.mu);
}

void dh__remote_readahead_wait_idle(void)
{
    pthread_mutex_lock(&ra.mu);
    for (;;) {
        bool busy = ra.head != NULL;
        for (int i = 0; i < ra.n_threads && !busy; i++)
            busy = ra.running[i] != NULL;
        if (!busy)
            break;
        pthread_cond_wait(&ra.idle, &ra.mu);
    }
    pthread_mutex_unlock(&ra.mu);
}

void dh__remote_readahead_stop(void)
{
    pthread_mutex_lock(&ra.mu);
    ra.stop = true;
    for (item_t *it = ra.head; it;) {
        item_t *next = it->next;
        ra.cancelled++;
        dh_free(it->url);
        dh_free(it);
        it = next;
    }
    ra.head = ra.tail = NULL;
    for (int i = 0; i < ra.n_threads; i++)
        if (ra.running[i])
            atomic_store(&ra.running[i]->cancel, true);
    pthread_cond_broadcast(&ra.work);
    int n = ra.n_threads;
    pthread_mutex_unlock(&ra.mu);
    for (int i = 0; i < n; i++)
        pthread_join(ra.threads[i], NULL);
    pthread_mutex_lock(&ra.mu);
    ra.n_threads = 0;
    ra.queued_bytes = 0;
    ra.stop = false;
    ra.configured = false; /* the settings are read again by the next use */
    pthread_mutex_unlock(&ra.mu);
}

void dh__remote_readahead_counts(dh__remote_cache_stats_t *out)
{
    pthread_mutex_lock(&ra.mu);
    out->ra_queued = ra.queued;
    out->ra_done = ra.done;
    out->ra_cancelled = ra.cancelled;
    out->ra_dropped = ra.dropped;
    out->ra_failed = ra.failed;
    out->ra_bytes = ra.bytes;
    pthread_mutex_unlock(&ra.mu);
}
