/* remote/whole.c: a small object read whole (a manifest, a profile set at a URL): its size
 * (one range request of byte 0), then one range GET of all of it. Not through the blocks of
 * reader.c: a manifest is read once, start to end. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/remote_lib.h"

int dh__remote_read_whole(const char *url, size_t max_bytes, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int64_t size = 0;
    int rc = dh__http_size(url, &size, NULL);
    if (rc < 0)
        return rc;
    char shown[512];
    dh__url_redact(url, shown, sizeof shown);
    if ((uint64_t)size > max_bytes)
        return dh__set_error(DH_ERANGE, "%s: %" PRId64 " bytes, more than the %zu read whole",
                             shown, size, max_bytes);
    char *buf = dh_malloc((size_t)size + 1);
    if (!buf)
        return dh__set_error(DH_ENOMEM, "%s: out of memory for %" PRId64 " bytes", shown, size);
    size_t got = 0;
    if (size > 0 && (rc = dh__http_get_range(url, 0, (size_t)size, buf, &got, NULL, NULL)) < 0) {
        dh_free(buf);
        return rc;
    }
    if (got != (size_t)size) {
        dh_free(buf);
        return dh__set_error(DH_EIO, "%s: %zu of %" PRId64 " bytes read (changed meanwhile?)",
                             shown, got, size);
    }
    buf[got] = '\0';
    *data = buf;
    *len = got;
    return 0;
}
