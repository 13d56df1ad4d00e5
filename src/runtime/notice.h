/* runtime/notice.h: the local notice channel between a DataServer and the clients on its
 * node (docs/shared-memory.md, wire-protocol.md "Packet form").
 *
 * The DataServer listens on an abstract AF_UNIX SOCK_SEQPACKET socket (nothing in the file
 * system to leave behind). A client connects, receives the arena's memfd (SCM_RIGHTS), and
 * keeps the connection open: it names itself with one packet (its client id), and from then
 * on the DataServer sends each DELIVER of arena handles to it as one packet
 * (dh_wire_encode_packet): two thread hops instead of ZeroMQ's four. Anything that cannot go
 * this way (payload frames, a full channel, no channel) goes over ZeroMQ instead.
 *
 * Who gets the fd: the DataServer asks the kernel who connected (SO_PEERCRED) and hands the
 * arena only to a process of its own effective uid or of a uid on its allowed list
 * (--shm-allow-uid, DH_SHM_ALLOW_UIDS); anyone else is logged (pid, uid), told why in a
 * packet without an fd, and hung up on.
 * An abstract socket has no file permissions, so this check is the only gate.
 *
 * Threads: a dh__notice_server_t belongs to the DataServer's loop thread; a client's
 * channel fd to its fetcher thread.
 */
#ifndef DH_RUNTIME_NOTICE_H
#define DH_RUNTIME_NOTICE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "datahelix/wire.h"

#define DH__NOTICE_NAME_CAP 128
#define DH__NOTICE_MAX 64       /* open notice channels; more clients get DELIVERs over ZeroMQ */
#define DH__NOTICE_ALLOW_MAX 16 /* uids allowed besides the server's own */
#define DH__NOTICE_REFUSED "refused: " /* starts the packet a refused client gets */

/* A client's channel: the accepted connection, named once the client has written its id. */
typedef struct dh__notice_conn {
    int fd;
    char name[DH__NOTICE_NAME_CAP];
} dh__notice_conn_t;

/* The DataServer's end: the listening socket and the channels it accepted. */
typedef struct dh__notice_server {
    int listen_fd;                  /* -1 when not listening */
    char name[DH__NOTICE_NAME_CAP]; /* the abstract socket's name (no leading NUL) */
    const char *owner;              /* the DataServer's name, for log lines (borrowed) */
    dh__notice_conn_t conns[DH__NOTICE_MAX];
    size_t n_conns;
    uid_t allow_uids[DH__NOTICE_ALLOW_MAX]; /* besides geteuid() */
    size_t n_allow_uids;
    size_t refused; /* peers refused for their uid (or unknown credentials) */
} dh__notice_server_t;

/* Initialises ns: not listening, no channels; owner (borrowed) is the DataServer's name. */
void dh__notice_server_init(dh__notice_server_t *ns, const char *owner);

/* Sets the uids, besides the server's effective uid, whose processes may get the arena:
 * `text` is "UID[,UID...]" (decimal, at most DH__NOTICE_ALLOW_MAX); NULL or "" allows none.
 * Returns 0, or DH_EINVAL with a message naming `what` (the option or variable it came
 * from) and the bad entry; the list is then left empty. */
int dh__notice_server_allow(dh__notice_server_t *ns, const char *text, const char *what);

/* Listens on a fresh abstract name ("datahelix-<pid>-<n>", in ns->name). Returns 0 or a
 * negative errno with a message. */
int dh__notice_server_listen(dh__notice_server_t *ns);

/* The listening socket is readable: accepts one client, checks its uid (SO_PEERCRED: ours
 * or an allowed one; else it is logged with its pid and uid, counted in ns->refused, sent
 * the reason without an fd, and closed), hands it arena_fd, and keeps the connection as a channel
 * (non-blocking) while there is room; failures are logged. */
void dh__notice_server_accept(dh__notice_server_t *ns, int arena_fd);

/* Channel i is readable: the client's id (its first packet), or its end (the channel is
 * closed; the last channel moves to slot i, so callers walk the channels backwards). */
void dh__notice_server_read(dh__notice_server_t *ns, size_t i);

/* Sends a message (a DELIVER of arena handles) as one packet on the newest channel of
 * client_id. Returns true when the whole packet went out; false when it must go over ZeroMQ
 * instead (no channel, a FRAME tensor, out of memory, full, or gone). */
bool dh__notice_server_send(dh__notice_server_t *ns, const char *client_id, const dh_msg_t *m);

/* Closes every channel and the listening socket. */
void dh__notice_server_close(dh__notice_server_t *ns);

/* Client: connects to the DataServer's socket @name and receives its arena's fd. Returns 0
 * with *arena_fd and *conn (the channel, the caller's to close), DH_EACCES when the server
 * refused this process's uid (the message gives the server's reason), or another negative
 * code with a message naming the socket. */
int dh__notice_connect(const char *name, int *arena_fd, int *conn);

/* Client: names itself on the channel (its first packet). Returns 0, or -1 when the packet
 * did not go out whole (the caller closes the channel and uses ZeroMQ only). */
int dh__notice_name(int conn, const char *client_id);

/* Client: the channel is readable. Returns 1 with the decoded packet in *out (the caller's:
 * dh_msg_clear), 0 when there was nothing to read or the packet was malformed (dropped,
 * logged), DH__NOTICE_AGAIN when it could not be read for lack of memory (it stays queued:
 * call again a little later), or -1 when the channel ended (the DataServer died or stopped;
 * the caller closes it). `owner` names the client in log lines. */
#define DH__NOTICE_AGAIN 2
int dh__notice_receive(int conn, const char *owner, dh_msg_t *out);

#endif
