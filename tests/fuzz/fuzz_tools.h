/* fuzz_tools.h: what the fuzz targets of `datahelix manifest`'s readers (tools/manifest_*.c:
 * fuzz_manifest_csv.c, fuzz_manifest_tar.c) share. Those readers take files by name, so each
 * input is written to a file in a scratch folder of the process's own (in /dev/shm, else
 * TMPDIR; removed at exit) and read by the real entry point (mb_from_table, mb_from_tar) into a
 * manifest beside it; their messages (stderr) are caught in a buffer, so a run is quiet and a
 * target can check what they say. An accepted run's manifest must load with the library's own
 * reader (dh_manifest_load): what the tool writes, probe reads.
 */
#ifndef DH_TESTS_FUZZ_TOOLS_H
#define DH_TESTS_FUZZ_TOOLS_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

static char fuzz_dir[4096];
static char fuzz_errors[1 << 16]; /* the messages of the last run, NUL-terminated */
static FILE *fuzz_capture, *fuzz_stderr;

static void fuzz_rm_dir(void)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (fuzz_dir[0] && system(cmd) != 0)
        fprintf(stderr, "fuzz: cannot remove %s\n", fuzz_dir);
}

/* The scratch folder (once), its path in fuzz_dir. */
static void fuzz_dir_init(void)
{
    if (fuzz_dir[0])
        return;
    /* memory (/dev/shm) when there is one: a disk's file creations and renames are ~4x
     * slower per input */
    snprintf(fuzz_dir, sizeof fuzz_dir, "/dev/shm/dh-fuzz-XXXXXX");
    if (!mkdtemp(fuzz_dir)) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/dh-fuzz-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        FUZZ_CHECK(mkdtemp(fuzz_dir) != NULL);
    }
    atexit(fuzz_rm_dir);
    fuzz_capture = fmemopen(fuzz_errors, sizeof fuzz_errors, "w");
    FUZZ_CHECK(fuzz_capture != NULL);
}

/* fuzz_dir + "/" + name into buf. */
static const char *fuzz_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", fuzz_dir, name);
    return buf;
}

/* Writes [data, data+size) to fuzz_dir/name. */
static void fuzz_write_file(const char *name, const uint8_t *data, size_t size)
{
    char path[4200];
    int fd =
        open(fuzz_path(path, sizeof path, name), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FUZZ_CHECK(fd >= 0);
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        FUZZ_CHECK(n > 0);
        done += (size_t)n;
    }
    FUZZ_CHECK(close(fd) == 0);
}

/* stderr into fuzz_errors until fuzz_capture_end. */
static void fuzz_capture_begin(void)
{
    rewind(fuzz_capture);
    fuzz_errors[0] = '\0';
    fuzz_stderr = stderr;
    stderr = fuzz_capture;
}

static void fuzz_capture_end(void)
{
    fflush(fuzz_capture);
    long n = ftell(fuzz_capture);
    fuzz_errors[n < 0                           ? 0
                : n >= (long)sizeof fuzz_errors ? sizeof fuzz_errors - 1
                                                : (size_t)n] = '\0';
    stderr = fuzz_stderr;
}

#endif
