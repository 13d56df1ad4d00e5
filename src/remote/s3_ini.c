/* s3_ini.c: the INI format of AWS's shared files (~/.aws/credentials, ~/.aws/config), as
 * botocore reads them: `[section]` headers, `key = value` (or `key: value`) lines, full-line
 * comments starting with '#' or ';', blank lines, and a key with an empty value followed by
 * indented `sub = value` lines, a nested section (`s3 =` / `  endpoint_url = ...`) read as
 * keys "key.sub". Values are kept verbatim (an inline '#' is part of the value, as botocore
 * does). Errors name PATH:LINE and never quote the line: it may hold a secret.
 *
 * Cost: one pass, an allocation per entry; the files are a few lines. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/s3.h"

static char *dup_range(const char *s, size_t n)
{
    char *p = dh_malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static void trim(const char **s, size_t *n)
{
    while (*n && (**s == ' ' || **s == '\t')) {
        (*s)++;
        (*n)--;
    }
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t' || (*s)[*n - 1] == '\r'))
        (*n)--;
}

void dh__ini_clear(dh__ini_t *ini)
{
    if (!ini)
        return;
    for (size_t i = 0; i < ini->count; i++) {
        dh_free(ini->entries[i].section);
        dh_free(ini->entries[i].key);
        dh_free(ini->entries[i].value);
    }
    dh_free(ini->entries);
    memset(ini, 0, sizeof(*ini));
}

/* Adds an entry; key_prefix ("s3") nests the key as "s3.key". A value of NULL records only
 * that the section exists (its header line). */
static int add(dh__ini_t *ini, const char *section, size_t section_len, const char *prefix,
               const char *key, size_t key_len, const char *value, size_t value_len, size_t line)
{
    if (ini->count == ini->cap) {
        size_t cap = ini->cap ? ini->cap * 2 : 16;
        dh__ini_entry_t *p = dh_reallocarray(ini->entries, cap, sizeof(*p));
        if (!p)
            return DH_ENOMEM;
        ini->entries = p;
        ini->cap = cap;
    }
    dh__ini_entry_t *e = &ini->entries[ini->count];
    memset(e, 0, sizeof(*e));
    e->line = line;
    e->section = dup_range(section, section_len);
    size_t prefix_len = prefix ? strlen(prefix) + 1 : 0;
    e->key = dh_malloc(prefix_len + key_len + 1);
    e->value = value ? dup_range(value, value_len) : NULL;
    if (!e->section || !e->key || (value && !e->value)) {
        dh_free(e->section);
        dh_free(e->key);
        dh_free(e->value);
        return DH_ENOMEM;
    }
    if (prefix) {
        memcpy(e->key, prefix, prefix_len - 1);
        e->key[prefix_len - 1] = '.';
    }
    memcpy(e->key + prefix_len, key, key_len);
    e->key[prefix_len + key_len] = '\0';
    ini->count++;
    return 0;
}

int dh__ini_parse(const char *text, size_t len, const char *path, dh__ini_t *out)
{
    memset(out, 0, sizeof(*out));
    const char *section = NULL;
    size_t section_len = 0;
    char nest[64] = ""; /* the key whose indented sub-keys follow, "" when none */
    size_t line_no = 0;
    const char *p = text, *end = text + len;
    int rc = 0;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t n = eol ? (size_t)(eol - p) : (size_t)(end - p);
        const char *line = p;
        p = eol ? eol + 1 : end;
        line_no++;
        if (memchr(line, '\0', n)) {
            rc = dh__set_error(DH_EPARSE, "%s:%zu: a NUL byte in the line", path, line_no);
            goto fail;
        }
        bool indented = n && (line[0] == ' ' || line[0] == '\t');
        const char *s = line;
        size_t m = n;
        trim(&s, &m);
        if (m == 0 || s[0] == '#' || s[0] == ';')
            continue;
        if (s[0] == '[') {
            if (s[m - 1] != ']') {
                rc = dh__set_error(DH_EPARSE, "%s:%zu: a section header without its ']'", path,
                                   line_no);
                goto fail;
            }
            section = s + 1;
            section_len = m - 2;
            trim(&section, &section_len);
            if (!section_len) {
                rc = dh__set_error(DH_EPARSE, "%s:%zu: an empty section name", path, line_no);
                goto fail;
            }
            nest[0] = '\0';
            if ((rc = add(out, section, section_len, NULL, "", 0, NULL, 0, line_no)) < 0)
                goto nomem;
            continue;
        }
        const char *eq = NULL;
        for (size_t i = 0; i < m && !eq; i++)
            if (s[i] == '=' || s[i] == ':')
                eq = s + i;
        if (!eq) {
            rc = dh__set_error(DH_EPARSE, "%s:%zu: expected 'key = value' or '[section]'", path,
                               line_no);
            goto fail;
        }
        if (!section) {
            rc = dh__set_error(DH_EPARSE, "%s:%zu: a key before any '[section]'", path, line_no);
            goto fail;
        }
        const char *key = s, *value = eq + 1;
        size_t key_len = (size_t)(eq - s), value_len = m - key_len - 1;
        trim(&key, &key_len);
        trim(&value, &value_len);
        if (!key_len) {
            rc = dh__set_error(DH_EPARSE, "%s:%zu: a value without a key", path, line_no);
            goto fail;
        }
        if (indented && nest[0]) {
            if ((rc = add(out, section, section_len, nest, key, key_len, value, value_len,
                          line_no)) < 0)
                goto nomem;
            continue;
        }
        if (indented) {
            rc = dh__set_error(DH_EPARSE,
                               "%s:%zu: an indented line that follows no 'key =' with an "
                               "empty value",
                               path, line_no);
            goto fail;
        }
        nest[0] = '\0';
        if (value_len == 0 && key_len < sizeof(nest)) {
            memcpy(nest, key, key_len);
            nest[key_len] = '\0';
        }
        if ((rc = add(out, section, section_len, NULL, key, key_len, value, value_len, line_no)) <
            0)
            goto nomem;
    }
    return 0;
nomem:
    rc = dh__set_error(DH_ENOMEM, "%s: out of memory reading it", path);
fail:
    dh__ini_clear(out);
    return rc;
}

int dh__ini_load(const char *path, dh__ini_t *out)
{
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return DH_ENOENT;
        return dh__set_error(-errno, "%s: %s", path, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > ((size_t)1 << 24)) {
                rc = dh__set_error(DH_EPARSE, "%s: larger than 16 MiB, not an AWS file", path);
                break;
            }
            char *q = dh_realloc(text, cap);
            if (!q) {
                rc = dh__set_error(DH_ENOMEM, "%s: out of memory reading it", path);
                break;
            }
            text = q;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                rc = dh__set_error(DH_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        rc = dh__ini_parse(text ? text : "", len, path, out);
    if (text) {
        explicit_bzero(text, len); /* the file may hold secrets */
        dh_free(text);
    }
    return rc;
}

const char *dh__ini_get(const dh__ini_t *ini, const char *section, const char *key, size_t *line)
{
    const char *found = NULL;
    for (size_t i = 0; i < ini->count; i++) {
        const dh__ini_entry_t *e = &ini->entries[i];
        if (e->value && strcmp(e->section, section) == 0 && strcasecmp(e->key, key) == 0) {
            found = e->value;
            if (line)
                *line = e->line;
        }
    }
    return found;
}

bool dh__ini_has_section(const dh__ini_t *ini, const char *section)
{
    for (size_t i = 0; i < ini->count; i++)
        if (strcmp(ini->entries[i].section, section) == 0)
            return true;
    return false;
}
