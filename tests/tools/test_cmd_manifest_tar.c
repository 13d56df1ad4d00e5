/* Tests of `datahelix manifest --from-tar` (tools/manifest_tar.c), run through $DH_CLI as a
 * real process. Shards are made here with the `tar` CLI in its three formats (ustar, pax, GNU),
 * from small files whose bytes differ member to member, so an offset that is off by a header
 * shows. The reference for each member's data offset is Python's tarfile (offset_data). */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dh_test.h"
#include "manifest_cli.h"
#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "datahelix/profile.h"

/* ---- helpers ------------------------------------------------------------------------ */

static void sh(const char *cmd)
{
    int status = system(cmd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("%s: failed (status %d)", cmd, status);
}

/* Runs "$DH_CLI manifest args", expects exit 0; returns its stderr (the caller's). */
static char *manifest_ok(const char *args)
{
    char *err_path = scratch("ok.err");
    char full[8192];
    snprintf(full, sizeof full, "manifest %s", args);
    int status = run_cli(full, err_path);
    char *err = read_all(err_path);
    if (status != 0)
        print_error("manifest %s: exit %d: %s\n", args, status, err);
    assert_int_equal(status, 0);
    free(err_path);
    return err;
}

/* Runs "$DH_CLI manifest args", expects exit status `expect`, no OUT written and every
 * string of `needles` (NULL-terminated) in stderr. */
static void manifest_fails(const char *args, const char *out, int expect,
                           const char *const *needles)
{
    char *err_path = scratch("fail.err");
    char full[8192];
    snprintf(full, sizeof full, "manifest %s", args);
    int status = run_cli(full, err_path);
    char *err = read_all(err_path);
    bool all = true;
    for (size_t i = 0; needles[i]; i++)
        all = all && strstr(err, needles[i]);
    if (status != expect || !all)
        print_error("manifest %s: exit %d (expected %d), stderr: %s\n", args, status, expect, err);
    assert_int_equal(status, expect);
    for (size_t i = 0; needles[i]; i++)
        assert_non_null(strstr(err, needles[i]));
    if (out) {
        assert_false(exists(out));
        char part[PATH_MAX];
        snprintf(part, sizeof part, "%s.part", out);
        assert_false(exists(part));
    }
    free(err);
    free(err_path);
}

/* `tar --format=FORMAT -C dir -cf tar_path MEMBERS` (members space-separated, in order). */
static void make_tar(const char *format, const char *dir, const char *tar_path, const char *members)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "tar --format=%s --no-recursion -C '%s' -cf '%s' %s", format, dir,
             tar_path, members);
    sh(cmd);
}

/* The data offset and size of a member per Python's tarfile (the reference). */
static void python_offset(const char *tar_path, const char *member, long long *offset,
                          long long *size)
{
    const char *py = getenv("DH_PYTHON_EXE");
    char *out = scratch("offsets.txt"), cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import sys, tarfile; m = tarfile.open(sys.argv[1]).getmember(sys.argv[2]); "
             "print(m.offset_data, m.size)' '%s' '%s' >'%s'",
             py && *py ? py : "python3", tar_path, member, out);
    sh(cmd);
    char *text = read_all(out);
    assert_int_equal(sscanf(text, "%lld %lld", offset, size), 2);
    free(text);
    free(out);
}

static void expect_in(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        print_error("expected <<%s>> in:\n%s\n", needle, text);
    assert_non_null(strstr(text, needle));
}

/* ---- samples, captions, ids, offsets ------------------------------------------------ */

typedef struct member {
    const char *name;
    const char *text; /* NULL: media, made distinct per member and format */
    size_t len;       /* media length (0: 37) */
} member_t;

#define LONG_DIR                                                                                   \
    "a-folder-name-long-enough-that-the-path-needs-more-than-the-hundred-bytes-of-a-tar-header-"   \
    "name-field"

/* One shard per tar format: members grouped by key (the path up to the first dot of the
 * basename), one media member per sample, captions from .txt (trimmed, BOM dropped; it wins
 * over .json) or .json ("caption", else "text"), keys without media skipped, folders
 * and names without a key ignored; each entry's offset and size are Python tarfile's offset_data
 * and size, and the bytes there are the member's. Long names force pax or GNU long-name headers (a
 * ustar prefix field in ustar). */
static void tar_samples_grouped_with_captions_and_python_offsets(void **state)
{
    static const member_t members[] = {
        {"a", "", 0}, /* the folder itself (a directory member) */
        {"a/0001.mp4", NULL, 0},
        {"a/0001.txt", "\xEF\xBB\xBF  a cat\n  on a mat \n", 0},
        {"a/0002.seg1.mkv", NULL, 0}, /* key a/0002, extension seg1.mkv */
        {"a/0002.json", "{\"caption\": \"caption key\", \"text\": \"not this\"}", 0},
        {"a/0003.webm", NULL, 0},
        {"a/0003.json", "{\"text\": \"text key\", \"fps\": 30}", 0},
        {"a/0004.txt", "a caption without a clip", 0}, /* no media: skipped */
        {"a/0005.mp4", NULL, 10000},                   /* longer than one block */
        {"a/0005.cls", "3", 0},
        {"a/0006.json", "{\"caption\": \"json loses\"}", 0},
        {"a/0006.mp4", NULL, 0},
        {"a/0006.txt", "txt wins", 0},
        {LONG_DIR "/clip.mp4", NULL, 0},
        {LONG_DIR "/clip.txt", "long caption", 0},
        {"a/.0007.mp4", "hidden", 0}, /* no key (WebDataset skips such names) */
        {"a/0008", "no dot", 0},      /* no key */
    };
    static const struct {
        const char *key, *media, *caption, *meta;
    } expected[] = {
        {"a/0001", "a/0001.mp4", "a cat\n  on a mat", ""},
        {"a/0002", "a/0002.seg1.mkv", "caption key", ""}, /* both caption keys: no meta */
        {"a/0003", "a/0003.webm", "text key", ",\"meta\":{\"fps\":30}"},
        {"a/0005", "a/0005.mp4", NULL, ",\"meta\":{\"cls\":3}"},
        {"a/0006", "a/0006.mp4", "txt wins", ""},
        {LONG_DIR "/clip", LONG_DIR "/clip.mp4", "long caption", ""},
    };
    static const char *const formats[] = {"ustar", "pax", "gnu"};
    char *dir = scratch("shards");
    for (size_t f = 0; f < LEN(formats); f++) {
        char src_name[64], names[8192] = "";
        snprintf(src_name, sizeof src_name, "src-%s", formats[f]);
        char *src = join(dir, src_name);
        for (size_t i = 0; i < LEN(members); i++) {
            if (strcmp(members[i].name, "a") == 0) {
                char cmd[4096];
                snprintf(cmd, sizeof cmd, "mkdir -p '%s/a'", src);
                sh(cmd);
            } else if (members[i].text) {
                put(src, members[i].name, members[i].text);
            } else {
                /* distinct bytes: the member's name and format, then a counter pattern */
                size_t len = members[i].len ? members[i].len : 37;
                unsigned char *data = malloc(len);
                assert_non_null(data);
                for (size_t b = 0; b < len; b++)
                    data[b] = (unsigned char)(b * 7 + i * 13 + f * 101);
                int n = snprintf((char *)data, len, "%s %s", formats[f], members[i].name);
                (void)n;
                put_bytes(src, members[i].name, data, len);
                free(data);
            }
            strcat(names, " '");
            strcat(names, members[i].name);
            strcat(names, "'");
        }
        char tar_name[64];
        snprintf(tar_name, sizeof tar_name, "%s.tar", formats[f]);
        char *tar_path = join(dir, tar_name), *out = join(dir, "manifest.jsonl"), args[4096];
        make_tar(formats[f], src, tar_path, names);
        snprintf(args, sizeof args, "--from-tar '%s' -o '%s'", tar_path, out);
        char *err = manifest_ok(args);
        expect_in(err, "wrote 6 entries");
        expect_in(err, "5 with captions (3 from .txt, 2 from .json;");
        expect_in(err, "1 keys without a media member skipped");
        expect_in(err, "3 other members");
        free(err);

        size_t tar_len;
        char *tar_bytes = read_all_n(tar_path, &tar_len), *text = read_all(out);
        char *tar_abs = realpath(tar_path, NULL);
        assert_non_null(tar_abs);
        dh_manifest_t *m = load(out);
        assert_int_equal(dh_manifest_count(m), LEN(expected));
        for (size_t i = 0; i < LEN(expected); i++) {
            long long offset, size;
            python_offset(tar_path, expected[i].media, &offset, &size);
            /* the line exactly: id, path relative to OUT's folder, offset, size, caption, meta
             * (the .json member's other keys, the .cls member as a number) */
            char line[2048], caption_json[512] = "";
            if (expected[i].caption) {
                /* the only escape the captions here need: the line break */
                char esc[256];
                size_t o = 0;
                for (const char *c = expected[i].caption; *c; c++) {
                    if (*c == '\n') {
                        esc[o++] = '\\';
                        esc[o++] = 'n';
                    } else {
                        esc[o++] = *c;
                    }
                }
                esc[o] = '\0';
                snprintf(caption_json, sizeof caption_json, ",\"caption\":\"%s\"", esc);
            }
            snprintf(line, sizeof line,
                     "{\"id\":\"%s/%s\",\"path\":\"%s\",\"offset\":%lld,\"size\":%lld%s%s}\n",
                     formats[f], expected[i].key, tar_name, offset, size, caption_json,
                     expected[i].meta);
            expect_in(text, line);
            /* the reader resolves it to the byte range, with the caption */
            const dh_manifest_entry_t *e = dh_manifest_entry(m, i);
            char want_path[4096], want_id[512];
            snprintf(want_path, sizeof want_path, "subfile,,start,%lld,end,%lld,,:%s", offset,
                     offset + size, tar_abs);
            snprintf(want_id, sizeof want_id, "%s/%s", formats[f], expected[i].key);
            assert_string_equal(e->id, want_id);
            assert_string_equal(e->path, want_path);
            assert_string_equal(e->caption, expected[i].caption ? expected[i].caption : "");
            /* and the bytes there are the member's */
            size_t member_len;
            char *member_path = join(src, expected[i].media);
            char *member = read_all_n(member_path, &member_len);
            assert_int_equal(size, (long long)member_len);
            assert_true(offset + size <= (long long)tar_len);
            assert_memory_equal(tar_bytes + offset, member, member_len);
            free(member);
            free(member_path);
        }
        dh_manifest_destroy(&m);
        free(tar_abs);
        free(text);
        free(tar_bytes);
        free(out);
        free(tar_path);
        free(src);
    }
    free(dir);
}

/* Members written as "./a/1.mp4" (tar -C dir .) have the key "a/1", not "./a/1". */
static void tar_leading_dot_slash_is_not_part_of_the_key(void **state)
{
    char *dir = scratch("dotslash"), *src = join(dir, "src");
    put(src, "a/1.mp4", "clip bytes");
    put(src, "a/1.txt", "one");
    char *tar_path = join(dir, "s.tar"), *out = join(dir, "m.jsonl"), args[4096];
    make_tar("gnu", src, tar_path, "./a/1.mp4 ./a/1.txt");
    snprintf(args, sizeof args, "--from-tar '%s' -o '%s'", tar_path, out);
    free(manifest_ok(args));
    dh_manifest_t *m = load(out);
    assert_int_equal(dh_manifest_count(m), 1);
    assert_string_equal(dh_manifest_entry(m, 0)->id, "s/a/1");
    assert_string_equal(dh_manifest_entry(m, 0)->caption, "one");
    dh_manifest_destroy(&m);
    free(out);
    free(tar_path);
    free(src);
    free(dir);
}

/* ---- shard lists --------------------------------------------------------------------- */

/* Shards s/08.tar .. s/11.tar, one sample each ("k"), its bytes naming the shard. */
static char *make_numbered_shards(void)
{
    char *dir = scratch("numbered"), *src = join(dir, "src");
    for (int i = 8; i <= 11; i++) {
        char content[32], tar_rel[32];
        snprintf(content, sizeof content, "bytes of shard %02d", i);
        put(src, "k.mp4", content);
        snprintf(tar_rel, sizeof tar_rel, "s/%02d.tar", i);
        char *tar_path = join(dir, tar_rel), *s_dir = join(dir, "s");
        assert_true(mkdir(s_dir, 0755) == 0 || errno == EEXIST);
        make_tar("ustar", src, tar_path, "k.mp4");
        free(s_dir);
        free(tar_path);
    }
    free(src);
    return dir;
}

static void expect_ids(const char *out, const char *const *ids, size_t n)
{
    dh_manifest_t *m = load(out);
    assert_int_equal(dh_manifest_count(m), n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(dh_manifest_entry(m, i)->id, ids[i]);
    dh_manifest_destroy(&m);
}

/* {08..11} keeps the width (08, 09, 10, 11), {a,b} lists, "::" joins patterns, --from-tar
 * repeats; shards are read in the order given. A shard outside OUT's folder is written with
 * its absolute path. */
static void tar_brace_ranges_keep_zero_padding_and_lists_join(void **state)
{
    char *dir = make_numbered_shards(), *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args, "--from-tar '%s/s/{08..11}.tar' -o '%s'", dir, out);
    free(manifest_ok(args));
    static const char *const all[] = {"08/k", "09/k", "10/k", "11/k"};
    expect_ids(out, all, LEN(all));
    char *text = read_all(out);
    expect_in(text, "\"path\":\"s/08.tar\"");
    expect_in(text, "\"path\":\"s/11.tar\"");
    free(text);

    snprintf(args, sizeof args,
             "--from-tar '%s/s/{11,09}.tar::%s/s/08.tar' --from-tar '%s/s/1{0..0}.tar' -o '%s'",
             dir, dir, dir, out);
    free(manifest_ok(args));
    static const char *const listed[] = {"11/k", "09/k", "08/k", "10/k"};
    expect_ids(out, listed, LEN(listed));

    /* outside OUT's folder: absolute */
    char *other = join(dir, "elsewhere"), *out2 = join(other, "m.jsonl");
    assert_int_equal(mkdir(other, 0755), 0);
    snprintf(args, sizeof args, "--from-tar '%s/s/{10..09}.tar' -o '%s'", dir, out2);
    free(manifest_ok(args));
    static const char *const down[] = {"10/k", "09/k"};
    expect_ids(out2, down, LEN(down));
    char *abs = realpath(dir, NULL), want[4096];
    assert_non_null(abs);
    snprintf(want, sizeof want, "\"path\":\"%s/s/10.tar\"", abs);
    text = read_all(out2);
    expect_in(text, want);
    free(text);
    free(abs);
    free(out2);
    free(other);
    free(out);
    free(dir);
}

/* A missing shard is an error naming it; --skip-missing skips it, names it and counts it. */
static void tar_missing_shard_is_named_or_skipped_and_counted(void **state)
{
    char *dir = make_numbered_shards(), *out = join(dir, "m.jsonl"), args[4096];
    snprintf(args, sizeof args, "--from-tar '%s/s/{08..12}.tar' -o '%s'", dir, out);
    const char *const needles[] = {"s/12.tar: cannot open the shard: No such file",
                                   "no manifest written", NULL};
    manifest_fails(args, out, 1, needles);

    snprintf(args, sizeof args, "--from-tar '%s/s/{07..12}.tar' --skip-missing -o '%s'", dir, out);
    char *err = manifest_ok(args);
    expect_in(err, "skipped ");
    expect_in(err, "s/07.tar: no such file");
    expect_in(err, "s/12.tar: no such file");
    expect_in(err, "from 6 tar shards (4 read, 2 skipped (missing)");
    free(err);
    static const char *const all[] = {"08/k", "09/k", "10/k", "11/k"};
    expect_ids(out, all, LEN(all));
    free(out);
    free(dir);
}

/* ---- refusals ------------------------------------------------------------------------ */

/* A gzip-compressed shard has no byte range to read in place: refused, by name, whatever
 * its file name says. */
static void tar_compressed_shard_is_refused(void **state)
{
    char *dir = scratch("compressed"), *src = join(dir, "src");
    put(src, "a/1.mp4", "clip");
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "tar -C '%s' -czf '%s/z.tar.gz' a/1.mp4 && cp '%s/z.tar.gz' '%s/z.tar'", src, dir, dir,
             dir);
    sh(cmd);
    char *out = join(dir, "m.jsonl"), args[4096];
    static const char *const names[] = {"z.tar.gz", "z.tar"};
    for (size_t i = 0; i < LEN(names); i++) {
        char needle[256];
        snprintf(needle, sizeof needle, "%s: compressed (gzip)", names[i]);
        snprintf(args, sizeof args, "--from-tar '%s/%s' -o '%s'", dir, names[i], out);
        const char *const needles[] = {needle, "decompress", NULL};
        manifest_fails(args, out, 1, needles);
    }
    free(out);
    free(src);
    free(dir);
}

/* A key with two media members is an error naming the shard and both members. */
static void tar_key_with_two_media_members_is_refused(void **state)
{
    char *dir = scratch("twomedia"), *src = join(dir, "src");
    put(src, "a/1.mp4", "one");
    put(src, "a/1.txt", "caption");
    put(src, "a/1.webm", "two");
    char *tar_path = join(dir, "t.tar"), *out = join(dir, "m.jsonl"), args[4096];
    make_tar("pax", src, tar_path, "a/1.mp4 a/1.txt a/1.webm");
    snprintf(args, sizeof args, "--from-tar '%s' -o '%s'", tar_path, out);
    const char *const needles[] = {"t.tar: key 'a/1' has two media members, 'a/1.mp4' and "
                                   "'a/1.webm'",
                                   NULL};
    manifest_fails(args, out, 1, needles);
    /* with --ext mp4 alone, the .webm is not media: one sample */
    snprintf(args, sizeof args, "--from-tar '%s' --ext mp4 -o '%s'", tar_path, out);
    free(manifest_ok(args));
    static const char *const ids[] = {"t/a/1"};
    expect_ids(out, ids, 1);
    free(out);
    free(tar_path);
    free(src);
    free(dir);
}

/* Caption members that cannot be read as captions, and truncated shards, are errors naming
 * the shard and the member. */
static void tar_errors_name_shard_and_member(void **state)
{
    char *dir = scratch("tarerrors"), *src = join(dir, "src");
    put(src, "a/1.mp4", "one");
    put(src, "a/1.json", "{\"caption\": ");
    put(src, "b/1.mp4", "two");
    put(src, "b/1.txt", "caf\xE9");
    put(src, "c/1.mp4", "three");
    put(src, "c/1.json", "{\"caption\": 7}");
    char *out = join(dir, "m.jsonl"), args[4096];
    static const struct {
        const char *members, *needle;
    } cases[] = {
        {"a/1.mp4 a/1.json", "bad-a.tar: member 'a/1.json':1:"},
        {"b/1.mp4 b/1.txt", "bad-b.tar: member 'b/1.txt': the caption is not valid UTF-8"},
        {"c/1.mp4 c/1.json", "bad-c.tar: member 'c/1.json': key 'caption' must be a string"},
    };
    for (size_t i = 0; i < LEN(cases); i++) {
        char tar_name[64];
        snprintf(tar_name, sizeof tar_name, "bad-%c.tar", "abc"[i]);
        char *tar_path = join(dir, tar_name);
        make_tar("gnu", src, tar_path, cases[i].members);
        snprintf(args, sizeof args, "--from-tar '%s' -o '%s'", tar_path, out);
        const char *const needles[] = {cases[i].needle, NULL};
        manifest_fails(args, out, 1, needles);
        free(tar_path);
    }
    /* a shard cut in the middle of its second member's header */
    char *tar_path = join(dir, "cut.tar"), cmd[8192];
    make_tar("ustar", src, tar_path, "a/1.mp4 b/1.mp4");
    snprintf(cmd, sizeof cmd, "truncate -s 1200 '%s'", tar_path);
    sh(cmd);
    snprintf(args, sizeof args, "--from-tar '%s' -o '%s'", tar_path, out);
    const char *const needles[] = {"cut.tar: after member 'a/1.mp4':", NULL};
    manifest_fails(args, out, 1, needles);
    /* cut inside a media member's data: a damaged shard, not an internal error (found by
     * fuzz_manifest_tar; before, "internal error: data offset 512 + size 3 lies outside") */
    make_tar("ustar", src, tar_path, "a/1.mp4");
    snprintf(cmd, sizeof cmd, "truncate -s 513 '%s'", tar_path);
    sh(cmd);
    const char *const cut_data[] = {"cut.tar: member 'a/1.mp4': its header says 3 bytes, but the "
                                    "shard ends 1 bytes after its data starts (a truncated or "
                                    "damaged shard)",
                                    NULL};
    manifest_fails(args, out, 1, cut_data);
    free(tar_path);
    free(out);
    free(src);
    free(dir);
}

/* ---- usage, progress ---------------------------------------------------------------- */

static void tar_usage_errors_exit_2_naming_the_problem(void **state)
{
    static const struct {
        const char *args, *names;
    } cases[] = {
        {"--from-tar 'x{1..}.tar' -o x.jsonl",
         "position 2: a brace with neither ',' nor '..' inside"},
        {"--from-tar 'x{a}.tar' -o x.jsonl",
         "position 2: a brace with neither ',' nor '..' inside"},
        {"--from-tar 'x{1..2.tar' -o x.jsonl", "position 2: a '{' that is never closed"},
        {"--from-tar 'x}.tar' -o x.jsonl", "position 2: a '}' that closes no '{'"},
        {"--from-tar 'a.tar::' -o x.jsonl", "an empty shard name"},
        {"--from-tar 'x{0..9999999}.tar' -o x.jsonl", "more than 1000000 names"},
        {"--from-tar a.tar --path-col p -o x.jsonl", "--path-col"},
        {"--from-tar a.tar --from-dir d -o x.jsonl", "--from-tar"},
        {"--from-tar a.tar --ext mp4,,mkv -o x.jsonl", "--ext"},
    };
    char *err_path = scratch("usage.err");
    for (size_t i = 0; i < LEN(cases); i++) {
        char args[1024];
        snprintf(args, sizeof args, "manifest %s", cases[i].args);
        int status = run_cli(args, err_path);
        char *err = read_all(err_path);
        if (status != 2 || !strstr(err, cases[i].names))
            print_error("'%s': exit %d, stderr: %s\n", cases[i].args, status, err);
        assert_int_equal(status, 2);
        assert_non_null(strstr(err, cases[i].names));
        free(err);
    }
    /* "::" joins patterns, but not inside an IPv6 literal: the shard is the whole URL (port 1
     * refuses; before, the pattern was cut at "[::" into two local names) */
    const char *ipv6 = "manifest --from-tar 'http://[::1]:1/a.tar' -o x.jsonl";
    int status = run_cli(ipv6, err_path);
    char *err = read_all(err_path);
    if (status != 1 || !strstr(err, "http://[::1]:1/a.tar: "))
        print_error("'%s': exit %d, stderr: %s\n", ipv6, status, err);
    assert_int_equal(status, 1);
    assert_non_null(strstr(err, "cannot open the shard: http://[::1]:1/a.tar: "));
    free(err);
    free(err_path);
}

/* --progress-every N: a line every N tar members scanned. */
static void tar_progress_lines_every_n_members(void **state)
{
    char *dir = scratch("tarprogress"), *src = join(dir, "src"), names[1024] = "";
    for (int i = 0; i < 5; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "c%d.mp4", i);
        put(src, rel, rel);
        strcat(names, " ");
        strcat(names, rel);
    }
    char *tar_path = join(dir, "p.tar"), *out = join(dir, "m.jsonl"), args[4096];
    make_tar("ustar", src, tar_path, names);
    snprintf(args, sizeof args, "--from-tar '%s' --progress-every 2 -o '%s'", tar_path, out);
    char *err = manifest_ok(args);
    expect_in(err, "manifest: 2 tar members scanned");
    expect_in(err, "manifest: 4 tar members scanned");
    assert_null(strstr(err, "manifest: 6 tar members scanned"));
    expect_in(err, "wrote 5 entries");
    free(err);
    free(out);
    free(tar_path);
    free(src);
    free(dir);
}

/* ---- end to end --------------------------------------------------------------------- */

/* synth makes real clips; they go into a tar shard with a caption member; manifest
 * --from-tar then probe reads every clip in place: one profile row each, the caption's
 * length in its text_len. */
static void from_tar_then_probe_profiles_every_clip(void **state)
{
    char *clips = NULL, *set = tiny_clips("tar-e2e", &clips);
    char *tar_path = join(set, "shard-000.tar"), *out = join(set, "from-tar.jsonl");
    make_tar("pax", clips, tar_path, "v0000000.mp4 v0000001.mp4 v0000001.txt v0000002.mp4");
    char args[4096];
    snprintf(args, sizeof args, "--from-tar '%s' -o '%s'", tar_path, out);
    free(manifest_ok(args));
    dh_profile_set_t *ps = probe_tiny(set, out);
    static const char *const ids[] = {"shard-000/v0000000", "shard-000/v0000001",
                                      "shard-000/v0000002"};
    for (size_t i = 0; i < 3; i++) {
        const dh_profile_row_t *row = dh_profile_set_row(ps, i);
        assert_string_equal(row->id, ids[i]);
        assert_int_equal(row->text_len, i == 1 ? (int64_t)(sizeof TINY_CAPTION - 1 + 3) / 4 : 0);
        assert_int_equal(row->frames, 4);
    }
    dh_profile_set_destroy(&ps);
    free(out);
    free(tar_path);
    free(clips);
    free(set);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(tar_samples_grouped_with_captions_and_python_offsets),
    cmocka_unit_test(tar_leading_dot_slash_is_not_part_of_the_key),
    cmocka_unit_test(tar_brace_ranges_keep_zero_padding_and_lists_join),
    cmocka_unit_test(tar_missing_shard_is_named_or_skipped_and_counted),
    cmocka_unit_test(tar_compressed_shard_is_refused),
    cmocka_unit_test(tar_key_with_two_media_members_is_refused),
    cmocka_unit_test(tar_errors_name_shard_and_member),
    cmocka_unit_test(tar_usage_errors_exit_2_naming_the_problem),
    cmocka_unit_test(tar_progress_lines_every_n_members),
    cmocka_unit_test(from_tar_then_probe_profiles_every_clip),
};

DH_TEST_MAIN(tests)
