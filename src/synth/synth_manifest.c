/* synth_manifest.c: a synthetic data set's files (synth.h, docs/synth.md): every clip's
 * shape drawn from the mix (dh__synth_plan_clip, before any encoding, so the result does not
 * depend on the number of threads), its folders, and manifest.jsonl (one line per clip, with
 * its caption), written last through a .part file and a rename.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/synth.h"
#include "core/internal.h"
#include "synth/synth_internal.h"

/* Clip i's draws come from a stream seeded by (seed, i) alone, so a data set of 100 clips
 * is the first 100 of one of 200 with the same seed, and `jobs` cannot change anything. */
void dh__synth_plan_clip(const dh_mix_t *mix, double total_weight, uint64_t seed, size_t i,
                         dh__synth_clip_plan_t *plan)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, dh_rng_mix(seed, (uint64_t)i));
    double pick = dh_rng_uniform(&rng) * total_weight;
    size_t e = 0;
    while (e + 1 < mix->count && pick >= mix->entries[e].weight) {
        pick -= mix->entries[e].weight;
        e++;
    }
    const dh_mix_entry_t *entry = &mix->entries[e];
    plan->entry = e;
    /* Even sizes for yuv420p: round to the nearest even number, at least 2. */
    plan->clip.width = entry->width < 2 ? 2 : (entry->width + 1) / 2 * 2;
    plan->clip.height = entry->height < 2 ? 2 : (entry->height + 1) / 2 * 2;
    plan->clip.fps = entry->fps;
    plan->clip.duration_s = entry->duration_s * dh__synth_uniform_in(&rng, 0.8, 1.2);
    plan->clip.gop = 0; /* 2 seconds */
    plan->clip.seed = dh_rng_next(&rng);
    double n = round(plan->clip.duration_s * plan->clip.fps);
    plan->frames = n < 1 ? 1 : (int64_t)n;
}

/* mkdir that accepts an existing directory; -errno naming the path otherwise. The folders
 * above it are made first (dh__make_parent_dirs), as `mkdir -p` would. */
int dh__synth_make_dir(const char *path)
{
    if (mkdir(path, 0777) == 0)
        return 0;
    int err = errno;
    struct stat st;
    if (err == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    if (err == EEXIST)
        err = ENOTDIR;
    return dh__set_error(-err, "%s: cannot create the directory: %s", path, strerror(err));
}

/* Writes DIR/manifest.jsonl through DIR/manifest.jsonl.part and a rename. */
int dh__synth_manifest_write(const char *out_dir, const dh__synth_clip_plan_t *plans,
                             const dh_mix_t *mix, size_t count)
{
    size_t dir_len = strlen(out_dir);
    char *path = dh_malloc(dir_len + sizeof "/manifest.jsonl");
    char *path_part = dh_malloc(dir_len + sizeof "/manifest.jsonl.part");
    int rc = 0;
    FILE *f = NULL;
    if (!path || !path_part) {
        rc = dh__set_error(DH_ENOMEM, "%s/manifest.jsonl: out of memory", out_dir);
        goto out;
    }
    sprintf(path, "%s/manifest.jsonl", out_dir);
    sprintf(path_part, "%s/manifest.jsonl.part", out_dir);
    if (!(f = fopen(path_part, "w"))) {
        rc = dh__set_error(-errno, "%s: cannot create: %s", path_part, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        const dh_mix_entry_t *entry = &mix->entries[plans[i].entry];
        char caption[256];
        dh__synth_caption(plans[i].clip.seed, caption, sizeof caption);
        fprintf(f,
                "{\"id\":\"v%07zu\",\"path\":\"clips/v%07zu.mp4\",\"caption\":\"%s\","
                "\"frames\":%d,\"height\":%d,\"width\":%d}\n",
                i, i, caption, (int)entry->frames, (int)entry->height, (int)entry->width);
    }
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) {
        f = NULL;
        rc = dh__set_error(DH_EIO, "%s: cannot write: %s", path_part, strerror(errno));
        goto out;
    }
    f = NULL;
    if (rename(path_part, path) != 0)
        rc = dh__set_error(-errno, "%s: cannot rename into place: %s", path, strerror(errno));
out:
    if (rc < 0 && path_part)
        unlink(path_part);
    dh_free(path);
    dh_free(path_part);
    return rc;
}
