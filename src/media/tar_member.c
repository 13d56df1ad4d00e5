/* tar_member.c: names a tar member read in place in an error message (pipeline_internal.h).
 * A manifest of WebDataset shards addresses a sample as a byte range of its shard
 * ("subfile,,start,S,end,E,,:SHARD", manifest.h), which is all the decoder knows; when it
 * fails, the message should name the sample, the shard and the member, not the range. The
 * member's name is in the 512-byte ustar header right before its data: read only when an
 * error is reported, so decoding pays nothing.
 *
 * Limits: the ustar name field holds 100 bytes (plus a 155-byte prefix); for a longer name a
 * pax or GNU writer puts the full name in an extension header before it and leaves a
 * truncated one there, which is what is shown. A header that does not check (not ustar, a
 * bad checksum) gives "the member at byte S" instead. A shard at a URL costs one range
 * request of the header's 512 bytes, made only then. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "datahelix/error.h"
#include "core/internal.h"
#include "media/pipeline_internal.h"
#include "remote/remote_lib.h"

#define TAR_BLOCK 512

/* The member name of the ustar header ending at data_offset, into name; 0 or -1. */
static int member_name(const char *file, long long data_offset, char *name, size_t size)
{
    unsigned char h[TAR_BLOCK];
    if (data_offset < TAR_BLOCK)
        return -1;
    ssize_t got = -1;
    if (dh__url_scheme(file) != DH_URL_NONE) { /* a shard at a URL: one range request */
        if (dh__media_remote_failed())
            return -1; /* the server failed (or the deadline passed): do not ask it again */
        size_t n = 0;
        if (dh__http_get_range(file, data_offset - TAR_BLOCK, TAR_BLOCK, h, &n, NULL, NULL) == 0)
            got = (ssize_t)n;
    } else {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return -1;
        got = pread(fd, h, sizeof h, (off_t)(data_offset - TAR_BLOCK));
        close(fd);
    }
    if (got != TAR_BLOCK || memcmp(h + 257, "ustar", 5) != 0)
        return -1;
    /* the checksum: the header's bytes summed with its own 8-byte field taken as spaces */
    unsigned long sum = 0, want = 0;
    for (size_t i = 0; i < TAR_BLOCK; i++)
        sum += i >= 148 && i < 156 ? ' ' : h[i];
    for (size_t i = 148; i < 156 && h[i] >= '0' && h[i] <= '7'; i++)
        want = want * 8 + (unsigned long)(h[i] - '0');
    if (sum != want)
        return -1;
    char base[101], prefix[156];
    memcpy(base, h, 100);
    base[100] = '\0';
    memcpy(prefix, h + 345, 155);
    prefix[155] = '\0';
    const char *b = base;
    while (b[0] == '.' && b[1] == '/')
        b += 2;
    snprintf(name, size, "%s%s%s", prefix, prefix[0] ? "/" : "", b);
    return 0;
}

int dh__name_tar_sample(int err, const char *path, const char *sample_id)
{
    long long start, end;
    const char *file = dh__subfile_range(path, &start, &end);
    if (start < 0)
        return dh__media_redact_error(err, path);
    char what[2048], member[300];
    snprintf(what, sizeof what, "%s", dh_last_error());
    size_t n = strlen(path);
    const char *rest =
        strncmp(what, path, n) == 0 && what[n] == ':' && what[n + 1] == ' ' ? what + n + 2 : what;
    char shown[1024]; /* a shard at a URL: printed without its query string */
    const char *shard =
        dh__url_scheme(file) != DH_URL_NONE ? dh__url_redact(file, shown, sizeof shown) : file;
    if (member_name(file, start, member, sizeof member) == 0)
        dh__set_error(err, "sample %s (member %s of shard %s): %s",
                      sample_id && *sample_id ? sample_id : "?", member, shard, rest);
    else
        dh__set_error(err, "sample %s (the member at byte %lld of shard %s): %s",
                      sample_id && *sample_id ? sample_id : "?", start, shard, rest);
    return dh__media_redact_error(err, path);
}
