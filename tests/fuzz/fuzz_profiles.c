/* fuzz_profiles.c: the profiles JSONL reader (src/model/profile_read.c) on untrusted text,
 * including its own scanner of the raw line that keeps unknown fields verbatim ("extra",
 * profile_extra.c).
 *
 * The input is a whole profiles file (dh_profile_set_load_buffer). Checked on an accepted
 * one: each row written back (dh_profile_row_write) reads back as the same row, every field
 * and the extra text alike (docs/profiles.md: the format round-trips).
 */
#include <string.h>

#include "fuzz.h"
#include "datahelix/error.h"
#include "datahelix/profile.h"

static int same_string(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

static void check_same_row(const dh_profile_row_t *a, const dh_profile_row_t *b)
{
    FUZZ_CHECK(strcmp(a->id, b->id) == 0);
    FUZZ_CHECK(strcmp(a->uri, b->uri) == 0);
    FUZZ_CHECK(strcmp(a->profile_key, b->profile_key) == 0);
    FUZZ_CHECK(a->frames == b->frames && a->height == b->height && a->width == b->width);
    FUZZ_CHECK(a->tokens_est == b->tokens_est);
    FUZZ_CHECK(a->cpu_s_est == b->cpu_s_est);
    FUZZ_CHECK(a->in_bytes == b->in_bytes && a->out_bytes == b->out_bytes);
    FUZZ_CHECK(a->duration_s == b->duration_s && a->fps == b->fps);
    FUZZ_CHECK(a->text_len == b->text_len);
    FUZZ_CHECK(same_string(a->codec, b->codec));
    FUZZ_CHECK(same_string(a->node, b->node));
    FUZZ_CHECK(same_string(a->extra, b->extra));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dh_profile_set_t *set = NULL;
    FUZZ_CHECK(dh_profile_set_new(&set) == 0);
    int rc = dh_profile_set_load_buffer(set, (const char *)data, size, "fuzz.jsonl");
    FUZZ_CHECK(rc == 0 || rc == DH_EPARSE || rc == DH_ESCHEMA || rc == DH_ENOMEM);

    /* The rows read before any bad line stay in the set (profile.h): write them back. */
    size_t count = dh_profile_set_count(set);
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    FUZZ_CHECK(f);
    for (size_t i = 0; i < count; i++)
        FUZZ_CHECK(dh_profile_row_write(f, dh_profile_set_row(set, i)) == 0);
    FUZZ_CHECK(fclose(f) == 0);

    dh_profile_set_t *again = NULL;
    FUZZ_CHECK(dh_profile_set_new(&again) == 0);
    FUZZ_CHECK(dh_profile_set_load_buffer(again, text, text_len, "written.jsonl") == 0);
    FUZZ_CHECK(dh_profile_set_count(again) == count);
    for (size_t i = 0; i < count; i++)
        check_same_row(dh_profile_set_row(set, i), dh_profile_set_row(again, i));
    FUZZ_CHECK(dh_profile_set_key_count(again) == dh_profile_set_key_count(set));

    free(text); /* open_memstream's buffer comes from the C library */
    dh_profile_set_destroy(&again);
    dh_profile_set_destroy(&set);
    return 0;
}
