/* plan_heuristics.c: the tier-1 planner's building blocks (plan_internal.h): the sorted
 * orders, the greedy placement, balanced largest differencing (Karmarkar-Karp with
 * cardinality) and the local improvement (swaps and moves off the most-loaded rank, and the
 * refill of deferred items). Deterministic and pure, like the rest of the planner (plan.c).
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

static int cmp_group_order(const void *pa, const void *pb)
{
    const dh__plan_sort_item_t *a = pa, *b = pb;
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
    const dh__plan_sort_item_t *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    if (a->load != b->load)
        return a->load > b->load ? -1 : 1;
    return a->index < b->index ? -1 : (a->index > b->index);
}

/* Writes into order[] the items idx[0..m) sorted by load descending, ties by index.
 * `scratch` holds m dh__plan_sort_item_t. O(m log m). */
void dh__plan_sort_desc(const double *load, const uint32_t *idx, size_t m,
                        dh__plan_sort_item_t *scratch, uint32_t *order)
{
    for (size_t i = 0; i < m; i++)
        scratch[i] = (dh__plan_sort_item_t){load[idx[i]], 0, load[idx[i]], idx[i]};
    qsort(scratch, m, sizeof *scratch, cmp_group_order);
    for (size_t i = 0; i < m; i++)
        order[i] = scratch[i].index;
}

/* The paper's order: samples grouped by profile key, groups by their largest load descending
 * (ties by key). The paper's cost is per profile key, so within a group the samples keep
 * their window order: load differences inside a key (caption length, say) are invisible to
 * it, which is part of the slack the other algorithms recover. Without keys every sample is
 * its own group, which is plain largest-first (LPT). O(m log m). */
void dh__plan_sort_grouped(const double *load, const uint32_t *key, const uint32_t *idx, size_t m,
                           dh__plan_sort_item_t *scratch, uint32_t *order)
{
    if (!key) {
        dh__plan_sort_desc(load, idx, m, scratch, order);
        return;
    }
    for (size_t i = 0; i < m; i++)
        scratch[i] = (dh__plan_sort_item_t){0, key[idx[i]], load[idx[i]], idx[i]};
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
void dh__plan_recompute(const dh__plan_ctx_t *c, const int32_t *rank_of, double *rank_load,
                        uint32_t *count)
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

uint32_t dh__plan_argmax(const double *v, uint32_t m)
{
    uint32_t best = 0;
    for (uint32_t r = 1; r < m; r++)
        if (v[r] > v[best])
            best = r;
    return best;
}

size_t dh__plan_placed_count(const int32_t *rank_of, size_t n)
{
    size_t placed = 0;
    for (size_t i = 0; i < n; i++)
        placed += rank_of[i] >= 0;
    return placed;
}

/* Least-loaded rank that can take an item of load x (item room and budget), ties to the
 * lowest index; -1 if none. O(R). */
int32_t dh__plan_least_loaded_with_room(const dh__plan_ctx_t *c, const double *rank_load,
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
void dh__plan_greedy_place(const dh__plan_ctx_t *c, const uint32_t *order, size_t m,
                           int32_t *rank_of, double *rank_load, uint32_t *count)
{
    for (size_t k = 0; k < m; k++) {
        uint32_t i = order[k];
        int32_t r = dh__plan_least_loaded_with_room(c, rank_load, count, c->load[i]);
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
int dh__plan_kk_partition(const dh__plan_ctx_t *c, const uint32_t *desc, size_t m, int balanced,
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
void dh__plan_improve(const dh__plan_ctx_t *c, int32_t *rank_of, double *rank_load,
                      uint32_t *members, size_t *offset)
{
    uint32_t R = c->ranks;
    size_t max_iterations = 16 * c->n + 64;
    dh__plan_recompute(c, rank_of, rank_load, NULL);
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

        uint32_t M = dh__plan_argmax(rank_load, R);
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
        dh__plan_recompute(c, rank_of, rank_load, NULL);
    }
}

/* Token budget: places deferred items, in `order` (carried first, then largest first), on
 * the least-loaded rank if they fit. Afterwards no deferred item fits on any rank, since
 * loads only grow during the pass. Returns how many were placed. O(m R). */
size_t dh__plan_fill_deferred(const dh__plan_ctx_t *c, const uint32_t *order, size_t m,
                              int32_t *rank_of, double *rank_load)
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
