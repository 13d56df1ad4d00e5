/* runtime.h: the coordinator and the DataServer (docs/design.md §2, §5; docs/runtime.md).
 *
 * Both are objects that own one event-loop thread and its ZeroMQ sockets. The `datahelix
 * coordinator` and `datahelix server` commands run one each on the main thread
 * (dh_*_run); embedded mode (client.h) and the benchmarks start them as threads of their own
 * process (dh_*_start) on a shared ZeroMQ context with inproc:// or tcp:// endpoints.
 *
 *   client --REQUEST--> coordinator --DISPATCH--> DataServer (executes) --DELIVER--> ...
 *     local target:  the executing server is the rank's local DataServer: it writes the
 *                    tensors into its shared-memory arena and sends the client a DELIVER of
 *                    handles (no payload on any socket);
 *     remote target: a sidecar sends DELIVER with the tensor frames (zero-copy) to the rank's
 *                    local DataServer, which copies them into its arena once and notifies
 *                    the client the same way.
 *   Every executor sends COMPLETE (measured cost) to the coordinator; the delivering local
 *   DataServer sends COMPLETE with delivered=1 once the client has the batch, which ends the
 *   request in the coordinator's book. A server that stops heartbeating is declared dead and
 *   every request in the book that it had not delivered is placed again; the client drops
 *   the duplicates that a late or revived server still delivers.
 *
 * Threading: _new, _destroy and _start belong to the caller's thread; _stop may be called
 * from any thread and from a signal handler (one atomic store). _run blocks the caller.
 */
#ifndef DATAHELIX_RUNTIME_H
#define DATAHELIX_RUNTIME_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#include "datahelix/place.h"
#include "datahelix/shm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- coordinator ---------------------------------------------------------------------- */

typedef struct dh_coordinator dh_coordinator_t;

typedef struct dh_coordinator_config {
    const char *listen;         /* endpoint to bind ("tcp://127.0.0.1:5555", "ipc:///x",
                                 * "inproc://x"; "tcp://127.0.0.1:*" picks a free port) */
    dh_place_config_t place;    /* policy and hysteresis (dh_place_config_default) */
    uint32_t dead_after_ms;     /* a server silent this long is declared dead (1000) */
    uint32_t queue_cap;         /* requests per worker slot before backpressure (4; 0 = none) */
    const char *telemetry_path; /* JSONL of every decision, or NULL */
    const char *metrics_listen; /* HOST:PORT to serve Prometheus metrics on (GET /metrics;
                                 * port 0 = a free one: dh_coordinator_metrics_port), or
                                 * NULL = none (docs/operations.md, "Metrics") */
    double default_link_Bps;    /* bandwidth between nodes before any estimate (1.25e9) */
    double default_latency_s;   /* one-way latency between nodes (100e-6) */
    void *zmq_ctx;              /* borrowed ZeroMQ context, or NULL for an own one */
    const char *keys_dir;       /* CURVE key directory (wire.h "Authentication",
                                 * docs/security.md): a tcp:// listen endpoint admits only its
                                 * listed keys; NULL = plaintext, anyone admitted */
    const char *key_name;       /* this process's key in keys_dir (NULL = "server") */
    double fetch_latency_s;     /* the fetch model's prior (docs/profiles.md, "The fetch
                                 * model"): a remote sample's fetch latency before any
                                 * completion teaches it (0.05; <= 0: the default) */
    double fetch_bytes_per_s;   /* ... and its bandwidth (100e6; <= 0: the default) */
} dh_coordinator_config_t;

/* Fills *cfg with the defaults above (listen NULL: must be set). */
DH_EXTERN void dh_coordinator_config_default(dh_coordinator_config_t *cfg);

/* Makes a coordinator and binds its socket. Returns 0, DH_EINVAL (no endpoint), -errno with
 * a message naming the endpoint (cannot bind: -EADDRINUSE ...), -errno naming the telemetry
 * file, DH_EINVAL or -errno naming metrics_listen (not HOST:PORT, cannot bind), or DH_ENOMEM. *out
 * is the caller's (dh_coordinator_destroy). */
DH_EXTERN int dh_coordinator_new(dh_coordinator_t **out, const dh_coordinator_config_t *cfg);

/* The endpoint actually bound (a wildcard port resolved). Borrowed. */
DH_EXTERN const char *dh_coordinator_endpoint(const dh_coordinator_t *c);

/* The TCP port its metrics are served on (metrics_listen), or 0 when it serves none. */
DH_EXTERN uint16_t dh_coordinator_metrics_port(const dh_coordinator_t *c);

/* Runs the event loop on the calling thread until dh_coordinator_stop. Returns 0 or a
 * negative code for a fatal socket error (logged). */
DH_EXTERN int dh_coordinator_run(dh_coordinator_t *c);

/* Runs the loop on a new thread. Returns 0 or -errno (pthread_create). */
DH_EXTERN int dh_coordinator_start(dh_coordinator_t *c);

/* Asks the loop to stop (async-signal-safe). */
DH_EXTERN void dh_coordinator_stop(dh_coordinator_t *c);

/* Stops and joins a started thread, closes the sockets, frees; sets *c = NULL. Safe on NULL. */
DH_EXTERN void dh_coordinator_destroy(dh_coordinator_t **c);

typedef struct dh_coordinator_stats {
    uint64_t requests, dispatches, redispatches, completes, delivered, decisions;
    uint64_t servers_alive, servers_dead_declared, clients;
    uint64_t rebalance_rounds; /* tier-2 rounds gathered and sent to their members */
    double sched_s;            /* time deciding placements (refreshing the changed servers'
                                * states, then the decision), total */
} dh_coordinator_stats_t;

/* A snapshot of the counters. Thread-safe. */
DH_EXTERN void dh_coordinator_stats(const dh_coordinator_t *c, dh_coordinator_stats_t *out);

/* Predicted against actual, per executed request (docs/design.md §4.1, "Online feedback").
 * At placement the coordinator records the request's predicted CPU seconds on the chosen
 * server (its cost model's prediction x that server's speed factor: C_cpu) and predicted
 * ready time T; at the executor's COMPLETE, the CPU seconds it measured for the request and
 * the seconds from the DISPATCH to that COMPLETE (a sidecar sends it when the task is done,
 * before forwarding; a local executor once its client has the batch). A request placed again (a
 * dead server) records its last placement. Relative error: |pred_cpu_s - actual_cpu_s| /
 * actual_cpu_s. */
typedef struct dh_prediction {
    uint32_t rank;         /* the requesting rank */
    uint64_t seq;          /* the client's request seq (batch x fanout + part) */
    uint32_t n_samples;    /* samples in the request */
    uint32_t server;       /* index of the executor in registration order */
    double deadline_s;     /* D at the decision */
    double pred_cpu_s;     /* C_cpu predicted at the decision */
    double profile_cpu_s;  /* the descriptors' cpu_s summed: the prediction with nothing
                            * learned (neither keys nor speed), for comparison */
    double actual_cpu_s;   /* measured by the executor */
    double pred_ready_s;   /* T predicted at the decision */
    double actual_ready_s; /* DISPATCH to the executor's COMPLETE, on the coordinator's clock */
    double pred_fetch_s;   /* the chosen server's predicted fetch of the request's remote
                            * samples (part of pred_ready_s; 0 for local files) */
    double fetch_s;        /* the executor's reported fetch: its samples' fetch_s summed */
    uint64_t fetch_bytes;  /* the bytes it fetched for them */
} dh_prediction_t;

/* The most records a coordinator keeps; past it the oldest are overwritten. */
#define DH_COORDINATOR_PREDICTIONS_MAX 65536

/* Copies the kept records, oldest first, into out[0 .. min(cap, kept)) (out may be NULL when
 * cap is 0) and returns how many are kept (at most DH_COORDINATOR_PREDICTIONS_MAX).
 * Thread-safe: may be called while the coordinator runs. */
DH_EXTERN size_t dh_coordinator_predictions(const dh_coordinator_t *c, dh_prediction_t *out,
                                            size_t cap);

/* The coordinator's learned state of the cost model, for tests and reports: the ratio
 * (measured / estimated CPU, speed 1) learned for a profile key (NAN if none) with the
 * observations behind it in *obs (may be NULL). Thread-safe (takes the coordinator's lock;
 * call it while the loop runs or after). */
DH_EXTERN double dh_coordinator_key_ratio(const dh_coordinator_t *c, const char *profile_key,
                                          uint64_t *obs);

/* ---- DataServer ----------------------------------------------------------------------- */

typedef struct dh_dataserver dh_dataserver_t;

typedef enum { DH_DS_LOCAL = 0, DH_DS_REMOTE = 1 } dh_ds_role_t;

typedef struct dh_dataserver_config {
    const char *coordinator; /* coordinator endpoint (required) */
    dh_ds_role_t role;
    const char *node;           /* node name (required) */
    const char *name;           /* server name; NULL = "<node>-<local|remote>-<pid>" */
    uint32_t workers;           /* worker threads; 0 (local role only) = delivery only: the
                                 * server maps its arena for its node's ranks and receives
                                 * what sidecars forward, but executes nothing */
    const char *pipeline_path;  /* pipeline spec JSON (docs/runtime.md), NULL = video defaults */
    const char *pipeline_json;  /* or the spec text itself (wins over pipeline_path) */
    uint64_t arena_bytes;       /* local: shared-memory arena size; 0 (default) = the
                                 * memory budget (a sparse memfd: it costs memory only as
                                 * far as batches fill it, and each rank's prefetch stays
                                 * within its share, docs/runtime.md) */
    const char *data_listen;    /* local: endpoint clients and sidecars connect to
                                 * ("tcp://127.0.0.1:*"; tcp://0.0.0.0:PORT for every
                                 * interface) */
    const char *data_advertise; /* local: what the coordinator tells clients and sidecars to
                                 * connect to: an endpoint, or a host (the bound port kept).
                                 * NULL: the bound endpoint, its wildcard host replaced by
                                 * this machine's address on the route to the coordinator
                                 * (docs/multinode.md) */
    uint32_t heartbeat_ms;      /* heartbeat period (100) */
    void *zmq_ctx;              /* borrowed ZeroMQ context, or NULL for an own one */
    uint64_t worker_cpus;       /* CPUs (bit i = CPU i) the workers are pinned to; 0 = any.
                                 * Rank-local loaders of `datahelix bench` use it to give
                                 * each rank only its share of the machine */
    double emulate_link_Bps;    /* emulated network (0 = off, the default): a delivery this
                                 * server forwards to another node holds its link (one per
                                 * target) for emulated bytes / this seconds, one delivery
                                 * after another, and reaches the target only then. Emulated
                                 * bytes: payload bytes / the synthetic pipeline's bytes_scale
                                 * (the size the payload stands for; the payload itself for a
                                 * video pipeline). `datahelix bench` sets it (--link-gbps) */

    /* local: the memory the arena may take when arena_bytes is 0; 0 =
     * dh_arena_budget_default() */
    uint64_t arena_budget_bytes;
    const char *keys_dir; /* CURVE key directory: every tcp:// socket authenticated and
                           * encrypted, the data endpoint admitting only listed keys
                           * (docs/security.md); NULL = plaintext */
    const char *key_name; /* this process's key in keys_dir (NULL = "server") */

    /* local: uids, besides this process's effective uid, whose processes may get the
     * arena's memfd over the fd-passing socket: "UID[,UID...]" (at most 16). NULL = the
     * environment variable DH_SHM_ALLOW_UIDS, else none. A process of any other uid is
     * refused (SO_PEERCRED) and logged with its pid and uid (docs/shared-memory.md §3) */
    const char *shm_allow_uids;

    /* HOST:PORT to serve Prometheus metrics on (GET /metrics; port 0 = a free one:
     * dh_dataserver_metrics_port), or NULL = none (docs/operations.md, "Metrics") */
    const char *metrics_listen;

    /* The local cache of remote byte ranges (docs/remote.md, "The local cache"): a
     * directory (made if missing; several DataServers of a host may share it) and the bound
     * on its files' total size in bytes (at least 2 MiB: two 1 MiB blocks). Both, or
     * neither (NULL / 0: no cache). dh_dataserver_new checks that the directory can be made
     * and written; the remote reader that fills it is not wired in yet (docs/remote.md) */
    const char *cache_dir;
    uint64_t cache_bytes;
} dh_dataserver_config_t;

DH_EXTERN void dh_dataserver_config_default(dh_dataserver_config_t *cfg);

/* The default memory budget of an arena: DH_ARENA_BUDGET (bytes, or with a K, M or G
 * suffix: KiB, MiB, GiB) when set and valid (else a warning), otherwise a quarter of the
 * machine's physical memory, or of the process's memory cgroup limit when that is lower
 * (4 GiB where neither is known), and at most half of the memory available now
 * (MemAvailable + SwapFree), which a larger arena would be refused. */
DH_EXTERN uint64_t dh_arena_budget_default(void);

/* Parses a byte count: digits with an optional K, M or G suffix (KiB, MiB, GiB). Returns 0
 * and *out, or DH_EINVAL with a message naming `what` (zero, junk, overflow). */
DH_EXTERN int dh_arena_parse_bytes(const char *text, const char *what, uint64_t *out);

/* Makes a DataServer: loads the pipeline spec, checks the cache directory, makes the
 * arena (local), binds the data endpoint and the fd-passing socket (local), connects to the
 * coordinator, starts the workers, serves metrics_listen. Returns 0, DH_EINVAL / DH_ESCHEMA /
 * DH_EPARSE (bad config or spec: the message names the field or file), -errno (bind, memfd),
 * DH_ENOMEM (out of memory, or an arena this process cannot hold: the message names its size and
 * the limit), -EFBIG (an arena over RLIMIT_FSIZE), -errno naming a cache_dir that cannot be made or
 * written. *out is the caller's. */
DH_EXTERN int dh_dataserver_new(dh_dataserver_t **out, const dh_dataserver_config_t *cfg);

DH_EXTERN const char *dh_dataserver_name(const dh_dataserver_t *s);
/* Local role: the data endpoint actually bound; "" for a sidecar. Borrowed. */
DH_EXTERN const char *dh_dataserver_endpoint(const dh_dataserver_t *s);
/* The TCP port its metrics are served on (metrics_listen), or 0 when it serves none. */
DH_EXTERN uint16_t dh_dataserver_metrics_port(const dh_dataserver_t *s);

DH_EXTERN int dh_dataserver_run(dh_dataserver_t *s);
DH_EXTERN int dh_dataserver_start(dh_dataserver_t *s);
DH_EXTERN void dh_dataserver_stop(dh_dataserver_t *s);
DH_EXTERN void dh_dataserver_destroy(dh_dataserver_t **s);

typedef struct dh_dataserver_stats {
    uint64_t tasks, samples, sample_errors;
    uint64_t delivered_local;     /* batches placed in the arena by its own workers */
    uint64_t delivered_forwarded; /* batches received from sidecars, placed in the arena */
    uint64_t forwarded;           /* sidecar: batches sent to a local DataServer */
    uint64_t bytes_forwarded;     /* sidecar: payload bytes sent */
    uint64_t bytes_received;      /* local: payload bytes received from sidecars */
    uint64_t bytes_cross_node;    /* payload bytes forwarded to a DataServer of another node
                                   * (of bytes_forwarded) */
    uint64_t arena_waits;         /* times a batch waited for arena space (backpressure) */
    uint64_t undeliverable;       /* batches dropped because their client was gone */
    uint64_t arena_spills;        /* tensors sent by copy after the arena stayed full (see
                                     docs/shared-memory.md, "Full arena") */
    uint64_t rebalance_sent;      /* tier 2: parts its clients moved to another node (their
                                   * bytes are in bytes_forwarded and bytes_cross_node) */
    uint64_t output_waits;        /* tasks for another node that waited for the process's
                                   * output budget (DH_OUTPUT_BUDGET; docs/runtime.md) */
    double fetch_s;               /* seconds its workers waited for remote bytes (the samples'
                                   * fetch_s; 0 for local files; docs/remote.md) */
    uint64_t fetch_bytes;         /* bytes they fetched from remote sources */
} dh_dataserver_stats_t;

DH_EXTERN void dh_dataserver_stats(const dh_dataserver_t *s, dh_dataserver_stats_t *out);

/* Local role: a snapshot of its arena's allocations (dh_shm_arena_stats through a private
 * read-only view, so any thread may call it while the server runs): how many batches are
 * still held by clients. Returns 0, DH_EINVAL (a sidecar has no arena), or what attaching
 * returns (-errno, DH_ENOMEM). */
DH_EXTERN int dh_dataserver_arena_stats(const dh_dataserver_t *s, dh_shm_arena_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif
