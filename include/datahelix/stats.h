/* stats.h: percentiles and summary statistics over samples of doubles.
 *
 * A dh_stats_t collects values (amortised O(1) append) and answers percentiles by sorting a
 * copy once (O(n log n)), cached until the next append. One thread at a time.
 */
#ifndef DATAHELIX_STATS_H
#define DATAHELIX_STATS_H

#include "datahelix/export.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dh_stats dh_stats_t;

/* Creates an empty collector. Returns 0 or DH_ENOMEM. *out is the caller's. */
DH_EXTERN int dh_stats_new(dh_stats_t **out);
DH_EXTERN void dh_stats_destroy(dh_stats_t **stats);

/* Appends one value. Returns 0 or DH_ENOMEM (the collector is unchanged then). */
DH_EXTERN int dh_stats_add(dh_stats_t *stats, double value);

DH_EXTERN size_t dh_stats_count(const dh_stats_t *stats);
DH_EXTERN double dh_stats_mean(const dh_stats_t *stats); /* 0 when empty */
DH_EXTERN double dh_stats_max(const dh_stats_t *stats);  /* 0 when empty */

/* The p-th percentile (0 <= p <= 100), linear interpolation between closest ranks
 * (numpy's default). 0 when empty. Sorts lazily, hence not const. */
DH_EXTERN double dh_stats_percentile(dh_stats_t *stats, double p);

/* Percentile of a plain array, which is sorted in place. 0 when n == 0. */
DH_EXTERN double dh_percentile_sorted_inplace(double *values, size_t n, double p);

#ifdef __cplusplus
}
#endif
#endif
