/* dh_passes.c: DataHelix's side of decode-bench as a process of its own, for perf: PASSES
 * passes of dh_pipeline_decode over a manifest's clips on one thread (THWC uint8, the
 * decode-bench spec), nothing else (docs/pipeline.md, "The bound, and the overhead outside
 * the decoder"). With "recycle", each sample's buffer is handed back to the pipeline
 * (dh__pipeline_recycle, as the data server does) instead of freed. Decoder reuse across
 * samples is on with DH_DECODER_REUSE=1; the decoders opened and reused go to stderr. Not
 * built by CMake:
 *
 *   cc -O2 -Iinclude -Isrc bench/decode/dh_passes.c -o dh_passes build/libdatahelix.a -ljansson \
 *      -lzmq -lmicrohttpd -lavformat -lavcodec -lswscale -lavutil -lcurl -lcrypto -lexpat \
 *      -pthread -lm
 *   perf stat -e task-clock,page-faults taskset -c 1 ./dh_passes DIR/manifest.jsonl 3 [recycle]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "datahelix/pipeline.h"
#include "media/pipeline_internal.h" /* dh__pipeline_recycle, dh__pipeline_decoders */

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: dh_passes MANIFEST PASSES [recycle]\n");
        return 2;
    }
    dh_manifest_t *m = NULL;
    if (dh_manifest_load(argv[1], &m) != 0) {
        fprintf(stderr, "%s: %s\n", argv[1], dh_last_error());
        return 2;
    }
    int passes = atoi(argv[2]);
    int recycle = argc > 3 && strcmp(argv[3], "recycle") == 0;
    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    spec.layout = DH_LAYOUT_THWC;
    spec.dtype = DH_DTYPE_UINT8;
    dh_pipeline_t *p = NULL;
    if (dh_pipeline_new(&p, &spec) != 0)
        return 3;
    int rc = 0;
    for (int r = 0; r < passes && rc == 0; r++)
        for (size_t i = 0; i < dh_manifest_count(m) && rc == 0; i++) {
            const dh_manifest_entry_t *e = dh_manifest_entry(m, i);
            dh_sample_t s;
            dh_sample_overrides_t ovr = {e->frames, e->height, e->width};
            if ((rc = dh_pipeline_decode(p, e->path, &ovr, e->id, &s)) != 0)
                fprintf(stderr, "%s\n", s.error_message ? s.error_message : e->path);
            if (recycle)
                dh__pipeline_recycle(p, &s);
            else
                dh_sample_clear(&s);
        }
    fprintf(stderr, "decoders opened %lld, reused %lld\n",
            (long long)dh__pipeline_decoders(p)->opened,
            (long long)dh__pipeline_decoders(p)->reused);
    dh_pipeline_destroy(&p);
    dh_manifest_destroy(&m);
    return rc ? 4 : 0;
}
