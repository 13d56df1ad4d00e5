/* Tests of the rebalancing benchmark harness (bench/rebalance_bench.h) and its command: on
 * small clips it runs both parts, every moved clip is taken over where it was allocated
 * (no copy), per-rank counts hold, the moves are a function of the seed, the JSON carries
 * its fields, and bad options are refused naming the option. Timings are not asserted:
 * see rebalance-bench. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "bench/rebalance_bench.h"

/* 8 clips of 2 x 32 x 32 x 3 among 4 ranks, 2 rounds. */
static dh_rebalance_bench_options_t small(void)
{
    dh_rebalance_bench_options_t o;
    dh_rebalance_bench_options_default(&o);
    o.clips = 8;
    o.ranks = 4;
    o.frames = 2;
    o.height = 32;
    o.width = 32;
    o.rounds = 2;
    return o;
}

static void expect_counts(const dh_rebalance_bench_report_t *r, uint32_t per_rank)
{
    uint32_t sum = 0;
    for (uint32_t k = 0; k < r->ranks; k++) {
        if (r->rank_clips[k] != per_rank)
            fail_msg("rank %u holds %u clips at the end, expected %u", k, r->rank_clips[k],
                     per_rank);
        sum += r->rank_clips[k];
    }
    assert_int_equal(sum, r->clips);
}

static void rebalance_bench_moves_every_clip_without_a_copy(void **state)
{
    dh_rebalance_bench_options_t o = small();
    dh_rebalance_bench_report_t r;
    int rc = dh_rebalance_bench_run(&o, &r);
    if (rc)
        fail_msg("run: %s (%s)", dh_last_error(), dh_err_name(rc));
    assert_int_equal(r.clip_bytes, 2 * 32 * 32 * 3);
    assert_int_equal(r.onnode_moved, 8);
    /* every moved clip of every timed round resolved at its original offset */
    assert_int_equal(r.onnode_handoffs_verified, 2 * 8);
    assert_int_equal(r.onnode_pixel_copies, 0);
    expect_counts(&r, 2);
    assert_true(r.onnode_p50_ms > 0 && r.onnode_p50_ms <= r.onnode_p95_ms);
    assert_true(r.cross_gbps_p50 > 0);
    assert_true(r.raw_tcp_gbps_p50 > 0);
    assert_true(r.cross_vs_raw > 0);
}

static void rebalance_bench_moves_a_fraction_and_keeps_counts(void **state)
{
    dh_rebalance_bench_options_t o = small();
    o.move_fraction = 0.5;
    o.rounds = 3;
    o.skip_cross = 1;
    dh_rebalance_bench_report_t r;
    int rc = dh_rebalance_bench_run(&o, &r);
    if (rc)
        fail_msg("run: %s (%s)", dh_last_error(), dh_err_name(rc));
    /* 4 of 8 clips move; no rank holds more than 2 of them, so each changes owner */
    assert_int_equal(r.onnode_moved, 4);
    assert_int_equal(r.onnode_handoffs_verified, 3 * 4);
    assert_int_equal(r.onnode_pixel_copies, 0);
    expect_counts(&r, 2);
    assert_true(r.cross_gbps_p50 == 0 && r.raw_tcp_gbps_p50 == 0);

    o.move_fraction = 0; /* a round with nothing to move still gathers and reports */
    rc = dh_rebalance_bench_run(&o, &r);
    if (rc)
        fail_msg("run: %s (%s)", dh_last_error(), dh_err_name(rc));
    assert_int_equal(r.onnode_moved, 0);
    assert_int_equal(r.onnode_handoffs_verified, 0);
    expect_counts(&r, 2);
}

static void rebalance_bench_moves_follow_the_seed(void **state)
{
    dh_rebalance_bench_options_t o = small();
    o.skip_cross = 1;
    dh_rebalance_bench_report_t a, b, c;
    assert_int_equal(dh_rebalance_bench_run(&o, &a), 0);
    assert_int_equal(dh_rebalance_bench_run(&o, &b), 0);
    o.seed = 2;
    assert_int_equal(dh_rebalance_bench_run(&o, &c), 0);
    assert_true(a.moves_digest == b.moves_digest);
    assert_true(a.moves_digest != c.moves_digest);
}

static void rebalance_bench_fails_cleanly_when_a_rank_dies(void **state)
{
    dh_rebalance_bench_options_t o = small();
    o.test_exit_round = 2; /* rank 0 exits when asked for the first timed round's gather */
    dh_rebalance_bench_report_t r;
    assert_int_equal(dh_rebalance_bench_run(&o, &r), DH_EIO);
    if (!strstr(dh_last_error(), "rank 0") || !strstr(dh_last_error(), "status 7"))
        fail_msg("the error does not name the rank and its status: %s", dh_last_error());
    /* every rank was killed and reaped */
    errno = 0;
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
}

static json_t *field(json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    if (!v || !json_is_number(v))
        fail_msg("the JSON has no number '%s'", name);
    return v;
}

static void expect_json_fields(json_t *obj)
{
    static const char *const names[] = {
        "clips",          "clip_bytes",       "ranks",        "rounds",
        "onnode_p50_ms",  "onnode_p95_ms",    "onnode_moved", "onnode_pixel_copies",
        "cross_gbps_p50", "raw_tcp_gbps_p50", "cross_vs_raw",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        field(obj, names[i]);
}

static void rebalance_bench_json_has_the_fields(void **state)
{
    dh_rebalance_bench_report_t r;
    memset(&r, 0, sizeof r);
    r.clips = 64;
    r.clip_bytes = 2408448;
    r.ranks = 8;
    r.rounds = 20;
    r.onnode_p50_ms = 1.25;
    r.onnode_moved = 64;
    r.cross_gbps_p50 = 2.5;
    r.raw_tcp_gbps_p50 = 3.0;
    r.cross_vs_raw = 0.8333;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(dh_rebalance_bench_write_json(f, &r), 0);
    fclose(f);
    json_error_t err;
    json_t *obj = json_loads(text, 0, &err);
    if (!obj)
        fail_msg("not JSON: %s in %s", err.text, text);
    expect_json_fields(obj);
    assert_int_equal(json_integer_value(field(obj, "clip_bytes")), 2408448);
    assert_int_equal(json_integer_value(field(obj, "onnode_pixel_copies")), 0);
    assert_close(json_number_value(field(obj, "cross_vs_raw")), 0.8333, 1e-9);
    json_decref(obj);
    free(text);
}

/* Runs "$DH_CLI rebalance-bench args", stdout and stderr to files; returns the exit status. */
static int run_cli(const char *args, const char *out_path, const char *err_path)
{
    const char *cli = getenv("DH_CLI");
    if (!cli || !*cli)
        fail_msg("DH_CLI is not set (run the tests through ctest)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' rebalance-bench %s >'%s' 2>'%s'", cli, args, out_path,
             err_path);
    int status = system(cmd);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void rebalance_bench_cli_prints_json(void **state)
{
    char out[1024], err[1024]; /* dh_test_path returns a static buffer */
    snprintf(out, sizeof out, "%s", dh_test_path("rb-out.json"));
    snprintf(err, sizeof err, "%s", dh_test_path("rb-err.txt"));
    int status = run_cli("--json --clips 8 --ranks 4 --frames 2 --height 32 --width 32 "
                         "--rounds 2 --seed 5",
                         out, err);
    if (status != 0)
        fail_msg("exit %d: %s", status, slurp(err));
    json_error_t jerr;
    json_t *obj = json_loads(slurp(out), 0, &jerr);
    if (!obj)
        fail_msg("stdout is not one JSON object: %s", jerr.text);
    expect_json_fields(obj);
    assert_int_equal(json_integer_value(field(obj, "clips")), 8);
    assert_int_equal(json_integer_value(field(obj, "ranks")), 4);
    assert_int_equal(json_integer_value(field(obj, "clip_bytes")), 6144);
    assert_int_equal(json_integer_value(field(obj, "onnode_moved")), 8);
    assert_int_equal(json_integer_value(field(obj, "onnode_pixel_copies")), 0);
    assert_true(json_number_value(field(obj, "cross_gbps_p50")) > 0);
    json_decref(obj);
    /* the progress lines name each phase */
    const char *progress = slurp(err);
    assert_non_null(strstr(progress, "on-node:"));
    assert_non_null(strstr(progress, "cross:"));
}

static void expect_usage_error(const char *args, const char *option)
{
    char out[1024], err[1024];
    snprintf(out, sizeof out, "%s", dh_test_path("rb-bad-out.txt"));
    snprintf(err, sizeof err, "%s", dh_test_path("rb-bad-err.txt"));
    int status = run_cli(args, out, err);
    const char *text = slurp(err);
    if (status != 2 || !strstr(text, option))
        fail_msg("'%s': exit %d (expected 2), stderr '%s' (expected to name %s)", args, status,
                 text, option);
}

static void rebalance_bench_cli_rejects_bad_options(void **state)
{
    expect_usage_error("--ranks 1", "--ranks");
    expect_usage_error("--clips 0", "--clips");
    expect_usage_error("--move-fraction 1.5", "--move-fraction");
    expect_usage_error("--move-fraction half", "--move-fraction");
    expect_usage_error("--rounds x", "--rounds");
    expect_usage_error("--frames 1 --height 2 --width 2", "--frames");
    expect_usage_error("--bogus", "bogus");
    expect_usage_error("extra", "extra");
}

static void expect_check_error(dh_rebalance_bench_options_t o, const char *option)
{
    dh_rebalance_bench_report_t r;
    assert_int_equal(dh_rebalance_bench_check(&o), DH_EINVAL);
    if (!strstr(dh_last_error(), option))
        fail_msg("'%s' does not name %s", dh_last_error(), option);
    assert_int_equal(dh_rebalance_bench_run(&o, &r), DH_EINVAL);
}

static void rebalance_bench_rejects_bad_options(void **state)
{
    dh_rebalance_bench_options_t o = small();
    assert_int_equal(dh_rebalance_bench_check(&o), 0);
    o.ranks = 1;
    expect_check_error(o, "--ranks");
    o = small();
    o.clips = DH_REBALANCE_BENCH_MAX_CLIPS + 1;
    expect_check_error(o, "--clips");
    o = small();
    o.move_fraction = -0.1;
    expect_check_error(o, "--move-fraction");
    o = small();
    o.rounds = 0;
    expect_check_error(o, "--rounds");
    o = small();
    o.width = 1;
    o.height = 1;
    o.frames = 1;
    expect_check_error(o, "--width");
    o = small();
    o.clips = 4096;
    o.frames = 64;
    o.height = 1024;
    o.width = 1024; /* 192 MiB clips: far past the arena limit */
    expect_check_error(o, "--clips");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(rebalance_bench_moves_every_clip_without_a_copy),
    cmocka_unit_test(rebalance_bench_moves_a_fraction_and_keeps_counts),
    cmocka_unit_test(rebalance_bench_moves_follow_the_seed),
    cmocka_unit_test(rebalance_bench_fails_cleanly_when_a_rank_dies),
    cmocka_unit_test(rebalance_bench_json_has_the_fields),
    cmocka_unit_test(rebalance_bench_cli_prints_json),
    cmocka_unit_test(rebalance_bench_cli_rejects_bad_options),
    cmocka_unit_test(rebalance_bench_rejects_bad_options),
};
DH_TEST_MAIN(tests)
