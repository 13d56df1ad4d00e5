/* rebalance.c: tier 2's default assignment policy and its cost gate (see rebalance.h). */
#include <math.h>
#include <stdbool.h>
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

typedef struct ranked {
    double tokens;
    size_t index;
} ranked_t;

static int by_tokens_desc(const void *a, const void *b)
{
    const ranked_t *x = a, *y = b;
    if (x->tokens != y->tokens)
        return x->tokens > y->tokens ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The second candidate of keep_counts: longest-processing-time first from scratch (each item,
 * largest first, to the least loaded rank with room left; a rank keeps its count), its bins
 * then given to ranks of the same count so as to keep most items where they are, then the
 * same improving swaps. It replaces cur when its largest rank is lower (equal: when it
 * moves fewer items). The greedy swaps alone stop at a local optimum when a few large
 * items sit on the most loaded ranks; LPT does not. */
static void try_lpt(const dh_rebalance_item_t *items, size_t n, const dh_rebalance_params_t *p,
                    uint32_t *cur, double *load)
{
    uint32_t R = p->ranks;
    ranked_t *order = dh_calloc(n, sizeof *order);
    uint32_t *bin = dh_calloc(n, sizeof *bin), *alt = dh_calloc(n, sizeof *alt);
    uint32_t *room = dh_calloc(R, sizeof *room), *count = dh_calloc(R, sizeof *count);
    uint32_t *rank_of_bin = dh_calloc(R, sizeof *rank_of_bin);
    uint32_t *overlap = dh_calloc((size_t)R * R, sizeof *overlap);
    bool *bin_done = dh_calloc(R, sizeof *bin_done), *rank_done = dh_calloc(R, sizeof *rank_done);
    double *bl = dh_calloc(R, sizeof *bl);
    if (!order || !bin || !alt || !room || !count || !rank_of_bin || !overlap || !bin_done ||
        !rank_done || !bl)
        goto done; /* no memory for the second candidate: the first stands */
    for (size_t i = 0; i < n; i++) {
        order[i] = (ranked_t){items[i].tokens, i};
        count[items[i].rank]++;
    }
    memcpy(room, count, R * sizeof *room);
    qsort(order, n, sizeof *order, by_tokens_desc);
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k].index;
        uint32_t best = R;
        for (uint32_t r = 0; r < R; r++)
            if (room[r] && (best == R || bl[r] < bl[best]))
                best = r;
        bin[i] = best;
        room[best]--;
        bl[best] += items[i].tokens;
        overlap[(size_t)best * R + items[i].rank]++;
    }
    /* bins to ranks of the same count, the largest overlap first */
    for (uint32_t done = 0; done < R; done++) {
        uint32_t bb = R, br = R, most = 0;
        for (uint32_t b = 0; b < R; b++)
            for (uint32_t r = 0; !bin_done[b] && r < R; r++)
                if (!rank_done[r] && count[b] == count[r] &&
                    (bb == R || overlap[(size_t)b * R + r] > most)) {
                    bb = b;
                    br = r;
                    most = overlap[(size_t)b * R + r];
                }
        if (bb == R)
            goto done; /* cannot happen: bin b has rank b's count */
        bin_done[bb] = rank_done[br] = true;
        rank_of_bin[bb] = br;
    }
    memset(bl, 0, R * sizeof *bl);
    for (size_t i = 0; i < n; i++) {
        alt[i] = rank_of_bin[bin[i]];
        bl[alt[i]] += items[i].tokens;
    }
    for (size_t k = 0; k < n && step(items, n, p, alt, bl); k++) {
    }
    double now = load[most_loaded(load, R)], cand = bl[most_loaded(bl, R)];
    size_t moves_now = 0, moves_cand = 0;
    for (size_t i = 0; i < n; i++) {
        moves_now += cur[i] != items[i].rank;
        moves_cand += alt[i] != items[i].rank;
    }
    if (cand < now || (cand == now && moves_cand < moves_now)) {
        memcpy(cur, alt, n * sizeof *cur);
        memcpy(load, bl, R * sizeof *load);
    }
done:
    dh_free(order);
    dh_free(bin);
    dh_free(alt);
    dh_free(room);
    dh_free(count);
    dh_free(rank_of_bin);
    dh_free(overlap);
    dh_free(bin_done);
    dh_free(rank_done);
    dh_free(bl);
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
    if (p->keep_counts && !p->max_moves && n > 1)
        try_lpt(items, n, p, cur, load);
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
