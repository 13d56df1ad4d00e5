/* Tests of the manifest reader: fields, path resolution, overrides, errors, allocation
 * failures. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/manifest.h"

static void manifest_reads_entries_and_resolves_paths(void **state)
{
    const char *path = dh_test_path("m1.jsonl");
    dh_test_write_file(path, "{\"id\":\"v0\",\"path\":\"clips/a.mp4\",\"caption\":\"a cat\","
                             "\"frames\":16,\"height\":224,\"width\":224}\r\n"
                             "\n"
                             "{\"id\":\"v1\",\"path\":\"/abs/b.mp4\",\"other\":[1,2],"
                             "\"text_tokens\":7}\n");
    dh_manifest_t *m = NULL;
    assert_int_equal(dh_manifest_load(path, &m), 0);
    assert_int_equal(dh_manifest_count(m), 2);
    const dh_manifest_entry_t *e = dh_manifest_entry(m, 0);
    assert_string_equal(e->id, "v0");
    char want[1024];
    snprintf(want, sizeof want, "%.*s/clips/a.mp4", (int)(strrchr(path, '/') - path), path);
    assert_string_equal(e->path, want);
    assert_string_equal(e->caption, "a cat");
    assert_int_equal(e->frames, 16);
    assert_int_equal(e->height, 224);
    assert_int_equal(e->width, 224);
    assert_int_equal(e->text_tokens, -1); /* absent: probe estimates */
    e = dh_manifest_entry(m, 1);
    assert_string_equal(e->path, "/abs/b.mp4");
    assert_string_equal(e->caption, "");
    assert_int_equal(e->frames, 0);
    assert_int_equal(e->text_tokens, 7);
    dh_manifest_destroy(&m);
    assert_null(m);
}

static void manifest_errors_name_line_and_field(void **state)
{
    const char *path = dh_test_path("m2.jsonl");
    dh_manifest_t *m = NULL;
    dh_test_write_file(path, "{\"id\":\"v0\",\"path\":\"a.mp4\"}\n{\"id\":\"v1\"}\n");
    assert_int_equal(dh_manifest_load(path, &m), DH_ESCHEMA);
    assert_null(m);
    assert_non_null(strstr(dh_last_error(), ":2: field 'path'"));
    dh_test_write_file(path, "{\"id\":\"v0\",\"path\":\"a.mp4\",\"frames\":-3}\n");
    assert_int_equal(dh_manifest_load(path, &m), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), ":1: field 'frames'"));
    dh_test_write_file(path, "{\"id\":\"v0\",\"path\":\n");
    assert_int_equal(dh_manifest_load(path, &m), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), ":1: not JSON"));
    dh_test_write_file(path, "{\"id\":\"v0\",\"path\":\"s3://\"}\n");
    assert_int_equal(dh_manifest_load(path, &m), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), ":1: field 'path': s3://: names no host"));
    dh_test_write_file(path, "[1]\n");
    assert_int_equal(dh_manifest_load(path, &m), DH_EPARSE);
    assert_int_equal(dh_manifest_load(dh_test_path("missing.jsonl"), &m), -ENOENT);
    assert_non_null(strstr(dh_last_error(), "missing.jsonl"));
}

/* A tar member read in place: "offset" and "size" make the path FFmpeg's subfile URL over
 * the byte range; they go together, and bad values name the field. */
static void manifest_byte_range_is_a_subfile_url(void **state)
{
    const char *path = dh_test_path("m3.jsonl");
    dh_test_write_file(path, "{\"id\":\"s/a\",\"path\":\"shards/000.tar\",\"offset\":1536,"
                             "\"size\":1000}\n{\"id\":\"s/b\",\"path\":\"/abs/1.tar\","
                             "\"offset\":0,\"size\":7}\n");
    dh_manifest_t *m = NULL;
    assert_int_equal(dh_manifest_load(path, &m), 0);
    char want[1024];
    snprintf(want, sizeof want, "subfile,,start,1536,end,2536,,:%.*s/shards/000.tar",
             (int)(strrchr(path, '/') - path), path);
    assert_string_equal(dh_manifest_entry(m, 0)->path, want);
    assert_string_equal(dh_manifest_entry(m, 1)->path, "subfile,,start,0,end,7,,:/abs/1.tar");
    dh_manifest_destroy(&m);
    static const struct {
        const char *line, *error;
    } bad[] = {
        {"{\"id\":\"a\",\"path\":\"x.tar\",\"offset\":512}\n", "go together"},
        {"{\"id\":\"a\",\"path\":\"x.tar\",\"size\":512}\n", "go together"},
        {"{\"id\":\"a\",\"path\":\"x.tar\",\"offset\":-1,\"size\":5}\n", "field 'offset'"},
        {"{\"id\":\"a\",\"path\":\"x.tar\",\"offset\":0,\"size\":0}\n", "field 'size'"},
        {"{\"id\":\"a\",\"path\":\"x.tar\",\"offset\":\"0\",\"size\":5}\n", "field 'offset'"},
        {"{\"id\":\"a\",\"path\":\"x.mp4\",\"text_tokens\":-2}\n", "field 'text_tokens'"},
        {"{\"id\":\"a\",\"path\":\"x.tar\",\"offset\":9223372036854775000,\"size\":5000}\n",
         "overflows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dh_test_write_file(path, bad[i].line);
        assert_int_equal(dh_manifest_load(path, &m), DH_ESCHEMA);
        if (!strstr(dh_last_error(), bad[i].error))
            print_error("case %zu: %s\n", i, dh_last_error());
        assert_non_null(strstr(dh_last_error(), bad[i].error));
        assert_non_null(strstr(dh_last_error(), ":1:"));
    }
}

/* dh_manifest_load_buffer reads `len` bytes of text as the file would: the name stands for
 * the path (relative paths join its folder, messages name it), a last line needs no newline,
 * and the first bad line is the error. */
static void manifest_load_buffer_reads_like_the_file(void **state)
{
    static const char text[] = "{\"id\":\"v0\",\"path\":\"clips/a.mp4\",\"caption\":\"a cat\","
                               "\"frames\":16}\r\n\n"
                               "{\"id\":\"v1\",\"path\":\"/abs/b.mp4\"}garbage";
    dh_manifest_t *m = NULL;
    assert_int_equal(
        dh_manifest_load_buffer(text, strlen(text) - strlen("garbage"), "data/set/m.jsonl", &m), 0);
    assert_int_equal(dh_manifest_count(m), 2);
    assert_string_equal(dh_manifest_entry(m, 0)->path, "data/set/clips/a.mp4");
    assert_string_equal(dh_manifest_entry(m, 0)->caption, "a cat");
    assert_int_equal(dh_manifest_entry(m, 0)->frames, 16);
    assert_string_equal(dh_manifest_entry(m, 1)->path, "/abs/b.mp4");
    dh_manifest_destroy(&m);
    assert_int_equal(dh_manifest_load_buffer(text, strlen(text), "data/set/m.jsonl", &m),
                     DH_EPARSE);
    assert_null(m);
    assert_non_null(strstr(dh_last_error(), "data/set/m.jsonl:3: not JSON"));
    assert_int_equal(dh_manifest_load_buffer("{\"id\":\"v\"}", 10, NULL, &m), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "<buffer>:1: field 'path': missing"));
    assert_int_equal(dh_manifest_load_buffer("", 0, "m.jsonl", &m), 0);
    assert_int_equal(dh_manifest_count(m), 0);
    dh_manifest_destroy(&m);
}

static int load_manifest(void *ctx)
{
    dh_manifest_t *m = NULL;
    int rc = dh_manifest_load(ctx, &m);
    if (rc == 0)
        assert_int_equal(dh_manifest_count(m), 300);
    dh_manifest_destroy(&m);
    return rc;
}

static void manifest_survives_each_allocation_failure(void **state)
{
    const char *path = dh_test_path("m3.jsonl");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 300; i++)
        fprintf(f, "{\"id\":\"v%d\",\"path\":\"clips/v%d.mp4\",\"caption\":\"clip %d\"}\n", i, i,
                i);
    assert_int_equal(fclose(f), 0);
    assert_true(dh_test_each_allocation_failure(load_manifest, (void *)path) > 300);
}

/* Numbered fault site (a faults build; skipped otherwise): a read error at each line of a
 * 4-line manifest (and at the end of the file) is -EIO naming the file and the last line
 * read, with nothing left allocated or open; the file loads whole once the fault is gone. */
static int load_four(void *ctx)
{
    dh_manifest_t *m = NULL;
    int rc = dh_manifest_load(ctx, &m);
    if (rc) {
        assert_null(m);
        assert_int_equal(rc, -EIO);
        assert_non_null(strstr(dh_last_error(), ": read error after line "));
        return rc;
    }
    assert_int_equal(dh_manifest_count(m), 4);
    assert_string_equal(dh_manifest_entry(m, 3)->id, "v3");
    dh_manifest_destroy(&m);
    return 0;
}

static void manifest_read_error_fails_cleanly_at_every_line(void **state)
{
    if (!dh_fault_enabled())
        skip();
    const char *path = dh_test_path("fault.jsonl");
    dh_test_write_file(path,
                       "{\"id\":\"v0\",\"path\":\"a.mp4\"}\n{\"id\":\"v1\",\"path\":\"b.mp4\"}\n"
                       "{\"id\":\"v2\",\"path\":\"c.mp4\"}\n{\"id\":\"v3\",\"path\":\"d.mp4\"}\n");
    char what[1100];
    snprintf(what, sizeof what, "%s: read error", path);
    assert_int_equal(dh_test_each_fault(DH_FAULT_MANIFEST_READ, what, load_four, (void *)path), 5);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(manifest_reads_entries_and_resolves_paths),
    cmocka_unit_test(manifest_errors_name_line_and_field),
    cmocka_unit_test(manifest_byte_range_is_a_subfile_url),
    cmocka_unit_test(manifest_load_buffer_reads_like_the_file),
    cmocka_unit_test(manifest_survives_each_allocation_failure),
    cmocka_unit_test(manifest_read_error_fails_cleanly_at_every_line),
};
DH_TEST_MAIN(tests)
