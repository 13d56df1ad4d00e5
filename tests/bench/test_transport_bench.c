/* Tests of `datahelix transport-bench` (src/bench/transport_bench.c) at a tiny size: both parts
 * run and report, and --curve measures the remote part again with CURVE on every socket (a key
 * directory made and removed by the run). A benchmark, so nothing here checks a speed. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "bench/transport_bench.h"

static int count_key_dirs(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, "datahelix-transport-keys-", 25) == 0;
    if (d)
        closedir(d);
    return n;
}

static void transport_bench_measures_plaintext_and_curve(void **state)
{
    (void)state;
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", dh_test_path("tmp"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", tmp);
    assert_int_equal(system(cmd), 0);
    setenv("TMPDIR", tmp, 1);
    static const uint64_t sizes[] = {1u << 20};
    dh_transport_options_t o = {.sizes = sizes,
                                .n_sizes = 1,
                                .batches = 3,
                                .remote_bytes = 1u << 20,
                                .remote_batches = 4,
                                .runs = 1,
                                .curve = 1};
    dh_transport_report_t r;
    assert_int_equal(dh_transport_bench(&o, &r), 0);
    assert_int_equal(r.n_local, 1);
    assert_true(r.local[0].overhead_p50_us > 0);
    assert_true(r.remote_gbps > 0 && r.raw_tcp_gbps > 0);
    assert_true(r.curve_gbps > 0 && r.curve_ratio > 0);
    assert_int_equal(count_key_dirs(tmp), 0); /* the run's keys are gone */
    o.curve = 0;
    assert_int_equal(dh_transport_bench(&o, &r), 0);
    assert_true(r.curve_gbps == 0 && r.curve_ratio == 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(transport_bench_measures_plaintext_and_curve),
};
DH_TEST_MAIN(tests)
