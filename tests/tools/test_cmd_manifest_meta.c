/* Tests of the labels and metadata `datahelix manifest` keeps ("meta": tools/manifest_meta.c,
 * and the --meta-col, --meta-ext and .json sidecar rules of manifest_table.c, manifest_tar.c
 * and manifest_dir.c) and of --skip-bad-captions (manifest_emit.c, manifest_caption.c), run
 * through $DH_CLI as a real process on placeholder files (nothing is decoded here). The lines
 * are checked as written: the library's manifest reader does not read "meta" (the Python
 * loader does: tests/python/test_meta.py). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dh_test.h"
#include "manifest_cli.h"

/* Runs "$DH_CLI manifest args", expects exit status `expect`; returns stderr (the caller's). */
static char *manifest_run(const char *args, int expect)
{
    char *err_path = scratch("meta.err");
    char full[4200];
    snprintf(full, sizeof full, "manifest %s", args);
    int status = run_cli(full, err_path);
    char *err = read_all(err_path);
    if (status != expect)
        print_error("manifest %s: exit %d (expected %d): %s\n", args, status, expect, err);
    assert_int_equal(status, expect);
    free(err_path);
    return err;
}

static void expect_in(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        print_error("expected <<%s>> in:\n%s\n", needle, text);
    assert_non_null(strstr(text, needle));
}

static void expect_not_in(const char *text, const char *needle)
{
    if (strstr(text, needle))
        print_error("did not expect <<%s>> in:\n%s\n", needle, text);
    assert_null(strstr(text, needle));
}

static void sh(const char *cmd)
{
    int status = system(cmd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("%s: failed (status %d)", cmd, status);
}

/* ---- --from-csv --meta-col ---------------------------------------------------------- */

/* The named columns go in "meta": a cell that reads as a decimal integer is an integer, a
 * real a real, "007" (a code) and other text a string, an empty cell is left out; '*' takes
 * every column but the path, caption and id columns. Before: every other column dropped. */
static void from_csv_meta_cols_keep_labels_as_numbers(void **state)
{
    char *dir = scratch("csvmeta");
    put(dir, "a.mp4", "");
    put(dir, "b.mp4", "");
    put(dir, "t.csv",
        "vid,path,caption,label,score,zip,tag\n"
        "v1,a.mp4,a cat,3,0.5,007,\"x, y\"\n"
        "v2,b.mp4,a dog,-4,1e2,12,\n");
    char *csv = join(dir, "t.csv"), *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args,
             "--from-csv '%s' --path-col path --caption-col caption --id-col vid "
             "--meta-col label --meta-col tag -o '%s'",
             csv, out);
    char *err = manifest_run(args, 0);
    expect_in(err, "2 entries with meta");
    free(err);
    char *text = read_all(out);
    expect_in(text, "{\"id\":\"v1\",\"path\":\"a.mp4\",\"caption\":\"a cat\",\"meta\":{\"label\":3,"
                    "\"tag\":\"x, y\"}}\n");
    expect_in(text,
              "{\"id\":\"v2\",\"path\":\"b.mp4\",\"caption\":\"a dog\",\"meta\":{\"label\":-4}}"
              "\n");
    free(text);

    snprintf(args, sizeof args,
             "--from-csv '%s' --path-col path --caption-col caption --id-col vid --meta-col '*' "
             "-o '%s'",
             csv, out);
    free(manifest_run(args, 0));
    text = read_all(out);
    expect_in(text, "\"meta\":{\"label\":3,\"score\":0.5,\"zip\":\"007\",\"tag\":\"x, y\"}}\n");
    expect_in(text, "\"meta\":{\"label\":-4,\"score\":100.0,\"zip\":12}}\n");
    expect_not_in(text, "\"vid\":");
    free(text);

    /* a column that is not there is named, with the header */
    snprintf(args, sizeof args, "--from-csv '%s' --path-col path --meta-col lable -o '%s'", csv,
             out);
    err = manifest_run(args, 1);
    expect_in(err, "no column 'lable' (--meta-col) in the header");
    expect_in(err, "'label'");
    free(err);
    free(out);
    free(csv);
    free(dir);
}

/* A kept cell holding a NUL byte fails the run naming it (found by fuzz_manifest_csv: the
 * value went out as "\u0000", and the library's manifest reader refused the whole file). */
static void from_csv_meta_cell_with_a_nul_byte_is_refused(void **state)
{
    char *dir = scratch("csvmetanul");
    put(dir, "a.mp4", "");
    char *csv = join(dir, "t.csv"), *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args, "printf 'path,label\\na.mp4,0\\000x\\n' > '%s'", csv);
    sh(args);
    snprintf(args, sizeof args, "--from-csv '%s' --path-col path --meta-col label -o '%s'", csv,
             out);
    char *err = manifest_run(args, 1);
    expect_in(err, "column 'label': the value of 'label' holds a NUL byte");
    free(err);
    assert_int_not_equal(access(out, F_OK), 0);
    free(out);
    free(csv);
    free(dir);
}

/* JSON lines: the named keys as they are (numbers, lists, strings); null or absent: left out. */
static void from_jsonl_meta_cols_keep_values_as_they_are(void **state)
{
    char *dir = scratch("jsonlmeta");
    put(dir, "a.mp4", "");
    put(dir, "b.mp4", "");
    put(dir, "t.jsonl",
        "{\"p\": \"a.mp4\", \"label\": 1, \"tags\": [\"x\"], \"w\": 0.25}\n"
        "{\"p\": \"b.mp4\", \"label\": null, \"tags\": [], \"w\": 2}\n");
    char *file = join(dir, "t.jsonl"), *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args, "--from-csv '%s' --path-col p --meta-col '*' -o '%s'", file, out);
    free(manifest_run(args, 0));
    char *text = read_all(out);
    expect_in(text, "{\"id\":\"a.mp4\",\"path\":\"a.mp4\",\"meta\":{\"label\":1,\"tags\":[\"x\"],"
                    "\"w\":0.25}}\n");
    expect_in(text, "{\"id\":\"b.mp4\",\"path\":\"b.mp4\",\"meta\":{\"tags\":[],\"w\":2}}\n");
    free(text);
    free(out);
    free(file);
    free(dir);
}

/* --meta-col and --meta-ext go with their source. */
static void meta_options_with_the_wrong_source_are_usage_errors(void **state)
{
    char *dir = scratch("metausage");
    put(dir, "a.mp4", "");
    char *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args, "--from-dir '%s' --meta-col label -o '%s'", dir, out);
    char *err = manifest_run(args, 2);
    expect_in(err, "--meta-col goes with --from-csv");
    free(err);
    snprintf(args, sizeof args, "--from-dir '%s' --meta-ext cls -o '%s'", dir, out);
    err = manifest_run(args, 2);
    expect_in(err, "--meta-ext goes with --from-tar");
    free(err);
    free(out);
    free(dir);
}

/* ---- --from-tar: .cls, .json, --meta-ext -------------------------------------------- */

/* As WebDataset writes a sample (KEY.mp4, KEY.cls "3", KEY.json {...}): "cls" an integer,
 * the .json member's keys but the caption's, a --meta-ext member under its extension. Before:
 * .cls and the .json's other keys dropped. */
static void from_tar_keeps_cls_json_and_named_members(void **state)
{
    char *dir = scratch("tarmeta"), *src = join(dir, "src");
    put(src, "k1.mp4", "media one");
    put(src, "k1.cls", "3\n");
    put(src, "k1.json", "{\"caption\": \"c1\", \"label\": 5, \"source\": \"yt\"}");
    put(src, "k1.seg.txt", " 1.5 ");
    put(src, "k2.mp4", "media two");
    put(src, "k2.cls", "not-a-number");
    char *tar = join(dir, "shard-000.tar"), *out = join(dir, "m.jsonl"), cmd[8192], args[4096];
    snprintf(cmd, sizeof cmd,
             "tar --format=ustar -C '%s' -cf '%s' k1.mp4 k1.cls k1.json k1.seg.txt k2.mp4 k2.cls",
             src, tar);
    sh(cmd);
    snprintf(args, sizeof args, "--from-tar '%s' --meta-ext seg.txt -o '%s'", tar, out);
    char *err = manifest_run(args, 0);
    expect_in(err, "2 entries with meta");
    free(err);
    char *text = read_all(out);
    expect_in(text, "\"caption\":\"c1\",\"meta\":{\"cls\":3,\"label\":5,\"source\":\"yt\","
                    "\"seg.txt\":1.5}}\n");
    expect_in(text, "{\"id\":\"shard-000/k2\",");
    expect_in(text, "\"meta\":{\"cls\":\"not-a-number\"}}\n");
    free(text);
    free(out);
    free(tar);
    free(src);
    free(dir);
}

/* ---- --from-dir: the .json sidecar's fields ----------------------------------------- */

/* The .json sidecar's keys are the clip's meta even when a .txt gives the caption. */
static void from_dir_keeps_json_sidecar_fields_beside_a_txt_caption(void **state)
{
    char *dir = scratch("dirmeta");
    put(dir, "a.mp4", "");
    put(dir, "a.txt", "from txt");
    put(dir, "a.json", "{\"caption\": \"not this\", \"label\": 2, \"fps\": 29.5}");
    char *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args, "--from-dir '%s' -o '%s'", dir, out);
    free(manifest_run(args, 0));
    char *text = read_all(out);
    expect_in(text, "{\"id\":\"a.mp4\",\"path\":\"a.mp4\",\"caption\":\"from txt\",\"meta\":{"
                    "\"label\":2,\"fps\":29.5}}\n");
    free(text);
    free(out);
    free(dir);
}

/* ---- --skip-bad-captions ------------------------------------------------------------ */

/* A caption that is not UTF-8 fails the run naming the file and the way out; with
 * --skip-bad-captions the entry is skipped, named and counted, the rest written. Before: no
 * way to skip, the whole run failed. */
static void skip_bad_captions_skips_names_and_counts(void **state)
{
    char *dir = scratch("badcap");
    put(dir, "a.mp4", "");
    put(dir, "a.txt", "fine");
    put(dir, "b.mp4", "");
    put(dir, "b.txt", "caf\xE9 latin-1");
    put(dir, "c.mp4", "");
    put(dir, "c.json", "{\"caption\": ");
    char *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args, "--from-dir '%s' -o '%s'", dir, out);
    char *err = manifest_run(args, 1);
    expect_in(err, "b.txt: the caption is not valid UTF-8 (--skip-bad-captions skips such");
    free(err);
    assert_false(exists(out));

    snprintf(args, sizeof args, "--from-dir '%s' --skip-bad-captions -o '%s'", dir, out);
    err = manifest_run(args, 0);
    expect_in(err, "manifest: skipped ");
    expect_in(err, "b.txt: the caption is not valid UTF-8");
    expect_in(err, "c.json:1:");
    expect_in(err, "skipped 2 entries whose caption cannot be used");
    expect_in(err, "wrote 1 entries");
    free(err);
    char *text = read_all(out);
    expect_in(text, "{\"id\":\"a.mp4\",\"path\":\"a.mp4\",\"caption\":\"fine\"}\n");
    expect_not_in(text, "b.mp4");
    free(text);

    /* a CSV caption cell, and a tar's .txt member, the same way */
    put(dir, "t.csv", "path,caption\na.mp4,ok\nb.mp4,caf\xE9\n");
    char *csv = join(dir, "t.csv");
    snprintf(args, sizeof args,
             "--from-csv '%s' --path-col path --caption-col caption --skip-bad-captions -o '%s'",
             csv, out);
    err = manifest_run(args, 0);
    expect_in(err, "t.csv:3: row 2: the caption is not valid UTF-8");
    expect_in(err, "skipped 1 entries");
    free(err);
    char *src = join(dir, "src"), *tar = join(dir, "s.tar"), cmd[8192];
    put(src, "k1.mp4", "m1");
    put(src, "k1.txt", "\xFF\xFE");
    put(src, "k2.mp4", "m2");
    snprintf(cmd, sizeof cmd, "tar --format=ustar -C '%s' -cf '%s' k1.mp4 k1.txt k2.mp4", src, tar);
    sh(cmd);
    snprintf(args, sizeof args, "--from-tar '%s' -o '%s'", tar, out);
    err = manifest_run(args, 1);
    expect_in(err, "member 'k1.txt': the caption is not valid UTF-8 (--skip-bad-captions");
    free(err);
    snprintf(args, sizeof args, "--from-tar '%s' --skip-bad-captions -o '%s'", tar, out);
    err = manifest_run(args, 0);
    expect_in(err, "wrote 1 entries");
    free(err);
    text = read_all(out);
    expect_in(text, "{\"id\":\"s/k2\",");
    expect_not_in(text, "s/k1");
    free(text);
    free(tar);
    free(src);
    free(csv);
    free(out);
    free(dir);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(from_csv_meta_cols_keep_labels_as_numbers),
    cmocka_unit_test(from_csv_meta_cell_with_a_nul_byte_is_refused),
    cmocka_unit_test(from_jsonl_meta_cols_keep_values_as_they_are),
    cmocka_unit_test(meta_options_with_the_wrong_source_are_usage_errors),
    cmocka_unit_test(from_tar_keeps_cls_json_and_named_members),
    cmocka_unit_test(from_dir_keeps_json_sidecar_fields_beside_a_txt_caption),
    cmocka_unit_test(skip_bad_captions_skips_names_and_counts),
};

DH_TEST_MAIN(tests)
