/* profile.h: descriptors and cost profiles, and their JSONL interchange format.
 *
 * A profile set is what the scheduler knows about samples before decoding them
 * (docs/design.md §3): one row per sample with its descriptor (id, uri, shape) and its predicted
 * costs (tokens, CPU seconds, bytes). Probe writes it, the planner, the runtime and the
 * benchmarks read it. The format is documented in docs/profiles.md.
 *
 * Memory: rows live in one array, strings in a chunked arena owned by the set, profile keys
 * interned (one copy per distinct key); 120 bytes per row (up to 2x while the row array
 * doubles) plus its strings: ~160 MB for 1,000,000 generated rows (docs/profiles.md).
 * A set belongs to one thread; read-only use from several threads is safe once loaded.
 */
#ifndef DATAHELIX_PROFILE_H
#define DATAHELIX_PROFILE_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_profile_row {
    /* Required fields. Strings are borrowed from the set that holds the row. */
    const char *id;          /* sample id, unique within a data set */
    const char *uri;         /* where the encoded sample is (path, or path#offset+length) */
    const char *profile_key; /* cost bucket: frames x resolution ("f16x224x224") */
    uint32_t key_index;      /* index of profile_key in the set's key table (set by the set) */
    int32_t frames;          /* frames sampled from the clip */
    int32_t height, width;   /* output size of each frame */
    int64_t tokens_est;      /* tokens the model sees for this sample */
    double cpu_s_est;        /* CPU seconds to produce the sample (decode + transform) */
    int64_t in_bytes;        /* encoded bytes read */
    int64_t out_bytes;       /* decoded output bytes */
    /* Optional descriptor fields (docs/design.md §3): 0 or NULL when absent. */
    double duration_s; /* clip duration in seconds */
    double fps;        /* source frame rate */
    int64_t text_len;  /* caption / text length in tokens */
    const char *codec; /* source codec name ("h264") */
    const char *node;  /* locality hint: the node that stores the file */
    const char *extra; /* any other fields, verbatim, as one compact JSON object */
} dh_profile_row_t;

typedef struct dh_profile_set dh_profile_set_t;

/* Creates an empty set. Returns 0 or DH_ENOMEM. *out is the caller's (dh_profile_set_destroy). */
DH_EXTERN int dh_profile_set_new(dh_profile_set_t **out);

/* Frees the set, its rows and strings; sets *set = NULL. Safe on NULL. */
DH_EXTERN void dh_profile_set_destroy(dh_profile_set_t **set);

/* Appends the rows of a JSONL file ("-" reads stdin). Blank lines are skipped. Unknown
 * fields are kept in `extra`, never an error. Returns 0, or on the first bad line
 * DH_EPARSE (not JSON / not an object) or DH_ESCHEMA (a required field is missing, has the
 * wrong type or an impossible value), DH_ENOENT/-errno (cannot open or read), DH_ENOMEM.
 * On error the set holds the rows appended before the bad line, and dh_last_error() says
 * "PATH:LINE: field 'NAME': what is wrong". */
DH_EXTERN int dh_profile_set_load(dh_profile_set_t *set, const char *path);

/* The same over an in-memory buffer of JSONL text; `name` stands for the path in messages. */
DH_EXTERN int dh_profile_set_load_buffer(dh_profile_set_t *set, const char *data, size_t len,
                                         const char *name);

/* Appends a copy of *row (strings copied, key interned, key_index ignored and set).
 * Returns 0, DH_ESCHEMA (a required string is NULL or a count is negative; message says
 * which) or DH_ENOMEM. */
DH_EXTERN int dh_profile_set_add(dh_profile_set_t *set, const dh_profile_row_t *row);

/* Number of rows. */
DH_EXTERN size_t dh_profile_set_count(const dh_profile_set_t *set);

/* Row i (i < count). Borrowed; valid until the set is changed or destroyed. */
DH_EXTERN const dh_profile_row_t *dh_profile_set_row(const dh_profile_set_t *set, size_t i);

/* Number of distinct profile keys, and key k (k < key_count). Borrowed. */
DH_EXTERN size_t dh_profile_set_key_count(const dh_profile_set_t *set);
DH_EXTERN const char *dh_profile_set_key(const dh_profile_set_t *set, size_t k);

/* Writes every row as JSONL to path ("-" is stdout). Returns 0 or -errno / DH_EIO (the
 * message names the path). */
DH_EXTERN int dh_profile_set_write(const dh_profile_set_t *set, const char *path);

/* Writes one row as one JSON line to f. Returns 0 or DH_EIO / DH_ENOMEM. */
DH_EXTERN int dh_profile_row_write(FILE *f, const dh_profile_row_t *row);

#ifdef __cplusplus
}
#endif
#endif
