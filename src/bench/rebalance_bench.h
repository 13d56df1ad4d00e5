/* bench/rebalance_bench.h: `datahelix rebalance-bench`, the cost of redistributing decoded
 * samples between ranks (tier 2, issue 14; docs/benchmarks.md "rebalance-bench").
 *
 * (a) on one node: N clips (frames x height x width x 3 uint8) in one shared-memory arena
 *     (shm.h), owned by R ranks that are forked processes attached to it over the inherited
 *     memfd. A coordinator (the calling process) runs rounds over ZeroMQ (tcp://127.0.0.1,
 *     the wire codec's messages): it gathers every rank's handles, decides a seeded move
 *     that keeps per-rank counts, and sends each receiver the handles (and shapes) it takes
 *     over; the receiver takes the sender's reference (dh_shm_arena_ref_for its pid, then
 *     one dh_shm_arena_unref), resolves each clip, checks its stamps and reports the offset
 *     it resolved to. A round is timed from its first message to the last receiver's
 *     report. A moved clip whose resolved offset or generation differs from its allocation
 *     counts as a pixel copy (there should be none: a move is a change of owner).
 * (b) across a loopback "node" boundary: the same clips go from arena A as zero-copy payload
 *     frames (dh_wire_send), one DELIVER per clip, over tcp://127.0.0.1 to a receiver thread
 *     that places each in its own arena B (one copy, as the runtime places forwarded
 *     batches) and acknowledges the round; beside it, in the same run, the same bytes over a
 *     plain loopback TCP socket between the same two threads. Both are timed to the
 *     receiver's acknowledgement; medians over the rounds.
 *
 * Invariants checked every round, failing the run when broken: each clip is held by
 * exactly one rank (gathered once, by the rank the coordinator's book says), per-rank
 * counts stay as they were, every handoff succeeds; after the ranks leave, each clip's
 * reference count is exactly the coordinator's one.
 */
#ifndef DH_BENCH_REBALANCE_BENCH_H
#define DH_BENCH_REBALANCE_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DH_REBALANCE_BENCH_MAX_RANKS 64
#define DH_REBALANCE_BENCH_MAX_CLIPS 4096

typedef struct dh_rebalance_bench_options {
    uint32_t clips;                 /* 1 .. DH_REBALANCE_BENCH_MAX_CLIPS (default 64) */
    uint32_t ranks;                 /* 2 .. DH_REBALANCE_BENCH_MAX_RANKS (default 8) */
    uint32_t frames, height, width; /* clip shape, x 3 channels of uint8 (16 x 224 x 224) */
    uint32_t rounds;                /* timed rounds of each part, after one warm-up (20) */
    double move_fraction;           /* share of the clips moved per round (1) */
    uint64_t seed;                  /* of the moves (1) */
    int skip_cross;                 /* 1: part (a) only */
    uint32_t test_exit_round;       /* tests only: rank 0 exits (status 7) when asked for this
                                     * round's gather; 0 = never */
    void (*progress)(const char *line, void *ctx); /* NULL: silent */
    void *ctx;
} dh_rebalance_bench_options_t;

typedef struct dh_rebalance_bench_report {
    uint32_t clips, ranks, rounds;
    uint64_t clip_bytes;
    double move_fraction;
    uint64_t seed;
    /* (a) */
    double onnode_p50_ms, onnode_p95_ms;
    uint32_t onnode_moved;             /* clips that changed owner, fewest of any timed round */
    uint64_t onnode_handoffs_verified; /* moved clips resolved and checked, all rounds */
    uint64_t onnode_pixel_copies;      /* moved clips not at their original slab (0) */
    uint32_t rank_clips[DH_REBALANCE_BENCH_MAX_RANKS]; /* clips each rank held at the end */
    uint64_t moves_digest;                             /* hash of every round's (clip, new owner) */
    /* (b); 0 when skipped. GB/s = 1e9 bytes per second. */
    double cross_gbps_p50, raw_tcp_gbps_p50, cross_vs_raw;
    double cross_p50_ms, raw_tcp_p50_ms; /* time to move all clips once */
} dh_rebalance_bench_report_t;

/* The defaults above. */
void dh_rebalance_bench_options_default(dh_rebalance_bench_options_t *opt);

/* Checks the options; returns 0 or DH_EINVAL with a message naming the option at fault in
 * its command-line spelling ("--ranks"). */
int dh_rebalance_bench_check(const dh_rebalance_bench_options_t *opt);

/* Runs both parts. Returns 0, DH_EINVAL (bad options, see _check), or the first error with
 * a message naming the part and the rank or clip at fault. Every child process is killed
 * and reaped before it returns, on every path. Not thread-safe against other fork()ing
 * threads of the caller (it forks the ranks). */
int dh_rebalance_bench_run(const dh_rebalance_bench_options_t *opt,
                           dh_rebalance_bench_report_t *out);

/* Writes the report as one JSON object and a newline: clips, clip_bytes, ranks, rounds,
 * move_fraction, seed, onnode_p50_ms, onnode_p95_ms, onnode_moved, onnode_pixel_copies,
 * onnode_handoffs_verified, cross_gbps_p50, raw_tcp_gbps_p50, cross_vs_raw, cross_p50_ms,
 * raw_tcp_p50_ms. Returns 0 or -EIO. */
int dh_rebalance_bench_write_json(FILE *f, const dh_rebalance_bench_report_t *r);

#endif
