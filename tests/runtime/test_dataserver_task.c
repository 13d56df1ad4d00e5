/* Tests of a task's measurements (dataserver_task.c): each sample's CPU seconds (synthetic: the
 * cost it slept; video: its decode's CPU time) and, for video, the timed read of its input that the
 * DataServer's heartbeat turns into a read bandwidth for C_io. */
#include <string.h>
#include <sys/stat.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/synth.h"
#include "runtime/rt.h"

static int heap_alloc(void *ctx, size_t nbytes, void **data, dh_shm_handle_t *handle)
{
    memset(handle, 0, sizeof *handle);
    *data = dh_malloc(nbytes);
    return *data ? 0 : DH_ENOMEM;
}

static void heap_release(void *ctx, void *data, const dh_shm_handle_t *handle)
{
    dh_free(data);
}

static void free_outputs(dh__rt_result_t *r)
{
    for (size_t t = 0; t < r->n_tensors; t++)
        dh_free(r->tensors[t].tensor.data);
    dh__rt_result_clear(r);
}

/* The python pipeline's spec (dataserver_pyworker.c runs it; tests/python/test_python_dataset.py
 * runs it end to end): its fields, and each refusal names the field. */
static void task_python_spec_parses_and_refuses_what_it_cannot_run(void **state)
{
    dh__rt_pipeline_t p;
    assert_int_equal(
        dh__rt_pipeline_load("{\"type\":\"python\",\"dataset\":\"pkg.mod:make\","
                             "\"python\":\"/usr/bin/python3\",\"path\":[\"/a\",\"/b\"],"
                             "\"seed\":7}",
                             NULL, &p),
        0);
    assert_true(p.python);
    assert_false(p.synthetic);
    assert_string_equal(p.py_dataset, "pkg.mod:make");
    assert_string_equal(p.py_exe, "/usr/bin/python3");
    assert_string_equal(p.py_path, "/a:/b");
    assert_int_equal(p.py_seed, 7);
    assert_true(p.sample_timeout_s == 300); /* the default */
    assert_int_equal(
        dh__rt_pipeline_load("{\"type\":\"python\",\"dataset\":\"m:f\",\"sample_timeout\":2.5}",
                             NULL, &p),
        0);
    assert_true(p.sample_timeout_s == 2.5);
    /* a video spec has it too (the DataServer's deadline, not the decoder's field) */
    assert_int_equal(dh__rt_pipeline_load("{\"frames\":4,\"sample_timeout\":1.5}", NULL, &p), 0);
    assert_true(p.sample_timeout_s == 1.5);
    assert_int_equal(p.video.frames, 4);
    assert_int_equal(dh__rt_pipeline_load("{\"frames\":4}", NULL, &p), 0);
    assert_true(p.sample_timeout_s == 300);
    static const struct {
        const char *json, *says;
    } bad[] = {
        {"{\"type\":\"python\"}", "needs 'dataset'"},
        {"{\"type\":\"python\",\"dataset\":\"\"}", "'dataset'"},
        {"{\"type\":\"python\",\"dataset\":\"m:f\",\"path\":[\"/a:b\"]}", "'path'"},
        {"{\"type\":\"python\",\"dataset\":\"m:f\",\"path\":\"/a\"}", "'path'"},
        {"{\"type\":\"python\",\"dataset\":\"m:f\",\"seed\":-1}", "'seed'"},
        {"{\"type\":\"python\",\"dataset\":\"m:f\",\"sample_timeout\":-1}", "'sample_timeout'"},
        {"{\"type\":\"python\",\"dataset\":\"m:f\",\"sample_timeout\":\"5\"}", "'sample_timeout'"},
        {"{\"type\":\"python\",\"dataset\":\"m:f\",\"workers\":2}", "unknown field"},
        {"{\"type\":\"pythn\"}", "\"python\""},
        {"{\"type\":\"video\",\"sample_timeout\":-2}", "'sample_timeout'"},
        {"{\"sample_timeout\":true}", "'sample_timeout'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(dh__rt_pipeline_load(bad[i].json, NULL, &p), DH_ESCHEMA);
        assert_non_null(strstr(dh_last_error(), bad[i].says));
    }
}

/* Sleep emulation, no noise: each sample's measurement is its cost x cpu_scale exactly,
 * and the request's is their sum; nothing is read. */
static void task_synthetic_measures_each_sample(void **state)
{
    dh__rt_pipeline_t p;
    assert_int_equal(dh__rt_pipeline_load("{\"type\":\"synthetic\",\"cost\":\"sleep\","
                                          "\"cpu_scale\":0.01,\"bytes_scale\":0.001}",
                                          NULL, &p),
                     0);
    dh__rt_worker_t *w = NULL;
    assert_int_equal(dh__rt_worker_new(&w, &p), 0);
    dh_wire_sample_t samples[2] = {
        {.id = "a", .uri = "synthetic://a", .key = "k", .cpu_s = 0.5, .out_bytes = 1000},
        {.id = "b", .uri = "synthetic://b", .key = "k", .cpu_s = 1.5, .out_bytes = 1000}};
    dh__rt_result_t r;
    assert_int_equal(dh__rt_execute(w, samples, 2, heap_alloc, heap_release, NULL, &r), 0);
    assert_non_null(r.sample_cpu_s);
    assert_close(r.sample_cpu_s[0], 0.005, 1e-12);
    assert_close(r.sample_cpu_s[1], 0.015, 1e-12);
    assert_close(r.cpu_s, 0.02, 1e-12);
    assert_true(r.read_s == 0 && r.read_bytes == 0);
    free_outputs(&r);
    dh__rt_worker_destroy(&w);
}

/* A real clip: its bytes are read (and timed) once, its decode's CPU time is its own
 * measurement, and the request's total (with the collate) is at least that. */
static void task_video_times_the_read_and_the_decode(void **state)
{
    char path[512];
    snprintf(path, sizeof path, "%s", dh_test_path("clip.mp4"));
    dh_synth_clip_t clip = {.width = 160, .height = 120, .fps = 25, .duration_s = 2, .seed = 7};
    assert_int_equal(dh_synth_write_clip(path, &clip), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    dh__rt_pipeline_t p;
    assert_int_equal(dh__rt_pipeline_load(NULL, NULL, &p), 0);
    dh__rt_worker_t *w = NULL;
    assert_int_equal(dh__rt_worker_new(&w, &p), 0);
    dh_wire_sample_t samples[2] = {{.id = "clip", .uri = path, .key = "k"},
                                   {.id = "missing", .uri = "/nonexistent/x.mp4", .key = "k"}};
    dh__rt_result_t r;
    int rc = dh__rt_execute(w, samples, 2, heap_alloc, heap_release, NULL, &r);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(r.samples[0].status, 0);
    assert_true(r.samples[1].status != 0); /* the decoder reports the missing file */
    assert_int_equal(r.read_bytes, (uint64_t)st.st_size);
    assert_true(r.read_s > 0);
    assert_true(r.sample_cpu_s[0] > 0);
    assert_true(r.cpu_s >= r.sample_cpu_s[0]);
    free_outputs(&r);
    dh__rt_worker_destroy(&w);
}

/* FFmpeg's interrupt callback (decode.c) is set from the worker's deadline: a deadline already
 * past (sample_timeout 1 ns) stops FFmpeg's first read, and the sample's failure says it ran
 * past sample_timeout (the thread was not abandoned: no DataServer loop watches it here). */
static void task_video_decode_stops_at_the_deadline_by_itself(void **state)
{
    char path[512];
    snprintf(path, sizeof path, "%s", dh_test_path("clip.mp4"));
    dh_synth_clip_t clip = {.width = 160, .height = 120, .fps = 25, .duration_s = 2, .seed = 7};
    assert_int_equal(dh_synth_write_clip(path, &clip), 0);
    dh__rt_pipeline_t p;
    assert_int_equal(dh__rt_pipeline_load("{\"sample_timeout\":1e-9}", NULL, &p), 0);
    dh__rt_worker_t *w = NULL;
    assert_int_equal(dh__rt_worker_new(&w, &p), 0);
    dh__rt_watch_t *watch = dh__rt_watch_new();
    assert_non_null(watch);
    dh__rt_worker_watch(w, watch, p.sample_timeout_s);
    dh_wire_sample_t samples[1] = {{.id = "clip", .uri = path, .key = "k"}};
    dh__rt_result_t r;
    assert_int_equal(dh__rt_execute(w, samples, 1, heap_alloc, heap_release, NULL, &r), 0);
    assert_int_equal(r.failed, 1);
    print_message("%s\n", r.samples[0].error);
    char want[700];
    snprintf(want, sizeof want, "sample 'clip' (%s): decode ran past sample_timeout 1e-09 s", path);
    assert_non_null(strstr(r.samples[0].error, want));
    assert_non_null(strstr(r.samples[0].error, "Immediate exit requested")); /* AVERROR_EXIT */
    free_outputs(&r);
    /* without the deadline the same worker decodes it */
    dh__rt_worker_watch(w, watch, 300);
    assert_int_equal(dh__rt_execute(w, samples, 1, heap_alloc, heap_release, NULL, &r), 0);
    assert_int_equal(r.failed, 0);
    free_outputs(&r);
    dh__rt_worker_destroy(&w);
    dh__rt_watch_unref(watch);
    dh__rt_watch_unref(watch);
}

/* A DataServer's pipeline spec of each type, parsed with each allocation failing in turn: out
 * of memory is DH_ENOMEM, never a syntax error (jansson reports its own as one). */
static int load_specs(void *ctx)
{
    static const char *const specs[] = {
        "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}",
        "{\"type\":\"video\",\"frames\":8,\"height\":64,\"width\":64}",
        "{\"type\":\"python\",\"dataset\":\"m:f\",\"path\":[\"/a\",\"/b\"]}"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        dh__rt_pipeline_t p;
        int rc = dh__rt_pipeline_load(specs[i], NULL, &p);
        if (rc)
            return rc;
    }
    return 0;
}

static void task_spec_survives_each_allocation_failure(void **state)
{
    assert_true(dh_test_each_allocation_failure(load_specs, NULL) > 10);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(task_synthetic_measures_each_sample),
    cmocka_unit_test(task_python_spec_parses_and_refuses_what_it_cannot_run),
    cmocka_unit_test(task_video_times_the_read_and_the_decode),
    cmocka_unit_test(task_video_decode_stops_at_the_deadline_by_itself),
    cmocka_unit_test(task_spec_survives_each_allocation_failure),
};
DH_TEST_MAIN(tests)
