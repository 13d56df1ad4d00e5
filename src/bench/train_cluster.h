/* bench/train_cluster.h: the in-process cluster of one `bench` system (train_bench.c): the
 * coordinator and the DataServers as threads of this process over inproc:// endpoints of
 * one ZeroMQ context (local delivery still goes through each local server's shared-memory
 * arena). Not thread-safe: the bench's main thread starts and stops it.
 */
#ifndef DH_BENCH_TRAIN_CLUSTER_H
#define DH_BENCH_TRAIN_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/cluster.h"
#include "datahelix/runtime.h"
#include "bench/experiment.h"

#define DH_BENCH_MAX_SERVERS 256

typedef struct dh_bench_cluster {
    dh_cluster_t *cluster;    /* the coordinator and the servers (include/datahelix/cluster.h) */
    void *ctx;                /* its ZeroMQ context, of every endpoint (borrowed) */
    dh_coordinator_t *coord;  /* its coordinator (borrowed) */
    uint32_t cores;           /* workers of every server */
    uint32_t arenas;          /* local DataServers (each has an arena) */
    uint32_t ranks_per_arena; /* the ranks each of them delivers to */
} dh_bench_cluster_t;

/* Starts the coordinator (placement sp->policy, dead after 10 s) and the system's DataServers
 * (rank-local: one per rank, the native budget split evenly; else opt's local servers and
 * remote sidecars), running pipeline_json (NULL: opt->pipeline), and waits up to 20 s until
 * every server has registered. Returns 0, or the first error (DH_EAGAIN: not all registered,
 * naming those); call dh_bench_cluster_stop either way. */
int dh_bench_cluster_start(dh_bench_cluster_t *c, const dh_bench_options_t *opt,
                           const dh_bench_system_t *sp, const char *pipeline_json);

/* Stops every server at once, then destroys them, the coordinator and the context
 * (dh_cluster_destroy). Safe on a cluster whose start failed part-way. */
void dh_bench_cluster_stop(dh_bench_cluster_t *c);

#endif
