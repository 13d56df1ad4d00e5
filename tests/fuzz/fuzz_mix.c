/* fuzz_mix.c: the mix file parser (src/model/mix.c) on untrusted JSON, and the synthetic
 * profiles drawn from what it accepts.
 *
 * The input is a mix file's JSON text (dh_mix_parse). Checked on an accepted mix: its
 * entries are in the documented ranges, and drawing rows from it (dh_profiles_generate)
 * succeeds with valid rows, as mix.h promises for any non-empty mix.
 */
#include <math.h>

#include "fuzz.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dh_mix_t *mix = NULL;
    int rc = dh_mix_parse((const char *)data, size, "fuzz-mix.json", &mix);
    if (rc != 0) {
        FUZZ_CHECK(mix == NULL);
        FUZZ_CHECK(rc == DH_EPARSE || rc == DH_ESCHEMA || rc == DH_ENOMEM);
        return 0;
    }
    FUZZ_CHECK(mix->count >= 1);
    for (size_t i = 0; i < mix->count; i++) {
        const dh_mix_entry_t *e = &mix->entries[i];
        FUZZ_CHECK(e->frames >= 1 && e->height >= 1 && e->width >= 1);
        FUZZ_CHECK(isfinite(e->duration_s) && e->duration_s > 0);
        FUZZ_CHECK(isfinite(e->fps) && e->fps > 0);
        FUZZ_CHECK(isfinite(e->weight) && e->weight > 0);
    }
    dh_profile_set_t *set = NULL;
    FUZZ_CHECK(dh_profile_set_new(&set) == 0);
    rc = dh_profiles_generate(mix, 4, 1, set);
    FUZZ_CHECK(rc == 0 || rc == DH_ENOMEM);
    FUZZ_CHECK(rc != 0 || dh_profile_set_count(set) == 4);
    dh_profile_set_destroy(&set);
    dh_mix_destroy(&mix);
    return 0;
}
