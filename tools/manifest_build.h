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
    size_t written, with_caption, with_meta;
    unsigned long long progress_every; /* 0: no progress lines */
    int skip_bad_captions;             /* --skip-bad-captions: skip, not fail (mb_bad_caption) */
    size_t skipped_bad_captions;
} mb_emitter_t;

/* Opens OUT.part for writing. */
int mb_emitter_open(mb_emitter_t *e, const char *out_path, unsigned long long progress_every);

struct json_t;

/* Writes one {"id","path"[,"caption"][,"meta"]} line. abs_path is absolute; it is written
 * relative to OUT's folder when it lies under it. caption may be NULL or "". meta (borrowed,
 * may be NULL) is a JSON object, written only when it has a key. id_column names the column
 * the id came from (for the duplicate-id message; NULL when not from a column). Returns 0,
 * 1 when the entry was skipped for a caption that is not UTF-8 (--skip-bad-captions), or -1. */
int mb_emit(mb_emitter_t *e, const char *id, const char *abs_path, const char *caption,
            struct json_t *meta, const mb_where_t *where, const char *id_column);

/* The same line for a byte range of abs_path (a tar member read in place), with "offset"
 * and "size" after "path": {"id","path","offset","size"[,"caption"][,"meta"]}. size > 0. */
int mb_emit_range(mb_emitter_t *e, const char *id, const char *abs_path, long long offset,
                  long long size, const char *caption, struct json_t *meta,
                  const mb_where_t *where);

/* A caption that cannot be used (unreadable, not UTF-8, a NUL byte, bad JSON): with
 * --skip-bad-captions counts it, names the first 10 on stderr ("manifest: skipped WHERE:
 * WHY") and returns 1 (skip the entry); else prints the error with the way out and returns
 * -1 (fail the run). where names the file, row or member. */
int mb_bad_caption(mb_emitter_t *e, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Closes and renames OUT.part to OUT (ok = 1), or removes it (ok = 0); frees everything. */
int mb_emitter_finish(mb_emitter_t *e, int ok);

/* "datahelix manifest: " + the message, to stderr; returns -1. */
int mb_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "FILE:LINE: row N, column 'NAME'" (or less, when line, row or column are 0/NULL) into buf. */
const char *mb_where_text(char *buf, size_t size, const mb_where_t *where, const char *column);

/* dir + "/" + name, malloc'd; NULL (after a message) when out of memory. */
char *mb_join(const char *dir, const char *name);

/* Caption rules shared by the sources (manifest_caption.c); where names the file or member.
 * mb_caption_text: text[0..len) (NUL-terminated at len) must hold no NUL and be UTF-8; a
 * UTF-8 byte-order mark and white space at both ends are removed in place. mb_caption_json:
 * root must be an object; *caption (the caller's) is its "caption" string, else its "text"
 * string, else NULL with *keyless = 1; a key that is not a string is a bad caption. Both
 * return 0, 1 (a bad caption skipped: mb_bad_caption) or -1. */
int mb_caption_text(mb_emitter_t *e, char *text, size_t len, const char *where);
int mb_caption_json(mb_emitter_t *e, struct json_t *root, const char *where, char **caption,
                    int *keyless);

/* Metadata rules shared by the sources (manifest_meta.c). mb_meta_value: text as a JSON
 * value: a decimal integer (no leading zeros, fits int64) an integer, a decimal real (finite)
 * a real, else a string; NULL when the text is not UTF-8 (or no memory); the caller's.
 * mb_meta_set_text: meta[key] = mb_meta_value(text), an error naming where and key when not
 * UTF-8 or holding a NUL byte. mb_meta_merge: copies root's keys (an object: a .json sidecar or
 * member) into meta, except the caption's keys "caption" and "text". */
struct json_t *mb_meta_value(const char *text, size_t len);
int mb_meta_set_text(struct json_t *meta, const char *key, const char *text, size_t len,
                     const char *where);
int mb_meta_merge(struct json_t *meta, struct json_t *root);

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
    const char **meta_cols; /* --meta-col: columns kept in "meta"; "*": every column but the
                             * path, caption and id columns */
    size_t n_meta_cols;
} mb_table_options_t;

typedef struct mb_table_report {
    size_t rows, taken, skipped_missing;
    const char *format; /* "CSV", "TSV", "JSON lines" */
} mb_table_report_t;

int mb_from_table(const mb_table_options_t *opt, mb_emitter_t *e, mb_table_report_t *report);

/* The tar reader: WebDataset shards, one entry per sample, pointing at its media member's
 * bytes inside the shard (manifest_tar.c). */
typedef struct mb_shard_list {
    char **shards;
    size_t n, cap;
} mb_shard_list_t;

/* Appends the shards a pattern names: "a.tar", brace ranges "{000..099}" (zero padding kept
 * when an end has a leading zero), brace lists "{train,val}", several joined by "::" (not
 * inside an IPv6 literal's brackets), and for "s3://bucket/prefix/" every .tar object listed
 * under the prefix. On a malformed pattern returns -1, on a listing that fails (network, S3's
 * error) -2, with the reason in why (no message printed). */
int mb_shards_expand(const char *pattern, mb_shard_list_t *list, char *why, size_t why_size);
void mb_shards_free(mb_shard_list_t *list);

typedef struct mb_tar_options {
    char **shards; /* in order */
    size_t n_shards;
    char **exts; /* media extensions, lower case, no dot */
    size_t n_exts;
    int skip_missing; /* a missing shard is skipped (counted) rather than an error */
    char **meta_exts; /* --meta-ext: members kept in "meta" besides .cls (lower case) */
    size_t n_meta_exts;
} mb_tar_options_t;

typedef struct mb_tar_report {
    size_t shards_read, shards_missing, members, samples;
    size_t keys_without_media; /* keys skipped: no media member */
    size_t other_members;      /* folders, links, names without a key */
    size_t captions_txt, captions_json, json_without_caption;
    size_t skipped_bad_caption; /* samples skipped for their caption (--skip-bad-captions) */
} mb_tar_report_t;

int mb_from_tar(const mb_tar_options_t *opt, mb_emitter_t *e, mb_tar_report_t *report);

#endif
