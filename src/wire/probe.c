/* probe.c: why a connect endpoint gives no ZeroMQ peer, found by asking the network directly.
 *
 * ZeroMQ hides the cause of a failed connect: its monitor says "retried", never "refused" or
 * "host not found", and a TCP server that does not speak ZMTP (torchrun's TCPStore at
 * MASTER_PORT, an HTTP server) looks like a silent peer until the handshake times out. When a
 * connect gives nothing, the caller (dh__wire_diagnose, zmq.c) probes once: resolve the host,
 * open a plain socket with a deadline, and read the first bytes. Every ZMTP 3 peer sends its
 * 10-byte signature (0xFF, 8 bytes, then a byte with bit 0 set) at once on accept, before
 * reading anything (ZMTP 3.x, "Greeting"), so a peer that sends other bytes, closes, or sends
 * nothing within the deadline speaks another protocol. The probe sends nothing.
 *
 * Cost: one getaddrinfo and one connect per probe, bounded by the caller's deadline (the
 * resolver's own timeout aside). Runs on the caller's thread; no state.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "datahelix/clock.h"
#include "datahelix/fault.h"
#include "core/internal.h"
#include "wire/internal.h"

static int remaining_ms(uint64_t deadline_ns)
{
    uint64_t now = dh_clock_now_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now + 999999) / 1000000);
}

/* Connects fd to addr by the deadline. Returns 0 or a positive errno (ETIMEDOUT). */
static int connect_by(int fd, const struct sockaddr *addr, socklen_t len, uint64_t deadline_ns)
{
    if (connect(fd, addr, len) == 0)
        return 0;
    if (errno != EINPROGRESS)
        return errno;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int n;
    while ((n = poll(&p, 1, remaining_ms(deadline_ns))) < 0 && errno == EINTR)
        ;
    if (n == 0)
        return ETIMEDOUT;
    int err = 0;
    socklen_t elen = sizeof err;
    if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
        return errno ? errno : EIO;
    return err;
}

/* Reads the peer's first bytes into buf (up to cap) by the deadline. Returns the count, 0
 * when the peer closed at once, -1 when it sent nothing in time, or -2 with *err set when
 * a read failed (a reset: that says nothing of the protocol the peer speaks). */
static ssize_t read_by(int fd, uint8_t *buf, size_t cap, uint64_t deadline_ns, int *err)
{
    size_t got = 0;
    while (got < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, remaining_ms(deadline_ns));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return got ? (ssize_t)got : -1;
        ssize_t r = DH_FAULT(DH_FAULT_WIRE_PROBE) ? (errno = ECONNRESET, -1)
                                                  : recv(fd, buf + got, cap - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            *err = errno;
            return -2;
        }
        if (r <= 0)
            return (ssize_t)got;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Fills out from the first bytes a connected fd gave. */
static dh__wire_probe_t classify_greeting(int fd, uint64_t deadline_ns, char *why, size_t cap)
{
    uint8_t sig[10];
    int err = 0;
    ssize_t n = read_by(fd, sig, sizeof sig, deadline_ns, &err);
    if (n == (ssize_t)sizeof sig && sig[0] == 0xFF && (sig[9] & 1))
        return DH__WIRE_PROBE_ZMTP;
    if (n == -2) {
        snprintf(why, cap, "probe: reading its greeting: %s", strerror(err));
        return DH__WIRE_PROBE_UNREACHABLE;
    }
    if (n < 0)
        snprintf(why, cap, "it accepted the connection but sent no ZeroMQ greeting");
    else if (n == 0)
        snprintf(why, cap, "it closed the connection without a ZeroMQ greeting");
    else
        snprintf(why, cap, "its first bytes (0x%02x...) are not a ZeroMQ greeting", sig[0]);
    return DH__WIRE_PROBE_FOREIGN;
}

static dh__wire_probe_t unreachable(int err, char *why, size_t cap)
{
    switch (err) {
    case ECONNREFUSED:
        snprintf(why, cap, "connection refused");
        break;
    case ENOENT:
        snprintf(why, cap, "no such socket file");
        break;
    case EHOSTUNREACH:
    case ENETUNREACH:
        snprintf(why, cap, "no route to host");
        break;
    case ETIMEDOUT:
        snprintf(why, cap, "no answer to the connect");
        break;
    default:
        snprintf(why, cap, "%s", strerror(err));
    }
    return DH__WIRE_PROBE_UNREACHABLE;
}

/* The probe's own socket (fault site DH_FAULT_WIRE_PROBE: EMFILE, as at the fd limit). */
static int probe_socket(int family, int type, int protocol)
{
    if (DH_FAULT(DH_FAULT_WIRE_PROBE)) {
        errno = EMFILE;
        return -1;
    }
    return socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
}

/* The probe could not be made (this process's failure, not the peer's). */
static dh__wire_probe_t probe_failed(int err, char *why, size_t cap)
{
    snprintf(why, cap, "probe: socket: %s", strerror(err));
    return DH__WIRE_PROBE_UNREACHABLE;
}

static dh__wire_probe_t probe_ipc(const char *path, uint64_t deadline_ns, char *why, size_t cap)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sun.sun_path) {
        snprintf(why, cap, "the socket path is too long");
        return DH__WIRE_PROBE_UNREACHABLE;
    }
    memcpy(sun.sun_path, path, strlen(path));
    if (path[0] == '@') /* ZeroMQ's abstract namespace */
        sun.sun_path[0] = '\0';
    int fd = probe_socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return probe_failed(errno, why, cap);
    int err = connect_by(fd, (struct sockaddr *)&sun, sizeof sun, deadline_ns);
    dh__wire_probe_t out =
        err ? unreachable(err, why, cap) : classify_greeting(fd, deadline_ns, why, cap);
    close(fd);
    return out;
}

static dh__wire_probe_t probe_tcp(const char *hostport, uint64_t deadline_ns, char *why, size_t cap)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || (size_t)(colon - hostport) >= sizeof host) {
        snprintf(why, cap, "no HOST:PORT");
        return DH__WIRE_PROBE_UNREACHABLE;
    }
    size_t hlen = (size_t)(colon - hostport);
    if (hostport[0] == '[' && hlen >= 2 && hostport[hlen - 1] == ']') { /* [v6]:port */
        memcpy(host, hostport + 1, hlen - 2);
        host[hlen - 2] = '\0';
    } else {
        memcpy(host, hostport, hlen);
        host[hlen] = '\0';
    }
    if (strcmp(host, "*") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, colon + 1, &hints, &res);
    if (g != 0) {
        snprintf(why, cap, "host not found: %s", gai_strerror(g));
        return DH__WIRE_PROBE_UNREACHABLE;
    }
    dh__wire_probe_t out = DH__WIRE_PROBE_UNREACHABLE;
    snprintf(why, cap, "no address");
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = probe_socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            out = probe_failed(errno, why, cap);
            continue;
        }
        int err = connect_by(fd, a->ai_addr, a->ai_addrlen, deadline_ns);
        out = err ? unreachable(err, why, cap) : classify_greeting(fd, deadline_ns, why, cap);
        close(fd);
        if (out != DH__WIRE_PROBE_UNREACHABLE || !remaining_ms(deadline_ns))
            break;
    }
    freeaddrinfo(res);
    return out;
}

dh__wire_probe_t dh__wire_probe(const char *endpoint, int timeout_ms, char *why, size_t cap)
{
    uint64_t deadline_ns =
        dh_clock_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000000;
    why[0] = '\0';
    if (strncmp(endpoint, "tcp://", 6) == 0)
        return probe_tcp(endpoint + 6, deadline_ns, why, cap);
    if (strncmp(endpoint, "ipc://", 6) == 0)
        return probe_ipc(endpoint + 6, deadline_ns, why, cap);
    snprintf(why, cap, "not a tcp:// or ipc:// endpoint");
    return DH__WIRE_PROBE_SKIPPED;
}
