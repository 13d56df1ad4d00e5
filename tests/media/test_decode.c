/* Tests of the decoding pipeline (src/media/decode.c) on synthetic clips made at test time
 * with dh_synth_write_clip: the frames decoded are the ones the plan samples (read back
 * from the frame index each synthetic frame carries), seeking gives the same pixels as
 * decoding every frame, shapes/dtypes/layouts, normalisation, cropping, and one error per
 * kind of bad input. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/mix.h"
#include "datahelix/pipeline.h"
#include "datahelix/synth.h"
#include "media/pipeline_internal.h"

/* The standard fixture: 160x120, 48 frames at 24 fps, a keyframe every 12 frames. */
static const dh_synth_clip_t small_clip = {160, 120, 24.0, 2.0, 12, 7};

static const char *fixture(const char *name, const dh_synth_clip_t *clip)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s", dh_test_path(name));
    int rc = dh_synth_write_clip(path, clip);
    if (rc != 0)
        print_error("dh_synth_write_clip(%s): %s\n", path, dh_last_error());
    assert_int_equal(rc, 0);
    return path;
}

/* A spec that decodes at the clip's own size, RGB THWC uint8: frames dh_synth_frame_index
 * can read. */
static dh_pipeline_spec_t native_spec(int32_t frames)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.frames = frames;
    spec.resize = DH_RESIZE_FIXED;
    spec.height = small_clip.height;
    spec.width = small_clip.width;
    spec.layout = DH_LAYOUT_THWC;
    return spec;
}

static void decode_ok(const dh_pipeline_spec_t *spec, const char *path,
                      const dh_sample_overrides_t *ovr, const char *id, dh_sample_t *s)
{
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, spec), 0);
    int rc = dh_pipeline_decode(p, path, ovr, id, s);
    if (rc != 0)
        print_error("dh_pipeline_decode(%s): %s\n", path, dh_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(s->error, 0);
    assert_null(s->error_message);
    dh_pipeline_destroy(&p);
    assert_null(p);
}

static const uint8_t *frame_at(const dh_sample_t *s, int32_t t)
{
    size_t bytes = s->frames.nbytes / (size_t)s->plan.frames;
    return (const uint8_t *)s->frames.data + (size_t)t * bytes;
}

/* Every output frame carries the index the plan sampled. */
static void assert_frames_are_planned(const dh_sample_t *s, int32_t width, int32_t height)
{
    for (int32_t t = 0; t < s->plan.frames; t++) {
        int64_t got = dh_synth_frame_index(frame_at(s, t), width, height);
        if (got != s->plan.indices[t])
            print_error("output frame %d: frame %lld decoded, %lld planned\n", (int)t,
                        (long long)got, (long long)s->plan.indices[t]);
        assert_int_equal(got, s->plan.indices[t]);
    }
}

static void uniform_decodes_the_planned_frames(void **state)
{
    const char *path = fixture("u.mp4", &small_clip);
    dh_pipeline_spec_t spec = native_spec(16);
    dh_sample_t s;
    decode_ok(&spec, path, NULL, "s0", &s);
    assert_int_equal(s.plan.frames, 16);
    assert_int_equal(s.plan.frame_count, 48);
    assert_string_equal(s.id, "s0");
    assert_frames_are_planned(&s, 160, 120);
    dh_sample_clear(&s);
    assert_null(s.frames.data);

    /* Sparse and dense plans both: 3 frames (a seek per frame), all 48 (no seek). */
    static const int32_t counts[] = {1, 3, 47, 48};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        int32_t frames = counts[i];
        spec.frames = frames;
        decode_ok(&spec, path, NULL, "s0", &s);
        assert_int_equal(s.plan.frames, frames);
        assert_frames_are_planned(&s, 160, 120);
        dh_sample_clear(&s);
    }
}

static void seeking_gives_the_pixels_of_sequential_decoding(void **state)
{
    const char *path = fixture("seq.mp4", &small_clip);
    dh_pipeline_spec_t spec = native_spec(48);
    dh_sample_t all;
    decode_ok(&spec, path, NULL, "all", &all); /* every frame, in order, no seek */
    for (int t = 0; t < 48; t++)
        assert_int_equal(all.plan.indices[t], t);
    size_t frame_bytes = (size_t)160 * 120 * 3;

    /* Uniform 5 (seeks across GOPs) and random windows (seek into the middle). */
    spec.frames = 5;
    for (int round = 0; round < 6; round++) {
        spec.sampling = round == 0 ? DH_SAMPLING_UNIFORM : DH_SAMPLING_RANDOM_WINDOW;
        spec.window_stride = round;
        if (spec.window_stride < 1)
            spec.window_stride = 1;
        char id[16];
        snprintf(id, sizeof id, "w%d", round);
        dh_sample_t s;
        decode_ok(&spec, path, NULL, id, &s);
        for (int32_t t = 0; t < s.plan.frames; t++)
            assert_memory_equal(frame_at(&s, t), frame_at(&all, (int32_t)s.plan.indices[t]),
                                frame_bytes);
        dh_sample_clear(&s);
    }
    dh_sample_clear(&all);
}

static void random_window_is_reproducible(void **state)
{
    dh_synth_clip_t clip = small_clip;
    clip.duration_s = 5.0; /* 120 frames: room for a window of 8 x 4 */
    const char *path = fixture("rw.mp4", &clip);
    dh_pipeline_spec_t spec = native_spec(8);
    spec.sampling = DH_SAMPLING_RANDOM_WINDOW;
    spec.seed = 11;
    dh_sample_t a, b, c;
    decode_ok(&spec, path, NULL, "s0000001", &a);
    decode_ok(&spec, path, NULL, "s0000001", &b);
    decode_ok(&spec, path, NULL, "s0000002", &c);
    assert_int_equal(a.frames.nbytes, b.frames.nbytes);
    assert_memory_equal(a.frames.data, b.frames.data, a.frames.nbytes);
    assert_memory_equal(a.plan.indices, b.plan.indices, 8 * sizeof(int64_t));
    assert_memory_not_equal(a.plan.indices, c.plan.indices, 8 * sizeof(int64_t));
    assert_frames_are_planned(&a, 160, 120);
    assert_frames_are_planned(&c, 160, 120);
    assert_int_equal(a.plan.indices[7] - a.plan.indices[0], 7 * 4); /* stride 4 */
    dh_sample_clear(&a);
    dh_sample_clear(&b);
    dh_sample_clear(&c);
}

static void fps_sampling_decodes_duration_times_rate(void **state)
{
    dh_synth_clip_t clip = small_clip;
    clip.duration_s = 5.0; /* 5 s at 2 fps: 10 frames */
    const char *path = fixture("fps.mp4", &clip);
    dh_pipeline_spec_t spec = native_spec(16);
    spec.sampling = DH_SAMPLING_FPS;
    dh_sample_t s;
    decode_ok(&spec, path, NULL, "f", &s);
    assert_int_equal(s.plan.frames, 10);
    assert_int_equal(s.frames.shape[0], 10);
    assert_frames_are_planned(&s, 160, 120);
    dh_sample_clear(&s);
}

static void overrides_set_frames_and_size(void **state)
{
    const char *path = fixture("o.mp4", &small_clip);
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    dh_sample_overrides_t ovr = {6, 56, 84};
    dh_sample_t s;
    decode_ok(&spec, path, &ovr, "o", &s);
    assert_int_equal(s.frames.ndim, 4);
    assert_int_equal(s.frames.shape[0], 6);
    assert_int_equal(s.frames.shape[1], 3);
    assert_int_equal(s.frames.shape[2], 56);
    assert_int_equal(s.frames.shape[3], 84);
    assert_int_equal(s.plan.tokens, dh_tokens_visual(6, 56, 84));
    dh_sample_clear(&s);
}

static void shapes_follow_resize_layout_and_dtype(void **state)
{
    const char *path = fixture("shape.mp4", &small_clip);
    static const struct {
        dh_resize_t resize;
        int32_t want_h, want_w; /* for a 120x160 source and a 64x96 target */
    } modes[] = {
        {DH_RESIZE_SHORT_SIDE_CROP, 64, 96},
        {DH_RESIZE_FIXED, 64, 96},
        {DH_RESIZE_NATIVE, 112, 168}, /* 120x160 rounded to multiples of 28 */
    };
    for (size_t m = 0; m < 3; m++)
        for (int layout = 0; layout < 2; layout++)
            for (int k = 0; k < 2; k++) {
                const dh_dtype_t dtype = k ? DH_DTYPE_FLOAT32 : DH_DTYPE_UINT8;
                dh_pipeline_spec_t spec;
                dh_pipeline_spec_defaults(&spec);
                spec.frames = 4;
                spec.height = 64;
                spec.width = 96;
                spec.resize = modes[m].resize;
                spec.layout = (dh_layout_t)layout;
                spec.dtype = dtype;
                dh_sample_t s;
                decode_ok(&spec, path, NULL, "x", &s);
                int64_t h = modes[m].want_h, w = modes[m].want_w;
                int64_t tchw[4] = {4, 3, h, w}, thwc[4] = {4, h, w, 3};
                const int64_t *want = layout == DH_LAYOUT_TCHW ? tchw : thwc;
                assert_int_equal(s.frames.ndim, 4);
                assert_int_equal(s.frames.dtype, dtype);
                for (int d = 0; d < 4; d++)
                    assert_int_equal(s.frames.shape[d], want[d]);
                assert_int_equal(s.frames.strides[3], 1);
                assert_int_equal(s.frames.strides[2], want[3]);
                assert_int_equal(s.frames.strides[1], want[3] * want[2]);
                assert_int_equal(s.frames.strides[0], want[3] * want[2] * want[1]);
                assert_int_equal(s.frames.nbytes, (size_t)(4 * 3 * h * w) * dh_dtype_size(dtype));
                assert_int_equal(s.plan.height, h);
                assert_int_equal(s.plan.width, w);
                assert_int_equal(s.plan.tokens, dh_tokens_visual(4, (int32_t)h, (int32_t)w));
                dh_sample_clear(&s);
            }
}

/* Both converter paths (convert.c): 50x70 scales (planar), 120x160 is the clip's own size
 * (packed, unscaled). */
static void tchw_holds_the_planes_of_thwc(void **state)
{
    const char *path = fixture("planes.mp4", &small_clip);
    static const int32_t sizes[2][2] = {{50, 70}, {120, 160}};
    for (int k = 0; k < 2; k++) {
        int32_t h = sizes[k][0], w = sizes[k][1];
        dh_pipeline_spec_t spec;
        dh_pipeline_spec_defaults(&spec);
        spec.frames = 3;
        spec.resize = DH_RESIZE_FIXED;
        spec.height = h;
        spec.width = w;
        dh_sample_t planar, packed;
        spec.layout = DH_LAYOUT_TCHW;
        decode_ok(&spec, path, NULL, "x", &planar);
        spec.layout = DH_LAYOUT_THWC;
        decode_ok(&spec, path, NULL, "x", &packed);
        const uint8_t *p = planar.frames.data, *q = packed.frames.data;
        int mismatches = 0;
        for (int t = 0; t < 3; t++)
            for (int c = 0; c < 3; c++)
                for (int y = 0; y < h; y++)
                    for (int x = 0; x < w; x++) {
                        int a = p[((t * 3 + c) * h + y) * w + x];
                        int b = q[((t * h + y) * w + x) * 3 + c];
                        if (a != b) /* one scaler path: the same values, only arranged apart */
                            mismatches++;
                    }
        assert_int_equal(mismatches, 0);
        dh_sample_clear(&planar);
        dh_sample_clear(&packed);
    }
}

/* Mean absolute difference (of 255) between decoded RGB frame `t` of `s` and the pixels
 * synth encoded for it, over columns [x0, clip width). */
static double mad_vs_source(const dh_synth_clip_t *clip, const dh_sample_t *s, int32_t t,
                            int32_t x0)
{
    size_t row = (size_t)clip->width * 3, n = row * (size_t)clip->height;
    uint8_t *want = dh_malloc(n);
    assert_non_null(want);
    dh_synth_frame_rgb(clip, s->plan.indices[t], want);
    const uint8_t *got = frame_at(s, t);
    double total = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        if ((int32_t)(i % row) >= 3 * x0) {
            total += abs((int)got[i] - (int)want[i]);
            count++;
        }
    dh_free(want);
    return total / (double)count;
}

/* One pipeline reuses its scaler while the sizes stay, and makes a new one when they change:
 * samples of alternating sizes (and so alternating converter paths) come out as a fresh
 * pipeline makes them. Frames at the clip's own size (the packed path) stay close to the
 * source up to the last column: 168 wide (8 mod 16: the packed path writes past the picture,
 * into the slack), 164 (not a multiple of 8: swscale's packed converter would leave the last
 * 4 columns unwritten, so the planar path takes it). */
static void scaler_follows_the_size_of_each_sample(void **state)
{
    static const dh_synth_clip_t clips[2] = {{168, 120, 24.0, 1.0, 12, 11},
                                             {164, 120, 24.0, 1.0, 12, 11}};
    for (int c = 0; c < 2; c++) {
        const dh_synth_clip_t *clip = &clips[c];
        const char *path = fixture(c ? "sizes164.mp4" : "sizes168.mp4", clip);
        dh_pipeline_spec_t spec = native_spec(6);
        spec.height = clip->height;
        spec.width = clip->width;
        dh_sample_overrides_t sizes[3] = {{0, 0, 0}, {0, 64, 96}, {0, 120, clip->width}};
        dh_sample_t fresh[3];
        for (int k = 0; k < 3; k++)
            decode_ok(&spec, path, &sizes[k], "x", &fresh[k]);
        assert_frames_are_planned(&fresh[0], clip->width, 120);
        for (int t = 0; t < 6; t++) { /* 4.3 to 4.8 and 4.6 to 5.2 measured */
            double all = mad_vs_source(clip, &fresh[0], t, 0);
            double tail = mad_vs_source(clip, &fresh[0], t, clip->width - 8);
            if (all > 5.5 || tail > 6.5)
                print_error("%d wide, frame %d: mean difference %.3f against the source, %.3f in "
                            "the last 8 columns\n",
                            clip->width, t, all, tail);
            assert_true(all <= 5.5 && tail <= 6.5);
        }
        dh_pipeline_t *p = NULL;
        assert_int_equal(dh_pipeline_new(&p, &spec), 0);
        static const int order[] = {0, 1, 2, 1, 0};
        for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
            dh_sample_t s;
            assert_int_equal(dh_pipeline_decode(p, path, &sizes[order[i]], "x", &s), 0);
            assert_int_equal(s.frames.nbytes, fresh[order[i]].frames.nbytes);
            assert_memory_equal(s.frames.data, fresh[order[i]].frames.data, s.frames.nbytes);
            dh_sample_clear(&s);
        }
        dh_pipeline_destroy(&p);
        for (int k = 0; k < 3; k++)
            dh_sample_clear(&fresh[k]);
    }
}

/* With B-frames an MP4 index holds decode times, which run ahead of the presentation ones:
 * a keyframe 1 or 2 frames after a target is not one before it. x264's defaults (reorder
 * delay 2), a keyframe every 12 of 48 frames, 16 uniform frames (1, 4, 7, 10, 13, ...): 10,
 * 22 and 34 lie 2 frames before a keyframe. Every planned frame comes out, and no frame is
 * decoded twice (reading the keyframe's decode time as its place went back to the start of
 * the GOP for each of them). */
static void b_frames_do_not_seek_back_before_a_keyframe(void **state)
{
    static const dh_synth_encoding_t encodings[] = {DH_SYNTH_ENC_X264_DEFAULT, DH_SYNTH_ENC_FLAT_B,
                                                    DH_SYNTH_ENC_NO_B};
    for (size_t k = 0; k < sizeof encodings / sizeof *encodings; k++) {
        char name[64];
        snprintf(name, sizeof name, "bframes%zu.mp4", k);
        const char *path = dh_test_path(name);
        assert_int_equal(dh_synth_write_clip_encoded(path, &small_clip, encodings[k]), 0);
        dh_pipeline_spec_t spec = native_spec(16);
        dh_pipeline_t *p = NULL;
        assert_int_equal(dh_pipeline_new(&p, &spec), 0);
        dh_sample_t s;
        int rc = dh_pipeline_decode(p, path, NULL, "x", &s);
        if (rc != 0)
            print_error("dh_pipeline_decode(%s): %s\n", path, dh_last_error());
        assert_int_equal(rc, 0);
        assert_int_equal(s.plan.indices[3], 10);
        assert_frames_are_planned(&s, 160, 120);
        if (dh__pipeline_redecoded(p) != 0)
            print_error("%s: %lld frames decoded twice\n", dh_synth_encoding_name(encodings[k]),
                        (long long)dh__pipeline_redecoded(p));
        assert_int_equal(dh__pipeline_redecoded(p), 0);
        dh_sample_clear(&s);
        dh_pipeline_destroy(&p);
    }
}

static void float32_is_normalised_uint8(void **state)
{
    const char *path = fixture("float.mp4", &small_clip);
    for (int layout = 0; layout < 2; layout++) {
        dh_pipeline_spec_t spec;
        dh_pipeline_spec_defaults(&spec);
        spec.frames = 2;
        spec.height = 32;
        spec.width = 48;
        spec.layout = (dh_layout_t)layout;
        spec.mean[0] = 0.5f, spec.mean[1] = 0.25f, spec.mean[2] = 0.0f;
        spec.std[0] = 0.5f, spec.std[1] = 2.0f, spec.std[2] = 1.0f;
        dh_sample_t u8, f32;
        decode_ok(&spec, path, NULL, "x", &u8);
        spec.dtype = DH_DTYPE_FLOAT32;
        decode_ok(&spec, path, NULL, "x", &f32);
        assert_int_equal(f32.frames.nbytes, 4 * u8.frames.nbytes);
        const uint8_t *u = u8.frames.data;
        const float *f = f32.frames.data;
        double lo = 1e9, hi = -1e9;
        for (size_t i = 0; i < u8.frames.nbytes; i++) {
            int c = layout == DH_LAYOUT_THWC ? (int)(i % 3) : (int)((i / (32 * 48)) % 3);
            double want = (u[i] / 255.0 - spec.mean[c]) / spec.std[c];
            assert_close(f[i], want, 1e-5);
            lo = fmin(lo, f[i]);
            hi = fmax(hi, f[i]);
        }
        assert_true(lo >= -1.0 - 1e-6 && hi <= 2.0 + 1e-6); /* R in [-1, 1], B in [0, 1] */
        dh_sample_clear(&u8);
        dh_sample_clear(&f32);
    }
}

static void center_crop_keeps_the_centre(void **state)
{
    /* A 320x120 clip cropped to 120x120 needs no scaling: the output is columns 100..219 of
     * the full frame. */
    dh_synth_clip_t clip = {320, 120, 24.0, 1.0, 12, 3};
    const char *path = fixture("wide.mp4", &clip);
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.frames = 2;
    spec.layout = DH_LAYOUT_THWC;
    spec.resize = DH_RESIZE_FIXED;
    spec.height = 120;
    spec.width = 320;
    dh_sample_t full, crop;
    decode_ok(&spec, path, NULL, "x", &full);
    spec.resize = DH_RESIZE_SHORT_SIDE_CROP;
    spec.width = 120;
    decode_ok(&spec, path, NULL, "x", &crop);
    const uint8_t *a = full.frames.data, *b = crop.frames.data;
    long total = 0, count = 0;
    for (int t = 0; t < 2; t++)
        for (int y = 0; y < 120; y++)
            for (int x = 2; x < 118; x++) /* chroma interpolation differs at the cut */
                for (int c = 0; c < 3; c++) {
                    total += abs(a[((t * 120 + y) * 320 + x + 100) * 3 + c] -
                                 b[((t * 120 + y) * 120 + x) * 3 + c]);
                    count++;
                }
    double mean_diff = (double)total / (double)count;
    if (mean_diff > 0.5)
        print_error("mean difference %.3f\n", mean_diff);
    assert_true(mean_diff <= 0.5);
    dh_sample_clear(&full);
    dh_sample_clear(&crop);
}

static void fewer_frames_than_asked_is_erange_unless_repeat(void **state)
{
    const char *path = fixture("short.mp4", &small_clip);
    dh_pipeline_spec_t spec = native_spec(64);
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, &spec), 0);
    dh_sample_t s;
    assert_int_equal(dh_pipeline_decode(p, path, NULL, "s9", &s), DH_ERANGE);
    assert_int_equal(s.error, DH_ERANGE);
    assert_non_null(strstr(s.error_message, path));
    assert_non_null(strstr(s.error_message, "48 frames"));
    assert_null(s.frames.data);
    dh_sample_clear(&s);
    dh_pipeline_destroy(&p);

    spec.allow_repeat = true;
    decode_ok(&spec, path, NULL, "s9", &s);
    assert_int_equal(s.plan.frames, 64);
    assert_frames_are_planned(&s, 160, 120);
    dh_sample_clear(&s);
}

/* Decodes a bad input: the error code, and a message naming the path and `why`. */
static void assert_decode_fails(const char *path, int want, const char *why)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, &spec), 0);
    dh_sample_t s;
    int rc = dh_pipeline_decode(p, path, NULL, "bad", &s);
    if (rc != want || !s.error_message || !strstr(s.error_message, path) ||
        !strstr(s.error_message, why))
        print_error("%s: got %s (%s), want %s with '%s'\n", path, dh_err_name(rc),
                    s.error_message ? s.error_message : "(no message)", dh_err_name(want), why);
    assert_int_equal(rc, want);
    assert_int_equal(s.error, want);
    assert_non_null(strstr(s.error_message, path));
    assert_non_null(strstr(s.error_message, why));
    assert_string_equal(dh_last_error(), s.error_message);
    assert_string_equal(s.id, "bad");
    assert_null(s.frames.data);
    dh_sample_clear(&s);
    dh_pipeline_destroy(&p);
}

static uint8_t *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(*size);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, *size, f), *size);
    fclose(f);
    return data;
}

static void write_all(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
}

static void missing_file_is_enoent(void **state)
{
    assert_decode_fails(dh_test_path("no-such-clip.mp4"), -ENOENT, "No such file");
}

static void text_file_is_not_a_video(void **state)
{
    const char *path = dh_test_path("notes.txt");
    dh_test_write_file(path, "this is a caption file, not a video\n");
    assert_decode_fails(path, DH_EIO, "not a video file FFmpeg can read: Invalid data");
}

static void audio_only_file_has_no_video_stream(void **state)
{
    /* A WAV file: 0.1 s of 8 kHz mono 16-bit silence. */
    const char *path = dh_test_path("audio.wav");
    uint8_t wav[44 + 1600] = {0};
    uint32_t data_bytes = 1600, rate = 8000, byte_rate = 16000;
    memcpy(wav, "RIFF", 4);
    uint32_t riff = 36 + data_bytes;
    memcpy(wav + 4, &riff, 4);
    memcpy(wav + 8, "WAVEfmt ", 8);
    uint32_t fmt_size = 16;
    uint16_t pcm = 1, channels = 1, align = 2, bits = 16;
    memcpy(wav + 16, &fmt_size, 4);
    memcpy(wav + 20, &pcm, 2);
    memcpy(wav + 22, &channels, 2);
    memcpy(wav + 24, &rate, 4);
    memcpy(wav + 28, &byte_rate, 4);
    memcpy(wav + 32, &align, 2);
    memcpy(wav + 34, &bits, 2);
    memcpy(wav + 36, "data", 4);
    memcpy(wav + 40, &data_bytes, 4);
    write_all(path, wav, sizeof wav);
    assert_decode_fails(path, DH_EIO, "no video stream");
}

static void truncated_file_is_an_error(void **state)
{
    const char *path = fixture("cut.mp4", &small_clip);
    size_t size;
    uint8_t *data = read_all(path, &size);
    char cut[1024];
    snprintf(cut, sizeof cut, "%s", dh_test_path("cut-in-half.mp4"));
    write_all(cut, data, size / 2);
    free(data);
    assert_decode_fails(cut, DH_EIO, "truncated or corrupt");
}

static void corrupt_stream_is_an_error(void **state)
{
    const char *path = fixture("corrupt.mp4", &small_clip);
    size_t size;
    uint8_t *data = read_all(path, &size);
    /* Scribble over the coded frames (the mdat box), keep the header intact. */
    uint8_t *mdat = memmem(data, size, "mdat", 4);
    assert_non_null(mdat);
    size_t from = (size_t)(mdat - data) + 2000, to = from + 18000 < size ? from + 18000 : size;
    for (size_t k = from; k < to; k++)
        data[k] = (uint8_t)(k * 7919u);
    char bad[1024];
    snprintf(bad, sizeof bad, "%s", dh_test_path("scribbled.mp4"));
    write_all(bad, data, size);
    free(data);
    assert_decode_fails(bad, DH_EIO, "Invalid data");
}

static void unsupported_codec_is_an_error(void **state)
{
    const char *path = fixture("codec.mp4", &small_clip);
    size_t size;
    uint8_t *data = read_all(path, &size);
    /* Rename the sample entry's codec (the last 'avc1': the first is a brand in ftyp). */
    uint8_t *entry = NULL;
    for (uint8_t *at = data; (at = memmem(at, size - (size_t)(at - data), "avc1", 4)); at += 4)
        entry = at;
    assert_non_null(entry);
    memcpy(entry, "zzzz", 4);
    char bad[1024];
    snprintf(bad, sizeof bad, "%s", dh_test_path("zzzz.mp4"));
    write_all(bad, data, size);
    free(data);
    assert_decode_fails(bad, DH_EIO, "unsupported codec");
}

static void clip_info_reads_the_header(void **state)
{
    const char *path = fixture("info.mp4", &small_clip);
    dh_clip_info_t clip;
    assert_int_equal(dh__pipeline_clip_info(path, &clip), 0);
    assert_int_equal(clip.frame_count, 48);
    assert_int_equal(clip.width, 160);
    assert_int_equal(clip.height, 120);
    assert_close(clip.fps, 24.0, 1e-9);
    assert_close(clip.duration_s, 2.0, 0.05);
    assert_int_equal(dh__pipeline_clip_info(dh_test_path("none.mp4"), &clip), -ENOENT);
}

static int decode_body(void *ctx)
{
    const char *path = ctx;
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.frames = 4;
    spec.height = 32;
    spec.width = 32;
    spec.dtype = DH_DTYPE_FLOAT32; /* with the scratch buffer */
    dh_pipeline_t *p = NULL;
    int rc = dh_pipeline_new(&p, &spec);
    if (rc < 0)
        return rc;
    dh_sample_t s;
    rc = dh_pipeline_decode(p, path, NULL, "x", &s);
    dh_sample_clear(&s);
    dh_pipeline_destroy(&p);
    return rc;
}

static void decode_survives_allocation_failure(void **state)
{
    /* FFmpeg's own allocations do not go through our allocator; ours do. */
    char path[1024];
    snprintf(path, sizeof path, "%s", fixture("alloc.mp4", &small_clip));
    assert_true(dh_test_each_allocation_failure(decode_body, path) >= 4);
}

static void batch_with_a_bad_sample_keeps_the_good_ones(void **state)
{
    char good[1024], other[1024];
    snprintf(good, sizeof good, "%s", fixture("b1.mp4", &small_clip));
    dh_synth_clip_t clip2 = small_clip;
    clip2.seed = 99;
    snprintf(other, sizeof other, "%s", fixture("b2.mp4", &clip2));
    const char *missing = dh_test_path("b-missing.mp4");
    dh_sample_request_t req[3] = {
        {"s0", good, {0, 0, 0}},
        {"s1", missing, {0, 0, 0}},
        {"s2", other, {8, 0, 0}},
    };
    dh_pipeline_spec_t spec = native_spec(4);
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, &spec), 0);
    dh_batch_t *batch = NULL;
    assert_int_equal(dh__pipeline_decode_batch(p, req, 3, &batch), 0);
    assert_int_equal(batch->count, 3);
    assert_int_equal(batch->failed, 1);
    assert_int_equal(batch->errors[0], 0);
    assert_int_equal(batch->errors[1], -ENOENT);
    assert_int_equal(batch->errors[2], 0);
    assert_null(batch->error_messages[0]);
    assert_non_null(strstr(batch->error_messages[1], missing));
    assert_string_equal(batch->ids[1], "s1");
    /* B x T x H x W x C with T = the largest T (8). */
    int64_t want[5] = {3, 8, 120, 160, 3};
    assert_int_equal(batch->frames.ndim, 5);
    for (int d = 0; d < 5; d++)
        assert_int_equal(batch->frames.shape[d], want[d]);
    static const uint8_t want_mask[3][8] = {
        {1, 1, 1, 1, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1}};
    assert_memory_equal(batch->mask.data, want_mask, sizeof want_mask);
    assert_int_equal(batch->frame_counts[0], 4);
    assert_int_equal(batch->frame_counts[1], 0);
    assert_int_equal(batch->frame_counts[2], 8);
    assert_int_equal(batch->tokens[0], dh_tokens_visual(4, 120, 160));
    assert_int_equal(batch->tokens[1], 0);
    assert_int_equal(batch->tokens[2], dh_tokens_visual(8, 120, 160));
    /* The good samples' frames are the ones a single decode gives. */
    size_t frame_bytes = (size_t)120 * 160 * 3, slot = 8 * frame_bytes;
    const uint8_t *px = batch->frames.data;
    dh_sample_t s0, s2;
    decode_ok(&spec, good, NULL, "s0", &s0);
    dh_sample_overrides_t ovr = {8, 0, 0};
    decode_ok(&spec, other, &ovr, "s2", &s2);
    assert_memory_equal(px, s0.frames.data, s0.frames.nbytes);
    assert_memory_equal(px + 2 * slot, s2.frames.data, s2.frames.nbytes);
    for (size_t i = 4 * frame_bytes; i < 2 * slot; i++) /* padding and the failed slot */
        assert_int_equal(px[i], 0);
    assert_int_equal(dh_synth_frame_index(px + 2 * slot + 7 * frame_bytes, 160, 120),
                     s2.plan.indices[7]);
    dh_sample_clear(&s0);
    dh_sample_clear(&s2);
    dh_batch_destroy(&batch);
    assert_null(batch);
    dh_pipeline_destroy(&p);
}

/* ---- numbered fault sites (a faults build; skipped otherwise) ----------------------- */

/* One pipeline, reused by every run of a sweep; the reference sample it decoded first. */
typedef struct fault_ctx {
    dh_pipeline_t *p;
    const char *path;
    dh_sample_t reference;
    const char *what; /* what the message must say besides the path */
} fault_ctx_t;

/* Decodes the clip. A failure (a read error opening or reading it, a packet the decoder
 * refuses) is the sample's error, naming the clip and what failed, with no frames; a
 * complete run gives the reference's pixels. */
static int decode_against_reference(void *ctx)
{
    fault_ctx_t *c = ctx;
    dh_sample_t s;
    int rc = dh_pipeline_decode(c->p, c->path, NULL, "x", &s);
    if (rc) {
        assert_int_equal(rc, DH_EIO);
        assert_int_equal(s.error, rc);
        assert_non_null(s.error_message); /* the sweep checks that it names the clip */
        assert_string_equal(s.error_message, dh_last_error());
        if (!strstr(s.error_message, c->what))
            print_error("'%s' does not say '%s'\n", s.error_message, c->what);
        assert_non_null(strstr(s.error_message, c->what));
        assert_null(s.frames.data);
    } else {
        assert_int_equal(s.frames.nbytes, c->reference.frames.nbytes);
        assert_memory_equal(s.frames.data, c->reference.frames.data, s.frames.nbytes);
    }
    dh_sample_clear(&s);
    return rc;
}

static long sweep_decode(int site, const char *what)
{
    fault_ctx_t c = {.what = what};
    c.path = fixture("fault.mp4", &small_clip);
    dh_pipeline_spec_t spec = native_spec(6);
    assert_int_equal(dh_pipeline_new(&c.p, &spec), 0);
    assert_int_equal(dh_pipeline_decode(c.p, c.path, NULL, "x", &c.reference), 0);
    long hits = dh_test_each_fault(site, c.path, decode_against_reference, &c);
    dh_sample_clear(&c.reference);
    dh_pipeline_destroy(&c.p);
    return hits;
}

static void decode_open_fault_names_the_clip(void **state)
{
    if (!dh_fault_enabled())
        skip();
    /* a read error is not called a bad file */
    assert_int_equal(sweep_decode(DH_FAULT_MEDIA_OPEN, "cannot open: Input/output error"), 1);
}

static void decode_read_fault_fails_cleanly_at_every_packet(void **state)
{
    if (!dh_fault_enabled())
        skip();
    /* 6 frames across 48: at least the packets up to the last one sampled */
    assert_true(sweep_decode(DH_FAULT_MEDIA_READ, ": Input/output error") >= 6);
}

static void decode_refused_packet_fails_cleanly_at_every_packet(void **state)
{
    if (!dh_fault_enabled())
        skip();
    assert_true(sweep_decode(DH_FAULT_MEDIA_DECODE, "decoding near frame") >= 6);
}

/* A tar member read in place (a WebDataset shard, manifest.h's subfile URL): a read error
 * at each of its packets names the sample, the member and the shard (tar_member.c). */
static void write_one_member_tar(const char *tar, const char *member, const uint8_t *data,
                                 size_t size)
{
    uint8_t h[512] = {0};
    snprintf((char *)h, 100, "%s", member);
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    snprintf((char *)h + 124, 12, "%011zo", size);
    memcpy(h + 136, "00000000000", 12);
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof h; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    FILE *f = fopen(tar, "wb");
    assert_non_null(f);
    static const uint8_t zeros[1536]; /* padding to a block, then two empty blocks */
    assert_int_equal(fwrite(h, 1, sizeof h, f), sizeof h);
    assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fwrite(zeros, 1, (512 - size % 512) % 512 + 1024, f),
                     (512 - size % 512) % 512 + 1024);
    assert_int_equal(fclose(f), 0);
}

static void decode_read_fault_in_a_tar_member_names_the_sample(void **state)
{
    if (!dh_fault_enabled())
        skip();
    size_t size;
    uint8_t *clip = read_all(fixture("member.mp4", &small_clip), &size);
    char tar[1024], url[1200], what[1300];
    snprintf(tar, sizeof tar, "%s", dh_test_path("shard-000.tar"));
    write_one_member_tar(tar, "clip-7.mp4", clip, size);
    free(clip);
    snprintf(url, sizeof url, "subfile,,start,512,end,%zu,,:%s", 512 + size, tar);
    snprintf(what, sizeof what, "sample x (member clip-7.mp4 of shard %s): ", tar);
    fault_ctx_t c = {.path = url, .what = "Input/output error"};
    dh_pipeline_spec_t spec = native_spec(6);
    assert_int_equal(dh_pipeline_new(&c.p, &spec), 0);
    assert_int_equal(dh_pipeline_decode(c.p, url, NULL, "x", &c.reference), 0);
    assert_true(dh_test_each_fault(DH_FAULT_MEDIA_READ, what, decode_against_reference, &c) >= 6);
    dh_sample_clear(&c.reference);
    dh_pipeline_destroy(&c.p);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(uniform_decodes_the_planned_frames),
    cmocka_unit_test(seeking_gives_the_pixels_of_sequential_decoding),
    cmocka_unit_test(random_window_is_reproducible),
    cmocka_unit_test(fps_sampling_decodes_duration_times_rate),
    cmocka_unit_test(overrides_set_frames_and_size),
    cmocka_unit_test(shapes_follow_resize_layout_and_dtype),
    cmocka_unit_test(tchw_holds_the_planes_of_thwc),
    cmocka_unit_test(scaler_follows_the_size_of_each_sample),
    cmocka_unit_test(b_frames_do_not_seek_back_before_a_keyframe),
    cmocka_unit_test(float32_is_normalised_uint8),
    cmocka_unit_test(center_crop_keeps_the_centre),
    cmocka_unit_test(fewer_frames_than_asked_is_erange_unless_repeat),
    cmocka_unit_test(missing_file_is_enoent),
    cmocka_unit_test(text_file_is_not_a_video),
    cmocka_unit_test(audio_only_file_has_no_video_stream),
    cmocka_unit_test(truncated_file_is_an_error),
    cmocka_unit_test(corrupt_stream_is_an_error),
    cmocka_unit_test(unsupported_codec_is_an_error),
    cmocka_unit_test(clip_info_reads_the_header),
    cmocka_unit_test(decode_survives_allocation_failure),
    cmocka_unit_test(batch_with_a_bad_sample_keeps_the_good_ones),
    cmocka_unit_test(decode_open_fault_names_the_clip),
    cmocka_unit_test(decode_read_fault_fails_cleanly_at_every_packet),
    cmocka_unit_test(decode_refused_packet_fails_cleanly_at_every_packet),
    cmocka_unit_test(decode_read_fault_in_a_tar_member_names_the_sample),
};
DH_TEST_MAIN(tests)
