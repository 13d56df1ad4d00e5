/* bench/transport_bench.h: `datahelix transport-bench` (docs/runtime.md "Transport").
 *
 * (a) local delivery overhead: a coordinator, a local DataServer (synthetic pipeline, no
 *     cost) and a client in this process over tcp://127.0.0.1; for each payload size, the
 *     time from "ready in the DataServer's arena" (the worker's clock) to "returned by
 *     next()" (the client's), prefetch 1 so next() is already waiting. Zero-copy: it should
 *     not grow with the size.
 * (b) remote forwarding throughput: the same with a delivery-only local DataServer and a
 *     sidecar, so every batch's bytes cross tcp://127.0.0.1 from the sidecar to the local
 *     DataServer's arena; beside it, in the same run, a plain TCP stream of the same bytes
 *     between two threads (the ceiling of the loopback link on this machine); with curve,
 *     the same again with CURVE authentication and encryption on every socket, in each run
 *     right after the plaintext one (docs/security.md, "Cost").
 */
#ifndef DH_BENCH_TRANSPORT_BENCH_H
#define DH_BENCH_TRANSPORT_BENCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct dh_transport_local_point {
    uint64_t bytes;
    double overhead_p50_us, overhead_p99_us;
    size_t batches;
} dh_transport_local_point_t;

typedef struct dh_transport_report {
    dh_transport_local_point_t local[16];
    size_t n_local;
    double remote_gbps, raw_tcp_gbps, remote_ratio;
    uint64_t remote_bytes;
    double curve_gbps;  /* --curve: the remote part with CURVE on every socket (0 without) */
    double curve_ratio; /* median over runs of curve / plaintext, each run side by side */
} dh_transport_report_t;

typedef struct dh_transport_options {
    const uint64_t *sizes; /* payload sizes for (a) */
    size_t n_sizes;
    size_t batches;        /* per size (a) */
    uint64_t remote_bytes; /* per batch (b) */
    size_t remote_batches; /* (b) */
    int runs;              /* (b) repeated, medians reported */
    int curve;             /* (b) also with CURVE (a key directory of the run), beside it */
    void (*progress)(const char *line, void *ctx);
    void *ctx;
} dh_transport_options_t;

/* Runs both parts. Returns 0 or the first error (message names the part). */
int dh_transport_bench(const dh_transport_options_t *opt, dh_transport_report_t *out);

#endif
