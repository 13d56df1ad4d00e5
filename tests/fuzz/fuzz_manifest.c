/* fuzz_manifest.c: the manifest reader (src/media/manifest.c) on untrusted JSONL.
 *
 * The input is a whole manifest, read with dh_manifest_load_buffer as if it were
 * "data/set/manifest.jsonl" (relative paths join "data/set"). Checked on an accepted one:
 * every entry has a non-empty id and path, a caption, a path that is the line's joined to
 * the folder or absolute (behind a byte-range prefix for tar members), and overrides in
 * the documented ranges; every string is read to its end, so ASan bounds it.
 */
#include <string.h>

#include "fuzz.h"
#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "remote/remote_lib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dh_manifest_t *m = NULL;
    int rc = dh_manifest_load_buffer((const char *)data, size, "data/set/manifest.jsonl", &m);
    if (rc != 0) {
        FUZZ_CHECK(m == NULL);
        FUZZ_CHECK(rc == DH_EPARSE || rc == DH_ESCHEMA || rc == DH_ENOMEM);
        return 0;
    }
    size_t n = dh_manifest_count(m);
    for (size_t i = 0; i < n; i++) {
        const dh_manifest_entry_t *e = dh_manifest_entry(m, i);
        FUZZ_CHECK(strlen(e->id) > 0);
        const char *path = e->path;
        if (strncmp(path, "subfile,,start,", 15) == 0) {
            path = strstr(path, ",,:");
            FUZZ_CHECK(path);
            path += 3;
        }
        if (dh__url_scheme(path) != DH_URL_NONE) { /* a URL is kept as written, naming a host */
            FUZZ_CHECK(dh__url_check_host(path) == 0);
            continue;
        }
        FUZZ_CHECK(path[0] == '/' || strncmp(path, "data/set/", 9) == 0);
        FUZZ_CHECK(strlen(path) > (path[0] == '/' ? 0 : 9));
        (void)strlen(e->caption);
        FUZZ_CHECK(e->text_tokens >= -1);
        FUZZ_CHECK(e->frames >= 0 && e->frames <= 1 << 20);
        FUZZ_CHECK(e->height >= 0 && e->height <= 1 << 20);
        FUZZ_CHECK(e->width >= 0 && e->width <= 1 << 20);
    }
    dh_manifest_destroy(&m);
    FUZZ_CHECK(m == NULL);
    return 0;
}
