/* Tests of src/media/remote_input.c: clips and tar members at http(s) URLs, served by nginx
 * (and fault_server.py for the faults; tests/remote/servers.h), probe and decode as their
 * local files do, reading only byte ranges: the same frames, the same probe, the bytes
 * fetched bounded; a missing clip names its URL and status, a stalled one stops at the
 * sample's deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "datahelix/pipeline.h"
#include "datahelix/probe.h"
#include "datahelix/synth.h"
#include "core/internal.h"
#include "media/media_lib.h"
#include "remote/remote_lib.h"
#include "remote/servers.h"

/* 320x240, 96 frames at 24 fps, a keyframe every 24 frames */
static const dh_synth_clip_t clips[3] = {
    {320, 240, 24.0, 4.0, 24, 1}, {320, 240, 24.0, 4.0, 24, 2}, {160, 120, 24.0, 2.0, 12, 3}};
static const char *names[3] = {"a.mp4", "b.mp4", "c.mp4"};

static int setup(void **state)
{
    servers_setup(state);
    for (int i = 0; i < 3; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s", servers.www, names[i]);
        assert_int_equal(dh_synth_write_clip(path, &clips[i]), 0);
    }
    dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    snprintf(cfg.ca_bundle, sizeof cfg.ca_bundle, "%s/ca.crt", servers.dir);
    cfg.backoff_s = 0.01;
    assert_int_equal(dh__http_configure(&cfg), 0);
    return 0;
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
        print_error("%s: %s\n", url, dh_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(a.frames.nbytes, b.frames.nbytes);
    assert_memory_equal(a.plan.indices, b.plan.indices,
                        sizeof a.plan.indices[0] * (size_t)a.plan.frames);
    assert_memory_equal(a.frames.data, b.frames.data, a.frames.nbytes);
    dh_sample_clear(&a);
    dh_sample_clear(&b);
}

static void a_url_clip_decodes_to_the_files_frames(void **state)
{
    (void)state;
    start_nginx();
    char local[700], url[700];
    snprintf(local, sizeof local, "%s/a.mp4", servers.www);
    dh_pipeline_spec_t spec = spec_of(8, 320, 240);
    for (int tls = 0; tls < 2; tls++) {
        snprintf(url, sizeof url, "%s://127.0.0.1:%d/a.mp4", tls ? "https" : "http",
                 tls ? servers.https_port : servers.http_port);
        dh__remote_stats_t before, after;
        dh__remote_stats(&before);
        assert_same_frames(&spec, local, url);
        dh__remote_stats(&after);
        uint64_t fetched = after.bytes_fetched - before.bytes_fetched;
        uint64_t read = after.bytes_read - before.bytes_read;
        struct stat sb;
        assert_int_equal(stat(local, &sb), 0);
        print_message("%s: file %lld bytes, demuxer read %llu, fetched %llu (%.2fx) in %llu "
                      "requests\n",
                      url, (long long)sb.st_size, (unsigned long long)read,
                      (unsigned long long)fetched, (double)fetched / (double)read,
                      (unsigned long long)(after.requests - before.requests));
        assert_true(fetched <= (uint64_t)sb.st_size);
        assert_true(read > 0);
    }
    /* a presigned URL's query string does not get in the demuxer's way */
    snprintf(url, sizeof url, "http://127.0.0.1:%d/a.mp4?X-Amz-Signature=abc&X-Amz-Date=1",
             servers.http_port);
    assert_same_frames(&spec, local, url);
}

/* A few frames of a long clip: the GOPs they need, not the file (range reads, not a
 * download), and not much more than the demuxer reads. */
static void a_few_frames_of_a_long_clip_fetch_a_fraction_of_it(void **state)
{
    (void)state;
    start_nginx();
    static const dh_synth_clip_t long_clip = {320, 240, 24.0, 40.0, 48, 9};
    char local[700], url[700];
    snprintf(local, sizeof local, "%s/long.mp4", servers.www);
    assert_int_equal(dh_synth_write_clip(local, &long_clip), 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/long.mp4", servers.http_port);
    struct stat sb;
    assert_int_equal(stat(local, &sb), 0);
    dh_pipeline_spec_t spec = spec_of(4, 320, 240);
    dh__remote_stats_t before, after;
    dh__remote_stats(&before);
    assert_same_frames(&spec, local, url);
    dh__remote_stats(&after);
    uint64_t fetched = after.bytes_fetched - before.bytes_fetched;
    uint64_t read = after.bytes_read - before.bytes_read;
    print_message("4 of 960 frames: file %lld bytes, demuxer read %llu, fetched %llu (%.2fx of "
                  "read, %.2f of the file) in %llu requests\n",
                  (long long)sb.st_size, (unsigned long long)read, (unsigned long long)fetched,
                  (double)fetched / (double)read, (double)fetched / (double)sb.st_size,
                  (unsigned long long)(after.requests - before.requests));
    assert_true(fetched < (uint64_t)sb.st_size / 2);
}

/* Through the local cache (remote/cache_fetch.c): the first decode fetches the cache blocks
 * its reads cover whole and the 8 KiB fragments of the others, a second decode of the same
 * clip makes no request (64 KiB and 16 KiB blocks). Prints what the first decode fetched
 * (docs/remote.md; tests/media/test_remote_cache_bytes.c compares the schemes). */
static void a_second_decode_through_the_cache_makes_no_request(void **state)
{
    (void)state;
    start_nginx();
    static const dh_synth_clip_t long_clip = {320, 240, 24.0, 40.0, 48, 9};
    char local[700], url[700], dir[700];
    snprintf(local, sizeof local, "%s/long.mp4", servers.www);
    assert_int_equal(dh_synth_write_clip(local, &long_clip), 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/long.mp4", servers.http_port);
    dh_pipeline_spec_t spec = spec_of(4, 320, 240);
    uint64_t first_fetch[2] = {0, 0};
    for (int setting = 0; setting < 2; setting++) { /* 64 KiB blocks, then 16 KiB */
        if (setting)
            setenv("DH_CACHE_BLOCK", "16384", 1);
        snprintf(dir, sizeof dir, "%s/cache-%d", servers.dir, setting);
        assert_int_equal(dh__remote_cache_use(dir, 64u << 20), 0);
        assert_int_equal(dh__remote_cache_block(), setting ? 16384 : 65536);
        for (int round = 0; round < 2; round++) {
            dh__remote_stats_t before, after;
            dh__remote_stats(&before);
            assert_same_frames(&spec, local, url);
            dh__remote_stats(&after);
            uint64_t fetched = after.bytes_fetched - before.bytes_fetched;
            uint64_t read = after.bytes_read - before.bytes_read;
            uint64_t requests = after.requests - before.requests;
            print_message("%zu KiB cache blocks, decode %d: demuxer read %llu, fetched %llu "
                          "(%.2fx) in %llu requests\n",
                          dh__remote_cache_block() >> 10, round + 1, (unsigned long long)read,
                          (unsigned long long)fetched, (double)fetched / (double)read,
                          (unsigned long long)requests);
            if (round == 0) {
                assert_true(requests > 0);
                first_fetch[setting] = fetched;
            } else {
                assert_int_equal(requests, 0);
            }
        }
        dh__remote_cache_release();
    }
    unsetenv("DH_CACHE_BLOCK");
    assert_true(first_fetch[1] <= first_fetch[0]); /* smaller blocks: the same reads, less */
    setenv("DH_CACHE_BLOCK", "5000", 1);
    assert_int_equal(dh__remote_cache_use(dir, 64u << 20), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "DH_CACHE_BLOCK=5000"));
    unsetenv("DH_CACHE_BLOCK");
}

static void a_url_clip_probes_as_the_file(void **state)
{
    (void)state;
    start_nginx();
    char local[700], url[700];
    snprintf(local, sizeof local, "%s/b.mp4", servers.www);
    snprintf(url, sizeof url, "https://127.0.0.1:%d/b.mp4", servers.https_port);
    dh_media_info_t a, b;
    assert_int_equal(dh_media_probe(local, &a), 0);
    int rc = dh_media_probe(url, &b);
    if (rc)
        print_error("%s: %s\n", url, dh_last_error());
    assert_int_equal(rc, 0);
    assert_string_equal(a.codec, b.codec);
    assert_int_equal(a.width, b.width);
    assert_int_equal(a.height, b.height);
    assert_int_equal(a.frame_count, b.frame_count);
    assert_int_equal(a.file_bytes, b.file_bytes);
    assert_int_equal(a.bit_rate, b.bit_rate);
    assert_close(a.fps, b.fps, 0);
    assert_close(a.duration_s, b.duration_s, 0);
    assert_int_equal(a.n_keyframes, b.n_keyframes);
    assert_memory_equal(a.keyframes, b.keyframes, a.n_keyframes * sizeof *a.keyframes);
    dh_media_info_clear(&a);
    dh_media_info_clear(&b);
}

/* The data offset and size of each member of a ustar archive. */
static void tar_members(const char *path, int64_t offset[3], int64_t size[3])
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    int64_t at = 0;
    for (int i = 0; i < 3; i++) {
        char h[512];
        assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
        assert_int_equal(fread(h, 1, 512, f), 512);
        size[i] = (int64_t)strtoll(h + 124, NULL, 8);
        offset[i] = at + 512;
        at = offset[i] + (size[i] + 511) / 512 * 512;
    }
    fclose(f);
}

static void a_member_of_a_url_shard_is_a_byte_range(void **state)
{
    (void)state;
    start_nginx();
    char cmd[2048], shard[700];
    snprintf(cmd, sizeof cmd, "cd %s && tar --format=ustar -cf shard.tar a.mp4 b.mp4 c.mp4",
             servers.www);
    sh(cmd);
    snprintf(shard, sizeof shard, "%s/shard.tar", servers.www);
    int64_t offset[3], size[3];
    tar_members(shard, offset, size);
    struct stat sb;
    assert_int_equal(stat(shard, &sb), 0);
    for (int i = 1; i < 3; i++) {
        char local[700], member[1024];
        snprintf(local, sizeof local, "%s/%s", servers.www, names[i]);
        snprintf(member, sizeof member,
                 "subfile,,start,%lld,end,%lld,,:http://127.0.0.1:%d/shard.tar",
                 (long long)offset[i], (long long)(offset[i] + size[i]), servers.http_port);
        dh__remote_stats_t before, after;
        dh__remote_stats(&before);
        dh_pipeline_spec_t spec = spec_of(8, clips[i].width, clips[i].height);
        assert_same_frames(&spec, local, member);
        dh__remote_stats(&after);
        uint64_t fetched = after.bytes_fetched - before.bytes_fetched;
        print_message("member %s: %lld bytes of a %lld-byte shard, fetched %llu\n", names[i],
                      (long long)size[i], (long long)sb.st_size, (unsigned long long)fetched);
        /* never the shard: the member's blocks, one more at each end at most */
        assert_true(fetched <= (uint64_t)size[i] + 2 * DH_REMOTE_BLOCK);
        dh_media_info_t info;
        assert_int_equal(dh_media_probe(member, &info), 0);
        assert_int_equal(info.file_bytes, size[i]);
        dh_media_info_clear(&info);
    }
    /* a member that is no video: the error names the sample, the member (its tar header,
     * one range request) and the shard */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/bad.mp4", servers.www);
    dh_test_write_file(bad, "not a video, only text");
    snprintf(cmd, sizeof cmd, "cd %s && tar --format=ustar -cf shard2.tar a.mp4 bad.mp4 c.mp4",
             servers.www);
    sh(cmd);
    snprintf(shard, sizeof shard, "%s/shard2.tar", servers.www);
    tar_members(shard, offset, size);
    char member[1024];
    snprintf(member, sizeof member, "subfile,,start,%lld,end,%lld,,:http://127.0.0.1:%d/shard2.tar",
             (long long)offset[1], (long long)(offset[1] + size[1]), servers.http_port);
    dh_sample_t s;
    dh_pipeline_spec_t spec = spec_of(4, 160, 120);
    assert_int_equal(decode(&spec, member, &s), DH_EIO);
    print_message("%s\n", s.error_message);
    char want[256];
    snprintf(want, sizeof want, "sample s (member bad.mp4 of shard http://127.0.0.1:%d/shard2.tar)",
             servers.http_port);
    assert_non_null(strstr(s.error_message, want));
    dh_sample_clear(&s);
}

static void a_missing_url_clip_names_its_url_and_status(void **state)
{
    (void)state;
    start_fault_server();
    char url[700];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/missing/a.mp4", servers.fault_port);
    dh_sample_t s;
    dh_pipeline_spec_t spec = spec_of(4, 320, 240);
    assert_int_equal(decode(&spec, url, &s), -ENOENT);
    print_message("%s\n", s.error_message);
    assert_non_null(strstr(s.error_message, url));
    assert_non_null(strstr(s.error_message, "HTTP 404"));
    assert_non_null(strstr(s.error_message, "bytes 0-"));
    dh_sample_clear(&s);
    /* a presigned URL's query string is in no message */
    char signed_url[800];
    snprintf(signed_url, sizeof signed_url, "%s?X-Amz-Signature=s3cr3t&X-Amz-Date=1", url);
    assert_int_equal(decode(&spec, signed_url, &s), -ENOENT);
    print_message("%s\n", s.error_message);
    assert_null(strstr(s.error_message, "s3cr3t"));
    assert_non_null(strstr(s.error_message, "a.mp4?..."));
    dh_sample_clear(&s);
    char member[900];
    snprintf(member, sizeof member, "subfile,,start,512,end,1000,,:%s", signed_url);
    assert_int_equal(decode(&spec, member, &s), -ENOENT);
    print_message("%s\n", s.error_message);
    assert_null(strstr(s.error_message, "s3cr3t"));
    assert_non_null(strstr(s.error_message, "sample s (the member at byte 512 of shard http://"));
    dh_sample_clear(&s);
    dh_media_info_t info;
    snprintf(url, sizeof url, "http://127.0.0.1:%d/forbidden/a.mp4", servers.fault_port);
    assert_int_equal(dh_media_probe(url, &info), -EACCES);
    assert_non_null(strstr(dh_last_error(), url));
    assert_non_null(strstr(dh_last_error(), "HTTP 403 AccessDenied"));
}

static void a_flaky_url_clip_decodes_after_retries(void **state)
{
    (void)state;
    start_fault_server();
    char local[700], url[700];
    snprintf(local, sizeof local, "%s/c.mp4", servers.www);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/cut/c.mp4", servers.fault_port);
    dh_pipeline_spec_t spec = spec_of(4, 160, 120);
    assert_same_frames(&spec, local, url);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/flaky/c.mp4", servers.fault_port);
    assert_same_frames(&spec, local, url);
    assert_int_equal(count_lines(servers.fault_log, " 500"), 1);
}

static void a_stalled_url_clip_stops_at_the_sample_deadline(void **state)
{
    (void)state;
    start_fault_server();
    dh__http_config_t cfg;
    dh__http_config_defaults(&cfg);
    cfg.stall_timeout_s = 3600; /* only the deadline can stop it */
    cfg.retry_budget_s = 3600;
    assert_int_equal(dh__http_configure(&cfg), 0);
    char url[700];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/slow/a.mp4", servers.fault_port);
    dh_sample_t s;
    dh_pipeline_spec_t spec = spec_of(4, 320, 240);
    dh__decode_set_deadline(dh_clock_now_ns() + 500000000u);
    int rc = decode(&spec, url, &s);
    dh__decode_set_deadline(0);
    print_message("%s\n", s.error_message ? s.error_message : "(none)");
    assert_int_equal(rc, DH_EIO);
    assert_non_null(strstr(s.error_message, "interrupted"));
    assert_non_null(strstr(s.error_message, url));
    dh_sample_clear(&s);
}

static void manifest_urls_are_not_joined_to_its_folder(void **state)
{
    (void)state;
    const char *text = "{\"id\":\"a\",\"path\":\"https://h/x/a.mp4\"}\n"
                       "{\"id\":\"b\",\"path\":\"http://h/s.tar\",\"offset\":512,\"size\":100}\n"
                       "{\"id\":\"c\",\"path\":\"c.mp4\"}\n";
    char path[700];
    snprintf(path, sizeof path, "%s", dh_test_path("m.jsonl"));
    dh_test_write_file(path, text);
    dh_manifest_t *m = NULL;
    assert_int_equal(dh_manifest_load(path, &m), 0);
    assert_string_equal(dh_manifest_entry(m, 0)->path, "https://h/x/a.mp4");
    assert_string_equal(dh_manifest_entry(m, 1)->path,
                        "subfile,,start,512,end,612,,:http://h/s.tar");
    assert_non_null(strstr(dh_manifest_entry(m, 2)->path, "/c.mp4"));
    assert_int_equal(dh_manifest_entry(m, 2)->path[0], '/');
    dh_manifest_destroy(&m);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(a_url_clip_decodes_to_the_files_frames, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_few_frames_of_a_long_clip_fetch_a_fraction_of_it, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_second_decode_through_the_cache_makes_no_request, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_url_clip_probes_as_the_file, setup, servers_teardown),
    cmocka_unit_test_setup_teardown(a_member_of_a_url_shard_is_a_byte_range, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_missing_url_clip_names_its_url_and_status, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_flaky_url_clip_decodes_after_retries, setup,
                                    servers_teardown),
    cmocka_unit_test_setup_teardown(a_stalled_url_clip_stops_at_the_sample_deadline, setup,
                                    servers_teardown),
    cmocka_unit_test(manifest_urls_are_not_joined_to_its_folder),
};
DH_TEST_MAIN(tests)
