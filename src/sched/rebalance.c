/* rebalance.c: tier 2's default assignment policy and its cost gate (see rebalance.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rebalance.h"
#include "core/internal.h"

void dh_rebalance_params_default(dh_rebalance_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->keep_counts = 1;
    p->s_per_token = 1;
    p->min_gain = 0.05;
}

static int check(const dh_rebalance_item_t *items, size_t n, const dh_rebalance_params_t *p)
{
    if (!p->ranks)
        return dh__set_error(DH_EINVAL, "rebalance: ranks must be at least 1");
    if (!(p->s_per_token > 0) || !isfinite(p->s_per_token))
        return dh__set_error(DH_EINVAL, "rebalance: s_per_token must be > 0 (got %g)",
                             p->s_per_token);
    if (!(p->move_s_per_B >= 0) || !isfinite(p->move_s_per_B) || !(p->min_gain >= 0) ||
        !isfinite(p->min_gain) || !(p->slack_s >= 0) || !isfinite(p->slack_s))
        return dh__set_error(
            DH_EINVAL, "rebalance: move_s_per_B, min_gain and slack_s must be finite and >= 0");
    for (size_t i = 0; i < n; i++) {
        if (items[i].rank >= p->ranks)
            return dh__set_error(DH_EINVAL, "rebalance: item %zu: rank %u of %u ranks", i,
                                 items[i].rank, p->ranks);
        if (!(items[i].tokens >= 0) || !isfinite(items[i].tokens) || !(items[i].bytes >= 0) ||
            !isfinite(items[i].bytes))
            return dh__set_error(
                DH_EINVAL, "rebalance: item %zu: tokens and bytes must be finite and >= 0", i);
    }
    return 0;
}

static uint32_t most_loaded(const double *load, uint32_t ranks)
{
    uint32_t hi = 0;
    for (uint32_t r = 1; r < ranks; r++)
        if (load[r] > load[hi])
            hi = r;
    return hi;
}

/* One improving step from the most loaded rank hi: a move of one of its items (packing)
 * or a swap with an item of another rank (keep_counts), the one that leaves the lower
 * max(load[hi], load[other]). Returns 0 when nothing lowers it. */
static int step(const dh_rebalance_item_t *items, size_t n, const dh_rebalance_params_t *p,
                uint32_t *cur, double *load)
{
    uint32_t hi = most_loaded(load, p->ranks);
    double best = load[hi];
    size_t bi = n, bj = n;
    uint32_t bto = hi;
    for (size_t i = 0; i < n; i++) {
        if (cur[i] != hi)
            continue;
        if (!p->keep_counts) {
            for (uint32_t r = 0; r < p->ranks; r++) {
                double t = items[i].tokens;
                if (r == hi || !(t > 0) || !(t < load[hi] - load[r]))
                    continue;
                double after = fmax(load[hi] - t, load[r] + t);
                if (after < best) {
                    best = after;
                    bi = i;
                    bto = r;
                }
            }
            continue;
        }
        for (size_t j = 0; j < n; j++) {
            uint32_t r = cur[j];
            double d = items[i].tokens - items[j].tokens;
            if (r == hi || !(d > 0) || !(d < load[hi] - load[r]))
                continue;
            double after = fmax(load[hi] - d, load[r] + d);
            if (after < best) {
                best = after;
                bi = i;
                bj = j;
                bto = r;
            }
        }
    }
    if (bi == n)
        return 0;
    double d = items[bi].tokens - (bj < n ? items[bj].tokens : 0);
    load[hi] -= d;
    load[bto] += d;
    cur[bi] = bto;
    if (bj < n)
        cur[bj] = hi;
    return 1;
}

int dh_rebalance_plan(const dh_rebalance_item_t *items, size_t n, const dh_rebalance_params_t *p,
                      uint32_t *new_rank, dh_rebalance_verdict_t *v)
{
    int rc = check(items, n, p);
    if (rc)
        return rc;
    double *load = dh_calloc(3 * (size_t)p->ranks, sizeof *load);
    uint32_t *cur = dh_calloc(n ? n : 1, sizeof *cur);
    if (!load || !cur) {
        dh_free(load);
        dh_free(cur);
        return dh__set_error(DH_ENOMEM, "rebalance: out of memory (%zu items, %u ranks)", n,
                             p->ranks);
    }
    double *out = load + p->ranks, *in = out + p->ranks;
    for (size_t i = 0; i < n; i++) {
        cur[i] = items[i].rank;
        load[cur[i]] += items[i].tokens;
    }
    dh_rebalance_verdict_t vd;
    memset(&vd, 0, sizeof vd);
    vd.max_before_s = load[most_loaded(load, p->ranks)] * p->s_per_token;
    uint32_t cap = p->max_moves ? p->max_moves : (uint32_t)(n < UINT32_MAX ? n : UINT32_MAX);
    for (uint32_t k = 0; k < cap && step(items, n, p, cur, load); k++) {
    }
    vd.max_after_s = load[most_loaded(load, p->ranks)] * p->s_per_token;
    vd.gain_s = vd.max_before_s - vd.max_after_s;
    uint32_t moved = 0;
    for (size_t i = 0; i < n; i++)
        if (cur[i] != items[i].rank) {
            moved++;
            out[items[i].rank] += items[i].bytes;
            in[cur[i]] += items[i].bytes;
        }
    double link = 0;
    for (uint32_t r = 0; r < p->ranks; r++)
        if (out[r] + in[r] > link)
            link = out[r] + in[r];
    vd.transfer_s = link * p->move_s_per_B;
    vd.cost_s = vd.transfer_s > p->slack_s ? vd.transfer_s - p->slack_s : 0;
    vd.applied = moved > 0 && vd.gain_s - vd.cost_s > p->min_gain * vd.max_before_s;
    vd.moved = vd.applied ? moved : 0;
    for (size_t i = 0; i < n; i++)
        new_rank[i] = vd.applied ? cur[i] : items[i].rank;
    *v = vd;
    dh_free(load);
    dh_free(cur);
    return 0;
}
