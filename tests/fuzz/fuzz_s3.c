/* fuzz_s3.c: the parsers of the S3 half (src/remote/, docs/remote.md "S3") on untrusted
 * input. The first byte picks the parser, the rest is its input:
 *
 *   0: a ListObjectsV2 reply (dh__s3_list_page_parse, expat): an accepted page has `count`
 *      objects each with a key, and a next token whenever it says it is truncated; a refused
 *      one leaves nothing;
 *   1: an error reply (dh__s3_check_response with status 403 and 404): never 0, one of the
 *      documented codes;
 *   2: an AWS INI file (dh__ini_parse): every entry has a section, a key and a value or none
 *      (a header), at a line inside the input;
 *   3: a shard pattern (dh__brace_expand, at most 1,000 names): every name is a string
 *      without the pattern's braces when it had balanced ones.
 */
#include <string.h>

#include "fuzz.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "remote/s3.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0] % 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (mode == 0) {
        dh__s3_list_page_t page;
        int rc = dh__s3_list_page_parse(text, len, "fuzz", &page);
        if (rc != 0) {
            FUZZ_CHECK(page.objects == NULL && page.count == 0 && page.next_token == NULL);
            FUZZ_CHECK(rc == DH_EPARSE || rc == DH_EIO || rc == DH_ENOMEM);
            return 0;
        }
        for (size_t i = 0; i < page.count; i++)
            FUZZ_CHECK(page.objects[i].key != NULL);
        FUZZ_CHECK(!page.truncated || page.next_token != NULL);
        dh__s3_list_page_clear(&page);
    } else if (mode == 1) {
        int rc = dh__s3_check_response(403, text, len, "fuzz");
        FUZZ_CHECK(rc == DH_EAUTH || rc == DH_ENOENT);
        rc = dh__s3_check_response(404, text, len, "fuzz");
        FUZZ_CHECK(rc == DH_ENOENT);
    } else if (mode == 2) {
        dh__ini_t ini;
        int rc = dh__ini_parse(text, len, "fuzz", &ini);
        if (rc != 0) {
            FUZZ_CHECK(ini.entries == NULL && ini.count == 0);
            FUZZ_CHECK(rc == DH_EPARSE || rc == DH_ENOMEM);
            return 0;
        }
        size_t lines = 1;
        for (size_t i = 0; i < len; i++)
            lines += text[i] == '\n';
        for (size_t i = 0; i < ini.count; i++) {
            FUZZ_CHECK(ini.entries[i].section && ini.entries[i].section[0]);
            FUZZ_CHECK(ini.entries[i].key != NULL);
            FUZZ_CHECK(ini.entries[i].line >= 1 && ini.entries[i].line <= lines);
        }
        dh__ini_clear(&ini);
    } else {
        char *pattern = dh_malloc(len + 1);
        if (!pattern)
            return 0;
        memcpy(pattern, text, len);
        pattern[len] = '\0';
        char **names = NULL;
        long n = dh__brace_expand(pattern, 1000, &names);
        if (n < 0) {
            FUZZ_CHECK(names == NULL);
            FUZZ_CHECK(n == DH_EPARSE || n == DH_ERANGE || n == DH_ENOMEM);
        } else {
            FUZZ_CHECK(n >= 1 && n <= 1000);
            for (long i = 0; i < n; i++)
                FUZZ_CHECK(names[i] && !strchr(names[i], '{') && !strchr(names[i], '}'));
            dh__brace_free(names, (size_t)n);
        }
        dh_free(pattern);
    }
    return 0;
}
