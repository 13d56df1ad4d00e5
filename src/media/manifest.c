/* manifest.c: reads DIR/manifest.jsonl, from the file or from memory (see manifest.h).
 *
 * Cost: one jansson parse per line; strings are copied into one allocation per entry
 * (id, path and caption back to back), so 100,000 lines take a few MB and well under a
 * second. Paths are resolved against the manifest's folder once, here. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/manifest.h"
#include "core/internal.h"
#include "remote/remote_lib.h"

/* The largest manifest read from a URL (read whole, then parsed). */
#define MANIFEST_URL_MAX_BYTES ((size_t)4 << 30)

struct dh_manifest {
    dh_manifest_entry_t *entries;
    size_t count, cap;
};

void dh_manifest_destroy(dh_manifest_t **manifest)
{
    if (!manifest || !*manifest)
        return;
    for (size_t i = 0; i < (*manifest)->count; i++)
        dh_free((void *)(*manifest)->entries[i].id); /* the entry's one string block */
    dh_free((*manifest)->entries);
    dh_free(*manifest);
    *manifest = NULL;
}

size_t dh_manifest_count(const dh_manifest_t *manifest)
{
    return manifest->count;
}

const dh_manifest_entry_t *dh_manifest_entry(const dh_manifest_t *manifest, size_t i)
{
    return &manifest->entries[i];
}

/* An optional positive integer field: 0 when absent or null. */
static int plan_field(json_t *root, const char *path, size_t line, const char *name, int32_t *out)
{
    json_t *v = json_object_get(root, name);
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 20)
        return dh__set_error(DH_ESCHEMA, "%s:%zu: field '%s': must be an integer in [1, %d]", path,
                             line, name, 1 << 20);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static int string_field(json_t *root, const char *path, size_t line, const char *name,
                        bool required, const char **out)
{
    json_t *v = json_object_get(root, name);
    *out = "";
    if (!v || json_is_null(v)) {
        if (required)
            return dh__set_error(DH_ESCHEMA, "%s:%zu: field '%s': missing", path, line, name);
        return 0;
    }
    if (!json_is_string(v) || (required && json_string_length(v) == 0))
        return dh__set_error(DH_ESCHEMA, "%s:%zu: field '%s': must be a non-empty string", path,
                             line, name);
    *out = json_string_value(v);
    return 0;
}

/* An optional count (bytes, an offset, tokens) of at least `min`: -1 when absent or null. */
static int byte_field(json_t *root, const char *path, size_t line, const char *name, int64_t min,
                      int64_t *out)
{
    json_t *v = json_object_get(root, name);
    *out = -1;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < min)
        return dh__set_error(DH_ESCHEMA, "%s:%zu: field '%s': must be an integer >= %lld", path,
                             line, name, (long long)min);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int append_entry(dh_manifest_t *m, const char *dir, json_t *root, const char *path,
                        size_t line)
{
    const char *id, *rel, *caption;
    dh_manifest_entry_t e = {0};
    int64_t offset, size;
    int rc;
    if ((rc = string_field(root, path, line, "id", true, &id)) < 0 ||
        (rc = string_field(root, path, line, "path", true, &rel)) < 0 ||
        (rc = string_field(root, path, line, "caption", false, &caption)) < 0 ||
        (rc = plan_field(root, path, line, "frames", &e.frames)) < 0 ||
        (rc = plan_field(root, path, line, "height", &e.height)) < 0 ||
        (rc = plan_field(root, path, line, "width", &e.width)) < 0 ||
        (rc = byte_field(root, path, line, "offset", 0, &offset)) < 0 ||
        (rc = byte_field(root, path, line, "size", 1, &size)) < 0 ||
        (rc = byte_field(root, path, line, "text_tokens", 0, &e.text_tokens)) < 0)
        return rc;
    if ((offset < 0) != (size < 0))
        return dh__set_error(DH_ESCHEMA,
                             "%s:%zu: fields 'offset' and 'size' go together (a member of a tar "
                             "shard: its data's byte range)",
                             path, line);
    if (offset >= 0 && size > INT64_MAX - offset)
        return dh__set_error(DH_ESCHEMA, "%s:%zu: field 'size': offset + size overflows", path,
                             line);
    /* a byte range of the file (a tar member, read in place): FFmpeg's subfile protocol */
    char range[96] = "";
    if (offset >= 0)
        snprintf(range, sizeof range, "subfile,,start,%lld,end,%lld,,:", (long long)offset,
                 (long long)(offset + size));
    if (m->count == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        dh_manifest_entry_t *grown = dh_reallocarray(m->entries, cap, sizeof *grown);
        if (!grown)
            return dh__set_error(DH_ENOMEM, "%s:%zu: out of memory", path, line);
        m->entries = grown;
        m->cap = cap;
    }
    /* an absolute path, or a URL (http, https, s3: read by range requests, docs/remote.md),
     * which must name a host or bucket */
    bool is_url = dh__url_scheme(rel) != DH_URL_NONE;
    if (is_url) {
        if (dh__url_check_host(rel))
            return dh__set_error(DH_ESCHEMA, "%s:%zu: field 'path': %s", path, line,
                                 dh_last_error());
    }
    bool absolute = rel[0] == '/' || is_url;
    size_t id_len = strlen(id), dir_len = absolute ? 0 : strlen(dir), rel_len = strlen(rel),
           cap_len = strlen(caption), range_len = strlen(range);
    char *block = dh_malloc(id_len + 1 + range_len + dir_len + 1 + rel_len + 1 + cap_len + 1);
    if (!block)
        return dh__set_error(DH_ENOMEM, "%s:%zu: out of memory", path, line);
    char *p = block;
    e.id = memcpy(p, id, id_len + 1);
    p += id_len + 1;
    e.path = p;
    memcpy(p, range, range_len);
    p += range_len;
    if (!absolute) {
        memcpy(p, dir, dir_len);
        p[dir_len] = '/';
        p += dir_len + 1;
    }
    memcpy(p, rel, rel_len + 1);
    p += rel_len + 1;
    e.caption = memcpy(p, caption, cap_len + 1);
    m->entries[m->count++] = e;
    return 0;
}

/* What one load needs across its lines: the manifest being built, the folder its relative
 * paths are relative to, and jansson's scratch block (reset per line). */
typedef struct loader {
    dh_manifest_t *m;
    const char *name; /* the path, for messages */
    char *dir;
    dh__json_scratch_t *scratch;
    dh__json_scratch_t *saved; /* this thread's scratch before the load started */
} loader_t;

static int loader_begin(loader_t *ld, const char *name)
{
    *ld = (loader_t){.name = name};
    dh__json_use_allocator();
    ld->m = dh_calloc(1, sizeof *ld->m);
    /* The folder the manifest's relative paths are relative to. */
    const char *slash = strrchr(name, '/');
    ld->dir = slash ? dh_strndup(name, (size_t)(slash - name)) : dh_strdup(".");
    if (slash == name && ld->dir) /* "/manifest.jsonl" */
        ld->dir[0] = '\0';
    /* jansson parses each line from a scratch block reset per line: faster, and jansson
     * 2.14 can crash when its own allocations fail mid-parse, which the block avoids for
     * any line under 64 KiB. */
    enum { HEADER = 32 }; /* keeps the block 16-byte aligned behind the header */
    ld->scratch = dh_malloc(HEADER + DH__JSON_SCRATCH_SIZE);
    if (ld->scratch) {
        *ld->scratch = (dh__json_scratch_t){.block = (char *)ld->scratch + HEADER,
                                            .cap = DH__JSON_SCRATCH_SIZE};
        ld->saved = dh__json_scratch_set(ld->scratch);
    }
    if (!ld->m || !ld->dir || !ld->scratch)
        return dh__set_error(DH_ENOMEM, "%s: out of memory", name);
    return 0;
}

/* Ends a load: on success *out takes the manifest, on failure it is freed. Returns rc. */
static int loader_end(loader_t *ld, int rc, dh_manifest_t **out)
{
    if (ld->scratch) {
        dh__json_scratch_set(ld->saved);
        dh_free(ld->scratch);
    }
    dh_free(ld->dir);
    if (rc != 0)
        dh_manifest_destroy(&ld->m);
    *out = ld->m;
    return rc;
}

/* One line (its '\n' included or not): trailing whitespace dropped, a blank line skipped,
 * else one JSON object appended as an entry. */
static int load_line(loader_t *ld, const char *line, size_t len, size_t line_no)
{
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                       line[len - 1] == '\t'))
        len--;
    if (len == 0)
        return 0;
    json_error_t jerr;
    dh__json_track_begin();
    ld->scratch->used = 0; /* the previous line's objects are all released */
    json_t *root = json_loadb(line, len, JSON_DECODE_ANY, &jerr);
    int rc;
    if (dh__json_track_failed())
        rc = dh__set_error(DH_ENOMEM, "%s:%zu: out of memory", ld->name, line_no);
    else if (!root)
        rc = dh__set_error(DH_EPARSE, "%s:%zu: not JSON: %s at column %d", ld->name, line_no,
                           jerr.text, jerr.column);
    else if (!json_is_object(root))
        rc = dh__set_error(DH_EPARSE, "%s:%zu: not a JSON object", ld->name, line_no);
    else
        rc = append_entry(ld->m, ld->dir, root, ld->name, line_no);
    json_decref(root);
    return rc;
}

int dh_manifest_load(const char *path, dh_manifest_t **out)
{
    *out = NULL;
    if (dh__url_scheme(path) != DH_URL_NONE) {
        /* a manifest at a URL: read whole; its relative paths join the URL's folder */
        char *data = NULL;
        size_t len = 0;
        int rc = dh__remote_read_whole(path, MANIFEST_URL_MAX_BYTES, &data, &len);
        if (rc == 0)
            rc = dh_manifest_load_buffer(data, len, path, out);
        dh_free(data);
        return rc;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        int err = errno;
        return dh__set_error(-err, "%s: cannot open: %s", path, strerror(err));
    }
    loader_t ld;
    int rc = loader_begin(&ld, path);
    char *line = NULL;
    size_t line_cap = 0, line_no = 0;
    ssize_t len;
    int injected = 0; /* a read error, as ferror reports (fault.h) */
    errno = 0;
    while (rc == 0 && !(injected = DH_FAULT(DH_FAULT_MANIFEST_READ)) &&
           (len = getline(&line, &line_cap, f)) >= 0)
        rc = load_line(&ld, line, (size_t)len, ++line_no);
    if (rc == 0 && (injected || ferror(f))) {
        int err = !injected && errno ? errno : EIO;
        rc = dh__set_error(-err, "%s: read error after line %zu: %s", path, line_no, strerror(err));
    }
    free(line); /* getline's buffer comes from the C library */
    fclose(f);
    return loader_end(&ld, rc, out);
}

int dh_manifest_load_buffer(const char *data, size_t len, const char *name, dh_manifest_t **out)
{
    *out = NULL;
    loader_t ld;
    int rc = loader_begin(&ld, name ? name : "<buffer>");
    size_t line_no = 0;
    const char *p = data, *end = data + len;
    while (rc == 0 && p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl + 1 : end) - p);
        rc = load_line(&ld, p, n, ++line_no);
        p += n;
    }
    return loader_end(&ld, rc, out);
}
