/* profile_internal.h: what the profile set's files share (profile.c: the set;
 * profile_read.c: the JSONL reader; profile_extra.c: the unknown fields kept verbatim;
 * profile_write.c: the writer). Private to src/model/ (docs/profiles.md, docs/conventions.md
 * "Names").
 */
#ifndef DH_MODEL_PROFILE_INTERNAL_H
#define DH_MODEL_PROFILE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "datahelix/profile.h"

struct json_t;

/* The reader's read block and the writer's stdio buffer: 1 MiB. */
#define DH__PROFILE_IO_CHUNK ((size_t)1 << 20)

/* JSON's four whitespace bytes. */
static inline bool dh__profile_is_json_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ---- the set (profile.c) ---- */

/* Copies a validated row (strings, extra of extra_len bytes or NULL) into the set. Amortised
 * O(1) per row plus the length of its strings. 0, or DH_ENOMEM with the set unchanged apart
 * from a few unused arena bytes (no message: the caller names the row). */
int dh__profile_append_row(dh_profile_set_t *set, const dh_profile_row_t *src, const char *extra,
                           size_t extra_len);

/* ---- the fields (profile_read.c) ---- */

/* Index of a known field name (len bytes, not NUL-terminated), or -1. */
int dh__profile_field_lookup(const char *name, size_t len);
/* The JSON name of known field `field` (static). */
const char *dh__profile_field_name(int field);
/* "an object", "a string", ...: the JSON type of v, for messages (static). */
const char *dh__profile_json_type_name(const struct json_t *v);
/* The first field of a row with an impossible value, with the reason in why[]; or -1. */
int dh__profile_row_problem(const dh_profile_row_t *r, char *why, size_t why_size);

/* ---- the unknown fields (profile_extra.c) ---- */

/* Writes into buf (room for len + 3 bytes) the compact object of the members of the JSON
 * object text [text, text+len) whose keys are not known fields, or "{}" if none; returns the
 * length written. The text must be one object jansson accepted. */
size_t dh__profile_extract_extra(const char *text, size_t len, char *buf);
/* Checks that extra is a JSON object without known fields and writes its compact form to
 * *compact (dh_malloc'd, the caller's; NULL for "{}"). 0, DH_ESCHEMA or DH_ENOMEM with a
 * message naming field 'extra'. */
int dh__profile_extra_normalise(const char *extra, char **compact, size_t *compact_len);

#endif
