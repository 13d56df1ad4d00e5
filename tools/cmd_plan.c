/* cmd_plan.c: `datahelix plan`, runs the tier-1 planner (plan.h, docs/planner.md) over the
 * steps drawn from a profile file and reports balance per algorithm: imbalance (max over
 * mean per-rank tokens), the gap to the lower bound max(mean, largest sample), and the gap
 * to the exact optimum on instances small enough for the branch and bound. Thin: parse,
 * load, sample, plan, summarise. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/sampler.h"
#include "datahelix/stats.h"
#include "cli.h"

#define CMD "plan"
#define EXACT_MAX_WINDOW 32 /* ranks x batch up to which the exact optimum is computed */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix plan --profiles FILE --ranks R --batch B [--steps S] [--algo NAME]\n"
            "                      [--seed N] [--node-limit N] [--json]\n"
            "\n"
            "Plans S global steps of R x B samples drawn from a seeded shuffle of the profile\n"
            "file (steps continue into the next epoch; load = tokens_est, key = profile_key),\n"
            "in fixed-batch mode, and reports per algorithm:\n"
            "  imbalance_mean, imbalance_p95  max / mean per-rank tokens, over the steps\n"
            "  gap_to_bound_mean              max / max(mean, largest sample) - 1\n"
            "  gap_to_opt_mean                max / exact optimum - 1, over the steps where\n"
            "                                 the exact solver finished (only when R x B <= %d;\n"
            "                                 the number of solved steps is printed)\n"
            "\n"
            "options:\n"
            "  -p, --profiles FILE   profile set, JSONL (docs/profiles.md); '-' is stdin\n"
            "  -r, --ranks R         ranks (data-parallel consumers), 1..4096 (required)\n"
            "  -b, --batch B         samples per rank per step, 1..65536 (required)\n"
            "  -S, --steps S         global steps to plan (default 200)\n"
            "  -a, --algo NAME       greedy | kk | swap | exact: report only this one\n"
            "                        (default: greedy, kk and swap; swap is the default\n"
            "                        algorithm, marked '*'; with exact, a step where the\n"
            "                        solver gives up counts its best plan, at least swap's)\n"
            "  -s, --seed N          shuffle seed (default 1)\n"
            "      --node-limit N    exact solver nodes per step (default 2000000)\n"
            "      --json            print one JSON object for the selected algorithm\n"
            "                        (--algo, default swap): {\"ranks\", \"batch\", \"steps\",\n"
            "                        \"algo\", \"imbalance_mean\", \"imbalance_p95\",\n"
            "                        \"gap_to_bound_mean\", \"gap_to_opt_mean\" (null when not\n"
            "                        computed), \"opt_steps\"}\n"
            "  -h, --help            show this help\n"
            "\n"
            "Progress goes to standard error when planning takes more than a second.\n"
            "Exit status: 0 success, 1 failure, 2 usage error.\n",
            EXACT_MAX_WINDOW);
}

typedef struct algo_result {
    dh_plan_algo_t algo;
    dh_stats_t *imbalance;
    double gap_bound_sum;
    double gap_opt_sum;
    size_t gap_opt_steps;
} algo_result_t;

static double max_of(const double *v, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] > m)
            m = v[i];
    return m;
}

int dh_cmd_plan(int argc, char **argv)
{
    enum { OPT_NODE_LIMIT = 1000, OPT_JSON };
    static const struct option options[] = {
        {"profiles", required_argument, NULL, 'p'},
        {"ranks", required_argument, NULL, 'r'},
        {"batch", required_argument, NULL, 'b'},
        {"steps", required_argument, NULL, 'S'},
        {"algo", required_argument, NULL, 'a'},
        {"seed", required_argument, NULL, 's'},
        {"node-limit", required_argument, NULL, OPT_NODE_LIMIT},
        {"json", no_argument, NULL, OPT_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *path = NULL, *algo_name = NULL;
    unsigned long long ranks = 0, batch = 0, steps = 200, seed = 1, node_limit = 2000000;
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "p:r:b:S:a:s:h", options, NULL)) != -1) {
        switch (c) {
        case 'p':
            path = optarg;
            break;
        case 'r':
            if (dh_cli_parse_u64(CMD, "--ranks", optarg, 1, 4096, &ranks) < 0)
                return 2;
            break;
        case 'b':
            if (dh_cli_parse_u64(CMD, "--batch", optarg, 1, 65536, &batch) < 0)
                return 2;
            break;
        case 'S':
            if (dh_cli_parse_u64(CMD, "--steps", optarg, 1, 100000000ULL, &steps) < 0)
                return 2;
            break;
        case 'a':
            algo_name = optarg;
            break;
        case 's':
            if (dh_cli_parse_u64(CMD, "--seed", optarg, 0, UINT64_MAX, &seed) < 0)
                return 2;
            break;
        case OPT_NODE_LIMIT:
            if (dh_cli_parse_u64(CMD, "--node-limit", optarg, 1, UINT64_MAX, &node_limit) < 0)
                return 2;
            break;
        case OPT_JSON:
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
    if (dh_cli_no_extra_args(CMD, argc, argv, optind) < 0)
        return 2;
    if (!path || !ranks || !batch) {
        fprintf(stderr, "datahelix %s: missing required option %s\n", CMD,
                !path    ? "--profiles"
                : !ranks ? "--ranks"
                         : "--batch");
        return 2;
    }
    dh_plan_algo_t selected = DH_PLAN_ALGO_DEFAULT;
    if (algo_name && dh_plan_algo_from_name(algo_name, &selected) != 0) {
        fprintf(stderr, "datahelix %s: --algo expects greedy, kk, swap or exact, got '%s'\n", CMD,
                algo_name);
        return 2;
    }

    int status = 1, rc;
    size_t window = (size_t)(ranks * batch);
    dh_profile_set_t *set = NULL;
    dh_sampler_t *sampler = NULL;
    uint32_t *ids = NULL, *keys = NULL;
    double *loads = NULL, *rank_load = NULL;
    int32_t *rank_of = NULL;
    algo_result_t results[DH_PLAN_ALGO_COUNT];
    size_t n_results = 0, opt_steps = 0;
    memset(results, 0, sizeof results);
    if (algo_name || json) {
        results[n_results++].algo = selected;
    } else {
        results[n_results++].algo = DH_PLAN_GREEDY;
        results[n_results++].algo = DH_PLAN_KK;
        results[n_results++].algo = DH_PLAN_SWAP;
    }

    uint64_t load_start_ns = dh_clock_now_ns();
    if ((rc = dh_profile_set_new(&set)) != 0 || (rc = dh_profile_set_load(set, path)) != 0) {
        dh_cli_fail(CMD, rc, "cannot load the profile set");
        goto out;
    }
    size_t rows = dh_profile_set_count(set);
    double load_s = dh_clock_elapsed_s(load_start_ns, dh_clock_now_ns());
    if (load_s > 1.0) /* a large file: say where the time went */
        fprintf(stderr, "datahelix %s: loaded %zu rows from %s in %.1f s\n", CMD, rows, path,
                load_s);
    if (rows < window) {
        fprintf(stderr, "datahelix %s: %s has %zu rows, fewer than ranks x batch = %zu\n", CMD,
                path, rows, window);
        goto out;
    }
    ids = dh_calloc(window, sizeof *ids);
    keys = dh_calloc(window, sizeof *keys);
    loads = dh_calloc(window, sizeof *loads);
    rank_of = dh_calloc(window, sizeof *rank_of);
    rank_load = dh_calloc(ranks, sizeof *rank_load);
    if (!ids || !keys || !loads || !rank_of || !rank_load) {
        dh_cli_fail(CMD, DH_ENOMEM, "cannot allocate the window");
        goto out;
    }
    for (size_t a = 0; a < n_results; a++)
        if ((rc = dh_stats_new(&results[a].imbalance)) != 0) {
            dh_cli_fail(CMD, rc, "cannot allocate statistics");
            goto out;
        }
    if ((rc = dh_sampler_new(&sampler, rows, window, seed, 1)) != 0) {
        dh_cli_fail(CMD, rc, "cannot create the sampler");
        goto out;
    }

    dh_plan_config_t cfg = {.mode = DH_PLAN_FIXED_BATCH,
                            .ranks = (uint32_t)ranks,
                            .batch = (uint32_t)batch,
                            .exact_node_limit = node_limit};
    int run_exact = window <= EXACT_MAX_WINDOW;
    uint64_t start_ns = dh_clock_now_ns(), last_progress_ns = start_ns;
    int progress_shown = 0;
    for (uint64_t step = 0; step < steps; step++) {
        if ((rc = dh_sampler_step(sampler, step, ids)) != 0) {
            dh_cli_fail(CMD, rc, "sampler");
            goto out;
        }
        double total = 0;
        for (size_t i = 0; i < window; i++) {
            const dh_profile_row_t *row = dh_profile_set_row(set, ids[i]);
            loads[i] = (double)row->tokens_est;
            keys[i] = row->key_index;
            total += loads[i];
        }
        double mean = total / (double)ranks;
        double bound = dh_plan_lower_bound(loads, window, (uint32_t)ranks);
        double opt = 0;
        int have_opt = 0;
        if (run_exact) {
            cfg.algo = DH_PLAN_EXACT;
            rc = dh_plan_step(&cfg, loads, keys, window, rank_of, rank_load);
            if (rc == 0) {
                have_opt = 1;
                opt = max_of(rank_load, ranks);
                opt_steps++;
            } else if (rc != DH_ETOOBIG) {
                dh_cli_fail(CMD, rc, "exact planner");
                goto out;
            }
        }
        for (size_t a = 0; a < n_results; a++) {
            cfg.algo = results[a].algo;
            rc = dh_plan_step(&cfg, loads, keys, window, rank_of, rank_load);
            if (rc != 0 && !(rc == DH_ETOOBIG && cfg.algo == DH_PLAN_EXACT)) {
                dh_cli_fail(CMD, rc, "planner");
                goto out;
            }
            double top = max_of(rank_load, ranks);
            if ((rc = dh_stats_add(results[a].imbalance, mean > 0 ? top / mean : 1.0)) != 0) {
                dh_cli_fail(CMD, rc, "statistics");
                goto out;
            }
            results[a].gap_bound_sum += bound > 0 ? top / bound - 1 : 0;
            if (have_opt) {
                results[a].gap_opt_sum += opt > 0 ? top / opt - 1 : 0;
                results[a].gap_opt_steps++;
            }
        }
        uint64_t now = dh_clock_now_ns();
        if (dh_clock_elapsed_s(start_ns, now) > 1.0 &&
            dh_clock_elapsed_s(last_progress_ns, now) > 1.0) {
            fprintf(stderr, "\rdatahelix %s: step %llu/%llu", CMD, (unsigned long long)step + 1,
                    steps);
            last_progress_ns = now;
            progress_shown = 1;
        }
    }
    if (progress_shown)
        fprintf(stderr, "\n");

    if (json) {
        algo_result_t *r = &results[0];
        printf("{\"ranks\": %llu, \"batch\": %llu, \"steps\": %llu, \"algo\": \"%s\", "
               "\"imbalance_mean\": %.6f, \"imbalance_p95\": %.6f, \"gap_to_bound_mean\": %.6f, "
               "\"gap_to_opt_mean\": ",
               ranks, batch, steps, dh_plan_algo_name(r->algo), dh_stats_mean(r->imbalance),
               dh_stats_percentile(r->imbalance, 95), r->gap_bound_sum / (double)steps);
        if (r->gap_opt_steps)
            printf("%.6f", r->gap_opt_sum / (double)r->gap_opt_steps);
        else
            printf("null");
        printf(", \"opt_steps\": %zu}\n", opt_steps);
    } else {
        printf("plan: %s, %zu rows, %llu ranks x batch %llu, %llu steps, seed %llu\n", path, rows,
               ranks, batch, steps, seed);
        printf("%-8s %15s %14s %18s %16s\n", "algo", "imbalance_mean", "imbalance_p95",
               "gap_to_bound_mean", "gap_to_opt_mean");
        for (size_t a = 0; a < n_results; a++) {
            algo_result_t *r = &results[a];
            char name[16], opt_text[32];
            snprintf(name, sizeof name, "%s%s", dh_plan_algo_name(r->algo),
                     r->algo == DH_PLAN_ALGO_DEFAULT ? " *" : "");
            if (r->gap_opt_steps)
                snprintf(opt_text, sizeof opt_text, "%.3f%%",
                         100 * r->gap_opt_sum / (double)r->gap_opt_steps);
            else
                snprintf(opt_text, sizeof opt_text, "n/a");
            printf("%-8s %15.4f %14.4f %17.3f%% %16s\n", name, dh_stats_mean(r->imbalance),
                   dh_stats_percentile(r->imbalance, 95), 100 * r->gap_bound_sum / (double)steps,
                   opt_text);
        }
        if (run_exact)
            printf("exact optimum: solved %zu/%llu steps (node limit %llu); gap_to_opt_mean is "
                   "over those steps\n",
                   opt_steps, steps, node_limit);
        else
            printf("exact optimum: not computed (ranks x batch = %zu > %d)\n", window,
                   EXACT_MAX_WINDOW);
        printf("* default algorithm\n");
    }
    status = 0;
out:
    for (size_t a = 0; a < n_results; a++)
        dh_stats_destroy(&results[a].imbalance);
    dh_sampler_destroy(&sampler);
    dh_profile_set_destroy(&set);
    dh_free(ids);
    dh_free(keys);
    dh_free(loads);
    dh_free(rank_of);
    dh_free(rank_load);
    return status;
}
