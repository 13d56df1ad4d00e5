/* manifest_table.c: `datahelix manifest --from-csv` (manifest_build.h): one manifest entry
 * per data row of a CSV, TSV or JSON-lines metadata file (WebVid-style: a path column, a
 * caption column), the path resolved against a root folder and checked to exist.
 *
 * CSV and TSV go through libcsv (quoted fields with delimiters, doubled quotes and newlines
 * inside them, CRLF), fed one physical line at a time so every message can name the line a
 * row starts on. CSV is parsed strictly (a stray quote is an error naming its line); TSV
 * leniently (a quote inside an unquoted field is text), since TSV writers rarely quote.
 * JSON lines go through jansson, one object a line. The --meta-col columns of a row become
 * its "meta" object (manifest_meta.c: a cell that reads as a number is a number; an empty
 * cell is left out). Cost: one pass, streaming; memory is one row plus the emitter's id set. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <csv.h>
#include <jansson.h>

#include "manifest_build.h"
#include "datahelix/error.h"
#include "remote/remote_lib.h"

typedef struct field {
    char *text;
    size_t len;
} field_t;

typedef struct table {
    const mb_table_options_t *opt;
    mb_table_report_t *report;
    mb_emitter_t *e;
    char *root; /* realpath of the root folder */
    /* CSV state */
    field_t *fields; /* the row being read */
    size_t n_fields, cap_fields;
    char **header;
    size_t n_header;
    long path_idx, caption_idx, id_idx;
    long *meta_idx; /* the --meta-col columns */
    size_t n_meta_idx;
    int have_header, failed;
    size_t line;      /* physical line being fed */
    size_t row_line;  /* line the current row starts on */
    int between_rows; /* no field of a row seen yet */
} table_t;

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* One data row, whatever the format: resolve, check, emit. */
static int take_row(table_t *t, const mb_where_t *where, const char *path, const char *caption,
                    const char *id, json_t *meta)
{
    char w[1024];
    t->report->rows++;
    if (!path[0])
        return mb_error("%s: empty path", mb_where_text(w, sizeof w, where, t->opt->path_col));
    int url = dh__url_scheme(path) != DH_URL_NONE;
    char *abs = path[0] == '/' || url ? strdup(path) : mb_join(t->root, path);
    if (!abs)
        return mb_error("out of memory");
    /* a URL (given, or under a URL --root) is not checked here: one request a row; probe
     * skips what cannot be read, naming it */
    url = url || dh__url_scheme(abs) != DH_URL_NONE;
    struct stat st = {.st_mode = S_IFREG};
    int rc = 0;
    if (url && dh__url_check_host(abs) != 0) {
        rc = mb_error("%s: %s", mb_where_text(w, sizeof w, where, t->opt->path_col),
                      dh_last_error());
    } else if (!url && stat(abs, &st) != 0) {
        int err = errno;
        if (err == ENOENT && t->opt->skip_missing) {
            if (t->report->skipped_missing++ < 10)
                fprintf(stderr, "manifest: skipped %s: no such file %s\n",
                        mb_where_text(w, sizeof w, where, t->opt->path_col), abs);
            free(abs);
            return 0;
        }
        rc = mb_error("%s: %s: %s%s", mb_where_text(w, sizeof w, where, t->opt->path_col), abs,
                      strerror(err),
                      err == ENOENT ? " (--root sets the folder relative paths start from; "
                                      "--skip-missing skips such rows)"
                                    : "");
    } else if (!S_ISREG(st.st_mode)) {
        rc = mb_error("%s: %s: not a regular file",
                      mb_where_text(w, sizeof w, where, t->opt->path_col), abs);
    } else {
        rc = mb_emit(t->e, id ? id : path, abs, caption, meta, where,
                     id ? t->opt->id_col : t->opt->path_col);
        t->report->taken += rc == 0;
        if (rc > 0) /* a bad caption, skipped (--skip-bad-captions) */
            rc = 0;
    }
    if (rc == 0 && t->e->progress_every && t->report->rows % t->e->progress_every == 0)
        fprintf(stderr, "manifest: %zu rows read\n", t->report->rows);
    free(abs);
    return rc;
}

/* ---- CSV and TSV (libcsv) ----------------------------------------------------------- */

static void on_field(void *text, size_t len, void *ctx)
{
    table_t *t = ctx;
    if (t->failed)
        return;
    if (t->n_fields == t->cap_fields) {
        size_t cap = t->cap_fields ? t->cap_fields * 2 : 16;
        field_t *grown = realloc(t->fields, cap * sizeof *grown);
        if (!grown) {
            t->failed = mb_error("out of memory");
            return;
        }
        t->fields = grown;
        t->cap_fields = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        t->failed = mb_error("out of memory");
        return;
    }
    if (len)
        memcpy(copy, text, len);
    copy[len] = '\0';
    t->fields[t->n_fields++] = (field_t){copy, len};
}

static long column_index(const table_t *t, const char *name)
{
    for (size_t i = 0; i < t->n_header; i++)
        if (strcmp(t->header[i], name) == 0)
            return (long)i;
    return -1;
}

static int missing_column(const table_t *t, const char *option, const char *name)
{
    char have[512] = "";
    size_t n = 0;
    for (size_t i = 0; i < t->n_header && n < sizeof have - 8; i++)
        n += (size_t)snprintf(have + n, sizeof have - n, "%s'%s'", i ? ", " : "", t->header[i]);
    return mb_error("%s:%zu: no column '%s' (%s) in the header; it has %s", t->opt->file,
                    t->row_line, name, option, have[0] ? have : "no columns");
}

static int header_row(table_t *t)
{
    t->header = malloc((t->n_fields ? t->n_fields : 1) * sizeof *t->header);
    if (!t->header)
        return mb_error("out of memory");
    for (size_t i = 0; i < t->n_fields; i++) {
        t->header[i] = t->fields[i].text;
        t->fields[i].text = NULL;
    }
    t->n_header = t->n_fields;
    /* A UTF-8 byte-order mark (Excel writes one) is not part of the first name. */
    if (t->n_header && strncmp(t->header[0], "\xEF\xBB\xBF", 3) == 0)
        memmove(t->header[0], t->header[0] + 3, strlen(t->header[0] + 3) + 1);
    t->have_header = 1;
    if ((t->path_idx = column_index(t, t->opt->path_col)) < 0)
        return missing_column(t, "--path-col", t->opt->path_col);
    t->caption_idx = t->id_idx = -1;
    if (t->opt->caption_col && (t->caption_idx = column_index(t, t->opt->caption_col)) < 0)
        return missing_column(t, "--caption-col", t->opt->caption_col);
    if (t->opt->id_col && (t->id_idx = column_index(t, t->opt->id_col)) < 0)
        return missing_column(t, "--id-col", t->opt->id_col);
    if (!t->opt->n_meta_cols)
        return 0;
    if (!(t->meta_idx = malloc((t->n_header + t->opt->n_meta_cols) * sizeof *t->meta_idx)))
        return mb_error("out of memory");
    for (size_t k = 0; k < t->opt->n_meta_cols; k++) {
        const char *name = t->opt->meta_cols[k];
        if (strcmp(name, "*") == 0) {
            for (long i = 0; i < (long)t->n_header; i++)
                if (i != t->path_idx && i != t->caption_idx && i != t->id_idx)
                    t->meta_idx[t->n_meta_idx++] = i;
        } else {
            long i = column_index(t, name);
            if (i < 0)
                return missing_column(t, "--meta-col", name);
            t->meta_idx[t->n_meta_idx++] = i;
        }
    }
    return 0;
}

/* The row's --meta-col cells as an object (an empty cell is left out: missing). */
static int csv_meta(const table_t *t, const mb_where_t *where, json_t **meta)
{
    *meta = NULL;
    if (!t->n_meta_idx)
        return 0;
    if (!(*meta = json_object()))
        return mb_error("out of memory");
    char w[1024];
    for (size_t k = 0; k < t->n_meta_idx; k++) {
        const field_t *f = &t->fields[t->meta_idx[k]];
        const char *name = t->header[t->meta_idx[k]];
        if (f->len == 0)
            continue;
        if (mb_meta_set_text(*meta, name, f->text, f->len,
                             mb_where_text(w, sizeof w, where, name)) < 0)
            return -1;
    }
    return 0;
}

/* A NUL byte would cut the C string short without a word: refuse it in the fields used. */
static int nul_in_used_field(const table_t *t, const mb_where_t *where)
{
    const long used[] = {t->path_idx, t->caption_idx, t->id_idx};
    for (size_t i = 0; i < sizeof used / sizeof used[0]; i++) {
        if (used[i] < 0 || !memchr(t->fields[used[i]].text, '\0', t->fields[used[i]].len))
            continue;
        char w[1024];
        return mb_error("%s: holds a NUL byte",
                        mb_where_text(w, sizeof w, where, t->header[used[i]]));
    }
    return 0;
}

static void on_row(int terminator, void *ctx)
{
    (void)terminator;
    table_t *t = ctx;
    if (!t->failed) {
        if (!t->have_header) {
            t->failed = header_row(t);
        } else {
            mb_where_t where = {
                .file = t->opt->file, .line = t->row_line, .row = t->report->rows + 1};
            char w[1024];
            if (t->n_fields != t->n_header)
                t->failed =
                    mb_error("%s: %zu fields, but the header has %zu columns",
                             mb_where_text(w, sizeof w, &where, NULL), t->n_fields, t->n_header);
            else if ((t->failed = nul_in_used_field(t, &where)) == 0) {
                json_t *meta = NULL;
                if ((t->failed = csv_meta(t, &where, &meta)) == 0)
                    t->failed =
                        take_row(t, &where, t->fields[t->path_idx].text,
                                 t->caption_idx >= 0 ? t->fields[t->caption_idx].text : NULL,
                                 t->id_idx >= 0 ? t->fields[t->id_idx].text : NULL, meta);
                json_decref(meta);
            }
        }
    }
    for (size_t i = 0; i < t->n_fields; i++)
        free(t->fields[i].text);
    t->n_fields = 0;
    t->between_rows = 1;
}

/* libcsv trims these around unquoted fields: spaces always, tabs unless they delimit. */
static int space_only(unsigned char c)
{
    return c == ' ';
}

static int read_csv(table_t *t, int delimiter, int strict)
{
    FILE *f = fopen(t->opt->file, "rb");
    if (!f) {
        int err = errno;
        return mb_error("%s: cannot open: %s", t->opt->file, strerror(err));
    }
    struct csv_parser p;
    if (csv_init(&p, (unsigned char)(strict ? CSV_STRICT | CSV_STRICT_FINI : 0)) != 0) {
        fclose(f);
        return mb_error("out of memory");
    }
    csv_set_delim(&p, (unsigned char)delimiter);
    if (delimiter == '\t')
        csv_set_space_func(&p, space_only);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    t->between_rows = 1;
    while (!t->failed && (len = getline(&line, &cap, f)) >= 0) {
        t->line++;
        int blank =
            (len == 1 && line[0] == '\n') || (len == 2 && line[0] == '\r' && line[1] == '\n');
        if (t->between_rows && !blank) {
            t->row_line = t->line;
            t->between_rows = 0;
        }
        if (csv_parse(&p, line, (size_t)len, on_field, on_row, t) != (size_t)len && !t->failed)
            t->failed = mb_error("%s:%zu: %s%s", t->opt->file, t->line, csv_strerror(csv_error(&p)),
                                 csv_error(&p) == CSV_EPARSE
                                     ? " (a quote inside an unquoted field, or text after a "
                                       "closing quote: quote the field and double its quotes)"
                                     : "");
    }
    if (!t->failed && ferror(f)) {
        int err = errno ? errno : EIO;
        t->failed = mb_error("%s: read error: %s", t->opt->file, strerror(err));
    }
    if (!t->failed && csv_fini(&p, on_field, on_row, t) != 0 && !t->failed)
        t->failed = mb_error("%s:%zu: a quoted field is not closed before the end of the file",
                             t->opt->file, t->row_line);
    if (!t->failed && !t->have_header)
        t->failed = mb_error("%s: empty: no header line", t->opt->file);
    csv_free(&p);
    for (size_t i = 0; i < t->n_fields; i++)
        free(t->fields[i].text);
    free(line);
    fclose(f);
    return t->failed ? -1 : 0;
}

/* ---- JSON lines (jansson) ----------------------------------------------------------- */

/* A string key of a row: *out NULL when absent or null (and not required). */
static int json_key(json_t *row, const char *key, int required, const mb_where_t *where,
                    const char **out)
{
    char w[1024];
    json_t *v = json_object_get(row, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return required ? mb_error("%s: missing", mb_where_text(w, sizeof w, where, key)) : 0;
    if (!json_is_string(v))
        return mb_error("%s: must be a string", mb_where_text(w, sizeof w, where, key));
    *out = json_string_value(v);
    return 0;
}

static int is_used_key(const mb_table_options_t *opt, const char *key)
{
    return strcmp(key, opt->path_col) == 0 ||
           (opt->caption_col && !strcmp(key, opt->caption_col)) ||
           (opt->id_col && strcmp(key, opt->id_col) == 0);
}

/* The row's --meta-col keys as they are ("*": every key but the path, caption and id keys);
 * an absent or null key is left out. */
static int jsonl_meta(const table_t *t, json_t *row, json_t **meta)
{
    if (!(*meta = json_object()))
        return mb_error("out of memory");
    for (size_t k = 0; k < t->opt->n_meta_cols; k++) {
        const char *name = t->opt->meta_cols[k], *key;
        json_t *v;
        if (strcmp(name, "*") == 0) {
            json_object_foreach(row, key, v)
            {
                if (!is_used_key(t->opt, key) && !json_is_null(v) &&
                    json_object_set(*meta, key, v) != 0)
                    return mb_error("out of memory");
            }
        } else if ((v = json_object_get(row, name)) && !json_is_null(v) &&
                   json_object_set(*meta, name, v) != 0) {
            return mb_error("out of memory");
        }
    }
    return 0;
}

static int read_jsonl(table_t *t)
{
    FILE *f = fopen(t->opt->file, "rb");
    if (!f) {
        int err = errno;
        return mb_error("%s: cannot open: %s", t->opt->file, strerror(err));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        t->line++;
        char *s = line;
        if (t->line == 1 && len >= 3 && strncmp(s, "\xEF\xBB\xBF", 3) == 0)
            s += 3, len -= 3;
        while (len > 0 && isspace((unsigned char)s[len - 1]))
            s[--len] = '\0';
        while (len > 0 && isspace((unsigned char)*s))
            s++, len--;
        if (len == 0)
            continue;
        if (t->line == 1 && s[0] == '[') {
            rc = mb_error("%s: a JSON array; --from-csv reads JSON lines, one object a line "
                          "(convert with: jq -c '.[]' %s)",
                          t->opt->file, t->opt->file);
            break;
        }
        mb_where_t where = {.file = t->opt->file, .line = t->line, .row = t->report->rows + 1};
        json_error_t jerr;
        json_t *row = json_loadb(s, (size_t)len, 0, &jerr);
        char w[1024];
        if (!row) {
            rc = mb_error("%s: not JSON: %s at column %d", mb_where_text(w, sizeof w, &where, NULL),
                          jerr.text, jerr.column);
            break;
        }
        const char *path = NULL, *caption = NULL, *id = NULL;
        if (!json_is_object(row))
            rc = mb_error("%s: not a JSON object", mb_where_text(w, sizeof w, &where, NULL));
        if (rc == 0)
            rc = json_key(row, t->opt->path_col, 1, &where, &path);
        if (rc == 0 && t->opt->caption_col)
            rc = json_key(row, t->opt->caption_col, 0, &where, &caption);
        if (rc == 0 && t->opt->id_col)
            rc = json_key(row, t->opt->id_col, 1, &where, &id);
        json_t *meta = NULL;
        if (rc == 0 && t->opt->n_meta_cols)
            rc = jsonl_meta(t, row, &meta);
        if (rc == 0)
            rc = take_row(t, &where, path, caption, id, meta);
        json_decref(meta);
        json_decref(row);
    }
    if (rc == 0 && ferror(f)) {
        int err = errno ? errno : EIO;
        rc = mb_error("%s: read error: %s", t->opt->file, strerror(err));
    }
    free(line);
    fclose(f);
    return rc;
}

int mb_from_table(const mb_table_options_t *opt, mb_emitter_t *e, mb_table_report_t *report)
{
    *report = (mb_table_report_t){0};
    table_t t = {.opt = opt, .report = report, .e = e};
    const char *file = opt->file;
    int jsonl = !opt->delimiter && (has_suffix(file, ".jsonl") || has_suffix(file, ".ndjson") ||
                                    has_suffix(file, ".json"));
    int delimiter = opt->delimiter                                         ? opt->delimiter
                    : has_suffix(file, ".tsv") || has_suffix(file, ".tab") ? '\t'
                                                                           : ',';
    report->format = jsonl ? "JSON lines" : delimiter == '\t' ? "TSV" : "CSV";
    char *root_dir = NULL;
    if (opt->root) {
        root_dir = strdup(opt->root);
    } else {
        const char *slash = strrchr(file, '/');
        root_dir = slash ? strndup(file, slash == file ? 1 : (size_t)(slash - file)) : strdup(".");
    }
    if (!root_dir)
        return mb_error("out of memory");
    /* a URL root (s3://bucket/prefix, https://host/dir): relative paths are joined to it */
    t.root = dh__url_scheme(root_dir) != DH_URL_NONE ? strdup(root_dir) : realpath(root_dir, NULL);
    if (!t.root) {
        int err = errno;
        mb_error("%s: cannot open the root folder: %s", root_dir, strerror(err));
        free(root_dir);
        return -1;
    }
    free(root_dir);
    int rc = jsonl ? read_jsonl(&t) : read_csv(&t, delimiter, delimiter != '\t');
    for (size_t i = 0; i < t.n_header; i++)
        free(t.header[i]);
    free(t.header);
    free(t.meta_idx);
    free(t.fields);
    free(t.root);
    return rc;
}
