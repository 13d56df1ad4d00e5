/* zmq.c: ZeroMQ helpers that carry the wire format (wire.h): sockets made with our limits,
 * sending a message with its payload frames zero-copy, receiving one with a timeout and
 * decoding it; and the socket options the runtime sets up (routing id, router handover, the
 * resolved endpoint) with the host name it names nodes by.
 *
 * The runtime (coordinator, DataServer, client) is the only user; it owns the ZeroMQ context
 * and keeps each socket on one thread. ZeroMQ errors map to our codes here: -errno where the
 * error is a system one, DH_EAGAIN for a timeout, with a message naming the endpoint and, on
 * a ROUTER, the peer.
 */
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/wire.h"
#include "core/internal.h"
#include "wire/internal.h"

struct dh_wire_socket {
    void *sock;
    int type;
    uint64_t sent;
    const dh_wire_keys_t *keys; /* CURVE on tcp:// (borrowed), or NULL */
    void *ctx;
    void *monitor;         /* tcp:// connect: a PAIR receiving its connection events, or NULL */
    int auth_error;        /* a handshake failure seen (its code), reported by every check */
    bool connected;        /* a TCP connection was once made (the monitor said so) */
    bool handshake_ok;     /* a ZMTP handshake once succeeded: a DataHelix peer answers there */
    unsigned unexplained;  /* handshakes in a row that failed without ZeroMQ saying why while
                            * a ZeroMQ peer answered the probe (dh__wire_auth_check) */
    const char *peer_role; /* what the endpoint should be ("coordinator"), for messages */
    char auth_msg[768];    /* and its message */
    char endpoint[256];    /* the last endpoint bound or connected, for messages */
};

/* ZeroMQ's own error numbers (above ZMQ_HAUSNUMERO) have no errno; map them to the nearest
 * one so callers see the usual "-errno" convention. */
static int map_errno(int e)
{
    switch (e) {
    case EAGAIN:
        return DH_EAGAIN;
    case ENOMEM:
        return DH_ENOMEM;
    case ETERM:
        return -ESHUTDOWN;
    case EFSM:
        return -EPROTO;
    case ENOCOMPATPROTO:
        return -EPROTONOSUPPORT;
    case EMTHREAD:
        return -EMFILE;
    default:
        return e > 0 && e < ZMQ_HAUSNUMERO ? -e : DH_EIO;
    }
}

static const char *endpoint_of(const dh_wire_socket_t *s)
{
    return s->endpoint[0] ? s->endpoint : "(unbound socket)";
}

/* "peer 0a1b2c..." for a ROUTER routing id (first 16 bytes in hex), "" otherwise. */
static const char *peer_name(char *buf, size_t cap, const void *id, size_t size)
{
    buf[0] = 0;
    if (!id || !size)
        return buf;
    size_t n = snprintf(buf, cap, " (peer ");
    const uint8_t *p = id;
    for (size_t i = 0; i < size && i < 16 && n + 3 < cap; i++)
        n += snprintf(buf + n, cap - n, "%02x", p[i]);
    snprintf(buf + n, cap - n, "%s)", size > 16 ? "..." : "");
    return buf;
}

int dh_wire_socket_new(dh_wire_socket_t **out, void *zmq_ctx, int zmq_type,
                       const dh_wire_socket_opts_t *opts)
{
    assert(out && zmq_ctx);
    *out = NULL;
    int64_t max_msg =
        opts && opts->max_msg_size ? opts->max_msg_size : DH_WIRE_DEFAULT_MAX_MSG_SIZE;
    if (max_msg < -1)
        max_msg = -1;
    dh_wire_socket_t *s = dh_calloc(1, sizeof *s);
    if (!s)
        return dh__set_error(DH_ENOMEM, "out of memory for a ZeroMQ socket");
    s->type = zmq_type;
    s->keys = opts ? opts->keys : NULL;
    s->ctx = zmq_ctx;
    s->sock = zmq_socket(zmq_ctx, zmq_type);
    if (!s->sock) {
        int e = zmq_errno();
        dh_free(s);
        return dh__set_error(map_errno(e), "zmq_socket(type %d): %s", zmq_type, zmq_strerror(e));
    }
    int linger = 0, mandatory = 1;
    const char *opt = NULL;
    if (zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg) != 0)
        opt = "ZMQ_MAXMSGSIZE";
    else if (zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger) != 0)
        opt = "ZMQ_LINGER";
    else if (zmq_type == ZMQ_ROUTER &&
             zmq_setsockopt(s->sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory) != 0)
        opt = "ZMQ_ROUTER_MANDATORY";
    if (opt) {
        int e = zmq_errno();
        zmq_close(s->sock);
        dh_free(s);
        return dh__set_error(map_errno(e), "zmq_setsockopt(%s): %s", opt, zmq_strerror(e));
    }
    *out = s;
    return 0;
}

void dh_wire_socket_destroy(dh_wire_socket_t **s)
{
    if (!s || !*s)
        return;
    if ((*s)->monitor) {
        zmq_socket_monitor((*s)->sock, NULL, 0);
        zmq_close((*s)->monitor);
    }
    zmq_close((*s)->sock);
    dh_free(*s);
    *s = NULL;
}

static int attach(dh_wire_socket_t *s, const char *endpoint, int bind)
{
    assert(s && endpoint);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    if (!strstr(endpoint, "://")) /* zmq_connect's answer would be a bare EINVAL */
        return dh__set_error(
            DH_EINVAL, "'%s': no scheme: endpoints are tcp://HOST:PORT or ipc://PATH", endpoint);
    int rc = dh__wire_keys_apply(s->keys, s->sock, endpoint, bind);
    if (rc)
        return rc;
    if (!bind && !s->monitor && strncmp(endpoint, "tcp://", 6) == 0) {
        /* A client learns of a refused key, a peer that wants CURVE (or does not), or a peer
         * that is no ZeroMQ peer at all only from the socket's events: watch them, so a
         * refusal fails fast with a reason instead of looking like a silent peer. */
        /* Named by a counter, not the socket's address: a socket made again at a freed one's
         * address would find the old name still bound (EADDRINUSE). */
        static atomic_uint monitors;
        char mon[64];
        snprintf(mon, sizeof mon, "inproc://dh-connect-monitor-%u", atomic_fetch_add(&monitors, 1));
        int linger = 0;
        if (zmq_socket_monitor(s->sock, mon,
                               ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0 ||
            !(s->monitor = zmq_socket(s->ctx, ZMQ_PAIR)) ||
            zmq_setsockopt(s->monitor, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
            zmq_connect(s->monitor, mon) != 0) {
            int e = zmq_errno();
            return dh__set_error(map_errno(e), "monitor of %s: %s", endpoint, zmq_strerror(e));
        }
    }
    if ((bind ? zmq_bind(s->sock, endpoint) : zmq_connect(s->sock, endpoint)) != 0) {
        int e = zmq_errno();
        return dh__set_error(map_errno(e), "%s %s: %s", bind ? "bind" : "connect", endpoint,
                             zmq_strerror(e));
    }
    return 0;
}

int dh_wire_socket_bind(dh_wire_socket_t *s, const char *endpoint)
{
    return attach(s, endpoint, 1);
}

int dh_wire_socket_connect(dh_wire_socket_t *s, const char *endpoint)
{
    return attach(s, endpoint, 0);
}

/* How long a probe of a connect endpoint may take (a ZeroMQ peer greets at once). */
#define PROBE_MS 500

/* Records that the endpoint answered in another protocol than ZMTP. */
static void foreign_peer(dh_wire_socket_t *s, const char *why)
{
    snprintf(s->auth_msg, sizeof s->auth_msg,
             "%s answered, but it is not a DataHelix %s (%.200s; another server on that port, "
             "e.g. torchrun's TCPStore at MASTER_PORT?)",
             endpoint_of(s), s->peer_role ? s->peer_role : "peer", why);
    s->auth_error = -EPROTO;
}

void dh__wire_set_peer_role(dh_wire_socket_t *s, const char *role)
{
    s->peer_role = role;
}

int dh__wire_diagnose(dh_wire_socket_t *s, int probe_ms)
{
    int rc = dh__wire_auth_check(s);
    if (rc || s->handshake_ok)
        return rc;
    char why[256];
    switch (dh__wire_probe(s->endpoint, probe_ms, why, sizeof why)) {
    case DH__WIRE_PROBE_FOREIGN:
        foreign_peer(s, why);
        return dh__set_error(s->auth_error, "%s", s->auth_msg);
    case DH__WIRE_PROBE_UNREACHABLE:
        return dh__set_error(DH_EAGAIN, "cannot reach the %s at %s (%s)",
                             s->peer_role ? s->peer_role : "peer", endpoint_of(s), why);
    default:
        return 0; /* a ZeroMQ peer answers there now: the cause is elsewhere */
    }
}

int dh__wire_auth_check(dh_wire_socket_t *s)
{
    while (s->monitor && !s->auth_error) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, s->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            break;
        }
        char where[256] = "";
        if (zmq_msg_more(&ev)) {
            zmq_msg_init(&addr);
            if (zmq_msg_recv(&addr, s->monitor, 0) >= 0)
                snprintf(where, sizeof where, "%.*s", (int)zmq_msg_size(&addr),
                         (const char *)zmq_msg_data(&addr));
            zmq_msg_close(&addr);
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        zmq_msg_close(&ev);
        if (event == ZMQ_EVENT_CONNECTED || event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            s->connected = true;
            s->handshake_ok |= event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
            if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
                s->unexplained = 0;
            continue;
        }
        /* A mechanism mismatch or a refused key is ZeroMQ talking; a closed connection or a
         * garbled greeting may be a peer of another protocol: ask it (probe.c). */
        bool zmq_said = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
                        value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH;
        if (!zmq_said) {
            char why[256];
            dh__wire_probe_t found = dh__wire_probe(s->endpoint, PROBE_MS, why, sizeof why);
            if (found == DH__WIRE_PROBE_FOREIGN) {
                foreign_peer(s, why);
                break;
            }
            if (found != DH__WIRE_PROBE_ZMTP)
                continue; /* gone meanwhile: ZeroMQ connects again */
            /* A ZeroMQ peer answers, but the handshake was cut without a reason: a peer that
             * wants keys does that on every try; a peer killed mid-handshake and restarted at
             * the same endpoint (a coordinator's restart) does it once. Three in a row. */
            if (++s->unexplained < 3)
                continue;
        }
        const char *dir = s->keys ? dh_wire_keys_dir(s->keys) : NULL;
        if (!s->keys)
            snprintf(s->auth_msg, sizeof s->auth_msg,
                     "the handshake with %s failed (%u): the peer requires CURVE keys; start "
                     "this process with --keys DIR or DATAHELIX_KEYS (docs/security.md)",
                     where[0] ? where : endpoint_of(s), value);
        else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            snprintf(s->auth_msg, sizeof s->auth_msg,
                     "%s refused this process's key %s (status %u): its key directory does "
                     "not list it; copy %s/%s.pub to the peer's key directory",
                     where[0] ? where : endpoint_of(s), dh_wire_keys_public(s->keys), value, dir,
                     dh_wire_keys_name(s->keys));
        else
            snprintf(s->auth_msg, sizeof s->auth_msg,
                     "the CURVE handshake with %s failed (%s, %u): the peer runs without keys "
                     "or with another server key than %s/server.pub",
                     where[0] ? where : endpoint_of(s),
                     event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "protocol error" : "no detail",
                     value, dir);
        s->auth_error = DH_EAUTH;
    }
    return s->auth_error ? dh__set_error(s->auth_error, "%s", s->auth_msg) : 0;
}

void *dh_wire_socket_handle(dh_wire_socket_t *s)
{
    return s->sock;
}

uint64_t dh__wire_socket_sent(const dh_wire_socket_t *s)
{
    return s->sent;
}

int dh__wire_set_routing_id(dh_wire_socket_t *s, const char *id)
{
    if (zmq_setsockopt(s->sock, ZMQ_ROUTING_ID, id, strlen(id)) != 0) {
        int e = zmq_errno();
        return dh__set_error(map_errno(e), "ZMQ_ROUTING_ID '%s': %s", id, zmq_strerror(e));
    }
    return 0;
}

int dh__wire_router_handover(dh_wire_socket_t *s)
{
    int on = 1;
    if (zmq_setsockopt(s->sock, ZMQ_ROUTER_HANDOVER, &on, sizeof on) != 0) {
        int e = zmq_errno();
        return dh__set_error(map_errno(e),
                             "cannot turn on ZMQ_ROUTER_HANDOVER (a reconnecting peer could "
                             "not take its routing id back): %s",
                             zmq_strerror(e));
    }
    return 0;
}

int dh__wire_last_endpoint(dh_wire_socket_t *s, char *buf, size_t cap)
{
    size_t len = cap;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, buf, &len) != 0) {
        int e = zmq_errno();
        return dh__set_error(map_errno(e), "ZMQ_LAST_ENDPOINT of %s: %s", endpoint_of(s),
                             zmq_strerror(e));
    }
    return 0;
}

void dh__wire_hostname(char *buf, size_t cap)
{
    if (gethostname(buf, cap) != 0 || !buf[0])
        snprintf(buf, cap, "localhost");
    buf[cap - 1] = '\0';
}

/* Waits until the socket has `events` ready or the deadline passes (deadline 0: forever).
 * Returns 1 ready, 0 timed out, or a negative code. */
static int wait_for(dh_wire_socket_t *s, short events, uint64_t deadline_ns)
{
    for (;;) {
        long timeout_ms = -1;
        if (deadline_ns) {
            uint64_t now = dh_clock_now_ns();
            timeout_ms = now >= deadline_ns ? 0 : (long)((deadline_ns - now + 999999) / 1000000);
        }
        zmq_pollitem_t item = {.socket = s->sock, .events = events};
        int n = zmq_poll(&item, 1, timeout_ms);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return map_errno(zmq_errno());
        }
        if (n > 0 && (item.revents & events))
            return 1;
        if (deadline_ns && dh_clock_now_ns() >= deadline_ns)
            return 0;
    }
}

static uint64_t deadline_after(int timeout_ms)
{
    return timeout_ms < 0 ? 0 : dh_clock_now_ns() + (uint64_t)timeout_ms * 1000000 + 1;
}

#if defined(__SANITIZE_THREAD__)
char dh__wire_tsan_token;
#endif

static void free_body(void *data, void *hint)
{
    dh__wire_tsan_acquire();
    (void)hint;
    dh_free(data);
}

/* Releases payloads[from..n) that ZeroMQ never took. */
static void release_payloads(dh_wire_payload_t *payloads, size_t from, size_t n)
{
    for (size_t i = from; i < n; i++)
        if (payloads[i].free_fn)
            payloads[i].free_fn(payloads[i].data, payloads[i].hint);
}

/* The payloads must be exactly the FRAME tensors' bytes, in order. */
static int check_payloads(const dh_msg_t *msg, const dh_wire_payload_t *payloads, size_t n)
{
    if (msg->type != DH_MSG_DELIVER) {
        if (n)
            return dh__set_error(DH_EINVAL, "%s carries %zu payload frames; only DELIVER may",
                                 dh_msg_type_name(msg->type), n);
        return 0;
    }
    size_t frame = 0;
    for (uint32_t i = 0; i < msg->deliver.n_tensors; i++) {
        const dh_wire_tensor_t *t = &msg->deliver.tensors[i];
        uint64_t nbytes;
        const char *bad = dh__wire_tensor_check(
            &t->tensor, t->location == DH_WIRE_LOC_SHM ? t->length : 0, &nbytes);
        if (bad)
            return dh__set_error(DH_EINVAL, "DELIVER: tensor %u '%s': bad %s", i, t->tensor.name,
                                 bad);
        if (t->location != DH_WIRE_LOC_FRAME)
            continue;
        if (frame >= n || payloads[frame].size != nbytes)
            return dh__set_error(DH_EINVAL,
                                 "DELIVER: tensor %u '%s' of %llu bytes has no payload frame of "
                                 "that size (%zu payloads)",
                                 i, t->tensor.name, (unsigned long long)nbytes, n);
        frame++;
    }
    if (frame != n)
        return dh__set_error(DH_EINVAL, "DELIVER: %zu payloads for %zu FRAME tensors", n, frame);
    return 0;
}

int dh_wire_send(dh_wire_socket_t *s, const void *routing_id, size_t routing_id_size,
                 const dh_msg_t *msg, dh_wire_payload_t *payloads, size_t n_payloads,
                 int timeout_ms)
{
    assert(s && msg && (payloads || n_payloads == 0));
    assert((s->type == ZMQ_ROUTER) == (routing_id != NULL));
    char peer[64];
    peer_name(peer, sizeof peer, routing_id, routing_id_size);
    const char *name = dh_msg_type_name(msg->type);
    int rc = 0;
    if (n_payloads > DH_WIRE_MAX_PAYLOADS)
        rc = dh__set_error(DH_EINVAL, "%s: %zu payload frames, at most %d", name, n_payloads,
                           DH_WIRE_MAX_PAYLOADS);
    if (rc == 0)
        rc = check_payloads(msg, payloads, n_payloads);
    if (rc) {
        release_payloads(payloads, 0, n_payloads);
        return rc;
    }

    dh_msg_t stamped = *msg;
    stamped.sender_seq = s->sent + 1;
    uint8_t header[DH_WIRE_HEADER_SIZE];
    uint8_t *body = NULL;
    size_t body_len = 0;
    rc = dh_wire_encode(&stamped, header, &body, &body_len);
    size_t first = routing_id ? 1 : 0, n_frames = first + 2 + n_payloads;
    zmq_msg_t *frames = rc ? NULL : dh_calloc(n_frames, sizeof *frames);
    if (rc == 0 && !frames)
        rc = dh__set_error(DH_ENOMEM, "send %s on %s: out of memory", name, endpoint_of(s));
    if (rc) {
        dh_free(body);
        release_payloads(payloads, 0, n_payloads);
        return rc;
    }

    /* Build every frame first, so each payload is owned by exactly one zmq_msg_t (whose close
     * or send releases it) or released here. The body goes zero-copy too. */
    size_t built = 0;
    int e = 0;
    if (first) {
        if (zmq_msg_init_size(&frames[0], routing_id_size) != 0)
            goto init_failed;
        memcpy(zmq_msg_data(&frames[0]), routing_id, routing_id_size);
        built++;
    }
    if (zmq_msg_init_size(&frames[built], DH_WIRE_HEADER_SIZE) != 0)
        goto init_failed;
    memcpy(zmq_msg_data(&frames[built]), header, DH_WIRE_HEADER_SIZE);
    built++;
    if (zmq_msg_init_data(&frames[built], body, body_len, free_body, NULL) != 0)
        goto init_failed;
    body = NULL;
    built++;
    for (size_t i = 0; i < n_payloads; i++) {
        if (zmq_msg_init_data(&frames[built], payloads[i].data, payloads[i].size,
                              payloads[i].free_fn, payloads[i].hint) != 0)
            goto init_failed;
        built++;
    }

    uint64_t deadline = deadline_after(timeout_ms);
    size_t sent = 0;
    dh__wire_tsan_release();
    while (sent < n_frames) {
        int flags = ZMQ_DONTWAIT | (sent + 1 < n_frames ? ZMQ_SNDMORE : 0);
        /* The fault site is the first frame only: ZeroMQ takes a message whole or not at all,
         * so a real failure after the first frame does not happen. */
        int fault = sent == 0 && DH_FAULT(DH_FAULT_WIRE_SEND);
        if (!fault && zmq_msg_send(&frames[sent], s->sock, flags) >= 0) {
            sent++;
            continue;
        }
        e = fault ? EHOSTUNREACH : zmq_errno();
        if (e == EINTR)
            continue;
        /* Only the first frame waits for room: ZeroMQ accepts the rest of a message whose
         * first part it took. */
        if (e == EAGAIN && sent == 0) {
            int ready = wait_for(s, ZMQ_POLLOUT, deadline);
            if (ready == 1)
                continue;
            if (ready == 0)
                rc = dh__set_error(DH_EAGAIN, "send %s on %s%s: timed out after %d ms", name,
                                   endpoint_of(s), peer, timeout_ms);
            else
                rc = dh__set_error(ready, "send %s on %s%s: poll failed: %s", name, endpoint_of(s),
                                   peer, dh_strerror(ready));
        } else {
            rc = dh__set_error(map_errno(e), "send %s on %s%s: %s", name, endpoint_of(s), peer,
                               zmq_strerror(e));
        }
        break;
    }
    for (size_t i = sent; i < n_frames; i++)
        zmq_msg_close(&frames[i]); /* releases what was not sent */
    dh_free(frames);
    if (rc == 0)
        s->sent++;
    return rc;

init_failed:
    e = zmq_errno();
    for (size_t i = 0; i < built; i++)
        zmq_msg_close(&frames[i]);
    dh_free(frames);
    dh_free(body); /* NULL once a frame owns it */
    release_payloads(payloads, built > first + 2 ? built - first - 2 : 0, n_payloads);
    return dh__set_error(map_errno(e), "send %s on %s: building frames: %s", name, endpoint_of(s),
                         zmq_strerror(e));
}

void dh_wire_received_release(dh_wire_received_t *r)
{
    if (!r)
        return;
    dh_msg_clear(&r->msg);
    zmq_msg_t *frames = r->frames_;
    for (size_t i = 0; i < r->n_frames_; i++)
        zmq_msg_close(&frames[i]);
    dh_free(frames);
    memset(r, 0, sizeof *r);
}

/* Receives and drops the rest of a multipart message (after an error), so the next receive
 * starts at a message boundary. */
static void drain(void *sock)
{
    int more = 1;
    size_t len = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int got = zmq_msg_recv(&m, sock, 0);
        zmq_msg_close(&m);
        if (got < 0 && zmq_errno() != EINTR)
            break;
        len = sizeof more;
    }
}

/* Prefixes this thread's last error with the endpoint and peer. */
static int recv_error(dh_wire_socket_t *s, const char *peer, int rc)
{
    char detail[512];
    snprintf(detail, sizeof detail, "%s", dh_last_error());
    return dh__set_error(rc, "recv on %s%s: %s", endpoint_of(s), peer, detail);
}

int dh_wire_recv(dh_wire_socket_t *s, int timeout_ms, dh_wire_received_t *out)
{
    assert(s && out && out->n_frames_ == 0 && out->frames_ == NULL);
    memset(out, 0, sizeof *out);
    uint64_t deadline = deadline_after(timeout_ms);
    const size_t max_frames = (s->type == ZMQ_ROUTER ? 1 : 0) + 2 + DH_WIRE_MAX_PAYLOADS;
    zmq_msg_t first;
    zmq_msg_init(&first);
    for (;;) {
        /* The fault leaves the message queued, as a real failure of the first part would. */
        int fault = DH_FAULT(DH_FAULT_WIRE_RECV);
        if (!fault && zmq_msg_recv(&first, s->sock, ZMQ_DONTWAIT) >= 0)
            break;
        int e = fault ? ETERM : zmq_errno();
        if (e == EINTR)
            continue;
        if (e != EAGAIN) {
            zmq_msg_close(&first);
            return dh__set_error(map_errno(e), "recv on %s: %s", endpoint_of(s), zmq_strerror(e));
        }
        int ready = wait_for(s, ZMQ_POLLIN, deadline);
        if (ready <= 0) {
            zmq_msg_close(&first);
            int refused = ready == 0 ? dh__wire_auth_check(s) : 0;
            if (refused)
                return refused; /* not silence: the peer refused our key, or is no peer */
            if (ready == 0)
                return dh__set_error(DH_EAGAIN, "recv on %s: timed out after %d ms", endpoint_of(s),
                                     timeout_ms);
            return dh__set_error(ready, "recv on %s: poll failed: %s", endpoint_of(s),
                                 dh_strerror(ready));
        }
    }

    /* The rest of the parts are already here: ZeroMQ delivers a message whole. */
    int rc = 0;
    size_t cap = 4;
    zmq_msg_t *frames = dh_calloc(cap, sizeof *frames);
    if (!frames) {
        if (s->type == ZMQ_ROUTER && zmq_msg_size(&first) <= sizeof out->routing_id) {
            out->routing_id_size = zmq_msg_size(&first); /* who sent it, to answer */
            memcpy(out->routing_id, zmq_msg_data(&first), out->routing_id_size);
        }
        zmq_msg_close(&first);
        drain(s->sock);
        return dh__set_error(DH_ENOMEM, "recv on %s: out of memory", endpoint_of(s));
    }
    dh__wire_tsan_acquire();
    zmq_msg_init(&frames[0]);
    zmq_msg_move(&frames[0], &first);
    zmq_msg_close(&first);
    out->frames_ = frames;
    out->n_frames_ = 1;
    out->cap_frames_ = cap;
    while (zmq_msg_more(&frames[out->n_frames_ - 1])) {
        if (out->n_frames_ == max_frames) {
            drain(s->sock);
            rc = dh__set_error(DH_EPARSE, "message of more than %zu frames", max_frames);
            break;
        }
        if (out->n_frames_ == out->cap_frames_) {
            /* zmq_msg_t is opaque: move the frames with zmq_msg_move, not realloc. */
            zmq_msg_t *grown = dh_calloc(cap * 2, sizeof *frames);
            if (!grown) {
                drain(s->sock);
                rc = dh__set_error(DH_ENOMEM, "out of memory for %zu frames", cap * 2);
                break;
            }
            for (size_t i = 0; i < out->n_frames_; i++) {
                zmq_msg_init(&grown[i]);
                zmq_msg_move(&grown[i], &frames[i]);
                zmq_msg_close(&frames[i]);
            }
            dh_free(frames);
            frames = grown;
            cap *= 2;
            out->frames_ = frames;
            out->cap_frames_ = cap;
        }
        zmq_msg_t *m = &frames[out->n_frames_];
        zmq_msg_init(m);
        if (zmq_msg_recv(m, s->sock, 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(m);
            if (e == EINTR)
                continue;
            rc = dh__set_error(map_errno(e), "%s", zmq_strerror(e));
            break;
        }
        out->n_frames_++;
    }

    char peer[64] = "";
    size_t at = 0;
    if (rc == 0 && s->type == ZMQ_ROUTER) {
        size_t id_size = zmq_msg_size(&frames[0]);
        if (id_size > sizeof out->routing_id)
            id_size = sizeof out->routing_id; /* cannot happen: ZeroMQ caps ids at 255 */
        memcpy(out->routing_id, zmq_msg_data(&frames[0]), id_size);
        out->routing_id_size = id_size;
        peer_name(peer, sizeof peer, out->routing_id, id_size);
        at = 1;
    }
    if (rc == 0 && out->n_frames_ - at < 2)
        rc = dh__set_error(DH_EPARSE, "message of %zu frames, needs a header and a body",
                           out->n_frames_ - at);
    if (rc == 0) {
        size_t n_payloads = out->n_frames_ - at - 2;
        dh_wire_frame_t *views = NULL;
        if (n_payloads) {
            views = dh_calloc(n_payloads, sizeof *views);
            if (!views)
                rc = dh__set_error(DH_ENOMEM, "out of memory for %zu payload frames", n_payloads);
            for (size_t i = 0; views && i < n_payloads; i++)
                views[i] = (dh_wire_frame_t){zmq_msg_data(&frames[at + 2 + i]),
                                             zmq_msg_size(&frames[at + 2 + i])};
        }
        if (rc == 0)
            rc = dh_wire_decode(zmq_msg_data(&frames[at]), zmq_msg_size(&frames[at]),
                                zmq_msg_data(&frames[at + 1]), zmq_msg_size(&frames[at + 1]), views,
                                n_payloads, &out->msg);
        dh_free(views);
    }
    if (rc) {
        rc = recv_error(s, peer, rc);
        uint8_t id[sizeof out->routing_id];
        size_t id_size = out->routing_id_size;
        memcpy(id, out->routing_id, id_size);
        dh_wire_received_release(out);
        memcpy(out->routing_id, id, id_size); /* who sent it, to answer */
        out->routing_id_size = id_size;
    }
    return rc;
}
