/* cmd_place_bench.c: `datahelix place-bench`, decisions per second and decision-time
 * percentiles of a placement policy on one core (see src/bench/place_bench.c). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/place.h"
#include "bench/place_bench.h"
#include "core/internal.h"
#include "cli.h"

#define MAX_SIZES 16

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: datahelix place-bench [--servers LIST] [--decisions N] [--policy NAME]\n"
        "                             [--path both|indexed|exhaustive] [--seed N] [--json]\n\n"
        "Measures the placement policy on one core (the process is pinned to the CPU it\n"
        "starts on): decisions per CPU-second of that thread, and p50/p99 wall-clock time\n"
        "per decision, over a realistic snapshot that changes as decisions fill queues and\n"
        "completions drain them (docs/scheduler.md describes it). Two paths: exhaustive\n"
        "(dh_place scores every server, and fills every candidate's T) and indexed\n"
        "(dh_place_index_decide, the index updated after each change); they make the same\n"
        "decisions, which the `same` column checks. Also prints which rule decided how often.\n\n"
        "  --servers LIST    comma-separated cluster sizes, each >= 2 (default 8,128,1024)\n"
        "  --decisions N     decisions per size (default 200000)\n"
        "  --policy NAME     deadline (default), least-request or local\n"
        "  --path WHICH      both (default: indexed, then exhaustive), indexed or exhaustive\n"
        "  --seed N          snapshot and request seed (default 1)\n"
        "  --json            print {\"results\":[{\"servers\",\"path\",\"decisions_per_s\","
        "\"p50_us\",\"p99_us\",\"max_us\",\"build_ms\",\"same\"}]}\n"
        "  -h, --help        this text\n");
}

/* Appends "SERVERS: rule P%, ..." and a newline to buf; returns the length appended. */
static size_t describe_rules(const dh_place_bench_result_t *r, char *buf, size_t size)
{
    size_t len = 0;
    int n = snprintf(buf, size, "  %6u servers:", r->servers);
    for (int k = 0; k <= DH_REASON_NO_CANDIDATE && n >= 0 && (size_t)n < size - len; k++) {
        len += (size_t)n;
        n = r->by_reason[k] ? snprintf(buf + len, size - len, " %s %.1f%%",
                                       dh_place_reason_name((dh_place_reason_t)k),
                                       100.0 * (double)r->by_reason[k] / (double)r->decisions)
                            : 0;
    }
    if (n >= 0 && (size_t)n < size - len)
        len += (size_t)n;
    if (len + 1 < size) {
        buf[len++] = '\n';
        buf[len] = '\0';
    }
    return len;
}

static void pin_to_one_core(void)
{
    int rc = dh__pin_to_current_cpu();
    if (rc != 0)
        fprintf(stderr,
                "datahelix place-bench: could not pin to one CPU (%s); timing may be "
                "noisier\n",
                dh_strerror(rc));
}

int dh_cmd_place_bench(int argc, char **argv)
{
    static const struct option options[] = {
        {"servers", required_argument, NULL, 's'}, {"decisions", required_argument, NULL, 'd'},
        {"policy", required_argument, NULL, 'p'},  {"seed", required_argument, NULL, 'S'},
        {"path", required_argument, NULL, 'P'},    {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    char servers_arg[256] = "8,128,1024";
    unsigned long long decisions = 200000, seed = 1;
    dh_policy_t policy = DH_POLICY_DEADLINE;
    int json = 0, opt, first_path = DH_PLACE_BENCH_INDEXED, last_path = DH_PLACE_BENCH_EXHAUSTIVE;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case 's':
            snprintf(servers_arg, sizeof servers_arg, "%s", optarg);
            break;
        case 'd':
            if (dh_cli_parse_u64("place-bench", "--decisions", optarg, 1, 1000000000ull,
                                 &decisions))
                return 2;
            break;
        case 'p':
            if (dh_policy_from_name(optarg, &policy) != 0) {
                fprintf(stderr, "datahelix place-bench: %s\n", dh_last_error());
                return 2;
            }
            break;
        case 'S':
            if (dh_cli_parse_u64("place-bench", "--seed", optarg, 0, ~0ull, &seed))
                return 2;
            break;
        case 'P':
            if (strcmp(optarg, "both") == 0) {
                first_path = DH_PLACE_BENCH_INDEXED;
                last_path = DH_PLACE_BENCH_EXHAUSTIVE;
            } else if (strcmp(optarg, "indexed") == 0) {
                first_path = last_path = DH_PLACE_BENCH_INDEXED;
            } else if (strcmp(optarg, "exhaustive") == 0) {
                first_path = last_path = DH_PLACE_BENCH_EXHAUSTIVE;
            } else {
                fprintf(stderr,
                        "datahelix place-bench: --path '%s' (expected both, indexed or "
                        "exhaustive)\n",
                        optarg);
                return 2;
            }
            break;
        case 'j':
            json = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (dh_cli_no_extra_args("place-bench", argc, argv, optind) < 0)
        return 2;

    unsigned long long sizes[MAX_SIZES];
    int n_sizes = 0;
    for (char *save = NULL, *tok = strtok_r(servers_arg, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n_sizes == MAX_SIZES) {
            fprintf(stderr, "datahelix place-bench: --servers takes at most %d sizes\n", MAX_SIZES);
            return 2;
        }
        if (dh_cli_parse_u64("place-bench", "--servers", tok, 2, 1000000, &sizes[n_sizes]))
            return 2;
        n_sizes++;
    }
    if (n_sizes == 0) {
        fprintf(stderr, "datahelix place-bench: --servers needs at least one size\n");
        return 2;
    }

    char rules[4096] = "";
    size_t rules_len = 0;
    pin_to_one_core();
    if (!json)
        printf("place-bench: policy %s, %llu decisions per size, one core\n\n"
               "%9s %-10s %12s %8s %8s %9s %9s %5s\n",
               dh_policy_name(policy), decisions, "servers", "path", "decisions/s", "p50_us",
               "p99_us", "max_us", "build_ms", "same");
    else
        printf("{\"results\":[");
    fflush(stdout); /* the header before the progress lines on stderr */
    int n_results = 0;
    for (int i = 0; i < n_sizes; i++) {
        uint64_t first_hash = 0;
        /* indexed = 1 runs first: the same column compares each later path with it */
        for (int path = first_path; path >= last_path; path--) {
            dh_place_bench_result_t r;
            const char *name = path == DH_PLACE_BENCH_INDEXED ? "indexed" : "exhaustive";
            if (!json)
                fprintf(stderr, "place-bench: %llu servers, %s...\n", sizes[i], name);
            int rc = dh_place_bench_run((uint32_t)sizes[i], decisions, seed, policy,
                                        (dh_place_bench_path_t)path, &r);
            if (rc != 0)
                return dh_cli_fail("place-bench", rc, "benchmark failed");
            if (path == first_path)
                first_hash = r.decisions_hash;
            const char *same = path == first_path               ? "-"
                               : r.decisions_hash == first_hash ? "yes"
                                                                : "NO";
            if (json)
                printf("%s{\"servers\":%u,\"path\":\"%s\",\"decisions_per_s\":%.1f,"
                       "\"p50_us\":%.3f,\"p99_us\":%.3f,\"max_us\":%.3f,\"build_ms\":%.3f,"
                       "\"same\":%s}",
                       n_results ? "," : "", r.servers, name, r.decisions_per_s, r.p50_us, r.p99_us,
                       r.max_us, r.build_ms,
                       path == first_path               ? "null"
                       : r.decisions_hash == first_hash ? "true"
                                                        : "false");
            else
                printf("%9u %-10s %12.0f %8.2f %8.2f %9.2f %9.2f %5s\n", r.servers, name,
                       r.decisions_per_s, r.p50_us, r.p99_us, r.max_us, r.build_ms, same);
            fflush(stdout);
            n_results++;
            if (!json && path == first_path)
                rules_len += describe_rules(&r, rules + rules_len, sizeof rules - rules_len);
            if (path != first_path && r.decisions_hash != first_hash) {
                fprintf(stderr,
                        "datahelix place-bench: the indexed and exhaustive paths decided "
                        "differently at %u servers\n",
                        r.servers);
                return 1;
            }
        }
    }
    if (json)
        printf("]}\n");
    else
        printf("\nwhich rule decided, per size:\n%s", rules);
    return 0;
}
