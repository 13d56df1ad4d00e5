/* cmd_daemons.c: `datahelix coordinator` and `datahelix server`, the two daemons of the data
 * plane (docs/runtime.md). Thin: parse, make the object, run its loop on the main thread until
 * SIGINT or SIGTERM, destroy. Each logs one line per lifecycle event on standard error. */
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/place.h"
#include "datahelix/runtime.h"
#include "cli.h"

static dh_coordinator_t *running_coordinator;
static dh_dataserver_t *running_server;

static void on_signal(int sig)
{
    (void)sig;
    if (running_coordinator)
        dh_coordinator_stop(running_coordinator);
    if (running_server)
        dh_dataserver_stop(running_server);
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void coordinator_usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix coordinator --listen ENDPOINT [--policy P] [--dead-after-ms N]\n"
            "                             [--queue-cap N] [--telemetry FILE]\n"
            "                             [--keys DIR [--key NAME]]\n"
            "                             [--metrics-listen HOST:PORT [--metrics-port-file F]]\n"
            "\n"
            "Runs the coordinator of a job: the registry of DataServers and clients, their\n"
            "liveness, and the scheduler that places every request (docs/runtime.md).\n"
            "It never touches tensors. Stops cleanly on SIGINT or SIGTERM.\n"
            "\n"
            "options:\n"
            "  -l, --listen ENDPOINT   ZeroMQ endpoint to bind: tcp://HOST:PORT (PORT * picks a\n"
            "                          free one, printed in the first log line), ipc:///PATH\n"
            "                          (required)\n"
            "  -p, --policy P          local | least-request | deadline (default deadline)\n"
            "  -d, --dead-after-ms N   a DataServer silent this long is declared dead and its\n"
            "                          undelivered requests are placed again (default 1000)\n"
            "  -q, --queue-cap N       requests per worker slot before a server is full\n"
            "                          (backpressure; default 4, 0 = no cap)\n"
            "  -t, --telemetry FILE    write every placement decision as a JSON line: chosen\n"
            "                          server, reason, every candidate's predicted time\n"
            "  -K, --keys DIR          CURVE key directory (default $DATAHELIX_KEYS): a tcp://\n"
            "                          endpoint admits only the keys DIR/*.pub lists and\n"
            "                          encrypts; needs DIR/server.secret (docs/security.md)\n"
            "      --key NAME          this process's key, DIR/NAME.secret (default\n"
            "                          $DATAHELIX_KEY, else server)\n"
            "      --metrics-listen HOST:PORT  serve Prometheus metrics at\n"
            "                          http://HOST:PORT/metrics (decisions by rule, predicted\n"
            "                          misses, each server's queue, heartbeat gaps, dead\n"
            "                          servers, cost prediction error, rebalance rounds:\n"
            "                          docs/operations.md \"Metrics\"); PORT 0 picks a free one,\n"
            "                          named in the log; 0.0.0.0 for every interface. Off\n"
            "                          by default\n"
            "      --metrics-port-file F  write the metrics port bound to F once it serves\n"
            "  -h, --help              show this help\n"
            "\n"
            "Exit status: 0 after a clean stop, 1 failure, 2 usage error.\n");
}

int dh_cmd_coordinator(int argc, char **argv)
{
    static const struct option options[] = {{"listen", required_argument, NULL, 'l'},
                                            {"policy", required_argument, NULL, 'p'},
                                            {"dead-after-ms", required_argument, NULL, 'd'},
                                            {"queue-cap", required_argument, NULL, 'q'},
                                            {"telemetry", required_argument, NULL, 't'},
                                            {"keys", required_argument, NULL, 'K'},
                                            {"key", required_argument, NULL, 'k'},
                                            {"metrics-listen", required_argument, NULL, 0x100},
                                            {"metrics-port-file", required_argument, NULL, 0x101},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    dh_coordinator_config_t cfg;
    dh_coordinator_config_default(&cfg);
    dh_cli_keys_from_env(&cfg.keys_dir, &cfg.key_name);
    const char *port_file = NULL;
    unsigned long long v;
    int opt;
    while ((opt = getopt_long(argc, argv, "l:p:d:q:t:K:h", options, NULL)) != -1) {
        switch (opt) {
        case 'l':
            cfg.listen = optarg;
            break;
        case 'p':
            if (dh_policy_from_name(optarg, &cfg.place.policy) != 0) {
                fprintf(stderr,
                        "datahelix coordinator: --policy: unknown policy '%s' (local, "
                        "least-request, deadline)\n",
                        optarg);
                return 2;
            }
            break;
        case 'd':
            if (dh_cli_parse_u64("coordinator", "--dead-after-ms", optarg, 10, 3600000, &v))
                return 2;
            cfg.dead_after_ms = (uint32_t)v;
            break;
        case 'q':
            if (dh_cli_parse_u64("coordinator", "--queue-cap", optarg, 0, 1000000, &v))
                return 2;
            cfg.queue_cap = (uint32_t)v;
            break;
        case 't':
            cfg.telemetry_path = optarg;
            break;
        case 'K':
            cfg.keys_dir = optarg;
            break;
        case 'k':
            cfg.key_name = optarg;
            break;
        case 0x100: /* --metrics-listen: long options only, no letter */
            cfg.metrics_listen = optarg;
            break;
        case 0x101: /* --metrics-port-file */
            port_file = optarg;
            break;
        case 'h':
            coordinator_usage(stdout);
            return 0;
        default:
            coordinator_usage(stderr);
            return 2;
        }
    }
    if (dh_cli_no_extra_args("coordinator", argc, argv, optind))
        return 2;
    if (!cfg.listen) {
        fprintf(stderr, "datahelix coordinator: --listen ENDPOINT is required\n");
        return 2;
    }
    if (port_file && !cfg.metrics_listen) {
        fprintf(stderr, "datahelix coordinator: --metrics-port-file needs --metrics-listen\n");
        return 2;
    }
    dh_coordinator_t *c = NULL;
    int rc = dh_coordinator_new(&c, &cfg);
    if (rc)
        return dh_cli_fail("coordinator", rc, "cannot start");
    if (port_file &&
        dh_cli_write_port_file("coordinator", port_file, dh_coordinator_metrics_port(c))) {
        dh_coordinator_destroy(&c);
        return 1;
    }
    running_coordinator = c;
    install_signals();
    rc = dh_coordinator_run(c);
    running_coordinator = NULL;
    dh_coordinator_destroy(&c);
    dh_log_info("coordinator: stopped");
    return rc ? 1 : 0;
}

static void server_usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix server --coordinator ENDPOINT --role local|remote --node NAME\n"
            "                        --workers N [--pipeline SPEC.json | --dataset M:F\n"
            "                        [--sample-timeout SECONDS]]\n"
            "                        [--arena-mb M]\n"
            "                        [--arena-budget BYTES] [--shm-allow-uid UID[,UID]]\n"
            "                        [--name NAME]\n"
            "                        [--data-listen ENDPOINT] [--advertise HOST|ENDPOINT]\n"
            "                        [--heartbeat-ms N] [--keys DIR [--key NAME]]\n"
            "                        [--heartbeat-ms N]\n"
            "                        [--metrics-listen HOST:PORT [--metrics-port-file F]]\n"
            "\n"
            "Runs a DataServer: a pool of workers that run the pipeline on the requests the\n"
            "coordinator dispatches to it (docs/runtime.md).\n"
            "  local   one per training node: delivers batches to the ranks of its node through\n"
            "          a shared-memory arena (memfd), and receives what sidecars forward\n"
            "  remote  a sidecar on spare CPU: forwards its batches' tensors to the consuming\n"
            "          rank's local DataServer\n"
            "Stops cleanly on SIGINT or SIGTERM.\n"
            "\n"
            "options:\n"
            "  -c, --coordinator ENDPOINT  the coordinator's endpoint (required)\n"
            "  -r, --role local|remote     (required)\n"
            "  -n, --node NAME             the node this server runs on (required)\n"
            "  -w, --workers N             worker threads, 1..1024 (required); a local server\n"
            "                              may have 0: it only delivers what sidecars send\n"
            "  -p, --pipeline SPEC.json    pipeline spec: {\"type\":\"video\", ...} (fields of\n"
            "                              docs/pipeline.md; the default) or {\"type\":\n"
            "                              \"synthetic\", \"cost\": \"sleep\"|\"spin\"|\"none\",\n"
            "                              \"cpu_scale\": X, \"bytes_scale\": Y}\n"
            "  -d, --dataset MODULE:FACTORY  run a Python map-style dataset instead: each\n"
            "                              worker is a process (python -m datahelix._worker;\n"
            "                              $DH_PYTHON_EXE, else python3) that imports MODULE\n"
            "                              (from $PYTHONPATH or the current directory) and\n"
            "                              calls FACTORY() for the dataset; what a remote\n"
            "                              sidecar runs for loaders with dataset=\n"
            "                              (docs/datasets.md, \"Your own Dataset\")\n"
            "      --sample-timeout SECONDS  with --dataset: how long one call of the\n"
            "                              dataset's code (__getitem__, load_into, collate,\n"
            "                              its loading in a new process) may run; past it the\n"
            "                              worker process is killed and replaced and the\n"
            "                              sample fails, named (default 300; 0: no limit; a\n"
            "                              --pipeline spec sets \"sample_timeout\", for a\n"
            "                              video pipeline too: docs/runtime.md, Deadlines)\n"
            "  -a, --arena-mb M            local: shared-memory arena size (default: the\n"
            "                              budget below; the memfd is sparse, so it costs\n"
            "                              memory only as far as batches fill it, and each\n"
            "                              rank's prefetch keeps to its share of it)\n"
            "  -B, --arena-budget BYTES    local: memory the default arena may take, e.g.\n"
            "                              8G, 512M (default: $DH_ARENA_BUDGET, else a quarter\n"
            "                              of physical memory or of the memory cgroup's\n"
            "                              limit, the lower). An arena this process cannot\n"
            "                              hold (RLIMIT_FSIZE, RLIMIT_AS, the cgroup's limit,\n"
            "                              MemAvailable) fails at start, naming the limit\n"
            "  -U, --shm-allow-uid UID[,UID]  local: uids besides this server's own whose\n"
            "                              processes may map the arena (default:\n"
            "                              $DH_SHM_ALLOW_UIDS, else none; others are refused\n"
            "                              and logged with their pid and uid)\n"
            "  -N, --name NAME             server name (default NODE-ROLE-PID)\n"
            "  -D, --data-listen ENDPOINT  local: endpoint for clients and sidecars (default\n"
            "      --listen ENDPOINT       tcp://127.0.0.1:*; tcp://0.0.0.0:PORT (PORT may be\n"
            "                              *) binds every interface, for sidecars on other\n"
            "                              machines)\n"
            "  -A, --advertise HOST|ENDPOINT  local: the data endpoint the coordinator hands\n"
            "                              to clients and sidecars (a HOST keeps the bound\n"
            "                              port); default: the bound one, a wildcard host\n"
            "                              replaced by this machine's address on the route\n"
            "                              to the coordinator (docs/multinode.md)\n"
            "  -b, --heartbeat-ms N        heartbeat period (default 100)\n"
            "  -K, --keys DIR              CURVE key directory (default $DATAHELIX_KEYS): every\n"
            "                              tcp:// connection authenticated and encrypted; the\n"
            "                              data endpoint admits only the keys DIR/*.pub lists\n"
            "                              (a local server needs DIR/server.secret;\n"
            "                              docs/security.md)\n"
            "      --key NAME              this process's key, DIR/NAME.secret (default\n"
            "                              $DATAHELIX_KEY, else server)\n"
            "      --metrics-listen HOST:PORT  serve Prometheus metrics at\n"
            "                              http://HOST:PORT/metrics (queue depth and work,\n"
            "                              bytes forwarded, arena bytes and slabs in use,\n"
            "                              spills, worker busy fraction, cost prediction\n"
            "                              error: docs/operations.md \"Metrics\"); PORT 0 picks\n"
            "                              a free one, named in the log. Off by default\n"
            "      --metrics-port-file F   write the metrics port bound to F once it serves\n"
            "      --cache-dir DIR         the local cache of remote byte ranges (made if\n"
            "                              missing; DataServers of one host may share it;\n"
            "                              docs/remote.md \"The local cache\"). Needs\n"
            "                              --cache-bytes\n"
            "      --cache-bytes N         the bound on the cache's files, bytes or with a K,\n"
            "                              M or G suffix (KiB, MiB, GiB); at least 2M\n"
            "%s"
            "  -h, --help                  show this help\n"
            "\n"
            "Exit status: 0 after a clean stop, 1 failure, 2 usage error.\n",
            DH_CLI_S3_USAGE);
}

int dh_cmd_server(int argc, char **argv)
{
    static const struct option options[] = {{"coordinator", required_argument, NULL, 'c'},
                                            {"role", required_argument, NULL, 'r'},
                                            {"node", required_argument, NULL, 'n'},
                                            {"workers", required_argument, NULL, 'w'},
                                            {"pipeline", required_argument, NULL, 'p'},
                                            {"dataset", required_argument, NULL, 'd'},
                                            {"arena-mb", required_argument, NULL, 'a'},
                                            {"arena-budget", required_argument, NULL, 'B'},
                                            {"shm-allow-uid", required_argument, NULL, 'U'},
                                            {"name", required_argument, NULL, 'N'},
                                            {"data-listen", required_argument, NULL, 'D'},
                                            {"listen", required_argument, NULL, 'D'},
                                            {"advertise", required_argument, NULL, 'A'},
                                            {"heartbeat-ms", required_argument, NULL, 'b'},
                                            {"keys", required_argument, NULL, 'K'},
                                            {"key", required_argument, NULL, 'k'},
                                            {"metrics-listen", required_argument, NULL, 0x100},
                                            {"metrics-port-file", required_argument, NULL, 0x101},
                                            {"sample-timeout", required_argument, NULL, 0x102},
                                            {"cache-dir", required_argument, NULL, 0x103},
                                            {"cache-bytes", required_argument, NULL, 0x104},
                                            DH_CLI_S3_LONGOPTS,
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    dh_dataserver_config_t cfg;
    dh_dataserver_config_default(&cfg);
    cfg.workers = 0;
    dh_cli_keys_from_env(&cfg.keys_dir, &cfg.key_name);
    int have_role = 0, have_workers = 0;
    const char *dataset = NULL, *port_file = NULL;
    double sample_timeout_s = 300;
    bool have_sample_timeout = false;
    unsigned long long v;
    int opt;
    dh_cli_s3_t s3 = {0};
    while ((opt = getopt_long(argc, argv, "c:r:n:w:p:d:a:B:U:N:D:A:b:K:h", options, NULL)) != -1) {
        if (dh_cli_s3_option(&s3, opt, optarg))
            continue;
        switch (opt) {
        case 'c':
            cfg.coordinator = optarg;
            break;
        case 'r':
            if (strcmp(optarg, "local") == 0)
                cfg.role = DH_DS_LOCAL;
            else if (strcmp(optarg, "remote") == 0)
                cfg.role = DH_DS_REMOTE;
            else {
                fprintf(stderr, "datahelix server: --role must be local or remote, got '%s'\n",
                        optarg);
                return 2;
            }
            have_role = 1;
            break;
        case 'n':
            cfg.node = optarg;
            break;
        case 'w':
            if (dh_cli_parse_u64("server", "--workers", optarg, 0, 1024, &v))
                return 2;
            cfg.workers = (uint32_t)v;
            have_workers = 1;
            break;
        case 'p':
            cfg.pipeline_path = optarg;
            break;
        case 'd':
            if (!strchr(optarg, ':') || optarg[0] == ':' || strchr(optarg, ':')[1] == '\0' ||
                strspn(optarg,
                       "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:") !=
                    strlen(optarg) ||
                strlen(optarg) > 1000) {
                fprintf(stderr, "datahelix server: --dataset must be MODULE:FACTORY, got '%s'\n",
                        optarg);
                return 2;
            }
            dataset = optarg;
            break;
        case 'a':
            if (dh_cli_parse_u64("server", "--arena-mb", optarg, 2, 1 << 20, &v))
                return 2;
            cfg.arena_bytes = (uint64_t)v << 20;
            break;
        case 'B':
            if (dh_arena_parse_bytes(optarg, "datahelix server: --arena-budget",
                                     &cfg.arena_budget_bytes)) {
                fprintf(stderr, "%s\n", dh_last_error());
                return 2;
            }
            break;
        case 'U':
            cfg.shm_allow_uids = optarg;
            break;
        case 'N':
            cfg.name = optarg;
            break;
        case 'D':
            cfg.data_listen = optarg;
            break;
        case 'A':
            cfg.data_advertise = optarg;
            break;
        case 'b':
            if (dh_cli_parse_u64("server", "--heartbeat-ms", optarg, 5, 60000, &v))
                return 2;
            cfg.heartbeat_ms = (uint32_t)v;
            break;
        case 'K':
            cfg.keys_dir = optarg;
            break;
        case 'k':
            cfg.key_name = optarg;
            break;
        case 0x100: /* --metrics-listen: long options only, no letter */
            cfg.metrics_listen = optarg;
            break;
        case 0x101: /* --metrics-port-file */
            port_file = optarg;
            break;
        case 0x102: { /* --sample-timeout */
            char *end = NULL;
            sample_timeout_s = strtod(optarg, &end);
            if (!end || end == optarg || *end || !(sample_timeout_s >= 0) ||
                sample_timeout_s > 1e7) {
                fprintf(stderr,
                        "datahelix server: --sample-timeout must be seconds in [0, 1e7] (0: no "
                        "limit), got '%s'\n",
                        optarg);
                return 2;
            }
            have_sample_timeout = true;
            break;
        }
        case 0x103: /* --cache-dir */
            cfg.cache_dir = optarg;
            break;
        case 0x104: /* --cache-bytes */
            if (dh_arena_parse_bytes(optarg, "datahelix server: --cache-bytes", &cfg.cache_bytes)) {
                fprintf(stderr, "%s\n", dh_last_error());
                return 2;
            }
            break;
        case 'h':
            server_usage(stdout);
            return 0;
        default:
            server_usage(stderr);
            return 2;
        }
    }
    if (dh_cli_no_extra_args("server", argc, argv, optind))
        return 2;
    const char *missing = !cfg.coordinator ? "--coordinator"
                          : !have_role     ? "--role"
                          : !cfg.node      ? "--node"
                          : !have_workers  ? "--workers"
                                           : NULL;
    if (missing) {
        fprintf(stderr, "datahelix server: %s is required (see --help)\n", missing);
        return 2;
    }
    if (!cfg.cache_dir != !cfg.cache_bytes) {
        fprintf(stderr, "datahelix server: %s\n",
                cfg.cache_dir ? "--cache-dir needs --cache-bytes (the bound on its size)"
                              : "--cache-bytes goes with --cache-dir");
        return 2;
    }
    if (dataset && cfg.pipeline_path) {
        fprintf(stderr, "datahelix server: give --pipeline or --dataset, not both\n");
        return 2;
    }
    if (have_sample_timeout && !dataset) {
        fprintf(stderr, "datahelix server: --sample-timeout goes with --dataset (a --pipeline "
                        "spec sets \"sample_timeout\")\n");
        return 2;
    }
    if (port_file && !cfg.metrics_listen) {
        fprintf(stderr, "datahelix server: --metrics-port-file needs --metrics-listen\n");
        return 2;
    }
    if (dh_cli_s3_apply("server", &s3) < 0)
        return 1;
    char spec[5200];
    if (dataset) { /* the python pipeline, the current directory importable */
        char cwd[4096];
        if (!getcwd(cwd, sizeof cwd) || strpbrk(cwd, "\"\\:"))
            snprintf(cwd, sizeof cwd, "/");
        snprintf(spec, sizeof spec,
                 "{\"type\":\"python\",\"dataset\":\"%s\",\"path\":[\"%s\"],"
                 "\"sample_timeout\":%.17g}",
                 dataset, cwd, sample_timeout_s);
        cfg.pipeline_json = spec;
    }
    dh_dataserver_t *s = NULL;
    int rc = dh_dataserver_new(&s, &cfg);
    if (rc)
        return dh_cli_fail("server", rc, "cannot start");
    if (port_file && dh_cli_write_port_file("server", port_file, dh_dataserver_metrics_port(s))) {
        dh_dataserver_destroy(&s);
        return 1;
    }
    running_server = s;
    install_signals();
    rc = dh_dataserver_run(s);
    running_server = NULL;
    dh_dataserver_destroy(&s);
    dh_log_info("server: stopped");
    return rc ? 1 : 0;
}
