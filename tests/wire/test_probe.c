/* Tests of probe.c and the connect diagnosis built on it (zmq.c's dh__wire_diagnose and the
 * monitor's foreign-peer check) over real sockets on 127.0.0.1: a bound port that does not
 * listen (refused), an unknown host, a listener that says nothing or closes at once (not
 * ZeroMQ), and a ZeroMQ ROUTER (ZMTP). Every wait is a poll with a deadline. */
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "dh_test.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/wire.h"
#include "core/internal.h"
#include "wire/internal.h"

/* A TCP socket on 127.0.0.1 with an OS-chosen port, listening or only bound. */
static int tcp_socket(int listening, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    if (listening)
        assert_int_equal(listen(fd, 8), 0);
    return fd;
}

static void probe_says_refused_for_a_port_nobody_listens_on(void **state)
{
    (void)state;
    int port, fd = tcp_socket(0, &port);
    char ep[64], why[256];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    assert_int_equal(dh__wire_probe(ep, 500, why, sizeof why), DH__WIRE_PROBE_UNREACHABLE);
    assert_string_equal(why, "connection refused");
    close(fd);
}

static void probe_says_host_not_found(void **state)
{
    (void)state;
    char why[256];
    assert_int_equal(dh__wire_probe("tcp://no-such-host.invalid:5555", 500, why, sizeof why),
                     DH__WIRE_PROBE_UNREACHABLE);
    assert_non_null(strstr(why, "host not found"));
}

static void probe_tells_a_silent_listener_from_zeromq(void **state)
{
    (void)state;
    int port, fd = tcp_socket(1, &port);
    char ep[64], why[256];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    uint64_t t0 = dh_clock_now_ns();
    assert_int_equal(dh__wire_probe(ep, 300, why, sizeof why), DH__WIRE_PROBE_FOREIGN);
    assert_non_null(strstr(why, "sent no ZeroMQ greeting"));
    assert_true(dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 2.0);
    close(fd);

    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof ep;
    assert_int_equal(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    assert_int_equal(dh__wire_probe(ep, 2000, why, sizeof why), DH__WIRE_PROBE_ZMTP);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

static void connect_refuses_an_endpoint_without_scheme(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    dh_wire_socket_t *s = NULL;
    assert_int_equal(dh_wire_socket_new(&s, ctx, ZMQ_DEALER, NULL), 0);
    assert_int_equal(dh_wire_socket_connect(s, "127.0.0.1:5555"), DH_EINVAL);
    assert_non_null(
        strstr(dh_last_error(), "no scheme: endpoints are tcp://HOST:PORT or ipc://PATH"));
    dh_wire_socket_destroy(&s);
    zmq_ctx_term(ctx);
}

/* A DEALER connected to a listener that closes each connection at once: the monitor's
 * handshake failure is probed, and recv fails with -EPROTO naming the role, well before its
 * own timeout; dh__wire_diagnose names a refused port. */
static void connect_names_a_foreign_peer_and_an_absent_one(void **state)
{
    (void)state;
    int port, fd = tcp_socket(1, &port);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    void *ctx = zmq_ctx_new();
    dh_wire_socket_t *s = NULL;
    assert_int_equal(dh_wire_socket_new(&s, ctx, ZMQ_DEALER, NULL), 0);
    dh__wire_set_peer_role(s, "coordinator");
    assert_int_equal(dh_wire_socket_connect(s, ep), 0);
    uint64_t t0 = dh_clock_now_ns();
    int rc = DH_EAGAIN;
    while (rc == DH_EAGAIN && dh_clock_elapsed_s(t0, dh_clock_now_ns()) < 10) {
        /* accept and close whatever connected, as a server of another protocol would */
        struct timeval tv = {0, 50000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        int conn = accept(fd, NULL, NULL);
        if (conn >= 0)
            close(conn);
        dh_wire_received_t r = {0};
        rc = dh_wire_recv(s, 100, &r);
        dh_wire_received_release(&r);
    }
    assert_int_equal(rc, -EPROTO);
    char want[128];
    snprintf(want, sizeof want, "%s answered, but it is not a DataHelix coordinator", ep);
    assert_non_null(strstr(dh_last_error(), want));
    dh_wire_socket_destroy(&s);
    close(fd);

    fd = tcp_socket(0, &port); /* bound, not listening: refused */
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    assert_int_equal(dh_wire_socket_new(&s, ctx, ZMQ_DEALER, NULL), 0);
    dh__wire_set_peer_role(s, "coordinator");
    assert_int_equal(dh_wire_socket_connect(s, ep), 0);
    assert_int_equal(dh__wire_diagnose(s, 500), DH_EAGAIN);
    snprintf(want, sizeof want, "cannot reach the coordinator at %s (connection refused)", ep);
    assert_non_null(strstr(dh_last_error(), want));
    dh_wire_socket_destroy(&s);
    close(fd);
    zmq_ctx_term(ctx);
}

/* Numbered fault site 23 (faults build; skipped otherwise): the probe's socket (EMFILE) and
 * its read of the greeting (ECONNRESET). */
static char fault_ep[64];

/* The diagnosis of a coordinator nobody listens for: "connection refused" when the probe
 * works (0), else the diagnosis's error, which must name the endpoint and the probe's step. */
static int diagnose_absent(void *arg)
{
    (void)arg;
    void *ctx = zmq_ctx_new();
    dh_wire_socket_t *s = NULL;
    assert_int_equal(dh_wire_socket_new(&s, ctx, ZMQ_DEALER, NULL), 0);
    dh__wire_set_peer_role(s, "coordinator");
    assert_int_equal(dh_wire_socket_connect(s, fault_ep), 0);
    int rc = dh__wire_diagnose(s, 500);
    assert_int_equal(rc, DH_EAGAIN);
    if (strstr(dh_last_error(), "(connection refused)"))
        rc = 0;
    dh_wire_socket_destroy(&s);
    assert_int_equal(zmq_ctx_term(ctx), 0);
    return rc;
}

static void diagnosis_of_an_absent_peer_fails_cleanly_at_every_hit(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    int port, fd = tcp_socket(0, &port); /* bound, not listening: refused */
    snprintf(fault_ep, sizeof fault_ep, "tcp://127.0.0.1:%d", port);
    char want[128];
    snprintf(want, sizeof want, "cannot reach the coordinator at %s (probe: socket: ", fault_ep);
    assert_int_equal(dh_test_each_fault(DH_FAULT_WIRE_PROBE, want, diagnose_absent, NULL), 1);
    close(fd);
}

/* The probe of a ZeroMQ peer: ZMTP when it works (0); a failed step says which and is never
 * taken for a peer of another protocol (which the monitor's check makes a lasting -EPROTO:
 * before, a reset while reading the greeting was "closed the connection without a ZeroMQ
 * greeting"). */
static int probe_zeromq(void *arg)
{
    (void)arg;
    char why[256];
    dh__wire_probe_t found = dh__wire_probe(fault_ep, 2000, why, sizeof why);
    if (found == DH__WIRE_PROBE_ZMTP)
        return 0;
    assert_int_equal(found, DH__WIRE_PROBE_UNREACHABLE);
    return dh__set_error(DH_EAGAIN, "%s: %s", fault_ep, why);
}

static void probe_of_a_zeromq_peer_fails_cleanly_at_every_hit(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    /* The ZeroMQ peer is a child process: the fds its I/O thread opens and closes for each
     * probe are not this process's, which the sweep counts. */
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        void *ctx = zmq_ctx_new();
        void *router = zmq_socket(ctx, ZMQ_ROUTER);
        char ep[64];
        size_t len = sizeof ep;
        if (zmq_bind(router, "tcp://127.0.0.1:*") != 0 ||
            zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len) != 0)
            _exit(1);
        if (write(up[1], ep, strlen(ep) + 1) < 0)
            _exit(1);
        char c;
        while (read(down[0], &c, 1) > 0) /* until the parent closes its end */
            ;
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    struct pollfd p = {.fd = up[0], .events = POLLIN};
    assert_int_equal(poll(&p, 1, 10000), 1);
    ssize_t n = read(up[0], fault_ep, sizeof fault_ep);
    assert_true(n > 6 && fault_ep[n - 1] == '\0');
    /* the socket, then each read of the 10-byte greeting (one, or more when it comes in
     * pieces) */
    assert_true(dh_test_each_fault(DH_FAULT_WIRE_PROBE, ": probe: ", probe_zeromq, NULL) >= 2);
    close(down[1]);
    close(up[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(probe_says_refused_for_a_port_nobody_listens_on),
    cmocka_unit_test(probe_says_host_not_found),
    cmocka_unit_test(probe_tells_a_silent_listener_from_zeromq),
    cmocka_unit_test(connect_refuses_an_endpoint_without_scheme),
    cmocka_unit_test(connect_names_a_foreign_peer_and_an_absent_one),
    cmocka_unit_test(diagnosis_of_an_absent_peer_fails_cleanly_at_every_hit),
    cmocka_unit_test(probe_of_a_zeromq_peer_fails_cleanly_at_every_hit),
};
DH_TEST_MAIN(tests)
