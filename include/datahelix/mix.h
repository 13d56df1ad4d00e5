/* mix.h: workload mixes and synthetic profile sets.
 *
 * A mix is a weighted list of clip shapes {frames, height, width, duration_s, fps, weight}
 * (docs/design.md §8). Built-in mixes follow the paper: kinetics-s (16 frames at 224p),
 * kinetics-m (32 at 336p), kinetics-l (64 at 448p), kinetics-mixed (S/M/L in equal parts)
 * and openvid-mixed (a wider spread of durations and resolutions up to 720p, portrait and
 * landscape). dh_profiles_generate() draws a profile set from a mix with costs from the
 * documented model in docs/profiles.md, so the planner and scheduler can run before any
 * real video exists.
 */
#ifndef DATAHELIX_MIX_H
#define DATAHELIX_MIX_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#include "datahelix/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_mix_entry {
    int32_t frames;    /* frames sampled per clip */
    int32_t height;    /* output height */
    int32_t width;     /* output width */
    double duration_s; /* clip duration */
    double fps;        /* source frame rate */
    double weight;     /* relative share of the mix (> 0) */
} dh_mix_entry_t;

typedef struct dh_mix {
    char *name;              /* built-in name or the file path */
    dh_mix_entry_t *entries; /* count entries */
    size_t count;
} dh_mix_t;

/* Loads a built-in mix by name, or else a JSON file holding a list of entries.
 * Returns 0, DH_EUNKNOWN (not a built-in name and no such file), DH_EPARSE / DH_ESCHEMA
 * (dh_last_error() names the file, the entry index and the field), DH_ENOMEM.
 * *out is the caller's (dh_mix_destroy). */
DH_EXTERN int dh_mix_load(const char *name_or_path, dh_mix_t **out);

/* Parses a mix file's JSON text (`len` bytes, not necessarily NUL-terminated); `source`
 * (NULL: "mix") names it in messages and becomes the mix's name. Returns 0, DH_EPARSE,
 * DH_ESCHEMA, DH_ENOMEM as dh_mix_load. *out is the caller's (dh_mix_destroy). */
DH_EXTERN int dh_mix_parse(const char *json, size_t len, const char *source, dh_mix_t **out);

/* Frees a mix; sets *mix = NULL. Safe on NULL. */
DH_EXTERN void dh_mix_destroy(dh_mix_t **mix);

/* NULL-terminated list of built-in mix names (static storage). */
DH_EXTERN const char *const *dh_mix_builtin_names(void);

/* Visual tokens of a clip under the Qwen-VL style formula with the default parameters
 * (spatial patch 14, temporal patch 2, spatial merge 2):
 *   ceil(frames/2) * ceil(height/14) * ceil(width/14) / 4 */
DH_EXTERN int64_t dh_tokens_visual(int32_t frames, int32_t height, int32_t width);

/* Appends `count` rows drawn from the mix with seed `seed` to `out`, with costs from the
 * synthetic model of docs/profiles.md. Ids are "s%07zu" numbered from the number of rows
 * already in `out` (so "s0000000"... for an empty set). Deterministic for a seed: row i
 * depends only on (seed, i), not on `count`. Returns 0, DH_EINVAL (empty mix) or
 * DH_ENOMEM (rows drawn before the failure stay in `out`). */
DH_EXTERN int dh_profiles_generate(const dh_mix_t *mix, size_t count, uint64_t seed,
                                   dh_profile_set_t *out);

#ifdef __cplusplus
}
#endif
#endif
