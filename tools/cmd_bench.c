/* cmd_bench.c: `datahelix bench`, the emulated synchronous training loop
 * (bench/train_bench.h, docs/benchmarks.md). Thin: parse, run, print the table and JSON. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "datahelix/error.h"
#include "datahelix/log.h"
#include "bench/train_bench.h"
#include "cli.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: datahelix bench (--dataset DIR | --emulate --mix NAME|FILE.json |\n"
        "                        --python-dataset MODULE:FACTORY) [options]\n"
        "\n"
        "Runs a synchronous data-parallel training loop against each system in turn, side\n"
        "by side on the same samples: R ranks (threads, each with a real client of the\n"
        "data plane) take a batch, 'compute' a x tokens + b seconds (a sleep: the\n"
        "emulated accelerator), then meet at a barrier (the all-reduce). The coordinator\n"
        "and the DataServers run as threads of this process.\n"
        "\n"
        "workload:\n"
        "  --dataset DIR         real decode: DIR/profiles.jsonl from `probe` (video pipeline)\n"
        "  --pipeline SPEC.json  with --dataset: the pipeline spec (default: video defaults)\n"
        "  --python-dataset MODULE:FACTORY\n"
        "                        a Python map-style dataset (FACTORY() returns it), run in\n"
        "                        the DataServers' worker processes: `python -m\n"
        "                        datahelix.profile` profiles it into --python-dir, with the\n"
        "                        costs of its estimate_cost and/or measured over one pass\n"
        "                        (--costs); with both, helix runs again on the learned\n"
        "                        costs under the same compute model, and the two are\n"
        "                        compared (docs/benchmarks.md, \"A Python dataset\")\n"
        "  --costs estimate|learned|both  with --python-dataset (both)\n"
        "  --sweep-remote N,N,...  the paper's remote-server sweep: the whole run once per\n"
        "                        --remote-servers value (e.g. 0,8,16,24), a table of each\n"
        "                        system's throughput, miss rate, input wait p95 and\n"
        "                        cross-node traffic per point; --json gets them all\n"
        "  --python-dir DIR      with --python-dataset: where the profiles go\n"
        "                        (default /tmp/datahelix-python-dataset-PID)\n"
        "  --emulate             the synthetic pipeline: each sample sleeps its CPU seconds\n"
        "                        on a worker (one machine emulates many virtual cores)\n"
        "  --mix NAME|FILE       with --emulate: kinetics-s|m|l, kinetics-mixed,\n"
        "                        openvid-mixed, or a JSON list of {frames,height,width,...}\n"
        "  --rows N              with --emulate: samples generated from the mix (4096)\n"
        "  --ranks R --batch B   ranks (8) and samples per rank per step (4)\n"
        "  --steps S --warmup W  measured steps (100) after W warm-up steps (20)\n"
        "  --seed N              sample order and generation seed (1)\n"
        "\n"
        "systems (--systems LIST, default native,pool,helix; ablation ladder:\n"
        "base,transport,prefetch-token,cost-ddl,ddlb):\n"
        "  native                rank-local loaders: a DataServer per rank, the native\n"
        "                        budget split evenly, sample-count batching, prefetch 2 per\n"
        "                        worker\n"
        "  native-N              the same with N cores in all\n"
        "  pool (= base)         shared pool of the helix servers, least-request routing,\n"
        "                        sample-count batching, 2 in flight per worker share,\n"
        "                        batches copied into the consumer on the training\n"
        "                        thread (charged like any transfer: --link-gbps)\n"
        "  transport             base with zero-copy shared-memory delivery\n"
        "  prefetch-token        transport + tier-1 token planning (packing: batch sizes\n"
        "                        vary, tokens even), deep prefetch, fanout (--fanout)\n"
        "  cost-ddl              prefetch-token + deadline placement (tier 1 alone)\n"
        "  helix (= ddlb)        cost-ddl + tier 2: the ranks rebalance materialized\n"
        "                        batches in one group of all ranks (each on its own node\n"
        "                        in the paper layout, so a move crosses a link, charged\n"
        "                        at --link-gbps, and the cost gate prices it the same)\n"
        "\n"
        "cluster:\n"
        "  --local-servers N     local DataServers, one per node (8); rank r is on node r%%N\n"
        "  --remote-servers M    remote sidecars (16)\n"
        "  --cores-per-server C  workers (virtual cores) per DataServer (4)\n"
        "  --native-cores N      total cores of `native` (default N x C of the locals)\n"
        "  --prefetch P          prefetch depth of the deep systems (default: 16, or the\n"
        "                        pool's in-flight depth, 2 x cores per rank, if deeper)\n"
        "  --prefetch-max Q      let their prefetch grow up to Q when next() waits\n"
        "                        (default: fixed at P, as every other system's depth;\n"
        "                        deeper for them alone is not an equal-depth comparison)\n"
        "  --fanout F            their requests per rank's batch, at most --batch: the\n"
        "                        parts decode in parallel, the client joins them by one\n"
        "                        copy, and packing gives each rank at least F samples\n"
        "                        (default: 1, unless one worker cannot decode a batch\n"
        "                        within the prefetch horizon's compute; then that many\n"
        "                        parts, at most the cores per rank, counting only real\n"
        "                        cores with --dataset)\n"
        "  --plan-window W       their tier 1 plans W consecutive steps of an epoch\n"
        "                        together, so a sample may be consumed up to W - 1 steps\n"
        "                        from its sampler step (1: each step alone, the default;\n"
        "                        docs/planner.md, \"Planning across steps\")\n"
        "\n"
        "tier 2 (rebalancing of materialized batches, docs/rebalancing.md):\n"
        "  --rebalance           on for every deep system (prefetch-token, cost-ddl,\n"
        "                        ddlb, helix); default: on for ddlb and helix only\n"
        "  --no-rebalance        off everywhere (ddlb and helix then run as cost-ddl)\n"
        "  --rebalance-buffer N  samples per round across the group (64)\n"
        "  --rebalance-min-gain G  the cost gate's margin: a round moves samples only when\n"
        "                        the projected cut of the largest rank's compute exceeds\n"
        "                        the part of the transfer that does not fit before the\n"
        "                        round is consumed by G x that compute (0.05)\n"
        "  --rebalance-fanout auto|batch|own|F  the fanout of the systems with tier 2:\n"
        "                        tier 2 moves parts (a request's microbatch) within their\n"
        "                        step, in exchange, so batch moves single samples (each\n"
        "                        rank keeps `batch`), ranks x batch gives one-sample slots\n"
        "                        (packing kept: a sample may move to an empty slot), and\n"
        "                        fanout 1 can only swap whole batches; a batch of several\n"
        "                        parts costs a join copy (--link-gbps); own: the system's\n"
        "                        own fanout (--fanout, else its default); auto (default):\n"
        "                        ranks x batch where that join takes at most half the\n"
        "                        mean step's compute (emulated), else own (always with\n"
        "                        --dataset)\n"
        "\n"
        "compute and metrics:\n"
        "  --compute auto|A,B    seconds per token and per step; auto (default): the\n"
        "                        balanced regime, where the mean rank's compute summed over\n"
        "                        steps equals the CPU work / the helix cores (b = 10%%)\n"
        "  --compute-scale X     multiplies a and b (1)\n"
        "  --deadline-threshold S  a step misses when its input wait exceeds S seconds\n"
        "                        (default: 10%% of the mean step compute)\n"
        "  --time-scale X        emulated: every duration x X (1), to run shorter\n"
        "  --bytes-scale X       emulated: payload bytes x X (0.001)\n"
        "  --link-gbps G         the transfer cost, one for every system: each byte that\n"
        "                        crosses nodes (a DataServer's link is busy while it\n"
        "                        forwards) and each byte a system copies (pool's copy on\n"
        "                        the training thread, the fanout join on the client's\n"
        "                        fetcher) costs 8 / (G x 1e9) s, of emulated bytes\n"
        "                        (payload / --bytes-scale); Gb/s (25, a 25 GbE NIC;\n"
        "                        0 = free). With --dataset only links are charged (the\n"
        "                        copies are real)\n"
        "  --cost-bias S         emulated misprediction: each profile key's actual cost is\n"
        "                        its estimate x a mean-one lognormal factor of sigma S,\n"
        "                        drawn once per key (0.3)\n"
        "  --cost-noise S        ... and each sample's x one of sigma S of its own (0.3)\n"
        "  --token-noise S       each sample's actual tokens: the estimate x a mean-one\n"
        "                        lognormal factor of sigma S (0.1). Draws are seeded by\n"
        "                        --seed and the key or sample id (the same for every\n"
        "                        system); schedulers see only the estimates; 0 = none\n"
        "\n"
        "output:\n"
        "  --json FILE           the report: {\"config\":{...},\"systems\":{NAME:{\n"
        "                        \"throughput_sps\",\"input_wait_p50_s\",\"input_wait_p95_s\",\n"
        "                        \"input_wait_p99_s\",\"batch_ready_p95_s\",\"ddl_miss_rate\",\n"
        "                        \"barrier_wait_mean_s\",\"cross_node_bytes\",\"copy_bytes\",\n"
        "                        \"sched_us_per_decision\",\"ideal_sps\",\"efficiency\",\n"
        "                        \"balance\",\"cores\",\"cpu_work_s\",\"rebalance_rounds\",\n"
        "                        \"rebalance_applied\",\"rebalance_kept_by_gate\",\n"
        "                        \"rebalance_moved_samples\",\"rebalance_moved_parts\",\n"
        "                        \"rebalance_bytes\",\"rebalance_s_p95\",...}}}\n"
        "  --trace FILE          a Chrome/Perfetto trace: per rank data wait, compute,\n"
        "                        barrier; per DataServer each batch from request to ready\n"
        "  --plot DIR            PNG plots in DIR (scripts/bench_plots.py, with matplotlib,\n"
        "                        run by $DH_PYTHON_EXE, default python3):\n"
        "                        step_time_p95.png (per rank, per system) and\n"
        "                        systems.png (throughput, input-wait p95, miss rate); the\n"
        "                        report goes to DIR/bench.json unless --json is given\n"
        "  -h, --help            show this help\n"
        "\n"
        "The table goes to standard output, progress to standard error. Exit status: 0,\n"
        "1 failure, 2 usage error.\n");
}

static void progress(const char *line, void *ctx)
{
    (void)ctx;
    fprintf(stderr, "bench: %s\n", line);
}

static int parse_double(const char *opt, const char *text, double min, double *out)
{
    char *end = NULL;
    double v = strtod(text, &end);
    if (!end || *end || !(v >= min) || v > 1e9) {
        fprintf(stderr, "datahelix bench: %s: expected a number >= %g, got '%s'\n", opt, min, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* Runs scripts/bench_plots.py (DH_PLOT_SCRIPT overrides the path) on the report, with the
 * interpreter $DH_PYTHON_EXE names (make and ctest set it to the project's .venv), else
 * python3 from PATH. */
static int run_plots(const char *json, const char *dir)
{
    const char *python = getenv("DH_PYTHON_EXE");
    if (!python || !*python)
        python = "python3";
    const char *script = getenv("DH_PLOT_SCRIPT");
    char path[4096];
    if (!script) {
        snprintf(path, sizeof path, "%s/scripts/bench_plots.py", DH_SOURCE_DIR);
        script = path;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "datahelix bench: --plot: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        execlp(python, python, script, json, dir, (char *)NULL);
        fprintf(stderr, "datahelix bench: --plot: cannot run %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr,
                "datahelix bench: --plot: %s failed (exit %d); the report is in %s (is "
                "matplotlib installed? make deps)\n",
                script, WIFEXITED(status) ? WEXITSTATUS(status) : -1, json);
        return -1;
    }
    return 0;
}

/* `python -m datahelix.profile SPEC -o DIR [--learn --workers N]` (python/datahelix/profile.py)
 * with $DH_PYTHON_EXE (else python3), the build's package (the python/ folder beside this
 * executable) and the current folder first on PYTHONPATH. Returns 0, or -1 having said why. */
static int profile_python_dataset(const char *spec, const char *dir, bool learn, uint32_t workers)
{
    const char *python = getenv("DH_PYTHON_EXE");
    if (!python || !*python)
        python = "python3";
    char exe[4096], pkg[4200], cwd[4096], path[16384], nworkers[16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(pkg, sizeof pkg, "%s/python", exe);
    struct stat st;
    const char *old = getenv("PYTHONPATH");
    snprintf(path, sizeof path, "%s%s%s%s%s", stat(pkg, &st) == 0 ? pkg : "",
             stat(pkg, &st) == 0 ? ":" : "", getcwd(cwd, sizeof cwd) ? cwd : ".",
             old && *old ? ":" : "", old && *old ? old : "");
    snprintf(nworkers, sizeof nworkers, "%u", workers ? workers : 1);
    fprintf(stderr, "bench: profiling %s into %s (%s)\n", spec, dir,
            learn ? "costs measured over one pass" : "costs from estimate_cost");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "datahelix bench: --python-dataset: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setenv("PYTHONPATH", path, 1);
        if (learn)
            execlp(python, python, "-m", "datahelix.profile", spec, "-o", dir, "--learn",
                   "--workers", nworkers, (char *)NULL);
        else
            execlp(python, python, "-m", "datahelix.profile", spec, "-o", dir, (char *)NULL);
        fprintf(stderr, "datahelix bench: --python-dataset: cannot run %s: %s\n", python,
                strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr,
                "datahelix bench: --python-dataset: `%s -m datahelix.profile %s` failed (exit "
                "%d; its message is above)\n",
                python, spec, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    return 0;
}

/* --sweep-remote: the run once per remote-server count, one table of every point. */
static int run_sweep(dh_bench_options_t *o, const char *list, const char *json)
{
    uint32_t counts[32];
    size_t n = 0;
    const char *at = list;
    while (*at) {
        char *end = NULL;
        unsigned long v = strtoul(at, &end, 10);
        if (end == at || v > 128 || n == 32 || (*end && *end != ',')) {
            fprintf(stderr,
                    "datahelix bench: --sweep-remote: expected up to 32 counts in [0, 128] "
                    "separated by commas, got '%s'\n",
                    list);
            return 2;
        }
        counts[n++] = (uint32_t)v;
        at = *end ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "datahelix bench: --sweep-remote: no counts given\n");
        return 2;
    }
    FILE *f = NULL;
    if (json && !(f = fopen(json, "w"))) {
        fprintf(stderr, "datahelix bench: cannot write --json %s: %s\n", json, strerror(errno));
        return 1;
    }
    if (f)
        fprintf(f, "{\"sweep_remote\":[");
    printf("%s, %u ranks x batch %u, %u steps (+%u warm-up), %u local servers, %u cores per "
           "server, links %.3g Gb/s\n",
           o->dataset ? o->dataset : o->mix, o->ranks, o->batch, o->steps, o->warmup,
           o->local_servers, o->cores_per_server, o->link_gbps);
    printf("%-8s %-10s %6s %10s %6s %9s %11s %9s\n", "remote", "system", "cores", "samples/s",
           "miss", "wait p95", "x-node MB/s", "~link use");
    /* One workload for every point: the compute model (a, b) and the miss threshold are
     * sized at the largest count (the balanced regime of the most cores) and kept for the
     * others, so a point differs from another only in its remote servers. */
    size_t big = 0;
    for (size_t i = 1; i < n; i++)
        if (counts[i] > counts[big])
            big = i;
    dh_bench_report_t *reps = calloc(n, sizeof *reps);
    if (!reps) {
        if (f)
            fclose(f);
        return dh_cli_fail("bench", DH_ENOMEM, "out of memory");
    }
    int rc = 0;
    for (size_t j = 0; j < n && rc == 0; j++) {
        size_t i = j == 0 ? big : j <= big ? j - 1 : j;
        o->remote_servers = counts[i];
        rc = dh_bench_run(o, &reps[i]);
        if (rc == 0 && j == 0) { /* the report's a, b and threshold are time-scaled */
            double ts = o->dataset ? 1 : o->time_scale;
            o->compute_auto = 0;
            o->a = reps[i].a / ts;
            o->b = reps[i].b / ts;
            o->compute_scale = 1;
            o->deadline_threshold_s = reps[i].deadline_threshold_s / ts;
        }
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        const dh_bench_report_t *r = &reps[i];
        for (size_t k = 0; k < r->n_systems; k++) {
            const dh_bench_system_result_t *y = &r->systems[k];
            /* bytes that crossed a link per second, against what the links into the training
             * nodes can carry together (one per local server's node). The bytes are the whole
             * run's, warm-up included, and wall_s the measured steps': the run is taken as
             * (warm-up + steps) / steps times as long (steps alike), so this is an estimate */
            double run_s = o->steps ? y->wall_s * (o->warmup + o->steps) / o->steps : 0;
            double mbps = run_s > 0 ? y->cross_node_bytes / run_s / 1e6 : 0;
            double cap = o->link_gbps > 0 ? o->link_gbps * 1e9 / 8 * o->local_servers : 0;
            double use = cap > 0 ? mbps * 1e6 / cap : 0;
            printf("%-8u %-10s %6u %10.1f %5.0f%% %9.3f %11.1f %8.0f%%\n", counts[i], y->name,
                   y->cores, y->throughput_sps, 100 * y->ddl_miss_rate, y->input_wait_p95_s, mbps,
                   100 * use);
            if (f)
                fprintf(f,
                        "%s{\"remote_servers\":%u,\"system\":\"%s\",\"cores\":%u,"
                        "\"throughput_sps\":%.6g,\"ddl_miss_rate\":%.6g,"
                        "\"input_wait_p95_s\":%.6g,\"cross_node_MBps\":%.6g,"
                        "\"ingress_link_use\":%.6g,\"balance\":%.6g,\"efficiency\":%.6g,"
                        "\"a\":%.6g,\"b\":%.6g}",
                        i || k ? "," : "", counts[i], y->name, y->cores, y->throughput_sps,
                        y->ddl_miss_rate, y->input_wait_p95_s, mbps, use, y->balance, y->efficiency,
                        r->a, r->b);
        }
    }
    for (size_t i = 0; i < n; i++)
        dh_bench_report_clear(&reps[i]);
    free(reps);
    if (rc) {
        if (f)
            fclose(f);
        return dh_cli_fail("bench", rc, "sweep point failed");
    }
    if (f) {
        fprintf(f, "]}\n");
        if (fclose(f) != 0) {
            fprintf(stderr, "datahelix bench: cannot write --json %s\n", json);
            return 1;
        }
        printf("report: %s\n", json);
    }
    return 0;
}

int dh_cmd_bench(int argc, char **argv)
{
    enum {
        O_DATASET = 256,
        O_PIPELINE,
        O_PYDATASET,
        O_COSTS,
        O_SWEEP_REMOTE,
        O_PYDIR,
        O_EMULATE,
        O_MIX,
        O_ROWS,
        O_RANKS,
        O_BATCH,
        O_STEPS,
        O_WARMUP,
        O_SEED,
        O_SYSTEMS,
        O_LOCAL,
        O_REMOTE,
        O_CORES,
        O_NATIVE,
        O_PREFETCH,
        O_FANOUT,
        O_PREFETCH_MAX,
        O_COMPUTE,
        O_CSCALE,
        O_THRESH,
        O_TSCALE,
        O_BSCALE,
        O_LINK,
        O_BIAS,
        O_NOISE,
        O_TNOISE,
        O_REBALANCE,
        O_NO_REBALANCE,
        O_RB_BUFFER,
        O_PLAN_WINDOW,
        O_RB_GAIN,
        O_RB_FANOUT,
        O_JSON,
        O_TRACE,
        O_PLOT
    };
    static const struct option options[] = {
        {"dataset", required_argument, NULL, O_DATASET},
        {"pipeline", required_argument, NULL, O_PIPELINE},
        {"python-dataset", required_argument, NULL, O_PYDATASET},
        {"costs", required_argument, NULL, O_COSTS},
        {"sweep-remote", required_argument, NULL, O_SWEEP_REMOTE},
        {"python-dir", required_argument, NULL, O_PYDIR},
        {"emulate", no_argument, NULL, O_EMULATE},
        {"mix", required_argument, NULL, O_MIX},
        {"rows", required_argument, NULL, O_ROWS},
        {"ranks", required_argument, NULL, O_RANKS},
        {"batch", required_argument, NULL, O_BATCH},
        {"steps", required_argument, NULL, O_STEPS},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"seed", required_argument, NULL, O_SEED},
        {"systems", required_argument, NULL, O_SYSTEMS},
        {"local-servers", required_argument, NULL, O_LOCAL},
        {"remote-servers", required_argument, NULL, O_REMOTE},
        {"cores-per-server", required_argument, NULL, O_CORES},
        {"native-cores", required_argument, NULL, O_NATIVE},
        {"prefetch", required_argument, NULL, O_PREFETCH},
        {"fanout", required_argument, NULL, O_FANOUT},
        {"prefetch-max", required_argument, NULL, O_PREFETCH_MAX},
        {"compute", required_argument, NULL, O_COMPUTE},
        {"compute-scale", required_argument, NULL, O_CSCALE},
        {"deadline-threshold", required_argument, NULL, O_THRESH},
        {"time-scale", required_argument, NULL, O_TSCALE},
        {"bytes-scale", required_argument, NULL, O_BSCALE},
        {"link-gbps", required_argument, NULL, O_LINK},
        {"cost-bias", required_argument, NULL, O_BIAS},
        {"cost-noise", required_argument, NULL, O_NOISE},
        {"token-noise", required_argument, NULL, O_TNOISE},
        {"rebalance", no_argument, NULL, O_REBALANCE},
        {"no-rebalance", no_argument, NULL, O_NO_REBALANCE},
        {"rebalance-buffer", required_argument, NULL, O_RB_BUFFER},
        {"plan-window", required_argument, NULL, O_PLAN_WINDOW},
        {"rebalance-min-gain", required_argument, NULL, O_RB_GAIN},
        {"rebalance-fanout", required_argument, NULL, O_RB_FANOUT},
        {"json", required_argument, NULL, O_JSON},
        {"trace", required_argument, NULL, O_TRACE},
        {"plot", required_argument, NULL, O_PLOT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    dh_bench_options_t o;
    dh_bench_options_default(&o);
    int emulate = 0;
    const char *json = NULL, *plot = NULL;
    const char *pydataset = NULL, *pydir = NULL, *costs = "both", *sweep = NULL;
    char pydir_buf[512], est_dir[600], learn_dir[600], pipe_est[700], pipe_learn[700];
    char plot_json[4096];
    unsigned long long v;
    int opt;
#define U64(name, lo, hi, dst)                                                                     \
    do {                                                                                           \
        if (dh_cli_parse_u64("bench", name, optarg, lo, hi, &v))                                   \
            return 2;                                                                              \
        dst = v;                                                                                   \
    } while (0)
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case O_DATASET:
            o.dataset = optarg;
            break;
        case O_PIPELINE:
            o.pipeline = optarg;
            break;
        case O_PYDATASET:
            pydataset = optarg;
            break;
        case O_PYDIR:
            pydir = optarg;
            break;
        case O_SWEEP_REMOTE:
            sweep = optarg;
            break;
        case O_COSTS:
            if (strcmp(optarg, "estimate") != 0 && strcmp(optarg, "learned") != 0 &&
                strcmp(optarg, "both") != 0) {
                fprintf(stderr,
                        "datahelix bench: --costs must be estimate, learned or both, got '%s'\n",
                        optarg);
                return 2;
            }
            costs = optarg;
            break;
        case O_EMULATE:
            emulate = 1;
            break;
        case O_MIX:
            o.mix = optarg;
            break;
        case O_ROWS:
            U64("--rows", 1, 10000000, o.emulate_rows);
            break;
        case O_RANKS:
            U64("--ranks", 1, 64, o.ranks);
            break;
        case O_BATCH:
            U64("--batch", 1, 4096, o.batch);
            break;
        case O_STEPS:
            U64("--steps", 1, 1000000, o.steps);
            break;
        case O_WARMUP:
            U64("--warmup", 0, 1000000, o.warmup);
            break;
        case O_SEED:
            U64("--seed", 0, ~0ull, o.seed);
            break;
        case O_SYSTEMS:
            o.systems = optarg;
            break;
        case O_LOCAL:
            U64("--local-servers", 1, 128, o.local_servers);
            break;
        case O_REMOTE:
            U64("--remote-servers", 0, 128, o.remote_servers);
            break;
        case O_CORES:
            U64("--cores-per-server", 1, 256, o.cores_per_server);
            break;
        case O_NATIVE:
            U64("--native-cores", 1, 4096, o.native_cores);
            break;
        case O_PREFETCH:
            U64("--prefetch", 1, 256, o.prefetch);
            break;
        case O_FANOUT:
            U64("--fanout", 1, 64, o.fanout);
            break;
        case O_PREFETCH_MAX:
            U64("--prefetch-max", 1, 1024, o.prefetch_max);
            break;
        case O_COMPUTE:
            if (strcmp(optarg, "auto") == 0) {
                o.compute_auto = 1;
            } else {
                char *end = NULL;
                o.a = strtod(optarg, &end);
                if (!end || *end != ',' || (o.b = strtod(end + 1, &end), *end) || o.a < 0 ||
                    o.b < 0) {
                    fprintf(stderr,
                            "datahelix bench: --compute: expected 'auto' or 'A,B' (seconds per "
                            "token, seconds per step), got '%s'\n",
                            optarg);
                    return 2;
                }
                o.compute_auto = 0;
            }
            break;
        case O_CSCALE:
            if (parse_double("--compute-scale", optarg, 1e-9, &o.compute_scale))
                return 2;
            break;
        case O_THRESH:
            if (parse_double("--deadline-threshold", optarg, 1e-9, &o.deadline_threshold_s))
                return 2;
            break;
        case O_TSCALE:
            if (parse_double("--time-scale", optarg, 1e-6, &o.time_scale))
                return 2;
            break;
        case O_BSCALE:
            if (parse_double("--bytes-scale", optarg, 0, &o.bytes_scale))
                return 2;
            break;
        case O_LINK:
            if (parse_double("--link-gbps", optarg, 0, &o.link_gbps))
                return 2;
            break;
        case O_BIAS:
            if (parse_double("--cost-bias", optarg, 0, &o.cost_bias))
                return 2;
            break;
        case O_NOISE:
            if (parse_double("--cost-noise", optarg, 0, &o.cost_noise))
                return 2;
            break;
        case O_TNOISE:
            if (parse_double("--token-noise", optarg, 0, &o.token_noise))
                return 2;
            break;
        case O_REBALANCE:
            o.rebalance = 1;
            break;
        case O_NO_REBALANCE:
            o.rebalance = 0;
            break;
        case O_RB_BUFFER:
            U64("--rebalance-buffer", 1, 1000000, o.rebalance_buffer);
            break;
        case O_PLAN_WINDOW:
            U64("--plan-window", 1, 1024, o.plan_window);
            break;
        case O_RB_GAIN:
            if (parse_double("--rebalance-min-gain", optarg, 0, &o.rebalance_min_gain))
                return 2;
            if (o.rebalance_min_gain > 1) {
                fprintf(stderr,
                        "datahelix bench: --rebalance-min-gain: expected at most 1, got "
                        "'%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_RB_FANOUT:
            if (strcmp(optarg, "batch") == 0)
                o.rebalance_fanout = DH_BENCH_FANOUT_BATCH;
            else if (strcmp(optarg, "auto") == 0)
                o.rebalance_fanout = 0;
            else if (strcmp(optarg, "own") == 0)
                o.rebalance_fanout = DH_BENCH_FANOUT_OWN;
            else
                U64("--rebalance-fanout", 1, 4096, o.rebalance_fanout);
            break;
        case O_JSON:
            json = optarg;
            break;
        case O_TRACE:
            o.trace_path = optarg;
            break;
        case O_PLOT:
            plot = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
#undef U64
    if (dh_cli_no_extra_args("bench", argc, argv, optind))
        return 2;
    if (emulate != (o.mix != NULL)) {
        fprintf(stderr, "datahelix bench: --emulate and --mix go together\n");
        return 2;
    }
    if ((o.dataset != NULL) + emulate + (pydataset != NULL) != 1) {
        fprintf(stderr, "datahelix bench: give one of --dataset DIR, --emulate --mix NAME and "
                        "--python-dataset MODULE:FACTORY\n");
        return 2;
    }
    bool learned_too = false;
    if (pydataset) {
        if (o.pipeline) {
            fprintf(stderr, "datahelix bench: --python-dataset makes its own pipeline; no "
                            "--pipeline\n");
            return 2;
        }
        if (!pydir) {
            snprintf(pydir_buf, sizeof pydir_buf, "/tmp/datahelix-python-dataset-%d",
                     (int)getpid());
            pydir = pydir_buf;
        }
        if (mkdir(pydir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "datahelix bench: --python-dir: cannot make %s: %s\n", pydir,
                    strerror(errno));
            return 1;
        }
        snprintf(est_dir, sizeof est_dir, "%s/estimate", pydir);
        snprintf(learn_dir, sizeof learn_dir, "%s/learned", pydir);
        bool want_est = strcmp(costs, "learned") != 0, want_learn = strcmp(costs, "estimate") != 0;
        uint32_t workers = (o.local_servers + o.remote_servers) * o.cores_per_server;
        if ((want_est && profile_python_dataset(pydataset, est_dir, false, workers)) ||
            (want_learn && profile_python_dataset(pydataset, learn_dir, true, workers)))
            return 1;
        o.dataset = want_est ? est_dir : learn_dir;
        snprintf(pipe_est, sizeof pipe_est, "%s/pipeline.json", o.dataset);
        o.pipeline = pipe_est;
        learned_too = want_est && want_learn;
    }
    if (o.prefetch_max && o.prefetch_max < o.prefetch) {
        fprintf(stderr, "datahelix bench: --prefetch-max %u is below --prefetch %u\n",
                o.prefetch_max, o.prefetch);
        return 2;
    }
    if (plot) {
        if (mkdir(plot, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "datahelix bench: --plot: cannot make %s: %s\n", plot, strerror(errno));
            return 1;
        }
        if (!json) {
            snprintf(plot_json, sizeof plot_json, "%s/bench.json", plot);
            json = plot_json;
        }
    }
    if (!getenv("DH_LOG_LEVEL"))
        dh_log_set_level(DH_LOG_WARN);
    o.progress = progress;
    if (sweep)
        return run_sweep(&o, sweep, json);
    dh_bench_report_t r;
    int rc = dh_bench_run(&o, &r);
    if (rc) {
        dh_bench_report_clear(&r);
        return dh_cli_fail("bench", rc, "benchmark failed");
    }
    printf("%s, %u ranks x batch %u, %u steps (+%u warm-up); compute %.3g s/token + %.3g s "
           "(mean step %.3f s); miss: input wait > %.3f s\n",
           o.dataset ? o.dataset : o.mix, o.ranks, o.batch, o.steps, o.warmup, r.a, r.b,
           r.mean_step_compute_s, r.deadline_threshold_s);
    dh_bench_print_table(stdout, &r);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f || dh_bench_write_json(f, &o, &r) || fclose(f) != 0) {
            fprintf(stderr, "datahelix bench: cannot write --json %s\n", json);
            dh_bench_report_clear(&r);
            return 1;
        }
        printf("report: %s\n", json);
    }
    if (o.trace_path)
        printf("trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o.trace_path);
    if (learned_too) { /* helix again, on the learned costs, under the same compute model */
        dh_bench_options_t o2 = o;
        o2.dataset = learn_dir;
        snprintf(pipe_learn, sizeof pipe_learn, "%s/pipeline.json", learn_dir);
        o2.pipeline = pipe_learn;
        o2.systems = "helix";
        o2.compute_auto = 0;
        o2.a = r.a;
        o2.b = r.b;
        o2.compute_scale = 1;
        o2.deadline_threshold_s = r.deadline_threshold_s;
        o2.trace_path = NULL;
        dh_bench_report_t r2;
        rc = dh_bench_run(&o2, &r2);
        if (rc) {
            dh_bench_report_clear(&r);
            dh_bench_report_clear(&r2);
            return dh_cli_fail("bench", rc, "benchmark on the learned costs failed");
        }
        printf("the same with the costs learned over one pass (%s):\n", learn_dir);
        dh_bench_print_table(stdout, &r2);
        const dh_bench_system_result_t *est = NULL;
        for (size_t i = 0; i < r.n_systems; i++)
            if (strcmp(r.systems[i].name, "helix") == 0)
                est = &r.systems[i];
        if (est && r2.n_systems == 1 && est->throughput_sps > 0)
            printf("helix on learned costs / helix on estimate_cost: %.3fx (%.1f / %.1f "
                   "samples/s, %u cores each)\n",
                   r2.systems[0].throughput_sps / est->throughput_sps, r2.systems[0].throughput_sps,
                   est->throughput_sps, est->cores);
        if (json) {
            char path[4200];
            size_t len = strlen(json);
            snprintf(path, sizeof path, "%.*s.learned.json",
                     (int)(len > 5 && strcmp(json + len - 5, ".json") == 0 ? len - 5 : len), json);
            FILE *f = fopen(path, "w");
            if (!f || dh_bench_write_json(f, &o2, &r2) || fclose(f) != 0) {
                fprintf(stderr, "datahelix bench: cannot write %s\n", path);
                dh_bench_report_clear(&r);
                dh_bench_report_clear(&r2);
                return 1;
            }
            printf("report (learned costs): %s\n", path);
        }
        dh_bench_report_clear(&r2);
    }
    dh_bench_report_clear(&r);
    if (plot && run_plots(json, plot))
        return 1;
    return 0;
}
