/* cmd_manifest.c: `datahelix manifest`, writes the manifest JSONL that `probe` reads from a
 * data set as people store it: a folder of clips with caption sidecars (manifest_dir.c), a
 * CSV/TSV/JSON-lines metadata table (manifest_table.c), or WebDataset tar shards
 * (manifest_tar.c); docs/datasets.md. Thin: parse the
 * options, run one source into the emitter (manifest_emit.c), summarise. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/clock.h"
#include "cli.h"
#include "manifest_build.h"

#define CMD "manifest"
#define DEFAULT_EXTS "mp4,m4v,mov,mkv,webm,avi,mpg,mpeg,flv"
#define MAX_EXTS 64
#define MAX_PATTERNS 256

static void usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix manifest --from-dir DIR [--ext LIST] -o OUT.jsonl\n"
            "       datahelix manifest --from-csv FILE --path-col NAME [--caption-col NAME]\n"
            "                          [--id-col NAME] [--meta-col NAME...] [--root DIR]\n"
            "                          [--delimiter C] [--skip-missing] -o OUT.jsonl\n"
            "       datahelix manifest --from-tar PATTERN [--from-tar PATTERN...] [--ext LIST]\n"
            "                          [--meta-ext LIST] [--skip-missing] -o OUT.jsonl\n"
            "       (each also takes --skip-bad-captions)\n"
            "\n"
            "Writes a manifest (one {\"id\", \"path\", \"caption\", \"meta\"} JSON object a line,\n"
            "the format `datahelix synth` writes and `datahelix probe` reads; docs/datasets.md).\n"
            "\"meta\" holds a sample's labels and other metadata (below), which the Python\n"
            "loader joins into each batch by sample id (batch[\"label\"]; docs/python.md). A\n"
            "text value that reads as a decimal integer or real becomes a number (\"007\" stays\n"
            "text).\n"
            "Paths are written relative to OUT's folder when the file lies under it, else\n"
            "absolute. OUT is written through OUT.part and renamed when complete, so a\n"
            "failed run leaves no manifest.\n"
            "\n"
            "--from-dir DIR walks DIR recursively and takes every file whose extension is in\n"
            "the list (case-insensitive), sorted by relative path (byte order); names\n"
            "starting with '.' are skipped, links to folders are not followed. The id is the\n"
            "path relative to DIR. The caption comes from a sidecar with the same stem:\n"
            "STEM.txt (its text, trimmed), else STEM.json (its \"caption\" or \"text\" key).\n"
            "The other keys of STEM.json are the clip's meta.\n"
            "\n"
            "--from-csv FILE reads a metadata table, one entry per row: CSV (RFC 4180 quoting:\n"
            "quoted fields may hold delimiters, doubled quotes and newlines), TSV (by the\n"
            ".tsv or .tab extension, or --delimiter), or JSON lines (.jsonl, .ndjson, .json:\n"
            "one object a line, the keys as columns). The first CSV/TSV line is the header.\n"
            "The id is the --id-col value, else the path as written in the table. Every\n"
            "local path must name an existing file; a URL path, or a relative one under a URL\n"
            "--root (s3://bucket/prefix, https://host/dir: joined to it), is not checked here\n"
            "(probe names what cannot be read). The --meta-col columns are the row's meta (an\n"
            "empty cell is left out).\n"
            "\n"
            "--from-tar PATTERN reads WebDataset tar shards without extracting them: PATTERN is\n"
            "a shard ('shards/000.tar'), a brace range ('shards/{000..099}.tar': zero padding\n"
            "kept), a brace list ('{train,val}.tar'), or several joined by '::'; --from-tar may\n"
            "be repeated. A shard may be a URL (http://, https://, s3://bucket/key: its headers\n"
            "are read by range requests) and 's3://bucket/prefix/' (a trailing '/') takes every\n"
            ".tar object listed under the prefix. A member's key is its path up to the first dot "
            "of its basename\n"
            "(dir/abc.seg1.mp4: key dir/abc); consecutive members with one key are a sample.\n"
            "A sample has exactly one media member (its last extension in the list; two are\n"
            "an error, none: the key is skipped and counted); its caption is the key's .txt\n"
            "member (trimmed), else its .json member's \"caption\" or \"text\" key. Its meta:\n"
            "the .json member's other keys, its .cls member (as \"cls\") and each --meta-ext\n"
            "member (as its extension), trimmed. Each sample is a line {\"id\": \"SHARD/KEY\",\n"
            "\"path\": the shard, \"offset\", \"size\": the media member's data in the shard,\n"
            "\"caption\", \"meta\"} that probe and decode read in place.\n"
            "SHARD is the shard's file name without .tar. Shards must be plain, uncompressed\n"
            "tar (ustar, pax or GNU): a compressed one (.tar.gz) is refused.\n"
            "\n"
            "options:\n"
            "  -d, --from-dir DIR       the folder to walk\n"
            "  -e, --ext LIST           extensions to take, comma-separated (default\n"
            "                           " DEFAULT_EXTS ")\n"
            "  -t, --from-tar PATTERN   the tar shards to read (repeatable)\n"
            "  -c, --from-csv FILE      the metadata table to read\n"
            "  -p, --path-col NAME      the column (key) holding each file's path (required\n"
            "                           with --from-csv)\n"
            "      --caption-col NAME   the column holding the caption (default: none)\n"
            "      --id-col NAME        the column holding the id (default: the path)\n"
            "      --meta-col NAME      a column kept in the entry's meta (repeatable; '*': every\n"
            "                           column but the path, caption and id columns)\n"
            "      --meta-ext LIST      tar members kept in the sample's meta besides .cls,\n"
            "                           comma-separated extensions (e.g. txt,seg.cls)\n"
            "  -r, --root DIR           the folder relative paths start from (default: FILE's\n"
            "                           folder)\n"
            "      --delimiter C        the field delimiter, one character or 'tab' (default:\n"
            "                           ',' or, for .tsv/.tab, tab); reads FILE as CSV/TSV\n"
            "      --skip-missing       skip rows whose file does not exist, or shards that do\n"
            "                           not exist (counted, the first 10 named on stderr)\n"
            "                           instead of failing\n"
            "      --skip-bad-captions  skip entries whose caption cannot be used (a caption file\n"
            "                           that cannot be read, is not UTF-8 or holds a NUL byte, a\n"
            "                           .json that is not a JSON object; counted, the first 10\n"
            "                           named on stderr) instead of failing\n"
            "  -o, --output OUT         the manifest to write (required)\n"
            "      --progress-every N   a progress line on stderr every N files (or tar members)\n"
            "                           scanned and every N entries written (default 10000,\n"
            "                           0: none)\n"
            "%s"
            "  -h, --help               this text\n"
            "\n"
            "Errors name the file, line, row and column at fault (a missing column, a file that\n"
            "does not exist, a duplicate id, malformed quoting, an unreadable folder), or the\n"
            "shard and member (a missing or compressed shard, two media members).\n"
            "Exit status: 0 success, 1 failure (no manifest written), 2 usage error.\n",
            DH_CLI_S3_USAGE);
}

static int usage_error(const char *what)
{
    fprintf(stderr, "datahelix %s: %s (see --help)\n", CMD, what);
    return 2;
}

/* "mp4,.MKV" -> {"mp4", "mkv"} in buf (lower case, no dots). */
static int parse_exts(const char *list, char *buf, size_t buf_size, char **exts, size_t *n)
{
    if (strlen(list) >= buf_size)
        return usage_error("--ext: the list is too long");
    strcpy(buf, list);
    *n = 0;
    char *save = NULL;
    for (char *p = buf;; p = NULL) {
        char *tok = strtok_r(p, ",", &save);
        if (!tok)
            break;
        while (*tok == '.')
            tok++;
        if (!*tok || strchr(tok, '/') || strchr(tok, ' '))
            return usage_error("--ext expects extensions like mp4,mkv,webm");
        for (char *c = tok; *c; c++)
            *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
        if (*n == MAX_EXTS)
            return usage_error("--ext: too many extensions");
        exts[(*n)++] = tok;
    }
    if (*n == 0 || strstr(list, ",,") || list[strlen(list) - 1] == ',')
        return usage_error("--ext expects extensions like mp4,mkv,webm");
    return 0;
}

int dh_cmd_manifest(int argc, char **argv)
{
    enum {
        OPT_CAPTION_COL = 256,
        OPT_ID_COL,
        OPT_DELIMITER,
        OPT_SKIP_MISSING,
        OPT_PROGRESS,
        OPT_META_COL,
        OPT_META_EXT,
        OPT_SKIP_BAD_CAPTIONS
    };
    static const struct option options[] = {
        {"from-dir", required_argument, NULL, 'd'},
        {"ext", required_argument, NULL, 'e'},
        {"from-csv", required_argument, NULL, 'c'},
        {"from-tar", required_argument, NULL, 't'},
        {"path-col", required_argument, NULL, 'p'},
        {"caption-col", required_argument, NULL, OPT_CAPTION_COL},
        {"id-col", required_argument, NULL, OPT_ID_COL},
        {"root", required_argument, NULL, 'r'},
        {"delimiter", required_argument, NULL, OPT_DELIMITER},
        {"skip-missing", no_argument, NULL, OPT_SKIP_MISSING},
        {"meta-col", required_argument, NULL, OPT_META_COL},
        {"meta-ext", required_argument, NULL, OPT_META_EXT},
        {"skip-bad-captions", no_argument, NULL, OPT_SKIP_BAD_CAPTIONS},
        {"output", required_argument, NULL, 'o'},
        {"progress-every", required_argument, NULL, OPT_PROGRESS},
        DH_CLI_S3_LONGOPTS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *from_dir = NULL, *ext_list = NULL, *output = NULL;
    mb_table_options_t table = {0};
    const char *patterns[MAX_PATTERNS];
    size_t n_patterns = 0;
    int skip_missing = 0, skip_bad_captions = 0;
    const char *meta_cols[MAX_PATTERNS];
    const char *meta_ext_list = NULL;
    unsigned long long progress_every = 10000;
    dh_cli_s3_t s3 = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "d:e:c:t:p:r:o:h", options, NULL)) != -1) {
        if (dh_cli_s3_option(&s3, c, optarg))
            continue;
        switch (c) {
        case 'd':
            from_dir = optarg;
            break;
        case 'e':
            ext_list = optarg;
            break;
        case 'c':
            table.file = optarg;
            break;
        case 't':
            if (n_patterns == MAX_PATTERNS)
                return usage_error("--from-tar: too many patterns");
            patterns[n_patterns++] = optarg;
            break;
        case 'p':
            table.path_col = optarg;
            break;
        case OPT_CAPTION_COL:
            table.caption_col = optarg;
            break;
        case OPT_ID_COL:
            table.id_col = optarg;
            break;
        case 'r':
            table.root = optarg;
            break;
        case OPT_DELIMITER:
            if (strcmp(optarg, "tab") == 0 || strcmp(optarg, "\\t") == 0)
                table.delimiter = '\t';
            else if (strlen(optarg) == 1 && optarg[0] != '"' && optarg[0] != '\n' &&
                     optarg[0] != '\r')
                table.delimiter = (unsigned char)optarg[0];
            else
                return usage_error("--delimiter expects one character (not a quote or a line "
                                   "break) or 'tab'");
            break;
        case OPT_SKIP_MISSING:
            skip_missing = 1;
            break;
        case OPT_META_COL:
            if (!*optarg)
                return usage_error("--meta-col expects a column name, or '*'");
            if (table.n_meta_cols == MAX_PATTERNS)
                return usage_error("--meta-col: too many columns");
            meta_cols[table.n_meta_cols++] = optarg;
            break;
        case OPT_META_EXT:
            meta_ext_list = optarg;
            break;
        case OPT_SKIP_BAD_CAPTIONS:
            skip_bad_captions = 1;
            break;
        case 'o':
            output = optarg;
            break;
        case OPT_PROGRESS:
            if (dh_cli_parse_u64(CMD, "--progress-every", optarg, 0, 1000000000ULL,
                                 &progress_every) < 0)
                return 2;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (dh_cli_no_extra_args(CMD, argc, argv, optind) < 0)
        return 2;
    if ((from_dir != NULL) + (table.file != NULL) + (n_patterns > 0) != 1)
        return usage_error("give one of --from-dir DIR, --from-csv FILE and --from-tar PATTERN");
    if (!output || !*output)
        return usage_error("-o/--output is required");
    if (dh_cli_s3_apply(CMD, &s3) < 0)
        return 1;
    if (!table.file &&
        (table.path_col || table.caption_col || table.id_col || table.root || table.delimiter))
        return usage_error("--path-col, --caption-col, --id-col, --root and --delimiter go with "
                           "--from-csv");
    if (from_dir && skip_missing)
        return usage_error("--skip-missing goes with --from-csv and --from-tar");
    if (table.file && ext_list)
        return usage_error("--ext goes with --from-dir and --from-tar");
    if (!table.file && table.n_meta_cols)
        return usage_error("--meta-col goes with --from-csv (--from-tar keeps .cls and .json "
                           "members, --from-dir the .json sidecar's keys)");
    if (!n_patterns && meta_ext_list)
        return usage_error("--meta-ext goes with --from-tar");
    table.meta_cols = meta_cols;
    table.skip_missing = skip_missing;
    if (table.file && (!table.path_col || !*table.path_col))
        return usage_error("--from-csv needs --path-col NAME");

    char ext_buf[1024], *exts[MAX_EXTS];
    size_t n_exts = 0;
    if (!table.file &&
        parse_exts(ext_list ? ext_list : DEFAULT_EXTS, ext_buf, sizeof ext_buf, exts, &n_exts) != 0)
        return 2;
    char meta_ext_buf[1024], *meta_exts[MAX_EXTS];
    size_t n_meta_exts = 0;
    if (meta_ext_list &&
        parse_exts(meta_ext_list, meta_ext_buf, sizeof meta_ext_buf, meta_exts, &n_meta_exts) != 0)
        return 2;
    mb_shard_list_t shards = {0};
    for (size_t i = 0; i < n_patterns; i++) {
        char why[1024], what[2048];
        int expanded = mb_shards_expand(patterns[i], &shards, why, sizeof why);
        if (expanded < 0) {
            mb_shards_free(&shards);
            snprintf(what, sizeof what, "--from-tar '%s': %s", patterns[i], why);
            if (expanded == -1)
                return usage_error(what);
            fprintf(stderr, "datahelix %s: %s\n", CMD, what);
            return 1;
        }
    }

    uint64_t start = dh_clock_now_ns();
    mb_emitter_t e;
    int rc = mb_emitter_open(&e, output, progress_every);
    e.skip_bad_captions = skip_bad_captions;
    mb_dir_report_t dir_report = {0};
    mb_table_report_t table_report = {0};
    mb_tar_report_t tar_report = {0};
    if (rc == 0 && n_patterns) {
        mb_tar_options_t opt = {.shards = shards.shards,
                                .n_shards = shards.n,
                                .exts = exts,
                                .n_exts = n_exts,
                                .skip_missing = skip_missing,
                                .meta_exts = meta_exts,
                                .n_meta_exts = n_meta_exts};
        rc = mb_from_tar(&opt, &e, &tar_report);
    } else if (rc == 0 && from_dir) {
        const char *slash = strrchr(output, '/');
        mb_dir_options_t opt = {.dir = from_dir,
                                .skip_name = slash ? slash + 1 : output,
                                .exts = exts,
                                .n_exts = n_exts};
        rc = mb_from_dir(&opt, &e, &dir_report);
    } else if (rc == 0) {
        rc = mb_from_table(&table, &e, &table_report);
    }
    size_t written = e.written, with_caption = e.with_caption, n_shards = shards.n;
    size_t with_meta = e.with_meta, bad_captions = e.skipped_bad_captions;
    mb_shards_free(&shards);
    if (mb_emitter_finish(&e, rc == 0) != 0)
        rc = -1;
    if (rc != 0) {
        fprintf(stderr, "datahelix %s: no manifest written\n", CMD);
        return 1;
    }
    double elapsed = dh_clock_elapsed_s(start, dh_clock_now_ns());
    if (bad_captions)
        fprintf(stderr,
                "manifest: skipped %zu entries whose caption cannot be used "
                "(--skip-bad-captions)%s\n",
                bad_captions, bad_captions > 10 ? "; the first 10 are named above" : "");
    if (n_patterns)
        fprintf(stderr,
                "manifest: wrote %zu entries to %s from %zu tar shards (%zu read, %zu skipped "
                "(missing); %zu members), %zu with captions (%zu from .txt, %zu from .json; %zu "
                ".json without a caption or text key), %zu keys without a media member skipped, "
                "%zu other members (folders, links, names without a key), in %.1f s\n",
                written, output, n_shards, tar_report.shards_read, tar_report.shards_missing,
                tar_report.members, with_caption, tar_report.captions_txt, tar_report.captions_json,
                tar_report.json_without_caption, tar_report.keys_without_media,
                tar_report.other_members, elapsed);
    else if (from_dir)
        fprintf(stderr,
                "manifest: wrote %zu entries to %s from %s (%zu files seen), %zu with captions "
                "(%zu from .txt, %zu from .json; %zu .json without a caption or text key), "
                "in %.1f s\n",
                written, output, from_dir, dir_report.files_seen, with_caption,
                dir_report.captions_txt, dir_report.captions_json, dir_report.json_without_caption,
                elapsed);
    else
        fprintf(stderr,
                "manifest: wrote %zu entries to %s from %s (%s, %zu rows), %zu with captions, "
                "%zu rows skipped (file missing), in %.1f s\n",
                written, output, table.file, table_report.format, table_report.rows, with_caption,
                table_report.skipped_missing, elapsed);
    fprintf(stderr, "manifest: %zu entries with meta\n", with_meta);
    return 0;
}
