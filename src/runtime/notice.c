/* notice.c: the local notice channel, both ends (notice.h): the DataServer's abstract
 * AF_UNIX SOCK_SEQPACKET socket that hands out the arena's memfd and then carries DELIVERs of
 * arena handles as single packets, and the client's connection to it.
 *
 * Every send and receive is non-blocking on the DataServer's side (its loop never waits on
 * a slow client: a full channel sends over ZeroMQ instead). Cost: one encode and one send
 * per DELIVER; a receive peeks the packet's size first, so one allocation of exactly that.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
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
        n = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
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

int dh__notice_receive(int conn, const char *owner, dh_msg_t *out)
{
    memset(out, 0, sizeof *out);
    ssize_t size;
    do {
        size = recv(conn, NULL, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    } while (size < 0 && errno == EINTR);
    if (size < 0 && errno == EAGAIN)
        return 0;
    uint8_t *buf = size > 0 ? dh_malloc((size_t)size) : NULL;
    ssize_t n = buf ? recv(conn, buf, (size_t)size, MSG_DONTWAIT) : -1;
    if (size <= 0 || n != size) {
        if (size > 0 && !buf)
            dh_log_warn("client '%s': out of memory for a %zd-byte notice", owner, size);
        dh_free(buf);
        return -1;
    }
    int rc = dh_wire_decode_packet(buf, (size_t)n, out);
    dh_free(buf);
    if (rc) {
        dh_log_warn("client '%s': dropped a malformed notice from the local DataServer: %s", owner,
                    dh_last_error());
        return 0;
    }
    return 1;
}
