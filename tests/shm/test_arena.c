/* Tests of the shared-memory arena: allocation, reuse, fragmentation, backpressure, handle
 * validation, attach validation, cross-process use (inherited fd and SCM_RIGHTS), clients
 * killed while holding references (and a live one's kept), concurrent counts, allocation
 * failures, memory reserved only as far as used, a hostile peer that tries to truncate the
 * memfd under a reader (and a reader of an unsealed one, which does die of SIGBUS), an arena
 * over RLIMIT_FSIZE or RLIMIT_AS that fails at start with the size and the limit.
 *
 * Children are forked and report through their exit status (cmocka's asserts belong to the
 * parent); the parent waits on pipes and sockets with poll() and a timeout, never a sleep. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/shm.h"
#include "shm/shm_internal.h"

#define SLAB ((size_t)64 << 10)
/* 1 MiB with 64 KiB slabs: one page of header and records, then 15 slabs. */
#define ARENA_SIZE ((size_t)1 << 20)
#define ARENA_SLABS 15

/* In a forked child: report a failed check on stderr and exit non-zero. */
#define CHILD_EXPECT(cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child %d: %s:%d: failed: %s (%s)\n", (int)getpid(), __FILE__,         \
                    __LINE__, #cond, dh_last_error());                                             \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static dh_shm_arena_t *new_arena(void)
{
    dh_shm_arena_t *a = NULL;
    int rc = dh_shm_arena_new(&a, ARENA_SIZE, SLAB);
    if (rc != 0)
        print_error("dh_shm_arena_new: %s (%s)\n", dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, 0);
    assert_non_null(a);
    return a;
}

static dh_shm_handle_t alloc_ok(dh_shm_arena_t *a, size_t len, pid_t holder, void **ptr)
{
    dh_shm_handle_t h;
    void *p = NULL;
    int rc = dh_shm_arena_alloc(a, len, holder, &h, &p);
    if (rc != 0)
        print_error("dh_shm_arena_alloc(%zu): %s (%s)\n", len, dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, 0);
    assert_non_null(p);
    if (ptr)
        *ptr = p;
    return h;
}

static dh_shm_arena_stats_t stats_of(const dh_shm_arena_t *a)
{
    dh_shm_arena_stats_t s;
    dh_shm_arena_stats(a, &s);
    return s;
}

/* Blocks until fd is readable, failing the test after timeout_ms. */
static void wait_readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc;
    do {
        rc = poll(&p, 1, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc != 1)
        print_error("fd %d not readable within %d ms\n", fd, timeout_ms);
    assert_int_equal(rc, 1);
}

static void read_exact(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    assert_int_equal(got, len);
}

/* Child side of read_exact: exits on failure. */
static void child_read_exact(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        CHILD_EXPECT(n > 0);
        got += (size_t)n;
    }
}

static void expect_exit_zero(pid_t pid)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        print_error("child %d: status 0x%x\n", (int)pid, status);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static long open_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    long n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static void expect_error(int rc, int want, const char *text)
{
    if (rc != want || !strstr(dh_last_error(), text))
        print_error("got %s (%s), want %s with '%s'\n", dh_err_name(rc), dh_last_error(),
                    dh_err_name(want), text);
    assert_int_equal(rc, want);
    assert_non_null(strstr(dh_last_error(), text));
}

/* ---- single process ------------------------------------------------------------------- */

static void arena_new_lays_out_header_and_slabs(void **state)
{
    dh_shm_arena_t *a = new_arena();
    dh_shm_arena_stats_t s = stats_of(a);
    assert_int_equal(s.size_bytes, ARENA_SIZE);
    assert_int_equal(s.slab_size, SLAB);
    assert_int_equal(s.slabs_total, ARENA_SLABS);
    assert_int_equal(s.slabs_used, 0);
    assert_int_equal(s.allocations_live, 0);
    assert_int_equal(dh__shm_arena_is_creator(a), 1);
    int fd = dh_shm_arena_fd(a);
    assert_true(fd >= 0);
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    int seals = fcntl(fd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
    assert_int_equal(ftruncate(fd, 4096), -1); /* sealed: nobody can shrink it under us */
    dh_shm_arena_destroy(&a);
    assert_null(a);
    dh_shm_arena_destroy(&a); /* safe on NULL */

    /* 0 picks the default slab size */
    assert_int_equal(dh_shm_arena_new(&a, 4 * DH_SHM_DEFAULT_SLAB_SIZE, 0), 0);
    s = stats_of(a);
    assert_int_equal(s.slab_size, DH_SHM_DEFAULT_SLAB_SIZE);
    assert_int_equal(s.slabs_total, 3);
    dh_shm_arena_destroy(&a);
}

static void arena_new_rejects_bad_sizes(void **state)
{
    dh_shm_arena_t *a = NULL;
    expect_error(dh_shm_arena_new(&a, ARENA_SIZE, 1000), DH_EINVAL, "slab size 1000");
    assert_null(a);
    expect_error(dh_shm_arena_new(&a, SLAB, SLAB), DH_EINVAL, "holds no slab");
    expect_error(dh_shm_arena_new(&a, (size_t)1 << 62, SLAB), DH_EINVAL, "exceeds the limit");
    assert_null(a);
}

static void arena_alloc_unref_collect_reuses_slabs(void **state)
{
    dh_shm_arena_t *a = new_arena();
    void *p = NULL;
    dh_shm_handle_t first = alloc_ok(a, 100, 0, &p);
    assert_int_equal(first.length, 100);
    assert_int_equal(first.generation, 1);
    assert_int_equal((uintptr_t)p % 4096, 0); /* slabs are page-aligned */
    memset(p, 0xab, SLAB);                    /* the whole slab is ours */
    void *q = NULL;
    assert_int_equal(dh_shm_arena_resolve(a, &first, &q), 0);
    assert_ptr_equal(p, q);
    assert_int_equal(dh_shm_arena_refcount(a, &first), 1);
    assert_int_equal(dh_shm_arena_ref(a, &first), 0);
    assert_int_equal(dh_shm_arena_refcount(a, &first), 2);

    dh_shm_handle_t second = alloc_ok(a, SLAB, 0, NULL);
    assert_int_equal(second.offset, first.offset + SLAB);
    assert_int_equal(second.generation, 2);

    assert_int_equal(dh_shm_arena_unref(a, &first), 0);
    assert_int_equal(dh_shm_arena_unref(a, &first), 0);
    assert_int_equal(dh_shm_arena_refcount(a, &first), -ESTALE);
    dh_shm_arena_stats_t s = stats_of(a);
    assert_int_equal(s.slabs_used, 2);
    assert_int_equal(s.slabs_reclaimable, 1);
    assert_int_equal(s.allocations_live, 1);
    assert_int_equal(s.allocations_reclaimable, 1);
    assert_int_equal(dh_shm_arena_collect(a), SLAB);
    assert_int_equal(dh_shm_arena_collect(a), 0);
    s = stats_of(a);
    assert_int_equal(s.slabs_used, 1);
    assert_int_equal(s.slabs_reclaimable, 0);

    /* the freed slab is the first fit again, under a new generation */
    dh_shm_handle_t third = alloc_ok(a, 7, 0, NULL);
    assert_int_equal(third.offset, first.offset);
    assert_int_equal(third.generation, 3);
    assert_int_equal(dh_shm_arena_resolve(a, &first, &q), -ESTALE);
    assert_null(q);

    /* the next allocation reclaims released slabs without an explicit collect */
    assert_int_equal(dh_shm_arena_unref(a, &third), 0);
    dh_shm_handle_t fourth = alloc_ok(a, 1, 0, NULL);
    assert_int_equal(fourth.offset, first.offset);
    assert_int_equal(stats_of(a).slabs_reclaimable, 0);
    dh_shm_arena_destroy(&a);
}

/* The newest allocation, released and collected: its handle is stale (-ESTALE: it was
 * issued), not invalid; a generation never issued at that offset is invalid. The boundary
 * is generation == the last issued. */
static void arena_newest_allocation_collected_is_stale(void **state)
{
    dh_shm_arena_t *a = new_arena();
    dh_shm_handle_t older = alloc_ok(a, SLAB, 0, NULL);
    dh_shm_handle_t newest = alloc_ok(a, SLAB, 0, NULL);
    assert_int_equal(dh_shm_arena_unref(a, &newest), 0);
    assert_int_equal(dh_shm_arena_collect(a), SLAB);
    void *q = NULL;
    assert_int_equal(dh_shm_arena_resolve(a, &newest, &q), -ESTALE);
    assert_int_equal(dh_shm_arena_refcount(a, &newest), -ESTALE);
    assert_int_equal(dh_shm_arena_unref(a, &newest), -ESTALE);
    dh_shm_handle_t never = newest;
    never.generation++;
    expect_error(dh_shm_arena_resolve(a, &never, &q), DH_EINVAL, "no allocation starts");
    assert_int_equal(dh_shm_arena_unref(a, &older), 0);
    dh_shm_arena_destroy(&a);
}

static void arena_multi_slab_allocations_are_contiguous(void **state)
{
    dh_shm_arena_t *a = new_arena();
    void *p = NULL;
    dh_shm_handle_t big = alloc_ok(a, 2 * SLAB + SLAB / 2, 0, &p);
    memset(p, 0x5a, 3 * SLAB); /* ceil(2.5) = 3 contiguous slabs */
    dh_shm_handle_t exact = alloc_ok(a, 2 * SLAB, 0, NULL);
    assert_int_equal(exact.offset, big.offset + 3 * SLAB);
    dh_shm_handle_t one = alloc_ok(a, 1, 0, NULL);
    assert_int_equal(one.offset, exact.offset + 2 * SLAB);
    dh_shm_arena_stats_t s = stats_of(a);
    assert_int_equal(s.slabs_used, 6);
    assert_int_equal(s.allocations_live, 3);
    assert_int_equal(dh_shm_arena_unref(a, &big), 0);
    assert_int_equal(dh_shm_arena_collect(a), 3 * SLAB);
    /* a handle into the middle of an allocation names no allocation */
    dh_shm_handle_t inner = exact;
    inner.offset += SLAB;
    void *q;
    assert_true(dh_shm_arena_resolve(a, &inner, &q) < 0);
    dh_shm_arena_destroy(&a);
}

static void arena_first_fit_finds_a_hole(void **state)
{
    dh_shm_arena_t *a = new_arena();
    dh_shm_handle_t h[ARENA_SLABS];
    for (int i = 0; i < ARENA_SLABS; i++)
        h[i] = alloc_ok(a, SLAB, 0, NULL);
    /* holes: slabs 3-4 (two) and 9 (one), 12 (one) */
    assert_int_equal(dh_shm_arena_unref(a, &h[3]), 0);
    assert_int_equal(dh_shm_arena_unref(a, &h[4]), 0);
    assert_int_equal(dh_shm_arena_unref(a, &h[9]), 0);
    assert_int_equal(dh_shm_arena_unref(a, &h[12]), 0);
    dh_shm_handle_t one = alloc_ok(a, 10, 0, NULL); /* first fit: slab 3, not 9 */
    assert_int_equal(one.offset, h[3].offset);
    dh_shm_handle_t two;
    void *p;
    /* slab 4 and 9 and 12 are free, but no two of them are adjacent */
    expect_error(dh_shm_arena_alloc(a, SLAB + 1, 0, &two, &p), DH_EAGAIN, "arena full");
    assert_int_equal(dh_shm_arena_unref(a, &h[10]), 0);
    two = alloc_ok(a, SLAB + 1, 0, NULL); /* 9-10 is now a hole of two */
    assert_int_equal(two.offset, h[9].offset);
    dh_shm_handle_t rest = alloc_ok(a, 1, 0, NULL);
    assert_int_equal(rest.offset, h[4].offset);
    rest = alloc_ok(a, 1, 0, NULL);
    assert_int_equal(rest.offset, h[12].offset);
    assert_int_equal(stats_of(a).slabs_used, ARENA_SLABS);
    dh_shm_arena_destroy(&a);
}

static void arena_full_gives_eagain_then_recovers(void **state)
{
    dh_shm_arena_t *a = new_arena();
    dh_shm_handle_t h, all = alloc_ok(a, ARENA_SLABS * SLAB, 0, NULL);
    void *p = (void *)&h;
    expect_error(dh_shm_arena_alloc(a, 1, 0, &h, &p), DH_EAGAIN, "arena full");
    expect_error(dh_shm_arena_alloc(a, ARENA_SLABS * SLAB + 1, 0, &h, &p), DH_ERANGE,
                 "exceed the arena");
    expect_error(dh_shm_arena_alloc(a, 0, 0, &h, &p), DH_EINVAL, "length 0");
    /* many refused attempts change nothing */
    for (int i = 0; i < 100; i++)
        assert_int_equal(dh_shm_arena_alloc(a, SLAB, 0, &h, &p), DH_EAGAIN);
    assert_int_equal(dh_shm_arena_unref(a, &all), 0);
    /* still full until the creator collects, which the next allocation does */
    assert_int_equal(stats_of(a).slabs_reclaimable, ARENA_SLABS);
    for (int i = 0; i < ARENA_SLABS; i++)
        alloc_ok(a, SLAB, 0, NULL);
    assert_int_equal(dh_shm_arena_alloc(a, 1, 0, &h, &p), DH_EAGAIN);
    dh_shm_arena_destroy(&a);
}

static void arena_resolve_rejects_bad_handles(void **state)
{
    dh_shm_arena_t *a = new_arena();
    dh_shm_handle_t good = alloc_ok(a, 3 * SLAB - 5, 0, NULL);
    dh_shm_handle_t other = alloc_ok(a, 10, 0, NULL);
    uint64_t data_end = other.offset + (ARENA_SLABS - 3) * SLAB;
    void *p = NULL;
    dh_shm_handle_t h;

    h = good;
    h.arena_id ^= 1;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_EINVAL, "arena id");
    h = good;
    h.offset = data_end;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_ERANGE, "past the last slab");
    h.offset = UINT64_MAX - 3;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_ERANGE, "past the last slab");
    h = good;
    h.offset = 0;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_EINVAL, "inside the header");
    h = good;
    h.offset += 8;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_EINVAL, "slab boundary");
    h = other;
    h.length = UINT64_MAX - 2; /* offset + length would wrap */
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_ERANGE, "does not fit");
    h.length = 0;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_EINVAL, "does not fit");
    h = good;
    h.length += 1;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_EINVAL, "length");
    h = good;
    h.generation = 7;
    expect_error(dh_shm_arena_resolve(a, &h, &p), -ESTALE, "generation 7");
    h.generation = 0;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_EINVAL, "generation 0");
    h = good;
    h.offset = other.offset + 2 * SLAB; /* a free slab never allocated */
    h.generation = 99;
    expect_error(dh_shm_arena_resolve(a, &h, &p), DH_EINVAL, "no allocation starts");
    /* every rejection leaves the pointer NULL and the counts alone */
    assert_null(p);
    expect_error(dh_shm_arena_ref(a, &h), DH_EINVAL, "no allocation starts");
    expect_error(dh_shm_arena_unref(a, &h), DH_EINVAL, "no allocation starts");
    assert_int_equal(dh_shm_arena_refcount(a, &good), 1);

    /* released: stale before and after the slabs are collected */
    assert_int_equal(dh_shm_arena_unref(a, &good), 0);
    expect_error(dh_shm_arena_resolve(a, &good, &p), -ESTALE, "released");
    expect_error(dh_shm_arena_ref(a, &good), -ESTALE, "released");
    expect_error(dh_shm_arena_unref(a, &good), -ESTALE, "released");
    assert_int_equal(dh_shm_arena_collect(a), 3 * SLAB);
    expect_error(dh_shm_arena_resolve(a, &good, &p), -ESTALE, "released and collected");
    /* and after reuse by a new allocation at the same offset */
    dh_shm_handle_t reuse = alloc_ok(a, 3 * SLAB - 5, 0, NULL);
    assert_int_equal(reuse.offset, good.offset);
    expect_error(dh_shm_arena_resolve(a, &good, &p), -ESTALE, "does not match");
    expect_error(dh_shm_arena_unref(a, &good), -ESTALE, "does not match");
    assert_int_equal(dh_shm_arena_refcount(a, &reuse), 1);
    assert_int_equal(dh_shm_arena_resolve(a, &reuse, &p), 0);
    assert_non_null(p);
    dh_shm_arena_destroy(&a);
}

/* ---- attach ---------------------------------------------------------------------------- */

static void arena_attach_in_process_shares_memory_and_counts(void **state)
{
    dh_shm_arena_t *a = new_arena(), *b = NULL;
    assert_int_equal(dh_shm_arena_attach(&b, dh_shm_arena_fd(a)), 0);
    assert_int_equal(dh__shm_arena_is_creator(b), 0);
    assert_int_not_equal(dh_shm_arena_fd(b), dh_shm_arena_fd(a)); /* its own dup */
    void *pa, *pb;
    dh_shm_handle_t h = alloc_ok(a, 2 * SLAB, 0, &pa);
    memcpy(pa, "hello", 6);
    assert_int_equal(dh_shm_arena_resolve(b, &h, &pb), 0);
    assert_ptr_not_equal(pa, pb);
    assert_string_equal(pb, "hello");
    assert_int_equal(dh_shm_arena_ref(b, &h), 0);
    assert_int_equal(dh_shm_arena_refcount(a, &h), 2);
    dh_shm_arena_stats_t sa = stats_of(a), sb = stats_of(b);
    assert_int_equal(sb.slabs_total, sa.slabs_total);
    assert_int_equal(sb.slabs_used, 2);
    assert_int_equal(sb.allocations_live, 1);
    assert_int_equal(dh_shm_arena_unref(b, &h), 0);
    assert_int_equal(dh_shm_arena_unref(b, &h), 0);
    assert_int_equal(stats_of(b).slabs_reclaimable, 2);
    assert_int_equal(dh_shm_arena_collect(a), 2 * SLAB);
    dh_shm_arena_destroy(&b);
    dh_shm_arena_destroy(&a);
}

static void arena_attach_rejects_bad_fds(void **state)
{
    dh_shm_arena_t *b = NULL;
    expect_error(dh_shm_arena_attach(&b, -1), -EBADF, "fd -1");
    assert_null(b);
    int pipe_fds[2];
    assert_int_equal(pipe(pipe_fds), 0);
    expect_error(dh_shm_arena_attach(&b, pipe_fds[0]), DH_EINVAL, "not a memfd");
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    const char *path = dh_test_path("not-an-arena");
    dh_test_write_file(path, "plain file\n");
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(dh_shm_arena_attach(&b, fd) < 0, 1);
    assert_null(b);
    close(fd);

    /* a memfd that anyone could shrink under our mapping */
    dh_shm_arena_t *a = new_arena();
    fd = memfd_create("unsealed", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, ARENA_SIZE), 0);
    char page[4096];
    assert_int_equal(pread(dh_shm_arena_fd(a), page, sizeof page, 0), sizeof page);
    assert_int_equal(pwrite(fd, page, sizeof page, 0), sizeof page);
    expect_error(dh_shm_arena_attach(&b, fd), DH_EINVAL, "not sealed against shrinking");
    close(fd);

    /* sealed, but too small for a header */
    fd = memfd_create("tiny", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd, 16), 0);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    expect_error(dh_shm_arena_attach(&b, fd), DH_EPARSE, "size 16 cannot hold an arena");
    close(fd);
    assert_null(b);
    dh_shm_arena_destroy(&a);
}

/* Makes an arena, overwrites one header field with `value`, and expects attach to fail
 * naming that field. */
static void expect_bad_field(size_t offset, const void *value, size_t size, const char *field)
{
    dh_shm_arena_t *a = new_arena(), *b = NULL;
    assert_int_equal(pwrite(dh_shm_arena_fd(a), value, size, (off_t)offset), (ssize_t)size);
    char want[128];
    snprintf(want, sizeof want, "header field '%s'", field);
    long fds = open_fd_count();
    expect_error(dh_shm_arena_attach(&b, dh_shm_arena_fd(a)), DH_EPARSE, want);
    assert_null(b);
    assert_int_equal(open_fd_count(), fds); /* the dup was closed */
    dh_shm_arena_destroy(&a);
}

static void arena_attach_rejects_bad_headers(void **state)
{
    uint64_t u64;
    uint32_t u32;
    u64 = 0x1234;
    expect_bad_field(offsetof(dh__shm_header_t, magic), &u64, 8, "magic");
    u32 = DH_SHM_VERSION + 1;
    expect_bad_field(offsetof(dh__shm_header_t, version), &u32, 4, "version");
    u32 = 8;
    expect_bad_field(offsetof(dh__shm_header_t, header_size), &u32, 4, "header_size");
    u64 = ARENA_SIZE * 2;
    expect_bad_field(offsetof(dh__shm_header_t, size), &u64, 8, "size");
    u64 = 1000;
    expect_bad_field(offsetof(dh__shm_header_t, slab_size), &u64, 8, "slab_size");
    u64 = SLAB / 2; /* a valid slab size, but then the count and offsets disagree */
    expect_bad_field(offsetof(dh__shm_header_t, slab_size), &u64, 8, "slab_count");
    u64 = ARENA_SLABS + 1;
    expect_bad_field(offsetof(dh__shm_header_t, slab_count), &u64, 8, "slab_count");
    u64 = 1 << 20;
    expect_bad_field(offsetof(dh__shm_header_t, page_size), &u64, 8, "page_size");
    u64 = 0;
    expect_bad_field(offsetof(dh__shm_header_t, records_offset), &u64, 8, "records_offset");
    u64 = 8192;
    expect_bad_field(offsetof(dh__shm_header_t, data_offset), &u64, 8, "data_offset");
    u64 = 0;
    expect_bad_field(offsetof(dh__shm_header_t, arena_id), &u64, 8, "arena_id");
}

/* ---- across processes ------------------------------------------------------------------ */

/* Child: attaches to fd, reads a handle from `in`, checks the parent's bytes, writes its
 * own, unrefs, acks on `out`. */
static void child_use_handle(int fd, int in, int out)
{
    dh_shm_arena_t *b = NULL;
    CHILD_EXPECT(dh_shm_arena_attach(&b, fd) == 0);
    dh_shm_handle_t h;
    child_read_exact(in, &h, sizeof h);
    unsigned char *p = NULL;
    CHILD_EXPECT(dh_shm_arena_resolve(b, &h, (void **)&p) == 0);
    for (size_t i = 0; i < h.length; i++)
        CHILD_EXPECT(p[i] == (unsigned char)(i * 7));
    for (size_t i = 0; i < h.length; i++)
        p[i] = (unsigned char)(255 - i % 256);
    CHILD_EXPECT(dh_shm_arena_refcount(b, &h) == 2);
    CHILD_EXPECT(dh_shm_arena_unref(b, &h) == 0);
    dh_shm_arena_destroy(&b);
    CHILD_EXPECT(write(out, "k", 1) == 1);
}

/* Parent: allocates 1.5 slabs, fills them, hands the child a reference, then checks the
 * child's bytes and that the count dropped. */
static dh_shm_handle_t fill_for_child(dh_shm_arena_t *a, pid_t child)
{
    unsigned char *p;
    dh_shm_handle_t h = alloc_ok(a, SLAB + SLAB / 2, 0, (void **)&p);
    for (size_t i = 0; i < h.length; i++)
        p[i] = (unsigned char)(i * 7);
    assert_int_equal(dh_shm_arena_ref_for(a, &h, child), 0);
    return h;
}

static void check_child_wrote(dh_shm_arena_t *a, const dh_shm_handle_t *h)
{
    unsigned char *p;
    assert_int_equal(dh_shm_arena_refcount(a, h), 1); /* the child's reference is gone */
    assert_int_equal(dh_shm_arena_resolve(a, h, (void **)&p), 0);
    for (size_t i = 0; i < h->length; i++)
        if (p[i] != (unsigned char)(255 - i % 256))
            fail_msg("byte %zu is %u, the child wrote %u", i, p[i], 255 - (unsigned)(i % 256));
    assert_int_equal(dh_shm_arena_unref(a, h), 0);
    assert_int_equal(dh_shm_arena_collect(a), 2 * SLAB);
    assert_int_equal(stats_of(a).slabs_used, 0);
}

static void arena_child_attaches_by_inherited_fd(void **state)
{
    dh_shm_arena_t *a = new_arena();
    int to_child[2], to_parent[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        child_use_handle(dh_shm_arena_fd(a), to_child[0], to_parent[1]);
        _exit(0);
    }
    close(to_child[0]);
    close(to_parent[1]);
    dh_shm_handle_t h = fill_for_child(a, pid);
    assert_int_equal(write(to_child[1], &h, sizeof h), sizeof h);
    wait_readable(to_parent[0], 5000);
    char ack = 0;
    read_exact(to_parent[0], &ack, 1);
    assert_int_equal(ack, 'k');
    expect_exit_zero(pid);
    check_child_wrote(a, &h);
    close(to_child[1]);
    close(to_parent[0]);
    dh_shm_arena_destroy(&a);
}

static void arena_child_attaches_via_scm_rights(void **state)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    /* fork before the arena exists: the child can only get it over the socket */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        int fd = -1;
        CHILD_EXPECT(dh_shm_recv_fd(sv[1], &fd) == 0);
        CHILD_EXPECT(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
        child_use_handle(fd, sv[1], sv[1]);
        close(fd);
        _exit(0);
    }
    close(sv[1]);
    dh_shm_arena_t *a = new_arena();
    dh_shm_handle_t h = fill_for_child(a, pid);
    assert_int_equal(dh_shm_send_fd(sv[0], dh_shm_arena_fd(a)), 0);
    assert_int_equal(write(sv[0], &h, sizeof h), sizeof h);
    wait_readable(sv[0], 5000);
    char ack = 0;
    read_exact(sv[0], &ack, 1);
    assert_int_equal(ack, 'k');
    expect_exit_zero(pid);
    check_child_wrote(a, &h);
    close(sv[0]);
    dh_shm_arena_destroy(&a);
}

static void arena_reclaim_dead_frees_killed_client_slabs(void **state)
{
    dh_shm_arena_t *a = new_arena();
    int to_child[2], to_parent[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        dh_shm_arena_t *b = NULL;
        CHILD_EXPECT(dh_shm_arena_attach(&b, dh_shm_arena_fd(a)) == 0);
        dh_shm_handle_t h;
        child_read_exact(to_child[0], &h, sizeof h);
        CHILD_EXPECT(dh_shm_arena_ref_for(b, &h, getpid()) == 0);
        CHILD_EXPECT(write(to_parent[1], "k", 1) == 1);
        /* hold the reference until killed: the parent never writes again */
        char never;
        while (read(to_child[0], &never, 1) != 0)
            ;
        _exit(2);
    }
    close(to_child[0]);
    close(to_parent[1]);
    /* passed: the child takes its own reference and becomes the holder */
    dh_shm_handle_t passed = alloc_ok(a, 2 * SLAB, 0, NULL);
    /* given: allocated for the child directly; the child never touches it */
    dh_shm_handle_t given = alloc_ok(a, SLAB, pid, NULL);
    /* kept: held by this (live) process */
    dh_shm_handle_t kept = alloc_ok(a, SLAB, getpid(), NULL);
    /* orphan: no holder, so never reclaimed for a death */
    dh_shm_handle_t orphan = alloc_ok(a, SLAB, 0, NULL);
    assert_int_equal(write(to_child[1], &passed, sizeof passed), sizeof passed);
    wait_readable(to_parent[0], 5000);
    char ack = 0;
    read_exact(to_parent[0], &ack, 1);
    assert_int_equal(ack, 'k');
    assert_int_equal(dh_shm_arena_refcount(a, &passed), 2);
    assert_int_equal(dh_shm_arena_unref(a, &passed), 0); /* the batch is the child's now */

    assert_int_equal(dh_shm_arena_reclaim_dead(a), 0); /* the child is alive */
    assert_int_equal(stats_of(a).slabs_used, 5);

    assert_int_equal(kill(pid, SIGKILL), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid); /* a zombie would still "exist" */
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);

    assert_int_equal(dh_shm_arena_reclaim_dead(a), 2);
    dh_shm_arena_stats_t s = stats_of(a);
    assert_int_equal(s.slabs_used, 2);
    assert_int_equal(s.allocations_live, 2);
    assert_int_equal(s.slabs_reclaimable, 0);
    assert_int_equal(dh_shm_arena_refcount(a, &passed), -ESTALE);
    assert_int_equal(dh_shm_arena_refcount(a, &given), -ESTALE);
    assert_int_equal(dh_shm_arena_refcount(a, &kept), 1);
    assert_int_equal(dh_shm_arena_refcount(a, &orphan), 1);
    assert_int_equal(dh_shm_arena_reclaim_dead(a), 0);
    /* the dead client's slabs serve the next batch */
    dh_shm_handle_t next = alloc_ok(a, 3 * SLAB, 0, NULL);
    assert_int_equal(next.offset, passed.offset);
    close(to_child[1]);
    close(to_parent[0]);
    dh_shm_arena_destroy(&a);
}

/* A client of the arena, forked: attaches by the inherited fd, takes the handle it reads
 * from `in` as its own (ref_for its pid: it becomes the holder), acks on `out`, and holds
 * it. On 'v' it checks every byte is `fill`, unrefs, acks and exits 0; it never gets 'v'
 * when it is to be killed. */
static pid_t fork_holder(dh_shm_arena_t *a, unsigned char fill, int *to_child, int *to_parent)
{
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        dh_shm_arena_t *b = NULL;
        CHILD_EXPECT(dh_shm_arena_attach(&b, dh_shm_arena_fd(a)) == 0);
        dh_shm_handle_t h;
        child_read_exact(down[0], &h, sizeof h);
        CHILD_EXPECT(dh_shm_arena_ref_for(b, &h, getpid()) == 0);
        CHILD_EXPECT(write(up[1], "k", 1) == 1);
        char cmd = 0;
        child_read_exact(down[0], &cmd, 1);
        CHILD_EXPECT(cmd == 'v');
        unsigned char *p = NULL;
        CHILD_EXPECT(dh_shm_arena_resolve(b, &h, (void **)&p) == 0);
        for (size_t i = 0; i < h.length; i++)
            CHILD_EXPECT(p[i] == fill);
        CHILD_EXPECT(dh_shm_arena_unref(b, &h) == 0);
        CHILD_EXPECT(write(up[1], "d", 1) == 1);
        _exit(0);
    }
    close(down[0]);
    close(up[1]);
    *to_child = down[1];
    *to_parent = up[0];
    return pid;
}

/* Hands `h` to a forked holder and waits for its ack; then drops this process's reference,
 * so the child is the allocation's only holder. */
static void give_to_holder(dh_shm_arena_t *a, const dh_shm_handle_t *h, int to_child, int to_parent)
{
    assert_int_equal(write(to_child, h, sizeof *h), sizeof *h);
    wait_readable(to_parent, 5000);
    char ack = 0;
    read_exact(to_parent, &ack, 1);
    assert_int_equal(ack, 'k');
    assert_int_equal(dh_shm_arena_refcount(a, h), 2);
    assert_int_equal(dh_shm_arena_unref(a, h), 0);
}

/* Two clients hold batches; one is killed. Reclaiming drops the dead one's allocation only:
 * the live one's keeps its count, its holder and its bytes, even once the dead one's slabs
 * are reused (first fit puts the next batch there), and the live client then releases it
 * itself. The dead holder's allocation lies first in the arena, so a reclaim that judged a
 * holder by what it saw before (errno left from the dead one's kill()) would drop the live
 * one too; and one that skipped the liveness check would drop both (issue 17). */
static void arena_reclaim_dead_keeps_live_clients_slabs(void **state)
{
    dh_shm_arena_t *a = new_arena();
    unsigned char *dead_bytes, *live_bytes;
    dh_shm_handle_t dead_h = alloc_ok(a, 2 * SLAB, 0, (void **)&dead_bytes);
    dh_shm_handle_t live_h = alloc_ok(a, SLAB + SLAB / 2, 0, (void **)&live_bytes);
    memset(dead_bytes, 'D', dead_h.length);
    memset(live_bytes, 'L', live_h.length);
    int dead_in, dead_out, live_in, live_out;
    pid_t dead = fork_holder(a, 'D', &dead_in, &dead_out);
    pid_t live = fork_holder(a, 'L', &live_in, &live_out);
    give_to_holder(a, &dead_h, dead_in, dead_out);
    give_to_holder(a, &live_h, live_in, live_out);

    assert_int_equal(dh_shm_arena_reclaim_dead(a), 0); /* both alive */
    assert_int_equal(stats_of(a).allocations_live, 2);

    assert_int_equal(kill(dead, SIGKILL), 0);
    int status = 0;
    assert_int_equal(waitpid(dead, &status, 0), dead); /* reaped: kill(pid, 0) says ESRCH */
    assert_true(WIFSIGNALED(status));

    assert_int_equal(dh_shm_arena_reclaim_dead(a), 1);
    dh_shm_arena_stats_t s = stats_of(a);
    assert_int_equal(s.allocations_live, 1);
    assert_int_equal(s.slabs_used, 2); /* the dead one's 2 slabs collected */
    assert_int_equal(dh_shm_arena_refcount(a, &dead_h), -ESTALE);
    assert_int_equal(dh_shm_arena_refcount(a, &live_h), 1);
    assert_int_equal(dh_shm_arena_reclaim_dead(a), 0);

    /* the next batch takes the dead one's slabs, not the live one's */
    unsigned char *next_bytes;
    dh_shm_handle_t next = alloc_ok(a, 2 * SLAB, 0, (void **)&next_bytes);
    assert_int_equal(next.offset, dead_h.offset);
    memset(next_bytes, 'N', next.length);
    for (size_t i = 0; i < live_h.length; i++)
        if (live_bytes[i] != 'L')
            fail_msg("live client's byte %zu is '%c', not 'L'", i, live_bytes[i]);

    /* the live client still holds its batch: it checks the bytes and releases it */
    assert_int_equal(write(live_in, "v", 1), 1);
    wait_readable(live_out, 5000);
    char ack = 0;
    read_exact(live_out, &ack, 1);
    assert_int_equal(ack, 'd');
    expect_exit_zero(live);
    assert_int_equal(dh_shm_arena_refcount(a, &live_h), -ESTALE);
    assert_int_equal(dh_shm_arena_unref(a, &next), 0);
    dh_shm_arena_collect(a);
    assert_int_equal(stats_of(a).slabs_used, 0);
    close(dead_in);
    close(dead_out);
    close(live_in);
    close(live_out);
    dh_shm_arena_destroy(&a);
}

/* ---- threads --------------------------------------------------------------------------- */

#define THREADS 8
#define ROUNDS 20000

typedef struct {
    dh_shm_arena_t *arena;
    dh_shm_handle_t handle;
    int failures;
} counter_job_t;

static void *ref_unref_many(void *arg)
{
    counter_job_t *job = arg;
    for (int i = 0; i < ROUNDS; i++) {
        job->failures += dh_shm_arena_ref(job->arena, &job->handle) != 0;
        if (i % 3 == 0) {
            job->failures += dh_shm_arena_ref(job->arena, &job->handle) != 0;
            job->failures += dh_shm_arena_unref(job->arena, &job->handle) != 0;
        }
        job->failures += dh_shm_arena_unref(job->arena, &job->handle) != 0;
    }
    /* drop the reference the main thread took for this thread */
    job->failures += dh_shm_arena_unref(job->arena, &job->handle) != 0;
    return NULL;
}

static void arena_concurrent_ref_unref_keeps_count(void **state)
{
    dh_shm_arena_t *a = new_arena(), *b = NULL;
    assert_int_equal(dh_shm_arena_attach(&b, dh_shm_arena_fd(a)), 0);
    dh_shm_handle_t h = alloc_ok(a, 3 * SLAB, 0, NULL);
    pthread_t threads[THREADS];
    counter_job_t jobs[THREADS];
    for (int t = 0; t < THREADS; t++) {
        /* half the threads go through a second mapping, as another process would */
        jobs[t] = (counter_job_t){.arena = t % 2 ? b : a, .handle = h};
        assert_int_equal(dh_shm_arena_ref(a, &h), 0);
    }
    assert_int_equal(dh_shm_arena_refcount(a, &h), THREADS + 1);
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&threads[t], NULL, ref_unref_many, &jobs[t]), 0);
    for (int t = 0; t < THREADS; t++) {
        assert_int_equal(pthread_join(threads[t], NULL), 0);
        assert_int_equal(jobs[t].failures, 0);
    }
    assert_int_equal(dh_shm_arena_refcount(a, &h), 1);
    assert_int_equal(dh_shm_arena_unref(a, &h), 0);
    assert_int_equal(dh_shm_arena_refcount(b, &h), -ESTALE);
    assert_int_equal(dh_shm_arena_collect(a), 3 * SLAB);
    dh_shm_arena_destroy(&b);
    dh_shm_arena_destroy(&a);
}

/* The last of several threads to unref releases the allocation, exactly once. */
static void *unref_once(void *arg)
{
    counter_job_t *job = arg;
    job->failures = dh_shm_arena_unref(job->arena, &job->handle);
    return NULL;
}

static void arena_concurrent_last_unref_releases_once(void **state)
{
    dh_shm_arena_t *a = new_arena();
    for (int round = 0; round < 200; round++) {
        dh_shm_handle_t h = alloc_ok(a, SLAB, 0, NULL);
        pthread_t threads[THREADS];
        counter_job_t jobs[THREADS];
        for (int t = 0; t < THREADS; t++) {
            jobs[t] = (counter_job_t){.arena = a, .handle = h};
            if (t > 0)
                assert_int_equal(dh_shm_arena_ref(a, &h), 0);
        }
        for (int t = 0; t < THREADS; t++)
            assert_int_equal(pthread_create(&threads[t], NULL, unref_once, &jobs[t]), 0);
        for (int t = 0; t < THREADS; t++) {
            assert_int_equal(pthread_join(threads[t], NULL), 0);
            assert_int_equal(jobs[t].failures, 0);
        }
        assert_int_equal(dh_shm_arena_unref(a, &h), -ESTALE);
        assert_int_equal(stats_of(a).slabs_reclaimable, 1);
    }
    /* the next allocation collected each round's slab, so the arena never filled */
    assert_int_equal(stats_of(a).slabs_used, 1);
    dh_shm_arena_destroy(&a);
}

/* ---- allocation failures --------------------------------------------------------------- */

static int new_alloc_destroy(void *ctx)
{
    long fds = open_fd_count();
    dh_shm_arena_t *a = NULL, *b = NULL;
    int rc = dh_shm_arena_new(&a, ARENA_SIZE, SLAB);
    if (rc != 0)
        assert_null(a);
    if (rc == 0) {
        rc = dh_shm_arena_attach(&b, dh_shm_arena_fd(a));
        if (rc != 0)
            assert_null(b);
    }
    if (rc == 0) {
        dh_shm_handle_t h;
        void *p;
        assert_int_equal(dh_shm_arena_alloc(a, 2 * SLAB, 0, &h, &p), 0);
        assert_int_equal(dh_shm_arena_unref(b, &h), 0);
        assert_int_equal(dh_shm_arena_collect(a), 2 * SLAB);
    }
    dh_shm_arena_destroy(&b);
    dh_shm_arena_destroy(&a);
    assert_int_equal(open_fd_count(), fds); /* no memfd or dup left open */
    return rc;
}

static void arena_survives_each_allocation_failure(void **state)
{
    /* new: the arena and its two private maps; attach: the arena object */
    assert_int_equal(dh_test_each_allocation_failure(new_alloc_destroy, NULL), 4);
}

/* The memfd is sparse: a 1 GiB arena holds memory only for its header and records until
 * allocations reach its slabs, and then only up to the highest slab reached (the memfd's
 * allocated blocks, st_blocks, which count what fallocate reserved or a write touched). */
static void arena_memory_is_reserved_as_used(void **state)
{
    (void)state;
    size_t big = (size_t)1 << 30, mib = (size_t)1 << 20;
    dh_shm_arena_t *a = NULL;
    assert_int_equal(dh_shm_arena_new(&a, big, mib), 0);
    struct stat st;
    assert_int_equal(fstat(dh_shm_arena_fd(a), &st), 0);
    assert_true((uint64_t)st.st_blocks * 512 < 4 * mib); /* header and records only */
    dh_shm_handle_t h[2];
    void *p[2];
    assert_int_equal(dh_shm_arena_alloc(a, 3 * mib, 0, &h[0], &p[0]), 0);
    assert_int_equal(dh_shm_arena_alloc(a, 5 * mib, 0, &h[1], &p[1]), 0);
    memset(p[1], 0xab, 5 * mib); /* touching allocated slabs cannot fault */
    assert_int_equal(fstat(dh_shm_arena_fd(a), &st), 0);
    uint64_t held = (uint64_t)st.st_blocks * 512;
    assert_true(held >= h[1].offset + 5 * mib); /* reserved up to the high-water mark */
    assert_true(held < h[1].offset + 5 * mib + 4 * mib);
    /* freed and allocated again below the mark: nothing more is reserved */
    assert_int_equal(dh_shm_arena_unref(a, &h[0]), 0);
    dh_shm_arena_collect(a);
    assert_int_equal(dh_shm_arena_alloc(a, 2 * mib, 0, &h[0], &p[0]), 0);
    assert_int_equal(fstat(dh_shm_arena_fd(a), &st), 0);
    assert_int_equal((uint64_t)st.st_blocks * 512, held);
    dh_shm_arena_destroy(&a);
}

/* ---- hostile peers and limits ------------------------------------------------------------ */

/* What a reader child exits with when a page of its mapping faults with SIGBUS: its own
 * handler, so the status says SIGBUS under the sanitizers too (they catch SIGBUS first). */
#define SIGBUS_EXIT 77

static void exit_on_sigbus(int sig)
{
    (void)sig;
    _exit(SIGBUS_EXIT);
}

/* In a child: touches every page of [base, base + size) and returns the bytes' sum. */
static unsigned long child_read_every_page(const void *base, size_t size)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exit_on_sigbus;
    CHILD_EXPECT(sigaction(SIGBUS, &sa, NULL) == 0);
    const volatile unsigned char *p = base;
    unsigned long sum = 0;
    for (size_t off = 0; off < size; off += 4096)
        sum += p[off];
    return sum;
}

static void expect_exit_code(pid_t pid, int code)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != code)
        print_error("child %d: status 0x%x, want exit %d\n", (int)pid, status, code);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), code);
}

/* A peer with its own open file description of the arena (as one that got the fd over the
 * socket, or opened /proc/PID/fd/N) tries every way to change its size or seals. The
 * seals refuse each (EPERM), so a reader that maps the arena reads every page afterwards
 * without SIGBUS. What the seals do not stop: punching a hole (the pages read as zeros, a
 * spoiled batch like any scribble, not a fault). */
static void arena_hostile_peer_cannot_truncate_under_a_reader(void **state)
{
    (void)state;
    dh_shm_arena_t *a = new_arena();
    void *p = NULL;
    alloc_ok(a, ARENA_SLABS * SLAB, 0, &p);
    memset(p, 0x5a, ARENA_SLABS * SLAB);
    const void *creator_base;
    size_t creator_size;
    dh_shm_arena_mapping(a, &creator_base, &creator_size);
    size_t data_offset = (size_t)((const unsigned char *)p - (const unsigned char *)creator_base);
    int fd = dh_shm_arena_fd(a);
    struct stat before;
    assert_int_equal(fstat(fd, &before), 0);

    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t reader = fork();
    assert_true(reader >= 0);
    if (reader == 0) {
        close(up[0]);
        close(down[1]);
        dh_shm_arena_t *b = NULL;
        CHILD_EXPECT(dh_shm_arena_attach(&b, fd) == 0);
        CHILD_EXPECT(write(up[1], "r", 1) == 1);
        char go = 0;
        child_read_exact(down[0], &go, 1);
        const void *base;
        size_t size;
        dh_shm_arena_mapping(b, &base, &size);
        CHILD_EXPECT(size == ARENA_SIZE);
        child_read_every_page(base, size);
        /* the slabs kept their bytes, but the one the peer punched reads as zeros */
        const unsigned char *slabs = (const unsigned char *)base + data_offset;
        for (size_t i = 0; i < (ARENA_SLABS - 1) * SLAB; i += 4096)
            CHILD_EXPECT(slabs[i] == 0x5a);
        for (size_t i = (ARENA_SLABS - 1) * SLAB; i < ARENA_SLABS * SLAB; i += 4096)
            CHILD_EXPECT(slabs[i] == 0);
        dh_shm_arena_destroy(&b);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    wait_readable(up[0], 5000);
    char ready = 0;
    read_exact(up[0], &ready, 1);
    assert_int_equal(ready, 'r');

    pid_t hostile = fork();
    assert_true(hostile >= 0);
    if (hostile == 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int own = open(path, O_RDWR | O_CLOEXEC); /* a description of its own */
        CHILD_EXPECT(own >= 0);
        off_t sizes[] = {0, 4096, ARENA_SIZE / 2, ARENA_SIZE - 1, 2 * ARENA_SIZE};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            CHILD_EXPECT(ftruncate(own, sizes[i]) == -1 && errno == EPERM);
            CHILD_EXPECT(ftruncate(fd, sizes[i]) == -1 && errno == EPERM);
        }
        /* no seal can be added (F_SEAL_SEAL): not even one that would stop new mappings */
        CHILD_EXPECT(fcntl(own, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == -1 && errno == EPERM);
        CHILD_EXPECT(fcntl(own, F_ADD_SEALS, F_SEAL_WRITE) == -1 && errno == EPERM);
        /* growing through fallocate is sealed too */
        CHILD_EXPECT(fallocate(own, 0, ARENA_SIZE, 4096) == -1 && errno == EPERM);
        /* punching a hole is not: it drops the last slab's pages */
        CHILD_EXPECT(fallocate(own, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               (off_t)(data_offset + (ARENA_SLABS - 1) * SLAB), (off_t)SLAB) == 0);
        close(own);
        _exit(0);
    }
    expect_exit_zero(hostile);
    struct stat after;
    assert_int_equal(fstat(fd, &after), 0);
    assert_int_equal(after.st_size, before.st_size);
    assert_int_equal(write(down[1], "g", 1), 1);
    expect_exit_code(reader, 0); /* SIGBUS would be SIGBUS_EXIT */
    /* and the arena still attaches */
    dh_shm_arena_t *b = NULL;
    assert_int_equal(dh_shm_arena_attach(&b, fd), 0);
    dh_shm_arena_destroy(&b);
    close(up[0]);
    close(down[1]);
    dh_shm_arena_destroy(&a);
}

/* The control of the test above, so that it can fail: a reader of a memfd without the
 * seals, truncated by a peer, does die of SIGBUS on its next touch. */
static void arena_reader_of_an_unsealed_memfd_dies_of_sigbus(void **state)
{
    (void)state;
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, ARENA_SIZE), 0);
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t reader = fork();
    assert_true(reader >= 0);
    if (reader == 0) {
        close(up[0]);
        close(down[1]);
        void *base = mmap(NULL, ARENA_SIZE, PROT_READ, MAP_SHARED, fd, 0);
        CHILD_EXPECT(base != MAP_FAILED);
        child_read_every_page(base, ARENA_SIZE);
        CHILD_EXPECT(write(up[1], "r", 1) == 1);
        char go = 0;
        child_read_exact(down[0], &go, 1);
        child_read_every_page(base, ARENA_SIZE);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    wait_readable(up[0], 5000);
    char ready = 0;
    read_exact(up[0], &ready, 1);
    assert_int_equal(ftruncate(fd, 0), 0); /* nothing stops it */
    assert_int_equal(write(down[1], "g", 1), 1);
    expect_exit_code(reader, SIGBUS_EXIT);
    close(up[0]);
    close(down[1]);
    close(fd);
}

/* ftruncate past RLIMIT_FSIZE kills the process with SIGXFSZ: the arena must refuse first,
 * naming the size and the limit. In a child, so the limit stays there. */
static void arena_new_over_file_size_limit_fails_at_start(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        CHILD_EXPECT(getrlimit(RLIMIT_FSIZE, &rl) == 0);
        rl.rlim_cur = ARENA_SIZE;
        CHILD_EXPECT(setrlimit(RLIMIT_FSIZE, &rl) == 0);
        dh_shm_arena_t *a = NULL;
        int rc = dh_shm_arena_new(&a, 8 * ARENA_SIZE, SLAB);
        CHILD_EXPECT(rc == -EFBIG && a == NULL);
        CHILD_EXPECT(strstr(dh_last_error(), "8388608 bytes"));
        CHILD_EXPECT(strstr(dh_last_error(), "RLIMIT_FSIZE of 1048576 bytes"));
        CHILD_EXPECT(dh_shm_arena_new(&a, ARENA_SIZE, SLAB) == 0); /* at the limit: fine */
        dh_shm_arena_destroy(&a);
        _exit(0);
    }
    expect_exit_zero(pid);
}

/* Size of this process's address space now (VmSize), in bytes. */
static uint64_t child_vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    CHILD_EXPECT(f);
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &kib) == 1)
            break;
    fclose(f);
    CHILD_EXPECT(kib > 0);
    return (uint64_t)kib * 1024;
}

/* Under RLIMIT_AS: an arena larger than the limit is refused before anything is made, and
 * one that fits the limit but not the room left under it fails at its mmap; both name the
 * limit. Not under the sanitizers: their shadow memory needs terabytes of address space. */
static void arena_new_over_address_space_limit_fails_at_start(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    skip();
#endif
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        CHILD_EXPECT(getrlimit(RLIMIT_AS, &rl) == 0);
        uint64_t limit = child_vm_size() + 32 * ARENA_SIZE; /* 32 MiB to spare */
        rl.rlim_cur = (rlim_t)limit;
        CHILD_EXPECT(setrlimit(RLIMIT_AS, &rl) == 0);
        char want[128];
        snprintf(want, sizeof want, "RLIMIT_AS of %llu bytes", (unsigned long long)limit);
        dh_shm_arena_t *a = NULL;
        int rc = dh_shm_arena_new(&a, (size_t)limit + ARENA_SIZE, SLAB);
        CHILD_EXPECT(rc == DH_ENOMEM && a == NULL);
        CHILD_EXPECT(strstr(dh_last_error(), want));
        /* under the limit, over the room left under it */
        size_t size = (size_t)(limit - ARENA_SIZE) / SLAB * SLAB;
        rc = dh_shm_arena_new(&a, size, SLAB);
        CHILD_EXPECT(rc == -ENOMEM && a == NULL);
        snprintf(want, sizeof want, "mmap of %zu bytes", size);
        CHILD_EXPECT(strstr(dh_last_error(), want));
        snprintf(want, sizeof want, "RLIMIT_AS %llu bytes", (unsigned long long)limit);
        CHILD_EXPECT(strstr(dh_last_error(), want));
        _exit(0);
    }
    expect_exit_zero(pid);
}

/* ---- numbered fault sites (a faults build; skipped otherwise) ----------------------- */

/* Makes an arena and uses it. A failed step of creation (memfd_create EMFILE, ftruncate or
 * fallocate ENOSPC, mmap ENOMEM) is an error naming the step and the size, with no fd,
 * mapping or allocation left (the sweep counts fds and allocations). */
static int new_use_destroy(void *ctx)
{
    (void)ctx;
    dh_shm_arena_t *a = NULL;
    int rc = dh_shm_arena_new(&a, ARENA_SIZE, SLAB);
    if (rc) {
        assert_null(a);
        assert_true(rc == -EMFILE || rc == -ENOSPC || rc == -ENOMEM);
        static const char *const steps[] = {"memfd_create of", "ftruncate of", "fallocate of",
                                            "mmap of"};
        int named = 0;
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
            named |= strstr(dh_last_error(), steps[i]) != NULL;
        assert_true(named);
        return rc;
    }
    void *p = NULL;
    alloc_ok(a, SLAB, 0, &p);
    memset(p, 1, SLAB);
    dh_shm_arena_destroy(&a);
    return 0;
}

static void arena_new_fails_cleanly_at_every_step(void **state)
{
    if (!dh_fault_enabled())
        skip();
    /* memfd_create, ftruncate, fallocate, mmap */
    assert_int_equal(dh_test_each_fault(DH_FAULT_SHM_CREATE, "shm arena: ", new_use_destroy, NULL),
                     4);
}

/* Attaches to the creator's arena and reads what it wrote. A failed dup (EMFILE) or mmap
 * (ENOMEM) names the fd; the creator's arena is untouched and the next attach works. */
typedef struct attach_ctx {
    dh_shm_arena_t *creator;
    dh_shm_handle_t h;
} attach_ctx_t;

static int attach_read_detach(void *ctx)
{
    attach_ctx_t *c = ctx;
    dh_shm_arena_t *view = NULL;
    int rc = dh_shm_arena_attach(&view, dh_shm_arena_fd(c->creator));
    if (rc) {
        assert_null(view);
        assert_true(rc == -EMFILE || rc == -ENOMEM);
        assert_non_null(strstr(dh_last_error(), rc == -EMFILE ? ": dup: " : ": mmap of "));
        return rc;
    }
    void *p = NULL;
    assert_int_equal(dh_shm_arena_resolve(view, &c->h, &p), 0);
    assert_int_equal(((unsigned char *)p)[0], 0x5a);
    dh_shm_arena_destroy(&view);
    return 0;
}

static void arena_attach_fails_cleanly_at_every_step(void **state)
{
    if (!dh_fault_enabled())
        skip();
    attach_ctx_t c = {.creator = new_arena()};
    void *p = NULL;
    c.h = alloc_ok(c.creator, 100, 0, &p);
    memset(p, 0x5a, 100);
    char what[64];
    snprintf(what, sizeof what, "shm attach: fd %d: ", dh_shm_arena_fd(c.creator));
    assert_int_equal(dh_test_each_fault(DH_FAULT_SHM_ATTACH, what, attach_read_detach, &c), 2);
    assert_int_equal(dh_shm_arena_refcount(c.creator, &c.h), 1);
    dh_shm_arena_destroy(&c.creator);
}

/* Three allocations, each reaching slabs never reserved before. When reserving them fails
 * (fallocate ENOSPC), the allocation is backpressure (DH_EAGAIN naming the bytes), no slab
 * is taken, and the next try on the same arena succeeds. */
static int alloc_fresh_slabs(void *ctx)
{
    (void)ctx;
    dh_shm_arena_t *a = new_arena();
    int failed = 0;
    for (int i = 0; i < 3; i++) {
        dh_shm_arena_stats_t before = stats_of(a);
        dh_shm_handle_t h;
        void *p = NULL;
        int rc = dh_shm_arena_alloc(a, 2 * SLAB, 0, &h, &p);
        if (rc) {
            assert_int_equal(rc, DH_EAGAIN);
            assert_non_null(strstr(dh_last_error(), "cannot reserve memory for"));
            dh_shm_arena_stats_t after = stats_of(a);
            assert_int_equal(after.slabs_used, before.slabs_used);
            assert_int_equal(after.allocations_live, before.allocations_live);
            char msg[512];
            snprintf(msg, sizeof msg, "%s", dh_last_error());
            rc = dh_shm_arena_alloc(a, 2 * SLAB, 0, &h, &p); /* the next try works */
            assert_int_equal(rc, 0);
            assert_string_equal(dh_last_error(), msg);
            failed = DH_EAGAIN;
        }
        memset(p, i, 2 * SLAB); /* the reserved slabs can be touched */
    }
    assert_int_equal(stats_of(a).slabs_used, 6);
    dh_shm_arena_destroy(&a);
    return failed;
}

static void arena_alloc_reserve_failure_is_backpressure(void **state)
{
    if (!dh_fault_enabled())
        skip();
    assert_int_equal(
        dh_test_each_fault(DH_FAULT_SHM_RESERVE, "shm alloc: ", alloc_fresh_slabs, NULL), 3);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(arena_new_lays_out_header_and_slabs),
    cmocka_unit_test(arena_new_rejects_bad_sizes),
    cmocka_unit_test(arena_alloc_unref_collect_reuses_slabs),
    cmocka_unit_test(arena_newest_allocation_collected_is_stale),
    cmocka_unit_test(arena_multi_slab_allocations_are_contiguous),
    cmocka_unit_test(arena_first_fit_finds_a_hole),
    cmocka_unit_test(arena_full_gives_eagain_then_recovers),
    cmocka_unit_test(arena_resolve_rejects_bad_handles),
    cmocka_unit_test(arena_attach_in_process_shares_memory_and_counts),
    cmocka_unit_test(arena_attach_rejects_bad_fds),
    cmocka_unit_test(arena_attach_rejects_bad_headers),
    cmocka_unit_test(arena_child_attaches_by_inherited_fd),
    cmocka_unit_test(arena_child_attaches_via_scm_rights),
    cmocka_unit_test(arena_reclaim_dead_frees_killed_client_slabs),
    cmocka_unit_test(arena_reclaim_dead_keeps_live_clients_slabs),
    cmocka_unit_test(arena_concurrent_ref_unref_keeps_count),
    cmocka_unit_test(arena_concurrent_last_unref_releases_once),
    cmocka_unit_test(arena_survives_each_allocation_failure),
    cmocka_unit_test(arena_memory_is_reserved_as_used),
    cmocka_unit_test(arena_hostile_peer_cannot_truncate_under_a_reader),
    cmocka_unit_test(arena_reader_of_an_unsealed_memfd_dies_of_sigbus),
    cmocka_unit_test(arena_new_over_file_size_limit_fails_at_start),
    cmocka_unit_test(arena_new_over_address_space_limit_fails_at_start),
    cmocka_unit_test(arena_new_fails_cleanly_at_every_step),
    cmocka_unit_test(arena_attach_fails_cleanly_at_every_step),
    cmocka_unit_test(arena_alloc_reserve_failure_is_backpressure),
};

DH_TEST_MAIN(tests)
