/* plan.c: the tier-1 planner of docs/design.md §4.4 (see plan.h and docs/planner.md).
 *
 * One step's window of samples is assigned to ranks so that the largest per-rank load is as
 * small as possible. Four algorithms share a few building blocks:
 *   - greedy_place: items in a given order, each to the least-loaded rank with room;
 *   - kk_partition: balanced largest differencing (Karmarkar-Karp with cardinality);
 *   - improve:      repeated best pairwise swaps (and, when packing, moves) off the max rank;
 *   - bb_search:    branch and bound, seeded with the `swap` plan as incumbent.
 * Everything is deterministic: sorts break ties by item index, rank choices by rank index,
 * and no random numbers are used. Pure: no I/O, clocks or threads; scratch memory comes from
 * dh_malloc and is freed before returning, so every allocation failure is a clean DH_ENOMEM.
 * dh_plan_rank_share applies a planner to a sampler's window: the rows one rank gets.
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

#define EXACT_NODE_LIMIT_DEFAULT 2000000ull
/* The exact solver recurses once per item; beyond this many items it would only exhaust its
 * node limit anyway, and the recursion depth stays small enough for any thread's stack. */
#define EXACT_MAX_ITEMS 4096u
/* Improvements smaller than this fraction of the max load are ignored: with integral token
 * loads sums are exact, but with arbitrary doubles a rounding-level "improvement" could
 * otherwise make the swap loop or the exact search chase ulps. */
#define REL_EPS 1e-12

static const char *const algo_names[DH_PLAN_ALGO_COUNT] = {"greedy", "kk", "swap", "exact"};

int dh_plan_algo_from_name(const char *name, dh_plan_algo_t *out)
{
    for (int a = 0; a < DH_PLAN_ALGO_COUNT; a++)
        if (name && strcmp(name, algo_names[a]) == 0) {
            *out = (dh_plan_algo_t)a;
            return 0;
        }
    return dh__set_error(DH_EUNKNOWN, "unknown planner algorithm '%s' (greedy, kk, swap, exact)",
                         name ? name : "(null)");
}

const char *dh_plan_algo_name(dh_plan_algo_t algo)
{
    return ((unsigned)algo < DH_PLAN_ALGO_COUNT) ? algo_names[algo] : "?";
}

double dh_plan_lower_bound(const double *load, size_t n, uint32_t ranks)
{
    assert(ranks > 0);
    double total = 0, largest = 0;
    for (size_t i = 0; i < n; i++) {
        total += load[i];
        if (load[i] > largest)
            largest = load[i];
    }
    double mean = total / ranks;
    return mean > largest ? mean : largest;
}

/* ---------------------------------------------------------------------------------------- */
/* Shared context and helpers                                                               */

typedef struct ctx {
    const double *load;
    size_t n;
    uint32_t ranks;
    const uint32_t *cap; /* per-rank item capacity, or NULL: no cardinality (token budget) */
    double budget;       /* per-rank load limit; INFINITY in fixed-batch mode */
} ctx_t;

typedef struct sort_item {
    double group; /* primary key, descending (the group's largest load, or the load) */
    uint32_t key; /* then profile key, ascending */
    double load;  /* then load, descending */
    uint32_t index;
} sort_item_t;

static int cmp_group_order(const void *pa, const void *pb)
{
    const sort_item_t *a = pa, *b = pb;
    if (a->group != b->group)
        return a->group > b->group ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    if (a->load != b->load)
        return a->load > b->load ? -1 : 1;
    return a->index < b->index ? -1 : (a->index > b->index);
}

static int cmp_key_then_load(const void *pa, const void *pb)
{
    const sort_item_t *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    if (a->load != b->load)
        return a->load > b->load ? -1 : 1;
    return a->index < b->index ? -1 : (a->index > b->index);
}

/* Writes into order[] the items idx[0..m) sorted by load descending, ties by index.
 * `scratch` holds m sort_item_t. O(m log m). */
static void sort_desc(const double *load, const uint32_t *idx, size_t m, sort_item_t *scratch,
                      uint32_t *order)
{
    for (size_t i = 0; i < m; i++)
        scratch[i] = (sort_item_t){load[idx[i]], 0, load[idx[i]], idx[i]};
    qsort(scratch, m, sizeof *scratch, cmp_group_order);
    for (size_t i = 0; i < m; i++)
        order[i] = scratch[i].index;
}

/* The paper's order: samples grouped by profile key, groups by their largest load descending
 * (ties by key). The paper's cost is per profile key, so within a group the samples keep
 * their window order: load differences inside a key (caption length, say) are invisible to
 * it, which is part of the slack the other algorithms recover. Without keys every sample is
 * its own group, which is plain largest-first (LPT). O(m log m). */
static void sort_grouped(const double *load, const uint32_t *key, const uint32_t *idx, size_t m,
                         sort_item_t *scratch, uint32_t *order)
{
    if (!key) {
        sort_desc(load, idx, m, scratch, order);
        return;
    }
    for (size_t i = 0; i < m; i++)
        scratch[i] = (sort_item_t){0, key[idx[i]], load[idx[i]], idx[i]};
    qsort(scratch, m, sizeof *scratch, cmp_key_then_load);
    for (size_t i = 0; i < m;) { /* runs of one key: the first holds the group's largest load */
        size_t j = i;
        while (j < m && scratch[j].key == scratch[i].key)
            scratch[j++].group = scratch[i].load;
        i = j;
    }
    for (size_t i = 0; i < m; i++)
        scratch[i].load = 0; /* within a group: window order */
    qsort(scratch, m, sizeof *scratch, cmp_group_order);
    for (size_t i = 0; i < m; i++)
        order[i] = scratch[i].index;
}

/* Recomputes every rank's load and item count from rank_of, in item order (so the sums are
 * the same bit for bit whatever moves led to the plan). O(n + R). */
static void recompute(const ctx_t *c, const int32_t *rank_of, double *rank_load, uint32_t *count)
{
    for (uint32_t r = 0; r < c->ranks; r++) {
        rank_load[r] = 0;
        if (count)
            count[r] = 0;
    }
    for (size_t i = 0; i < c->n; i++)
        if (rank_of[i] >= 0) {
            rank_load[rank_of[i]] += c->load[i];
            if (count)
                count[rank_of[i]]++;
        }
}

static uint32_t argmax(const double *v, uint32_t m)
{
    uint32_t best = 0;
    for (uint32_t r = 1; r < m; r++)
        if (v[r] > v[best])
            best = r;
    return best;
}

static size_t placed_count(const int32_t *rank_of, size_t n)
{
    size_t placed = 0;
    for (size_t i = 0; i < n; i++)
        placed += rank_of[i] >= 0;
    return placed;
}

/* Least-loaded rank that can take an item of load x (item room and budget), ties to the
 * lowest index; -1 if none. O(R). */
static int32_t least_loaded_with_room(const ctx_t *c, const double *rank_load,
                                      const uint32_t *count, double x)
{
    int32_t best = -1;
    for (uint32_t r = 0; r < c->ranks; r++) {
        if (c->cap && count[r] >= c->cap[r])
            continue;
        if (rank_load[r] + x > c->budget)
            continue;
        if (best < 0 || rank_load[r] < rank_load[best])
            best = (int32_t)r;
    }
    return best;
}

/* Places the items of order[0..m) in that order, each on the least-loaded rank with room;
 * an item that fits nowhere is deferred (-1; only possible in token-budget mode, since in
 * fixed-batch mode the capacities add up to n). rank_load/count hold the starting state and
 * are updated. O(m R). */
static void greedy_place(const ctx_t *c, const uint32_t *order, size_t m, int32_t *rank_of,
                         double *rank_load, uint32_t *count)
{
    for (size_t k = 0; k < m; k++) {
        uint32_t i = order[k];
        int32_t r = least_loaded_with_room(c, rank_load, count, c->load[i]);
        rank_of[i] = r;
        if (r >= 0) {
            rank_load[r] += c->load[i];
            count[r]++;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Balanced largest differencing (Karmarkar-Karp with cardinality)                          */

/* A partial solution ("tuple") is R subsets, kept sorted by sum descending; its spread is
 * largest minus smallest sum. Subsets are linked lists of items (next[]), so joining two is
 * O(1). */
typedef struct kk {
    uint32_t ranks;
    double *sum;    /* tuples x ranks */
    int32_t *head;  /* tuples x ranks; -1 = empty subset */
    int32_t *tail;  /* tuples x ranks */
    int32_t *next;  /* per item */
    uint32_t *heap; /* tuple ids, max-heap by (spread desc, id asc) */
    size_t heap_len;
} kk_t;

static double kk_spread(const kk_t *k, uint32_t t)
{
    return k->sum[(size_t)t * k->ranks] - k->sum[(size_t)t * k->ranks + k->ranks - 1];
}

/* Heap order: larger spread first, then lower tuple id (deterministic ties). */
static int kk_before(const kk_t *k, uint32_t a, uint32_t b)
{
    double sa = kk_spread(k, a), sb = kk_spread(k, b);
    if (sa != sb)
        return sa > sb;
    return a < b;
}

static void kk_push(kk_t *k, uint32_t t)
{
    size_t i = k->heap_len++;
    k->heap[i] = t;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!kk_before(k, k->heap[i], k->heap[parent]))
            break;
        uint32_t tmp = k->heap[i];
        k->heap[i] = k->heap[parent];
        k->heap[parent] = tmp;
        i = parent;
    }
}

static uint32_t kk_pop(kk_t *k)
{
    uint32_t top = k->heap[0];
    k->heap[0] = k->heap[--k->heap_len];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < k->heap_len && kk_before(k, k->heap[l], k->heap[best]))
            best = l;
        if (r < k->heap_len && kk_before(k, k->heap[r], k->heap[best]))
            best = r;
        if (best == i)
            break;
        uint32_t tmp = k->heap[i];
        k->heap[i] = k->heap[best];
        k->heap[best] = tmp;
        i = best;
    }
    return top;
}

/* Joins tuple b into tuple a: a's largest subset with b's smallest, and so on, then re-sorts
 * a's subsets by sum descending (stable insertion sort: O(R^2) worst, R is small). */
static void kk_combine(kk_t *k, uint32_t a, uint32_t b)
{
    uint32_t R = k->ranks;
    size_t A = (size_t)a * R, Bt = (size_t)b * R;
    for (uint32_t i = 0; i < R; i++) {
        size_t x = A + i, y = Bt + (R - 1 - i);
        k->sum[x] += k->sum[y];
        if (k->head[y] >= 0) {
            if (k->head[x] < 0)
                k->head[x] = k->head[y];
            else
                k->next[k->tail[x]] = k->head[y];
            k->tail[x] = k->tail[y];
        }
    }
    for (uint32_t i = 1; i < R; i++) {
        double s = k->sum[A + i];
        int32_t h = k->head[A + i], t = k->tail[A + i];
        uint32_t j = i;
        while (j > 0 && k->sum[A + j - 1] < s) {
            k->sum[A + j] = k->sum[A + j - 1];
            k->head[A + j] = k->head[A + j - 1];
            k->tail[A + j] = k->tail[A + j - 1];
            j--;
        }
        k->sum[A + j] = s;
        k->head[A + j] = h;
        k->tail[A + j] = t;
    }
}

/* Partitions the items desc[0..m) (sorted by load descending) into R subsets and writes each
 * item's subset into part_of[item]. Balanced (fixed-batch, m = R x B): consecutive groups of R
 * items start as R-tuples, so every subset ends with exactly B items. Unbalanced (token
 * budget): every item starts as its own tuple with R - 1 empty subsets (classic multiway
 * differencing). Repeatedly the two tuples with the largest spread are joined, largest sums
 * with smallest. Returns 0 or DH_ENOMEM. */
static int kk_partition(const ctx_t *c, const uint32_t *desc, size_t m, int balanced,
                        int32_t *part_of)
{
    uint32_t R = c->ranks;
    if (m == 0)
        return 0;
    size_t tuples = balanced ? m / R : m;
    kk_t k = {.ranks = R};
    k.sum = dh_calloc(tuples * R, sizeof *k.sum);
    k.head = dh_calloc(tuples * R, sizeof *k.head); /* calloc: checks tuples x R x size */
    k.tail = dh_calloc(tuples * R, sizeof *k.tail);
    k.next = dh_calloc(c->n, sizeof *k.next);
    k.heap = dh_calloc(tuples, sizeof *k.heap);
    int rc = DH_ENOMEM;
    if (!k.sum || !k.head || !k.tail || !k.next || !k.heap)
        goto out;
    for (size_t x = 0; x < tuples * R; x++)
        k.head[x] = k.tail[x] = -1;
    for (size_t i = 0; i < m; i++) {
        size_t slot = balanced ? i : i * R; /* balanced: item i is subset i%R of tuple i/R */
        k.sum[slot] = c->load[desc[i]];
        k.head[slot] = k.tail[slot] = (int32_t)desc[i];
        k.next[desc[i]] = -1;
    }
    for (size_t t = 0; t < tuples; t++)
        kk_push(&k, (uint32_t)t);
    while (k.heap_len > 1) {
        uint32_t a = kk_pop(&k), b = kk_pop(&k);
        kk_combine(&k, a, b);
        kk_push(&k, a);
    }
    uint32_t last = k.heap[0];
    for (uint32_t s = 0; s < R; s++)
        for (int32_t i = k.head[(size_t)last * R + s]; i >= 0; i = k.next[i])
            part_of[i] = (int32_t)s;
    rc = 0;
out:
    dh_free(k.sum);
    dh_free(k.head);
    dh_free(k.tail);
    dh_free(k.next);
    dh_free(k.heap);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Local improvement: swaps (and moves when packing) off the most-loaded rank               */

/* Repeats: take the most-loaded rank M (lowest index on ties); over every other rank r, every
 * swap of an item of M with a lighter item of r (and, without cardinality, every move of an
 * item of M to r) that keeps r within the budget, pick the one with the smallest
 * max(load M, load r) afterwards; apply it if that is below load M; stop when none is. Each
 * applied step lowers the sorted load vector lexicographically, so it terminates; the
 * iteration cap only guards against rounding with non-integral loads. Never changes which
 * items are placed. `members` holds n entries, `offset` R + 1. O(iterations x (n + R B^2)). */
static void improve(const ctx_t *c, int32_t *rank_of, double *rank_load, uint32_t *members,
                    size_t *offset)
{
    uint32_t R = c->ranks;
    size_t max_iterations = 16 * c->n + 64;
    recompute(c, rank_of, rank_load, NULL);
    for (size_t iter = 0; iter < max_iterations && R > 1; iter++) {
        /* Bucket the placed items by rank, in index order: O(n + R). */
        memset(offset, 0, (R + 1) * sizeof *offset);
        for (size_t i = 0; i < c->n; i++)
            if (rank_of[i] >= 0)
                offset[rank_of[i] + 1]++;
        for (uint32_t r = 0; r < R; r++)
            offset[r + 1] += offset[r];
        for (size_t i = 0; i < c->n; i++)
            if (rank_of[i] >= 0)
                members[offset[rank_of[i]]++] = (uint32_t)i;
        for (uint32_t r = R; r > 0; r--) /* offsets were advanced by the fill: shift back */
            offset[r] = offset[r - 1];
        offset[0] = 0;

        uint32_t M = argmax(rank_load, R);
        double top = rank_load[M];
        double best = top * (1 - REL_EPS);
        int64_t best_i = -1, best_j = -1;
        uint32_t best_r = 0;
        for (uint32_t r = 0; r < R; r++) {
            if (r == M)
                continue;
            for (size_t a = offset[M]; a < offset[M + 1]; a++) {
                uint32_t i = members[a];
                double xi = c->load[i];
                if (!c->cap) { /* a move changes counts: only without cardinality */
                    double to = rank_load[r] + xi;
                    double pair = fmax(top - xi, to);
                    if (to <= c->budget && pair < best) {
                        best = pair;
                        best_i = i, best_j = -1, best_r = r;
                    }
                }
                for (size_t b = offset[r]; b < offset[r + 1]; b++) {
                    uint32_t j = members[b];
                    double d = xi - c->load[j];
                    if (d <= 0)
                        continue;
                    double to = rank_load[r] + d;
                    double pair = fmax(top - d, to);
                    if (to <= c->budget && pair < best) {
                        best = pair;
                        best_i = i, best_j = j, best_r = r;
                    }
                }
            }
        }
        if (best_i < 0)
            break;
        rank_of[best_i] = (int32_t)best_r;
        if (best_j >= 0)
            rank_of[best_j] = (int32_t)M;
        recompute(c, rank_of, rank_load, NULL);
    }
}

/* Token budget: places deferred items, in `order` (carried first, then largest first), on
 * the least-loaded rank if they fit. Afterwards no deferred item fits on any rank, since
 * loads only grow during the pass. Returns how many were placed. O(m R). */
static size_t fill_deferred(const ctx_t *c, const uint32_t *order, size_t m, int32_t *rank_of,
                            double *rank_load)
{
    size_t placed = 0;
    for (size_t k = 0; k < m; k++) {
        uint32_t i = order[k];
        if (rank_of[i] >= 0)
            continue;
        uint32_t r = 0;
        for (uint32_t q = 1; q < c->ranks; q++)
            if (rank_load[q] < rank_load[r])
                r = q;
        if (rank_load[r] + c->load[i] <= c->budget) {
            rank_of[i] = (int32_t)r;
            rank_load[r] += c->load[i];
            placed++;
        }
    }
    return placed;
}

/* ---------------------------------------------------------------------------------------- */
/* Exact: branch and bound                                                                  */

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
static int exact_improve(const ctx_t *c, const dh_plan_config_t *cfg, int32_t *rank_of,
                         const double *rank_load, uint32_t *order, sort_item_t *scratch)
{
    uint32_t R = c->ranks;
    size_t m = 0;
    for (size_t i = 0; i < c->n; i++)
        if (rank_of[i] >= 0)
            order[m++] = (uint32_t)i;
    sort_desc(c->load, order, m, scratch, order);
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
    b.ub = rank_load[argmax(rank_load, R)];
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

/* ---------------------------------------------------------------------------------------- */
/* The entry points                                                                         */

static int validate(const dh_plan_config_t *cfg, const double *load, size_t n, size_t n_carried)
{
    if ((unsigned)cfg->algo >= DH_PLAN_ALGO_COUNT)
        return dh__set_error(DH_EINVAL, "planner: unknown algorithm %d", (int)cfg->algo);
    if (cfg->ranks == 0)
        return dh__set_error(DH_EINVAL, "planner: ranks must be > 0");
    if (n > INT32_MAX)
        return dh__set_error(DH_EINVAL, "planner: %zu items is too many", n);
    for (size_t i = 0; i < n; i++)
        if (!(load[i] >= 0) || isinf(load[i]))
            return dh__set_error(DH_EINVAL, "planner: item %zu has load %g (must be finite, >= 0)",
                                 i, load[i]);
    if (cfg->mode == DH_PLAN_FIXED_BATCH) {
        if (cfg->batch == 0)
            return dh__set_error(DH_EINVAL, "planner: batch must be > 0");
        if ((uint64_t)n != (uint64_t)cfg->ranks * cfg->batch)
            return dh__set_error(DH_EINVAL,
                                 "planner: fixed-batch window has %zu items, expected ranks x "
                                 "batch = %u x %u",
                                 n, cfg->ranks, cfg->batch);
        if (n_carried != 0)
            return dh__set_error(DH_EINVAL, "planner: carried items only in token-budget mode");
        return 0;
    }
    if (cfg->mode != DH_PLAN_TOKEN_BUDGET)
        return dh__set_error(DH_EINVAL, "planner: unknown mode %d", (int)cfg->mode);
    if (!(cfg->token_budget > 0) || isinf(cfg->token_budget))
        return dh__set_error(DH_EINVAL, "planner: token budget %g must be finite and > 0",
                             cfg->token_budget);
    if (n_carried > n)
        return dh__set_error(DH_EINVAL, "planner: %zu carried items of %zu", n_carried, n);
    for (size_t i = 0; i < n; i++)
        if (load[i] > cfg->token_budget)
            return dh__set_error(DH_ERANGE, "planner: item %zu has load %g over the budget %g", i,
                                 load[i], cfg->token_budget);
    return 0;
}

/* Scratch of one planning call: one allocation per array, all freed by ws_free. */
typedef struct ws {
    uint32_t *order;     /* n */
    uint32_t *order2;    /* n */
    uint32_t *members;   /* n */
    sort_item_t *sorted; /* n */
    int32_t *plan_b;     /* n */
    size_t *offset;      /* R + 1 */
    uint32_t *count;     /* R */
    double *load_b;      /* R */
    uint32_t *cap;       /* R (fixed-batch) */
} ws_t;

static void ws_free(ws_t *w)
{
    dh_free(w->order);
    dh_free(w->order2);
    dh_free(w->members);
    dh_free(w->sorted);
    dh_free(w->plan_b);
    dh_free(w->offset);
    dh_free(w->count);
    dh_free(w->load_b);
    dh_free(w->cap);
}

static int ws_alloc(ws_t *w, size_t n, uint32_t R)
{
    size_t m = n ? n : 1;
    memset(w, 0, sizeof *w);
    w->order = dh_malloc(m * sizeof *w->order);
    w->order2 = dh_malloc(m * sizeof *w->order2);
    w->members = dh_malloc(m * sizeof *w->members);
    w->sorted = dh_malloc(m * sizeof *w->sorted);
    w->plan_b = dh_malloc(m * sizeof *w->plan_b);
    w->offset = dh_calloc((size_t)R + 1, sizeof *w->offset);
    w->count = dh_calloc(R, sizeof *w->count);
    w->load_b = dh_calloc(R, sizeof *w->load_b);
    w->cap = dh_calloc(R, sizeof *w->cap);
    if (w->order && w->order2 && w->members && w->sorted && w->plan_b && w->offset && w->count &&
        w->load_b && w->cap)
        return 0;
    ws_free(w);
    return DH_ENOMEM;
}

/* Token budget: order[] = carried items largest first, then the others largest first. */
static void packing_order(const ctx_t *c, size_t n_carried, ws_t *w, uint32_t *order)
{
    for (size_t i = 0; i < c->n; i++)
        w->order2[i] = (uint32_t)i;
    sort_desc(c->load, w->order2, n_carried, w->sorted, order);
    sort_desc(c->load, w->order2 + n_carried, c->n - n_carried, w->sorted, order + n_carried);
}

/* The paper's greedy into rank_of. Token budget: carried items first. */
static void run_greedy(const ctx_t *c, const uint32_t *key, size_t n_carried, ws_t *w,
                       int32_t *rank_of, double *rank_load)
{
    for (size_t i = 0; i < c->n; i++)
        w->order2[i] = (uint32_t)i;
    sort_desc(c->load, w->order2, n_carried, w->sorted, w->order);
    sort_grouped(c->load, key, w->order2 + n_carried, c->n - n_carried, w->sorted,
                 w->order + n_carried);
    memset(w->count, 0, c->ranks * sizeof *w->count);
    for (uint32_t r = 0; r < c->ranks; r++)
        rank_load[r] = 0;
    greedy_place(c, w->order, c->n, rank_of, rank_load, w->count);
}

/* Karmarkar-Karp into rank_of. Fixed batch: the balanced partition is the plan. Token
 * budget: the unbalanced partition gives each item a preferred rank; items then go, carried
 * first and largest first, to their preferred rank if it has room under the budget, else to
 * the least-loaded rank with room, else are deferred. */
static int run_kk(const ctx_t *c, size_t n_carried, ws_t *w, int32_t *rank_of, double *rank_load)
{
    if (c->cap) {
        for (size_t i = 0; i < c->n; i++)
            w->order2[i] = (uint32_t)i;
        sort_desc(c->load, w->order2, c->n, w->sorted, w->order);
        int rc = kk_partition(c, w->order, c->n, 1, rank_of);
        if (rc == 0)
            recompute(c, rank_of, rank_load, NULL);
        return rc;
    }
    int32_t *pref = (int32_t *)w->members; /* free until improve() runs */
    for (size_t i = 0; i < c->n; i++)
        w->order2[i] = (uint32_t)i;
    sort_desc(c->load, w->order2, c->n, w->sorted, w->order);
    int rc = kk_partition(c, w->order, c->n, 0, pref);
    if (rc)
        return rc;
    packing_order(c, n_carried, w, w->order);
    memset(w->count, 0, c->ranks * sizeof *w->count);
    for (uint32_t r = 0; r < c->ranks; r++)
        rank_load[r] = 0;
    for (size_t k = 0; k < c->n; k++) {
        uint32_t i = w->order[k];
        int32_t r = pref[i];
        if (rank_load[r] + c->load[i] > c->budget)
            r = least_loaded_with_room(c, rank_load, w->count, c->load[i]);
        rank_of[i] = r;
        if (r >= 0) {
            rank_load[r] += c->load[i];
            w->count[r]++;
        }
    }
    return 0;
}

/* Token budget: after a plan changes, defer nothing that fits: fill, improve, repeat until a
 * fill places nothing (each round places at least one more item, so at most n rounds). */
static void settle_packing(const ctx_t *c, size_t n_carried, ws_t *w, int32_t *rank_of,
                           double *rank_load)
{
    packing_order(c, n_carried, w, w->order);
    recompute(c, rank_of, rank_load, NULL);
    while (fill_deferred(c, w->order, c->n, rank_of, rank_load) > 0)
        improve(c, rank_of, rank_load, w->members, w->offset);
}

/* `swap`: the better of greedy and kk (more items placed, then the lower max load; greedy on
 * ties), then improving swaps/moves. */
static int run_swap(const ctx_t *c, const uint32_t *key, size_t n_carried, ws_t *w,
                    int32_t *rank_of, double *rank_load)
{
    run_greedy(c, key, n_carried, w, rank_of, rank_load);
    int rc = run_kk(c, n_carried, w, w->plan_b, w->load_b);
    if (rc)
        return rc;
    size_t placed_a = placed_count(rank_of, c->n), placed_b = placed_count(w->plan_b, c->n);
    double max_a = rank_load[argmax(rank_load, c->ranks)];
    double max_b = w->load_b[argmax(w->load_b, c->ranks)];
    if (placed_b > placed_a || (placed_b == placed_a && max_b < max_a)) {
        memcpy(rank_of, w->plan_b, c->n * sizeof *rank_of);
        memcpy(rank_load, w->load_b, c->ranks * sizeof *rank_load);
    }
    improve(c, rank_of, rank_load, w->members, w->offset);
    if (!c->cap)
        settle_packing(c, n_carried, w, rank_of, rank_load);
    return 0;
}

int dh_plan_step_carried(const dh_plan_config_t *cfg, const double *load, const uint32_t *key,
                         size_t n, size_t n_carried, int32_t *rank_of, double *rank_load)
{
    assert(cfg && (load || n == 0) && (rank_of || n == 0));
    int rc = validate(cfg, load, n, n_carried);
    if (rc)
        return rc;
    uint32_t R = cfg->ranks;
    ws_t w;
    double *loads = dh_calloc(R, sizeof *loads);
    if (!loads || ws_alloc(&w, n, R) != 0) {
        dh_free(loads);
        return DH_ENOMEM;
    }
    ctx_t c = {.load = load, .n = n, .ranks = R, .cap = NULL, .budget = INFINITY};
    if (cfg->mode == DH_PLAN_FIXED_BATCH) {
        for (uint32_t r = 0; r < R; r++)
            w.cap[r] = cfg->batch;
        c.cap = w.cap;
    } else {
        c.budget = cfg->token_budget;
    }
    switch (cfg->algo) {
    case DH_PLAN_GREEDY:
        run_greedy(&c, key, n_carried, &w, rank_of, loads);
        break;
    case DH_PLAN_KK:
        rc = run_kk(&c, n_carried, &w, rank_of, loads);
        break;
    case DH_PLAN_SWAP:
        rc = run_swap(&c, key, n_carried, &w, rank_of, loads);
        break;
    case DH_PLAN_EXACT:
        rc = run_swap(&c, key, n_carried, &w, rank_of, loads);
        if (rc == 0)
            rc = exact_improve(&c, cfg, rank_of, loads, w.order, w.sorted);
        if ((rc == 0 || rc == DH_ETOOBIG) && !c.cap)
            settle_packing(&c, n_carried, &w, rank_of, loads);
        break;
    }
    if (rc == 0 || rc == DH_ETOOBIG) {
        recompute(&c, rank_of, loads, NULL);
        if (rank_load)
            memcpy(rank_load, loads, R * sizeof *rank_load);
    }
    ws_free(&w);
    dh_free(loads);
    return rc;
}

int dh_plan_step(const dh_plan_config_t *cfg, const double *load, const uint32_t *key, size_t n,
                 int32_t *rank_of, double *rank_load)
{
    return dh_plan_step_carried(cfg, load, key, n, 0, rank_of, rank_load);
}

int dh_plan_fanout(const double *load, size_t n, uint32_t parts, uint32_t *part_of)
{
    if (parts == 0 || parts > n)
        return dh__set_error(DH_EINVAL, "fanout: %u parts for %zu items (need 1..n)", parts, n);
    for (size_t i = 0; i < n; i++)
        if (!(load[i] >= 0) || isinf(load[i]))
            return dh__set_error(DH_EINVAL, "fanout: item %zu has load %g", i, load[i]);
    ws_t w;
    double *loads = dh_calloc(parts, sizeof *loads);
    int32_t *rank_of = dh_malloc(n * sizeof *rank_of);
    if (!loads || !rank_of || ws_alloc(&w, n, parts) != 0) {
        dh_free(loads);
        dh_free(rank_of);
        return DH_ENOMEM;
    }
    /* Sizes differ by at most one: the first n % parts parts take one item more. Largest first
     * to the least-loaded part with room, then the same improving swaps as `swap`. */
    for (uint32_t p = 0; p < parts; p++)
        w.cap[p] = (uint32_t)(n / parts) + (p < n % parts);
    ctx_t c = {.load = load, .n = n, .ranks = parts, .cap = w.cap, .budget = INFINITY};
    for (size_t i = 0; i < n; i++)
        w.order2[i] = (uint32_t)i;
    sort_desc(load, w.order2, n, w.sorted, w.order);
    greedy_place(&c, w.order, n, rank_of, loads, w.count);
    improve(&c, rank_of, loads, w.members, w.offset);
    for (size_t i = 0; i < n; i++)
        part_of[i] = (uint32_t)rank_of[i];
    ws_free(&w);
    dh_free(loads);
    dh_free(rank_of);
    return 0;
}

/* ---- a rank's share of a step ---- */

int dh_plan_min_rows(int32_t *rank_of, const double *load, size_t n, uint32_t ranks,
                     uint32_t min_rows)
{
    if (ranks == 0)
        return dh__set_error(DH_EINVAL, "plan min rows: ranks must be > 0");
    size_t *count = dh_malloc(ranks * sizeof *count);
    if (!count)
        return dh__set_error(DH_ENOMEM, "out of memory balancing row counts");
    for (;;) {
        memset(count, 0, ranks * sizeof *count);
        for (size_t i = 0; i < n; i++)
            if (rank_of[i] >= 0 && (uint32_t)rank_of[i] < ranks)
                count[rank_of[i]]++;
        uint32_t short_r = ranks, most = 0;
        for (uint32_t r = 0; r < ranks; r++) {
            if (count[r] < min_rows && short_r == ranks)
                short_r = r;
            if (count[r] > count[most])
                most = r;
        }
        if (short_r == ranks || count[most] <= min_rows)
            break;
        size_t lightest = n;
        for (size_t i = 0; i < n; i++)
            if (rank_of[i] == (int32_t)most && (lightest == n || load[i] < load[lightest]))
                lightest = i;
        rank_of[lightest] = (int32_t)short_r;
    }
    dh_free(count);
    return 0;
}

/* One step's items shared by cfg->mode into rank_of (the per-step plan). Packed: the
 * token-budget planner with a budget nothing exceeds (no deferral), then min_rows. Exact's
 * DH_ETOOBIG is not an error (rank_of holds its best plan). */
static int share_step(const dh_share_config_t *cfg, const double *load, const uint32_t *key,
                      size_t n, int32_t *rank_of)
{
    dh_plan_config_t pc = {
        .mode = DH_PLAN_FIXED_BATCH, .algo = cfg->algo, .ranks = cfg->ranks, .batch = cfg->batch};
    int rc = 0;
    if (cfg->mode == DH_SHARE_TOKEN_PACKED) {
        double total = 0;
        for (size_t i = 0; i < n; i++)
            total += load[i];
        pc.mode = DH_PLAN_TOKEN_BUDGET;
        pc.token_budget = total + 1;
        rc = dh_plan_step(&pc, load, key, n, rank_of, NULL);
        if (rc == DH_ETOOBIG)
            rc = 0;
        if (rc == 0)
            rc = dh_plan_min_rows(rank_of, load, n, cfg->ranks, cfg->min_rows);
    } else if (cfg->mode == DH_SHARE_TOKEN_BALANCED) {
        rc = dh_plan_step(&pc, load, key, n, rank_of, NULL);
    } else {
        for (size_t i = 0; i < n; i++)
            rank_of[i] = (int32_t)(i / cfg->batch);
    }
    return rc == DH_ETOOBIG ? 0 : rc;
}

static double max_rank_load(const double *load, const int32_t *rank_of, size_t n, double *rank_load,
                            uint32_t ranks)
{
    memset(rank_load, 0, ranks * sizeof *rank_load);
    for (size_t i = 0; i < n; i++)
        if (rank_of[i] >= 0 && (uint32_t)rank_of[i] < ranks)
            rank_load[rank_of[i]] += load[i];
    double mx = 0;
    for (uint32_t r = 0; r < ranks; r++)
        if (rank_load[r] > mx)
            mx = rank_load[r];
    return mx;
}

/* Whether no rank holds more than cap of the m items of rank_of (count: ranks scratch). */
static bool rows_fit(const int32_t *rank_of, size_t m, uint32_t ranks, size_t cap, size_t *count)
{
    memset(count, 0, ranks * sizeof *count);
    for (size_t i = 0; i < m; i++)
        if (++count[rank_of[i]] > cap)
            return false;
    return true;
}

int dh_plan_window_share(const dh_share_config_t *cfg, uint32_t steps, const double *load,
                         const uint32_t *key, size_t n, uint32_t *step_of, int32_t *rank_of)
{
    if (cfg->ranks == 0 || cfg->batch == 0 || steps == 0)
        return dh__set_error(DH_EINVAL, "plan window: ranks %u, batch %u and steps %u must be > 0",
                             cfg->ranks, cfg->batch, steps);
    if (cfg->mode != DH_SHARE_TOKEN_BALANCED && cfg->mode != DH_SHARE_TOKEN_PACKED)
        return dh__set_error(DH_EINVAL,
                             "plan window: planning across steps needs the balanced or packed "
                             "mode (mode %d)",
                             (int)cfg->mode);
    size_t per_step = (size_t)cfg->ranks * cfg->batch;
    if (n != (size_t)steps * per_step)
        return dh__set_error(DH_EINVAL, "plan window: %zu items, expected %u steps x %zu", n, steps,
                             per_step);
    for (size_t i = 0; i < n; i++)
        if (!(load[i] >= 0) || isinf(load[i]))
            return dh__set_error(DH_EINVAL, "plan window: item %zu has load %g", i, load[i]);
    size_t bins = (size_t)steps * cfg->ranks;
    size_t bin_cap = cfg->mode == DH_SHARE_TOKEN_BALANCED ? cfg->batch : per_step;
    uint32_t *idx = dh_malloc(n * sizeof *idx);
    uint32_t *order = dh_malloc(n * sizeof *order);
    sort_item_t *scratch = dh_malloc(n * sizeof *scratch);
    double *bin_load = dh_calloc(bins, sizeof *bin_load);
    size_t *bin_count = dh_calloc(bins, sizeof *bin_count);
    uint32_t *members = dh_malloc(per_step * steps * sizeof *members);
    double *sl = dh_malloc(n * sizeof *sl);
    uint32_t *sk = key ? dh_malloc(n * sizeof *sk) : NULL;
    int32_t *alt = dh_malloc(n * sizeof *alt);
    double *rank_load = dh_malloc(cfg->ranks * sizeof *rank_load);
    int rc = 0;
    if (!idx || !order || !scratch || !bin_load || !bin_count || !members || !sl || (key && !sk) ||
        !alt || !rank_load) {
        rc = dh__set_error(DH_ENOMEM, "out of memory planning a window of %u steps", steps);
        goto done;
    }
    /* 1. largest first into the least-loaded bin with room */
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)i;
    sort_desc(load, idx, n, scratch, order);
    /* packed: every bin ends with at least min_rows items (the lightest fill the short bins:
     * once the items left are as many as the bins' shortfall, only short bins take them) */
    size_t min_rows = cfg->mode == DH_SHARE_TOKEN_PACKED && cfg->min_rows > 1 ? cfg->min_rows : 1;
    if (min_rows > cfg->batch)
        min_rows = cfg->batch;
    size_t short_by = bins * min_rows;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = order[k];
        size_t own = i / per_step, best = bins;
        bool only_short = n - k <= short_by;
        for (size_t bi = 0; bi < bins; bi++) {
            if (bin_count[bi] >= bin_cap || (only_short && bin_count[bi] >= min_rows))
                continue;
            if (best == bins || bin_load[bi] < bin_load[best] ||
                (bin_load[bi] == bin_load[best] &&
                 (bin_count[bi] < bin_count[best] ||
                  (bin_count[bi] == bin_count[best] && bi / cfg->ranks == own &&
                   best / cfg->ranks != own))))
                best = bi;
        }
        /* n = bins x batch <= bins x bin_cap items: a bin with room always exists */
        assert(best < bins);
        bin_load[best] += load[i];
        if (bin_count[best]++ < min_rows)
            short_by--;
        rank_of[i] = (int32_t)best; /* its bin, for now */
    }
    /* 2. bins grouped into steps heaviest first: a step costs its largest bin, so bins of
     * like load share a step (for fixed bins this minimises the sum of the steps' largest) */
    for (size_t bi = 0; bi < bins; bi++)
        idx[bi] = (uint32_t)bi;
    sort_desc(bin_load, idx, bins, scratch, order); /* bins <= n: scratch and order fit */
    for (size_t p = 0; p < bins; p++)
        idx[order[p]] = (uint32_t)p; /* bin -> its place */
    for (size_t i = 0; i < n; i++) {
        size_t place = idx[rank_of[i]];
        step_of[i] = (uint32_t)(place / cfg->ranks);
        rank_of[i] = (int32_t)(place % cfg->ranks);
    }
    /* 3. each step again by the per-step planner; the better plan of the two is kept */
    for (uint32_t t = 0; t < steps; t++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (step_of[i] == t) {
                members[m] = (uint32_t)i;
                sl[m] = load[i];
                if (sk)
                    sk[m] = key[i];
                alt[m] = rank_of[i];
                m++;
            }
        if (cfg->mode == DH_SHARE_TOKEN_PACKED &&
            (rc = dh_plan_min_rows(alt, sl, m, cfg->ranks, cfg->min_rows)))
            goto done;
        double before = max_rank_load(sl, alt, m, rank_load, cfg->ranks);
        for (size_t j = 0; j < m; j++)
            rank_of[members[j]] = alt[j];
        if ((rc = share_step(cfg, sl, sk, m, alt)))
            goto done;
        if (max_rank_load(sl, alt, m, rank_load, cfg->ranks) < before &&
            rows_fit(alt, m, cfg->ranks, bin_cap, bin_count))
            for (size_t j = 0; j < m; j++)
                rank_of[members[j]] = alt[j];
    }
done:
    dh_free(idx);
    dh_free(order);
    dh_free(scratch);
    dh_free(bin_load);
    dh_free(bin_count);
    dh_free(members);
    dh_free(sl);
    dh_free(sk);
    dh_free(alt);
    dh_free(rank_load);
    return rc;
}

/* The window of steps that holds `step` planned by cfg: its n_all items (ids, in window
 * order), each with its step within the window (step_of) and rank (rank_of); *at is
 * `step`'s index in the window. The arrays are dh_malloc'd, the caller's (NULL on error). */
static int share_window(const dh_share_config_t *cfg, dh_sampler_t *sampler,
                        const dh_profile_set_t *profiles, uint64_t step, uint32_t **ids_out,
                        int32_t **rank_out, uint32_t **step_out, size_t *n_out, uint32_t *at)
{
    *ids_out = NULL;
    *rank_out = NULL;
    *step_out = NULL;
    if (cfg->ranks == 0 || cfg->batch == 0)
        return dh__set_error(DH_EINVAL, "plan share: ranks %u and batch %u must be > 0", cfg->ranks,
                             cfg->batch);
    if ((unsigned)cfg->mode >= DH_SHARE_MODE_COUNT)
        return dh__set_error(DH_EINVAL, "plan share: unknown mode %d", (int)cfg->mode);
    size_t per_step = (size_t)cfg->ranks * cfg->batch;
    /* an epoch's tail (drop_last 0: fewer rows per rank, or pads) is planned alone */
    size_t step_size = dh_sampler_step_size(sampler, step);
    bool tail = step_size != per_step || dh_sampler_step_pads(sampler, step);
    dh_share_config_t tail_cfg = *cfg;
    if (step_size != per_step) {
        tail_cfg.batch = (uint32_t)(step_size / cfg->ranks);
        if (tail_cfg.min_rows > tail_cfg.batch)
            tail_cfg.min_rows = tail_cfg.batch;
        cfg = &tail_cfg;
        per_step = step_size;
    }
    /* the window of steps [first, first + w) that holds `step` (w = 1: the step alone) */
    uint64_t first = step;
    uint32_t w = 1;
    if (cfg->window_steps > 1 && cfg->mode != DH_SHARE_SAMPLE_COUNT && !tail) {
        size_t k; /* the step's index in its epoch (which may be cut from a sample) */
        uint64_t spe = dh_sampler_epoch_steps(sampler, dh_sampler_step_epoch(sampler, step, &k));
        uint64_t last = step - k + spe - 1;
        if (dh_sampler_step_size(sampler, last) != per_step || dh_sampler_step_pads(sampler, last))
            spe--; /* the windows cover the full steps; the short tail is planned alone */
        first = step - k % cfg->window_steps;
        uint64_t left = spe - (first - (step - k));
        w = left < cfg->window_steps ? (uint32_t)left : cfg->window_steps;
    }
    size_t n_all = (size_t)w * per_step;
    uint32_t *ids = dh_malloc(n_all * sizeof *ids);
    double *load = dh_malloc(n_all * sizeof *load);
    uint32_t *key = dh_malloc(n_all * sizeof *key);
    int32_t *rank_of = dh_malloc(n_all * sizeof *rank_of);
    uint32_t *step_of = dh_malloc(n_all * sizeof *step_of);
    int rc = 0;
    if (!ids || !load || !key || !rank_of || !step_of) {
        rc = dh__set_error(DH_ENOMEM, "out of memory planning a step");
        goto done;
    }
    for (uint32_t t = 0; t < w; t++)
        if ((rc = dh_sampler_step(sampler, first + t, ids + (size_t)t * per_step)))
            goto done;
    for (size_t i = 0; i < n_all; i++) {
        const dh_profile_row_t *row = dh_profile_set_row(profiles, ids[i]);
        load[i] = (double)row->tokens_est;
        key[i] = row->key_index;
    }
    if (w > 1) {
        rc = dh_plan_window_share(cfg, w, load, key, n_all, step_of, rank_of);
    } else {
        memset(step_of, 0, n_all * sizeof *step_of);
        rc = share_step(cfg, load, key, n_all, rank_of);
    }
done:
    dh_free(load);
    dh_free(key);
    if (rc) {
        dh_free(ids);
        dh_free(rank_of);
        dh_free(step_of);
        return rc;
    }
    *ids_out = ids;
    *rank_out = rank_of;
    *step_out = step_of;
    *n_out = n_all;
    *at = (uint32_t)(step - first);
    return 0;
}

int dh_plan_rank_share(const dh_share_config_t *cfg, dh_sampler_t *sampler,
                       const dh_profile_set_t *profiles, uint64_t step, uint32_t rank,
                       uint32_t *rows, size_t cap)
{
    if (rank >= cfg->ranks)
        return dh__set_error(DH_EINVAL, "rank %u >= ranks %u", rank, cfg->ranks);
    uint32_t *ids, *step_of, at;
    int32_t *rank_of;
    size_t n_all;
    int rc = share_window(cfg, sampler, profiles, step, &ids, &rank_of, &step_of, &n_all, &at);
    if (rc)
        return rc;
    size_t n = 0;
    for (size_t i = 0; i < n_all; i++)
        if (step_of[i] == at && rank_of[i] == (int32_t)rank && n < cap)
            rows[n++] = ids[i];
    dh_free(ids);
    dh_free(rank_of);
    dh_free(step_of);
    return (int)n;
}

int dh_plan_step_share(const dh_share_config_t *cfg, dh_sampler_t *sampler,
                       const dh_profile_set_t *profiles, uint64_t step, uint32_t *rows,
                       uint32_t *rank_of, size_t cap)
{
    uint32_t *ids, *step_of, at;
    int32_t *ranks;
    size_t n_all;
    int rc = share_window(cfg, sampler, profiles, step, &ids, &ranks, &step_of, &n_all, &at);
    if (rc)
        return rc;
    size_t n = 0;
    for (size_t i = 0; i < n_all && rc == 0; i++) {
        if (step_of[i] != at || ranks[i] < 0)
            continue;
        if (n == cap) {
            rc = dh__set_error(DH_ERANGE, "plan share: step %llu has more than %zu rows",
                               (unsigned long long)step, cap);
            break;
        }
        rows[n] = ids[i];
        rank_of[n++] = (uint32_t)ranks[i];
    }
    dh_free(ids);
    dh_free(ranks);
    dh_free(step_of);
    return rc ? rc : (int)n;
}

uint32_t dh_plan_fanout_width(uint32_t batch, uint32_t cores_per_rank, double batch_decode_s,
                              double horizon_s)
{
    uint32_t cap = cores_per_rank < batch ? cores_per_rank : batch;
    if (cap <= 1 || !(batch_decode_s > horizon_s))
        return 1;
    if (!(horizon_s > 0))
        return cap;
    double parts = ceil(batch_decode_s / horizon_s);
    return parts >= (double)cap ? cap : (uint32_t)parts;
}
