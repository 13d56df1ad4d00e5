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
#include "bench/experiment.h"
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
        "bench's own:\n"
        "  --emulate             the synthetic pipeline: each sample sleeps its CPU seconds\n"
        "                        on a worker (one machine emulates many virtual cores)\n"
        "  --python-dataset MODULE:FACTORY\n"
        "                        a Python map-style dataset (FACTORY() returns it), run in\n"
        "                        the DataServers' worker processes: `python -m\n"
        "                        datahelix.profile` profiles it into --python-dir, with the\n"
        "                        costs of its estimate_cost and/or measured over one pass\n"
        "                        (--costs); with both, helix runs again on the learned\n"
        "                        costs under the same compute model, and the two are\n"
        "                        compared (docs/benchmarks.md, \"A Python dataset\")\n"
        "  --costs estimate|learned|both  with --python-dataset (both)\n"
        "  --python-dir DIR      with --python-dataset: where the profiles go\n"
        "                        (default /tmp/datahelix-python-dataset-PID)\n"
        "  --sweep-remote N,N,...  the paper's remote-server sweep: the whole run once per\n"
        "                        --remote-servers value (e.g. 0,8,16,24), a table of each\n"
        "                        system's throughput, miss rate, input wait p95 and\n"
        "                        cross-node traffic per point; --json gets them all\n"
        "  --json FILE           the report: {\"config\":{...},\"systems\":{NAME:{\n"
        "                        \"throughput_sps\",\"input_wait_p50_s\",\"input_wait_p95_s\",\n"
        "                        \"input_wait_p99_s\",\"batch_ready_p95_s\",\"ddl_miss_rate\",\n"
        "                        \"barrier_wait_mean_s\",\"cross_node_bytes\",\"copy_bytes\",\n"
        "                        \"sched_us_per_decision\",\"ideal_sps\",\"efficiency\",\n"
        "                        \"balance\",\"cores\",\"cpu_work_s\",\"rebalance_rounds\",\n"
        "                        \"rebalance_applied\",\"rebalance_kept_by_gate\",\n"
        "                        \"rebalance_moved_samples\",\"rebalance_moved_parts\",\n"
        "                        \"rebalance_bytes\",\"rebalance_s_p95\",...}}}\n"
        "  --plot DIR            PNG plots in DIR (scripts/bench_plots.py, with matplotlib,\n"
        "                        run by $DH_PYTHON_EXE, default python3):\n"
        "                        step_time_p95.png (per rank, per system) and\n"
        "                        systems.png (throughput, input-wait p95, miss rate); the\n"
        "                        report goes to DIR/bench.json unless --json is given\n"
        "  -h, --help            show this help\n"
        "\n"
        "the experiment's options (bench/experiment.c; `simulate` takes those not marked\n"
        "bench-only in docs/benchmarks.md, with the same meaning, defaults and checks):\n"
        "\n");
    dh_experiment_help(out, DH_EXPERIMENT_BENCH);
    fprintf(out, "\n"
                 "The table goes to standard output, progress to standard error. Exit status: 0,\n"
                 "1 failure, 2 usage error.\n");
}

static void progress(const char *line, void *ctx)
{
    (void)ctx;
    fprintf(stderr, "bench: %s\n", line);
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
    enum { O_PYDATASET = 256, O_COSTS, O_SWEEP_REMOTE, O_PYDIR, O_EMULATE, O_JSON, O_PLOT };
    struct option options[80] = {
        {"python-dataset", required_argument, NULL, O_PYDATASET},
        {"costs", required_argument, NULL, O_COSTS},
        {"sweep-remote", required_argument, NULL, O_SWEEP_REMOTE},
        {"python-dir", required_argument, NULL, O_PYDIR},
        {"emulate", no_argument, NULL, O_EMULATE},
        {"json", required_argument, NULL, O_JSON},
        {"plot", required_argument, NULL, O_PLOT},
        {"help", no_argument, NULL, 'h'},
    };
    dh_cli_experiment_longopts(DH_EXPERIMENT_BENCH, options, 8, sizeof options / sizeof options[0]);
    dh_bench_options_t o;
    dh_bench_options_default(&o);
    int emulate = 0;
    const char *json = NULL, *plot = NULL;
    const char *pydataset = NULL, *pydir = NULL, *costs = "both", *sweep = NULL;
    char pydir_buf[512], est_dir[600], learn_dir[600], pipe_est[700], pipe_learn[700];
    char plot_json[4096];
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
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
        case O_JSON:
            json = optarg;
            break;
        case O_PLOT:
            plot = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default: {
            int set = dh_cli_experiment_option("bench", DH_EXPERIMENT_BENCH, opt, optarg, &o);
            if (set < 0)
                return 2;
            if (set == 0) {
                usage(stderr);
                return 2;
            }
            break;
        }
        }
    }
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
