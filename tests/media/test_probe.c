/* Tests of container probing (no decode) and of the decode-cost count. */
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/error.h"
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

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(frames_needed_seeks_or_decodes_forward),
    cmocka_unit_test(probe_reads_a_clip_without_decoding),
    cmocka_unit_test(probe_errors_name_the_file),
};
DH_TEST_MAIN(tests)
