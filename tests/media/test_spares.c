/* Tests of the output buffers a pipeline keeps for its next samples (src/media/spares.c,
 * dh__pipeline_recycle): the pool's choice and limits, and that a sample decoded into a
 * reused buffer (poisoned before it was handed back) equals the same sample from a fresh
 * pipeline, over alternating sizes, layouts and dtypes. */
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"
#include "datahelix/synth.h"
#include "media/media_lib.h"
#include "media/pipeline_internal.h"

static void pool_takes_the_smallest_fit_within_twice_the_need(void **state)
{
    (void)state;
    dh__spares_t s;
    memset(&s, 0, sizeof s);
    void *a = dh_malloc(1000), *b = dh_malloc(3000), *c = dh_malloc(1500);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    dh__spares_give(&s, a, 1000);
    dh__spares_give(&s, b, 3000);
    dh__spares_give(&s, c, 1500);
    dh__spares_give(&s, NULL, 99); /* nothing */
    assert_int_equal(s.count, 3);
    assert_int_equal(s.bytes, 5500);
    assert_ptr_equal(dh__spares_take(&s, 1400), c); /* 1500 fits best */
    assert_ptr_equal(dh__spares_take(&s, 1000), a); /* exactly */
    void *fresh = dh__spares_take(&s, 1400);        /* 3000 is over twice 1400: not that one */
    assert_non_null(fresh);
    assert_true(fresh != b);
    assert_int_equal(s.count, 1);
    assert_ptr_equal(dh__spares_take(&s, 1500), b); /* 3000 is twice 1500 */
    assert_int_equal(s.count, 0);
    assert_int_equal(s.bytes, 0);
    dh_free(a);
    dh_free(b);
    dh_free(c);
    dh_free(fresh);
    dh__spares_clear(&s);
}

static void pool_drops_the_oldest_past_its_limits(void **state)
{
    (void)state;
    dh__spares_t s;
    memset(&s, 0, sizeof s);
    void *first = dh_malloc(16);
    assert_non_null(first);
    dh__spares_give(&s, first, 16);
    for (int i = 1; i <= DH_SPARES_MAX; i++) { /* one more than it keeps: `first` goes */
        void *p = dh_malloc(16);
        assert_non_null(p);
        dh__spares_give(&s, p, 16);
    }
    assert_int_equal(s.count, DH_SPARES_MAX);
    for (int i = 0; i < s.count; i++)
        assert_true(s.buf[i].data != first);
    /* a buffer over the byte limit on its own is freed (ASan: no leak), the pool unchanged */
    dh__spares_give(&s, dh_malloc(16), DH_SPARES_MAX_BYTES + 1);
    assert_int_equal(s.count, DH_SPARES_MAX);
    assert_int_equal(s.bytes, DH_SPARES_MAX * 16);
    /* one that fits only alone pushes every older one out */
    dh__spares_give(&s, dh_malloc(16), DH_SPARES_MAX_BYTES - 8);
    assert_int_equal(s.count, 1);
    assert_int_equal(s.bytes, DH_SPARES_MAX_BYTES - 8);
    dh__spares_clear(&s);
    assert_int_equal(s.count, 0);
}

static void decode_into(dh_pipeline_t *p, const char *path, const dh_sample_overrides_t *ovr,
                        dh_sample_t *s)
{
    int rc = dh_pipeline_decode(p, path, ovr, "x", s);
    if (rc != 0)
        print_error("dh_pipeline_decode(%s): %s\n", path, dh_last_error());
    assert_int_equal(rc, 0);
}

/* Widths 164 and 168 (FFmpeg's packed converter leaves `width mod 8` columns to the
 * pipeline), sizes that alternate so every buffer is reused by a sample of another shape,
 * each buffer filled with 0x5a before it is handed back: every byte must be written again. */
static void reused_buffers_give_the_fresh_pipelines_frames(void **state)
{
    (void)state;
    static const dh_synth_clip_t clip = {164, 120, 24.0, 1.0, 12, 5};
    char path[1024];
    snprintf(path, sizeof path, "%s", dh_test_path("spares164.mp4"));
    assert_int_equal(dh_synth_write_clip(path, &clip), 0);
    static const dh_sample_overrides_t sizes[4] = {
        {6, 120, 164}, {5, 64, 96}, {6, 120, 160}, {4, 100, 164}};
    static const int order[] = {0, 1, 0, 2, 3, 2, 1, 0, 3, 3};
    static const struct {
        dh_layout_t layout;
        dh_dtype_t dtype;
    } kinds[] = {{DH_LAYOUT_THWC, DH_DTYPE_UINT8},
                 {DH_LAYOUT_TCHW, DH_DTYPE_UINT8},
                 {DH_LAYOUT_THWC, DH_DTYPE_FLOAT32}};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        dh_pipeline_spec_t spec;
        dh_pipeline_spec_defaults(&spec);
        spec.frames = 6;
        spec.resize = DH_RESIZE_FIXED;
        spec.height = clip.height;
        spec.width = clip.width;
        spec.layout = kinds[k].layout;
        spec.dtype = kinds[k].dtype;
        dh_sample_t fresh[4];
        for (int i = 0; i < 4; i++) {
            dh_pipeline_t *p = NULL;
            assert_int_equal(dh_pipeline_new(&p, &spec), 0);
            decode_into(p, path, &sizes[i], &fresh[i]);
            dh_pipeline_destroy(&p);
        }
        dh_pipeline_t *p = NULL;
        assert_int_equal(dh_pipeline_new(&p, &spec), 0);
        int reused = 0;
        void *last[4] = {NULL, NULL, NULL, NULL};
        for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
            int o = order[i];
            dh_sample_t s;
            decode_into(p, path, &sizes[o], &s);
            assert_int_equal(s.frames.nbytes, fresh[o].frames.nbytes);
            assert_memory_equal(s.frames.data, fresh[o].frames.data, s.frames.nbytes);
            for (int j = 0; j < 4; j++)
                reused += last[j] == s.frames.data;
            memset(s.frames.data, 0x5a, s.frames.nbytes);
            last[i % 4] = s.frames.data;
            dh__pipeline_recycle(p, &s);
            assert_null(s.frames.data);
        }
        if (reused == 0)
            print_error("no buffer was reused over %zu samples\n", sizeof order / sizeof *order);
        assert_true(reused > 0);
        dh_pipeline_destroy(&p); /* frees the kept buffers (ASan: no leak) */
        for (int i = 0; i < 4; i++)
            dh_sample_clear(&fresh[i]);
    }
}

/* A failed sample has no buffer to hand back; recycling it (or a zeroed sample) is a clear. */
static void recycling_a_failed_or_empty_sample_is_a_clear(void **state)
{
    (void)state;
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    dh_pipeline_t *p = NULL;
    assert_int_equal(dh_pipeline_new(&p, &spec), 0);
    dh_sample_t s;
    assert_int_not_equal(dh_pipeline_decode(p, dh_test_path("no-such-clip.mp4"), NULL, "x", &s), 0);
    assert_non_null(s.error_message);
    dh__pipeline_recycle(p, &s);
    assert_null(s.error_message);
    dh_sample_t zero;
    memset(&zero, 0, sizeof zero);
    dh__pipeline_recycle(p, &zero);
    dh_pipeline_destroy(&p);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(pool_takes_the_smallest_fit_within_twice_the_need),
    cmocka_unit_test(pool_drops_the_oldest_past_its_limits),
    cmocka_unit_test(reused_buffers_give_the_fresh_pipelines_frames),
    cmocka_unit_test(recycling_a_failed_or_empty_sample_is_a_clear),
};
DH_TEST_MAIN(tests)
