/* manifest_dir.c: `datahelix manifest --from-dir` (manifest_build.h): walks a folder tree,
 * keeps the files with a listed extension, sorts them by relative path (byte order, so the
 * manifest does not depend on the file system's order or the locale) and emits each with
 * the caption of its sidecar file and the fields of its .json sidecar as "meta".
 *
 * Rules (docs/datasets.md): names starting with '.' are skipped (.git, macOS "._clip.mp4"
 * resource forks); a symbolic link to a file is taken, one to a folder is not followed (no
 * loops). Cost: one readdir pass, then two open() attempts per taken file for its sidecars;
 * the relative paths are held in memory to sort them (about 100 bytes a file). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "manifest_build.h"

typedef struct walk {
    const mb_dir_options_t *opt;
    const char *out_dir_abs; /* the folder of OUT, whose OUT and OUT.part are skipped */
    mb_dir_report_t *report;
    unsigned long long progress_every;
    char **paths; /* relative to opt->dir */
    size_t n, cap;
} walk_t;

static int wanted(const walk_t *w, const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name || !dot[1])
        return 0;
    for (size_t i = 0; i < w->opt->n_exts; i++)
        if (strcasecmp(dot + 1, w->opt->exts[i]) == 0)
            return 1;
    return 0;
}

/* OUT itself, or OUT.part being written, when the walk passes through OUT's folder. */
static int is_output(const walk_t *w, const char *dir_abs, const char *name)
{
    const char *out = w->opt->skip_name;
    size_t n = out ? strlen(out) : 0;
    return out && strncmp(name, out, n) == 0 && (!name[n] || strcmp(name + n, ".part") == 0) &&
           strcmp(dir_abs, w->out_dir_abs) == 0;
}

static int take(walk_t *w, const char *rel)
{
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        char **grown = realloc(w->paths, cap * sizeof *grown);
        if (!grown)
            return mb_error("out of memory (%zu files)", w->n);
        w->paths = grown;
        w->cap = cap;
    }
    if (!(w->paths[w->n] = strdup(rel)))
        return mb_error("out of memory (%zu files)", w->n);
    w->n++;
    return 0;
}

/* Walks abs (rel from the root; "" for the root itself). Depth-first; the order is fixed by
 * the sort afterwards. */
static int walk_dir(walk_t *w, const char *abs, const char *rel)
{
    DIR *d = opendir(abs);
    if (!d) {
        int err = errno;
        return mb_error("%s: cannot read the folder: %s", abs, strerror(err));
    }
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *ent = readdir(d);
        if (!ent) {
            if (errno) {
                int err = errno;
                rc = mb_error("%s: cannot read the folder: %s", abs, strerror(err));
            }
            break;
        }
        if (ent->d_name[0] == '.')
            continue;
        char *child_abs = mb_join(abs, ent->d_name);
        char *child_rel = rel[0] ? mb_join(rel, ent->d_name) : strdup(ent->d_name);
        if (!child_abs || !child_rel) {
            free(child_abs);
            free(child_rel);
            rc = mb_error("out of memory");
            break;
        }
        int is_dir = ent->d_type == DT_DIR, is_file = ent->d_type == DT_REG;
        if (ent->d_type == DT_UNKNOWN || ent->d_type == DT_LNK) {
            struct stat st;
            if (lstat(child_abs, &st) == 0 && S_ISDIR(st.st_mode))
                is_dir = 1; /* DT_UNKNOWN on some file systems */
            else if (stat(child_abs, &st) == 0 && S_ISREG(st.st_mode))
                is_file = 1; /* a file, or a link to one; a link to a folder: neither */
        }
        if (is_file && is_output(w, abs, ent->d_name))
            is_file = 0;
        if (is_dir) {
            rc = walk_dir(w, child_abs, child_rel);
        } else if (is_file) {
            w->report->files_seen++;
            if (wanted(w, ent->d_name))
                rc = take(w, child_rel);
            if (w->progress_every && w->report->files_seen % w->progress_every == 0)
                fprintf(stderr, "manifest: %zu files scanned, %zu taken\n", w->report->files_seen,
                        w->n);
        }
        free(child_abs);
        free(child_rel);
        if (rc < 0)
            break;
    }
    closedir(d);
    return rc;
}

static int by_bytes(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads a whole small file; NULL with *missing = 1 when it does not exist, NULL with the
 * reason in why when it cannot be read. */
static char *read_sidecar(const char *path, int *missing, size_t *len, char *why, size_t why_size)
{
    *missing = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int err = errno;
        if (err == ENOENT)
            *missing = 1;
        else
            snprintf(why, why_size, "cannot read the caption: %s", strerror(err));
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (cap - n < 4096) {
            cap = cap ? cap * 2 : 4096;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                snprintf(why, why_size, "out of memory");
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        snprintf(why, why_size, "cannot read the caption: read error");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* STEM.txt: its text without a UTF-8 byte-order mark and surrounding white space. Returns
 * 0 (*found: it exists), 1 (a bad caption, skipped) or -1. */
static int caption_from_txt(mb_emitter_t *e, const char *path, char **caption, int *found)
{
    size_t n = 0;
    int missing;
    char why[512] = "";
    char *text = read_sidecar(path, &missing, &n, why, sizeof why);
    *found = 0;
    if (!text)
        return missing ? 0 : mb_bad_caption(e, path, "%s", why);
    int rc = mb_caption_text(e, text, n, path);
    if (rc != 0) {
        free(text);
        return rc;
    }
    *caption = text;
    *found = 1;
    return 0;
}

/* STEM.json: an object; its "caption" string, else its "text" string, else no caption (when
 * want_caption); its other keys into meta. Returns 0, 1 (a bad caption, skipped) or -1. */
static int sidecar_json(mb_emitter_t *e, const char *path, int want_caption, char **caption,
                        int *found, int *keyless, json_t *meta)
{
    *found = *keyless = 0;
    struct stat st;
    if (stat(path, &st) != 0) {
        int err = errno;
        return err == ENOENT ? 0 : mb_bad_caption(e, path, "cannot read: %s", strerror(err));
    }
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        char where[4096];
        snprintf(where, sizeof where, "%s:%d:%d", path, jerr.line, jerr.column);
        return mb_bad_caption(e, where, "not JSON: %s", jerr.text);
    }
    int rc = 0;
    if (want_caption) {
        rc = mb_caption_json(e, root, path, caption, keyless);
        *found = rc == 0 && *caption;
    } else if (!json_is_object(root)) {
        rc = mb_bad_caption(e, path, "not a JSON object");
    }
    if (rc == 0)
        rc = mb_meta_merge(meta, root);
    json_decref(root);
    return rc;
}

/* The sidecars of ROOT/rel: rel with its extension replaced by .txt (the caption), and by
 * .json (the caption when there is no .txt; its other fields are the clip's meta). Returns
 * 0, 1 (a bad caption, skipped) or -1. */
static int sidecars(mb_emitter_t *e, const char *abs, mb_dir_report_t *report, char **caption,
                    json_t *meta)
{
    *caption = NULL;
    const char *dot = strrchr(abs, '.');
    size_t stem = (size_t)(dot - abs);
    char *side = malloc(stem + sizeof ".json");
    if (!side)
        return mb_error("out of memory");
    memcpy(side, abs, stem);
    strcpy(side + stem, ".txt");
    int found = 0, keyless = 0;
    int rc = caption_from_txt(e, side, caption, &found);
    report->captions_txt += rc == 0 && found;
    if (rc == 0) {
        int txt = found;
        strcpy(side + stem, ".json");
        rc = sidecar_json(e, side, !txt, caption, &found, &keyless, meta);
        report->captions_json += rc == 0 && !txt && found;
        report->json_without_caption += rc == 0 && !txt && keyless;
    }
    free(side);
    return rc;
}

int mb_from_dir(const mb_dir_options_t *opt, mb_emitter_t *e, mb_dir_report_t *report)
{
    *report = (mb_dir_report_t){0};
    char *root = realpath(opt->dir, NULL);
    if (!root) {
        int err = errno;
        return mb_error("%s: cannot open the folder: %s", opt->dir, strerror(err));
    }
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
        free(root);
        return mb_error("%s: not a folder", opt->dir);
    }
    walk_t w = {.opt = opt,
                .out_dir_abs = e->out_dir_abs,
                .report = report,
                .progress_every = e->progress_every};
    int rc = walk_dir(&w, root, "");
    if (rc == 0)
        qsort(w.paths, w.n, sizeof *w.paths, by_bytes);
    for (size_t i = 0; rc == 0 && i < w.n; i++) {
        char *abs = mb_join(root, w.paths[i]), *caption = NULL;
        if (!abs) {
            rc = -1;
            break;
        }
        mb_where_t where = {.file = abs};
        json_t *meta = json_object();
        rc = meta ? sidecars(e, abs, report, &caption, meta) : mb_error("out of memory");
        if (rc == 0)
            rc = mb_emit(e, w.paths[i], abs, caption, meta, &where, NULL);
        if (rc > 0) /* a bad caption, skipped (--skip-bad-captions) */
            rc = 0;
        json_decref(meta);
        free(caption);
        free(abs);
    }
    report->taken = w.n;
    for (size_t i = 0; i < w.n; i++)
        free(w.paths[i]);
    free(w.paths);
    free(root);
    return rc;
}
