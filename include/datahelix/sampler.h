/* sampler.h: the seeded, epoch-aware sample order (docs/design.md §4.4). Pure.
 *
 * Epoch e is a permutation of 0..n-1 drawn from (seed, e) (or the identity when shuffle is
 * off). Global step s takes `per_step` consecutive ids of the stream of epochs: with
 * drop_last (the default), an epoch has floor(n / per_step) steps and its tail is not used;
 * the union of an epoch's steps over all ranks is then exactly the epoch's first steps x
 * per_step ids. Without drop_last (dh_sampler_set_drop_last), as torch's
 * DistributedSampler(drop_last=False): an epoch has ceil(n / per_step) steps; the last one
 * holds the epoch's tail of t = n mod per_step ids padded to ceil(t / ranks) x ranks ids with
 * the epoch's first ids (the pads, fewer than ranks, at the end of the step), so every rank
 * gets as many; every id of the epoch appears once, and the pads a second time.
 *
 * An elastic resume (dh_sampler_set_start) cuts one epoch from a sample offset P instead:
 * its step k is the ids [P + k x per_step, P + (k+1) x per_step) of its permutation (the
 * windows an uninterrupted run with this per_step would have from P), its tail what is left
 * after the last of them, under the same drop_last rule; the ids before P are in none of its
 * steps. The epochs after it are cut as usual, their global steps following its own.
 */
#ifndef DATAHELIX_SAMPLER_H
#define DATAHELIX_SAMPLER_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_sampler dh_sampler_t;

/* Creates a sampler over n samples (n > 0), `per_step` ids per global step
 * (0 < per_step <= n). Returns 0, DH_EINVAL or DH_ENOMEM. *out is the caller's. */
DH_EXTERN int dh_sampler_new(dh_sampler_t **out, size_t n, size_t per_step, uint64_t seed,
                             int shuffle);
DH_EXTERN void dh_sampler_destroy(dh_sampler_t **sampler);

/* drop_last 1 (the default of dh_sampler_new): an epoch's tail that does not fill a step is
 * not used. 0: it is the epoch's last step, padded for `ranks` ranks (see above). Call before
 * the first step. Returns 0, or DH_EINVAL when per_step is not a multiple of ranks (or ranks
 * is 0). */
DH_EXTERN int dh_sampler_set_drop_last(dh_sampler_t *sampler, int drop_last, uint32_t ranks);

/* Cuts epoch `epoch` from sample `first_sample` (0..n) of its order (see above): it then has
 * floor((n - first_sample) / per_step) steps (ceil without drop_last; 0 when nothing fills
 * one), and epoch e > `epoch` starts at global step e x steps_per_epoch - steps_per_epoch +
 * that. 0 undoes it. One epoch at a time (a new call replaces the last); call before the
 * first step. Returns 0, or DH_EINVAL for first_sample > n or an epoch too far to number
 * its steps. */
DH_EXTERN int dh_sampler_set_start(dh_sampler_t *sampler, uint64_t epoch, size_t first_sample);

/* Steps in one epoch (floor(n / per_step); ceil without drop_last): every epoch's but one
 * cut by dh_sampler_set_start. */
DH_EXTERN size_t dh_sampler_steps_per_epoch(const dh_sampler_t *sampler);

/* Steps in epoch `epoch` (dh_sampler_steps_per_epoch, or its own when cut from a sample). */
DH_EXTERN size_t dh_sampler_epoch_steps(const dh_sampler_t *sampler, uint64_t epoch);

/* The global step of epoch `epoch`'s first step (epoch x steps_per_epoch, moved by a cut
 * epoch before it). */
DH_EXTERN uint64_t dh_sampler_epoch_first_step(const dh_sampler_t *sampler, uint64_t epoch);

/* The epoch of global step `step`, and (index not NULL) its index in that epoch. */
DH_EXTERN uint64_t dh_sampler_step_epoch(const dh_sampler_t *sampler, uint64_t step, size_t *index);

/* The ids of global step `step`: per_step, except an epoch's padded tail step (drop_last 0,
 * n not a multiple of per_step): a multiple of ranks, less than per_step. */
DH_EXTERN size_t dh_sampler_step_size(const dh_sampler_t *sampler, uint64_t step);

/* How many of step `step`'s ids are pads (its last ones): 0 but in a padded tail step. */
DH_EXTERN size_t dh_sampler_step_pads(const dh_sampler_t *sampler, uint64_t step);

/* Writes the dh_sampler_step_size ids (at most per_step) of global step `step` (counted from
 * epoch 0; its epoch dh_sampler_step_epoch, step / steps_per_epoch when no epoch is cut
 * from a sample) into ids. Returns 0 or DH_ENOMEM (building a new epoch's
 * permutation; the current implementation allocates its buffer in dh_sampler_new, so it
 * always returns 0). Not const: caches the current epoch's permutation, rebuilt in O(n) when
 * the epoch changes (so steps are best asked in order). One thread at a time. */
DH_EXTERN int dh_sampler_step(dh_sampler_t *sampler, uint64_t step, uint32_t *ids);

#ifdef __cplusplus
}
#endif
#endif
