/* manifest_meta.c: the "meta" object of a manifest line (docs/datasets.md, "Labels and
 * metadata"): the rules every source of `datahelix manifest` applies to the values it keeps
 * beside the caption, so a CSV column, a tar member (.cls, --meta-ext) and a .json sidecar's
 * field become the same JSON values: text that reads as a decimal integer becomes an integer,
 * text that reads as a decimal real a real, anything else a string. The loader turns a key
 * whose values are all numbers into a tensor (python/datahelix/_meta.py). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "manifest_build.h"

/* "-12", "0", "7" (not "007": a code with leading zeros stays text, as a zip code or an
 * id does; not "+3", "1e3", " 1"). */
static int is_decimal_integer(const char *s, size_t len)
{
    size_t i = s[0] == '-';
    if (i == len)
        return 0;
    if (s[i] == '0' && len - i > 1)
        return 0;
    for (; i < len; i++)
        if (!isdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

/* "-1.5", "0.25", "3e-4", "2.", ".5": digits, at most one '.', an optional exponent; no "nan",
 * "inf", hex or leading '+' (strtod would take them). */
static int is_decimal_real(const char *s, size_t len)
{
    size_t i = s[0] == '-', digits = 0, dots = 0;
    if (i + 1 < len && s[i] == '0' && isdigit((unsigned char)s[i + 1]))
        return 0; /* "007.5": a code, as for integers */
    for (; i < len && (isdigit((unsigned char)s[i]) || s[i] == '.'); i++) {
        digits += isdigit((unsigned char)s[i]) != 0;
        dots += s[i] == '.';
    }
    if (digits == 0 || dots > 1)
        return 0;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '-' || s[i] == '+'))
            i++;
        size_t exp_digits = 0;
        for (; i < len && isdigit((unsigned char)s[i]); i++)
            exp_digits++;
        if (exp_digits == 0)
            return 0;
    }
    return i == len;
}

json_t *mb_meta_value(const char *text, size_t len)
{
    if (len > 0 && len < 64 && !memchr(text, '\0', len)) {
        char buf[64];
        memcpy(buf, text, len);
        buf[len] = '\0';
        if (is_decimal_integer(buf, len)) {
            errno = 0;
            long long v = strtoll(buf, NULL, 10);
            if (errno == 0)
                return json_integer(v);
        } else if (is_decimal_real(buf, len)) {
            double v = strtod(buf, NULL);
            if (isfinite(v))
                return json_real(v);
        }
    }
    return json_stringn(text, len); /* NULL: not UTF-8 */
}

int mb_meta_set_text(json_t *meta, const char *key, const char *text, size_t len, const char *where)
{
    /* jansson would keep it (as "\u0000"), but no manifest reader takes a NUL in a string */
    if (memchr(text, '\0', len))
        return mb_error("%s: the value of '%s' holds a NUL byte", where, key);
    json_t *v = mb_meta_value(text, len);
    if (!v)
        return mb_error("%s: the value of '%s' is not valid UTF-8", where, key);
    if (json_object_set_new(meta, key, v) != 0)
        return mb_error("%s: the key '%s' is not valid UTF-8", where, key);
    return 0;
}

int mb_meta_merge(json_t *meta, json_t *root)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "caption") == 0 || strcmp(key, "text") == 0)
            continue; /* the caption's keys: the caption, not metadata */
        if (json_object_set(meta, key, v) != 0)
            return mb_error("out of memory");
    }
    return 0;
}
