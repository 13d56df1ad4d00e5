/* shm.h: the shared-memory arena of a local DataServer (docs/design.md §5, docs/shared-memory.md).
 *
 * An arena is one memfd of a fixed size, mapped MAP_SHARED by the DataServer that made it
 * (the *creator*) and by its clients (*attachers*), who get the fd over a Unix socket
 * (dh_shm_send_fd / dh_shm_recv_fd) or by inheritance. It holds a header page, a table of
 * per-allocation records, and fixed-size slabs. A batch is placed in ceil(len / slab_size)
 * contiguous slabs; only a small handle (arena id, offset, length, generation) travels in
 * messages, and the receiver resolves it to a pointer after validating it.
 *
 * Lifetime: the creator allocates (one owner thread). Each allocation carries an atomic
 * reference count in shared memory; anyone (any attached process, any thread) refs and
 * unrefs it, lock-free. When the count reaches 0 the slabs become reclaimable, and the
 * creator reclaims them on its next allocation or dh_shm_arena_collect(). Each allocation
 * names one holder pid; dh_shm_arena_reclaim_dead() drops the references of holders that
 * have died. A full arena is backpressure (DH_EAGAIN), never a crash and never a wait.
 *
 * Threading: an arena object may be used from several threads for dh_shm_arena_ref,
 * _ref_for, _unref, _refcount, _resolve, _stats, _fd (they read immutable
 * fields and shared atomics). dh_shm_arena_alloc, _collect, _reclaim_dead and _destroy
 * belong to the creator's owner thread. Linux only (memfd_create, file seals).
 */
#ifndef DATAHELIX_SHM_H
#define DATAHELIX_SHM_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Slab size used when dh_shm_arena_new is given 0. */
#define DH_SHM_DEFAULT_SLAB_SIZE ((size_t)1 << 20)

/* Layout version written in the header; attach refuses any other. */
#define DH_SHM_VERSION 1u

/* A reference to one allocation, small enough to travel in a message (plain data, 32 bytes,
 * native byte order: both ends are on one machine). A receiver must validate it with
 * dh_shm_arena_resolve (or _ref/_unref, which validate too) before use. */
typedef struct dh_shm_handle {
    uint64_t arena_id;   /* random id of the arena, chosen at creation */
    uint64_t offset;     /* bytes from the start of the mapping to the first slab */
    uint64_t length;     /* bytes requested at allocation (<= slabs x slab_size) */
    uint64_t generation; /* allocation number in this arena (>= 1); detects reuse */
} dh_shm_handle_t;

typedef struct dh_shm_arena_stats {
    uint64_t size_bytes;              /* whole memfd, header included */
    uint64_t slab_size;               /* bytes per slab */
    uint64_t slabs_total;             /* slabs in the arena */
    uint64_t slabs_used;              /* slabs in allocations not yet collected */
    uint64_t slabs_reclaimable;       /* of slabs_used, those whose count reached 0 */
    uint64_t allocations_live;        /* allocations with a reference count > 0 */
    uint64_t allocations_reclaimable; /* allocations at count 0, not yet collected */
} dh_shm_arena_stats_t;

typedef struct dh_shm_arena dh_shm_arena_t;

/* Creates an arena of `size` bytes (header included) in a new memfd, sealed against
 * shrinking and growing. The memfd is sparse: its slabs' memory is reserved (fallocate) as
 * allocations first reach them, so a large arena costs memory only as far as it is used,
 * and touching an allocated slab cannot fault for lack of memory (dh_shm_arena_alloc
 * fails with DH_EAGAIN instead). slab_size: bytes per slab, a multiple of the page
 * size (0 = DH_SHM_DEFAULT_SLAB_SIZE); the arena holds as many slabs as fit after the
 * header and records. The caller becomes the creator and the only allocator.
 * Returns 0, DH_EINVAL (slab_size not a page multiple, size too small for one slab or too
 * large; the message says which), -errno from memfd_create/ftruncate/fallocate/mmap
 * (-ENOSPC / -ENOMEM: not enough memory for the header and records), or DH_ENOMEM.
 * *out is the caller's (dh_shm_arena_destroy); NULL on failure. Thread-safe. */
DH_EXTERN int dh_shm_arena_new(dh_shm_arena_t **out, size_t size, size_t slab_size);

/* Attaches to an arena made by another process (or this one) from an fd of its memfd.
 * The fd is duplicated (close-on-exec): the caller keeps and closes its own. The header is
 * copied and validated before use: seals (must forbid shrinking), magic, version, size vs
 * fstat, slab size, slab count and table offsets vs the layout they imply.
 * Returns 0, -errno (bad fd: -EBADF; dup or mmap failure), DH_EINVAL (not a memfd, or
 * not sealed against shrinking), DH_EPARSE (too small, or a header field is wrong; the
 * message names the field and both values), or DH_ENOMEM.
 * *out is the caller's (dh_shm_arena_destroy); NULL on failure. Thread-safe. */
DH_EXTERN int dh_shm_arena_attach(dh_shm_arena_t **out, int fd);

/* Unmaps the arena and closes its fd; sets *arena = NULL. Safe on NULL. Does not touch
 * reference counts: other processes' mappings stay valid, and the memory is freed by the
 * kernel when the last mapping and fd are gone. Pointers from _resolve become invalid in
 * this process. Owner thread only. */
DH_EXTERN void dh_shm_arena_destroy(dh_shm_arena_t **arena);

/* The arena's memfd, to send to a client (dh_shm_send_fd). Borrowed: closed by _destroy. */
DH_EXTERN int dh_shm_arena_fd(const dh_shm_arena_t *arena);

/* The arena's random id (what handles carry in arena_id). Thread-safe. */
DH_EXTERN uint64_t dh_shm_arena_id(const dh_shm_arena_t *arena);

/* Creator only. Allocates ceil(len / slab_size) contiguous slabs, first fit from the start
 * of the arena, after reclaiming released allocations if any are pending. The allocation
 * starts with a reference count of 1, held by holder_pid (the client the batch goes to;
 * 0 = no holder, never reclaimed by _reclaim_dead). Fills *handle and *ptr (the first
 * slab, page-aligned, not zeroed).
 * Returns 0, DH_EAGAIN (no run of free slabs is long enough now, or the machine has no
 * memory to reserve slabs never used before: backpressure; retry after clients unref),
 * DH_ERANGE (len exceeds the whole arena, so waiting cannot help), or
 * DH_EINVAL (len == 0). Never blocks. Owner thread only. Cost: O(slabs) bitmap scan. */
DH_EXTERN int dh_shm_arena_alloc(dh_shm_arena_t *arena, size_t len, pid_t holder_pid,
                                 dh_shm_handle_t *handle, void **ptr);

/* Validates a handle (usually received from another process) and returns a pointer to its
 * first byte in this process's mapping. Checks: arena id, offset inside the slab area and
 * on a slab boundary, offset + length inside the arena, a live allocation starting there,
 * same generation, same length, count > 0. The pointer is valid for handle->length bytes
 * while the caller holds a reference. Returns 0, DH_EINVAL (not a handle of this arena:
 * wrong arena id, unaligned, inside the header, no allocation starts there, length
 * mismatch), DH_ERANGE (offset or length past the end), or -ESTALE (the allocation was
 * released, or the slabs were reused: generation mismatch). The message names the check.
 * Thread-safe, lock-free. */
DH_EXTERN int dh_shm_arena_resolve(const dh_shm_arena_t *arena, const dh_shm_handle_t *handle,
                                   void **ptr);

/* Adds one reference to a live allocation. Fails with -ESTALE once the count has reached 0
 * (a released allocation cannot be revived), DH_ERANGE if the count would exceed
 * INT32_MAX, or as _resolve for a bad handle. Thread-safe, lock-free, any process. */
DH_EXTERN int dh_shm_arena_ref(dh_shm_arena_t *arena, const dh_shm_handle_t *handle);

/* As dh_shm_arena_ref, and makes `pid` the allocation's holder (one holder per allocation:
 * the last _ref_for wins). Use it when a batch is handed to another client. */
DH_EXTERN int dh_shm_arena_ref_for(dh_shm_arena_t *arena, const dh_shm_handle_t *handle, pid_t pid);

/* Drops one reference. When the count reaches 0 the allocation is released: its slabs are
 * reclaimable by the creator's next _alloc or _collect, and the handle goes stale.
 * Returns 0, -ESTALE (count already 0 or slabs reused), or as _resolve for a bad handle.
 * Thread-safe, lock-free, any process. */
DH_EXTERN int dh_shm_arena_unref(dh_shm_arena_t *arena, const dh_shm_handle_t *handle);

/* The allocation's current reference count (>= 1), or a negative code as _resolve (-ESTALE
 * once released). A snapshot: other processes may change it at once. Thread-safe. */
DH_EXTERN int dh_shm_arena_refcount(const dh_shm_arena_t *arena, const dh_shm_handle_t *handle);

/* Creator only. Returns the slabs of every released allocation (count 0) to the free map.
 * Returns the bytes reclaimed (slabs x slab_size). Owner thread only. Cost: O(slabs). */
DH_EXTERN uint64_t dh_shm_arena_collect(dh_shm_arena_t *arena);

/* Creator only. For each live allocation whose holder pid no longer exists
 * (kill(pid, 0) fails with ESRCH), drops all its references, then collects. Returns the
 * number of allocations dropped. Limits: a dead child that is not yet reaped (zombie)
 * still exists; a recycled pid looks alive; the creator itself is never dead.
 * Owner thread only. Cost: O(slabs) plus one kill() per live allocation. */
DH_EXTERN size_t dh_shm_arena_reclaim_dead(dh_shm_arena_t *arena);

/* Fills *stats from the shared records (atomic snapshots; may be slightly inconsistent
 * while other processes ref/unref). Thread-safe, any process. Cost: O(slabs). */
DH_EXTERN void dh_shm_arena_stats(const dh_shm_arena_t *arena, dh_shm_arena_stats_t *stats);

/* This process's mapping of the whole arena: *base and *size (header included). A pointer
 * from _resolve lies in [base, base + size). Thread-safe. */
DH_EXTERN void dh_shm_arena_mapping(const dh_shm_arena_t *arena, const void **base, size_t *size);

/* Sends fd over a connected AF_UNIX socket (SCM_RIGHTS, with one data byte). The caller
 * keeps its fd. Returns 0 or -errno (-EPIPE if the peer is gone; no SIGPIPE). Retries on
 * EINTR. Thread-safe. */
DH_EXTERN int dh_shm_send_fd(int sock, int fd);

/* Receives one fd sent by dh_shm_send_fd (close-on-exec). *fd is the caller's to close.
 * Returns 0, DH_EEOF (peer closed), DH_EPARSE (a message without exactly one fd; any fds it
 * carried are closed), or -errno. Blocks until a message arrives (use a non-blocking
 * socket to get -EAGAIN). Thread-safe. */
DH_EXTERN int dh_shm_recv_fd(int sock, int *fd);

#ifdef __cplusplus
}
#endif
#endif
