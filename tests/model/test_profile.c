/* Tests of the profile set and its JSONL reader/writer (src/model/profile*.c,
 * docs/profiles.md): round trips, every schema error with its file:line and field, odd
 * files (CRLF, blank lines, truncation, empty, huge, very long lines), key interning and
 * allocation failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/profile.h"

/* A valid row with every known field; tests replace parts of it. */
#define ROW_HEAD_FIELDS "\"id\":\"a\",\"uri\":\"/v/a.mp4\",\"profile_key\":\"f16x224x224\","
#define ROW_HEAD "{" ROW_HEAD_FIELDS
#define ROW_TAIL                                                                                   \
    "\"frames\":16,\"height\":224,\"width\":224,\"tokens_est\":600,\"cpu_s_est\":0.05,"            \
    "\"in_bytes\":1000,\"out_bytes\":2408448}"
#define GOOD_ROW ROW_HEAD ROW_TAIL
/* GOOD_ROW with one more member at its end; duplicate keys are allowed and the last one
 * wins, so this overrides a field of GOOD_ROW. */
#define ROW_WITH(member)                                                                           \
    ROW_HEAD                                                                                       \
    "\"frames\":16,\"height\":224,\"width\":224,"                                                  \
    "\"tokens_est\":600,\"cpu_s_est\":0.05,\"in_bytes\":1000,\"out_bytes\":2408448," member "}"

static dh_profile_set_t *new_set(void)
{
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_non_null(set);
    return set;
}

/* Loads text as a file called `name` (in the scratch directory) into a fresh set. */
static int load_text(const char *name, const char *text, dh_profile_set_t **out)
{
    const char *path = dh_test_path(name);
    dh_test_write_file(path, text);
    *out = new_set();
    return dh_profile_set_load(*out, path);
}

/* Asserts that loading the one-line text gives err and a message holding each needle. */
static void expect_load_error(const char *text, int err, const char *needle1, const char *needle2)
{
    dh_profile_set_t *set = NULL;
    int rc = load_text("bad.jsonl", text, &set);
    if (rc != err)
        print_error("text: %s\nmessage: %s\n", text, dh_last_error());
    assert_int_equal(rc, err);
    const char *msg = dh_last_error();
    if (!strstr(msg, needle1) || (needle2 && !strstr(msg, needle2)))
        print_error("message '%s' lacks '%s' or '%s'\n", msg, needle1, needle2 ? needle2 : "");
    assert_non_null(strstr(msg, needle1));
    if (needle2)
        assert_non_null(strstr(msg, needle2));
    dh_profile_set_destroy(&set);
}

static void new_set_is_empty(void **state)
{
    dh_profile_set_t *set = new_set();
    assert_int_equal(dh_profile_set_count(set), 0);
    assert_int_equal(dh_profile_set_key_count(set), 0);
    assert_null(dh_profile_set_row(set, 0));
    dh_profile_set_destroy(&set);
    assert_null(set);
    dh_profile_set_destroy(&set); /* safe on NULL */
}

static void round_trip_preserves_every_field(void **state)
{
    dh_profile_set_t *set = new_set();
    dh_profile_row_t full = {
        .id = "clip \"1\"\\ \xc3\xa9\t",
        .uri = "/data/k400/abc.mp4#1024+4096",
        .profile_key = "f32x336x336",
        .frames = 32,
        .height = 336,
        .width = 336,
        .tokens_est = 2400,
        .cpu_s_est = 0.1,
        .in_bytes = 123456789012,
        .out_bytes = 10838016,
        .duration_s = 9.966666666666667,
        .fps = 29.97,
        .text_len = 96,
        .codec = "h264",
        .node = "node-3",
        .extra = "{ \"caption\": \"a dog, \\\"running\\\"\", \"tags\": [1, 2.5e-3, null],"
                 " \"meta\": {\"k\": true} }",
    };
    dh_profile_row_t minimal = {.id = "b",
                                .uri = "b.mp4",
                                .profile_key = "f16x224x224",
                                .frames = 16,
                                .height = 224,
                                .width = 224,
                                .tokens_est = 0,
                                .cpu_s_est = 1.0 / 3.0,
                                .in_bytes = 0,
                                .out_bytes = 0};
    assert_int_equal(dh_profile_set_add(set, &full), 0);
    assert_int_equal(dh_profile_set_add(set, &minimal), 0);
    const char *path = dh_test_path("round.jsonl");
    assert_int_equal(dh_profile_set_write(set, path), 0);

    dh_profile_set_t *back = new_set();
    assert_int_equal(dh_profile_set_load(back, path), 0);
    assert_int_equal(dh_profile_set_count(back), 2);
    for (size_t i = 0; i < 2; i++) {
        const dh_profile_row_t *a = dh_profile_set_row(set, i), *b = dh_profile_set_row(back, i);
        assert_string_equal(a->id, b->id);
        assert_string_equal(a->uri, b->uri);
        assert_string_equal(a->profile_key, b->profile_key);
        assert_int_equal(a->frames, b->frames);
        assert_int_equal(a->height, b->height);
        assert_int_equal(a->width, b->width);
        assert_int_equal(a->tokens_est, b->tokens_est);
        assert_true(a->cpu_s_est == b->cpu_s_est); /* exact: shortest round-trip digits */
        assert_int_equal(a->in_bytes, b->in_bytes);
        assert_int_equal(a->out_bytes, b->out_bytes);
        assert_true(a->duration_s == b->duration_s);
        assert_true(a->fps == b->fps);
        assert_int_equal(a->text_len, b->text_len);
        if (a->codec)
            assert_string_equal(a->codec, b->codec);
        else
            assert_null(b->codec);
        if (a->node)
            assert_string_equal(a->node, b->node);
        else
            assert_null(b->node);
        if (a->extra)
            assert_string_equal(a->extra, b->extra);
        else
            assert_null(b->extra);
    }
    /* The extra object was stored compact, whitespace inside strings kept. */
    assert_string_equal(dh_profile_set_row(back, 0)->extra,
                        "{\"caption\":\"a dog, \\\"running\\\"\",\"tags\":[1,2.5e-3,null],"
                        "\"meta\":{\"k\":true}}");
    /* Writing the loaded set again gives the same bytes. */
    const char *path2 = dh_test_path("round2.jsonl");
    assert_int_equal(dh_profile_set_write(back, path2), 0);
    FILE *f1 = fopen(path, "rb"), *f2 = fopen(path2, "rb");
    assert_non_null(f1);
    assert_non_null(f2);
    char b1[4096], b2[4096];
    size_t n1 = fread(b1, 1, sizeof b1, f1), n2 = fread(b2, 1, sizeof b2, f2);
    fclose(f1);
    fclose(f2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    /* 0.1 is written as 0.1, not 0.10000000000000001. */
    b1[n1] = '\0';
    assert_non_null(strstr(b1, "\"cpu_s_est\":0.1,"));
    dh_profile_set_destroy(&set);
    dh_profile_set_destroy(&back);
}

static void unknown_fields_are_kept_verbatim_in_extra(void **state)
{
    dh_profile_set_t *set = NULL;
    int rc = load_text("extra.jsonl",
                       "{\"z\": 0.1, " ROW_HEAD_FIELDS "\"a b\" : {\"x\": [1, \"s p\"]}, " ROW_TAIL
                       "\n" GOOD_ROW "\n",
                       &set);
    assert_int_equal(rc, 0);
    assert_int_equal(dh_profile_set_count(set), 2);
    assert_string_equal(dh_profile_set_row(set, 0)->extra,
                        "{\"z\":0.1,\"a b\":{\"x\":[1,\"s p\"]}}");
    assert_null(dh_profile_set_row(set, 1)->extra);
    assert_null(dh_profile_set_row(set, 1)->codec);
    assert_int_equal(dh_profile_set_row(set, 1)->text_len, 0);
    dh_profile_set_destroy(&set);
}

static void escaped_known_key_is_not_an_extra(void **state)
{
    /* "\u0069d" is "id": jansson reads it as the id field, so it must not reappear in extra
     * (the writer would then emit two ids). */
    dh_profile_set_t *set = NULL;
    int rc = load_text(
        "esc.jsonl",
        "{\"\\u0069d\":\"q\",\"uri\":\"u\",\"profile_key\":\"k\",\"x\":1," ROW_TAIL "\n", &set);
    assert_int_equal(rc, 0);
    assert_string_equal(dh_profile_set_row(set, 0)->id, "q");
    assert_string_equal(dh_profile_set_row(set, 0)->extra, "{\"x\":1}");
    dh_profile_set_destroy(&set);
}

static void null_optional_fields_are_absent(void **state)
{
    dh_profile_set_t *set = NULL;
    int rc =
        load_text("null.jsonl",
                  ROW_HEAD "\"codec\":null,\"fps\":null,\"text_len\":null," ROW_TAIL "\n", &set);
    assert_int_equal(rc, 0);
    assert_null(dh_profile_set_row(set, 0)->codec);
    assert_true(dh_profile_set_row(set, 0)->fps == 0);
    assert_null(dh_profile_set_row(set, 0)->extra);
    dh_profile_set_destroy(&set);
}

/* Every required field, left out in turn: DH_ESCHEMA naming bad.jsonl:2 and the field. */
static void missing_required_field_is_eschema(void **state)
{
    static const char *const required[] = {"id",       "uri",      "profile_key", "frames",
                                           "height",   "width",    "tokens_est",  "cpu_s_est",
                                           "in_bytes", "out_bytes"};
    static const char *const values[] = {"\"a\"", "\"u\"", "\"k\"", "16",   "224",
                                         "224",   "600",   "0.05",  "1000", "2000"};
    for (size_t skip = 0; skip < 10; skip++) {
        char text[1024];
        size_t n = (size_t)snprintf(text, sizeof text, "%s\n{", GOOD_ROW);
        int first = 1;
        for (size_t i = 0; i < 10; i++) {
            if (i == skip)
                continue;
            n += (size_t)snprintf(text + n, sizeof text - n, "%s\"%s\":%s", first ? "" : ",",
                                  required[i], values[i]);
            first = 0;
        }
        snprintf(text + n, sizeof text - n, "}\n");
        char needle[64];
        snprintf(needle, sizeof needle, "field '%s': missing", required[skip]);
        dh_profile_set_t *set = NULL;
        assert_int_equal(load_text("bad.jsonl", text, &set), DH_ESCHEMA);
        assert_non_null(strstr(dh_last_error(), "bad.jsonl:2: "));
        if (!strstr(dh_last_error(), needle))
            print_error("'%s' lacks '%s'\n", dh_last_error(), needle);
        assert_non_null(strstr(dh_last_error(), needle));
        assert_int_equal(dh_profile_set_count(set), 1); /* the good first line was kept */
        dh_profile_set_destroy(&set);
    }
}

static void wrong_type_is_eschema(void **state)
{
    expect_load_error(ROW_WITH("\"frames\":\"16\""), DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'frames': expected an integer > 0, got a string");
    expect_load_error(ROW_WITH("\"height\":224.0"), DH_ESCHEMA, "bad.jsonl:1: ",
                      "field 'height': expected an integer > 0, got a real number");
    expect_load_error(ROW_WITH("\"tokens_est\":1.5"), DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'tokens_est': expected an integer >= 0");
    expect_load_error(ROW_WITH("\"cpu_s_est\":\"fast\""), DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'cpu_s_est': expected a number");
    expect_load_error("{\"id\":7,\"uri\":\"u\",\"profile_key\":\"k\"," ROW_TAIL, DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'id': expected a string, got an integer");
    expect_load_error("{\"id\":\"a\",\"uri\":[\"u\"],\"profile_key\":\"k\"," ROW_TAIL, DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'uri': expected a string, got an array");
    expect_load_error(ROW_HEAD "\"codec\":5," ROW_TAIL, DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'codec': expected a string");
    expect_load_error(ROW_HEAD "\"fps\":true," ROW_TAIL, DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'fps': expected a number >= 0, got a boolean");
    expect_load_error("{\"id\":null,\"uri\":\"u\",\"profile_key\":\"k\"," ROW_TAIL, DH_ESCHEMA,
                      "bad.jsonl:1: ", "field 'id': expected a string, got null");
}

static void negative_or_zero_values_are_eschema(void **state)
{
    static const char *const counts[] = {"tokens_est", "in_bytes", "out_bytes", "text_len"};
    for (size_t i = 0; i < 4; i++) {
        char text[1024], needle[64];
        /* The later value wins for a duplicate key, so the bad one goes last. */
        snprintf(text, sizeof text, "%s", GOOD_ROW);
        text[strlen(text) - 1] = '\0';
        snprintf(text + strlen(text), sizeof text - strlen(text), ",\"%s\":-1}", counts[i]);
        snprintf(needle, sizeof needle, "field '%s': must be >= 0, got -1", counts[i]);
        expect_load_error(text, DH_ESCHEMA, "bad.jsonl:1: ", needle);
    }
    static const char *const dims[] = {"frames", "height", "width"};
    for (size_t i = 0; i < 3; i++) {
        char text[1024], needle[64];
        snprintf(text, sizeof text, "%s", GOOD_ROW);
        text[strlen(text) - 1] = '\0';
        snprintf(text + strlen(text), sizeof text - strlen(text), ",\"%s\":0}", dims[i]);
        snprintf(needle, sizeof needle, "field '%s': must be > 0, got 0", dims[i]);
        expect_load_error(text, DH_ESCHEMA, "bad.jsonl:1: ", needle);
    }
    char text[1024];
    snprintf(text, sizeof text, "%s", GOOD_ROW);
    text[strlen(text) - 1] = '\0';
    strcat(text, ",\"cpu_s_est\":-0.5}");
    expect_load_error(text, DH_ESCHEMA, "field 'cpu_s_est': must be a finite number >= 0",
                      "bad.jsonl:1: ");
    snprintf(text, sizeof text, "%s", GOOD_ROW);
    text[strlen(text) - 1] = '\0';
    strcat(text, ",\"frames\":-3}");
    expect_load_error(text, DH_ESCHEMA, "field 'frames': must be > 0, got -3", NULL);
    snprintf(text, sizeof text, "%s", GOOD_ROW);
    text[strlen(text) - 1] = '\0';
    strcat(text, ",\"width\":3000000000}");
    expect_load_error(text, DH_ESCHEMA, "field 'width': 3000000000 is out of range", NULL);
    expect_load_error("{\"id\":\"\",\"uri\":\"u\",\"profile_key\":\"k\"," ROW_TAIL, DH_ESCHEMA,
                      "field 'id': must not be empty", NULL);
}

static void not_json_line_is_eparse(void **state)
{
    expect_load_error(GOOD_ROW "\n{\"id\": \"a\",, }\n", DH_EPARSE,
                      "bad.jsonl:2: not JSON: ", "at column 12");
    expect_load_error("\xff\xfe\n", DH_EPARSE, "bad.jsonl:1: not JSON: ", NULL);
    expect_load_error(GOOD_ROW "x\n", DH_EPARSE, "bad.jsonl:1: not JSON: ", NULL);
}

static void non_object_line_is_eparse(void **state)
{
    expect_load_error("[1, 2]\n", DH_EPARSE, "bad.jsonl:1: not a JSON object (got an array)", NULL);
    expect_load_error("\n\n42\n", DH_EPARSE, "bad.jsonl:3: not a JSON object (got an integer)",
                      NULL);
}

static void truncated_last_line_is_eparse_with_line_number(void **state)
{
    dh_profile_set_t *set = NULL;
    int rc = load_text("cut.jsonl", GOOD_ROW "\n" GOOD_ROW "\n{\"id\":\"a\",\"uri\":\"/v/a", &set);
    assert_int_equal(rc, DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "cut.jsonl:3: not JSON"));
    assert_non_null(strstr(dh_last_error(), "truncated?"));
    assert_int_equal(dh_profile_set_count(set), 2);
    dh_profile_set_destroy(&set);
}

static void last_line_without_newline_loads(void **state)
{
    dh_profile_set_t *set = NULL;
    assert_int_equal(load_text("nonl.jsonl", GOOD_ROW "\n" GOOD_ROW, &set), 0);
    assert_int_equal(dh_profile_set_count(set), 2);
    dh_profile_set_destroy(&set);
}

static void crlf_and_blank_lines_are_accepted(void **state)
{
    dh_profile_set_t *set = NULL;
    int rc = load_text("crlf.jsonl",
                       "\xEF\xBB\xBF" GOOD_ROW "\r\n\r\n   \n\t\r\n" GOOD_ROW "\r\n\n", &set);
    assert_int_equal(rc, 0);
    assert_int_equal(dh_profile_set_count(set), 2);
    assert_string_equal(dh_profile_set_row(set, 1)->id, "a");
    assert_null(dh_profile_set_row(set, 1)->extra);
    dh_profile_set_destroy(&set);
    /* Line numbers still count the blank lines. */
    expect_load_error(GOOD_ROW "\r\n\r\n\r\nnope\r\n", DH_EPARSE, "bad.jsonl:4: not JSON", NULL);
}

static void empty_file_gives_empty_set(void **state)
{
    dh_profile_set_t *set = NULL;
    assert_int_equal(load_text("empty.jsonl", "", &set), 0);
    assert_int_equal(dh_profile_set_count(set), 0);
    dh_profile_set_destroy(&set);
    assert_int_equal(load_text("blank.jsonl", "\n\n  \n", &set), 0);
    assert_int_equal(dh_profile_set_count(set), 0);
    dh_profile_set_destroy(&set);
    set = new_set();
    assert_int_equal(dh_profile_set_load_buffer(set, "", 0, "buf"), 0);
    assert_int_equal(dh_profile_set_count(set), 0);
    dh_profile_set_destroy(&set);
}

static void missing_file_is_enoent(void **state)
{
    dh_profile_set_t *set = new_set();
    const char *path = dh_test_path("does-not-exist.jsonl");
    assert_int_equal(dh_profile_set_load(set, path), DH_ENOENT);
    assert_non_null(strstr(dh_last_error(), path));
    dh_profile_set_destroy(&set);
}

static void write_to_missing_directory_fails(void **state)
{
    dh_profile_set_t *set = new_set();
    const char *path = dh_test_path("no-such-dir/out.jsonl");
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", path);
    assert_int_equal(dh_profile_set_write(set, copy), DH_ENOENT);
    assert_non_null(strstr(dh_last_error(), copy));
    dh_profile_set_destroy(&set);
}

/* Found by fuzzing (tests/fuzz/fuzz_profiles.c; the input is tests/fuzz/corpus/profiles/
 * regression-nul-after-number): jansson accepted a NUL byte after a number, the unknown
 * member was kept in extra up to the NUL ("{\"\":1"), and the row written back did not
 * parse. A line holding a NUL byte is now not JSON. */
static void nul_byte_in_a_line_is_not_json(void **state)
{
    static const char text[] = "{\"id\":\"a\",\"uri\":\"p\",\"profile_key\":\"2\",\"width\":4,"
                               "\"tokens_est\":6,\"cpu_s_est\":0,\"frames\":1,\"out_bytes\":2,"
                               "\"height\":4,\"\":1\0,\"in_bytes\":0}";
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load_buffer(set, text, sizeof text - 1, "nul.jsonl"),
                     DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "nul.jsonl:1: not JSON: a NUL byte at column 118"));
    assert_int_equal(dh_profile_set_count(set), 0);
    dh_profile_set_destroy(&set);
}

static void load_buffer_names_the_source(void **state)
{
    static const char text[] = GOOD_ROW "\n" ROW_WITH("\"frames\":-1") "\n";
    dh_profile_set_t *set = new_set();
    assert_int_equal(dh_profile_set_load_buffer(set, text, strlen(text), "mem"), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "mem:2: field 'frames'"));
    assert_int_equal(dh_profile_set_count(set), 1);
    dh_profile_set_destroy(&set);
}

/* 200,000 rows (~40 MB) through the file reader: many 1 MiB read blocks, lines cut at
 * block ends. Count, keys and a few rows are checked. */
static void huge_input_loads_every_row(void **state)
{
    enum { ROWS = 200000 };
    const char *path = dh_test_path("huge.jsonl");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < ROWS; i++)
        fprintf(
            f,
            "{\"id\":\"s%07d\",\"uri\":\"synthetic://s%07d.mp4\",\"profile_key\":\"f%dx224x224\","
            "\"frames\":%d,\"height\":224,\"width\":224,\"tokens_est\":%d,\"cpu_s_est\":%.6f,"
            "\"in_bytes\":%d,\"out_bytes\":%d,\"duration_s\":10,\"fps\":25,\"text_len\":%d,"
            "\"codec\":\"h264\"}\n",
            i, i, 8 << (i % 3), 8 << (i % 3), 100 + i % 500, 0.01 + (i % 1000) * 1e-4, i,
            (8 << (i % 3)) * 224 * 224 * 3, i % 300);
    assert_int_equal(fclose(f), 0);
    dh_profile_set_t *set = new_set();
    assert_int_equal(dh_profile_set_load(set, path), 0);
    assert_int_equal(dh_profile_set_count(set), ROWS);
    assert_int_equal(dh_profile_set_key_count(set), 3);
    for (size_t i = 0; i < ROWS; i += 9973) {
        const dh_profile_row_t *r = dh_profile_set_row(set, i);
        char id[16];
        snprintf(id, sizeof id, "s%07zu", i);
        assert_string_equal(r->id, id);
        assert_int_equal(r->frames, 8 << (i % 3));
        assert_int_equal(r->in_bytes, (int64_t)i);
        assert_int_equal(r->text_len, (int64_t)(i % 300));
    }
    assert_string_equal(dh_profile_set_row(set, ROWS - 1)->id, "s0199999");
    dh_profile_set_destroy(&set);
}

/* Lines of 100 KB and of 3 MiB (longer than the 1 MiB read block and the parser's scratch
 * block) with a long extra field. */
static void very_long_lines_load(void **state)
{
    static const size_t sizes[] = {100 * 1000, 3 * 1024 * 1024};
    for (size_t s = 0; s < 2; s++) {
        size_t n = sizes[s];
        char *big = malloc(n + 1);
        assert_non_null(big);
        for (size_t i = 0; i < n; i++)
            big[i] = (char)('a' + i % 26);
        big[n] = '\0';
        const char *path = dh_test_path("long.jsonl");
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "%s\n%s\"caption\":\"%s\",%s\n%s\n", GOOD_ROW, ROW_HEAD, big, ROW_TAIL,
                GOOD_ROW);
        assert_int_equal(fclose(f), 0);
        dh_profile_set_t *set = new_set();
        assert_int_equal(dh_profile_set_load(set, path), 0);
        assert_int_equal(dh_profile_set_count(set), 3);
        const char *extra = dh_profile_set_row(set, 1)->extra;
        assert_non_null(extra);
        assert_int_equal(strlen(extra), n + strlen("{\"caption\":\"\"}"));
        assert_memory_equal(extra + strlen("{\"caption\":\""), big, n);
        assert_null(dh_profile_set_row(set, 2)->extra);
        dh_profile_set_destroy(&set);
        free(big);
    }
}

static void keys_are_interned(void **state)
{
    dh_profile_set_t *set = new_set();
    static const char *const keys[] = {"f16x224x224", "f32x336x336", "f16x224x224",
                                       "f64x448x448", "f32x336x336", "f16x224x224"};
    for (size_t i = 0; i < 6; i++) {
        char key[32];
        snprintf(key, sizeof key, "%s", keys[i]); /* a fresh buffer each time */
        dh_profile_row_t row = {
            .id = "x", .uri = "u", .profile_key = key, .frames = 1, .height = 1, .width = 1};
        assert_int_equal(dh_profile_set_add(set, &row), 0);
    }
    assert_int_equal(dh_profile_set_key_count(set), 3);
    assert_string_equal(dh_profile_set_key(set, 0), "f16x224x224");
    assert_string_equal(dh_profile_set_key(set, 1), "f32x336x336");
    assert_string_equal(dh_profile_set_key(set, 2), "f64x448x448");
    assert_null(dh_profile_set_key(set, 3));
    static const uint32_t expect[] = {0, 1, 0, 2, 1, 0};
    for (size_t i = 0; i < 6; i++) {
        const dh_profile_row_t *r = dh_profile_set_row(set, i);
        assert_int_equal(r->key_index, expect[i]);
        /* One interned copy: the same pointer as the key table's. */
        assert_ptr_equal(r->profile_key, dh_profile_set_key(set, r->key_index));
    }
    dh_profile_set_destroy(&set);
}

/* Many distinct keys force the hash table to grow several times. */
static void many_keys_intern_and_grow(void **state)
{
    dh_profile_set_t *set = new_set();
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 1000; k++) {
            char key[32];
            snprintf(key, sizeof key, "f%dx%dx%d", k % 64 + 1, k, k + 7);
            dh_profile_row_t row = {
                .id = "x", .uri = "u", .profile_key = key, .frames = 1, .height = 1, .width = 1};
            assert_int_equal(dh_profile_set_add(set, &row), 0);
            assert_int_equal(dh_profile_set_row(set, dh_profile_set_count(set) - 1)->key_index, k);
        }
    assert_int_equal(dh_profile_set_key_count(set), 1000);
    assert_int_equal(dh_profile_set_count(set), 2000);
    dh_profile_set_destroy(&set);
}

static void add_copies_strings(void **state)
{
    dh_profile_set_t *set = new_set();
    char id[8] = "abc", uri[8] = "u.mp4", key[8] = "k1", codec[8] = "vp9";
    dh_profile_row_t row = {.id = id,
                            .uri = uri,
                            .profile_key = key,
                            .frames = 2,
                            .height = 3,
                            .width = 4,
                            .codec = codec,
                            .extra = "{}"};
    assert_int_equal(dh_profile_set_add(set, &row), 0);
    strcpy(id, "zzz");
    strcpy(uri, "zzz");
    strcpy(key, "zz");
    strcpy(codec, "zzz");
    const dh_profile_row_t *r = dh_profile_set_row(set, 0);
    assert_string_equal(r->id, "abc");
    assert_string_equal(r->uri, "u.mp4");
    assert_string_equal(r->profile_key, "k1");
    assert_string_equal(r->codec, "vp9");
    assert_null(r->extra); /* an empty extra object is no extra */
    assert_null(r->node);
    dh_profile_set_destroy(&set);
}

static void add_rejects_invalid_rows(void **state)
{
    dh_profile_set_t *set = new_set();
    dh_profile_row_t good = {
        .id = "a", .uri = "u", .profile_key = "k", .frames = 1, .height = 1, .width = 1};
    dh_profile_row_t r = good;
    r.uri = NULL;
    assert_int_equal(dh_profile_set_add(set, &r), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "field 'uri': missing"));
    r = good;
    r.in_bytes = -5;
    assert_int_equal(dh_profile_set_add(set, &r), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "field 'in_bytes': must be >= 0, got -5"));
    r = good;
    r.cpu_s_est = NAN;
    assert_int_equal(dh_profile_set_add(set, &r), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "field 'cpu_s_est'"));
    r = good;
    r.extra = "[1]";
    assert_int_equal(dh_profile_set_add(set, &r), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "field 'extra': must be a JSON object"));
    r.extra = "{\"frames\": 3}";
    assert_int_equal(dh_profile_set_add(set, &r), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "known field 'frames'"));
    r.extra = "{bad";
    assert_int_equal(dh_profile_set_add(set, &r), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "field 'extra': not JSON"));
    assert_int_equal(dh_profile_set_count(set), 0);
    assert_int_equal(dh_profile_set_add(set, &good), 0);
    assert_int_equal(dh_profile_set_count(set), 1);
    dh_profile_set_destroy(&set);
}

/* Fails each allocation of a load (set, arena, key table, rows, parser, jansson) in turn:
 * DH_ENOMEM, no crash, no leak, and success once no allocation fails (docs/conventions.md Tests).
 */
typedef struct load_case {
    const char *text;
    size_t len;
} load_case_t;

/* Loads the case's text; the complete run must hold all 201 rows. */
static int load_rows(void *ctx)
{
    const load_case_t *lc = ctx;
    dh_profile_set_t *set = NULL;
    int rc = dh_profile_set_new(&set);
    if (rc == 0)
        rc = dh_profile_set_load_buffer(set, lc->text, lc->len, "alloc");
    size_t rows = set ? dh_profile_set_count(set) : 0;
    dh_profile_set_destroy(&set);
    if (rc == 0)
        assert_int_equal(rows, 201);
    return rc;
}

static void load_survives_each_allocation_failure(void **state)
{
    /* Extras, long strings and several keys reach every allocation site; 200 rows make the
     * row array and the arena grow; one 80 KB line overflows the parser's scratch block so
     * jansson's own allocations fail too. */
    size_t cap = 200 * 400 + 90000, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (int i = 0; i < 200; i++)
        len +=
            (size_t)snprintf(text + len, cap - len,
                             "{\"id\":\"row-%d-xxxxxxxxxxxxxxxxxxxxxxxx\",\"uri\":\"/data/%d.mp4\","
                             "\"profile_key\":\"f%dx224x224\",\"frames\":16,\"height\":224,"
                             "\"width\":224,\"tokens_est\":600,\"cpu_s_est\":0.05,"
                             "\"in_bytes\":1000,\"out_bytes\":2000,\"node\":\"n%d\","
                             "\"x\":{\"k\":[%d]}}\n",
                             i, i, i % 7, i % 3, i);
    len += (size_t)snprintf(text + len, cap - len, "%s\"long\":\"", ROW_HEAD);
    memset(text + len, 'q', 80000);
    len += 80000;
    len += (size_t)snprintf(text + len, cap - len, "\",%s\n", ROW_TAIL);
    load_case_t lc = {text, len};
    long made = dh_test_each_allocation_failure(load_rows, &lc);
    if (made <= 10)
        print_error("only %ld allocations in a full load\n", made);
    assert_true(made > 10); /* the loop did reach the allocations it meant to fail */
    free(text);
}

/* The same for add (extra checking) and write. */
static int add_rows(void *ctx)
{
    dh_profile_set_t *set = NULL;
    int rc = dh_profile_set_new(&set);
    for (int i = 0; rc == 0 && i < 300; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i % 40);
        dh_profile_row_t row = {.id = "an-id-of-some-length",
                                .uri = "u",
                                .profile_key = key,
                                .frames = 1,
                                .height = 1,
                                .width = 1,
                                .extra = "{\"a\": [1, 2, {\"b\": \"c\"}]}"};
        rc = dh_profile_set_add(set, &row);
    }
    dh_profile_set_destroy(&set);
    return rc;
}

static void add_survives_each_allocation_failure(void **state)
{
    assert_true(dh_test_each_allocation_failure(add_rows, NULL) > 10);
}

/* Numbered fault sites (a faults build only): a read error and a full disk give a clean
 * error that names the file, and nothing leaks. */
/* Site 1 (faults build; skipped otherwise): a read error at each read of a load (the
 * first read and the one that finds the end): -EIO naming the file and the line, the set
 * as it was (empty), nothing left allocated; the complete run loads the row. */
static const char *fault_path;

static int load_fault_file(void *arg)
{
    (void)arg;
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    int rc = dh_profile_set_load(set, fault_path);
    if (rc) {
        assert_int_equal(rc, -EIO);
        assert_non_null(strstr(dh_last_error(), "read error"));
    } else {
        assert_int_equal(dh_profile_set_count(set), 1);
    }
    dh_profile_set_destroy(&set);
    return rc;
}

static void read_fault_names_the_file(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    fault_path = dh_test_path("fault-read.jsonl");
    dh_test_write_file(fault_path, "{\"id\":\"a\",\"uri\":\"u\",\"profile_key\":\"k\",\"frames\":1,"
                                   "\"height\":2,\"width\":2,\"tokens_est\":1,\"cpu_s_est\":0.1,"
                                   "\"in_bytes\":1,\"out_bytes\":12}\n");
    assert_int_equal(dh_test_each_fault(DH_FAULT_PROFILE_READ, fault_path, load_fault_file, NULL),
                     2);
}

/* Site 2: the write (ENOSPC), the close (EIO) and the rename (EIO) of a profile file fail in
 * turn: each names the file and the step; the file written before (one row) is left whole
 * and no PATH.part remains; the complete run replaces it with both rows. Before, the file
 * was opened in place: a failed write left it truncated. */
static dh_profile_set_t *fault_set;

static int write_fault_file(void *arg)
{
    (void)arg;
    int rc = dh_profile_set_write(fault_set, fault_path);
    char part[600];
    snprintf(part, sizeof part, "%s.part", fault_path);
    assert_int_equal(access(part, F_OK), -1);
    dh_profile_set_t *back = NULL;
    assert_int_equal(dh_profile_set_new(&back), 0);
    assert_int_equal(dh_profile_set_load(back, fault_path), 0);
    assert_int_equal(dh_profile_set_count(back), rc ? 1 : 2);
    dh_profile_set_destroy(&back);
    return rc;
}

static void write_fault_names_the_file(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    assert_int_equal(dh_profile_set_new(&fault_set), 0);
    dh_profile_row_t row = {.id = "a",
                            .uri = "u",
                            .profile_key = "k",
                            .frames = 1,
                            .height = 2,
                            .width = 2,
                            .tokens_est = 1,
                            .cpu_s_est = 0.1,
                            .in_bytes = 1,
                            .out_bytes = 12};
    assert_int_equal(dh_profile_set_add(fault_set, &row), 0);
    fault_path = dh_test_path("fault-write.jsonl");
    assert_int_equal(dh_profile_set_write(fault_set, fault_path), 0); /* the old file */
    row.id = "b";
    assert_int_equal(dh_profile_set_add(fault_set, &row), 0);
    assert_int_equal(dh_test_each_fault(DH_FAULT_PROFILE_WRITE, fault_path, write_fault_file, NULL),
                     3);
    dh_profile_set_destroy(&fault_set);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(read_fault_names_the_file),
    cmocka_unit_test(write_fault_names_the_file),
    cmocka_unit_test(new_set_is_empty),
    cmocka_unit_test(round_trip_preserves_every_field),
    cmocka_unit_test(unknown_fields_are_kept_verbatim_in_extra),
    cmocka_unit_test(escaped_known_key_is_not_an_extra),
    cmocka_unit_test(null_optional_fields_are_absent),
    cmocka_unit_test(missing_required_field_is_eschema),
    cmocka_unit_test(wrong_type_is_eschema),
    cmocka_unit_test(negative_or_zero_values_are_eschema),
    cmocka_unit_test(not_json_line_is_eparse),
    cmocka_unit_test(non_object_line_is_eparse),
    cmocka_unit_test(truncated_last_line_is_eparse_with_line_number),
    cmocka_unit_test(last_line_without_newline_loads),
    cmocka_unit_test(crlf_and_blank_lines_are_accepted),
    cmocka_unit_test(empty_file_gives_empty_set),
    cmocka_unit_test(missing_file_is_enoent),
    cmocka_unit_test(write_to_missing_directory_fails),
    cmocka_unit_test(load_buffer_names_the_source),
    cmocka_unit_test(nul_byte_in_a_line_is_not_json),
    cmocka_unit_test(huge_input_loads_every_row),
    cmocka_unit_test(very_long_lines_load),
    cmocka_unit_test(keys_are_interned),
    cmocka_unit_test(many_keys_intern_and_grow),
    cmocka_unit_test(add_copies_strings),
    cmocka_unit_test(add_rejects_invalid_rows),
    cmocka_unit_test(load_survives_each_allocation_failure),
    cmocka_unit_test(add_survives_each_allocation_failure),
};
DH_TEST_MAIN(tests)
