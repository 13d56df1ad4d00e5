/* remote/cache.c: the local cache's blocks (cache_internal.h; docs/remote.md, "The local
 * cache"): open and close, the block file format, get and put.
 *
 * A block file is a 48-byte header (magic, block size, index, data length, a 64-bit
 * checksum of the data, the key's length, a checksum of the header), the key and the data.
 * A reader checks all of it: a file of the wrong size, header or checksum is a corrupt
 * block, deleted and missed; one of another key under the same name (a hash collision) is
 * missed and left. A writer fills a temporary file and renames it into place under the
 * directory's lock (cache_space.c), so a reader opens a whole block or none, and one that
 * has it open keeps reading it whole when it is evicted or replaced. No fsync: a block cut
 * short by a power loss fails its checksum and is a miss.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "core/internal.h"
#include "remote/cache_internal.h"

static const char block_magic[8] = {'D', 'H', 'C', 'B', 'L', 'K', '1', '\n'};

/* A 64-bit checksum of the data: xxHash64's round over four independent lanes (32 bytes a
 * step, so the multiplies overlap), then its merge and avalanche. Not xxHash64's exact
 * value; only this file reads it. */
static uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL

static uint64_t round64(uint64_t acc, uint64_t w)
{
    return rotl64(acc + w * P2, 31) * P1;
}

static uint64_t checksum64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t lane[4] = {seed + P1 + P2, seed + P2, seed, seed - P1};
    size_t i = 0;
    for (; i + 32 <= len; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, 8);
            lane[k] = round64(lane[k], w);
        }
    uint64_t h = rotl64(lane[0], 1) + rotl64(lane[1], 7) + rotl64(lane[2], 12) +
                 rotl64(lane[3], 18) + (uint64_t)len;
    for (int k = 0; k < 4; k++)
        h = (h ^ round64(0, lane[k])) * P1 + P3;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = rotl64(h ^ round64(0, w), 27) * P1 + P3;
    }
    for (; i < len; i++)
        h = rotl64(h ^ (p[i] * P3), 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* "b-" and the first 128 bits of SHA-256(key, NUL, block_bytes, block_index) in hex. */
static int block_name(const dh__cache_t *c, const char *key, uint64_t block_index,
                      char name[DH__CACHE_NAME_BYTES + 1])
{
    size_t key_len = strlen(key);
    unsigned char in[DH__CACHE_KEY_MAX + 17], md[EVP_MAX_MD_SIZE];
    unsigned md_len = 0;
    uint64_t block_bytes = c->block_bytes;
    memcpy(in, key, key_len);
    in[key_len] = 0;
    memcpy(in + key_len + 1, &block_bytes, 8);
    memcpy(in + key_len + 9, &block_index, 8);
    if (!EVP_Digest(in, key_len + 17, md, &md_len, EVP_sha256(), NULL) || md_len < 16)
        return dh__set_error(DH_ENOMEM, "cache %s: SHA-256 of a block's key failed", c->dir);
    static const char hex[] = "0123456789abcdef";
    name[0] = 'b';
    name[1] = '-';
    for (int i = 0; i < 16; i++) {
        name[2 + 2 * i] = hex[md[i] >> 4];
        name[3 + 2 * i] = hex[md[i] & 15];
    }
    name[DH__CACHE_NAME_BYTES - 1] = 0;
    return 0;
}

static int check_key(const dh__cache_t *c, const char *key)
{
    size_t n = strlen(key);
    if (n == 0 || n > DH__CACHE_KEY_MAX)
        return dh__set_error(DH_EINVAL, "cache %s: a key of %zu bytes (1 to %d): %.80s", c->dir, n,
                             DH__CACHE_KEY_MAX, key);
    return 0;
}

static void header_encode(unsigned char h[DH__CACHE_HEADER_BYTES], uint64_t block_bytes,
                          uint64_t block_index, uint64_t data_len, uint64_t data_sum,
                          uint32_t key_len)
{
    memcpy(h, block_magic, 8);
    memcpy(h + 8, &block_bytes, 8);
    memcpy(h + 16, &block_index, 8);
    memcpy(h + 24, &data_len, 8);
    memcpy(h + 32, &data_sum, 8);
    memcpy(h + 40, &key_len, 4);
    uint32_t sum = (uint32_t)checksum64(h, 44, 1);
    memcpy(h + 44, &sum, 4);
}

static ssize_t read_full(int fd, void *buf, size_t n, off_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static int write_full(dh__cache_t *c, dh__cache_write_t *w, const void *buf, size_t n, off_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r;
        if (DH_FAULT(DH_FAULT_CACHE_WRITE)) {
            r = -1;
            errno = ENOSPC;
        } else {
            r = pwrite(w->fd, (const char *)buf + done, n - done, off + (off_t)done);
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return dh__set_error(r < 0 ? -errno : -EIO, "cache %s: cannot write %s/%s: %s", c->dir,
                                 c->dir, w->tmp_name, r < 0 ? strerror(errno) : "no progress");
        done += (size_t)r;
    }
    return 0;
}

int dh__cache_open(dh__cache_t **out, const char *dir, uint64_t bytes_max, size_t block_bytes)
{
    *out = NULL;
    if (!dir || !dir[0])
        return dh__set_error(DH_EINVAL, "cache: no directory");
    if (block_bytes == 0 || block_bytes > ((size_t)1 << 30))
        return dh__set_error(DH_EINVAL, "cache %s: a block of %zu bytes (1 to 1 GiB)", dir,
                             block_bytes);
    uint64_t least =
        DH__CACHE_LOCK_BYTES + DH__CACHE_HEADER_BYTES + DH__CACHE_KEY_MAX + (uint64_t)block_bytes;
    if (bytes_max < least)
        return dh__set_error(DH_EINVAL,
                             "cache %s: a bound of %" PRIu64
                             " bytes is below one block of %zu bytes with its header and "
                             "longest key (%" PRIu64 ")",
                             dir, bytes_max, block_bytes, least);
    dh__cache_t *c = dh_calloc(1, sizeof *c);
    if (!c)
        return dh__set_error(DH_ENOMEM, "cache %s: out of memory", dir);
    c->dir_fd = c->lock_fd = -1;
    c->bytes_max = bytes_max;
    c->block_bytes = block_bytes;
    pthread_mutex_init(&c->mu, NULL);
    int rc;
    if (!(c->dir = dh_strdup(dir))) {
        rc = dh__set_error(DH_ENOMEM, "cache %s: out of memory", dir);
        goto fail;
    }
    if ((rc = dh__make_dirs(dir)))
        goto fail;
    c->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dir_fd < 0) {
        rc = dh__set_error(-errno, "cache %s: cannot open the directory: %s", dir, strerror(errno));
        goto fail;
    }
    c->lock_fd = openat(c->dir_fd, "cache.lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (c->lock_fd < 0) {
        rc = dh__set_error(-errno, "cache %s: cannot open %s/cache.lock: %s", dir, dir,
                           strerror(errno));
        goto fail;
    }
    /* A directory we may open but not write (read-only mount, another user's): fail now,
     * naming it, rather than at every put. */
    char probe[64];
    snprintf(probe, sizeof probe, "w-probe-%d", (int)getpid());
    int pfd = openat(c->dir_fd, probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (pfd < 0) {
        rc = dh__set_error(-errno, "cache %s: cannot write in the directory: %s", dir,
                           strerror(errno));
        goto fail;
    }
    close(pfd);
    unlinkat(c->dir_fd, probe, 0);
    if ((rc = dh__cache_lock(c)))
        goto fail;
    uint64_t used = 0;
    rc = dh__cache_scan(c, &used);
    if (rc == 0) { /* a bound smaller than last time's */
        rc = dh__cache_make_room(c, 0, &used);
        if (rc == DH_EAGAIN) /* the rest held by other processes' writes: evicted later */
            rc = 0;
    }
    if (rc == 0)
        rc = dh__cache_used_write(c, used);
    dh__cache_unlock(c);
    if (rc)
        goto fail;
    *out = c;
    return 0;
fail:
    dh__cache_close(&c);
    return rc;
}

void dh__cache_close(dh__cache_t **p)
{
    dh__cache_t *c = *p;
    if (!c)
        return;
    if (c->lock_fd >= 0)
        close(c->lock_fd);
    if (c->dir_fd >= 0)
        close(c->dir_fd);
    pthread_mutex_destroy(&c->mu);
    dh_free(c->cand);
    dh_free(c->dir);
    dh_free(c);
    *p = NULL;
}

size_t dh__cache_block_bytes(const dh__cache_t *c)
{
    return c->block_bytes;
}

const char *dh__cache_dir(const dh__cache_t *c)
{
    return c->dir;
}

/* Deletes the corrupt block `name` if it is still the file read (read_st: its fstat), under
 * the lock, and recounts the directory: the record counted the block at the size it was
 * written, which a damaged file may no longer have. Corruption is rare, so the scan's
 * cost (a stat per file) is paid rarely. */
static void drop_corrupt(dh__cache_t *c, const char *name, const struct stat *read_st)
{
    atomic_fetch_add(&c->corrupt, 1);
    if (dh__cache_lock(c))
        return; /* left for the next reader */
    struct stat st;
    uint64_t used;
    if (fstatat(c->dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_ino == read_st->st_ino &&
        st.st_dev == read_st->st_dev && unlinkat(c->dir_fd, name, 0) == 0)
        (void)dh__cache_scan(c, &used);
    dh__cache_unlock(c);
}

int dh__cache_get(dh__cache_t *c, const char *key, uint64_t block_index, void *buf, size_t *len)
{
    *len = 0;
    char name[DH__CACHE_NAME_BYTES + 1];
    int rc = check_key(c, key);
    if (rc || (rc = block_name(c, key, block_index, name)))
        return rc;
    int fd = openat(c->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) {
            atomic_fetch_add(&c->misses, 1);
            return 0;
        }
        return dh__set_error(-errno, "cache %s: cannot open %s/%s: %s", c->dir, c->dir, name,
                             strerror(errno));
    }
    struct stat st;
    unsigned char h[DH__CACHE_HEADER_BYTES];
    char file_key[DH__CACHE_KEY_MAX];
    size_t key_len = strlen(key);
    bool corrupt = true;
    ssize_t n = fstat(fd, &st) == 0 ? read_full(fd, h, sizeof h, 0) : -errno;
    if (n < 0) {
        rc = dh__set_error((int)n, "cache %s: cannot read %s/%s: %s", c->dir, c->dir, name,
                           strerror((int)-n));
        close(fd);
        return rc;
    }
    uint64_t bb, index, data_len, data_sum;
    uint32_t klen, sum;
    memcpy(&bb, h + 8, 8);
    memcpy(&index, h + 16, 8);
    memcpy(&data_len, h + 24, 8);
    memcpy(&data_sum, h + 32, 8);
    memcpy(&klen, h + 40, 4);
    memcpy(&sum, h + 44, 4);
    if (n == (ssize_t)sizeof h && memcmp(h, block_magic, 8) == 0 &&
        sum == (uint32_t)checksum64(h, 44, 1) && bb == c->block_bytes && klen >= 1 &&
        klen <= DH__CACHE_KEY_MAX && data_len >= 1 && data_len <= c->block_bytes &&
        (uint64_t)st.st_size == DH__CACHE_HEADER_BYTES + klen + data_len) {
        n = read_full(fd, file_key, klen, DH__CACHE_HEADER_BYTES);
        if (n == (ssize_t)klen &&
            (klen != key_len || index != block_index || memcmp(file_key, key, klen) != 0)) {
            close(fd); /* another key's block under this name: not ours to judge */
            atomic_fetch_add(&c->misses, 1);
            return 0;
        }
        if (n == (ssize_t)klen)
            n = read_full(fd, buf, data_len, (off_t)(DH__CACHE_HEADER_BYTES + klen));
        if (n < 0) {
            rc = dh__set_error((int)n, "cache %s: cannot read %s/%s: %s", c->dir, c->dir, name,
                               strerror((int)-n));
            close(fd);
            return rc;
        }
        corrupt = n != (ssize_t)data_len || checksum64(buf, data_len, 0) != data_sum;
    }
    if (corrupt) {
        close(fd);
        drop_corrupt(c, name, &st);
        atomic_fetch_add(&c->misses, 1);
        return 0;
    }
    /* Most recently used now. Another user's file refuses (EPERM): it keeps its time. */
    int64_t now = dh__cache_now_ns();
    struct timespec ts[2] = {{now / 1000000000, now % 1000000000},
                             {now / 1000000000, now % 1000000000}};
    (void)futimens(fd, ts);
    close(fd);
    *len = (size_t)data_len;
    atomic_fetch_add(&c->hits, 1);
    return 1;
}

int dh__cache_reserve(dh__cache_t *c, const char *key, uint64_t block_index, size_t len,
                      dh__cache_write_t *w)
{
    assert(len >= 1 && len <= c->block_bytes);
    memset(w, 0, sizeof *w);
    w->fd = -1;
    int rc = check_key(c, key);
    if (rc || (rc = block_name(c, key, block_index, w->name)))
        return rc;
    w->len = len;
    w->reserved = DH__CACHE_HEADER_BYTES + strlen(key) + len;
    if ((rc = dh__cache_lock(c)))
        return rc;
    uint64_t used = 0;
    if ((rc = dh__cache_used_read(c, &used)) || (rc = dh__cache_make_room(c, w->reserved, &used)) ||
        (rc = dh__cache_cand_room(c)))
        goto out;
    /* Created and flock'd under the directory's lock: a scan never sees it unlocked while
     * its writer lives. The name is unique in this process (one counter for every object);
     * a process of another pid namespace with the same pid may hold it: then the next. */
    static atomic_uint_fast64_t tmp_seq;
    for (int tries = 0; tries < 64; tries++) {
        snprintf(w->tmp_name, sizeof w->tmp_name, "t-%s-%" PRIu64 "-%d-%" PRIuFAST64, w->name + 2,
                 w->reserved, (int)getpid(), (uint_fast64_t)atomic_fetch_add(&tmp_seq, 1));
        w->fd = openat(c->dir_fd, w->tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (w->fd >= 0 || errno != EEXIST)
            break;
    }
    if (w->fd < 0) {
        rc = dh__set_error(-errno, "cache %s: cannot create %s/%s: %s", c->dir, c->dir, w->tmp_name,
                           strerror(errno));
        goto out;
    }
    if (flock(w->fd, LOCK_EX | LOCK_NB) != 0) {
        rc = dh__set_error(-errno, "cache %s: cannot lock %s/%s: %s", c->dir, c->dir, w->tmp_name,
                           strerror(errno));
    } else {
        rc = dh__cache_used_write(c, used + w->reserved);
    }
    if (rc) {
        unlinkat(c->dir_fd, w->tmp_name, 0);
        close(w->fd);
        w->fd = -1;
    } else {
        c->cand_pending++;
    }
out:
    dh__cache_unlock(c);
    return rc;
}

void dh__cache_abandon(dh__cache_t *c, dh__cache_write_t *w)
{
    if (w->fd < 0)
        return;
    /* The caller's error stays this thread's last: this path sets none of its own. */
    pthread_mutex_lock(&c->mu);
    while (flock(c->lock_fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    uint64_t used;
    c->cand_pending--;
    if (unlinkat(c->dir_fd, w->tmp_name, 0) == 0) {
        unsigned char rec[16];
        if (pread(c->lock_fd, rec, sizeof rec, 0) == (ssize_t)sizeof rec) {
            memcpy(&used, rec + 8, 8);
            used = used > w->reserved ? used - w->reserved : 0;
            memcpy(rec + 8, &used, 8);
            (void)!pwrite(c->lock_fd, rec, sizeof rec, 0);
        }
    }
    flock(c->lock_fd, LOCK_UN);
    pthread_mutex_unlock(&c->mu);
    close(w->fd);
    w->fd = -1;
}

int dh__cache_commit(dh__cache_t *c, const char *key, uint64_t block_index, const void *data,
                     dh__cache_write_t *w)
{
    /* key and block_index: the reservation's (its header is written from them) */
    assert(w->fd >= 0);
    size_t key_len = strlen(key);
    unsigned char h[DH__CACHE_HEADER_BYTES];
    header_encode(h, c->block_bytes, block_index, w->len, checksum64(data, w->len, 0),
                  (uint32_t)key_len);
    int rc = write_full(c, w, h, sizeof h, 0);
    if (rc == 0)
        rc = write_full(c, w, key, key_len, DH__CACHE_HEADER_BYTES);
    if (rc == 0)
        rc = write_full(c, w, data, w->len, (off_t)(DH__CACHE_HEADER_BYTES + key_len));
    int64_t now = dh__cache_now_ns();
    struct timespec ts[2] = {{now / 1000000000, now % 1000000000},
                             {now / 1000000000, now % 1000000000}};
    if (rc == 0 && futimens(w->fd, ts) != 0)
        rc = dh__set_error(-errno, "cache %s: cannot set the time of %s/%s: %s", c->dir, c->dir,
                           w->tmp_name, strerror(errno));
    if (rc) {
        dh__cache_abandon(c, w);
        return rc;
    }
    if ((rc = dh__cache_lock(c))) {
        dh__cache_abandon(c, w);
        return rc;
    }
    struct stat st;
    uint64_t used = 0;
    bool placed = false;
    if ((rc = dh__cache_used_read(c, &used)))
        goto out;
    if (fstatat(c->dir_fd, w->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        /* Put meanwhile by another process or thread: keep that one. */
    } else if (DH_FAULT(DH_FAULT_CACHE_RENAME)) {
        rc = dh__set_error(-EIO, "cache %s: cannot rename %s/%s to %s: %s", c->dir, c->dir,
                           w->tmp_name, w->name, strerror(EIO));
    } else if (renameat(c->dir_fd, w->tmp_name, c->dir_fd, w->name) != 0) {
        rc = dh__set_error(-errno, "cache %s: cannot rename %s/%s to %s: %s", c->dir, c->dir,
                           w->tmp_name, w->name, strerror(errno));
    } else {
        placed = true;
    }
    if (!placed) {
        unlinkat(c->dir_fd, w->tmp_name, 0);
        used = used > w->reserved ? used - w->reserved : 0;
        int wrc = dh__cache_used_write(c, used);
        rc = rc ? rc : wrc;
    } else {
        struct stat nst;
        if (fstat(w->fd, &nst) == 0)
            dh__cache_cand_add(c, w->name, (uint64_t)nst.st_size, now, nst.st_ino);
        atomic_fetch_add(&c->inserts, 1);
    }
out:
    if (rc && !placed)
        unlinkat(c->dir_fd, w->tmp_name, 0);
    c->cand_pending--; /* after cand_add, which used the room this write kept */
    dh__cache_unlock(c);
    close(w->fd);
    w->fd = -1;
    return rc;
}

int dh__cache_put(dh__cache_t *c, const char *key, uint64_t block_index, const void *data,
                  size_t len)
{
    dh__cache_write_t w;
    int rc = dh__cache_reserve(c, key, block_index, len, &w);
    return rc ? rc : dh__cache_commit(c, key, block_index, data, &w);
}

int dh__cache_stats(dh__cache_t *c, dh__cache_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->hits = atomic_load(&c->hits);
    out->misses = atomic_load(&c->misses);
    out->inserts = atomic_load(&c->inserts);
    out->evictions = atomic_load(&c->evictions);
    out->corrupt = atomic_load(&c->corrupt);
    out->swept = atomic_load(&c->swept);
    out->bytes_max = c->bytes_max;
    int rc = dh__cache_lock(c);
    if (rc)
        return rc;
    rc = dh__cache_used_read(c, &out->bytes);
    dh__cache_unlock(c);
    return rc;
}
