/* runtime/coordinator_metrics.h: the coordinator's Prometheus metrics (coordinator_metrics.c),
 * called from its loop thread. Every function is a no-op on a coordinator without
 * `metrics_listen` (c->metrics NULL).
 */
#ifndef DH_RUNTIME_COORDINATOR_METRICS_H
#define DH_RUNTIME_COORDINATOR_METRICS_H

#include "datahelix/place.h"
#include "datahelix/runtime.h"

/* Makes the registry and serves it on `listen` (HOST:PORT). 0, or what
 * dh__metrics_http_start returns (DH_EINVAL, -errno, DH_ENOMEM). Caller's thread, in _new. */
int dh__coord_metrics_start(dh_coordinator_t *c, const char *listen);

/* Stops serving and frees (before the coordinator's state goes). Safe when not started. */
void dh__coord_metrics_destroy(dh_coordinator_t *c);

/* One placement decision: rc from dh_place, d its decision (a predicted deadline miss when
 * the chosen server's miss_s > 0). */
void dh__coord_metrics_decision(dh_coordinator_t *c, int rc, const dh_decision_t *d);

/* A heartbeat from a server whose previous message came gap_s seconds ago. */
void dh__coord_metrics_heartbeat(dh_coordinator_t *c, double gap_s);

/* An executed request's predicted and actual costs (the record the coordinator keeps). */
void dh__coord_metrics_prediction(dh_coordinator_t *c, const dh_prediction_t *p);

/* The loop's tick: the servers' book (queue depth, queued work), speed, liveness. */
void dh__coord_metrics_tick(dh_coordinator_t *c);

#endif
