/* probe.c: container metadata without decoding, and the decode-cost count (see probe.h).
 *
 * Cost: opening an MP4 reads its moov box (the sample tables), typically well under a
 * millisecond of CPU for a 10 s clip; no codec is opened. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/log.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/probe.h"
#include "core/internal.h"
#include "media/pipeline_internal.h"
#include "remote/remote_lib.h"

/* FFmpeg's message for an error code. */
static const char *av_message(int averr, char *buf, size_t size)
{
    if (av_strerror(averr, buf, size) < 0)
        snprintf(buf, size, "FFmpeg error %d", averr);
    return buf;
}

void dh_media_info_clear(dh_media_info_t *info)
{
    dh_free(info->keyframes);
    memset(info, 0, sizeof *info);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Keyframe positions from the demuxer's index (MP4: the stss box), as frame indices. */
static int read_keyframes(const char *path, AVStream *st, double fps, dh_media_info_t *info)
{
    int n = avformat_index_get_entries_count(st);
    if (n <= 0)
        return 0;
    info->keyframes = dh_calloc((size_t)n, sizeof *info->keyframes);
    if (!info->keyframes)
        return dh__set_error(DH_ENOMEM, "%s: out of memory for %d index entries", path, n);
    double tb = av_q2d(st->time_base);
    /* Index timestamps are decode timestamps. With B-frames they run a fixed delay behind
     * presentation, so counting from the first entry (the first frame, a keyframe) rather
     * than from the stream's start time gives presentation indices. */
    const AVIndexEntry *first = avformat_index_get_entry(st, 0);
    int64_t start = first ? first->timestamp : 0;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const AVIndexEntry *e = avformat_index_get_entry(st, i);
        if (!e || !(e->flags & AVINDEX_KEYFRAME))
            continue;
        int64_t frame = llround((double)(e->timestamp - start) * tb * fps);
        info->keyframes[k++] = frame < 0 ? 0 : frame;
    }
    /* Index entries are in decode order; presentation order may differ (B-frames). */
    qsort(info->keyframes, k, sizeof *info->keyframes, cmp_i64);
    info->n_keyframes = k;
    return 0;
}

/* What the pipeline cannot decode faithfully is refused here, with the reason and the way
 * out, rather than decoded wrong (docs/pipeline.md, "Codecs and containers"):
 *   - a display matrix that mirrors the picture, or turns it by other than a multiple of 90
 *     degrees (quarter turns are applied: dh__display_rotation);
 *   - AVI with reordered (B-)frames: AVI stores no presentation times, so frame numbers
 *     taken from the decoder's guessed timestamps are off by the reorder delay. Whether the
 *     stream reorders is known only from its first packets, so AVI pays a short stream-info
 *     probe. */
static int check_supported(const char *path, AVFormatContext *fmt, AVStream *st)
{
    if (dh__display_rotation(st) < 0)
        return dh__set_error(DH_EIO,
                             "%s: its display matrix mirrors the picture or turns it by other "
                             "than a multiple of 90 degrees, which the pipeline does not apply; "
                             "re-encode it upright (the ffmpeg CLI applies it: ffmpeg -i IN "
                             "OUT)",
                             path);
    if (strcmp(fmt->iformat->name, "avi") == 0) {
        if (st->codecpar->video_delay == 0)
            (void)avformat_find_stream_info(fmt, NULL);
        if (st->codecpar->video_delay > 0)
            return dh__set_error(DH_EIO,
                                 "%s: AVI with reordered (B-)frames (%s, delay %d): AVI keeps no "
                                 "presentation times, so sampled frames would be off by the "
                                 "delay; re-encode without B-frames or into MP4/MKV",
                                 path, avcodec_get_name(st->codecpar->codec_id),
                                 st->codecpar->video_delay);
    }
    return 0;
}

int dh_media_probe(const char *path, dh_media_info_t *info)
{
    memset(info, 0, sizeof *info);
    struct stat sb;
    long long start, end;
    const char *file = dh__subfile_range(path, &start, &end);
    bool remote = dh__url_scheme(file) != DH_URL_NONE; /* its size comes with the first read */
    if (remote) {
        sb.st_size = 0;
    } else if (stat(file, &sb) != 0) {
        int err = errno;
        return dh__set_error(-err, "%s: %s", file, strerror(err));
    }
    info->file_bytes = (int64_t)sb.st_size;
    if (start >= 0 && !remote) {
        if (start >= end || end > (long long)sb.st_size)
            return dh__set_error(DH_ERANGE,
                                 "%s: bytes [%lld, %lld) lie outside the file (%lld bytes)", file,
                                 start, end, (long long)sb.st_size);
        info->file_bytes = end - start;
    }
    av_log_set_level(AV_LOG_QUIET); /* errors are reported through dh_last_error() */

    char msg[256];
    AVFormatContext *fmt = NULL;
    int averr = dh__media_open_input(&fmt, path); /* a file, or a URL's range reads */
    if (averr < 0) {
        const char *why = dh__media_remote_message(averr);
        return dh__set_error(why                        ? dh__media_remote_error()
                             : averr == AVERROR(ENOENT) ? -ENOENT
                                                        : DH_EIO,
                             "%s: not a readable media file: %s", path,
                             why ? why : av_message(averr, msg, sizeof msg));
    }
    int rc = 0;
    if (remote && (info->file_bytes = avio_size(fmt->pb)) < 0) {
        rc = dh__set_error(DH_EIO, "%s: cannot tell its size", path);
        goto out;
    }
    int idx = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    if (idx < 0) {
        rc = dh__set_error(DH_EIO, "%s: no video stream (%s)", path,
                           av_message(idx, msg, sizeof msg));
        goto out;
    }
    AVStream *st = fmt->streams[idx];
    AVCodecParameters *par = st->codecpar;
    if (par->width <= 0 || par->height <= 0) {
        /* The header does not say; let FFmpeg look at the first packets. */
        averr = avformat_find_stream_info(fmt, NULL);
        if (averr < 0 || par->width <= 0 || par->height <= 0) {
            rc = dh__set_error(DH_EIO, "%s: video stream without a size (%s)", path,
                               averr < 0 ? av_message(averr, msg, sizeof msg) : "empty header");
            goto out;
        }
    }
    if (!avcodec_find_decoder(par->codec_id)) {
        rc = dh__set_error(DH_EIO, "%s: no decoder for codec '%s'", path,
                           avcodec_get_name(par->codec_id));
        goto out;
    }
    if ((rc = check_supported(path, fmt, st)))
        goto out;
    snprintf(info->codec, sizeof info->codec, "%s", avcodec_get_name(par->codec_id));
    /* the displayed size: a quarter turn (the stream's display matrix, an image's EXIF
     * orientation) swaps the sides */
    int turn = dh__display_rotation(st);
    if (dh__still_image(fmt)) {
        averr = dh__image_rotation(fmt, idx, &turn);
        if (averr < 0 || turn < 0) {
            rc = dh__set_error(DH_EIO, "%s: %s", path,
                               averr < 0 ? av_message(averr, msg, sizeof msg)
                                         : "its orientation mirrors the picture, which the "
                                           "pipeline does not apply");
            goto out;
        }
    }
    info->width = turn == 90 || turn == 270 ? par->height : par->width;
    info->height = turn == 90 || turn == 270 ? par->width : par->height;
    AVRational rate = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
    info->fps = rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0.0;
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0)
        info->duration_s = (double)st->duration * av_q2d(st->time_base);
    else if (fmt->duration != AV_NOPTS_VALUE && fmt->duration > 0)
        info->duration_s = (double)fmt->duration / AV_TIME_BASE;
    if (st->nb_frames > 0)
        info->frame_count = st->nb_frames;
    else if (dh__still_image(fmt))
        info->frame_count = 1; /* a still image is a clip of one frame */
    else
        info->frame_count = (int64_t)llround(info->duration_s * info->fps);
    if (info->frame_count == 1 && info->fps > 0 && !(info->duration_s > 0))
        info->duration_s = 1.0 / info->fps;
    if (info->fps <= 0 && info->duration_s > 0 && info->frame_count > 0)
        info->fps = (double)info->frame_count / info->duration_s;
    if (info->fps <= 0 || info->frame_count <= 0) {
        rc = dh__set_error(DH_EIO, "%s: cannot tell the frame rate or frame count", path);
        goto out;
    }
    info->bit_rate = par->bit_rate > 0 ? par->bit_rate : fmt->bit_rate;
    rc = read_keyframes(path, st, info->fps, info);
out:
    dh__media_close_input(&fmt);
    if (rc != 0)
        dh_media_info_clear(info);
    return rc;
}

/* Index of the last keyframe <= frame, or -1 if none. O(log n). */
static ptrdiff_t keyframe_at_or_before(const int64_t *keyframes, size_t n, int64_t frame)
{
    size_t lo = 0, hi = n; /* first index with keyframes[i] > frame */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keyframes[mid] <= frame)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

int64_t dh_decode_frames_needed(const int64_t *keyframes, size_t n_keyframes,
                                const int64_t *targets, size_t n_targets)
{
    if (n_keyframes == 0)
        return (int64_t)n_targets;
    int64_t decoded = 0, next = -1; /* next frame the decoder would output; -1: not started */
    for (size_t i = 0; i < n_targets; i++) {
        int64_t t = targets[i];
        if (t < next - 1)
            next = -1; /* behind: must seek */
        if (t == next - 1)
            continue; /* the same frame again (a repeated sample) */
        ptrdiff_t k = keyframe_at_or_before(keyframes, n_keyframes, t);
        int64_t kf = k >= 0 ? keyframes[k] : 0;
        if (next < 0 || kf > next)
            next = kf; /* seek: decoding forward would pass a keyframe anyway */
        decoded += t - next + 1;
        next = t + 1;
    }
    return decoded;
}
