/* manifest_cli.h: helpers shared by the tests of `datahelix manifest` (test_cmd_manifest.c,
 * test_cmd_manifest_tar.c): scratch paths, files made with their folders, whole-file reads,
 * the command run as a process ($DH_CLI) and manifests read back with the library's reader. */
#ifndef DH_TESTS_TOOLS_MANIFEST_CLI_H
#define DH_TESTS_TOOLS_MANIFEST_CLI_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "datahelix/manifest.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* A path in this process's scratch directory, the caller's to free. */
static __attribute__((unused)) char *scratch(const char *name)
{
    char *p = strdup(dh_test_path(name));
    assert_non_null(p);
    return p;
}

static __attribute__((unused)) char *join(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    assert_non_null(p);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static __attribute__((unused)) bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Writes root/rel (len bytes), creating its folders. */
static __attribute__((unused)) void put_bytes(const char *root, const char *rel, const void *data,
                                              size_t len)
{
    char *path = join(root, rel);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            fail_msg("mkdir %s: %s", path, strerror(errno));
        *p = '/';
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("cannot write %s: %s", path, strerror(errno));
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(path);
}

/* Writes root/rel, creating its folders. */
static __attribute__((unused)) void put(const char *root, const char *rel, const char *text)
{
    put_bytes(root, rel, text, strlen(text));
}

/* The whole file, NUL-terminated (the caller's); its length in *len when len is not NULL. */
static __attribute__((unused)) char *read_all_n(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s: %s", path, strerror(errno));
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

static __attribute__((unused)) char *read_all(const char *path)
{
    return read_all_n(path, NULL);
}

/* Runs "$DH_CLI args" (args already quoted), stderr to err_path; returns the exit status. */
static __attribute__((unused)) int run_cli(const char *args, const char *err_path)
{
    const char *cli = getenv("DH_CLI");
    if (!cli || !*cli)
        fail_msg("DH_CLI is not set (run the tests through ctest)");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s' >/dev/null", cli, args, err_path);
    int status = system(cmd);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* A manifest read back with the library's reader (the one probe uses). */
static __attribute__((unused)) dh_manifest_t *load(const char *path)
{
    dh_manifest_t *m = NULL;
    int rc = dh_manifest_load(path, &m);
    if (rc != 0)
        print_error("%s: %s\n", path, dh_last_error());
    assert_int_equal(rc, 0);
    return m;
}

#endif
