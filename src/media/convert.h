/* media/convert.h: the pipeline's frame converter (convert.c): one decoded frame (crop,
 * scale, colour, turn) into one output slot of a sample. Private to src/media: decode.c owns
 * one converter per pipeline. */
#ifndef DH_MEDIA_CONVERT_H
#define DH_MEDIA_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "datahelix/pipeline.h"

struct AVFrame;
struct SwsContext;

/* The scaler is reused while these stay the same (they do for every frame of a clip, and
 * usually across clips of one data set). */
typedef struct dh__scaler_key {
    int src_w, src_h, src_fmt, dst_w, dst_h, dst_fmt, colorspace, range;
} dh__scaler_key_t;

typedef struct dh__converter {
    dh_layout_t layout;
    dh_dtype_t dtype;
    bool crop; /* short-side+center-crop: crop the source to the output's aspect ratio */
    struct SwsContext *sws;
    dh__scaler_key_t key;
    uint8_t *scratch; /* up to two RGB frames (convert.c says which) */
    size_t scratch_cap;
    float lut[3][256]; /* float32 normalisation: (v / 255 - mean[c]) / std[c] */
} dh__converter_t;

/* Bytes past the end of an output buffer the converter may write (swscale's unscaled
 * yuv420p -> RGB24 path stores 24 bytes past a picture whose width is 8 mod 16): the
 * output tensor and the scratch are allocated this much longer. */
#define DH_CONVERT_SLACK 64

/* Sets up `c` for `spec` (the normalisation table); no allocation. */
void dh__converter_init(dh__converter_t *c, const dh_pipeline_spec_t *spec);

/* Frees the scaler and the scratch; `c` can be set up again. */
void dh__converter_clear(dh__converter_t *c);

/* Makes sure the scratch holds what converting h x w frames (turned by `rotation`) needs.
 * Returns 0 or DH_ENOMEM (no message). */
int dh__converter_reserve(dh__converter_t *c, int32_t h, int32_t w, int rotation);

/* Converts frame `f` (cropped in place: its pointers move) into output slot `slot` of `s`
 * (s->frames allocated with DH_CONVERT_SLACK bytes after its end; slots are written in
 * ascending order: the slack of one slot lands in the next, written later). `rotation`:
 * degrees clockwise the picture is turned for display. Returns 0 or an FFmpeg error. */
int dh__convert_frame(dh__converter_t *c, struct AVFrame *f, int rotation, dh_sample_t *s,
                      int32_t slot);

#endif
