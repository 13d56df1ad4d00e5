/* test_notice.c: who gets the arena's memfd from the DataServer's abstract socket
 * (src/runtime/notice.c): a process of the server's own uid does, one of another uid is
 * refused (SO_PEERCRED) and logged with its pid and uid, unless its uid is on the allowed
 * list; the list's parsing. The peers are forked children that setuid() to nobody (65534),
 * so the uid cases need root and are skipped without it. Children report through their
 * exit status; the parent waits on the listening socket with poll() and a timeout. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/shm.h"
#include "core/internal.h"
#include "runtime/notice.h"

#define NOBODY ((uid_t)65534)
#define SAME_UID ((uid_t)-1)

/* In a forked child: report a failed check on stderr and exit non-zero. */
#define CHILD_EXPECT(cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child %d: %s:%d: failed: %s (%s)\n", (int)getpid(), __FILE__,         \
                    __LINE__, #cond, dh_last_error());                                             \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

/* A forked peer: becomes `uid` (SAME_UID: stays), connects to @name and expects the arena's
 * fd (an attachable arena) or a refusal (DH_EACCES, the server's reason, no fd). */
static pid_t spawn_peer(const char *name, uid_t uid, bool expect_fd)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid != 0)
        return pid;
    if (uid != SAME_UID) {
        CHILD_EXPECT(setgroups(0, NULL) == 0);
        CHILD_EXPECT(setgid((gid_t)uid) == 0);
        CHILD_EXPECT(setuid(uid) == 0);
        CHILD_EXPECT(geteuid() == uid);
    }
    int fd = -1, conn = -1;
    int rc = dh__notice_connect(name, &fd, &conn);
    if (expect_fd) {
        CHILD_EXPECT(rc == 0 && fd >= 0);
        dh_shm_arena_t *arena = NULL;
        CHILD_EXPECT(dh_shm_arena_attach(&arena, fd) == 0);
        dh_shm_arena_destroy(&arena);
        close(fd);
        close(conn);
    } else {
        char want[64];
        snprintf(want, sizeof want, "refused this process: uid %u is not", (unsigned)geteuid());
        CHILD_EXPECT(rc == DH_EACCES && fd == -1 && strstr(dh_last_error(), want));
    }
    _exit(0);
}

static void expect_exit_zero(pid_t pid)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        print_error("peer %d: status 0x%x\n", (int)pid, status);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Waits for the peer's connection and accepts it, with the server's log lines (stderr)
 * written to the test's file `log_name`; returns that file's text (the caller frees). */
static char *accept_logged(dh__notice_server_t *ns, int arena_fd, const char *log_name)
{
    struct pollfd p = {.fd = ns->listen_fd, .events = POLLIN};
    int rc;
    do {
        rc = poll(&p, 1, 10000);
    } while (rc < 0 && errno == EINTR);
    assert_int_equal(rc, 1);
    const char *path = dh_test_path(log_name);
    int log = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(log >= 0);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_int_equal(dup2(log, 2), 2);
    dh__notice_server_accept(ns, arena_fd);
    fflush(stderr);
    assert_int_equal(dup2(saved, 2), 2);
    close(saved);
    close(log);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *text = calloc(1, 4096);
    assert_non_null(text);
    size_t n = fread(text, 1, 4095, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

typedef struct fixture {
    dh__notice_server_t ns;
    dh_shm_arena_t *arena;
} fixture_t;

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    dh__notice_server_init(&fx->ns, "test");
    assert_int_equal(dh__notice_server_listen(&fx->ns), 0);
    assert_int_equal(dh_shm_arena_new(&fx->arena, (size_t)1 << 20, (size_t)64 << 10), 0);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    dh__notice_server_close(&fx->ns);
    dh_shm_arena_destroy(&fx->arena);
    free(fx);
    return 0;
}

static void notice_hands_the_arena_to_the_same_uid(void **state)
{
    fixture_t *fx = *state;
    pid_t pid = spawn_peer(fx->ns.name, SAME_UID, true);
    char *log = accept_logged(&fx->ns, dh_shm_arena_fd(fx->arena), "same.log");
    expect_exit_zero(pid);
    assert_int_equal(fx->ns.refused, 0);
    assert_int_equal(fx->ns.n_conns, 1);
    assert_null(strstr(log, "refused"));
    free(log);
}

static void notice_refuses_a_peer_of_another_uid(void **state)
{
    fixture_t *fx = *state;
    if (geteuid() != 0)
        skip(); /* no other uid to become */
    pid_t pid = spawn_peer(fx->ns.name, NOBODY, false);
    char *log = accept_logged(&fx->ns, dh_shm_arena_fd(fx->arena), "refused.log");
    expect_exit_zero(pid);
    assert_int_equal(fx->ns.refused, 1);
    assert_int_equal(fx->ns.n_conns, 0);
    char want[128];
    snprintf(want, sizeof want, "refused the arena to pid %d (uid 65534)", (int)pid);
    if (!strstr(log, want))
        print_error("log lacks '%s':\n%s\n", want, log);
    assert_non_null(strstr(log, want));
    assert_non_null(strstr(log, "not this server's uid 0"));
    free(log);
}

static void notice_hands_the_arena_to_an_allowed_uid(void **state)
{
    fixture_t *fx = *state;
    if (geteuid() != 0)
        skip();
    assert_int_equal(dh__notice_server_allow(&fx->ns, "1000,65534", "--shm-allow-uid"), 0);
    assert_int_equal(fx->ns.n_allow_uids, 2);
    pid_t pid = spawn_peer(fx->ns.name, NOBODY, true);
    char *log = accept_logged(&fx->ns, dh_shm_arena_fd(fx->arena), "allowed.log");
    expect_exit_zero(pid);
    assert_int_equal(fx->ns.refused, 0);
    assert_int_equal(fx->ns.n_conns, 1);
    free(log);
    /* an allowed list without its uid refuses it again */
    assert_int_equal(dh__notice_server_allow(&fx->ns, "1000", "--shm-allow-uid"), 0);
    pid = spawn_peer(fx->ns.name, NOBODY, false);
    log = accept_logged(&fx->ns, dh_shm_arena_fd(fx->arena), "allowed2.log");
    expect_exit_zero(pid);
    assert_int_equal(fx->ns.refused, 1);
    free(log);
}

static void notice_allow_list_is_parsed_strictly(void **state)
{
    fixture_t *fx = *state;
    dh__notice_server_t *ns = &fx->ns;
    assert_int_equal(dh__notice_server_allow(ns, NULL, "x"), 0);
    assert_int_equal(ns->n_allow_uids, 0);
    assert_int_equal(dh__notice_server_allow(ns, "", "x"), 0);
    assert_int_equal(ns->n_allow_uids, 0);
    assert_int_equal(dh__notice_server_allow(ns, "0", "x"), 0);
    assert_int_equal(ns->n_allow_uids, 1);
    assert_int_equal(ns->allow_uids[0], 0);
    assert_int_equal(dh__notice_server_allow(ns, "1,22,4294967294", "x"), 0);
    assert_int_equal(ns->n_allow_uids, 3);
    assert_int_equal(ns->allow_uids[2], 4294967294u);
    const char *bad[] = {
        "abc", "1,,2", "1,", ",1", "-1", " 1", "1 ", "4294967295", "99999999999999999999", "1;2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = dh__notice_server_allow(ns, bad[i], "DataServer: --shm-allow-uid");
        if (rc != DH_EINVAL)
            print_error("'%s' was accepted\n", bad[i]);
        assert_int_equal(rc, DH_EINVAL);
        assert_non_null(strstr(dh_last_error(), "--shm-allow-uid"));
        assert_non_null(strstr(dh_last_error(), bad[i]));
        assert_int_equal(ns->n_allow_uids, 0); /* nothing half-parsed is kept */
    }
    char many[256] = "1";
    for (int i = 2; i <= DH__NOTICE_ALLOW_MAX + 1; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), ",%d", i);
    assert_int_equal(dh__notice_server_allow(ns, many, "x"), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "more than 16"));
}

/* ---- numbered fault sites (a faults build; skipped otherwise) ----------------------- */

/* A client of this process (a thread) asking for the arena. */
typedef struct client {
    const char *name;
    const dh_shm_arena_t *arena;
    int rc;
    char msg[1024];
} client_t;

static void *client_main(void *arg)
{
    client_t *c = arg;
    int fd = -1, conn = -1;
    c->rc = dh__notice_connect(c->name, &fd, &conn);
    snprintf(c->msg, sizeof c->msg, "%s", dh_last_error());
    if (c->rc == 0) {
        dh_shm_arena_t *view = NULL;
        c->rc = dh_shm_arena_attach(&view, fd);
        if (c->rc == 0 && dh_shm_arena_id(view) != dh_shm_arena_id(c->arena))
            c->rc = DH_EINVAL;
        dh_shm_arena_destroy(&view);
        close(fd);
        close(conn);
    }
    return NULL;
}

/* One hand-over of the arena to a client thread; the channel closed by both ends after. A
 * failed sendmsg on the server's side (EPIPE) or recvmsg on the client's (ECONNRESET) is the
 * client's error naming the DataServer's socket; neither end keeps an fd or a channel. */
static int hand_over(void *ctx)
{
    fixture_t *fx = ctx;
    client_t c = {.name = fx->ns.name, .arena = fx->arena};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, client_main, &c), 0);
    struct pollfd p = {.fd = fx->ns.listen_fd, .events = POLLIN};
    int ready;
    do {
        ready = poll(&p, 1, 10000);
    } while (ready < 0 && errno == EINTR);
    assert_int_equal(ready, 1);
    dh__notice_server_accept(&fx->ns, dh_shm_arena_fd(fx->arena));
    assert_int_equal(pthread_join(t, NULL), 0);
    for (size_t i = fx->ns.n_conns; i-- > 0;)
        dh__notice_server_read(&fx->ns, i); /* the client has gone: its channel ends */
    assert_int_equal(fx->ns.n_conns, 0);
    if (c.rc)
        dh__set_error(c.rc, "%s", c.msg); /* the client thread's error, for the sweep */
    return c.rc;
}

static void sweep_notice(int site)
{
    if (!dh_fault_enabled())
        skip();
    void *state = NULL;
    assert_int_equal(setup(&state), 0);
    fixture_t *fx = state;
    char what[256];
    snprintf(what, sizeof what, "no arena fd from the DataServer's socket @%s: ", fx->ns.name);
    assert_int_equal(dh_test_each_fault(site, what, hand_over, fx), 1);
    teardown(&state);
}

static void notice_send_fd_failure_fails_the_client_cleanly(void **state)
{
    sweep_notice(DH_FAULT_SHM_SEND_FD);
}

static void notice_recv_fd_failure_fails_the_client_cleanly(void **state)
{
    sweep_notice(DH_FAULT_SHM_RECV_FD);
}

/* Fault sites 25 and 26 (faults build; skipped otherwise): DELIVER packets on a notice
 * channel (a socketpair standing for an accepted, named channel). Both are recovered at every
 * hit: a packet the DataServer could not send is sent over ZeroMQ instead (the send says
 * false), and a packet the client could not read for lack of memory stays queued
 * (DH__NOTICE_AGAIN) and is read by the next call; each of the 3 DELIVERs arrives once, in
 * order, and the channel stays open. Before, a failed read closed the channel and lost the
 * packet (its batch waited out next()'s timeout). */
#define NOTICE_PACKETS 3

static int notice_packets(void *arg)
{
    (void)arg;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    dh__notice_server_t ns;
    dh__notice_server_init(&ns, "test");
    ns.conns[0].fd = sv[0];
    snprintf(ns.conns[0].name, sizeof ns.conns[0].name, "rank0");
    ns.n_conns = 1;
    bool over_zmq[NOTICE_PACKETS] = {0};
    for (uint64_t seq = 0; seq < NOTICE_PACKETS; seq++) {
        dh_msg_t m = {.type = DH_MSG_DELIVER};
        m.deliver.client_id = "rank0";
        m.deliver.seq = seq;
        m.deliver.server = "ds0";
        over_zmq[seq] = !dh__notice_server_send(&ns, "rank0", &m);
    }
    uint64_t next = 0;
    for (int tries = 0; next < NOTICE_PACKETS && tries < 1000; tries++) {
        while (next < NOTICE_PACKETS && over_zmq[next])
            next++; /* went over ZeroMQ: not on this channel */
        if (next == NOTICE_PACKETS)
            break;
        struct pollfd p = {.fd = sv[1], .events = POLLIN};
        assert_int_equal(poll(&p, 1, 5000), 1);
        dh_msg_t got = {0};
        int rc = dh__notice_receive(sv[1], "rank0", &got);
        assert_true(rc == 1 || rc == DH__NOTICE_AGAIN);
        if (rc == 1) {
            assert_int_equal(got.type, DH_MSG_DELIVER);
            assert_int_equal(got.deliver.seq, next);
            next++;
            dh_msg_clear(&got);
        }
    }
    assert_int_equal(next, NOTICE_PACKETS);
    dh_msg_t none = {0};
    assert_int_equal(dh__notice_receive(sv[1], "rank0", &none), 0); /* nothing twice */
    dh__notice_server_close(&ns);                                   /* closes sv[0] */
    close(sv[1]);
    return 0;
}

static void notice_send_failure_falls_back_to_zeromq(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    assert_int_equal(dh_test_each_fault(DH_FAULT_NOTICE_SEND, NULL, notice_packets, NULL),
                     NOTICE_PACKETS);
}

static void notice_read_failure_leaves_the_packet_queued(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    assert_int_equal(dh_test_each_fault(DH_FAULT_NOTICE_RECV, NULL, notice_packets, NULL),
                     NOTICE_PACKETS);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(notice_hands_the_arena_to_the_same_uid, setup, teardown),
        cmocka_unit_test_setup_teardown(notice_refuses_a_peer_of_another_uid, setup, teardown),
        cmocka_unit_test_setup_teardown(notice_hands_the_arena_to_an_allowed_uid, setup, teardown),
        cmocka_unit_test_setup_teardown(notice_allow_list_is_parsed_strictly, setup, teardown),
        cmocka_unit_test(notice_send_fd_failure_fails_the_client_cleanly),
        cmocka_unit_test(notice_recv_fd_failure_fails_the_client_cleanly),
        cmocka_unit_test(notice_send_failure_falls_back_to_zeromq),
        cmocka_unit_test(notice_read_failure_leaves_the_packet_queued),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
