/* alloc.h: every allocation of DataHelix goes through one hook.
 *
 * Tests install a hook that fails allocation N (dh_alloc_fail_after) to check that each
 * failure gives a clean error, no crash and no leak. JSON parsing (jansson) is routed
 * through the same hook. The hook is process-global: install it before any other thread
 * allocates. The counters are atomic, so counting is thread-safe.
 */
#ifndef DATAHELIX_ALLOC_H
#define DATAHELIX_ALLOC_H

#include "datahelix/export.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_allocator {
    void *(*malloc_fn)(size_t size);
    void *(*realloc_fn)(void *ptr, size_t size);
    void (*free_fn)(void *ptr);
} dh_allocator_t;

/* Installs an allocator (NULL restores the C library's). Not thread-safe: call at start-up. */
DH_EXTERN void dh_alloc_set(const dh_allocator_t *allocator);

/* Fault injection: the next `n` allocations succeed, the one after fails, then all succeed
 * again. n < 0 disables. Returns nothing; read dh_alloc_count() to size a loop. */
DH_EXTERN void dh_alloc_fail_after(long n);

/* Number of allocations made since the last dh_alloc_reset_count(). */
DH_EXTERN long dh_alloc_count(void);
DH_EXTERN void dh_alloc_reset_count(void);

/* Number of live allocations (malloc minus free) since start-up; a leak check for tests. */
DH_EXTERN long dh_alloc_live(void);

/* malloc/calloc/realloc/free/strdup through the hook. calloc and reallocarray check
 * count x size for overflow and fail with NULL. */
DH_EXTERN void *dh_malloc(size_t size);
DH_EXTERN void *dh_calloc(size_t count, size_t size);
DH_EXTERN void *dh_realloc(void *ptr, size_t size);
DH_EXTERN void *dh_reallocarray(void *ptr, size_t count, size_t size);
DH_EXTERN void dh_free(void *ptr);
DH_EXTERN char *dh_strdup(const char *s);
DH_EXTERN char *dh_strndup(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
