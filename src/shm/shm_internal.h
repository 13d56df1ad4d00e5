/* shm/shm_internal.h: the shared-memory layout of an arena (docs/shared-memory.md §1).
 *
 * Everything here lives in the memfd and is seen by several processes. Fields written once
 * by the creator before any other process can attach are plain; fields that change while
 * others are attached are C11 atomics (lock-free on every target we build for: checked by
 * static assertions in arena.c). Native byte order: all processes are on one machine.
 * The allocator's own state (which slabs are used, how many each allocation spans) is NOT
 * here: it is private to the creator, so a client that scribbles on the mapping can spoil
 * data and counts but cannot make the creator hand out overlapping slabs.
 * Tests include this file to forge bad headers. Private to src/shm (and its tests); what
 * other modules use is in shm/shm_lib.h.
 */
#ifndef DH_SHM_INTERNAL_H
#define DH_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "datahelix/shm.h"
#include "shm/shm_lib.h"

/* "DHSHMAR\1" read as a little-endian uint64 */
#define DH__SHM_MAGIC UINT64_C(0x0152414d48534844)

/* Records are one cache line each, so counts of neighbouring allocations refed from
 * different cores do not share a line. */
#define DH__SHM_RECORD_SIZE 64u

/* The header at offset 0. Immutable after creation except the atomics at the end. */
typedef struct dh__shm_header {
    uint64_t magic;          /* DH__SHM_MAGIC */
    uint32_t version;        /* DH_SHM_VERSION */
    uint32_t header_size;    /* sizeof(dh__shm_header_t) */
    uint64_t size;           /* bytes of the memfd */
    uint64_t slab_size;      /* bytes per slab, a page multiple */
    uint64_t slab_count;     /* slabs after the metadata */
    uint64_t page_size;      /* page size of the creator (all offsets are multiples) */
    uint64_t records_offset; /* slab_count records of DH__SHM_RECORD_SIZE bytes */
    uint64_t data_offset;    /* first slab; page-aligned */
    uint64_t arena_id;       /* random; copied into every handle */
    int64_t creator_pid;
    /* Changing while attached. Written by the creator except released_pending. */
    _Atomic uint64_t generation;       /* last allocation generation issued (0 = none) */
    _Atomic uint64_t released_pending; /* bumped by whoever drops a count to 0; the
                                          creator's next alloc collects when non-zero */
} dh__shm_header_t;

enum {
    DH__SHM_FREE = 0, /* no allocation starts at this slab */
    DH__SHM_LIVE = 1, /* an allocation starts here (its count may already be 0: released) */
};

/* One record per slab; only the record of an allocation's first slab is used.
 * refword = (low 32 bits of generation) << 32 | reference count, so that a ref or unref
 * through a stale handle cannot touch a reused record (the CAS compares both halves).
 * A count of 0 is the sticky "released" flag: ref refuses to raise it again. */
typedef struct dh__shm_record {
    _Atomic uint64_t refword;
    _Atomic uint64_t generation; /* full generation of the allocation */
    _Atomic uint64_t length;     /* bytes requested */
    _Atomic uint32_t span;       /* slabs covered */
    _Atomic uint32_t state;      /* DH__SHM_FREE / DH__SHM_LIVE, written by the creator */
    _Atomic int32_t holder_pid;  /* 0 = none */
    uint8_t reserved[DH__SHM_RECORD_SIZE - 36];
} dh__shm_record_t;

#define DH__SHM_REFWORD(generation, count)                                                         \
    (((uint64_t)(uint32_t)(generation) << 32) | (uint64_t)(uint32_t)(count))
#define DH__SHM_REFWORD_GEN(word) ((uint32_t)((word) >> 32))
#define DH__SHM_REFWORD_COUNT(word) ((uint32_t)(word))

/* The layout implied by (size, slab_size, page_size): what the creator writes and what an
 * attacher recomputes to check the header. Returns 0, or DH_EINVAL with a message. */
typedef struct dh__shm_layout {
    uint64_t size, slab_size, slab_count, page_size;
    uint64_t records_offset, data_offset;
} dh__shm_layout_t;

int dh__shm_layout(uint64_t size, uint64_t slab_size, uint64_t page_size, dh__shm_layout_t *layout);

/* Whether an arena of `size` bytes can be had, asked before anything is made. Returns 0, or
 * with a message naming the size and the limit: -EFBIG (over RLIMIT_FSIZE), DH_ENOMEM (over
 * RLIMIT_AS, the cgroup's memory limit, or MemAvailable + SwapFree). probe may be NULL. */
int dh__shm_check_size(uint64_t size, const dh__shm_probe_t *probe);

/* 1 if this object made the arena (may allocate), 0 if it attached. For tests. */
int dh__shm_arena_is_creator(const dh_shm_arena_t *arena);

#endif
