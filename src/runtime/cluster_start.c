/* cluster_start.c: the in-process cluster (include/datahelix/cluster.h; docs/runtime.md,
 * "In-process clusters"): a coordinator (or an existing one joined) and a list of DataServers as
 * threads of this process, sharing one ZeroMQ context, made in one call, started coordinator first,
 * and taken apart in the one safe order (every server asked to stop before any is destroyed). What
 * differs between its users (the embedded client, `bench`, `transport-bench`, Python's
 * `_C.Cluster`) is only configuration: endpoints, policy, the servers, their arenas (each caller
 * sizes them). Threads: none of its own; the caller's thread makes, starts, waits and destroys.
 */
#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cluster.h"
#include "datahelix/error.h"
#include "runtime/coordinator_internal.h"

#define ENDPOINT_MAX 256

struct dh_cluster {
    void *ctx;
    bool own_ctx;
    dh_coordinator_t *coord; /* NULL: joined */
    char endpoint[ENDPOINT_MAX];
    dh_dataserver_t **servers;
    size_t n_servers;
};

void dh_cluster_config_default(dh_cluster_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    dh_place_config_t place;
    dh_place_config_default(&place);
    cfg->policy = place.policy;
}

void dh_cluster_server_default(dh_cluster_server_t *s)
{
    memset(s, 0, sizeof *s);
    s->role = DH_DS_LOCAL;
}

/* A fresh inproc:// endpoint: unique in this process, whatever the context. */
static void unique_inproc(char *buf, size_t cap, const char *what)
{
    static atomic_uint counter;
    snprintf(buf, cap, "inproc://datahelix-%s-%d-%u", what, (int)getpid(),
             atomic_fetch_add(&counter, 1));
}

static int new_coordinator(dh_cluster_t *c, const dh_cluster_config_t *cfg)
{
    if (cfg->join && cfg->join[0]) {
        if (strlen(cfg->join) >= sizeof c->endpoint)
            return dh__set_error(DH_EINVAL, "cluster: coordinator endpoint too long: %.64s...",
                                 cfg->join);
        snprintf(c->endpoint, sizeof c->endpoint, "%s", cfg->join);
        return 0;
    }
    char listen[ENDPOINT_MAX];
    if (cfg->listen && cfg->listen[0])
        snprintf(listen, sizeof listen, "%s", cfg->listen);
    else
        unique_inproc(listen, sizeof listen, "coordinator");
    dh_coordinator_config_t cc;
    dh_coordinator_config_default(&cc);
    cc.listen = listen;
    cc.zmq_ctx = c->ctx;
    cc.place.policy = cfg->policy;
    if (cfg->dead_after_ms)
        cc.dead_after_ms = cfg->dead_after_ms;
    cc.keys_dir = cfg->keys_dir;
    cc.key_name = cfg->key_name;
    int rc = dh_coordinator_new(&c->coord, &cc);
    if (rc)
        return rc;
    const char *ep =
        cfg->advertise && cfg->advertise[0] ? cfg->advertise : dh_coordinator_endpoint(c->coord);
    if (strlen(ep) >= sizeof c->endpoint)
        return dh__set_error(DH_EINVAL, "cluster: coordinator endpoint too long: %.64s...", ep);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", ep);
    return 0;
}

static int new_server(dh_cluster_t *c, const dh_cluster_config_t *cfg,
                      const dh_cluster_server_t *sp)
{
    if (!sp->node || !sp->node[0])
        return dh__set_error(DH_EINVAL, "cluster: DataServer %zu has no node", c->n_servers);
    dh_dataserver_config_t dc;
    dh_dataserver_config_default(&dc);
    dc.coordinator = c->endpoint;
    dc.role = sp->role;
    dc.node = sp->node;
    dc.name = sp->name;
    dc.workers = sp->workers;
    dc.worker_cpus = sp->worker_cpus;
    dc.arena_bytes = sp->arena_bytes;
    dc.emulate_link_Bps = sp->emulate_link_Bps;
    dc.data_advertise = sp->data_advertise;
    dc.shm_allow_uids = sp->shm_allow_uids;
    dc.pipeline_json = cfg->pipeline_json;
    dc.pipeline_path = cfg->pipeline_path;
    dc.keys_dir = cfg->keys_dir;
    dc.key_name = cfg->key_name;
    dc.zmq_ctx = c->ctx;
    char data_ep[ENDPOINT_MAX];
    if (sp->data_listen && sp->data_listen[0]) {
        dc.data_listen = sp->data_listen;
    } else if (strncmp(c->endpoint, "inproc://", 9) == 0) {
        unique_inproc(data_ep, sizeof data_ep, "data");
        dc.data_listen = data_ep;
    }
    int rc = dh_dataserver_new(&c->servers[c->n_servers], &dc);
    if (rc)
        return rc;
    c->n_servers++;
    return 0;
}

int dh_cluster_new(dh_cluster_t **out, const dh_cluster_config_t *cfg)
{
    assert(out && cfg && (cfg->servers || cfg->n_servers == 0));
    *out = NULL;
    dh_cluster_t *c = dh_calloc(1, sizeof *c);
    if (!c)
        return dh__set_error(DH_ENOMEM, "cluster: out of memory");
    int rc = 0;
    if (cfg->n_servers && !(c->servers = dh_calloc(cfg->n_servers, sizeof *c->servers))) {
        rc = dh__set_error(DH_ENOMEM, "cluster: out of memory for %zu DataServers", cfg->n_servers);
        goto fail;
    }
    c->ctx = cfg->zmq_ctx;
    if (!c->ctx) {
        if (!(c->ctx = zmq_ctx_new())) {
            rc = dh__set_error(DH_ENOMEM, "cluster: zmq_ctx_new failed");
            goto fail;
        }
        c->own_ctx = true;
    }
    if ((rc = new_coordinator(c, cfg)))
        goto fail;
    for (size_t i = 0; i < cfg->n_servers; i++)
        if ((rc = new_server(c, cfg, &cfg->servers[i])))
            goto fail;
    *out = c;
    return 0;
fail:
    dh_cluster_destroy(&c);
    return rc;
}

int dh_cluster_start(dh_cluster_t *c)
{
    int rc = c->coord ? dh_coordinator_start(c->coord) : 0;
    for (size_t i = 0; rc == 0 && i < c->n_servers; i++)
        rc = dh_dataserver_start(c->servers[i]);
    return rc;
}

/* The servers `coordinator` has not taken a HELLO from, named into buf; their count. */
static size_t unregistered(const dh_cluster_t *c, const dh_coordinator_t *coordinator, char *buf,
                           size_t cap)
{
    size_t missing = 0, used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < c->n_servers; i++) {
        const char *name = dh_dataserver_name(c->servers[i]);
        /* NAN: a name the coordinator never registered (it keeps the dead too) */
        if (!isnan(dh__coord_server_speed(coordinator, name)))
            continue;
        if (used < cap) {
            int n = snprintf(buf + used, cap - used, "%s'%s'", missing ? ", " : "", name);
            used += n > 0 ? (size_t)n : 0;
        }
        missing++;
    }
    return missing;
}

int dh_cluster_wait_registered(const dh_cluster_t *c, const dh_coordinator_t *coordinator,
                               uint32_t timeout_ms)
{
    if (!coordinator)
        coordinator = c->coord;
    assert(coordinator); /* a joining cluster names the coordinator it joined */
    char names[512];
    uint64_t t0 = dh_clock_now_ns();
    for (;;) {
        size_t missing = unregistered(c, coordinator, names, sizeof names);
        if (missing == 0)
            return 0;
        if (dh_clock_elapsed_s(t0, dh_clock_now_ns()) * 1000 >= timeout_ms)
            return dh__set_error(DH_EAGAIN,
                                 "cluster: %zu of %zu DataServers did not register with the "
                                 "coordinator %s within %u ms: %s",
                                 missing, c->n_servers, c->endpoint, timeout_ms, names);
        struct timespec pause = {0, 5 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

const char *dh_cluster_endpoint(const dh_cluster_t *c)
{
    return c->endpoint;
}

dh_coordinator_t *dh_cluster_coordinator(const dh_cluster_t *c)
{
    return c->coord;
}

void *dh_cluster_zmq_ctx(const dh_cluster_t *c)
{
    return c->ctx;
}

size_t dh_cluster_count(const dh_cluster_t *c)
{
    return c->n_servers;
}

dh_dataserver_t *dh_cluster_server(const dh_cluster_t *c, size_t i)
{
    assert(i < c->n_servers);
    return c->servers[i];
}

void dh_cluster_destroy(dh_cluster_t **pc)
{
    dh_cluster_t *c = pc ? *pc : NULL;
    if (!c)
        return;
    /* every server stopping at once: none waits to forward to one already gone */
    for (size_t i = 0; i < c->n_servers; i++)
        dh_dataserver_stop(c->servers[i]);
    for (size_t i = 0; i < c->n_servers; i++)
        dh_dataserver_destroy(&c->servers[i]);
    dh_free(c->servers);
    dh_coordinator_destroy(&c->coord);
    if (c->own_ctx)
        zmq_ctx_term(c->ctx);
    dh_free(c);
    *pc = NULL;
}
