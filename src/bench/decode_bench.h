/* decode_bench.h: the harness behind `datahelix decode-bench`: per-core throughput of
 * producing each clip's sampled frames at the target size, by DataHelix's pipeline, by the
 * ffmpeg CLI (one process over all clips, one thread, bilinear scale) and by PyAV
 * (bench/decode/pyav_decode.py), plain and with the same non-reference-frame skipping, and
 * by the other Python decoders a user would pick (decord, SPDL, torchcodec:
 * bench/decode/peer_decode.py), on the same clips, frames and sizes, in one run; plus a
 * pixel check that they produce the same frames. */
#ifndef DH_BENCH_DECODE_BENCH_H
#define DH_BENCH_DECODE_BENCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct dh_decode_bench_config {
    const char *mix;         /* NAME[@ENCODING]: built-in mix name or mix file, and the synth
                              * encoding (flat-b, the default; x264-default; no-b) */
    size_t clips;            /* clips in the data set */
    unsigned runs;           /* rounds; medians are reported */
    uint64_t seed;           /* data set seed */
    const char *work_dir;    /* data sets are made (once) under it */
    const char *pyav_script; /* path of pyav_decode.py; NULL or missing = no PyAV column */
    const char *python;      /* interpreter (default "python3") */
    const char *peer_script; /* path of peer_decode.py; NULL or missing = every peer column
                              * says so */
    int verbose;             /* progress on stderr */
} dh_decode_bench_config_t;

/* How the ffmpeg column is timed (ffmpeg_method in the report). */
#define DH_DECODE_BENCH_FFMPEG_METHOD "one-process"
#define DH_DECODE_BENCH_FFMPEG_BATCH 64 /* clips per ffmpeg process at most */
#define DH_DECODE_BENCH_CHECK_CLIPS 4   /* clips in the pixel check */

/* The peer columns: decord, SPDL, torchcodec (peer_decode.py --peer NAME), in this order. */
#define DH_DECODE_BENCH_PEERS 3

/* One peer column: a number or a reason, never both, never neither. */
typedef struct dh_decode_bench_peer {
    char name[16];      /* "decord", "spdl", "torchcodec" */
    double clips_per_s; /* median over the runs; 0 when reason is set */
    double mad_vs_pyav; /* mean |peer - PyAV| over the pixel check's frames, of 255; -1 when
                         * not measured (no PyAV, or reason is set) */
    char reason[256];   /* why the peer has no number (not installed, import error, failed);
                         * empty when it has one */
} dh_decode_bench_peer_t;

typedef struct dh_decode_bench_result {
    char mix[64];
    char encoding[16];               /* the synth encoding of the data set */
    size_t clips, frames;            /* per round */
    double datahelix_clips_per_s;    /* medians over the runs */
    double ffmpeg_clips_per_s;       /* 0 when ffmpeg failed or is missing */
    double pyav_clips_per_s;         /* 0 when PyAV is not available */
    double pyav_skip_clips_per_s;    /* PyAV with skip_frame=NONREF on unsampled packets; 0 when
                                      * PyAV is not available */
    char ffmpeg_method[48];          /* "one-process" (several -i inputs, one process per
                                      * DH_DECODE_BENCH_FFMPEG_BATCH clips) */
    size_t check_clips;              /* clips compared pixel by pixel (the first ones) */
    double pixel_mad_vs_pyav;        /* mean |DataHelix - PyAV| over those frames, of 255; -1
                                      * when PyAV is not available */
    double pixel_mad_ffmpeg_vs_pyav; /* the same for the ffmpeg CLI's frames; -1 when either
                                      * is not available */
    char pyav_error[256];            /* why the PyAV columns are empty */
    dh_decode_bench_peer_t peers[DH_DECODE_BENCH_PEERS];
} dh_decode_bench_result_t;

/* Makes the data set if needed, plans every clip with the default pipeline spec (uniform
 * sampling, short-side+center-crop to the clip's size from the manifest, uint8 THWC), runs
 * the pixel check once (untimed), then the four columns and the peers `runs` times each,
 * interleaved.
 * Pins the process (and so its children) to the CPU it runs on. Returns 0 or an error
 * naming what failed (DH_EINVAL for an unknown encoding). */
int dh_decode_bench_run(const dh_decode_bench_config_t *cfg, dh_decode_bench_result_t *out);

#endif
