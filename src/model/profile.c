/* profile.c: the profile set (one row of descriptor + predicted cost per sample) and its
 * JSONL interchange format (docs/profiles.md, docs/design.md §3).
 *
 * Loading is the hot path: the planner and the benchmarks read sets of millions of rows.
 * Each line is parsed by jansson (json_loadb), the known fields are copied out, and the
 * parsed object is dropped at once. Strings live in a chunked arena owned by the set (rows
 * point into it, so chunks are never moved or reallocated), profile keys are interned in an
 * open-addressing hash table (one copy per distinct key, key_index = its slot in the key
 * table), and rows sit in one growable array. Memory is about sizeof(row) = 120 bytes per
 * row (x up to 2 while the array doubles) plus the row's strings; the jansson object of a
 * line lives only while that line is processed.
 *
 * Unknown fields are kept verbatim (their source text with whitespace outside strings
 * removed) in row.extra, so a round trip through the writer never rewrites a number
 * (jansson would print 0.1 as 0.10000000000000001).
 *
 * Allocation failure: jansson does not report every allocation failure it meets (its
 * lexer drops bytes when a buffer cannot grow), so this file routes jansson's allocations
 * through a thin wrapper over dh_malloc that records failures in a thread-local flag, and
 * a line that saw one fails with DH_ENOMEM whatever jansson returned. The same wrapper
 * serves jansson from a per-line scratch block while a loader runs (see below).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/profile.h"
#include "core/internal.h"

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
static int append_row(dh_profile_set_t *set, const dh_profile_row_t *src, const char *extra,
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

/* ---- fields ------------------------------------------------------------------------- */

typedef enum {
    F_ID,
    F_URI,
    F_PROFILE_KEY,
    F_FRAMES,
    F_HEIGHT,
    F_WIDTH,
    F_TOKENS_EST,
    F_CPU_S_EST,
    F_IN_BYTES,
    F_OUT_BYTES,
    F_DURATION_S,
    F_FPS,
    F_TEXT_LEN,
    F_CODEC,
    F_NODE,
    F_COUNT
} field_t;

typedef enum {
    K_STRING, /* a string (required ones non-empty) */
    K_DIM,    /* a JSON integer in [1, INT32_MAX] */
    K_COUNT,  /* a JSON integer >= 0 */
    K_NUMBER, /* a finite JSON number >= 0 (integer or real) */
} field_kind_t;

static const struct field_info {
    const char *name;
    uint8_t len;
    uint8_t kind;
    bool required;
} fields[F_COUNT] = {
#define FIELD(name, kind, required)                                                                \
    {                                                                                              \
        name, sizeof(name) - 1, kind, required                                                     \
    }
    [F_ID] = FIELD("id", K_STRING, true),
    [F_URI] = FIELD("uri", K_STRING, true),
    [F_PROFILE_KEY] = FIELD("profile_key", K_STRING, true),
    [F_FRAMES] = FIELD("frames", K_DIM, true),
    [F_HEIGHT] = FIELD("height", K_DIM, true),
    [F_WIDTH] = FIELD("width", K_DIM, true),
    [F_TOKENS_EST] = FIELD("tokens_est", K_COUNT, true),
    [F_CPU_S_EST] = FIELD("cpu_s_est", K_NUMBER, true),
    [F_IN_BYTES] = FIELD("in_bytes", K_COUNT, true),
    [F_OUT_BYTES] = FIELD("out_bytes", K_COUNT, true),
    [F_DURATION_S] = FIELD("duration_s", K_NUMBER, false),
    [F_FPS] = FIELD("fps", K_NUMBER, false),
    [F_TEXT_LEN] = FIELD("text_len", K_COUNT, false),
    [F_CODEC] = FIELD("codec", K_STRING, false),
    [F_NODE] = FIELD("node", K_STRING, false),
#undef FIELD
};

/* Index of a known field name, or -1. A linear scan of 15 short names, length first:
 * a few ns per key, small next to jansson's parse. */
static int field_lookup(const char *name, size_t len)
{
    for (int f = 0; f < F_COUNT; f++)
        if (fields[f].len == len && memcmp(fields[f].name, name, len) == 0)
            return f;
    return -1;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

/* The first field of a row with an impossible value, with the reason in why[]; or -1.
 * Shared by the loader (after type checks) and dh_profile_set_add. */
static int row_problem(const dh_profile_row_t *r, char *why, size_t why_size)
{
    const char *strings[] = {[F_ID] = r->id, [F_URI] = r->uri, [F_PROFILE_KEY] = r->profile_key};
    for (int f = F_ID; f <= F_PROFILE_KEY; f++)
        if (!strings[f] || !strings[f][0]) {
            snprintf(why, why_size, "%s", strings[f] ? "must not be empty" : "missing");
            return f;
        }
    const int32_t dims[] = {[F_FRAMES] = r->frames, [F_HEIGHT] = r->height, [F_WIDTH] = r->width};
    for (int f = F_FRAMES; f <= F_WIDTH; f++)
        if (dims[f] <= 0) {
            snprintf(why, why_size, "must be > 0, got %" PRId32, dims[f]);
            return f;
        }
    const struct {
        int field;
        int64_t value;
    } counts[] = {{F_TOKENS_EST, r->tokens_est},
                  {F_IN_BYTES, r->in_bytes},
                  {F_OUT_BYTES, r->out_bytes},
                  {F_TEXT_LEN, r->text_len}};
    for (size_t i = 0; i < DH_ARRAY_LEN(counts); i++)
        if (counts[i].value < 0) {
            snprintf(why, why_size, "must be >= 0, got %" PRId64, counts[i].value);
            return counts[i].field;
        }
    const struct {
        int field;
        double value;
    } numbers[] = {{F_CPU_S_EST, r->cpu_s_est}, {F_DURATION_S, r->duration_s}, {F_FPS, r->fps}};
    for (size_t i = 0; i < DH_ARRAY_LEN(numbers); i++)
        if (!isfinite(numbers[i].value) || numbers[i].value < 0) {
            snprintf(why, why_size, "must be a finite number >= 0, got %g", numbers[i].value);
            return numbers[i].field;
        }
    return -1;
}

/* Stores the JSON value v of known field f into *row after checking its type. Returns -1
 * and a reason in why[] if the type is wrong. Strings are borrowed from v. A JSON null for
 * an optional field means absent (Python writers emit None as null). */
static int field_read(int f, json_t *v, dh_profile_row_t *row, char *why, size_t why_size)
{
    const struct field_info *fi = &fields[f];
    if (json_is_null(v) && !fi->required)
        return 0;
    switch (fi->kind) {
    case K_STRING: {
        if (!json_is_string(v))
            goto wrong_type;
        const char *s = json_string_value(v);
        switch (f) {
        case F_ID:
            row->id = s;
            break;
        case F_URI:
            row->uri = s;
            break;
        case F_PROFILE_KEY:
            row->profile_key = s;
            break;
        case F_CODEC:
            row->codec = s;
            break;
        case F_NODE:
            row->node = s;
            break;
        }
        return 0;
    }
    case K_DIM: {
        if (!json_is_integer(v))
            goto wrong_type;
        json_int_t x = json_integer_value(v);
        if (x > INT32_MAX) {
            snprintf(why, why_size, "%" JSON_INTEGER_FORMAT " is out of range (max %d)", x,
                     INT32_MAX);
            return -1;
        }
        /* Keep the sign so row_problem reports "must be > 0, got -3". */
        int32_t d = x < INT32_MIN ? INT32_MIN : (int32_t)x;
        if (f == F_FRAMES)
            row->frames = d;
        else if (f == F_HEIGHT)
            row->height = d;
        else
            row->width = d;
        return 0;
    }
    case K_COUNT: {
        if (!json_is_integer(v))
            goto wrong_type;
        int64_t x = json_integer_value(v);
        if (f == F_TOKENS_EST)
            row->tokens_est = x;
        else if (f == F_IN_BYTES)
            row->in_bytes = x;
        else if (f == F_OUT_BYTES)
            row->out_bytes = x;
        else
            row->text_len = x;
        return 0;
    }
    case K_NUMBER: {
        if (!json_is_number(v))
            goto wrong_type;
        double x = json_number_value(v);
        if (f == F_CPU_S_EST)
            row->cpu_s_est = x;
        else if (f == F_DURATION_S)
            row->duration_s = x;
        else
            row->fps = x;
        return 0;
    }
    }
wrong_type:
    snprintf(why, why_size, "expected %s, got %s",
             fi->kind == K_STRING  ? "a string"
             : fi->kind == K_DIM   ? "an integer > 0"
             : fi->kind == K_COUNT ? "an integer >= 0"
                                   : "a number >= 0",
             json_type_name(v));
    return -1;
}

/* ---- raw member scanning (for verbatim extras) -------------------------------------- */

/* These walk text that jansson has already accepted as one JSON object, so they need no
 * error checks. All are O(length of what they skip). */

static bool is_json_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_json_ws(*p))
        p++;
    return p;
}

/* p at the opening quote; returns the position after the closing quote. */
static const char *skip_string(const char *p, const char *end)
{
    for (p++; p < end && *p != '"'; p++)
        if (*p == '\\')
            p++;
    return p < end ? p + 1 : end;
}

static const char *skip_value(const char *p, const char *end)
{
    if (*p == '"')
        return skip_string(p, end);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                p = skip_string(p, end);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return end;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && !is_json_ws(*p))
        p++;
    return p;
}

/* Appends [p, end) to dst without the whitespace outside strings; returns the new end. */
static char *copy_compact(char *dst, const char *p, const char *end)
{
    while (p < end) {
        if (*p == '"') {
            const char *q = skip_string(p, end);
            memcpy(dst, p, (size_t)(q - p));
            dst += q - p;
            p = q;
        } else if (is_json_ws(*p)) {
            p++;
        } else {
            *dst++ = *p++;
        }
    }
    return dst;
}

/* Known-field index of a raw quoted key, or -1. A key written with escapes ("\u0069d")
 * is decoded through jansson so it matches what json_object_foreach saw. */
static int raw_key_field(const char *key, const char *key_end)
{
    const char *inner = key + 1;
    size_t len = (size_t)(key_end - key) - 2;
    if (!memchr(inner, '\\', len))
        return field_lookup(inner, len);
    json_t *s = json_loadb(key, (size_t)(key_end - key), JSON_DECODE_ANY, NULL);
    int f = s && json_is_string(s) ? field_lookup(json_string_value(s), json_string_length(s)) : -1;
    json_decref(s);
    return f;
}

/* Writes into buf (room for len + 3 bytes) the compact object of the members of the JSON
 * object text [text, text+len) whose keys are not known fields, or "{}" if none; returns
 * the length written. Members are kept in source order, duplicates included (verbatim). */
static size_t extract_extra(const char *text, size_t len, char *buf)
{
    const char *p = text, *end = text + len;
    char *out = buf;
    *out++ = '{';
    p = skip_ws(p, end);
    p++; /* '{' */
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p == '}')
            break;
        const char *key = p, *key_end = skip_string(p, end);
        p = skip_ws(key_end, end);
        p = skip_ws(p + 1, end); /* ':' */
        const char *value = p;
        p = skip_value(p, end);
        if (raw_key_field(key, key_end) < 0) {
            if (out > buf + 1)
                *out++ = ',';
            memcpy(out, key, (size_t)(key_end - key));
            out += key_end - key;
            *out++ = ':';
            out = copy_compact(out, value, p);
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',')
            p++;
    }
    *out++ = '}';
    return (size_t)(out - buf);
}

/* ---- loading -------------------------------------------------------------------------- */

typedef struct loader {
    dh_profile_set_t *set;
    const char *name; /* path, or "<stdin>", for messages */
    size_t line;      /* 1-based number of the line being read */
    char *scratch;    /* holds a row's extra text before it is copied to the arena */
    size_t scratch_cap;
    dh__json_scratch_t *json;       /* jansson's per-line scratch (header + block, one malloc) */
    dh__json_scratch_t *json_saved; /* this thread's scratch before the loader started */
} loader_t;

/* Sets up the loader and activates its jansson scratch block on this thread. */
static int loader_begin(loader_t *ld, dh_profile_set_t *set, const char *name)
{
    *ld = (loader_t){.set = set, .name = name, .line = 1};
    /* The header sits in front of the block; 64 bytes keep the block 16-byte aligned. */
    ld->json = dh_malloc(64 + DH__JSON_SCRATCH_SIZE);
    if (!ld->json)
        return dh__set_error(DH_ENOMEM, "%s: out of memory for the parser", name);
    *ld->json = (dh__json_scratch_t){.block = (char *)ld->json + 64, .cap = DH__JSON_SCRATCH_SIZE};
    ld->json_saved = dh__json_scratch_set(ld->json);
    return 0;
}

static void loader_done(loader_t *ld)
{
    if (ld->json) {
        dh__json_scratch_set(ld->json_saved);
        dh_free(ld->json);
        ld->json = NULL;
    }
    dh_free(ld->scratch);
    ld->scratch = NULL;
}

static int loader_error(const loader_t *ld, int err, int field, const char *why)
{
    return dh__set_error(err, "%s:%zu: field '%s': %s", ld->name, ld->line, fields[field].name,
                         why);
}

/* Parses one line (without its '\n') and appends its row. `unterminated` is true for a
 * last line with no newline, to hint at truncation when it does not parse. */
static int load_line(loader_t *ld, const char *text, size_t len, bool unterminated)
{
    /* Trailing '\r' (CRLF files) and surrounding whitespace; blank lines are skipped. */
    while (len && is_json_ws(text[len - 1]))
        len--;
    size_t lead = 0;
    if (ld->line == 1 && len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        lead = 3; /* UTF-8 byte order mark written by some editors */
    while (lead < len && is_json_ws(text[lead]))
        lead++;
    if (lead == len)
        return 0;
    text += lead;
    len -= lead;

    /* A NUL byte is never JSON text, but jansson 2.14 accepts one after a number ("1\0"),
     * and the extra scanner would copy it into a C string that ends there: the row written
     * back would not parse (found by tests/fuzz/fuzz_profiles.c). */
    const char *nul = memchr(text, '\0', len);
    if (nul)
        return dh__set_error(DH_EPARSE, "%s:%zu: not JSON: a NUL byte at column %zu", ld->name,
                             ld->line, (size_t)(nul - text) + 1 + lead);
    json_error_t jerr;
    dh__json_track_begin();
    ld->json->used = 0; /* the previous line's objects are all released */
    /* JSON_DECODE_ANY so a scalar line reads as "not a JSON object", not a syntax error.
     * Duplicate keys are allowed (the last wins), as in most JSON readers. */
    json_t *root = json_loadb(text, len, JSON_DECODE_ANY, &jerr);
    int rc = 0;
    if (dh__json_track_failed()) {
        rc = dh__set_error(DH_ENOMEM, "%s:%zu: out of memory parsing the line", ld->name, ld->line);
        goto out;
    }
    if (!root) {
        rc = dh__set_error(DH_EPARSE, "%s:%zu: not JSON: %s at column %zu%s", ld->name, ld->line,
                           jerr.text, (size_t)(jerr.column > 0 ? jerr.column : 0) + lead,
                           unterminated ? " (the file ends inside this line: truncated?)" : "");
        goto out;
    }
    if (!json_is_object(root)) {
        rc = dh__set_error(DH_EPARSE, "%s:%zu: not a JSON object (got %s)", ld->name, ld->line,
                           json_type_name(root));
        goto out;
    }

    dh_profile_row_t row = {0};
    uint32_t seen = 0;
    size_t known = 0;
    char why[160];
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        int f = field_lookup(key, strlen(key));
        if (f < 0)
            continue;
        known++;
        seen |= 1u << f;
        if (field_read(f, value, &row, why, sizeof why) < 0) {
            rc = loader_error(ld, DH_ESCHEMA, f, why);
            goto out;
        }
    }
    for (int f = 0; f < F_COUNT; f++)
        if (fields[f].required && !(seen & (1u << f))) {
            rc = loader_error(ld, DH_ESCHEMA, f, "missing");
            goto out;
        }
    int bad = row_problem(&row, why, sizeof why);
    if (bad >= 0) {
        rc = loader_error(ld, DH_ESCHEMA, bad, why);
        goto out;
    }

    /* Extras cost a second pass over the line, only when the object has unknown keys. */
    size_t extra_len = 0;
    if (json_object_size(root) > known) {
        if (ld->scratch_cap < len + 3) {
            char *s = dh_realloc(ld->scratch, len + 3);
            if (!s) {
                rc = dh__set_error(DH_ENOMEM, "%s:%zu: out of memory", ld->name, ld->line);
                goto out;
            }
            ld->scratch = s;
            ld->scratch_cap = len + 3;
        }
        dh__json_track_begin();
        extra_len = extract_extra(text, len, ld->scratch);
        if (dh__json_track_failed()) {
            rc = dh__set_error(DH_ENOMEM, "%s:%zu: out of memory", ld->name, ld->line);
            goto out;
        }
    }
    if (append_row(ld->set, &row, extra_len ? ld->scratch : NULL, extra_len) < 0)
        rc = dh__set_error(DH_ENOMEM, "%s:%zu: out of memory storing the row", ld->name, ld->line);
out:
    json_decref(root);
    return rc;
}

int dh_profile_set_load_buffer(dh_profile_set_t *set, const char *data, size_t len,
                               const char *name)
{
    loader_t ld;
    int rc = loader_begin(&ld, set, name ? name : "<buffer>");
    if (rc < 0)
        return rc;
    const char *p = data, *end = data + len;
    for (; rc == 0 && p < end; ld.line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        rc = load_line(&ld, p, (size_t)(line_end - p), nl == NULL);
        p = nl ? nl + 1 : end;
    }
    loader_done(&ld);
    return rc;
}

#define READ_CHUNK ((size_t)1 << 20)

/* Reads the file in 1 MiB blocks into one buffer that grows only to hold the longest line
 * (plus a block). Complete lines are parsed in place; a partial line at the end of the
 * buffer is moved to its front before the next read. O(file size) copying at most once
 * per byte, memory O(longest line + 1 MiB). */
int dh_profile_set_load(dh_profile_set_t *set, const char *path)
{
    bool use_stdin = strcmp(path, "-") == 0;
    FILE *f = use_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        int err = errno;
        return dh__set_error(-err, "%s: cannot open: %s", path, strerror(err));
    }
    loader_t ld;
    size_t cap = READ_CHUNK, have = 0, scanned = 0;
    char *buf = NULL;
    int rc = loader_begin(&ld, set, use_stdin ? "<stdin>" : path);
    if (rc < 0)
        goto out;
    buf = dh_malloc(cap);
    if (!buf) {
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory for the read buffer", ld.name);
        goto out;
    }
    for (;;) {
        if (cap - have < READ_CHUNK / 2) {
            /* The line in the buffer is longer than the free space: grow (x2). */
            char *bigger = dh_realloc(buf, cap * 2);
            if (!bigger) {
                rc = dh__set_error(DH_ENOMEM, "%s:%zu: out of memory for a line of %zu+ bytes",
                                   ld.name, ld.line, have);
                goto out;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t n = fread(buf + have, 1, cap - have, f);
        int injected = DH_FAULT(DH_FAULT_PROFILE_READ); /* a read error, as ferror reports */
        if (injected) {
            n = 0;
            errno = EIO;
        }
        if (n == 0) {
            if (injected || ferror(f)) {
                int err = errno ? errno : EIO;
                rc = dh__set_error(-err, "%s:%zu: read error: %s", ld.name, ld.line, strerror(err));
                goto out;
            }
            if (have > 0) /* last line with no newline */
                rc = load_line(&ld, buf, have, true);
            goto out;
        }
        have += n;
        size_t start = 0;
        const char *nl;
        while ((nl = memchr(buf + scanned, '\n', have - scanned)) != NULL) {
            size_t line_end = (size_t)(nl - buf);
            rc = load_line(&ld, buf + start, line_end - start, false);
            if (rc < 0)
                goto out;
            ld.line++;
            start = scanned = line_end + 1;
        }
        memmove(buf, buf + start, have - start);
        have -= start;
        scanned = have;
    }
out:
    dh_free(buf);
    loader_done(&ld);
    if (!use_stdin)
        fclose(f);
    return rc;
}

/* ---- adding ------------------------------------------------------------------------- */

/* Checks that extra is a JSON object without known fields and writes its compact form
 * (whitespace outside strings removed) to *compact (dh_malloc'd; NULL for "{}"). */
static int extra_normalise(const char *extra, char **compact, size_t *compact_len)
{
    *compact = NULL;
    *compact_len = 0;
    size_t len = strlen(extra);
    json_error_t jerr;
    dh__json_track_begin();
    json_t *obj = json_loadb(extra, len, JSON_DECODE_ANY, &jerr);
    int rc = 0;
    if (dh__json_track_failed()) {
        rc = dh__set_error(DH_ENOMEM, "profile row: out of memory checking field 'extra'");
        goto out;
    }
    if (!obj || !json_is_object(obj)) {
        rc = dh__set_error(DH_ESCHEMA, "profile row: field 'extra': %s%s",
                           obj ? "must be a JSON object, got " : "not JSON: ",
                           obj ? json_type_name(obj) : jerr.text);
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value)
    {
        if (field_lookup(key, strlen(key)) >= 0) {
            rc = dh__set_error(DH_ESCHEMA, "profile row: field 'extra': holds the known field '%s'",
                               key);
            goto out;
        }
    }
    if (json_object_size(obj) == 0)
        goto out;
    char *buf = dh_malloc(len + 3);
    if (!buf) {
        rc = dh__set_error(DH_ENOMEM, "profile row: out of memory copying field 'extra'");
        goto out;
    }
    const char *p = skip_ws(extra, extra + len);
    const char *end = extra + len;
    while (end > p && is_json_ws(end[-1]))
        end--;
    *compact_len = (size_t)(copy_compact(buf, p, end) - buf);
    *compact = buf;
out:
    json_decref(obj);
    return rc;
}

int dh_profile_set_add(dh_profile_set_t *set, const dh_profile_row_t *row)
{
    char why[160];
    int bad = row_problem(row, why, sizeof why);
    if (bad >= 0)
        return dh__set_error(DH_ESCHEMA, "profile row %s: field '%s': %s",
                             row->id ? row->id : "(no id)", fields[bad].name, why);
    char *extra = NULL;
    size_t extra_len = 0;
    if (row->extra && row->extra[0]) {
        int rc = extra_normalise(row->extra, &extra, &extra_len);
        if (rc < 0)
            return rc;
    }
    int rc = append_row(set, row, extra, extra_len);
    dh_free(extra);
    if (rc < 0)
        return dh__set_error(rc, "profile row %s: out of memory", row->id);
    return 0;
}

/* ---- writing ------------------------------------------------------------------------ */

/* Writes s as a JSON string: '"' and '\\' escaped, control bytes as \uXXXX or the short
 * escapes, everything else (UTF-8 included) as is. */
static void put_string(FILE *f, const char *s)
{
    putc('"', f);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        fwrite(run, 1, (size_t)(s - run), f);
        run = s + 1;
        switch (c) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            fprintf(f, "\\u%04x", c);
            break;
        }
    }
    fwrite(run, 1, (size_t)(s - run), f);
    putc('"', f);
}

/* The shortest of %.15g, %.16g, %.17g that reads back as the same double: round trips
 * exactly, and 0.1 stays "0.1". Values are finite (checked on the way in). */
static void put_number(FILE *f, double v)
{
    char buf[40];
    for (int precision = 15; precision <= 17; precision++) {
        snprintf(buf, sizeof buf, "%.*g", precision, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

static void put_field_string(FILE *f, const char *name, const char *value)
{
    fprintf(f, ",\"%s\":", name);
    put_string(f, value);
}

int dh_profile_row_write(FILE *f, const dh_profile_row_t *row)
{
    fputs("{\"id\":", f);
    put_string(f, row->id);
    put_field_string(f, "uri", row->uri);
    put_field_string(f, "profile_key", row->profile_key);
    fprintf(f,
            ",\"frames\":%" PRId32 ",\"height\":%" PRId32 ",\"width\":%" PRId32
            ",\"tokens_est\":%" PRId64 ",\"cpu_s_est\":",
            row->frames, row->height, row->width, row->tokens_est);
    put_number(f, row->cpu_s_est);
    fprintf(f, ",\"in_bytes\":%" PRId64 ",\"out_bytes\":%" PRId64, row->in_bytes, row->out_bytes);
    /* Optional fields: absent (0 / NULL) ones are not written. */
    if (row->duration_s != 0) {
        fputs(",\"duration_s\":", f);
        put_number(f, row->duration_s);
    }
    if (row->fps != 0) {
        fputs(",\"fps\":", f);
        put_number(f, row->fps);
    }
    if (row->text_len != 0)
        fprintf(f, ",\"text_len\":%" PRId64, row->text_len);
    if (row->codec)
        put_field_string(f, "codec", row->codec);
    if (row->node)
        put_field_string(f, "node", row->node);
    /* extra is a compact object "{...}" (checked on the way in): splice its members. */
    if (row->extra) {
        size_t len = strlen(row->extra);
        if (len > 2) {
            putc(',', f);
            fwrite(row->extra + 1, 1, len - 2, f);
        }
    }
    fputs("}\n", f);
    return ferror(f) ? DH_EIO : 0;
}

/* A file is written as PATH.part beside it and renamed over PATH once complete, so a failed
 * write (the disk full, a close that reports a network file system's error, a refused
 * rename) leaves the old file, or none, never a partial one; PATH.part is removed. Fault
 * site DH_FAULT_PROFILE_WRITE: the write (ENOSPC), the close (EIO), the rename (EIO). */
int dh_profile_set_write(const dh_profile_set_t *set, const char *path)
{
    bool use_stdout = strcmp(path, "-") == 0;
    const char *name = use_stdout ? "<stdout>" : path;
    char *part = NULL;
    FILE *f = stdout;
    if (!use_stdout) {
        size_t len = strlen(path) + sizeof ".part";
        if (!(part = dh_malloc(len)))
            return dh__set_error(DH_ENOMEM, "%s: out of memory for its name", path);
        snprintf(part, len, "%s.part", path);
        if (!(f = fopen(part, "w"))) {
            int err = errno;
            dh__set_error(-err, "%s: cannot open for writing (as %s): %s", path, part,
                          strerror(err));
            dh_free(part);
            return -err;
        }
    }
    /* A 1 MiB stdio buffer (from our allocator) cuts write calls ~250x against 4 KiB. */
    char *iobuf = use_stdout ? NULL : dh_malloc(READ_CHUNK);
    if (iobuf)
        setvbuf(f, iobuf, _IOFBF, READ_CHUNK);
    int rc = 0;
    for (size_t i = 0; i < set->count && rc == 0; i++)
        rc = dh_profile_row_write(f, &set->rows[i]);
    int err = 0;
    const char *step = "write";
    if (rc == 0 && DH_FAULT(DH_FAULT_PROFILE_WRITE)) /* the disk fills up */
        err = ENOSPC;
    else if (rc == 0 && fflush(f) != 0)
        err = errno;
    else if (rc < 0)
        err = errno ? errno : EIO;
    if (!use_stdout) {
        int closed = DH_FAULT(DH_FAULT_PROFILE_WRITE) ? (fclose(f), errno = EIO, EOF) : fclose(f);
        if (closed != 0 && !err) {
            err = errno;
            step = "close";
        }
        if (!err && (DH_FAULT(DH_FAULT_PROFILE_WRITE) ? (errno = EIO, -1) : rename(part, path))) {
            err = errno;
            step = "rename";
        }
        if (err)
            unlink(part);
    }
    dh_free(iobuf);
    if (err && strcmp(step, "rename") == 0)
        rc = dh__set_error(-err, "%s: cannot rename %s to it: %s", path, part, strerror(err));
    else if (err || rc < 0)
        rc = dh__set_error(err ? -err : DH_EIO, "%s: %s failed: %s", name, step,
                           strerror(err ? err : EIO));
    dh_free(part);
    return rc;
}
