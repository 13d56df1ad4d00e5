/* decode.c: decodes one pipeline sample (pipeline.h, docs/pipeline.md "Decode strategy").
 *
 * Per sample: open the file once, read the container header (the stream info probe only
 * when the header lacks the size or rate), plan the sample (sampling.c), then for each
 * sampled frame either decode forward, or, when a keyframe lies between the decoder's
 * position and the target (the container's index; without one, when the target is more
 * than a GOP ahead), seek to the keyframe at or before the target and decode forward. Only
 * sampled frames are converted (convert.c); non-reference frames that are not sampled are
 * not even decoded (skip_frame = AVDISCARD_NONREF for their packets).
 *
 * One decoder thread (thread_count = 1): the data server runs many samples in parallel,
 * which scales better; with DH_DECODER_REUSE=1 the last sample's decoder, flushed, when the
 * stream's parameters match (decoder_reuse.c). Frame index <-> pts: the time base and average frame
 * rate (constant rate), or a table of every frame's pts (variable rate). dh__pipeline_decode_batch
 * decodes a request list and hands the samples to dh_collate (collate.c).
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/log.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/pipeline.h"
#include "core/internal.h"
#include "media/convert.h"
#include "media/media_lib.h"
#include "media/pipeline_internal.h"

struct dh_pipeline {
    dh_pipeline_spec_t spec;
    dh__converter_t converter; /* its scaler and scratch are reused across samples */
    dh__spares_t spares;       /* output buffers handed back (dh__pipeline_recycle) */
    dh__decoders_t decoders;   /* the decoder of the last sample, for the next (decoder_reuse.c) */
    int64_t redecoded;         /* of the last sample: dh__pipeline_redecoded */
};

/* One open clip. */
typedef struct decoder {
    const char *path;
    AVFormatContext *fmt;
    AVCodecContext *codec;
    AVStream *st;
    AVPacket *pkt;
    AVFrame *frame;
    int stream;
    AVRational rate;       /* frames per second */
    int64_t start_pts;     /* pts of frame 0 */
    bool draining;         /* end of file reached, the decoder is being flushed */
    const int64_t *wanted; /* sampled indices (ascending), for skip_frame decisions */
    int32_t n_wanted;
    int64_t *pts_table; /* variable frame rate: every frame's pts, ascending (frame k is
                         * pts_table[k]); NULL for a constant rate */
    int64_t n_pts;
    int rotation; /* degrees clockwise the picture is turned for display (0, 90, 180, 270):
                   * the stream's display matrix, an image's EXIF orientation */
    bool still;   /* a still image: one frame */
} decoder_t;

/* ---- pipeline objects ------------------------------------------------------------------ */

int dh_pipeline_new(dh_pipeline_t **out, const dh_pipeline_spec_t *spec)
{
    *out = NULL;
    int rc = dh_pipeline_spec_check(spec);
    if (rc < 0)
        return rc;
    dh_pipeline_t *p = dh_calloc(1, sizeof *p);
    if (!p)
        return dh__set_error(DH_ENOMEM, "pipeline: out of memory");
    p->spec = *spec;
    dh__converter_init(&p->converter, spec);
    dh__decoders_init(&p->decoders);
    *out = p;
    return 0;
}

void dh_pipeline_destroy(dh_pipeline_t **pp)
{
    if (!pp || !*pp)
        return;
    dh__converter_clear(&(*pp)->converter);
    dh__spares_clear(&(*pp)->spares);
    dh__decoders_clear(&(*pp)->decoders);
    dh_free(*pp);
    *pp = NULL;
}

int64_t dh__pipeline_redecoded(const dh_pipeline_t *pipeline)
{
    return pipeline->redecoded;
}

const dh__decoders_t *dh__pipeline_decoders(const dh_pipeline_t *pipeline)
{
    return &pipeline->decoders;
}

void dh__pipeline_set_decoder_reuse(dh_pipeline_t *pipeline, bool on)
{
    pipeline->decoders.off = !on;
    if (!on)
        dh__decoders_clear(&pipeline->decoders);
}

const dh_pipeline_spec_t *dh_pipeline_spec(const dh_pipeline_t *pipeline)
{
    return &pipeline->spec;
}

/* ---- opening ----------------------------------------------------------------------------- */

static const char *av_message(int averr, char *buf, size_t size)
{
    const char *remote = dh__media_remote_message(averr); /* URL, HTTP status, byte range */
    if (remote)
        return remote;
    if (av_strerror(averr, buf, size) < 0)
        snprintf(buf, size, "FFmpeg error %d", averr);
    return buf;
}

/* Our code for an FFmpeg error: system errors we name stay -errno, the rest is DH_EIO. */
static int code_of(int averr)
{
    if (averr == AVERROR(ENOMEM))
        return DH_ENOMEM;
    if (averr == AVERROR(ENOENT) || averr == AVERROR(EACCES))
        return averr; /* AVERROR(e) is -e */
    return DH_EIO;
}

int dh__read_packet(AVFormatContext *fmt, AVPacket *pkt)
{
    return DH_FAULT(DH_FAULT_MEDIA_READ) ? AVERROR(EIO) : av_read_frame(fmt, pkt);
}

static void decoder_close(decoder_t *d)
{
    avcodec_free_context(&d->codec);
    dh__media_close_input(&d->fmt);
    av_packet_free(&d->pkt);
    av_frame_free(&d->frame);
    dh_free(d->pts_table);
    d->pts_table = NULL;
}

static bool header_is_enough(const AVStream *st)
{
    const AVCodecParameters *par = st->codecpar;
    bool has_rate = (st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0) ||
                    (st->r_frame_rate.num > 0 && st->r_frame_rate.den > 0);
    bool has_length = st->nb_frames > 0 || st->duration > 0;
    return par->codec_id != AV_CODEC_ID_NONE && par->width > 0 && par->height > 0 && has_rate &&
           has_length;
}

/* Errors are reported through dh_last_error() with FFmpeg's message; FFmpeg's own log lines
 * would only repeat them, many times per corrupt file (probe.c does the same). Once, so
 * worker threads opening clips do not race on FFmpeg's global log level. */
static pthread_once_t quiet_once = PTHREAD_ONCE_INIT;

static void quiet_ffmpeg(void)
{
    av_log_set_level(AV_LOG_QUIET);
}

/* When opening failed: the container format the file's first bytes look like (by content,
 * not by its name), or NULL. Tells a truncated MP4 from a text file in the message. Runs
 * only on the error path. */
static const char *recognised_format(const char *path)
{
    uint8_t buf[4096 + AVPROBE_PADDING_SIZE] = {0};
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, 4096, f);
    fclose(f);
    AVProbeData pd = {.filename = "", .buf = buf, .buf_size = (int)n};
    int score = 0;
    const AVInputFormat *fmt = av_probe_input_format2(&pd, 1, &score);
    return fmt && score > AVPROBE_SCORE_EXTENSION ? fmt->name : NULL;
}

/* Whether frame k may not be at start + k / fps: the average frame rate differs from the
 * base rate (the smallest interval's; variable frame rate, or frames missing), or the
 * container does not count its frames (Matroska/WebM, MPEG-TS: their headers cannot tell a
 * variable rate, and the count would otherwise be estimated as duration x fps). MP4 (an
 * exact sample table) at a constant rate keeps the formula. */
static bool variable_rate(const AVStream *st)
{
    bool rates = st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0 &&
                 st->r_frame_rate.num > 0 && st->r_frame_rate.den > 0;
    return st->nb_frames <= 0 || (rates && av_cmp_q(st->avg_frame_rate, st->r_frame_rate) != 0);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Variable frame rate: frame k is not at start + k / fps, so the frames' timestamps are
 * read from the container (its packets, demuxed without decoding: the cost of reading the
 * file once), sorted (presentation order) and deduplicated into d->pts_table. Frame k is then the
 * k-th frame shown, as a player (and PyAV) counts it. The caller opens the container again to
 * decode. */
static int build_pts_table(decoder_t *d)
{
    char msg[AV_ERROR_MAX_STRING_SIZE];
    AVPacket *pkt = av_packet_alloc();
    if (!pkt)
        return dh__set_error(DH_ENOMEM, "%s: out of memory", d->path);
    int64_t cap = 0;
    int averr;
    d->n_pts = 0;
    while ((averr = dh__read_packet(d->fmt, pkt)) >= 0) {
        int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
        bool ours = pkt->stream_index == d->stream && ts != AV_NOPTS_VALUE;
        av_packet_unref(pkt);
        if (!ours)
            continue;
        if (d->n_pts == cap) {
            cap = cap ? 2 * cap : 256;
            int64_t *grown = dh_reallocarray(d->pts_table, (size_t)cap, sizeof *grown);
            if (!grown) {
                av_packet_free(&pkt);
                return dh__set_error(DH_ENOMEM, "%s: out of memory", d->path);
            }
            d->pts_table = grown;
        }
        d->pts_table[d->n_pts++] = ts;
    }
    av_packet_free(&pkt);
    if (averr != AVERROR_EOF)
        return dh__set_error(code_of(averr), "%s: cannot read its frames' timestamps: %s", d->path,
                             av_message(averr, msg, sizeof msg));
    if (d->n_pts == 0) {
        dh_free(d->pts_table); /* no timestamps: the constant-rate rule */
        d->pts_table = NULL;
    } else {
        qsort(d->pts_table, (size_t)d->n_pts, sizeof *d->pts_table, cmp_i64);
        int64_t n = 1;
        for (int64_t i = 1; i < d->n_pts; i++)
            if (d->pts_table[i] != d->pts_table[n - 1])
                d->pts_table[n++] = d->pts_table[i];
        d->n_pts = n;
    }
    return 0;
}

const char *dh__subfile_range(const char *path, long long *start, long long *end)
{
    static const char prefix[] = "subfile,,start,";
    int n = 0;
    if (strncmp(path, prefix, sizeof prefix - 1) != 0 ||
        sscanf(path + sizeof prefix - 1, "%lld,end,%lld,,:%n", start, end, &n) != 2 || n == 0) {
        *start = *end = -1;
        return path;
    }
    return path + sizeof prefix - 1 + n;
}

/* The deadline of this thread's decodes (dh__decode_set_deadline), and FFmpeg's interrupt
 * callback over it: thread-local, so an abandoned thread's callback reads only its own. */
static _Thread_local uint64_t decode_deadline_ns;

void dh__decode_set_deadline(uint64_t deadline_ns)
{
    decode_deadline_ns = deadline_ns;
}

static int past_deadline(void *opaque)
{
    (void)opaque;
    return decode_deadline_ns && dh_clock_now_ns() > decode_deadline_ns;
}

/* Opens the container and finds the video stream. */
static int open_container(decoder_t *d, const char *path)
{
    char msg[AV_ERROR_MAX_STRING_SIZE];
    int averr = AVERROR(EIO);
    if (!DH_FAULT(DH_FAULT_MEDIA_OPEN)) {
        if (!(d->fmt = avformat_alloc_context()))
            return dh__set_error(DH_ENOMEM, "%s: out of memory", path);
        d->fmt->interrupt_callback = (AVIOInterruptCB){past_deadline, NULL};
        averr = dh__media_open_input(&d->fmt, path); /* a file, or a URL's range reads */
    }
    if (averr < 0) {
        int code = code_of(averr);
        /* A read error (EIO: a failing disk, a network file system) is not a bad file. */
        bool bad_file = code == DH_EIO && averr != AVERROR(EIO) && !dh__media_remote_message(averr);
        const char *format = bad_file ? recognised_format(path) : NULL;
        if (format)
            return dh__set_error(code, "%s: cannot read its %s header (truncated or corrupt?): %s",
                                 path, format, av_message(averr, msg, sizeof msg));
        if (bad_file)
            return dh__set_error(code, "%s: not a video file FFmpeg can read: %s", path,
                                 av_message(averr, msg, sizeof msg));
        return dh__set_error(code, "%s: cannot open: %s", path, av_message(averr, msg, sizeof msg));
    }
    /* MP4 headers carry everything we need (size, rate, frame count): the stream-info
     * probe, which decodes frames, runs only for containers whose header does not. */
    int stream = av_find_best_stream(d->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    if (stream < 0 || !header_is_enough(d->fmt->streams[stream])) {
        averr = avformat_find_stream_info(d->fmt, NULL);
        if (averr < 0)
            return dh__set_error(code_of(averr), "%s: cannot read the stream info: %s", path,
                                 av_message(averr, msg, sizeof msg));
        stream = av_find_best_stream(d->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    }
    if (stream < 0)
        return dh__set_error(stream == AVERROR(ENOMEM) ? DH_ENOMEM : DH_EIO,
                             "%s: no video stream: %s", path, av_message(stream, msg, sizeof msg));
    d->stream = stream;
    d->st = d->fmt->streams[stream];
    d->rate = d->st->avg_frame_rate;
    if (d->rate.num <= 0 || d->rate.den <= 0)
        d->rate = d->st->r_frame_rate;
    if (d->rate.num <= 0 || d->rate.den <= 0)
        return dh__set_error(DH_EIO, "%s: the video stream has no frame rate", path);
    d->start_pts = d->st->start_time != AV_NOPTS_VALUE ? d->st->start_time : 0;
    d->rotation = dh__display_rotation(d->st);
    for (unsigned i = 0; i < d->fmt->nb_streams; i++)
        if ((int)i != stream)
            d->fmt->streams[i]->discard = AVDISCARD_ALL; /* audio packets are not even read */
    return 0;
}

/* Opens the container and finds the video stream (no codec yet). Where frame k may not be
 * at start + k / fps, the frames' timestamps are read first (one demux pass), and a still
 * image is decoded once for its orientation; then the container is opened again: a fresh demuxer is
 * the one way back to the first packet that holds for every format (an MPEG-TS seek to the start
 * lands on a later packet). */
static int decoder_open_input(decoder_t *d, const char *path)
{
    memset(d, 0, sizeof *d);
    d->path = path;
    pthread_once(&quiet_once, quiet_ffmpeg);
    int rc = open_container(d, path);
    if (rc)
        return rc;
    int rotation = d->rotation;
    d->still = dh__still_image(d->fmt);
    if (d->still && d->st->codecpar->codec_id == AV_CODEC_ID_MJPEG) {
        /* a JPEG's orientation (EXIF) comes with its decoded frame: decoded once here, for
         * the plan's displayed size; other images carry none FFmpeg reports */
        char msg[AV_ERROR_MAX_STRING_SIZE];
        int averr = dh__image_rotation(d->fmt, d->stream, &rotation);
        if (averr < 0)
            return dh__set_error(code_of(averr), "%s: cannot decode the image: %s", path,
                                 av_message(averr, msg, sizeof msg));
        if (rotation < 0)
            return dh__set_error(DH_EIO,
                                 "%s: its orientation mirrors the picture, which the pipeline "
                                 "does not apply",
                                 path);
    } else if (d->still || !variable_rate(d->st)) {
        return 0; /* one frame, or frame k at start + k / fps: nothing to read first */
    } else if ((rc = build_pts_table(d))) {
        return rc;
    }
    dh__media_close_input(&d->fmt);
    if ((rc = open_container(d, path)))
        return rc;
    d->rotation = rotation;
    if (d->pts_table)
        d->start_pts = d->pts_table[0];
    return 0;
}

static void decoder_clip_info(const decoder_t *d, dh_clip_info_t *clip)
{
    const AVStream *st = d->st;
    memset(clip, 0, sizeof *clip);
    clip->fps = av_q2d(d->rate);
    /* the displayed size: a quarter turn swaps the coded one's sides */
    bool quarter = d->rotation == 90 || d->rotation == 270;
    clip->width = quarter ? st->codecpar->height : st->codecpar->width;
    clip->height = quarter ? st->codecpar->width : st->codecpar->height;
    if (st->duration > 0)
        clip->duration_s = (double)st->duration * av_q2d(st->time_base);
    else if (d->fmt->duration > 0)
        clip->duration_s = (double)d->fmt->duration / AV_TIME_BASE;
    /* nb_frames is exact in MP4 (the sample table); other containers leave it 0 and
     * dh_pipeline_plan estimates duration x fps; a variable-rate clip counted its frames. */
    clip->frame_count = d->still            ? 1
                        : d->pts_table      ? d->n_pts
                        : st->nb_frames > 0 ? st->nb_frames
                                            : 0;
    if (d->still && !(clip->duration_s > 0) && clip->fps > 0)
        clip->duration_s = 1.0 / clip->fps;
}

static int decoder_open_codec(dh_pipeline_t *p, decoder_t *d)
{
    char msg[AV_ERROR_MAX_STRING_SIZE];
    const AVCodecParameters *par = d->st->codecpar;
    const AVCodec *codec = avcodec_find_decoder(par->codec_id);
    if (!codec) {
        char tag[AV_FOURCC_MAX_STRING_SIZE];
        return dh__set_error(DH_EIO,
                             "%s: unsupported codec '%s' (tag '%s'): no decoder in this "
                             "FFmpeg",
                             d->path, avcodec_get_name(par->codec_id),
                             av_fourcc_make_string(tag, par->codec_tag));
    }
    if (!(d->pkt = av_packet_alloc()) || !(d->frame = av_frame_alloc()))
        return dh__set_error(DH_ENOMEM, "%s: out of memory", d->path);
    /* the last sample's decoder when the stream's parameters match (decoder_reuse.c) */
    int averr = dh__decoders_take(&p->decoders, d->st, codec, &d->codec);
    if (averr < 0)
        return dh__set_error(code_of(averr), "%s: cannot open the %s decoder: %s", d->path,
                             codec->name, av_message(averr, msg, sizeof msg));
    return 0;
}

int dh__pipeline_clip_info(const char *path, dh_clip_info_t *clip)
{
    decoder_t d;
    memset(clip, 0, sizeof *clip);
    int rc = decoder_open_input(&d, path);
    if (rc == 0)
        decoder_clip_info(&d, clip);
    decoder_close(&d);
    return rc;
}

/* ---- frame index <-> timestamp --------------------------------------------------------- */

/* Constant rate: index = round((pts - start) x time_base x fps). Variable rate: the index
 * of the table's nearest timestamp. */
static int64_t index_of_pts(const decoder_t *d, int64_t pts)
{
    if (!d->pts_table)
        return av_rescale_q_rnd(pts - d->start_pts, d->st->time_base, av_inv_q(d->rate),
                                AV_ROUND_NEAR_INF | AV_ROUND_PASS_MINMAX);
    int64_t lo = 0, hi = d->n_pts; /* the first entry >= pts */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (d->pts_table[mid] < pts)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == d->n_pts || (lo > 0 && pts - d->pts_table[lo - 1] < d->pts_table[lo] - pts))
        lo--;
    return lo;
}

static int64_t pts_of_index(const decoder_t *d, int64_t index)
{
    if (!d->pts_table || index < 0)
        return d->start_pts + av_rescale_q(index, av_inv_q(d->rate), d->st->time_base);
    if (index < d->n_pts)
        return d->pts_table[index];
    return d->pts_table[d->n_pts - 1] +
           av_rescale_q(index - d->n_pts + 1, av_inv_q(d->rate), d->st->time_base);
}

static bool is_wanted(const decoder_t *d, int64_t index)
{
    int32_t lo = 0, hi = d->n_wanted;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (d->wanted[mid] < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < d->n_wanted && d->wanted[lo] == index;
}

/* The frame index of the keyframe at or before `index` from the container's index, or -1
 * without one. MP4 indexes decode times, ahead of presentation by the reorder delay (the
 * first frame's pts less the first entry's; 0 without B-frames or for pts indexes): read as
 * pts, a keyframe 1 or 2 frames after a target passed for one before it, and the seek went
 * back a GOP (x264 defaults: 19% more frames decoded on kinetics-mixed). A delay read too
 * long (a late edit list) only makes seeks rarer. O(log entries). */
static int64_t keyframe_before(const decoder_t *d, int64_t index)
{
    if (avformat_index_get_entries_count(d->st) <= 0)
        return -1;
    const AVIndexEntry *first = avformat_index_get_entry(d->st, 0);
    bool known = first && first->timestamp != AV_NOPTS_VALUE && d->start_pts != AV_NOPTS_VALUE;
    int64_t delay = known && d->start_pts > first->timestamp ? d->start_pts - first->timestamp : 0;
    int i = av_index_search_timestamp(d->st, pts_of_index(d, index) - delay, AVSEEK_FLAG_BACKWARD);
    const AVIndexEntry *e = i >= 0 ? avformat_index_get_entry(d->st, i) : NULL;
    if (!e)
        return 0;
    int64_t k = index_of_pts(d, e->timestamp + delay);
    return k < 0 ? 0 : k;
}

/* ---- decoding --------------------------------------------------------------------------- */

/* Receives the next decoded frame into d->frame and its index into *index. Returns 0,
 * AVERROR_EOF at the end of the stream, or another FFmpeg error. */
static int next_frame(decoder_t *d, int64_t *index, int64_t *last_index)
{
    for (;;) {
        int averr = avcodec_receive_frame(d->codec, d->frame);
        if (averr == 0) {
            int64_t pts = d->frame->best_effort_timestamp;
            /* A frame without a timestamp follows the one before it. */
            *index = pts != AV_NOPTS_VALUE ? index_of_pts(d, pts) : *last_index + 1;
            return 0;
        }
        if (averr != AVERROR(EAGAIN))
            return averr;
        if (d->draining)
            return AVERROR_EOF;
        for (;;) {
            averr = dh__read_packet(d->fmt, d->pkt);
            if (averr == AVERROR_EOF) {
                d->draining = true;
                averr = avcodec_send_packet(d->codec, NULL);
                break;
            }
            if (averr < 0)
                return averr;
            if (d->pkt->stream_index != d->stream) {
                av_packet_unref(d->pkt);
                continue;
            }
            /* A non-reference frame that is not sampled is not decoded at all; reference
             * frames are (later frames need them). The decision is per packet from its pts;
             * without one, decode. */
            bool skip =
                d->pkt->pts != AV_NOPTS_VALUE && !is_wanted(d, index_of_pts(d, d->pkt->pts));
            d->codec->skip_frame = skip ? AVDISCARD_NONREF : AVDISCARD_DEFAULT;
            averr = DH_FAULT(DH_FAULT_MEDIA_DECODE) ? AVERROR_INVALIDDATA
                                                    : avcodec_send_packet(d->codec, d->pkt);
            av_packet_unref(d->pkt);
            break;
        }
        if (averr < 0 && averr != AVERROR(EAGAIN) && averr != AVERROR_EOF)
            return averr;
    }
}

/* Seeks to the keyframe at or before frame `index`. */
static int seek_to(decoder_t *d, int64_t index)
{
    int64_t ts = index <= 0 ? d->start_pts : pts_of_index(d, index);
    int averr = av_seek_frame(d->fmt, d->stream, ts, AVSEEK_FLAG_BACKWARD);
    if (averr < 0)
        return averr;
    avcodec_flush_buffers(d->codec);
    d->draining = false;
    return 0;
}

static void copy_slot(dh_sample_t *s, int32_t from, int32_t to)
{
    size_t bytes = s->frames.nbytes / (size_t)s->plan.frames;
    memcpy((uint8_t *)s->frames.data + (size_t)to * bytes,
           (uint8_t *)s->frames.data + (size_t)from * bytes, bytes);
}

static int alloc_output(dh_pipeline_t *p, dh_sample_t *s, const char *path, int rotation)
{
    const dh_pipeline_spec_t *spec = &p->spec;
    dh_tensor_t *t = &s->frames;
    int64_t T = s->plan.frames, H = s->plan.height, W = s->plan.width;
    dh_tensor_set_name(t, "frames");
    t->dtype = spec->dtype;
    t->ndim = 4;
    int64_t tchw[4] = {T, 3, H, W}, thwc[4] = {T, H, W, 3};
    memcpy(t->shape, spec->layout == DH_LAYOUT_TCHW ? tchw : thwc, sizeof tchw);
    dh_tensor_set_contiguous(t); /* nbytes: T x 3 x H x W x dtype size */
    /* the converter may write DH_CONVERT_SLACK bytes past the last frame (convert.h) */
    if (!(t->data = dh__spares_take(&p->spares, t->nbytes + DH_CONVERT_SLACK)))
        return dh__set_error(DH_ENOMEM, "%s: out of memory for %zu output bytes", path, t->nbytes);
    if (dh__converter_reserve(&p->converter, (int32_t)H, (int32_t)W, rotation) < 0)
        return dh__set_error(DH_ENOMEM, "%s: out of memory for the conversion scratch", path);
    return 0;
}

/* Decodes the planned frames of an open clip into s->frames. */
static int decode_planned(dh_pipeline_t *p, decoder_t *d, dh_sample_t *s)
{
    char msg[AV_ERROR_MAX_STRING_SIZE];
    const int64_t *want = s->plan.indices;
    int32_t T = s->plan.frames;
    d->wanted = want;
    d->n_wanted = T;
    /* Without an index, "more than a GOP ahead" uses the keyframe interval seen so far,
     * 2 seconds' worth until one is seen. */
    int64_t gop_estimate = (int64_t)fmax(1.0, 2.0 * av_q2d(d->rate));
    int64_t last = -1, last_key = -1; /* index of the last frame received, of the last keyframe */
    bool positioned = false;          /* `last` is known (false after a seek) */
    int retries = 0;                  /* backward re-seeks for the current target */
    int64_t highest = -1;             /* the highest index received */
    p->redecoded = 0;
    int32_t j = 0;
    while (j < T) {
        int64_t target = want[j];
        if (j > 0 && target <= want[j - 1]) { /* a repeated frame (allow_repeat) */
            copy_slot(s, j - 1, j);
            j++;
            continue;
        }
        /* Seek when a keyframe lies between where the decoder is and the target. */
        int64_t next = positioned ? last + 1 : 0;
        int64_t key = keyframe_before(d, target);
        bool seek = key >= 0 ? key > next : target - next > gop_estimate;
        if (seek || (positioned && target < next)) {
            int averr = seek_to(d, target);
            if (averr < 0)
                return dh__set_error(code_of(averr), "%s: cannot seek to frame %lld: %s", d->path,
                                     (long long)target, av_message(averr, msg, sizeof msg));
            positioned = false;
        }
        /* Decode forward to the target. */
        for (;;) {
            int64_t index = -1;
            int averr = next_frame(d, &index, &last);
            if (averr == AVERROR_EOF && last < 0)
                return dh__set_error(DH_EIO,
                                     "%s: the stream has no decodable frame before frame "
                                     "%lld: truncated or corrupt",
                                     d->path, (long long)target);
            if (averr == AVERROR_EOF)
                return dh__set_error(DH_EIO,
                                     "%s: the stream ends after frame %lld but frame %lld is "
                                     "sampled (the container says %lld frames): truncated or "
                                     "corrupt",
                                     d->path, (long long)last, (long long)target,
                                     (long long)s->plan.frame_count);
            if (averr < 0)
                return dh__set_error(code_of(averr), "%s: decoding near frame %lld: %s", d->path,
                                     (long long)(last + 1), av_message(averr, msg, sizeof msg));
            bool first_after_seek = !positioned;
            positioned = true;
            if (d->frame->key_frame) {
                if (last_key >= 0 && index > last_key)
                    gop_estimate = index - last_key;
                last_key = index;
            }
            last = index;
            p->redecoded += index <= highest; /* a seek went back over decoded frames */
            highest = index > highest ? index : highest;
            if (index < target) {
                av_frame_unref(d->frame);
                continue;
            }
            if (index > target && first_after_seek && retries < 2) {
                /* The seek landed after the target (an index in decode order, an open
                 * GOP): back off by two GOPs, then to the start. */
                av_frame_unref(d->frame);
                int64_t back = retries == 0 ? target - 2 * gop_estimate : 0;
                retries++;
                if ((averr = seek_to(d, back)) < 0)
                    return dh__set_error(code_of(averr), "%s: cannot seek to frame %lld: %s",
                                         d->path, (long long)back,
                                         av_message(averr, msg, sizeof msg));
                positioned = false;
                continue;
            }
            /* index >= target: the target, or (a frame missing from a variable-rate
             * stream) the nearest frame after it. */
            averr = dh__convert_frame(&p->converter, d->frame, d->rotation, s, j);
            av_frame_unref(d->frame);
            if (averr < 0)
                return dh__set_error(code_of(averr), "%s: cannot convert frame %lld: %s", d->path,
                                     (long long)index, av_message(averr, msg, sizeof msg));
            retries = 0;
            j++;
            while (j < T && want[j] <= index) { /* repeats, or targets the stream skipped */
                copy_slot(s, j - 1, j);
                j++;
            }
            break;
        }
    }
    return 0;
}

static int decode_sample(dh_pipeline_t *p, const char *path, const dh_sample_overrides_t *ovr,
                         const char *id, dh_sample_t *out)
{
    decoder_t d;
    int rc = decoder_open_input(&d, path);
    if (rc == 0) {
        dh_clip_info_t clip;
        decoder_clip_info(&d, &clip);
        if ((rc = dh_pipeline_plan(&p->spec, &clip, ovr, id, &out->plan)) < 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", dh_last_error());
            dh__set_error(rc, "%s: %s", path, why);
        }
    }
    if (rc == 0)
        rc = decoder_open_codec(p, &d);
    if (rc == 0)
        rc = alloc_output(p, out, path, d.rotation);
    if (rc == 0)
        rc = decode_planned(p, &d, out);
    if (rc == 0) /* a decoder that failed is not trusted with the next sample */
        dh__decoders_give(&p->decoders, &d.codec, d.st);
    decoder_close(&d);
    return rc;
}

int dh_pipeline_decode(dh_pipeline_t *pipeline, const char *path,
                       const dh_sample_overrides_t *overrides, const char *sample_id,
                       dh_sample_t *out)
{
    assert(pipeline && path && out);
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (!(out->id = dh_strdup(sample_id ? sample_id : "")))
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory", path);
    if (rc == 0)
        rc = decode_sample(pipeline, path, overrides, sample_id, out);
    if (rc < 0) {
        dh__name_tar_sample(rc, path, sample_id); /* a tar member: sample, member, shard */
        dh_tensor_clear(&out->frames);            /* the plan stays when decoding failed after it */
        out->error = rc;
        out->error_message = dh_strdup(dh_last_error()); /* NULL if memory is that short */
    }
    return rc;
}

void dh__pipeline_recycle(dh_pipeline_t *pipeline, dh_sample_t *sample)
{
    if (sample && sample->frames.data) {
        dh__spares_give(&pipeline->spares, sample->frames.data,
                        sample->frames.nbytes + DH_CONVERT_SLACK);
        sample->frames.data = NULL;
    }
    dh_sample_clear(sample);
}

void dh_sample_clear(dh_sample_t *sample)
{
    if (!sample)
        return;
    dh_free(sample->id);
    dh_free(sample->error_message);
    dh_sample_plan_clear(&sample->plan);
    dh_tensor_clear(&sample->frames);
    memset(sample, 0, sizeof *sample);
}

int dh__pipeline_decode_batch(dh_pipeline_t *pipeline, const dh_sample_request_t *requests,
                              size_t count, dh_batch_t **out)
{
    *out = NULL;
    dh_sample_t *samples = dh_calloc(count ? count : 1, sizeof *samples);
    if (!samples)
        return dh__set_error(DH_ENOMEM, "decode batch: out of memory for %zu samples", count);
    for (size_t i = 0; i < count; i++)
        (void)dh_pipeline_decode(pipeline, requests[i].path, &requests[i].overrides, requests[i].id,
                                 &samples[i]);
    const dh_pipeline_spec_t *spec = dh_pipeline_spec(pipeline);
    int rc = dh_collate(samples, count, spec->dtype, spec->layout, out);
    for (size_t i = 0; i < count; i++)
        dh__pipeline_recycle(pipeline, &samples[i]);
    dh_free(samples);
    return rc;
}
