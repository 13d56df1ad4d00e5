/* remote/cache_space.c: the bound of the local cache (cache_internal.h): the directory's
 * lock, the record of the bytes it holds, eviction of the least recently used blocks and
 * the scan that recounts the directory and removes what crashed writers left.
 *
 * Every change of the directory's files (a reservation, a rename into place, an eviction,
 * the deletion of a corrupt block) happens under an exclusive flock of DIR/cache.lock,
 * which records the bytes held; a temporary file is written outside the lock but never
 * past its reservation. So the files' total stays within the bound at every moment, for
 * any number of processes. Limits: recency across processes is as exact as this process's
 * candidates, which come from its last scan plus its own inserts (blocks other processes
 * inserted since are found at the next scan, when the candidates run out; a block touched
 * since the scan is put back at its new time): a block another process just inserted is
 * never evicted first. A scan costs a stat per file: 55-101 ms for 10,000 blocks
 * (docs/remote.md, "Costs").
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/cache_internal.h"

static const char lock_magic[8] = {'D', 'H', 'C', 'A', 'C', 'H', 'E', '1'};

int64_t dh__cache_now_ns(void)
{
    static atomic_int_fast64_t last;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    int_fast64_t prev = atomic_load(&last);
    for (;;) {
        int64_t next = now > prev ? now : prev + 1;
        if (atomic_compare_exchange_weak(&last, &prev, next))
            return next;
    }
}

int dh__cache_lock(dh__cache_t *c)
{
    pthread_mutex_lock(&c->mu);
    while (flock(c->lock_fd, LOCK_EX) != 0) {
        if (errno == EINTR)
            continue;
        int e = errno;
        pthread_mutex_unlock(&c->mu);
        return dh__set_error(-e, "cache %s: cannot lock %s/cache.lock: %s", c->dir, c->dir,
                             strerror(e));
    }
    return 0;
}

void dh__cache_unlock(dh__cache_t *c)
{
    flock(c->lock_fd, LOCK_UN);
    pthread_mutex_unlock(&c->mu);
}

int dh__cache_used_read(dh__cache_t *c, uint64_t *used)
{
    unsigned char rec[16];
    ssize_t n = pread(c->lock_fd, rec, sizeof rec, 0);
    if (n < 0)
        return dh__set_error(-errno, "cache %s: cannot read %s/cache.lock: %s", c->dir, c->dir,
                             strerror(errno));
    if (n == (ssize_t)sizeof rec && memcmp(rec, lock_magic, 8) == 0) {
        memcpy(used, rec + 8, 8);
        return 0;
    }
    return dh__cache_scan(c, used); /* a new directory, or a record cut short by a crash */
}

int dh__cache_used_write(dh__cache_t *c, uint64_t used)
{
    unsigned char rec[DH__CACHE_LOCK_BYTES] = {0};
    memcpy(rec, lock_magic, 8);
    memcpy(rec + 8, &used, 8);
    ssize_t n = pwrite(c->lock_fd, rec, sizeof rec, 0);
    if (n != (ssize_t)sizeof rec)
        return dh__set_error(n < 0 ? -errno : -EIO, "cache %s: cannot write %s/cache.lock: %s",
                             c->dir, c->dir, n < 0 ? strerror(errno) : "short write");
    return 0;
}

static int cand_cmp(const void *a, const void *b)
{
    const dh__cache_cand_t *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns)
        return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cand_reserve(dh__cache_t *c, size_t count)
{
    if (count <= c->cand_cap)
        return 0;
    size_t cap = c->cand_cap ? c->cand_cap * 2 : 64;
    while (cap < count)
        cap *= 2;
    dh__cache_cand_t *grown = dh_realloc(c->cand, cap * sizeof *grown);
    if (!grown)
        return dh__set_error(DH_ENOMEM, "cache %s: out of memory for %zu blocks' records", c->dir,
                             count);
    c->cand = grown;
    c->cand_cap = cap;
    return 0;
}

static bool is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* A temporary file "t-HEX32-RESERVED-PID-SEQ": its reservation, or 0 if not one of ours. */
static uint64_t tmp_reserved(const char *name)
{
    if (strncmp(name, "t-", 2) != 0 || strlen(name) < 36 || !is_hex(name + 2, 32) ||
        name[34] != '-')
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(name + 35, &end, 10);
    return errno == 0 && end && *end == '-' ? (uint64_t)v : 0;
}

/* Deletes a temporary file whose writer is gone: nobody holds its flock (a writer takes it
 * under the directory's lock, which the scan holds, before anyone can see the file). Returns
 * 1 when deleted, 0 when a writer lives (or the file is gone), -errno. */
static int sweep_tmp(dh__cache_t *c, const char *name)
{
    int fd = openat(c->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT ? 0
                               : dh__set_error(-errno, "cache %s: cannot open %s/%s: %s", c->dir,
                                               c->dir, name, strerror(errno));
    int rc = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        if (unlinkat(c->dir_fd, name, 0) == 0) {
            atomic_fetch_add(&c->swept, 1);
            rc = 1;
        } else if (errno != ENOENT) {
            rc = dh__set_error(-errno, "cache %s: cannot delete %s/%s: %s", c->dir, c->dir, name,
                               strerror(errno));
        }
    } else if (errno != EWOULDBLOCK) {
        rc = dh__set_error(-errno, "cache %s: cannot lock %s/%s: %s", c->dir, c->dir, name,
                           strerror(errno));
    }
    close(fd);
    return rc;
}

int dh__cache_scan(dh__cache_t *c, uint64_t *used)
{
    int fd = openat(c->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return dh__set_error(-e, "cache %s: cannot list the directory: %s", c->dir, strerror(e));
    }
    uint64_t total = DH__CACHE_LOCK_BYTES;
    c->cand_next = c->cand_count = 0;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        const char *name = e->d_name;
        uint64_t reserved = tmp_reserved(name);
        if (reserved) {
            int swept = sweep_tmp(c, name);
            if (swept < 0)
                rc = swept;
            else if (swept == 0 && faccessat(c->dir_fd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
                total += reserved; /* a writer in flight, in this process or another */
            continue;
        }
        if (strlen(name) != DH__CACHE_NAME_BYTES - 1 || strncmp(name, "b-", 2) != 0 ||
            !is_hex(name + 2, 32))
            continue; /* not the cache's: neither counted nor touched */
        struct stat st;
        if (fstatat(c->dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (st.st_size < DH__CACHE_HEADER_BYTES) { /* cut short: a corrupt block */
            if (unlinkat(c->dir_fd, name, 0) == 0)
                atomic_fetch_add(&c->corrupt, 1);
            continue;
        }
        if ((rc = cand_reserve(c, c->cand_count + 1)))
            break;
        dh__cache_cand_t *k = &c->cand[c->cand_count++];
        memcpy(k->name, name, DH__CACHE_NAME_BYTES);
        k->size = (uint64_t)st.st_size;
        k->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        k->ino = st.st_ino;
        total += k->size;
    }
    closedir(d);
    if (rc == 0) /* the room kept for the writes in flight */
        rc = cand_reserve(c, c->cand_count + c->cand_pending);
    if (rc)
        return rc;
    if (c->cand_count > 1)
        qsort(c->cand, c->cand_count, sizeof *c->cand, cand_cmp);
    *used = total;
    return dh__cache_used_write(c, total);
}

int dh__cache_cand_room(dh__cache_t *c)
{
    if (c->cand_next > 0 && c->cand_count + c->cand_pending >= c->cand_cap) {
        /* reuse the evicted prefix */
        memmove(c->cand, c->cand + c->cand_next, (c->cand_count - c->cand_next) * sizeof *c->cand);
        c->cand_count -= c->cand_next;
        c->cand_next = 0;
    }
    return cand_reserve(c, c->cand_count + c->cand_pending + 1);
}

void dh__cache_cand_add(dh__cache_t *c, const char *name, uint64_t size, int64_t mtime_ns,
                        ino_t ino)
{
    assert(c->cand_count < c->cand_cap); /* kept by dh__cache_cand_room */
    dh__cache_cand_t *k = &c->cand[c->cand_count];
    memcpy(k->name, name, DH__CACHE_NAME_BYTES);
    k->size = size;
    k->mtime_ns = mtime_ns;
    k->ino = ino;
    /* Normally the newest; another thread's stamp may be a little later: keep the order. */
    size_t i = c->cand_count++;
    while (i > c->cand_next && cand_cmp(&c->cand[i - 1], &c->cand[i]) > 0) {
        dh__cache_cand_t t = c->cand[i - 1];
        c->cand[i - 1] = c->cand[i];
        c->cand[i] = t;
        i--;
    }
}

/* Puts a candidate touched since it was listed back at its new time (binary search, then a
 * move of the records after it). */
static void cand_requeue(dh__cache_t *c, dh__cache_cand_t k)
{
    size_t lo = c->cand_next, hi = c->cand_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cand_cmp(&c->cand[mid], &k) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* cand_next was advanced past k's old slot, so there is room before it. */
    memmove(&c->cand[c->cand_next - 1], &c->cand[c->cand_next], (lo - c->cand_next) * sizeof k);
    c->cand[lo - 1] = k;
    c->cand_next--;
}

int dh__cache_make_room(dh__cache_t *c, uint64_t need, uint64_t *used)
{
    bool rescanned = false;
    while (*used + need > c->bytes_max) {
        if (c->cand_next == c->cand_count) {
            if (rescanned)
                return dh__set_error(DH_EAGAIN,
                                     "cache %s: no room for a block of %" PRIu64 " bytes: %" PRIu64
                                     " of %" PRIu64 " bytes held by writes in flight",
                                     c->dir, need, *used, c->bytes_max);
            int rc = dh__cache_scan(c, used);
            if (rc)
                return rc;
            rescanned = true;
            continue;
        }
        dh__cache_cand_t k = c->cand[c->cand_next++];
        struct stat st;
        if (fstatat(c->dir_fd, k.name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* evicted by another process, which counted it */
        int64_t mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        if (st.st_ino != k.ino || (uint64_t)st.st_size != k.size) {
            continue; /* replaced by another process: found at the next scan */
        }
        if (mtime_ns != k.mtime_ns) { /* used since it was listed: not the oldest any more */
            k.mtime_ns = mtime_ns;
            cand_requeue(c, k);
            continue;
        }
        if (unlinkat(c->dir_fd, k.name, 0) != 0) {
            if (errno == ENOENT)
                continue;
            return dh__set_error(-errno, "cache %s: cannot evict %s/%s: %s", c->dir, c->dir, k.name,
                                 strerror(errno));
        }
        atomic_fetch_add(&c->evictions, 1);
        *used = *used > k.size ? *used - k.size : 0;
    }
    return 0;
}
