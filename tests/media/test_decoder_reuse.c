/* Tests of the decoder a pipeline keeps for its next sample (src/media/decoder_reuse.c):
 * one pipeline decoding clips A, B, A ... (H.264 of two sizes and two encodings, MPEG-4 Part
 * 2, and HEVC and VP9 where this machine's ffmpeg CLI encodes them) gives, bit for bit, the
 * frames of a fresh pipeline per sample with reuse off; a decoder is reused exactly when the
 * stream parameters match the last good sample's, and a sample that failed leaves none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"
#include "datahelix/synth.h"
#include "media/pipeline_internal.h"

/* 48 frames at 24 fps, a keyframe every 12: 8 uniform samples seek between GOPs. */
static const dh_synth_clip_t clip_a = {160, 120, 24.0, 2.0, 12, 7};
static const dh_synth_clip_t clip_a2 = {160, 120, 24.0, 2.0, 12, 9}; /* A's stream, other pixels */
static const dh_synth_clip_t clip_c = {192, 144, 24.0, 2.0, 12, 11}; /* another size */

static char *synth(const char *name, const dh_synth_clip_t *clip, dh_synth_encoding_t enc)
{
    char *path = dh_strdup(dh_test_path(name));
    assert_non_null(path);
    int rc = dh_synth_write_clip_encoded(path, clip, enc);
    if (rc != 0)
        print_error("dh_synth_write_clip_encoded(%s): %s\n", path, dh_last_error());
    assert_int_equal(rc, 0);
    return path;
}

/* `source` transcoded by the ffmpeg CLI with `codec_args`, or NULL (and why, on stderr) when
 * this machine's ffmpeg cannot. */
static char *transcode(const char *source, const char *name, const char *codec_args)
{
    char *path = dh_strdup(dh_test_path(name));
    assert_non_null(path);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "ffmpeg -nostdin -loglevel error -y -i '%s' %s -an '%s'", source,
             codec_args, path);
    if (system(cmd) != 0) {
        fprintf(stderr, "skipping %s: '%s' failed\n", name, cmd);
        dh_free(path);
        return NULL;
    }
    return path;
}

static dh_pipeline_spec_t spec_112(void)
{
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.frames = 8;
    spec.resize = DH_RESIZE_FIXED; /* scaled: the scaler changes with the source size too */
    spec.height = 112;
    spec.width = 112;
    spec.layout = DH_LAYOUT_THWC;
    return spec;
}

/* The sample from a new pipeline with reuse off: a decoder opened for it alone. */
static int decode_fresh(const dh_pipeline_spec_t *spec, const char *path,
                        const dh_sample_overrides_t *ovr, dh_sample_t *s)
{
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, spec), 0);
    dh__pipeline_set_decoder_reuse(p, false);
    int rc = dh_pipeline_decode(p, path, ovr, "fresh", s);
    assert_int_equal(dh__pipeline_decoders(p)->reused, 0);
    dh_pipeline_destroy(&p);
    return rc;
}

typedef struct step {
    const char *path; /* NULL: this machine cannot make the clip; left out */
    int key;          /* clips with the same key have the same stream parameters */
    int32_t frames;   /* frames to sample, 0: the spec's 8; 48 (all) drains the decoder */
} step_t;

static void run_steps(const step_t *steps, size_t n, bool expect_failure_at_bad)
{
    dh_pipeline_spec_t spec = spec_112();
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, &spec), 0);
    dh__pipeline_set_decoder_reuse(p, true);
    int kept = -1; /* the key of the decoder the pipeline keeps, -1: none */
    int64_t reused = 0, opened = 0;
    for (size_t i = 0; i < n; i++) {
        if (!steps[i].path)
            continue;
        dh_sample_t want, got;
        dh_sample_overrides_t ovr = {steps[i].frames, 0, 0};
        int kept_before = kept;
        int want_rc = decode_fresh(&spec, steps[i].path, &ovr, &want);
        int got_rc = dh_pipeline_decode(p, steps[i].path, &ovr, "reused", &got);
        if (want_rc != got_rc)
            print_error("step %zu (%s): fresh %d, reused %d: %s\n", i, steps[i].path, want_rc,
                        got_rc, got.error_message ? got.error_message : "");
        assert_int_equal(got_rc, want_rc);
        if (got_rc == 0) {
            assert_int_equal(got.frames.nbytes, want.frames.nbytes);
            assert_memory_equal(got.plan.indices, want.plan.indices,
                                (size_t)want.plan.frames * sizeof *want.plan.indices);
            if (memcmp(got.frames.data, want.frames.data, want.frames.nbytes) != 0)
                print_error("step %zu (%s): frames differ from a fresh decoder's\n", i,
                            steps[i].path);
            assert_memory_equal(got.frames.data, want.frames.data, want.frames.nbytes);
            kept = steps[i].key;
        } else {
            assert_true(expect_failure_at_bad);
            kept = -1; /* a failed sample's decoder is not kept */
            assert_null(dh__pipeline_decoders(p)->codec);
        }
        const dh__decoders_t *k = dh__pipeline_decoders(p);
        bool reuse = kept_before == steps[i].key;
        if (k->reused != reused + reuse)
            print_error("step %zu (%s, key %d, kept %d): reused %lld, expected %lld\n", i,
                        steps[i].path, steps[i].key, kept_before, (long long)k->reused,
                        (long long)(reused + reuse));
        assert_int_equal(k->reused, reused + reuse);
        assert_int_equal(k->opened, opened + !reuse);
        reused = k->reused;
        opened = k->opened;
        dh_sample_clear(&want);
        dh__pipeline_recycle(p, &got);
    }
    assert_true(reused > 0);
    dh_pipeline_destroy(&p); /* frees the kept decoder (ASan: no leak) */
}

static void reused_decoders_give_a_fresh_decoders_frames(void **state)
{
    (void)state;
    char *a = synth("reuse-a.mp4", &clip_a, DH_SYNTH_ENC_FLAT_B);
    char *a2 = synth("reuse-a2.mp4", &clip_a2, DH_SYNTH_ENC_FLAT_B);
    char *c = synth("reuse-c.mp4", &clip_c, DH_SYNTH_ENC_FLAT_B);
    char *nob = synth("reuse-nob.mp4", &clip_a, DH_SYNTH_ENC_NO_B);
    char *m = transcode(a, "reuse-m.mp4", "-c:v mpeg4 -q:v 4 -g 12");
    char *m2 = transcode(a2, "reuse-m2.mp4", "-c:v mpeg4 -q:v 4 -g 12");
    assert_non_null(m); /* FFmpeg's own encoder: every ffmpeg CLI has it */
    char *h = transcode(a, "reuse-h.mp4",
                        "-c:v libx265 -preset ultrafast -x265-params "
                        "log-level=error:keyint=12 -tag:v hvc1");
    char *v = transcode(a, "reuse-v.webm", "-c:v libvpx-vp9 -deadline realtime -g 12");
    /* 48 frames: every frame, the last ones only after the end of the stream (the decoder
     * drained, as only a flush undoes) */
    const step_t steps[] = {
        {a, 1, 0},  {a2, 1, 0}, {a, 1, 48},  {a2, 1, 0}, {c, 2, 0},  {a, 1, 0}, {m, 3, 48},
        {m2, 3, 0}, {a, 1, 0},  {nob, 4, 0}, {a, 1, 0},  {h, 5, 48}, {h, 5, 0}, {a2, 1, 0},
        {v, 6, 48}, {v, 6, 0},  {a, 1, 0},   {m, 3, 0},  {c, 2, 48}, {c, 2, 0}, {a, 1, 0},
    };
    run_steps(steps, sizeof steps / sizeof *steps, false);
    dh_free(a);
    dh_free(a2);
    dh_free(c);
    dh_free(nob);
    dh_free(m);
    dh_free(m2);
    dh_free(h);
    dh_free(v);
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

/* A's header with its coded frames scribbled over: it takes A's decoder and fails in it;
 * the decoder is dropped, and the next A opens a new one. */
static void a_failed_sample_keeps_no_decoder(void **state)
{
    (void)state;
    char *a = synth("reuse-fail-a.mp4", &clip_a, DH_SYNTH_ENC_FLAT_B);
    size_t size;
    uint8_t *data = read_all(a, &size);
    uint8_t *mdat = memmem(data, size, "mdat", 4);
    assert_non_null(mdat);
    size_t from = (size_t)(mdat - data) + 2000, to = from + 18000 < size ? from + 18000 : size;
    for (size_t k = from; k < to; k++)
        data[k] = (uint8_t)(k * 7919u);
    char *bad = dh_strdup(dh_test_path("reuse-scribbled.mp4"));
    assert_non_null(bad);
    FILE *f = fopen(bad, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    free(data);
    const step_t steps[] = {{a, 1, 0}, {a, 1, 0}, {bad, 1, 0}, {a, 1, 0}, {a, 1, 0}};
    run_steps(steps, sizeof steps / sizeof *steps, true);
    dh_free(a);
    dh_free(bad);
}

/* Reuse off (DH_DECODER_REUSE=0's switch): every sample opens its own, none is kept. */
static void reuse_off_opens_one_decoder_per_sample(void **state)
{
    (void)state;
    char *a = synth("reuse-off-a.mp4", &clip_a, DH_SYNTH_ENC_FLAT_B);
    dh_pipeline_spec_t spec = spec_112();
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, &spec), 0);
    dh__pipeline_set_decoder_reuse(p, false);
    for (int i = 0; i < 3; i++) {
        dh_sample_t s;
        assert_int_equal(dh_pipeline_decode(p, a, NULL, "x", &s), 0);
        dh__pipeline_recycle(p, &s);
        assert_null(dh__pipeline_decoders(p)->codec);
    }
    assert_int_equal(dh__pipeline_decoders(p)->opened, 3);
    assert_int_equal(dh__pipeline_decoders(p)->reused, 0);
    dh_pipeline_destroy(&p);
    dh_free(a);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(reused_decoders_give_a_fresh_decoders_frames),
    cmocka_unit_test(a_failed_sample_keeps_no_decoder),
    cmocka_unit_test(reuse_off_opens_one_decoder_per_sample),
};
DH_TEST_MAIN(tests)
