/* place_bench.h: the placement micro-benchmark behind `datahelix place-bench`.
 *
 * It builds a realistic cluster snapshot (documented in docs/scheduler.md), then makes
 * decisions with the deadline policy the way the coordinator does: each decision updates
 * the coordinator's book (the chosen server's queue grows) and completions drain queues,
 * so the snapshot keeps changing. Each decision is timed on its own.
 */
#ifndef DH_BENCH_PLACE_BENCH_H
#define DH_BENCH_PLACE_BENCH_H

#include <stdint.h>

#include "datahelix/place.h"

typedef struct dh_place_bench_result {
    uint32_t servers;
    uint64_t decisions;
    double decisions_per_s;        /* decisions / CPU time of the thread running the decision loop
                                    * (timers and bookkeeping included; time other processes take
                                    * from the core excluded) */
    double p50_us, p99_us, max_us; /* wall clock per decision */
    uint64_t by_reason[DH_REASON_NO_CANDIDATE + 1]; /* how often each rule decided */
} dh_place_bench_result_t;

/* Runs `decisions` decisions of `policy` over a snapshot of `servers` servers (>= 2) drawn
 * from `seed`. Returns 0 or DH_ENOMEM / DH_EINVAL. */
int dh_place_bench_run(uint32_t servers, uint64_t decisions, uint64_t seed, dh_policy_t policy,
                       dh_place_bench_result_t *out);

#endif
