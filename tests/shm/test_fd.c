/* test_fd.c: the memfd side channel (src/shm/fd.c) under its fault sites (a faults build;
 * skipped otherwise): sendmsg failing (DH_FAULT_SHM_SEND_FD) and recvmsg failing
 * (DH_FAULT_SHM_RECV_FD) at every hit of a hand-over of two arenas' fds. Each failure is an
 * error naming the call and the socket, with no fd or allocation left behind, nothing half
 * sent (a failed send leaves the socket empty) and nothing lost (a failed receive leaves the
 * message queued: the next receive gets it); the same socket pair carries the next hand-over.
 * The arena side (memfd_create, ftruncate, mmap) is swept in test_arena.c. In any build: a
 * message without exactly one fd is refused, and a peer that hangs up is DH_EEOF. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/shm.h"

#define ARENA_SIZE ((size_t)1 << 20)
#define SLAB ((size_t)64 << 10)
#define ARENAS 2

typedef struct channel {
    int sv[2];
    dh_shm_arena_t *arena[ARENAS];
} channel_t;

static void channel_open(channel_t *c)
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c->sv), 0);
    for (int i = 0; i < ARENAS; i++)
        assert_int_equal(dh_shm_arena_new(&c->arena[i], ARENA_SIZE, SLAB), 0);
}

static void channel_close(channel_t *c)
{
    for (int i = 0; i < ARENAS; i++)
        dh_shm_arena_destroy(&c->arena[i]);
    close(c->sv[0]);
    close(c->sv[1]);
}

/* 1 when the receiving end has bytes queued, 0 when it is empty. */
static int queued(const channel_t *c)
{
    struct pollfd p = {.fd = c->sv[1], .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

/* Receives one fd and checks that it attaches to arena i. Returns 0 or the receive's code. */
static int receive_arena(channel_t *c, int i)
{
    int fd = -1;
    int rc = dh_shm_recv_fd(c->sv[1], &fd);
    if (rc)
        return rc;
    dh_shm_arena_t *view = NULL;
    int arc = dh_shm_arena_attach(&view, fd);
    close(fd);
    assert_int_equal(arc, 0);
    assert_true(dh_shm_arena_id(view) == dh_shm_arena_id(c->arena[i]));
    dh_shm_arena_destroy(&view);
    return 0;
}

/* One hand-over: each arena's fd sent, received and attached. A failed send must leave
 * nothing on the socket (the receiver would otherwise attach the wrong arena later). */
static int hand_over_send(void *ctx)
{
    channel_t *c = ctx;
    for (int i = 0; i < ARENAS; i++) {
        int rc = dh_shm_send_fd(c->sv[0], dh_shm_arena_fd(c->arena[i]));
        if (rc) {
            assert_int_equal(rc, -EPIPE);
            assert_false(queued(c));
            return rc;
        }
        assert_int_equal(receive_arena(c, i), 0);
    }
    return 0;
}

static void shm_send_fd_fails_cleanly_at_every_hit(void **state)
{
    if (!dh_fault_enabled())
        skip();
    channel_t c;
    channel_open(&c);
    long hits = dh_test_each_fault(DH_FAULT_SHM_SEND_FD, "shm send fd", hand_over_send, &c);
    assert_int_equal(hits, ARENAS);
    channel_close(&c);
}

/* Both fds sent first; a failed receive leaves its message queued, so the retry gets it:
 * nothing is lost and no fd stays in flight. The error stays the failed receive's (a
 * success does not set one). */
static int hand_over_recv(void *ctx)
{
    channel_t *c = ctx;
    for (int i = 0; i < ARENAS; i++)
        assert_int_equal(dh_shm_send_fd(c->sv[0], dh_shm_arena_fd(c->arena[i])), 0);
    int failed = 0;
    for (int i = 0; i < ARENAS; i++) {
        int rc = receive_arena(c, i);
        if (rc) {
            assert_int_equal(rc, -ECONNRESET);
            assert_true(queued(c)); /* still there */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", dh_last_error());
            assert_int_equal(receive_arena(c, i), 0);
            assert_string_equal(dh_last_error(), msg);
            failed = rc;
        }
    }
    assert_false(queued(c));
    return failed;
}

static void shm_recv_fd_fails_cleanly_at_every_hit(void **state)
{
    if (!dh_fault_enabled())
        skip();
    channel_t c;
    channel_open(&c);
    long hits =
        dh_test_each_fault(DH_FAULT_SHM_RECV_FD, "shm recv fd on socket", hand_over_recv, &c);
    assert_int_equal(hits, ARENAS);
    channel_close(&c);
}

static long open_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    long n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static void expect_error(int rc, int want, const char *text)
{
    if (rc != want || !strstr(dh_last_error(), text))
        print_error("got %s (%s), want %s with '%s'\n", dh_err_name(rc), dh_last_error(),
                    dh_err_name(want), text);
    assert_int_equal(rc, want);
    assert_non_null(strstr(dh_last_error(), text));
}

/* Any build: a message must carry exactly one fd (two are both closed, none kept), and a
 * peer that hangs up is DH_EEOF. */
static void shm_recv_fd_rejects_messages_without_one_fd(void **state)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    long fds = open_fd_count();
    int fd = 12345;
    /* data without an fd */
    assert_int_equal(write(sv[0], "x", 1), 1);
    expect_error(dh_shm_recv_fd(sv[1], &fd), DH_EPARSE, "expected one fd, got 0");
    assert_int_equal(fd, -1);
    /* two fds in one message: both are closed, none returned */
    int two[2] = {sv[0], sv[0]};
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof two)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof two);
    memcpy(CMSG_DATA(c), two, sizeof two);
    assert_int_equal(sendmsg(sv[0], &msg, 0), 1);
    expect_error(dh_shm_recv_fd(sv[1], &fd), DH_EPARSE, "expected one fd, got 2");
    assert_int_equal(open_fd_count(), fds);
    /* one good fd */
    assert_int_equal(dh_shm_send_fd(sv[0], sv[0]), 0);
    assert_int_equal(dh_shm_recv_fd(sv[1], &fd), 0);
    assert_true(fd >= 0);
    assert_int_equal(open_fd_count(), fds + 1);
    close(fd);
    /* the peer hangs up */
    close(sv[0]);
    expect_error(dh_shm_recv_fd(sv[1], &fd), DH_EEOF, "peer closed");
    assert_int_equal(dh_shm_send_fd(sv[1], sv[1]), -EPIPE);
    close(sv[1]);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(shm_send_fd_fails_cleanly_at_every_hit),
    cmocka_unit_test(shm_recv_fd_fails_cleanly_at_every_hit),
    cmocka_unit_test(shm_recv_fd_rejects_messages_without_one_fd),
};

DH_TEST_MAIN(tests)
