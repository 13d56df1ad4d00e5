/* s3_braces.c: WebDataset's shard patterns (docs/remote.md, "Shard patterns"), the brace
 * syntax of bash and of the braceexpand package WebDataset uses: `{000..099}` (numeric
 * ranges, zero padding kept, descending and stepped ranges), `{a,b}` (alternatives, nested
 * braces allowed), several braces in one pattern (their product, left to right). Errors give
 * the 1-based position of the character at fault.
 *
 * Cost: recursive over the braces, linear in the output; the output is bounded by the
 * caller's max_count before it is built. Limit: no letter ranges ({a..e}) and no backslash
 * escapes; neither appears in shard names. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/s3.h"

typedef struct {
    char **items;
    size_t count, cap;
} list_t;

static void list_free(list_t *l)
{
    dh__brace_free(l->items, l->count);
    memset(l, 0, sizeof(*l));
}

static int list_push(list_t *l, char *s)
{
    if (!s)
        return DH_ENOMEM;
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        char **p = dh_reallocarray(l->items, cap, sizeof(*p));
        if (!p) {
            dh_free(s);
            return DH_ENOMEM;
        }
        l->items = p;
        l->cap = cap;
    }
    l->items[l->count++] = s;
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *p = dh_malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

typedef struct {
    const char *pattern; /* the whole pattern, for messages */
    size_t max_count;
} ctx_t;

static int expand(const ctx_t *c, const char *s, size_t len, list_t *out);

/* Parses a decimal integer bound of a range: optional '-', digits. */
static bool parse_bound(const char *s, size_t n, long long *v, size_t *digits, bool *padded)
{
    size_t i = 0;
    if (n && s[0] == '-')
        i = 1;
    if (i == n || n - i > 18)
        return false;
    for (size_t j = i; j < n; j++)
        if (s[j] < '0' || s[j] > '9')
            return false;
    char buf[24];
    memcpy(buf, s, n);
    buf[n] = '\0';
    *v = strtoll(buf, NULL, 10);
    *digits = n;
    *padded = n - i > 1 && s[i] == '0';
    return true;
}

/* The strings of a range body "A..B" or "A..B..STEP" (at offset `at` of the pattern). */
static int range(const ctx_t *c, const char *body, size_t n, size_t at, list_t *out)
{
    const char *dots = NULL;
    for (size_t i = 0; i + 1 < n && !dots; i++)
        if (body[i] == '.' && body[i + 1] == '.')
            dots = body + i;
    const char *a = body, *b = dots + 2;
    size_t an = (size_t)(dots - body);
    const char *dots2 = NULL;
    for (const char *q = b; q + 1 < body + n && !dots2; q++)
        if (q[0] == '.' && q[1] == '.')
            dots2 = q;
    size_t bn = (size_t)((dots2 ? dots2 : body + n) - b);
    long long from, to, step = 1;
    size_t ad, bd, sd;
    bool ap, bp, sp;
    if (!parse_bound(a, an, &from, &ad, &ap))
        return dh__set_error(DH_EPARSE, "'%s': position %zu: range start is not a number",
                             c->pattern, at + 1);
    if (!parse_bound(b, bn, &to, &bd, &bp))
        return dh__set_error(DH_EPARSE, "'%s': position %zu: range end is not a number", c->pattern,
                             at + 1 + (size_t)(b - body));
    if (dots2) {
        const char *st = dots2 + 2;
        size_t sn = (size_t)(body + n - st);
        if (!parse_bound(st, sn, &step, &sd, &sp) || step == 0)
            return dh__set_error(DH_EPARSE,
                                 "'%s': position %zu: range step is not a non-zero number",
                                 c->pattern, at + 1 + (size_t)(st - body));
        if (step < 0)
            step = -step;
    }
    unsigned long long span =
        from <= to ? (unsigned long long)(to - from) : (unsigned long long)(from - to);
    if (span / (unsigned long long)step + 1 > c->max_count)
        return dh__set_error(DH_ERANGE, "'%s': position %zu: the range gives more than %zu names",
                             c->pattern, at + 1, c->max_count);
    int width = (ap || bp) ? (int)(ad > bd ? ad : bd) : 0;
    if (width > 20) /* bounds have at most 19 characters (parse_bound) */
        width = 20;
    for (unsigned long long k = 0; k <= span / (unsigned long long)step; k++) {
        long long v = from <= to ? from + (long long)(k * (unsigned long long)step)
                                 : from - (long long)(k * (unsigned long long)step);
        char num[48];
        if (v < 0)
            snprintf(num, sizeof(num), "-%0*lld", width > 0 ? width - 1 : 0, -v);
        else
            snprintf(num, sizeof(num), "%0*lld", width, v);
        int rc = list_push(out, dh_strdup(num));
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The alternatives of a brace body, each expanded (they may hold braces). */
static int alternatives(const ctx_t *c, const char *body, size_t n, size_t at, list_t *out)
{
    size_t start = 0;
    int depth = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && body[i] == '{')
            depth++;
        else if (i < n && body[i] == '}')
            depth--;
        if (i == n || (body[i] == ',' && depth == 0)) {
            list_t part = {0};
            int rc = expand(c, body + start, i - start, &part);
            (void)at;
            for (size_t k = 0; rc == 0 && k < part.count; k++) {
                rc = list_push(out, part.items[k]);
                part.items[k] = NULL;
            }
            list_free(&part);
            if (rc < 0)
                return rc;
            if (out->count > c->max_count)
                return dh__set_error(DH_ERANGE, "'%s': more than %zu names", c->pattern,
                                     c->max_count);
            start = i + 1;
        }
    }
    return 0;
}

/* Expands s[0..len) (a piece of c->pattern, for positions). */
static int expand(const ctx_t *c, const char *s, size_t len, list_t *out)
{
    size_t at = (size_t)(s - c->pattern);
    size_t open = len;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '}')
            return dh__set_error(DH_EPARSE, "'%s': position %zu: a '}' that closes no '{'",
                                 c->pattern, at + i + 1);
        if (s[i] == '{') {
            open = i;
            break;
        }
    }
    if (open == len)
        return list_push(out, dup_n(s, len)) < 0 ? DH_ENOMEM : 0;
    size_t close = len;
    int depth = 0;
    bool comma = false;
    for (size_t i = open; i < len && close == len; i++) {
        if (s[i] == '{')
            depth++;
        else if (s[i] == '}' && --depth == 0)
            close = i;
        else if (s[i] == ',' && depth == 1)
            comma = true;
    }
    if (close == len)
        return dh__set_error(DH_EPARSE, "'%s': position %zu: a '{' that is never closed",
                             c->pattern, at + open + 1);
    const char *body = s + open + 1;
    size_t body_len = close - open - 1;
    list_t mid = {0}, rest = {0};
    int rc;
    if (comma)
        rc = alternatives(c, body, body_len, at + open + 1, &mid);
    else if (body_len >= 4 && memmem(body, body_len, "..", 2) && !memchr(body, '{', body_len))
        rc = range(c, body, body_len, at + open + 1, &mid);
    else
        rc =
            dh__set_error(DH_EPARSE, "'%s': position %zu: a brace with neither ',' nor '..' inside",
                          c->pattern, at + open + 1);
    if (rc == 0)
        rc = expand(c, s + close + 1, len - close - 1, &rest);
    if (rc == 0 && mid.count * rest.count > c->max_count)
        rc = dh__set_error(DH_ERANGE, "'%s': the pattern gives more than %zu names", c->pattern,
                           c->max_count);
    for (size_t i = 0; rc == 0 && i < mid.count; i++)
        for (size_t j = 0; rc == 0 && j < rest.count; j++) {
            size_t a = strlen(mid.items[i]), b = strlen(rest.items[j]);
            char *joined = dh_malloc(open + a + b + 1);
            if (joined) {
                memcpy(joined, s, open);
                memcpy(joined + open, mid.items[i], a);
                memcpy(joined + open + a, rest.items[j], b + 1);
            }
            rc = list_push(out, joined);
        }
    list_free(&mid);
    list_free(&rest);
    return rc;
}

long dh__brace_expand(const char *pattern, size_t max_count, char ***out)
{
    *out = NULL;
    ctx_t c = {.pattern = pattern, .max_count = max_count};
    list_t l = {0};
    int rc = expand(&c, pattern, strlen(pattern), &l);
    if (rc == 0 && l.count > max_count)
        rc = dh__set_error(DH_ERANGE, "'%s': the pattern gives more than %zu names", pattern,
                           max_count);
    if (rc < 0) {
        if (rc == DH_ENOMEM)
            dh__set_error(DH_ENOMEM, "'%s': out of memory expanding the pattern", pattern);
        list_free(&l);
        return rc;
    }
    *out = l.items;
    return (long)l.count;
}

void dh__brace_free(char **strings, size_t count)
{
    for (size_t i = 0; strings && i < count; i++)
        dh_free(strings[i]);
    dh_free(strings);
}
