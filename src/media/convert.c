/* convert.c: turns one decoded frame into one output slot of a pipeline sample
 * (convert.h, docs/pipeline.md "Resize" and "Decode strategy" step 6): the centre crop (by
 * moving the frame's plane pointers), the scale and colour conversion (libswscale, bilinear,
 * one cached scaler), the display turn, and the output's layout and dtype.
 *
 * Two swscale paths, chosen from the sizes alone (never the layout, so TCHW and THWC hold
 * the same values):
 * - packed: the kept region is already the output size (no scaling: synth and most curated
 *   data sets store clips at their training size), 4:2:0, width a multiple of 8, even height,
 *   no turn. swscale's unscaled yuv420p -> RGB24 converter (SIMD) writes packed RGB, straight
 *   into THWC uint8 output; TCHW and float32 read it from the scratch. 0.067 ms for a
 *   448x448 frame on one core, against 0.38 ms for the planar path below (plus 0.2 ms for the
 *   interleave THWC needed after it); the same conversion PyAV's and the ffmpeg CLI's
 *   rgb24 output use. Chroma is not interpolated horizontally (each pair of pixels shares
 *   its chroma sample). It writes 24 bytes past the picture when the width is 8 mod 16
 *   (DH_CONVERT_SLACK); it leaves the last width mod 8 columns unwritten, hence the width
 *   rule (FFmpeg 5.1's x86 code, measured).
 * - planar: everything else. Bilinear to planar RGB (GBRP, which swscale always
 *   interpolates with full chroma), straight into TCHW uint8 output; THWC and float32 go
 *   through the scratch. Faster than packed RGB24 when scaling (0.37 vs 0.60 ms for 448x448 ->
 *   400x400), and swscale's unscaled packed path is avoided where it would be wrong.
 */
#include <math.h>
#include <string.h>

#include <libavutil/frame.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "media/convert.h"

/* No SWS_ACCURATE_RND: it disables the SIMD unscaled yuv420p -> RGB24 converter (and makes
 * no difference to the planar path's time); SWS_FULL_CHR_H_INT is implied for GBRP. */
#define SCALER_FLAGS SWS_BILINEAR

void dh__converter_init(dh__converter_t *c, const dh_pipeline_spec_t *spec)
{
    memset(c, 0, sizeof *c);
    c->layout = spec->layout;
    c->dtype = spec->dtype;
    c->crop = spec->resize == DH_RESIZE_SHORT_SIDE_CROP;
    for (int ch = 0; ch < 3; ch++)
        for (int v = 0; v < 256; v++)
            c->lut[ch][v] = (float)(((double)v / 255.0 - spec->mean[ch]) / spec->std[ch]);
}

void dh__converter_clear(dh__converter_t *c)
{
    sws_freeContext(c->sws);
    c->sws = NULL;
    dh_free(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
}

int dh__converter_reserve(dh__converter_t *c, int32_t h, int32_t w, int rotation)
{
    /* one RGB frame (scaled or converted), and the turned one of a rotated picture */
    size_t need = (rotation ? 2u : 1u) * 3u * (size_t)h * (size_t)w + DH_CONVERT_SLACK;
    if (c->scratch_cap >= need)
        return 0;
    uint8_t *scratch = dh_malloc(need);
    if (!scratch)
        return DH_ENOMEM;
    dh_free(c->scratch);
    c->scratch = scratch;
    c->scratch_cap = need;
    return 0;
}

static int scaler_get(dh__converter_t *c, const dh__scaler_key_t *key)
{
    if (c->sws && memcmp(&c->key, key, sizeof *key) == 0)
        return 0;
    sws_freeContext(c->sws);
    c->sws = sws_getContext(key->src_w, key->src_h, key->src_fmt, key->dst_w, key->dst_h,
                            key->dst_fmt, SCALER_FLAGS, NULL, NULL, NULL);
    if (!c->sws)
        return AVERROR(EINVAL);
    c->key = *key;
    /* The source's colour matrix and range (BT.601 limited when unspecified), RGB out full
     * range. */
    int cs = key->colorspace == AVCOL_SPC_UNSPECIFIED ? SWS_CS_DEFAULT : key->colorspace;
    const int *coeffs = sws_getCoefficients(cs);
    int src_full = key->range == AVCOL_RANGE_JPEG;
    sws_setColorspaceDetails(c->sws, coeffs, src_full, sws_getCoefficients(SWS_CS_DEFAULT), 1, 0,
                             1 << 16, 1 << 16);
    return 0;
}

/* Crops the decoded frame in place (pointer moves, no copy) to the centre region that
 * short-side+center-crop keeps: the largest region of the output's aspect ratio. */
static void crop_for_output(AVFrame *f, int32_t out_h, int32_t out_w)
{
    const AVPixFmtDescriptor *desc = av_pix_fmt_desc_get(f->format);
    double scale = fmax((double)out_h / f->height, (double)out_w / f->width);
    int crop_w = (int)lrint(out_w / scale), crop_h = (int)lrint(out_h / scale);
    crop_w = crop_w < 1 ? 1 : crop_w > f->width ? f->width : crop_w;
    crop_h = crop_h < 1 ? 1 : crop_h > f->height ? f->height : crop_h;
    int x0 = (f->width - crop_w) / 2, y0 = (f->height - crop_h) / 2;
    /* Keep chroma planes aligned with luma: offsets on whole chroma samples. */
    if (desc) {
        x0 &= ~((1 << desc->log2_chroma_w) - 1);
        y0 &= ~((1 << desc->log2_chroma_h) - 1);
    }
    if (x0 == 0 && y0 == 0 && crop_w == f->width && crop_h == f->height)
        return;
    f->crop_left = (size_t)x0;
    f->crop_top = (size_t)y0;
    f->crop_right = (size_t)(f->width - x0 - crop_w);
    f->crop_bottom = (size_t)(f->height - y0 - crop_h);
    av_frame_apply_cropping(f, AV_FRAME_CROP_UNALIGNED);
}

/* Turns one plane of ch x cw bytes by `rotation` degrees clockwise into `dst` (cw x ch for a
 * quarter turn, else ch x cw): what a player does with the stream's display matrix. */
static void turn_plane(const uint8_t *src, int32_t ch, int32_t cw, int rotation, uint8_t *dst)
{
    if (rotation == 90) { /* dst is cw rows of ch: dst[y][x] = src[ch - 1 - x][y] */
        for (int32_t y = 0; y < cw; y++)
            for (int32_t x = 0; x < ch; x++)
                dst[(size_t)y * ch + x] = src[(size_t)(ch - 1 - x) * cw + y];
    } else if (rotation == 270) { /* dst[y][x] = src[x][cw - 1 - y] */
        for (int32_t y = 0; y < cw; y++)
            for (int32_t x = 0; x < ch; x++)
                dst[(size_t)y * ch + x] = src[(size_t)x * cw + (cw - 1 - y)];
    } else { /* 180: dst[y][x] = src[ch - 1 - y][cw - 1 - x] */
        size_t n = (size_t)ch * cw;
        for (size_t i = 0; i < n; i++)
            dst[i] = src[n - 1 - i];
    }
}

/* The packed path's rule (the file's first comment): no scaling, 4:2:0, width a multiple
 * of 8, even height, no turn. */
static bool packed_path(const AVFrame *f, int32_t h, int32_t w, int rotation)
{
    bool yuv420 = f->format == AV_PIX_FMT_YUV420P || f->format == AV_PIX_FMT_YUVJ420P;
    return yuv420 && rotation == 0 && f->width == w && f->height == h && w % 8 == 0 && h % 2 == 0;
}

/* Writes packed RGB `rgb` (plane pixels) into slot `slot` of a TCHW uint8 or a float32
 * output. */
static void from_packed(const dh__converter_t *c, const uint8_t *rgb, size_t plane, dh_sample_t *s,
                        int32_t slot)
{
    if (c->dtype == DH_DTYPE_UINT8) { /* TCHW */
        uint8_t *out = (uint8_t *)s->frames.data + (size_t)slot * plane * 3;
        for (size_t i = 0; i < plane; i++) {
            out[i] = rgb[3 * i];
            out[plane + i] = rgb[3 * i + 1];
            out[2 * plane + i] = rgb[3 * i + 2];
        }
        return;
    }
    float *out = (float *)s->frames.data + (size_t)slot * plane * 3;
    const float *lr = c->lut[0], *lg = c->lut[1], *lb = c->lut[2];
    if (c->layout == DH_LAYOUT_TCHW) {
        for (size_t i = 0; i < plane; i++) {
            out[i] = lr[rgb[3 * i]];
            out[plane + i] = lg[rgb[3 * i + 1]];
            out[2 * plane + i] = lb[rgb[3 * i + 2]];
        }
    } else {
        for (size_t i = 0; i < 3 * plane; i += 3) {
            out[i] = lr[rgb[i]];
            out[i + 1] = lg[rgb[i + 1]];
            out[i + 2] = lb[rgb[i + 2]];
        }
    }
}

/* Writes planar RGB planes r, g, b into slot `slot` of a THWC uint8 or a float32 output. */
static void from_planar(const dh__converter_t *c, const uint8_t *rgb, size_t plane, dh_sample_t *s,
                        int32_t slot)
{
    const uint8_t *r = rgb, *g = rgb + plane, *b = rgb + 2 * plane;
    if (c->dtype == DH_DTYPE_UINT8) { /* THWC */
        uint8_t *out = (uint8_t *)s->frames.data + (size_t)slot * plane * 3;
        for (size_t i = 0; i < plane; i++) {
            out[3 * i] = r[i];
            out[3 * i + 1] = g[i];
            out[3 * i + 2] = b[i];
        }
        return;
    }
    float *out = (float *)s->frames.data + (size_t)slot * plane * 3;
    const float *lr = c->lut[0], *lg = c->lut[1], *lb = c->lut[2];
    if (c->layout == DH_LAYOUT_TCHW) {
        for (size_t i = 0; i < plane; i++)
            out[i] = lr[r[i]];
        for (size_t i = 0; i < plane; i++)
            out[plane + i] = lg[g[i]];
        for (size_t i = 0; i < plane; i++)
            out[2 * plane + i] = lb[b[i]];
    } else {
        for (size_t i = 0; i < plane; i++) {
            out[3 * i] = lr[r[i]];
            out[3 * i + 1] = lg[g[i]];
            out[3 * i + 2] = lb[b[i]];
        }
    }
}

int dh__convert_frame(dh__converter_t *c, AVFrame *f, int rotation, dh_sample_t *s, int32_t slot)
{
    int32_t h = s->plan.height, w = s->plan.width;
    size_t plane = (size_t)h * (size_t)w;
    uint8_t *slot_bytes = (uint8_t *)s->frames.data + (size_t)slot * plane * 3;
    /* A turned picture is cropped and scaled as coded (a quarter turn swaps the output's
     * sides there), then turned into the output's planes. */
    bool quarter = rotation == 90 || rotation == 270;
    int32_t ch = quarter ? w : h, cw = quarter ? h : w;
    if (c->crop)
        crop_for_output(f, ch, cw);
    bool packed = packed_path(f, ch, cw, rotation);
    dh__scaler_key_t key = {f->width,
                            f->height,
                            f->format,
                            cw,
                            ch,
                            packed ? AV_PIX_FMT_RGB24 : AV_PIX_FMT_GBRP,
                            f->colorspace,
                            f->color_range};
    int averr = scaler_get(c, &key);
    if (averr < 0)
        return averr;
    bool thwc_u8 = c->dtype == DH_DTYPE_UINT8 && c->layout == DH_LAYOUT_THWC;
    bool tchw_u8 = c->dtype == DH_DTYPE_UINT8 && c->layout == DH_LAYOUT_TCHW;
    const uint8_t *const *src = (const uint8_t *const *)f->data;
    if (packed) {
        uint8_t *rgb = thwc_u8 ? slot_bytes : c->scratch;
        uint8_t *dst[4] = {rgb, NULL, NULL, NULL};
        int dst_stride[4] = {3 * cw, 0, 0, 0};
        int rows = sws_scale(c->sws, src, f->linesize, 0, f->height, dst, dst_stride);
        if (rows != ch)
            return rows < 0 ? rows : AVERROR_EXTERNAL;
        if (!thwc_u8)
            from_packed(c, rgb, plane, s, slot);
        return 0;
    }
    uint8_t *rgb = rotation || !tchw_u8 ? c->scratch : slot_bytes;
    /* GBRP's planes are G, B, R; pointing them into R, G, B order gives RGB planes. */
    uint8_t *dst[4] = {rgb + plane, rgb + 2 * plane, rgb, NULL};
    int dst_stride[4] = {cw, cw, cw, 0};
    int rows = sws_scale(c->sws, src, f->linesize, 0, f->height, dst, dst_stride);
    if (rows != ch)
        return rows < 0 ? rows : AVERROR_EXTERNAL;
    if (rotation) {
        uint8_t *turned = tchw_u8 ? slot_bytes : c->scratch + 3 * plane;
        for (int k = 0; k < 3; k++)
            turn_plane(rgb + (size_t)k * plane, ch, cw, rotation, turned + (size_t)k * plane);
        rgb = turned;
    }
    if (!tchw_u8)
        from_planar(c, rgb, plane, s, slot);
    return 0;
}
