/* json_alloc.c: jansson's allocations, routed through dh_malloc/dh_free with a per-thread
 * failure flag and an optional per-thread scratch block (see core/internal.h).
 *
 * Why the flag: jansson reports some allocation failures as syntax errors, and drops bytes
 * silently on others; callers check dh__json_track_failed() to turn those into DH_ENOMEM.
 * Why the scratch: parsing one 250-byte profile row makes about 35 jansson allocations, and
 * the counted dh_malloc hook (atomics) plus the C library made up ~30% of a profile load.
 * While a thread has a scratch block set, its jansson allocations are bump-allocated from it
 * (frees inside it are no-ops); a request too big for what is left falls back to dh_malloc.
 * Other threads are unaffected (the state is thread-local). */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"

static _Thread_local bool json_alloc_failed;
static _Thread_local dh__json_scratch_t *json_scratch;

static void *json_tracked_malloc(size_t size)
{
    dh__json_scratch_t *s = json_scratch;
    if (s) {
        size_t need = (size + 15) & ~(size_t)15; /* keep max_align_t alignment */
        if (need >= size && need <= s->cap - s->used) {
            void *p = s->block + s->used;
            s->used += need;
            return p;
        }
    }
    void *p = dh_malloc(size);
    if (!p)
        json_alloc_failed = true;
    return p;
}

static void json_tracked_free(void *ptr)
{
    dh__json_scratch_t *s = json_scratch;
    if (s && (char *)ptr >= s->block && (char *)ptr < s->block + s->cap)
        return;
    dh_free(ptr);
}

void dh__json_use_allocator(void)
{
    static atomic_int installed;
    if (!atomic_exchange(&installed, 1))
        json_set_alloc_funcs(json_tracked_malloc, json_tracked_free);
}

void dh__json_track_begin(void)
{
    dh__json_use_allocator();
    json_alloc_failed = false;
}

bool dh__json_track_failed(void)
{
    return json_alloc_failed;
}

dh__json_scratch_t *dh__json_scratch_set(dh__json_scratch_t *scratch)
{
    dh__json_scratch_t *previous = json_scratch;
    json_scratch = scratch;
    return previous;
}

int dh__json_load_file(const char *path, json_t **root, json_error_t *jerr)
{
    dh__json_track_begin();
    errno = 0;
    *root = json_load_file(path, JSON_REJECT_DUPLICATES, jerr);
    if (!*root && json_error_code(jerr) == json_error_cannot_open_file) {
        int err = errno ? errno : EIO;
        return dh__set_error(-err, "%s: cannot open: %s", path, strerror(err));
    }
    return 0;
}

int dh__json_check(json_t *root, const json_error_t *jerr, const char *source)
{
    if (dh__json_track_failed() || (!root && json_error_code(jerr) == json_error_out_of_memory)) {
        json_decref(root);
        return dh__set_error(DH_ENOMEM, "%s: out of memory", source);
    }
    if (!root)
        return dh__set_error(DH_EPARSE, "%s:%d: not JSON: %s at column %d", source, jerr->line,
                             jerr->text, jerr->column);
    return 0;
}
