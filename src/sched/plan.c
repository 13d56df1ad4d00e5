/* plan.c: the tier-1 planner's entry points (docs/design.md §4.4, plan.h, docs/planner.md):
 * checking a call, its scratch, and which building blocks each algorithm runs in each mode.
 *
 * One step's window of samples is assigned to ranks so that the largest per-rank load is as
 * small as possible. Four algorithms share a few building blocks (plan_internal.h):
 *   - dh__plan_greedy_place:  items in a given order, each to the least-loaded rank with room;
 *   - dh__plan_kk_partition:  balanced largest differencing (Karmarkar-Karp with cardinality);
 *   - dh__plan_improve:       repeated best pairwise swaps (and, when packing, moves) off the
 *                             max rank (these three in plan_heuristics.c);
 *   - dh__plan_exact_improve: branch and bound, seeded with the `swap` plan as incumbent
 *                             (plan_exact.c).
 * Everything is deterministic: sorts break ties by item index, rank choices by rank index,
 * and no random numbers are used. Pure: no I/O, clocks or threads; scratch memory comes from
 * dh_malloc and is freed before returning, so every allocation failure is a clean DH_ENOMEM.
 * A rank's share of a sampler's window (dh_plan_rank_share) is in plan_share.c.
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
    uint32_t *order;              /* n */
    uint32_t *order2;             /* n */
    uint32_t *members;            /* n */
    dh__plan_sort_item_t *sorted; /* n */
    int32_t *plan_b;              /* n */
    size_t *offset;               /* R + 1 */
    uint32_t *count;              /* R */
    double *load_b;               /* R */
    uint32_t *cap;                /* R (fixed-batch) */
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
static void packing_order(const dh__plan_ctx_t *c, size_t n_carried, ws_t *w, uint32_t *order)
{
    for (size_t i = 0; i < c->n; i++)
        w->order2[i] = (uint32_t)i;
    dh__plan_sort_desc(c->load, w->order2, n_carried, w->sorted, order);
    dh__plan_sort_desc(c->load, w->order2 + n_carried, c->n - n_carried, w->sorted,
                       order + n_carried);
}

/* The paper's greedy into rank_of. Token budget: carried items first. */
static void run_greedy(const dh__plan_ctx_t *c, const uint32_t *key, size_t n_carried, ws_t *w,
                       int32_t *rank_of, double *rank_load)
{
    for (size_t i = 0; i < c->n; i++)
        w->order2[i] = (uint32_t)i;
    dh__plan_sort_desc(c->load, w->order2, n_carried, w->sorted, w->order);
    dh__plan_sort_grouped(c->load, key, w->order2 + n_carried, c->n - n_carried, w->sorted,
                          w->order + n_carried);
    memset(w->count, 0, c->ranks * sizeof *w->count);
    for (uint32_t r = 0; r < c->ranks; r++)
        rank_load[r] = 0;
    dh__plan_greedy_place(c, w->order, c->n, rank_of, rank_load, w->count);
}

/* Karmarkar-Karp into rank_of. Fixed batch: the balanced partition is the plan. Token
 * budget: the unbalanced partition gives each item a preferred rank; items then go, carried
 * first and largest first, to their preferred rank if it has room under the budget, else to
 * the least-loaded rank with room, else are deferred. */
static int run_kk(const dh__plan_ctx_t *c, size_t n_carried, ws_t *w, int32_t *rank_of,
                  double *rank_load)
{
    if (c->cap) {
        for (size_t i = 0; i < c->n; i++)
            w->order2[i] = (uint32_t)i;
        dh__plan_sort_desc(c->load, w->order2, c->n, w->sorted, w->order);
        int rc = dh__plan_kk_partition(c, w->order, c->n, 1, rank_of);
        if (rc == 0)
            dh__plan_recompute(c, rank_of, rank_load, NULL);
        return rc;
    }
    int32_t *pref = (int32_t *)w->members; /* free until dh__plan_improve() runs */
    for (size_t i = 0; i < c->n; i++)
        w->order2[i] = (uint32_t)i;
    dh__plan_sort_desc(c->load, w->order2, c->n, w->sorted, w->order);
    int rc = dh__plan_kk_partition(c, w->order, c->n, 0, pref);
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
            r = dh__plan_least_loaded_with_room(c, rank_load, w->count, c->load[i]);
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
static void settle_packing(const dh__plan_ctx_t *c, size_t n_carried, ws_t *w, int32_t *rank_of,
                           double *rank_load)
{
    packing_order(c, n_carried, w, w->order);
    dh__plan_recompute(c, rank_of, rank_load, NULL);
    while (dh__plan_fill_deferred(c, w->order, c->n, rank_of, rank_load) > 0)
        dh__plan_improve(c, rank_of, rank_load, w->members, w->offset);
}

/* `swap`: the better of greedy and kk (more items placed, then the lower max load; greedy on
 * ties), then improving swaps/moves. */
static int run_swap(const dh__plan_ctx_t *c, const uint32_t *key, size_t n_carried, ws_t *w,
                    int32_t *rank_of, double *rank_load)
{
    run_greedy(c, key, n_carried, w, rank_of, rank_load);
    int rc = run_kk(c, n_carried, w, w->plan_b, w->load_b);
    if (rc)
        return rc;
    size_t placed_a = dh__plan_placed_count(rank_of, c->n),
           placed_b = dh__plan_placed_count(w->plan_b, c->n);
    double max_a = rank_load[dh__plan_argmax(rank_load, c->ranks)];
    double max_b = w->load_b[dh__plan_argmax(w->load_b, c->ranks)];
    if (placed_b > placed_a || (placed_b == placed_a && max_b < max_a)) {
        memcpy(rank_of, w->plan_b, c->n * sizeof *rank_of);
        memcpy(rank_load, w->load_b, c->ranks * sizeof *rank_load);
    }
    dh__plan_improve(c, rank_of, rank_load, w->members, w->offset);
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
    dh__plan_ctx_t c = {.load = load, .n = n, .ranks = R, .cap = NULL, .budget = INFINITY};
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
            rc = dh__plan_exact_improve(&c, cfg, rank_of, loads, w.order, w.sorted);
        if ((rc == 0 || rc == DH_ETOOBIG) && !c.cap)
            settle_packing(&c, n_carried, &w, rank_of, loads);
        break;
    }
    if (rc == 0 || rc == DH_ETOOBIG) {
        dh__plan_recompute(&c, rank_of, loads, NULL);
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
    dh__plan_ctx_t c = {.load = load, .n = n, .ranks = parts, .cap = w.cap, .budget = INFINITY};
    for (size_t i = 0; i < n; i++)
        w.order2[i] = (uint32_t)i;
    dh__plan_sort_desc(load, w.order2, n, w.sorted, w.order);
    dh__plan_greedy_place(&c, w.order, n, rank_of, loads, w.count);
    dh__plan_improve(&c, rank_of, loads, w.members, w.offset);
    for (size_t i = 0; i < n; i++)
        part_of[i] = (uint32_t)rank_of[i];
    ws_free(&w);
    dh_free(loads);
    dh_free(rank_of);
    return 0;
}
