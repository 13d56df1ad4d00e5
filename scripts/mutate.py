#!/usr/bin/env python3
"""mutate.py: a small mutation check of the tests (issue 17, "tests that catch what they claim").

Each mutant below is one single-line edit of src/ (a comparison flipped, an off-by-one, a
check dropped, two things swapped): file, the exact original text (unique in its file),
its replacement, a name, and the ctest regex of the tests that should catch it. For each
mutant the script applies the edit to a scratch copy of the source tree (never to the
working tree: <repo>/build-mutate/src, its own build in build-mutate/build), builds the
library, the CLI and the test executables those tests need with ninja, runs those tests
with a timeout, and restores the file. A mutant is

    killed    a test failed or timed out,
    survived  every test passed (the tests do not catch it: write one, or explain in
              docs/testing.md why the mutant is equivalent),
    invalid   it does not compile (warnings are errors): not counted either way.

It prints a table and the kill rate, killed / (killed + survived), and exits 1 when the
rate is under --min-kill-rate (default 0.9), 2 on a usage or set-up error (a mutant whose
file is gone or whose original text is not found exactly once, named; the unmutated tests
failing). `make mutate` runs
it; it is not part of `make test` (10 min for 83 mutants on 2 cores with build-mutate/ built,
the first run also builds it; budget-lone-task-waits alone waits out the 180 s time-out). docs/testing.md has the latest table.

    scripts/mutate.py                 every mutant
    scripts/mutate.py --list          the mutants, their lines and tests
    scripts/mutate.py --only NAME     one mutant (repeatable)
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

# (name, file, original, replacement, tests regex)
MUTANTS = [
    # ---- src/sched/ ----
    ("place-local-meets-strict", "src/sched/place.c",
     "if (local_ok && t_local <= deadline) {",
     "if (local_ok && t_local < deadline) {",
     r"^sched\.test_place\."),
    ("place-remote-gain-ignores-margin", "src/sched/place.c",
     "t_remote <= deadline && t_local - t_remote > margin)",
     "t_remote <= deadline && t_local - t_remote > 0 * margin)",
     r"^sched\.test_place\."),
    ("place-same-node-not-first", "src/sched/place.c",
     "if (best_same >= 0 && t_best_same <= deadline)",
     "if (0 && best_same >= 0 && t_best_same <= deadline)",
     r"^sched\.test_place\."),
    ("place-queue-cap-off-by-one", "src/sched/place_internal.h",
     "unsigned full = (uint32_t)(s->queue_cap - 1) < s->queue_len;",
     "unsigned full = (uint32_t)(s->queue_cap - 1) <= s->queue_len;",
     r"^sched\.test_place"),
    ("place-earliest-ignores-local", "src/sched/place.c",
     "local_ok ? dh__place_better(local, t_local, best_remote, t_remote) : best_remote;",
     "local_ok && best_remote < 0 ? local : best_remote;",
     r"^sched\.test_place"),
    ("fanout-part-sizes-off-by-one", "src/sched/plan.c",
     "w.cap[p] = (uint32_t)(n / parts) + (p < n % parts);",
     "w.cap[p] = (uint32_t)(n / parts) + (p <= n % parts);",
     r"^sched\.test_plan\."),
    ("share-ignores-window-step", "src/sched/plan_share.c",
     "if (step_of[i] == at && rank_of[i] == (int32_t)rank && n < cap)",
     "if ((step_of[i] == at || cfg->window_steps > 1) && rank_of[i] == (int32_t)rank && n < cap)",
     r"^sched\.test_(share|plan)\."),
    ("share-last-window-past-epoch", "src/sched/plan_share.c",
     "w = left < cfg->window_steps ? (uint32_t)left : cfg->window_steps;",
     "w = left < cfg->window_steps ? (uint32_t)left + 1 : cfg->window_steps;",
     r"^sched\.test_(share|plan)\."),
    ("deadline-next-batch-zero", "src/sched/deadline.c",
     "if (consumed == 0 || b < consumed)",
     "if (consumed == 0 || b <= consumed)",
     r"^sched\.test_deadline\."),
    ("deadline-negative-not-clamped", "src/sched/deadline.c",
     "if (d < 0)",
     "if (d < -1e9)",
     r"^sched\.test_deadline\."),
    ("byte-horizon-first-not-always", "src/sched/deadline.c",
     "if (k > 0 && !(sum + b <= budget))",
     "if (!(sum + b <= budget))",
     r"^sched\.test_deadline\."),
    ("byte-horizon-strict-fit", "src/sched/deadline.c",
     "if (k > 0 && !(sum + b <= budget))",
     "if (k > 0 && !(sum + b < budget))",
     r"^sched\.test_deadline\."),
    ("prefetch-doubling-past-max", "src/sched/deadline.c",
     "return horizon <= max - horizon ? 2 * horizon : max;",
     "return 2 * horizon;",
     r"^sched\.test_deadline\."),
    ("prefetch-ignores-full-arena", "src/sched/deadline.c",
     "!(arena_used < 0.5))",
     "!(arena_used < 1.5))",
     r"^sched\.test_deadline\."),
    ("sampler-same-order-every-epoch", "src/sched/sampler.c",
     "dh_rng_seed(&rng, dh_rng_mix(s->seed, epoch));",
     "dh_rng_seed(&rng, dh_rng_mix(s->seed, 0));",
     r"^sched\.test_sampler\."),
    ("sampler-stale-epoch-kept", "src/sched/sampler.c",
     "if (!sampler->have_epoch || sampler->epoch != w.epoch)",
     "if (!sampler->have_epoch)",
     r"^sched\.test_sampler\."),
    ("sampler-shuffle-sattolo", "src/sched/sampler.c",
     "size_t j = (size_t)dh_rng_below(&rng, (uint64_t)i + 1);",
     "size_t j = (size_t)dh_rng_below(&rng, (uint64_t)i);",
     r"^sched\.test_sampler\."),
    # ---- src/media/ (named in issue 17) ----
    ("random-window-last-start-unreachable", "src/media/sampling.c",
     "int64_t start = (int64_t)dh_rng_below(&rng, (uint64_t)(count - span + 1));",
     "int64_t start = (int64_t)dh_rng_below(&rng, (uint64_t)(count - span + (count == span)));",
     r"^media\.test_sampling\."),
    # ---- src/remote/ (the S3 half, issue 34) ----
    ("s3-sign-query-unsorted", "src/remote/s3_sign.c",
     "    qsort(ps, in->n_params, sizeof(*ps), param_cmp);",
     "    (void)param_cmp;",
     r"^remote\.test_s3_sign\."),
    ("s3-sign-path-slash-encoded", "src/remote/s3_sign.c",
     "encode_into(&creq, in->path, strlen(in->path), true);",
     "encode_into(&creq, in->path, strlen(in->path), false);",
     r"^remote\.test_s3_sign\."),
    ("s3-sign-value-not-trimmed", "src/remote/s3_sign.c",
     "    while (*v == ' ' || *v == '\\t')",
     "    while (false && (*v == ' ' || *v == '\\t'))",
     r"^remote\.test_s3_sign\."),
    ("s3-list-truncation-ignored", "src/remote/s3_list.c",
     "        if (!page.truncated)",
     "        if (true)",
     r"^remote\.test_s3_list\."),
    ("s3-list-repeated-token-followed", "src/remote/s3_list.c",
     "if (token && strcmp(token, page.next_token) == 0) {",
     "if (false && token && strcmp(token, page.next_token) == 0) {",
     r"^remote\.test_s3_list\."),
    ("s3-403-not-an-auth-error", "src/remote/s3_list.c",
     "if (status == 401 || status == 403)",
     "if (status == 401)",
     r"^remote\.test_s3_list\."),
    ("s3-url-decode-plus-kept", "src/remote/s3_list.c",
     "            *out++ = ' ';",
     "            *out++ = '+';",
     r"^remote\.test_s3_list\."),
    ("s3-env-keys-beat-named-profile", "src/remote/s3_config.c",
     "if (want_keys && !opts->profile && (id || secret)) {",
     "if (want_keys && (id || secret)) {",
     r"^remote\.test_s3_config\."),
    ("s3-virtual-host-on-custom-endpoint", "src/remote/s3_url.c",
     "(cfg->style == DH__S3_STYLE_AUTO && !cfg->endpoint_url && virtual_ok(bucket));",
     "(cfg->style == DH__S3_STYLE_AUTO && virtual_ok(bucket));",
     r"^remote\.test_s3_url\."),
    ("ini-first-value-wins", "src/remote/s3_ini.c",
     "            found = e->value;",
     "            found = found ? found : e->value;",
     r"^remote\.test_s3_ini\."),
    ("braces-padding-dropped", "src/remote/s3_braces.c",
     "int width = (ap || bp) ? (int)(ad > bd ? ad : bd) : 0;",
     "int width = 0;",
     r"^remote\.test_s3_braces\."),
    # ---- src/runtime/ ----
    ("duplicate-check-removed", "src/runtime/client_fetch.c",
     "bool dup = p.seq < lo || p.seq >= hi || (slot->ready && slot->seq == p.seq);",
     "bool dup = false && (p.seq < lo || p.seq >= hi || (slot->ready && slot->seq == p.seq));",
     r"^runtime\.test_client_fetch\."),
    ("duplicate-window-end-off-by-one", "src/runtime/client_fetch.c",
     "bool dup = p.seq < lo || p.seq >= hi || (slot->ready && slot->seq == p.seq);",
     "bool dup = p.seq < lo || p.seq > hi || (slot->ready && slot->seq == p.seq);",
     r"^runtime\.test_client_fetch\."),
    ("refused-deliver-keeps-slabs", "src/runtime/client_fetch.c",
     "        if (a) {",
     "        if (!a) {",
     r"^runtime\.test_client_fetch\."),
    ("fanout-join-parts-reversed", "src/runtime/client_fetch.c",
     "column[k] = parts[k].n_tensors ? &parts[k].tensors[t] : NULL;",
     "column[k] = parts[n_parts - 1 - k].n_tensors ? &parts[n_parts - 1 - k].tensors[t] : NULL;",
     r"^runtime\.test_client(_fetch)?\.(embedded_fanout_joins_microbatches|duplicate_part)"),
    ("fanout-request-parts-reversed", "src/runtime/client_send.c",
     "if (part_of[i] != p)",
     "if (part_of[i] != parts - 1 - p)",
     r"^runtime\.test_client\.embedded_fanout_joins_microbatches$"),
    ("reclaim-never-runs", "src/runtime/dataserver_loop.c",
     "if (s->arena && now - last_reclaim > 200000000ull) {",
     "if (s->arena && now - last_reclaim > 200000000ull && 0) {",
     r"^runtime\.test_dataserver\."),
    ("delivery-does-not-name-holder", "src/runtime/dataserver_deliver.c",
     "dh_shm_arena_ref_for(s->arena, &tensors[i].handle, (pid_t)kc->pid) == 0)",
     "dh_shm_arena_ref(s->arena, &tensors[i].handle) == 0)",
     r"^runtime\.test_dataserver\."),
    ("coordinator-never-declares-dead", "src/runtime/coordinator_liveness.c",
     "if (now - s->last_seen_ns <= (uint64_t)limit * 1000000ull)",
     "if (now - s->last_seen_ns <= (uint64_t)limit * 1000000000ull)",
     r"^runtime\.(test_client_cluster\.client_asks_again_when_named_server_is_gone|test_coordinator_liveness\.limit_follows)"),
    ("budget-never-waits", "src/runtime/dataserver_output_budget.c",
     "while (g_reserved > 0 && g_reserved + bytes > budget && !atomic_load(stop)) {",
     "while (g_reserved > 0 && g_reserved > budget && !atomic_load(stop)) {",
     r"^runtime\.test_dataserver_output_budget\."),
    ("budget-settle-keeps-peak", "src/runtime/dataserver_output_budget.c",
     "    g_reserved += bytes; /* may pass the budget",
     "    g_reserved += c->bytes; /* may pass the budget",
     r"^runtime\.test_dataserver_output_budget\."),
    ("task-memory-ignores-padding", "src/runtime/dataserver_task.c",
     "            h = fmax(h, s->height);",
     "            h = fmax(h, s->width);",
     r"^runtime\.test_dataserver_output_budget\."),
    ("collate-into-padding-not-zeroed", "src/media/collate.c",
     "            memset(slot + (size_t)t * frame_bytes, 0, (size_t)(bt - t) * frame_bytes);",
     "            (void)0;",
     r"^media\.test_collate\."),
    ("rebalance-round-ignores-arena", "src/runtime/client_rebalance.c",
     "        if (fit < rb->steps)",
     "        if (0 && fit < rb->steps)",
     r"^runtime\.test_rebalance\.rebalance_rounds_fit"),
    # ---- src/runtime/ tier 2's client side (client_rebalance*.c) ----
    ("rb-gate-ignored", "src/runtime/client_rebalance_decide.c",
     "d->apply |= v.applied != 0;",
     "d->apply |= v.gain_s > 0;",
     r"^runtime\.test_rebalance\.rebalance_gate_keeps"),
    ("rb-part-counts-unchecked", "src/runtime/client_rebalance_decide.c",
     "if (had != gets) {",
     "if (0 && had != gets) {",
     r"^runtime\.test_rebalance\.rebalance_policy_error"),
    ("rb-foreign-rank-accepted", "src/runtime/client_rebalance_decide.c",
     "if (dh__client_rb_member_of(m, new_rank[i]) < 0) {",
     "if (dh__client_rb_member_of(m, new_rank[i]) < -1) {",
     r"^runtime\.test_rebalance\.rebalance_policy_error"),
    ("rb-offer-without-tokens", "src/runtime/client_rebalance.c",
     "w->tokens += (double)p->samples[i].tokens;",
     "w->tokens += 0 * (double)p->samples[i].tokens;",
     r"^runtime\.test_rebalance\.rebalance_gate_keeps"),
    ("rb-incoming-takes-own-part", "src/runtime/client_rebalance_move.c",
     "!(new_rank[next_in] == me && m->parts[next_in].rank != me))",
     "!(new_rank[next_in] == me))",
     r"^runtime\.test_rebalance\.rebalance_(user_policy_is|packing)"),
    ("rb-exchange-recv-offset-stuck", "src/runtime/client_rebalance_move.c",
     "recv_at[from] += part_bytes(w);",
     "recv_at[from] += 0 * part_bytes(w);",
     r"^runtime\.test_rebalance\.rebalance_exchange_fn_carries"),
    ("rb-moved-samples-miscounted", "src/runtime/client_rebalance_move.c",
     "dh__count(&c->counters.rebalance_moved_samples, in->n_samples);",
     "dh__count(&c->counters.rebalance_moved_samples, in->n_samples + 1);",
     r"^runtime\.test_rebalance\.rebalance_user_policy_is"),
    ("rb-take-over-keeps-sender-refs", "src/runtime/client_rebalance_move.c",
     "dh_shm_arena_unref(p.arena->arena, &p.handles[k]);",
     "(void)p.handles[k];",
     r"^runtime\.test_rebalance\.rebalance_user_policy_is"),
    ("rb-take-over-failure-keeps-sender-refs", "src/runtime/client_rebalance_move.c",
     "for (uint32_t k = 0; k < w->n_tensors; k++) {",
     "for (uint32_t k = 0; k < 0 * w->n_tensors; k++) {",
     r"^runtime\.test_rebalance\.rebalance_failed_take_over"),
    ("rb-send-failure-keeps-slabs", "src/runtime/client_rebalance_move.c",
     "they go here */\n                    dh__client_part_release_tensors(&c->ring[slot]);",
     "they go here */\n                    (void)slot;",
     r"^runtime\.test_rebalance\.rebalance_failed_send"),
    # ---- src/runtime/ the Python worker protocol (dataserver_pyworker*.c) ----
    ("pyworker-op-unchecked", "src/runtime/dataserver_pyworker.c",
     "if (!json_is_object(msg) || !json_is_string(json_object_get(msg, \"op\"))) {",
     "if (!json_is_object(msg)) {",
     r"^runtime\.test_dataserver_pyworker\.pyworker_messages"),
    ("pyworker-sample-count-unchecked", "src/runtime/dataserver_pyworker.c",
     "if (!json_is_array(list) || json_array_size(list) != out->n_samples)",
     "if (!json_is_array(list) || json_array_size(list) > out->n_samples)",
     r"^runtime\.test_dataserver_pyworker\.pyworker_messages"),
    ("pyworker-dims-off-by-one", "src/runtime/dataserver_pyworker.c",
     "json_array_size(shape) > DH_TENSOR_MAX_DIMS)",
     "json_array_size(shape) > DH_TENSOR_MAX_DIMS + 1)",
     r"^runtime\.test_dataserver_pyworker\.pyworker_messages"),
    ("pyworker-size-unbounded", "src/runtime/dataserver_pyworker.c",
     "            if (elems > MAX_BYTES)",
     "            if (0 && elems > MAX_BYTES)",
     r"^runtime\.test_dataserver_pyworker\.pyworker_messages"),
    ("pyworker-timeout-tenfold", "src/runtime/dataserver_pyworker.c",
     "w->armed_ns + (int64_t)(w->timeout_s * 1e9) : 0;",
     "w->armed_ns + (int64_t)(w->timeout_s * 1e10) : 0;",
     r"^runtime\.test_dataserver_pyworker\.pyworker_a_hanging"),
    ("pyworker-timeout-fails-the-batch", "src/runtime/dataserver_pyworker.c",
     "if (slot >= 0 && (uint32_t)slot < n && !(*failed && (*failed)[slot])) {",
     "if (slot > 0 && (uint32_t)slot < n && !(*failed && (*failed)[slot]) && 0) {",
     r"^runtime\.test_dataserver_pyworker\.pyworker_a_hanging"),
    ("pyworker-killed-worker-not-replaced", "src/runtime/dataserver_pyworker.c",
     "    w->pid = 0;\n    w->ready = false;",
     "    w->pid = 0;\n    w->ready = true;",
     r"^runtime\.test_dataserver_pyworker\.pyworker_a_hanging"),
    # ---- src/wire/auth.c ----
    ("auth-readable-secret-accepted", "src/wire/auth.c",
     "if (secret && (st.st_mode & 077)) {",
     "if (secret && (st.st_mode & 077) == 077) {",
     r"^wire\.test_auth\.keys_load"),
    ("auth-key-length-unchecked", "src/wire/auth.c",
     "if (strlen(s) != Z85_KEY_LEN)",
     "if (strlen(s) < Z85_KEY_LEN)",
     r"^wire\.test_auth\.keys_load"),
    ("auth-unlisted-key-admitted", "src/wire/auth.c",
     "            if (name) {",
     "            if (name || key[0]) {",
     r"^wire\.test_auth\.curve_refuses_an_unlisted"),
    ("auth-bind-without-secret", "src/wire/auth.c",
     "if (!k->server_secret[0])",
     "if (0 && !k->server_secret[0])",
     r"^wire\.test_auth\.binding_tcp_without"),
    ("auth-curve-on-ipc", "src/wire/auth.c",
     "if (!k || strncmp(endpoint, \"tcp://\", 6) != 0)",
     "if (!k)",
     r"^wire\.test_auth\.keys_leave_ipc"),
    # ---- src/runtime/dataserver_output_budget.c ----
    ("budget-lone-task-waits", "src/runtime/dataserver_output_budget.c",
     "while (g_reserved > 0 && g_reserved + bytes > budget && !atomic_load(stop)) {",
     "while (g_reserved + bytes > budget && !atomic_load(stop)) {",
     r"^runtime\.test_dataserver_output_budget\.one_task_alone"),
    ("budget-release-never-frees", "src/runtime/dataserver_output_budget.c",
     "if (!c || atomic_fetch_sub(&c->refs, 1) != 1)",
     "if (!c || atomic_fetch_sub(&c->refs, 1) != 0)",
     r"^runtime\.test_dataserver_output_budget\."),
    # ---- the fault and clean-up paths (slabs given back on an error) ----
    ("fetch-bad-handle-keeps-later-slabs", "src/runtime/client_fetch.c",
     "\"unknown arena\");\n                drop_deliver_from(c, m, i + 1);",
     "\"unknown arena\");\n                drop_deliver_from(c, m, i + 2);",
     r"^runtime\.test_client_fetch\.deliver_failing_at_each"),
    ("fetch-oom-keeps-later-slabs", "src/runtime/client_fetch.c",
     "drop_deliver_from(c, m, i + 1); /* the slabs of the tensors not reached */",
     "drop_deliver_from(c, m, i + 2); /* the slabs of the tensors not reached */",
     r"^runtime\.test_client_fetch\.deliver_failing_at_each"),
    ("fetch-duplicate-keeps-slabs", "src/runtime/client_fetch.c",
     "    if (dup) {",
     "    if (0) {",
     r"^runtime\.test_client_fetch\.duplicate_deliver_is_dropped"),
    ("forward-rb-send-failure-keeps-one", "src/runtime/dataserver_forward.c",
     "for (uint32_t k = (uint32_t)np; k < p->n_tensors; k++) {",
     "for (uint32_t k = (uint32_t)np + 1; k < p->n_tensors; k++) {",
     r"^runtime\.test_dataserver_forward\.rebalance_send_releases"),
    ("forward-place-failure-keeps-slabs", "src/runtime/dataserver_forward.c",
     "sidecar, dh_last_error());\n                dh__ds_unref_tensors(s, tensors, n);",
     "sidecar, dh_last_error());\n                (void)tensors;",
     r"^runtime\.test_dataserver_forward\.place_forwarded_releases"),
    ("forward-not-a-frame-keeps-slabs", "src/runtime/dataserver_forward.c",
     "s->name, sidecar, w->tensor.name);\n            dh__ds_unref_tensors(s, tensors, n);",
     "s->name, sidecar, w->tensor.name);\n            (void)tensors;",
     r"^runtime\.test_dataserver_forward\.place_forwarded_releases"),
    # ---- src/runtime/coordinator_liveness.c ----
    ("liveness-limit-never-rises", "src/runtime/coordinator_liveness.c",
     "if (now_want > s->limit_ms)",
     "if (0 && now_want > s->limit_ms)",
     r"^runtime\.test_coordinator_liveness\.limit_rises"),
    ("liveness-limit-uncapped", "src/runtime/coordinator_liveness.c",
     "s->limit_ms = (uint32_t)(want < cap ? want : cap);",
     "s->limit_ms = (uint32_t)want;",
     r"^runtime\.test_coordinator_liveness\.limit_(follows|rules)"),
    ("liveness-long-gaps-learned", "src/runtime/coordinator_liveness.c",
     "if (gap_ms > limit_of(c, s))",
     "if (gap_ms > 1000 * limit_of(c, s))",
     r"^runtime\.test_coordinator_liveness\.limit_(follows|rules)"),
    ("liveness-in-process-timed-out", "src/runtime/coordinator_liveness.c",
     "if (s->pid == (uint32_t)getpid() && dh__inprocess_has(s->name))",
     "if (0 && s->pid == (uint32_t)getpid() && dh__inprocess_has(s->name))",
     r"^runtime\.test_coordinator_liveness\.in_process"),
    # ---- src/runtime/stats_table.c (the metrics table) ----
    ("stats-counter-read-as-double", "src/runtime/stats_table.c",
     "if (t[i].kind == DH_STAT_COUNTER || t[i].kind == DH_STAT_U64) {",
     "if (t[i].kind == DH_STAT_U64) {",
     r"^runtime\.test_metrics\.daemons_serve"),
    ("stats-labelled-series-own-family", "src/runtime/stats_table.c",
     "if (i > 0 && t[i - 1].metric && strcmp(t[i - 1].metric, t[i].metric) == 0) {",
     "if (0 && i > 0 && t[i - 1].metric && strcmp(t[i - 1].metric, t[i].metric) == 0) {",
     r"^runtime\.test_metrics\.daemons_serve"),
    ("stats-repeated-name-kept", "src/runtime/stats_table.c",
     "if (dh__metrics_find(r, v[i].name))",
     "if (0 && dh__metrics_find(r, v[i].name))",
     r"^runtime\.test_metrics\.renders_values"),
    # ---- src/shm/ ----
    ("reclaim-frees-live-holder", "src/shm/arena.c",
     "if (kill(pid, 0) == 0 || errno != ESRCH)",
     "if (0 && (kill(pid, 0) == 0 || errno != ESRCH))",
     r"^(shm\.test_arena\.arena_reclaim|runtime\.test_dataserver\.)"),
    ("reclaim-judges-live-by-stale-errno", "src/shm/arena.c",
     "if (kill(pid, 0) == 0 || errno != ESRCH)",
     "if (kill(pid, 0) == 0 && errno != ESRCH)",
     r"^shm\.test_arena\.arena_reclaim"),
    ("alloc-slab-rounding-off-by-one", "src/shm/arena.c",
     "uint64_t want = ((uint64_t)len + l->slab_size - 1) / l->slab_size;",
     "uint64_t want = ((uint64_t)len + l->slab_size) / l->slab_size;",
     r"^shm\.test_arena\."),
    ("handle-offset-at-end-accepted", "src/shm/arena.c",
     "if (h->offset >= data_end)",
     "if (h->offset > data_end)",
     r"^shm\.test_arena\."),
    ("handle-length-past-end-accepted", "src/shm/arena.c",
     "if (h->length == 0 || h->length > data_end - h->offset)",
     "if (h->length == 0)",
     r"^shm\.test_arena\."),
    ("stale-generation-accepted", "src/shm/arena.c",
     "if (generation != h->generation)",
     "if (0 && generation != h->generation)",
     r"^shm\.test_arena\."),
    ("released-generation-not-stale", "src/shm/arena.c",
     "if (h->generation <= issued)",
     "if (h->generation < issued)",
     r"^shm\.test_arena\."),
    # ---- src/wire/ ----
    ("codec-ndim-bound-off-by-one", "src/wire/codec_values.c",
     "if (ndim > DH_TENSOR_MAX_DIMS) {",
     "if (ndim > DH_TENSOR_MAX_DIMS + 1) {",
     r"^wire\.test_codec\."),
    ("codec-shm-extent-unchecked", "src/wire/codec_values.c",
     "if (wt->location == DH_WIRE_LOC_SHM && nbytes > wt->length)",
     "if (0 && wt->location == DH_WIRE_LOC_SHM && nbytes > wt->length)",
     r"^wire\.test_codec\."),
    ("codec-type-bound-off-by-one", "src/wire/codec.c",
     "if (type < 1 || type > DH_MSG_TYPE_MAX)",
     "if (type < 1 || type > DH_MSG_TYPE_MAX + 1)",
     r"^wire\.test_codec\."),
    ("codec-read-past-end", "src/wire/codec_values.c",
     "if (r->len - r->pos < n)",
     "if (r->len - r->pos + 1 < n)",
     r"^wire\.test_codec\."),
    ("codec-extra-frames-accepted", "src/wire/codec_values.c",
     "if (r->frame != r->n_payloads)",
     "if (r->frame > r->n_payloads)",
     r"^wire\.test_codec\."),
    ("codec-count-overflow-unchecked", "src/wire/codec_values.c",
     "if (*out > left / min_size)",
     "if (*out > left)",
     r"^wire\.test_codec\."),
    ("zmq-frame-size-unchecked", "src/wire/zmq.c",
     "if (frame >= n || payloads[frame].size != nbytes)",
     "if (frame >= n)",
     r"^wire\.test_(zmq|codec)\."),
    ("zmq-payload-cap-off-by-one", "src/wire/zmq.c",
     "if (n_payloads > DH_WIRE_MAX_PAYLOADS)",
     "if (n_payloads > DH_WIRE_MAX_PAYLOADS + 1)",
     r"^wire\.test_(zmq|codec)\."),
]


def sh(cmd, cwd=None, timeout=None, log=None):
    """Runs cmd; returns (rc, seconds). rc 124 on time-out. Output to the log file or piped."""
    start = time.monotonic()
    out = open(log, "a") if log else subprocess.DEVNULL
    try:
        if log:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
        p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)  # the test and every process it started
            p.wait()
            rc = 124
    finally:
        if log:
            out.close()
    return rc, time.monotonic() - start


def sync_tree(repo, dst):
    """Copies the tracked and untracked-not-ignored files of repo into dst, rewriting only
    those whose content changed (so ninja rebuilds only what changed), and removes files
    of dst that are no longer there."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=repo, check=True, capture_output=True).stdout.split(b"\0")
    want = set()
    for f in files:
        if not f:
            continue
        rel = f.decode()
        src = os.path.join(repo, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        want.add(rel)
        out = os.path.join(dst, rel)
        with open(src, "rb") as fh:
            data = fh.read()
        try:
            with open(out, "rb") as fh:
                if fh.read() == data:
                    continue
        except OSError:
            pass
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as fh:
            fh.write(data)
        shutil.copymode(src, out)
    for root, dirs, names in os.walk(dst):
        dirs[:] = [d for d in dirs if d != ".git"]
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), dst)
            if rel not in want:
                os.unlink(os.path.join(root, n))


def test_executables(ctest, build, regex):
    """The test executables (ninja targets) of the ctest tests matching regex."""
    out = subprocess.run([ctest, "--test-dir", build, "-N", "-R", regex,
                          "--show-only=json-v1"], check=True, capture_output=True).stdout
    targets, names = set(), []
    for t in json.loads(out).get("tests", []):
        names.append(t["name"])
        # module.test_file.case runs the executable module_test_file (tests/CMakeLists.txt)
        m = re.match(r"^(\w+)\.(test_\w+)\.\w+$", t["name"])
        if m:
            targets.add("%s_%s" % m.groups())
    return sorted(targets), names


def line_of(text, original):
    return text[:text.index(original)].count("\n") + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this mutant")
    ap.add_argument("--min-kill-rate", type=float, default=0.9)
    ap.add_argument("--scratch", help="scratch folder (default: <repo>/build-mutate)")
    ap.add_argument("--jobs", type=int, default=1, help="ninja -j and ctest -j (default 1)")
    ap.add_argument("--timeout", type=int, default=180,
                    help="seconds for one mutant's tests (a time-out kills it)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mutants = MUTANTS
    names = [m[0] for m in MUTANTS]
    if len(set(names)) != len(names):
        sys.exit("mutate.py: duplicate mutant names")
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            sys.exit("mutate.py: no mutant named %s (--list shows them)" % ", ".join(unknown))
        mutants = [m for m in MUTANTS if m[0] in args.only]

    # every mutant's original text is in its file exactly once
    bad = 0
    for name, path, orig, repl, tests in mutants:
        try:
            with open(os.path.join(repo, path)) as fh:
                text = fh.read()
        except OSError as e:
            print("mutate.py: %s: cannot read %s (%s)" % (name, path, e.strerror),
                  file=sys.stderr)
            bad += 1
            continue
        if text.count(orig) != 1:
            print("mutate.py: %s: '%s' occurs %d times in %s (must be once)"
                  % (name, orig, text.count(orig), path), file=sys.stderr)
            bad += 1
    if bad:
        print("mutate.py: %d mutant(s) no longer match their source (fix them above)" % bad,
              file=sys.stderr)
        return 2
    if args.list:
        for name, path, orig, repl, tests in mutants:
            with open(os.path.join(repo, path)) as fh:
                line = line_of(fh.read(), orig)
            print("%-38s %s:%d\n    - %s\n    + %s\n    tests: %s"
                  % (name, path, line, orig.strip(), repl.strip(), tests))
        print("%d mutants" % len(mutants))
        return 0

    scratch = os.path.abspath(args.scratch or os.path.join(repo, "build-mutate"))
    src, build, logs = (os.path.join(scratch, d) for d in ("src", "build", "logs"))
    os.makedirs(src, exist_ok=True)
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    cmake = os.environ.get("CMAKE", "cmake")
    ctest = os.environ.get("CTEST") or ("/usr/bin/ctest" if os.path.exists("/usr/bin/ctest")
                                        else "ctest")
    jobs = str(args.jobs)
    print("mutate.py: scratch copy %s (the working tree is never edited)" % scratch, flush=True)
    sync_tree(repo, src)
    setup_log = os.path.join(logs, "setup.log")
    # The fault-injection sites are compiled in (DH_ENABLE_FAULTS, as in `make test-asan`):
    # the tests of the clean-up paths arm them, and skip (pass) without them. With the
    # project's .venv the Python package is built too (once, in the baseline): the Python
    # worker's test (test_dataserver_pyworker) starts a real worker process from it, and
    # skips without it (no .venv: DH_PYTHON=OFF).
    venv_py = os.path.join(repo, ".venv", "bin", "python")
    flags = {"DH_ENABLE_FAULTS": "ON", "DH_PYTHON": "ON" if os.path.exists(venv_py) else "OFF"}
    cache = os.path.join(build, "CMakeCache.txt")
    configured = os.path.exists(cache)
    if configured:
        with open(cache) as fh:
            text = fh.read()
        configured = all("%s:BOOL=%s" % kv in text for kv in flags.items())
    if not configured:
        rc, _ = sh([cmake, "-S", src, "-B", build, "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
                   + ["-D%s=%s" % kv for kv in flags.items()]
                   + (["-DPython3_EXECUTABLE=" + venv_py] if flags["DH_PYTHON"] == "ON" else []),
                   log=setup_log)
        if rc:
            print("mutate.py: configure failed; see %s" % setup_log, file=sys.stderr)
            return 2

    # the targets each mutant's tests need (build.ninja first: a new test file is globbed
    # then), and the baseline: unmutated, they must pass
    sh(["ninja", "-C", build, "build.ninja"], log=setup_log)
    plan = []
    for m in mutants:
        targets, tests = test_executables(ctest, build, m[4])
        if not tests:
            print("mutate.py: %s: no test matches %s" % (m[0], m[4]), file=sys.stderr)
            return 2
        plan.append((m, ["datahelix_cli"] + targets, tests))
    all_targets = sorted({t for p in plan for t in p[1]})
    for t in ("datahelix_python", "datahelix_python_files"):  # when DH_PYTHON is on
        if sh(["ninja", "-C", build, "-t", "query", t], log=setup_log)[0] == 0:
            all_targets.append(t)
    # the tests by name, 40 to a regex of one group: CMake's regular expressions allow only a
    # few parentheses and a bounded size (a union of the mutants' regexes failed to compile,
    # and ctest ran no test at all); --no-tests=error makes a regex matching nothing an error
    names = sorted({t for p in plan for t in p[2]})
    chunks = ["^(%s)$" % "|".join(re.escape(t) for t in names[i:i + 40])
              for i in range(0, len(names), 40)]
    print("mutate.py: baseline build and tests (%d targets, %d tests)"
          % (len(all_targets), len(names)), flush=True)
    rc, _ = sh(["ninja", "-C", build, "-j", jobs] + all_targets, log=setup_log)
    for union in chunks:
        if rc == 0:
            rc, _ = sh([ctest, "--test-dir", build, "-R", union, "-j", jobs, "--timeout",
                        str(args.timeout), "--output-on-failure", "--no-tests=error"],
                       log=setup_log, timeout=None)
    if rc:
        print("mutate.py: the unmutated build or tests fail; see %s" % setup_log, file=sys.stderr)
        return 2

    results = []
    for (name, path, orig, repl, regex), targets, tests in plan:
        f = os.path.join(src, path)
        with open(f) as fh:
            text = fh.read()
        line = line_of(text, orig)
        log = os.path.join(logs, name + ".log")
        t0 = time.monotonic()
        try:
            with open(f, "w") as fh:
                fh.write(text.replace(orig, repl))
            rc, _ = sh(["ninja", "-C", build, "-j", jobs] + targets, log=log)
            if rc:
                status, detail = "invalid", "does not build"
            else:
                rc, _ = sh([ctest, "--test-dir", build, "-R", regex, "-j", jobs, "--timeout",
                            str(args.timeout), "--output-on-failure", "--no-tests=error"], log=log,
                           timeout=args.timeout * 2)
                with open(log) as fh:
                    failed = re.findall(r"^\s*\d+ - (\S+) \(", fh.read(), re.M)
                if rc == 124:
                    status, detail = "killed", "time-out"
                elif rc:
                    status = "killed"
                    detail = "%d of %d failed: %s" % (len(failed), len(tests), ", ".join(failed[:2])
                                                       + (" ..." if len(failed) > 2 else ""))
                else:
                    status, detail = "survived", "%d tests passed" % len(tests)
        finally:
            with open(f, "w") as fh:
                fh.write(text)
        secs = time.monotonic() - t0
        results.append({"name": name, "file": path, "line": line, "status": status,
                        "detail": detail, "seconds": round(secs, 1), "tests": regex})
        print("%-38s %-30s %-9s %5.0fs  %s" % (name, "%s:%d" % (path[4:], line), status, secs,
                                                detail), flush=True)

    killed = sum(r["status"] == "killed" for r in results)
    survived = [r for r in results if r["status"] == "survived"]
    invalid = sum(r["status"] == "invalid" for r in results)
    counted = killed + len(survived)
    rate = killed / counted if counted else 1.0
    print("\n| mutant | line | result |\n|---|---|---|")
    for r in results:
        print("| %s | %s:%d | %s |" % (r["name"], r["file"], r["line"], r["status"]))
    print("\nmutants %d: killed %d, survived %d, invalid %d; kill rate %.3f (minimum %.2f)"
          % (len(results), killed, len(survived), invalid, rate, args.min_kill_rate))
    for r in survived:
        print("  survived: %s (%s:%d)" % (r["name"], r["file"], r["line"]))
    print("logs: %s" % logs)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, "killed": killed, "survived": len(survived),
                       "invalid": invalid, "kill_rate": rate}, fh, indent=1)
    return 0 if rate >= args.min_kill_rate else 1


if __name__ == "__main__":
    sys.exit(main())
