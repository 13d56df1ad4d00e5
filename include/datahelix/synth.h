/* synth.h: synthetic video data sets (issue 3, docs/design.md §6).
 *
 * Encodes real H.264 clips in MP4 through libavcodec/libavformat, with moving, textured
 * content, so decoding them costs what decoding real video costs (a flat colour would
 * decode almost for free). A data set is a folder of clips plus DIR/manifest.jsonl, one
 * line per sample: {"id", "path" (relative to DIR), "caption", "frames", "height",
 * "width"}, where frames/height/width are the clip's sampling plan from the mix (they
 * override the pipeline spec's defaults, docs/pipeline.md).
 *
 * Not part of libdatahelix: this is the header of the datahelix_synth static library
 * (src/synth/), which the tests, the benchmarks and `datahelix synth` link; it is not
 * installed and datahelix.h does not include it.
 */
#ifndef DATAHELIX_SYNTH_H
#define DATAHELIX_SYNTH_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#include "datahelix/mix.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the B-frames of a clip are laid out (docs/synth.md "Encoder settings"). */
typedef enum dh_synth_encoding {
    DH_SYNTH_ENC_FLAT_B = 0,   /* "flat-b", the default: IBBBP..., three non-reference
                                * B-frames per reference frame (bframes=3, b-adapt=0,
                                * b-pyramid=none): 3 of 4 frames can be skipped */
    DH_SYNTH_ENC_X264_DEFAULT, /* "x264-default": x264's own B-frame defaults (bframes=3,
                                * b-adapt=1, b-pyramid=normal): the middle B of each run is a
                                * reference, so fewer frames can be skipped */
    DH_SYNTH_ENC_NO_B,         /* "no-b": I and P frames only, every frame a reference */
} dh_synth_encoding_t;

/* The encoding's name above, or NULL for a value out of range. */
DH_EXTERN const char *dh_synth_encoding_name(dh_synth_encoding_t encoding);

/* Parses one of the names above. Returns 0 or DH_EINVAL (the message lists the names). */
DH_EXTERN int dh_synth_encoding_parse(const char *name, dh_synth_encoding_t *out);

/* One clip to encode. */
typedef struct dh_synth_clip {
    int32_t width, height; /* encoded size, even numbers */
    double fps;            /* frame rate (> 0) */
    double duration_s;     /* length; frames = round(duration x fps), at least 1 */
    int32_t gop;           /* keyframe interval in frames (0 = 2 seconds' worth) */
    uint64_t seed;         /* content seed: the same seed gives the same pixels */
} dh_synth_clip_t;

/* The pixels of frame `index` of a clip (RGB24, width x height x 3 bytes into rgb), as
 * encoded before compression. Deterministic for (clip->seed, index); a moving texture
 * plus the frame index drawn as a binary code in the top rows, so tests can tell which
 * frame a decoded image is. */
DH_EXTERN void dh_synth_frame_rgb(const dh_synth_clip_t *clip, int64_t index, uint8_t *rgb);

/* Reads back the frame index drawn by dh_synth_frame_rgb from a decoded RGB24 frame of the
 * clip's size (tolerant of compression noise). Returns the index, or -1 if unreadable.
 * The code holds 16 bits (indices mod 65536) in cells of at least 8x8 pixels, each bit above
 * its complement: one row of 16 cells for widths >= 128, two rows of 8 for widths 64..127,
 * in a band 16 to 32 rows high; frames narrower than 64 or lower than the band carry no
 * code (-1). */
DH_EXTERN int64_t dh_synth_frame_index(const uint8_t *rgb, int32_t width, int32_t height);

/* Encodes one clip to `path` (MP4, H.264 via libx264 on one thread, preset ultrafast with
 * CABAC and deblocking, CRF 23, yuv420p, three non-reference B-frames per reference frame
 * (DH_SYNTH_ENC_FLAT_B), a keyframe exactly every gop frames;
 * frame i has pts i in a time base of 1/fps). Writes PATH.part and renames it to `path` when
 * complete; on failure neither is left. Sizes must be even, in [16, 8192]; fps in (0, 1000].
 * Returns 0, -errno (cannot create the file), DH_EIO (FFmpeg failed: dh_last_error() has the
 * path and FFmpeg's message), DH_EINVAL (bad size or rate; the message names the path) or
 * DH_ENOMEM. Thread-safe. Lowers FFmpeg's log level to warnings if it is at the default. */
DH_EXTERN int dh_synth_write_clip(const char *path, const dh_synth_clip_t *clip);

/* dh_synth_write_clip with the B-frames laid out as `encoding` says. Same contract, plus
 * DH_EINVAL for an encoding out of range. */
DH_EXTERN int dh_synth_write_clip_encoded(const char *path, const dh_synth_clip_t *clip,
                                          dh_synth_encoding_t encoding);

/* Progress of dh_synth_dataset: called from the calling thread after each clip. */
typedef void (*dh_synth_progress_fn)(size_t done, size_t total, void *ctx);

/* Writes `count` clips drawn from `mix` with `seed` into out_dir (created if missing), with
 * `jobs` encoder threads (0 = number of CPUs), and out_dir/manifest.jsonl. Deterministic for
 * a seed whatever `jobs` is. Returns 0 or the first error (message names the clip). */
DH_EXTERN int dh_synth_dataset(const char *out_dir, const dh_mix_t *mix, size_t count,
                               uint64_t seed, unsigned jobs, dh_synth_progress_fn progress,
                               void *ctx);

/* What a data set holds, for a closing summary. */
typedef struct dh_synth_totals {
    size_t clips;   /* clips written */
    int64_t frames; /* frames encoded, all clips */
    double video_s; /* seconds of video, all clips */
    uint64_t bytes; /* bytes of the clip files */
} dh_synth_totals_t;

/* dh_synth_dataset_write with every clip encoded with `encoding` (dh_synth_dataset_write
 * uses DH_SYNTH_ENC_FLAT_B). Same contract, plus DH_EINVAL for an encoding out of range. */
DH_EXTERN int dh_synth_dataset_encoded(const char *out_dir, const dh_mix_t *mix, size_t count,
                                       uint64_t seed, unsigned jobs, dh_synth_encoding_t encoding,
                                       dh_synth_progress_fn progress, void *ctx,
                                       dh_synth_totals_t *totals);

/* dh_synth_dataset that also fills *totals (when not NULL; zeroed first, valid on success).
 * Clip i depends only on (seed, i), so a smaller count writes a prefix of a larger one. The
 * manifest is written (to a temporary name, then renamed) only after every clip is complete,
 * and a stale manifest is removed first, so an interrupted run never leaves a manifest that
 * points at half-written clips; each clip is itself renamed into place when complete.
 * Returns 0, DH_EINVAL (empty mix or an entry with a size or rate that cannot be encoded),
 * -errno (out_dir cannot be created or written; the message names the path), or the error
 * of the lowest-numbered clip that failed (DH_EIO, DH_ENOMEM...; the message names it). */
DH_EXTERN int dh_synth_dataset_write(const char *out_dir, const dh_mix_t *mix, size_t count,
                                     uint64_t seed, unsigned jobs, dh_synth_progress_fn progress,
                                     void *ctx, dh_synth_totals_t *totals);

#ifdef __cplusplus
}
#endif
#endif
