/* test_cluster.c: the data plane as separate processes (issue 4): a coordinator, local and
 * remote DataServers and client ranks (`datahelix consume`), each on its own endpoints
 * (ipc:// and tcp://127.0.0.1), with the synthetic pipeline. Every test checks the ranks'
 * ledgers against the tier-1 plan (every sample of the epoch exactly once, each rank's
 * batches in order with the planned samples), that every process exits cleanly, and that
 * nothing of ours is left (cluster.h). Faults: kill -9 of a sidecar and of a local DataServer
 * mid-epoch, SIGSTOP/SIGCONT, a client killed with its slabs held, failing samples. And
 * `consume`'s tier-2 flags. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "cluster.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/sampler.h"

#define RANKS 4
#define BATCH 2
#define SAMPLES 400 /* 50 steps of 8 */
#define STEPS (SAMPLES / (RANKS * BATCH))
#define SEED 7
#define T_MS 90000

typedef struct cluster {
    char coord_ep[256];
    char profiles[512];
    char pipeline[512];
    char telemetry[512];
    cl_proc_t coord;
    cl_proc_t servers[4]; /* local-a, local-b, remote-1, remote-2 */
    cl_proc_t ranks[RANKS];
    char ledgers[RANKS][512];
    const char *policy;
    bool noisy; /* the pipeline's actual tokens differ from the estimates (tier 2 has work) */
} cluster_t;

static const char *const server_names[4] = {"local-a", "local-b", "remote-1", "remote-2"};

/* A free loopback port below the kernel's ephemeral range: the coordinator is restarted at
 * the same endpoint (cluster_coordinator_kill9_restarted), and a port in the ephemeral range
 * can be handed to some outgoing connection while it is down. */
static void free_tcp_endpoint(char *buf, size_t cap)
{
    int low = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    int lo = low > 13024 ? low - 12000 : 1024, span = low - lo > 1 ? low - lo : 1;
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 500; tries++) {
        int port = lo + (int)(rand_r(&seed) % (unsigned)span);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(s >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = bind(s, (struct sockaddr *)&a, sizeof a) == 0;
        close(s);
        if (ok) {
            snprintf(buf, cap, "tcp://127.0.0.1:%d", port);
            return;
        }
    }
    fail_msg("no free loopback port below %d", low);
}

static void make_profiles(const char *path, int count)
{
    char n[32];
    snprintf(n, sizeof n, "%d", count);
    char *argv[] = {
        "datahelix", "gen-profiles", "--mix", "kinetics-mixed", "--count", n, "--seed", "1",
        "-o",        (char *)path,   NULL};
    cl_proc_t p;
    cl_spawn(&p, "gen-profiles", argv);
    cl_expect_exit(&p, 0, 60000);
}

/* Starts coordinator + 4 DataServers (2 per role); `tcp` picks the transport of the
 * coordinator endpoint. Waits until all four registered. */
static void start_servers(cluster_t *c, bool tcp, const char *policy, int local_workers)
{
    if (tcp)
        free_tcp_endpoint(c->coord_ep, sizeof c->coord_ep);
    else
        snprintf(c->coord_ep, sizeof c->coord_ep, "ipc://%s", dh_test_path("coord.sock"));
    snprintf(c->profiles, sizeof c->profiles, "%s", dh_test_path("profiles.jsonl"));
    snprintf(c->pipeline, sizeof c->pipeline, "%s", dh_test_path("synthetic.json"));
    snprintf(c->telemetry, sizeof c->telemetry, "%s", dh_test_path("telemetry.jsonl"));
    make_profiles(c->profiles, SAMPLES);
    /* kinetics-mixed costs 0.05-1 s of CPU per sample: scaled to ~1-20 ms of sleep, and
     * 1% of the decoded bytes (24 KB - 400 KB per sample). */
    dh_test_write_file(c->pipeline, c->noisy ? "{\"type\": \"synthetic\", \"cost\": \"sleep\", "
                                               "\"cpu_scale\": 0.02, \"bytes_scale\": 0.01, "
                                               "\"token_noise\": 0.3}"
                                             : "{\"type\": \"synthetic\", \"cost\": \"sleep\", "
                                               "\"cpu_scale\": 0.02, \"bytes_scale\": 0.01}");
    c->policy = policy;
    char *cargv[] = {
        "datahelix",       "coordinator", "--listen",    c->coord_ep,  "--policy", (char *)policy,
        "--dead-after-ms", "400",         "--telemetry", c->telemetry, NULL};
    cl_spawn(&c->coord, "coordinator", cargv);
    cl_wait_log(c->coord.log, "coordinator: listening on", 1, 10000);
    char lw[16];
    snprintf(lw, sizeof lw, "%d", local_workers);
    for (int i = 0; i < 4; i++) {
        bool local = i < 2;
        char *node = (char *)(i == 0 ? "node-a" : i == 1 ? "node-b" : i == 2 ? "cpu-1" : "cpu-2");
        char *argv[] = {"datahelix",
                        "server",
                        "--coordinator",
                        c->coord_ep,
                        "--role",
                        local ? "local" : "remote",
                        "--node",
                        node,
                        "--workers",
                        local ? lw : "2",
                        "--pipeline",
                        c->pipeline,
                        "--name",
                        (char *)server_names[i],
                        "--arena-mb",
                        "64",
                        "--heartbeat-ms",
                        "50",
                        NULL};
        cl_spawn(&c->servers[i], server_names[i], argv);
    }
    for (int i = 0; i < 4; i++) {
        char needle[128];
        snprintf(needle, sizeof needle, "DataServer '%s' registered", server_names[i]);
        cl_wait_log(c->coord.log, needle, 1, 10000);
    }
}

/* Starts the ranks (`datahelix consume`) with extra options (up to 8, NULL-terminated; NULL:
 * none). */
static void start_ranks_with(cluster_t *c, const char *const *extra, const char *compute_ms)
{
    for (int r = 0; r < RANKS; r++) {
        char rank[8], name[32];
        snprintf(rank, sizeof rank, "%d", r);
        snprintf(name, sizeof name, "rank-%d", r);
        snprintf(c->ledgers[r], sizeof c->ledgers[r], "%s", dh_test_path(name));
        strncat(c->ledgers[r], ".jsonl", sizeof c->ledgers[r] - strlen(c->ledgers[r]) - 1);
        char seed[16];
        snprintf(seed, sizeof seed, "%d", SEED);
        char *argv[] = {"datahelix",
                        "consume",
                        "--coordinator",
                        c->coord_ep,
                        "--profiles",
                        c->profiles,
                        "--rank",
                        rank,
                        "--ranks",
                        "4",
                        "--batch",
                        "2",
                        "--seed",
                        seed,
                        "--node",
                        r < 2 ? "node-a" : "node-b",
                        "--ledger",
                        c->ledgers[r],
                        "--compute-ms",
                        (char *)compute_ms,
                        "--check-payload",
                        "--timeout-ms",
                        "60000",
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL};
        size_t at = 0;
        while (argv[at])
            at++;
        for (size_t k = 0; extra && extra[k] && k < 8; k++)
            argv[at++] = (char *)extra[k];
        cl_spawn(&c->ranks[r], name, argv);
    }
}

static void start_ranks(cluster_t *c, const char *extra_opt, const char *compute_ms)
{
    const char *extra[] = {extra_opt, NULL};
    start_ranks_with(c, extra, compute_ms);
}

static void finish_ranks(cluster_t *c)
{
    for (int r = 0; r < RANKS; r++)
        cl_expect_exit(&c->ranks[r], 0, T_MS);
}

static void stop_all(cluster_t *c)
{
    for (int i = 0; i < 4; i++)
        if (!c->servers[i].reaped)
            cl_stop(&c->servers[i]);
    cl_stop(&c->coord);
}

/* The ids rank r must get at step s, from the same pure planner the clients use. */
typedef struct plan_ref {
    dh_profile_set_t *set;
    char ***ids; /* [step][rank * BATCH + k] */
} plan_ref_t;

static void plan_ref_make_window(plan_ref_t *p, const char *profiles, uint32_t window)
{
    assert_int_equal(dh_profile_set_new(&p->set), 0);
    assert_int_equal(dh_profile_set_load(p->set, profiles), 0);
    size_t n = dh_profile_set_count(p->set), per = RANKS * BATCH;
    dh_sampler_t *s = NULL;
    assert_int_equal(dh_sampler_new(&s, n, per, SEED, 1), 0);
    dh_share_config_t sc = {.mode = DH_SHARE_TOKEN_BALANCED,
                            .algo = DH_PLAN_ALGO_DEFAULT,
                            .ranks = RANKS,
                            .batch = BATCH,
                            .window_steps = window};
    p->ids = calloc(STEPS, sizeof *p->ids);
    for (size_t step = 0; step < STEPS; step++) {
        p->ids[step] = calloc(per, sizeof(char *));
        for (uint32_t r = 0; r < RANKS; r++) {
            uint32_t rows[BATCH];
            assert_int_equal(dh_plan_rank_share(&sc, s, p->set, step, r, rows, BATCH), BATCH);
            for (int k = 0; k < BATCH; k++)
                p->ids[step][r * BATCH + k] = (char *)dh_profile_set_row(p->set, rows[k])->id;
        }
    }
    dh_sampler_destroy(&s);
}

static void plan_ref_make(plan_ref_t *p, const char *profiles)
{
    plan_ref_make_window(p, profiles, 1);
}

static void plan_ref_free(plan_ref_t *p)
{
    for (size_t step = 0; step < STEPS; step++)
        free(p->ids[step]);
    free(p->ids);
    dh_profile_set_destroy(&p->set);
}

typedef struct ledger_summary {
    int batches, remote_batches, errors;
} ledger_summary_t;

/* Checks every rank's ledger against the plan: batch i of rank r is line i, with the planned
 * ids in order; over all ranks every sample of the epoch appears exactly once. */
static ledger_summary_t check_ledgers_window(cluster_t *c, uint32_t window)
{
    plan_ref_t ref;
    plan_ref_make_window(&ref, c->profiles, window);
    ledger_summary_t sum = {0};
    size_t n = dh_profile_set_count(ref.set);
    int *seen = calloc(n, sizeof *seen);
    for (int r = 0; r < RANKS; r++) {
        FILE *f = fopen(c->ledgers[r], "r");
        assert_non_null(f);
        char line[65536];
        int index = 0;
        while (fgets(line, sizeof line, f)) {
            json_error_t err;
            json_t *o = json_loads(line, 0, &err);
            assert_non_null(o);
            if (json_object_get(o, "error")) {
                sum.errors++;
                json_decref(o);
                index++;
                continue;
            }
            int got_index = (int)json_integer_value(json_object_get(o, "index"));
            if (got_index != index)
                print_error("rank %d: line %d holds batch %d (order broken)\n", r, index,
                            got_index);
            assert_int_equal(got_index, index);
            assert_true(index < STEPS);
            json_t *ids = json_object_get(o, "ids");
            assert_int_equal(json_array_size(ids), BATCH);
            for (int k = 0; k < BATCH; k++) {
                const char *id = json_string_value(json_array_get(ids, (size_t)k));
                const char *want = ref.ids[index][r * BATCH + k];
                if (strcmp(id, want) != 0)
                    print_error("rank %d batch %d sample %d: got '%s', planned '%s'\n", r, index, k,
                                id, want);
                assert_string_equal(id, want);
                for (size_t i = 0; i < n; i++)
                    if (strcmp(dh_profile_set_row(ref.set, i)->id, id) == 0)
                        seen[i]++;
            }
            sum.errors += (int)json_array_size(json_object_get(o, "errors"));
            const char *server = json_string_value(json_object_get(o, "server"));
            if (server && strstr(server, "remote"))
                sum.remote_batches++;
            sum.batches++;
            index++;
            json_decref(o);
        }
        fclose(f);
        if (index != STEPS)
            print_error("rank %d: %d batches in its ledger, expected %d\n", r, index, STEPS);
        assert_int_equal(index, STEPS);
    }
    /* the epoch: STEPS x 8 samples drawn, each exactly once (SAMPLES is a multiple of 8,
     * so that is every sample of the file) */
    int once = 0;
    for (size_t i = 0; i < n; i++) {
        if (seen[i] > 1)
            print_error("sample '%s' delivered %d times\n", dh_profile_set_row(ref.set, i)->id,
                        seen[i]);
        assert_true(seen[i] <= 1);
        once += seen[i];
    }
    assert_int_equal(once, STEPS * RANKS * BATCH);
    free(seen);
    plan_ref_free(&ref);
    return sum;
}

static ledger_summary_t check_ledgers(cluster_t *c)
{
    return check_ledgers_window(c, 1);
}

/* "key N" in a log's stop line. */
static unsigned long long log_number(const char *path, const char *key)
{
    char *text = cl_read(path);
    const char *at = strstr(text, key);
    unsigned long long v = at ? strtoull(at + strlen(key), NULL, 10) : 0;
    free(text);
    return v;
}

/* Tier 1 across steps (`consume --plan-window 5`): every rank yields, batch by batch, the ids
 * the window planner gives it (which differ from the step-by-step plan's: samples moved
 * between steps), every sample of the epoch exactly once. */
static void cluster_plan_window_epoch_exactly_once(void **state)
{
    cluster_t c = {0};
    start_servers(&c, false, "deadline", 1);
    const char *extra[] = {"--plan-window", "5", NULL};
    start_ranks_with(&c, extra, "2");
    finish_ranks(&c);
    ledger_summary_t s = check_ledgers_window(&c, 5);
    assert_int_equal(s.errors, 0);
    plan_ref_t alone, across;
    plan_ref_make(&alone, c.profiles);
    plan_ref_make_window(&across, c.profiles, 5);
    int differ = 0;
    for (int step = 0; step < STEPS; step++)
        for (int i = 0; i < RANKS * BATCH; i++)
            differ += strcmp(alone.ids[step][i], across.ids[step][i]) != 0;
    plan_ref_free(&alone);
    plan_ref_free(&across);
    assert_true(differ > 0);
    stop_all(&c);
    cl_assert_no_leftovers();
}

static void cluster_full_epoch_ipc(void **state)
{
    cluster_t c = {0};
    start_servers(&c, false, "least-request", 1);
    start_ranks(&c, NULL, "2");
    finish_ranks(&c);
    ledger_summary_t s = check_ledgers(&c);
    assert_int_equal(s.errors, 0);
    /* least-request spreads over all four servers: the remote path was used */
    assert_true(s.remote_batches > 0);
    stop_all(&c);
    /* Every byte a DataServer forwarded (sidecars, and a local one executing for a client of
     * the other node) arrived in a local arena: counted on both ends. */
    unsigned long long remote = log_number(c.servers[2].log, "bytes forwarded ") +
                                log_number(c.servers[3].log, "bytes forwarded ");
    unsigned long long sent = remote + log_number(c.servers[0].log, "bytes forwarded ") +
                              log_number(c.servers[1].log, "bytes forwarded ");
    unsigned long long got = log_number(c.servers[0].log, "bytes received ") +
                             log_number(c.servers[1].log, "bytes received ");
    if (sent != got || remote == 0)
        print_error("DataServers forwarded %llu bytes (sidecars %llu), local DataServers "
                    "received %llu\n",
                    sent, remote, got);
    assert_true(remote > 0);
    assert_true(sent == got);
    /* every decision is in the telemetry, with its candidates */
    assert_true(cl_count(c.telemetry, "\"reason\":\"least_request\"") >= STEPS * RANKS);
    assert_true(cl_count(c.telemetry, "\"candidates\":[{") >= STEPS * RANKS);
    cl_assert_no_leftovers();
}

/* The requests the coordinator placed again, summed over its "declared dead" / "left" lines
 * ("...; N undelivered requests to place again": the count that feeds its redispatches
 * counter). */
static unsigned long long replaced_requests(const char *coord_log)
{
    static const char tail[] = " undelivered requests to place again";
    char *text = cl_read(coord_log);
    unsigned long long sum = 0;
    for (const char *at = strstr(text, tail); at; at = strstr(at + 1, tail)) {
        const char *d = at;
        while (d > text && d[-1] >= '0' && d[-1] <= '9')
            d--;
        sum += strtoull(d, NULL, 10);
    }
    free(text);
    return sum;
}

static void cluster_kill9_sidecar_mid_epoch(void **state)
{
    cluster_t c = {0};
    start_servers(&c, true, "least-request", 1);
    start_ranks(&c, NULL, "2");
    cl_wait_lines(c.ledgers[0], STEPS / 4, T_MS);
    cl_signal(&c.servers[2], SIGKILL);
    /* mid-epoch: rank 0 had not finished when the server died */
    assert_true(cl_count(c.ledgers[0], "\n") < STEPS);
    assert_int_equal(cl_wait_exit(&c.servers[2], 5000), 128 + SIGKILL);
    finish_ranks(&c);
    ledger_summary_t s = check_ledgers(&c);
    assert_int_equal(s.errors, 0);
    cl_wait_log(c.coord.log, "DataServer 'remote-1' (pid", 1, 5000);
    assert_true(cl_count(c.coord.log, "declared dead") >= 1);
    /* the telemetry stays JSON with a dead server among the candidates (its T is null) */
    FILE *tf = fopen(c.telemetry, "r");
    assert_non_null(tf);
    char line[65536];
    int lines = 0, nulls = 0;
    while (fgets(line, sizeof line, tf)) {
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        if (!o)
            fail_msg("telemetry line %d is not JSON (%s): %.200s", lines + 1, jerr.text, line);
        nulls += strstr(line, "\"t_s\":null") != NULL;
        json_decref(o);
        lines++;
    }
    fclose(tf);
    assert_true(lines > 0);
    assert_true(nulls > 0);
    /* what the dead sidecar held was placed again (and, no errors above, delivered) */
    unsigned long long replaced = replaced_requests(c.coord.log);
    if (replaced == 0)
        print_error("the coordinator placed no request again after the kill\n");
    assert_true(replaced > 0);
    stop_all(&c);
    cl_assert_no_leftovers();
}

/* The coordinator killed (SIGKILL) mid-epoch and restarted at the same endpoint at once,
 * 20 times, each at another point of the epoch: the DataServers register again (their
 * heartbeat is answered "unknown"), the clients see the new incarnation in the answer to
 * their HELLO (or "unknown client" to a REQUEST), register again and send the requests of
 * every batch not received: every epoch completes, exactly once and in order. */
static void cluster_coordinator_kill9_restarted(void **state)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    const int runs = 5; /* every process instrumented: the same checks, fewer times */
#else
    const int runs = 20;
#endif
    for (int run = 0; run < runs; run++) {
        cluster_t c = {0};
        for (int r = 0; r < RANKS; r++) { /* the last run's ledgers would end the wait below */
            char name[32];
            snprintf(name, sizeof name, "rank-%d.jsonl", r);
            unlink(dh_test_path(name));
        }
        start_servers(&c, true, "deadline", 2);
        start_ranks(&c, NULL, "3");
        cl_wait_lines(c.ledgers[run % RANKS], 2 + (run * 7) % (STEPS / 2), T_MS);
        /* mid-epoch: that rank had not finished when the coordinator died */
        assert_true(cl_count(c.ledgers[run % RANKS], "\n") < STEPS);
        cl_signal(&c.coord, SIGKILL);
        assert_int_equal(cl_wait_exit(&c.coord, 5000), 128 + SIGKILL);
        char *cargv[] = {"datahelix",      "coordinator",     "--listen", c.coord_ep, "--policy",
                         (char *)c.policy, "--dead-after-ms", "400",      NULL};
        cl_spawn(&c.coord, "coordinator-again", cargv);
        cl_wait_log(c.coord.log, "coordinator: listening on", 1, 10000);
        finish_ranks(&c);
        ledger_summary_t s = check_ledgers(&c);
        assert_int_equal(s.errors, 0);
        /* the clients saw the restart and sent what was outstanding again */
        int saw = 0;
        for (int r = 0; r < RANKS; r++)
            saw += cl_count(c.ranks[r].log, "restarted: sent the requests of");
        if (saw == 0)
            print_error("run %d: no client saw the coordinator restart\n", run);
        assert_true(saw > 0);
        for (int i = 0; i < 4; i++) { /* all four came back to the new one */
            char needle[128];
            snprintf(needle, sizeof needle, "DataServer '%s' registered", server_names[i]);
            cl_wait_log(c.coord.log, needle, 1, 10000);
        }
        stop_all(&c);
        cl_assert_no_leftovers();
    }
}

/* A node's local DataServer killed for good: its ranks fail within their
 * --coordinator-timeout-ms, naming the cause, instead of waiting for batches that will not
 * come; the other node's ranks finish their epoch. */
static void cluster_local_server_gone_fails_its_ranks(void **state)
{
    cluster_t c = {0};
    start_servers(&c, true, "deadline", 2);
    const char *extra[] = {"--coordinator-timeout-ms", "1500", NULL};
    start_ranks_with(&c, extra, "20");
    for (int r = 2; r < RANKS; r++) /* both of node-b's ranks running before it goes */
        cl_wait_lines(c.ledgers[r], 3, T_MS);
    cl_signal(&c.servers[1], SIGKILL); /* local-b: node-b's, ranks 2 and 3 */
    assert_int_equal(cl_wait_exit(&c.servers[1], 5000), 128 + SIGKILL);
    for (int r = 2; r < RANKS; r++) {
        cl_expect_exit(&c.ranks[r], 1, 30000);
        cl_wait_log(c.ranks[r].log, "has had no live local DataServer for 1500 ms", 1, 1000);
    }
    for (int r = 0; r < 2; r++)
        cl_expect_exit(&c.ranks[r], 0, T_MS);
    c.servers[1].reaped = true;
    stop_all(&c);
    cl_assert_no_leftovers();
}

static void cluster_kill9_local_server_restarted(void **state)
{
    cluster_t c = {0};
    start_servers(&c, true, "deadline", 2);
    start_ranks(&c, NULL, "2");
    cl_wait_lines(c.ledgers[2], STEPS / 4, T_MS);
    cl_signal(&c.servers[1], SIGKILL); /* node-b's local DataServer: ranks 2 and 3 lose it */
    assert_int_equal(cl_wait_exit(&c.servers[1], 5000), 128 + SIGKILL);
    cl_wait_log(c.coord.log, "'local-b' (pid", 1, 5000);
    /* a new local DataServer for node-b: the coordinator points the ranks at it and places
     * every undelivered request again */
    char *argv[] = {
        "datahelix", "server",   "--coordinator", c.coord_ep, "--role",         "local",
        "--node",    "node-b",   "--workers",     "2",        "--pipeline",     c.pipeline,
        "--name",    "local-b2", "--arena-mb",    "64",       "--heartbeat-ms", "50",
        NULL};
    cl_spawn(&c.servers[1], "local-b2", argv);
    finish_ranks(&c);
    ledger_summary_t s = check_ledgers(&c);
    assert_int_equal(s.errors, 0);
    assert_true(cl_count(c.ranks[2].log, "local DataServer is now 'local-b2'") == 1);
    stop_all(&c);
    cl_assert_no_leftovers();
}

static void cluster_sigstop_then_sigcont(void **state)
{
    cluster_t c = {0};
    start_servers(&c, false, "least-request", 1);
    start_ranks(&c, NULL, "2");
    cl_wait_lines(c.ledgers[0], STEPS / 4, T_MS);
    cl_signal(&c.servers[3], SIGSTOP);
    cl_wait_log(c.coord.log, "'remote-2' (pid", 1, 10000); /* declared dead */
    cl_signal(&c.servers[3], SIGCONT);
    cl_wait_log(c.coord.log, "DataServer 'remote-2' is back", 1, 10000);
    finish_ranks(&c);
    ledger_summary_t s = check_ledgers(&c);
    assert_int_equal(s.errors, 0);
    stop_all(&c);
    cl_assert_no_leftovers();
}

static void cluster_client_killed_slabs_reclaimed(void **state)
{
    cluster_t c = {0};
    start_servers(&c, false, "local", 1);
    /* rank 0 computes slowly, so batches wait in its prefetch ring (slabs held) */
    start_ranks(&c, NULL, "40");
    cl_wait_lines(c.ledgers[0], 2, T_MS);
    cl_signal(&c.ranks[0], SIGKILL);
    assert_int_equal(cl_wait_exit(&c.ranks[0], 5000), 128 + SIGKILL);
    cl_wait_log(c.servers[0].log, "held by dead clients", 1, 10000);
    /* each rank past its start (its SIGTERM handler set, a batch consumed): a rank still
     * starting on a loaded machine would die of the signal instead of stopping */
    for (int r = 1; r < RANKS; r++)
        cl_wait_lines(c.ledgers[r], 1, T_MS);
    for (int r = 1; r < RANKS; r++)
        cl_signal(&c.ranks[r], SIGTERM);
    for (int r = 1; r < RANKS; r++)
        cl_expect_exit(&c.ranks[r], 3, 10000); /* interrupted */
    stop_all(&c);
    cl_assert_no_leftovers();
}

static void cluster_failing_samples_skip_and_raise(void **state)
{
    cluster_t c = {0};
    start_servers(&c, false, "deadline", 2);
    /* two samples of the file fail: their uri says so (the synthetic pipeline's error path) */
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, c.profiles), 0);
    dh_profile_set_t *bad = NULL;
    assert_int_equal(dh_profile_set_new(&bad), 0);
    for (size_t i = 0; i < dh_profile_set_count(set); i++) {
        dh_profile_row_t row = *dh_profile_set_row(set, i);
        if (i == 3 || i == 77)
            row.uri = i == 3 ? "error:clips/broken-3.mp4" : "error:clips/broken-77.mp4";
        assert_int_equal(dh_profile_set_add(bad, &row), 0);
    }
    assert_int_equal(dh_profile_set_write(bad, c.profiles), 0);
    dh_profile_set_destroy(&set);
    dh_profile_set_destroy(&bad);
    start_ranks(&c, "--on-error=skip", "0");
    finish_ranks(&c);
    ledger_summary_t s = check_ledgers(&c);
    assert_int_equal(s.errors, 2);
    int named = 0;
    for (int r = 0; r < RANKS; r++)
        named += cl_count(c.ledgers[r], "clips/broken-");
    assert_int_equal(named, 2);
    /* raise: the two batches become errors naming the sample, the others come */
    start_ranks(&c, "--on-error=raise", "0");
    finish_ranks(&c);
    int raised = 0, lines = 0;
    for (int r = 0; r < RANKS; r++) {
        raised += cl_count(c.ledgers[r], "\"error\":\"sample '");
        lines += cl_lines(c.ledgers[r]);
    }
    assert_int_equal(raised, 2);
    assert_int_equal(lines, STEPS * RANKS);
    stop_all(&c);
    cl_assert_no_leftovers();
}

/* Tier 2 moved samples between ranks: checks every rank's ledger in order (line i is batch
 * i, BATCH samples), and that each step's samples, over all ranks, are exactly the planned
 * ones, each once. Returns the samples yielded by another rank than planned. */
static int check_ledgers_rebalanced(cluster_t *c)
{
    plan_ref_t ref;
    plan_ref_make(&ref, c->profiles);
    int moved = 0;
    char *got[STEPS][RANKS * BATCH];
    int got_rank[STEPS][RANKS * BATCH];
    memset(got, 0, sizeof got);
    for (int r = 0; r < RANKS; r++) {
        FILE *f = fopen(c->ledgers[r], "r");
        assert_non_null(f);
        char line[65536];
        int index = 0;
        while (fgets(line, sizeof line, f)) {
            json_error_t err;
            json_t *o = json_loads(line, 0, &err);
            assert_non_null(o);
            assert_null(json_object_get(o, "error"));
            assert_int_equal((int)json_integer_value(json_object_get(o, "index")), index);
            assert_true(index < STEPS);
            json_t *ids = json_object_get(o, "ids");
            assert_int_equal(json_array_size(ids), BATCH);
            for (int k = 0; k < BATCH; k++) {
                got[index][r * BATCH + k] =
                    strdup(json_string_value(json_array_get(ids, (size_t)k)));
                got_rank[index][r * BATCH + k] = r;
            }
            json_decref(o);
            index++;
        }
        fclose(f);
        assert_int_equal(index, STEPS);
    }
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < RANKS * BATCH; i++) {
            int found = -1, times = 0;
            for (int k = 0; k < RANKS * BATCH; k++)
                if (strcmp(got[s][k], ref.ids[s][i]) == 0) {
                    found = k;
                    times++;
                }
            if (times != 1)
                print_error("step %d: planned sample '%s' yielded %d times\n", s, ref.ids[s][i],
                            times);
            assert_int_equal(times, 1);
            moved += got_rank[s][found] != i / BATCH;
        }
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < RANKS * BATCH; i++)
            free(got[s][i]);
    plan_ref_free(&ref);
    return moved;
}

/* Tier 2 over the four ranks of two nodes (ranks 0-1 share node-a's arena: moves there are
 * handoffs of slab ownership between processes; moves to node-b go DataServer to
 * DataServer), one sample per part, while a sidecar is killed with SIGKILL mid-epoch: every
 * step's samples are yielded exactly once, in order, and samples did move. */
static void cluster_rebalance_exactly_once_under_kill9(void **state)
{
    cluster_t c = {0};
    c.noisy = true;
    start_servers(&c, true, "deadline", 1);
    const char *extra[] = {"--rebalance",         "--fanout", "2", "--rebalance-buffer", "16",
                           "--rebalance-late-ms", "30000",    NULL};
    start_ranks_with(&c, extra, "2");
    cl_wait_lines(c.ledgers[0], STEPS / 4, T_MS);
    cl_signal(&c.servers[2], SIGKILL);
    assert_true(cl_count(c.ledgers[0], "\n") < STEPS);
    assert_int_equal(cl_wait_exit(&c.servers[2], 5000), 128 + SIGKILL);
    finish_ranks(&c);
    int moved = check_ledgers_rebalanced(&c);
    if (moved == 0)
        print_error("tier 2 moved no sample\n");
    assert_true(moved > 0);
    /* both ways of moving were used */
    unsigned long long local = 0, remote = 0;
    for (int r = 0; r < RANKS; r++) {
        local += log_number(c.ranks[r].log, "\"rebalance_moved_samples\":");
        remote += log_number(c.ranks[r].log, "\"rebalance_bytes_remote\":");
    }
    assert_int_equal(local, (unsigned long long)moved);
    assert_true(remote > 0);
    stop_all(&c);
    cl_assert_no_leftovers();
}

/* `consume`'s tier-2 flags: in --help; a bad --rebalance-min-gain and a tuning flag
 * without --rebalance are usage errors naming the flag; with --rebalance (embedded mode,
 * one rank: a group of one, which does not rebalance) the epoch's steps come and the
 * summary carries the tier-2 counts. */
static void cluster_consume_rebalance_flags(void **state)
{
    cl_proc_t p;
    char *help[] = {"datahelix", "consume", "--help", NULL};
    cl_spawn(&p, "consume-help", help);
    cl_expect_exit(&p, 0, 10000);
    assert_int_equal(cl_count(p.log, "--rebalance-min-gain"), 1);
    char *gain[] = {"datahelix", "consume", "--profiles",  "none.jsonl",
                    "--rank",    "0",       "--ranks",     "1",
                    "--batch",   "1",       "--rebalance", "--rebalance-min-gain",
                    "2",         NULL};
    cl_spawn(&p, "consume-gain", gain);
    cl_expect_exit(&p, 2, 10000);
    assert_true(cl_count(p.log, "--rebalance-min-gain") >= 1);
    char *alone[] = {
        "datahelix", "consume", "--profiles", "none.jsonl",         "--rank", "0", "--ranks",
        "1",         "--batch", "1",          "--rebalance-buffer", "8",      NULL};
    cl_spawn(&p, "consume-alone", alone);
    cl_expect_exit(&p, 2, 10000);
    assert_int_equal(cl_count(p.log, "go with --rebalance"), 1);

    char profiles[512], pipeline[512];
    snprintf(profiles, sizeof profiles, "%s", dh_test_path("profiles.jsonl"));
    snprintf(pipeline, sizeof pipeline, "%s", dh_test_path("synthetic.json"));
    make_profiles(profiles, 16);
    dh_test_write_file(pipeline, "{\"type\": \"synthetic\", \"cost\": \"sleep\", "
                                 "\"cpu_scale\": 0.001, \"bytes_scale\": 0.001}");
    char *run[] = {"datahelix",   "consume",
                   "--profiles",  profiles,
                   "--pipeline",  pipeline,
                   "--rank",      "0",
                   "--ranks",     "1",
                   "--batch",     "2",
                   "--steps",     "3",
                   "--rebalance", "--rebalance-buffer",
                   "8",           "--rebalance-min-gain",
                   "0.1",         NULL};
    cl_spawn(&p, "consume-rebalance", run);
    cl_expect_exit(&p, 0, 60000);
    assert_int_equal(cl_count(p.log, "\"batches\":3,"), 1);
    assert_int_equal(cl_count(p.log, "\"rebalance\":true,\"rebalance_rounds\":"), 1);
    cl_assert_no_leftovers();
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(cluster_full_epoch_ipc, cl_teardown),
        cmocka_unit_test_teardown(cluster_plan_window_epoch_exactly_once, cl_teardown),
        cmocka_unit_test_teardown(cluster_kill9_sidecar_mid_epoch, cl_teardown),
        cmocka_unit_test_teardown(cluster_rebalance_exactly_once_under_kill9, cl_teardown),
        cmocka_unit_test_teardown(cluster_kill9_local_server_restarted, cl_teardown),
        cmocka_unit_test_teardown(cluster_coordinator_kill9_restarted, cl_teardown),
        cmocka_unit_test_teardown(cluster_local_server_gone_fails_its_ranks, cl_teardown),
        cmocka_unit_test_teardown(cluster_sigstop_then_sigcont, cl_teardown),
        cmocka_unit_test_teardown(cluster_client_killed_slabs_reclaimed, cl_teardown),
        cmocka_unit_test_teardown(cluster_failing_samples_skip_and_raise, cl_teardown),
        cmocka_unit_test_teardown(cluster_consume_rebalance_flags, cl_teardown),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
