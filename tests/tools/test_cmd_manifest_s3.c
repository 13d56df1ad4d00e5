/* `datahelix manifest` and `datahelix probe` over s3:// (tools/manifest_tar.c,
 * manifest_table.c, cli_s3.c), run through $DH_CLI as real processes against moto's S3 server
 * with signatures enforced (tests/remote/moto_server.h): tar shards named by a brace pattern
 * or found by listing a prefix, their headers read by range requests; a CSV's paths joined to
 * an s3:// --root; the manifest probed in place; a wrong secret named with S3's code. */
#include "remote/moto_server.h"

#include "datahelix/synth.h"
#include "manifest_cli.h"

static char dir[700];

/* Two shards of two clips each (wds/000.tar, wds/001.tar), a clip at clips/x y.mp4 and a
 * README that a listing must pass over. */
static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s", dh_test_path("s3cli"));
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/a' '%s/b'", dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    const dh_synth_clip_t clip = {160, 120, 24.0, 2.0, 12, 1};
    static const char *names[4] = {"a/k0.mp4", "a/k1.mp4", "b/k2.mp4", "b/k3.mp4"};
    for (int i = 0; i < 4; i++) {
        char path[800];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        dh_synth_clip_t c = clip;
        c.seed = (uint64_t)(i + 1);
        assert_int_equal(dh_synth_write_clip(path, &c), 0);
    }
    snprintf(cmd, sizeof cmd,
             "cd '%s/a' && printf 'caption zero' > k0.txt && tar --format=ustar -cf ../000.tar "
             "k0.mp4 k0.txt k1.mp4 && cd ../b && tar --format=pax -cf ../001.tar k2.mp4 k3.mp4 "
             "&& echo readme > ../README",
             dir);
    assert_int_equal(system(cmd), 0);
    static char up[4][900];
    snprintf(up[0], sizeof up[0], "wds/000.tar=%s/000.tar", dir);
    snprintf(up[1], sizeof up[1], "wds/001.tar=%s/001.tar", dir);
    snprintf(up[2], sizeof up[2], "wds/README=%s/README", dir);
    snprintf(up[3], sizeof up[3], "clips/x y.mp4=%s/a/k0.mp4", dir);
    const char *uploads[] = {up[0], up[1], up[2], up[3], NULL};
    int rc = start_server_with(uploads);
    setenv("AWS_ACCESS_KEY_ID", server.key_id, 1);
    setenv("AWS_SECRET_ACCESS_KEY", server.secret, 1);
    setenv("AWS_REGION", "us-east-1", 1);
    unsetenv("AWS_PROFILE");
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_ENDPOINT_URL_S3");
    setenv("AWS_ENDPOINT_URL", server.endpoint, 1); /* the default of --s3-endpoint */
    setenv("HOME", dh_test_path("home-none"), 1);
    return rc;
}

static int cli(const char *args, char **err)
{
    char *err_path = scratch("cli.err");
    int status = run_cli(args, err_path);
    *err = read_all(err_path);
    free(err_path);
    return status;
}

static void expect_in(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        print_error("expected <<%s>> in:\n%s\n", needle, text);
    assert_non_null(strstr(text, needle));
}

static void shards_by_pattern_and_by_listing_then_probed(void **state)
{
    (void)state;
    char *out = scratch("wds.jsonl"), *profiles = scratch("wds-profiles.jsonl"), args[4096];
    char *err;
    /* a brace pattern, the endpoint from AWS_ENDPOINT_URL */
    snprintf(args, sizeof args, "manifest --from-tar 's3://dh-test/wds/{000..001}.tar' -o '%s'",
             out);
    int status = cli(args, &err);
    if (status)
        fail_msg("%s: exit %d: %s", args, status, err);
    free(err);
    dh_manifest_t *m = load(out);
    assert_int_equal(dh_manifest_count(m), 4);
    static const char *ids[] = {"000/k0", "000/k1", "001/k2", "001/k3"};
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(dh_manifest_entry(m, i)->id, ids[i]);
    assert_string_equal(dh_manifest_entry(m, 0)->caption, "caption zero");
    assert_non_null(strstr(dh_manifest_entry(m, 3)->path, ":s3://dh-test/wds/001.tar"));
    dh_manifest_destroy(&m);
    char *text = read_all(out);
    expect_in(text, "\"path\":\"s3://dh-test/wds/000.tar\"");
    free(text);

    /* the prefix listed (the README is not a shard), the endpoint given on the command line */
    unsetenv("AWS_ENDPOINT_URL");
    snprintf(args, sizeof args, "manifest --from-tar 's3://dh-test/wds/' --s3-endpoint %s -o '%s'",
             server.endpoint, out);
    status = cli(args, &err);
    if (status)
        fail_msg("%s: exit %d: %s", args, status, err);
    expect_in(err, "from 2 tar shards");
    free(err);
    m = load(out);
    assert_int_equal(dh_manifest_count(m), 4);
    assert_string_equal(dh_manifest_entry(m, 2)->id, "001/k2");
    dh_manifest_destroy(&m);

    /* probed in place: every member decoded by range reads */
    char *spec = scratch("spec.json"), *cal = scratch("calibration.json");
    dh_test_write_file(spec, "{\"frames\": 4, \"height\": 32, \"width\": 32}\n");
    snprintf(args, sizeof args,
             "probe '%s' -o '%s' --pipeline '%s' --calibration '%s' --jobs 1 --s3-endpoint %s", out,
             profiles, spec, cal, server.endpoint);
    status = cli(args, &err);
    if (status)
        fail_msg("%s: exit %d: %s", args, status, err);
    free(err);
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, profiles), 0);
    assert_int_equal(dh_profile_set_count(set), 4);
    dh_profile_set_destroy(&set);

    /* a missing shard: named with S3's code; skipped with --skip-missing */
    snprintf(args, sizeof args,
             "manifest --from-tar 's3://dh-test/wds/{001..002}.tar' --s3-endpoint %s -o '%s'",
             server.endpoint, out);
    assert_int_equal(cli(args, &err), 1);
    expect_in(err, "s3://dh-test/wds/002.tar: HTTP 404 NoSuchKey");
    free(err);
    snprintf(args, sizeof args,
             "manifest --from-tar 's3://dh-test/wds/{001..002}.tar' --skip-missing "
             "--s3-endpoint %s -o '%s'",
             server.endpoint, out);
    assert_int_equal(cli(args, &err), 0);
    expect_in(err, "1 skipped (missing)");
    free(err);
    free(out);
    free(profiles);
    free(spec);
    free(cal);
}

static void csv_root_and_a_wrong_secret(void **state)
{
    (void)state;
    char *csv = scratch("urls.csv"), *out = scratch("csv.jsonl"), args[4096], *err;
    put(dh_test_path(""), "urls.csv", "path,caption\nx y.mp4,a clip\n");
    snprintf(args, sizeof args,
             "manifest --from-csv '%s' --path-col path --caption-col caption --root "
             "s3://dh-test/clips -o '%s'",
             csv, out);
    int status = cli(args, &err);
    if (status)
        fail_msg("%s: exit %d: %s", args, status, err);
    free(err);
    dh_manifest_t *m = load(out);
    assert_int_equal(dh_manifest_count(m), 1);
    assert_string_equal(dh_manifest_entry(m, 0)->path, "s3://dh-test/clips/x y.mp4");
    dh_manifest_destroy(&m);

    /* a wrong secret: the listing fails naming it and S3's code, never the secret */
    setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789", 1);
    snprintf(args, sizeof args, "manifest --from-tar 's3://dh-test/wds/' -o '%s'", out);
    assert_int_equal(cli(args, &err), 1);
    expect_in(err, "listing s3://dh-test/wds/: HTTP 403 SignatureDoesNotMatch");
    assert_null(strstr(err, "wrong-secret"));
    free(err);
    char *profiles = scratch("csv-profiles.jsonl");
    snprintf(args, sizeof args, "probe '%s' -o '%s'", out, profiles);
    assert_int_equal(cli(args, &err), 1);
    expect_in(err, "s3://dh-test/clips/x y.mp4: HTTP 403 SignatureDoesNotMatch");
    assert_null(strstr(err, "wrong-secret"));
    free(err);
    /* a bad endpoint is named before any work */
    snprintf(args, sizeof args, "probe '%s' -o '%s' --s3-endpoint ftp://x", out, profiles);
    assert_int_equal(cli(args, &err), 1);
    expect_in(err, "S3 settings");
    free(err);
    free(profiles);
    free(csv);
    free(out);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(shards_by_pattern_and_by_listing_then_probed, setup,
                                    stop_server),
    cmocka_unit_test_setup_teardown(csv_root_and_a_wrong_secret, setup, stop_server),
};
DH_TEST_MAIN(tests)
