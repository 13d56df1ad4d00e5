/* Clips and tar members at s3:// URLs, read through the S3 module's hooks (s3_hooks.c: path
 * style on the endpoint, every try signed with SigV4) from moto's S3 server with signatures
 * enforced (tests/remote/moto_server.h): probe and decode give the local file's frames, a
 * wrong secret is a 403 SignatureDoesNotMatch and a missing object a 404 NoSuchKey, each
 * naming the s3:// URL and never the secret; a prefix lists page after page. */
#include <stdio.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/pipeline.h"
#include "datahelix/probe.h"
#include "datahelix/synth.h"
#include "core/internal.h"
#include "media/media_lib.h"
#include "remote/moto_server.h"
#include "remote/remote_lib.h"

static const dh_synth_clip_t clip_a = {320, 240, 24.0, 4.0, 24, 1};
static const dh_synth_clip_t clip_c = {160, 120, 24.0, 2.0, 12, 3};
static char dir[700], path_a[800], path_c[800], path_tar[800];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s", dh_test_path("s3media"));
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path_a, sizeof path_a, "%s/a.mp4", dir);
    snprintf(path_c, sizeof path_c, "%s/c.mp4", dir);
    snprintf(path_tar, sizeof path_tar, "%s/shard.tar", dir);
    assert_int_equal(dh_synth_write_clip(path_a, &clip_a), 0);
    assert_int_equal(dh_synth_write_clip(path_c, &clip_c), 0);
    snprintf(cmd, sizeof cmd, "cd '%s' && tar --format=ustar -cf shard.tar a.mp4 c.mp4", dir);
    assert_int_equal(system(cmd), 0);
    static char up_a[900], up_t[900];
    snprintf(up_a, sizeof up_a, "clips/a b.mp4=%s", path_a);
    snprintf(up_t, sizeof up_t, "media/shard.tar=%s", path_tar);
    const char *uploads[] = {up_a, up_t, NULL};
    return start_server_with(uploads);
}

/* Settings as a user gives them: keys in the environment, --s3-endpoint. */
static void configure(const char *secret)
{
    setenv("AWS_ACCESS_KEY_ID", server.key_id, 1);
    setenv("AWS_SECRET_ACCESS_KEY", secret, 1);
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_PROFILE");
    unsetenv("AWS_ENDPOINT_URL");
    unsetenv("AWS_ENDPOINT_URL_S3");
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("HOME", dh_test_path("home-none"), 1);
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_CONFIG_FILE");
    dh__remote_s3_settings_t s = {.endpoint_url = server.endpoint};
    assert_int_equal(dh__remote_s3_configure(&s), 0);
}

static dh_pipeline_spec_t spec_of(int32_t frames, int32_t width, int32_t height)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.frames = frames;
    spec.resize = DH_RESIZE_FIXED;
    spec.width = width;
    spec.height = height;
    spec.layout = DH_LAYOUT_THWC;
    return spec;
}

static int decode(const dh_pipeline_spec_t *spec, const char *path, dh_sample_t *s)
{
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, spec), 0);
    memset(s, 0, sizeof *s);
    int rc = dh_pipeline_decode(p, path, NULL, "s", s);
    dh_pipeline_destroy(&p);
    return rc;
}

static void assert_same_frames(const dh_pipeline_spec_t *spec, const char *local, const char *url)
{
    dh_sample_t a, b;
    int rc = decode(spec, local, &a);
    assert_int_equal(rc, 0);
    rc = decode(spec, url, &b);
    if (rc)
        fail_msg("%s: %s", url, b.error_message ? b.error_message : dh_last_error());
    assert_int_equal(a.frames.nbytes, b.frames.nbytes);
    assert_memory_equal(a.plan.indices, b.plan.indices,
                        sizeof a.plan.indices[0] * (size_t)a.plan.frames);
    assert_memory_equal(a.frames.data, b.frames.data, a.frames.nbytes);
    dh_sample_clear(&a);
    dh_sample_clear(&b);
}

static void s3_clips_and_members_probe_and_decode_as_their_files(void **state)
{
    (void)state;
    configure(server.secret);
    dh__remote_stats_t before, after;
    dh__remote_stats(&before);
    /* a key that needs encoding, in the URL and in the signature */
    const char *url = "s3://dh-test/clips/a b.mp4";
    dh_pipeline_spec_t spec = spec_of(8, clip_a.width, clip_a.height);
    assert_same_frames(&spec, path_a, url);
    dh_media_info_t a, b;
    assert_int_equal(dh_media_probe(path_a, &a), 0);
    int rc = dh_media_probe(url, &b);
    if (rc)
        fail_msg("%s", dh_last_error());
    assert_int_equal(a.file_bytes, b.file_bytes);
    assert_int_equal(a.frame_count, b.frame_count);
    dh_media_info_clear(&a);
    dh_media_info_clear(&b);
    dh__remote_stats(&after);
    print_message("s3 clip: %llu requests, %llu bytes fetched\n",
                  (unsigned long long)(after.requests - before.requests),
                  (unsigned long long)(after.bytes_fetched - before.bytes_fetched));
    assert_true(after.requests - before.requests >= 2);
    assert_int_equal(after.errors, before.errors);

    /* the second member of the shard: a byte range of its s3:// URL */
    FILE *f = fopen(path_tar, "rb");
    assert_non_null(f);
    char h[512];
    assert_int_equal(fread(h, 1, 512, f), 512);
    long long size0 = strtoll(h + 124, NULL, 8);
    long long at = 512 + (size0 + 511) / 512 * 512;
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    assert_int_equal(fread(h, 1, 512, f), 512);
    fclose(f);
    assert_string_equal(h, "c.mp4");
    long long size1 = strtoll(h + 124, NULL, 8);
    char member[300];
    snprintf(member, sizeof member, "subfile,,start,%lld,end,%lld,,:s3://dh-test/media/shard.tar",
             at + 512, at + 512 + size1);
    spec = spec_of(4, clip_c.width, clip_c.height);
    assert_same_frames(&spec, path_c, member);
    dh_media_info_t info;
    assert_int_equal(dh_media_probe(member, &info), 0);
    assert_int_equal(info.file_bytes, size1);
    dh_media_info_clear(&info);
}

static void a_wrong_secret_and_a_missing_object_are_named(void **state)
{
    (void)state;
    configure("wrong-secret-0123456789");
    dh_sample_t s;
    dh_pipeline_spec_t spec = spec_of(4, 320, 240);
    assert_int_equal(decode(&spec, "s3://dh-test/clips/a b.mp4", &s), -EACCES);
    print_message("%s\n", s.error_message);
    assert_non_null(strstr(s.error_message, "s3://dh-test/clips/a b.mp4: HTTP 403 "
                                            "SignatureDoesNotMatch"));
    assert_null(strstr(s.error_message, "wrong-secret"));
    assert_null(strstr(s.error_message, server.endpoint)); /* the s3:// name, not the signed URL */
    dh_sample_clear(&s);
    dh__remote_object_t *objects;
    size_t count;
    assert_int_equal(dh__remote_s3_list("s3://dh-test/shards/", &objects, &count), DH_EAUTH);
    assert_non_null(strstr(dh_last_error(), "listing s3://dh-test/shards/: HTTP 403 "
                                            "SignatureDoesNotMatch"));
    assert_null(strstr(dh_last_error(), "wrong-secret"));

    configure(server.secret);
    assert_int_equal(decode(&spec, "s3://dh-test/clips/missing.mp4", &s), -ENOENT);
    print_message("%s\n", s.error_message);
    assert_non_null(strstr(s.error_message, "s3://dh-test/clips/missing.mp4: HTTP 404 NoSuchKey"));
    dh_sample_clear(&s);
    dh_media_info_t info;
    assert_int_equal(dh_media_probe("s3://no-such-bucket/a.mp4", &info), -ENOENT);
    assert_non_null(strstr(dh_last_error(), "s3://no-such-bucket/a.mp4: HTTP 404 NoSuchBucket"));

    /* anonymous: not signed, refused by a bucket that is not public */
    dh__remote_s3_settings_t anon = {.endpoint_url = server.endpoint, .anonymous = true};
    assert_int_equal(dh__remote_s3_configure(&anon), 0);
    assert_int_equal(dh_media_probe("s3://dh-test/clips/a b.mp4", &info), -EACCES);
    assert_non_null(strstr(dh_last_error(), "s3://dh-test/clips/a b.mp4: HTTP 403"));
}

static void a_prefix_lists_every_object(void **state)
{
    (void)state;
    configure(server.secret);
    dh__remote_object_t *objects;
    size_t count;
    int rc = dh__remote_s3_list("s3://dh-test/shards/", &objects, &count);
    if (rc)
        fail_msg("%s", dh_last_error());
    assert_int_equal(count, 12);
    assert_string_equal(objects[0].url, "s3://dh-test/shards/000.tar");
    assert_string_equal(objects[11].url, "s3://dh-test/shards/011.tar");
    assert_int_equal(objects[3].size_B, 1000);
    dh__remote_objects_free(objects, count);
    assert_int_equal(dh__remote_s3_list("s3://no-such-bucket/x/", &objects, &count), DH_ENOENT);
    assert_non_null(
        strstr(dh_last_error(), "listing s3://no-such-bucket/x/: HTTP 404 NoSuchBucket"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(s3_clips_and_members_probe_and_decode_as_their_files, setup,
                                    stop_server),
    cmocka_unit_test_setup_teardown(a_wrong_secret_and_a_missing_object_are_named, setup,
                                    stop_server),
    cmocka_unit_test_setup_teardown(a_prefix_lists_every_object, setup, stop_server),
};
DH_TEST_MAIN(tests)
