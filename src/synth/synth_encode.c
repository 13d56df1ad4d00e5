/* synth_encode.c: a synthetic clip's encoding (synth.h, docs/synth.md):
 * dh_synth_write_clip_encoded renders every frame (synth_frame.c) and encodes RGB24 ->
 * yuv420p (libswscale) -> libx264 (one thread, preset ultrafast with CABAC and deblocking,
 * CRF 23, fixed GOP, B-frames as the clip's encoding says, no scene-cut keyframes) -> MP4
 * (libavformat), written to PATH.part and renamed into place. A 10 s 448x448 clip at 30 fps
 * takes about 0.8 s. The encodings' names and a clip's checks are here too.
 *
 * FFmpeg types stay inside this file.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/synth.h"
#include "core/internal.h"
#include "synth/synth_internal.h"

/* ---- limits ------------------------------------------------------------------------- */

#define SYNTH_MIN_SIDE 16    /* below this the code band and the shapes make no sense */
#define SYNTH_MAX_SIDE 8192  /* H.264 level 6.2 tops out near 8192x4320 */
#define SYNTH_MAX_FPS 1000.0 /* typo guard */
#define SYNTH_MAX_FRAMES 1000000
#define SYNTH_PRESET "ultrafast" /* see docs/synth.md "Encoder settings" for the timings */
#define SYNTH_CRF "23"           /* libx264's default quality */

/* ---- encodings ---------------------------------------------------------------------- */

static const char *const encoding_names[] = {"flat-b", "x264-default", "no-b"};

const char *dh_synth_encoding_name(dh_synth_encoding_t encoding)
{
    return (unsigned)encoding < DH_ARRAY_LEN(encoding_names) ? encoding_names[encoding] : NULL;
}

int dh_synth_encoding_parse(const char *name, dh_synth_encoding_t *out)
{
    for (size_t i = 0; name && i < DH_ARRAY_LEN(encoding_names); i++)
        if (strcmp(name, encoding_names[i]) == 0) {
            *out = (dh_synth_encoding_t)i;
            return 0;
        }
    return dh__set_error(DH_EINVAL, "encoding '%s': expected flat-b, x264-default or no-b",
                         name ? name : "(null)");
}

/* FFmpeg's libx264 wrapper logs several informational lines per clip; a data set of 200
 * clips would bury the progress output. Lower the level once, and only if the application
 * left it at FFmpeg's default. */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_quiet(void)
{
    if (av_log_get_level() == AV_LOG_INFO)
        av_log_set_level(AV_LOG_WARNING);
}

/* ---- encoding ----------------------------------------------------------------------- */

typedef struct encoder {
    const char *path; /* the final path, for messages */
    AVFormatContext *mux;
    AVCodecContext *codec;
    AVStream *stream;
    struct SwsContext *sws;
    AVFrame *yuv;
    AVPacket *packet;
} encoder_t;

/* An FFmpeg failure as our code and message. FFmpeg's own allocations do not go through
 * dh_malloc, but an out-of-memory from it is still DH_ENOMEM. */
static int av_fail(const char *path, const char *what, int averr)
{
    char msg[AV_ERROR_MAX_STRING_SIZE];
    av_strerror(averr, msg, sizeof msg);
    return dh__set_error(averr == AVERROR(ENOMEM) ? DH_ENOMEM : DH_EIO, "%s: %s: %s", path, what,
                         msg);
}

/* Frame count and keyframe interval of a valid clip, or DH_EINVAL naming the path. */
int dh__synth_clip_check(const char *path, const dh_synth_clip_t *clip, int64_t *frames, int *gop)
{
    if (clip->width < SYNTH_MIN_SIDE || clip->width > SYNTH_MAX_SIDE || clip->width % 2 ||
        clip->height < SYNTH_MIN_SIDE || clip->height > SYNTH_MAX_SIDE || clip->height % 2)
        return dh__set_error(DH_EINVAL,
                             "%s: size %dx%d: expected even numbers in [%d, %d] (yuv420p)", path,
                             (int)clip->width, (int)clip->height, SYNTH_MIN_SIDE, SYNTH_MAX_SIDE);
    if (!isfinite(clip->fps) || clip->fps <= 0 || clip->fps > SYNTH_MAX_FPS)
        return dh__set_error(DH_EINVAL, "%s: fps %g: expected a number in (0, %g]", path, clip->fps,
                             SYNTH_MAX_FPS);
    double n = round(clip->duration_s * clip->fps);
    if (!isfinite(clip->duration_s) || clip->duration_s <= 0 || n > SYNTH_MAX_FRAMES)
        return dh__set_error(DH_EINVAL, "%s: duration %g s at %g fps: expected 0 < frames <= %d",
                             path, clip->duration_s, clip->fps, SYNTH_MAX_FRAMES);
    if (clip->gop < 0)
        return dh__set_error(DH_EINVAL, "%s: gop %d: expected >= 0", path, (int)clip->gop);
    *frames = n < 1 ? 1 : (int64_t)n;
    long two_seconds = lround(2 * clip->fps);
    *gop = clip->gop > 0 ? (int)clip->gop : two_seconds < 1 ? 1 : (int)two_seconds;
    return 0;
}

/* Sets up the muxer, the encoder and the converter; opens path_part for writing. */
static int encoder_open(encoder_t *e, const char *path_part, const dh_synth_clip_t *clip, int gop,
                        dh_synth_encoding_t encoding)
{
    int rc = avformat_alloc_output_context2(&e->mux, NULL, "mp4", path_part);
    if (rc < 0)
        return av_fail(e->path, "cannot set up the mp4 muxer", rc);
    const AVCodec *x264 = avcodec_find_encoder_by_name("libx264");
    if (!x264)
        return dh__set_error(DH_EIO, "%s: FFmpeg has no libx264 encoder", e->path);
    e->codec = avcodec_alloc_context3(x264);
    e->stream = avformat_new_stream(e->mux, NULL);
    e->yuv = av_frame_alloc();
    e->packet = av_packet_alloc();
    if (!e->codec || !e->stream || !e->yuv || !e->packet)
        return av_fail(e->path, "cannot set up the encoder", AVERROR(ENOMEM));

    /* A rational rate close to fps: 25 -> 25/1, 29.97 -> 30000/1001. Frame i has pts i. */
    AVRational rate = av_d2q(clip->fps, 1001000);
    AVCodecContext *c = e->codec;
    c->width = clip->width;
    c->height = clip->height;
    c->pix_fmt = AV_PIX_FMT_YUV420P;
    c->time_base = av_inv_q(rate);
    c->framerate = rate;
    c->gop_size = gop;
    c->keyint_min = gop;
    /* Three non-reference B-frames between reference frames (IBBBPBBBP...: x264's default
     * count, without its B-pyramid), as in most H.264 found in the wild (camera and web
     * encodes): a decoder that knows which frames it needs can skip unneeded B-frames, and
     * a data set without them would hide that. */
    c->max_b_frames = 3;
    /* One thread per encoder: a data set runs one encoder per core instead, which scales
     * better than x264's frame threads on small frames and keeps the output independent of
     * the machine. */
    c->thread_count = 1;
    if (e->mux->oformat->flags & AVFMT_GLOBALHEADER)
        c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    /* Scene cuts would add keyframes off the GOP grid; the pipeline's seek cost model wants
     * keyframes exactly every `gop` frames. Ultrafast turns CABAC and the deblocking filter
     * off; they are put back (about +50% encode time) because they are a large part of what
     * decoding real H.264 costs, and decode cost is what these clips are for. */
    const char *params = "scenecut=0:cabac=1:deblock=0,0:bframes=3:b-adapt=0:b-pyramid=none";
    if (encoding == DH_SYNTH_ENC_X264_DEFAULT)
        params = "scenecut=0:cabac=1:deblock=0,0:bframes=3:b-adapt=1:b-pyramid=normal";
    else if (encoding == DH_SYNTH_ENC_NO_B) {
        params = "scenecut=0:cabac=1:deblock=0,0:bframes=0";
        c->max_b_frames = 0;
    }
    if ((rc = av_opt_set(c->priv_data, "preset", SYNTH_PRESET, 0)) < 0 ||
        (rc = av_opt_set(c->priv_data, "crf", SYNTH_CRF, 0)) < 0 ||
        (rc = av_opt_set(c->priv_data, "x264-params", params, 0)) < 0)
        return av_fail(e->path, "cannot set libx264 options", rc);
    if ((rc = avcodec_open2(c, x264, NULL)) < 0)
        return av_fail(e->path, "cannot open libx264", rc);
    if ((rc = avcodec_parameters_from_context(e->stream->codecpar, c)) < 0)
        return av_fail(e->path, "cannot set the stream parameters", rc);
    e->stream->time_base = c->time_base;
    e->stream->avg_frame_rate = rate;

    e->sws = sws_getContext(clip->width, clip->height, AV_PIX_FMT_RGB24, clip->width, clip->height,
                            AV_PIX_FMT_YUV420P, SWS_POINT, NULL, NULL, NULL);
    if (!e->sws)
        return dh__set_error(DH_EIO, "%s: cannot set up RGB24 -> yuv420p conversion", e->path);
    e->yuv->format = AV_PIX_FMT_YUV420P;
    e->yuv->width = clip->width;
    e->yuv->height = clip->height;
    if ((rc = av_frame_get_buffer(e->yuv, 0)) < 0)
        return av_fail(e->path, "cannot allocate a frame", rc);

    if ((rc = avio_open(&e->mux->pb, path_part, AVIO_FLAG_WRITE)) < 0) {
        char msg[AV_ERROR_MAX_STRING_SIZE];
        av_strerror(rc, msg, sizeof msg);
        /* AVERROR(e) is -e for system errors: those are -errno, as the header promises. */
        return dh__set_error(rc > -4096 ? rc : DH_EIO, "%s: cannot create %s: %s", e->path,
                             path_part, msg);
    }
    if ((rc = avformat_write_header(e->mux, NULL)) < 0)
        return av_fail(e->path, "cannot write the mp4 header", rc);
    return 0;
}

/* Moves every packet the encoder has ready into the muxer. */
static int encoder_drain(encoder_t *e)
{
    for (;;) {
        int rc = avcodec_receive_packet(e->codec, e->packet);
        if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF)
            return 0;
        if (rc < 0)
            return av_fail(e->path, "libx264 failed", rc);
        av_packet_rescale_ts(e->packet, e->codec->time_base, e->stream->time_base);
        e->packet->stream_index = e->stream->index;
        /* Takes the packet's reference whatever it returns. */
        if ((rc = av_interleaved_write_frame(e->mux, e->packet)) < 0)
            return av_fail(e->path, "cannot write a packet", rc);
    }
}

static int encoder_frame(encoder_t *e, const uint8_t *rgb, int64_t index)
{
    int rc = av_frame_make_writable(e->yuv);
    if (rc < 0)
        return av_fail(e->path, "cannot allocate a frame", rc);
    const uint8_t *src[1] = {rgb};
    const int src_stride[1] = {e->codec->width * 3};
    sws_scale(e->sws, src, src_stride, 0, e->codec->height, e->yuv->data, e->yuv->linesize);
    e->yuv->pts = index;
    if ((rc = avcodec_send_frame(e->codec, e->yuv)) < 0)
        return av_fail(e->path, "libx264 failed", rc);
    return encoder_drain(e);
}

static int encoder_finish(encoder_t *e)
{
    int rc = avcodec_send_frame(e->codec, NULL);
    if (rc < 0)
        return av_fail(e->path, "libx264 failed to flush", rc);
    if ((rc = encoder_drain(e)) < 0)
        return rc;
    if ((rc = av_write_trailer(e->mux)) < 0)
        return av_fail(e->path, "cannot write the mp4 index", rc);
    if ((rc = avio_closep(&e->mux->pb)) < 0)
        return av_fail(e->path, "cannot close", rc);
    return 0;
}

static void encoder_close(encoder_t *e)
{
    if (e->mux && e->mux->pb)
        avio_closep(&e->mux->pb);
    avformat_free_context(e->mux);
    avcodec_free_context(&e->codec);
    sws_freeContext(e->sws);
    av_frame_free(&e->yuv);
    av_packet_free(&e->packet);
}

int dh_synth_write_clip(const char *path, const dh_synth_clip_t *clip)
{
    return dh_synth_write_clip_encoded(path, clip, DH_SYNTH_ENC_FLAT_B);
}

int dh_synth_write_clip_encoded(const char *path, const dh_synth_clip_t *clip,
                                dh_synth_encoding_t encoding)
{
    assert(path && clip);
    if (!dh_synth_encoding_name(encoding))
        return dh__set_error(DH_EINVAL, "%s: encoding %d: expected a dh_synth_encoding_t", path,
                             (int)encoding);
    int64_t frames = 0;
    int gop = 0;
    int rc = dh__synth_clip_check(path, clip, &frames, &gop);
    if (rc < 0)
        return rc;
    pthread_once(&log_once, log_quiet);

    /* Written under PATH.part and renamed when complete, so a reader (or an interrupted
     * data set) never sees a half-written clip under the real name. */
    size_t path_len = strlen(path);
    char *path_part = dh_malloc(path_len + sizeof ".part");
    /* libswscale's SIMD readers may read up to 16 bytes past the last pixel: padding. */
    uint8_t *rgb = dh_malloc((size_t)clip->width * clip->height * 3 + 64);
    encoder_t e = {.path = path};
    if (!path_part || !rgb) {
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory for a %dx%d frame", path, (int)clip->width,
                           (int)clip->height);
        goto out;
    }
    memcpy(path_part, path, path_len);
    memcpy(path_part + path_len, ".part", sizeof ".part");
    if ((rc = encoder_open(&e, path_part, clip, gop, encoding)) < 0)
        goto out;
    for (int64_t i = 0; i < frames; i++) {
        dh_synth_frame_rgb(clip, i, rgb);
        if ((rc = encoder_frame(&e, rgb, i)) < 0)
            goto out;
    }
    if ((rc = encoder_finish(&e)) < 0)
        goto out;
    if (rename(path_part, path) != 0)
        rc = dh__set_error(-errno, "%s: cannot rename %s into place: %s", path, path_part,
                           strerror(errno));
out:
    encoder_close(&e);
    if (rc < 0 && path_part)
        unlink(path_part); /* whatever stage failed; ENOENT when it was never created */
    dh_free(path_part);
    dh_free(rgb);
    return rc;
}
