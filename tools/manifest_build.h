/* manifest_build.h: the private pieces of `datahelix manifest` (tools/cmd_manifest.c), which
 * turns a data set as people store it into the manifest JSONL that `probe` reads
 * (include/datahelix/manifest.h, docs/datasets.md). Three files: the emitter (here and in
 * cmd_manifest.c: duplicate ids, paths relative to the output, the JSONL it writes), the
 * folder walker (manifest_dir.c) and the table reader (manifest_table.c: CSV and TSV through
 * libcsv, JSON lines through jansson). Single-threaded. Every function that fails has
 * already printed "datahelix manifest: WHERE: WHAT" to stderr and returns -1. */
#ifndef DH_TOOLS_MANIFEST_BUILD_H
#define DH_TOOLS_MANIFEST_BUILD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Where an entry came from, for messages: "FILE:LINE: row N, column 'NAME'" (line 0: just
 * "FILE", as for a folder's files). */
typedef struct mb_where {
    const char *file;
    size_t line; /* 1-based physical line where the row starts, 0 = none */
    size_t row;  /* 1-based data row (the CSV header is not a row), 0 = none */
} mb_where_t;

typedef struct mb_id_slot mb_id_slot_t;

/* Writes entries to OUT.part (renamed to OUT by mb_emitter_finish), rejecting duplicate ids. */
typedef struct mb_emitter {
    const char *out_path;
    char *part_path;
    FILE *out;
    char *out_dir_abs; /* realpath of OUT's folder: paths under it are written relative */
    mb_id_slot_t *slots;
    size_t slot_cap, ids;
    size_t written, with_caption;
    unsigned long long progress_every; /* 0: no progress lines */
} mb_emitter_t;

/* Opens OUT.part for writing. */
int mb_emitter_open(mb_emitter_t *e, const char *out_path, unsigned long long progress_every);

/* Writes one {"id","path"[,"caption"]} line. abs_path is absolute; it is written relative to
 * OUT's folder when it lies under it. caption may be NULL or "". id_column names the column
 * the id came from (for the duplicate-id message; NULL when not from a column). */
int mb_emit(mb_emitter_t *e, const char *id, const char *abs_path, const char *caption,
            const mb_where_t *where, const char *id_column);

/* Closes and renames OUT.part to OUT (ok = 1), or removes it (ok = 0); frees everything. */
int mb_emitter_finish(mb_emitter_t *e, int ok);

/* "datahelix manifest: " + the message, to stderr; returns -1. */
int mb_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "FILE:LINE: row N, column 'NAME'" (or less, when line, row or column are 0/NULL) into buf. */
const char *mb_where_text(char *buf, size_t size, const mb_where_t *where, const char *column);

/* dir + "/" + name, malloc'd; NULL (after a message) when out of memory. */
char *mb_join(const char *dir, const char *name);

/* The folder walker: every file under dir whose extension is one of exts (lower case, no
 * dot; matched case-insensitively), in byte order of its path relative to dir, its id that
 * relative path, its caption from a sidecar STEM.txt (trimmed) or STEM.json ("caption" or
 * "text" key) beside it. */
typedef struct mb_dir_options {
    const char *dir;
    const char *skip_name; /* OUT's file name: OUT and OUT.part in its folder are not data */
    char **exts;
    size_t n_exts;
} mb_dir_options_t;

typedef struct mb_dir_report {
    size_t files_seen, taken, captions_txt, captions_json, json_without_caption;
} mb_dir_report_t;

int mb_from_dir(const mb_dir_options_t *opt, mb_emitter_t *e, mb_dir_report_t *report);

/* The table reader: CSV, TSV or JSON lines, one entry per data row. */
typedef enum mb_table_format {
    MB_TABLE_AUTO, /* from the extension: .tsv/.tab TSV, .jsonl/.ndjson/.json JSON lines */
    MB_TABLE_CSV,
    MB_TABLE_JSONL,
} mb_table_format_t;

typedef struct mb_table_options {
    const char *file;
    const char *path_col, *caption_col, *id_col; /* caption_col, id_col may be NULL */
    const char *root;                            /* NULL: the file's folder */
    int delimiter;                               /* 0: from the format */
    int skip_missing;
} mb_table_options_t;

typedef struct mb_table_report {
    size_t rows, taken, skipped_missing;
    const char *format; /* "CSV", "TSV", "JSON lines" */
} mb_table_report_t;

int mb_from_table(const mb_table_options_t *opt, mb_emitter_t *e, mb_table_report_t *report);

#endif
