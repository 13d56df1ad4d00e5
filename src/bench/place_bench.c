/* place_bench.c: the placement micro-benchmark (see place_bench.h and docs/scheduler.md).
 *
 * The snapshot: servers/8 nodes (at least 2); the first server of each node is its local
 * DataServer, the others are remote sidecars spread round-robin over the nodes. 4 workers
 * and a queue cap of 16 per server, speed factors 0.8-1.25, storage 2 GB/s (local) or
 * 0.5 GB/s (remote), links 10-100 Gb/s with 20-200 us latency, 2% of servers dead.
 * Requests: batches of 4 kinetics-mixed samples (16x224, 32x336, 64x448), deadlines
 * 0.8-3x the request's CPU time, consumers on random nodes; after each decision the chosen
 * server's queue grows and one completion (on a random busy server) drains another. On the
 * indexed path each of those changes is also an O(log N) dh_place_index_update, inside the
 * loop whose CPU time gives decisions/s (the per-decision percentiles time the decision
 * alone, on both paths).
 */
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/stats.h"
#include "bench/place_bench.h"

#define REQUEST_POOL 4096

typedef struct sample_shape {
    double cpu_s, in_bytes, out_bytes;
} sample_shape_t;

/* kinetics-mixed: S/M/L, CPU seconds from the gen-profiles model, uint8 RGB outputs. */
static const sample_shape_t shapes[3] = {
    {0.06, 0.6e6, 16.0 * 224 * 224 * 3},
    {0.25, 1.5e6, 32.0 * 336 * 336 * 3},
    {1.10, 4.0e6, 64.0 * 448 * 448 * 3},
};

static double uniform(dh_rng_t *rng, double lo, double hi)
{
    return lo + (hi - lo) * dh_rng_uniform(rng);
}

/* One step of FNV-1a over 64 bits. */
static uint64_t fnv(uint64_t hash, uint64_t value)
{
    for (int k = 0; k < 8; k++) {
        hash ^= (value >> (8 * k)) & 0xff;
        hash *= 0x100000001b3ull;
    }
    return hash;
}

int dh_place_bench_run(uint32_t servers, uint64_t decisions, uint64_t seed, dh_policy_t policy,
                       dh_place_bench_path_t path, dh_place_bench_result_t *out)
{
    if (servers < 2 || decisions == 0)
        return DH_EINVAL;
    uint32_t nodes = servers / 8 < 2 ? 2 : servers / 8;
    dh_rng_t rng;
    dh_rng_seed(&rng, seed);
    int rc = DH_ENOMEM;
    dh_server_state_t *srv = dh_calloc(servers, sizeof *srv);
    dh_link_t *links = dh_calloc((size_t)nodes * nodes, sizeof *links);
    dh_candidate_t *cand = dh_calloc(servers, sizeof *cand);
    dh_request_cost_t *reqs = dh_calloc(REQUEST_POOL, sizeof *reqs);
    int32_t *local_of_node = dh_calloc(nodes, sizeof *local_of_node);
    dh_stats_t *lat = NULL;
    dh_place_index_t *idx = NULL;
    if (!srv || !links || !cand || !reqs || !local_of_node || dh_stats_new(&lat) != 0)
        goto done;

    for (uint32_t i = 0; i < servers; i++) {
        int is_local = i < nodes;
        srv[i] = (dh_server_state_t){
            .node = i % nodes,
            .role = is_local ? DH_SERVER_LOCAL : DH_SERVER_REMOTE,
            .alive = dh_rng_uniform(&rng) >= 0.02 || is_local,
            .workers = 4,
            .queue_cap = 16,
            .speed_factor = uniform(&rng, 0.8, 1.25),
            .storage_s_per_B = 1.0 / (is_local ? 2e9 : 5e8),
        };
        if (is_local)
            local_of_node[i] = (int32_t)i;
    }
    for (uint32_t a = 0; a < nodes; a++)
        for (uint32_t b = 0; b < nodes; b++)
            links[(size_t)a * nodes + b] =
                dh_link_make(uniform(&rng, 1.25e9, 12.5e9), uniform(&rng, 20e-6, 200e-6));
    for (uint32_t i = 0; i < REQUEST_POOL; i++) {
        dh_request_cost_t *r = &reqs[i];
        for (int k = 0; k < 4; k++) {
            const sample_shape_t *s = &shapes[dh_rng_below(&rng, 3)];
            r->cpu_s += s->cpu_s;
            r->in_bytes += s->in_bytes;
            r->out_bytes += s->out_bytes;
        }
        /* The compute window of the consuming rank: 0.8x to 3x the request's own CPU time
         * (the balanced regime of docs/design.md §8, where neither side dominates). */
        r->deadline_s = r->cpu_s * uniform(&rng, 0.8, 3.0);
        r->consumer_node = (uint32_t)dh_rng_below(&rng, nodes);
        r->local_server = local_of_node[r->consumer_node];
    }

    dh_place_config_t cfg;
    dh_place_config_default(&cfg);
    cfg.policy = policy;
    dh_snapshot_t snap = {srv, servers, links, nodes};
    *out = (dh_place_bench_result_t){.servers = servers, .decisions = decisions};
    out->decisions_hash = 0xcbf29ce484222325ull;
    const int indexed = path == DH_PLACE_BENCH_INDEXED;
    if (indexed) {
        uint64_t b0 = dh_clock_now_ns();
        if ((rc = dh_place_index_new(&idx, &snap)) != 0)
            goto done;
        out->build_ms = (double)(dh_clock_now_ns() - b0) * 1e-6;
        rc = DH_ENOMEM;
    }

    uint64_t loop_cpu_start = dh_clock_thread_cpu_ns();
    for (uint64_t d = 0; d < decisions; d++) {
        const dh_request_cost_t *r = &reqs[d % REQUEST_POOL];
        dh_decision_t dec = {.candidates = indexed ? NULL : cand};
        uint64_t t0 = dh_clock_now_ns();
        int prc =
            indexed ? dh_place_index_decide(idx, &cfg, r, &dec) : dh_place(&cfg, &snap, r, &dec);
        uint64_t t1 = dh_clock_now_ns();
        if (dh_stats_add(lat, (double)(t1 - t0) * 1e-3) != 0)
            goto done;
        out->by_reason[dec.reason]++;
        uint64_t t_bits;
        memcpy(&t_bits, &dec.t_s, sizeof t_bits);
        out->decisions_hash = fnv(
            fnv(out->decisions_hash, (uint64_t)(uint32_t)dec.server << 8 | (uint64_t)dec.reason),
            t_bits);
        /* The coordinator's book: the chosen server takes the work... */
        if (prc == 0) {
            dh_server_state_t *s = &srv[dec.server];
            s->queue_len++;
            s->queue_wait_s += r->cpu_s * s->speed_factor / s->workers;
            if (indexed)
                dh_place_index_update(idx, (uint32_t)dec.server, s);
        }
        /* ...and completions drain queues: up to 4 random servers are probed for one that
         * has work, keeping the cluster busy but not saturated. */
        for (int probe = 0; probe < 4; probe++) {
            uint32_t k = (uint32_t)dh_rng_below(&rng, servers);
            dh_server_state_t *c = &srv[k];
            if (c->queue_len > 0) {
                c->queue_wait_s -= c->queue_wait_s / c->queue_len;
                c->queue_len--;
                if (indexed)
                    dh_place_index_update(idx, k, c);
                break;
            }
        }
    }
    double elapsed = dh_clock_elapsed_s(loop_cpu_start, dh_clock_thread_cpu_ns());

    out->decisions_per_s = (double)decisions / elapsed;
    out->p50_us = dh_stats_percentile(lat, 50);
    out->p99_us = dh_stats_percentile(lat, 99);
    out->max_us = dh_stats_max(lat);
    rc = 0;
done:
    dh_stats_destroy(&lat);
    dh_place_index_destroy(&idx);
    dh_free(srv);
    dh_free(links);
    dh_free(cand);
    dh_free(reqs);
    dh_free(local_of_node);
    return rc;
}
