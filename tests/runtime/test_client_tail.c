/* test_client_tail.c: the client's keep_tail (drop_last=False, client.h) in embedded mode:
 * each epoch ends with a short step shared by the ranks alike, its pads (repeats of the
 * epoch's first samples) marked `padded`, every sample delivered once an epoch besides them,
 * also when the tail has fewer rows than the fanout's parts; and keep_tail with tier 2 is a
 * configuration error. Each rank runs its own embedded client (the plan is pure: a rank needs
 * no other to know its share). */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cluster.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/profile.h"

#define SYNTH "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}"
#define N 13
#define RANKS 2
#define BATCH 2
#define STEPS 4 /* ceil(13 / 4) */
#define EPOCHS 2

static void tail_config(dh_client_config_t *cfg, const char *profiles, uint32_t rank,
                        uint32_t fanout)
{
    dh_client_config_default(cfg);
    cfg->profiles = profiles;
    cfg->pipeline_json = SYNTH;
    cfg->rank = rank;
    cfg->ranks = RANKS;
    cfg->batch = BATCH;
    cfg->fanout = fanout;
    cfg->epochs = EPOCHS;
    cfg->seed = 8;
    cfg->keep_tail = 1;
    cfg->node = "test-node";
    cfg->next_timeout_ms = 60000;
    cfg->connect_timeout_ms = 10000;
}

static void every_sample_once_and_pads_marked(uint32_t fanout)
{
    const char *profiles = cl_write_profiles("tail.jsonl", N);
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, profiles), 0);
    /* per epoch: how often each row came unpadded, and the pads' rows */
    int seen[EPOCHS][N] = {{0}}, pads[EPOCHS] = {0};
    uint32_t first_step[EPOCHS][RANKS * BATCH], n_first[EPOCHS] = {0};
    int pad_row[EPOCHS][RANKS];
    for (uint32_t rank = 0; rank < RANKS; rank++) {
        dh_client_config_t cfg;
        tail_config(&cfg, profiles, rank, fanout);
        dh_client_t *c = NULL;
        int rc = dh_client_new(&c, &cfg);
        if (rc)
            print_error("%s\n", dh_last_error());
        assert_int_equal(rc, 0);
        dh_client_batch_t *b = NULL;
        uint64_t index = 0;
        while ((rc = dh_client_next(c, &b)) == 0) {
            uint32_t epoch = (uint32_t)(index / STEPS), k = (uint32_t)(index % STEPS);
            assert_int_equal(b->epoch, epoch);
            assert_int_equal(b->step, index);
            assert_int_equal(b->n_samples, k + 1 < STEPS ? BATCH : 1); /* tail 1, padded 2 */
            for (size_t i = 0; i < b->n_samples; i++) {
                const dh_client_sample_t *s = &b->samples[i];
                size_t row = 0;
                while (row < N && strcmp(dh_profile_set_row(set, (uint32_t)row)->id, s->id))
                    row++;
                assert_true(row < N);
                if (k == 0)
                    first_step[epoch][n_first[epoch]++] = (uint32_t)row;
                if (s->padded) {
                    assert_int_equal(k, STEPS - 1); /* only in the tail */
                    pad_row[epoch][pads[epoch]++] = (int)row;
                } else {
                    seen[epoch][row]++;
                }
            }
            dh_client_batch_release(&b);
            index++;
        }
        assert_int_equal(rc, DH_EEOF);
        assert_int_equal(index, (uint64_t)STEPS * EPOCHS); /* every rank the same count */
        dh_client_stats_t st;
        dh_client_stats(c, &st);
        assert_int_equal(st.steps_total, STEPS * EPOCHS);
        dh_client_destroy(&c);
    }
    for (int e = 0; e < EPOCHS; e++) {
        for (int row = 0; row < N; row++)
            assert_int_equal(seen[e][row], 1);
        assert_int_equal(pads[e], 1); /* ceil(13 / 2) x 2 - 13 */
        bool from_start = false;      /* the pad repeats one of the epoch's first samples */
        for (uint32_t i = 0; i < n_first[e]; i++)
            from_start |= (int)first_step[e][i] == pad_row[e][0];
        assert_true(from_start);
    }
    dh_profile_set_destroy(&set);
    cl_assert_no_leftovers();
}

static void keep_tail_delivers_every_sample_and_marks_pads(void **state)
{
    every_sample_once_and_pads_marked(1);
}

/* fanout 2 and a tail of one row per rank: the row in part 0, part 1 empty. */
static void keep_tail_below_fanout(void **state)
{
    every_sample_once_and_pads_marked(2);
}

static void keep_tail_refuses_rebalance(void **state)
{
    const char *profiles = cl_write_profiles("tail.jsonl", N);
    dh_client_config_t cfg;
    tail_config(&cfg, profiles, 0, 1);
    cfg.rebalance.enabled = 1;
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "keep_tail"));
    assert_null(c);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keep_tail_delivers_every_sample_and_marks_pads),
        cmocka_unit_test(keep_tail_below_fanout),
        cmocka_unit_test(keep_tail_refuses_rebalance),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
