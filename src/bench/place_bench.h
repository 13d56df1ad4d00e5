/* place_bench.h: the placement micro-benchmark behind `datahelix place-bench`.
 *
 * It builds a realistic cluster snapshot (documented in docs/scheduler.md), then makes
 * decisions with the deadline policy the way the coordinator does: each decision updates
 * the coordinator's book (the chosen server's queue grows) and completions drain queues,
 * so the snapshot keeps changing. Each decision is timed on its own. It measures either the
 * exhaustive rule (dh_place, which also fills every candidate's T, as the coordinator's
 * telemetry wants) or the index (dh_place_index_decide, kept current by
 * dh_place_index_update after each change); on the same seed both make the same decisions.
 */
#ifndef DH_BENCH_PLACE_BENCH_H
#define DH_BENCH_PLACE_BENCH_H

#include <stdint.h>

#include "datahelix/place.h"

typedef enum {
    DH_PLACE_BENCH_EXHAUSTIVE = 0, /* dh_place: every server scored per decision */
    DH_PLACE_BENCH_INDEXED = 1,    /* dh_place_index_decide, updated as queues change */
} dh_place_bench_path_t;

typedef struct dh_place_bench_result {
    uint32_t servers;
    uint64_t decisions;
    double decisions_per_s;        /* decisions / CPU time of the thread running the decision loop
                                    * (timers and bookkeeping included; time other processes take
                                    * from the core excluded) */
    double p50_us, p99_us, max_us; /* wall clock per decision */
    uint64_t by_reason[DH_REASON_NO_CANDIDATE + 1]; /* how often each rule decided */
    uint64_t decisions_hash; /* FNV-1a of every decision's (server, reason, T bits): equal on
                              * both paths when they decide the same */
    double build_ms;         /* wall time to build the index (indexed path; else 0) */
} dh_place_bench_result_t;

/* Runs `decisions` decisions of `policy` over a snapshot of `servers` servers (>= 2) drawn
 * from `seed`, on `path`. Returns 0 or DH_ENOMEM / DH_EINVAL. */
int dh_place_bench_run(uint32_t servers, uint64_t decisions, uint64_t seed, dh_policy_t policy,
                       dh_place_bench_path_t path, dh_place_bench_result_t *out);

#endif
