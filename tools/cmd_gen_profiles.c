/* cmd_gen_profiles.c: `datahelix gen-profiles`, writes a synthetic profile set (JSONL,
 * docs/profiles.md) drawn from a built-in or file mix, so the planner and the benchmarks
 * have input before any real video is probed. Thin: parse, dh_profiles_generate, write. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/profile.h"
#include "cli.h"

#define CMD "gen-profiles"
#define MAX_COUNT 100000000ULL /* 100 M rows: ~15 GB of rows in memory, a sane ceiling */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: datahelix gen-profiles --mix MIX --count N [--seed S] [-o FILE]\n"
            "\n"
            "Writes N synthetic profile rows (JSONL, one object per line; see docs/profiles.md)\n"
            "drawn from a workload mix, with costs from the synthetic cost model.\n"
            "\n"
            "options:\n"
            "  -m, --mix MIX      kinetics-s | kinetics-m | kinetics-l | kinetics-mixed |\n"
            "                     openvid-mixed, or a JSON file holding a list of\n"
            "                     {frames, height, width, duration_s, fps, weight} objects\n"
            "                     (fps defaults to 30, weight to 1)\n"
            "  -n, --count N      number of rows, 0..%llu (required)\n"
            "  -s, --seed S       random seed (default 0); the same seed gives the same file\n"
            "  -o, --output FILE  where to write (default '-', standard output)\n"
            "  -h, --help         show this help\n"
            "\n"
            "Ends with a one-line summary on standard error: rows written and rows per\n"
            "profile key. Exit status: 0 success, 1 failure, 2 usage error.\n",
            MAX_COUNT);
}

int dh_cmd_gen_profiles(int argc, char **argv)
{
    static const struct option options[] = {
        {"mix", required_argument, NULL, 'm'},  {"count", required_argument, NULL, 'n'},
        {"seed", required_argument, NULL, 's'}, {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0},
    };
    const char *mix_name = NULL, *output = "-";
    unsigned long long count = 0, seed = 0;
    int have_count = 0, opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:n:s:o:h", options, NULL)) != -1) {
        switch (opt) {
        case 'm':
            mix_name = optarg;
            break;
        case 'n':
            if (dh_cli_parse_u64(CMD, "--count", optarg, 0, MAX_COUNT, &count) < 0)
                return 2;
            have_count = 1;
            break;
        case 's':
            if (dh_cli_parse_u64(CMD, "--seed", optarg, 0, UINT64_MAX, &seed) < 0)
                return 2;
            break;
        case 'o':
            output = optarg;
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
    if (!mix_name || !have_count) {
        fprintf(stderr, "datahelix %s: %s is required (see --help)\n", CMD,
                !mix_name ? "--mix" : "--count");
        return 2;
    }

    dh_mix_t *mix = NULL;
    dh_profile_set_t *set = NULL;
    size_t *per_key = NULL;
    int status = 1, rc;
    if ((rc = dh_mix_load(mix_name, &mix)) < 0) {
        dh_cli_fail(CMD, rc, "cannot load the mix");
        goto out;
    }
    if ((rc = dh_profile_set_new(&set)) < 0 ||
        (rc = dh_profiles_generate(mix, (size_t)count, seed, set)) < 0) {
        dh_cli_fail(CMD, rc, "cannot generate profiles");
        goto out;
    }
    if ((rc = dh_profile_set_write(set, output)) < 0) {
        dh_cli_fail(CMD, rc, "cannot write profiles");
        goto out;
    }

    size_t keys = dh_profile_set_key_count(set), rows = dh_profile_set_count(set);
    per_key = dh_calloc(keys ? keys : 1, sizeof *per_key);
    if (!per_key) {
        dh_cli_fail(CMD, DH_ENOMEM, "cannot summarise");
        goto out;
    }
    for (size_t i = 0; i < rows; i++)
        per_key[dh_profile_set_row(set, i)->key_index]++;
    fprintf(stderr, "datahelix %s: wrote %zu rows to %s (mix %s, seed %llu):", CMD, rows,
            strcmp(output, "-") == 0 ? "<stdout>" : output, mix_name, seed);
    for (size_t k = 0; k < keys; k++)
        fprintf(stderr, " %s=%zu", dh_profile_set_key(set, k), per_key[k]);
    fputc('\n', stderr);
    status = 0;
out:
    dh_free(per_key);
    dh_profile_set_destroy(&set);
    dh_mix_destroy(&mix);
    return status;
}
