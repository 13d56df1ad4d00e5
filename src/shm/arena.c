/* arena.c: the shared-memory arena (see shm.h, docs/shared-memory.md).
 *
 * One memfd: header, one record per slab, then the slabs. The creator alone allocates and
 * collects, from private state (a used-slab bitmap and a span per first slab), and mirrors
 * each allocation into the shared record of its first slab so that any process can
 * validate a handle and move the reference count. Counts are moved with a compare-and-swap
 * on a word that also holds the allocation's generation, so a stale handle can never move
 * the count of a newer allocation in the same slabs.
 *
 * Cost: alloc and collect scan the slabs (O(slabs), a few thousand for a GiB arena of
 * 1 MiB slabs, skipping 64 full slabs per word); ref/unref/resolve are O(1) and lock-free.
 *
 * Memory: the memfd is sparse. Creation reserves (fallocate) only the header and records;
 * an allocation reserves the slabs up to its end the first time the arena reaches that far
 * (a high-water mark: first fit keeps allocations low, so this is one call per new high),
 * so a large arena costs memory only as far as it has been used, and a machine short of
 * memory still fails with an error at allocation (backpressure), never a SIGBUS on touch.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/rng.h"
#include "datahelix/shm.h"
#include "core/internal.h"
#include "shm/shm_internal.h"

/* Shared counts must be lock-free: a lock inside shared memory would stay held by a
 * killed process. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2,
               "64-bit atomics must be lock-free for the shared arena");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");
_Static_assert(sizeof(dh__shm_record_t) == DH__SHM_RECORD_SIZE, "record is one cache line");
_Static_assert(sizeof(dh_shm_handle_t) == 32, "handle is 32 bytes of plain data");

/* At most this many slabs, so indexes, spans and counts fit in 32 bits. */
#define MAX_SLABS ((uint64_t)INT32_MAX)
/* Sizes above this are refused (far beyond any machine's memory; keeps sums exact). */
#define MAX_SIZE ((uint64_t)1 << 50)

struct dh_shm_arena {
    int fd;
    bool creator;
    uint8_t *base;
    dh__shm_layout_t layout; /* private copy: never re-read from the shared header */
    uint64_t arena_id;
    dh__shm_header_t *header;
    dh__shm_record_t *records;
    /* Creator only: the allocator's private state. */
    uint64_t *used;      /* bit i set = slab i belongs to an allocation */
    uint32_t *span;      /* span[i] = slabs of the allocation starting at i, 0 = none */
    uint64_t generation; /* last generation issued */
    uint64_t reserved;   /* bytes of the memfd reserved so far, from offset 0 */
};

/* A numbered fault site (fault.h) that fails as the call after it would: sets errno to e and
 * returns 1 when the test armed `site` to fail now. */
static int fault_errno(int site, int e)
{
    if (!DH_FAULT(site))
        return 0;
    errno = e;
    return 1;
}

static uint64_t round_up(uint64_t x, uint64_t multiple)
{
    return (x + multiple - 1) / multiple * multiple;
}

static uint64_t data_offset_for(uint64_t records_offset, uint64_t slabs, uint64_t page_size)
{
    return round_up(records_offset + slabs * DH__SHM_RECORD_SIZE, page_size);
}

int dh__shm_layout(uint64_t size, uint64_t slab_size, uint64_t page_size, dh__shm_layout_t *layout)
{
    memset(layout, 0, sizeof *layout);
    if (page_size == 0 || (page_size & (page_size - 1)) != 0)
        return dh__set_error(DH_EINVAL, "shm arena: page size %" PRIu64 " is not a power of 2",
                             page_size);
    if (slab_size == 0 || slab_size % page_size != 0 || slab_size > MAX_SIZE)
        return dh__set_error(DH_EINVAL,
                             "shm arena: slab size %" PRIu64
                             " is not a positive multiple of the page size %" PRIu64,
                             slab_size, page_size);
    if (size > MAX_SIZE)
        return dh__set_error(DH_EINVAL, "shm arena: size %" PRIu64 " exceeds the limit %" PRIu64,
                             size, MAX_SIZE);
    uint64_t records_offset = round_up(sizeof(dh__shm_header_t), DH__SHM_RECORD_SIZE);
    /* Each slab costs slab_size plus its record, so this is an upper bound; the page
     * rounding of the data offset may take a slab or two back. */
    uint64_t slabs =
        size > records_offset ? (size - records_offset) / (slab_size + DH__SHM_RECORD_SIZE) : 0;
    if (slabs > MAX_SLABS)
        slabs = MAX_SLABS;
    while (slabs > 0 &&
           data_offset_for(records_offset, slabs, page_size) + slabs * slab_size > size)
        slabs--;
    if (slabs == 0)
        return dh__set_error(DH_EINVAL,
                             "shm arena: size %" PRIu64 " holds no slab of %" PRIu64
                             " bytes after the header (needs at least %" PRIu64 ")",
                             size, slab_size,
                             data_offset_for(records_offset, 1, page_size) + slab_size);
    layout->size = size;
    layout->slab_size = slab_size;
    layout->slab_count = slabs;
    layout->page_size = page_size;
    layout->records_offset = records_offset;
    layout->data_offset = data_offset_for(records_offset, slabs, page_size);
    return 0;
}

static uint64_t page_size_now(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (uint64_t)page : 4096;
}

static void place_views(dh_shm_arena_t *arena)
{
    arena->header = (dh__shm_header_t *)arena->base;
    arena->records = (dh__shm_record_t *)(arena->base + arena->layout.records_offset);
}

void dh_shm_arena_destroy(dh_shm_arena_t **arena)
{
    if (!arena || !*arena)
        return;
    dh_shm_arena_t *a = *arena;
    if (a->base)
        munmap(a->base, (size_t)a->layout.size);
    if (a->fd >= 0)
        close(a->fd);
    dh_free(a->used);
    dh_free(a->span);
    dh_free(a);
    *arena = NULL;
}

int dh_shm_arena_fd(const dh_shm_arena_t *arena)
{
    return arena->fd;
}

uint64_t dh_shm_arena_id(const dh_shm_arena_t *arena)
{
    return arena->arena_id;
}

int dh__shm_arena_is_creator(const dh_shm_arena_t *arena)
{
    return arena->creator ? 1 : 0;
}

/* A non-zero id that differs between arenas, processes and restarts: it only has to make a
 * handle for another arena fail to resolve, not be secret. */
static uint64_t new_arena_id(const void *salt)
{
    static atomic_uint_fast64_t counter;
    uint64_t id = dh_rng_mix(dh_clock_now_ns() ^ ((uint64_t)getpid() << 32),
                             (uint64_t)(uintptr_t)salt + atomic_fetch_add(&counter, 1));
    return id ? id : 1;
}

int dh_shm_arena_new(dh_shm_arena_t **out, size_t size, size_t slab_size)
{
    assert(out);
    *out = NULL;
    if (slab_size == 0)
        slab_size = DH_SHM_DEFAULT_SLAB_SIZE;
    dh__shm_layout_t layout;
    int rc = dh__shm_layout(size, slab_size, page_size_now(), &layout);
    if (rc < 0)
        return rc;
    if (layout.size > (uint64_t)SIZE_MAX || layout.size > (uint64_t)INT64_MAX)
        return dh__set_error(DH_EINVAL, "shm arena: size %zu does not fit this platform", size);
    /* An arena this process can never hold fails here, naming the limit, not later with
     * SIGXFSZ at ftruncate, the OOM killer, or backpressure that never ends (limits.c). */
    if ((rc = dh__shm_check_size(layout.size, NULL)) < 0)
        return rc;

    dh_shm_arena_t *a = dh_calloc(1, sizeof *a);
    if (!a)
        return dh__set_error(DH_ENOMEM, "shm arena: out of memory");
    a->fd = -1;
    a->creator = true;
    a->layout = layout;
    a->used = dh_calloc((size_t)(layout.slab_count + 63) / 64, sizeof *a->used);
    a->span = dh_calloc((size_t)layout.slab_count, sizeof *a->span);
    if (!a->used || !a->span) {
        dh_shm_arena_destroy(&a);
        return dh__set_error(DH_ENOMEM, "shm arena: out of memory for %" PRIu64 " slabs",
                             layout.slab_count);
    }

    const char *step = "memfd_create";
    a->fd = fault_errno(DH_FAULT_SHM_CREATE, EMFILE)
                ? -1
                : memfd_create("datahelix-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (a->fd < 0)
        goto fail;
    step = "ftruncate";
    if (fault_errno(DH_FAULT_SHM_CREATE, ENOSPC) || ftruncate(a->fd, (off_t)layout.size) < 0)
        goto fail;
    /* Reserve the header and records now; slabs are reserved as allocations first reach
     * them (dh_shm_arena_alloc), so that a large arena costs nothing until used, and a
     * short machine fails there with backpressure instead of SIGBUS-ing whoever first
     * touches a slab. File systems without fallocate skip it. */
    step = "fallocate";
    if (fault_errno(DH_FAULT_SHM_CREATE, ENOSPC) ||
        (fallocate(a->fd, 0, 0, (off_t)layout.data_offset) < 0 && errno != EOPNOTSUPP))
        goto fail;
    a->reserved = layout.data_offset;
    /* No one may shrink it under a mapping (SIGBUS) or change the size at all. */
    step = "F_ADD_SEALS";
    if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        goto fail;
    step = "mmap";
    void *base =
        fault_errno(DH_FAULT_SHM_CREATE, ENOMEM)
            ? MAP_FAILED
            : mmap(NULL, (size_t)layout.size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (base == MAP_FAILED)
        goto fail;
    a->base = base;
    place_views(a);

    /* A new memfd reads as zeros: every record is DH__SHM_FREE with a count of 0. */
    a->arena_id = new_arena_id(a);
    dh__shm_header_t *h = a->header;
    h->magic = DH__SHM_MAGIC;
    h->version = DH_SHM_VERSION;
    h->header_size = (uint32_t)sizeof *h;
    h->size = layout.size;
    h->slab_size = layout.slab_size;
    h->slab_count = layout.slab_count;
    h->page_size = layout.page_size;
    h->records_offset = layout.records_offset;
    h->data_offset = layout.data_offset;
    h->arena_id = a->arena_id;
    h->creator_pid = (int64_t)getpid();
    atomic_init(&h->generation, 0);
    atomic_init(&h->released_pending, 0);
    *out = a;
    return 0;

fail:
    rc = -errno;
    dh_shm_arena_destroy(&a);
    /* ENOMEM/ENOSPC here: the limits were fine a moment ago, but the memory for the header
     * and records, or the address space for the mapping, was not there. Name the rlimit. */
    struct rlimit as;
    char limit[96] = "";
    if ((rc == -ENOMEM || rc == -ENOSPC) && getrlimit(RLIMIT_AS, &as) == 0 &&
        as.rlim_cur != RLIM_INFINITY)
        snprintf(limit, sizeof limit, " (RLIMIT_AS %" PRIu64 " bytes)", (uint64_t)as.rlim_cur);
    return dh__set_error(rc, "shm arena: %s of %" PRIu64 " bytes: %s%s", step, layout.size,
                         strerror(-rc), limit);
}

/* The header fields that never change after creation, as they must read for `layout`. */
static int check_header(int fd, const dh__shm_header_t *h, uint64_t file_size,
                        dh__shm_layout_t *layout)
{
#define WANT(field, expected)                                                                      \
    do {                                                                                           \
        if ((uint64_t)(h->field) != (uint64_t)(expected))                                          \
            return dh__set_error(DH_EPARSE,                                                        \
                                 "shm attach: fd %d: header field '" #field "' is %" PRIu64        \
                                 ", expected %" PRIu64,                                            \
                                 fd, (uint64_t)(h->field), (uint64_t)(expected));                  \
    } while (0)
    WANT(magic, DH__SHM_MAGIC);
    WANT(version, DH_SHM_VERSION);
    WANT(header_size, sizeof *h);
    WANT(size, file_size);
    WANT(page_size, page_size_now());
    if (dh__shm_layout(h->size, h->slab_size, h->page_size, layout) < 0) {
        char why[512]; /* copied: the message is rewritten below from the same buffer */
        snprintf(why, sizeof why, "%s", dh_last_error());
        return dh__set_error(DH_EPARSE, "shm attach: fd %d: header field 'slab_size': %s", fd, why);
    }
    WANT(slab_count, layout->slab_count);
    WANT(records_offset, layout->records_offset);
    WANT(data_offset, layout->data_offset);
    if (h->arena_id == 0)
        return dh__set_error(DH_EPARSE, "shm attach: fd %d: header field 'arena_id' is 0", fd);
#undef WANT
    return 0;
}

int dh_shm_arena_attach(dh_shm_arena_t **out, int fd)
{
    assert(out);
    *out = NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int rc = -errno;
        return dh__set_error(rc, "shm attach: fd %d: fstat: %s", fd, strerror(-rc));
    }
    if (!S_ISREG(st.st_mode))
        return dh__set_error(DH_EINVAL, "shm attach: fd %d: not a memfd (not a regular file)", fd);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        int rc = -errno;
        return dh__set_error(rc, "shm attach: fd %d: not a memfd (F_GET_SEALS: %s)", fd,
                             strerror(-rc));
    }
    /* Without this seal anyone holding the fd could truncate it, and every process that
     * then touched a slab past the new end would die of SIGBUS. */
    if (!(seals & F_SEAL_SHRINK))
        return dh__set_error(DH_EINVAL, "shm attach: fd %d: memfd is not sealed against shrinking",
                             fd);
    uint64_t file_size = (uint64_t)st.st_size;
    if (st.st_size < (off_t)sizeof(dh__shm_header_t) || file_size > MAX_SIZE ||
        file_size > (uint64_t)SIZE_MAX)
        return dh__set_error(DH_EPARSE,
                             "shm attach: fd %d: size %" PRIu64
                             " cannot hold an arena (header %zu bytes, limit %" PRIu64 ")",
                             fd, file_size, sizeof(dh__shm_header_t), MAX_SIZE);

    dh_shm_arena_t *a = dh_calloc(1, sizeof *a);
    if (!a)
        return dh__set_error(DH_ENOMEM, "shm attach: out of memory");
    a->fd = -1;
    a->fd = fault_errno(DH_FAULT_SHM_ATTACH, EMFILE) ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (a->fd < 0) {
        int rc = -errno;
        dh_shm_arena_destroy(&a);
        return dh__set_error(rc, "shm attach: fd %d: dup: %s", fd, strerror(-rc));
    }
    void *base = fault_errno(DH_FAULT_SHM_ATTACH, ENOMEM)
                     ? MAP_FAILED
                     : mmap(NULL, (size_t)file_size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (base == MAP_FAILED) {
        int rc = -errno;
        dh_shm_arena_destroy(&a);
        return dh__set_error(rc, "shm attach: fd %d: mmap of %" PRIu64 " bytes: %s", fd, file_size,
                             strerror(-rc));
    }
    a->base = base;
    a->layout.size = file_size; /* what destroy unmaps, until the header is checked */

    /* Copy the immutable part once, then check the copy: the mapping is writable by others. */
    dh__shm_header_t copy;
    memcpy(&copy, base, offsetof(dh__shm_header_t, generation));
    int rc = check_header(fd, &copy, file_size, &a->layout);
    if (rc < 0) {
        a->layout.size = file_size;
        dh_shm_arena_destroy(&a);
        return rc;
    }
    a->arena_id = copy.arena_id;
    place_views(a);
    *out = a;
    return 0;
}

/* ---- creator: allocation ------------------------------------------------------------- */

static bool slab_used(const dh_shm_arena_t *a, uint64_t i)
{
    return (a->used[i / 64] >> (i % 64)) & 1;
}

static void mark_slabs(dh_shm_arena_t *a, uint64_t first, uint64_t count, bool used)
{
    for (uint64_t i = first; i < first + count; i++) {
        if (used)
            a->used[i / 64] |= UINT64_C(1) << (i % 64);
        else
            a->used[i / 64] &= ~(UINT64_C(1) << (i % 64));
    }
}

/* First slab of the first run of `want` free slabs, or -1. Whole used words are skipped. */
static int64_t first_fit(const dh_shm_arena_t *a, uint64_t want)
{
    uint64_t n = a->layout.slab_count, run = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i % 64 == 0 && i + 64 <= n && a->used[i / 64] == UINT64_MAX) {
            run = 0;
            i += 63;
            continue;
        }
        run = slab_used(a, i) ? 0 : run + 1;
        if (run == want)
            return (int64_t)(i + 1 - want);
    }
    return -1;
}

uint64_t dh_shm_arena_collect(dh_shm_arena_t *arena)
{
    assert(arena->creator && "only the creator collects");
    atomic_exchange_explicit(&arena->header->released_pending, 0, memory_order_acquire);
    uint64_t slabs = 0;
    for (uint64_t i = 0; i < arena->layout.slab_count; i++) {
        uint32_t span = arena->span[i];
        if (span == 0)
            continue;
        dh__shm_record_t *rec = &arena->records[i];
        /* acquire: the last holder's writes to the slabs happen before we reuse them */
        uint64_t word = atomic_load_explicit(&rec->refword, memory_order_acquire);
        if (DH__SHM_REFWORD_COUNT(word) == 0) {
            atomic_store_explicit(&rec->state, DH__SHM_FREE, memory_order_release);
            mark_slabs(arena, i, span, false);
            arena->span[i] = 0;
            slabs += span;
        }
        i += span - 1;
    }
    return slabs * arena->layout.slab_size;
}

int dh_shm_arena_alloc(dh_shm_arena_t *arena, size_t len, pid_t holder_pid, dh_shm_handle_t *handle,
                       void **ptr)
{
    assert(arena->creator && "only the creator allocates");
    assert(handle && ptr);
    const dh__shm_layout_t *l = &arena->layout;
    if (len == 0)
        return dh__set_error(DH_EINVAL, "shm alloc: length 0");
    if ((uint64_t)len > l->slab_count * l->slab_size)
        return dh__set_error(DH_ERANGE,
                             "shm alloc: %zu bytes exceed the arena's %" PRIu64 " slabs of %" PRIu64
                             " bytes",
                             len, l->slab_count, l->slab_size);
    uint64_t want = ((uint64_t)len + l->slab_size - 1) / l->slab_size;
    if (atomic_load_explicit(&arena->header->released_pending, memory_order_relaxed) != 0)
        dh_shm_arena_collect(arena);
    int64_t first = first_fit(arena, want);
    if (first < 0) {
        dh_shm_arena_stats_t stats;
        dh_shm_arena_stats(arena, &stats);
        return dh__set_error(DH_EAGAIN,
                             "shm alloc: arena full: no run of %" PRIu64 " free slabs (%" PRIu64
                             " of %" PRIu64 " used, %" PRIu64 " allocations live)",
                             want, stats.slabs_used, stats.slabs_total, stats.allocations_live);
    }
    uint64_t i = (uint64_t)first;
    uint64_t end = l->data_offset + (i + want) * l->slab_size;
    if (end > arena->reserved) {
        if (fault_errno(DH_FAULT_SHM_RESERVE, ENOSPC) ||
            (fallocate(arena->fd, 0, (off_t)arena->reserved, (off_t)(end - arena->reserved)) < 0 &&
             errno != EOPNOTSUPP))
            return dh__set_error(DH_EAGAIN,
                                 "shm alloc: cannot reserve memory for %" PRIu64
                                 " more bytes of the arena (%" PRIu64 " of %" PRIu64
                                 " reserved): %s",
                                 end - arena->reserved, arena->reserved, l->size, strerror(errno));
        arena->reserved = end;
    }
    mark_slabs(arena, i, want, true);
    arena->span[i] = (uint32_t)want;
    uint64_t generation = ++arena->generation;
    atomic_store_explicit(&arena->header->generation, generation, memory_order_relaxed);

    /* Fill the record, then publish it: a reader that sees LIVE and the new refword (both
     * acquire) sees the fields written before them. */
    dh__shm_record_t *rec = &arena->records[i];
    atomic_store_explicit(&rec->generation, generation, memory_order_relaxed);
    atomic_store_explicit(&rec->length, (uint64_t)len, memory_order_relaxed);
    atomic_store_explicit(&rec->span, (uint32_t)want, memory_order_relaxed);
    atomic_store_explicit(&rec->holder_pid, (int32_t)holder_pid, memory_order_relaxed);
    atomic_store_explicit(&rec->refword, DH__SHM_REFWORD(generation, 1), memory_order_release);
    atomic_store_explicit(&rec->state, DH__SHM_LIVE, memory_order_release);

    handle->arena_id = arena->arena_id;
    handle->offset = l->data_offset + i * l->slab_size;
    handle->length = len;
    handle->generation = generation;
    *ptr = arena->base + handle->offset;
    return 0;
}

size_t dh_shm_arena_reclaim_dead(dh_shm_arena_t *arena)
{
    assert(arena->creator && "only the creator reclaims");
    pid_t self = getpid();
    size_t dropped = 0;
    for (uint64_t i = 0; i < arena->layout.slab_count; i++) {
        uint32_t span = arena->span[i];
        if (span == 0)
            continue;
        dh__shm_record_t *rec = &arena->records[i];
        i += span - 1;
        uint64_t word = atomic_load_explicit(&rec->refword, memory_order_acquire);
        pid_t pid = (pid_t)atomic_load_explicit(&rec->holder_pid, memory_order_relaxed);
        /* pid <= 0 would make kill() address process groups: no holder, skip. */
        if (DH__SHM_REFWORD_COUNT(word) == 0 || pid <= 0 || pid == self)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue; /* alive, or not ours to signal (EPERM): alive either way */
        /* Drop every reference, keeping the generation half so stale handles stay stale. */
        while (DH__SHM_REFWORD_COUNT(word) != 0 &&
               !atomic_compare_exchange_weak_explicit(&rec->refword, &word,
                                                      DH__SHM_REFWORD(DH__SHM_REFWORD_GEN(word), 0),
                                                      memory_order_acq_rel, memory_order_acquire))
            ;
        dropped++;
    }
    if (dropped)
        dh_shm_arena_collect(arena);
    return dropped;
}

/* ---- any process: handles and counts --------------------------------------------------- */

/* Checks everything about a handle that does not depend on its count, and returns its
 * record. The handle comes from another process: every field is checked before use. */
static int check_handle(const dh_shm_arena_t *arena, const dh_shm_handle_t *h,
                        dh__shm_record_t **out)
{
    assert(h);
    const dh__shm_layout_t *l = &arena->layout;
    uint64_t data_end = l->data_offset + l->slab_count * l->slab_size;
    if (h->arena_id != arena->arena_id)
        return dh__set_error(DH_EINVAL,
                             "shm handle: arena id %016" PRIx64 " is not this arena's %016" PRIx64,
                             h->arena_id, arena->arena_id);
    if (h->offset < l->data_offset)
        return dh__set_error(DH_EINVAL,
                             "shm handle: offset %" PRIu64
                             " is inside the header (slabs start at %" PRIu64 ")",
                             h->offset, l->data_offset);
    if (h->offset >= data_end)
        return dh__set_error(
            DH_ERANGE, "shm handle: offset %" PRIu64 " is past the last slab (ends at %" PRIu64 ")",
            h->offset, data_end);
    if ((h->offset - l->data_offset) % l->slab_size != 0)
        return dh__set_error(DH_EINVAL,
                             "shm handle: offset %" PRIu64
                             " is not on a slab boundary (slabs of %" PRIu64 " from %" PRIu64 ")",
                             h->offset, l->slab_size, l->data_offset);
    if (h->length == 0 || h->length > data_end - h->offset)
        return dh__set_error(h->length == 0 ? DH_EINVAL : DH_ERANGE,
                             "shm handle: length %" PRIu64 " at offset %" PRIu64
                             " does not fit the arena (slabs end at %" PRIu64 ")",
                             h->length, h->offset, data_end);
    if (h->generation == 0)
        return dh__set_error(DH_EINVAL, "shm handle: generation 0 is never issued");
    dh__shm_record_t *rec = &arena->records[(h->offset - l->data_offset) / l->slab_size];
    if (atomic_load_explicit(&rec->state, memory_order_acquire) != DH__SHM_LIVE) {
        uint64_t issued = atomic_load_explicit(&arena->header->generation, memory_order_relaxed);
        if (h->generation <= issued)
            return dh__set_error(-ESTALE,
                                 "shm handle: allocation %" PRIu64 " at offset %" PRIu64
                                 " was released and collected",
                                 h->generation, h->offset);
        return dh__set_error(DH_EINVAL, "shm handle: no allocation starts at offset %" PRIu64,
                             h->offset);
    }
    uint64_t generation = atomic_load_explicit(&rec->generation, memory_order_relaxed);
    if (generation != h->generation)
        return dh__set_error(-ESTALE,
                             "shm handle: generation %" PRIu64 " at offset %" PRIu64
                             " does not match the allocation there (%" PRIu64 ")",
                             h->generation, h->offset, generation);
    uint64_t length = atomic_load_explicit(&rec->length, memory_order_relaxed);
    if (length != h->length)
        return dh__set_error(DH_EINVAL,
                             "shm handle: length %" PRIu64 " does not match allocation %" PRIu64
                             " (%" PRIu64 " bytes)",
                             h->length, generation, length);
    *out = rec;
    return 0;
}

/* Loads the count of the allocation `h` names, or -ESTALE if it was released or reused. */
static int load_count(dh__shm_record_t *rec, const dh_shm_handle_t *h, uint64_t *word)
{
    *word = atomic_load_explicit(&rec->refword, memory_order_acquire);
    if (DH__SHM_REFWORD_GEN(*word) != (uint32_t)h->generation)
        return dh__set_error(-ESTALE, "shm handle: allocation %" PRIu64 " was reused",
                             h->generation);
    if (DH__SHM_REFWORD_COUNT(*word) == 0)
        return dh__set_error(-ESTALE, "shm handle: allocation %" PRIu64 " was released",
                             h->generation);
    return 0;
}

int dh_shm_arena_resolve(const dh_shm_arena_t *arena, const dh_shm_handle_t *handle, void **ptr)
{
    assert(ptr);
    *ptr = NULL;
    dh__shm_record_t *rec;
    uint64_t word;
    int rc = check_handle(arena, handle, &rec);
    if (rc == 0)
        rc = load_count(rec, handle, &word);
    if (rc < 0)
        return rc;
    *ptr = arena->base + handle->offset;
    return 0;
}

int dh_shm_arena_refcount(const dh_shm_arena_t *arena, const dh_shm_handle_t *handle)
{
    dh__shm_record_t *rec;
    uint64_t word;
    int rc = check_handle(arena, handle, &rec);
    if (rc == 0)
        rc = load_count(rec, handle, &word);
    return rc < 0 ? rc : (int)DH__SHM_REFWORD_COUNT(word);
}

int dh_shm_arena_ref(dh_shm_arena_t *arena, const dh_shm_handle_t *handle)
{
    dh__shm_record_t *rec;
    uint64_t word;
    int rc = check_handle(arena, handle, &rec);
    if (rc < 0)
        return rc;
    /* The CAS compares the generation half too: if the allocation was released and its
     * slabs reused since check_handle, it fails instead of moving the new one's count. */
    do {
        if ((rc = load_count(rec, handle, &word)) < 0)
            return rc;
        if (DH__SHM_REFWORD_COUNT(word) >= INT32_MAX)
            return dh__set_error(
                DH_ERANGE, "shm ref: allocation %" PRIu64 " has %" PRIu32 " references already",
                handle->generation, DH__SHM_REFWORD_COUNT(word));
    } while (!atomic_compare_exchange_weak_explicit(&rec->refword, &word, word + 1,
                                                    memory_order_acq_rel, memory_order_acquire));
    return 0;
}

int dh_shm_arena_ref_for(dh_shm_arena_t *arena, const dh_shm_handle_t *handle, pid_t pid)
{
    int rc = dh_shm_arena_ref(arena, handle);
    if (rc == 0) {
        dh__shm_record_t *rec =
            &arena->records[(handle->offset - arena->layout.data_offset) / arena->layout.slab_size];
        atomic_store_explicit(&rec->holder_pid, (int32_t)pid, memory_order_relaxed);
    }
    return rc;
}

int dh_shm_arena_unref(dh_shm_arena_t *arena, const dh_shm_handle_t *handle)
{
    dh__shm_record_t *rec;
    uint64_t word;
    int rc = check_handle(arena, handle, &rec);
    if (rc < 0)
        return rc;
    do {
        if ((rc = load_count(rec, handle, &word)) < 0)
            return rc;
        /* release: this process's writes to the slabs happen before the creator reuses them */
    } while (!atomic_compare_exchange_weak_explicit(&rec->refword, &word, word - 1,
                                                    memory_order_acq_rel, memory_order_acquire));
    if (DH__SHM_REFWORD_COUNT(word) == 1)
        atomic_fetch_add_explicit(&arena->header->released_pending, 1, memory_order_release);
    return 0;
}

void dh_shm_arena_mapping(const dh_shm_arena_t *arena, const void **base, size_t *size)
{
    *base = arena->base;
    *size = (size_t)arena->layout.size;
}

void dh_shm_arena_stats(const dh_shm_arena_t *arena, dh_shm_arena_stats_t *stats)
{
    assert(stats);
    const dh__shm_layout_t *l = &arena->layout;
    memset(stats, 0, sizeof *stats);
    stats->size_bytes = l->size;
    stats->slab_size = l->slab_size;
    stats->slabs_total = l->slab_count;
    for (uint64_t i = 0; i < l->slab_count; i++) {
        dh__shm_record_t *rec = &arena->records[i];
        uint64_t span;
        if (arena->creator) {
            span = arena->span[i];
        } else {
            /* An attacher reads the shared record: clamp what it says to the arena. */
            if (atomic_load_explicit(&rec->state, memory_order_acquire) != DH__SHM_LIVE)
                continue;
            span = atomic_load_explicit(&rec->span, memory_order_relaxed);
            if (span == 0 || span > l->slab_count - i)
                span = 1;
        }
        if (span == 0)
            continue;
        uint64_t word = atomic_load_explicit(&rec->refword, memory_order_relaxed);
        stats->slabs_used += span;
        if (DH__SHM_REFWORD_COUNT(word) == 0) {
            stats->slabs_reclaimable += span;
            stats->allocations_reclaimable++;
        } else {
            stats->allocations_live++;
        }
        i += span - 1;
    }
}
