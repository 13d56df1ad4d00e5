/* plan_internal.h: what the tier-1 planner's files share (plan.c, plan_heuristics.c,
 * plan_exact.c, plan_share.c): one planning call's context, the sort scratch, and the
 * building blocks every algorithm is made of. Private to src/sched/.
 */
#ifndef DH_SCHED_PLAN_INTERNAL_H
#define DH_SCHED_PLAN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/plan.h"

/* Improvements smaller than this fraction of the max load are ignored: with integral token
 * loads sums are exact, but with arbitrary doubles a rounding-level "improvement" could
 * otherwise make the swap loop or the exact search chase ulps. */
#define REL_EPS 1e-12

typedef struct dh__plan_ctx {
    const double *load;
    size_t n;
    uint32_t ranks;
    const uint32_t *cap; /* per-rank item capacity, or NULL: no cardinality (token budget) */
    double budget;       /* per-rank load limit; INFINITY in fixed-batch mode */
} dh__plan_ctx_t;

typedef struct dh__plan_sort_item {
    double group; /* primary key, descending (the group's largest load, or the load) */
    uint32_t key; /* then profile key, ascending */
    double load;  /* then load, descending */
    uint32_t index;
} dh__plan_sort_item_t;

/* Items idx[0..m) into order[] by load descending, ties by index (scratch: m items). */
void dh__plan_sort_desc(const double *load, const uint32_t *idx, size_t m,
                        dh__plan_sort_item_t *scratch, uint32_t *order);
/* The paper's order: grouped by profile key, groups by their largest load descending. */
void dh__plan_sort_grouped(const double *load, const uint32_t *key, const uint32_t *idx, size_t m,
                           dh__plan_sort_item_t *scratch, uint32_t *order);
/* Every rank's load (and item count, if count) from rank_of, in item order. */
void dh__plan_recompute(const dh__plan_ctx_t *c, const int32_t *rank_of, double *rank_load,
                        uint32_t *count);
/* The index of the largest of v[0..m), the lowest on ties. */
uint32_t dh__plan_argmax(const double *v, uint32_t m);
/* How many of rank_of[0..n) are placed (>= 0). */
size_t dh__plan_placed_count(const int32_t *rank_of, size_t n);
/* The least-loaded rank with room for an item of load x, lowest index on ties; -1 if none. */
int32_t dh__plan_least_loaded_with_room(const dh__plan_ctx_t *c, const double *rank_load,
                                        const uint32_t *count, double x);
/* order[0..m) in that order, each to the least-loaded rank with room, else deferred (-1). */
void dh__plan_greedy_place(const dh__plan_ctx_t *c, const uint32_t *order, size_t m,
                           int32_t *rank_of, double *rank_load, uint32_t *count);
/* Karmarkar-Karp over desc[0..m) (load descending) into rank_of; balanced: with cardinality.
 * 0 or DH_ENOMEM. */
int dh__plan_kk_partition(const dh__plan_ctx_t *c, const uint32_t *desc, size_t m, int balanced,
                          int32_t *rank_of);
/* Best swaps (and moves when packing) off the most-loaded rank until none helps. members: n
 * entries, offset: R + 1. */
void dh__plan_improve(const dh__plan_ctx_t *c, int32_t *rank_of, double *rank_load,
                      uint32_t *members, size_t *offset);
/* Token budget: places deferred items of order[0..m) that now fit; returns how many. */
size_t dh__plan_fill_deferred(const dh__plan_ctx_t *c, const uint32_t *order, size_t m,
                              int32_t *rank_of, double *rank_load);
/* Branch and bound for a plan strictly better than rank_of (the swap plan). 0, DH_ETOOBIG or
 * DH_ENOMEM. */
int dh__plan_exact_improve(const dh__plan_ctx_t *c, const dh_plan_config_t *cfg, int32_t *rank_of,
                           const double *rank_load, uint32_t *order, dh__plan_sort_item_t *scratch);

#endif
