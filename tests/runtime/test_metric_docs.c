/* test_metric_docs.c: docs/operations.md's metric tables ("Metrics": "### Coordinator",
 * "### DataServer", "### A rank's loader") list exactly the metrics of the tables of
 * src/runtime/stats_table.h (dh_metrics_table): each family once, with its label and type.
 * A row a table lacks (stale) or a family no row lists (missing), a wrong type or label,
 * fails naming it; the second case shows the check failing on a doctored copy.
 *
 * A doc row: | `name`, `name{label}`, ... | type | meaning |  (the meaning is free text). */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/metrics.h"
#include "dh_test.h"

typedef struct {
    char text[8192];
    size_t len;
    int problems;
} report_t;

static void say(report_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(report_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->text + r->len, sizeof r->text - r->len, fmt, ap);
    va_end(ap);
    if (n > 0 && r->len + (size_t)n < sizeof r->text)
        r->len += (size_t)n;
    r->problems++;
}

/* The section of `doc` under the heading `head` (to the next heading), or NULL. */
static const char *section(const char *doc, const char *head, size_t *len)
{
    const char *metrics = strstr(doc, "\n## Metrics\n");
    const char *s = metrics ? strstr(metrics, head) : NULL;
    if (!s || s[strlen(head)] != '\n')
        return NULL;
    s += strlen(head);
    const char *end = strstr(s, "\n#");
    *len = end ? (size_t)(end - s) : strlen(s);
    return s;
}

typedef struct {
    char name[128], label[32], type[16];
    bool seen;
} entry_t;

/* The entries of a section's table rows. */
static size_t doc_entries(const char *s, size_t len, entry_t *out, size_t cap)
{
    size_t n = 0;
    for (const char *line = s; line && line < s + len;) {
        const char *eol = memchr(line, '\n', (size_t)(s + len - line));
        size_t ll = eol ? (size_t)(eol - line) : (size_t)(s + len - line);
        if (ll > 3 && strncmp(line, "| `", 3) == 0) {
            const char *bar1 = memchr(line + 1, '|', ll - 1);
            const char *bar2 = bar1 ? memchr(bar1 + 1, '|', (size_t)(line + ll - bar1 - 1)) : NULL;
            char type[16] = "";
            if (bar2) {
                const char *t = bar1 + 1;
                while (*t == ' ')
                    t++;
                size_t tl = (size_t)(bar2 - t);
                while (tl && t[tl - 1] == ' ')
                    tl--;
                snprintf(type, sizeof type, "%.*s", (int)tl, t);
            }
            for (const char *q = line; bar1 && q < bar1 && n < cap;) {
                const char *open = memchr(q, '`', (size_t)(bar1 - q));
                const char *close = open ? memchr(open + 1, '`', (size_t)(bar1 - open - 1)) : NULL;
                if (!close)
                    break;
                entry_t *e = &out[n++];
                memset(e, 0, sizeof *e);
                const char *brace = memchr(open + 1, '{', (size_t)(close - open - 1));
                const char *name_end = brace ? brace : close;
                snprintf(e->name, sizeof e->name, "%.*s", (int)(name_end - open - 1), open + 1);
                if (brace)
                    snprintf(e->label, sizeof e->label, "%.*s", (int)(close - brace - 2),
                             brace + 1);
                snprintf(e->type, sizeof e->type, "%s", type);
                q = close + 1;
            }
        }
        line = eol ? eol + 1 : NULL;
    }
    return n;
}

/* Checks one section against one table; problems go to r. */
static void check_section(const char *doc, const char *head, dh_metrics_of_t of, report_t *r)
{
    size_t len;
    const char *s = section(doc, head, &len);
    if (!s) {
        say(r, "docs/operations.md: no section '%s' under \"## Metrics\"\n", head);
        return;
    }
    static entry_t rows[256];
    size_t n_doc = doc_entries(s, len, rows, 256), n;
    const dh_metric_desc_t *t = dh_metrics_table(of, &n);
    for (size_t i = 0; i < n; i++) {
        if (!t[i].metric || (i > 0 && t[i - 1].metric && !strcmp(t[i - 1].metric, t[i].metric)))
            continue;
        char label[32] = "";
        if (t[i].label)
            snprintf(label, sizeof label, "%.*s", (int)strcspn(t[i].label, "="), t[i].label);
        entry_t *e = NULL;
        for (size_t k = 0; k < n_doc && !e; k++)
            if (!strcmp(rows[k].name, t[i].metric))
                e = &rows[k];
        if (!e) {
            say(r, "docs/operations.md, %s: missing row for `%s` (%s)\n", head, t[i].metric,
                t[i].type);
            continue;
        }
        e->seen = true;
        if (strcmp(e->type, t[i].type))
            say(r, "docs/operations.md, %s: `%s` is a %s, not %s\n", head, t[i].metric, t[i].type,
                e->type);
        if (strcmp(e->label, label))
            say(r, "docs/operations.md, %s: `%s` has the label {%s}, not {%s}\n", head, t[i].metric,
                label, e->label);
    }
    for (size_t k = 0; k < n_doc; k++)
        if (!rows[k].seen)
            say(r, "docs/operations.md, %s: stale row for `%s`, which the table does not have\n",
                head, rows[k].name);
}

static void check_doc(const char *doc, report_t *r)
{
    check_section(doc, "### Coordinator", DH_METRICS_COORDINATOR, r);
    check_section(doc, "### DataServer", DH_METRICS_DATASERVER, r);
    check_section(doc, "### A rank's loader", DH_METRICS_CLIENT, r);
}

static char *read_doc(void)
{
    FILE *f = fopen(DH_SOURCE_DIR "/docs/operations.md", "rb");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *copy = malloc(n + 4096);
    assert_non_null(copy);
    memcpy(copy, buf, n + 1);
    return copy;
}

static void operations_md_lists_every_metric_of_the_tables(void **state)
{
    (void)state;
    char *doc = read_doc();
    static report_t r;
    memset(&r, 0, sizeof r);
    check_doc(doc, &r);
    if (r.problems) {
        fputs(r.text, stderr);
        fail_msg("%d problem(s) above (the tables: src/runtime/stats_table.h)%s", r.problems, "");
    }
    free(doc);
}

/* The check fails on a copy with one row dropped, one type changed and one row made up. */
static void the_check_names_a_missing_a_wrong_and_a_stale_row(void **state)
{
    (void)state;
    char *doc = read_doc();
    char *row = strstr(doc, "| `datahelix_coordinator_sched_seconds_total` |");
    assert_non_null(row);
    memmove(row, strchr(row, '\n') + 1, strlen(strchr(row, '\n') + 1) + 1); /* dropped */
    char *gauge = strstr(doc, "| `datahelix_dataserver_workers` | gauge |");
    assert_non_null(gauge);
    memcpy(strstr(gauge, "gauge"), "count", 5); /* a wrong type */
    const char *bogus = "| `datahelix_client_bogus_total` | counter | made up |\n";
    char *loader = strstr(doc, "### A rank's loader\n");
    assert_non_null(loader);
    char *at = strstr(loader, "\n| `") + 1;
    memmove(at + strlen(bogus), at, strlen(at) + 1);
    memcpy(at, bogus, strlen(bogus)); /* a stale row */
    static report_t r;
    memset(&r, 0, sizeof r);
    check_doc(doc, &r);
    assert_int_equal(r.problems, 3);
    assert_non_null(strstr(r.text, "missing row for `datahelix_coordinator_sched_seconds_total`"));
    assert_non_null(strstr(r.text, "`datahelix_dataserver_workers` is a gauge, not count"));
    assert_non_null(strstr(r.text, "stale row for `datahelix_client_bogus_total`"));
    free(doc);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(operations_md_lists_every_metric_of_the_tables),
    cmocka_unit_test(the_check_names_a_missing_a_wrong_and_a_stale_row),
};
DH_TEST_MAIN(tests)
