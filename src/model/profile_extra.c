/* profile_extra.c: the unknown fields of a profile row, kept verbatim (docs/profiles.md):
 * their source text, with whitespace outside strings removed, in row.extra, so a round trip
 * through the writer never rewrites a number (jansson would print 0.1 as
 * 0.10000000000000001). The reader (profile_read.c) cuts them out of a line it has parsed;
 * dh_profile_set_add (profile.c) checks and compacts a caller's.
 */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "model/profile_internal.h"

/* ---- raw member scanning (for verbatim extras) -------------------------------------- */

/* These walk text that jansson has already accepted as one JSON object, so they need no
 * error checks. All are O(length of what they skip). */

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && dh__profile_is_json_ws(*p))
        p++;
    return p;
}

/* p at the opening quote; returns the position after the closing quote. */
static const char *skip_string(const char *p, const char *end)
{
    for (p++; p < end && *p != '"'; p++)
        if (*p == '\\')
            p++;
    return p < end ? p + 1 : end;
}

static const char *skip_value(const char *p, const char *end)
{
    if (*p == '"')
        return skip_string(p, end);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                p = skip_string(p, end);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return end;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && !dh__profile_is_json_ws(*p))
        p++;
    return p;
}

/* Appends [p, end) to dst without the whitespace outside strings; returns the new end. */
static char *copy_compact(char *dst, const char *p, const char *end)
{
    while (p < end) {
        if (*p == '"') {
            const char *q = skip_string(p, end);
            memcpy(dst, p, (size_t)(q - p));
            dst += q - p;
            p = q;
        } else if (dh__profile_is_json_ws(*p)) {
            p++;
        } else {
            *dst++ = *p++;
        }
    }
    return dst;
}

/* Known-field index of a raw quoted key, or -1. A key written with escapes ("\u0069d")
 * is decoded through jansson so it matches what json_object_foreach saw. */
static int raw_key_field(const char *key, const char *key_end)
{
    const char *inner = key + 1;
    size_t len = (size_t)(key_end - key) - 2;
    if (!memchr(inner, '\\', len))
        return dh__profile_field_lookup(inner, len);
    json_t *s = json_loadb(key, (size_t)(key_end - key), JSON_DECODE_ANY, NULL);
    int f = s && json_is_string(s)
                ? dh__profile_field_lookup(json_string_value(s), json_string_length(s))
                : -1;
    json_decref(s);
    return f;
}

/* Writes into buf (room for len + 3 bytes) the compact object of the members of the JSON
 * object text [text, text+len) whose keys are not known fields, or "{}" if none; returns
 * the length written. Members are kept in source order, duplicates included (verbatim). */
size_t dh__profile_extract_extra(const char *text, size_t len, char *buf)
{
    const char *p = text, *end = text + len;
    char *out = buf;
    *out++ = '{';
    p = skip_ws(p, end);
    p++; /* '{' */
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p == '}')
            break;
        const char *key = p, *key_end = skip_string(p, end);
        p = skip_ws(key_end, end);
        p = skip_ws(p + 1, end); /* ':' */
        const char *value = p;
        p = skip_value(p, end);
        if (raw_key_field(key, key_end) < 0) {
            if (out > buf + 1)
                *out++ = ',';
            memcpy(out, key, (size_t)(key_end - key));
            out += key_end - key;
            *out++ = ':';
            out = copy_compact(out, value, p);
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',')
            p++;
    }
    *out++ = '}';
    return (size_t)(out - buf);
}

/* ---- a caller's extra ---------------------------------------------------------------- */

/* Checks that extra is a JSON object without known fields and writes its compact form
 * (whitespace outside strings removed) to *compact (dh_malloc'd; NULL for "{}"). */
int dh__profile_extra_normalise(const char *extra, char **compact, size_t *compact_len)
{
    *compact = NULL;
    *compact_len = 0;
    size_t len = strlen(extra);
    json_error_t jerr;
    dh__json_track_begin();
    json_t *obj = json_loadb(extra, len, JSON_DECODE_ANY, &jerr);
    int rc = 0;
    if (dh__json_track_failed()) {
        rc = dh__set_error(DH_ENOMEM, "profile row: out of memory checking field 'extra'");
        goto out;
    }
    if (!obj || !json_is_object(obj)) {
        rc = dh__set_error(DH_ESCHEMA, "profile row: field 'extra': %s%s",
                           obj ? "must be a JSON object, got " : "not JSON: ",
                           obj ? dh__profile_json_type_name(obj) : jerr.text);
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value)
    {
        if (dh__profile_field_lookup(key, strlen(key)) >= 0) {
            rc = dh__set_error(DH_ESCHEMA, "profile row: field 'extra': holds the known field '%s'",
                               key);
            goto out;
        }
    }
    if (json_object_size(obj) == 0)
        goto out;
    char *buf = dh_malloc(len + 3);
    if (!buf) {
        rc = dh__set_error(DH_ENOMEM, "profile row: out of memory copying field 'extra'");
        goto out;
    }
    const char *p = skip_ws(extra, extra + len);
    const char *end = extra + len;
    while (end > p && dh__profile_is_json_ws(end[-1]))
        end--;
    *compact_len = (size_t)(copy_compact(buf, p, end) - buf);
    *compact = buf;
out:
    json_decref(obj);
    return rc;
}
