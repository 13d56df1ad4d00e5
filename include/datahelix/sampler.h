/* sampler.h: the seeded, epoch-aware sample order (docs/design.md §4.4). Pure.
 *
 * Epoch e is a permutation of 0..n-1 drawn from (seed, e) (or the identity when shuffle is
 * off). Global step s takes `per_step` consecutive ids of the stream of epochs: with
 * drop_last, an epoch has floor(n / per_step) steps and its tail is not used; the union of
 * an epoch's steps over all ranks is then exactly the epoch's first steps x per_step ids.
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

/* Steps in one epoch (floor(n / per_step)). */
DH_EXTERN size_t dh_sampler_steps_per_epoch(const dh_sampler_t *sampler);

/* Writes the per_step ids of global step `step` (counted from epoch 0; epoch =
 * step / steps_per_epoch) into ids. Returns 0 or DH_ENOMEM (building a new epoch's
 * permutation; the current implementation allocates its buffer in dh_sampler_new, so it
 * always returns 0). Not const: caches the current epoch's permutation, rebuilt in O(n) when
 * the epoch changes (so steps are best asked in order). One thread at a time. */
DH_EXTERN int dh_sampler_step(dh_sampler_t *sampler, uint64_t step, uint32_t *ids);

#ifdef __cplusplus
}
#endif
#endif
