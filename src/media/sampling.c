/* sampling.c: pure planning of a pipeline sample (pipeline.h, docs/pipeline.md).
 *
 * From the spec, the clip's metadata, the sample's overrides and its id: which source
 * frames are sampled, the output size, and the visual tokens. No I/O and no FFmpeg, so
 * `probe` and the scheduler can plan without decoding; the decoder runs the same code, so
 * the two never disagree. Everything is O(frames).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"
#include "datahelix/rng.h"
#include "core/internal.h"
#include "media/pipeline_internal.h"

/* FNV-1a over the id: a stable 64-bit key for seeding random-window per sample. */
static uint64_t id_hash(const char *id)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)(id ? id : ""); *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

static int64_t round_to(double x, int64_t factor)
{
    /* Python's round() is round-half-even, as is nearbyint() in the default mode: Qwen2-VL's
     * smart_resize rounds with it, and we want the same sizes. */
    return (int64_t)nearbyint(x / (double)factor) * factor;
}

static int64_t floor_to(double x, int64_t factor)
{
    return (int64_t)floor(x / (double)factor) * factor;
}

static int64_t ceil_to(double x, int64_t factor)
{
    return (int64_t)ceil(x / (double)factor) * factor;
}

static int64_t max_i64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Qwen2-VL's smart_resize: each side a multiple of factor (at least factor), the pixel
 * count within [min_pixels, max_pixels], the aspect ratio kept as closely as that allows. */
static void smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                         int64_t max_pixels, int32_t *out_h, int32_t *out_w)
{
    int64_t h = max_i64(factor, round_to((double)height, factor));
    int64_t w = max_i64(factor, round_to((double)width, factor));
    double area = (double)height * (double)width;
    if ((double)h * (double)w > (double)max_pixels) {
        double beta = sqrt(area / (double)max_pixels);
        h = max_i64(factor, floor_to((double)height / beta, factor));
        w = max_i64(factor, floor_to((double)width / beta, factor));
    } else if ((double)h * (double)w < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / area);
        h = ceil_to((double)height * beta, factor);
        w = ceil_to((double)width * beta, factor);
    }
    *out_h = (int32_t)(h > DH_PIPELINE_MAX_SIDE ? floor_to(DH_PIPELINE_MAX_SIDE, factor) : h);
    *out_w = (int32_t)(w > DH_PIPELINE_MAX_SIDE ? floor_to(DH_PIPELINE_MAX_SIDE, factor) : w);
}

void dh_pipeline_output_size(const dh_pipeline_spec_t *spec, int32_t src_width, int32_t src_height,
                             const dh_sample_overrides_t *overrides, int32_t *out_height,
                             int32_t *out_width)
{
    int32_t oh = overrides ? overrides->height : 0, ow = overrides ? overrides->width : 0;
    if (spec->resize == DH_RESIZE_NATIVE) {
        int64_t h = oh > 0 ? oh : src_height, w = ow > 0 ? ow : src_width;
        int64_t factor = (int64_t)spec->patch_size * spec->spatial_merge;
        smart_resize(h > 0 ? h : 1, w > 0 ? w : 1, factor, spec->min_pixels, spec->max_pixels,
                     out_height, out_width);
        return;
    }
    *out_height = oh > 0 ? oh : spec->height;
    *out_width = ow > 0 ? ow : spec->width;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

int64_t dh_pipeline_tokens(const dh_pipeline_spec_t *spec, int32_t frames, int32_t height,
                           int32_t width)
{
    int64_t merge = spec->spatial_merge;
    return ceil_div(frames, spec->temporal_patch) * ceil_div(height, spec->patch_size) *
           ceil_div(width, spec->patch_size) / (merge * merge);
}

/* The number of frames a sample asks for. */
static int32_t frames_asked(const dh_pipeline_spec_t *spec, double duration_s, int32_t override)
{
    if (override > 0)
        return override;
    if (spec->sampling != DH_SAMPLING_FPS)
        return spec->frames;
    /* As Qwen2-VL's smart_nframes: duration x rate, clamped to [min, max] rounded inwards to
     * multiples of the temporal patch, then rounded to a multiple of the temporal patch. */
    int64_t tp = spec->temporal_patch;
    int64_t lo = ceil_to(spec->min_frames, tp), hi = floor_to(spec->max_frames, tp);
    if (hi < lo)
        hi = lo;
    int64_t n = round_to(duration_s * spec->fps, tp);
    n = n < lo ? lo : n > hi ? hi : n;
    return (int32_t)n;
}

/* Frame k of `count` spread evenly over `span` frames: the middle of the k-th of `count`
 * equal segments, floor((2k + 1) * span / (2 * count)). Strictly increasing when span >=
 * count; repeats frames (non-decreasing) when span < count. */
static void spread(int64_t *indices, int32_t count, int64_t start, int64_t span)
{
    for (int32_t k = 0; k < count; k++)
        indices[k] = start + (2 * (int64_t)k + 1) * span / (2 * (int64_t)count);
}

int dh_pipeline_plan(const dh_pipeline_spec_t *spec, const dh_clip_info_t *clip,
                     const dh_sample_overrides_t *overrides, const char *sample_id,
                     dh_sample_plan_t *plan)
{
    memset(plan, 0, sizeof *plan);
    const char *id = sample_id ? sample_id : "";
    dh_sample_overrides_t ovr = overrides ? *overrides : (dh_sample_overrides_t){0, 0, 0};
    if (ovr.frames < 0 || ovr.frames > DH_PIPELINE_MAX_FRAMES || ovr.height < 0 ||
        ovr.height > DH_PIPELINE_MAX_SIDE || ovr.width < 0 || ovr.width > DH_PIPELINE_MAX_SIDE)
        return dh__set_error(DH_EINVAL,
                             "sample '%s': overrides frames=%d height=%d width=%d out of range "
                             "(frames <= %d, sides <= %d)",
                             id, (int)ovr.frames, (int)ovr.height, (int)ovr.width,
                             DH_PIPELINE_MAX_FRAMES, DH_PIPELINE_MAX_SIDE);
    if (!(clip->fps > 0) || !isfinite(clip->fps))
        return dh__set_error(DH_EINVAL, "sample '%s': the clip has no frame rate", id);
    if (clip->width <= 0 || clip->height <= 0)
        return dh__set_error(DH_EINVAL, "sample '%s': the clip has no size (%dx%d)", id,
                             (int)clip->width, (int)clip->height);
    double duration = clip->duration_s;
    int64_t count = clip->frame_count;
    if (count <= 0 && isfinite(duration) && duration > 0)
        count = (int64_t)llround(duration * clip->fps);
    if (count <= 0 || count > DH_PIPELINE_MAX_CLIP_FRAMES)
        return dh__set_error(DH_EINVAL,
                             "sample '%s': the clip has no frames (frame count %lld, "
                             "duration %.3f s)",
                             id, (long long)clip->frame_count, clip->duration_s);
    if (!(duration > 0) || !isfinite(duration))
        duration = (double)count / clip->fps;

    int32_t frames = frames_asked(spec, duration, ovr.frames);
    if (frames > count && !spec->allow_repeat)
        return dh__set_error(DH_ERANGE,
                             "sample '%s': the clip has %lld frames, the plan asks for %d "
                             "(set \"allow_repeat\": true to repeat frames)",
                             id, (long long)count, (int)frames);
    int64_t *indices = dh_calloc((size_t)frames, sizeof *indices);
    if (!indices)
        return dh__set_error(DH_ENOMEM, "sample '%s': out of memory", id);

    if (spec->sampling == DH_SAMPLING_RANDOM_WINDOW) {
        int64_t span = (int64_t)frames * spec->window_stride;
        if (span > count)
            span = count;
        dh_rng_t rng;
        dh_rng_seed(&rng, dh_rng_mix(spec->seed, id_hash(id)));
        int64_t start = (int64_t)dh_rng_below(&rng, (uint64_t)(count - span + 1));
        spread(indices, frames, start, span);
    } else {
        spread(indices, frames, 0, count);
    }

    dh_pipeline_output_size(spec, clip->width, clip->height, &ovr, &plan->height, &plan->width);
    plan->frames = frames;
    plan->frame_count = count;
    plan->indices = indices;
    plan->tokens = dh_pipeline_tokens(spec, frames, plan->height, plan->width);
    return 0;
}

void dh_sample_plan_clear(dh_sample_plan_t *plan)
{
    if (!plan)
        return;
    dh_free(plan->indices);
    memset(plan, 0, sizeof *plan);
}
