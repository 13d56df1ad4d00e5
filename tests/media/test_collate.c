/* Tests of collation (src/media/collate.c): padding to the batch's largest T (and H, W),
 * valid-frame masks, per-sample metadata and errors, layouts and dtypes, and the
 * allocation-failure run. Samples are built by hand: collation is pure. */
#include <string.h>

#include "dh_test.h"
#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"

/* A sample of T frames of H x W whose element i holds base + i (mod 251, nonzero). */
static void make_sample(dh_sample_t *s, const char *id, int32_t t, int32_t h, int32_t w,
                        dh_dtype_t dtype, dh_layout_t layout, int base)
{
    memset(s, 0, sizeof *s);
    s->id = dh_strdup(id);
    s->plan.frames = t;
    s->plan.height = h;
    s->plan.width = w;
    s->plan.tokens = 1000 + t;
    s->frames.dtype = dtype;
    s->frames.ndim = 4;
    int64_t tchw[4] = {t, 3, h, w}, thwc[4] = {t, h, w, 3};
    memcpy(s->frames.shape, layout == DH_LAYOUT_TCHW ? tchw : thwc, sizeof tchw);
    size_t n = (size_t)t * 3 * (size_t)h * (size_t)w;
    s->frames.nbytes = n * dh_dtype_size(dtype);
    s->frames.data = dh_malloc(s->frames.nbytes);
    assert_non_null(s->frames.data);
    for (size_t i = 0; i < n; i++) {
        int v = 1 + (int)((base + i) % 250);
        if (dtype == DH_DTYPE_UINT8)
            ((uint8_t *)s->frames.data)[i] = (uint8_t)v;
        else
            ((float *)s->frames.data)[i] = (float)v + 0.5f;
    }
}

static void make_failed(dh_sample_t *s, const char *id, int error, const char *message)
{
    memset(s, 0, sizeof *s);
    s->id = dh_strdup(id);
    s->error = error;
    s->error_message = dh_strdup(message);
}

static dh_batch_t *collate_ok(const dh_sample_t *samples, size_t n, dh_dtype_t dtype,
                              dh_layout_t layout)
{
    dh_batch_t *batch = NULL;
    assert_int_equal(dh_collate(samples, n, dtype, layout, &batch), 0);
    assert_non_null(batch);
    assert_int_equal(batch->count, n);
    return batch;
}

static void frames_are_padded_to_the_longest_with_masks(void **state)
{
    dh_sample_t s[3];
    make_sample(&s[0], "a", 2, 4, 5, DH_DTYPE_UINT8, DH_LAYOUT_TCHW, 0);
    make_sample(&s[1], "b", 3, 4, 5, DH_DTYPE_UINT8, DH_LAYOUT_TCHW, 7);
    make_sample(&s[2], "c", 1, 4, 5, DH_DTYPE_UINT8, DH_LAYOUT_TCHW, 9);
    dh_batch_t *b = collate_ok(s, 3, DH_DTYPE_UINT8, DH_LAYOUT_TCHW);
    int64_t shape[5] = {3, 3, 3, 4, 5}, strides[5] = {180, 60, 20, 5, 1};
    assert_string_equal(b->frames.name, "frames");
    assert_string_equal(b->mask.name, "mask");
    assert_int_equal(b->frames.ndim, 5);
    assert_int_equal(b->frames.dtype, DH_DTYPE_UINT8);
    for (int d = 0; d < 5; d++) {
        assert_int_equal(b->frames.shape[d], shape[d]);
        assert_int_equal(b->frames.strides[d], strides[d]);
    }
    assert_int_equal(b->frames.nbytes, 3 * 180);
    static const uint8_t mask[3][3] = {{1, 1, 0}, {1, 1, 1}, {1, 0, 0}};
    assert_int_equal(b->mask.ndim, 2);
    assert_int_equal(b->mask.shape[0], 3);
    assert_int_equal(b->mask.shape[1], 3);
    assert_int_equal(b->mask.strides[0], 3);
    assert_memory_equal(b->mask.data, mask, sizeof mask);
    const uint8_t *px = b->frames.data;
    for (int i = 0; i < 3; i++) {
        size_t valid = s[i].frames.nbytes;
        assert_memory_equal(px + i * 180, s[i].frames.data, valid);
        for (size_t k = valid; k < 180; k++)
            assert_int_equal(px[i * 180 + k], 0);
        assert_int_equal(b->frame_counts[i], s[i].plan.frames);
        assert_int_equal(b->heights[i], 4);
        assert_int_equal(b->widths[i], 5);
        assert_int_equal(b->tokens[i], 1000 + s[i].plan.frames);
        assert_int_equal(b->errors[i], 0);
        assert_null(b->error_messages[i]);
        assert_string_equal(b->ids[i], s[i].id);
    }
    assert_int_equal(b->failed, 0);
    dh_batch_destroy(&b);
    assert_null(b);
    for (int i = 0; i < 3; i++)
        dh_sample_clear(&s[i]);
}

static void different_sizes_are_padded_bottom_right(void **state)
{
    for (int layout = 0; layout < 2; layout++) {
        dh_sample_t s[2];
        make_sample(&s[0], "small", 2, 2, 3, DH_DTYPE_FLOAT32, (dh_layout_t)layout, 0);
        make_sample(&s[1], "big", 1, 4, 5, DH_DTYPE_FLOAT32, (dh_layout_t)layout, 3);
        dh_batch_t *b = collate_ok(s, 2, DH_DTYPE_FLOAT32, (dh_layout_t)layout);
        int64_t tchw[5] = {2, 2, 3, 4, 5}, thwc[5] = {2, 2, 4, 5, 3};
        for (int d = 0; d < 5; d++)
            assert_int_equal(b->frames.shape[d], layout == DH_LAYOUT_TCHW ? tchw[d] : thwc[d]);
        assert_int_equal(b->frames.nbytes, 2 * 2 * 3 * 4 * 5 * sizeof(float));
        assert_int_equal(b->heights[0], 2);
        assert_int_equal(b->widths[0], 3);
        assert_int_equal(b->heights[1], 4);
        assert_int_equal(b->widths[1], 5);
        const float *px = b->frames.data, *src = s[0].frames.data;
        /* Element (t, c, y, x) of the small sample sits at its place in the big grid, zeros
         * around it. */
        for (int t = 0; t < 2; t++)
            for (int c = 0; c < 3; c++)
                for (int y = 0; y < 4; y++)
                    for (int x = 0; x < 5; x++) {
                        size_t at = layout == DH_LAYOUT_TCHW
                                        ? (size_t)(((t * 3 + c) * 4 + y) * 5 + x)
                                        : (size_t)(((t * 4 + y) * 5 + x) * 3 + c);
                        float want = 0;
                        if (y < 2 && x < 3)
                            want = layout == DH_LAYOUT_TCHW ? src[((t * 3 + c) * 2 + y) * 3 + x]
                                                            : src[((t * 2 + y) * 3 + x) * 3 + c];
                        assert_close(px[at], want, 0);
                    }
        /* The big sample fills its first frame; its second frame is padding. */
        assert_memory_equal(px + 60 * 2, s[1].frames.data, s[1].frames.nbytes);
        for (size_t k = 60 * 3; k < 60 * 4; k++)
            assert_close(px[k], 0, 0);
        dh_batch_destroy(&b);
        dh_sample_clear(&s[0]);
        dh_sample_clear(&s[1]);
    }
}

static void failed_samples_keep_their_slot_and_error(void **state)
{
    dh_sample_t s[3];
    make_sample(&s[0], "ok", 2, 2, 2, DH_DTYPE_UINT8, DH_LAYOUT_THWC, 0);
    make_failed(&s[1], "bad", -ENOENT, "/data/x.mp4: cannot open: No such file or directory");
    make_sample(&s[2], "ok2", 1, 2, 2, DH_DTYPE_UINT8, DH_LAYOUT_THWC, 4);
    dh_batch_t *b = collate_ok(s, 3, DH_DTYPE_UINT8, DH_LAYOUT_THWC);
    assert_int_equal(b->failed, 1);
    assert_int_equal(b->errors[1], -ENOENT);
    assert_string_equal(b->error_messages[1], s[1].error_message);
    assert_ptr_not_equal(b->error_messages[1], s[1].error_message); /* a copy */
    assert_string_equal(b->ids[1], "bad");
    assert_int_equal(b->frame_counts[1], 0);
    assert_int_equal(b->tokens[1], 0);
    static const uint8_t mask[3][2] = {{1, 1}, {0, 0}, {1, 0}};
    assert_memory_equal(b->mask.data, mask, sizeof mask);
    const uint8_t *px = b->frames.data;
    for (size_t k = 24; k < 48; k++)
        assert_int_equal(px[k], 0);
    dh_batch_destroy(&b);
    for (int i = 0; i < 3; i++)
        dh_sample_clear(&s[i]);
}

static void all_failed_or_empty_batches_have_no_pixels(void **state)
{
    dh_sample_t s[2];
    make_failed(&s[0], "x", DH_EIO, "x.mp4: corrupt");
    make_failed(&s[1], "y", DH_ERANGE, "y.mp4: short");
    dh_batch_t *b = collate_ok(s, 2, DH_DTYPE_UINT8, DH_LAYOUT_TCHW);
    assert_int_equal(b->failed, 2);
    assert_int_equal(b->frames.nbytes, 0);
    assert_null(b->frames.data);
    assert_int_equal(b->frames.shape[0], 2);
    assert_int_equal(b->frames.shape[1], 0);
    assert_int_equal(b->mask.nbytes, 0);
    dh_batch_destroy(&b);
    dh_sample_clear(&s[0]);
    dh_sample_clear(&s[1]);

    b = collate_ok(NULL, 0, DH_DTYPE_UINT8, DH_LAYOUT_TCHW);
    assert_int_equal(b->frames.shape[0], 0);
    assert_null(b->frames.data);
    dh_batch_destroy(&b);
    dh_batch_destroy(&b); /* safe on NULL */
}

static int collate_body(void *ctx)
{
    const dh_sample_t *samples = ctx;
    dh_batch_t *b = NULL;
    int rc = dh_collate(samples, 3, DH_DTYPE_FLOAT32, DH_LAYOUT_TCHW, &b);
    if (rc == 0 && !b)
        return DH_EINVAL;
    dh_batch_destroy(&b);
    return rc;
}

static void collate_survives_allocation_failure(void **state)
{
    dh_sample_t s[3];
    make_sample(&s[0], "a", 2, 3, 3, DH_DTYPE_FLOAT32, DH_LAYOUT_TCHW, 0);
    make_failed(&s[1], "b", DH_EIO, "b.mp4: corrupt");
    make_sample(&s[2], "c", 3, 2, 4, DH_DTYPE_FLOAT32, DH_LAYOUT_TCHW, 1);
    /* 7 arrays, pixels, mask, 3 ids, 1 message, the batch itself. */
    assert_int_equal(dh_test_each_allocation_failure(collate_body, s), 14);
    for (int i = 0; i < 3; i++)
        dh_sample_clear(&s[i]);
}

static void clears_are_safe_on_zeroed_values(void **state)
{
    dh_sample_t s;
    memset(&s, 0, sizeof s);
    dh_sample_clear(&s);
    dh_sample_clear(NULL);
    dh_tensor_t t;
    memset(&t, 0, sizeof t);
    dh_tensor_clear(&t);
    dh_sample_plan_t p;
    memset(&p, 0, sizeof p);
    dh_sample_plan_clear(&p);
    assert_int_equal(dh_dtype_size(DH_DTYPE_UINT8), 1);
    assert_int_equal(dh_dtype_size(DH_DTYPE_FLOAT32), 4);
}

/* A contiguous int16 tensor named `name` of rows x cols whose element (r, c) is base + 10r + c. */
static dh_tensor_t grid(const char *name, int64_t rows, int64_t cols, int base)
{
    dh_tensor_t t = {.dtype = DH_DTYPE_INT16, .ndim = 2, .shape = {rows, cols}};
    dh_tensor_set_name(&t, name);
    dh_tensor_set_contiguous(&t);
    t.data = dh_malloc(t.nbytes ? t.nbytes : 1);
    assert_non_null(t.data);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            ((int16_t *)t.data)[r * cols + c] = (int16_t)(base + 10 * r + c);
    return t;
}

static int16_t at(const dh_tensor_t *t, int64_t r, int64_t c)
{
    return ((const int16_t *)t->data)[r * t->strides[0] + c * t->strides[1]];
}

/* dh_collate_into's allocator: hands out a buffer full of garbage (0xAB), so padding left
 * unwritten shows; or fails with DH_EAGAIN. */
typedef struct garbage {
    void *buf;
    size_t asked;
    int calls;
    bool fail;
} garbage_t;

static int garbage_alloc(void *ctx, size_t nbytes, void **data)
{
    garbage_t *g = ctx;
    g->calls++;
    g->asked = nbytes;
    if (g->fail)
        return dh__set_error(DH_EAGAIN, "test: no room for %zu bytes", nbytes);
    g->buf = dh_malloc(nbytes);
    assert_non_null(g->buf);
    memset(g->buf, 0xAB, nbytes);
    *data = g->buf;
    return 0;
}

static void collate_into_writes_the_callers_memory_as_collate_would(void **state)
{
    /* every case of dh_collate: equal sizes with shorter T, different H and W in both
     * layouts and dtypes, a failed sample, an empty one */
    for (int layout = 0; layout < 2; layout++)
        for (int dt = 0; dt < 2; dt++) {
            dh_dtype_t dtype = dt ? DH_DTYPE_FLOAT32 : DH_DTYPE_UINT8;
            dh_sample_t s[5];
            make_sample(&s[0], "a", 2, 4, 5, dtype, (dh_layout_t)layout, 0);
            make_sample(&s[1], "b", 3, 4, 5, dtype, (dh_layout_t)layout, 7);
            make_sample(&s[2], "c", 1, 2, 3, dtype, (dh_layout_t)layout, 9);
            make_failed(&s[3], "d", DH_EIO, "d: broken");
            memset(&s[4], 0, sizeof s[4]);
            s[4].id = dh_strdup("e");
            dh_batch_t *want = collate_ok(s, 5, dtype, (dh_layout_t)layout);
            garbage_t g = {0};
            dh_batch_t *got = NULL;
            assert_int_equal(
                dh_collate_into(s, 5, dtype, (dh_layout_t)layout, garbage_alloc, &g, &got), 0);
            assert_int_equal(g.calls, 1);
            assert_int_equal(g.asked, want->frames.nbytes);
            assert_ptr_equal(got->frames.data, g.buf);
            assert_true(got->frames_borrowed);
            assert_false(want->frames_borrowed);
            assert_memory_equal(got->frames.data, want->frames.data, want->frames.nbytes);
            assert_memory_equal(got->frames.shape, want->frames.shape, sizeof want->frames.shape);
            assert_memory_equal(got->mask.data, want->mask.data, want->mask.nbytes);
            assert_int_equal(got->failed, 1);
            for (int i = 0; i < 5; i++) {
                assert_int_equal(got->frame_counts[i], want->frame_counts[i]);
                assert_int_equal(got->tokens[i], want->tokens[i]);
                assert_int_equal(got->errors[i], want->errors[i]);
                assert_string_equal(got->ids[i], want->ids[i]);
            }
            dh_batch_destroy(&got); /* leaves the caller's buffer alone (ASan: no double free) */
            dh_free(g.buf);
            dh_batch_destroy(&want);
            for (int i = 0; i < 5; i++)
                dh_sample_clear(&s[i]);
        }
}

static void collate_into_returns_the_allocators_error_and_keeps_nothing(void **state)
{
    dh_sample_t s[1];
    make_sample(&s[0], "a", 2, 4, 5, DH_DTYPE_UINT8, DH_LAYOUT_TCHW, 0);
    long live = dh_alloc_live();
    garbage_t g = {.fail = true};
    dh_batch_t *b = (dh_batch_t *)&g; /* set to NULL on failure */
    assert_int_equal(dh_collate_into(s, 1, DH_DTYPE_UINT8, DH_LAYOUT_TCHW, garbage_alloc, &g, &b),
                     DH_EAGAIN);
    assert_null(b);
    assert_int_equal(g.calls, 1);
    assert_string_equal(dh_last_error(), "test: no room for 120 bytes");
    assert_int_equal(dh_alloc_live(), live);
    assert_int_equal(dh_collate_into(s, 1, DH_DTYPE_UINT8, DH_LAYOUT_TCHW, NULL, NULL, &b),
                     DH_EINVAL);
    /* an all-failed batch has no frames: the allocator is never called */
    dh_sample_t f[1];
    make_failed(&f[0], "f", DH_EIO, "f: broken");
    g = (garbage_t){0};
    assert_int_equal(dh_collate_into(f, 1, DH_DTYPE_UINT8, DH_LAYOUT_TCHW, garbage_alloc, &g, &b),
                     0);
    assert_int_equal(g.calls, 0);
    assert_null(b->frames.data);
    dh_batch_destroy(&b);
    dh_sample_clear(&f[0]);
    dh_sample_clear(&s[0]);
}

static void rows_join_parts_padding_the_other_dims(void **state)
{
    dh_tensor_t a = grid("mask", 2, 3, 100), b = grid("mask", 1, 5, 500), out;
    const dh_tensor_t *parts[] = {&a, &b};
    assert_int_equal(dh_collate_rows(parts, NULL, 2, &out, NULL), 0);
    assert_string_equal(out.name, "mask");
    assert_int_equal(out.dtype, DH_DTYPE_INT16);
    assert_int_equal(out.shape[0], 3);
    assert_int_equal(out.shape[1], 5);
    assert_int_equal(out.strides[0], 5);
    assert_int_equal(out.strides[1], 1);
    assert_int_equal(out.nbytes, 3 * 5 * 2);
    for (int64_t c = 0; c < 5; c++) {
        assert_int_equal(at(&out, 0, c), c < 3 ? 100 + c : 0); /* padded on the right */
        assert_int_equal(at(&out, 1, c), c < 3 ? 110 + c : 0);
        assert_int_equal(at(&out, 2, c), 500 + c);
    }
    dh_tensor_clear(&out);
    dh_tensor_clear(&a);
    dh_tensor_clear(&b);
}

static void rows_of_a_missing_part_are_zeros(void **state)
{
    dh_tensor_t a = grid("frames", 1, 2, 1), c = grid("frames", 1, 2, 7), out;
    const dh_tensor_t *parts[] = {NULL, &a, NULL, &c};
    const int64_t gaps[] = {2, 0, 1, 0};
    assert_int_equal(dh_collate_rows(parts, gaps, 4, &out, NULL), 0);
    assert_int_equal(out.shape[0], 5);
    const int16_t want[5][2] = {{0, 0}, {0, 0}, {1, 2}, {0, 0}, {7, 8}};
    for (int64_t r = 0; r < 5; r++)
        for (int64_t k = 0; k < 2; k++)
            assert_int_equal(at(&out, r, k), want[r][k]);
    dh_tensor_clear(&out);
    dh_tensor_clear(&a);
    dh_tensor_clear(&c);
}

static void rows_read_strided_parts(void **state)
{
    /* A view of columns 0..1 of a 2 x 4 grid: strides {4, 1}, shape {2, 2}. */
    dh_tensor_t full = grid("x", 2, 4, 10), view = full, out;
    view.shape[1] = 2;
    const dh_tensor_t *parts[] = {&view};
    assert_int_equal(dh_collate_rows(parts, NULL, 1, &out, NULL), 0);
    assert_int_equal(out.strides[0], 2);
    assert_int_equal(at(&out, 0, 1), 11);
    assert_int_equal(at(&out, 1, 0), 20);
    assert_int_equal(at(&out, 1, 1), 21);
    dh_tensor_clear(&out);
    dh_tensor_clear(&full);
}

static void rows_refuse_parts_that_disagree(void **state)
{
    dh_tensor_t a = grid("mask", 1, 2, 0), b = grid("frames", 1, 2, 0), out;
    const dh_tensor_t *parts[] = {NULL, &a, &b};
    size_t bad = 99;
    assert_int_equal(dh_collate_rows(parts, NULL, 3, &out, &bad), DH_EINVAL);
    assert_int_equal(bad, 2);
    assert_non_null(strstr(dh_last_error(), "part 2's tensor 'mask' does not match part 1's"));
    assert_null(out.data);
    b.dtype = DH_DTYPE_UINT16; /* the same name, another dtype */
    dh_tensor_set_name(&b, "mask");
    assert_int_equal(dh_collate_rows(parts, NULL, 3, &out, &bad), DH_EINVAL);
    assert_int_equal(bad, 2);
    const dh_tensor_t *none[] = {NULL, NULL};
    assert_int_equal(dh_collate_rows(none, NULL, 2, &out, &bad), DH_EINVAL);
    assert_int_equal(bad, 2);
    dh_tensor_clear(&a);
    dh_tensor_clear(&b);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(frames_are_padded_to_the_longest_with_masks),
    cmocka_unit_test(different_sizes_are_padded_bottom_right),
    cmocka_unit_test(failed_samples_keep_their_slot_and_error),
    cmocka_unit_test(all_failed_or_empty_batches_have_no_pixels),
    cmocka_unit_test(collate_survives_allocation_failure),
    cmocka_unit_test(clears_are_safe_on_zeroed_values),
    cmocka_unit_test(collate_into_writes_the_callers_memory_as_collate_would),
    cmocka_unit_test(collate_into_returns_the_allocators_error_and_keeps_nothing),
    cmocka_unit_test(rows_join_parts_padding_the_other_dims),
    cmocka_unit_test(rows_of_a_missing_part_are_zeros),
    cmocka_unit_test(rows_read_strided_parts),
    cmocka_unit_test(rows_refuse_parts_that_disagree),
};
DH_TEST_MAIN(tests)
