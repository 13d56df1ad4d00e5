/* deadline.h: when a rank needs its next batches, and how far ahead to ask for them
 * (docs/design.md §4.2). Pure: the caller measures the clock and passes seconds in.
 *
 * A batch's compute window is predicted from its tokens (seconds per token, measured) or,
 * without that, from the mean measured window. The deadline D(b) of batch b is what is left
 * of the current window plus the predicted windows of the batches between. The adaptive
 * prefetch rule deepens the horizon of batches requested ahead when the rank waits.
 */
#ifndef DATAHELIX_DEADLINE_H
#define DATAHELIX_DEADLINE_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the client has measured of its rank's compute. */
typedef struct dh_deadline_model {
    double s_per_token;    /* seconds of compute per token (EWMA); <= 0 = not measured */
    double mean_window_s;  /* mean compute window between two next() calls (EWMA) */
    const int64_t *tokens; /* ring of the planned batches' tokens: batch b at b % n_tokens */
    size_t n_tokens;       /* > 0 */
} dh_deadline_model_t;

/* Predicted compute seconds of batch b: s_per_token x its tokens when both are > 0, else
 * mean_window_s. */
DH_EXTERN double dh_deadline_compute_s(const dh_deadline_model_t *m, uint64_t b);

/* D(b): seconds until the rank calls next() for batch b, given that `consumed` batches were
 * returned, the last one elapsed_s ago: the predicted window of batch consumed-1 less
 * elapsed_s (at least 0), plus the predicted windows of batches consumed..b-1. 0 before the
 * first return (consumed 0) and for a batch already due (b < consumed). */
DH_EXTERN double dh_deadline_s(const dh_deadline_model_t *m, uint64_t b, uint64_t consumed,
                               double elapsed_s);

/* Adaptive prefetch: the horizon after next() returned batch `batch`. Doubles `horizon` (up
 * to max) when, in steady state (batch >= horizon), with a compute window known
 * (window_s > 0) and the local arena under half full (arena_used < 0.5), next() waited more
 * than 1% of the window (waited_s) or the batch arrived less than a window before it was
 * asked for (slack_s < window_s). Else, or when max <= horizon, returns horizon. */
DH_EXTERN uint32_t dh_deadline_prefetch_horizon(uint32_t horizon, uint32_t max, uint64_t batch,
                                                double waited_s, double slack_s, double window_s,
                                                double arena_used);

#ifdef __cplusplus
}
#endif
#endif
