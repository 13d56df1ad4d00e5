/* train_cluster.c: the in-process cluster `bench` runs one system on (train_cluster.h): a
 * coordinator and the system's DataServers as threads of this process, over inproc://
 * endpoints of one ZeroMQ context, each local server with its arena sized for its ranks. */
#include "bench/train_cluster.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/clock.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/profile.h"

/* The transfer cost: bytes per second of --link-gbps (0 = free). */
static double link_Bps(const dh_bench_options_t *opt)
{
    return opt->link_gbps * 1e9 / 8;
}

static void sleep_for(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

void dh_bench_cluster_stop(dh_bench_cluster_t *c)
{
    /* every server stopping at once: none waits to forward to one already gone */
    for (size_t i = 0; i < c->n_servers; i++)
        dh_dataserver_stop(c->servers[i]);
    for (size_t i = 0; i < c->n_servers; i++)
        dh_dataserver_destroy(&c->servers[i]);
    dh_coordinator_destroy(&c->coord);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    memset(c, 0, sizeof *c);
}

/* The arena of a local server for the `ranks` ranks that share it (docs/runtime.md,
 * "Prefetch in bytes"): what their deepest horizon needs (ranks x 2 x prefetch batches of
 * the largest sample), bounded by this server's part of the memory budget (DH_ARENA_BUDGET,
 * else a quarter of physical memory): bench runs all `arenas` local servers in one
 * process, so they split it, and each part must hold one step of its ranks. The memfd is
 * sparse and each rank's prefetch keeps to its share (the clients' local_ranks), so a large
 * arena costs only what the batches in flight take. Emulated payloads are stand-ins (x
 * bytes_scale) and a batch's two tensors take a slab (1 MiB) each at least: 4 MiB a
 * batch. */
static int bench_arena_bytes(const dh_bench_options_t *opt, uint32_t ranks, uint32_t arenas,
                             uint64_t *out)
{
    uint32_t helix_cores = (opt->local_servers + opt->remote_servers) * opt->cores_per_server;
    uint32_t depth =
        opt->prefetch_max ? opt->prefetch_max : 2 * dh_bench_deep_prefetch(opt, helix_cores);
    *out = (uint64_t)opt->ranks * depth * ((uint64_t)4 << 20);
    if (*out < (uint64_t)64 << 20)
        *out = (uint64_t)64 << 20;
    if (!opt->dataset)
        return 0;
    char path[1024];
    snprintf(path, sizeof path, "%s/profiles.jsonl", opt->dataset);
    dh_profile_set_t *set = NULL;
    int rc = dh_profile_set_new(&set);
    if (rc || (rc = dh_profile_set_load(set, path))) {
        dh_profile_set_destroy(&set);
        return rc;
    }
    uint64_t largest = 0;
    for (size_t i = 0; i < dh_profile_set_count(set); i++) {
        int64_t b = dh_profile_set_row(set, i)->out_bytes;
        largest = b > 0 && (uint64_t)b > largest ? (uint64_t)b : largest;
    }
    dh_profile_set_destroy(&set);
    double need = (double)ranks * depth * opt->batch * (double)largest;
    uint64_t want = need > (double)((uint64_t)1 << 50) ? (uint64_t)1 << 50 : (uint64_t)need;
    if (want < (uint64_t)64 << 20)
        want = (uint64_t)64 << 20;
    uint64_t budget = dh_arena_budget_default() / (arenas ? arenas : 1);
    rc = dh_deadline_arena_size(ranks, opt->batch, largest, want, budget, out);
    if (rc) {
        char why[512]; /* copied: the message is rewritten from the same buffer */
        snprintf(why, sizeof why, "%s", dh_last_error());
        return dh__set_error(rc, "bench: %u local DataServers in this process, each with an %s",
                             arenas, why);
    }
    return 0;
}

static int add_server(dh_bench_cluster_t *c, const dh_bench_options_t *opt,
                      const char *pipeline_json, dh_ds_role_t role, const char *node,
                      const char *name, uint32_t workers, uint64_t cpus)
{
    if (c->n_servers == DH_BENCH_MAX_SERVERS)
        return dh__set_error(DH_EINVAL, "bench: more than %d DataServers", DH_BENCH_MAX_SERVERS);
    static unsigned counter;
    char data_ep[96];
    snprintf(data_ep, sizeof data_ep, "inproc://bench-data-%d-%u", (int)getpid(), counter++);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = dh_coordinator_endpoint(c->coord);
    dc.role = role;
    dc.node = node;
    dc.name = name;
    dc.workers = workers;
    dc.pipeline_json = pipeline_json;
    dc.pipeline_path = pipeline_json ? NULL : opt->pipeline;
    /* the ranks a local server delivers to (a rank-local loader's server: one), as the
     * clients' local_ranks */
    int rc = bench_arena_bytes(opt, c->ranks_per_arena, c->arenas, &dc.arena_bytes);
    if (rc)
        return rc;
    dc.data_listen = data_ep;
    dc.zmq_ctx = c->ctx;
    dc.worker_cpus = cpus;
    /* the one transfer cost: a link to another node carries link_Bps emulated bytes per
     * second (time-scaled like every emulated duration) */
    dc.emulate_link_Bps =
        opt->link_gbps > 0 ? link_Bps(opt) / (opt->dataset ? 1 : opt->time_scale) : 0;
    rc = dh_dataserver_new(&c->servers[c->n_servers], &dc);
    if (rc)
        return rc;
    c->n_servers++;
    c->cores += workers;
    return dh_dataserver_start(c->servers[c->n_servers - 1]);
}

int dh_bench_cluster_start(dh_bench_cluster_t *c, const dh_bench_options_t *opt,
                           const dh_bench_system_t *sp, const char *pipeline_json)
{
    memset(c, 0, sizeof *c);
    c->ctx = zmq_ctx_new();
    if (!c->ctx)
        return dh__set_error(DH_ENOMEM, "zmq_ctx_new failed");
    static unsigned counter;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://bench-coordinator-%d-%u", (int)getpid(), counter++);
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = ep;
    cc.zmq_ctx = c->ctx;
    cc.place.policy = sp->policy;
    cc.dead_after_ms = 10000; /* a loaded 2-core machine must not fake deaths */
    int rc = dh_coordinator_new(&c->coord, &cc);
    if (rc || (rc = dh_coordinator_start(c->coord)))
        return rc;
    char node[64], name[64];
    c->arenas = sp->rank_local ? opt->ranks : opt->local_servers;
    c->ranks_per_arena =
        sp->rank_local ? 1 : (opt->ranks + opt->local_servers - 1) / opt->local_servers;
    if (sp->rank_local) {
        uint32_t total = sp->cores           ? sp->cores
                         : opt->native_cores ? opt->native_cores
                                             : opt->local_servers * opt->cores_per_server;
        uint32_t per = total / opt->ranks ? total / opt->ranks : 1;
        /* Real decode: rank-local loaders get only their share of this machine's CPUs
         * (rank r on CPU r x cpus / ranks), as on a node where each rank's loader is its
         * own process group; otherwise the kernel would pool their idle time. */
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        uint32_t ncpu = online > 0 ? (uint32_t)online : 1;
        for (uint32_t r = 0; r < opt->ranks; r++) {
            snprintf(node, sizeof node, "node-%u", r);
            snprintf(name, sizeof name, "local-%u", r);
            uint64_t cpus = 0;
            if (opt->dataset && ncpu <= 64) {
                uint32_t lo = r * ncpu / opt->ranks, hi = (r + 1) * ncpu / opt->ranks;
                if (hi <= lo)
                    hi = lo + 1;
                for (uint32_t i = lo; i < hi; i++)
                    cpus |= 1ull << i;
            }
            if ((rc = add_server(c, opt, pipeline_json, DH_DS_LOCAL, node, name, per, cpus)))
                return rc;
        }
    } else {
        for (uint32_t i = 0; i < opt->local_servers; i++) {
            snprintf(node, sizeof node, "node-%u", i);
            snprintf(name, sizeof name, "local-%u", i);
            if ((rc = add_server(c, opt, pipeline_json, DH_DS_LOCAL, node, name,
                                 opt->cores_per_server, 0)))
                return rc;
        }
        for (uint32_t i = 0; i < opt->remote_servers; i++) {
            snprintf(node, sizeof node, "spare-%u", i);
            snprintf(name, sizeof name, "remote-%u", i);
            if ((rc = add_server(c, opt, pipeline_json, DH_DS_REMOTE, node, name,
                                 opt->cores_per_server, 0)))
                return rc;
        }
    }
    /* every server registered before the first request */
    uint64_t t0 = dh_clock_now_ns();
    for (;;) {
        dh_coordinator_stats_t st;
        dh_coordinator_stats(c->coord, &st);
        if (st.servers_alive >= c->n_servers)
            return 0;
        if (dh_clock_elapsed_s(t0, dh_clock_now_ns()) > 20)
            return dh__set_error(DH_EAGAIN,
                                 "bench: %s: only %llu of %zu DataServers registered in 20 s",
                                 sp->name, (unsigned long long)st.servers_alive, c->n_servers);
        sleep_for(0.005);
    }
}
