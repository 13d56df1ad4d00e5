/* profile_write.c: the writer of the profiles JSONL format (docs/profiles.md §1-2): a row
 * as one line, and a profile set as a file replaced whole or not at all. Numbers are written
 * in the shortest form that reads back as the same double; a row's unknown fields
 * (profile_extra.c) are spliced in as they were read.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/profile.h"
#include "core/internal.h"
#include "model/profile_internal.h"

/* ---- writing ------------------------------------------------------------------------ */

/* Writes s as a JSON string: '"' and '\\' escaped, control bytes as \uXXXX or the short
 * escapes, everything else (UTF-8 included) as is. */
static void put_string(FILE *f, const char *s)
{
    putc('"', f);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        fwrite(run, 1, (size_t)(s - run), f);
        run = s + 1;
        switch (c) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            fprintf(f, "\\u%04x", c);
            break;
        }
    }
    fwrite(run, 1, (size_t)(s - run), f);
    putc('"', f);
}

/* The shortest of %.15g, %.16g, %.17g that reads back as the same double: round trips
 * exactly, and 0.1 stays "0.1". Values are finite (checked on the way in). */
static void put_number(FILE *f, double v)
{
    char buf[40];
    for (int precision = 15; precision <= 17; precision++) {
        snprintf(buf, sizeof buf, "%.*g", precision, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

static void put_field_string(FILE *f, const char *name, const char *value)
{
    fprintf(f, ",\"%s\":", name);
    put_string(f, value);
}

int dh_profile_row_write(FILE *f, const dh_profile_row_t *row)
{
    fputs("{\"id\":", f);
    put_string(f, row->id);
    put_field_string(f, "uri", row->uri);
    put_field_string(f, "profile_key", row->profile_key);
    fprintf(f,
            ",\"frames\":%" PRId32 ",\"height\":%" PRId32 ",\"width\":%" PRId32
            ",\"tokens_est\":%" PRId64 ",\"cpu_s_est\":",
            row->frames, row->height, row->width, row->tokens_est);
    put_number(f, row->cpu_s_est);
    fprintf(f, ",\"in_bytes\":%" PRId64 ",\"out_bytes\":%" PRId64, row->in_bytes, row->out_bytes);
    /* Optional fields: absent (0 / NULL) ones are not written. */
    if (row->duration_s != 0) {
        fputs(",\"duration_s\":", f);
        put_number(f, row->duration_s);
    }
    if (row->fps != 0) {
        fputs(",\"fps\":", f);
        put_number(f, row->fps);
    }
    if (row->text_len != 0)
        fprintf(f, ",\"text_len\":%" PRId64, row->text_len);
    if (row->codec)
        put_field_string(f, "codec", row->codec);
    if (row->node)
        put_field_string(f, "node", row->node);
    /* extra is a compact object "{...}" (checked on the way in): splice its members. */
    if (row->extra) {
        size_t len = strlen(row->extra);
        if (len > 2) {
            putc(',', f);
            fwrite(row->extra + 1, 1, len - 2, f);
        }
    }
    fputs("}\n", f);
    return ferror(f) ? DH_EIO : 0;
}

/* A file is written as PATH.part beside it and renamed over PATH once complete, so a failed
 * write (the disk full, a close that reports a network file system's error, a refused
 * rename) leaves the old file, or none, never a partial one; PATH.part is removed. Fault
 * site DH_FAULT_PROFILE_WRITE: the write (ENOSPC), the close (EIO), the rename (EIO). */
int dh_profile_set_write(const dh_profile_set_t *set, const char *path)
{
    bool use_stdout = strcmp(path, "-") == 0;
    const char *name = use_stdout ? "<stdout>" : path;
    char *part = NULL;
    FILE *f = stdout;
    if (!use_stdout) {
        size_t len = strlen(path) + sizeof ".part";
        if (!(part = dh_malloc(len)))
            return dh__set_error(DH_ENOMEM, "%s: out of memory for its name", path);
        snprintf(part, len, "%s.part", path);
        if (!(f = fopen(part, "w"))) {
            int err = errno;
            dh__set_error(-err, "%s: cannot open for writing (as %s): %s", path, part,
                          strerror(err));
            dh_free(part);
            return -err;
        }
    }
    /* A 1 MiB stdio buffer (from our allocator) cuts write calls ~250x against 4 KiB. */
    char *iobuf = use_stdout ? NULL : dh_malloc(DH__PROFILE_IO_CHUNK);
    if (iobuf)
        setvbuf(f, iobuf, _IOFBF, DH__PROFILE_IO_CHUNK);
    int rc = 0;
    for (size_t i = 0; i < dh_profile_set_count(set) && rc == 0; i++)
        rc = dh_profile_row_write(f, dh_profile_set_row(set, i));
    int err = 0;
    const char *step = "write";
    if (rc == 0 && DH_FAULT(DH_FAULT_PROFILE_WRITE)) /* the disk fills up */
        err = ENOSPC;
    else if (rc == 0 && fflush(f) != 0)
        err = errno;
    else if (rc < 0)
        err = errno ? errno : EIO;
    if (!use_stdout) {
        int closed = DH_FAULT(DH_FAULT_PROFILE_WRITE) ? (fclose(f), errno = EIO, EOF) : fclose(f);
        if (closed != 0 && !err) {
            err = errno;
            step = "close";
        }
        if (!err && (DH_FAULT(DH_FAULT_PROFILE_WRITE) ? (errno = EIO, -1) : rename(part, path))) {
            err = errno;
            step = "rename";
        }
        if (err)
            unlink(part);
    }
    dh_free(iobuf);
    if (err && strcmp(step, "rename") == 0)
        rc = dh__set_error(-err, "%s: cannot rename %s to it: %s", path, part, strerror(err));
    else if (err || rc < 0)
        rc = dh__set_error(err ? -err : DH_EIO, "%s: %s failed: %s", name, step,
                           strerror(err ? err : EIO));
    dh_free(part);
    return rc;
}
