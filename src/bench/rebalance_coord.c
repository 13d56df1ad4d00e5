/* rebalance_coord.c: the stand-in coordinator of rebalance-bench's on-node part, as
 * the ranks see it: it forks the ranks, serves them over its own ROUTER on
 * tcp://127.0.0.1, places the clips, and at the end sees them leave holding nothing. Every
 * wait is a receive with a deadline that also notices a dead rank. The rounds between are
 * in rebalance_rounds.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/wire.h"
#include "wire/wire_lib.h"
#include "bench/rebalance_bench_internal.h"

/* Kills rank r if it still runs, and reaps it. */
static void kill_and_reap(onnode_t *o, uint32_t r)
{
    if (o->pid[r] <= 0)
        return;
    kill(o->pid[r], SIGKILL);
    while (waitpid(o->pid[r], NULL, 0) < 0 && errno == EINTR)
        ;
    o->pid[r] = 0;
}

/* A rank that exited: an error naming it and its status (0 when all are alive). */
static int ranks_alive(onnode_t *o)
{
    for (uint32_t r = 0; r < o->opt->ranks; r++) {
        int status = 0;
        if (o->pid[r] <= 0 || waitpid(o->pid[r], &status, WNOHANG) != o->pid[r])
            continue;
        pid_t pid = o->pid[r];
        o->pid[r] = 0;
        if (WIFSIGNALED(status))
            return dh__set_error(DH_EIO, "on-node: rank %" PRIu32 " (pid %d) died of signal %d", r,
                                 (int)pid, WTERMSIG(status));
        return dh__set_error(DH_EIO,
                             "on-node: rank %" PRIu32 " (pid %d) exited with status %d (its "
                             "message is on standard error)",
                             r, (int)pid, WEXITSTATUS(status));
    }
    return 0;
}

static long rank_of_id(const dh_wire_received_t *r, uint32_t ranks)
{
    char id[32];
    if (r->routing_id_size < 6 || r->routing_id_size >= sizeof id)
        return -1;
    memcpy(id, r->routing_id, r->routing_id_size);
    id[r->routing_id_size] = '\0';
    if (strncmp(id, "rank-", 5) != 0 || id[5] < '0' || id[5] > '9')
        return -1;
    char *end = NULL;
    unsigned long v = strtoul(id + 5, &end, 10);
    return *end == '\0' && v < ranks ? (long)v : -1;
}

/* The next message from a rank, within STEP_TIMEOUT_MS; fails when a rank exits, sends an
 * ERROR, or is not one of ours. `what` names the wait in messages. */
int dh__rebalance_coord_recv(onnode_t *o, dh_wire_received_t *r, uint32_t *rank, const char *what)
{
    uint64_t deadline = dh_clock_now_ns() + (uint64_t)STEP_TIMEOUT_MS * 1000000u;
    for (;;) {
        memset(r, 0, sizeof *r);
        int rc = dh_wire_recv(o->router, SLICE_MS, r);
        if (rc == 0) {
            long k = rank_of_id(r, o->opt->ranks);
            if (k < 0) {
                dh_wire_received_release(r);
                return dh__set_error(-EPROTO, "on-node: %s: a message from an unknown peer", what);
            }
            *rank = (uint32_t)k;
            if (r->msg.type == DH_MSG_ERROR) {
                rc = dh__set_error(r->msg.error.code < 0 ? r->msg.error.code : DH_EIO,
                                   "on-node: %s: %s", what, r->msg.error.message);
                dh_wire_received_release(r);
                return rc;
            }
            return 0;
        }
        if (rc != DH_EAGAIN)
            return rc;
        if ((rc = ranks_alive(o)))
            return rc;
        if (dh_clock_now_ns() > deadline)
            return dh__set_error(-ETIMEDOUT, "on-node: %s: no reply within %d ms", what,
                                 STEP_TIMEOUT_MS);
    }
}

int dh__rebalance_send_to_rank(onnode_t *o, uint32_t rank, const dh_msg_t *m)
{
    char id[32];
    int n = snprintf(id, sizeof id, "rank-%" PRIu32, rank);
    return dh_wire_send(o->router, id, (size_t)n, m, NULL, 0, STEP_TIMEOUT_MS);
}

int dh__rebalance_send_deliver(onnode_t *o, uint32_t rank, const char *kind, uint64_t seq,
                               uint32_t n_tensors, uint32_t n_gone)
{
    dh_msg_t m = {.type = DH_MSG_DELIVER};
    m.deliver.client_id = (char *)kind;
    m.deliver.seq = seq;
    m.deliver.n_tensors = n_tensors;
    m.deliver.tensors = o->tensors;
    m.deliver.n_samples = n_gone;
    m.deliver.samples = o->gone;
    m.deliver.ready_ns = dh_clock_now_ns();
    m.deliver.server = (char *)"coordinator";
    return dh__rebalance_send_to_rank(o, rank, &m);
}

/* Forks the ranks, each attached to the arena over the inherited memfd. Called before this
 * process has a ZeroMQ context or a thread of this run. */
int dh__rebalance_start_ranks(onnode_t *o)
{
    const pid_t parent = getpid();
    fflush(NULL); /* a child must not inherit unwritten output */
    for (uint32_t r = 0; r < o->opt->ranks; r++) {
        int fds[2]; /* [0] the rank's end, [1] the coordinator's */
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
            return dh__set_error(-errno, "on-node: socketpair for rank %" PRIu32 ": %s", r,
                                 strerror(errno));
        pid_t pid = fork();
        if (pid < 0) {
            int e = errno;
            close(fds[0]);
            close(fds[1]);
            return dh__set_error(-e, "on-node: fork of rank %" PRIu32 ": %s", r, strerror(e));
        }
        if (pid == 0) {
            close(fds[1]);
            for (uint32_t q = 0; q < r; q++)
                close(o->setup_w[q]);
            dh__rebalance_rank_main(o->opt, r, parent, dh_shm_arena_fd(o->arena), fds[0]);
        }
        close(fds[0]);
        o->pid[r] = pid;
        o->setup_w[r] = fds[1];
    }
    return 0;
}

/* Binds the coordinator's ROUTER, tells each rank where, and waits for every HELLO. */
int dh__rebalance_connect_ranks(onnode_t *o)
{
    const uint32_t ranks = o->opt->ranks;
    o->ctx = zmq_ctx_new();
    if (!o->ctx)
        return dh__set_error(DH_ENOMEM, "on-node: zmq_ctx_new failed");
    char endpoint[ENDPOINT_CAP];
    int rc;
    if ((rc = dh_wire_socket_new(&o->router, o->ctx, ZMQ_ROUTER, NULL)) ||
        (rc = dh_wire_socket_bind(o->router, "tcp://127.0.0.1:*")) ||
        (rc = dh__wire_last_endpoint(o->router, endpoint, sizeof endpoint)))
        return rc;
    uint32_t len = (uint32_t)strlen(endpoint);
    for (uint32_t r = 0; r < ranks; r++) {
        if ((rc = dh__rebalance_send_exact(o->setup_w[r], &len, sizeof len)) ||
            (rc = dh__rebalance_send_exact(o->setup_w[r], endpoint, len)))
            return dh__set_error(rc, "on-node: cannot tell rank %" PRIu32 " the endpoint", r);
        close(o->setup_w[r]);
        o->setup_w[r] = -1;
    }
    bool seen[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t got = 0; got < ranks;) {
        dh_wire_received_t m;
        uint32_t r;
        if ((rc = dh__rebalance_coord_recv(o, &m, &r, "waiting for the ranks' HELLO")))
            return rc;
        bool ok = m.msg.type == DH_MSG_HELLO && m.msg.hello.rank == r &&
                  m.msg.hello.pid == (uint32_t)o->pid[r] && !seen[r];
        dh_wire_received_release(&m);
        if (!ok)
            return dh__set_error(-EPROTO, "on-node: rank %" PRIu32 " did not say HELLO as itself",
                                 r);
        seen[r] = true;
        got++;
    }
    return 0;
}

/* Allocates and fills the clips, each held by its first rank (clip i by rank i % ranks),
 * and tells each rank what it holds. */
int dh__rebalance_place_clips(onnode_t *o)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    for (uint32_t i = 0; i < opt->clips; i++) {
        clip_book_t *c = &o->book[i];
        c->owner = c->next_owner = i % opt->ranks;
        o->expected[c->owner]++;
        void *p = NULL;
        int rc = dh_shm_arena_alloc(o->arena, o->clip_bytes, o->pid[c->owner], &c->handle, &p);
        if (rc)
            return dh__rebalance_with_context(rc, "on-node: allocating clip %" PRIu32, i);
        dh__rebalance_clip_fill(p, o->clip_bytes, dh__rebalance_clip_tag(opt->seed, i));
    }
    for (uint32_t r = 0; r < opt->ranks; r++) {
        uint32_t n = 0;
        for (uint32_t i = 0; i < opt->clips; i++)
            if (o->book[i].owner == r)
                dh__rebalance_clip_tensor(&o->tensors[n++], opt, i, &o->book[i].handle);
        int rc = dh__rebalance_send_deliver(o, r, KIND_ASSIGN, 0, n, 0);
        if (rc)
            return rc;
    }
    return 0;
}

/* The ranks leave: the coordinator keeps every clip (one reference each, for part b), each
 * rank, told GOODBYE, drops the references it holds and exits; then each clip must have
 * exactly the coordinator's reference: every rank held each of its clips exactly once. */
int dh__rebalance_release_ranks(onnode_t *o)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    int rc;
    for (uint32_t i = 0; i < opt->clips; i++)
        if ((rc = dh_shm_arena_ref(o->arena, &o->book[i].handle)))
            return rc;
    o->coordinator_refs = true;
    dh_msg_t bye = {.type = DH_MSG_GOODBYE};
    for (uint32_t r = 0; r < opt->ranks; r++)
        if ((rc = dh__rebalance_send_to_rank(o, r, &bye)))
            return rc;
    /* each drops its references and exits with status 0: wait for every exit, in receive
     * slices that catch a rank's ERROR */
    uint64_t deadline = dh_clock_now_ns() + (uint64_t)STEP_TIMEOUT_MS * 1000000u;
    for (;;) {
        uint32_t left = 0;
        for (uint32_t r = 0; r < opt->ranks; r++) {
            int status = 0;
            if (o->pid[r] <= 0)
                continue;
            if (waitpid(o->pid[r], &status, WNOHANG) != o->pid[r]) {
                left++;
                continue;
            }
            o->pid[r] = 0;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return dh__set_error(DH_EIO,
                                     "on-node: rank %" PRIu32 " failed leaving (wait status %d; "
                                     "its message is on standard error)",
                                     r, status);
        }
        if (left == 0)
            break;
        if (dh_clock_now_ns() > deadline)
            return dh__set_error(-ETIMEDOUT, "on-node: %" PRIu32 " ranks did not exit", left);
        dh_wire_received_t m;
        memset(&m, 0, sizeof m);
        rc = dh_wire_recv(o->router, 10, &m);
        if (rc == 0) {
            rc = m.msg.type == DH_MSG_ERROR
                     ? dh__set_error(DH_EIO, "on-node: leaving: %s", m.msg.error.message)
                     : dh__set_error(-EPROTO, "on-node: unexpected %s while the ranks leave",
                                     dh_msg_type_name(m.msg.type));
            dh_wire_received_release(&m);
            return rc;
        }
        if (rc != DH_EAGAIN)
            return rc;
    }
    for (uint32_t i = 0; i < opt->clips; i++) {
        int refs = dh_shm_arena_refcount(o->arena, &o->book[i].handle);
        if (refs != 1)
            return dh__set_error(-EPROTO,
                                 "on-node: clip %" PRIu32 " has %d references after the ranks "
                                 "left; only the coordinator's 1 should remain",
                                 i, refs);
    }
    return 0;
}

void dh__rebalance_onnode_stop(onnode_t *o)
{
    for (uint32_t r = 0; r < DH_REBALANCE_BENCH_MAX_RANKS; r++) {
        if (o->setup_w[r] >= 0)
            close(o->setup_w[r]);
        o->setup_w[r] = -1;
        kill_and_reap(o, r);
    }
    dh_wire_socket_destroy(&o->router);
    if (o->ctx)
        zmq_ctx_term(o->ctx);
    o->ctx = NULL;
}
