/* mix.c: workload mixes (docs/design.md §8) and synthetic profile sets drawn from them.
 *
 * A mix is a weighted list of clip shapes. The built-in ones follow the paper's Kinetics
 * S/M/L workloads plus a wider OpenVid-like spread; any other mix is a JSON file. From a
 * mix, dh_profiles_generate() draws rows whose costs follow the synthetic cost model of
 * docs/profiles.md (decode work depends on the source resolution and on how many frames
 * the decoder must walk through between keyframes; resize work on the output size), so the
 * planner, the scheduler and the benchmarks can run before any real video exists.
 * Everything here is pure and deterministic for a seed.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/rng.h"
#include "core/internal.h"

/* ---- built-in mixes ------------------------------------------------------------------ */

/* Kinetics clips are ~10 s cuts of YouTube videos at 25-30 fps. */
static const dh_mix_entry_t kinetics_s[] = {{16, 224, 224, 10.0, 25.0, 1.0}};
static const dh_mix_entry_t kinetics_m[] = {{32, 336, 336, 10.0, 30.0, 1.0}};
static const dh_mix_entry_t kinetics_l[] = {{64, 448, 448, 10.0, 30.0, 1.0}};
static const dh_mix_entry_t kinetics_mixed[] = {
    {16, 224, 224, 10.0, 25.0, 1.0},
    {32, 336, 336, 10.0, 30.0, 1.0},
    {64, 448, 448, 10.0, 30.0, 1.0},
};
/* OpenVid-like: short and long clips, 256p to 720p, landscape, portrait and square. */
static const dh_mix_entry_t openvid_mixed[] = {
    {8, 256, 448, 2.0, 24.0, 2.0},     /* short landscape, 256p */
    {8, 448, 256, 3.0, 30.0, 1.0},     /* short portrait, 256p */
    {16, 360, 640, 4.0, 30.0, 2.0},    /* 360p landscape */
    {16, 640, 360, 6.0, 30.0, 1.0},    /* 360p portrait */
    {24, 480, 848, 8.0, 24.0, 1.5},    /* 480p landscape, film rate */
    {32, 480, 480, 10.0, 25.0, 1.0},   /* 480p square */
    {48, 720, 1280, 12.0, 30.0, 0.75}, /* 720p landscape */
    {64, 1280, 720, 20.0, 60.0, 0.5},  /* 720p portrait, 60 fps */
};

static const struct builtin {
    const char *name;
    const dh_mix_entry_t *entries;
    size_t count;
} builtins[] = {
    {"kinetics-s", kinetics_s, DH_ARRAY_LEN(kinetics_s)},
    {"kinetics-m", kinetics_m, DH_ARRAY_LEN(kinetics_m)},
    {"kinetics-l", kinetics_l, DH_ARRAY_LEN(kinetics_l)},
    {"kinetics-mixed", kinetics_mixed, DH_ARRAY_LEN(kinetics_mixed)},
    {"openvid-mixed", openvid_mixed, DH_ARRAY_LEN(openvid_mixed)},
};

static const char *const builtin_names[] = {"kinetics-s",     "kinetics-m",    "kinetics-l",
                                            "kinetics-mixed", "openvid-mixed", NULL};

const char *const *dh_mix_builtin_names(void)
{
    return builtin_names;
}

/* ---- mix objects -------------------------------------------------------------------- */

static int mix_make(const char *name, const dh_mix_entry_t *entries, size_t count, dh_mix_t **out)
{
    dh_mix_t *mix = dh_calloc(1, sizeof *mix);
    if (!mix)
        return DH_ENOMEM;
    mix->name = dh_strdup(name);
    mix->entries = dh_calloc(count ? count : 1, sizeof *mix->entries);
    if (!mix->name || !mix->entries) {
        dh_mix_destroy(&mix);
        return DH_ENOMEM;
    }
    if (entries)
        memcpy(mix->entries, entries, count * sizeof *entries);
    mix->count = count;
    *out = mix;
    return 0;
}

void dh_mix_destroy(dh_mix_t **pmix)
{
    if (!pmix || !*pmix)
        return;
    dh_free((*pmix)->name);
    dh_free((*pmix)->entries);
    dh_free(*pmix);
    *pmix = NULL;
}

/* Limits that keep every derived quantity (out_bytes = frames*h*w*3, pixel counts) far
 * from int64 overflow, and catch typos such as a width of 22400. */
#define MIX_MAX_FRAMES 100000
#define MIX_MAX_SIDE 16384
/* And bounds that keep the rows drawn from any accepted mix valid (finite costs, in_bytes
 * far below INT64_MAX: at most ~1.5e15 for a 1:16384 clip of a day at 1000 fps), and the
 * sum of the weights finite. Without them a mix with "duration_s": 1e33 loaded, then every
 * row drawn from it failed with DH_ESCHEMA (in_bytes overflowed to a negative count); the
 * fuzz target tests/fuzz/fuzz_mix.c found it. */
#define MIX_MAX_DURATION_S 86400.0
#define MIX_MAX_FPS 1000.0
#define MIX_MAX_WEIGHT 1e12
#define MIX_DEFAULT_FPS 30.0
#define MIX_DEFAULT_WEIGHT 1.0

static int entry_int(const char *path, size_t i, json_t *obj, const char *field, int32_t max,
                     int32_t *out)
{
    json_t *v = json_object_get(obj, field);
    if (!v)
        return dh__set_error(DH_ESCHEMA, "%s: entry [%zu]: field '%s': missing", path, i, field);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > max)
        return dh__set_error(DH_ESCHEMA,
                             "%s: entry [%zu]: field '%s': expected an integer in [1, %d]", path, i,
                             field, (int)max);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

/* A number in (0, max]; when absent, *out = fallback, or an error if fallback < 0. */
static int entry_number(const char *path, size_t i, json_t *obj, const char *field, double max,
                        double fallback, double *out)
{
    json_t *v = json_object_get(obj, field);
    if (!v) {
        if (fallback < 0)
            return dh__set_error(DH_ESCHEMA, "%s: entry [%zu]: field '%s': missing", path, i,
                                 field);
        *out = fallback;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !(json_number_value(v) <= max))
        return dh__set_error(DH_ESCHEMA,
                             "%s: entry [%zu]: field '%s': expected a number in (0, %g]", path, i,
                             field, max);
    *out = json_number_value(v);
    return 0;
}

static const char *const entry_fields[] = {"frames",     "height", "width",
                                           "duration_s", "fps",    "weight"};

static int entry_parse(const char *path, size_t i, json_t *obj, dh_mix_entry_t *e)
{
    if (!json_is_object(obj))
        return dh__set_error(DH_ESCHEMA, "%s: entry [%zu]: expected an object", path, i);
    /* A mix is a hand-written config: an unknown field is most likely a typo ("weigth")
     * that would silently fall back to a default, so it is an error here (unlike the
     * profile JSONL, whose extra fields are data). */
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value)
    {
        size_t k = 0;
        while (k < DH_ARRAY_LEN(entry_fields) && strcmp(entry_fields[k], key) != 0)
            k++;
        if (k == DH_ARRAY_LEN(entry_fields))
            return dh__set_error(DH_ESCHEMA,
                                 "%s: entry [%zu]: unknown field '%s' (known: frames, height, "
                                 "width, duration_s, fps, weight)",
                                 path, i, key);
    }
    int rc;
    if ((rc = entry_int(path, i, obj, "frames", MIX_MAX_FRAMES, &e->frames)) < 0 ||
        (rc = entry_int(path, i, obj, "height", MIX_MAX_SIDE, &e->height)) < 0 ||
        (rc = entry_int(path, i, obj, "width", MIX_MAX_SIDE, &e->width)) < 0 ||
        (rc = entry_number(path, i, obj, "duration_s", MIX_MAX_DURATION_S, -1, &e->duration_s)) <
            0 ||
        (rc = entry_number(path, i, obj, "fps", MIX_MAX_FPS, MIX_DEFAULT_FPS, &e->fps)) < 0 ||
        (rc = entry_number(path, i, obj, "weight", MIX_MAX_WEIGHT, MIX_DEFAULT_WEIGHT,
                           &e->weight)) < 0)
        return rc;
    return 0;
}

/* The mix from jansson's result of parsing `source` (a path or a caller's name): out of
 * memory and syntax errors, then the list. Takes root. */
static int mix_from_json(json_t *root, const json_error_t *jerr, const char *source, dh_mix_t **out)
{
    *out = NULL;
    int rc = dh__json_check(root, jerr, source);
    if (rc)
        return rc;
    dh_mix_t *mix = NULL;
    if (!json_is_array(root)) {
        rc = dh__set_error(DH_ESCHEMA,
                           "%s: expected a JSON list of {frames, height, width, duration_s, "
                           "fps, weight} objects",
                           source);
        goto out;
    }
    if (json_array_size(root) == 0) {
        rc = dh__set_error(DH_ESCHEMA, "%s: the mix has no entries", source);
        goto out;
    }
    if ((rc = mix_make(source, NULL, json_array_size(root), &mix)) < 0) {
        dh__set_error(rc, "%s: out of memory", source);
        goto out;
    }
    for (size_t i = 0; i < mix->count; i++)
        if ((rc = entry_parse(source, i, json_array_get(root, i), &mix->entries[i])) < 0)
            goto out;
out:
    json_decref(root);
    if (rc < 0)
        dh_mix_destroy(&mix);
    *out = mix;
    return rc;
}

static int mix_load_file(const char *path, dh_mix_t **out)
{
    json_error_t jerr;
    json_t *root;
    int rc = dh__json_load_file(path, &root, &jerr);
    if (rc) {
        *out = NULL;
        return rc;
    }
    return mix_from_json(root, &jerr, path, out);
}

int dh_mix_parse(const char *json, size_t len, const char *source, dh_mix_t **out)
{
    if (!source)
        source = "mix";
    dh__json_track_begin();
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    return mix_from_json(root, &jerr, source, out);
}

int dh_mix_load(const char *name_or_path, dh_mix_t **out)
{
    *out = NULL;
    for (size_t i = 0; i < DH_ARRAY_LEN(builtins); i++)
        if (strcmp(builtins[i].name, name_or_path) == 0) {
            int rc = mix_make(name_or_path, builtins[i].entries, builtins[i].count, out);
            return rc < 0 ? dh__set_error(rc, "mix %s: out of memory", name_or_path) : 0;
        }
    struct stat st;
    if (stat(name_or_path, &st) != 0 && errno == ENOENT)
        return dh__set_error(DH_EUNKNOWN,
                             "'%s' is neither a built-in mix (kinetics-s, kinetics-m, "
                             "kinetics-l, kinetics-mixed, openvid-mixed) nor an existing file",
                             name_or_path);
    return mix_load_file(name_or_path, out);
}

/* ---- tokens and the synthetic cost model (docs/profiles.md) ---------------------------- */

int64_t dh_tokens_visual(int32_t frames, int32_t height, int32_t width)
{
    int64_t t = (frames + 1) / 2, h = (height + 13) / 14, w = (width + 13) / 14;
    return t * h * w / 4;
}

/* Constants of the model. See docs/profiles.md for where the numbers come from. */
#define COST_FIXED_S 0.002          /* open + demux + container parse per sample */
#define COST_DECODE_S_PER_PX 2.5e-9 /* software H.264 decode, one core (~400 Mpx/s) */
#define COST_RESIZE_S_PER_PX 1.5e-9 /* scale + colour convert + normalise, per output px */
#define COST_JITTER_SIGMA 0.15      /* lognormal sigma of the per-sample cost noise */
#define GOP_SECONDS 2.0             /* keyframe interval of the source encodes */
#define BITS_PER_PIXEL 0.1          /* encoded bits per source pixel per frame (H.264) */
#define DURATION_SIGMA 0.2          /* lognormal sigma of clip duration around the entry's */
#define TEXT_LEN_MEDIAN 40.0        /* caption length median, tokens */
#define TEXT_LEN_SIGMA 0.8
#define TEXT_LEN_MIN 10
#define TEXT_LEN_MAX 300

/* Source resolution the output is scaled from: the smallest standard height
 * (240/360/480/720/1080/1440/2160) at or above the output's short side; non-square outputs
 * keep their aspect ratio, square outputs are centre crops of a 16:9 source. */
static void source_size(int32_t height, int32_t width, double *src_h, double *src_w)
{
    static const int standard[] = {240, 360, 480, 720, 1080, 1440, 2160};
    int32_t short_side = height < width ? height : width;
    int32_t long_side = height < width ? width : height;
    double s = short_side;
    for (size_t i = 0; i < DH_ARRAY_LEN(standard); i++)
        if (standard[i] >= short_side) {
            s = standard[i];
            break;
        }
    double l = height == width ? s * 16.0 / 9.0 : s * (double)long_side / short_side;
    *src_h = height <= width ? s : l;
    *src_w = height <= width ? l : s;
}

static double clamp(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* Draws row `index` of a generated set. Each row has its own generator seeded from
 * (seed, index), so row i does not depend on how many rows are drawn. */
static void draw_row(const dh_mix_t *mix, const double *cumulative, uint64_t seed, size_t index,
                     dh_profile_row_t *row, char *id, size_t id_size, char *uri, size_t uri_size,
                     char *key, size_t key_size)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, dh_rng_mix(seed, (uint64_t)index));

    /* Entry by weight: binary search in the cumulative weights. O(log entries). */
    double u = dh_rng_uniform(&rng) * cumulative[mix->count - 1];
    size_t lo = 0, hi = mix->count - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (u < cumulative[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    const dh_mix_entry_t *e = &mix->entries[lo];

    double duration = e->duration_s * clamp(exp(DURATION_SIGMA * dh_rng_normal(&rng)), 0.5, 1.5);
    duration = round(duration * 1000.0) / 1000.0;
    if (duration < 0.001)
        duration = 0.001;
    double text = TEXT_LEN_MEDIAN * exp(TEXT_LEN_SIGMA * dh_rng_normal(&rng));
    int64_t text_len = (int64_t)clamp(round(text), TEXT_LEN_MIN, TEXT_LEN_MAX);
    double jitter = exp(COST_JITTER_SIGMA * dh_rng_normal(&rng));

    double src_h, src_w;
    source_size(e->height, e->width, &src_h, &src_w);
    double src_px = src_h * src_w, out_px = (double)e->height * e->width;
    double src_frames = fmax(1.0, round(duration * e->fps));
    double gop = fmax(1.0, round(GOP_SECONDS * e->fps));
    /* Decoding frame n means decoding from the keyframe before it. With samples spread over
     * the clip, the decoder either walks every frame once, or seeks per sample and walks on
     * average half a GOP to reach it; it does whichever is fewer. */
    double decoded = fmin(src_frames, e->frames * (gop / 2.0 + 1.0));
    double cpu = (COST_FIXED_S + COST_DECODE_S_PER_PX * decoded * src_px +
                  COST_RESIZE_S_PER_PX * e->frames * out_px) *
                 jitter;

    snprintf(id, id_size, "s%07zu", index);
    snprintf(uri, uri_size, "synthetic://%s.mp4", id);
    snprintf(key, key_size, "f%dx%dx%d", (int)e->frames, (int)e->height, (int)e->width);
    *row = (dh_profile_row_t){
        .id = id,
        .uri = uri,
        .profile_key = key,
        .frames = e->frames,
        .height = e->height,
        .width = e->width,
        .tokens_est = dh_tokens_visual(e->frames, e->height, e->width) + text_len,
        .cpu_s_est = round(cpu * 1e6) / 1e6, /* microseconds: keeps the JSONL short */
        .in_bytes = (int64_t)llround(duration * e->fps * src_px * BITS_PER_PIXEL / 8.0),
        .out_bytes = (int64_t)e->frames * e->height * e->width * 3,
        .duration_s = duration,
        .fps = e->fps,
        .text_len = text_len,
        .codec = "h264",
    };
}

int dh_profiles_generate(const dh_mix_t *mix, size_t count, uint64_t seed, dh_profile_set_t *out)
{
    if (!mix || mix->count == 0)
        return dh__set_error(DH_EINVAL, "mix %s: no entries to draw from",
                             mix && mix->name ? mix->name : "(null)");
    double *cumulative = dh_calloc(mix->count, sizeof *cumulative);
    if (!cumulative)
        return dh__set_error(DH_ENOMEM, "mix %s: out of memory", mix->name);
    double total = 0;
    for (size_t i = 0; i < mix->count; i++) {
        total += mix->entries[i].weight;
        cumulative[i] = total;
    }
    int rc = 0;
    size_t first = dh_profile_set_count(out); /* ids continue after existing rows */
    for (size_t i = 0; i < count && rc == 0; i++) {
        char id[32], uri[64], key[48];
        dh_profile_row_t row;
        draw_row(mix, cumulative, seed, first + i, &row, id, sizeof id, uri, sizeof uri, key,
                 sizeof key);
        rc = dh_profile_set_add(out, &row);
    }
    dh_free(cumulative);
    return rc;
}
