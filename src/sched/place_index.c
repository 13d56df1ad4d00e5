/* place_index.c: the placement rule of place.c without a scan of every server per decision
 * (docs/scheduler.md §2, "The index"). Pure, like place.c: no I/O, threads or clocks.
 *
 * What a decision needs from the servers (place.c): counts of live and eligible servers,
 * the local server's T, and two minima of (T, index) over the eligible non-local servers:
 * on the consumer's node, and elsewhere. The first is a scan of the consumer's node
 * (O(servers on that node)). The second is the expensive one, and is a branch and bound
 * over a tournament tree:
 *
 *   - the leaves are the servers, ordered by (storage_s_per_B, speed_factor, index): storage
 *     is a hardware class (few values), speed is learned and continuous;
 *   - each vertex keeps, over the eligible servers below it, the minimum speed, storage and
 *     queue term, and how many there are;
 *   - a vertex's lower bound is T evaluated on those minima with the smallest transfer term
 *     of any link into the consumer's node (kept per consumer, O(1) to read);
 *   - a depth-first search visits the child with the smaller bound first and skips every
 *     vertex whose bound is above the best T found so far (equal is still visited: a tie may
 *     hold a lower index).
 *
 * Why the bound is exact, not approximate: T = (((cpu x speed + in x storage) + fetch) +
 * queue) + net is computed in the same order everywhere (place_internal.h, compiled without
 * FMA contraction), and with cpu, in and out bytes finite and >= 0 every rounded step is
 * non-decreasing in its operands. So T on per-field minima (and fetch 0: a remote sample's
 * per-server fetch term is >= 0 and not in the tree, so it only weakens the cut), rounded
 * the same way, is <= the
 * rounded T of every server below: no epsilon is needed, and the server found is the one
 * place.c finds, with the same bits in T. A request outside that domain (a negative or
 * non-finite cost) turns the bounds off, and the search visits every leaf.
 *
 * Cost: O(log N) per update (a path of the tree); per decision, O(servers on the consumer's
 * node) plus the vertices whose bound does not exceed the answer: output-sensitive, O(N) at
 * worst (every server within the transfer spread of the best). Rule 2 (the local server
 * meets D) bounds the search further by what a remote must beat. Least-request is a
 * tournament winner kept in the same tree (O(1) per decision).
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/place.h"
#include "core/internal.h"
#include "sched/place_internal.h"

typedef struct vertex {
    double min_speed, min_storage_s_per_B, min_queue_s; /* over eligible servers below; a NaN
                                                         * among them propagates (never prune) */
    uint32_t eligible;                                  /* eligible servers below */
    int32_t fewest; /* least-request winner below (a leaf: its server), or -1 */
} vertex_t;

struct dh_place_index {
    dh_server_state_t *servers; /* the index's copy */
    uint32_t n_servers, n_nodes;
    dh_link_t *links_to;    /* links_to[to * n_nodes + from]: a consumer's row is contiguous */
    double *min_s_per_B_to; /* per consumer node: minima over links from the other nodes */
    double *min_latency_s_to;
    uint32_t *node_start; /* servers of node k: node_servers[node_start[k] ..
                           * node_start[k + 1]), by index */
    uint32_t *node_servers;
    uint32_t leaves;            /* a power of two >= n_servers */
    vertex_t *tree;             /* 2 x leaves; 1 is the root, leaves at [leaves, 2 x leaves) */
    uint32_t *leaf_of;          /* server -> leaf slot */
    uint32_t *node_of_leaf;     /* leaf slot -> its server's node */
    struct sort_key *sort_keys; /* n_servers: layout's scratch, so updates never allocate */
    uint32_t alive;
    uint32_t moved; /* updates that changed a speed or storage since the leaves were sorted */
};

/* min that propagates a NaN from either side, so a bound over a NaN is NaN (never pruned). */
static inline double nan_min(double a, double b)
{
    return (a < b || a != a) ? a : b;
}

/* Least-request order: fewer outstanding requests per worker (exact, by
 * cross-multiplication), then the lower index. */
static int32_t fewer_requests(const dh_server_state_t *servers, int32_t a, int32_t b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    uint64_t ra = (uint64_t)servers[a].queue_len * servers[b].workers;
    uint64_t rb = (uint64_t)servers[b].queue_len * servers[a].workers;
    return ra < rb || (ra == rb && a < b) ? a : b;
}

static void set_leaf(dh_place_index_t *idx, uint32_t server)
{
    const dh_server_state_t *s = &idx->servers[server];
    uint32_t slot = idx->leaf_of[server];
    vertex_t *v = &idx->tree[idx->leaves + slot];
    idx->node_of_leaf[slot] = s->node;
    if (dh__place_status(s) == DH_CANDIDATE_OK)
        *v = (vertex_t){s->speed_factor, s->storage_s_per_B, dh__place_queue_s(s), 1,
                        (int32_t)server};
    else
        *v = (vertex_t){INFINITY, INFINITY, INFINITY, 0, -1};
}

static void pull(dh_place_index_t *idx, uint32_t v)
{
    const vertex_t *a = &idx->tree[2 * v], *b = &idx->tree[2 * v + 1];
    vertex_t *x = &idx->tree[v];
    x->min_speed = nan_min(a->min_speed, b->min_speed);
    x->min_storage_s_per_B = nan_min(a->min_storage_s_per_B, b->min_storage_s_per_B);
    x->min_queue_s = nan_min(a->min_queue_s, b->min_queue_s);
    x->eligible = a->eligible + b->eligible;
    x->fewest = fewer_requests(idx->servers, a->fewest, b->fewest);
}

/* A total order on doubles for sorting (NaN last), so the comparator is consistent. */
static int cmp_double(double a, double b)
{
    if (a < b)
        return -1;
    if (a > b)
        return 1;
    return (a != a) - (b != b);
}

typedef struct sort_key {
    double storage_s_per_B, speed;
    uint32_t server;
} sort_key_t;

static int cmp_key(const void *pa, const void *pb)
{
    const sort_key_t *a = pa, *b = pb;
    int c = cmp_double(a->storage_s_per_B, b->storage_s_per_B);
    if (!c)
        c = cmp_double(a->speed, b->speed);
    if (!c)
        c = (a->server > b->server) - (a->server < b->server);
    return c;
}

/* Sorts the leaves by (storage, speed, index) and rebuilds the tree: O(N log N). The order
 * only makes the bounds tight; any order gives the same decisions. */
static void layout(dh_place_index_t *idx)
{
    uint32_t n = idx->n_servers;
    sort_key_t *keys = idx->sort_keys;
    for (uint32_t i = 0; i < n; i++)
        keys[i] = (sort_key_t){idx->servers[i].storage_s_per_B, idx->servers[i].speed_factor, i};
    qsort(keys, n, sizeof *keys, cmp_key);
    for (uint32_t slot = 0; slot < n; slot++)
        idx->leaf_of[keys[slot].server] = slot;
    for (uint32_t slot = n; slot < idx->leaves; slot++)
        idx->tree[idx->leaves + slot] = (vertex_t){INFINITY, INFINITY, INFINITY, 0, -1};
    for (uint32_t i = 0; i < n; i++)
        set_leaf(idx, i);
    for (uint32_t v = idx->leaves - 1; v >= 1; v--)
        pull(idx, v);
    idx->moved = 0;
}

/* The servers of each node, by index (a counting sort): O(N + nodes). */
static void group_by_node(dh_place_index_t *idx)
{
    memset(idx->node_start, 0, (idx->n_nodes + 1) * sizeof *idx->node_start);
    for (uint32_t i = 0; i < idx->n_servers; i++)
        idx->node_start[idx->servers[i].node + 1]++;
    for (uint32_t k = 0; k < idx->n_nodes; k++)
        idx->node_start[k + 1] += idx->node_start[k];
    for (uint32_t i = 0; i < idx->n_servers; i++) {
        uint32_t k = idx->servers[i].node;
        idx->node_servers[idx->node_start[k]++] = i;
    }
    for (uint32_t k = idx->n_nodes; k > 0; k--)
        idx->node_start[k] = idx->node_start[k - 1];
    idx->node_start[0] = 0;
}

/* The smallest s_per_B and latency over the links into `to` from the other nodes: O(nodes).
 * +inf when there is no other node. */
static void link_minima(dh_place_index_t *idx, uint32_t to)
{
    double s_per_B = INFINITY, latency_s = INFINITY;
    const dh_link_t *row = &idx->links_to[(size_t)to * idx->n_nodes];
    for (uint32_t from = 0; from < idx->n_nodes; from++)
        if (from != to) {
            s_per_B = nan_min(s_per_B, row[from].s_per_B);
            latency_s = nan_min(latency_s, row[from].latency_s);
        }
    idx->min_s_per_B_to[to] = s_per_B;
    idx->min_latency_s_to[to] = latency_s;
}

void dh_place_index_destroy(dh_place_index_t **p)
{
    dh_place_index_t *idx = *p;
    if (!idx)
        return;
    dh_free(idx->servers);
    dh_free(idx->links_to);
    dh_free(idx->min_s_per_B_to);
    dh_free(idx->min_latency_s_to);
    dh_free(idx->node_start);
    dh_free(idx->node_servers);
    dh_free(idx->tree);
    dh_free(idx->leaf_of);
    dh_free(idx->node_of_leaf);
    dh_free(idx->sort_keys);
    dh_free(idx);
    *p = NULL;
}

int dh_place_index_new(dh_place_index_t **out, const dh_snapshot_t *snap)
{
    *out = NULL;
    uint32_t n = snap->n_servers, nodes = snap->n_nodes;
    if (nodes == 0 || nodes > UINT32_MAX / 2)
        return dh__set_error(DH_EINVAL, "placement index: %u nodes", nodes);
    for (uint32_t i = 0; i < n; i++)
        if (snap->servers[i].node >= nodes)
            return dh__set_error(DH_EINVAL, "placement index: server %u is on node %u of %u", i,
                                 snap->servers[i].node, nodes);
    uint32_t leaves = 1;
    while (leaves < n)
        leaves *= 2;
    dh_place_index_t *idx = dh_calloc(1, sizeof *idx);
    if (!idx)
        return dh__set_error(DH_ENOMEM, "placement index: no memory");
    idx->n_servers = n;
    idx->n_nodes = nodes;
    idx->leaves = leaves;
    idx->servers = dh_calloc(n ? n : 1, sizeof *idx->servers);
    idx->links_to = dh_calloc((size_t)nodes * nodes, sizeof *idx->links_to);
    idx->min_s_per_B_to = dh_calloc(nodes, sizeof *idx->min_s_per_B_to);
    idx->min_latency_s_to = dh_calloc(nodes, sizeof *idx->min_latency_s_to);
    idx->node_start = dh_calloc(nodes + 1, sizeof *idx->node_start);
    idx->node_servers = dh_calloc(n ? n : 1, sizeof *idx->node_servers);
    idx->tree = dh_calloc(2 * (size_t)leaves, sizeof *idx->tree);
    idx->leaf_of = dh_calloc(n ? n : 1, sizeof *idx->leaf_of);
    idx->node_of_leaf = dh_calloc(leaves, sizeof *idx->node_of_leaf);
    idx->sort_keys = dh_calloc(n ? n : 1, sizeof *idx->sort_keys);
    if (!idx->sort_keys || !idx->servers || !idx->links_to || !idx->min_s_per_B_to ||
        !idx->min_latency_s_to || !idx->node_start || !idx->node_servers || !idx->tree ||
        !idx->leaf_of || !idx->node_of_leaf) {
        dh_place_index_destroy(&idx);
        return dh__set_error(DH_ENOMEM, "placement index: no memory for %u servers, %u nodes", n,
                             nodes);
    }
    if (n)
        memcpy(idx->servers, snap->servers, n * sizeof *idx->servers);
    for (uint32_t from = 0; from < nodes; from++)
        for (uint32_t to = 0; to < nodes; to++)
            idx->links_to[(size_t)to * nodes + from] = snap->links[(size_t)from * nodes + to];
    for (uint32_t to = 0; to < nodes; to++)
        link_minima(idx, to);
    group_by_node(idx);
    for (uint32_t i = 0; i < n; i++)
        idx->alive += dh__place_status(&idx->servers[i]) != DH_CANDIDATE_DEAD;
    layout(idx);
    *out = idx;
    return 0;
}

int dh_place_index_update(dh_place_index_t *idx, uint32_t server, const dh_server_state_t *state)
{
    if (server >= idx->n_servers || state->node >= idx->n_nodes)
        return dh__set_error(DH_EINVAL,
                             "placement index: server %u (node %u) outside %u servers, %u nodes",
                             server, state->node, idx->n_servers, idx->n_nodes);
    dh_server_state_t *s = &idx->servers[server];
    idx->alive -= dh__place_status(s) != DH_CANDIDATE_DEAD;
    idx->alive += dh__place_status(state) != DH_CANDIDATE_DEAD;
    int moved = memcmp(&s->speed_factor, &state->speed_factor, sizeof s->speed_factor) ||
                memcmp(&s->storage_s_per_B, &state->storage_s_per_B, sizeof s->storage_s_per_B);
    int regroup = s->node != state->node;
    *s = *state;
    if (regroup)
        group_by_node(idx); /* O(N + nodes); servers rarely change node */
    /* A server whose speed or storage changed keeps its leaf, so the sort loosens the bounds
     * as speeds are learned; after n_servers such updates the leaves are sorted again
     * (O(N log N), amortised O(log N) per update). */
    if (moved && ++idx->moved >= idx->n_servers && idx->n_servers > 1) {
        layout(idx);
        return 0;
    }
    set_leaf(idx, server);
    for (uint32_t v = (idx->leaves + idx->leaf_of[server]) / 2; v >= 1; v /= 2)
        pull(idx, v);
    return 0;
}

int dh_place_index_set_link(dh_place_index_t *idx, uint32_t from, uint32_t to, dh_link_t link)
{
    if (from >= idx->n_nodes || to >= idx->n_nodes)
        return dh__set_error(DH_EINVAL, "placement index: link %u -> %u outside %u nodes", from, to,
                             idx->n_nodes);
    idx->links_to[(size_t)to * idx->n_nodes + from] = link;
    link_minima(idx, to); /* O(nodes) */
    return 0;
}

/* The search for the best eligible server off the consumer's node. */
typedef struct search {
    const dh_request_cost_t *req; /* its fetch term, per server */
    double cpu_s, in_bytes, out_bytes;
    double net_lb_s;           /* the least transfer term of any other node */
    const dh_link_t *links_to; /* the consumer's row */
    uint32_t consumer;
    int32_t local;
    int bounded; /* costs finite and >= 0: the bounds hold */
    int gain;    /* rule 2: only servers that meet D with a gain count */
    double deadline_s, t_local, margin_s;
    int32_t best; /* the incumbent, or -1 */
    double t_best;
} search_t;

/* Rule 2's test of a remote's T: it meets D and beats the local T by more than the margin.
 * Non-increasing in t, so a bound that fails it fails for every server below. */
static inline int gains(const search_t *s, double t)
{
    return t <= s->deadline_s && s->t_local - t > s->margin_s;
}

/* Whether no server under a vertex whose bound is lb can change the search's answer. */
static inline int cut(const search_t *s, double lb)
{
    if (!s->bounded || lb != lb)
        return 0;
    return lb > s->t_best || (s->gain && !gains(s, lb));
}

/* A lower bound of T under v: the fetch term, >= 0 per server, is bounded by 0. */
static inline double bound(const search_t *s, const vertex_t *v)
{
    return dh__place_t(s->cpu_s, s->in_bytes, v->min_speed, v->min_storage_s_per_B, 0.0,
                       v->min_queue_s, s->net_lb_s);
}

static void search_other(const dh_place_index_t *idx, search_t *s)
{
    const vertex_t *tree = idx->tree;
    const uint32_t leaves = idx->leaves;
    uint32_t stack[80];
    double stack_lb[80];
    int sp = 0;
    if (tree[1].eligible == 0)
        return;
    stack[sp] = 1;
    stack_lb[sp++] = bound(s, &tree[1]);
    while (sp > 0) {
        sp--;
        uint32_t v = stack[sp];
        if (cut(s, stack_lb[sp])) /* the incumbent may have improved since the push */
            continue;
        if (v >= leaves) {
            const vertex_t *leaf = &tree[v];
            int32_t server = leaf->fewest;
            uint32_t node = idx->node_of_leaf[v - leaves];
            if (server == s->local || node == s->consumer)
                continue;
            double t =
                dh__place_t(s->cpu_s, s->in_bytes, leaf->min_speed, leaf->min_storage_s_per_B,
                            dh__place_fetch_s(s->req, (uint32_t)server), leaf->min_queue_s,
                            dh__place_link_s(&s->links_to[node], s->out_bytes));
            if ((t < s->t_best || (t == s->t_best && server < s->best)) &&
                (!s->gain || gains(s, t))) {
                s->t_best = t;
                s->best = server;
            }
            continue;
        }
        /* Push the child with the larger bound first, so the smaller is searched first and
         * the incumbent tightens early. */
        const vertex_t *a = &tree[2 * v], *b = &tree[2 * v + 1];
        double lb_a = a->eligible ? bound(s, a) : INFINITY;
        double lb_b = b->eligible ? bound(s, b) : INFINITY;
        int take_a = a->eligible && !cut(s, lb_a), take_b = b->eligible && !cut(s, lb_b);
        if (take_a && take_b && lb_a < lb_b) {
            stack[sp] = 2 * v + 1;
            stack_lb[sp++] = lb_b;
            take_b = 0;
        }
        if (take_a) {
            stack[sp] = 2 * v;
            stack_lb[sp++] = lb_a;
        }
        if (take_b) {
            stack[sp] = 2 * v + 1;
            stack_lb[sp++] = lb_b;
        }
    }
}

static inline int finite_nonneg(double x)
{
    return x >= 0 && x < INFINITY;
}

int dh_place_index_decide(const dh_place_index_t *idx, const dh_place_config_t *cfg,
                          const dh_request_cost_t *req, dh_decision_t *out)
{
    assert(out->candidates == NULL); /* a per-server table is O(N): dh_place fills one */
    const uint32_t n = idx->n_servers, consumer = req->consumer_node;
    const double deadline = req->deadline_s;
    const int32_t local = req->local_server;
    if (consumer >= idx->n_nodes)
        return dh__set_error(DH_EINVAL, "placement index: consumer node %u of %u", consumer,
                             idx->n_nodes);
    const dh_link_t *links_to = &idx->links_to[(size_t)consumer * idx->n_nodes];

    /* The local server: O(1). */
    int local_alive = 0, local_ok = 0;
    double t_local = INFINITY;
    if (local >= 0 && (uint32_t)local < n) {
        const dh_server_state_t *s = &idx->servers[local];
        local_alive = s->alive != 0;
        if (dh__place_status(s) == DH_CANDIDATE_OK) {
            local_ok = 1;
            t_local = dh__place_t(
                req->cpu_s, req->in_bytes, s->speed_factor, s->storage_s_per_B,
                dh__place_fetch_s(req, (uint32_t)local), dh__place_queue_s(s),
                s->node == consumer ? 0.0 : dh__place_link_s(&links_to[s->node], req->out_bytes));
        }
    }
    int rc;
    if (dh__place_gate(cfg, n, idx->alive, idx->tree[1].eligible, local, local_alive, local_ok,
                       t_local, deadline, out, &rc))
        return rc;
    if (cfg->policy == DH_POLICY_LEAST_REQUEST) {
        int32_t fewest = idx->tree[1].fewest;
        const dh_server_state_t *s = &idx->servers[fewest];
        double t = dh__place_t(
            req->cpu_s, req->in_bytes, s->speed_factor, s->storage_s_per_B,
            dh__place_fetch_s(req, (uint32_t)fewest), dh__place_queue_s(s),
            s->node == consumer ? 0.0 : dh__place_link_s(&links_to[s->node], req->out_bytes));
        return dh__place_finish(out, fewest, t, deadline, DH_REASON_LEAST_REQUEST, 0);
    }

    /* The best eligible non-local server on the consumer's node: a scan of that node, in
     * index order with a strict '<' (the lowest index on ties), as place.c does. */
    int32_t best_same = -1;
    double t_best_same = INFINITY;
    for (uint32_t k = idx->node_start[consumer]; k < idx->node_start[consumer + 1]; k++) {
        uint32_t i = idx->node_servers[k];
        const dh_server_state_t *s = &idx->servers[i];
        if ((int32_t)i == local || dh__place_status(s) != DH_CANDIDATE_OK)
            continue;
        double t = dh__place_t(req->cpu_s, req->in_bytes, s->speed_factor, s->storage_s_per_B,
                               dh__place_fetch_s(req, i), dh__place_queue_s(s), 0.0);
        if (t < t_best_same) {
            t_best_same = t;
            best_same = (int32_t)i;
        }
    }

    search_t s = {
        .req = req,
        .cpu_s = req->cpu_s,
        .in_bytes = req->in_bytes,
        .out_bytes = req->out_bytes,
        .net_lb_s = dh__place_link_s(
            &(dh_link_t){idx->min_s_per_B_to[consumer], idx->min_latency_s_to[consumer]},
            req->out_bytes),
        .links_to = links_to,
        .consumer = consumer,
        .local = local,
        .bounded = finite_nonneg(req->cpu_s) && finite_nonneg(req->in_bytes) &&
                   finite_nonneg(req->out_bytes),
        .deadline_s = deadline,
        .t_local = t_local,
        .best = -1,
        .t_best = INFINITY,
    };
    const int others = idx->n_nodes > 1;

    /* Rule 2. place.c returns REMOTE_GAIN iff the best remote (the smaller (T, index) of the
     * two minima) passes the test `gains`. The test is non-increasing in T, so the best
     * remote passes iff some remote passes, and it is then the best of those that pass: the
     * search may skip every server (and subtree) that fails it. */
    if (local_ok && t_local <= deadline) {
        s.gain = 1;
        s.margin_s = dh__place_margin(cfg, t_local);
        if (best_same >= 0 && gains(&s, t_best_same)) {
            s.best = best_same;
            s.t_best = t_best_same;
        }
        if (others)
            search_other(idx, &s);
        if (s.best >= 0)
            return dh__place_finish(out, s.best, s.t_best, deadline, DH_REASON_REMOTE_GAIN, 0);
        return dh__place_finish(out, local, t_local, deadline, DH_REASON_LOCAL_MEETS, 0);
    }
    /* Rule 3, the consumer's node: no other minimum is needed. */
    if (best_same >= 0 && t_best_same <= deadline)
        return dh__place_finish(out, best_same, t_best_same, deadline, DH_REASON_LEAST_TRANSFER, 0);
    /* Rule 3 elsewhere, and rule 4. The search starts from best_same, so it returns the best
     * remote of place.c. If that is off the consumer's node and meets D, it is place.c's
     * best_other meeting D (best_same, if any, misses D here, so is slower). Otherwise no
     * server elsewhere meets D (none is faster than the best remote), and rule 4 applies. */
    s.best = best_same;
    s.t_best = t_best_same;
    if (others)
        search_other(idx, &s);
    if (s.best >= 0 && s.best != best_same && s.t_best <= deadline)
        return dh__place_finish(out, s.best, s.t_best, deadline, DH_REASON_LEAST_TRANSFER, 0);
    int32_t earliest = local_ok ? dh__place_better(local, t_local, s.best, s.t_best) : s.best;
    return dh__place_finish(out, earliest, earliest == local ? t_local : s.t_best, deadline,
                            DH_REASON_EARLIEST_FINISH, 0);
}
