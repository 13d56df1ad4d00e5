/* decoder_reuse.c: the open decoder a pipeline keeps for its next sample (docs/pipeline.md,
 * "The bound, and the overhead outside the decoder").
 *
 * Opening a decoder allocates its whole state (the h264 decoder's context, slice tables and
 * frame pool) and parses the stream's extradata; for clips of one data set these are the
 * same every time. A pipeline keeps the decoder of its last sample that decoded without
 * error, and hands it, flushed (avcodec_flush_buffers: what a seek within a clip does), to
 * the next sample whose stream parameters (codec, extradata, size, pixel format, colour
 * fields, time base; not the bit rate, which no video decoder reads) equal those it was
 * opened with; the decoder options are always the same. Any other sample opens its own,
 * which then replaces the kept one. One thread at a time (the pipeline's).
 * Off unless DH_DECODER_REUSE=1: its CPU gain was within the noise, and a kept decoder holds
 * its frame pool (2.5-7.4 MB) per worker, which took a 48-worker 720p run past its memory
 * bound (tests/python/test_overload.py). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>

#include "media/pipeline_internal.h"

void dh__decoders_init(dh__decoders_t *k)
{
    memset(k, 0, sizeof *k);
    const char *env = getenv("DH_DECODER_REUSE");
    k->off = !(env && strcmp(env, "1") == 0);
}

void dh__decoders_clear(dh__decoders_t *k)
{
    avcodec_free_context(&k->codec);
    avcodec_parameters_free(&k->par);
}

/* Whether a decoder opened for (a, tb_a) starts as one opened for (b, tb_b) would: every
 * field avcodec_parameters_to_context copies into a video decoder's context. */
static bool same_stream(const AVCodecParameters *a, AVRational tb_a, const AVCodecParameters *b,
                        AVRational tb_b)
{
    return a->codec_type == b->codec_type && a->codec_id == b->codec_id &&
           a->codec_tag == b->codec_tag && a->format == b->format && a->width == b->width &&
           a->height == b->height && a->profile == b->profile && a->level == b->level &&
           a->bits_per_coded_sample == b->bits_per_coded_sample &&
           a->bits_per_raw_sample == b->bits_per_raw_sample &&
           av_cmp_q(a->sample_aspect_ratio, b->sample_aspect_ratio) == 0 &&
           a->field_order == b->field_order && a->color_range == b->color_range &&
           a->color_primaries == b->color_primaries && a->color_trc == b->color_trc &&
           a->color_space == b->color_space && a->chroma_location == b->chroma_location &&
           a->video_delay == b->video_delay && av_cmp_q(tb_a, tb_b) == 0 &&
           a->extradata_size == b->extradata_size &&
           (a->extradata_size == 0 ||
            memcmp(a->extradata, b->extradata, (size_t)a->extradata_size) == 0);
}

int dh__decoders_take(dh__decoders_t *k, const AVStream *st, const AVCodec *codec,
                      AVCodecContext **out)
{
    *out = NULL;
    if (k->codec && same_stream(k->par, av_make_q(k->time_base.num, k->time_base.den), st->codecpar,
                                st->time_base)) {
        AVCodecContext *c = k->codec;
        k->codec = NULL;
        avcodec_flush_buffers(c);
        /* what a fresh context starts with, and flushing leaves as it was */
        c->skip_frame = AVDISCARD_DEFAULT;
        c->pts_correction_num_faulty_pts = c->pts_correction_num_faulty_dts = 0;
        c->pts_correction_last_pts = c->pts_correction_last_dts = INT64_MIN;
        k->reused++;
        *out = c;
        return 0;
    }
    AVCodecContext *c = avcodec_alloc_context3(codec);
    if (!c)
        return AVERROR(ENOMEM);
    int averr = avcodec_parameters_to_context(c, st->codecpar);
    if (averr >= 0) {
        /* One thread per decoder: the data server decodes many samples in parallel. */
        c->thread_count = 1;
        c->thread_type = 0;
        c->pkt_timebase = st->time_base;
        averr = avcodec_open2(c, codec, NULL);
    }
    if (averr < 0) {
        avcodec_free_context(&c);
        return averr;
    }
    k->opened++;
    *out = c;
    return 0;
}

void dh__decoders_give(dh__decoders_t *k, AVCodecContext **codec, const AVStream *st)
{
    if (!*codec)
        return;
    if (k->off) {
        avcodec_free_context(codec);
        return;
    }
    if (!k->par && !(k->par = avcodec_parameters_alloc())) {
        avcodec_free_context(codec);
        return;
    }
    if (avcodec_parameters_copy(k->par, st->codecpar) < 0) {
        avcodec_free_context(codec);
        avcodec_free_context(&k->codec); /* its parameters are gone */
        return;
    }
    avcodec_free_context(&k->codec);
    k->codec = *codec;
    k->time_base.num = st->time_base.num;
    k->time_base.den = st->time_base.den;
    *codec = NULL;
}
