/* sim/sim_state.h: the simulator's state, shared by its files (internal to src/sim): the
 * modelled cluster (samples, requests, servers, batches, ranks, tier-2 rounds, links) in
 * one sim_t, the event kinds, and the event handlers each file implements: sim_flow.c (a
 * request from the sender to its delivery: links, placement, tier 2, joins), sim_ranks.c
 * (the ranks: copy stage, next(), compute, barrier, the speed anchor), sim.c (one system's
 * run and dh_sim_run). One thread.
 */
#ifndef DH_SIM_SIM_STATE_H
#define DH_SIM_SIM_STATE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/rebalance.h"
#include "datahelix/rng.h"
#include "datahelix/sampler.h"
#include "datahelix/stats.h"
#include "sim/event.h"
#include "sim/sim.h"
#include "bench/train_prefetch.h"

enum {
    EV_TASK_DONE = 1,
    EV_FORWARDED,
    EV_BATCH_READY,
    EV_COMPUTE_DONE,
    EV_ANCHOR,
    EV_CLIENT_START, /* a rank's client is created: its sender starts prefetching */
    EV_LOOP_START,   /* the training loop starts: every rank calls next() for step 0 */
    EV_COPY_DONE,    /* pool's copy stage has copied a batch */
};

#define ANCHOR_S 0.02 /* the coordinator's speed anchor period (coordinator.c's tick) */

/* ---- the model's state ---- */

typedef struct sample {
    const dh_profile_row_t *row;
    double act_cpu_s; /* actual, time-scaled */
    double act_tokens;
    double out_bytes; /* emulated (the size the stand-in payload stands for) */
    double in_bytes;
} sample_t;

typedef struct request {
    uint32_t rank, part, n;
    uint64_t batch;
    uint32_t *rows;
    double pred_cpu_s, pred_c_cpu_s, profile_cpu_s, act_cpu_s, bytes;
    double sent_s, deadline_s;
    int32_t server;
    uint32_t next; /* FIFO link (UINT32_MAX = none) */
} request_t;

typedef struct server {
    uint32_t node, workers, busy;
    double true_speed;
    uint32_t q_head, q_tail, q_len;
    double queued_cpu_s, speed; /* the coordinator's book and learned speed */
} server_t;

typedef struct batch {
    uint64_t b; /* UINT64_MAX = slot unused */
    uint32_t parts, parts_ready, samples;
    double sent_s, delivered_s, final_s, ready_s;
    double tokens, bytes, cpu_s;
    double received_s; /* the last part's delivery */
    bool ready;
    bool copied; /* pool: its copy stage is done with it */
} batch_t;

typedef struct rank {
    uint32_t node;
    int32_t local;
    uint64_t planned, consumed;
    uint32_t horizon;
    double s_per_token, mean_window_s, last_return_s, entry_s;
    bool waiting;
    double fetcher_free_s;
    uint64_t taken;                   /* pool: batches its copy stage took from the client */
    bool copying;                     /* pool: the copy stage is busy */
    int64_t *tokens_of;               /* ring (depth + 2): planned batches' estimated tokens */
    batch_t *ring;                    /* ring (depth + 2) */
    double compute_s, wait_s, done_s; /* this step's; done_s: at the barrier */
} rank_t;

typedef struct step_plan {
    uint64_t step; /* UINT64_MAX = unused */
    uint32_t n;
    uint32_t *rows, *owner; /* owner: the rank, after tier 2 */
    uint32_t *off;          /* ranks + 1: CSR over rows sorted by rank (tier 1's share) */
    uint32_t *by_rank;
} step_plan_t;

/* A tier-2 round: rb_steps consecutive steps (client_rebalance.c). */
typedef struct round {
    uint64_t r; /* UINT64_MAX = unused */
    uint32_t done;
    uint8_t *rank_done; /* ranks: offered */
    double lead_min, spt_sum;
    uint32_t spt_n;
    bool decided;
} round_t;

typedef struct link_slot {
    uint64_t key; /* (server + 1) << 32 | node; 0 = empty */
    double busy_s;
} link_slot_t;

typedef struct sim {
    const dh_sim_options_t *o;
    const dh_bench_options_t *opt;
    const dh_bench_system_t *sp;
    dh_bench_system_result_t *res;
    const dh_profile_set_t *set;
    const sample_t *samples;
    dh_sampler_t *sampler;
    dh_share_config_t share;
    double a, b, threshold, ts, link_Bps, copy_s_per_B;
    uint32_t ranks, fanout, prefetch, prefetch_max, depth, ahead; /* ahead: pool's stage */
    uint64_t total, requested_total;
    bool slots, tier2;
    /* cluster */
    server_t *servers;
    dh_server_state_t *snap;
    uint32_t n_servers, n_nodes;
    int32_t *node_server; /* node -> its server or -1 */
    dh_link_t links[4];
    dh_cost_model_t *model;
    dh_place_index_t *index; /* o->place_index: dh_place_index_* instead of dh_place */
    uint32_t *idx_node;
    dh_link_t *idx_links;
    dh_place_config_t place;
    link_slot_t *link_tab;
    size_t link_cap, link_n;
    /* requests */
    request_t *req;
    uint32_t n_req, cap_req, free_req;
    uint32_t book_head, book_tail; /* unplaced, arrival order */
    /* ranks and steps */
    rank_t *rk;
    step_plan_t *steps;
    uint32_t n_steps_ring;
    uint32_t *scratch_rows, *scratch_rank, *fan_part;
    double *fan_load;
    uint32_t rb_steps, rb_empty, n_rounds_ring, rb_group, n_groups;
    round_t *rounds;
    dh_rebalance_item_t *rb_items;
    uint32_t *rb_new, *rb_index;
    size_t rb_cap;
    uint64_t cur_step;
    uint32_t arrived;
    double step_start_s, t_begin, t_end;
    dh_sim_events_t ev;
    double now;
    /* metrics */
    dh_stats_t *waits, *readies, *err_measured, *err_profile, *err_part[2];
    double samples_n, misses, barrier_sum, mean_sum, max_sum, cpu, bound_sum;
    double step_max, step_sum, miss_part[2], count_part[2];
    double *step_tokens;
    size_t step_tokens_n, step_tokens_cap;
    uint64_t decisions, completions, err_stride;
    double sched_s;
    int rc;
} sim_t;

static inline uint32_t dh__sim_mod_ring(uint64_t b, uint32_t n)
{
    return (uint32_t)(b % n);
}

/* ---- the handlers (each file's own; the events of sim.c call them) ---- */

void dh__sim_snap_sync(sim_t *s, uint32_t i);
void dh__sim_sender(sim_t *s, uint32_t r);
void dh__sim_part_delivered(sim_t *s, uint32_t id);
void dh__sim_task_done(sim_t *s, uint32_t si, uint32_t id);
void dh__sim_step_begin(sim_t *s);
void dh__sim_compute_done(sim_t *s, uint32_t r);
void dh__sim_batch_ready(sim_t *s, uint32_t r, uint64_t b);
void dh__sim_copy_done(sim_t *s, uint32_t r, uint64_t b);
void dh__sim_anchor(sim_t *s);

#endif
