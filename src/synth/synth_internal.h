/* synth_internal.h: what the files of src/synth/ share (synth_frame.c, synth_encode.c,
 * synth_manifest.c, synth_dataset.c): a clip's plan within a data set, and the steps one
 * file does for another. Private to src/synth/; FFmpeg types stay in synth_encode.c.
 */
#ifndef DH_SYNTH_SYNTH_INTERNAL_H
#define DH_SYNTH_SYNTH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/rng.h"
#include "datahelix/synth.h"

/* Everything about clip i, drawn before any encoding starts. */
typedef struct dh__synth_clip_plan {
    size_t entry;         /* mix entry it was drawn from */
    dh_synth_clip_t clip; /* what to encode */
    dh_synth_encoding_t encoding;
    int64_t frames; /* frames it will have */
} dh__synth_clip_plan_t;

/* A draw of rng, uniform in [lo, hi): a scene's (synth_frame.c) and a clip's shape
 * (synth_manifest.c). */
static inline double dh__synth_uniform_in(dh_rng_t *rng, double lo, double hi)
{
    return lo + (hi - lo) * dh_rng_uniform(rng);
}

/* Frame count and keyframe interval of a valid clip, or DH_EINVAL naming the path
 * (synth_encode.c). */
int dh__synth_clip_check(const char *path, const dh_synth_clip_t *clip, int64_t *frames, int *gop);
/* Clip i of a data set, drawn from a stream seeded by (seed, i) alone (synth_manifest.c). */
void dh__synth_plan_clip(const dh_mix_t *mix, double total_weight, uint64_t seed, size_t i,
                         dh__synth_clip_plan_t *plan);
/* mkdir that accepts an existing directory; -errno naming the path otherwise
 * (synth_manifest.c). */
int dh__synth_make_dir(const char *path);
/* Writes DIR/manifest.jsonl through DIR/manifest.jsonl.part and a rename (synth_manifest.c). */
int dh__synth_manifest_write(const char *out_dir, const dh__synth_clip_plan_t *plans,
                             const dh_mix_t *mix, size_t count);
/* A short sentence about what the clip of this seed shows (synth_frame.c). */
void dh__synth_caption(uint64_t seed, char *out, size_t size);

#endif
