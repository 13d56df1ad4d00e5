/* profile.c: the profile set (one row of descriptor + predicted cost per sample,
 * docs/profiles.md, docs/design.md §3): its memory, its accessors, and a row added to it,
 * checked, by the reader or by dh_profile_set_add. The JSONL format is read in
 * profile_read.c, written in profile_write.c; the unknown fields a row keeps verbatim are
 * profile_extra.c (all share profile_internal.h).
 *
 * Strings live in a chunked arena owned by the set (rows point into it, so chunks are never
 * moved or reallocated), profile keys are interned in an open-addressing hash table (one
 * copy per distinct key, key_index = its slot in the key table), and rows sit in one
 * growable array. Memory is about sizeof(row) = 120 bytes per row (x up to 2 while the array
 * doubles) plus the row's strings.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/profile.h"
#include "core/internal.h"
#include "model/profile_internal.h"

/* ---- the set ------------------------------------------------------------------------ */

/* Arena chunk: strings are bump-allocated from `data`. Chunks start at 4 KiB (small sets
 * stay small) and double up to 1 MiB; a string larger than a quarter of the current chunk
 * size gets a chunk of its own, linked behind the current one so the current chunk's free
 * tail is not abandoned. Waste is at most the free tail of each full chunk. */
typedef struct arena_chunk {
    struct arena_chunk *prev;
    size_t used, cap;
    char data[];
} arena_chunk_t;

#define ARENA_FIRST_CHUNK ((size_t)4096)
#define ARENA_MAX_CHUNK ((size_t)1 << 20)
#define ROWS_FIRST_CAP 64

struct dh_profile_set {
    dh_profile_row_t *rows;
    size_t count, cap;
    arena_chunk_t *arena; /* the chunk allocations come from; older ones via prev */
    size_t arena_next_cap;
    const char **keys; /* key table: interned profile keys (in the arena) */
    size_t key_count, key_cap;
    uint32_t *slots; /* hash table over keys: 0 = empty, else key index + 1 */
    size_t slot_cap; /* a power of two, at least twice key_count */
};

int dh_profile_set_new(dh_profile_set_t **out)
{
    dh__json_use_allocator();
    dh_profile_set_t *set = dh_calloc(1, sizeof *set);
    *out = set;
    if (!set)
        return dh__set_error(DH_ENOMEM, "profile set: out of memory");
    set->arena_next_cap = ARENA_FIRST_CHUNK;
    return 0;
}

void dh_profile_set_destroy(dh_profile_set_t **pset)
{
    if (!pset || !*pset)
        return;
    dh_profile_set_t *set = *pset;
    for (arena_chunk_t *c = set->arena, *prev; c; c = prev) {
        prev = c->prev;
        dh_free(c);
    }
    dh_free(set->rows);
    dh_free(set->keys);
    dh_free(set->slots);
    dh_free(set);
    *pset = NULL;
}

size_t dh_profile_set_count(const dh_profile_set_t *set)
{
    return set->count;
}

const dh_profile_row_t *dh_profile_set_row(const dh_profile_set_t *set, size_t i)
{
    return i < set->count ? &set->rows[i] : NULL;
}

size_t dh_profile_set_key_count(const dh_profile_set_t *set)
{
    return set->key_count;
}

const char *dh_profile_set_key(const dh_profile_set_t *set, size_t k)
{
    return k < set->key_count ? set->keys[k] : NULL;
}

/* Copies len bytes plus a NUL into the arena. O(len). NULL on allocation failure. */
static char *arena_strndup(dh_profile_set_t *set, const char *s, size_t len)
{
    size_t need = len + 1;
    arena_chunk_t *cur = set->arena;
    if (!cur || cur->cap - cur->used < need) {
        bool oversize = need > set->arena_next_cap / 4;
        size_t cap = oversize ? need : set->arena_next_cap;
        arena_chunk_t *c = dh_malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->used = 0;
        c->cap = cap;
        if (oversize && cur) {
            c->prev = cur->prev; /* keep filling `cur`; this chunk holds one string */
            cur->prev = c;
        } else {
            c->prev = cur;
            set->arena = c;
            if (set->arena_next_cap < ARENA_MAX_CHUNK)
                set->arena_next_cap *= 2;
        }
        cur = c;
    }
    char *p = cur->data + cur->used;
    memcpy(p, s, len);
    p[len] = '\0';
    cur->used += need;
    return p;
}

/* FNV-1a: keys are short ("f16x224x224"), so a simple byte hash is enough. */
static uint32_t hash_key(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* Doubles the hash table and reinserts every key. O(key_count). */
static int slots_grow(dh_profile_set_t *set)
{
    size_t cap = set->slot_cap ? set->slot_cap * 2 : 16;
    uint32_t *slots = dh_calloc(cap, sizeof *slots);
    if (!slots)
        return DH_ENOMEM;
    for (size_t k = 0; k < set->key_count; k++) {
        size_t i = hash_key(set->keys[k]) & (cap - 1);
        while (slots[i])
            i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)(k + 1);
    }
    dh_free(set->slots);
    set->slots = slots;
    set->slot_cap = cap;
    return 0;
}

/* Finds or adds key; sets *index and *interned. Expected O(strlen(key)) (load <= 1/2). */
static int key_intern(dh_profile_set_t *set, const char *key, uint32_t *index,
                      const char **interned)
{
    if ((set->key_count + 1) * 2 > set->slot_cap && slots_grow(set) < 0)
        return DH_ENOMEM;
    size_t mask = set->slot_cap - 1, i = hash_key(key) & mask;
    for (; set->slots[i]; i = (i + 1) & mask) {
        uint32_t k = set->slots[i] - 1;
        if (strcmp(set->keys[k], key) == 0) {
            *index = k;
            *interned = set->keys[k];
            return 0;
        }
    }
    if (set->key_count == set->key_cap) {
        size_t cap = set->key_cap ? set->key_cap * 2 : 16;
        const char **keys = dh_reallocarray(set->keys, cap, sizeof *keys);
        if (!keys)
            return DH_ENOMEM;
        set->keys = keys;
        set->key_cap = cap;
    }
    char *copy = arena_strndup(set, key, strlen(key));
    if (!copy)
        return DH_ENOMEM;
    set->keys[set->key_count] = copy;
    set->slots[i] = (uint32_t)(set->key_count + 1);
    *index = (uint32_t)set->key_count++;
    *interned = copy;
    return 0;
}

/* Copies a validated row (strings, extra of extra_len bytes or NULL) into the set. Rows
 * grow by doubling: amortised O(1) per row plus the length of its strings. On failure the
 * set is unchanged apart from a few unused arena bytes. */
int dh__profile_append_row(dh_profile_set_t *set, const dh_profile_row_t *src, const char *extra,
                           size_t extra_len)
{
    if (set->count == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : ROWS_FIRST_CAP;
        dh_profile_row_t *rows = dh_reallocarray(set->rows, cap, sizeof *rows);
        if (!rows)
            return DH_ENOMEM;
        set->rows = rows;
        set->cap = cap;
    }
    dh_profile_row_t row = *src;
    row.id = arena_strndup(set, src->id, strlen(src->id));
    row.uri = arena_strndup(set, src->uri, strlen(src->uri));
    row.codec = src->codec ? arena_strndup(set, src->codec, strlen(src->codec)) : NULL;
    row.node = src->node ? arena_strndup(set, src->node, strlen(src->node)) : NULL;
    row.extra = extra ? arena_strndup(set, extra, extra_len) : NULL;
    if (!row.id || !row.uri || (src->codec && !row.codec) || (src->node && !row.node) ||
        (extra && !row.extra))
        return DH_ENOMEM;
    if (key_intern(set, src->profile_key, &row.key_index, &row.profile_key) < 0)
        return DH_ENOMEM;
    set->rows[set->count++] = row;
    return 0;
}

/* ---- adding ------------------------------------------------------------------------- */

int dh_profile_set_add(dh_profile_set_t *set, const dh_profile_row_t *row)
{
    char why[160];
    int bad = dh__profile_row_problem(row, why, sizeof why);
    if (bad >= 0)
        return dh__set_error(DH_ESCHEMA, "profile row %s: field '%s': %s",
                             row->id ? row->id : "(no id)", dh__profile_field_name(bad), why);
    char *extra = NULL;
    size_t extra_len = 0;
    if (row->extra && row->extra[0]) {
        int rc = dh__profile_extra_normalise(row->extra, &extra, &extra_len);
        if (rc < 0)
            return rc;
    }
    int rc = dh__profile_append_row(set, row, extra, extra_len);
    dh_free(extra);
    if (rc < 0)
        return dh__set_error(rc, "profile row %s: out of memory", row->id);
    return 0;
}
