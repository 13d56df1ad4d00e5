/* spec.c: the pipeline spec (pipeline.h, docs/pipeline.md): defaults, JSON parsing with
 * messages that name the source and the field, range checks, and JSON output.
 *
 * A spec is a hand-written config: an unknown field is most likely a typo ("frame") that
 * would silently fall back to a default, so it is an error, as in mix files.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"
#include "core/internal.h"
#include "media/pipeline_internal.h"

#define MAX_PIXELS_LIMIT ((int64_t)DH_PIPELINE_MAX_SIDE * DH_PIPELINE_MAX_SIDE)
#define MAX_PATCH 1024
#define MAX_MERGE 64
#define MAX_FPS 1000.0

static const char *const sampling_names[] = {"uniform", "random-window", "fps"};
static const char *const resize_names[] = {"short-side+center-crop", "fixed", "native"};
/* The dtypes a spec may ask for (a subset of DH_DTYPE_MAP: what the decode pipeline writes);
 * their names are the table's (dh_dtype_name). */
static const dh_dtype_t spec_dtypes[] = {DH_DTYPE_UINT8, DH_DTYPE_FLOAT32};
static const char *const layout_names[] = {"TCHW", "THWC"};

const char *dh_sampling_name(dh_sampling_t sampling)
{
    return (unsigned)sampling < DH_ARRAY_LEN(sampling_names) ? sampling_names[sampling] : "?";
}

const char *dh_resize_name(dh_resize_t resize)
{
    return (unsigned)resize < DH_ARRAY_LEN(resize_names) ? resize_names[resize] : "?";
}

const char *dh_layout_name(dh_layout_t layout)
{
    return (unsigned)layout < DH_ARRAY_LEN(layout_names) ? layout_names[layout] : "?";
}

void dh_pipeline_spec_defaults(dh_pipeline_spec_t *spec)
{
    *spec = (dh_pipeline_spec_t){
        .frames = 16,
        .sampling = DH_SAMPLING_UNIFORM,
        .window_stride = 4,
        .allow_repeat = false,
        .resize = DH_RESIZE_SHORT_SIDE_CROP,
        .height = 224,
        .width = 224,
        .dtype = DH_DTYPE_UINT8,
        .layout = DH_LAYOUT_TCHW,
        .mean = {0.485f, 0.456f, 0.406f},
        .std = {0.229f, 0.224f, 0.225f},
        .fps = 2.0,
        .min_frames = 4,
        .max_frames = 64,
        .min_pixels = 3136,
        .max_pixels = 200704,
        .patch_size = 14,
        .temporal_patch = 2,
        .spatial_merge = 2,
        .seed = 0,
    };
}

/* ---- range checks, shared by parse (DH_ESCHEMA) and check (DH_EINVAL) ------------------ */

static int check_ranges(const dh_pipeline_spec_t *s, const char *source, int code)
{
#define INT_RANGE(field, lo, hi)                                                                   \
    if ((int64_t)s->field < (lo) || (int64_t)s->field > (hi))                                      \
    return dh__set_error(code, "%s: field '" #field "': %lld is not in [%lld, %lld]", source,      \
                         (long long)s->field, (long long)(lo), (long long)(hi))
    INT_RANGE(frames, 1, DH_PIPELINE_MAX_FRAMES);
    INT_RANGE(window_stride, 1, DH_PIPELINE_MAX_FRAMES);
    INT_RANGE(height, 1, DH_PIPELINE_MAX_SIDE);
    INT_RANGE(width, 1, DH_PIPELINE_MAX_SIDE);
    INT_RANGE(min_frames, 1, DH_PIPELINE_MAX_FRAMES);
    INT_RANGE(max_frames, 1, DH_PIPELINE_MAX_FRAMES);
    INT_RANGE(min_pixels, 1, MAX_PIXELS_LIMIT);
    INT_RANGE(max_pixels, 1, MAX_PIXELS_LIMIT);
    INT_RANGE(patch_size, 1, MAX_PATCH);
    INT_RANGE(temporal_patch, 1, MAX_PATCH);
    INT_RANGE(spatial_merge, 1, MAX_MERGE);
#undef INT_RANGE
    if ((unsigned)s->sampling >= DH_ARRAY_LEN(sampling_names))
        return dh__set_error(code, "%s: field 'sampling': unknown value %d", source, s->sampling);
    if ((unsigned)s->resize >= DH_ARRAY_LEN(resize_names))
        return dh__set_error(code, "%s: field 'resize': unknown value %d", source, s->resize);
    if (s->dtype != DH_DTYPE_UINT8 && s->dtype != DH_DTYPE_FLOAT32)
        return dh__set_error(code, "%s: field 'dtype': unknown value %d", source, s->dtype);
    if ((unsigned)s->layout >= DH_ARRAY_LEN(layout_names))
        return dh__set_error(code, "%s: field 'layout': unknown value %d", source, s->layout);
    if (!(s->fps > 0) || s->fps > MAX_FPS)
        return dh__set_error(code, "%s: field 'fps': %g is not in (0, %g]", source, s->fps,
                             MAX_FPS);
    for (int c = 0; c < 3; c++) {
        if (!isfinite(s->mean[c]))
            return dh__set_error(code, "%s: field 'mean': [%d] is not a finite number", source, c);
        if (!(s->std[c] > 0) || !isfinite(s->std[c]))
            return dh__set_error(code, "%s: field 'std': [%d] must be a finite number > 0", source,
                                 c);
    }
    if (s->min_frames > s->max_frames)
        return dh__set_error(code, "%s: field 'min_frames': %d is above max_frames %d", source,
                             (int)s->min_frames, (int)s->max_frames);
    if (s->min_pixels > s->max_pixels)
        return dh__set_error(code, "%s: field 'min_pixels': %lld is above max_pixels %lld", source,
                             (long long)s->min_pixels, (long long)s->max_pixels);
    int64_t factor = (int64_t)s->patch_size * s->spatial_merge;
    if (s->resize == DH_RESIZE_NATIVE && factor * factor > s->max_pixels)
        return dh__set_error(code,
                             "%s: field 'max_pixels': %lld is below one merged patch "
                             "((patch_size x spatial_merge)^2 = %lld)",
                             source, (long long)s->max_pixels, (long long)(factor * factor));
    return 0;
}

int dh_pipeline_spec_check(const dh_pipeline_spec_t *spec)
{
    return check_ranges(spec, "pipeline spec", DH_EINVAL);
}

/* ---- JSON parsing ---------------------------------------------------------------------- */

static int get_int(json_t *v, const char *source, const char *field, int64_t lo, int64_t hi,
                   int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return dh__set_error(DH_ESCHEMA, "%s: field '%s': expected an integer in [%lld, %lld]",
                             source, field, (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return 0;
}

static int get_enum(json_t *v, const char *source, const char *field, const char *const *names,
                    size_t n, int *out)
{
    if (json_is_string(v))
        for (size_t i = 0; i < n; i++)
            if (strcmp(json_string_value(v), names[i]) == 0) {
                *out = (int)i;
                return 0;
            }
    char known[128] = "";
    for (size_t i = 0; i < n; i++) {
        size_t used = strlen(known);
        snprintf(known + used, sizeof known - used, "%s\"%s\"", i ? ", " : "", names[i]);
    }
    return dh__set_error(DH_ESCHEMA, "%s: field '%s': expected one of %s", source, field, known);
}

static int get_rgb(json_t *v, const char *source, const char *field, float out[3])
{
    if (!json_is_array(v) || json_array_size(v) != 3)
        return dh__set_error(DH_ESCHEMA, "%s: field '%s': expected a list of 3 numbers (R, G, B)",
                             source, field);
    for (size_t c = 0; c < 3; c++) {
        json_t *x = json_array_get(v, c);
        if (!json_is_number(x) || !isfinite(json_number_value(x)))
            return dh__set_error(DH_ESCHEMA, "%s: field '%s': [%zu] is not a finite number", source,
                                 field, c);
        out[c] = (float)json_number_value(x);
    }
    return 0;
}

/* One field of the object; returns 1 when the key is unknown. */
static int parse_field(const char *source, const char *key, json_t *v, dh_pipeline_spec_t *s)
{
    int64_t i = 0;
    int e = 0, rc = 0;
#define INT_FIELD(name, lo, hi)                                                                    \
    if (strcmp(key, #name) == 0) {                                                                 \
        if ((rc = get_int(v, source, key, lo, hi, &i)) == 0)                                       \
            s->name = i;                                                                           \
        return rc;                                                                                 \
    }
    INT_FIELD(frames, 1, DH_PIPELINE_MAX_FRAMES)
    INT_FIELD(window_stride, 1, DH_PIPELINE_MAX_FRAMES)
    INT_FIELD(height, 1, DH_PIPELINE_MAX_SIDE)
    INT_FIELD(width, 1, DH_PIPELINE_MAX_SIDE)
    INT_FIELD(min_frames, 1, DH_PIPELINE_MAX_FRAMES)
    INT_FIELD(max_frames, 1, DH_PIPELINE_MAX_FRAMES)
    INT_FIELD(min_pixels, 1, MAX_PIXELS_LIMIT)
    INT_FIELD(max_pixels, 1, MAX_PIXELS_LIMIT)
    INT_FIELD(patch_size, 1, MAX_PATCH)
    INT_FIELD(temporal_patch, 1, MAX_PATCH)
    INT_FIELD(spatial_merge, 1, MAX_MERGE)
    INT_FIELD(seed, 0, INT64_MAX)
#undef INT_FIELD
#define ENUM_FIELD(name, names)                                                                    \
    if (strcmp(key, #name) == 0) {                                                                 \
        if ((rc = get_enum(v, source, key, names, DH_ARRAY_LEN(names), &e)) == 0)                  \
            s->name = e;                                                                           \
        return rc;                                                                                 \
    }
    ENUM_FIELD(sampling, sampling_names)
    ENUM_FIELD(resize, resize_names)
    if (strcmp(key, "dtype") == 0) {
        const char *dtype_names[DH_ARRAY_LEN(spec_dtypes)];
        for (size_t d = 0; d < DH_ARRAY_LEN(spec_dtypes); d++)
            dtype_names[d] = dh_dtype_name(spec_dtypes[d]);
        if ((rc = get_enum(v, source, key, dtype_names, DH_ARRAY_LEN(dtype_names), &e)) == 0)
            s->dtype = spec_dtypes[e];
        return rc;
    }
    ENUM_FIELD(layout, layout_names)
#undef ENUM_FIELD
    if (strcmp(key, "mean") == 0)
        return get_rgb(v, source, key, s->mean);
    if (strcmp(key, "std") == 0)
        return get_rgb(v, source, key, s->std);
    if (strcmp(key, "fps") == 0) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > MAX_FPS)
            return dh__set_error(DH_ESCHEMA, "%s: field 'fps': expected a number in (0, %g]",
                                 source, MAX_FPS);
        s->fps = json_number_value(v);
        return 0;
    }
    if (strcmp(key, "allow_repeat") == 0) {
        if (!json_is_boolean(v))
            return dh__set_error(DH_ESCHEMA, "%s: field 'allow_repeat': expected true or false",
                                 source);
        s->allow_repeat = json_is_true(v);
        return 0;
    }
    return 1;
}

static int parse_root(json_t *root, const char *source, dh_pipeline_spec_t *out)
{
    if (!json_is_object(root))
        return dh__set_error(DH_ESCHEMA, "%s: expected a JSON object (the pipeline spec)", source);
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        int rc = parse_field(source, key, value, &spec);
        if (rc < 0)
            return rc;
        if (rc > 0)
            return dh__set_error(DH_ESCHEMA,
                                 "%s: unknown field '%s' (known: frames, sampling, window_stride, "
                                 "allow_repeat, resize, height, width, dtype, layout, mean, std, "
                                 "fps, min_frames, max_frames, min_pixels, max_pixels, "
                                 "patch_size, temporal_patch, spatial_merge, seed)",
                                 source, key);
    }
    int rc = check_ranges(&spec, source, DH_ESCHEMA);
    if (rc < 0)
        return rc;
    *out = spec;
    return 0;
}

/* Shared tail of parse and load: out-of-memory and syntax errors, then the object. */
static int finish(json_t *root, const json_error_t *jerr, const char *source,
                  dh_pipeline_spec_t *spec)
{
    int rc = dh__json_check(root, jerr, source);
    if (rc)
        return rc;
    rc = parse_root(root, source, spec);
    json_decref(root);
    return rc;
}

int dh_pipeline_spec_parse(const char *json, size_t len, const char *source,
                           dh_pipeline_spec_t *spec)
{
    if (!source)
        source = "pipeline spec";
    dh__json_track_begin();
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    return finish(root, &jerr, source, spec);
}

int dh_pipeline_spec_load(const char *path, dh_pipeline_spec_t *spec)
{
    json_error_t jerr;
    json_t *root;
    int rc = dh__json_load_file(path, &root, &jerr);
    return rc ? rc : finish(root, &jerr, path, spec);
}

char *dh_pipeline_spec_to_json(const dh_pipeline_spec_t *s)
{
    char buf[1024];
    int n = snprintf(
        buf, sizeof buf,
        "{\"frames\": %d, \"sampling\": \"%s\", \"window_stride\": %d, \"allow_repeat\": %s, "
        "\"resize\": \"%s\", \"height\": %d, \"width\": %d, \"dtype\": \"%s\", \"layout\": "
        "\"%s\", \"mean\": [%.9g, %.9g, %.9g], \"std\": [%.9g, %.9g, %.9g], \"fps\": %.17g, "
        "\"min_frames\": %d, \"max_frames\": %d, \"min_pixels\": %lld, \"max_pixels\": %lld, "
        "\"patch_size\": %d, \"temporal_patch\": %d, \"spatial_merge\": %d, \"seed\": %llu}",
        (int)s->frames, dh_sampling_name(s->sampling), (int)s->window_stride,
        s->allow_repeat ? "true" : "false", dh_resize_name(s->resize), (int)s->height,
        (int)s->width, dh_dtype_name(s->dtype), dh_layout_name(s->layout), s->mean[0], s->mean[1],
        s->mean[2], s->std[0], s->std[1], s->std[2], s->fps, (int)s->min_frames, (int)s->max_frames,
        (long long)s->min_pixels, (long long)s->max_pixels, (int)s->patch_size,
        (int)s->temporal_patch, (int)s->spatial_merge, (unsigned long long)s->seed);
    if (n < 0 || (size_t)n >= sizeof buf)
        return NULL; /* cannot happen with checked ranges */
    return dh_strdup(buf);
}
