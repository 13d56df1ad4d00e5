/* pipeline.h: the native video pipeline (docs/design.md §6, docs/pipeline.md).
 *
 * read -> demux -> seek to the keyframe before each sampled frame -> decode only what is
 * needed -> resize/crop (libswscale) -> convert/normalise into the output layout -> collate
 * (pad to the batch max, with masks) -> count tokens.
 *
 * Three layers:
 *  - the spec (dh_pipeline_spec_t): a plain value, parsed from JSON;
 *  - planning (dh_pipeline_plan): PURE (no I/O, no FFmpeg): from the spec, the clip's
 *    metadata, per-sample overrides and the sample id, which frames are sampled, the output
 *    size and the visual tokens. `probe` uses it without decoding;
 *  - decoding (dh_pipeline_t, one per thread) and collation (dh_collate, pure).
 * FFmpeg types never cross this header: tensors are plain dh_tensor_t (tensor.h).
 */
#ifndef DATAHELIX_PIPELINE_H
#define DATAHELIX_PIPELINE_H

#include "datahelix/export.h"
#include "datahelix/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- spec ----------------------------------------------------------------------------- */

typedef enum {
    DH_SAMPLING_UNIFORM,       /* evenly spaced over the whole clip, deterministic */
    DH_SAMPLING_RANDOM_WINDOW, /* evenly spaced in a random window, seeded by (seed, id) */
    DH_SAMPLING_FPS,           /* frames = duration x fps, clamped and rounded (Qwen-VL) */
} dh_sampling_t;

typedef enum {
    DH_RESIZE_SHORT_SIDE_CROP, /* "short-side+center-crop": cover height x width, centre crop */
    DH_RESIZE_FIXED,           /* "fixed": scale to height x width, aspect ignored */
    DH_RESIZE_NATIVE,          /* "native": keep aspect, sides multiple of patch x merge */
} dh_resize_t;

typedef enum {
    DH_LAYOUT_TCHW,
    DH_LAYOUT_THWC,
} dh_layout_t;

/* Every field of the JSON spec (docs/pipeline.md); dh_pipeline_spec_defaults() fills it. */
typedef struct dh_pipeline_spec {
    int32_t frames; /* frames per sample (uniform, random-window) */
    dh_sampling_t sampling;
    int32_t window_stride; /* random-window: the window spans frames x stride source frames */
    bool allow_repeat;     /* a clip with fewer frames than asked repeats frames (else error) */
    dh_resize_t resize;
    int32_t height, width;          /* output size (short-side+center-crop, fixed) */
    dh_dtype_t dtype;               /* DH_DTYPE_UINT8 or DH_DTYPE_FLOAT32 */
    dh_layout_t layout;             /* channels are always RGB */
    float mean[3], std[3];          /* float32: (x/255 - mean[c]) / std[c] */
    double fps;                     /* fps sampling: sampled frames per second of video */
    int32_t min_frames, max_frames; /* fps sampling clamp */
    int64_t min_pixels, max_pixels; /* native resize clamp of height x width */
    int32_t patch_size, temporal_patch, spatial_merge; /* token formula */
    uint64_t seed;
} dh_pipeline_spec_t;

/* Fills *spec with the defaults: 16 frames, uniform, window_stride 4, no repeat,
 * short-side+center-crop 224x224, uint8, TCHW, ImageNet mean/std, fps 2.0, frames in
 * [4, 64], pixels in [3136, 200704], patch 14, temporal patch 2, merge 2, seed 0. */
DH_EXTERN void dh_pipeline_spec_defaults(dh_pipeline_spec_t *spec);

/* Parses a JSON object (text of `len` bytes, not necessarily NUL-terminated) over the
 * defaults: fields present replace the defaults. `source` names the text in messages (a
 * path, "--spec"). Returns 0, DH_EPARSE (not JSON), DH_ESCHEMA (unknown field or bad value:
 * dh_last_error() names the source and the field), DH_ENOMEM. *spec is written only on
 * success. Thread-safe. */
DH_EXTERN int dh_pipeline_spec_parse(const char *json, size_t len, const char *source,
                                     dh_pipeline_spec_t *spec);

/* dh_pipeline_spec_parse on the contents of a file. Also returns -errno (cannot open). */
DH_EXTERN int dh_pipeline_spec_load(const char *path, dh_pipeline_spec_t *spec);

/* Checks the ranges of every field (what parse checks) for a spec built in code. Returns
 * 0 or DH_EINVAL naming the field. */
DH_EXTERN int dh_pipeline_spec_check(const dh_pipeline_spec_t *spec);

/* The spec as a JSON object (every field), for logs and profile metadata. The string is
 * the caller's (dh_free); NULL when out of memory. */
DH_EXTERN char *dh_pipeline_spec_to_json(const dh_pipeline_spec_t *spec);

/* ---- planning (pure) ------------------------------------------------------------------ */

/* What the container says about a clip (probe or the decoder's demuxer). */
typedef struct dh_clip_info {
    int64_t frame_count; /* frames in the clip; 0 = unknown: estimated as duration x fps */
    double fps;          /* average frame rate (> 0) */
    double duration_s;   /* 0 = unknown: frame_count / fps */
    int32_t width, height;
} dh_clip_info_t;

/* A sample's own sampling plan (a manifest line's frames/height/width); 0 = the spec's.
 * For fps sampling a `frames` override fixes the count (spread evenly over the clip). For
 * native resize, height/width overrides replace the source size as the size to round. */
typedef struct dh_sample_overrides {
    int32_t frames, height, width;
} dh_sample_overrides_t;

typedef struct dh_sample_plan {
    int32_t frames;        /* T: number of sampled frames */
    int32_t height, width; /* output size */
    int64_t tokens;        /* visual tokens of T x height x width */
    int64_t frame_count;   /* the clip's frame count the plan was made for */
    int64_t *indices;      /* T source frame indices, non-decreasing (dh_malloc'd) */
} dh_sample_plan_t;

/* Plans one sample. `overrides` may be NULL; `sample_id` (may be NULL, = "") seeds
 * random-window together with spec->seed, so a request is reproducible. Pure and
 * deterministic. Returns 0; DH_ERANGE when the clip has fewer frames than the plan asks
 * and !spec->allow_repeat; DH_EINVAL for unusable clip metadata (no frame rate, no size,
 * no frames) or overrides out of range; DH_ENOMEM. Messages name the sample id. On success
 * plan->indices is the caller's (dh_sample_plan_clear); on failure *plan is zeroed. */
DH_EXTERN int dh_pipeline_plan(const dh_pipeline_spec_t *spec, const dh_clip_info_t *clip,
                               const dh_sample_overrides_t *overrides, const char *sample_id,
                               dh_sample_plan_t *plan);

/* Frees plan->indices and zeroes the plan. Safe on a zeroed plan. */
DH_EXTERN void dh_sample_plan_clear(dh_sample_plan_t *plan);

/* Output size of a clip of src_width x src_height under the spec's resize mode and the
 * optional overrides (pure). */
DH_EXTERN void dh_pipeline_output_size(const dh_pipeline_spec_t *spec, int32_t src_width,
                                       int32_t src_height, const dh_sample_overrides_t *overrides,
                                       int32_t *out_height, int32_t *out_width);

/* Visual tokens: ceil(T/tp) * ceil(H/p) * ceil(W/p) / merge^2 with the spec's parameters
 * (equals dh_tokens_visual() for the defaults). */
DH_EXTERN int64_t dh_pipeline_tokens(const dh_pipeline_spec_t *spec, int32_t frames, int32_t height,
                                     int32_t width);

/* ---- decoding ------------------------------------------------------------------------- */

/* One decoded sample, or one sample's error. */
typedef struct dh_sample {
    char *id;              /* copy of the request's id ("" when none) */
    int error;             /* 0, or the negative DH_E* / -errno code */
    char *error_message;   /* NULL when ok; else names the path and cause */
    dh_sample_plan_t plan; /* zeroed when the error came before planning */
    dh_tensor_t frames;    /* "frames": T x 3 x H x W (TCHW) or T x H x W x 3 (THWC), RGB */
} dh_sample_t;

/* Frees what a sample holds and zeroes it. Safe on a zeroed sample. */
DH_EXTERN void dh_sample_clear(dh_sample_t *sample);

/* A decoder with its spec and scratch (a scaler context, buffers) reused across samples.
 * One thread at a time; make one per worker thread. */
typedef struct dh_pipeline dh_pipeline_t;

/* Makes a pipeline for a spec (copied; checked with dh_pipeline_spec_check). Returns 0,
 * DH_EINVAL, DH_ENOMEM. *out is the caller's (dh_pipeline_destroy). */
DH_EXTERN int dh_pipeline_new(dh_pipeline_t **out, const dh_pipeline_spec_t *spec);

/* Frees; sets *pipeline = NULL. Safe on NULL. */
DH_EXTERN void dh_pipeline_destroy(dh_pipeline_t **pipeline);

/* The pipeline's spec (borrowed). */
DH_EXTERN const dh_pipeline_spec_t *dh_pipeline_spec(const dh_pipeline_t *pipeline);

/* Decodes one sample: opens `path`, plans (dh_pipeline_plan), seeks/decodes the sampled
 * frames on one thread, resizes and converts them into out->frames. `overrides` and
 * `sample_id` as for dh_pipeline_plan. *out is zeroed first and always filled: on error
 * out->error / out->error_message say why (also returned, and in dh_last_error()).
 * Returns 0; -ENOENT / -EACCES (cannot open: the message names the path); DH_EIO (not a
 * media file, no video stream, unsupported codec, corrupt or truncated stream: the message
 * names the path and carries FFmpeg's message); DH_ERANGE (fewer frames than asked);
 * DH_ENOMEM. The caller frees with dh_sample_clear. Never crashes on bad input. */
DH_EXTERN int dh_pipeline_decode(dh_pipeline_t *pipeline, const char *path,
                                 const dh_sample_overrides_t *overrides, const char *sample_id,
                                 dh_sample_t *out);

/* ---- batches -------------------------------------------------------------------------- */

typedef struct dh_sample_request {
    const char *id;   /* sample id (borrowed; may be NULL) */
    const char *path; /* clip path (borrowed) */
    dh_sample_overrides_t overrides;
} dh_sample_request_t;

/* A collated batch. Failed samples keep their slot: zero frames, zero mask, 0 tokens, and
 * their error. Frames are padded at the end to the batch's max T; when sizes differ,
 * frames are padded at the bottom and right to the batch's max H and max W (heights[b] and
 * widths[b] give each sample's valid region). All memory is the batch's. */
typedef struct dh_batch {
    size_t count;          /* B */
    dh_tensor_t frames;    /* "frames": B x T x 3 x H x W (TCHW) or B x T x H x W x 3 (THWC) */
    dh_tensor_t mask;      /* "mask": B x T uint8: 1 for a real frame, 0 for padding */
    int32_t *frame_counts; /* B: valid frames per sample */
    int32_t *heights;      /* B: valid rows */
    int32_t *widths;       /* B: valid columns */
    int64_t *tokens;       /* B: visual tokens per sample (0 for a failed one) */
    char **ids;            /* B: sample ids */
    int *errors;           /* B: 0 or the sample's error code */
    char **error_messages; /* B: NULL or the sample's error message */
    size_t failed;         /* number of samples with errors */
    bool frames_borrowed;  /* frames.data is the caller's (dh_collate_into): not freed */
} dh_batch_t;

/* Collates `count` samples (decoded with one spec, so one dtype and layout; failed samples
 * allowed) into a new batch. Pure. Samples are left as they were (copied, not moved).
 * Returns 0 or DH_ENOMEM (nothing is allocated then). *out is the caller's
 * (dh_batch_destroy). */
DH_EXTERN int dh_collate(const dh_sample_t *samples, size_t count, dh_dtype_t dtype,
                         dh_layout_t layout, dh_batch_t **out);

/* Where dh_collate_into puts the frames: *data = `nbytes` writable bytes; returns 0, or an
 * error code with the message set (dh__set_error), which dh_collate_into returns. */
typedef int dh_collate_alloc_fn(void *ctx, size_t nbytes, void **data);

/* dh_collate, with the frames tensor written straight into memory from `alloc` (called once,
 * with the padded batch's byte size, and not at all when the batch has no frames): every
 * byte of it is written, padding zeroed, so it need not be zeroed. The memory stays the
 * caller's: frames_borrowed is set and dh_batch_destroy leaves it alone. This saves the
 * copy of a batch that has to end up elsewhere (a DataServer's arena) and the memory of a
 * second copy. Returns 0, DH_ENOMEM, DH_EINVAL (alloc NULL) or alloc's code (nothing is
 * left allocated then, and alloc's memory, if any, was not handed out). */
DH_EXTERN int dh_collate_into(const dh_sample_t *samples, size_t count, dh_dtype_t dtype,
                              dh_layout_t layout, dh_collate_alloc_fn *alloc, void *ctx,
                              dh_batch_t **out);

/* Joins tensors along dimension 0, the collation of microbatches into one batch: out gets
 * the rows of parts[0], then of parts[1], ..., every other dimension padded with zeros at
 * its end to the largest extent among the parts. A NULL part stands for gap_rows[k] rows of
 * zeros (a microbatch with no tensors: its samples all failed); gap_rows may be NULL when no
 * part is. The parts may be strided (element strides); out is contiguous, with the first
 * non-NULL part's name and dtype. Pure. Returns 0; DH_EINVAL when a part's name, dtype or
 * ndim differs from the first non-NULL part's, or ndim is 0, or every part is NULL (*bad, if
 * not NULL, is the index of the part at fault; the message names it); DH_ENOMEM (out keeps
 * the shape and nbytes asked for, data NULL). On success out->data is a new zero-filled
 * buffer the caller owns (dh_tensor_clear). Cost: one memcpy per innermost row. */
DH_EXTERN int dh_collate_rows(const dh_tensor_t *const *parts, const int64_t *gap_rows, size_t n,
                              dh_tensor_t *out, size_t *bad);

/* Frees the batch; sets *batch = NULL. Safe on NULL. */
DH_EXTERN void dh_batch_destroy(dh_batch_t **batch);

/* "uniform", "short-side+center-crop", "TCHW"...: the JSON names (static); dtype names are
 * dh_dtype_name() (tensor.h). */
DH_EXTERN const char *dh_sampling_name(dh_sampling_t sampling);
DH_EXTERN const char *dh_resize_name(dh_resize_t resize);
DH_EXTERN const char *dh_layout_name(dh_layout_t layout);

#ifdef __cplusplus
}
#endif
#endif
