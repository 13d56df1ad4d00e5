/* cache_test_util.h: helpers of the local cache's tests (test_cache*.c): block contents
 * derived from the key, and the directory's files counted as the bound counts them. */
#ifndef DH_TEST_CACHE_UTIL_H
#define DH_TEST_CACHE_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "remote/cache_internal.h"

/* The block of key number `k`, index `i`: a length in [1, block_bytes] and bytes that both
 * follow from (k, i), so any reader can tell a wrong block from the right one. */
static inline size_t block_fill(unsigned k, uint64_t i, size_t block_bytes, unsigned char *out)
{
    uint64_t s = (k + 1) * 0x9E3779B97F4A7C15ULL ^ (i + 7) * 0xBF58476D1CE4E5B9ULL;
    size_t len = 1 + (size_t)((s >> 7) % block_bytes);
    for (size_t j = 0; j < len; j++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out[j] = (unsigned char)s;
    }
    return len;
}

static inline void block_key(unsigned k, char *key, size_t cap)
{
    snprintf(key, cap, "https://example.test/bucket/clip-%u.mp4#size=%u", k, 1000000 + k);
}

/* The sizes of the directory's regular files (the lock file included); *tmps: how many of
 * them are temporary files ("t-..."). */
static inline uint64_t dir_total(const char *dir, int *tmps)
{
    DIR *d = opendir(dir);
    uint64_t total = 0;
    int t = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[2048];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            total += (uint64_t)st.st_size;
            t += strncmp(e->d_name, "t-", 2) == 0;
        }
    }
    if (d)
        closedir(d);
    if (tmps)
        *tmps = t;
    return total;
}

/* The same under the cache's lock: a consistent snapshot while other processes insert. */
static inline uint64_t dir_total_locked(const char *dir)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/cache.lock", dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || flock(fd, LOCK_EX) != 0)
        return UINT64_MAX;
    uint64_t total = dir_total(dir, NULL);
    flock(fd, LOCK_UN);
    close(fd);
    return total;
}

/* The bound for `blocks` blocks of block_bytes with keys of key_len bytes. */
static inline uint64_t bound_for(unsigned blocks, size_t block_bytes, size_t key_len)
{
    return DH__CACHE_LOCK_BYTES + blocks * (DH__CACHE_HEADER_BYTES + key_len + block_bytes);
}

#endif
