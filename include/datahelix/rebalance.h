/* rebalance.h: tier 2's default assignment policy and its cost gate (docs/design.md §5,
 * issue 14). Pure: no I/O, no threads, no clocks.
 *
 * A round holds materialized samples, each owned by a rank of the load-balance group, with
 * what is known once it is decoded: its actual tokens and output bytes. The default policy
 * moves samples between ranks to lower the largest rank's predicted compute over the round
 * (s_per_token x its tokens), keeping each rank's sample count (fixed-batch: pairwise swaps)
 * or not (packing: single moves). The gate then keeps the current assignment unless
 *
 *     gain_s - cost_s > min_gain x max_before_s
 *
 * where gain_s = (largest rank's tokens before - after) x s_per_token, and cost_s is what
 * of the transfer lands on the critical path: transfer_s, the largest bytes any one rank
 * sends plus receives x move_s_per_B (each rank's link carries its own moves; 0 on one
 * node, where a move is a change of a slab's owner, not a copy), less slack_s, the time the
 * moves have before the first of the round's batches is consumed (a move that is over
 * before its batch is needed delays nothing): cost_s = max(0, transfer_s - slack_s). Every
 * member of the group derives the same decision from the same inputs: ties break by the
 * lower item index. The runtime's round (client_rebalance.c), the benchmark and the tests
 * share it.
 */
#ifndef DATAHELIX_REBALANCE_H
#define DATAHELIX_REBALANCE_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One materialized sample of the round. */
typedef struct dh_rebalance_item {
    uint32_t rank; /* the rank that owns it now (< ranks) */
    double tokens; /* actual tokens (>= 0) */
    double bytes;  /* output bytes: what moving it carries (>= 0) */
} dh_rebalance_item_t;

typedef struct dh_rebalance_params {
    uint32_t ranks;      /* ranks of the group (> 0) */
    int keep_counts;     /* 1: fixed-batch, per-rank sample counts kept (swaps); 0: packing */
    double s_per_token;  /* the learned compute seconds per token (> 0) */
    double move_s_per_B; /* transfer seconds per byte moved (0: ownership handoff on-node) */
    double min_gain;     /* the gate's margin, a fraction of the largest rank's compute (0.05) */
    uint32_t max_moves;  /* at most this many moves or swaps (0 = n) */
    double slack_s;      /* seconds before the round's first batch is consumed (0: none,
                          * the whole transfer is on the critical path) */
} dh_rebalance_params_t;

/* The gate's inputs and verdict for one round (the runtime logs them). */
typedef struct dh_rebalance_verdict {
    double max_before_s, max_after_s; /* the largest rank's compute, before and after */
    double gain_s;                    /* max_before_s - max_after_s */
    double transfer_s;                /* the proposed moves' transfer on the busiest link */
    double cost_s;                    /* of it, past the slack: max(0, transfer_s - slack_s) */
    uint32_t moved;                   /* samples whose rank changes (0 when kept) */
    int applied;                      /* 1: new_rank is the proposal; 0: kept */
} dh_rebalance_verdict_t;

/* Fills p with the defaults: keep_counts 1, s_per_token 1, move_s_per_B 0, min_gain 0.05,
 * max_moves 0; ranks 0 (the caller sets it). */
DH_EXTERN void dh_rebalance_params_default(dh_rebalance_params_t *p);

/* The round's decision: writes new_rank[i] for every item (its current rank when the gate
 * keeps the assignment) and *v. Deterministic. Returns 0, or DH_EINVAL (ranks 0, an item's
 * rank out of range, a negative or non-finite tokens/bytes, s_per_token <= 0, a negative
 * move cost, min_gain or slack; new_rank and *v then unchanged) or DH_ENOMEM. n 0 is a kept
 * empty round. Each move or swap lowers the sum of the squared rank loads, so the search
 * ends; it is greedy (the most loaded rank first), not optimal. */
DH_EXTERN int dh_rebalance_plan(const dh_rebalance_item_t *items, size_t n,
                                const dh_rebalance_params_t *p, uint32_t *new_rank,
                                dh_rebalance_verdict_t *v);

#ifdef __cplusplus
}
#endif
#endif
