/* remote/cache_internal.h: the bounded local cache of remote byte ranges (docs/remote.md,
 * "The local cache"), internal to src/remote/ and its tests.
 *
 * A cache is a directory of fixed-size blocks of remote objects, one file per block, shared
 * by every process of the host that opens it (several DataServers on one --cache-dir). A
 * block is named by the SHA-256 of its key (the object: URL and identity, e.g. size and
 * ETag), the block size and its index; the file holds a header (the key, the index, the
 * length, a checksum of the data) and the data. The total size of the directory's files
 * never exceeds bytes_max: a writer reserves its block's bytes under the directory's lock
 * file (flock), evicting the least recently used blocks first, writes a temporary file
 * outside the lock and renames it into place under the lock, so a reader sees a whole
 * block or none. Recency is the block file's modification time, set on insert and on every
 * hit, so it survives restarts; open() recounts the directory and removes the temporary
 * files of crashed writers. Files: cache.c (open, get, put, the block format),
 * cache_space.c (the lock, reservation, eviction, the directory scan).
 */
#ifndef DH_REMOTE_CACHE_INTERNAL_H
#define DH_REMOTE_CACHE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The longest key, in bytes: a URL without its query plus an identity. */
#define DH__CACHE_KEY_MAX 2048
/* The lock file's size, counted against bytes_max like the blocks. */
#define DH__CACHE_LOCK_BYTES 64
/* A block file's fixed header, before the key and the data. */
#define DH__CACHE_HEADER_BYTES 48
/* Block file names: "b-" and 32 hex digits (128 bits of the SHA-256). */
#define DH__CACHE_NAME_BYTES 35

typedef struct dh__cache dh__cache_t;

typedef struct dh__cache_stats {
    /* This object's counters since open (not the other processes'). */
    uint64_t hits;      /* get() found the whole, checked block */
    uint64_t misses;    /* get() found no block, a foreign one, or a corrupt one */
    uint64_t inserts;   /* put() made a block file */
    uint64_t evictions; /* blocks this object deleted to make room */
    uint64_t corrupt;   /* blocks found corrupt (wrong size, header or checksum), deleted */
    uint64_t swept;     /* temporary files of crashed writers deleted */
    /* The directory's, shared by every process (read under the lock): */
    uint64_t bytes;     /* bytes held: block files, reservations of writes in flight, the
                         * lock file */
    uint64_t bytes_max; /* this object's bound */
} dh__cache_stats_t;

/* A write in flight (put's steps, for a writer that streams its block): its reserved
 * temporary file, locked by this process until committed or abandoned. */
typedef struct dh__cache_write {
    int fd;                              /* the temporary file, open for writing */
    char name[DH__CACHE_NAME_BYTES + 1]; /* the block file it becomes */
    char tmp_name[DH__CACHE_NAME_BYTES + 64];
    uint64_t reserved; /* its file's size: header, key and data */
    size_t len;        /* the data's bytes */
} dh__cache_write_t;

/* Opens (creating it and its parents when missing) the cache directory `dir`, bounded to
 * bytes_max bytes of files, with blocks of block_bytes. Under the directory's lock, it
 * counts the blocks, deletes the temporary files of writers that are gone and truncated
 * blocks, and evicts the least recently used blocks while the total is over bytes_max (a
 * smaller bound than last time). Processes sharing a directory should use the same
 * block_bytes (blocks of other sizes are other blocks, evicted in turn) and bytes_max
 * (each enforces its own at its inserts). Returns 0 and *out (the caller's:
 * dh__cache_close), DH_EINVAL (bytes_max below one block of the longest key, block_bytes 0
 * or over 1 GiB), -errno naming the directory or file that cannot be made, written or
 * locked, DH_ENOMEM. The object is thread-safe. */
int dh__cache_open(dh__cache_t **out, const char *dir, uint64_t bytes_max, size_t block_bytes);

/* Closes the cache (its files stay). Safe on NULL; sets *c = NULL. */
void dh__cache_close(dh__cache_t **c);

/* The block of `key` with index block_index: copies its data (at most block_bytes) into
 * buf and sets *len. Returns 1 (a hit: the block marked most recently used), 0 (a miss: no
 * block; or a block of another key under the same name; or a corrupt block, which is
 * deleted), or -errno naming the file that cannot be read. A block being evicted or
 * replaced while it is read is read whole from the file opened, or missed. key: at most
 * DH__CACHE_KEY_MAX bytes. Thread-safe. */
int dh__cache_get(dh__cache_t *c, const char *key, uint64_t block_index, void *buf, size_t *len);

/* Stores len bytes (1..block_bytes) of data as the block `key`/block_index, evicting the
 * least recently used blocks first so that the directory stays within bytes_max. A block
 * already there (put by another process meanwhile) is kept. Returns 0, DH_EAGAIN (no room:
 * the rest of the bound is reserved by other writes in flight; nothing stored), or -errno
 * naming the file that cannot be written, renamed or locked (nothing stored, the
 * reservation given back). Thread-safe. */
int dh__cache_put(dh__cache_t *c, const char *key, uint64_t block_index, const void *data,
                  size_t len);

/* put's steps. reserve: room for a block of len bytes, and its temporary file (w->fd),
 * locked by this object. commit (with reserve's key and block_index): writes data (len
 * bytes) into it and renames it into place.
 * abandon: deletes the file and gives the room back. commit and abandon close w->fd, and
 * one of them must follow a reserve that returned 0. A process that dies between them
 * leaves a temporary file that the next open, or the next scan, deletes. Returns as put. */
int dh__cache_reserve(dh__cache_t *c, const char *key, uint64_t block_index, size_t len,
                      dh__cache_write_t *w);
int dh__cache_commit(dh__cache_t *c, const char *key, uint64_t block_index, const void *data,
                     dh__cache_write_t *w);
void dh__cache_abandon(dh__cache_t *c, dh__cache_write_t *w);

/* The counters, and the directory's bytes read under its lock. Returns 0 or -errno naming
 * the lock file. */
int dh__cache_stats(dh__cache_t *c, dh__cache_stats_t *out);

size_t dh__cache_block_bytes(const dh__cache_t *c);
/* The directory, borrowed for the cache's life. */
const char *dh__cache_dir(const dh__cache_t *c);

/* ---- between cache.c and cache_space.c ---- */

typedef struct dh__cache_cand {
    char name[DH__CACHE_NAME_BYTES + 1];
    uint64_t size;
    int64_t mtime_ns;
    ino_t ino;
} dh__cache_cand_t;

struct dh__cache {
    char *dir;
    int dir_fd;  /* the directory, for the *at() calls */
    int lock_fd; /* DIR/cache.lock: flock'd exclusively around every change of the files */
    uint64_t bytes_max;
    size_t block_bytes;
    /* Threads of this process: flock is per open file, so they take this first. It also
     * guards the candidates. */
    pthread_mutex_t mu;
    /* Eviction candidates, oldest first, from the last scan plus this object's inserts;
     * each is checked (inode, size, time) before it is deleted. [next, count) are left. */
    dh__cache_cand_t *cand;
    size_t cand_next, cand_count, cand_cap;
    /* Writes in flight (reserved, not yet committed or abandoned): the candidates keep room
     * for each, so that a commit never allocates (an allocation fails a reservation, before
     * anything is made: DH_ENOMEM). */
    size_t cand_pending;
    atomic_uint_fast64_t hits, misses, inserts, evictions, corrupt, swept;
};

/* Takes the directory's lock (the mutex, then flock). Returns 0 or -errno naming the lock
 * file (the mutex released again). */
int dh__cache_lock(dh__cache_t *c);
void dh__cache_unlock(dh__cache_t *c);
/* Under the lock: the bytes the lock file records, or the scan's count where the record is
 * missing or malformed. Returns 0 or -errno naming the file. */
int dh__cache_used_read(dh__cache_t *c, uint64_t *used);
int dh__cache_used_write(dh__cache_t *c, uint64_t used);
/* Under the lock: lists the directory: the blocks become the candidates (oldest first),
 * the temporary files of dead writers and truncated blocks are deleted, and the bytes of
 * blocks, live reservations and the lock file are recorded as used (*used). Returns 0 or
 * -errno naming the directory. */
int dh__cache_scan(dh__cache_t *c, uint64_t *used);
/* Under the lock: evicts least recently used blocks until used + need <= bytes_max
 * (rescanning once when the candidates run out). Returns 0, or DH_EAGAIN naming what
 * holds the rest. */
int dh__cache_make_room(dh__cache_t *c, uint64_t need, uint64_t *used);
/* Under the lock: room in the candidates for one more write in flight (cand_pending + 1).
 * Returns 0 or DH_ENOMEM. */
int dh__cache_cand_room(dh__cache_t *c);
/* Under the lock: adds a block just made (the newest) to the candidates, in the room
 * dh__cache_cand_room kept for it. */
void dh__cache_cand_add(dh__cache_t *c, const char *name, uint64_t size, int64_t mtime_ns,
                        ino_t ino);
/* A strictly increasing wall-clock time in ns for this process's recency stamps. */
int64_t dh__cache_now_ns(void);

#endif
