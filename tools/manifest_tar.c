/* manifest_tar.c: `datahelix manifest --from-tar` (manifest_build.h): one manifest entry per
 * WebDataset sample in a list of tar shards, each pointing at its media member's bytes inside
 * the shard (path, offset, size), so probe and decode read it in place through FFmpeg's
 * subfile protocol and nothing is ever extracted (docs/datasets.md "From WebDataset tar
 * shards"). Also the shard-list expansion ('shards/{000..099}.tar').
 *
 * WebDataset's rules: a member's key is its path up to the first dot of its basename, its
 * extension everything after that dot (dir/abc.seg1.mp4: key dir/abc, extension seg1.mp4);
 * consecutive members with one key form a sample (the writer writes them together and
 * WebDataset's reader groups them the same way). A sample is a key with exactly one media
 * member (its last extension in --ext); its caption is the key's .txt member, else its .json
 * member's "caption" or "text" key (manifest_caption.c). Its "meta" (manifest_meta.c): the
 * .json member's other keys, then the .cls member and the --meta-ext members, each under its
 * extension, its trimmed text as a number when it reads as one.
 *
 * The data offset: libarchive hands out the position of an entry's first header
 * (archive_read_header_position), which for pax ('x', 'g') and GNU long-name ('L', 'K')
 * entries is the extension header, not the data. Instead, right after
 * archive_read_next_header the tar reader has consumed exactly the entry's headers, so the
 * bytes consumed from the file, archive_filter_bytes(a, -1), are the data offset of an
 * uncompressed tar (its read-ahead buffer is not counted: it is the consumed position).
 * Every media member's offset is checked: the first bytes libarchive returns for the member
 * must equal the file's bytes at that offset (pread), or the run fails naming the member.
 * Compressed shards are refused: a member of a .tar.gz has no byte range in the file.
 *
 * Cost: per member one 512-byte header (plus extension headers), read in 64 KiB blocks, and
 * for a media member one pread of up to 4 KiB for the check; the rest of each member is
 * skipped with lseek, so a shard of large clips costs about one block read per member.
 * Memory: one sample at a time, plus the emitter's id set. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>
#include <jansson.h>

#include "datahelix/error.h"
#include "manifest_build.h"
#include "remote/remote_lib.h"

#define MAX_SHARDS 1000000
#define CHECK_BYTES 4096                      /* compared at each media member's offset */
#define MAX_CAPTION_MEMBER (16 * 1024 * 1024) /* a .txt or .json larger is an error */
#define BLOCK_SIZE (64 * 1024)

/* ---- the shard list ------------------------------------------------------------------- */

static int push_shard(mb_shard_list_t *list, char *shard, char *why, size_t why_size)
{
    if (list->n == MAX_SHARDS) {
        free(shard);
        snprintf(why, why_size, "more than %d shards", MAX_SHARDS);
        return -1;
    }
    if (list->n == list->cap) {
        size_t cap = list->cap ? list->cap * 2 : 64;
        char **grown = realloc(list->shards, cap * sizeof *grown);
        if (!grown) {
            free(shard);
            snprintf(why, why_size, "out of memory");
            return -1;
        }
        list->shards = grown;
        list->cap = cap;
    }
    list->shards[list->n++] = shard;
    return 0;
}

/* The next "::" of a pattern list outside an IPv6 literal's brackets ("http://[::1]:8080/"). */
static const char *next_separator(const char *s)
{
    int in_brackets = 0;
    for (; *s; s++) {
        if (*s == '[')
            in_brackets = 1;
        else if (*s == ']')
            in_brackets = 0;
        else if (!in_brackets && s[0] == ':' && s[1] == ':')
            return s;
    }
    return NULL;
}

/* "s3://bucket/prefix/": every object under the prefix whose name ends in .tar, in key order
 * (ListObjectsV2, paginated). */
static int push_listing(const char *prefix_url, mb_shard_list_t *list, char *why, size_t why_size)
{
    dh__remote_object_t *objects = NULL;
    size_t count = 0;
    if (dh__remote_s3_list(prefix_url, &objects, &count) < 0) {
        snprintf(why, why_size, "%s", dh_last_error());
        return -2;
    }
    int rc = 0;
    size_t taken = 0;
    for (size_t i = 0; rc == 0 && i < count; i++) {
        size_t len = strlen(objects[i].url);
        if (len < 4 || strcasecmp(objects[i].url + len - 4, ".tar") != 0)
            continue;
        char *copy = strdup(objects[i].url);
        if (!copy) {
            snprintf(why, why_size, "out of memory");
            rc = -1;
        } else {
            rc = push_shard(list, copy, why, why_size);
            taken++;
        }
    }
    dh__remote_objects_free(objects, count);
    if (rc == 0 && taken == 0) {
        snprintf(why, why_size, "%s: no .tar objects under this prefix (%zu objects listed)",
                 prefix_url, count);
        rc = -1;
    }
    return rc;
}

int mb_shards_expand(const char *pattern, mb_shard_list_t *list, char *why, size_t why_size)
{
    /* WebDataset's separator between patterns: "a/{0..3}.tar::b/{0..9}.tar" */
    const char *start = pattern;
    for (;;) {
        const char *sep = next_separator(start);
        size_t len = sep ? (size_t)(sep - start) : strlen(start);
        if (len == 0) {
            snprintf(why, why_size, "an empty shard name");
            return -1;
        }
        char *piece = strndup(start, len);
        if (!piece) {
            snprintf(why, why_size, "out of memory");
            return -1;
        }
        /* WebDataset's braces, the library's expansion (s3_braces.c, as braceexpand does) */
        char **names = NULL;
        long n = dh__brace_expand(piece, MAX_SHARDS - list->n, &names);
        free(piece);
        if (n < 0) {
            snprintf(why, why_size, "%s", dh_last_error());
            return -1;
        }
        int rc = 0;
        for (long i = 0; rc == 0 && i < n; i++) {
            size_t name_len = strlen(names[i]);
            if (dh__url_scheme(names[i]) == DH_URL_S3 && names[i][name_len - 1] == '/') {
                rc = push_listing(names[i], list, why, why_size);
                continue;
            }
            char *copy = strdup(names[i]);
            if (!copy) {
                snprintf(why, why_size, "out of memory");
                rc = -1;
            } else {
                rc = push_shard(list, copy, why, why_size);
            }
        }
        dh__brace_free(names, (size_t)n);
        if (rc < 0)
            return rc;
        if (!sep)
            return 0;
        start = sep + 2;
    }
}

void mb_shards_free(mb_shard_list_t *list)
{
    for (size_t i = 0; i < list->n; i++)
        free(list->shards[i]);
    free(list->shards);
    *list = (mb_shard_list_t){0};
}

/* ---- reading a shard ------------------------------------------------------------------ */

typedef struct sample {
    char *key;        /* NULL: no sample open */
    char *media_name; /* the media member, NULL: none yet */
    long long media_offset, media_size;
    char *txt_name, *json_name;
    char *txt_caption, *json_caption;
    int json_keyless;
    int bad_caption; /* skipped at flush (--skip-bad-captions) */
    json_t *meta;    /* NULL until a member adds a key */
} sample_t;

typedef struct shard {
    const mb_tar_options_t *opt;
    mb_tar_report_t *report;
    mb_emitter_t *e;
    const char *name; /* as given */
    char *abs;        /* its realpath, written to the manifest */
    const char *stem; /* its basename without ".tar": the id's first part */
    size_t stem_len;
    int fd;
    dh__remote_file_t *remote; /* a shard at a URL: read by range requests (docs/remote.md) */
    long long remote_pos;      /* the next byte libarchive reads of it */
    char *remote_buf;          /* BLOCK_SIZE bytes */
    long long file_size;
    struct archive *a;
    sample_t s;
} shard_t;

static void sample_clear(sample_t *s)
{
    free(s->key);
    free(s->media_name);
    free(s->txt_name);
    free(s->json_name);
    free(s->txt_caption);
    free(s->json_caption);
    json_decref(s->meta);
    *s = (sample_t){0};
}

/* libarchive's reason; it leaves none for some truncated headers. */
static const char *archive_why(struct archive *a)
{
    const char *why = archive_error_string(a);
    return why ? why : "the shard ends inside a header (truncated?)";
}

/* "SHARD: member 'NAME'" into buf. */
static const char *member_where(char *buf, size_t size, const shard_t *sh, const char *member)
{
    snprintf(buf, size, "%s: member '%s'", sh->name, member);
    return buf;
}

/* Emits the open sample (if it has a media member), then clears it. */
static int flush_sample(shard_t *sh)
{
    sample_t *s = &sh->s;
    int rc = 0;
    if (!s->key)
        return 0;
    if (!s->media_name) {
        sh->report->keys_without_media++;
    } else if (s->bad_caption) {
        sh->report->skipped_bad_caption++;
    } else {
        const char *caption = s->txt_caption ? s->txt_caption : s->json_caption;
        sh->report->captions_txt += s->txt_caption != NULL;
        sh->report->captions_json += !s->txt_caption && s->json_caption;
        sh->report->json_without_caption += !s->txt_caption && s->json_keyless;
        char *id = malloc(sh->stem_len + 1 + strlen(s->key) + 1), w[2048];
        if (!id) {
            rc = mb_error("out of memory");
        } else {
            sprintf(id, "%.*s/%s", (int)sh->stem_len, sh->stem, s->key);
            mb_where_t where = {.file = member_where(w, sizeof w, sh, s->media_name)};
            rc = mb_emit_range(sh->e, id, sh->abs, s->media_offset, s->media_size, caption, s->meta,
                               &where);
            sh->report->skipped_bad_caption += rc > 0;
            rc = rc > 0 ? 0 : rc;
            sh->report->samples += rc == 0;
        }
        free(id);
    }
    sample_clear(s);
    return rc;
}

/* The whole of the current member (a caption), NUL-terminated. */
static char *read_member(shard_t *sh, const char *name, long long size, size_t *len)
{
    char w[2048];
    if (size > MAX_CAPTION_MEMBER) {
        mb_error("%s: %lld bytes, too large for a caption (limit %d)",
                 member_where(w, sizeof w, sh, name), size, MAX_CAPTION_MEMBER);
        return NULL;
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        mb_error("out of memory");
        return NULL;
    }
    size_t got = 0;
    while (got < (size_t)size) {
        la_ssize_t n = archive_read_data(sh->a, buf + got, (size_t)size - got);
        if (n <= 0) {
            mb_error("%s: cannot read: %s", member_where(w, sizeof w, sh, name),
                     n < 0 ? archive_why(sh->a) : "the member ends early");
            free(buf);
            return NULL;
        }
        got += (size_t)n;
    }
    buf[got] = '\0';
    *len = got;
    return buf;
}

/* The media member's data must be where we will say it is: its first bytes through libarchive
 * equal the file's bytes at offset. */
static int check_offset(shard_t *sh, const char *name, long long offset, long long size)
{
    char w[2048];
    if (offset >= 0 && offset <= sh->file_size && size > sh->file_size - offset)
        return mb_error("%s: its header says %lld bytes, but the shard ends %lld bytes after "
                        "its data starts (a truncated or damaged shard)",
                        member_where(w, sizeof w, sh, name), size, sh->file_size - offset);
    if (offset < 0 || offset > sh->file_size)
        return mb_error("%s: internal error: data offset %lld + size %lld lies outside the %lld "
                        "bytes of the file",
                        member_where(w, sizeof w, sh, name), offset, size, sh->file_size);
    unsigned char via_archive[CHECK_BYTES], via_file[CHECK_BYTES];
    size_t want = size < CHECK_BYTES ? (size_t)size : CHECK_BYTES, got = 0;
    while (got < want) {
        la_ssize_t n = archive_read_data(sh->a, via_archive + got, want - got);
        if (n <= 0)
            return mb_error("%s: cannot read: %s", member_where(w, sizeof w, sh, name),
                            n < 0 ? archive_why(sh->a) : "the member ends early");
        got += (size_t)n;
    }
    ssize_t n;
    if (sh->remote) {
        size_t read_bytes = 0;
        if (dh__remote_file_read(sh->remote, offset, via_file, want, &read_bytes) < 0)
            return mb_error("%s: cannot read: %s", sh->name, dh_last_error());
        n = (ssize_t)read_bytes;
    } else if ((n = pread(sh->fd, via_file, want, (off_t)offset)) < 0) {
        int err = errno;
        return mb_error("%s: cannot read: %s", sh->name, strerror(err));
    }
    if ((size_t)n != want || memcmp(via_archive, via_file, want) != 0)
        return mb_error("%s: internal error: the bytes at data offset %lld are not the member's "
                        "(a tar layout this reader does not handle; please report it)",
                        member_where(w, sizeof w, sh, name), offset);
    return 0;
}

/* .cls, and the --meta-ext extensions (not the caption's .txt/.json: those are read anyway). */
static int is_meta_ext(const mb_tar_options_t *opt, const char *ext)
{
    if (strcasecmp(ext, "cls") == 0)
        return 1;
    for (size_t i = 0; i < opt->n_meta_exts; i++)
        if (strcasecmp(ext, opt->meta_exts[i]) == 0)
            return 1;
    return 0;
}

/* A .cls or --meta-ext member: meta[EXT] = its text without surrounding white space, a
 * number when it reads as one (WebDataset writes a class as its decimal text). */
static int take_meta_member(shard_t *sh, const char *name, const char *ext, long long size)
{
    char w[2048];
    size_t len = 0;
    char *text = read_member(sh, name, size, &len);
    if (!text)
        return -1;
    char *start = text, *end = text + len;
    while (start < end && isspace((unsigned char)*start))
        start++;
    while (end > start && isspace((unsigned char)end[-1]))
        end--;
    char key[256];
    size_t n = 0;
    for (; ext[n] && n + 1 < sizeof key; n++)
        key[n] = (char)tolower((unsigned char)ext[n]);
    key[n] = '\0';
    int rc = mb_meta_set_text(sh->s.meta, key, start, (size_t)(end - start),
                              member_where(w, sizeof w, sh, name));
    free(text);
    return rc;
}

static int is_media(const mb_tar_options_t *opt, const char *ext)
{
    const char *last = strrchr(ext, '.');
    last = last ? last + 1 : ext;
    for (size_t i = 0; i < opt->n_exts; i++)
        if (strcasecmp(last, opt->exts[i]) == 0)
            return 1;
    return 0;
}

/* One regular member: name is "KEY.EXT" (the key's basename non-empty, no leading dot). */
static int take_member(shard_t *sh, struct archive_entry *ent, const char *name, size_t key_len,
                       long long offset)
{
    sample_t *s = &sh->s;
    const char *ext = name + key_len + 1;
    long long size = (long long)archive_entry_size(ent);
    char w[2048];
    if (s->key && (strlen(s->key) != key_len || strncmp(s->key, name, key_len) != 0) &&
        flush_sample(sh) < 0)
        return -1;
    if (!s->key && !(s->key = strndup(name, key_len)))
        return mb_error("out of memory");
    if (is_media(sh->opt, ext)) {
        if (s->media_name)
            return mb_error("%s: key '%s' has two media members, '%s' and '%s' (a sample takes "
                            "one; --ext lists the extensions that count as media)",
                            sh->name, s->key, s->media_name, name);
        if (size <= 0)
            return mb_error("%s: an empty media member", member_where(w, sizeof w, sh, name));
        if (archive_entry_sparse_count(ent) > 0)
            return mb_error("%s: a sparse member has no single byte range in the shard",
                            member_where(w, sizeof w, sh, name));
        if (check_offset(sh, name, offset, size) < 0)
            return -1;
        if (!(s->media_name = strdup(name)))
            return mb_error("out of memory");
        s->media_offset = offset;
        s->media_size = size;
        return 0;
    }
    int txt = strcasecmp(ext, "txt") == 0, json = strcasecmp(ext, "json") == 0;
    int meta = is_meta_ext(sh->opt, ext);
    if (!txt && !json && !meta)
        return 0; /* other fields of the sample (.npy, ...): not ours */
    if (!s->meta && !(s->meta = json_object()))
        return mb_error("out of memory");
    if (!txt && !json)
        return take_meta_member(sh, name, ext, size);
    char **seen = txt ? &s->txt_name : &s->json_name;
    if (*seen)
        return mb_error("%s: key '%s' has two .%s members, '%s' and '%s'", sh->name, s->key, ext,
                        *seen, name);
    if (!(*seen = strdup(name)))
        return mb_error("out of memory");
    size_t len = 0;
    char *text = read_member(sh, name, size, &len);
    if (!text)
        return -1;
    member_where(w, sizeof w, sh, name);
    int rc;
    if (txt) {
        rc = mb_caption_text(sh->e, text, len, w);
        if (rc == 0 && meta)
            rc = mb_meta_set_text(s->meta, ext, text, strlen(text), w);
        if (rc == 0) {
            s->txt_caption = text;
            text = NULL;
        }
    } else {
        json_error_t jerr;
        json_t *root = json_loadb(text, len, 0, &jerr);
        if (!root) {
            char where[2100];
            snprintf(where, sizeof where, "%s:%d:%d", w, jerr.line, jerr.column);
            rc = mb_bad_caption(sh->e, where, "not JSON: %s", jerr.text);
        } else {
            rc = mb_caption_json(sh->e, root, w, &s->json_caption, &s->json_keyless);
            if (rc == 0)
                rc = mb_meta_merge(s->meta, root);
            json_decref(root);
        }
    }
    free(text);
    if (rc > 0) { /* a bad caption: the sample is skipped when it is complete */
        s->bad_caption = 1;
        rc = 0;
    }
    return rc;
}

/* The key of a member name: up to the first dot of the basename; 0 when the name has no
 * such key (no dot, or a basename starting with one), as WebDataset skips such names. */
static size_t key_length(const char *name)
{
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base || !dot[1])
        return 0;
    return (size_t)(dot - name);
}

static int read_members(shard_t *sh)
{
    struct archive_entry *ent;
    char *prev = NULL; /* the last member's name, for errors between members */
    int rc = 0;
    for (;;) {
        int r = archive_read_next_header(sh->a, &ent);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN) {
            rc = mb_error("%s: %s%s%s: %s", sh->name, prev ? "after member '" : "at the start",
                          prev ? prev : "", prev ? "'" : "", archive_why(sh->a));
            break;
        }
        /* bytes consumed so far = the end of this member's headers = its data (see above) */
        long long offset = (long long)archive_filter_bytes(sh->a, -1);
        mb_tar_report_t *report = sh->report;
        report->members++;
        if (sh->e->progress_every && report->members % sh->e->progress_every == 0)
            fprintf(stderr, "manifest: %zu tar members scanned, %zu samples\n", report->members,
                    report->samples);
        const char *name = archive_entry_pathname(ent);
        if (!name) {
            rc = mb_error("%s: after member '%s': a member name that cannot be read", sh->name,
                          prev ? prev : "");
            break;
        }
        while (name[0] == '.' && name[1] == '/')
            name += 2; /* "./a/b.mp4", as `tar -C dir -cf x.tar .` writes: the key is "a/b" */
        free(prev);
        if (!(prev = strdup(name))) {
            rc = mb_error("out of memory");
            break;
        }
        size_t key_len = key_length(name);
        if (archive_entry_filetype(ent) != AE_IFREG || key_len == 0) {
            report->other_members++; /* folders, links, names without a key */
            continue;
        }
        if ((rc = take_member(sh, ent, name, key_len, offset)) < 0)
            break;
    }
    if (rc == 0)
        rc = flush_sample(sh);
    free(prev);
    return rc;
}

static int read_archive(shard_t *sh);

/* libarchive's reads of a shard at a URL: BLOCK_SIZE bytes at a time through the remote
 * reader (range requests; it fetches ahead while reads run on), and skips over the members'
 * data without a request, so a shard of large clips costs about a request per member. */
static la_ssize_t remote_read(struct archive *a, void *ud, const void **buf)
{
    shard_t *sh = ud;
    size_t got = 0;
    if (dh__remote_file_read(sh->remote, sh->remote_pos, sh->remote_buf, BLOCK_SIZE, &got) < 0) {
        archive_set_error(a, EIO, "%s", dh_last_error());
        return -1;
    }
    sh->remote_pos += (long long)got;
    *buf = sh->remote_buf;
    return (la_ssize_t)got;
}

static la_int64_t remote_skip(struct archive *a, void *ud, la_int64_t request)
{
    (void)a;
    shard_t *sh = ud;
    long long left = sh->file_size - sh->remote_pos;
    if (request > left)
        request = left > 0 ? left : 0;
    sh->remote_pos += request;
    return request;
}

/* A shard at a URL (http, https, s3): its size (one range request); a missing one is skipped
 * with --skip-missing. 1 when skipped. */
static int open_remote_shard(shard_t *sh)
{
    if (dh__remote_file_open(&sh->remote, sh->name, 0, -1) < 0)
        return mb_error("%s", dh_last_error());
    int64_t size = dh__remote_file_size(sh->remote);
    if (size == -ENOENT && sh->opt->skip_missing) {
        if (sh->report->shards_missing++ < 10)
            fprintf(stderr, "manifest: skipped %s: %s\n", sh->name, dh_last_error());
        return 1;
    }
    if (size < 0)
        return mb_error("cannot open the shard: %s%s", dh_last_error(),
                        size == -ENOENT ? " (--skip-missing skips missing shards)" : "");
    sh->file_size = (long long)size;
    if (!(sh->abs = strdup(sh->name)) || !(sh->remote_buf = malloc(BLOCK_SIZE)))
        return mb_error("out of memory");
    return 0;
}

/* Opens the shard for libarchive and for pread (or range reads: a URL); refuses what cannot
 * be read in place. */
static int read_shard(shard_t *sh)
{
    if (dh__url_scheme(sh->name) != DH_URL_NONE) {
        int rc = open_remote_shard(sh);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        return read_archive(sh);
    }
    sh->fd = open(sh->name, O_RDONLY | O_CLOEXEC);
    if (sh->fd < 0) {
        int err = errno;
        if (err == ENOENT && sh->opt->skip_missing) {
            if (sh->report->shards_missing++ < 10)
                fprintf(stderr, "manifest: skipped %s: no such file\n", sh->name);
            return 0;
        }
        return mb_error("%s: cannot open the shard: %s%s", sh->name, strerror(err),
                        err == ENOENT ? " (--skip-missing skips missing shards)" : "");
    }
    struct stat st;
    if (fstat(sh->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return mb_error("%s: not a regular file", sh->name);
    sh->file_size = (long long)st.st_size;
    if (!(sh->abs = realpath(sh->name, NULL))) {
        int err = errno;
        return mb_error("%s: %s", sh->name, strerror(err));
    }
    return read_archive(sh);
}

/* The tar reader over the open shard: the stem of ids, then every member. */
static int read_archive(shard_t *sh)
{
    const char *slash = strrchr(sh->name, '/');
    sh->stem = slash ? slash + 1 : sh->name;
    sh->stem_len = strlen(sh->stem);
    if (sh->stem_len > 4 && strcmp(sh->stem + sh->stem_len - 4, ".tar") == 0)
        sh->stem_len -= 4;
    if (!(sh->a = archive_read_new()))
        return mb_error("out of memory");
    /* every filter, so a compressed shard is recognised and refused by name */
    archive_read_support_filter_all(sh->a);
    archive_read_support_format_tar(sh->a);
    int opened = sh->remote ? archive_read_open2(sh->a, sh, NULL, remote_read, remote_skip, NULL)
                            : archive_read_open_fd(sh->a, sh->fd, BLOCK_SIZE);
    if (opened != ARCHIVE_OK)
        return mb_error("%s: %s", sh->name, archive_why(sh->a));
    if (archive_filter_count(sh->a) > 1 || archive_filter_code(sh->a, 0) != ARCHIVE_FILTER_NONE)
        return mb_error("%s: compressed (%s): a member of a compressed tar has no byte range "
                        "in the file to read in place; decompress the shard to a plain .tar",
                        sh->name, archive_filter_name(sh->a, 0));
    int rc = read_members(sh);
    sh->report->shards_read += rc == 0;
    return rc;
}

int mb_from_tar(const mb_tar_options_t *opt, mb_emitter_t *e, mb_tar_report_t *report)
{
    *report = (mb_tar_report_t){0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < opt->n_shards; i++) {
        shard_t sh = {.opt = opt, .report = report, .e = e, .name = opt->shards[i], .fd = -1};
        rc = read_shard(&sh);
        sample_clear(&sh.s);
        if (sh.a)
            archive_read_free(sh.a);
        if (sh.fd >= 0)
            close(sh.fd);
        dh__remote_file_close(&sh.remote);
        free(sh.remote_buf);
        free(sh.abs);
    }
    return rc;
}
