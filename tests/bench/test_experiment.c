/* Tests of the experiment core (bench/experiment.h): the option table's defaults and checks
 * are one set for `bench` and `simulate` (the drifted checks agree), shared options print
 * the same help in both, and the systems catalogue describes each system once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dh_test.h"
#include "bench/experiment.h"
#include "datahelix/error.h"

static size_t index_of(const char *name)
{
    size_t n;
    const dh_experiment_option_t *t = dh_experiment_options(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return i;
    fail_msg("no option --%s", name);
    return 0;
}

static int set(dh_bench_options_t *o, const char *name, const char *arg, unsigned command)
{
    return dh_experiment_option_set(o, index_of(name), arg, command);
}

static void experiment_defaults_come_from_the_table(void **state)
{
    (void)state;
    dh_bench_options_t o;
    dh_bench_options_default(&o);
    assert_int_equal(o.ranks, 8);
    assert_int_equal(o.batch, 4);
    assert_int_equal(o.steps, 100);
    assert_int_equal(o.warmup, 20);
    assert_int_equal(o.emulate_rows, 4096);
    assert_int_equal(o.local_servers, 8);
    assert_int_equal(o.remote_servers, 16);
    assert_int_equal(o.cores_per_server, 4);
    assert_int_equal(o.rebalance, -1);
    assert_int_equal(o.rebalance_buffer, 64);
    assert_int_equal(o.plan_window, 1);
    assert_int_equal(o.compute_auto, 1);
    assert_true(o.seed == 1);
    assert_close(o.time_scale, 1, 0);
    assert_close(o.bytes_scale, 0.001, 0);
    assert_close(o.link_gbps, 25, 0);
    assert_close(o.cost_bias, 0.3, 0);
    assert_close(o.cost_noise, 0.3, 0);
    assert_close(o.token_noise, 0.1, 0);
    assert_close(o.rebalance_min_gain, 0.05, 0);
    assert_string_equal(o.systems, "native,pool,helix");
    assert_null(o.mix);
    assert_null(o.dataset);
}

/* The checks bench and simulate had drifted on now agree, bench's way: a gate margin above
 * 1 and a sigma above 4 are refused by both. Only the run's and cluster's sizes go further
 * in simulate. */
static void experiment_checks_agree_between_commands(void **state)
{
    (void)state;
    const unsigned cmds[] = {DH_EXPERIMENT_BENCH, DH_EXPERIMENT_SIMULATE};
    for (int c = 0; c < 2; c++) {
        dh_bench_options_t o;
        dh_bench_options_default(&o);
        assert_int_equal(set(&o, "rebalance-min-gain", "2", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "rebalance-min-gain", "1", cmds[c]), 0);
        assert_close(o.rebalance_min_gain, 1, 0);
        assert_int_equal(set(&o, "cost-noise", "4.5", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "cost-bias", "5", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "token-noise", "4", cmds[c]), 0);
        assert_int_equal(set(&o, "time-scale", "1e-7", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "deadline-threshold", "0", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "batch", "4097", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "ranks", "0", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "ranks", "-1", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "compute", "1,x", cmds[c]), DH_EINVAL);
        assert_int_equal(set(&o, "compute", "0.5,0.25", cmds[c]), 0);
        assert_true(o.compute_auto == 0 && o.a == 0.5 && o.b == 0.25);
        assert_int_equal(set(&o, "no-rebalance", NULL, cmds[c]), 0);
        assert_int_equal(o.rebalance, 0);
        assert_int_equal(set(&o, "rebalance", NULL, cmds[c]), 0);
        assert_int_equal(o.rebalance, 1);
    }
    dh_bench_options_t o;
    dh_bench_options_default(&o);
    assert_int_equal(set(&o, "ranks", "65", DH_EXPERIMENT_BENCH), DH_EINVAL);
    assert_int_equal(set(&o, "ranks", "4096", DH_EXPERIMENT_SIMULATE), 0);
    assert_int_equal(o.ranks, 4096);
    assert_int_equal(set(&o, "rebalance-fanout", "batch", DH_EXPERIMENT_BENCH), 0);
    assert_true(o.rebalance_fanout == DH_BENCH_FANOUT_BATCH);
}

/* Every number's default lies in its range, or is 0 meaning "auto" (said in its help). */
static void experiment_defaults_lie_in_their_ranges(void **state)
{
    (void)state;
    size_t n;
    const dh_experiment_option_t *t = dh_experiment_options(&n);
    for (size_t i = 0; i < n; i++) {
        if (t[i].kind != DH_EXPERIMENT_U32 && t[i].kind != DH_EXPERIMENT_SIZE &&
            t[i].kind != DH_EXPERIMENT_DOUBLE)
            continue;
        if (t[i].def == 0 && t[i].def_in_help)
            continue;
        if (!(t[i].def >= t[i].min && t[i].def <= t[i].max))
            fail_msg("--%s: default %g outside [%g, %g]", t[i].name, t[i].def, t[i].min, t[i].max);
    }
}

static char *help_of(unsigned command)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    dh_experiment_help(f, command);
    fclose(f);
    return text;
}

/* The block of "  --NAME" up to the next option line. */
static char *block(const char *help, const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "  --%s", name);
    const char *p = strstr(help, key);
    if (!p)
        return NULL;
    const char *end = strstr(p + 1, "\n  -");
    const char *blank = strstr(p + 1, "\n\n");
    if (!end || (blank && blank < end))
        end = blank;
    return strndup(p, end ? (size_t)(end - p) : strlen(p));
}

static void experiment_shared_options_print_the_same_help(void **state)
{
    (void)state;
    char *bench = help_of(DH_EXPERIMENT_BENCH), *sim = help_of(DH_EXPERIMENT_SIMULATE);
    size_t n;
    const dh_experiment_option_t *t = dh_experiment_options(&n);
    for (size_t i = 0; i < n; i++) {
        char *b = block(bench, t[i].name), *s = block(sim, t[i].name);
        assert_non_null(b); /* every option is bench's */
        if (t[i].commands & DH_EXPERIMENT_SIMULATE) {
            assert_non_null(s);
            assert_string_equal(b, s);
        } else {
            assert_null(s);
        }
        free(b);
        free(s);
    }
    free(bench);
    free(sim);
}

static void experiment_catalogue_describes_each_system(void **state)
{
    (void)state;
    dh_bench_options_t o;
    dh_bench_options_default(&o);
    dh_bench_system_t s;
    assert_int_equal(dh_bench_system_of("helix", &o, &s), 0);
    assert_true(s.deep && s.tier2 && s.policy == DH_POLICY_DEADLINE && !s.copy);
    assert_int_equal(dh_bench_system_of("ddlb", &o, &s), 0);
    assert_true(s.deep && s.tier2);
    assert_int_equal(dh_bench_system_of("cost-ddl", &o, &s), 0);
    assert_true(s.deep && !s.tier2 && s.token_plan == DH_SHARE_TOKEN_PACKED);
    assert_int_equal(dh_bench_system_of("base", &o, &s), 0);
    assert_true(s.copy && !s.deep && s.policy == DH_POLICY_LEAST_REQUEST);
    assert_int_equal(dh_bench_system_of("transport", &o, &s), 0);
    assert_true(!s.copy && !s.deep);
    assert_int_equal(dh_bench_system_of("native-16", &o, &s), 0);
    assert_true(s.rank_local && s.cores == 16 && s.policy == DH_POLICY_LOCAL);
    assert_int_equal(dh_bench_system_of("native-4", &o, &s), DH_EINVAL); /* < 8 ranks */
    assert_int_equal(dh_bench_system_of("nope", &o, &s), DH_EINVAL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(experiment_defaults_come_from_the_table),
    cmocka_unit_test(experiment_checks_agree_between_commands),
    cmocka_unit_test(experiment_defaults_lie_in_their_ranges),
    cmocka_unit_test(experiment_shared_options_print_the_same_help),
    cmocka_unit_test(experiment_catalogue_describes_each_system),
};
DH_TEST_MAIN(tests)
