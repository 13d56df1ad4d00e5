/* client_plan.c: the client's planning calls: the rows a rank gets at a step (the tier-1
 * rule of src/sched under the client's config, docs/planner.md) and the pads of an epoch's
 * last step (keep_tail, "The epoch's tail"). */
#include <pthread.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/sampler.h"
#include "runtime/client_internal.h"

/* The profile rows `rank` gets at `step`, in window order (dh_plan_rank_share under the
 * client's config). Returns the count or < 0. */
int dh__client_plan_rank_step(dh_client_t *c, dh_sampler_t *sampler, uint64_t step, uint32_t rank,
                              uint32_t *rows, size_t cap)
{
    dh_share_config_t sc = {.mode = c->cfg.token_plan,
                            .algo = c->cfg.plan_algo,
                            .ranks = c->cfg.ranks,
                            .batch = c->cfg.batch,
                            .min_rows = dh__client_slots(c) ? 1 : c->cfg.fanout,
                            .window_steps = c->cfg.plan_window};
    return dh_plan_rank_share(&sc, sampler, c->profiles, step, rank, rows, cap);
}

int dh_client_plan_rank_step(dh_client_t *c, uint64_t step, uint32_t rank, uint32_t *rows,
                             size_t cap)
{
    if (rank >= c->cfg.ranks)
        return dh__set_error(DH_EINVAL, "rank %u >= ranks %u", rank, c->cfg.ranks);
    pthread_mutex_lock(&c->plan_lock);
    int rc = dh__client_plan_rank_step(c, c->plan_sampler, step, rank, rows, cap);
    pthread_mutex_unlock(&c->plan_lock);
    return rc;
}

/* Marks the pads of an epoch's last step (keep_tail) among a batch's samples: the step's
 * last dh_sampler_step_pads ids are repeats of the epoch's first samples, which no other row
 * of that step holds (the step is not the epoch's first: n >= ranks x batch), so each pad is
 * the sample of its id. By id, not by row: the parts of a batch (fanout) come back in their
 * own order. Costs one sampler step, once per epoch. Returns 0 or DH_ENOMEM. */
int dh__client_mark_pads(dh_client_t *c, uint64_t step, dh_client_sample_t *samples, size_t n)
{
    pthread_mutex_lock(&c->plan_lock);
    size_t pads = dh_sampler_step_pads(c->plan_sampler, step);
    size_t size = dh_sampler_step_size(c->plan_sampler, step);
    uint32_t *ids = pads ? dh_malloc(size * sizeof *ids) : NULL;
    int rc = pads && !ids ? dh__set_error(DH_ENOMEM, "out of memory marking a step's pads") : 0;
    if (ids && (rc = dh_sampler_step(c->plan_sampler, step, ids)) == 0)
        for (size_t k = size - pads; k < size; k++) {
            const char *id = dh_profile_set_row(c->profiles, ids[k])->id;
            for (size_t i = 0; i < n; i++)
                if (!samples[i].padded && samples[i].id && strcmp(samples[i].id, id) == 0) {
                    samples[i].padded = 1;
                    break;
                }
        }
    pthread_mutex_unlock(&c->plan_lock);
    dh_free(ids);
    return rc;
}
