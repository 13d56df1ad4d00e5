/* cluster.h: the in-process cluster (docs/runtime.md, "In-process clusters"): a coordinator
 * (or an existing one joined) and a list of DataServers run as threads of this process on one
 * ZeroMQ context, made in one call, started coordinator first, and taken apart in the one safe
 * order (every server asked to stop before any is destroyed). The one way to embed a cluster
 * in a program: the embedded client (client.h), `bench`, `transport-bench` and the Python
 * extension's `_C.Cluster` (start_cluster) all start theirs through it.
 *
 * Ownership: the strings and the server list of a config are borrowed until dh_cluster_new
 * returns; the cluster and its parts are the caller's (dh_cluster_destroy); what the getters
 * return is borrowed for the cluster's life.
 * Errors: 0 or a negative dh_err_t; the message (dh_last_error) names the part that failed.
 * Threading: a cluster belongs to the thread that made it (_new, _start, _wait_registered,
 * _destroy); the coordinator and the servers it returns are thread-safe as runtime.h says
 * (their _stats from any thread). It runs no thread of its own beyond its parts'.
 */
#ifndef DATAHELIX_CLUSTER_H
#define DATAHELIX_CLUSTER_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#include "datahelix/place.h"
#include "datahelix/runtime.h"

/* One DataServer of a cluster (dh_cluster_server_default first: fields may be added). */
typedef struct dh_cluster_server {
    dh_ds_role_t role;          /* default DH_DS_LOCAL */
    const char *node;           /* required */
    const char *name;           /* NULL: the DataServer's default, NODE-ROLE-PID */
    uint32_t workers;           /* as given: 0 is a delivery-only local server (default 0) */
    uint64_t worker_cpus;       /* CPU mask of its workers (bit i = CPU i); 0 = any */
    uint64_t arena_bytes;       /* local: its arena; 0 = the memory budget (DH_ARENA_BUDGET) */
    double emulate_link_Bps;    /* emulated network to other nodes; 0 = off */
    const char *data_listen;    /* local: NULL = a unique inproc:// endpoint when the
                                 * coordinator's is inproc://, else the DataServer's default
                                 * (tcp://127.0.0.1:*) */
    const char *data_advertise; /* local: the data endpoint told to others (runtime.h); NULL:
                                 * the DataServer's default */
    const char *shm_allow_uids; /* local: other uids that may map its arena (runtime.h) */
} dh_cluster_server_t;

/* A cluster (dh_cluster_config_default first: fields may be added). */
typedef struct dh_cluster_config {
    void *zmq_ctx;          /* borrowed ZeroMQ context of every part; NULL: the cluster owns one */
    const char *listen;     /* the coordinator's endpoint to bind; NULL: a unique inproc:// */
    const char *advertise;  /* the coordinator's endpoint as the servers connect to it and
                             * dh_cluster_endpoint names it (a wildcard address bound: a
                             * routable one); NULL: the endpoint bound */
    const char *join;       /* an existing coordinator's endpoint: none is started, the servers
                             * register with it (listen, advertise, policy, dead_after_ms
                             * unused) */
    dh_policy_t policy;     /* the coordinator's placement policy (default deadline) */
    uint32_t dead_after_ms; /* 0: the coordinator's default (1000) */
    const char *keys_dir;   /* CURVE on every tcp:// socket (NULL: plaintext) */
    const char *key_name;   /* this process's key in keys_dir (NULL: "server") */
    const char *pipeline_json;          /* every server's pipeline spec (wins over pipeline_path) */
    const char *pipeline_path;          /* both NULL: the video pipeline's defaults */
    const dh_cluster_server_t *servers; /* borrowed until dh_cluster_new returns */
    size_t n_servers;                   /* 0: a coordinator only */
} dh_cluster_config_t;

typedef struct dh_cluster dh_cluster_t;

/* Zeroes *cfg and sets the coordinator's default policy. Never fails. */
DH_EXTERN void dh_cluster_config_default(dh_cluster_config_t *cfg);

/* Zeroes *s and sets the defaults of one server (role DH_DS_LOCAL). Never fails. */
DH_EXTERN void dh_cluster_server_default(dh_cluster_server_t *s);

/* Makes the coordinator (unless cfg->join) and every server, in that order, binding their
 * sockets; starts no thread. Returns 0 with *out the caller's (dh_cluster_destroy), or the
 * first part's error (its message names it; DH_EINVAL: an unknown policy, a server without a
 * node, an endpoint too long; DH_ENOMEM) with *out NULL and nothing left. */
DH_EXTERN int dh_cluster_new(dh_cluster_t **out, const dh_cluster_config_t *cfg);

/* Starts the coordinator's thread, then each server's (a loop and its workers), so the
 * servers' HELLOs find it listening. Returns 0 or the first -errno (pthread_create); what
 * started is stopped by dh_cluster_destroy. Call once. */
DH_EXTERN int dh_cluster_start(dh_cluster_t *c);

/* Waits up to timeout_ms until `coordinator` (NULL: the cluster's own; a joining cluster
 * must name the one it joined, which must run in this process) has taken every server's
 * HELLO. Returns 0, or DH_EAGAIN naming the servers that did not register. Polls every
 * 5 ms; blocks the caller. */
DH_EXTERN int dh_cluster_wait_registered(const dh_cluster_t *c, const dh_coordinator_t *coordinator,
                                         uint32_t timeout_ms);

/* The coordinator's endpoint: cfg->advertise, else the one bound (a wildcard port
 * resolved), or cfg->join. Borrowed for the cluster's life. */
DH_EXTERN const char *dh_cluster_endpoint(const dh_cluster_t *c);

/* The cluster's coordinator, or NULL when it joined one. Borrowed for the cluster's life;
 * not to be destroyed or stopped by the caller. */
DH_EXTERN dh_coordinator_t *dh_cluster_coordinator(const dh_cluster_t *c);

/* The ZeroMQ context of every part (cfg->zmq_ctx or the cluster's own). Borrowed. */
DH_EXTERN void *dh_cluster_zmq_ctx(const dh_cluster_t *c);

/* The number of servers, and server i < dh_cluster_count (in cfg->servers' order).
 * Borrowed for the cluster's life; not to be destroyed by the caller. */
DH_EXTERN size_t dh_cluster_count(const dh_cluster_t *c);
DH_EXTERN dh_dataserver_t *dh_cluster_server(const dh_cluster_t *c, size_t i);

/* Asks every server to stop at once (none then waits to forward to one already gone),
 * destroys them, then the coordinator, then the context when it is the cluster's own;
 * frees and sets *c = NULL. Blocks until their threads have joined. Safe on NULL and on a
 * cluster that never started. */
DH_EXTERN void dh_cluster_destroy(dh_cluster_t **c);

#endif
