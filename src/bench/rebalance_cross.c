/* rebalance_cross.c: rebalance-bench's cross-node part: the clips of the on-node
 * arena sent to a second arena by two threads of this process, a sender and a receiver
 * "node" over tcp://127.0.0.1, through ZeroMQ (one DELIVER per clip, placed with one copy)
 * beside a plain TCP socket carrying the same bytes in the same run (the baseline).
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/stats.h"
#include "datahelix/wire.h"
#include "wire/wire_lib.h"
#include "bench/rebalance_bench_internal.h"

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
                     ? dh__rebalance_clip_of_tensor(&d->tensors[0], opt, DH_WIRE_LOC_FRAME)
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
            if (!dh__rebalance_clip_intact(p, len, dh__rebalance_clip_tag(opt->seed, (uint32_t)k)))
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
    int rc = placed ? dh_shm_arena_new(&arena, dh__rebalance_arena_bytes(rx->opt), 0)
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
        dh__rebalance_clip_tensor(&w, opt, i, NULL);
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

int dh__rebalance_cross_part(onnode_t *o)
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
    dh__rebalance_progress(opt,
                           "cross: %" PRIu32
                           " clips of %.1f MB, tcp://127.0.0.1 through ZeroMQ and "
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
    dh__rebalance_progress(opt,
                           "cross: DataHelix %.2f GB/s, raw TCP %.2f GB/s (medians), ratio %.2f",
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
