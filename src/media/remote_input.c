/* remote_input.c: opens a clip's container, from a local file through FFmpeg's own protocols,
 * or from an http://, https:// or s3:// URL (a whole object, or a tar member: a byte range
 * of its shard, "subfile,,start,S,end,E,,:URL") through a custom AVIOContext over the remote
 * module's range reader (remote/remote_lib.h, docs/remote.md). The demuxer's reads and seeks
 * become block-aligned range requests of only the bytes it asks for (an MP4's moov, the
 * sampled GOPs); the container's interrupt callback (the decode's sample_timeout) stops a
 * request that waits.
 *
 * FFmpeg reports a failed read as an AVERROR, which would lose the URL, HTTP status and byte
 * range: the remote error is kept per thread and dh__media_remote_error puts it back.
 * The decoder's messages name the clip's path as written; dh__media_redact_error takes a
 * URL's query string (a presigned signature) out of them. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <libavformat/avformat.h>
#include <libavutil/mem.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "media/pipeline_internal.h"
#include "remote/remote_lib.h"

#define AVIO_BUFFER_BYTES (32 << 10) /* FFmpeg's own default */

typedef struct remote_input {
    dh__remote_file_t *file;
    int64_t pos;
} remote_input_t;

/* The last remote failure of this thread's reads (0: none since the last open). */
static _Thread_local int remote_code;
static _Thread_local char remote_message[1024];

static int remember(int rc)
{
    remote_code = rc;
    snprintf(remote_message, sizeof remote_message, "%s", dh_last_error());
    if (strstr(remote_message, "interrupted"))
        return AVERROR_EXIT;
    return rc == -ENOENT || rc == -EACCES || rc == DH_ENOMEM ? AVERROR(-rc) : AVERROR(EIO);
}

int dh__media_remote_error(void)
{
    int rc = remote_code;
    if (rc)
        dh__set_error(rc, "%s", remote_message);
    return rc;
}

bool dh__media_remote_failed(void)
{
    return remote_code != 0;
}

const char *dh__media_remote_message(int averr)
{
    if (!remote_code || !(averr == AVERROR(EIO) || averr == AVERROR(ENOENT) ||
                          averr == AVERROR(EACCES) || averr == AVERROR_EXIT))
        return NULL;
    /* "URL: what" -> "what": the caller's message names the clip already */
    const char *sep = strstr(remote_message, ": ");
    return sep && strncmp(remote_message, "http", 4) == 0 ? sep + 2 : remote_message;
}

static int read_remote(void *opaque, uint8_t *buf, int size)
{
    remote_input_t *in = opaque;
    size_t got = 0;
    int rc = dh__remote_file_read(in->file, in->pos, buf, (size_t)size, &got);
    if (rc)
        return remember(rc);
    in->pos += (int64_t)got;
    return got ? (int)got : AVERROR_EOF;
}

static int64_t seek_remote(void *opaque, int64_t offset, int whence)
{
    remote_input_t *in = opaque;
    whence &= ~AVSEEK_FORCE;
    if (whence == AVSEEK_SIZE) {
        int64_t size = dh__remote_file_size(in->file);
        return size < 0 ? remember((int)size) : size;
    }
    int64_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? in->pos : -1;
    if (whence == SEEK_END) {
        if ((base = dh__remote_file_size(in->file)) < 0)
            return remember((int)base);
    }
    if (base < 0 || offset < -base)
        return AVERROR(EINVAL);
    in->pos = base + offset;
    return in->pos;
}

static void free_remote(AVIOContext **pb)
{
    if (!*pb)
        return;
    remote_input_t *in = (*pb)->opaque;
    if (in) {
        dh__remote_file_close(&in->file);
        dh_free(in);
    }
    av_freep(&(*pb)->buffer);
    avio_context_free(pb);
}

/* An AVIOContext reading [start, end) of url (end -1: to the object's end). */
static int open_remote(AVIOContext **out, const char *url, long long start, long long end,
                       const AVIOInterruptCB *interrupt)
{
    *out = NULL;
    remote_input_t *in = dh_calloc(1, sizeof *in);
    if (!in)
        return AVERROR(ENOMEM);
    int rc = dh__remote_file_open(&in->file, url, start < 0 ? 0 : start, start < 0 ? -1 : end);
    if (rc) {
        dh_free(in);
        return remember(rc);
    }
    if (interrupt && interrupt->callback)
        dh__remote_file_set_interrupt(
            in->file, &(dh__remote_interrupt_t){interrupt->callback, interrupt->opaque});
    uint8_t *buffer = av_malloc(AVIO_BUFFER_BYTES);
    AVIOContext *pb = buffer ? avio_alloc_context(buffer, AVIO_BUFFER_BYTES, 0, in, read_remote,
                                                  NULL, seek_remote)
                             : NULL;
    if (!pb) {
        av_free(buffer);
        dh__remote_file_close(&in->file);
        dh_free(in);
        return AVERROR(ENOMEM);
    }
    *out = pb;
    return 0;
}

int dh__media_open_input(AVFormatContext **fmt, const char *path)
{
    remote_code = 0;
    long long start, end;
    const char *file = dh__subfile_range(path, &start, &end);
    if (dh__url_scheme(file) == DH_URL_NONE)
        return avformat_open_input(fmt, path, NULL, NULL);
    if (!*fmt && !(*fmt = avformat_alloc_context()))
        return AVERROR(ENOMEM);
    AVIOContext *pb;
    int averr = open_remote(&pb, file, start, end, &(*fmt)->interrupt_callback);
    if (averr < 0) {
        avformat_free_context(*fmt);
        *fmt = NULL;
        return averr;
    }
    (*fmt)->pb = pb;
    (*fmt)->flags |= AVFMT_FLAG_CUSTOM_IO;
    /* the URL names the format by its extension, as a file's name does; the bytes come from pb
     * (on failure FFmpeg frees the context but leaves a caller's pb to the caller) */
    averr = avformat_open_input(fmt, file, NULL, NULL);
    if (averr < 0)
        free_remote(&pb);
    return averr;
}

void dh__media_close_input(AVFormatContext **fmt)
{
    if (!*fmt)
        return;
    AVIOContext *pb = (*fmt)->flags & AVFMT_FLAG_CUSTOM_IO ? (*fmt)->pb : NULL;
    avformat_close_input(fmt);
    free_remote(&pb);
}

int dh__media_redact_error(int err, const char *path)
{
    long long start, end;
    const char *file = dh__subfile_range(path, &start, &end);
    const char *query = strchr(file, '?');
    if (dh__url_scheme(file) == DH_URL_NONE || !query)
        return err;
    char msg[2048], out[2048];
    snprintf(msg, sizeof msg, "%s", dh_last_error());
    /* every copy of the URL's query (up to a fragment) becomes "?..." */
    size_t qlen = strcspn(query, "#"), used = 0;
    const char *at = msg, *hit;
    while ((hit = strstr(at, query)) && qlen > 1) {
        used += (size_t)snprintf(out + used, sizeof out - used, "%.*s?...", (int)(hit - at), at);
        at = hit + qlen;
        if (used >= sizeof out)
            break;
    }
    if (used < sizeof out)
        snprintf(out + used, sizeof out - used, "%s", at);
    return dh__set_error(err, "%s", out);
}
