/* Tests of pure pipeline planning (src/media/sampling.c): frame selection for uniform,
 * random-window and fps sampling, output sizes for each resize mode, tokens. */
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/pipeline.h"

static dh_pipeline_spec_t spec_with(dh_sampling_t sampling, int32_t frames)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.sampling = sampling;
    spec.frames = frames;
    return spec;
}

static dh_clip_info_t clip_of(int64_t frames, double fps, int32_t width, int32_t height)
{
    return (dh_clip_info_t){frames, fps, (double)frames / fps, width, height};
}

static void plan_ok(const dh_pipeline_spec_t *spec, const dh_clip_info_t *clip,
                    const dh_sample_overrides_t *ovr, const char *id, dh_sample_plan_t *plan)
{
    int rc = dh_pipeline_plan(spec, clip, ovr, id, plan);
    if (rc != 0)
        print_error("dh_pipeline_plan: %s\n", dh_last_error());
    assert_int_equal(rc, 0);
}

static void uniform_takes_segment_centres(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_UNIFORM, 16);
    dh_clip_info_t clip = clip_of(48, 24, 160, 120);
    dh_sample_plan_t plan;
    plan_ok(&spec, &clip, NULL, "a", &plan);
    assert_int_equal(plan.frames, 16);
    assert_int_equal(plan.frame_count, 48);
    /* floor((2k + 1) * 48 / 32) = 1, 4, 7, ..., 46 */
    for (int k = 0; k < 16; k++)
        assert_int_equal(plan.indices[k], 1 + 3 * k);
    dh_sample_plan_clear(&plan);
    assert_null(plan.indices);

    /* Asking for every frame gives every frame. */
    spec.frames = 48;
    plan_ok(&spec, &clip, NULL, "a", &plan);
    for (int k = 0; k < 48; k++)
        assert_int_equal(plan.indices[k], k);
    dh_sample_plan_clear(&plan);

    /* Uneven: 10 of 25 frames, strictly increasing, first and last inside. */
    spec.frames = 10;
    clip = clip_of(25, 25, 64, 64);
    plan_ok(&spec, &clip, NULL, "a", &plan);
    static const int64_t want[10] = {1, 3, 6, 8, 11, 13, 16, 18, 21, 23};
    for (int k = 0; k < 10; k++)
        assert_int_equal(plan.indices[k], want[k]);
    dh_sample_plan_clear(&plan);
}

static void uniform_is_the_same_for_every_id(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_UNIFORM, 8);
    dh_clip_info_t clip = clip_of(300, 30, 640, 360);
    dh_sample_plan_t a, b;
    plan_ok(&spec, &clip, NULL, "s0000001", &a);
    plan_ok(&spec, &clip, NULL, "s0000002", &b);
    assert_memory_equal(a.indices, b.indices, 8 * sizeof *a.indices);
    dh_sample_plan_clear(&a);
    dh_sample_plan_clear(&b);
}

static void fewer_frames_than_asked_is_an_error(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_UNIFORM, 16);
    dh_clip_info_t clip = clip_of(10, 24, 160, 120);
    dh_sample_plan_t plan;
    assert_int_equal(dh_pipeline_plan(&spec, &clip, NULL, "s0000007", &plan), DH_ERANGE);
    assert_non_null(strstr(dh_last_error(), "s0000007"));
    assert_non_null(strstr(dh_last_error(), "10 frames"));
    assert_null(plan.indices);
    spec.sampling = DH_SAMPLING_RANDOM_WINDOW;
    assert_int_equal(dh_pipeline_plan(&spec, &clip, NULL, "x", &plan), DH_ERANGE);
}

static void allow_repeat_repeats_frames(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_UNIFORM, 16);
    spec.allow_repeat = true;
    dh_clip_info_t clip = clip_of(10, 24, 160, 120);
    dh_sample_plan_t plan;
    plan_ok(&spec, &clip, NULL, "x", &plan);
    assert_int_equal(plan.frames, 16);
    int seen[10] = {0};
    for (int k = 0; k < 16; k++) {
        assert_in_range(plan.indices[k], 0, 9);
        if (k > 0)
            assert_true(plan.indices[k] >= plan.indices[k - 1]);
        seen[plan.indices[k]]++;
    }
    for (int i = 0; i < 10; i++)
        assert_true(seen[i] >= 1); /* every frame of the clip is used */
    dh_sample_plan_clear(&plan);
}

static void random_window_is_reproducible_per_id(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_RANDOM_WINDOW, 16);
    spec.seed = 42;
    dh_clip_info_t clip = clip_of(300, 30, 640, 360);
    dh_sample_plan_t a, b, c, d;
    plan_ok(&spec, &clip, NULL, "s0000001", &a);
    plan_ok(&spec, &clip, NULL, "s0000001", &b);
    plan_ok(&spec, &clip, NULL, "s0000002", &c);
    assert_memory_equal(a.indices, b.indices, 16 * sizeof *a.indices);
    assert_memory_not_equal(a.indices, c.indices, 16 * sizeof *a.indices);
    spec.seed = 43;
    plan_ok(&spec, &clip, NULL, "s0000001", &d);
    assert_memory_not_equal(a.indices, d.indices, 16 * sizeof *a.indices);
    dh_sample_plan_clear(&a);
    dh_sample_plan_clear(&b);
    dh_sample_plan_clear(&c);
    dh_sample_plan_clear(&d);
}

static void random_window_is_a_strided_window(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_RANDOM_WINDOW, 16);
    spec.window_stride = 4;
    dh_clip_info_t clip = clip_of(300, 30, 640, 360);
    int64_t first_min = 300, first_max = -1;
    for (int i = 0; i < 64; i++) {
        char id[16];
        snprintf(id, sizeof id, "s%07d", i);
        dh_sample_plan_t plan;
        plan_ok(&spec, &clip, NULL, id, &plan);
        /* 16 frames every 4 frames from a random start: a 64-frame window. */
        int64_t start = plan.indices[0] - 2;
        assert_in_range(start, 0, 300 - 64);
        for (int k = 0; k < 16; k++)
            assert_int_equal(plan.indices[k], start + 2 + 4 * k);
        first_min = start < first_min ? start : first_min;
        first_max = start > first_max ? start : first_max;
        dh_sample_plan_clear(&plan);
    }
    assert_true(first_max - first_min > 100); /* starts spread over the clip */

    /* A clip shorter than the window: the window is the whole clip, as uniform. */
    clip = clip_of(40, 30, 640, 360);
    dh_sample_plan_t plan, uniform;
    plan_ok(&spec, &clip, NULL, "s1", &plan);
    spec.sampling = DH_SAMPLING_UNIFORM;
    plan_ok(&spec, &clip, NULL, "s1", &uniform);
    assert_memory_equal(plan.indices, uniform.indices, 16 * sizeof *plan.indices);
    dh_sample_plan_clear(&plan);
    dh_sample_plan_clear(&uniform);
}

/* Every window start in [0, N - S] is reachable, the first and the last included: a clip of
 * 70 frames, windows of 16 x 4 = 64 frames, so 7 starts (0..6), each drawn by some id. */
static void random_window_reaches_every_start(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_RANDOM_WINDOW, 16);
    spec.window_stride = 4;
    dh_clip_info_t clip = clip_of(70, 30, 640, 360);
    int seen[7] = {0};
    for (int i = 0; i < 400; i++) {
        char id[16];
        snprintf(id, sizeof id, "w%07d", i);
        dh_sample_plan_t plan;
        plan_ok(&spec, &clip, NULL, id, &plan);
        int64_t start = plan.indices[0] - 2;
        assert_in_range(start, 0, 6);
        assert_true(plan.indices[15] < 70);
        seen[start]++;
        dh_sample_plan_clear(&plan);
    }
    for (int k = 0; k < 7; k++)
        if (seen[k] == 0)
            fail_msg("window start %d never drawn in 400 ids (the last is 6)", k);
}

static int32_t fps_frames(double duration_s, double clip_fps, const dh_sample_overrides_t *ovr)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_FPS, 16);
    dh_clip_info_t clip = {(int64_t)(duration_s * clip_fps), clip_fps, duration_s, 640, 360};
    dh_sample_plan_t plan;
    plan_ok(&spec, &clip, ovr, "f", &plan);
    int32_t frames = plan.frames;
    /* Spread evenly over the whole clip. */
    for (int32_t k = 0; k < frames; k++)
        assert_int_equal(plan.indices[k], (2 * k + 1) * clip.frame_count / (2 * frames));
    dh_sample_plan_clear(&plan);
    return frames;
}

static void fps_sampling_counts_duration_times_rate(void **state)
{
    /* Defaults: 2 fps, frames in [4, 64], a multiple of the temporal patch (2). */
    assert_int_equal(fps_frames(10.0, 30, NULL), 20);
    assert_int_equal(fps_frames(5.5, 30, NULL), 12);   /* 11 -> 12 (half to even of 5.5) */
    assert_int_equal(fps_frames(6.5, 30, NULL), 12);   /* 13 -> 12 (half to even of 6.5) */
    assert_int_equal(fps_frames(7.4, 30, NULL), 14);   /* 14.8 -> 14 */
    assert_int_equal(fps_frames(1.2, 30, NULL), 4);    /* 2.4 -> clamped up to 4 */
    assert_int_equal(fps_frames(100.0, 30, NULL), 64); /* 200 -> clamped down to 64 */
    /* A manifest's frames override fixes the count. */
    dh_sample_overrides_t ovr = {24, 0, 0};
    assert_int_equal(fps_frames(10.0, 30, &ovr), 24);
}

static void fps_bounds_round_inwards_to_the_temporal_patch(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_FPS, 16);
    spec.min_frames = 5;  /* -> 6 */
    spec.max_frames = 11; /* -> 10 */
    dh_clip_info_t shortc = {30, 30, 1.0, 64, 64}, longc = {3000, 30, 100.0, 64, 64};
    dh_sample_plan_t plan;
    plan_ok(&spec, &shortc, NULL, "x", &plan);
    assert_int_equal(plan.frames, 6);
    dh_sample_plan_clear(&plan);
    plan_ok(&spec, &longc, NULL, "x", &plan);
    assert_int_equal(plan.frames, 10);
    dh_sample_plan_clear(&plan);
}

static void overrides_replace_frames_and_size(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_UNIFORM, 16);
    dh_clip_info_t clip = clip_of(300, 30, 640, 360);
    dh_sample_overrides_t ovr = {32, 336, 300};
    dh_sample_plan_t plan;
    plan_ok(&spec, &clip, &ovr, "x", &plan);
    assert_int_equal(plan.frames, 32);
    assert_int_equal(plan.height, 336);
    assert_int_equal(plan.width, 300);
    assert_int_equal(plan.tokens, dh_tokens_visual(32, 336, 300));
    dh_sample_plan_clear(&plan);

    /* Zero fields keep the spec's. */
    ovr = (dh_sample_overrides_t){0, 0, 100};
    plan_ok(&spec, &clip, &ovr, "x", &plan);
    assert_int_equal(plan.frames, 16);
    assert_int_equal(plan.height, 224);
    assert_int_equal(plan.width, 100);
    dh_sample_plan_clear(&plan);

    ovr = (dh_sample_overrides_t){-1, 0, 0};
    assert_int_equal(dh_pipeline_plan(&spec, &clip, &ovr, "bad", &plan), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "bad"));
}

static void fixed_and_crop_sizes_are_the_spec_size(void **state)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.height = 120;
    spec.width = 200;
    int32_t h, w;
    spec.resize = DH_RESIZE_SHORT_SIDE_CROP;
    dh_pipeline_output_size(&spec, 1920, 1080, NULL, &h, &w);
    assert_int_equal(h, 120);
    assert_int_equal(w, 200);
    spec.resize = DH_RESIZE_FIXED;
    dh_pipeline_output_size(&spec, 64, 480, NULL, &h, &w);
    assert_int_equal(h, 120);
    assert_int_equal(w, 200);
}

static void native_size_rounds_and_clamps_as_smart_resize(void **state)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.resize = DH_RESIZE_NATIVE; /* factor 28, pixels in [3136, 200704] */
    /* Expected values from Qwen2-VL's smart_resize (Python, round half to even). */
    static const struct {
        int32_t h, w, want_h, want_w;
    } cases[] = {
        {120, 160, 112, 168},   /* rounded to multiples of 28 */
        {1080, 1920, 336, 588}, /* above max_pixels: scaled down, floored */
        {720, 1280, 336, 588},  {480, 848, 336, 588}, {1280, 720, 588, 336},
        {360, 640, 336, 588},   {20, 20, 56, 56}, /* below min_pixels: scaled up, ceiled */
        {42, 70, 56, 56},                         /* 1.5 -> 2 and 2.5 -> 2: half to even */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t h, w;
        dh_pipeline_output_size(&spec, cases[i].w, cases[i].h, NULL, &h, &w);
        if (h != cases[i].want_h || w != cases[i].want_w)
            print_error("%dx%d -> %dx%d, want %dx%d\n", (int)cases[i].h, (int)cases[i].w, (int)h,
                        (int)w, (int)cases[i].want_h, (int)cases[i].want_w);
        assert_int_equal(h, cases[i].want_h);
        assert_int_equal(w, cases[i].want_w);
        assert_int_equal(h % 28, 0);
        assert_int_equal(w % 28, 0);
    }
    int32_t h, w;
    spec.max_pixels = 100000;
    dh_pipeline_output_size(&spec, 1920, 1080, NULL, &h, &w);
    assert_int_equal(h, 224);
    assert_int_equal(w, 420);
    assert_true((int64_t)h * w <= 100000);
    /* A size override is the size to round (as Qwen's resized_height/resized_width). */
    spec.max_pixels = 200704;
    dh_sample_overrides_t ovr = {0, 120, 160};
    dh_pipeline_output_size(&spec, 1920, 1080, &ovr, &h, &w);
    assert_int_equal(h, 112);
    assert_int_equal(w, 168);
}

static void tokens_match_dh_tokens_visual_for_defaults(void **state)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    static const int32_t frames[] = {1, 2, 3, 15, 16, 17, 64};
    static const int32_t sides[] = {1, 13, 14, 15, 28, 112, 224, 225, 336, 448};
    for (size_t f = 0; f < sizeof frames / sizeof *frames; f++)
        for (size_t h = 0; h < sizeof sides / sizeof *sides; h++)
            for (size_t w = 0; w < sizeof sides / sizeof *sides; w++)
                assert_int_equal(dh_pipeline_tokens(&spec, frames[f], sides[h], sides[w]),
                                 dh_tokens_visual(frames[f], sides[h], sides[w]));
    assert_int_equal(dh_pipeline_tokens(&spec, 16, 224, 224), 8 * 16 * 16 / 4);
}

static void tokens_follow_the_spec_parameters(void **state)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.patch_size = 16;
    spec.temporal_patch = 4;
    spec.spatial_merge = 1;
    /* ceil(10/4) * ceil(100/16) * ceil(50/16) / 1 = 3 * 7 * 4 */
    assert_int_equal(dh_pipeline_tokens(&spec, 10, 100, 50), 84);
    spec.spatial_merge = 2;
    assert_int_equal(dh_pipeline_tokens(&spec, 10, 100, 50), 21);
}

static void plan_rejects_unusable_clips(void **state)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    dh_sample_plan_t plan;
    dh_clip_info_t no_rate = {48, 0, 2, 160, 120}, no_size = {48, 24, 2, 0, 120},
                   no_frames = {0, 24, 0, 160, 120};
    assert_int_equal(dh_pipeline_plan(&spec, &no_rate, NULL, "r", &plan), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "frame rate"));
    assert_int_equal(dh_pipeline_plan(&spec, &no_size, NULL, "s", &plan), DH_EINVAL);
    assert_int_equal(dh_pipeline_plan(&spec, &no_frames, NULL, "f", &plan), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "'f'"));
}

static void frame_count_is_estimated_from_duration(void **state)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    dh_clip_info_t clip = {0, 25, 2.0, 160, 120}; /* no count: 2 s x 25 fps = 50 */
    dh_sample_plan_t plan;
    plan_ok(&spec, &clip, NULL, "x", &plan);
    assert_int_equal(plan.frame_count, 50);
    assert_int_equal(plan.indices[15], 31 * 50 / 32);
    dh_sample_plan_clear(&plan);
}

static int plan_body(void *ctx)
{
    const dh_pipeline_spec_t *spec = ctx;
    dh_clip_info_t clip = clip_of(300, 30, 640, 360);
    dh_sample_plan_t plan;
    int rc = dh_pipeline_plan(spec, &clip, NULL, "x", &plan);
    dh_sample_plan_clear(&plan);
    return rc;
}

static void plan_survives_allocation_failure(void **state)
{
    dh_pipeline_spec_t spec = spec_with(DH_SAMPLING_RANDOM_WINDOW, 16);
    assert_int_equal(dh_test_each_allocation_failure(plan_body, &spec), 1);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(uniform_takes_segment_centres),
    cmocka_unit_test(uniform_is_the_same_for_every_id),
    cmocka_unit_test(fewer_frames_than_asked_is_an_error),
    cmocka_unit_test(allow_repeat_repeats_frames),
    cmocka_unit_test(random_window_is_reproducible_per_id),
    cmocka_unit_test(random_window_is_a_strided_window),
    cmocka_unit_test(random_window_reaches_every_start),
    cmocka_unit_test(fps_sampling_counts_duration_times_rate),
    cmocka_unit_test(fps_bounds_round_inwards_to_the_temporal_patch),
    cmocka_unit_test(overrides_replace_frames_and_size),
    cmocka_unit_test(fixed_and_crop_sizes_are_the_spec_size),
    cmocka_unit_test(native_size_rounds_and_clamps_as_smart_resize),
    cmocka_unit_test(tokens_match_dh_tokens_visual_for_defaults),
    cmocka_unit_test(tokens_follow_the_spec_parameters),
    cmocka_unit_test(plan_rejects_unusable_clips),
    cmocka_unit_test(frame_count_is_estimated_from_duration),
    cmocka_unit_test(plan_survives_allocation_failure),
};
DH_TEST_MAIN(tests)
