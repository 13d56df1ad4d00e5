/* manifest.h: a data set's manifest, DIR/manifest.jsonl (written by `datahelix synth`,
 * read by `probe`, the benchmarks and, later, the runtime).
 *
 * One JSON object per line: "id" (string, required), "path" (string, required: relative to
 * the manifest's folder, or absolute), "caption" (string, optional), and an optional
 * per-sample sampling plan "frames", "height", "width" (positive integers) that overrides
 * the pipeline spec's defaults (docs/pipeline.md), and "offset", "size" (together: a byte
 * range of the file, a member of a tar shard read in place; the entry's path is then
 * FFmpeg's "subfile,,start,OFFSET,end,OFFSET+SIZE,,:FILE"), and "text_tokens" (the
 * caption's length in the user's tokenizer's tokens; datahelix.count_text_tokens writes it).
 * Other fields are ignored.
 * A set belongs to one thread; read-only use from several threads is safe once loaded.
 */
#ifndef DATAHELIX_MANIFEST_H
#define DATAHELIX_MANIFEST_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_manifest_entry {
    const char *id;      /* borrowed from the manifest */
    const char *path;    /* resolved: the manifest's folder joined with the line's path
                          * (behind a "subfile,,start,S,end,E,,:" prefix for a byte range) */
    const char *caption; /* "" when absent */
    int64_t text_tokens; /* the caption's tokens by the user's tokenizer ("text_tokens"), or -1:
                          * probe then counts one token per 4 bytes */
    int32_t frames;      /* sampling plan override, 0 = the spec's */
    int32_t height, width;
} dh_manifest_entry_t;

typedef struct dh_manifest dh_manifest_t;

/* Reads a manifest file, or a manifest at an http://, https:// or s3:// URL (read whole, up
 * to 4 GiB; its relative paths are joined to the URL's folder; errors as the remote reader's:
 * -ENOENT, -EACCES, DH_EIO naming the URL and the HTTP status). Returns 0, -errno (cannot
 * open or read; the message names the path), DH_EPARSE / DH_ESCHEMA on the first bad line
 * ("PATH:LINE: field 'NAME': ..."), or DH_ENOMEM. *out is the caller's (dh_manifest_destroy). */
DH_EXTERN int dh_manifest_load(const char *path, dh_manifest_t **out);

/* The same over `len` bytes of JSONL text in memory (not necessarily NUL-terminated);
 * `name` (NULL: "<buffer>") stands for the path, in messages and as the folder relative
 * paths are joined to. Returns 0, DH_EPARSE / DH_ESCHEMA, DH_ENOMEM; *out as above. */
DH_EXTERN int dh_manifest_load_buffer(const char *data, size_t len, const char *name,
                                      dh_manifest_t **out);

/* Frees the manifest; sets *manifest = NULL. Safe on NULL. */
DH_EXTERN void dh_manifest_destroy(dh_manifest_t **manifest);

DH_EXTERN size_t dh_manifest_count(const dh_manifest_t *manifest);

/* Entry i (i < count). Borrowed; valid until the manifest is destroyed. */
DH_EXTERN const dh_manifest_entry_t *dh_manifest_entry(const dh_manifest_t *manifest, size_t i);

#ifdef __cplusplus
}
#endif
#endif
