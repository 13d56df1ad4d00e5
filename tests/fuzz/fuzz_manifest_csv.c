/* fuzz_manifest_csv.c: `datahelix manifest --from-csv`'s table reader (tools/manifest_table.c,
 * with manifest_meta.c and manifest_caption.c behind it) on untrusted CSV, TSV and JSON lines.
 *
 * Input: one selector byte, then the table file's bytes. The selector: bits 0-1 the format
 * (0 CSV as table.csv, 1 TSV as table.tsv, 2 JSON lines as table.jsonl, 3 CSV with ';' as
 * the delimiter); bit 2 --caption-col caption; bit 3 --id-col id; bit 4 --meta-col '*';
 * bit 5 --meta-col label; bit 6 --skip-missing; bit 7 --skip-bad-captions. The path column
 * is "path"; the scratch folder (the root) holds the files a.mp4, b.mp4 and sub/c.mp4 and a
 * folder d. Checked on an accepted table: the manifest written loads with dh_manifest_load,
 * with as many entries as the report says were taken, and rows = taken + skipped_missing.
 */
#include <sys/stat.h>

#include "fuzz_tools.h"
#include "manifest_build.h"
#include "datahelix/manifest.h"
#include "remote/remote_lib.h"

static void setup(void)
{
    if (fuzz_dir[0])
        return;
    fuzz_dir_init();
    char path[4200];
    FUZZ_CHECK(mkdir(fuzz_path(path, sizeof path, "sub"), 0755) == 0);
    FUZZ_CHECK(mkdir(fuzz_path(path, sizeof path, "d"), 0755) == 0);
    fuzz_write_file("a.mp4", (const uint8_t *)"a", 1);
    fuzz_write_file("b.mp4", (const uint8_t *)"b", 1);
    fuzz_write_file("sub/c.mp4", (const uint8_t *)"c", 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    setup();
    unsigned sel = data[0];
    static const char *names[] = {"table.csv", "table.tsv", "table.jsonl", "table.csv"};
    const char *name = names[sel & 3];
    fuzz_write_file(name, data + 1, size - 1);
    char file[4200], out_path[4200];
    fuzz_path(file, sizeof file, name);
    fuzz_path(out_path, sizeof out_path, "out.jsonl");
    const char *meta_cols[2];
    size_t n_meta = 0;
    if (sel & 16)
        meta_cols[n_meta++] = "*";
    if (sel & 32)
        meta_cols[n_meta++] = "label";
    mb_table_options_t opt = {.file = file,
                              .path_col = "path",
                              .caption_col = sel & 4 ? "caption" : NULL,
                              .id_col = sel & 8 ? "id" : NULL,
                              .delimiter = (sel & 3) == 3 ? ';' : 0,
                              .skip_missing = (sel & 64) != 0,
                              .meta_cols = meta_cols,
                              .n_meta_cols = n_meta};
    mb_emitter_t e;
    mb_table_report_t report;
    fuzz_capture_begin();
    int rc = mb_emitter_open(&e, out_path, 0);
    FUZZ_CHECK(rc == 0);
    e.skip_bad_captions = (sel & 128) != 0;
    rc = mb_from_table(&opt, &e, &report);
    int fin = mb_emitter_finish(&e, rc == 0);
    fuzz_capture_end();
    FUZZ_CHECK(rc == 0 || rc == -1);
    if (rc != 0) {
        FUZZ_CHECK(fuzz_errors[0] != '\0'); /* a failure always says why */
        return 0;
    }
    FUZZ_CHECK(fin == 0);
    FUZZ_CHECK(report.rows >= report.taken + report.skipped_missing);
    dh_manifest_t *m = NULL;
    int lrc = dh_manifest_load(out_path, &m);
    if (lrc != 0)
        fprintf(stderr, "the manifest written does not load: %s\n", dh_last_error());
    FUZZ_CHECK(lrc == 0);
    FUZZ_CHECK(dh_manifest_count(m) == report.taken);
    for (size_t i = 0; i < dh_manifest_count(m); i++) {
        const dh_manifest_entry_t *ent = dh_manifest_entry(m, i);
        FUZZ_CHECK(ent->id[0] != '\0');
        (void)strlen(ent->caption);
        if (dh__url_scheme(ent->path) != DH_URL_NONE) { /* not fetched: it names a host */
            FUZZ_CHECK(dh__url_check_host(ent->path) == 0);
            continue;
        }
        struct stat st;
        FUZZ_CHECK(stat(ent->path, &st) == 0 && S_ISREG(st.st_mode));
    }
    dh_manifest_destroy(&m);
    unlink(out_path);
    return 0;
}
