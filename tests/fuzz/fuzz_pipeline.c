/* fuzz_pipeline.c: the pipeline spec parser (src/media/spec.c) on untrusted JSON, and the
 * pure planning it drives (src/media/sampling.c).
 *
 * The input is a spec's JSON text (dh_pipeline_spec_parse). Checked on an accepted spec: it
 * passes dh_pipeline_spec_check, its JSON form (dh_pipeline_spec_to_json) parses back to the
 * same spec, and planning a few clips (long, short, of unknown frame count, with and
 * without overrides) either refuses with a documented code or gives a plan whose frame
 * indices are non-decreasing and inside the clip, with a positive output size.
 */
#include <string.h>

#include "fuzz.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/pipeline.h"

static const dh_clip_info_t clips[] = {
    {.frame_count = 300, .fps = 30.0, .duration_s = 10.0, .width = 1280, .height = 720},
    {.frame_count = 5, .fps = 25.0, .duration_s = 0.2, .width = 64, .height = 48},
    {.frame_count = 0, .fps = 29.97, .duration_s = 3.2, .width = 720, .height = 1280},
};
static const dh_sample_overrides_t overrides[] = {{0, 0, 0}, {8, 100, 200}};

static void check_plans(const dh_pipeline_spec_t *spec)
{
    for (size_t c = 0; c < sizeof clips / sizeof clips[0]; c++)
        for (size_t o = 0; o < sizeof overrides / sizeof overrides[0]; o++) {
            dh_sample_plan_t plan;
            int rc = dh_pipeline_plan(spec, &clips[c], &overrides[o], "fuzz/sample", &plan);
            if (rc != 0) {
                FUZZ_CHECK(rc == DH_ERANGE);
                FUZZ_CHECK(plan.indices == NULL);
                continue;
            }
            FUZZ_CHECK(plan.frames >= 1 && plan.indices);
            FUZZ_CHECK(plan.height >= 1 && plan.width >= 1);
            FUZZ_CHECK(plan.tokens >= 0);
            for (int32_t i = 0; i < plan.frames; i++) {
                FUZZ_CHECK(plan.indices[i] >= 0 && plan.indices[i] < plan.frame_count);
                FUZZ_CHECK(i == 0 || plan.indices[i - 1] <= plan.indices[i]);
            }
            dh_sample_plan_clear(&plan);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dh_pipeline_spec_t spec;
    int rc = dh_pipeline_spec_parse((const char *)data, size, "fuzz.json", &spec);
    if (rc != 0) {
        FUZZ_CHECK(rc == DH_EPARSE || rc == DH_ESCHEMA || rc == DH_ENOMEM);
        return 0;
    }
    FUZZ_CHECK(dh_pipeline_spec_check(&spec) == 0);
    char *json = dh_pipeline_spec_to_json(&spec);
    FUZZ_CHECK(json);
    dh_pipeline_spec_t again;
    FUZZ_CHECK(dh_pipeline_spec_parse(json, strlen(json), "to_json", &again) == 0);
    char *json2 = dh_pipeline_spec_to_json(&again);
    FUZZ_CHECK(json2 && strcmp(json, json2) == 0);
    dh_free(json2);
    dh_free(json);
    check_plans(&spec);
    return 0;
}
