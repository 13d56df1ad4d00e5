/* Tests of the python pipeline's worker process driver (dataserver_pyworker.c) through
 * dh__rt_execute, with a real worker process (the build's datahelix package,
 * tests/python/pydatasets.py): a __getitem__ that never returns, past sample_timeout; the
 * numbered fault sites of the worker's start, send and receive; and the checks of the worker
 * process's messages (dh__py_msg_parse, dh__py_take_alloc), with no process. The loader's
 * end to end tests are in tests/python/test_python_dataset.py. */
#include <errno.h>
#include <libgen.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "runtime/dataserver_pyworker.h"
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

static int add_sanitizer(struct dl_phdr_info *info, size_t size, void *preload)
{
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    if (strncmp(base, "libasan.so", 10) == 0 || strncmp(base, "libubsan.so", 11) == 0 ||
        strncmp(base, "libtsan.so", 10) == 0) {
        size_t used = strlen(preload);
        snprintf((char *)preload + used, 4096 - used, "%s%s", used ? " " : "", name);
    }
    return 0;
}

/* In a sanitizer build the worker process (an uninstrumented python) imports the build's
 * instrumented extension: it needs the sanitizer runtimes preloaded (as `make test-asan`
 * does for pytest), and no leak report on the interpreter itself. Nothing in other builds.
 * False under ThreadSanitizer (no python runs under it here: `make test-tsan` builds no
 * package). */
static bool preload_sanitizers_for_children(void)
{
    static char preload[4096];
    preload[0] = '\0';
    dl_iterate_phdr(add_sanitizer, preload);
    if (strstr(preload, "libtsan"))
        return false;
    if (preload[0]) {
        setenv("LD_PRELOAD", preload, 1);
        setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    }
    return true;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sample '2' hangs in __getitem__: with sample_timeout 1 s it fails, named with the call and
 * the time, within a bounded time; its batch mates are delivered (run again in a new
 * process), and the next task runs in the worker as before. */
static void pyworker_a_hanging_sample_fails_and_the_worker_goes_on(void **state)
{
    const char *cli = getenv("DH_CLI"); /* BUILD/datahelix: the package is BUILD/python */
    assert_non_null(cli);
    char build[1024], spec[4096], worker[1100];
    snprintf(build, sizeof build, "%s", cli);
    snprintf(worker, sizeof worker, "%s/python/datahelix/_worker.py", dirname(build));
    if (!preload_sanitizers_for_children() || access(worker, R_OK) != 0) {
        print_message("skipped: no python package in this build (%s), or ThreadSanitizer\n",
                      worker);
        skip();
    }
    snprintf(spec, sizeof spec,
             "{\"type\":\"python\",\"dataset\":\"pydatasets:make_hanging_clips\","
             "\"path\":[\"%s/tests/python\",\"%s/python\"],\"sample_timeout\":1}",
             DH_SOURCE_DIR, build);
    dh__rt_pipeline_t p;
    assert_int_equal(dh__rt_pipeline_load(spec, NULL, &p), 0);
    dh__rt_worker_t *w = NULL;
    assert_int_equal(dh__rt_worker_new(&w, &p), 0);
    dh_wire_sample_t samples[3] = {{.id = "1", .uri = "index:1", .key = "python"},
                                   {.id = "2", .uri = "index:2", .key = "python"},
                                   {.id = "3", .uri = "index:3", .key = "python"}};
    dh__rt_result_t r;
    double t0 = now_s();
    int rc = dh__rt_execute(w, samples, 3, heap_alloc, heap_release, NULL, &r);
    if (rc)
        print_error("%s\n", dh_last_error());
    assert_int_equal(rc, 0);
    assert_true(now_s() - t0 < 15);
    assert_int_equal(r.failed, 1);
    assert_int_equal(r.samples[0].status, 0);
    assert_int_equal(r.samples[2].status, 0);
    assert_int_equal(r.samples[1].status, DH_EDATASET);
    assert_non_null(r.samples[1].error);
    print_message("%s\n", r.samples[1].error);
    assert_non_null(strstr(r.samples[1].error, "sample '2' (dataset[2]): __getitem__ ran past "
                                               "sample_timeout (1 s): no answer after 1."));
    assert_non_null(strstr(r.samples[1].error, "was killed"));
    assert_true(r.n_tensors > 0);
    free_outputs(&r);
    dh_wire_sample_t next[2] = {{.id = "4", .uri = "index:4", .key = "python"},
                                {.id = "5", .uri = "index:5", .key = "python"}};
    assert_int_equal(dh__rt_execute(w, next, 2, heap_alloc, heap_release, NULL, &r), 0);
    assert_int_equal(r.failed, 0);
    free_outputs(&r);
    dh__rt_worker_destroy(&w);
}

/* ---- numbered fault sites (a faults build; skipped otherwise) ----------------------- */

/* The python pipeline of pydatasets:make_clips in this build, or skip(). */
static void clips_pipeline(dh__rt_pipeline_t *p)
{
    const char *cli = getenv("DH_CLI");
    assert_non_null(cli);
    char build[1024], spec[4096], worker[1100];
    snprintf(build, sizeof build, "%s", cli);
    snprintf(worker, sizeof worker, "%s/python/datahelix/_worker.py", dirname(build));
    if (!dh_fault_enabled() || !preload_sanitizers_for_children() || access(worker, R_OK) != 0)
        skip();
    snprintf(spec, sizeof spec,
             "{\"type\":\"python\",\"dataset\":\"pydatasets:make_clips\","
             "\"path\":[\"%s/tests/python\",\"%s/python\"]}",
             DH_SOURCE_DIR, build);
    assert_int_equal(dh__rt_pipeline_load(spec, NULL, p), 0);
}

/* Two samples run in the worker; both delivered. */
static int run_two(dh__rt_worker_t *w)
{
    dh_wire_sample_t samples[2] = {{.id = "1", .uri = "index:1", .key = "python"},
                                   {.id = "3", .uri = "index:3", .key = "python"}};
    dh__rt_result_t r;
    int rc = dh__rt_execute(w, samples, 2, heap_alloc, heap_release, NULL, &r);
    if (rc)
        return rc;
    assert_int_equal(r.failed, 0);
    assert_int_equal(r.samples[0].status, 0);
    assert_int_equal(r.samples[1].status, 0);
    assert_true(r.n_tensors > 0);
    free_outputs(&r);
    return 0;
}

static int run_two_in(void *ctx)
{
    return run_two(ctx);
}

/* A worker made, its task run, the worker ended. When its process cannot be started
 * (posix_spawnp EAGAIN), the task fails with an error naming the command; no socket is
 * left open and no child is left behind. */
static int start_run_end(void *ctx)
{
    dh__rt_worker_t *w = NULL;
    assert_int_equal(dh__rt_worker_new(&w, ctx), 0);
    int rc = run_two(w);
    if (rc)
        assert_int_equal(rc, -EAGAIN);
    dh__rt_worker_destroy(&w);
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1); /* every child reaped */
    return rc;
}

static void pyworker_spawn_failure_fails_the_task_cleanly(void **state)
{
    dh__rt_pipeline_t p;
    clips_pipeline(&p);
    assert_int_equal(dh_test_each_fault(DH_FAULT_PY_SPAWN,
                                        "cannot start the Python worker process '", start_run_end,
                                        &p),
                     1);
}

/* A send to, or a receive from, the worker's process that fails as when it died (EPIPE,
 * ECONNRESET), at every message of a task: the process is ended and a new one runs the task
 * again, which then delivers every sample; the socket of the old one is closed (the sweep
 * counts fds) and its process reaped; the worker goes on. */
static void sweep_worker_channel(int site)
{
    dh__rt_pipeline_t p;
    clips_pipeline(&p);
    dh__rt_worker_t *w = NULL;
    assert_int_equal(dh__rt_worker_new(&w, &p), 0);
    assert_int_equal(run_two(w), 0); /* the process started, its scratch made */
    long hits = dh_test_each_fault(site, NULL, run_two_in, w);
    assert_true(hits >= 2);
    dh__rt_worker_destroy(&w);
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
}

static void pyworker_send_failure_restarts_the_process(void **state)
{
    sweep_worker_channel(DH_FAULT_PY_SEND);
}

static void pyworker_recv_failure_restarts_the_process(void **state)
{
    sweep_worker_channel(DH_FAULT_PY_RECV);
}

/* ---- the process's messages, parsed with no process ---- */

static int parse(const char *text, json_t **msg)
{
    return dh__py_msg_parse(text, strlen(text), 7, 1234, msg);
}

/* An alloc message for n samples (a result with n entries), through parse and take_alloc. */
static int take_alloc(const char *text, uint32_t n, dh__rt_result_t *r)
{
    memset(r, 0, sizeof *r);
    r->n_samples = n;
    r->samples = dh_calloc(n ? n : 1, sizeof *r->samples);
    r->sample_cpu_s = dh_calloc(n ? n : 1, sizeof *r->sample_cpu_s);
    assert_non_null(r->samples);
    assert_non_null(r->sample_cpu_s);
    json_t *msg = NULL;
    assert_int_equal(parse(text, &msg), 0);
    int rc = dh__py_take_alloc(msg, 7, r);
    json_decref(msg);
    return rc;
}

#define TWO_SAMPLES "\"samples\":[{\"tokens\":3},{\"error\":\"bad\"}]"
#define TENSOR(shape) "\"tensors\":[{\"name\":\"x\",\"dtype\":\"uint8\",\"shape\":" shape "}]"

/* dh__py_msg_parse takes a JSON object with a string "op" and nothing else; take_alloc
 * takes exactly n_samples results, at most DH_TENSOR_MAX_DIMS dimensions and at most 2^40
 * bytes an array (the messages a broken or hostile worker process could send). */
static void pyworker_messages_are_checked(void **state)
{
    (void)state;
    json_t *msg = NULL;
    static const char *const bad[] = {
        "", "not json", "[\"op\"]", "{\"op\":1}", "{\"what\":\"alloc\"}", "{\"op\":null}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg = (json_t *)1;
        assert_int_equal(parse(bad[i], &msg), DH_EPARSE);
        assert_null(msg);
        assert_non_null(strstr(dh_last_error(), "Python worker 7 (pid 1234): malformed"));
    }
    assert_int_equal(parse("{\"op\":\"done\"}", &msg), 0);
    assert_string_equal(json_string_value(json_object_get(msg, "op")), "done");
    json_decref(msg);

    dh__rt_result_t r;
    long live = dh_alloc_live();
    assert_int_equal(take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[2,3]") "}", 2, &r),
                     0);
    assert_int_equal(r.failed, 1);
    assert_int_equal(r.samples[0].tokens, 3);
    assert_int_equal(r.samples[1].status, DH_EDATASET);
    assert_string_equal(r.samples[1].error, "bad");
    assert_int_equal(r.n_tensors, 1);
    assert_int_equal(r.tensors[0].tensor.ndim, 2);
    assert_int_equal(r.tensors[0].tensor.nbytes, 6);
    dh__rt_result_clear(&r);
    /* one sample result too few, or too many */
    assert_int_equal(take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[1]") "}", 3, &r),
                     DH_EPARSE);
    dh__rt_result_clear(&r);
    assert_int_equal(take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[1]") "}", 1, &r),
                     DH_EPARSE);
    dh__rt_result_clear(&r);
    /* DH_TENSOR_MAX_DIMS (6) dimensions, and one more */
    assert_int_equal(
        take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[1,1,1,1,1,2]") "}", 2, &r), 0);
    assert_int_equal(r.tensors[0].tensor.ndim, 6);
    dh__rt_result_clear(&r);
    assert_int_equal(
        take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[1,1,1,1,1,1,2]") "}", 2, &r),
        DH_EDATASET);
    dh__rt_result_clear(&r);
    /* 2^40 bytes pass the parse (no buffer yet), 2^41 do not; nor does a negative size */
    assert_int_equal(
        take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[1048576,1048576]") "}", 2, &r), 0);
    dh__rt_result_clear(&r);
    assert_int_equal(
        take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[1048576,2097152]") "}", 2, &r),
        DH_EDATASET);
    assert_non_null(strstr(dh_last_error(), "is over"));
    dh__rt_result_clear(&r);
    assert_int_equal(take_alloc("{\"op\":\"alloc\"," TWO_SAMPLES "," TENSOR("[-1]") "}", 2, &r),
                     DH_EDATASET);
    dh__rt_result_clear(&r);
    assert_int_equal(dh_alloc_live(), live);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(pyworker_a_hanging_sample_fails_and_the_worker_goes_on),
    cmocka_unit_test(pyworker_spawn_failure_fails_the_task_cleanly),
    cmocka_unit_test(pyworker_send_failure_restarts_the_process),
    cmocka_unit_test(pyworker_recv_failure_restarts_the_process),
    cmocka_unit_test(pyworker_messages_are_checked),
};
DH_TEST_MAIN(tests)
