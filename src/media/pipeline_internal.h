/* media/pipeline_internal.h: limits and cross-file internals of the pipeline (spec.c,
 * sampling.c, decode.c, collate.c). */
#ifndef DH_MEDIA_PIPELINE_INTERNAL_H
#define DH_MEDIA_PIPELINE_INTERNAL_H

/* Limits that keep every derived size (T x H x W x 3 x 4 bytes, index arithmetic
 * (2k + 1) x frame_count) far from overflow, and catch typos such as a width of 22400. */
#define DH_PIPELINE_MAX_FRAMES 100000
#define DH_PIPELINE_MAX_SIDE 16384
#define DH_PIPELINE_MAX_CLIP_FRAMES ((int64_t)1 << 40)

#endif
