/* rebalance_bench.c: see rebalance_bench.h. The on-node part forks the ranks (before any
 * ZeroMQ context or thread exists in this process), serves them as a coordinator over a
 * ROUTER, and checks every invariant from the messages; the cross part is two threads of
 * this process (sender and receiver "nodes") over tcp://127.0.0.1, once through ZeroMQ and
 * once through a plain socket. Nothing waits on a fixed sleep: every wait is a receive with
 * a deadline that also notices a dead rank or receiver.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/shm.h"
#include "datahelix/stats.h"
#include "datahelix/wire.h"
#include "wire/wire_lib.h"
#include "bench/rebalance_bench.h"

#define CHANNELS 3
#define STEP_TIMEOUT_MS 60000 /* longest wait for one reply: a stuck peer fails the run */
#define SLICE_MS 200          /* receive slice between liveness checks */
#define MAX_ARENA_BYTES ((uint64_t)8 << 30)
#define ENDPOINT_CAP 256

#define KIND_ASSIGN "assign"     /* coordinator -> rank: clips allocated for it (set-up) */
#define KIND_HOLDINGS "holdings" /* rank -> coordinator: the clips it holds (the gather) */
#define KIND_HANDOFF "handoff"   /* coordinator -> rank: clips it takes over / gives away */
#define KIND_TAKEN "taken"       /* rank -> coordinator: the clips it took, as resolved */

void dh_rebalance_bench_options_default(dh_rebalance_bench_options_t *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->clips = 64;
    opt->ranks = 8;
    opt->frames = 16;
    opt->height = 224;
    opt->width = 224;
    opt->rounds = 20;
    opt->move_fraction = 1.0;
    opt->seed = 1;
}

static uint64_t clip_bytes_of(const dh_rebalance_bench_options_t *opt)
{
    return (uint64_t)opt->frames * opt->height * opt->width * CHANNELS;
}

/* Bytes of an arena holding every clip in slabs of the default size, header included. */
static uint64_t arena_bytes_for(const dh_rebalance_bench_options_t *opt)
{
    const uint64_t slab = DH_SHM_DEFAULT_SLAB_SIZE;
    uint64_t per_clip = (clip_bytes_of(opt) + slab - 1) / slab;
    return ((uint64_t)opt->clips * per_clip + 2) * slab;
}

int dh_rebalance_bench_check(const dh_rebalance_bench_options_t *o)
{
    if (o->clips < 1 || o->clips > DH_REBALANCE_BENCH_MAX_CLIPS)
        return dh__set_error(DH_EINVAL, "--clips must be 1..%d, got %" PRIu32,
                             DH_REBALANCE_BENCH_MAX_CLIPS, o->clips);
    if (o->ranks < 2 || o->ranks > DH_REBALANCE_BENCH_MAX_RANKS)
        return dh__set_error(DH_EINVAL, "--ranks must be 2..%d, got %" PRIu32,
                             DH_REBALANCE_BENCH_MAX_RANKS, o->ranks);
    if (o->frames < 1 || o->frames > 4096)
        return dh__set_error(DH_EINVAL, "--frames must be 1..4096, got %" PRIu32, o->frames);
    if (o->height < 1 || o->height > 8192)
        return dh__set_error(DH_EINVAL, "--height must be 1..8192, got %" PRIu32, o->height);
    if (o->width < 1 || o->width > 8192)
        return dh__set_error(DH_EINVAL, "--width must be 1..8192, got %" PRIu32, o->width);
    if (o->rounds < 1 || o->rounds > 10000)
        return dh__set_error(DH_EINVAL, "--rounds must be 1..10000, got %" PRIu32, o->rounds);
    if (!(o->move_fraction >= 0 && o->move_fraction <= 1))
        return dh__set_error(DH_EINVAL, "--move-fraction must be in [0, 1], got %g",
                             o->move_fraction);
    uint64_t clip = clip_bytes_of(o);
    if (clip < 64)
        return dh__set_error(DH_EINVAL,
                             "--frames x --height x --width x 3 is %" PRIu64
                             " bytes; a clip needs at least 64 (its stamps)",
                             clip);
    if (clip > ((uint64_t)1 << 30))
        return dh__set_error(
            DH_EINVAL,
            "--frames x --height x --width x 3 is %" PRIu64 " bytes; at most 1 GiB per clip", clip);
    if (arena_bytes_for(o) > MAX_ARENA_BYTES)
        return dh__set_error(
            DH_EINVAL,
            "--clips %" PRIu32 " of %" PRIu64 " bytes need an arena of %.1f GB; at most %.1f GB",
            o->clips, clip, (double)arena_bytes_for(o) / 1e9, (double)MAX_ARENA_BYTES / 1e9);
    return 0;
}

/* Sets rc's message to "<context>: <the current message>". (dh__set_error formats into the
 * buffer dh_last_error() returns, so the current message is copied out first.) */
static int with_context(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int with_context(int rc, const char *fmt, ...)
{
    char prev[512], context[512];
    snprintf(prev, sizeof prev, "%s", dh_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    return dh__set_error(rc, "%s: %s", context, prev);
}

/* ---- clips: their bytes, their tensors ------------------------------------------------- */

/* A clip's stamp: written at its start, middle and end, the rest filled with its top byte,
 * so a receiver can tell the clip (and a copy gone wrong) from a few bytes. */
static uint64_t clip_tag(uint64_t seed, uint32_t clip)
{
    return dh_rng_mix(seed ^ 0x72656261u, (uint64_t)clip + 1);
}

static size_t clip_middle(size_t len)
{
    return (len / 2) & ~(size_t)7;
}

static void clip_fill(uint8_t *p, size_t len, uint64_t tag)
{
    memset(p, (int)(tag >> 56), len);
    memcpy(p, &tag, 8);
    memcpy(p + clip_middle(len), &tag, 8);
    memcpy(p + len - 8, &tag, 8);
}

static bool clip_intact(const uint8_t *p, size_t len, uint64_t tag)
{
    uint64_t a, b, c;
    memcpy(&a, p, 8);
    memcpy(&b, p + clip_middle(len), 8);
    memcpy(&c, p + len - 8, 8);
    const uint8_t fill = (uint8_t)(tag >> 56);
    return a == tag && b == tag && c == tag && p[clip_middle(len) - 1] == fill &&
           p[len - 9] == fill;
}

/* A clip's tensor: "clip<index>", uint8 frames x height x width x 3, contiguous; with the
 * handle for a shared-memory one, a payload frame otherwise. */
static void clip_tensor(dh_wire_tensor_t *w, const dh_rebalance_bench_options_t *opt, uint32_t clip,
                        const dh_shm_handle_t *h)
{
    memset(w, 0, sizeof *w);
    snprintf(w->tensor.name, sizeof w->tensor.name, "clip%" PRIu32, clip);
    w->tensor.dtype = DH_DTYPE_UINT8;
    w->tensor.ndim = 4;
    w->tensor.shape[0] = opt->frames;
    w->tensor.shape[1] = opt->height;
    w->tensor.shape[2] = opt->width;
    w->tensor.shape[3] = CHANNELS;
    dh_tensor_set_contiguous(&w->tensor);
    if (h) {
        w->location = DH_WIRE_LOC_SHM;
        w->arena_id = h->arena_id;
        w->offset = h->offset;
        w->length = h->length;
        w->generation = h->generation;
    } else {
        w->location = DH_WIRE_LOC_FRAME;
    }
}

static dh_shm_handle_t handle_of(const dh_wire_tensor_t *w)
{
    return (dh_shm_handle_t){w->arena_id, w->offset, w->length, w->generation};
}

/* The clip index a name "clip<index>" names, or -1 when it names none of the run's clips. */
static long clip_index(const char *name, uint32_t clips)
{
    if (strncmp(name, "clip", 4) != 0 || name[4] < '0' || name[4] > '9')
        return -1;
    char *end = NULL;
    unsigned long v = strtoul(name + 4, &end, 10);
    return *end == '\0' && v < clips ? (long)v : -1;
}

/* A received clip tensor of the run's shape and dtype, in the expected location; returns
 * its index or -1. */
static long clip_of_tensor(const dh_wire_tensor_t *w, const dh_rebalance_bench_options_t *opt,
                           uint8_t location)
{
    const dh_tensor_t *t = &w->tensor;
    if (w->location != location || t->dtype != DH_DTYPE_UINT8 || t->ndim != 4 ||
        t->shape[0] != opt->frames || t->shape[1] != opt->height || t->shape[2] != opt->width ||
        t->shape[3] != CHANNELS || t->nbytes != clip_bytes_of(opt))
        return -1;
    return clip_index(t->name, opt->clips);
}

static int read_exact(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? DH_EEOF : -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* To a socket: a rank already gone is -EPIPE, not a SIGPIPE. */
static int send_exact(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? DH_EIO : -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- a rank (a forked process) ---------------------------------------------------------- */

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
    const size_t len = (size_t)clip_bytes_of(st->opt);
    for (uint32_t i = 0; i < d->n_samples; i++) {
        long k = clip_index(d->samples[i].id, clips);
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
        long k = clip_of_tensor(w, st->opt, DH_WIRE_LOC_SHM);
        if (k < 0 || st->holds[k])
            return dh__set_error(-EPROTO, "rank %" PRIu32 ": bad or already held clip '%s'",
                                 st->rank, w->tensor.name);
        dh_shm_handle_t h = handle_of(w);
        void *p = NULL;
        int rc = dh_shm_arena_ref_for(st->arena, &h, self);
        if (rc == 0)
            rc = dh_shm_arena_unref(st->arena, &h);
        if (rc == 0)
            rc = dh_shm_arena_resolve(st->arena, &h, &p);
        if (rc)
            return with_context(rc, "rank %" PRIu32 ": taking over %s", st->rank, w->tensor.name);
        if (!clip_intact(p, len, clip_tag(st->opt->seed, (uint32_t)k)))
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
        long k = clip_of_tensor(&d->tensors[i], st->opt, DH_WIRE_LOC_SHM);
        dh_shm_handle_t h = handle_of(&d->tensors[i]);
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
                dh_shm_handle_t h = handle_of(&st->have[i]);
                if (st->holds[i] && (rc = dh_shm_arena_unref(st->arena, &h)) == 0)
                    st->holds[i] = 0;
            }
            if (rc)
                rc = with_context(rc, "rank %" PRIu32 ": releasing its clips", st->rank);
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
    if ((rc = read_exact(setup_fd, &len, sizeof len)) || len >= sizeof endpoint ||
        (rc = read_exact(setup_fd, endpoint, len)))
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
static void rank_main(const dh_rebalance_bench_options_t *opt, uint32_t rank, pid_t parent,
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

/* ---- the coordinator of the on-node part ------------------------------------------------ */

typedef struct clip_book {
    dh_shm_handle_t handle;    /* as allocated */
    uint32_t owner;            /* the rank holding it, as this book says */
    uint32_t next_owner;       /* this round's decision */
    uint32_t seen_round;       /* round number of the last gather or ack that named it */
    dh_wire_tensor_t gathered; /* the tensor its holder sent in this round's gather */
} clip_book_t;

typedef struct onnode {
    const dh_rebalance_bench_options_t *opt;
    dh_rebalance_bench_report_t *out;
    size_t clip_bytes;
    dh_shm_arena_t *arena;
    pid_t pid[DH_REBALANCE_BENCH_MAX_RANKS];         /* 0: not started or reaped */
    int setup_w[DH_REBALANCE_BENCH_MAX_RANKS];       /* our end of each rank's set-up socket */
    uint32_t expected[DH_REBALANCE_BENCH_MAX_RANKS]; /* clips per rank (kept by every move) */
    void *ctx;
    dh_wire_socket_t *router;
    clip_book_t *book;
    uint32_t *order, *scratch;     /* clips each, for the moves */
    dh_wire_tensor_t *tensors;     /* clips, for messages */
    dh_wire_sample_result_t *gone; /* clips, for messages */
    char (*gone_ids)[16];
    bool coordinator_refs; /* this process took a reference on every clip */
} onnode_t;

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
static int coord_recv(onnode_t *o, dh_wire_received_t *r, uint32_t *rank, const char *what)
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

static int send_to_rank(onnode_t *o, uint32_t rank, const dh_msg_t *m)
{
    char id[32];
    int n = snprintf(id, sizeof id, "rank-%" PRIu32, rank);
    return dh_wire_send(o->router, id, (size_t)n, m, NULL, 0, STEP_TIMEOUT_MS);
}

static int send_deliver(onnode_t *o, uint32_t rank, const char *kind, uint64_t seq,
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
    return send_to_rank(o, rank, &m);
}

/* Forks the ranks, each attached to the arena over the inherited memfd. Called before this
 * process has a ZeroMQ context or a thread of this run. */
static int start_ranks(onnode_t *o)
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
            rank_main(o->opt, r, parent, dh_shm_arena_fd(o->arena), fds[0]);
        }
        close(fds[0]);
        o->pid[r] = pid;
        o->setup_w[r] = fds[1];
    }
    return 0;
}

/* Binds the coordinator's ROUTER, tells each rank where, and waits for every HELLO. */
static int connect_ranks(onnode_t *o)
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
        if ((rc = send_exact(o->setup_w[r], &len, sizeof len)) ||
            (rc = send_exact(o->setup_w[r], endpoint, len)))
            return dh__set_error(rc, "on-node: cannot tell rank %" PRIu32 " the endpoint", r);
        close(o->setup_w[r]);
        o->setup_w[r] = -1;
    }
    bool seen[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t got = 0; got < ranks;) {
        dh_wire_received_t m;
        uint32_t r;
        if ((rc = coord_recv(o, &m, &r, "waiting for the ranks' HELLO")))
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
static int place_clips(onnode_t *o)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    for (uint32_t i = 0; i < opt->clips; i++) {
        clip_book_t *c = &o->book[i];
        c->owner = c->next_owner = i % opt->ranks;
        o->expected[c->owner]++;
        void *p = NULL;
        int rc = dh_shm_arena_alloc(o->arena, o->clip_bytes, o->pid[c->owner], &c->handle, &p);
        if (rc)
            return with_context(rc, "on-node: allocating clip %" PRIu32, i);
        clip_fill(p, o->clip_bytes, clip_tag(opt->seed, i));
    }
    for (uint32_t r = 0; r < opt->ranks; r++) {
        uint32_t n = 0;
        for (uint32_t i = 0; i < opt->clips; i++)
            if (o->book[i].owner == r)
                clip_tensor(&o->tensors[n++], opt, i, &o->book[i].handle);
        int rc = send_deliver(o, r, KIND_ASSIGN, 0, n, 0);
        if (rc)
            return rc;
    }
    return 0;
}

/* This round's decision, the same for every run of a seed: a share of the clips, chosen at
 * random, move among the slots they free, so every rank keeps its count. The moving clips
 * are grouped by owner (ranks in a random order, clips in a random order within), and each
 * takes the slot `largest group` places further on: when no rank holds more than half the
 * moving clips, every one of them changes owner. Returns the clips that change owner.
 * Cost: O(clips + ranks). */
static uint32_t plan_moves(onnode_t *o, uint32_t round)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    const uint32_t n = opt->clips, ranks = opt->ranks;
    dh_rng_t rng;
    dh_rng_seed(&rng, dh_rng_mix(opt->seed, (uint64_t)round));
    for (uint32_t i = 0; i < n; i++) {
        o->book[i].next_owner = o->book[i].owner;
        o->order[i] = i;
    }
    uint32_t m = (uint32_t)(opt->move_fraction * n + 0.5);
    for (uint32_t j = 0; j < m; j++) { /* a random m-subset, in random order */
        uint32_t k = j + (uint32_t)dh_rng_below(&rng, n - j), t = o->order[j];
        o->order[j] = o->order[k];
        o->order[k] = t;
    }
    uint32_t rank_order[DH_REBALANCE_BENCH_MAX_RANKS], start[DH_REBALANCE_BENCH_MAX_RANKS + 1];
    uint32_t group[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t r = 0; r < ranks; r++)
        rank_order[r] = r;
    for (uint32_t r = ranks; r > 1; r--) {
        uint32_t k = (uint32_t)dh_rng_below(&rng, r), t = rank_order[r - 1];
        rank_order[r - 1] = rank_order[k];
        rank_order[k] = t;
    }
    /* stable counting sort of the moving clips by their owner's place in rank_order */
    uint32_t place[DH_REBALANCE_BENCH_MAX_RANKS];
    for (uint32_t r = 0; r < ranks; r++)
        place[rank_order[r]] = r;
    for (uint32_t j = 0; j < m; j++)
        group[place[o->book[o->order[j]].owner]]++;
    uint32_t largest = 0;
    start[0] = 0;
    for (uint32_t r = 0; r < ranks; r++) {
        start[r + 1] = start[r] + group[r];
        if (group[r] > largest)
            largest = group[r];
    }
    for (uint32_t j = 0; j < m; j++)
        o->scratch[start[place[o->book[o->order[j]].owner]]++] = o->order[j];
    uint32_t moved = 0;
    for (uint32_t j = 0; j < m; j++) {
        clip_book_t *c = &o->book[o->scratch[j]];
        c->next_owner = o->book[o->scratch[(j + largest) % m]].owner;
        moved += c->next_owner != c->owner;
    }
    for (uint32_t i = 0; i < n; i++)
        o->out->moves_digest =
            dh_rng_mix(o->out->moves_digest, ((uint64_t)i << 32) | o->book[i].next_owner);
    return moved;
}

/* The gather: every rank reports its clips; each must be named once, by the rank this
 * book says holds it, with the handle it was allocated with; and every rank keeps its
 * count. */
static int gather(onnode_t *o, uint32_t round)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    dh_msg_t req = {.type = DH_MSG_REQUEST};
    req.request.client_id = (char *)"coordinator";
    req.request.seq = round;
    req.request.delivery_node = (char *)"bench-node";
    int rc;
    for (uint32_t r = 0; r < opt->ranks; r++) {
        req.request.rank = r;
        if ((rc = send_to_rank(o, r, &req)))
            return rc;
    }
    bool seen[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t got = 0; got < opt->ranks; got++) {
        dh_wire_received_t m;
        uint32_t r;
        if ((rc = coord_recv(o, &m, &r, "gathering the ranks' clips")))
            return rc;
        const dh_msg_deliver_t *d = &m.msg.deliver;
        if (m.msg.type != DH_MSG_DELIVER || strcmp(d->client_id, KIND_HOLDINGS) != 0 ||
            d->seq != round || seen[r])
            rc = dh__set_error(-EPROTO,
                               "on-node: round %" PRIu32 ": rank %" PRIu32
                               " sent an unexpected %s in the gather",
                               round, r, dh_msg_type_name(m.msg.type));
        else if (d->n_tensors != o->expected[r])
            rc = dh__set_error(-EPROTO,
                               "on-node: round %" PRIu32 ": rank %" PRIu32 " holds %" PRIu32
                               " clips, it should hold %" PRIu32,
                               round, r, d->n_tensors, o->expected[r]);
        seen[r] = true;
        for (uint32_t i = 0; i < d->n_tensors && rc == 0; i++) {
            const dh_wire_tensor_t *w = &d->tensors[i];
            long k = clip_of_tensor(w, opt, DH_WIRE_LOC_SHM);
            clip_book_t *c = k >= 0 ? &o->book[k] : NULL;
            dh_shm_handle_t h = handle_of(w);
            if (!c || c->seen_round == round || c->owner != r ||
                memcmp(&h, &c->handle, sizeof h) != 0)
                rc = dh__set_error(-EPROTO,
                                   "on-node: round %" PRIu32 ": rank %" PRIu32
                                   " reports '%s', which is not its own (held by rank %ld)",
                                   round, r, w->tensor.name, c ? (long)c->owner : -1L);
            else {
                c->seen_round = round;
                c->gathered = *w;
            }
        }
        dh_wire_received_release(&m);
        if (rc)
            return rc;
    }
    return 0;
}

/* The handoff of one round's decision and the receivers' reports. Counts, in the report,
 * the moved clips verified and those not found at their original slab. */
static int handoff(onnode_t *o, uint32_t round, uint32_t *verified, uint32_t *copies)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    uint32_t takes[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    int rc;
    for (uint32_t r = 0; r < opt->ranks; r++) {
        uint32_t nt = 0, ng = 0;
        for (uint32_t i = 0; i < opt->clips; i++) {
            const clip_book_t *c = &o->book[i];
            if (c->owner == c->next_owner)
                continue;
            if (c->next_owner == r)
                o->tensors[nt++] = c->gathered; /* the handle as its holder sent it */
            if (c->owner == r) {
                o->gone[ng] = (dh_wire_sample_result_t){.id = o->gone_ids[i], .error = ""};
                ng++;
            }
        }
        takes[r] = nt;
        if ((rc = send_deliver(o, r, KIND_HANDOFF, round, nt, ng)))
            return rc;
    }
    bool seen[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t got = 0; got < opt->ranks; got++) {
        dh_wire_received_t m;
        uint32_t r;
        if ((rc = coord_recv(o, &m, &r, "waiting for the handoff")))
            return rc;
        const dh_msg_deliver_t *d = &m.msg.deliver;
        if (m.msg.type != DH_MSG_DELIVER || strcmp(d->client_id, KIND_TAKEN) != 0 ||
            d->seq != round || seen[r] || d->n_tensors != takes[r])
            rc = dh__set_error(-EPROTO,
                               "on-node: round %" PRIu32 ": rank %" PRIu32
                               " sent an unexpected %s after the handoff",
                               round, r, dh_msg_type_name(m.msg.type));
        seen[r] = true;
        for (uint32_t i = 0; i < d->n_tensors && rc == 0; i++) {
            const dh_wire_tensor_t *w = &d->tensors[i];
            long k = clip_of_tensor(w, opt, DH_WIRE_LOC_SHM);
            clip_book_t *c = k >= 0 ? &o->book[k] : NULL;
            if (!c || c->next_owner != r || c->owner == r)
                rc = dh__set_error(-EPROTO,
                                   "on-node: round %" PRIu32 ": rank %" PRIu32
                                   " took '%s', which was not for it",
                                   round, r, w->tensor.name);
            else {
                (*verified)++;
                /* the receiver resolved it where it was allocated: same bytes, no copy */
                if (w->offset != c->handle.offset || w->generation != c->handle.generation ||
                    w->arena_id != c->handle.arena_id)
                    (*copies)++;
            }
        }
        dh_wire_received_release(&m);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < opt->clips; i++)
        o->book[i].owner = o->book[i].next_owner;
    return 0;
}

/* The ranks leave: the coordinator keeps every clip (one reference each, for part b), each
 * rank, told GOODBYE, drops the references it holds and exits; then each clip must have
 * exactly the coordinator's reference: every rank held each of its clips exactly once. */
static int release_ranks(onnode_t *o)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    int rc;
    for (uint32_t i = 0; i < opt->clips; i++)
        if ((rc = dh_shm_arena_ref(o->arena, &o->book[i].handle)))
            return rc;
    o->coordinator_refs = true;
    dh_msg_t bye = {.type = DH_MSG_GOODBYE};
    for (uint32_t r = 0; r < opt->ranks; r++)
        if ((rc = send_to_rank(o, r, &bye)))
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

static void progress(const dh_rebalance_bench_options_t *opt, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void progress(const dh_rebalance_bench_options_t *opt, const char *fmt, ...)
{
    if (!opt->progress)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    opt->progress(line, opt->ctx);
}

/* One round: the gather, the decision, the handoff; timed end to end. round 0 is the
 * untimed warm-up; round rounds + 1 only gathers (it checks the last handoff). */
static int onnode_rounds(onnode_t *o, double *ms, uint32_t *moved_min)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    int rc;
    *moved_min = UINT32_MAX;
    for (uint32_t round = 1; round <= opt->rounds + 1; round++) {
        uint64_t t0 = dh_clock_now_ns();
        if ((rc = gather(o, round)))
            return rc;
        uint32_t moved = plan_moves(o, round), verified = 0, copies = 0;
        if ((rc = handoff(o, round, &verified, &copies)))
            return rc;
        double dt = dh_clock_elapsed_s(t0, dh_clock_now_ns()) * 1e3;
        if (verified != moved)
            return dh__set_error(-EPROTO,
                                 "on-node: round %" PRIu32 ": %" PRIu32 " clips moved, %" PRIu32
                                 " reported taken",
                                 round, moved, verified);
        if (round == 1)
            continue; /* the warm-up: first touches of pages and connections */
        ms[round - 2] = dt;
        o->out->onnode_handoffs_verified += verified;
        o->out->onnode_pixel_copies += copies;
        if (moved < *moved_min)
            *moved_min = moved;
    }
    return gather(o, opt->rounds + 2); /* checks the last round's result */
}

static void onnode_stop(onnode_t *o)
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

/* ---- the cross-node part ---------------------------------------------------------------- */

typedef struct cross_rx {
    const dh_rebalance_bench_options_t *opt;
    void *ctx; /* node B's own ZeroMQ context (and I/O thread), as on another machine */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ready;      /* bound, or failed: endpoint or rc set */
    atomic_int done; /* the thread has finished */
    atomic_int stop;
    int rc;
    char endpoint[ENDPOINT_CAP];
    char error[512]; /* the thread's dh_last_error() when rc != 0 */
} cross_rx_t;

static void rx_ready(cross_rx_t *rx, int rc)
{
    pthread_mutex_lock(&rx->mu);
    rx->ready = true;
    rx->rc = rc;
    if (rc)
        snprintf(rx->error, sizeof rx->error, "%s", dh_last_error());
    pthread_cond_signal(&rx->cv);
    pthread_mutex_unlock(&rx->mu);
}

/* Places one round's clips (one DELIVER each, a payload frame) in arena B with one copy
 * each, as the runtime places a forwarded batch, and acknowledges the round with a COMPLETE
 * once it holds them all; then releases them (the consumer's part, not timed). */
static int rx_serve(cross_rx_t *rx, dh_shm_arena_t *arena, dh_wire_socket_t *router,
                    dh_shm_handle_t *placed)
{
    const dh_rebalance_bench_options_t *opt = rx->opt;
    uint32_t n = 0;
    uint64_t round = 0;
    while (!atomic_load(&rx->stop)) {
        dh_wire_received_t r;
        memset(&r, 0, sizeof r);
        int rc = dh_wire_recv(router, SLICE_MS, &r);
        if (rc == DH_EAGAIN)
            continue;
        if (rc)
            return rc;
        if (r.msg.type == DH_MSG_GOODBYE) {
            dh_wire_received_release(&r);
            return 0;
        }
        const dh_msg_deliver_t *d = &r.msg.deliver;
        long k = r.msg.type == DH_MSG_DELIVER && d->n_tensors == 1
                     ? clip_of_tensor(&d->tensors[0], opt, DH_WIRE_LOC_FRAME)
                     : -1;
        if (k < 0 || (n > 0 && d->seq != round))
            rc = dh__set_error(-EPROTO, "cross: the receiver got an unexpected %s",
                               dh_msg_type_name(r.msg.type));
        void *p = NULL;
        if (rc == 0)
            rc = dh_shm_arena_alloc(arena, d->tensors[0].tensor.nbytes, 0, &placed[n], &p);
        if (rc == 0) {
            const size_t len = d->tensors[0].tensor.nbytes;
            memcpy(p, d->tensors[0].tensor.data, len);
            if (!clip_intact(p, len, clip_tag(opt->seed, (uint32_t)k)))
                rc = dh__set_error(-EPROTO, "cross: clip %ld arrived with other bytes", k);
            round = d->seq;
            n++;
        }
        if (rc == 0 && n == opt->clips) {
            dh_msg_t ack = {.type = DH_MSG_COMPLETE};
            ack.complete.client_id = (char *)"node-b";
            ack.complete.seq = round;
            ack.complete.bytes = (uint64_t)n * d->tensors[0].tensor.nbytes;
            ack.complete.delivered = 1;
            rc = dh_wire_send(router, r.routing_id, r.routing_id_size, &ack, NULL, 0,
                              STEP_TIMEOUT_MS);
            for (uint32_t i = 0; i < n && rc == 0; i++)
                rc = dh_shm_arena_unref(arena, &placed[i]);
            n = 0;
        }
        if (rc) {
            dh_msg_t e = {.type = DH_MSG_ERROR};
            char msg[512];
            snprintf(msg, sizeof msg, "%s", dh_last_error());
            e.error.code = rc;
            e.error.message = msg;
            dh_wire_send(router, r.routing_id, r.routing_id_size, &e, NULL, 0, 1000);
            dh__set_error(rc, "%s", msg);
        }
        dh_wire_received_release(&r);
        if (rc)
            return rc;
    }
    return 0;
}

static void *rx_main(void *arg)
{
    cross_rx_t *rx = arg;
    dh_shm_arena_t *arena = NULL;
    dh_wire_socket_t *router = NULL;
    dh_shm_handle_t *placed = dh_calloc(rx->opt->clips, sizeof *placed);
    int rc = placed ? dh_shm_arena_new(&arena, arena_bytes_for(rx->opt), 0)
                    : dh__set_error(DH_ENOMEM, "cross: out of memory");
    if (rc == 0 && ((rc = dh_wire_socket_new(&router, rx->ctx, ZMQ_ROUTER, NULL)) ||
                    (rc = dh_wire_socket_bind(router, "tcp://127.0.0.1:*")) ||
                    (rc = dh__wire_last_endpoint(router, rx->endpoint, sizeof rx->endpoint))))
        dh_wire_socket_destroy(&router);
    rx_ready(rx, rc);
    if (rc == 0 && (rc = rx_serve(rx, arena, router, placed)) != 0) {
        pthread_mutex_lock(&rx->mu);
        rx->rc = rc;
        snprintf(rx->error, sizeof rx->error, "%s", dh_last_error());
        pthread_mutex_unlock(&rx->mu);
    }
    dh_wire_socket_destroy(&router);
    dh_shm_arena_destroy(&arena);
    dh_free(placed);
    atomic_store(&rx->done, 1);
    return NULL;
}

/* The raw baseline's receiver: each round's bytes into a 1 MiB buffer, then a 1-byte ack. */
typedef struct raw_rx {
    int fd;
    uint64_t per_round;
    uint32_t rounds;
    int rc;
} raw_rx_t;

static void *raw_main(void *arg)
{
    raw_rx_t *rx = arg;
    const size_t cap = (size_t)1 << 20;
    char *buf = dh_malloc(cap);
    rx->rc = buf ? 0 : DH_ENOMEM;
    for (uint32_t k = 0; k < rx->rounds && rx->rc == 0; k++) {
        uint64_t got = 0;
        while (got < rx->per_round) {
            uint64_t want = rx->per_round - got;
            ssize_t n = recv(rx->fd, buf, want < cap ? (size_t)want : cap, 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                rx->rc = n == 0 ? DH_EEOF : -errno;
                break;
            }
            got += (uint64_t)n;
        }
        char ack = 'k';
        if (rx->rc == 0 && send(rx->fd, &ack, 1, MSG_NOSIGNAL) != 1)
            rx->rc = -errno;
    }
    dh_free(buf);
    /* the sender's next read sees the end (or its writes fail) when this side fails */
    shutdown(rx->fd, SHUT_RDWR);
    return NULL;
}

/* A connected loopback TCP pair: *tx (sender) and *rxfd (receiver). */
static int tcp_pair(int *tx, int *rxfd)
{
    *tx = *rxfd = -1;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int rc = 0;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &len) != 0)
        rc = dh__set_error(-errno, "cross: raw TCP listen: %s", strerror(errno));
    if (rc == 0 && ((*tx = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
                    connect(*tx, (struct sockaddr *)&a, sizeof a) != 0))
        rc = dh__set_error(-errno, "cross: raw TCP connect: %s", strerror(errno));
    if (rc == 0 && (*rxfd = accept4(ls, NULL, NULL, SOCK_CLOEXEC)) < 0)
        rc = dh__set_error(-errno, "cross: raw TCP accept: %s", strerror(errno));
    /* as ZeroMQ does on its TCP sockets: no Nagle delay for the 1-byte ack */
    int one = 1;
    if (rc == 0 && (setsockopt(*tx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
                    setsockopt(*rxfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0))
        rc = dh__set_error(-errno, "cross: raw TCP_NODELAY: %s", strerror(errno));
    if (ls >= 0)
        close(ls);
    if (rc) {
        if (*rxfd >= 0)
            close(*rxfd);
        *rxfd = -1;
        if (*tx >= 0)
            close(*tx);
        *tx = -1;
    }
    return rc;
}

/* One round through ZeroMQ: every clip as one DELIVER with its slab as a zero-copy payload
 * frame, then the receiver's COMPLETE. Returns the seconds, or a negative code. */
static int zmq_round(dh_wire_socket_t *dealer, cross_rx_t *rx, uint8_t *const *clip_ptr,
                     uint64_t round, double *secs)
{
    const dh_rebalance_bench_options_t *opt = rx->opt;
    uint64_t t0 = dh_clock_now_ns();
    int rc = 0;
    for (uint32_t i = 0; i < opt->clips && rc == 0; i++) {
        dh_wire_tensor_t w;
        clip_tensor(&w, opt, i, NULL);
        w.tensor.data = clip_ptr[i];
        dh_msg_t m = {.type = DH_MSG_DELIVER};
        m.deliver.client_id = (char *)"node-b";
        m.deliver.seq = round;
        m.deliver.n_tensors = 1;
        m.deliver.tensors = &w;
        m.deliver.ready_ns = dh_clock_now_ns();
        m.deliver.server = (char *)"node-a";
        /* the arena outlives the socket: nothing to free when ZeroMQ is done */
        dh_wire_payload_t p = {clip_ptr[i], w.tensor.nbytes, NULL, NULL};
        rc = dh_wire_send(dealer, NULL, 0, &m, &p, 1, STEP_TIMEOUT_MS);
    }
    uint64_t deadline = dh_clock_now_ns() + (uint64_t)STEP_TIMEOUT_MS * 1000000u;
    while (rc == 0) {
        dh_wire_received_t r;
        memset(&r, 0, sizeof r);
        rc = dh_wire_recv(dealer, SLICE_MS, &r);
        if (rc == DH_EAGAIN) {
            rc = 0;
            if (atomic_load(&rx->done))
                rc = dh__set_error(DH_EIO, "cross: the receiver stopped: %s", rx->error);
            else if (dh_clock_now_ns() > deadline)
                rc = dh__set_error(-ETIMEDOUT, "cross: round %" PRIu64 " not acknowledged", round);
            continue;
        }
        if (rc)
            break;
        if (r.msg.type == DH_MSG_ERROR)
            rc = dh__set_error(DH_EIO, "cross: the receiver: %s", r.msg.error.message);
        else if (r.msg.type != DH_MSG_COMPLETE || r.msg.complete.seq != round)
            rc = dh__set_error(-EPROTO, "cross: unexpected %s for round %" PRIu64,
                               dh_msg_type_name(r.msg.type), round);
        dh_wire_received_release(&r);
        if (rc == 0) {
            *secs = dh_clock_elapsed_s(t0, dh_clock_now_ns());
            return 0;
        }
    }
    return rc;
}

/* One round through the plain socket: the same slabs' bytes, then the 1-byte ack. */
static int raw_round(int tx, const dh_rebalance_bench_options_t *opt, uint8_t *const *clip_ptr,
                     size_t clip_bytes, double *secs)
{
    uint64_t t0 = dh_clock_now_ns();
    for (uint32_t i = 0; i < opt->clips; i++) {
        size_t sent = 0;
        while (sent < clip_bytes) {
            ssize_t n = send(tx, clip_ptr[i] + sent, clip_bytes - sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return dh__set_error(-errno, "cross: raw TCP send: %s", strerror(errno));
            sent += (size_t)n;
        }
    }
    char ack = 0;
    ssize_t n;
    while ((n = recv(tx, &ack, 1, 0)) < 0 && errno == EINTR)
        ;
    if (n != 1)
        return dh__set_error(n == 0 ? DH_EEOF : -errno, "cross: raw TCP: no ack from the receiver");
    *secs = dh_clock_elapsed_s(t0, dh_clock_now_ns());
    return 0;
}

static int cross_part(onnode_t *o)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    dh_rebalance_bench_report_t *out = o->out;
    const uint32_t rounds = opt->rounds;
    const double total = (double)o->clip_bytes * opt->clips;
    uint8_t **clip_ptr = dh_calloc(opt->clips, sizeof *clip_ptr);
    double *zmq_s = dh_calloc(rounds, sizeof *zmq_s), *raw_s = dh_calloc(rounds, sizeof *raw_s);
    double *ratio = dh_calloc(rounds, sizeof *ratio);
    cross_rx_t rx = {.opt = opt};
    raw_rx_t raw = {.fd = -1, .per_round = (uint64_t)total, .rounds = rounds + 1};
    pthread_t rx_thread, raw_thread;
    bool rx_started = false, raw_started = false;
    dh_wire_socket_t *dealer = NULL;
    void *ctx_a = NULL; /* node A's context; node B's is rx.ctx */
    int tx = -1, rc = 0;
    pthread_mutex_init(&rx.mu, NULL);
    pthread_cond_init(&rx.cv, NULL);
    if (!clip_ptr || !zmq_s || !raw_s || !ratio) {
        rc = dh__set_error(DH_ENOMEM, "cross: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < opt->clips && rc == 0; i++)
        rc = dh_shm_arena_resolve(o->arena, &o->book[i].handle, (void **)&clip_ptr[i]);
    if (rc)
        goto done;
    if (!(rx.ctx = zmq_ctx_new()) || !(ctx_a = zmq_ctx_new())) {
        rc = dh__set_error(DH_ENOMEM, "cross: zmq_ctx_new failed");
        goto done;
    }
    if (pthread_create(&rx_thread, NULL, rx_main, &rx) != 0) {
        rc = dh__set_error(DH_EIO, "cross: cannot start the receiver thread");
        goto done;
    }
    rx_started = true;
    pthread_mutex_lock(&rx.mu);
    while (!rx.ready)
        pthread_cond_wait(&rx.cv, &rx.mu);
    rc = rx.rc;
    pthread_mutex_unlock(&rx.mu);
    if (rc) {
        rc = dh__set_error(rc, "cross: receiver: %s", rx.error);
        goto done;
    }
    if ((rc = dh_wire_socket_new(&dealer, ctx_a, ZMQ_DEALER, NULL)) ||
        (rc = dh__wire_set_routing_id(dealer, "node-a")) ||
        (rc = dh_wire_socket_connect(dealer, rx.endpoint)))
        goto done;
    if ((rc = tcp_pair(&tx, &raw.fd)))
        goto done;
    if (pthread_create(&raw_thread, NULL, raw_main, &raw) != 0) {
        rc = dh__set_error(DH_EIO, "cross: cannot start the raw TCP receiver thread");
        goto done;
    }
    raw_started = true;
    progress(opt,
             "cross: %" PRIu32 " clips of %.1f MB, tcp://127.0.0.1 through ZeroMQ and "
             "through a plain socket, %" PRIu32 " rounds after a warm-up",
             opt->clips, (double)o->clip_bytes / 1e6, rounds);
    for (uint32_t k = 0; k <= rounds && rc == 0; k++) {
        double zs = 0, rs = 0;
        /* each goes first every other round: neither inherits the other's warm caches */
        if (k % 2 == 0 && (rc = zmq_round(dealer, &rx, clip_ptr, k + 1, &zs)))
            break;
        if ((rc = raw_round(tx, opt, clip_ptr, o->clip_bytes, &rs)))
            break;
        if (k % 2 == 1 && (rc = zmq_round(dealer, &rx, clip_ptr, k + 1, &zs)))
            break;
        if (k == 0)
            continue; /* warm-up: connections, arena B's first touches */
        zmq_s[k - 1] = zs;
        raw_s[k - 1] = rs;
        ratio[k - 1] = rs / zs; /* the same bytes: time ratio = throughput ratio */
    }
    if (rc)
        goto done;
    out->cross_p50_ms = dh_percentile_sorted_inplace(zmq_s, rounds, 50) * 1e3;
    out->raw_tcp_p50_ms = dh_percentile_sorted_inplace(raw_s, rounds, 50) * 1e3;
    out->cross_gbps_p50 = total / (out->cross_p50_ms / 1e3) / 1e9;
    out->raw_tcp_gbps_p50 = total / (out->raw_tcp_p50_ms / 1e3) / 1e9;
    out->cross_vs_raw = dh_percentile_sorted_inplace(ratio, rounds, 50);
    progress(opt, "cross: DataHelix %.2f GB/s, raw TCP %.2f GB/s (medians), ratio %.2f",
             out->cross_gbps_p50, out->raw_tcp_gbps_p50, out->cross_vs_raw);
done:
    if (rx_started) {
        atomic_store(&rx.stop, 1); /* it leaves within a receive slice */
        pthread_join(rx_thread, NULL);
        if (rc == 0 && rx.rc) /* a late failure of the receiver */
            rc = dh__set_error(rx.rc, "cross: receiver: %s", rx.error);
    }
    dh_wire_socket_destroy(&dealer);
    if (tx >= 0)
        shutdown(tx, SHUT_RDWR); /* wakes the raw receiver when this side failed */
    if (raw_started) {
        pthread_join(raw_thread, NULL);
        if (rc == 0 && raw.rc)
            rc = dh__set_error(raw.rc, "cross: raw TCP receiver failed");
    }
    if (tx >= 0)
        close(tx);
    if (raw.fd >= 0)
        close(raw.fd);
    if (ctx_a)
        zmq_ctx_term(ctx_a);
    if (rx.ctx)
        zmq_ctx_term(rx.ctx);
    pthread_cond_destroy(&rx.cv);
    pthread_mutex_destroy(&rx.mu);
    dh_free(ratio);
    dh_free(raw_s);
    dh_free(zmq_s);
    dh_free(clip_ptr);
    return rc;
}

/* ---- the run ---------------------------------------------------------------------------- */

int dh_rebalance_bench_run(const dh_rebalance_bench_options_t *opt,
                           dh_rebalance_bench_report_t *out)
{
    memset(out, 0, sizeof *out);
    int rc = dh_rebalance_bench_check(opt);
    if (rc)
        return rc;
    out->clips = opt->clips;
    out->ranks = opt->ranks;
    out->rounds = opt->rounds;
    out->clip_bytes = clip_bytes_of(opt);
    out->move_fraction = opt->move_fraction;
    out->seed = opt->seed;
    onnode_t o;
    memset(&o, 0, sizeof o);
    o.opt = opt;
    o.out = out;
    o.clip_bytes = (size_t)out->clip_bytes;
    for (uint32_t r = 0; r < DH_REBALANCE_BENCH_MAX_RANKS; r++)
        o.setup_w[r] = -1;
    const uint32_t n = opt->clips;
    o.book = dh_calloc(n, sizeof *o.book);
    o.order = dh_calloc(n, sizeof *o.order);
    o.scratch = dh_calloc(n, sizeof *o.scratch);
    o.tensors = dh_calloc(n, sizeof *o.tensors);
    o.gone = dh_calloc(n, sizeof *o.gone);
    o.gone_ids = dh_calloc(n, sizeof *o.gone_ids);
    double *ms = dh_calloc(opt->rounds, sizeof *ms);
    if (!o.book || !o.order || !o.scratch || !o.tensors || !o.gone || !o.gone_ids || !ms) {
        rc = dh__set_error(DH_ENOMEM, "rebalance-bench: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < n; i++)
        snprintf(o.gone_ids[i], sizeof o.gone_ids[i], "clip%" PRIu32, i);
    if ((rc = dh_shm_arena_new(&o.arena, arena_bytes_for(opt), 0))) {
        rc = with_context(rc, "on-node: arena of %.1f MB", (double)arena_bytes_for(opt) / 1e6);
        goto done;
    }
    if ((rc = start_ranks(&o)) || (rc = connect_ranks(&o)) || (rc = place_clips(&o)))
        goto done;
    progress(opt,
             "on-node: %" PRIu32 " ranks (processes) attached, %" PRIu32
             " clips of %.1f MB in one arena; %" PRIu32 " rounds after a warm-up",
             opt->ranks, n, (double)o.clip_bytes / 1e6, opt->rounds);
    uint32_t moved = 0;
    if ((rc = onnode_rounds(&o, ms, &moved)) || (rc = release_ranks(&o)))
        goto done;
    for (uint32_t i = 0; i < n; i++)
        out->rank_clips[o.book[i].owner]++;
    out->onnode_moved = moved;
    out->onnode_p50_ms = dh_percentile_sorted_inplace(ms, opt->rounds, 50);
    out->onnode_p95_ms = dh_percentile_sorted_inplace(ms, opt->rounds, 95);
    progress(opt,
             "on-node: %" PRIu32 " clips changed owner per round: p50 %.3f ms, p95 %.3f ms; "
             "pixel copies %" PRIu64,
             moved, out->onnode_p50_ms, out->onnode_p95_ms, out->onnode_pixel_copies);
    if (!opt->skip_cross)
        rc = cross_part(&o);
done:
    onnode_stop(&o);
    if (o.arena && o.coordinator_refs) {
        for (uint32_t i = 0; i < n; i++)
            dh_shm_arena_unref(o.arena, &o.book[i].handle);
        dh_shm_arena_collect(o.arena);
        dh_shm_arena_stats_t st;
        dh_shm_arena_stats(o.arena, &st);
        if (rc == 0 && st.allocations_live != 0)
            rc = dh__set_error(-EPROTO, "on-node: %" PRIu64 " clips still referenced at the end",
                               st.allocations_live);
    }
    dh_shm_arena_destroy(&o.arena);
    dh_free(ms);
    dh_free(o.gone_ids);
    dh_free(o.gone);
    dh_free(o.tensors);
    dh_free(o.scratch);
    dh_free(o.order);
    dh_free(o.book);
    return rc;
}

int dh_rebalance_bench_write_json(FILE *f, const dh_rebalance_bench_report_t *r)
{
    int n = fprintf(f,
                    "{\"clips\":%" PRIu32 ",\"clip_bytes\":%" PRIu64 ",\"ranks\":%" PRIu32
                    ",\"rounds\":%" PRIu32 ",\"move_fraction\":%.3f,\"seed\":%" PRIu64
                    ",\"onnode_p50_ms\":%.4f,\"onnode_p95_ms\":%.4f,\"onnode_moved\":%" PRIu32
                    ",\"onnode_pixel_copies\":%" PRIu64 ",\"onnode_handoffs_verified\":%" PRIu64
                    ",\"cross_gbps_p50\":%.4f,\"raw_tcp_gbps_p50\":%.4f,\"cross_vs_raw\":%.4f"
                    ",\"cross_p50_ms\":%.3f,\"raw_tcp_p50_ms\":%.3f}\n",
                    r->clips, r->clip_bytes, r->ranks, r->rounds, r->move_fraction, r->seed,
                    r->onnode_p50_ms, r->onnode_p95_ms, r->onnode_moved, r->onnode_pixel_copies,
                    r->onnode_handoffs_verified, r->cross_gbps_p50, r->raw_tcp_gbps_p50,
                    r->cross_vs_raw, r->cross_p50_ms, r->raw_tcp_p50_ms);
    return n < 0 ? -EIO : 0;
}
