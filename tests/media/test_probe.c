/* Tests of container probing (no decode) and of the decode-cost count. */
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include <sys/stat.h>

#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "datahelix/mix.h"
#include "datahelix/pipeline.h"
#include "datahelix/profile.h"
#include "datahelix/probe.h"
#include "datahelix/synth.h"

static void frames_needed_seeks_or_decodes_forward(void **state)
{
    const int64_t kf[] = {0, 10, 20, 30};
    /* One frame at the start: just it. */
    int64_t t1[] = {0};
    assert_int_equal(dh_decode_frames_needed(kf, 4, t1, 1), 1);
    /* Frame 15: seek to 10, decode 10..15. */
    int64_t t2[] = {15};
    assert_int_equal(dh_decode_frames_needed(kf, 4, t2, 1), 6);
    /* 12 then 15: forward from 13 (no keyframe between). */
    int64_t t3[] = {12, 15};
    assert_int_equal(dh_decode_frames_needed(kf, 4, t3, 2), 3 + 3);
    /* 5 then 25: keyframe 20 lies between, so seek: 6 + 6. */
    int64_t t4[] = {5, 25};
    assert_int_equal(dh_decode_frames_needed(kf, 4, t4, 2), 6 + 6);
    /* A repeated frame costs nothing more. */
    int64_t t5[] = {15, 15};
    assert_int_equal(dh_decode_frames_needed(kf, 4, t5, 2), 6);
    /* Every frame of a 40-frame clip: each decoded once. */
    int64_t all[40];
    for (int i = 0; i < 40; i++)
        all[i] = i;
    assert_int_equal(dh_decode_frames_needed(kf, 4, all, 40), 40);
    /* No index: one frame per target. */
    assert_int_equal(dh_decode_frames_needed(NULL, 0, t4, 2), 2);
}

static void probe_reads_a_clip_without_decoding(void **state)
{
    const char *path = dh_test_path("probe.mp4");
    dh_synth_clip_t clip = {
        .width = 160, .height = 120, .fps = 24, .duration_s = 2.0, .gop = 12, .seed = 5};
    assert_int_equal(dh_synth_write_clip(path, &clip), 0);
    dh_media_info_t info;
    assert_int_equal(dh_media_probe(path, &info), 0);
    assert_string_equal(info.codec, "h264");
    assert_int_equal(info.width, 160);
    assert_int_equal(info.height, 120);
    assert_close(info.fps, 24, 0.01);
    assert_close(info.duration_s, 2.0, 0.1);
    assert_in_range(info.frame_count, 47, 49);
    assert_true(info.file_bytes > 1000);
    /* A keyframe every 12 frames. */
    assert_in_range(info.n_keyframes, 4, 5);
    for (size_t i = 0; i < info.n_keyframes; i++)
        assert_int_equal(info.keyframes[i], (int64_t)i * 12);
    dh_media_info_clear(&info);
    assert_null(info.keyframes);
}

static void probe_errors_name_the_file(void **state)
{
    dh_media_info_t info;
    const char *missing = dh_test_path("no-such.mp4");
    assert_int_equal(dh_media_probe(missing, &info), -ENOENT);
    assert_non_null(strstr(dh_last_error(), "no-such.mp4"));
    const char *text = dh_test_path("not-a-video.mp4");
    dh_test_write_file(text, "this is a caption, not a video\n");
    assert_int_equal(dh_media_probe(text, &info), DH_EIO);
    assert_non_null(strstr(dh_last_error(), "not-a-video.mp4"));
    assert_null(info.keyframes);
}

/* A data set of 4 good clips (two resolution buckets) plus a missing file and a text file:
 * the good ones become rows, the bad ones are skipped with their reason, the calibration is
 * measured and cached, and a second probe takes it from the cache without decoding. */
static void probe_manifest_skips_bad_files_and_caches_calibration(void **state)
{
    const char *dir = dh_test_path("set");
    char path[1024], manifest[1024], cache[1024];
    mkdir(dir, 0755);
    for (int i = 0; i < 4; i++) {
        dh_synth_clip_t clip = {.width = i < 2 ? 160 : 320,
                                .height = i < 2 ? 120 : 240,
                                .fps = 24,
                                .duration_s = 1.5,
                                .gop = 12,
                                .seed = (uint64_t)i};
        snprintf(path, sizeof path, "%s/c%d.mp4", dir, i);
        assert_int_equal(dh_synth_write_clip(path, &clip), 0);
    }
    snprintf(path, sizeof path, "%s/text.mp4", dir);
    dh_test_write_file(path, "not a video\n");
    snprintf(manifest, sizeof manifest, "%s/manifest.jsonl", dir);
    dh_test_write_file(manifest,
                       "{\"id\":\"a\",\"path\":\"c0.mp4\",\"caption\":\"a clip\",\"frames\":8}\n"
                       "{\"id\":\"gone\",\"path\":\"missing.mp4\"}\n"
                       "{\"id\":\"b\",\"path\":\"c1.mp4\",\"frames\":8}\n"
                       "{\"id\":\"txt\",\"path\":\"text.mp4\"}\n"
                       "{\"id\":\"c\",\"path\":\"c2.mp4\",\"frames\":8}\n"
                       "{\"id\":\"d\",\"path\":\"c3.mp4\",\"frames\":8,\"height\":112,"
                       "\"width\":112}\n");
    snprintf(cache, sizeof cache, "%s/cache/calibration.json", dir);
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    dh_manifest_t *m = NULL;
    assert_int_equal(dh_manifest_load(manifest, &m), 0);
    for (int pass = 0; pass < 2; pass++) {
        dh_profile_set_t *set = NULL;
        dh_probe_report_t report;
        dh_probe_options_t opt = {.jobs = 2, .calibration_path = cache, .seed = 1};
        assert_int_equal(dh_profile_set_new(&set), 0);
        assert_int_equal(dh_probe_manifest(m, &spec, &opt, set, &report), 0);
        assert_int_equal(report.rows, 4);
        assert_int_equal(dh_profile_set_count(set), 4);
        assert_int_equal(report.n_skips, 2);
        assert_int_equal(report.skips[0].entry, 1);
        assert_int_equal(report.skips[0].error, -ENOENT);
        assert_non_null(strstr(report.skips[0].message, "missing.mp4"));
        assert_int_equal(report.skips[1].entry, 3);
        assert_int_equal(report.skips[1].error, DH_EIO);
        assert_non_null(strstr(report.skips[1].message, "text.mp4"));
        /* First pass: measured (2 buckets); second: all from the cache, nothing decoded. */
        assert_int_equal(report.calibration_cached, pass);
        if (pass == 0)
            assert_true(report.calibration_decodes >= 2);
        else
            assert_int_equal(report.calibration_decodes, 0);
        const dh_profile_row_t *a = dh_profile_set_row(set, 0), *d = dh_profile_set_row(set, 3);
        assert_string_equal(a->id, "a");
        assert_int_equal(a->frames, 8);
        assert_int_equal(a->height, 224);
        assert_int_equal(a->text_len, 2); /* "a clip": 6 bytes / 4, rounded up */
        assert_int_equal(a->tokens_est, dh_tokens_visual(8, 224, 224) + 2);
        assert_int_equal(a->out_bytes, 8LL * 224 * 224 * 3);
        assert_string_equal(a->codec, "h264");
        assert_true(a->cpu_s_est > 0);
        assert_string_equal(d->profile_key, "f8x112x112");
        assert_non_null(strstr(d->extra, "\"bucket\":\"h264-240p\""));
        assert_non_null(strstr(a->extra, "\"bucket\":\"h264-240p\""));
        double median, p90;
        size_t checked;
        if (pass == 1) {
            assert_int_equal(dh_probe_check(m, &spec, set, report.entry_of_row, 4, 1, NULL, NULL,
                                            &median, &p90, &checked),
                             0);
            assert_int_equal(checked, 4);
            assert_true(median >= 0 && median <= p90);
        }
        dh_probe_report_clear(&report);
        dh_profile_set_destroy(&set);
    }
    dh_manifest_destroy(&m);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(probe_manifest_skips_bad_files_and_caches_calibration),
    cmocka_unit_test(frames_needed_seeks_or_decodes_forward),
    cmocka_unit_test(probe_reads_a_clip_without_decoding),
    cmocka_unit_test(probe_errors_name_the_file),
};
DH_TEST_MAIN(tests)
