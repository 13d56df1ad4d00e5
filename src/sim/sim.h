/* sim/sim.h: `datahelix simulate`, a discrete-event simulator of the training loop of
 * `datahelix bench --emulate` (docs/simulator.md).
 *
 * It runs the same scheduling code as the runtime, linked: the tier-1 planner
 * (dh_plan_step_share), the placement (dh_place, or a switchable placement function), the
 * online cost model and the coordinator's speed rule (dh_cost_model_*, dh_cost_speed_*),
 * the deadline and adaptive prefetch rules (dh_deadline_*) and the tier-2 policy
 * (dh_rebalance_plan), over a modelled cluster in virtual seconds: R ranks computing
 * a x tokens + b and meeting at a barrier each step, DataServers whose workers run each
 * request's actual cost (the synthetic pipeline's misprediction, model/model_lib.h), links as
 * serial resources with a bandwidth and a latency. The workload, the options, the systems
 * and the compute model are the experiment core's (bench/experiment.h), the metrics and the
 * JSON report `bench`'s (train_bench.h). No runtime header.
 * One thread; no I/O except the caller's progress callback.
 */
#ifndef DH_SIM_SIM_H
#define DH_SIM_SIM_H

#include <stdint.h>

#include "bench/train_bench.h"
#include "datahelix/place.h"

/* The placement function: dh_place's contract (same decisions). The simulator calls it
 * with out->candidates NULL. An indexed placement (O(log N) a decision) plugs in here. */
typedef int dh_sim_place_fn(void *ctx, const dh_place_config_t *cfg, const dh_snapshot_t *snap,
                            const dh_request_cost_t *req, dh_decision_t *out);

typedef struct dh_sim_options {
    dh_bench_options_t bench;  /* workload, layout, systems, seed: as `bench --emulate`
                                * (ranks and servers may exceed bench's limits) */
    double link_latency_s;     /* one-way latency of every link (0: the emulation's) */
    double server_speed_sigma; /* each server's true speed: a mean-one lognormal of this
                                * sigma, drawn from (seed, server); 0 = all at speed 1 */
    dh_plan_algo_t plan_algo;  /* tier 1's algorithm (DH_PLAN_ALGO_DEFAULT, the client's) */
    int rank_steps;            /* 1: keep rank_step_s (ranks x steps doubles) for the JSON */
    uint32_t rebalance_group;  /* tier 2's load-balance groups: this many consecutive ranks
                                * each (0 = one group of all ranks, as bench) */
    int place_index;           /* 1: dh_place_index_* (the same decisions in O(log N)) */
    double client_start_s;     /* the time bench takes to create one client (its
                                * client_start_s): rank r's sender starts prefetching
                                * (ranks - 1 - r) x this before the training loop, as bench
                                * makes its clients one after another (0: all at the loop's
                                * start) */
    dh_sim_place_fn *place;    /* NULL = dh_place */
    void *place_ctx;
} dh_sim_options_t;

void dh_sim_options_default(dh_sim_options_t *opt);

/* Simulates every system of opt->bench.systems. Fills *out as dh_bench_run does (write it
 * with dh_bench_write_json; free it with dh_bench_report_clear). Returns 0, DH_EINVAL
 * (options, named), DH_ENOMEM, or a profile error. */
int dh_sim_run(const dh_sim_options_t *opt, dh_bench_report_t *out);

#endif
