/* cmd_consume.c: `datahelix consume`, one training rank's loop without a model: takes every
 * batch of its share of the epoch from a client (client.h), optionally "computes" for a fixed
 * time per batch, checks what it got, and writes a ledger (one JSON line per batch) that the
 * integration tests compare against the plan. Thin: parse, dh_client_new, loop on
 * dh_client_next, print a JSON summary. */
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/wire.h"
#include "cli.h"

#define CMD "consume"

static atomic_int interrupted;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&interrupted, 1);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix consume --profiles FILE --rank R --ranks N --batch B\n"
            "                         [--coordinator ENDPOINT] [options]\n"
            "\n"
            "Runs one rank's data loop: a client plans every global step over the profile\n"
            "file (tier 1, seeded epoch-aware order), requests its share ahead of use and\n"
            "yields the batches in order. With no --coordinator it runs in embedded mode (a\n"
            "coordinator and a local DataServer as threads of this process).\n"
            "\n"
            "options:\n"
            "  -c, --coordinator ENDPOINT  coordinator endpoint (default: embedded mode)\n"
            "  -P, --profiles FILE         profile JSONL from probe or gen-profiles (required)\n"
            "  -r, --rank R                this rank (required)\n"
            "  -R, --ranks N               ranks in the job (required)\n"
            "  -b, --batch B               samples per rank per step (required)\n"
            "  -f, --fanout F              requests per batch (microbatches; default 1)\n"
            "  -k, --prefetch K            batches requested ahead (default 4)\n"
            "      --prefetch-max M        adaptive prefetch: when next() waits, double the\n"
            "                              batches requested ahead, up to M (default: fixed)\n"
            "  -e, --epochs E              epochs (default 1)\n"
            "  -s, --steps S               stop after S batches (default: the epochs)\n"
            "      --seed S                sample order seed (default 0)\n"
            "      --no-shuffle            file order instead of a seeded shuffle\n"
            "      --on-error raise|skip   a failed sample fails next() (default), or is\n"
            "                              flagged in its batch and counted\n"
            "  -n, --node NAME             this rank's node (default: the host name)\n"
            "  -C, --compute-ms X          sleep X ms after each batch (an emulated step)\n"
            "  -l, --ledger FILE           write one JSON line per batch: rank, index, epoch,\n"
            "                              server, sample ids, errors\n"
            "      --check-payload         verify each synthetic sample's bytes start with its id\n"
            "  -t, --timeout-ms N          give up when a batch is not ready within N ms\n"
            "                              (default 120000)\n"
            "      --coordinator-timeout-ms N  fail when the coordinator has not answered\n"
            "                              for N ms, or this node has had no live local\n"
            "                              DataServer for N ms (default 60000)\n"
            "  -K, --keys DIR              CURVE key directory (default $DATAHELIX_KEYS): tcp://\n"
            "                              connections authenticate with DIR/NAME.secret and\n"
            "                              encrypt (docs/security.md)\n"
            "      --key NAME              this rank's key (default $DATAHELIX_KEY, else\n"
            "                              server)\n"
            "      --pipeline SPEC.json    embedded mode: the DataServer's pipeline spec\n"
            "      --workers N             embedded mode: its workers (default 2)\n"
            "      --plan-window W         tier 1 plans W consecutive steps of an epoch together\n"
            "                              (a sample may come up to W - 1 steps from its\n"
            "                              sampler step; default 1: each step alone)\n"
            "      --rebalance             tier 2: rebalance materialized batches among the\n"
            "                              ranks, with the default policy and cost gate (the\n"
            "                              client's default groups are by node, and consume\n"
            "                              counts all --ranks as one node's: one group)\n"
            "      --rebalance-buffer N    with --rebalance: samples per round across the\n"
            "                              group (default 64)\n"
            "      --rebalance-min-gain G  with --rebalance: the gate's margin, a fraction of\n"
            "                              the largest rank's compute (default 0.05)\n"
            "      --rebalance-late-ms MS  with --rebalance: how long past its deadline this rank\n"
            "                              lets a round be gathered (default 0: a round that is\n"
            "                              not ready when the batch is needed is kept as planned)\n"
            "  -h, --help                  show this help\n"
            "\n"
            "Prints a JSON summary on standard output at the end. Exit status: 0 when every\n"
            "batch came (failed samples allowed with --on-error skip), 1 failure, 2 usage\n"
            "error, 3 interrupted.\n");
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static const dh_tensor_t *tensor_named(const dh_client_batch_t *b, const char *name)
{
    for (size_t i = 0; i < b->n_tensors; i++)
        if (strcmp(b->tensors[i].name, name) == 0)
            return &b->tensors[i];
    return NULL;
}

/* Synthetic payloads: "sizes" (bytes per sample) and "payload" (the samples' bytes back to
 * back), each sample's bytes starting with its id (src/runtime/dataserver_task.c). */
static int check_payload(const dh_client_batch_t *b)
{
    const dh_tensor_t *sizes = tensor_named(b, "sizes");
    const dh_tensor_t *pay = tensor_named(b, "payload");
    if (!sizes || sizes->dtype != DH_DTYPE_INT64 || (size_t)sizes->shape[0] != b->n_samples) {
        fprintf(stderr,
                "datahelix consume: batch %llu (from '%s', %zu tensors, %zu samples) has no "
                "valid 'sizes' tensor\n",
                (unsigned long long)b->index, b->server, b->n_tensors, b->n_samples);
        return -1;
    }
    const int64_t *sz = sizes->data;
    size_t at = 0;
    for (size_t i = 0; i < b->n_samples; i++) {
        size_t len = (size_t)sz[i];
        size_t idlen = strlen(b->samples[i].id);
        size_t n = idlen < len ? idlen : len;
        if (n && (!pay || at + len > pay->nbytes ||
                  memcmp((const char *)pay->data + at, b->samples[i].id, n) != 0)) {
            fprintf(stderr,
                    "datahelix consume: batch %llu sample %zu ('%s'): payload bytes "
                    "do not match the sample\n",
                    (unsigned long long)b->index, i, b->samples[i].id);
            return -1;
        }
        at += len;
    }
    return 0;
}

int dh_cmd_consume(int argc, char **argv)
{
    enum {
        OPT_SEED = 256,
        OPT_NO_SHUFFLE,
        OPT_ON_ERROR,
        OPT_CHECK,
        OPT_PIPELINE,
        OPT_WORKERS,
        OPT_PREFETCH_MAX,
        OPT_REBALANCE,
        OPT_RB_BUFFER,
        OPT_PLAN_WINDOW,
        OPT_RB_GAIN,
        OPT_RB_LATE,
        OPT_COORD_TIMEOUT,
        OPT_KEY
    };
    static const struct option options[] = {
        {"coordinator", required_argument, NULL, 'c'},
        {"profiles", required_argument, NULL, 'P'},
        {"rank", required_argument, NULL, 'r'},
        {"ranks", required_argument, NULL, 'R'},
        {"batch", required_argument, NULL, 'b'},
        {"fanout", required_argument, NULL, 'f'},
        {"prefetch", required_argument, NULL, 'k'},
        {"prefetch-max", required_argument, NULL, OPT_PREFETCH_MAX},
        {"epochs", required_argument, NULL, 'e'},
        {"steps", required_argument, NULL, 's'},
        {"seed", required_argument, NULL, OPT_SEED},
        {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
        {"on-error", required_argument, NULL, OPT_ON_ERROR},
        {"node", required_argument, NULL, 'n'},
        {"compute-ms", required_argument, NULL, 'C'},
        {"ledger", required_argument, NULL, 'l'},
        {"check-payload", no_argument, NULL, OPT_CHECK},
        {"timeout-ms", required_argument, NULL, 't'},
        {"pipeline", required_argument, NULL, OPT_PIPELINE},
        {"workers", required_argument, NULL, OPT_WORKERS},
        {"rebalance", no_argument, NULL, OPT_REBALANCE},
        {"rebalance-buffer", required_argument, NULL, OPT_RB_BUFFER},
        {"plan-window", required_argument, NULL, OPT_PLAN_WINDOW},
        {"rebalance-min-gain", required_argument, NULL, OPT_RB_GAIN},
        {"rebalance-late-ms", required_argument, NULL, OPT_RB_LATE},
        {"coordinator-timeout-ms", required_argument, NULL, OPT_COORD_TIMEOUT},
        {"keys", required_argument, NULL, 'K'},
        {"key", required_argument, NULL, OPT_KEY},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    dh_cli_keys_from_env(&cfg.keys_dir, &cfg.key_name);
    int timeout_ms = 120000;
    int have_rank = 0, have_ranks = 0, have_batch = 0, check = 0, rb_tuned = 0;
    double compute_ms = 0;
    const char *ledger_path = NULL;
    unsigned long long v;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:P:r:R:b:f:k:e:s:n:C:l:t:K:h", options, NULL)) != -1) {
        switch (opt) {
        case 'c':
            cfg.coordinator = optarg;
            break;
        case 'P':
            cfg.profiles = optarg;
            break;
        case 'r':
            if (dh_cli_parse_u64(CMD, "--rank", optarg, 0, 1 << 20, &v))
                return 2;
            cfg.rank = (uint32_t)v;
            have_rank = 1;
            break;
        case 'R':
            if (dh_cli_parse_u64(CMD, "--ranks", optarg, 1, 1 << 20, &v))
                return 2;
            cfg.ranks = (uint32_t)v;
            have_ranks = 1;
            break;
        case 'b':
            if (dh_cli_parse_u64(CMD, "--batch", optarg, 1, 4096, &v))
                return 2;
            cfg.batch = (uint32_t)v;
            have_batch = 1;
            break;
        case 'f':
            if (dh_cli_parse_u64(CMD, "--fanout", optarg, 1, 4096, &v))
                return 2;
            cfg.fanout = (uint32_t)v;
            break;
        case 'k':
            if (dh_cli_parse_u64(CMD, "--prefetch", optarg, 1, 1024, &v))
                return 2;
            cfg.prefetch = (uint32_t)v;
            break;
        case OPT_PREFETCH_MAX:
            if (dh_cli_parse_u64(CMD, "--prefetch-max", optarg, 1, 1024, &v))
                return 2;
            cfg.prefetch_max = (uint32_t)v;
            break;
        case 'e':
            if (dh_cli_parse_u64(CMD, "--epochs", optarg, 1, 1000000, &v))
                return 2;
            cfg.epochs = (uint32_t)v;
            break;
        case 's':
            if (dh_cli_parse_u64(CMD, "--steps", optarg, 1, UINT64_MAX >> 1, &v))
                return 2;
            cfg.max_steps = v;
            break;
        case OPT_SEED:
            if (dh_cli_parse_u64(CMD, "--seed", optarg, 0, UINT64_MAX, &v))
                return 2;
            cfg.seed = v;
            break;
        case OPT_NO_SHUFFLE:
            cfg.shuffle = 0;
            break;
        case OPT_ON_ERROR:
            if (strcmp(optarg, "raise") == 0)
                cfg.on_error = DH_ON_ERROR_RAISE;
            else if (strcmp(optarg, "skip") == 0)
                cfg.on_error = DH_ON_ERROR_SKIP;
            else {
                fprintf(stderr, "datahelix consume: --on-error must be raise or skip, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'n':
            cfg.node = optarg;
            break;
        case 'C': {
            char *end = NULL;
            compute_ms = strtod(optarg, &end);
            if (!end || *end || !(compute_ms >= 0) || compute_ms > 3.6e6) {
                fprintf(stderr,
                        "datahelix consume: --compute-ms expects milliseconds >= 0, got "
                        "'%s'\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'l':
            ledger_path = optarg;
            break;
        case OPT_CHECK:
            check = 1;
            break;
        case 't':
            if (dh_cli_parse_u64(CMD, "--timeout-ms", optarg, 1, 86400000, &v))
                return 2;
            timeout_ms = (int)v;
            break;
        case 'K':
            cfg.keys_dir = optarg;
            break;
        case OPT_KEY:
            cfg.key_name = optarg;
            break;
        case OPT_COORD_TIMEOUT:
            if (dh_cli_parse_u64(CMD, "--coordinator-timeout-ms", optarg, 1, 86400000, &v))
                return 2;
            cfg.coordinator_timeout_ms = (int)v;
            break;
        case OPT_PIPELINE:
            cfg.pipeline_path = optarg;
            break;
        case OPT_WORKERS:
            if (dh_cli_parse_u64(CMD, "--workers", optarg, 1, 1024, &v))
                return 2;
            cfg.workers = (uint32_t)v;
            break;
        case OPT_REBALANCE:
            cfg.rebalance.enabled = 1; /* groups by node (group_of NULL), the defaults */
            break;
        case OPT_PLAN_WINDOW:
            if (dh_cli_parse_u64(CMD, "--plan-window", optarg, 1, 1024, &v))
                return 2;
            cfg.plan_window = (uint32_t)v;
            break;
        case OPT_RB_BUFFER:
            if (dh_cli_parse_u64(CMD, "--rebalance-buffer", optarg, 1, 1000000, &v))
                return 2;
            cfg.rebalance.buffer_size = (uint32_t)v;
            rb_tuned = 1;
            break;
        case OPT_RB_LATE:
            if (dh_cli_parse_u64(CMD, "--rebalance-late-ms", optarg, 0, 3600000, &v))
                return 2;
            cfg.rebalance.late_ms = (int)v;
            rb_tuned = 1;
            break;
        case OPT_RB_GAIN: {
            char *end = NULL;
            double g = strtod(optarg, &end);
            if (!end || end == optarg || *end || !(g >= 0 && g <= 1)) {
                fprintf(stderr,
                        "datahelix consume: --rebalance-min-gain expects a fraction in [0, 1], "
                        "got '%s'\n",
                        optarg);
                return 2;
            }
            cfg.rebalance.min_gain = g;
            rb_tuned = 1;
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (dh_cli_no_extra_args(CMD, argc, argv, optind))
        return 2;
    const char *missing = !cfg.profiles ? "--profiles"
                          : !have_rank  ? "--rank"
                          : !have_ranks ? "--ranks"
                          : !have_batch ? "--batch"
                                        : NULL;
    if (missing) {
        fprintf(stderr, "datahelix consume: %s is required (see --help)\n", missing);
        return 2;
    }
    if (rb_tuned && !cfg.rebalance.enabled) {
        fprintf(stderr, "datahelix consume: --rebalance-buffer, --rebalance-min-gain and "
                        "--rebalance-late-ms go with --rebalance\n");
        return 2;
    }
    if (cfg.rank >= cfg.ranks) {
        fprintf(stderr, "datahelix consume: --rank %u must be below --ranks %u\n", cfg.rank,
                cfg.ranks);
        return 2;
    }
    FILE *ledger = NULL;
    if (ledger_path && !(ledger = fopen(ledger_path, "w"))) {
        perror(ledger_path);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    cfg.next_timeout_ms = 200;
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc) {
        if (ledger)
            fclose(ledger);
        return dh_cli_fail(CMD, rc, "cannot start the client");
    }
    int status = 0;
    uint64_t errors_raised = 0;
    while (!atomic_load(&interrupted)) {
        dh_client_batch_t *b = NULL;
        /* next() waits in slices so that SIGINT/SIGTERM are seen while blocked. */
        uint64_t waited_ms = 0;
        while ((rc = dh_client_next(c, &b)) == DH_EAGAIN && !atomic_load(&interrupted) &&
               waited_ms < (uint64_t)timeout_ms)
            waited_ms += 200;
        if (rc == DH_EEOF || (rc == DH_EAGAIN && atomic_load(&interrupted)))
            break;
        if (rc == DH_EAGAIN) {
            fprintf(stderr, "datahelix consume: rank %u: batch not ready within %d ms\n", cfg.rank,
                    timeout_ms);
            status = 1;
            break;
        }
        if (rc == DH_ENOSERVER) { /* no local DataServer for this node: nothing more comes */
            fprintf(stderr, "datahelix consume: rank %u: %s\n", cfg.rank, dh_last_error());
            status = 1;
            break;
        }
        if (rc) {
            /* on_error raise: that batch is consumed; report and go on. */
            errors_raised++;
            fprintf(stderr, "datahelix consume: rank %u: %s\n", cfg.rank, dh_last_error());
            if (ledger) {
                fprintf(ledger, "{\"rank\":%u,\"error\":", cfg.rank);
                json_string(ledger, dh_last_error());
                fprintf(ledger, ",\"code\":\"%s\"}\n", dh_err_name(rc));
            }
            continue;
        }
        if (check && check_payload(b) != 0)
            status = 1;
        if (ledger) {
            fprintf(ledger, "{\"rank\":%u,\"index\":%llu,\"epoch\":%u,\"server\":", cfg.rank,
                    (unsigned long long)b->index, b->epoch);
            json_string(ledger, b->server);
            fprintf(ledger, ",\"tokens\":%lld,\"wait_s\":%.6f,\"ids\":[", (long long)b->tokens,
                    b->wait_s);
            for (size_t i = 0; i < b->n_samples; i++) {
                if (i)
                    fputc(',', ledger);
                json_string(ledger, b->samples[i].id);
            }
            fprintf(ledger, "],\"errors\":[");
            size_t k = 0;
            for (size_t i = 0; i < b->n_samples; i++)
                if (b->samples[i].error) {
                    if (k++)
                        fputc(',', ledger);
                    json_string(ledger, b->samples[i].error_message);
                }
            fprintf(ledger, "]}\n");
            fflush(ledger);
        }
        dh_client_batch_release(&b);
        if (status)
            break;
        if (compute_ms > 0) {
            struct timespec ts = {
                (time_t)(compute_ms / 1000),
                (long)((compute_ms - 1000.0 * (double)(time_t)(compute_ms / 1000)) * 1e6)};
            nanosleep(&ts, NULL);
        }
    }
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    printf("{\"rank\":%u,\"client\":\"%s\",\"batches\":%llu,\"steps_total\":%llu,\"samples\":%llu,"
           "\"samples_failed\":%llu,\"errors_raised\":%llu,\"requests_sent\":%llu,"
           "\"duplicates_dropped\":%llu,\"bytes\":%llu,\"wait_s\":%.6f,\"s_per_token\":%.3g,"
           "\"prefetch_now\":%llu,\"rebalance\":%s,\"rebalance_rounds\":%llu,"
           "\"rebalance_applied\":%llu,\"rebalance_kept_by_gate\":%llu,"
           "\"rebalance_moved_parts\":%llu,\"rebalance_moved_samples\":%llu,"
           "\"rebalance_bytes\":%llu,\"rebalance_bytes_remote\":%llu,"
           "\"rebalance_s_p95\":%.6f,\"rebalance_s_max\":%.6f,\"rebalance_final_s_p95\":%.6f}\n",
           cfg.rank, dh_client_id(c), (unsigned long long)st.batches,
           (unsigned long long)st.steps_total, (unsigned long long)st.samples,
           (unsigned long long)st.samples_failed, (unsigned long long)errors_raised,
           (unsigned long long)st.requests_sent, (unsigned long long)st.duplicates_dropped,
           (unsigned long long)st.bytes_delivered, st.wait_s, st.s_per_token,
           (unsigned long long)st.prefetch_now, cfg.rebalance.enabled ? "true" : "false",
           (unsigned long long)st.rebalance_rounds, (unsigned long long)st.rebalance_applied,
           (unsigned long long)st.rebalance_kept_by_gate,
           (unsigned long long)st.rebalance_moved_parts,
           (unsigned long long)st.rebalance_moved_samples, (unsigned long long)st.rebalance_bytes,
           (unsigned long long)st.rebalance_bytes_remote, st.rebalance_s_p95, st.rebalance_s_max,
           st.rebalance_final_s_p95);
    fflush(stdout);
    dh_client_destroy(&c);
    if (ledger)
        fclose(ledger);
    if (atomic_load(&interrupted))
        return 3;
    return status;
}
