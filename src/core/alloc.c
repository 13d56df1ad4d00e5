/* alloc.c: the allocator hook and allocation fault injection (see alloc.h).
 *
 * Cost: two relaxed atomic increments per call on top of the C library. The "live" count
 * needs to pair frees with allocations, so dh_free(NULL) does not count. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "core/internal.h"

static dh_allocator_t current = {malloc, realloc, free};
static atomic_long alloc_count;
static atomic_long live_count;
static atomic_long fail_at = -1; /* absolute value of alloc_count at which to fail */

void dh_alloc_set(const dh_allocator_t *allocator)
{
    if (allocator)
        current = *allocator;
    else
        current = (dh_allocator_t){malloc, realloc, free};
}

void dh_alloc_fail_after(long n)
{
    atomic_store(&fail_at, n < 0 ? -1 : atomic_load(&alloc_count) + n);
}

long dh_alloc_count(void)
{
    return atomic_load(&alloc_count);
}

void dh_alloc_reset_count(void)
{
    atomic_store(&alloc_count, 0);
    atomic_store(&fail_at, -1);
}

long dh_alloc_live(void)
{
    return atomic_load(&live_count);
}

/* True if this allocation is the one chosen to fail. */
static int should_fail(void)
{
    long n = atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
    long f = atomic_load_explicit(&fail_at, memory_order_relaxed);
    return f >= 0 && n == f;
}

void *dh_malloc(size_t size)
{
    if (should_fail())
        return NULL;
    void *p = current.malloc_fn(size ? size : 1);
    if (p)
        atomic_fetch_add_explicit(&live_count, 1, memory_order_relaxed);
    return p;
}

void *dh_calloc(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = dh_malloc(count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void *dh_realloc(void *ptr, size_t size)
{
    if (!ptr)
        return dh_malloc(size);
    if (should_fail())
        return NULL;
    return current.realloc_fn(ptr, size ? size : 1);
}

void *dh_reallocarray(void *ptr, size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    return dh_realloc(ptr, count * size);
}

void dh_free(void *ptr)
{
    if (!ptr)
        return;
    atomic_fetch_sub_explicit(&live_count, 1, memory_order_relaxed);
    current.free_fn(ptr);
}

char *dh_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *p = dh_malloc(len + 1);
    if (!p)
        return NULL;
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

char *dh_strdup(const char *s)
{
    return dh_strndup(s, SIZE_MAX);
}
