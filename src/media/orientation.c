/* orientation.c: which way up a picture is shown: a video stream's display matrix (phone
 * videos) and a JPEG's EXIF orientation (pipeline_internal.h), and whether a container is a
 * still image. The decoder applies the turn (decode.c); probe refuses a mirrored one. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>

#include "pipeline_internal.h"

/* Degrees clockwise a display matrix turns the picture (0, 90, 180, 270), or -1 (mirrored,
 * or another angle). */
static int rotation_of_matrix(const int32_t *matrix)
{
    /* mirrored: the 2x2 part's determinant is negative */
    if ((double)matrix[0] * matrix[4] - (double)matrix[1] * matrix[3] < 0)
        return -1;
    double ccw = av_display_rotation_get(matrix); /* counter-clockwise, (-180, 180] */
    if (isnan(ccw) || fabs(ccw - (double)lrint(ccw)) > 0.5)
        return -1;
    long cw = ((-lrint(ccw) % 360) + 360) % 360;
    return cw % 90 == 0 ? (int)cw : -1;
}

int dh__display_rotation(const AVStream *st)
{
    size_t size = 0;
    const uint8_t *m = av_stream_get_side_data(st, AV_PKT_DATA_DISPLAYMATRIX, &size);
    return m && size >= 9 * sizeof(int32_t) ? rotation_of_matrix((const int32_t *)m) : 0;
}

bool dh__still_image(const AVFormatContext *fmt)
{
    const char *name = fmt->iformat->name;
    size_t n = strlen(name);
    return strcmp(name, "image2") == 0 || (n > 5 && strcmp(name + n - 5, "_pipe") == 0);
}

int dh__image_rotation(AVFormatContext *fmt, int stream, int *rotation)
{
    *rotation = 0;
    const AVCodecParameters *par = fmt->streams[stream]->codecpar;
    if (par->codec_id != AV_CODEC_ID_MJPEG)
        return 0; /* only JPEG's EXIF orientation reaches FFmpeg's frames */
    const AVCodec *codec = avcodec_find_decoder(par->codec_id);
    AVCodecContext *ctx = codec ? avcodec_alloc_context3(codec) : NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *frame = av_frame_alloc();
    int averr = !codec ? AVERROR_DECODER_NOT_FOUND : (!ctx || !pkt || !frame) ? AVERROR(ENOMEM) : 0;
    if (averr == 0 && (averr = avcodec_parameters_to_context(ctx, par)) >= 0) {
        ctx->thread_count = 1;
        averr = avcodec_open2(ctx, codec, NULL);
    }
    bool sent_eof = false;
    while (averr >= 0) {
        averr = avcodec_receive_frame(ctx, frame);
        if (averr == 0)
            break;
        if (averr != AVERROR(EAGAIN) || sent_eof)
            break;
        averr = dh__read_packet(fmt, pkt);
        if (averr == AVERROR_EOF) {
            sent_eof = true;
            averr = avcodec_send_packet(ctx, NULL);
        } else if (averr >= 0) {
            if (pkt->stream_index == stream)
                averr = avcodec_send_packet(ctx, pkt);
            av_packet_unref(pkt);
        }
    }
    if (averr == 0) {
        const AVFrameSideData *sd = av_frame_get_side_data(frame, AV_FRAME_DATA_DISPLAYMATRIX);
        if (sd && sd->size >= 9 * sizeof(int32_t))
            *rotation = rotation_of_matrix((const int32_t *)sd->data);
    }
    av_frame_free(&frame);
    av_packet_free(&pkt);
    avcodec_free_context(&ctx);
    return averr;
}
