/* manifest_caption.c: the caption rules `datahelix manifest` applies to a caption file, shared
 * by the folder walker (a sidecar file beside a clip, manifest_dir.c) and the tar reader (a
 * member of the same sample, manifest_tar.c), so both sources read a caption the same way
 * (docs/datasets.md): a .txt is its text, trimmed; a .json is its "caption" or "text" key. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "manifest_build.h"

int mb_caption_text(mb_emitter_t *e, char *text, size_t len, const char *where)
{
    if (memchr(text, '\0', len))
        return mb_bad_caption(e, where, "the caption holds a NUL byte (not a text file?)");
    json_t *check = json_stringn(text, len); /* NULL: not UTF-8 */
    if (!check)
        return mb_bad_caption(e, where, "the caption is not valid UTF-8");
    json_decref(check);
    char *start = text;
    if (len >= 3 && (unsigned char)start[0] == 0xEF && (unsigned char)start[1] == 0xBB &&
        (unsigned char)start[2] == 0xBF)
        start += 3;
    while (*start && isspace((unsigned char)*start))
        start++;
    char *end = start + strlen(start);
    while (end > start && isspace((unsigned char)end[-1]))
        *--end = '\0';
    memmove(text, start, (size_t)(end - start) + 1);
    return 0;
}

int mb_caption_json(mb_emitter_t *e, json_t *root, const char *where, char **caption, int *keyless)
{
    *caption = NULL;
    *keyless = 0;
    if (!json_is_object(root))
        return mb_bad_caption(e, where, "not a JSON object");
    const char *key = json_object_get(root, "caption") ? "caption" : "text";
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *keyless = 1;
        return 0;
    }
    if (!json_is_string(v))
        return mb_bad_caption(e, where, "key '%s' must be a string", key);
    if (!(*caption = strdup(json_string_value(v))))
        return mb_error("out of memory");
    return 0;
}
