/* profile_read.c: the reader of the profiles JSONL format (docs/profiles.md §1-2): a
 * row's fields, their types and their values checked, one line at a time, from a buffer or
 * a file, into a profile set (profile.c).
 *
 * Loading is the hot path: the planner and the benchmarks read sets of millions of rows.
 * Each line is parsed by jansson (json_loadb), the known fields are copied out, and the
 * parsed object is dropped at once; the jansson object of a line lives only while that line
 * is processed. A line's unknown fields are kept verbatim (profile_extra.c).
 *
 * Allocation failure: jansson does not report every allocation failure it meets (its
 * lexer drops bytes when a buffer cannot grow), so jansson's allocations go through a thin
 * wrapper over dh_malloc that records failures in a thread-local flag (src/core), and a line
 * that saw one fails with DH_ENOMEM whatever jansson returned. The same wrapper serves
 * jansson from a per-line scratch block while a loader runs (see below).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/profile.h"
#include "core/internal.h"
#include "model/profile_internal.h"

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
int dh__profile_field_lookup(const char *name, size_t len)
{
    for (int f = 0; f < F_COUNT; f++)
        if (fields[f].len == len && memcmp(fields[f].name, name, len) == 0)
            return f;
    return -1;
}

const char *dh__profile_field_name(int field)
{
    return fields[field].name;
}

const char *dh__profile_json_type_name(const json_t *v)
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
int dh__profile_row_problem(const dh_profile_row_t *r, char *why, size_t why_size)
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
        /* Keep the sign so dh__profile_row_problem reports "must be > 0, got -3". */
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
             dh__profile_json_type_name(v));
    return -1;
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
    while (len && dh__profile_is_json_ws(text[len - 1]))
        len--;
    size_t lead = 0;
    if (ld->line == 1 && len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        lead = 3; /* UTF-8 byte order mark written by some editors */
    while (lead < len && dh__profile_is_json_ws(text[lead]))
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
                           dh__profile_json_type_name(root));
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
        int f = dh__profile_field_lookup(key, strlen(key));
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
    int bad = dh__profile_row_problem(&row, why, sizeof why);
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
        extra_len = dh__profile_extract_extra(text, len, ld->scratch);
        if (dh__json_track_failed()) {
            rc = dh__set_error(DH_ENOMEM, "%s:%zu: out of memory", ld->name, ld->line);
            goto out;
        }
    }
    if (dh__profile_append_row(ld->set, &row, extra_len ? ld->scratch : NULL, extra_len) < 0)
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
    size_t cap = DH__PROFILE_IO_CHUNK, have = 0, scanned = 0;
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
        if (cap - have < DH__PROFILE_IO_CHUNK / 2) {
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
