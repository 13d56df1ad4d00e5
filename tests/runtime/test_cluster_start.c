/* Tests of the in-process cluster (src/runtime/cluster_start.c, include/datahelix/cluster.h): a
 * coordinator and DataServers as threads of this process, made, started, waited for and taken apart
 * by one starter; a second cluster joining the first's coordinator; the registration wait naming
 * the server that never registered; a bad server refused with nothing left; and each allocation of
 * the making failing in turn. The processes' tests are test_cluster.c. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/cluster.h"
#include "datahelix/error.h"
#include "datahelix/runtime.h"

#define SYNTH "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.001}"
#define WAIT_MS 20000 /* generous: a loaded 2-core machine; the wait returns when done */

static void config(dh_cluster_config_t *cc, const dh_cluster_server_t *servers, size_t n)
{
    dh_cluster_config_default(cc);
    cc->pipeline_json = SYNTH;
    cc->dead_after_ms = 60000; /* a loaded machine must not fake a death */
    cc->servers = servers;
    cc->n_servers = n;
}

/* One coordinator and two servers (a local one and a sidecar) on unique inproc://
 * endpoints of the cluster's own context: both register, the coordinator counts them alive,
 * and destroying it frees everything it allocated. */
static void cluster_starts_and_every_server_registers(void **state)
{
    long live = dh_alloc_live();
    dh_cluster_server_t servers[2] = {
        {.role = DH_DS_LOCAL,
         .node = "node-a",
         .name = "t-local",
         .workers = 1,
         .arena_bytes = 8u << 20},
        {.role = DH_DS_REMOTE, .node = "spare", .name = "t-remote", .workers = 1},
    };
    dh_cluster_config_t cc;
    config(&cc, servers, 2);
    dh_cluster_t *c = NULL;
    assert_int_equal(dh_cluster_new(&c, &cc), 0);
    assert_non_null(dh_cluster_coordinator(c));
    assert_non_null(dh_cluster_zmq_ctx(c));
    assert_int_equal(dh_cluster_count(c), 2);
    assert_string_equal(dh_dataserver_name(dh_cluster_server(c, 0)), "t-local");
    assert_string_equal(dh_dataserver_name(dh_cluster_server(c, 1)), "t-remote");
    assert_true(strncmp(dh_cluster_endpoint(c), "inproc://", 9) == 0);
    assert_true(strncmp(dh_dataserver_endpoint(dh_cluster_server(c, 0)), "inproc://", 9) == 0);
    assert_int_equal(dh_cluster_start(c), 0);
    assert_int_equal(dh_cluster_wait_registered(c, NULL, WAIT_MS), 0);
    dh_coordinator_stats_t st;
    dh_coordinator_stats(dh_cluster_coordinator(c), &st);
    assert_int_equal(st.servers_alive, 2);
    dh_cluster_destroy(&c);
    assert_null(c);
    dh_cluster_destroy(&c); /* safe on NULL */
    assert_int_equal(dh_alloc_live(), live);
}

/* listen on tcp://127.0.0.1:* : the endpoint is the port bound, and the local server's data
 * endpoint is tcp too (the DataServer's default). */
static void cluster_on_tcp_resolves_its_port(void **state)
{
    dh_cluster_server_t server = {.role = DH_DS_LOCAL,
                                  .node = "node-tcp",
                                  .name = "t-tcp",
                                  .workers = 1,
                                  .arena_bytes = 8u << 20};
    dh_cluster_config_t cc;
    config(&cc, &server, 1);
    cc.listen = "tcp://127.0.0.1:*";
    dh_cluster_t *c = NULL;
    assert_int_equal(dh_cluster_new(&c, &cc), 0);
    assert_true(strncmp(dh_cluster_endpoint(c), "tcp://127.0.0.1:", 16) == 0);
    assert_null(strchr(dh_cluster_endpoint(c), '*'));
    assert_true(strncmp(dh_dataserver_endpoint(dh_cluster_server(c, 0)), "tcp://", 6) == 0);
    assert_int_equal(dh_cluster_start(c), 0);
    assert_int_equal(dh_cluster_wait_registered(c, NULL, WAIT_MS), 0);
    dh_cluster_destroy(&c);
}

/* A second cluster in the first's context joins its coordinator: it starts none, its
 * endpoint is the one joined, and its server registers with the first's coordinator. */
static void cluster_joins_an_existing_coordinator(void **state)
{
    dh_cluster_server_t first = {.role = DH_DS_LOCAL,
                                 .node = "node-a",
                                 .name = "j-first",
                                 .workers = 1,
                                 .arena_bytes = 8u << 20};
    dh_cluster_server_t second = {.role = DH_DS_LOCAL,
                                  .node = "node-b",
                                  .name = "j-second",
                                  .workers = 1,
                                  .arena_bytes = 8u << 20};
    dh_cluster_config_t cc;
    config(&cc, &first, 1);
    dh_cluster_t *a = NULL, *b = NULL;
    assert_int_equal(dh_cluster_new(&a, &cc), 0);
    assert_int_equal(dh_cluster_start(a), 0);
    config(&cc, &second, 1);
    cc.zmq_ctx = dh_cluster_zmq_ctx(a);
    cc.join = dh_cluster_endpoint(a);
    assert_int_equal(dh_cluster_new(&b, &cc), 0);
    assert_null(dh_cluster_coordinator(b));
    assert_ptr_equal(dh_cluster_zmq_ctx(b), dh_cluster_zmq_ctx(a));
    assert_string_equal(dh_cluster_endpoint(b), dh_cluster_endpoint(a));
    assert_int_equal(dh_cluster_start(b), 0);
    assert_int_equal(dh_cluster_wait_registered(b, dh_cluster_coordinator(a), WAIT_MS), 0);
    assert_int_equal(dh_cluster_wait_registered(a, NULL, WAIT_MS), 0);
    dh_coordinator_stats_t st;
    dh_coordinator_stats(dh_cluster_coordinator(a), &st);
    assert_int_equal(st.servers_alive, 2);
    dh_cluster_destroy(&b); /* borrows a's context: before a */
    dh_cluster_destroy(&a);
}

/* A server that joins an endpoint nobody binds never registers with the coordinator waited
 * on: the wait gives up at its timeout with DH_EAGAIN, naming that server and not the one
 * that did register. */
static void registration_timeout_names_the_missing_server(void **state)
{
    dh_cluster_server_t here = {.role = DH_DS_LOCAL,
                                .node = "node-a",
                                .name = "w-here",
                                .workers = 1,
                                .arena_bytes = 8u << 20};
    dh_cluster_server_t lost = {
        .role = DH_DS_REMOTE, .node = "spare", .name = "w-lost", .workers = 1};
    dh_cluster_config_t cc;
    config(&cc, &here, 1);
    dh_cluster_t *a = NULL, *b = NULL;
    assert_int_equal(dh_cluster_new(&a, &cc), 0);
    assert_int_equal(dh_cluster_start(a), 0);
    assert_int_equal(dh_cluster_wait_registered(a, NULL, WAIT_MS), 0);
    char nowhere[128];
    snprintf(nowhere, sizeof nowhere, "inproc://nobody-listens-%d", (int)getpid());
    config(&cc, &lost, 1);
    cc.zmq_ctx = dh_cluster_zmq_ctx(a);
    cc.join = nowhere;
    assert_int_equal(dh_cluster_new(&b, &cc), 0);
    assert_int_equal(dh_cluster_start(b), 0);
    assert_int_equal(dh_cluster_wait_registered(b, dh_cluster_coordinator(a), 300), DH_EAGAIN);
    const char *why = dh_last_error();
    print_message("%s\n", why);
    assert_non_null(strstr(why, "1 of 1 DataServers did not register"));
    assert_non_null(strstr(why, "'w-lost'"));
    assert_null(strstr(why, "w-here"));
    assert_non_null(strstr(why, nowhere));
    dh_cluster_destroy(&b);
    dh_cluster_destroy(&a);
}

/* A server without a node is refused, naming its index; what was made before it (the
 * coordinator, the first server, the context) is taken apart. */
static void server_without_node_is_refused_and_nothing_left(void **state)
{
    long live = dh_alloc_live();
    dh_cluster_server_t servers[2] = {
        {.role = DH_DS_LOCAL,
         .node = "node-a",
         .name = "n-ok",
         .workers = 1,
         .arena_bytes = 8u << 20},
        {.role = DH_DS_REMOTE, .node = NULL, .name = "n-bad", .workers = 1},
    };
    dh_cluster_config_t cc;
    config(&cc, servers, 2);
    dh_cluster_t *c = NULL;
    assert_int_equal(dh_cluster_new(&c, &cc), DH_EINVAL);
    assert_null(c);
    assert_non_null(strstr(dh_last_error(), "DataServer 1 has no node"));
    assert_int_equal(dh_alloc_live(), live);
}

/* Delivery-only servers (0 workers): a DataServer starts its workers when it is made, and
 * their allocations, on their own threads, would race the count of failing ones. */
static int make_and_destroy(void *ctx)
{
    (void)ctx;
    dh_cluster_server_t servers[2] = {
        {.role = DH_DS_LOCAL, .node = "node-a", .name = "m-a", .arena_bytes = 8u << 20},
        {.role = DH_DS_LOCAL, .node = "node-b", .name = "m-b", .arena_bytes = 8u << 20},
    };
    dh_cluster_config_t cc;
    config(&cc, servers, 2);
    dh_cluster_t *c = NULL;
    int rc = dh_cluster_new(&c, &cc);
    if (rc == 0)
        assert_non_null(c);
    else
        assert_null(c);
    dh_cluster_destroy(&c);
    return rc;
}

/* Each allocation of making a cluster (its own, the coordinator's, the servers') fails in
 * turn: DH_ENOMEM, no crash, nothing leaked (dh_test_each_allocation_failure). */
static void cluster_new_survives_each_allocation_failure(void **state)
{
    assert_true(dh_test_each_allocation_failure(make_and_destroy, NULL) > 3);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(cluster_starts_and_every_server_registers),
    cmocka_unit_test(cluster_on_tcp_resolves_its_port),
    cmocka_unit_test(cluster_joins_an_existing_coordinator),
    cmocka_unit_test(registration_timeout_names_the_missing_server),
    cmocka_unit_test(server_without_node_is_refused_and_nothing_left),
    cmocka_unit_test(cluster_new_survives_each_allocation_failure),
};

DH_TEST_MAIN(tests)
