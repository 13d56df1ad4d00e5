/* Tests of `datahelix probe`'s closing summary and exit status (tools/cmd_probe.c), run
 * through $DH_CLI as a real process on 3 real clips from `datahelix synth` plus entries that
 * cannot be used: what probe dropped is said (kept N of M, skipped by reason, named), and a
 * run that keeps no clip, or --strict with a skipped clip, fails without writing profiles.
 * Before: probe skipped such clips and exited 0 with only "N files skipped". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "manifest_cli.h"

static void expect_in(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        print_error("expected <<%s>> in:\n%s\n", needle, text);
    assert_non_null(strstr(text, needle));
}

/* The 3 tiny clips (without synth's per-clip plan, so the spec's frames apply) plus a
 * missing file and a file that is not a video. */
static char *manifest_with_bad_entries(const char *set_name, char **set)
{
    char *clips = NULL;
    *set = tiny_clips(set_name, &clips);
    put(clips, "junk.mp4", "this is not a video");
    char *out = join(*set, "bad.jsonl");
    dh_test_write_file(out, "{\"id\":\"v0\",\"path\":\"clips/v0000000.mp4\"}\n"
                            "{\"id\":\"v1\",\"path\":\"clips/v0000001.mp4\"}\n"
                            "{\"id\":\"v2\",\"path\":\"clips/v0000002.mp4\"}\n"
                            "{\"id\":\"gone\",\"path\":\"clips/gone.mp4\"}\n"
                            "{\"id\":\"junk\",\"path\":\"clips/junk.mp4\"}\n");
    free(clips);
    return out;
}

/* Runs probe with a spec of `frames` frames and extra options; returns stderr. */
static char *probe(const char *set, const char *manifest, int frames, const char *extra, int expect,
                   const char *profiles)
{
    char *spec = join(set, "spec.json"), *cal = join(set, "calibration.json");
    char *err_path = join(set, "probe.err"), text[256], args[4096];
    snprintf(text, sizeof text, "{\"frames\": %d, \"height\": 32, \"width\": 32}\n", frames);
    dh_test_write_file(spec, text);
    snprintf(args, sizeof args, "probe '%s' -o '%s' --pipeline '%s' --calibration '%s' --jobs 1 %s",
             manifest, profiles, spec, cal, extra);
    int status = run_cli(args, err_path);
    char *err = read_all(err_path);
    if (status != expect)
        print_error("probe: exit %d (expected %d): %s\n", status, expect, err);
    assert_int_equal(status, expect);
    free(err_path);
    free(cal);
    free(spec);
    return err;
}

static void summary_says_kept_of_total_and_skipped_by_reason(void **state)
{
    char *set = NULL, *manifest = manifest_with_bad_entries("probesum", &set);
    char *profiles = join(set, "profiles.jsonl");
    char *err = probe(set, manifest, 4, "", 0, profiles);
    expect_in(err, "probe: kept 3 of 5 clips, skipped 2 (1 missing, 1 unreadable)");
    expect_in(err, "probe: skipped gone (missing): ");
    expect_in(err, "probe: skipped junk (unreadable): ");
    assert_true(exists(profiles));
    free(err);
    free(profiles);
    free(manifest);
    free(set);
}

static void strict_fails_on_any_skipped_clip(void **state)
{
    char *set = NULL, *manifest = manifest_with_bad_entries("probestrict", &set);
    char *profiles = join(set, "strict-profiles.jsonl");
    char *err = probe(set, manifest, 4, "--strict", 1, profiles);
    expect_in(err, "kept 3 of 5 clips, skipped 2");
    expect_in(err, "--strict: clips were skipped; no profiles written");
    assert_false(exists(profiles));
    free(err);
    /* every clip usable: --strict passes */
    char *good = join(set, "manifest.jsonl");
    err = probe(set, good, 4, "--strict", 0, profiles);
    expect_in(err, "probe: kept 3 of 3 clips, skipped none");
    assert_true(exists(profiles));
    free(err);
    free(good);
    free(profiles);
    free(manifest);
    free(set);
}

/* The clips have 4 frames; a plan of 8 (no allow_repeat) keeps none: exit 1, "too short". */
static void no_clip_kept_fails_naming_too_short(void **state)
{
    char *set = NULL, *manifest = manifest_with_bad_entries("probenone", &set);
    char *profiles = join(set, "none-profiles.jsonl");
    char *err = probe(set, manifest, 8, "", 1, profiles);
    expect_in(err, "kept 0 of 5 clips, skipped 5 (1 missing, 1 unreadable, 3 too short)");
    expect_in(err, "no clip of the manifest could be used; no profiles written");
    assert_false(exists(profiles));
    free(err);
    free(profiles);
    free(manifest);
    free(set);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(summary_says_kept_of_total_and_skipped_by_reason),
    cmocka_unit_test(strict_fails_on_any_skipped_clip),
    cmocka_unit_test(no_clip_kept_fails_naming_too_short),
};

DH_TEST_MAIN(tests)
