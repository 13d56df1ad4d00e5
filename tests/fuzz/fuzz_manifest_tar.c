/* fuzz_manifest_tar.c: `datahelix manifest --from-tar`'s shard reader (tools/manifest_tar.c:
 * libarchive's tar reader, then the sample grouping, the data offsets and their check, the
 * caption and meta members through manifest_caption.c and manifest_meta.c) on an untrusted
 * tar, and the shard-pattern expansion (mb_shards_expand) on untrusted text.
 *
 * Input: one selector byte, then the shard's bytes. The selector: bit 0 --skip-bad-captions;
 * bit 1 --meta-ext lbl; bit 2 --ext webm besides mp4; bits 3-7 unused. Checked on an
 * accepted shard: no "internal error" in its messages (the offset check: a data offset that
 * is not where libarchive read the member from), the manifest written loads with
 * dh_manifest_load, one entry per sample reported, each a byte range of the shard inside
 * the file. Any input's first line, up to 64 bytes, is also expanded as a shard pattern:
 * accepted, at least one name; refused, a reason (no ranges and at most 3 brace groups,
 * so that one input names at most a few thousand shards).
 */
#include <sys/stat.h>

#include "fuzz_tools.h"
#include "manifest_build.h"
#include "datahelix/manifest.h"

static void fuzz_pattern(const uint8_t *data, size_t size)
{
    char pattern[65];
    size_t n = 0;
    while (n < size && n < sizeof pattern - 1 && data[n] != '\n' && data[n] != '\0') {
        pattern[n] = (char)data[n];
        n++;
    }
    pattern[n] = '\0';
    /* a range names up to 10^18 shards; the expansion's own cap (1,000,000) is what bounds
     * it, but a million names per input is too slow for a fuzzer: keep ranges short */
    size_t braces = 0;
    for (size_t i = 0; i < n; i++)
        braces += pattern[i] == '{';
    if (strstr(pattern, "..") || braces > 3) /* and lists of lists: 20^3 names at most */
        return;
    if (strstr(pattern, "://")) /* a URL prefix ending in '/' is listed: network, not parsing */
        return;
    mb_shard_list_t list = {0};
    char why[256] = "";
    int rc = mb_shards_expand(pattern, &list, why, sizeof why);
    if (rc == 0) {
        FUZZ_CHECK(list.n >= 1);
        for (size_t i = 0; i < list.n; i++)
            (void)strlen(list.shards[i]);
    } else {
        FUZZ_CHECK(rc == -1 && why[0] != '\0');
    }
    mb_shards_free(&list);
    FUZZ_CHECK(list.shards == NULL && list.n == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    fuzz_pattern(data + 1, size - 1);
    fuzz_dir_init();
    unsigned sel = data[0];
    fuzz_write_file("shard-000.tar", data + 1, size - 1);
    char shard[4200], out_path[4200];
    fuzz_path(shard, sizeof shard, "shard-000.tar");
    fuzz_path(out_path, sizeof out_path, "out.jsonl");
    char *shards[] = {shard};
    char *exts[] = {"mp4", "webm"};
    char *meta_exts[] = {"lbl"};
    mb_tar_options_t opt = {.shards = shards,
                            .n_shards = 1,
                            .exts = exts,
                            .n_exts = sel & 4 ? 2 : 1,
                            .meta_exts = meta_exts,
                            .n_meta_exts = sel & 2 ? 1 : 0};
    mb_emitter_t e;
    mb_tar_report_t report;
    fuzz_capture_begin();
    int rc = mb_emitter_open(&e, out_path, 0);
    FUZZ_CHECK(rc == 0);
    e.skip_bad_captions = (sel & 1) != 0;
    rc = mb_from_tar(&opt, &e, &report);
    int fin = mb_emitter_finish(&e, rc == 0);
    fuzz_capture_end();
    /* (unless the input holds the words itself, in a member's name) */
    int internal =
        strstr(fuzz_errors, "internal error") && !memmem(data, size, "internal error", 14);
    if (internal)
        fprintf(stderr, "%s", fuzz_errors);
    FUZZ_CHECK(!internal);
    FUZZ_CHECK(rc == 0 || rc == -1);
    if (rc != 0) {
        FUZZ_CHECK(fuzz_errors[0] != '\0'); /* a failure always says why */
        return 0;
    }
    FUZZ_CHECK(fin == 0);
    FUZZ_CHECK(report.shards_read == 1);
    dh_manifest_t *m = NULL;
    int lrc = dh_manifest_load(out_path, &m);
    if (lrc != 0)
        fprintf(stderr, "the manifest written does not load: %s\n", dh_last_error());
    FUZZ_CHECK(lrc == 0);
    FUZZ_CHECK(dh_manifest_count(m) == report.samples);
    for (size_t i = 0; i < dh_manifest_count(m); i++) {
        const dh_manifest_entry_t *ent = dh_manifest_entry(m, i);
        FUZZ_CHECK(strncmp(ent->id, "shard-000/", 10) == 0 && ent->id[10] != '\0');
        (void)strlen(ent->caption);
        long long start = -1, end = -1;
        int at = -1;
        FUZZ_CHECK(sscanf(ent->path, "subfile,,start,%lld,end,%lld,,:%n", &start, &end, &at) == 2);
        FUZZ_CHECK(at > 0 && strcmp(ent->path + at, shard) == 0);
        FUZZ_CHECK(start >= 512 && end > start && (size_t)end <= size - 1);
    }
    dh_manifest_destroy(&m);
    unlink(out_path);
    return 0;
}
