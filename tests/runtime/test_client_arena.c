/* test_client_arena.c: an embedded client's shared-memory arena and the prefetch that fills it
 * (client.h): the horizon deepens when next() waits, prefetch keeps to its share of the
 * arena, the arena is sized from the data within its budget, a full arena is backpressure,
 * one that cannot be had fails at start, and a batch is zero-copy and outlives its client. */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "client_test.h"
#include "cluster.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/mix.h"
#include "datahelix/plan.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/sampler.h"
#include "datahelix/wire.h"
#include "runtime/rt.h"

/* Adaptive prefetch: a consumer faster than its DataServer waits at next(); each wait past
 * the first horizon doubles the horizon, up to prefetch_max, and the epoch is still
 * delivered in order, exactly once. With prefetch_max 0 the horizon stays put. */
static uint64_t horizon_after_epoch(const char *profiles, uint32_t prefetch_max)
{
    dh_client_config_t cfg;
    base_config(&cfg, profiles,
                "{\"type\":\"synthetic\",\"cost\":\"sleep\",\"cpu_scale\":0.01,"
                "\"bytes_scale\":0.002}");
    cfg.prefetch = 1;
    cfg.prefetch_max = prefetch_max;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    uint64_t index = 0;
    int rc;
    while ((rc = dh_client_next(c, &b)) == 0) {
        assert_int_equal(b->index, index++);
        check_synthetic(b);
        dh_client_batch_release(&b);
        cl_nap_ms(1); /* the compute window */
    }
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(index, 16);
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    assert_int_equal(st.samples, 64);
    assert_int_equal(st.duplicates_dropped, 0);
    dh_client_destroy(&c);
    return st.prefetch_now;
}

static void adaptive_prefetch_deepens_when_next_waits(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    assert_int_equal(horizon_after_epoch(profiles, 8), 8);
    assert_int_equal(horizon_after_epoch(profiles, 0), 1);
    cl_assert_no_leftovers();
}

/* Prefetch in bytes: a client asked to prefetch 16 batches from an arena that holds a few
 * of them never has more bytes requested and not yet returned (with the batch it holds)
 * than its share of the arena, and still gets every batch in order; its share is the
 * arena's capacity / local_ranks, less the margin. */
static void prefetch_keeps_to_its_share_of_the_arena(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    for (uint32_t local = 1; local <= 2; local++) {
        dh_client_config_t cfg;
        base_config(&cfg, profiles,
                    "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.05}");
        cfg.prefetch = 16;
        cfg.arena_bytes = ((uint64_t)24 << 20) * local; /* the same share for each */
        cfg.local_ranks = local;
        dh_client_t *c = NULL;
        int rc = dh_client_new(&c, &cfg);
        if (rc)
            print_error("%s\n", dh_last_error());
        assert_int_equal(rc, 0);
        dh_client_batch_t *b = NULL;
        uint64_t index = 0;
        double epoch_bytes = 0;
        while ((rc = dh_client_next(c, &b)) == 0) {
            assert_int_equal(b->index, index++);
            check_synthetic(b);
            for (size_t t = 0; t < b->n_tensors; t++)
                epoch_bytes += (double)b->tensors[t].nbytes;
            cl_nap_ms(2); /* the compute window: the prefetch runs ahead meanwhile */
            dh_client_batch_release(&b);
        }
        assert_int_equal(rc, DH_EEOF);
        assert_int_equal(index, 16);
        dh_client_stats_t st;
        dh_client_stats(c, &st);
        double share = (double)(cfg.arena_bytes / local) * (1 - DH_DEADLINE_ARENA_MARGIN);
        assert_true(st.byte_budget <= share && st.byte_budget > 0.9 * share);
        assert_true(epoch_bytes > 2 * st.byte_budget); /* 16 batches ahead would not fit */
        assert_true(st.bytes_outstanding_peak > 0);
        assert_true(st.bytes_outstanding_peak <= st.byte_budget);
        dh_client_destroy(&c);
    }
    cl_assert_no_leftovers();
}

/* Embedded mode sizes its arena from the data: the horizon (prefetch x batch x the largest
 * sample), bounded by the budget; a budget that cannot hold one batch fails, naming the
 * numbers and the option. */
static void embedded_arena_sized_from_data_within_budget(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 64);
    size_t n = 0;
    dh_profile_set_t *set = load_rows(profiles, &n);
    int64_t largest = 0;
    for (size_t i = 0; i < n; i++)
        if (dh_profile_set_row(set, i)->out_bytes > largest)
            largest = dh_profile_set_row(set, i)->out_bytes;
    dh_profile_set_destroy(&set);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    cfg.prefetch = 2;
    cfg.arena_budget_bytes = (uint64_t)8 << 30;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_stats_t st;
    dh_client_stats(c, &st);
    double need = 2.0 * 4 * (double)largest; /* prefetch x batch x largest, the margin back */
    assert_true(st.byte_budget >= 0.99 * need && st.byte_budget < need + (8 << 20));
    dh_client_destroy(&c);

    cfg.arena_budget_bytes = (uint64_t)64 << 20; /* less than 4 x largest (~37 MiB) */
    assert_int_equal(dh_client_new(&c, &cfg), DH_ERANGE);
    assert_null(c);
    assert_non_null(strstr(dh_last_error(), "cannot hold one step"));
    assert_non_null(strstr(dh_last_error(), "batch 4"));
    assert_non_null(strstr(dh_last_error(), "--arena-budget"));
    cl_assert_no_leftovers();
}

static void embedded_full_arena_is_backpressure(void **state)
{
    /* ~0.5-4 MB per sample with 8 batches of prefetch in a 16 MiB arena: workers wait for
     * slabs that next() releases, and every batch still comes in order. */
    run_epoch_ids(cl_write_profiles("p.jsonl", 32), 1, 8, (uint64_t)16 << 20,
                  "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.1}");
    cl_assert_no_leftovers();
}

/* An embedded client whose arena cannot be had fails in dh_client_new, before its epoch,
 * naming the arena's size and the limit (docs/shared-memory.md §2a). */
static void embedded_arena_that_cannot_be_had_fails_at_start(void **state)
{
    (void)state;
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    cfg.arena_bytes = (uint64_t)1 << 49; /* 512 TiB */
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc != DH_ENOMEM || !strstr(dh_last_error(), "562949953421312 bytes"))
        print_error("dh_client_new: %s (%s)\n", dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, DH_ENOMEM);
    assert_null(c);
    assert_non_null(strstr(dh_last_error(), "562949953421312 bytes"));
    assert_non_null(strstr(dh_last_error(), "exceed"));
    cl_assert_no_leftovers();
}

static void embedded_zero_copy_and_batch_outlives_client(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 16);
    dh_client_config_t cfg;
    base_config(&cfg, profiles, SYNTH);
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_batch_t *b = NULL;
    assert_int_equal(dh_client_next(c, &b), 0);
    /* the payload lies in the arena mapping (a memfd), not on the heap */
    const dh_tensor_t *payload = tensor(b, "payload");
    assert_non_null(payload);
    char line[512];
    int in_arena = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    assert_non_null(maps);
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)payload->data >= lo &&
            (unsigned long)payload->data < hi && strstr(line, "memfd:datahelix-arena"))
            in_arena = 1;
    }
    fclose(maps);
    assert_int_equal(in_arena, 1);
    dh_client_destroy(&c);
    check_synthetic(b); /* still mapped: the batch holds the arena */
    dh_client_batch_release(&b);
    assert_null(b);
    cl_assert_no_leftovers();
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(adaptive_prefetch_deepens_when_next_waits),
        cmocka_unit_test(embedded_full_arena_is_backpressure),
        cmocka_unit_test(prefetch_keeps_to_its_share_of_the_arena),
        cmocka_unit_test(embedded_arena_sized_from_data_within_budget),
        cmocka_unit_test(embedded_zero_copy_and_batch_outlives_client),
        cmocka_unit_test(embedded_arena_that_cannot_be_had_fails_at_start),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
