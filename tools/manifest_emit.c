/* manifest_emit.c: the output side of `datahelix manifest` (manifest_build.h): one JSON
 * line per entry into OUT.part, renamed to OUT only when every entry is written, so a failed
 * run never leaves a half manifest; a hash set of ids rejects a duplicate with both rows.
 *
 * Cost: one jansson object and one dump per entry; the id set keeps each id once (about
 * 40 bytes plus the id), so WebVid-10M's 10.7 M rows need about 0.6 GB. */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "datahelix/fault.h"
#include "core/internal.h"
#include "manifest_build.h"

struct mb_id_slot {
    char *id; /* NULL: free slot */
    size_t line, row;
};

int mb_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("datahelix manifest: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

int mb_bad_caption(mb_emitter_t *e, const char *where, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (!e->skip_bad_captions)
        return mb_error("%s: %s (--skip-bad-captions skips such entries)", where, why);
    if (e->skipped_bad_captions++ < 10)
        fprintf(stderr, "manifest: skipped %s: %s\n", where, why);
    return 1;
}

const char *mb_where_text(char *buf, size_t size, const mb_where_t *where, const char *column)
{
    int n = snprintf(buf, size, "%s", where->file);
    if (where->line && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ":%zu", where->line);
    if (where->row && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ": row %zu", where->row);
    if (column && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, "%s column '%s'", where->row ? "," : ":", column);
    return buf;
}

char *mb_join(const char *dir, const char *name)
{
    size_t d = strlen(dir), n = strlen(name);
    int slash = d > 0 && dir[d - 1] != '/';
    char *p = malloc(d + (size_t)slash + n + 1);
    if (!p) {
        mb_error("out of memory");
        return NULL;
    }
    memcpy(p, dir, d);
    if (slash)
        p[d] = '/';
    memcpy(p + d + slash, name, n + 1);
    return p;
}

/* FNV-1a: ids are short strings; good enough spread for open addressing at load <= 1/2. */
static uint64_t hash_id(const char *id)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

static mb_id_slot_t *find_slot(mb_id_slot_t *slots, size_t cap, const char *id)
{
    size_t i = (size_t)hash_id(id) & (cap - 1);
    while (slots[i].id && strcmp(slots[i].id, id) != 0)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

static int grow_ids(mb_emitter_t *e)
{
    size_t cap = e->slot_cap ? e->slot_cap * 2 : 1024;
    mb_id_slot_t *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return mb_error("out of memory (%zu ids)", e->ids);
    for (size_t i = 0; i < e->slot_cap; i++)
        if (e->slots[i].id)
            *find_slot(slots, cap, e->slots[i].id) = e->slots[i];
    free(e->slots);
    e->slots = slots;
    e->slot_cap = cap;
    return 0;
}

int mb_emitter_open(mb_emitter_t *e, const char *out_path, unsigned long long progress_every)
{
    *e = (mb_emitter_t){.out_path = out_path, .progress_every = progress_every};
    /* The folder OUT's relative paths will be resolved against by the manifest reader. */
    const char *slash = strrchr(out_path, '/');
    char *dir =
        slash ? strndup(out_path, slash == out_path ? 1 : (size_t)(slash - out_path)) : strdup(".");
    if (!dir)
        return mb_error("out of memory");
    e->out_dir_abs = realpath(dir, NULL);
    if (!e->out_dir_abs) {
        int err = errno;
        mb_error("%s: cannot write there: %s: %s", out_path, dir, strerror(err));
        free(dir);
        return -1;
    }
    free(dir);
    e->part_path = malloc(strlen(out_path) + sizeof ".part");
    if (!e->part_path)
        return mb_error("out of memory");
    sprintf(e->part_path, "%s.part", out_path);
    e->out = fopen(e->part_path, "w");
    if (!e->out) {
        int err = errno;
        return mb_error("%s: cannot create: %s", e->part_path, strerror(err));
    }
    return grow_ids(e);
}

/* abs_path as the manifest reader will resolve it: relative to OUT's folder when under it. */
static const char *written_path(const mb_emitter_t *e, const char *abs_path)
{
    size_t n = strlen(e->out_dir_abs);
    if (n == 1 && e->out_dir_abs[0] == '/')
        return abs_path[0] == '/' && abs_path[1] ? abs_path + 1 : abs_path;
    if (strncmp(abs_path, e->out_dir_abs, n) == 0 && abs_path[n] == '/' && abs_path[n + 1])
        return abs_path + n + 1;
    return abs_path;
}

static int set_string(json_t *obj, const char *key, const char *value, const mb_where_t *where)
{
    json_t *s = json_string(value); /* NULL on invalid UTF-8 (or no memory) */
    if (!s) {
        char w[1024];
        return mb_error("%s: the %s is not valid UTF-8", mb_where_text(w, sizeof w, where, NULL),
                        key);
    }
    if (json_object_set_new(obj, key, s) != 0)
        return mb_error("out of memory");
    return 0;
}

static int emit(mb_emitter_t *e, const char *id, const char *abs_path, long long offset,
                long long size, const char *caption, json_t *meta, const mb_where_t *where,
                const char *id_column)
{
    char w[1024];
    if (!id[0])
        return mb_error("%s: empty id", mb_where_text(w, sizeof w, where, id_column));
    json_t *caption_json = caption && caption[0] ? json_string(caption) : NULL;
    if (caption && caption[0] && !caption_json) /* NULL on invalid UTF-8 (or no memory) */
        return mb_bad_caption(e, mb_where_text(w, sizeof w, where, NULL),
                              "the caption is not valid UTF-8");
    if ((e->ids + 1) * 2 > e->slot_cap && grow_ids(e) < 0) {
        json_decref(caption_json);
        return -1;
    }
    mb_id_slot_t *slot = find_slot(e->slots, e->slot_cap, id);
    if (slot->id) {
        json_decref(caption_json);
        char first[64] = "";
        if (slot->line)
            snprintf(first, sizeof first, " (first at line %zu, row %zu)", slot->line, slot->row);
        return mb_error("%s: duplicate id '%s'%s", mb_where_text(w, sizeof w, where, id_column), id,
                        first);
    }
    if (!(slot->id = strdup(id))) {
        json_decref(caption_json);
        return mb_error("out of memory");
    }
    slot->line = where->line;
    slot->row = where->row;
    e->ids++;

    json_t *obj = json_object();
    if (!obj) {
        json_decref(caption_json);
        return mb_error("out of memory");
    }
    int rc = set_string(obj, "id", id, where);
    if (rc == 0)
        rc = set_string(obj, "path", written_path(e, abs_path), where);
    if (rc == 0 && offset >= 0 &&
        (json_object_set_new(obj, "offset", json_integer(offset)) != 0 ||
         json_object_set_new(obj, "size", json_integer(size)) != 0))
        rc = mb_error("out of memory");
    if (rc == 0 && caption_json) {
        rc = json_object_set_new(obj, "caption", caption_json) == 0 ? 0 : mb_error("out of memory");
        caption_json = NULL;
        e->with_caption += rc == 0;
    }
    if (rc == 0 && meta && json_object_size(meta) > 0) {
        rc = json_object_set(obj, "meta", meta) == 0 ? 0 : mb_error("out of memory");
        e->with_meta += rc == 0;
    }
    json_decref(caption_json);
    /* Fault site DH_FAULT_CLI_WRITE: a line's write (ENOSPC), then the close and the rename. */
    if (rc == 0 && (DH_FAULT(DH_FAULT_CLI_WRITE) ? (errno = ENOSPC, 1)
                                                 : json_dumpf(obj, e->out, JSON_COMPACT) != 0 ||
                                                       fputc('\n', e->out) == EOF)) {
        int err = errno ? errno : EIO;
        rc = mb_error("%s: write error: %s", e->part_path, strerror(err));
    }
    json_decref(obj);
    if (rc == 0 && ++e->written % (e->progress_every ? e->progress_every : ULLONG_MAX) == 0)
        fprintf(stderr, "manifest: %zu entries written\n", e->written);
    return rc;
}

int mb_emit(mb_emitter_t *e, const char *id, const char *abs_path, const char *caption,
            json_t *meta, const mb_where_t *where, const char *id_column)
{
    return emit(e, id, abs_path, -1, -1, caption, meta, where, id_column);
}

int mb_emit_range(mb_emitter_t *e, const char *id, const char *abs_path, long long offset,
                  long long size, const char *caption, json_t *meta, const mb_where_t *where)
{
    assert(offset >= 0 && size > 0);
    return emit(e, id, abs_path, offset, size, caption, meta, where, NULL);
}

int mb_emitter_finish(mb_emitter_t *e, int ok)
{
    int rc = 0;
    if (e->out) {
        int closed = fclose(e->out);
        if (ok && DH_FAULT(DH_FAULT_CLI_WRITE)) /* a network file system's error at close */
            closed = EOF, errno = EIO;
        if (closed != 0 && ok) {
            int err = errno;
            rc = mb_error("%s: write error at close: %s", e->part_path, strerror(err));
        }
        e->out = NULL;
        if (ok && rc == 0 &&
            (DH_FAULT(DH_FAULT_CLI_WRITE) ? (errno = EIO, -1)
                                          : rename(e->part_path, e->out_path)) != 0) {
            int err = errno;
            rc = mb_error("%s: cannot rename to %s: %s", e->part_path, e->out_path, strerror(err));
        }
        if (!ok || rc != 0)
            unlink(e->part_path);
    }
    for (size_t i = 0; i < e->slot_cap; i++)
        free(e->slots[i].id);
    free(e->slots);
    free(e->part_path);
    free(e->out_dir_abs);
    e->slots = NULL;
    e->part_path = e->out_dir_abs = NULL;
    return rc;
}
