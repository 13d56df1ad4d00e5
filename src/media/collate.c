/* collate.c: collation of decoded samples into batches (pipeline.h, docs/pipeline.md "Collate").
 *
 * dh_collate is pure: it copies decoded samples into one B x T x ... tensor padded with
 * zeros to the batch's largest T (and H, W when sizes differ), with a B x T valid-frame
 * mask and per-sample metadata. A failed sample keeps its slot (all padding) and carries
 * its error, so one bad clip never fails a batch. Cost: one pass over the output bytes
 * (memcpy per sample when sizes match, per row when they do not). dh_collate_into writes the
 * frames into the caller's memory instead (a DataServer's arena slab), zeroing the padding
 * itself, so a batch is written once, where it is delivered from. dh_collate_rows joins
 * already collated microbatches the same way along their first dimension (the client's
 * fanout > 1). It only reads samples:
 * decoding them (decode.c) comes first and calls in here, never the other way round.
 */
#include <assert.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"
#include "core/internal.h"

void dh_batch_destroy(dh_batch_t **pbatch)
{
    if (!pbatch || !*pbatch)
        return;
    dh_batch_t *b = *pbatch;
    for (size_t i = 0; i < b->count; i++) {
        if (b->ids)
            dh_free(b->ids[i]);
        if (b->error_messages)
            dh_free(b->error_messages[i]);
    }
    if (b->frames_borrowed)
        b->frames.data = NULL; /* the caller's (dh_collate_into) */
    dh_tensor_clear(&b->frames);
    dh_tensor_clear(&b->mask);
    dh_free(b->frame_counts);
    dh_free(b->heights);
    dh_free(b->widths);
    dh_free(b->tokens);
    dh_free(b->ids);
    dh_free(b->errors);
    dh_free(b->error_messages);
    dh_free(b);
    *pbatch = NULL;
}

/* T, H, W of a decoded sample's frames; all 0 for a failed or empty one. */
static void sample_dims(const dh_sample_t *s, dh_layout_t layout, int64_t *t, int64_t *h,
                        int64_t *w)
{
    *t = *h = *w = 0;
    if (s->error != 0 || s->frames.ndim != 4 || !s->frames.data)
        return;
    *t = s->frames.shape[0];
    *h = s->frames.shape[layout == DH_LAYOUT_TCHW ? 2 : 1];
    *w = s->frames.shape[layout == DH_LAYOUT_TCHW ? 3 : 2];
}

/* Copies sample s (T x ... of its own H, W) into its slot of the batch tensor. `zeroed`: the
 * slot holds zeros already; else every byte of it is written (padding zeroed). */
static void copy_sample(const dh_sample_t *s, dh_layout_t layout, size_t esize, uint8_t *slot,
                        int64_t bt, int64_t bh, int64_t bw, bool zeroed)
{
    int64_t t, h, w;
    sample_dims(s, layout, &t, &h, &w);
    size_t frame_bytes = (size_t)(3 * bh * bw) * esize;
    const uint8_t *src = s->frames.data;
    if (h == bh && w == bw) {
        memcpy(slot, src, (size_t)t * frame_bytes);
        if (!zeroed)
            memset(slot + (size_t)t * frame_bytes, 0, (size_t)(bt - t) * frame_bytes);
        return;
    }
    if (!zeroed)
        memset(slot, 0, (size_t)bt * frame_bytes);
    /* Spatial padding at the bottom and right: copy row by row. */
    if (layout == DH_LAYOUT_TCHW) {
        for (int64_t f = 0; f < t; f++)
            for (int64_t c = 0; c < 3; c++)
                for (int64_t y = 0; y < h; y++)
                    memcpy(slot + (size_t)(((f * 3 + c) * bh + y) * bw) * esize,
                           src + (size_t)(((f * 3 + c) * h + y) * w) * esize, (size_t)w * esize);
    } else {
        for (int64_t f = 0; f < t; f++)
            for (int64_t y = 0; y < h; y++)
                memcpy(slot + (size_t)((f * bh + y) * bw * 3) * esize,
                       src + (size_t)((f * h + y) * w * 3) * esize, (size_t)(w * 3) * esize);
    }
}

static int collate(const dh_sample_t *samples, size_t count, dh_dtype_t dtype, dh_layout_t layout,
                   dh_collate_alloc_fn *alloc, void *ctx, dh_batch_t **out)
{
    *out = NULL;
    size_t esize = dh_dtype_size(dtype);
    int64_t bt = 0, bh = 0, bw = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t t, h, w;
        sample_dims(&samples[i], layout, &t, &h, &w);
        assert(t == 0 || samples[i].frames.dtype == dtype); /* one spec per batch */
        bt = t > bt ? t : bt;
        bh = h > bh ? h : bh;
        bw = w > bw ? w : bw;
    }
    dh_batch_t *b = dh_calloc(1, sizeof *b);
    if (!b)
        return dh__set_error(DH_ENOMEM, "collate: out of memory");
    size_t n = count ? count : 1;
    b->frame_counts = dh_calloc(n, sizeof *b->frame_counts);
    b->heights = dh_calloc(n, sizeof *b->heights);
    b->widths = dh_calloc(n, sizeof *b->widths);
    b->tokens = dh_calloc(n, sizeof *b->tokens);
    b->ids = dh_calloc(n, sizeof *b->ids);
    b->errors = dh_calloc(n, sizeof *b->errors);
    b->error_messages = dh_calloc(n, sizeof *b->error_messages);
    if (!b->frame_counts || !b->heights || !b->widths || !b->tokens || !b->ids || !b->errors ||
        !b->error_messages)
        goto nomem;
    b->count = count; /* from here dh_batch_destroy frees ids[i] and error_messages[i] */

    dh_tensor_t *px = &b->frames;
    dh_tensor_set_name(px, "frames");
    px->dtype = dtype;
    px->ndim = 5;
    int64_t shape_tchw[5] = {(int64_t)count, bt, 3, bh, bw};
    int64_t shape_thwc[5] = {(int64_t)count, bt, bh, bw, 3};
    memcpy(px->shape, layout == DH_LAYOUT_TCHW ? shape_tchw : shape_thwc, sizeof shape_tchw);
    dh_tensor_set_contiguous(px); /* nbytes: count x (bt x 3 x bh x bw) x esize */
    if (px->nbytes && !alloc && !(px->data = dh_calloc(px->nbytes, 1)))
        goto nomem;

    dh_tensor_t *mask = &b->mask;
    dh_tensor_set_name(mask, "mask");
    mask->dtype = DH_DTYPE_UINT8;
    mask->ndim = 2;
    mask->shape[0] = (int64_t)count;
    mask->shape[1] = bt;
    dh_tensor_set_contiguous(mask);
    if (mask->nbytes && !(mask->data = dh_calloc(mask->nbytes, 1)))
        goto nomem;

    for (size_t i = 0; i < count; i++) {
        const dh_sample_t *s = &samples[i];
        if (!(b->ids[i] = dh_strdup(s->id ? s->id : "")))
            goto nomem;
        if (s->error_message && !(b->error_messages[i] = dh_strdup(s->error_message)))
            goto nomem;
        int64_t t, h, w;
        sample_dims(s, layout, &t, &h, &w);
        b->errors[i] = s->error;
        if (s->error != 0) {
            b->failed++;
            continue;
        }
        b->frame_counts[i] = (int32_t)t;
        b->heights[i] = (int32_t)h;
        b->widths[i] = (int32_t)w;
        b->tokens[i] = s->plan.tokens;
        memset((uint8_t *)mask->data + i * (size_t)bt, 1, (size_t)t);
    }
    if (px->nbytes && alloc) { /* last: a failure above leaves nothing of the caller's */
        int rc = alloc(ctx, px->nbytes, &px->data);
        if (rc) {
            px->data = NULL;
            dh_batch_destroy(&b);
            return rc;
        }
        b->frames_borrowed = true;
    }
    size_t slot_bytes = (size_t)(bt * 3 * bh * bw) * esize;
    for (size_t i = 0; i < count && px->data; i++) {
        uint8_t *slot = (uint8_t *)px->data + i * slot_bytes;
        if (b->errors[i] == 0 && b->frame_counts[i] > 0)
            copy_sample(&samples[i], layout, esize, slot, bt, bh, bw, !alloc);
        else if (alloc)
            memset(slot, 0, slot_bytes);
    }
    *out = b;
    return 0;
nomem:
    dh_batch_destroy(&b);
    return dh__set_error(DH_ENOMEM, "collate: out of memory for a batch of %zu samples", count);
}

int dh_collate(const dh_sample_t *samples, size_t count, dh_dtype_t dtype, dh_layout_t layout,
               dh_batch_t **out)
{
    return collate(samples, count, dtype, layout, NULL, NULL, out);
}

int dh_collate_into(const dh_sample_t *samples, size_t count, dh_dtype_t dtype, dh_layout_t layout,
                    dh_collate_alloc_fn *alloc, void *ctx, dh_batch_t **out)
{
    *out = NULL;
    if (!alloc)
        return dh__set_error(DH_EINVAL, "collate: no allocator for the frames");
    return collate(samples, count, dtype, layout, alloc, ctx, out);
}

int dh_collate_rows(const dh_tensor_t *const *parts, const int64_t *gap_rows, size_t n,
                    dh_tensor_t *out, size_t *bad)
{
    memset(out, 0, sizeof *out);
    size_t ref = 0; /* the first part with a tensor: the name, dtype and rank */
    while (ref < n && !parts[ref])
        ref++;
    if (ref == n || parts[ref]->ndim < 1) {
        if (bad)
            *bad = ref;
        return dh__set_error(DH_EINVAL, "collate rows: %s",
                             ref == n ? "no part has a tensor" : "a tensor of rank 0 has no rows");
    }
    *out = *parts[ref];
    out->data = NULL;
    int64_t rows = 0;
    for (size_t k = 0; k < n; k++) {
        const dh_tensor_t *x = parts[k];
        if (!x) {
            rows += gap_rows ? gap_rows[k] : 0;
            continue;
        }
        if (x->dtype != out->dtype || x->ndim != out->ndim || strcmp(x->name, out->name) != 0) {
            if (bad)
                *bad = k;
            return dh__set_error(DH_EINVAL,
                                 "collate rows: part %zu's tensor '%s' does not match "
                                 "part %zu's",
                                 k, out->name, ref);
        }
        rows += x->shape[0];
        for (int32_t d = 1; d < out->ndim; d++)
            if (x->shape[d] > out->shape[d])
                out->shape[d] = x->shape[d];
    }
    out->shape[0] = rows;
    dh_tensor_set_contiguous(out);
    void *buf = dh_calloc(1, out->nbytes ? out->nbytes : 1);
    if (!buf)
        return dh__set_error(DH_ENOMEM, "collate rows: out of memory joining %zu parts (%zu bytes)",
                             n, out->nbytes);
    out->data = buf;
    size_t elem = dh_dtype_size(out->dtype);
    int64_t row0 = 0;
    for (size_t k = 0; k < n; k++) {
        const dh_tensor_t *x = parts[k];
        if (!x) { /* zero rows (calloc) */
            row0 += gap_rows ? gap_rows[k] : 0;
            continue;
        }
        /* Copy x's elements into out at row offset row0, dimension by dimension: the
         * innermost dimension is copied as one run. */
        size_t inner = elem * (size_t)x->shape[x->ndim - 1];
        size_t outer = 1;
        for (int32_t d = 0; d + 1 < x->ndim; d++)
            outer *= (size_t)x->shape[d];
        for (size_t i = 0; i < outer; i++) {
            size_t rem = i, src_off = 0, dst_off = (size_t)row0 * (size_t)out->strides[0] * elem;
            for (int d = (int)x->ndim - 2; d >= 0; d--) {
                size_t idx = rem % (size_t)x->shape[d];
                rem /= (size_t)x->shape[d];
                src_off += idx * (size_t)x->strides[d] * elem;
                dst_off += idx * (size_t)out->strides[d] * elem;
            }
            memcpy((char *)out->data + dst_off, (const char *)x->data + src_off, inner);
        }
        row0 += x->shape[0];
    }
    return 0;
}
