/* notice.c: the local notice channel, both ends (notice.h): the DataServer's abstract
 * AF_UNIX SOCK_SEQPACKET socket that hands out the arena's memfd and then carries DELIVERs of
 * arena handles as single packets, and the client's connection to it.
 *
 * Only processes of the DataServer's effective uid, or of a uid on its allowed list, get
 * the memfd (SO_PEERCRED; the abstract socket has no file permissions to do it): a process
 * that holds the fd can read and write every batch of every rank on the node.
 *
 * Every send and receive is non-blocking on the DataServer's side (its loop never waits on
 * a slow client: a full channel sends over ZeroMQ instead). Cost: one encode and one send
 * per DELIVER; a receive peeks the packet's size first, so one allocation of exactly that.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "datahelix/shm.h"
#include "runtime/notice.h"

/* The abstract address of `name` (leading NUL: nothing in the file system). */
static socklen_t abstract_addr(const char *name, struct sockaddr_un *addr)
{
    *addr = (struct sockaddr_un){.sun_family = AF_UNIX};
    size_t len = strlen(name);
    memcpy(addr->sun_path + 1, name, len);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

/* ---- the DataServer's end ---- */

void dh__notice_server_init(dh__notice_server_t *ns, const char *owner)
{
    memset(ns, 0, sizeof *ns);
    ns->listen_fd = -1;
    ns->owner = owner;
}

int dh__notice_server_allow(dh__notice_server_t *ns, const char *text, const char *what)
{
    ns->n_allow_uids = 0;
    if (!text || !text[0])
        return 0;
    const char *s = text;
    for (;;) {
        char *end;
        errno = 0;
        unsigned long long uid = s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
        if (s[0] < '0' || s[0] > '9' || errno || (*end && *end != ',') ||
            uid >= (unsigned long long)(uid_t)-1 || ns->n_allow_uids == DH__NOTICE_ALLOW_MAX) {
            const char *why = ns->n_allow_uids == DH__NOTICE_ALLOW_MAX
                                  ? "more than 16 uids"
                                  : "each entry must be a decimal uid below 4294967295";
            ns->n_allow_uids = 0;
            return dh__set_error(DH_EINVAL, "%s: '%s' is not a list of uids (UID[,UID...]): %s",
                                 what, text, why);
        }
        ns->allow_uids[ns->n_allow_uids++] = (uid_t)uid;
        if (!*end)
            return 0;
        s = end + 1;
    }
}

/* Tells a refused peer why in one packet without an fd (its dh__notice_connect fails
 * with DH_EACCES and this text, instead of retrying as if the server had died), counts it
 * and hangs up. */
static void refuse(dh__notice_server_t *ns, int conn, const char *why)
{
    ssize_t sent;
    do {
        sent = send(conn, why, strlen(why), MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    ns->refused++;
    close(conn);
}

/* The peer's uid is ours or an allowed one. */
static bool uid_allowed(const dh__notice_server_t *ns, uid_t uid)
{
    if (uid == geteuid())
        return true;
    for (size_t i = 0; i < ns->n_allow_uids; i++)
        if (ns->allow_uids[i] == uid)
            return true;
    return false;
}

int dh__notice_server_listen(dh__notice_server_t *ns)
{
    static atomic_uint counter;
    snprintf(ns->name, sizeof ns->name, "datahelix-%d-%u", (int)getpid(),
             atomic_fetch_add(&counter, 1));
    ns->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (ns->listen_fd < 0)
        return dh__set_error(-errno, "DataServer: socket(AF_UNIX): %s", strerror(errno));
    struct sockaddr_un addr;
    socklen_t alen = abstract_addr(ns->name, &addr);
    if (bind(ns->listen_fd, (struct sockaddr *)&addr, alen) != 0 || listen(ns->listen_fd, 64) != 0)
        return dh__set_error(-errno, "DataServer: cannot listen on @%s: %s", ns->name,
                             strerror(errno));
    return 0;
}

void dh__notice_server_accept(dh__notice_server_t *ns, int arena_fd)
{
    int conn = accept4(ns->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0)
        return;
    /* The credentials the kernel recorded at connect(): the peer cannot forge them. */
    struct ucred cred;
    socklen_t cred_len = sizeof cred;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 ||
        cred_len != sizeof cred) {
        dh_log_warn("DataServer '%s': refused the arena to a client on @%s: SO_PEERCRED: %s",
                    ns->owner, ns->name, strerror(errno));
        refuse(ns, conn, DH__NOTICE_REFUSED "the DataServer cannot tell the client's uid");
        return;
    }
    if (!uid_allowed(ns, cred.uid)) {
        char why[256];
        snprintf(why, sizeof why,
                 DH__NOTICE_REFUSED "uid %u is not this DataServer's uid %u nor an allowed one "
                                    "(--shm-allow-uid, DH_SHM_ALLOW_UIDS)",
                 (unsigned)cred.uid, (unsigned)geteuid());
        dh_log_warn("DataServer '%s': refused the arena to pid %d (uid %u) on @%s: not this "
                    "server's uid %u nor an allowed one (--shm-allow-uid, DH_SHM_ALLOW_UIDS)",
                    ns->owner, (int)cred.pid, (unsigned)cred.uid, ns->name, (unsigned)geteuid());
        refuse(ns, conn, why);
        return;
    }
    int rc = dh_shm_send_fd(conn, arena_fd);
    if (rc == 0 && ns->n_conns < DH__NOTICE_MAX &&
        fcntl(conn, F_SETFL, fcntl(conn, F_GETFL) | O_NONBLOCK) == 0) {
        ns->conns[ns->n_conns++] = (dh__notice_conn_t){.fd = conn};
        return;
    }
    if (rc)
        dh_log_warn("DataServer '%s': cannot hand the arena to a client: %s", ns->owner,
                    dh_strerror(rc));
    close(conn);
}

static void server_drop(dh__notice_server_t *ns, size_t i)
{
    close(ns->conns[i].fd);
    ns->conns[i] = ns->conns[--ns->n_conns];
}

void dh__notice_server_read(dh__notice_server_t *ns, size_t i)
{
    char buf[DH__NOTICE_NAME_CAP];
    ssize_t n = recv(ns->conns[i].fd, buf, sizeof buf - 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0 || ns->conns[i].name[0]) {
        server_drop(ns, i); /* closed, failed, or a second packet (not in the protocol) */
        return;
    }
    buf[n] = '\0';
    if (strlen(buf) != (size_t)n) {
        dh_log_warn("DataServer '%s': a client named itself with a malformed id on the arena "
                    "socket @%s; using ZeroMQ for it",
                    ns->owner, ns->name);
        server_drop(ns, i);
        return;
    }
    memcpy(ns->conns[i].name, buf, (size_t)n + 1);
}

bool dh__notice_server_send(dh__notice_server_t *ns, const char *client_id, const dh_msg_t *m)
{
    int fd = -1;
    for (size_t i = ns->n_conns; i-- > 0;) /* the newest connection of that client */
        if (strcmp(ns->conns[i].name, client_id) == 0) {
            fd = ns->conns[i].fd;
            break;
        }
    if (fd < 0)
        return false;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dh_wire_encode_packet(m, &buf, &len))
        return false;
    ssize_t n;
    do {
        n = DH_FAULT(DH_FAULT_NOTICE_SEND) ? (errno = EAGAIN, -1) /* the channel is full */
                                           : send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    dh_free(buf);
    if (n != (ssize_t)len) {
        dh_log_debug("DataServer '%s': notice channel of client '%s': %s; using ZeroMQ", ns->owner,
                     client_id, n < 0 ? strerror(errno) : "short send");
        return false;
    }
    return true;
}

void dh__notice_server_close(dh__notice_server_t *ns)
{
    while (ns->n_conns)
        server_drop(ns, ns->n_conns - 1);
    if (ns->listen_fd >= 0)
        close(ns->listen_fd);
    ns->listen_fd = -1;
}

/* ---- the client's end ---- */

int dh__notice_connect(const char *name, int *fd_out, int *conn_out)
{
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return dh__set_error(-errno, "socket(AF_UNIX): %s", strerror(errno));
    struct sockaddr_un addr;
    if (strlen(name) + 1 > sizeof addr.sun_path) {
        close(sock);
        return dh__set_error(DH_EINVAL, "arena socket name '%s' too long", name);
    }
    socklen_t alen = abstract_addr(name, &addr);
    if (connect(sock, (struct sockaddr *)&addr, alen) != 0) {
        int e = errno;
        close(sock);
        return dh__set_error(-e, "cannot connect to the DataServer's arena socket @%s: %s", name,
                             strerror(e));
    }
    /* A refusal is a packet of text without an fd (the arena's is one byte with it). */
    char peek[256];
    ssize_t n;
    do {
        n = recv(sock, peek, sizeof peek - 1, MSG_PEEK);
    } while (n < 0 && errno == EINTR);
    size_t prefix = strlen(DH__NOTICE_REFUSED);
    if (n > (ssize_t)prefix && memcmp(peek, DH__NOTICE_REFUSED, prefix) == 0) {
        peek[n] = '\0';
        close(sock);
        return dh__set_error(DH_EACCES,
                             "the DataServer's arena socket @%s refused this process: %s", name,
                             peek + prefix);
    }
    int rc = dh_shm_recv_fd(sock, fd_out);
    if (rc) {
        close(sock);
        return dh__set_error(rc, "no arena fd from the DataServer's socket @%s: %s", name,
                             dh_strerror(rc));
    }
    *conn_out = sock; /* kept as the notice channel */
    return 0;
}

int dh__notice_name(int conn, const char *client_id)
{
    ssize_t sent;
    do {
        sent = send(conn, client_id, strlen(client_id), MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent == (ssize_t)strlen(client_id) ? 0 : -1;
}

/* The packet is read with MSG_PEEK, decoded, and only then taken off the channel: a
 * failure for lack of memory (the kernel's, the buffer, the decode) leaves it queued for the
 * next call (DH__NOTICE_AGAIN), where before the channel was closed and the DELIVER lost (the
 * batch then waited out next()'s timeout). */
int dh__notice_receive(int conn, const char *owner, dh_msg_t *out)
{
    memset(out, 0, sizeof *out);
    ssize_t size;
    do {
        size = recv(conn, NULL, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    } while (size < 0 && errno == EINTR);
    if (size < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (size < 0 && (errno == ENOMEM || errno == ENOBUFS))
        return DH__NOTICE_AGAIN;
    if (size <= 0)
        return -1; /* the DataServer's end (0), or the channel broke */
    uint8_t *buf = dh_malloc((size_t)size);
    if (!buf) {
        dh_log_warn("client '%s': out of memory for a %zd-byte notice (left queued)", owner, size);
        return DH__NOTICE_AGAIN;
    }
    ssize_t n;
    do { /* fault site DH_FAULT_NOTICE_RECV: the kernel is short of memory (ENOMEM) */
        n = DH_FAULT(DH_FAULT_NOTICE_RECV) ? (errno = ENOMEM, -1)
                                           : recv(conn, buf, (size_t)size, MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n != size) {
        int again = n < 0 && (errno == ENOMEM || errno == ENOBUFS);
        dh_free(buf);
        return again ? DH__NOTICE_AGAIN : -1;
    }
    int rc = dh_wire_decode_packet(buf, (size_t)n, out);
    dh_free(buf);
    if (rc == DH_ENOMEM) {
        dh_log_warn("client '%s': out of memory decoding a notice (left queued)", owner);
        return DH__NOTICE_AGAIN;
    }
    ssize_t taken; /* the packet off the channel (a zero-length read drops it whole) */
    do {
        taken = recv(conn, NULL, 0, MSG_TRUNC | MSG_DONTWAIT);
    } while (taken < 0 && errno == EINTR);
    if (taken != size) {
        dh_msg_clear(out);
        return -1;
    }
    if (rc) {
        dh_log_warn("client '%s': dropped a malformed notice from the local DataServer: %s", owner,
                    dh_last_error());
        return 0;
    }
    return 1;
}
