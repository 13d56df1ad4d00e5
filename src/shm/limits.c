/* limits.c: whether this process can hold an arena of a given size, asked before the memfd
 * is made (docs/shared-memory.md, "Memory that cannot be had").
 *
 * An arena too large for the process fails at start with a message naming the size and the
 * limit, instead of later: RLIMIT_FSIZE (ftruncate past it kills the process with SIGXFSZ),
 * RLIMIT_AS (the mapping), the memory limit of the process's memory cgroup (v2 memory.max
 * or v1 memory.limit_in_bytes, the smallest on the path to the root) and the memory the
 * machine has now (MemAvailable + SwapFree in /proc/meminfo). The memfd is sparse, so a
 * filled arena takes its size only later; an arena over the memory bounds could never be
 * filled without the OOM killer or a stalled epoch.
 *
 * Cost: two getrlimit and a handful of small file reads (one per cgroup level), once per
 * arena. Limit: a snapshot; memory that other processes take after the start is not ours
 * to foresee (the arena's high-water fallocate then fails with backpressure, arena.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "datahelix/error.h"
#include "core/internal.h"
#include "shm/shm_internal.h"

/* v1 reports "no limit" as a huge page-rounded number (LONG_MAX & ~4095 on x86_64). */
#define CGROUP_V1_UNLIMITED ((uint64_t)1 << 62)

static double mib(uint64_t bytes)
{
    return (double)bytes / 1048576.0;
}

/* Reads a small text file into buf (NUL-terminated). Returns 0, or -1 if it cannot. */
static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n > 0 ? 0 : -1;
}

/* A file holding one unsigned number ("max" counts as none). Returns 0 with *out, or -1. */
static int read_u64(const char *path, uint64_t *out)
{
    char buf[64];
    if (read_small(path, buf, sizeof buf) < 0)
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || end == buf || (*end && *end != '\n'))
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* The path of this process's cgroup with the memory controller, from <proc>/self/cgroup:
 * the v1 line naming "memory" if any, else the v2 line ("0::PATH"). *v1 says which. */
static int memory_cgroup_path(const char *proc_dir, char *path, size_t cap, int *v1)
{
    char file[512], text[4096];
    snprintf(file, sizeof file, "%s/self/cgroup", proc_dir);
    if (read_small(file, text, sizeof text) < 0)
        return -1;
    int found = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = '\0';
        *c2 = '\0';
        const char *controllers = c1 + 1;
        bool is_v2 = strcmp(line, "0") == 0 && controllers[0] == '\0' && found < 0;
        bool is_memory = false;
        for (const char *s = controllers; (s = strstr(s, "memory")); s += 6)
            if ((s == controllers || s[-1] == ',') && (s[6] == '\0' || s[6] == ','))
                is_memory = true;
        if (is_memory || is_v2) {
            snprintf(path, cap, "%s", c2 + 1);
            *v1 = is_memory;
            found = 0;
            if (is_memory)
                break; /* a v1 memory controller is the one that limits */
        }
    }
    return found;
}

/* The smallest memory limit of the cgroup at `path` and its ancestors (below cgroup_dir).
 * Fills *limit and its source ("cgroup /a/b memory.max"); UINT64_MAX when there is none. */
static void cgroup_limit(const char *proc_dir, const char *cgroup_dir, uint64_t *limit,
                         char *source, size_t cap)
{
    *limit = UINT64_MAX;
    char rel[1024];
    int v1 = 0;
    if (memory_cgroup_path(proc_dir, rel, sizeof rel, &v1) < 0)
        return;
    char base[512], probe[1600];
    if (v1) {
        snprintf(base, sizeof base, "%s/memory", cgroup_dir);
    } else {
        snprintf(base, sizeof base, "%s", cgroup_dir);
        snprintf(probe, sizeof probe, "%s/cgroup.controllers", base);
        FILE *f = fopen(probe, "re");
        if (f)
            fclose(f);
        else /* hybrid hierarchy: v2 mounted under unified/ */
            snprintf(base, sizeof base, "%s/unified", cgroup_dir);
    }
    const char *file = v1 ? "memory.limit_in_bytes" : "memory.max";
    size_t len = strlen(rel);
    while (len > 1 && rel[len - 1] == '/')
        rel[--len] = '\0';
    for (;;) {
        uint64_t v;
        snprintf(probe, sizeof probe, "%s%s%s/%s", base, rel[0] == '/' ? "" : "/",
                 strcmp(rel, "/") == 0 ? "" : rel, file);
        if (read_u64(probe, &v) == 0 && !(v1 && v >= CGROUP_V1_UNLIMITED) && v < *limit) {
            *limit = v;
            snprintf(source, cap, "cgroup %s %s", rel[0] ? rel : "/", file);
        }
        char *slash = strrchr(rel, '/');
        if (!slash || strcmp(rel, "/") == 0 || rel[0] == '\0')
            break;
        if (slash == rel)
            rel[1] = '\0'; /* up to the root, "/" */
        else
            *slash = '\0';
    }
}

/* MemAvailable + SwapFree of <proc>/meminfo in bytes, or UINT64_MAX if unknown. */
static uint64_t meminfo_available(const char *proc_dir)
{
    char file[512], text[8192];
    snprintf(file, sizeof file, "%s/meminfo", proc_dir);
    if (read_small(file, text, sizeof text) < 0)
        return UINT64_MAX;
    const char *avail = strstr(text, "MemAvailable:"), *swap = strstr(text, "SwapFree:");
    if (!avail)
        return UINT64_MAX;
    uint64_t kib = strtoull(avail + strlen("MemAvailable:"), NULL, 10);
    if (swap)
        kib += strtoull(swap + strlen("SwapFree:"), NULL, 10);
    return kib > UINT64_MAX / 1024 ? UINT64_MAX : kib * 1024;
}

void dh__shm_memory_probe(const dh__shm_probe_t *probe, dh__shm_memory_t *out)
{
    const char *proc_dir = probe && probe->proc_dir ? probe->proc_dir : "/proc";
    const char *cgroup_dir = probe && probe->cgroup_dir ? probe->cgroup_dir : "/sys/fs/cgroup";
    memset(out, 0, sizeof *out);
    cgroup_limit(proc_dir, cgroup_dir, &out->cgroup_limit_bytes, out->cgroup_source,
                 sizeof out->cgroup_source);
    out->available_bytes = meminfo_available(proc_dir);
}

uint64_t dh__shm_budget_default(const dh__shm_probe_t *probe, uint64_t physical_bytes)
{
    dh__shm_memory_t mem;
    dh__shm_memory_probe(probe, &mem);
    uint64_t memory = physical_bytes;
    if (mem.cgroup_limit_bytes < memory)
        memory = mem.cgroup_limit_bytes;
    uint64_t budget = memory / 4;
    if (mem.available_bytes != UINT64_MAX && mem.available_bytes / 2 < budget)
        budget = mem.available_bytes / 2;
    return budget;
}

int dh__shm_check_size(uint64_t size, const dh__shm_probe_t *probe)
{
    struct rlimit rl;
    /* ftruncate past RLIMIT_FSIZE does not just fail: the kernel sends SIGXFSZ, whose
     * default action ends the process (a crash at start, not an error). */
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        size > (uint64_t)rl.rlim_cur)
        return dh__set_error(-EFBIG,
                             "shm arena: %" PRIu64 " bytes (%.1f MiB) exceed this process's file "
                             "size limit RLIMIT_FSIZE of %" PRIu64 " bytes (%.1f MiB; ulimit -f)",
                             size, mib(size), (uint64_t)rl.rlim_cur, mib((uint64_t)rl.rlim_cur));
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        size > (uint64_t)rl.rlim_cur)
        return dh__set_error(DH_ENOMEM,
                             "shm arena: %" PRIu64 " bytes (%.1f MiB) exceed this process's "
                             "address space limit RLIMIT_AS of %" PRIu64
                             " bytes (%.1f MiB; ulimit -v)",
                             size, mib(size), (uint64_t)rl.rlim_cur, mib((uint64_t)rl.rlim_cur));
    dh__shm_memory_t mem;
    dh__shm_memory_probe(probe, &mem);
    if (size > mem.cgroup_limit_bytes)
        return dh__set_error(DH_ENOMEM,
                             "shm arena: %" PRIu64 " bytes (%.1f MiB) exceed the memory limit of "
                             "this process's cgroup, %" PRIu64 " bytes (%.1f MiB; %s)",
                             size, mib(size), mem.cgroup_limit_bytes, mib(mem.cgroup_limit_bytes),
                             mem.cgroup_source);
    if (size > mem.available_bytes)
        return dh__set_error(DH_ENOMEM,
                             "shm arena: %" PRIu64 " bytes (%.1f MiB) exceed the memory the "
                             "machine has available, %" PRIu64
                             " bytes (%.1f MiB; MemAvailable + SwapFree in %s/meminfo)",
                             size, mib(size), mem.available_bytes, mib(mem.available_bytes),
                             probe && probe->proc_dir ? probe->proc_dir : "/proc");
    return 0;
}
