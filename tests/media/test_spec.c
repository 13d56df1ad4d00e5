/* Tests of the pipeline spec (src/media/spec.c): defaults, JSON parsing of every field,
 * errors that name the source and the field, files, round trip, allocation failure. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"

/* The example of docs/pipeline.md. */
static const char example[] =
    "{\"frames\": 16, \"sampling\": \"uniform\", \"resize\": \"short-side+center-crop\", "
    "\"height\": 224, \"width\": 224, \"dtype\": \"uint8\", \"layout\": \"TCHW\", "
    "\"mean\": [0.485, 0.456, 0.406], \"std\": [0.229, 0.224, 0.225], \"fps\": 2.0, "
    "\"min_frames\": 4, \"max_frames\": 64, \"min_pixels\": 3136, \"max_pixels\": 200704, "
    "\"patch_size\": 14, \"temporal_patch\": 2, \"spatial_merge\": 2, \"seed\": 0}";

/* Field by field: the struct has padding bytes memcmp would see. */
static void assert_spec_equal(const dh_pipeline_spec_t *a, const dh_pipeline_spec_t *b)
{
    assert_int_equal(a->frames, b->frames);
    assert_int_equal(a->sampling, b->sampling);
    assert_int_equal(a->window_stride, b->window_stride);
    assert_int_equal(a->allow_repeat, b->allow_repeat);
    assert_int_equal(a->resize, b->resize);
    assert_int_equal(a->height, b->height);
    assert_int_equal(a->width, b->width);
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->layout, b->layout);
    for (int c = 0; c < 3; c++) {
        assert_close(a->mean[c], b->mean[c], 0);
        assert_close(a->std[c], b->std[c], 0);
    }
    assert_close(a->fps, b->fps, 0);
    assert_int_equal(a->min_frames, b->min_frames);
    assert_int_equal(a->max_frames, b->max_frames);
    assert_int_equal(a->min_pixels, b->min_pixels);
    assert_int_equal(a->max_pixels, b->max_pixels);
    assert_int_equal(a->patch_size, b->patch_size);
    assert_int_equal(a->temporal_patch, b->temporal_patch);
    assert_int_equal(a->spatial_merge, b->spatial_merge);
    assert_int_equal(a->seed, b->seed);
}

static int parse(const char *json, dh_pipeline_spec_t *spec)
{
    return dh_pipeline_spec_parse(json, strlen(json), "spec.json", spec);
}

static void defaults_are_the_documented_example(void **state)
{
    dh_pipeline_spec_t defaults, parsed;
    dh_pipeline_spec_defaults(&defaults);
    assert_int_equal(parse(example, &parsed), 0);
    assert_spec_equal(&defaults, &parsed);
    assert_int_equal(defaults.frames, 16);
    assert_int_equal(defaults.window_stride, 4);
    assert_false(defaults.allow_repeat);
    assert_int_equal(dh_pipeline_spec_check(&defaults), 0);
    /* An empty object is all defaults. */
    assert_int_equal(parse("{}", &parsed), 0);
    assert_spec_equal(&defaults, &parsed);
}

static void every_field_is_read(void **state)
{
    dh_pipeline_spec_t s;
    const char *json =
        "{\"frames\": 32, \"sampling\": \"random-window\", \"window_stride\": 3, "
        "\"allow_repeat\": true, \"resize\": \"native\", \"height\": 100, \"width\": 50, "
        "\"dtype\": \"float32\", \"layout\": \"THWC\", \"mean\": [0.5, 0.25, 0], "
        "\"std\": [1, 2, 0.5], \"fps\": 1.5, \"min_frames\": 2, \"max_frames\": 10, "
        "\"min_pixels\": 100, \"max_pixels\": 50000, \"patch_size\": 16, "
        "\"temporal_patch\": 4, \"spatial_merge\": 1, \"seed\": 12345678901}";
    assert_int_equal(parse(json, &s), 0);
    assert_int_equal(s.frames, 32);
    assert_int_equal(s.sampling, DH_SAMPLING_RANDOM_WINDOW);
    assert_int_equal(s.window_stride, 3);
    assert_true(s.allow_repeat);
    assert_int_equal(s.resize, DH_RESIZE_NATIVE);
    assert_int_equal(s.height, 100);
    assert_int_equal(s.width, 50);
    assert_int_equal(s.dtype, DH_DTYPE_FLOAT32);
    assert_int_equal(s.layout, DH_LAYOUT_THWC);
    assert_close(s.mean[0], 0.5, 1e-7);
    assert_close(s.mean[1], 0.25, 1e-7);
    assert_close(s.mean[2], 0, 0);
    assert_close(s.std[1], 2, 0);
    assert_close(s.fps, 1.5, 0);
    assert_int_equal(s.min_frames, 2);
    assert_int_equal(s.max_frames, 10);
    assert_int_equal(s.min_pixels, 100);
    assert_int_equal(s.max_pixels, 50000);
    assert_int_equal(s.patch_size, 16);
    assert_int_equal(s.temporal_patch, 4);
    assert_int_equal(s.spatial_merge, 1);
    assert_int_equal(s.seed, 12345678901ull);
    assert_int_equal(parse("{\"sampling\": \"fps\", \"resize\": \"fixed\"}", &s), 0);
    assert_int_equal(s.sampling, DH_SAMPLING_FPS);
    assert_int_equal(s.resize, DH_RESIZE_FIXED);
}

static void unknown_field_is_named(void **state)
{
    dh_pipeline_spec_t s;
    dh_pipeline_spec_defaults(&s);
    dh_pipeline_spec_t before = s;
    assert_int_equal(parse("{\"frames\": 8, \"frame\": 8}", &s), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "spec.json"));
    assert_non_null(strstr(dh_last_error(), "unknown field 'frame'"));
    assert_spec_equal(&s, &before); /* untouched on error */
}

static void bad_values_name_the_field(void **state)
{
    static const struct {
        const char *json, *field;
    } cases[] = {
        {"{\"frames\": 0}", "'frames'"},
        {"{\"frames\": 2.5}", "'frames'"},
        {"{\"frames\": \"16\"}", "'frames'"},
        {"{\"frames\": 100001}", "'frames'"},
        {"{\"sampling\": \"linear\"}", "'sampling'"},
        {"{\"resize\": 3}", "'resize'"},
        {"{\"dtype\": \"float16\"}", "'dtype'"},
        {"{\"layout\": \"NCHW\"}", "'layout'"},
        {"{\"height\": -1}", "'height'"},
        {"{\"width\": 20000}", "'width'"},
        {"{\"mean\": [0.5, 0.5]}", "'mean'"},
        {"{\"mean\": [0.5, \"a\", 0.5]}", "'mean'"},
        {"{\"std\": [1, 0, 1]}", "'std'"},
        {"{\"std\": 1}", "'std'"},
        {"{\"fps\": 0}", "'fps'"},
        {"{\"fps\": \"2\"}", "'fps'"},
        {"{\"min_frames\": 10, \"max_frames\": 5}", "'min_frames'"},
        {"{\"min_pixels\": 1000, \"max_pixels\": 100}", "'min_pixels'"},
        {"{\"resize\": \"native\", \"min_pixels\": 1, \"max_pixels\": 500}", "'max_pixels'"},
        {"{\"patch_size\": 0}", "'patch_size'"},
        {"{\"temporal_patch\": 0}", "'temporal_patch'"},
        {"{\"spatial_merge\": 65}", "'spatial_merge'"},
        {"{\"seed\": -1}", "'seed'"},
        {"{\"allow_repeat\": 1}", "'allow_repeat'"},
        {"{\"window_stride\": 0}", "'window_stride'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dh_pipeline_spec_t s;
        int rc = parse(cases[i].json, &s);
        if (rc != DH_ESCHEMA || !strstr(dh_last_error(), cases[i].field) ||
            !strstr(dh_last_error(), "spec.json"))
            print_error("%s: %s: %s\n", cases[i].json, dh_err_name(rc), dh_last_error());
        assert_int_equal(rc, DH_ESCHEMA);
        assert_non_null(strstr(dh_last_error(), cases[i].field));
        assert_non_null(strstr(dh_last_error(), "spec.json"));
    }
}

static void not_json_is_eparse_with_the_line(void **state)
{
    dh_pipeline_spec_t s;
    assert_int_equal(parse("{\"frames\": 16,\n \"sampling\": }", &s), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "spec.json:2:"));
    assert_int_equal(parse("[16]", &s), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "expected a JSON object"));
    assert_int_equal(parse("{\"frames\": 1, \"frames\": 2}", &s), DH_EPARSE); /* duplicate */
    /* Not NUL-terminated: only len bytes are read. */
    assert_int_equal(dh_pipeline_spec_parse("{\"frames\": 8}garbage", 13, NULL, &s), 0);
    assert_int_equal(s.frames, 8);
}

static void load_reads_a_file(void **state)
{
    const char *path = dh_test_path("spec.json");
    dh_test_write_file(path, "{\"frames\": 24, \"layout\": \"THWC\"}\n");
    dh_pipeline_spec_t s;
    assert_int_equal(dh_pipeline_spec_load(path, &s), 0);
    assert_int_equal(s.frames, 24);
    assert_int_equal(s.layout, DH_LAYOUT_THWC);
    dh_test_write_file(path, "{\"height\": 0}\n");
    assert_int_equal(dh_pipeline_spec_load(path, &s), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), path));
    assert_non_null(strstr(dh_last_error(), "'height'"));
    const char *missing = dh_test_path("missing-spec.json");
    assert_int_equal(dh_pipeline_spec_load(missing, &s), -ENOENT);
    assert_non_null(strstr(dh_last_error(), missing));
}

static void to_json_round_trips(void **state)
{
    dh_pipeline_spec_t s, back;
    dh_pipeline_spec_defaults(&s);
    s.sampling = DH_SAMPLING_FPS;
    s.resize = DH_RESIZE_NATIVE;
    s.dtype = DH_DTYPE_FLOAT32;
    s.layout = DH_LAYOUT_THWC;
    s.fps = 0.1;
    s.allow_repeat = true;
    s.seed = 77;
    s.mean[1] = 0.123456789f;
    char *json = dh_pipeline_spec_to_json(&s);
    assert_non_null(json);
    assert_int_equal(parse(json, &back), 0);
    assert_spec_equal(&s, &back);
    dh_free(json);
    assert_string_equal(dh_sampling_name(DH_SAMPLING_RANDOM_WINDOW), "random-window");
    assert_string_equal(dh_resize_name(DH_RESIZE_SHORT_SIDE_CROP), "short-side+center-crop");
    assert_string_equal(dh_dtype_name(DH_DTYPE_FLOAT32), "float32");
    assert_string_equal(dh_layout_name(DH_LAYOUT_TCHW), "TCHW");
}

static void check_rejects_bad_specs_built_in_code(void **state)
{
    dh_pipeline_spec_t s;
    dh_pipeline_spec_defaults(&s);
    s.std[2] = 0;
    assert_int_equal(dh_pipeline_spec_check(&s), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "'std'"));
    dh_pipeline_t *p = (dh_pipeline_t *)&s; /* overwritten with NULL */
    assert_int_equal(dh_pipeline_new(&p, &s), DH_EINVAL);
    assert_null(p);
    dh_pipeline_spec_defaults(&s);
    s.layout = (dh_layout_t)7;
    assert_int_equal(dh_pipeline_spec_check(&s), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "'layout'"));
}

static int parse_body(void *ctx)
{
    dh_pipeline_spec_t s;
    int rc = parse(example, &s);
    if (rc != 0)
        return rc;
    char *json = dh_pipeline_spec_to_json(&s);
    if (!json)
        return DH_ENOMEM;
    dh_free(json);
    return 0;
}

static void parse_survives_allocation_failure(void **state)
{
    assert_true(dh_test_each_allocation_failure(parse_body, NULL) > 1);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(defaults_are_the_documented_example),
    cmocka_unit_test(every_field_is_read),
    cmocka_unit_test(unknown_field_is_named),
    cmocka_unit_test(bad_values_name_the_field),
    cmocka_unit_test(not_json_is_eparse_with_the_line),
    cmocka_unit_test(load_reads_a_file),
    cmocka_unit_test(to_json_round_trips),
    cmocka_unit_test(check_rejects_bad_specs_built_in_code),
    cmocka_unit_test(parse_survives_allocation_failure),
};
DH_TEST_MAIN(tests)
