/* fd.c: passing an arena's memfd to a client over an AF_UNIX socket (SCM_RIGHTS).
 *
 * One message = one data byte (a stream socket cannot carry ancillary data alone) plus
 * exactly one fd. The receiver treats the message as input from another process: anything
 * but exactly one fd is an error, and any fds that came with it are closed, not leaked.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/shm.h"
#include "core/internal.h"

/* Room for a few fds, so an unexpected extra one is received (and closed) rather than
 * truncating the control message. */
#define MAX_FDS 4

int dh_shm_send_fd(int sock, int fd)
{
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
    ssize_t n;
    do {
        if (DH_FAULT(DH_FAULT_SHM_SEND_FD)) { /* as the kernel says when the peer is gone */
            errno = EPIPE;
            n = -1;
            break;
        }
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        int rc = -errno;
        return dh__set_error(rc, "shm send fd %d on socket %d: %s", fd, sock, strerror(-rc));
    }
    return 0;
}

int dh_shm_recv_fd(int sock, int *fd)
{
    assert(fd);
    *fd = -1;
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t n;
    do {
        if (DH_FAULT(DH_FAULT_SHM_RECV_FD)) { /* the message stays queued, as it would */
            errno = ECONNRESET;
            n = -1;
            break;
        }
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        int rc = -errno;
        return dh__set_error(rc, "shm recv fd on socket %d: %s", sock, strerror(-rc));
    }
    int received[MAX_FDS * 2];
    size_t count = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < fds && count < DH_ARRAY_LEN(received); i++)
            memcpy(&received[count++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    if (count == 1 && !(msg.msg_flags & MSG_CTRUNC)) {
        *fd = received[0];
        return 0;
    }
    for (size_t i = 0; i < count; i++)
        close(received[i]);
    if (n == 0 && count == 0)
        return dh__set_error(DH_EEOF, "shm recv fd on socket %d: peer closed the connection", sock);
    return dh__set_error(DH_EPARSE,
                         "shm recv fd on socket %d: expected one fd, got %zu%s in a %zd-byte "
                         "message",
                         sock, count, (msg.msg_flags & MSG_CTRUNC) ? " (truncated)" : "", n);
}
