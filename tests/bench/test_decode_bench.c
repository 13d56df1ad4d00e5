/* Tests of the decode-bench harness on a tiny mix: it makes the data set, runs all the
 * decoders on the same plan (ffmpeg's and PyAV's outputs are checked frame for frame count
 * inside the harness), reports throughput for each, says how ffmpeg was timed, and its
 * pixel check finds the same frames (mean absolute difference against PyAV's <= 3 of 255);
 * every peer column (decord, SPDL, torchcodec) is a number with its MAD or a stated reason
 * (the peers are not installed in CI). Timings are not asserted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "bench/decode_bench.h"

/* The harness's configuration for `mix` in `work`: one run, seed 1, the checked-in PyAV
 * script, and the interpreter ctest names in DH_PYTHON_EXE (set when configured with a
 * venv), else python3. */
static dh_decode_bench_config_t bench_config(const char *mix, size_t clips, const char *work)
{
    dh_decode_bench_config_t cfg = {.mix = mix,
                                    .clips = clips,
                                    .runs = 1,
                                    .seed = 1,
                                    .work_dir = work,
                                    .pyav_script = DH_SOURCE_DIR "/bench/decode/pyav_decode.py",
                                    .peer_script = DH_SOURCE_DIR "/bench/decode/peer_decode.py",
                                    .python = getenv("DH_PYTHON_EXE")};
    if (!cfg.python || !*cfg.python)
        cfg.python = "python3";
    return cfg;
}

/* Each peer column is either a number (with the same frames as PyAV: MAD <= 3) or a stated
 * reason, never both, never neither. */
static void assert_peers_stated(const dh_decode_bench_result_t *r)
{
    static const char *const names[DH_DECODE_BENCH_PEERS] = {"decord", "spdl", "torchcodec"};
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++) {
        const dh_decode_bench_peer_t *peer = &r->peers[p];
        assert_string_equal(peer->name, names[p]);
        if (peer->reason[0]) {
            assert_true(peer->clips_per_s == 0);
            assert_true(peer->mad_vs_pyav == -1);
        } else {
            if (!(peer->clips_per_s > 0))
                fail_msg("peer %s: no number and no reason", peer->name);
            if (!(peer->mad_vs_pyav >= 0 && peer->mad_vs_pyav <= 3.0))
                fail_msg("peer %s: MAD %.3f against PyAV", peer->name, peer->mad_vs_pyav);
        }
    }
}

static void decode_bench_runs_all_three_on_the_same_plan(void **state)
{
    char mix[1024]; /* dh_test_path's buffer is reused by the next call */
    snprintf(mix, sizeof mix, "%s", dh_test_path("tiny-mix.json"));
    dh_test_write_file(mix, "[{\"frames\": 4, \"height\": 64, \"width\": 64, \"duration_s\": 1,"
                            " \"fps\": 12}]");
    char work[1024];
    snprintf(work, sizeof work, "%s", dh_test_path("decode-bench"));
    dh_decode_bench_config_t cfg = bench_config(mix, 3, work);
    dh_decode_bench_result_t r;
    int rc = dh_decode_bench_run(&cfg, &r);
    if (rc != 0)
        fail_msg("decode-bench: %s (%s)", dh_last_error(), dh_err_name(rc));
    assert_int_equal(r.clips, 3);
    assert_int_equal(r.frames, 12);
    assert_true(r.datahelix_clips_per_s > 0);
    assert_true(r.ffmpeg_clips_per_s > 0);
    assert_string_equal(r.ffmpeg_method, "one-process");
    assert_string_equal(r.encoding, "flat-b");
    if (!(r.pyav_clips_per_s > 0))
        fail_msg("no PyAV column: %s", r.pyav_error);
    assert_true(r.pyav_skip_clips_per_s > 0);
    /* The three decoders produce the same frames. */
    assert_int_equal(r.check_clips, 3);
    assert_true(r.pixel_mad_vs_pyav >= 0 && r.pixel_mad_vs_pyav <= 3.0);
    assert_true(r.pixel_mad_ffmpeg_vs_pyav >= 0 && r.pixel_mad_ffmpeg_vs_pyav <= 3.0);
    assert_peers_stated(&r);
    /* The data set is made once and reused. */
    assert_int_equal(dh_decode_bench_run(&cfg, &r), 0);
    /* Without the peer script every peer column says so. */
    cfg.peer_script = dh_test_path("no-such-peer-script.py");
    assert_int_equal(dh_decode_bench_run(&cfg, &r), 0);
    assert_peers_stated(&r);
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++)
        assert_non_null(strstr(r.peers[p].reason, "no peer script"));
}

/* NAME@ENCODING makes the data set with that synth encoding (x264's B-pyramid, or no
 * B-frames) and the same checks hold on it. */
static void decode_bench_runs_the_other_encodings(void **state)
{
    char mix[1024];
    snprintf(mix, sizeof mix, "%s", dh_test_path("tiny-mix-enc.json"));
    dh_test_write_file(mix, "[{\"frames\": 6, \"height\": 64, \"width\": 64, \"duration_s\": 1,"
                            " \"fps\": 12}]");
    char work[1024];
    snprintf(work, sizeof work, "%s", dh_test_path("decode-bench-enc"));
    static const char *const encodings[] = {"x264-default", "no-b"};
    for (size_t e = 0; e < 2; e++) {
        char name[1100];
        snprintf(name, sizeof name, "%s@%s", mix, encodings[e]);
        dh_decode_bench_config_t cfg = bench_config(name, 2, work);
        dh_decode_bench_result_t r;
        int rc = dh_decode_bench_run(&cfg, &r);
        if (rc != 0)
            fail_msg("decode-bench %s: %s (%s)", name, dh_last_error(), dh_err_name(rc));
        assert_string_equal(r.encoding, encodings[e]);
        assert_int_equal(r.frames, 12);
        assert_true(r.ffmpeg_clips_per_s > 0);
        if (!(r.pyav_skip_clips_per_s > 0))
            fail_msg("no PyAV column: %s", r.pyav_error);
        assert_true(r.pixel_mad_vs_pyav >= 0 && r.pixel_mad_vs_pyav <= 3.0);
        assert_true(r.pixel_mad_ffmpeg_vs_pyav >= 0 && r.pixel_mad_ffmpeg_vs_pyav <= 3.0);
        assert_peers_stated(&r);
    }
}

static void decode_bench_names_a_bad_encoding(void **state)
{
    dh_decode_bench_config_t cfg = {.mix = "kinetics-s@no-such-encoding",
                                    .clips = 1,
                                    .runs = 1,
                                    .work_dir = dh_test_path("decode-bench-bad-enc")};
    dh_decode_bench_result_t r;
    assert_int_equal(dh_decode_bench_run(&cfg, &r), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "no-such-encoding"));
}

static void decode_bench_names_a_bad_mix(void **state)
{
    dh_decode_bench_config_t cfg = {
        .mix = "no-such-mix", .clips = 1, .runs = 1, .work_dir = dh_test_path("decode-bench-bad")};
    dh_decode_bench_result_t r;
    assert_int_equal(dh_decode_bench_run(&cfg, &r), DH_EUNKNOWN);
    assert_non_null(strstr(dh_last_error(), "no-such-mix"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(decode_bench_runs_all_three_on_the_same_plan),
    cmocka_unit_test(decode_bench_runs_the_other_encodings),
    cmocka_unit_test(decode_bench_names_a_bad_mix),
    cmocka_unit_test(decode_bench_names_a_bad_encoding),
};
DH_TEST_MAIN(tests)
