/* Tests of the arena's start-up limits (src/shm/limits.c): the memory cgroup's limit (v2 and
 * v1, the smallest ancestor, "max" and v1's "unlimited" ignored), MemAvailable + SwapFree,
 * and the message of an arena too large for them, naming its size and the limit. The
 * cgroup and /proc trees are fakes under the test's scratch directory; the rlimits are
 * tested through dh_shm_arena_new in test_arena.c. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "shm/shm_internal.h"

#define MIB ((uint64_t)1 << 20)

/* mkdir -p of the test's scratch path `rel`; returns the full path (static buffer). */
static const char *make_dirs(const char *rel)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s", dh_test_path(rel));
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    mkdir(path, 0755);
    return path;
}

static void write_at(const char *dir, const char *name, const char *text)
{
    char path[2400];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_true(n > 0 && (size_t)n < sizeof path);
    dh_test_write_file(path, text);
}

/* A fake /proc with this meminfo and cgroup file, and an empty fake /sys/fs/cgroup. */
static void fake_proc(const char *tag, const char *meminfo, const char *cgroup,
                      dh__shm_probe_t *probe)
{
    static char proc[1024], sys[1024];
    char rel[256];
    snprintf(rel, sizeof rel, "%s/proc/self", tag);
    make_dirs(rel);
    snprintf(rel, sizeof rel, "%s/proc", tag);
    snprintf(proc, sizeof proc, "%s", make_dirs(rel));
    write_at(proc, "meminfo", meminfo);
    write_at(proc, "self/cgroup", cgroup);
    snprintf(rel, sizeof rel, "%s/sys", tag);
    snprintf(sys, sizeof sys, "%s", make_dirs(rel));
    probe->proc_dir = proc;
    probe->cgroup_dir = sys;
}

static void expect_fail_naming(int rc, int want, const char *a, const char *b)
{
    if (rc != want || !strstr(dh_last_error(), a) || !strstr(dh_last_error(), b))
        print_error("got %s (%s), want %s naming '%s' and '%s'\n", dh_err_name(rc), dh_last_error(),
                    dh_err_name(want), a, b);
    assert_int_equal(rc, want);
    assert_non_null(strstr(dh_last_error(), a));
    assert_non_null(strstr(dh_last_error(), b));
}

static void limits_cgroup_v2_smallest_ancestor_bounds_the_arena(void **state)
{
    (void)state;
    dh__shm_probe_t probe;
    fake_proc("v2", "MemTotal: 100000000 kB\nMemAvailable: 90000000 kB\nSwapFree: 0 kB\n",
              "0::/job/rank\n", &probe);
    char path[2400];
    snprintf(path, sizeof path, "%s/job/rank", probe.cgroup_dir);
    make_dirs("v2/sys/job/rank");
    write_at(probe.cgroup_dir, "cgroup.controllers", "cpu memory\n");
    write_at(probe.cgroup_dir, "memory.max", "max\n"); /* the root: no limit */
    write_at(path, "memory.max", "max\n");
    snprintf(path, sizeof path, "%s/job", probe.cgroup_dir);
    write_at(path, "memory.max", "268435456\n"); /* the parent: 256 MiB */
    dh__shm_memory_t mem;
    dh__shm_memory_probe(&probe, &mem);
    assert_int_equal(mem.cgroup_limit_bytes, 256 * MIB);
    assert_non_null(strstr(mem.cgroup_source, "cgroup /job memory.max"));
    assert_int_equal(mem.available_bytes, (uint64_t)90000000 * 1024);

    assert_int_equal(dh__shm_check_size(256 * MIB, &probe), 0);
    expect_fail_naming(dh__shm_check_size(257 * MIB, &probe), DH_ENOMEM, "269484032 bytes",
                       "cgroup, 268435456 bytes");
    assert_non_null(strstr(dh_last_error(), "cgroup /job memory.max"));
}

static void limits_cgroup_v1_memory_controller_bounds_the_arena(void **state)
{
    (void)state;
    dh__shm_probe_t probe;
    fake_proc("v1", "MemAvailable: 90000000 kB\n",
              "5:cpu,cpuacct:/other\n4:memory:/pod/ctr\n0::/\n", &probe);
    make_dirs("v1/sys/memory/pod/ctr");
    char path[2400];
    snprintf(path, sizeof path, "%s/memory/pod/ctr", probe.cgroup_dir);
    write_at(path, "memory.limit_in_bytes", "134217728\n"); /* 128 MiB */
    snprintf(path, sizeof path, "%s/memory/pod", probe.cgroup_dir);
    write_at(path, "memory.limit_in_bytes", "9223372036854771712\n"); /* v1's "unlimited" */
    dh__shm_memory_t mem;
    dh__shm_memory_probe(&probe, &mem);
    assert_int_equal(mem.cgroup_limit_bytes, 128 * MIB);
    assert_non_null(strstr(mem.cgroup_source, "cgroup /pod/ctr memory.limit_in_bytes"));
    expect_fail_naming(dh__shm_check_size(200 * MIB, &probe), DH_ENOMEM, "209715200 bytes",
                       "134217728 bytes");
}

static void limits_available_memory_bounds_the_arena(void **state)
{
    (void)state;
    dh__shm_probe_t probe;
    /* 64 MiB available + 16 MiB of free swap = 80 MiB; no cgroup files at all */
    fake_proc("mem",
              "MemTotal: 1000000 kB\nMemFree: 1000 kB\nMemAvailable: 65536 kB\n"
              "SwapTotal: 16384 kB\nSwapFree: 16384 kB\n",
              "0::/\n", &probe);
    dh__shm_memory_t mem;
    dh__shm_memory_probe(&probe, &mem);
    assert_int_equal(mem.cgroup_limit_bytes, UINT64_MAX);
    assert_int_equal(mem.available_bytes, 80 * MIB);
    assert_int_equal(dh__shm_check_size(80 * MIB, &probe), 0);
    expect_fail_naming(dh__shm_check_size(100 * MIB, &probe), DH_ENOMEM, "104857600 bytes",
                       "available, 83886080 bytes");
    assert_non_null(strstr(dh_last_error(), "MemAvailable + SwapFree"));
}

static void limits_default_budget_is_a_quarter_bounded_by_cgroup_and_available(void **state)
{
    (void)state;
    dh__shm_probe_t probe;
    /* plenty available: a quarter of physical memory */
    fake_proc("budget-idle", "MemTotal: 8388608 kB\nMemAvailable: 8000000 kB\nSwapFree: 0 kB\n",
              "0::/\n", &probe);
    assert_int_equal(dh__shm_budget_default(&probe, 8192 * MIB), 2048 * MIB);
    /* a busy machine: 2 GiB available of 8 -> 1 GiB, not the quarter (2 GiB) that
     * dh__shm_check_size would refuse once the machine has less than that left */
    fake_proc("budget-busy", "MemTotal: 8388608 kB\nMemAvailable: 2097152 kB\nSwapFree: 0 kB\n",
              "0::/\n", &probe);
    uint64_t busy = dh__shm_budget_default(&probe, 8192 * MIB);
    assert_int_equal(busy, 1024 * MIB);
    assert_int_equal(dh__shm_check_size(busy, &probe), 0);
    /* unknown availability: the quarter */
    fake_proc("budget-unknown", "MemTotal: 8388608 kB\n", "0::/\n", &probe);
    assert_int_equal(dh__shm_budget_default(&probe, 8192 * MIB), 2048 * MIB);
}

static void limits_unreadable_files_give_no_bound(void **state)
{
    (void)state;
    dh__shm_probe_t probe = {.proc_dir = dh_test_path("nowhere/proc"),
                             .cgroup_dir = dh_test_path("nowhere/sys")};
    dh__shm_memory_t mem;
    dh__shm_memory_probe(&probe, &mem);
    assert_int_equal(mem.cgroup_limit_bytes, UINT64_MAX);
    assert_int_equal(mem.available_bytes, UINT64_MAX);
    assert_int_equal(dh__shm_check_size((uint64_t)1 << 40, &probe), 0);
    /* junk in the files is no bound either */
    fake_proc("junk", "MemAvailable: lots\n", "0::/\n", &probe);
    write_at(probe.cgroup_dir, "cgroup.controllers", "memory\n");
    write_at(probe.cgroup_dir, "memory.max", "12abc\n");
    dh__shm_memory_probe(&probe, &mem);
    assert_int_equal(mem.cgroup_limit_bytes, UINT64_MAX);
}

/* This machine: an arena of 2^49 bytes (512 TiB) cannot be had anywhere we run. */
static void limits_real_machine_refuses_an_impossible_arena(void **state)
{
    (void)state;
    dh__shm_memory_t mem;
    dh__shm_memory_probe(NULL, &mem);
    uint64_t huge = (uint64_t)1 << 49;
    if (mem.available_bytes >= huge)
        skip();
    expect_fail_naming(dh__shm_check_size(huge, NULL), DH_ENOMEM, "562949953421312 bytes",
                       "exceed");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(limits_cgroup_v2_smallest_ancestor_bounds_the_arena),
    cmocka_unit_test(limits_cgroup_v1_memory_controller_bounds_the_arena),
    cmocka_unit_test(limits_available_memory_bounds_the_arena),
    cmocka_unit_test(limits_default_budget_is_a_quarter_bounded_by_cgroup_and_available),
    cmocka_unit_test(limits_unreadable_files_give_no_bound),
    cmocka_unit_test(limits_real_machine_refuses_an_impossible_arena),
};

DH_TEST_MAIN(tests)
