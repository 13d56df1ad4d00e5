/* runtime/dataserver_metrics.h: the DataServer's Prometheus metrics (dataserver_metrics.c).
 * Every function is a no-op on a DataServer without `metrics_listen` (s->metrics NULL).
 */
#ifndef DH_RUNTIME_DATASERVER_METRICS_H
#define DH_RUNTIME_DATASERVER_METRICS_H

#include "datahelix/runtime.h"

struct task;

/* Makes the registry and serves it on `listen` (HOST:PORT). 0, or what
 * dh__metrics_http_start returns (DH_EINVAL, -errno, DH_ENOMEM). Caller's thread, in _new. */
int dh__ds_metrics_start(dh_dataserver_t *s, const char *listen);

/* Stops serving and frees (before the server's state goes). Safe when not started. */
void dh__ds_metrics_destroy(dh_dataserver_t *s);

/* A task its worker finished (loop thread): its measured against predicted CPU seconds. */
void dh__ds_metrics_task(dh_dataserver_t *s, const struct task *t);

/* The loop's state (loop thread, each turn of the loop): queue depth and queued work. */
void dh__ds_metrics_tick(dh_dataserver_t *s);

#endif
