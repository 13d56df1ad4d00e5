/* cmd_probe.c: `datahelix probe`, profile rows for a data set from container metadata and
 * this machine's calibrated cost model (src/media/prober.c, docs/pipeline.md). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/manifest.h"
#include "datahelix/pipeline.h"
#include "datahelix/probe.h"
#include "datahelix/profile.h"
#include "cli.h"

#define CMD "probe"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: datahelix probe MANIFEST -o PROFILES.jsonl [--pipeline SPEC.json] [--jobs N]\n"
        "                       [--calibration FILE] [--recalibrate] [--check N] [--seed S]\n"
        "                       [--strict] [--s3-endpoint URL] [--s3-profile NAME]\n"
        "                       [--s3-anonymous]\n\n"
        "Reads the container metadata of every clip of a data set (no decoding) and writes\n"
        "one profile row per readable clip (docs/profiles.md): the pipeline's sampling plan,\n"
        "its tokens, and cpu_s_est from a cost model calibrated on this machine. The first\n"
        "probe with a given pipeline spec times a few real decodes per codec and resolution\n"
        "bucket and caches the result; later probes reuse it. A clip that cannot be used\n"
        "(missing, unreadable, too short for the plan, no frames) is skipped: the summary\n"
        "says how many of the manifest's clips were kept, how many were skipped for each\n"
        "reason, and names the first 10 skipped (--strict: fail instead).\n\n"
        "options:\n"
        "  -o, --output FILE       where to write the profile rows (required; '-' = stdout)\n"
        "  -p, --pipeline SPEC     pipeline spec JSON (docs/pipeline.md; default: defaults)\n"
        "  -j, --jobs N            metadata reader threads (default: CPUs)\n"
        "      --calibration FILE  calibration cache (default $XDG_CACHE_HOME or\n"
        "                          ~/.cache/datahelix/calibration.json)\n"
        "      --recalibrate       time decodes again even if the cache has this machine\n"
        "      --check N           afterwards, decode N random clips and print the median\n"
        "                          and p90 of |predicted - measured| / measured CPU time\n"
        "  -s, --seed S            which clips calibration and --check time (default 1)\n"
        "      --strict            fail (exit 1, no profiles written) when any clip is skipped\n"
        "%s"
        "  -h, --help              this text\n\n"
        "Progress and a closing summary (rows, skipped clips by reason) go to stderr.\n"
        "Exit status: 0 success (some clips may be skipped: see the summary), 1 failure\n"
        "(also: no clip kept, or --strict and a clip skipped; no profiles written),\n"
        "2 usage error.\n",
        DH_CLI_S3_USAGE);
}

typedef struct progress_state {
    int tty;
    const char *last_phase;
    uint64_t last_ns, start_ns;
    size_t last_decile;
} progress_state_t;

static void progress(const char *phase, size_t done, size_t total, void *ctx)
{
    progress_state_t *ps = ctx;
    uint64_t now = dh_clock_now_ns();
    if (ps->last_phase != phase) {
        if (ps->last_phase && ps->tty)
            fputc('\n', stderr);
        ps->last_phase = phase;
        ps->start_ns = now;
        ps->last_ns = 0;
        ps->last_decile = (size_t)-1;
    }
    double elapsed = dh_clock_elapsed_s(ps->start_ns, now);
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    if (ps->tty) {
        if (done < total && now - ps->last_ns < 200000000ull)
            return;
        ps->last_ns = now;
        fprintf(stderr, "\r%s: %zu/%zu (%.0f%%) %.1f/s   ", phase, done, total, pct,
                elapsed > 0 ? (double)done / elapsed : 0.0);
        if (done == total)
            fputc('\n', stderr), ps->last_phase = NULL;
    } else {
        size_t decile = total ? done * 10 / total : 10;
        if (decile == ps->last_decile)
            return;
        ps->last_decile = decile;
        fprintf(stderr, "%s: %zu/%zu (%.0f%%) after %.1f s\n", phase, done, total, pct, elapsed);
    }
}

/* The closing summary: kept N of M, skipped by reason, the first 10 skipped named. */
static void print_summary(const dh_manifest_t *manifest, const dh_probe_report_t *report,
                          size_t total)
{
    static const char *const reasons[] = {"missing", "unreadable", "too short", "no frames"};
    char by_reason[256] = "";
    size_t n = 0;
    for (size_t r = 0; r < sizeof reasons / sizeof reasons[0]; r++) {
        size_t count = 0;
        for (size_t i = 0; i < report->n_skips; i++)
            count += report->skips[i].reason && strcmp(report->skips[i].reason, reasons[r]) == 0;
        if (count && n < sizeof by_reason)
            n += (size_t)snprintf(by_reason + n, sizeof by_reason - n, "%s%zu %s", n ? ", " : "",
                                  count, reasons[r]);
    }
    if (report->n_skips == 0)
        fprintf(stderr, "probe: kept %zu of %zu clips, skipped none\n", report->rows, total);
    else
        fprintf(stderr, "probe: kept %zu of %zu clips, skipped %zu (%s)\n", report->rows, total,
                report->n_skips, by_reason);
    for (size_t i = 0; i < report->n_skips; i++) {
        if (i == 10) {
            fprintf(stderr, "probe: ... and %zu more skipped\n", report->n_skips - 10);
            break;
        }
        fprintf(stderr, "probe: skipped %s (%s): %s (%s)\n",
                dh_manifest_entry(manifest, report->skips[i].entry)->id,
                report->skips[i].reason ? report->skips[i].reason : "unreadable",
                report->skips[i].message, dh_err_name(report->skips[i].error));
    }
}

int dh_cmd_probe(int argc, char **argv)
{
    enum { OPT_CALIBRATION = 256, OPT_RECALIBRATE, OPT_CHECK, OPT_STRICT };
    static const struct option options[] = {
        {"output", required_argument, NULL, 'o'},
        {"pipeline", required_argument, NULL, 'p'},
        {"jobs", required_argument, NULL, 'j'},
        {"calibration", required_argument, NULL, OPT_CALIBRATION},
        {"recalibrate", no_argument, NULL, OPT_RECALIBRATE},
        {"check", required_argument, NULL, OPT_CHECK},
        {"seed", required_argument, NULL, 's'},
        {"strict", no_argument, NULL, OPT_STRICT},
        DH_CLI_S3_LONGOPTS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *output = NULL, *spec_path = NULL;
    unsigned long long jobs = 0, check = 0, seed = 1;
    int strict = 0;
    dh_probe_options_t opt = {0};
    dh_cli_s3_t s3 = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:p:j:s:h", options, NULL)) != -1) {
        if (dh_cli_s3_option(&s3, c, optarg))
            continue;
        switch (c) {
        case 'o':
            output = optarg;
            break;
        case 'p':
            spec_path = optarg;
            break;
        case 'j':
            if (dh_cli_parse_u64(CMD, "--jobs", optarg, 1, 64, &jobs) < 0)
                return 2;
            break;
        case OPT_CALIBRATION:
            opt.calibration_path = optarg;
            break;
        case OPT_RECALIBRATE:
            opt.recalibrate = 1;
            break;
        case OPT_CHECK:
            if (dh_cli_parse_u64(CMD, "--check", optarg, 1, 1000000, &check) < 0)
                return 2;
            break;
        case 's':
            if (dh_cli_parse_u64(CMD, "--seed", optarg, 0, ~0ull, &seed) < 0)
                return 2;
            break;
        case OPT_STRICT:
            strict = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind + 1 != argc || !output) {
        fprintf(stderr, "datahelix %s: %s (see --help)\n", CMD,
                optind >= argc ? "MANIFEST is required"
                : !output      ? "-o/--output is required"
                               : "takes one MANIFEST");
        return 2;
    }
    const char *manifest_path = argv[optind];
    if (dh_cli_s3_apply(CMD, &s3) < 0)
        return 1;

    dh_pipeline_spec_t spec;
    dh_pipeline_spec_defaults(&spec);
    int rc;
    if (spec_path && (rc = dh_pipeline_spec_load(spec_path, &spec)) != 0)
        return dh_cli_fail(CMD, rc, "bad pipeline spec");
    dh_manifest_t *manifest = NULL;
    if ((rc = dh_manifest_load(manifest_path, &manifest)) != 0)
        return dh_cli_fail(CMD, rc, "cannot read the manifest");

    progress_state_t ps = {.tty = isatty(STDERR_FILENO)};
    opt.jobs = (unsigned)jobs;
    opt.seed = seed;
    opt.progress = progress;
    opt.ctx = &ps;
    dh_profile_set_t *set = NULL;
    dh_probe_report_t report = {0};
    int status = 1;
    uint64_t start = dh_clock_now_ns();
    if ((rc = dh_profile_set_new(&set)) != 0 ||
        (rc = dh_probe_manifest(manifest, &spec, &opt, set, &report)) != 0) {
        dh_cli_fail(CMD, rc, "probe failed");
        goto out;
    }
    size_t total = dh_manifest_count(manifest);
    int refuse = report.rows == 0 || (strict && report.n_skips > 0);
    if (!refuse && (rc = dh_profile_set_write(set, output)) != 0) {
        dh_cli_fail(CMD, rc, "cannot write the profiles");
        goto out;
    }
    if (!refuse)
        fprintf(stderr, "probe: %zu rows written to %s, %zu files skipped, in %.1f s\n",
                report.rows, output, report.n_skips, dh_clock_elapsed_s(start, dh_clock_now_ns()));
    if (!report.calibration_cached)
        fprintf(stderr,
                "probe: calibration measured on this machine: %zu clips timed, saved to %s\n",
                report.calibration_decodes, report.calibration_path);
    else if (report.calibration_decodes)
        fprintf(stderr,
                "probe: calibration from %s, plus %zu clips timed for new resolution "
                "buckets\n",
                report.calibration_path, report.calibration_decodes);
    else
        fprintf(stderr, "probe: calibration from %s (nothing decoded)\n", report.calibration_path);
    print_summary(manifest, &report, total);
    if (refuse) {
        fprintf(stderr, "datahelix %s: %s; no profiles written\n", CMD,
                report.rows == 0 ? "no clip of the manifest could be used"
                                 : "--strict: clips were skipped");
        goto out;
    }
    if (check) {
        double median, p90;
        size_t checked;
        rc = dh_probe_check(manifest, &spec, set, report.entry_of_row, (size_t)check, seed + 1,
                            progress, &ps, &median, &p90, &checked);
        if (rc != 0) {
            dh_cli_fail(CMD, rc, "check failed");
            goto out;
        }
        printf("probe check: %zu clips decoded: median |predicted - measured| / measured = "
               "%.1f%%, p90 = %.1f%%\n",
               checked, 100 * median, 100 * p90);
    }
    status = 0;
out:
    dh_probe_report_clear(&report);
    dh_profile_set_destroy(&set);
    dh_manifest_destroy(&manifest);
    return status;
}
