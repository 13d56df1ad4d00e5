/* Tests of the training-loop benchmark harness (bench/train_bench.h): every system runs to
 * the end on a tiny emulated cluster, the metrics are within their definitions, the JSON
 * report and the trace are well formed, and bad options name the option. Timings and
 * ratios are not asserted: that is the benchmark's job, not a test's. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/error.h"
#include "bench/train_bench.h"
#include "runtime/cluster.h"

static void tiny(dh_bench_options_t *o)
{
    dh_bench_options_default(o);
    o->mix = "kinetics-mixed";
    o->emulate_rows = 256;
    o->ranks = 2;
    o->batch = 2;
    o->steps = 6;
    o->warmup = 2;
    o->local_servers = 2;
    o->remote_servers = 1;
    o->cores_per_server = 2;
    o->prefetch = 4;
    o->time_scale = 0.02; /* sample costs of a few ms */
    static char dir[512]; /* dh_test_path's buffer is reused */
    snprintf(dir, sizeof dir, "%s", dh_test_path(""));
    o->work_dir = dir;
}

static void bench_runs_every_system_within_definitions(void **state)
{
    dh_bench_options_t o;
    tiny(&o);
    o.systems = "native,native-8,pool,helix,base,transport,prefetch-token,cost-ddl";
    static char trace[512];
    snprintf(trace, sizeof trace, "%s", dh_test_path("trace.json"));
    o.trace_path = trace;
    dh_bench_report_t r;
    int rc = dh_bench_run(&o, &r);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(r.n_systems, 8);
    static const unsigned cores[] = {4, 8, 6, 6, 6, 6, 6, 6};
    for (size_t i = 0; i < r.n_systems; i++) {
        const dh_bench_system_result_t *s = &r.systems[i];
        assert_int_equal(s->cores, cores[i]);
        assert_true(s->throughput_sps > 0);
        assert_true(s->ideal_sps > 0);
        /* the bound holds up to the clock's and the sleeps' slack */
        assert_true(s->efficiency > 0 && s->efficiency < 1.3);
        assert_true(s->balance > 0 && s->balance <= 1.0 + 1e-9);
        assert_true(s->input_wait_p50_s <= s->input_wait_p95_s);
        assert_true(s->input_wait_p95_s <= s->input_wait_p99_s);
        assert_true(s->ddl_miss_rate >= 0 && s->ddl_miss_rate <= 1);
        assert_true(s->cpu_work_s > 0);
    }
    /* native never leaves its node; the shared pool uses the sidecar */
    assert_true(r.systems[0].cross_ds_bytes == 0);

    FILE *f = fopen(dh_test_path("report.json"), "w");
    assert_non_null(f);
    assert_int_equal(dh_bench_write_json(f, &o, &r), 0);
    fclose(f);
    json_error_t err;
    json_t *j = json_load_file(dh_test_path("report.json"), 0, &err);
    if (!j)
        print_error("report: %s (line %d)\n", err.text, err.line);
    assert_non_null(j);
    json_t *systems = json_object_get(j, "systems");
    assert_int_equal(json_object_size(systems), 8);
    static const char *keys[] = {
        "throughput_sps",        "input_wait_p50_s", "input_wait_p95_s",    "input_wait_p99_s",
        "batch_ready_p95_s",     "ddl_miss_rate",    "barrier_wait_mean_s", "cross_ds_bytes",
        "sched_us_per_decision", "ideal_sps",        "efficiency",          "balance"};
    json_t *helix = json_object_get(systems, "helix");
    assert_non_null(helix);
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        assert_true(json_is_number(json_object_get(helix, keys[k])));
    json_t *steps = json_object_get(helix, "rank_step_s");
    assert_int_equal(json_array_size(steps), 2);
    assert_int_equal(json_array_size(json_array_get(steps, 0)), 6);
    assert_true(json_is_object(json_object_get(j, "config")));
    json_decref(j);

    json_t *t = json_load_file(o.trace_path, 0, &err);
    if (!t)
        print_error("trace: %s (line %d)\n", err.text, err.line);
    assert_non_null(t);
    json_t *ev = json_object_get(t, "traceEvents");
    size_t computes = 0, tasks = 0, i;
    json_t *e;
    json_array_foreach(ev, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && strcmp(name, "compute") == 0)
            computes++;
        if (name && strncmp(name, "rank ", 5) == 0 &&
            strcmp(json_string_value(json_object_get(e, "ph")), "X") == 0)
            tasks++;
    }
    assert_int_equal(computes, 8 * 2 * 8); /* systems x ranks x (warmup + steps) */
    assert_true(tasks > 0);
    json_decref(t);
    dh_bench_report_clear(&r);
    cl_assert_no_leftovers();
}

static void bench_rejects_bad_options_by_name(void **state)
{
    dh_bench_options_t o;
    dh_bench_report_t r;
    tiny(&o);
    o.systems = "native,ray";
    assert_int_equal(dh_bench_run(&o, &r), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "'ray'"));
    dh_bench_report_clear(&r);
    tiny(&o);
    o.systems = "native-1";
    assert_int_equal(dh_bench_run(&o, &r), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "native-N"));
    dh_bench_report_clear(&r);
    tiny(&o);
    o.dataset = "/nonexistent";
    assert_int_equal(dh_bench_run(&o, &r), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "--dataset"));
    tiny(&o);
    o.mix = NULL;
    o.dataset = "/nonexistent-datahelix-dir";
    assert_true(dh_bench_run(&o, &r) != 0);
    assert_non_null(strstr(dh_last_error(), "/nonexistent-datahelix-dir/profiles.jsonl"));
    dh_bench_report_clear(&r);
}

static void run_cli(const char *name, char *const argv[])
{
    cl_proc_t p;
    cl_spawn(&p, name, argv);
    cl_expect_exit(&p, 0, 240000);
}

static void assert_png(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        print_error("no plot %s\n", path);
    assert_non_null(f);
    unsigned char magic[8] = {0};
    assert_int_equal(fread(magic, 1, 8, f), 8);
    fclose(f);
    assert_memory_equal(magic, "\x89PNG\r\n\x1a\n", 8);
}

/* The command end to end in dataset mode (real decode of a few synthesised clips), with
 * --plot: the report and both PNGs are written. */
static void bench_cli_real_decode_with_plots(void **state)
{
    char dir[512], manifest[600], profiles[600], cache[600], plots[600], path[700];
    snprintf(dir, sizeof dir, "%s", dh_test_path("video"));
    snprintf(manifest, sizeof manifest, "%s/manifest.jsonl", dir);
    snprintf(profiles, sizeof profiles, "%s/profiles.jsonl", dir);
    snprintf(cache, sizeof cache, "%s/calibration.json", dir);
    snprintf(plots, sizeof plots, "%s/plots", dir);
    char *synth[] = {"datahelix", "synth", "--out",  dir, "--mix", "kinetics-s",
                     "--count",   "8",     "--seed", "4", NULL};
    run_cli("synth", synth);
    setenv("DH_CALIBRATION_CACHE", cache, 1);
    char *probe[] = {"datahelix", "probe", manifest, "-o", profiles, NULL};
    run_cli("probe", probe);
    char *bench[] = {"datahelix",
                     "bench",
                     "--dataset",
                     dir,
                     "--ranks",
                     "2",
                     "--batch",
                     "2",
                     "--steps",
                     "2",
                     "--warmup",
                     "1",
                     "--local-servers",
                     "1",
                     "--remote-servers",
                     "0",
                     "--cores-per-server",
                     "2",
                     "--systems",
                     "native,pool,helix",
                     "--plot",
                     plots,
                     NULL};
    run_cli("bench", bench);
    snprintf(path, sizeof path, "%s/bench.json", plots);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    assert_non_null(j);
    assert_int_equal(json_object_size(json_object_get(j, "systems")), 3);
    json_decref(j);
    snprintf(path, sizeof path, "%s/step_time_p95.png", plots);
    assert_png(path);
    snprintf(path, sizeof path, "%s/systems.png", plots);
    assert_png(path);
    cl_assert_no_leftovers();
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(bench_cli_real_decode_with_plots),
    cmocka_unit_test(bench_runs_every_system_within_definitions),
    cmocka_unit_test(bench_rejects_bad_options_by_name),
};
DH_TEST_MAIN(tests)
