/* Tests of probe.c and the connect diagnosis built on it (zmq.c's dh__wire_diagnose and the
 * monitor's foreign-peer check) over real sockets on 127.0.0.1: a bound port that does not
 * listen (refused), an unknown host, a listener that says nothing or closes at once (not
 * ZeroMQ), and a ZeroMQ ROUTER (ZMTP). Every wait is a poll with a deadline. */
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "dh_test.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/wire.h"
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

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(probe_says_refused_for_a_port_nobody_listens_on),
    cmocka_unit_test(probe_says_host_not_found),
    cmocka_unit_test(probe_tells_a_silent_listener_from_zeromq),
    cmocka_unit_test(connect_refuses_an_endpoint_without_scheme),
    cmocka_unit_test(connect_names_a_foreign_peer_and_an_absent_one),
};
DH_TEST_MAIN(tests)
