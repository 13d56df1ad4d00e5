/* media/pipeline_internal.h: limits and cross-file internals of the pipeline (spec.c,
 * sampling.c, decode.c, collate.c), private to src/media (and its tests). What other modules
 * use is in media/media_lib.h. */
#ifndef DH_MEDIA_PIPELINE_INTERNAL_H
#define DH_MEDIA_PIPELINE_INTERNAL_H

/* Limits that keep every derived size (T x H x W x 3 x 4 bytes, index arithmetic
 * (2k + 1) x frame_count) far from overflow, and catch typos such as a width of 22400. */
#define DH_PIPELINE_MAX_FRAMES 100000
#define DH_PIPELINE_MAX_SIDE 16384
#define DH_PIPELINE_MAX_CLIP_FRAMES ((int64_t)1 << 40)

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "datahelix/pipeline.h"
#include "media/media_lib.h"

struct AVCodec;
struct AVCodecContext;
struct AVCodecParameters;
struct AVStream;
struct AVFormatContext;
struct AVPacket;

/* av_read_frame behind its fault site (fault.h, DH_FAULT_MEDIA_READ): a read error, as a
 * failing disk gives. decode.c. */
int dh__read_packet(struct AVFormatContext *fmt, struct AVPacket *pkt);

/* How many degrees clockwise a player turns the stream's picture for display, from its
 * display matrix (phone videos): 0 (none), 90, 180 or 270; -1 when the matrix mirrors the
 * picture or turns it by another angle (which the pipeline does not apply). orientation.c;
 * probe.c refuses -1. */
int dh__display_rotation(const struct AVStream *st);

/* A still image (JPEG, PNG, WebP, ...): FFmpeg reads it with an image demuxer, "image2" (by
 * file name) or "<codec>_pipe" (by content), as a stream of one frame at a nominal rate (25)
 * with no duration. */
bool dh__still_image(const struct AVFormatContext *fmt);

/* An image's orientation (JPEG's EXIF Orientation, which FFmpeg gives as the decoded frame's
 * display matrix) as dh__display_rotation gives it: for a JPEG decodes the first frame of
 * `stream` (reading packets from fmt's position); any other codec is 0 without decoding.
 * Returns 0 or an FFmpeg error. */
int dh__image_rotation(struct AVFormatContext *fmt, int stream, int *rotation);

/* For a tar member read in place (a subfile path): rewrites the thread's last error
 * "PATH: WHAT" (PATH the subfile path) as "sample ID (member NAME of shard FILE): WHAT", the
 * member's name read from its tar header (tar_member.c; a shard at a URL: one range
 * request). Then, for a URL path, its query string is taken out of the message
 * (dh__media_redact_error). Keeps the error code; returns err. */
int dh__name_tar_sample(int err, const char *path, const char *sample_id);

/* Opens a container like avformat_open_input (*fmt NULL, or allocated with its interrupt
 * callback set): a local path (subfile ranges included) through FFmpeg's protocols; an
 * http://, https:// or s3:// URL, or a subfile range of one, through range reads
 * (remote_input.c), which the interrupt callback stops. Returns 0 or an AVERROR; for a remote
 * read that failed, dh__media_remote_error gives the remote module's error. Close with
 * dh__media_close_input. */
int dh__media_open_input(struct AVFormatContext **fmt, const char *path);
void dh__media_close_input(struct AVFormatContext **fmt);

/* The code of this thread's last failed remote read since its last dh__media_open_input
 * (0: none), its message (naming the URL, the HTTP status and the byte range) put back as
 * the last error. */
int dh__media_remote_error(void);

/* Whether a remote read of this thread failed since its last dh__media_open_input. */
bool dh__media_remote_failed(void);

/* For an FFmpeg error that a failed remote read of this thread caused (EIO, ENOENT, EACCES,
 * EXIT: interrupted): the remote error's text after its URL ("HTTP 404 for bytes 0-65535
 * after 1 try"), else NULL. Thread-local, valid until the thread's next open. */
const char *dh__media_remote_message(int averr);

/* For a path that is a URL with a query string (a presigned URL's signature), or a
 * subfile range of one: every copy of the query in the thread's last error becomes "?...".
 * Keeps the code; returns err. */
int dh__media_redact_error(int err, const char *path);

/* How many frames the last dh_pipeline_decode on `pipeline` had the decoder return at or
 * before an index it had returned already (a seek back over decoded frames: what an open
 * GOP's retry does, and what a keyframe misread from the container's index cost). For
 * tests. */
int64_t dh__pipeline_redecoded(const dh_pipeline_t *pipeline);

/* Reads the clip metadata the decoder plans with (opens the file, reads the header; no
 * decoding unless the header lacks the size). Same errors as dh_pipeline_decode. For tests. */
int dh__pipeline_clip_info(const char *path, dh_clip_info_t *clip);

/* Decodes `count` requests one after the other on this thread and collates them. A bad
 * sample never fails the batch: it yields its error in the batch. Returns 0, or DH_ENOMEM
 * when the batch itself cannot be allocated. *out is the caller's (dh_batch_destroy). For
 * tests. */
int dh__pipeline_decode_batch(dh_pipeline_t *pipeline, const dh_sample_request_t *requests,
                              size_t count, dh_batch_t **out);

/* Output buffers kept for reuse (spares.c): at most DH_SPARES_MAX buffers, DH_SPARES_MAX_BYTES
 * in all, the oldest dropped first. One thread at a time (the pipeline's). */
#define DH_SPARES_MAX 8
#define DH_SPARES_MAX_BYTES ((size_t)64 << 20)
typedef struct dh__spares {
    struct {
        void *data;
        size_t cap; /* bytes usable at data */
    } buf[DH_SPARES_MAX];
    int count;
    size_t bytes; /* sum of cap */
} dh__spares_t;

/* Frees every kept buffer; the pool is empty (and may be used again). */
void dh__spares_clear(dh__spares_t *spares);

/* A buffer of at least `need` bytes: the smallest kept one that fits and is at most twice
 * `need` (taken out of the pool), else a new one (dh_malloc). Its contents are undefined.
 * NULL when out of memory. dh_free it, or hand it back with dh__spares_give. */
void *dh__spares_take(dh__spares_t *spares, size_t need);

/* Keeps `data` (from dh_malloc, `cap` usable bytes) for a later dh__spares_take; when the pool
 * is full it frees its oldest buffers, or `data` itself when that alone is over the byte cap.
 * NULL: nothing. */
void dh__spares_give(dh__spares_t *spares, void *data, size_t cap);

/* The open decoder a pipeline keeps for its next sample (decoder_reuse.c). One thread at a
 * time (the pipeline's). */
typedef struct dh__decoders {
    struct AVCodecContext *codec;  /* kept, not yet flushed; NULL: none */
    struct AVCodecParameters *par; /* the stream parameters it was opened with */
    struct {
        int num, den;
    } time_base;    /* the stream's, which the decoder's pkt_timebase is */
    bool off;       /* every sample opens its own (the default; DH_DECODER_REUSE=1: reuse) */
    int64_t opened; /* decoders opened (avcodec_open2) */
    int64_t reused; /* samples given the kept decoder */
} dh__decoders_t;

/* Empty; reads DH_DECODER_REUSE. */
void dh__decoders_init(dh__decoders_t *decoders);

/* Frees the kept decoder; `decoders` is empty (and may be used again). */
void dh__decoders_clear(dh__decoders_t *decoders);

/* An open decoder (`codec`, one thread) for stream `st`: the kept one, flushed, when `st`'s
 * parameters equal those it was opened with, else a new one. Returns 0 or an FFmpeg error
 * (nothing kept is lost). */
int dh__decoders_take(dh__decoders_t *decoders, const struct AVStream *st,
                      const struct AVCodec *codec, struct AVCodecContext **out);

/* Keeps *codec (taken for stream `st`, which it decoded without error) for a later take,
 * in place of the one kept; frees it when reuse is off. *codec is NULL after. */
void dh__decoders_give(dh__decoders_t *decoders, struct AVCodecContext **codec,
                       const struct AVStream *st);

/* The pipeline's decoder counts (for tests). */
const dh__decoders_t *dh__pipeline_decoders(const dh_pipeline_t *pipeline);

/* Turns reuse on or off for this pipeline (off frees the kept decoder). For tests. */
void dh__pipeline_set_decoder_reuse(dh_pipeline_t *pipeline, bool on);

#endif
