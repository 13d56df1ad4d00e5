/* rebalance_rank.c: one rank of rebalance-bench's on-node part, a process forked by
 * the coordinator (rebalance_coord.c): it attaches to the arena over the inherited memfd,
 * connects a DEALER to the coordinator's ROUTER, and answers each message: the clips
 * assigned to it, a gather of what it holds, a handoff (it takes over each incoming clip's
 * reference and checks its bytes), GOODBYE (it drops its references and exits 0).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/wire.h"
#include "wire/wire_lib.h"
#include "bench/rebalance_bench_internal.h"

typedef struct rank_state {
    const dh_rebalance_bench_options_t *opt;
    uint32_t rank;
    pid_t parent;
    dh_shm_arena_t *arena;
    const uint8_t *base; /* this process's mapping of the arena */
    void *ctx;
    dh_wire_socket_t *sock;
    uint8_t *holds;         /* holds[clip]: 1 while this rank holds it */
    dh_wire_tensor_t *have; /* have[clip]: its tensor and handle, while held */
    dh_wire_tensor_t *out;  /* scratch for replies */
} rank_state_t;

static int rank_send(rank_state_t *st, const char *kind, uint64_t seq, dh_wire_tensor_t *tensors,
                     uint32_t n)
{
    dh_msg_t m = {.type = DH_MSG_DELIVER};
    m.deliver.client_id = (char *)kind;
    m.deliver.seq = seq;
    m.deliver.n_tensors = n;
    m.deliver.tensors = tensors;
    m.deliver.ready_ns = dh_clock_now_ns();
    m.deliver.server = (char *)"rank";
    return dh_wire_send(st->sock, NULL, 0, &m, NULL, 0, STEP_TIMEOUT_MS);
}

static int rank_holdings(rank_state_t *st, uint64_t seq)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < st->opt->clips; i++)
        if (st->holds[i])
            st->out[n++] = st->have[i];
    return rank_send(st, KIND_HOLDINGS, seq, st->out, n);
}

/* The handoff: forget what goes away; take over each incoming clip's reference (a new one
 * for this pid, then the sender's dropped), resolve it, check its stamps, and report the
 * offset it resolved to in this process's mapping. */
static int rank_handoff(rank_state_t *st, const dh_msg_deliver_t *d)
{
    const uint32_t clips = st->opt->clips;
    const size_t len = (size_t)dh__rebalance_clip_bytes(st->opt);
    for (uint32_t i = 0; i < d->n_samples; i++) {
        long k = dh__rebalance_clip_index(d->samples[i].id, clips);
        if (k < 0 || !st->holds[k])
            return dh__set_error(-EPROTO, "rank %" PRIu32 ": told to give away '%s', not held",
                                 st->rank, d->samples[i].id);
        st->holds[k] = 0;
    }
    if (d->n_tensors > clips)
        return dh__set_error(-EPROTO,
                             "rank %" PRIu32 ": told to take %" PRIu32 " clips of %" PRIu32,
                             st->rank, d->n_tensors, clips);
    const pid_t self = getpid();
    for (uint32_t i = 0; i < d->n_tensors; i++) {
        const dh_wire_tensor_t *w = &d->tensors[i];
        long k = dh__rebalance_clip_of_tensor(w, st->opt, DH_WIRE_LOC_SHM);
        if (k < 0 || st->holds[k])
            return dh__set_error(-EPROTO, "rank %" PRIu32 ": bad or already held clip '%s'",
                                 st->rank, w->tensor.name);
        dh_shm_handle_t h = dh__rebalance_handle_of(w);
        void *p = NULL;
        int rc = dh_shm_arena_ref_for(st->arena, &h, self);
        if (rc == 0)
            rc = dh_shm_arena_unref(st->arena, &h);
        if (rc == 0)
            rc = dh_shm_arena_resolve(st->arena, &h, &p);
        if (rc)
            return dh__rebalance_with_context(rc, "rank %" PRIu32 ": taking over %s", st->rank,
                                              w->tensor.name);
        if (!dh__rebalance_clip_intact(p, len, dh__rebalance_clip_tag(st->opt->seed, (uint32_t)k)))
            return dh__set_error(-EPROTO, "rank %" PRIu32 ": %s: its bytes are not the clip's",
                                 st->rank, w->tensor.name);
        st->holds[k] = 1;
        st->have[k] = *w;
        st->out[i] = *w;
        st->out[i].offset = (uint64_t)((const uint8_t *)p - st->base);
    }
    return rank_send(st, KIND_TAKEN, d->seq, st->out, d->n_tensors);
}

/* Clips allocated for this rank at set-up: it holds their one reference already. */
static int rank_assign(rank_state_t *st, const dh_msg_deliver_t *d)
{
    for (uint32_t i = 0; i < d->n_tensors; i++) {
        long k = dh__rebalance_clip_of_tensor(&d->tensors[i], st->opt, DH_WIRE_LOC_SHM);
        dh_shm_handle_t h = dh__rebalance_handle_of(&d->tensors[i]);
        void *p = NULL;
        if (k < 0 || dh_shm_arena_resolve(st->arena, &h, &p) != 0)
            return dh__set_error(-EPROTO, "rank %" PRIu32 ": bad assigned clip '%s'", st->rank,
                                 d->tensors[i].tensor.name);
        st->holds[k] = 1;
        st->have[k] = d->tensors[i];
    }
    return 0;
}

static int rank_serve(rank_state_t *st)
{
    for (;;) {
        dh_wire_received_t r;
        memset(&r, 0, sizeof r);
        int rc = dh_wire_recv(st->sock, 1000, &r);
        if (rc == DH_EAGAIN) {
            if (getppid() != st->parent) /* the coordinator is gone */
                return dh__set_error(DH_EEOF, "rank %" PRIu32 ": the coordinator exited", st->rank);
            continue;
        }
        if (rc)
            return rc;
        const dh_msg_t *m = &r.msg;
        if (m->type == DH_MSG_REQUEST) {
            if (st->rank == 0 && m->request.seq == st->opt->test_exit_round)
                _exit(7); /* a rank lost mid-round (tests) */
            rc = rank_holdings(st, m->request.seq);
        } else if (m->type == DH_MSG_DELIVER && strcmp(m->deliver.client_id, KIND_HANDOFF) == 0) {
            rc = rank_handoff(st, &m->deliver);
        } else if (m->type == DH_MSG_DELIVER && strcmp(m->deliver.client_id, KIND_ASSIGN) == 0) {
            rc = rank_assign(st, &m->deliver);
        } else if (m->type == DH_MSG_GOODBYE) {
            /* leave: drop every reference held; exiting with status 0 says it went well */
            for (uint32_t i = 0; i < st->opt->clips && rc == 0; i++) {
                dh_shm_handle_t h = dh__rebalance_handle_of(&st->have[i]);
                if (st->holds[i] && (rc = dh_shm_arena_unref(st->arena, &h)) == 0)
                    st->holds[i] = 0;
            }
            if (rc)
                rc = dh__rebalance_with_context(rc, "rank %" PRIu32 ": releasing its clips",
                                                st->rank);
            dh_wire_received_release(&r);
            return rc;
        } else {
            rc = dh__set_error(-EPROTO, "rank %" PRIu32 ": unexpected %s", st->rank,
                               dh_msg_type_name(m->type));
        }
        dh_wire_received_release(&r);
        if (rc)
            return rc;
    }
}

static int rank_run(rank_state_t *st, int arena_fd, int setup_fd)
{
    const uint32_t clips = st->opt->clips;
    int rc = dh_shm_arena_attach(&st->arena, arena_fd);
    if (rc)
        return rc;
    size_t size;
    dh_shm_arena_mapping(st->arena, (const void **)&st->base, &size);
    st->holds = dh_calloc(clips, 1);
    st->have = dh_calloc(clips, sizeof *st->have);
    st->out = dh_calloc(clips, sizeof *st->out);
    if (!st->holds || !st->have || !st->out)
        return dh__set_error(DH_ENOMEM, "rank %" PRIu32 ": out of memory", st->rank);
    uint32_t len = 0;
    char endpoint[ENDPOINT_CAP] = {0};
    if ((rc = dh__rebalance_read_exact(setup_fd, &len, sizeof len)) || len >= sizeof endpoint ||
        (rc = dh__rebalance_read_exact(setup_fd, endpoint, len)))
        return dh__set_error(rc ? rc : DH_EPARSE, "rank %" PRIu32 ": no coordinator endpoint",
                             st->rank);
    st->ctx = zmq_ctx_new();
    if (!st->ctx)
        return dh__set_error(DH_ENOMEM, "rank %" PRIu32 ": zmq_ctx_new failed", st->rank);
    char id[32];
    snprintf(id, sizeof id, "rank-%" PRIu32, st->rank);
    if ((rc = dh_wire_socket_new(&st->sock, st->ctx, ZMQ_DEALER, NULL)) ||
        (rc = dh__wire_set_routing_id(st->sock, id)) ||
        (rc = dh_wire_socket_connect(st->sock, endpoint)))
        return rc;
    dh_msg_t hello = {.type = DH_MSG_HELLO};
    hello.hello.role = DH_WIRE_ROLE_CLIENT;
    hello.hello.node = (char *)"bench-node";
    hello.hello.name = id;
    hello.hello.pid = (uint32_t)getpid();
    hello.hello.rank = st->rank;
    if ((rc = dh_wire_send(st->sock, NULL, 0, &hello, NULL, 0, STEP_TIMEOUT_MS)))
        return rc;
    return rank_serve(st);
}

/* A rank's whole life: never returns. It dies with the coordinator (PR_SET_PDEATHSIG, and
 * its receive loop checks the parent). Errors go to the coordinator as an ERROR message
 * when the socket is up, and to standard error. */
void dh__rebalance_rank_main(const dh_rebalance_bench_options_t *opt, uint32_t rank, pid_t parent,
                             int arena_fd, int setup_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(3);
    rank_state_t st = {.opt = opt, .rank = rank, .parent = parent};
    int rc = rank_run(&st, arena_fd, setup_fd);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dh_last_error());
        if (st.sock) {
            dh_msg_t e = {.type = DH_MSG_ERROR};
            e.error.code = rc;
            e.error.message = msg;
            dh_wire_send(st.sock, NULL, 0, &e, NULL, 0, 1000);
        }
        fprintf(stderr, "rebalance-bench: rank %" PRIu32 ": %s (%s)\n", rank, msg, dh_err_name(rc));
    }
    /* the memory and the mapping go with the process; the socket must close before the
     * context terminates, after its last message (an ERROR) is out */
    if (st.sock) {
        int linger = 2000;
        zmq_setsockopt(dh_wire_socket_handle(st.sock), ZMQ_LINGER, &linger, sizeof linger);
    }
    dh_wire_socket_destroy(&st.sock);
    if (st.ctx)
        zmq_ctx_term(st.ctx);
    _exit(rc ? 1 : 0);
}
