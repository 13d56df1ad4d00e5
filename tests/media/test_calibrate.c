/* Tests of the probe's cost calibration: the fit recovers known coefficients, keeps them
 * non-negative, learns bucket ratios, and the cache file round-trips per machine. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/calibrate.h"
#include "datahelix/error.h"

static void bucket_key_classes_resolutions(void **state)
{
    dh_media_info_t info = {.codec = "h264", .width = 854, .height = 480};
    char key[32];
    dh_calibration_bucket_key(&info, key, sizeof key);
    assert_string_equal(key, "h264-480p");
    info.width = 448;
    info.height = 448;
    dh_calibration_bucket_key(&info, key, sizeof key);
    assert_string_equal(key, "h264-480p");
    info.width = 720; /* portrait 720x1280: the short side decides */
    info.height = 1280;
    dh_calibration_bucket_key(&info, key, sizeof key);
    assert_string_equal(key, "h264-720p");
    info.width = 224;
    info.height = 224;
    dh_calibration_bucket_key(&info, key, sizeof key);
    assert_string_equal(key, "h264-240p");
}

static void fit_recovers_known_coefficients(void **state)
{
    dh_decode_features_t f[12];
    double measured[12];
    const char *buckets[12];
    for (int i = 0; i < 12; i++) {
        f[i].decoded_px = 1e6 * (1 + i * 3 % 7) * (1 + i % 4);
        f[i].output_px = 2e5 * (1 + i % 5);
        f[i].decoded_bytes = 1e5 * (1 + i * 5 % 11);
        measured[i] =
            0.004 + 3e-9 * f[i].decoded_px + 1e-8 * f[i].output_px + 2e-7 * f[i].decoded_bytes;
        buckets[i] = i % 2 ? "h264-240p" : "h264-480p";
    }
    dh_calibration_t cal = {0};
    assert_int_equal(dh_calibration_fit(f, buckets, measured, 12, &cal), 0);
    assert_close(cal.fixed_s, 0.004, 1e-6);
    assert_close(cal.s_per_decoded_px, 3e-9, 1e-12);
    assert_close(cal.s_per_output_px, 1e-8, 1e-11);
    assert_close(cal.s_per_byte, 2e-7, 1e-10);
    assert_int_equal(cal.n_buckets, 2);
    for (int i = 0; i < 12; i++)
        assert_close(dh_calibration_predict(&cal, buckets[i], &f[i]), measured[i],
                     1e-6 * measured[i]);
}

static void fit_keeps_coefficients_non_negative(void **state)
{
    /* Time falls with output pixels here: an unconstrained fit would go negative. */
    dh_decode_features_t f[6];
    double measured[6];
    const char *buckets[6];
    for (int i = 0; i < 6; i++) {
        f[i] = (dh_decode_features_t){1e6 * (i + 1), 1e6 * (6 - i), 0};
        measured[i] = 0.01 * (i + 1);
        buckets[i] = "h264-360p";
    }
    dh_calibration_t cal = {0};
    assert_int_equal(dh_calibration_fit(f, buckets, measured, 6, &cal), 0);
    assert_true(cal.fixed_s >= 0);
    assert_true(cal.s_per_decoded_px >= 0);
    assert_true(cal.s_per_output_px >= 0);
    assert_close(cal.s_per_decoded_px, 1e-8, 1e-12);
}

static void bucket_ratios_correct_a_slower_class(void **state)
{
    /* The 720p bucket decodes 1.5x slower per pixel than the model of the others. */
    dh_decode_features_t f[9];
    double measured[9];
    const char *buckets[9];
    for (int i = 0; i < 9; i++) {
        f[i] = (dh_decode_features_t){1e7 * (1 + i % 3), 1e6, 0};
        buckets[i] = i < 6 ? "h264-360p" : "h264-720p";
        measured[i] = (0.01 + 2e-9 * f[i].decoded_px) * (i < 6 ? 1.0 : 1.5);
    }
    dh_calibration_t cal = {0};
    assert_int_equal(dh_calibration_fit(f, buckets, measured, 9, &cal), 0);
    for (int i = 0; i < 9; i++) {
        double p = dh_calibration_predict(&cal, buckets[i], &f[i]);
        if (fabs(p - measured[i]) > 0.05 * measured[i])
            fail_msg("sample %d (%s): predicted %g, measured %g", i, buckets[i], p, measured[i]);
    }
    /* A new bucket added later keeps the coefficients. */
    double before = cal.s_per_decoded_px;
    dh_decode_features_t g = {1e7, 1e6, 0};
    double m = 2 * (0.01 + 2e-9 * 1e7);
    const char *b = "hevc-360p";
    assert_int_equal(dh_calibration_add_buckets(&g, &b, &m, 1, &cal), 0);
    assert_close(cal.s_per_decoded_px, before, 0);
    assert_true(dh_calibration_has_bucket(&cal, "hevc-360p"));
    assert_close(dh_calibration_predict(&cal, "hevc-360p", &g), m, 1e-9);
    assert_int_equal(dh_calibration_fit(&g, &b, (double[]){-1}, 1, &cal), DH_EINVAL);
}

static void cache_round_trips_per_machine(void **state)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", dh_test_path("cache/sub/calibration.json"));
    dh_calibration_t a = {.fixed_s = 0.003,
                          .s_per_decoded_px = 2.5e-9,
                          .s_per_output_px = 4e-9,
                          .s_per_byte = 3e-8,
                          .n_buckets = 2,
                          .buckets = {{"h264-240p", 1.1, 3}, {"h264-720p", 0.9, 2}}};
    dh_calibration_t b = a, got;
    b.fixed_s = 0.007;
    assert_int_equal(dh_calibration_load(path, "cpu-a", &got), DH_ENOENT);
    assert_int_equal(dh_calibration_save(path, "cpu-a", &a), 0);
    assert_int_equal(dh_calibration_save(path, "cpu-b", &b), 0);
    assert_int_equal(dh_calibration_load(path, "cpu-a", &got), 0);
    assert_close(got.fixed_s, 0.003, 1e-12);
    assert_close(got.s_per_decoded_px, 2.5e-9, 1e-18);
    assert_close(got.s_per_output_px, 4e-9, 1e-18);
    assert_close(got.s_per_byte, 3e-8, 1e-18);
    assert_int_equal(got.n_buckets, 2);
    assert_true(dh_calibration_has_bucket(&got, "h264-720p"));
    assert_int_equal(dh_calibration_load(path, "cpu-b", &got), 0);
    assert_close(got.fixed_s, 0.007, 1e-12);
    assert_int_equal(dh_calibration_load(path, "cpu-c", &got), DH_ENOENT);
    dh_test_write_file(path, "not json");
    assert_int_equal(dh_calibration_load(path, "cpu-a", &got), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "calibration.json"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(bucket_key_classes_resolutions),
    cmocka_unit_test(fit_recovers_known_coefficients),
    cmocka_unit_test(fit_keeps_coefficients_non_negative),
    cmocka_unit_test(bucket_ratios_correct_a_slower_class),
    cmocka_unit_test(cache_round_trips_per_machine),
};
DH_TEST_MAIN(tests)
