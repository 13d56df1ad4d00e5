/* calibrate.h: the per-machine CPU cost model behind `datahelix probe` (docs/pipeline.md).
 *
 * The CPU seconds to produce one sample are modelled as
 *
 *     cpu_s = (fixed_s + s_per_decoded_px x decoded_px + s_per_output_px x output_px
 *              + s_per_byte x decoded_bytes) x ratio[bucket]
 *
 * where decoded_px = frames the decoder decodes (dh_decode_frames_needed) x source pixels,
 * output_px = sampled frames x output pixels (scaling, conversion, layout), decoded_bytes =
 * the compressed bytes of the decoded frames (entropy decoding scales with bits, so busy
 * clips cost more than calm ones of the same size), and bucket is
 * the codec and source-resolution class ("h264-480p"). The four coefficients are fitted to
 * real decodes timed on this machine, minimising the squared *relative* error, with each
 * coefficient kept >= 0; each bucket then gets the median ratio of measured to predicted
 * time of its own timed clips. The result is cached per machine (CPU model, FFmpeg version,
 * pipeline spec) in a small JSON file, so later probes need no decoding at all.
 */
#ifndef DATAHELIX_CALIBRATE_H
#define DATAHELIX_CALIBRATE_H

#include "datahelix/export.h"

#include <stddef.h>

#include "datahelix/probe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DH_CALIBRATION_MAX_BUCKETS 64

typedef struct dh_decode_features {
    double decoded_px;    /* decoded frames x source pixels */
    double output_px;     /* sampled frames x output pixels */
    double decoded_bytes; /* compressed bytes of the decoded frames */
} dh_decode_features_t;

typedef struct dh_calibration_bucket {
    char key[32];     /* "h264-480p" */
    double ratio;     /* median measured / model over this bucket's timed clips */
    unsigned samples; /* timed clips behind the ratio */
} dh_calibration_bucket_t;

typedef struct dh_calibration {
    double fixed_s;
    double s_per_decoded_px;
    double s_per_output_px;
    double s_per_byte;
    size_t n_buckets;
    dh_calibration_bucket_t buckets[DH_CALIBRATION_MAX_BUCKETS];
} dh_calibration_t;

/* The bucket of a clip: codec and the standard height class of its short side
 * (240p/360p/480p/720p/1080p/2160p). Writes a NUL-terminated key of at most size-1 bytes. */
DH_EXTERN void dh_calibration_bucket_key(const dh_media_info_t *info, char *key, size_t size);

/* Predicted CPU seconds of a sample (see the formula above); an unknown bucket has ratio 1.
 * Pure. */
DH_EXTERN double dh_calibration_predict(const dh_calibration_t *cal, const char *bucket,
                                        const dh_decode_features_t *features);

/* Fits the coefficients to n timed samples (features, bucket keys, measured CPU seconds,
 * all > 0) and sets each bucket's ratio, replacing the buckets of *cal that were timed
 * again and keeping the others. Pure. Returns 0, or DH_EINVAL for n == 0 or a
 * non-positive measurement, or DH_ERANGE when more than DH_CALIBRATION_MAX_BUCKETS buckets
 * would be needed. */
DH_EXTERN int dh_calibration_fit(const dh_decode_features_t *features, const char *const *buckets,
                                 const double *measured_s, size_t n, dh_calibration_t *cal);

/* Adds to *cal the ratios of buckets that were not timed before, keeping its coefficients
 * (used when a cached calibration meets a new resolution class). Pure. Same returns. */
DH_EXTERN int dh_calibration_add_buckets(const dh_decode_features_t *features,
                                         const char *const *buckets, const double *measured_s,
                                         size_t n, dh_calibration_t *cal);

/* 1 if the calibration has a ratio for bucket. */
DH_EXTERN int dh_calibration_has_bucket(const dh_calibration_t *cal, const char *bucket);

/* Reads the entry for machine_key from the cache file at path. Returns 0, DH_ENOENT (no
 * file, or no entry for this key), DH_EPARSE (names the file), -errno, DH_ENOMEM. */
DH_EXTERN int dh_calibration_load(const char *path, const char *machine_key, dh_calibration_t *cal);

/* Writes (adds or replaces) the entry for machine_key in the cache file at path, creating
 * its folder; other machines' entries are kept. Written to a temporary file then renamed,
 * so a reader never sees half a file. Returns 0, -errno or DH_ENOMEM. */
DH_EXTERN int dh_calibration_save(const char *path, const char *machine_key,
                                  const dh_calibration_t *cal);

/* The default cache file: $DH_CALIBRATION_CACHE, else $XDG_CACHE_HOME/datahelix/
 * calibration.json, else $HOME/.cache/datahelix/calibration.json. Writes into buf. */
DH_EXTERN void dh_calibration_default_path(char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
