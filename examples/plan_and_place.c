/* plan_and_place.c: the README's first example. Loads a profile file, plans one global step
 * for 4 ranks with the default tier-1 planner, then places each rank's request on a small
 * two-node cluster with the deadline policy.
 *
 *   build/examples/plan_and_place PROFILES.jsonl
 */
#include <stdio.h>
#include <stdlib.h>

#include "datahelix/datahelix.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PROFILES.jsonl\n", argv[0]);
        return 2;
    }
    dh_profile_set_t *set = NULL;
    int rc = dh_profile_set_new(&set);
    if (rc == 0)
        rc = dh_profile_set_load(set, argv[1]);
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", dh_err_name(rc), dh_last_error());
        dh_profile_set_destroy(&set);
        return 1;
    }

    /* Tier 1: the first 4 x 2 rows are one global step; balance tokens across 4 ranks. */
    enum { RANKS = 4, BATCH = 2, N = RANKS * BATCH };
    if (dh_profile_set_count(set) < N) {
        fprintf(stderr, "%s: needs at least %d rows\n", argv[1], N);
        dh_profile_set_destroy(&set);
        return 1;
    }
    double tokens[N];
    int32_t rank_of[N];
    double rank_tokens[RANKS];
    for (int i = 0; i < N; i++)
        tokens[i] = (double)dh_profile_set_row(set, (size_t)i)->tokens_est;
    dh_plan_config_t plan = {
        .mode = DH_PLAN_FIXED_BATCH, .algo = DH_PLAN_ALGO_DEFAULT, .ranks = RANKS, .batch = BATCH};
    rc = dh_plan_step(&plan, tokens, NULL, N, rank_of, rank_tokens);
    if (rc != 0) {
        fprintf(stderr, "plan: %s: %s\n", dh_err_name(rc), dh_last_error());
        dh_profile_set_destroy(&set);
        return 1;
    }

    /* Placement: node 0 holds ranks 0-1 and their local server 0; node 1 holds ranks 2-3
     * and local server 1; server 2 is a remote sidecar on node 1. */
    dh_link_t links[4] = {dh_link_make(1e9, 0), dh_link_make(1.25e9, 1e-4),
                          dh_link_make(1.25e9, 1e-4), dh_link_make(1e9, 0)};
    dh_server_state_t servers[3] = {
        {.node = 0,
         .role = DH_SERVER_LOCAL,
         .alive = 1,
         .workers = 2,
         .queue_len = 2,
         .queue_cap = 8,
         .queue_wait_s = 0.4,
         .speed_factor = 1.0,
         .storage_s_per_B = 1e-9},
        {.node = 1,
         .role = DH_SERVER_LOCAL,
         .alive = 1,
         .workers = 2,
         .queue_cap = 8,
         .speed_factor = 1.0,
         .storage_s_per_B = 1e-9},
        {.node = 1,
         .role = DH_SERVER_REMOTE,
         .alive = 1,
         .workers = 4,
         .queue_cap = 8,
         .speed_factor = 0.8,
         .storage_s_per_B = 2e-9},
    };
    dh_snapshot_t snap = {servers, 3, links, 2};
    dh_cost_model_t *model = NULL;
    dh_place_config_t place;
    dh_place_config_default(&place);
    if (dh_cost_model_new(&model, NULL) != 0) {
        dh_profile_set_destroy(&set);
        return 1;
    }
    for (int r = 0; r < RANKS; r++) {
        const dh_profile_row_t *rows[N];
        size_t k = 0;
        for (int i = 0; i < N; i++)
            if (rank_of[i] == r)
                rows[k++] = dh_profile_set_row(set, (size_t)i);
        dh_request_cost_t req = {
            .deadline_s = 0.5, .consumer_node = (uint32_t)(r / 2), .local_server = r / 2};
        dh_cost_model_request(model, rows, k, &req);
        dh_candidate_t cand[3];
        dh_decision_t d = {.candidates = cand};
        rc = dh_place(&place, &snap, &req, &d);
        printf("rank %d: %zu samples, %.0f tokens, %.3f CPU s -> server %d (%s)\n", r, k,
               rank_tokens[r], req.cpu_s, d.server, dh_place_reason_text(d.reason));
    }
    dh_cost_model_destroy(&model);
    dh_profile_set_destroy(&set);
    return 0;
}
