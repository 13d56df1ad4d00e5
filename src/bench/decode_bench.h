/* decode_bench.h: the harness behind `datahelix decode-bench`: per-core throughput of
 * producing each clip's sampled frames at the target size, by DataHelix's pipeline, by the
 * ffmpeg CLI (one thread, bilinear scale) and by PyAV (bench/decode/pyav_decode.py), on the
 * same clips, frames and sizes, in one run. */
#ifndef DH_BENCH_DECODE_BENCH_H
#define DH_BENCH_DECODE_BENCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct dh_decode_bench_config {
    const char *mix;         /* built-in mix name or mix file */
    size_t clips;            /* clips in the data set */
    unsigned runs;           /* rounds; medians are reported */
    uint64_t seed;           /* data set seed */
    const char *work_dir;    /* data sets are made (once) under it */
    const char *pyav_script; /* path of pyav_decode.py; NULL or missing = no PyAV column */
    const char *python;      /* interpreter (default "python3") */
    int verbose;             /* progress on stderr */
} dh_decode_bench_config_t;

typedef struct dh_decode_bench_result {
    char mix[64];
    size_t clips, frames;         /* per round */
    double datahelix_clips_per_s; /* medians over the runs */
    double ffmpeg_clips_per_s;    /* 0 when ffmpeg failed or is missing */
    double pyav_clips_per_s;      /* 0 when PyAV is not available */
    char pyav_error[256];         /* why the PyAV column is empty */
} dh_decode_bench_result_t;

/* Makes the data set if needed, plans every clip with the default pipeline spec (uniform
 * sampling, short-side+center-crop to the clip's size from the manifest, uint8 THWC), and
 * runs the three decoders `runs` times each, interleaved. Pins the process (and so its
 * children) to the CPU it runs on. Returns 0 or an error naming what failed. */
int dh_decode_bench_run(const dh_decode_bench_config_t *cfg, dh_decode_bench_result_t *out);

#endif
