/* train_cluster.c: the in-process cluster `bench` runs one system on (train_cluster.h): a
 * coordinator and the system's DataServers as threads of this process, over inproc://
 * endpoints of one ZeroMQ context, each local server with its arena sized for its ranks.
 * The runtime's starter (include/datahelix/cluster.h, src/runtime/cluster_start.c) makes, starts
 * and stops them; this file chooses the servers, their CPUs and arenas. */
#include "bench/train_cluster.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/profile.h"

/* The transfer cost: bytes per second of --link-gbps (0 = free). */
static double link_Bps(const dh_bench_options_t *opt)
{
    return opt->link_gbps * 1e9 / 8;
}

void dh_bench_cluster_stop(dh_bench_cluster_t *c)
{
    dh_cluster_destroy(&c->cluster);
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

/* Server i of the list: its role, node, name, workers and CPUs. */
static void add_server(dh_cluster_server_t *servers, char (*names)[2][64], size_t i,
                       dh_ds_role_t role, const char *node_fmt, const char *name_fmt,
                       uint32_t index, uint32_t workers, uint64_t cpus)
{
    snprintf(names[i][0], sizeof names[i][0], node_fmt, index);
    snprintf(names[i][1], sizeof names[i][1], name_fmt, index);
    servers[i].role = role;
    servers[i].node = names[i][0];
    servers[i].name = names[i][1];
    servers[i].workers = workers;
    servers[i].worker_cpus = cpus;
}

int dh_bench_cluster_start(dh_bench_cluster_t *c, const dh_bench_options_t *opt,
                           const dh_bench_system_t *sp, const char *pipeline_json)
{
    memset(c, 0, sizeof *c);
    c->arenas = sp->rank_local ? opt->ranks : opt->local_servers;
    c->ranks_per_arena =
        sp->rank_local ? 1 : (opt->ranks + opt->local_servers - 1) / opt->local_servers;
    size_t n = sp->rank_local ? opt->ranks : (size_t)opt->local_servers + opt->remote_servers;
    if (n > DH_BENCH_MAX_SERVERS)
        return dh__set_error(DH_EINVAL, "bench: more than %d DataServers", DH_BENCH_MAX_SERVERS);
    /* the ranks a local server delivers to (a rank-local loader's server: one), as the
     * clients' local_ranks */
    uint64_t arena_bytes = 0;
    int rc = bench_arena_bytes(opt, c->ranks_per_arena, c->arenas, &arena_bytes);
    if (rc)
        return rc;
    dh_cluster_server_t *servers = dh_calloc(n ? n : 1, sizeof *servers);
    char(*names)[2][64] = dh_calloc(n ? n : 1, sizeof *names);
    if (!servers || !names) {
        rc = dh__set_error(DH_ENOMEM, "bench: out of memory for %zu DataServers", n);
        goto done;
    }
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
            uint64_t cpus = 0;
            if (opt->dataset && ncpu <= 64) {
                uint32_t lo = r * ncpu / opt->ranks, hi = (r + 1) * ncpu / opt->ranks;
                if (hi <= lo)
                    hi = lo + 1;
                for (uint32_t i = lo; i < hi; i++)
                    cpus |= 1ull << i;
            }
            add_server(servers, names, r, DH_DS_LOCAL, "node-%u", "local-%u", r, per, cpus);
        }
    } else {
        for (uint32_t i = 0; i < opt->local_servers; i++)
            add_server(servers, names, i, DH_DS_LOCAL, "node-%u", "local-%u", i,
                       opt->cores_per_server, 0);
        for (uint32_t i = 0; i < opt->remote_servers; i++)
            add_server(servers, names, opt->local_servers + i, DH_DS_REMOTE, "spare-%u",
                       "remote-%u", i, opt->cores_per_server, 0);
    }
    for (size_t i = 0; i < n; i++) {
        servers[i].arena_bytes = arena_bytes;
        /* the one transfer cost: a link to another node carries link_Bps emulated bytes per
         * second (time-scaled like every emulated duration) */
        servers[i].emulate_link_Bps =
            opt->link_gbps > 0 ? link_Bps(opt) / (opt->dataset ? 1 : opt->time_scale) : 0;
        c->cores += servers[i].workers;
    }
    dh_cluster_config_t cc;
    dh_cluster_config_default(&cc);
    cc.policy = sp->policy;
    cc.dead_after_ms = 10000; /* a loaded 2-core machine must not fake deaths */
    cc.pipeline_json = pipeline_json;
    cc.pipeline_path = pipeline_json ? NULL : opt->pipeline;
    cc.servers = servers;
    cc.n_servers = n;
    if ((rc = dh_cluster_new(&c->cluster, &cc)))
        goto done;
    c->ctx = dh_cluster_zmq_ctx(c->cluster);
    c->coord = dh_cluster_coordinator(c->cluster);
    /* every server registered before the first request */
    if ((rc = dh_cluster_start(c->cluster)) ||
        (rc = dh_cluster_wait_registered(c->cluster, NULL, 20000))) {
        char why[512]; /* copied: the message is rewritten from the same buffer */
        snprintf(why, sizeof why, "%s", dh_last_error());
        rc = dh__set_error(rc, "bench: %s: %s", sp->name, why);
    }
done:
    dh_free(servers);
    dh_free(names);
    return rc;
}
