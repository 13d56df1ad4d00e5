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
#include "datahelix/profile.h"

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

/* The end-to-end tests' data: `datahelix synth` makes 3 real clips of 4 frames (64x96) in
 * scratch folder `set`, and clip v0000001 gets a caption sidecar (TINY_CAPTION). Returns the
 * set's folder; *clips gets its clips folder (both the caller's). */
#define TINY_CAPTION "a red square slides left over a grey field" /* 42 bytes */

static __attribute__((unused)) char *tiny_clips(const char *set_name, char **clips)
{
    char mix_name[256];
    snprintf(mix_name, sizeof mix_name, "%s-mix.json", set_name);
    char *mix = scratch(mix_name), *set = scratch(set_name), *err_path = scratch("synth.err");
    dh_test_write_file(mix, "[{\"frames\": 4, \"height\": 64, \"width\": 96, "
                            "\"duration_s\": 0.4, \"fps\": 10}]\n");
    char args[4096];
    snprintf(args, sizeof args, "synth --out '%s' --mix '%s' --count 3 --seed 5 --jobs 1", set,
             mix);
    assert_int_equal(run_cli(args, err_path), 0);
    *clips = join(set, "clips");
    put(*clips, "v0000001.txt", TINY_CAPTION);
    free(err_path);
    free(mix);
    return set;
}

/* `datahelix probe` of a manifest of the 3 tiny clips into set/profiles.jsonl (4 frames of
 * 32x32: without synth's per-clip plan the spec must ask for the clips' 4), which must write
 * 3 rows and skip none; returns the profile set read back (the caller's). */
static __attribute__((unused)) dh_profile_set_t *probe_tiny(const char *set, const char *manifest)
{
    char *profiles = join(set, "profiles.jsonl"), *cal = join(set, "calibration.json");
    char *spec = join(set, "spec.json"), *err_path = join(set, "probe.err");
    dh_test_write_file(spec, "{\"frames\": 4, \"height\": 32, \"width\": 32}\n");
    char args[4096];
    snprintf(args, sizeof args, "probe '%s' -o '%s' --pipeline '%s' --calibration '%s' --jobs 1",
             manifest, profiles, spec, cal);
    int status = run_cli(args, err_path);
    char *err = read_all(err_path);
    if (status != 0)
        print_error("probe: exit %d: %s\n", status, err);
    assert_int_equal(status, 0);
    assert_non_null(strstr(err, "3 rows written"));
    assert_non_null(strstr(err, "0 files skipped"));
    free(err);
    dh_profile_set_t *ps = NULL;
    assert_int_equal(dh_profile_set_new(&ps), 0);
    assert_int_equal(dh_profile_set_load(ps, profiles), 0);
    assert_int_equal(dh_profile_set_count(ps), 3);
    free(err_path);
    free(spec);
    free(cal);
    free(profiles);
    return ps;
}

#endif
