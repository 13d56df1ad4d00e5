/* runtime/runtime_lib.h: what other modules of the library use of the runtime beyond
 * include/datahelix/runtime.h (docs/conventions.md, "Names"): the in-process cluster
 * (cluster_start.c), the one way this library starts a coordinator and DataServers as threads of
 * one process: the embedded client (client.c), `bench` (bench/train_cluster.c) and
 * `transport-bench` (bench/transport_bench.c).
 */
#ifndef DH_RUNTIME_LIB_H
#define DH_RUNTIME_LIB_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/place.h"
#include "datahelix/runtime.h"

/* One DataServer of a cluster. The strings are borrowed until dh__cluster_new returns. */
typedef struct dh__cluster_server {
    dh_ds_role_t role;
    const char *node;        /* required */
    const char *name;        /* NULL: the DataServer's default, NODE-ROLE-PID */
    uint32_t workers;        /* as given: 0 is a delivery-only local server */
    uint64_t worker_cpus;    /* CPU mask of its workers (bit i = CPU i); 0 = any */
    uint64_t arena_bytes;    /* local: its arena; 0 = the memory budget (the caller sizes it) */
    double emulate_link_Bps; /* emulated network to other nodes; 0 = off */
    const char *data_listen; /* local: NULL = a unique inproc:// endpoint when the
                              * coordinator's is inproc://, else the DataServer's default
                              * (tcp://127.0.0.1:*) */
} dh__cluster_server_t;

typedef struct dh__cluster_config {
    void *zmq_ctx;          /* borrowed ZeroMQ context of every part; NULL: the cluster owns one */
    const char *listen;     /* the coordinator's endpoint to bind; NULL: a unique inproc:// */
    const char *join;       /* an existing coordinator's endpoint: none is started, the servers
                             * register with it (listen, policy, dead_after_ms unused) */
    dh_policy_t policy;     /* the coordinator's placement policy (default deadline) */
    uint32_t dead_after_ms; /* 0: the coordinator's default (1000) */
    const char *keys_dir;   /* CURVE on every tcp:// socket (NULL: plaintext) */
    const char *key_name;   /* this process's key in keys_dir (NULL: "server") */
    const char *pipeline_json; /* every server's pipeline spec (wins over pipeline_path) */
    const char *pipeline_path; /* both NULL: the video pipeline's defaults */
    const dh__cluster_server_t *servers; /* borrowed until dh__cluster_new returns */
    size_t n_servers;
} dh__cluster_config_t;

typedef struct dh__cluster dh__cluster_t;

/* Zeroes *cfg and sets the coordinator's default policy. */
void dh__cluster_config_default(dh__cluster_config_t *cfg);

/* Makes the coordinator (unless cfg->join) and every server, in that order, binding their
 * sockets; starts no thread. Returns 0, or the first part's error (its message names it;
 * DH_EINVAL: an unknown policy or a server without a node; DH_ENOMEM) with nothing left.
 * *out is the caller's (dh__cluster_destroy). */
int dh__cluster_new(dh__cluster_t **out, const dh__cluster_config_t *cfg);

/* Starts the coordinator's thread, then each server's (a loop and its workers), so the
 * servers' HELLOs find it listening. Returns 0 or the first -errno (pthread_create); what
 * started is stopped by dh__cluster_destroy. */
int dh__cluster_start(dh__cluster_t *c);

/* Waits up to timeout_ms until `coordinator` (NULL: the cluster's own; a joining cluster
 * must name the one it joined, which must run in this process) has taken every server's
 * HELLO. Returns 0, or DH_EAGAIN naming the servers that did not register. Polls every
 * 5 ms. */
int dh__cluster_wait_registered(const dh__cluster_t *c, const dh_coordinator_t *coordinator,
                                uint32_t timeout_ms);

/* The coordinator's endpoint: the one bound (a wildcard port resolved), or cfg->join.
 * Borrowed for the cluster's life. */
const char *dh__cluster_endpoint(const dh__cluster_t *c);

/* The cluster's coordinator, or NULL when it joined one. Borrowed. */
dh_coordinator_t *dh__cluster_coordinator(const dh__cluster_t *c);

/* The ZeroMQ context of every part (cfg->zmq_ctx or the cluster's own). Borrowed. */
void *dh__cluster_zmq_ctx(const dh__cluster_t *c);

/* The number of servers, and server i (in cfg->servers' order). Borrowed. */
size_t dh__cluster_count(const dh__cluster_t *c);
dh_dataserver_t *dh__cluster_server(const dh__cluster_t *c, size_t i);

/* Asks every server to stop at once (none then waits to forward to one already gone),
 * destroys them, then the coordinator, then the context when it is the
 * cluster's own; frees and sets *c = NULL. Safe on NULL and on a cluster that never
 * started. */
void dh__cluster_destroy(dh__cluster_t **c);

#endif
