/* plan_share.c: a rank's share of a step (plan.h, docs/planner.md): one step's plan per
 * share mode, the window planner that spreads a window of steps' samples over steps and
 * ranks, and the rows one rank gets from a sampler's step (dh_plan_rank_share,
 * dh_plan_step_share). Pure: no I/O, clocks or threads.
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
    dh__plan_sort_item_t *scratch = dh_malloc(n * sizeof *scratch);
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
    dh__plan_sort_desc(load, idx, n, scratch, order);
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
    dh__plan_sort_desc(bin_load, idx, bins, scratch, order); /* bins <= n: scratch and order fit */
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
