/* test_descriptor.c: the conversions between a sample's profile row, its REQUEST descriptor
 * and the decoder's overrides (src/runtime/descriptor.c): a round trip keeps every field
 * the wire carries, negative predictions go out as 0, an empty key comes back as "?". */
#include <string.h>

#include "dh_test.h"
#include "runtime/descriptor.h"

static dh_profile_row_t full_row(void)
{
    return (dh_profile_row_t){.id = "clip-7",
                              .uri = "clips/7.mp4",
                              .profile_key = "f16x224x224",
                              .key_index = 3,
                              .frames = 16,
                              .height = 224,
                              .width = 200,
                              .tokens_est = 4096,
                              .cpu_s_est = 0.25,
                              .in_bytes = 123456,
                              .out_bytes = 2408448,
                              .duration_s = 10,
                              .codec = "h264"};
}

static void row_to_sample_and_back_keeps_wire_fields(void **state)
{
    dh_profile_row_t row = full_row(), back;
    dh_wire_sample_t s;
    memset(&s, 0xab, sizeof s);
    dh__rt_sample_of_row(&row, &s);
    assert_ptr_equal(s.id, row.id); /* borrowed, not copied */
    assert_string_equal(s.uri, "clips/7.mp4");
    assert_string_equal(s.key, "f16x224x224");
    assert_int_equal(s.frames, 16);
    assert_int_equal(s.height, 224);
    assert_int_equal(s.width, 200);
    assert_int_equal(s.tokens, 4096);
    assert_close(s.cpu_s, 0.25, 0);
    assert_int_equal(s.in_bytes, 123456);
    assert_int_equal(s.out_bytes, 2408448);
    dh__rt_row_of_sample(&s, &back);
    assert_string_equal(back.id, row.id);
    assert_string_equal(back.uri, row.uri);
    assert_string_equal(back.profile_key, row.profile_key);
    assert_int_equal(back.frames, row.frames);
    assert_int_equal(back.height, row.height);
    assert_int_equal(back.width, row.width);
    assert_int_equal(back.tokens_est, row.tokens_est);
    assert_close(back.cpu_s_est, row.cpu_s_est, 0);
    assert_int_equal(back.in_bytes, row.in_bytes);
    assert_int_equal(back.out_bytes, row.out_bytes);
    /* what the wire does not carry is 0 on the way back */
    assert_int_equal(back.key_index, 0);
    assert_close(back.duration_s, 0, 0);
    assert_null(back.codec);
}

/* A negative (unknown) prediction goes out as 0; zero stays zero. */
static void negative_predictions_are_sent_as_zero(void **state)
{
    dh_profile_row_t row = full_row();
    row.tokens_est = -1;
    row.cpu_s_est = -0.5;
    row.in_bytes = -7;
    row.out_bytes = 0;
    dh_wire_sample_t s;
    dh__rt_sample_of_row(&row, &s);
    assert_int_equal(s.tokens, 0);
    assert_close(s.cpu_s, 0, 0);
    assert_int_equal(s.in_bytes, 0);
    assert_int_equal(s.out_bytes, 0);
}

static void empty_or_absent_key_reads_as_unknown(void **state)
{
    dh_wire_sample_t s = {.id = (char *)"a", .uri = (char *)"a.mp4", .key = (char *)""};
    dh_profile_row_t row;
    dh__rt_row_of_sample(&s, &row);
    assert_string_equal(row.profile_key, "?");
    s.key = NULL;
    dh__rt_row_of_sample(&s, &row);
    assert_string_equal(row.profile_key, "?");
}

static void overrides_are_the_sample_size(void **state)
{
    dh_wire_sample_t s = {.frames = 8, .height = 112, .width = 0};
    dh_sample_overrides_t ov = dh__rt_overrides_of_sample(&s);
    assert_int_equal(ov.frames, 8);
    assert_int_equal(ov.height, 112);
    assert_int_equal(ov.width, 0); /* 0: the pipeline's default */
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(row_to_sample_and_back_keeps_wire_fields),
    cmocka_unit_test(negative_predictions_are_sent_as_zero),
    cmocka_unit_test(empty_or_absent_key_reads_as_unknown),
    cmocka_unit_test(overrides_are_the_sample_size),
};
DH_TEST_MAIN(tests)
