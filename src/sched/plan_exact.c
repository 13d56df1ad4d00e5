/* plan_exact.c: the tier-1 planner's `exact` algorithm: a branch and bound over the placed
 * items, seeded with the `swap` plan as its incumbent, under a node limit (plan_internal.h,
 * docs/planner.md). Deterministic and pure, like the rest of the planner (plan.c).
 */
#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "core/internal.h"
#include "plan_internal.h"

#define EXACT_NODE_LIMIT_DEFAULT 2000000ull
/* The exact solver recurses once per item; beyond this many items it would only exhaust its
 * node limit anyway, and the recursion depth stays small enough for any thread's stack. */
#define EXACT_MAX_ITEMS 4096u

/* The search builds one rank at a time ("bin completion"): a new rank always takes the
 * largest unplaced item, then a combination of further items in descending order, until it
 * holds `batch` items (fixed batch) or is closed (token budget). Because every rank opens
 * with the largest item left, ranks are never interchangeable, which breaks all the
 * symmetry between ranks of identical state (load, count) that an item-by-item search has
 * to break by hand; within one slot, items of equal value are tried once (the rest give the
 * same remaining multiset). Pruning: a rank must stay below the incumbent (the `swap` plan,
 * then each better plan found), including the smallest items it still has to take; and
 * each time a rank opens, the ranks left are empty, so the full cardinality-aware lower
 * bound (fixed_bound) of the items left must be below the incumbent too. */
typedef struct bb {
    uint32_t ranks;
    size_t n;            /* items in the search (the placed items, sorted) */
    const double *y;     /* their loads, descending */
    uint32_t batch;      /* items per rank, or 0: no cardinality (token budget) */
    uint8_t *used;       /* n */
    uint32_t *assign;    /* rank of y[k] in the partial plan */
    uint32_t *best;      /* incumbent plan */
    double *rank_load;   /* loads of the ranks built so far */
    double *rest;        /* n + 1: loads of the unplaced items, for the bound */
    double *rest_suffix; /* n + 1 */
    double ub;           /* incumbent's max load */
    double cut;          /* a new plan must stay below this: ub x (1 - REL_EPS) */
    double lb;           /* root lower bound: an incumbent at it is optimal */
    uint64_t nodes, node_limit;
    int aborted, proven;
} bb_t;

/* Lower bound on the max load of any plan of the n = R x B items y[] (descending; suffix[k]
 * = y[k] + ... + y[n-1]) over R empty ranks of exactly B items each. Beyond
 * max(mean, largest):
 *  - the largest item plus the B - 1 smallest;
 *  - pigeonhole: among the R q + 1 largest items some rank holds q + 1, so it weighs at least
 *    the q + 1 smallest of them plus the B - q - 1 smallest items (q = 1 .. B-1);
 *  - partner: for the j largest items, either two share a rank (y[j-2] + y[j-1]), or they sit
 *    on j ranks whose j (B-1) other items include one at least the j (B-1)-th smallest,
 *    next to a top item >= y[j-1]; plus the B - 2 smallest items. For B = 2 this is exactly
 *    the optimum, max_j (y[j] + y[n-1-j]).
 * (Any k distinct items weigh at least the k smallest, which makes each term valid.)
 * Without cardinality (B = 0): max(mean, largest). O(R + B). */
static double fixed_bound(const double *y, const double *suffix, size_t n, uint32_t R, uint32_t B)
{
    double lb = n ? fmax(suffix[0] / R, y[0]) : 0;
    if (B < 2 || n == 0)
        return lb;
    lb = fmax(lb, y[0] + suffix[n - (B - 1)]);
    for (uint32_t q = 1; q < B; q++) {
        size_t top = (size_t)R * q + 1;
        lb = fmax(lb, suffix[top - q - 1] - suffix[top] + suffix[n - (B - q - 1)]);
    }
    for (uint32_t j = 2; j <= R; j++) {
        double share = y[j - 2] + y[j - 1];
        double apart = y[j - 1] + y[n - (size_t)j * (B - 1)];
        lb = fmax(lb, fmin(share, apart) + suffix[n - (B - 2)]);
    }
    /* Doubling up: with the T > R largest items, the set S of ranks that hold two or more of
     * them holds at least T - (R - |S|) of them (the others hold one at most), so S weighs at
     * least that many of the smallest top items plus the smallest items for its other slots,
     * and its heaviest rank at least S's mean. |S| = s is unknown: take the least over s. */
    for (size_t T = (size_t)R + 1; T <= n; T++) {
        double least = INFINITY;
        for (size_t s = 1; 2 * s <= T && s <= R; s++) {
            size_t tops = T - (R - s); /* top items in S, at least (and two per rank) */
            if (tops < 2 * s)
                tops = 2 * s;
            if (tops > s * B)
                continue; /* S cannot hold them: this s is impossible */
            size_t others = s * B - tops;
            double total = suffix[T - tops] - suffix[T] + suffix[n - others];
            least = fmin(least, total / (double)s);
        }
        if (least < INFINITY)
            lb = fmax(lb, least);
    }
    return lb;
}

static void bb_open(bb_t *b, uint32_t rank);

static int bb_count_node(bb_t *b)
{
    if (++b->nodes > b->node_limit) {
        b->aborted = 1;
        return 0;
    }
    return 1;
}

static void bb_solution(bb_t *b, uint32_t ranks_built)
{
    double top = 0;
    for (uint32_t r = 0; r < ranks_built; r++)
        top = fmax(top, b->rank_load[r]);
    if (top < b->cut) {
        b->ub = top;
        b->cut = top * (1 - REL_EPS);
        memcpy(b->best, b->assign, b->n * sizeof *b->best);
        if (b->ub <= b->lb * (1 + REL_EPS))
            b->proven = 1; /* at the lower bound: nothing can beat it */
    }
}

/* Dominance (as in Korf's bin completion): a finished rank is dominated, and need not be
 * searched, if one of its items (not the opener, the largest left) can be exchanged for a
 * larger unplaced item, or (without cardinality) an unplaced item can be added, and the rank
 * stays below the incumbent. Any plan completing the dominated rank maps to one completing
 * the dominating rank: the exchanged item goes back where the larger one was, which only
 * lightens that rank. Only the next larger unplaced value needs checking. O(n^2) worst. */
static int bb_dominated(const bb_t *b, uint32_t rank, size_t opener, double load)
{
    for (size_t i = opener + 1; i < b->n; i++) {
        if (!b->used[i] || b->assign[i] != rank)
            continue;
        for (size_t j = i; j-- > 0;) {
            if (b->used[j] || !(b->y[j] > b->y[i]))
                continue;
            if (load - b->y[i] + b->y[j] < b->cut)
                return 1;
            break;
        }
    }
    if (!b->batch)
        for (size_t k = b->n; k-- > 0;)
            if (!b->used[k])
                return load + b->y[k] < b->cut; /* the smallest unplaced item fits */
    return 0;
}

/* Adds items from index `start` on to rank `rank` (opened by item `opener`), which holds
 * `count` items of total `load`. */
static void bb_fill(bb_t *b, uint32_t rank, size_t opener, size_t start, double load,
                    uint32_t count)
{
    if (b->batch && count == b->batch) {
        if (bb_dominated(b, rank, opener, load))
            return;
        b->rank_load[rank] = load;
        bb_open(b, rank + 1);
        return;
    }
    /* With cardinality the rank still needs `after` items past the next one; the cheapest
     * are the last `after` unplaced items, which must lie beyond the candidate. O(n). */
    uint32_t after = b->batch ? b->batch - count - 1 : 0;
    double tail = 0;
    size_t tail_first = b->n;
    for (size_t k = b->n, got = 0; k > start && got < after; k--)
        if (!b->used[k - 1]) {
            tail += b->y[k - 1];
            tail_first = k - 1;
            got++;
        }
    double last_tried = -1;
    for (size_t i = start; i < b->n; i++) {
        if (b->used[i] || b->y[i] == last_tried)
            continue;
        if (after && i >= tail_first)
            break; /* not enough items left behind i to complete the rank */
        if (load + b->y[i] + tail >= b->cut)
            continue; /* a smaller item further on may still fit */
        last_tried = b->y[i];
        if (!bb_count_node(b))
            return;
        b->used[i] = 1;
        b->assign[i] = rank;
        bb_fill(b, rank, opener, i + 1, load + b->y[i], count + 1);
        b->used[i] = 0;
        if (b->aborted || b->proven)
            return;
    }
    if (!b->batch && !bb_dominated(b, rank, opener, load)) { /* the rank may stop here */
        b->rank_load[rank] = load;
        bb_open(b, rank + 1);
    }
}

static void bb_open(bb_t *b, uint32_t rank)
{
    size_t m = 0, first = b->n;
    for (size_t k = 0; k < b->n; k++)
        if (!b->used[k]) {
            if (first == b->n)
                first = k;
            b->rest[m++] = b->y[k];
        }
    if (m == 0) { /* every item placed; ranks not built stay empty */
        for (uint32_t r = rank; r < b->ranks; r++)
            b->rank_load[r] = 0;
        bb_solution(b, b->ranks);
        return;
    }
    if (rank == b->ranks)
        return; /* items left over and no rank to take them */
    b->rest_suffix[m] = 0;
    for (size_t k = m; k > 0; k--)
        b->rest_suffix[k - 1] = b->rest_suffix[k] + b->rest[k - 1];
    if (rank == b->ranks - 1) { /* the last rank takes everything left */
        if (b->rest_suffix[0] >= b->cut || !bb_count_node(b))
            return;
        for (size_t k = 0; k < b->n; k++)
            if (!b->used[k])
                b->assign[k] = rank;
        b->rank_load[rank] = b->rest_suffix[0];
        bb_solution(b, b->ranks);
        return;
    }
    if (fixed_bound(b->rest, b->rest_suffix, m, b->ranks - rank, b->batch) >= b->cut)
        return;
    if (!bb_count_node(b))
        return;
    b->used[first] = 1;
    b->assign[first] = rank;
    bb_fill(b, rank, first, first + 1, b->y[first], 1);
    b->used[first] = 0;
}

/* Searches for a plan of the placed items strictly better than the incumbent in rank_of
 * (the swap plan) and writes it into rank_of. Returns 0, DH_ETOOBIG or DH_ENOMEM. */
int dh__plan_exact_improve(const dh__plan_ctx_t *c, const dh_plan_config_t *cfg, int32_t *rank_of,
                           const double *rank_load, uint32_t *order, dh__plan_sort_item_t *scratch)
{
    uint32_t R = c->ranks;
    size_t m = 0;
    for (size_t i = 0; i < c->n; i++)
        if (rank_of[i] >= 0)
            order[m++] = (uint32_t)i;
    dh__plan_sort_desc(c->load, order, m, scratch, order);
    bb_t b = {.ranks = R, .n = m, .batch = c->cap ? c->cap[0] : 0};
    b.node_limit = cfg->exact_node_limit ? cfg->exact_node_limit : EXACT_NODE_LIMIT_DEFAULT;
    double *y = dh_calloc(m + 1, sizeof *y);
    b.used = dh_calloc(m + 1, sizeof *b.used);
    b.assign = dh_calloc(m + 1, sizeof *b.assign);
    b.best = dh_calloc(m + 1, sizeof *b.best);
    b.rank_load = dh_calloc(R, sizeof *b.rank_load);
    b.rest = dh_calloc(m + 1, sizeof *b.rest);
    b.rest_suffix = dh_calloc(m + 1, sizeof *b.rest_suffix);
    int rc = DH_ENOMEM;
    if (!y || !b.used || !b.assign || !b.best || !b.rank_load || !b.rest || !b.rest_suffix)
        goto out;
    b.y = y;
    for (size_t k = 0; k < m; k++)
        y[k] = c->load[order[k]];
    b.rest_suffix[m] = 0;
    for (size_t k = m; k > 0; k--)
        b.rest_suffix[k - 1] = b.rest_suffix[k] + y[k - 1];
    b.ub = rank_load[dh__plan_argmax(rank_load, R)];
    b.cut = b.ub * (1 - REL_EPS);
    b.lb = fixed_bound(y, b.rest_suffix, m, R, b.batch);
    rc = 0;
    if (b.ub <= b.lb * (1 + REL_EPS))
        goto out; /* the incumbent is at the lower bound */
    if (m > EXACT_MAX_ITEMS) {
        rc = dh__set_error(DH_ETOOBIG, "exact planner: %zu items (at most %u)", m, EXACT_MAX_ITEMS);
        goto out;
    }
    for (size_t k = 0; k < m; k++)
        b.best[k] = (uint32_t)rank_of[order[k]];
    bb_open(&b, 0);
    for (size_t k = 0; k < m; k++) /* the best plan found, proven or not */
        rank_of[order[k]] = (int32_t)b.best[k];
    if (b.aborted)
        rc = dh__set_error(DH_ETOOBIG,
                           "exact planner: gave up after %llu nodes (%zu items, %u ranks)",
                           (unsigned long long)b.node_limit, m, R);
out:
    dh_free(y);
    dh_free(b.used);
    dh_free(b.assign);
    dh_free(b.best);
    dh_free(b.rank_load);
    dh_free(b.rest);
    dh_free(b.rest_suffix);
    return rc;
}
