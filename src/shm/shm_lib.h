/* shm/shm_lib.h: what the rest of the library (the DataServer) uses of the shm module
 * beyond include/datahelix/shm.h: the probe of the memory this process may take (limits.c;
 * dh__ prefix, not exported). The arena's layout and the module's own internals are in
 * shm/shm_internal.h, which no other module includes. */
#ifndef DH_SHM_LIB_H
#define DH_SHM_LIB_H

#include <stdint.h>

/* Where limits.c reads the machine's memory; a NULL member is the real one. Tests point
 * them at fake trees. */
typedef struct dh__shm_probe {
    const char *proc_dir;   /* NULL = "/proc": meminfo and self/cgroup */
    const char *cgroup_dir; /* NULL = "/sys/fs/cgroup" */
} dh__shm_probe_t;

/* What the memory this process may take is bounded by (limits.c). */
typedef struct dh__shm_memory {
    uint64_t cgroup_limit_bytes; /* smallest memory limit of this process's memory cgroup
                                    and its ancestors; UINT64_MAX = none found */
    char cgroup_source[1200];    /* which file gave it, e.g. "cgroup /a memory.max" */
    uint64_t available_bytes;    /* MemAvailable + SwapFree now; UINT64_MAX = unknown */
} dh__shm_memory_t;

/* Fills *out from <proc>/self/cgroup, the cgroup files and <proc>/meminfo. probe may be
 * NULL. Never fails: what cannot be read is UINT64_MAX (no bound). */
void dh__shm_memory_probe(const dh__shm_probe_t *probe, dh__shm_memory_t *out);

/* The default budget of an arena when nothing sets one: a quarter of physical_bytes or of
 * the cgroup's limit, whichever is lower, and at most half of what the machine has available
 * now (MemAvailable + SwapFree). Without that last bound a default arena on a busy machine
 * exceeded what dh__shm_check_size allows and the loader refused to start. probe may be
 * NULL. */
uint64_t dh__shm_budget_default(const dh__shm_probe_t *probe, uint64_t physical_bytes);

#endif
