/* probe.h: what a video file costs, read from its container without decoding it.
 *
 * dh_media_probe reads the container's header and index (libavformat; for MP4 the moov
 * box): codec, size, frame rate, duration, frame count, bit rate, and where the keyframes
 * are. dh_decode_frames_needed then counts the frames the pipeline's decoder will decode
 * to produce a given set of sampled frames (seeking to the keyframe before each one, and
 * decoding forward when that is no farther), which is what CPU cost scales with. `datahelix
 * probe` combines the two with a per-machine calibration (docs/pipeline.md).
 */
#ifndef DATAHELIX_PROBE_H
#define DATAHELIX_PROBE_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_media_info {
    char codec[32]; /* decoder name ("h264") */
    int32_t width, height;
    double fps; /* average frame rate */
    double duration_s;
    int64_t frame_count; /* from the container's index, or duration x fps */
    int64_t bit_rate;    /* bits per second of the video stream (or the file) */
    int64_t file_bytes;
    int64_t *keyframes; /* frame indices of keyframes, ascending (dh_malloc'd; may be NULL
                         * when the container has no index: then every frame is a seek
                         * point as far as dh_decode_frames_needed knows) */
    size_t n_keyframes;
} dh_media_info_t;

/* Reads the metadata of the video file at path into *info (zeroed first). No frame is
 * decoded unless the container's header lacks the video size. Returns 0, -ENOENT and other
 * -errno (cannot open), DH_EIO (not a media file, no video stream, no decoder for its
 * codec, or a corrupt header: dh_last_error() has the path and FFmpeg's message), or
 * DH_ENOMEM. Free with dh_media_info_clear. Thread-safe. */
DH_EXTERN int dh_media_probe(const char *path, dh_media_info_t *info);

/* Frees what dh_media_probe allocated; safe on a zeroed or cleared info. */
DH_EXTERN void dh_media_info_clear(dh_media_info_t *info);

/* Frames a decoder decodes to produce frames `targets` (ascending frame indices) of a clip
 * whose keyframes are `keyframes` (ascending; keyframes[0] is normally 0): for each target,
 * it decodes forward from where it is when no keyframe lies between, else seeks to the
 * keyframe at or before the target and decodes from there. Pure, O(n_targets x
 * log n_keyframes). With no keyframes it counts every target as one decoded frame. */
DH_EXTERN int64_t dh_decode_frames_needed(const int64_t *keyframes, size_t n_keyframes,
                                          const int64_t *targets, size_t n_targets);

/* ---- probing a data set ------------------------------------------------------------ */

struct dh_manifest;
struct dh_pipeline_spec;
struct dh_profile_set;

/* Called from the calling thread as work progresses: phase is "probe", "calibrate" or
 * "check"; done of total items. */
typedef void (*dh_probe_progress_fn)(const char *phase, size_t done, size_t total, void *ctx);

typedef struct dh_probe_options {
    unsigned jobs;                /* metadata reader threads (0 = CPUs) */
    const char *calibration_path; /* NULL = dh_calibration_default_path() */
    int recalibrate;              /* time clips again even when the cache has an entry */
    unsigned clips_per_bucket;    /* clips timed per resolution bucket (0 = 3) */
    uint64_t seed;                /* which clips are timed */
    dh_probe_progress_fn progress;
    void *ctx;
} dh_probe_options_t;

typedef struct dh_probe_skip {
    size_t entry;       /* manifest entry index */
    int error;          /* its error code */
    char *message;      /* names the file and the cause */
    const char *reason; /* static: "missing", "unreadable" (not a video FFmpeg reads, or one
                         * the pipeline refuses), "too short" (fewer frames than the plan
                         * asks), "no frames" (no frame rate, size or frame count to plan) */
} dh_probe_skip_t;

typedef struct dh_probe_report {
    size_t rows;            /* rows appended */
    size_t *entry_of_row;   /* rows entries: the manifest entry of each appended row */
    dh_probe_skip_t *skips; /* every skipped entry, in manifest order */
    size_t n_skips;
    int calibration_cached;     /* 1: coefficients came from the cache */
    size_t calibration_decodes; /* clips decoded to calibrate this time */
    char calibration_path[1024];
    char machine_key[512];
} dh_probe_report_t;

/* Probes every manifest entry (container metadata only, `jobs` threads), plans it with the
 * spec, estimates its CPU cost with this machine's calibration (timing a few real decodes
 * per resolution bucket the cache lacks, then saving the cache), and appends one profile
 * row per readable entry to `out` in manifest order. A bad file is skipped and reported
 * in report->skips, never fatal. Returns 0, or DH_ENOMEM, or an error of the calibration
 * cache or of calibration itself (no clip of a bucket could be decoded is not an error:
 * the bucket keeps ratio 1). Free the report with dh_probe_report_clear. */
DH_EXTERN int dh_probe_manifest(const struct dh_manifest *manifest,
                                const struct dh_pipeline_spec *spec,
                                const dh_probe_options_t *options, struct dh_profile_set *out,
                                dh_probe_report_t *report);

DH_EXTERN void dh_probe_report_clear(dh_probe_report_t *report);

/* Accuracy check: decodes `count` rows of `rows` (chosen with seed; all when count >= rows),
 * one at a time on this thread, timing each one's CPU, and writes the median and 90th
 * percentile of |cpu_s_est - measured| / measured. entry_of_row maps rows to manifest
 * entries (from the report). Rows whose decode fails are left out. Returns 0, DH_EINVAL
 * (nothing could be decoded) or DH_ENOMEM. */
DH_EXTERN int dh_probe_check(const struct dh_manifest *manifest,
                             const struct dh_pipeline_spec *spec, const struct dh_profile_set *rows,
                             const size_t *entry_of_row, size_t count, uint64_t seed,
                             dh_probe_progress_fn progress, void *ctx, double *median_rel_err,
                             double *p90_rel_err, size_t *checked);

#ifdef __cplusplus
}
#endif
#endif
