/* test_client_exchange.c: no side door around CURVE in the C client (issue 33 point 5;
 * docs/security.md, "What travels where"): with CURVE keys (keys_dir), a tier-2 exchange_fn
 * (which carries the payloads that move across nodes outside the encrypted data plane) is
 * refused by dh_client_new, naming the opt-in, unless rebalance.allow_unencrypted_exchange is
 * 1; without keys, or with the opt-in, the client starts (embedded mode, one rank). The
 * DataLoader refuses the same earlier (python/datahelix/_exchange.py, test_exchange.py); this
 * is the check every caller meets, _C.Client and C programs included. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cluster.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/wire.h"

#define SYNTH "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}"

static int no_exchange(void *user, uint32_t group, uint64_t round, const uint32_t *ranks,
                       uint32_t n_ranks, const void *send, const size_t *send_counts, void *recv,
                       const size_t *recv_counts)
{
    (void)user, (void)group, (void)round, (void)ranks, (void)n_ranks, (void)send;
    (void)send_counts, (void)recv, (void)recv_counts;
    return 0;
}

static void exchange_config(dh_client_config_t *cfg, const char *profiles, const char *keys)
{
    dh_client_config_default(cfg);
    cfg->profiles = profiles;
    cfg->pipeline_json = SYNTH;
    cfg->ranks = 1;
    cfg->batch = 4;
    cfg->node = "test-node";
    cfg->next_timeout_ms = 60000;
    cfg->connect_timeout_ms = 10000;
    cfg->rebalance.enabled = 1;
    cfg->rebalance.exchange_fn = no_exchange;
    cfg->keys_dir = keys;
}

static void exchange_fn_with_keys_is_refused_unless_allowed(void **state)
{
    (void)state;
    const char *profiles = cl_write_profiles("exchange.jsonl", 16);
    char keys[512], prefix[600];
    snprintf(keys, sizeof keys, "%s", dh_test_path("exchange-keys"));
    assert_int_equal(mkdir(keys, 0700), 0);
    snprintf(prefix, sizeof prefix, "%s/server", keys);
    assert_int_equal(dh_wire_keygen(prefix, NULL), 0);

    dh_client_config_t cfg;
    exchange_config(&cfg, profiles, keys);
    dh_client_t *c = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), DH_EINVAL);
    assert_null(c);
    assert_non_null(strstr(dh_last_error(), "rebalance.exchange_fn with CURVE keys"));
    assert_non_null(strstr(dh_last_error(), keys));
    assert_non_null(strstr(dh_last_error(), "allow_unencrypted_exchange = 1"));

    /* the opt-in: the client starts (warned) */
    cfg.rebalance.allow_unencrypted_exchange = 1;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("with the opt-in: %s (%s)\n", dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, 0);
    dh_client_destroy(&c);

    /* without keys there is nothing to go around: no refusal */
    exchange_config(&cfg, profiles, NULL);
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_destroy(&c);
    /* nor with keys and no exchange_fn (the DataServers forward over CURVE) */
    exchange_config(&cfg, profiles, keys);
    cfg.rebalance.exchange_fn = NULL;
    assert_int_equal(dh_client_new(&c, &cfg), 0);
    dh_client_destroy(&c);
    cl_assert_no_leftovers();
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exchange_fn_with_keys_is_refused_unless_allowed),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
