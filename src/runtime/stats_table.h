/* runtime/stats_table.h: the one table per component of its stats and Prometheus metrics
 * (datahelix/metrics.h says what a row is; docs/operations.md, "Metrics", lists them and
 * tests/runtime/test_metric_docs.c holds that list to these tables).
 *
 * A row: XX(kind, key, type, label, name, help)
 *   kind   COUNTER, SECONDS, U64, F64, BINDING or METRIC (dh_stat_kind_t, DH_STAT_<kind>)
 *   key    the field of the public stats struct (kinds with a field; in the struct's order:
 *          stats_table.c checks the struct against the table at compile time), the Python
 *          stats() key; a METRIC row's key names its series for the daemon's code
 *   type   COUNTER, GAUGE, HISTOGRAM, or NONE (not served)
 *   label  NULL, "name" (the daemon makes the series) or "name=value" (this row's series of
 *          the family it shares with the row above, whose name it repeats)
 * From the table come: the counters' struct (DH__STAT_COUNTER_FIELD: a dh__counter_t per
 * COUNTER row, key_ns per SECONDS row), the snapshot (DH__STAT_READ), the public
 * dh_metrics_table (names, types, help, the field's offset), the daemons' registries
 * (dh__stats_metrics_build) and their scrape (dh__stats_metrics_mirror), the Python
 * binding's stats() dicts and its rendering of a rank's metrics.
 */
#ifndef DH_RUNTIME_STATS_TABLE_H
#define DH_RUNTIME_STATS_TABLE_H

#include <stddef.h>

#include "datahelix/metrics.h"
#include "runtime/counters.h"
#include "runtime/metrics.h"

/* clang-format off */
#define DH__CLIENT_STATS(XX)                                                                        \
    XX(COUNTER, batches, COUNTER, NULL, "datahelix_client_batches_total", "Batches next() returned.") \
    XX(COUNTER, samples, COUNTER, NULL, "datahelix_client_samples_total", "Samples in those batches.") \
    XX(COUNTER, samples_failed, COUNTER, NULL, "datahelix_client_samples_failed_total",             \
       "Samples that came flagged failed (on_error=skip).")                                        \
    XX(COUNTER, requests_sent, COUNTER, NULL, "datahelix_client_requests_sent_total",               \
       "REQUESTs sent to the coordinator.")                                                         \
    XX(COUNTER, deliveries, COUNTER, NULL, "datahelix_client_deliveries_total", "DELIVERs filed.")  \
    XX(COUNTER, duplicates_dropped, COUNTER, NULL, "datahelix_client_duplicates_dropped_total",     \
       "DELIVERs dropped as duplicates (a request executed twice after a fault).")                  \
    XX(COUNTER, bytes_delivered, COUNTER, NULL, "datahelix_client_delivered_bytes_total",           \
       "Tensor bytes of delivered batches.")                                                        \
    XX(COUNTER, copied_tensors, COUNTER, NULL, "datahelix_client_copied_tensors_total",             \
       "Tensors that came by copy, not in the arena (a full arena).")                               \
    XX(COUNTER, copy_bytes, COUNTER, NULL, "datahelix_client_copy_bytes_total",                     \
       "Bytes the fanout join copied.")                                                             \
    XX(COUNTER, notices, COUNTER, NULL, "datahelix_client_notices_total",                           \
       "Deliveries that came on the local notice channel.")                                        \
    XX(SECONDS, wait_s, COUNTER, NULL, "datahelix_client_wait_seconds_total",                       \
       "Seconds next() blocked waiting for a batch (the training loop's stall).")                   \
    XX(F64, s_per_token, GAUGE, NULL, "datahelix_client_compute_seconds_per_token",                 \
       "Learned compute seconds per token of the training step (0 before data).")                   \
    XX(U64, steps_total, GAUGE, NULL, "datahelix_client_planned_steps",                             \
       "Batches this client will deliver in the pass.")                                             \
    XX(U64, prefetch_now, GAUGE, NULL, "datahelix_client_prefetch_batches",                         \
       "The prefetch horizon now, in batches.")                                                     \
    XX(F64, bytes_outstanding, GAUGE, NULL, "datahelix_client_outstanding_bytes",                   \
       "Estimated decoded bytes of the batches requested and not yet returned, and of the batch "   \
       "last returned (at the last admission).")                                                    \
    XX(F64, bytes_outstanding_peak, GAUGE, NULL, "datahelix_client_outstanding_peak_bytes",         \
       "The most of the same at any admission beyond the first batch in flight.")                   \
    XX(F64, byte_budget, GAUGE, NULL, "datahelix_client_byte_budget_bytes",                         \
       "The bytes prefetch is held to (0: no arena known, no byte limit).")                         \
    XX(COUNTER, rebalance_rounds, COUNTER, NULL, "datahelix_client_rebalance_rounds_total",         \
       "Tier-2 rounds this rank took part in.")                                                     \
    XX(COUNTER, rebalance_applied, COUNTER, NULL, "datahelix_client_rebalance_applied_total",       \
       "Tier-2 rounds that moved parts.")                                                           \
    XX(COUNTER, rebalance_kept_by_gate, COUNTER, NULL,                                              \
       "datahelix_client_rebalance_kept_by_gate_total", "Tier-2 rounds the cost gate kept as they were.") \
    XX(COUNTER, rebalance_moved_parts, COUNTER, NULL, "datahelix_client_rebalance_moved_parts_total", \
       "Parts this rank received by tier 2.")                                                       \
    XX(COUNTER, rebalance_moved_samples, COUNTER, NULL,                                             \
       "datahelix_client_rebalance_moved_samples_total", "Samples this rank received by tier 2.")   \
    XX(COUNTER, rebalance_bytes, COUNTER, NULL, "datahelix_client_rebalance_bytes_total",           \
       "Bytes of the parts received by tier 2.")                                                    \
    XX(COUNTER, rebalance_bytes_remote, COUNTER, NULL, "datahelix_client_rebalance_remote_bytes_total", \
       "Of those, bytes forwarded from other nodes.")                                               \
    XX(F64, rebalance_s_p95, GAUGE, NULL, "datahelix_client_rebalance_decision_p95_seconds",        \
       "p95 of a round's last part materialized to its decision applied.")                          \
    XX(F64, rebalance_s_max, GAUGE, NULL, "datahelix_client_rebalance_decision_max_seconds",        \
       "The most of the same.")                                                                     \
    XX(F64, rebalance_final_s_p95, GAUGE, NULL, "datahelix_client_rebalance_final_p95_seconds",     \
       "p95 of a round's last part materialized to its batches final.")                             \
    XX(COUNTER, rebalance_exchanges, COUNTER, NULL, "datahelix_client_rebalance_exchanges_total",   \
       "Tier-2 rounds whose bytes came through exchange_fn.")                                       \
    XX(F64, rebalance_transfer_s_p95, GAUGE, NULL, "datahelix_client_rebalance_transfer_p95_seconds", \
       "p95 of the exchanges' transfer time.")                                                      \
    XX(F64, rebalance_transfer_s_total, COUNTER, NULL,                                              \
       "datahelix_client_rebalance_transfer_seconds_total", "Seconds those exchanges took.")        \
    XX(BINDING, rebalance_callback_errors, COUNTER, NULL,                                           \
       "datahelix_client_rebalance_callback_errors_total",                                          \
       "feature_fn / sort_fn calls that raised or answered badly.")

#define DH__COORD_STATS(XX)                                                                         \
    XX(COUNTER, requests, COUNTER, NULL, "datahelix_coordinator_requests_total", "REQUESTs received.") \
    XX(COUNTER, dispatches, COUNTER, NULL, "datahelix_coordinator_dispatches_total", "DISPATCHes sent.") \
    XX(COUNTER, redispatches, COUNTER, NULL, "datahelix_coordinator_redispatches_total",            \
       "Requests placed again because their server was declared dead or dropped a DISPATCH.")        \
    XX(COUNTER, completes, COUNTER, NULL, "datahelix_coordinator_completes_total",                  \
       "COMPLETE reports received (executors' and deliverers').")                                   \
    XX(COUNTER, delivered, COUNTER, NULL, "datahelix_coordinator_delivered_total",                  \
       "Requests delivered to their rank (ended in the book).")                                     \
    XX(COUNTER, decisions, COUNTER, "rule", "datahelix_coordinator_decisions_total",                \
       "Placement decisions by the rule that chose the server (dh_place_reason_name; "              \
       "no_candidate: none could take it now, tried again later).")                                 \
    XX(COUNTER, servers_alive, GAUGE, NULL, "datahelix_coordinator_servers_alive", "DataServers alive now.") \
    XX(COUNTER, servers_dead_declared, COUNTER, NULL, "datahelix_coordinator_servers_declared_dead_total", \
       "DataServers declared dead: silent past --dead-after-ms, or gone (GOODBYE, a broken "        \
       "connection).")                                                                              \
    XX(COUNTER, clients, COUNTER, NULL, "datahelix_coordinator_client_registrations_total",         \
       "Clients (ranks) registered, a re-registration counted again.")                              \
    XX(COUNTER, rebalance_rounds, COUNTER, NULL, "datahelix_coordinator_rebalance_rounds_total",    \
       "Tier-2 rebalance rounds gathered and sent to their members.")                               \
    XX(SECONDS, sched_s, COUNTER, NULL, "datahelix_coordinator_sched_seconds_total",                \
       "Seconds spent in the placement rule (dh_place).")                                           \
    XX(METRIC, misses, COUNTER, NULL, "datahelix_coordinator_deadline_misses_total",                \
       "Decisions whose chosen server's predicted ready time T was past the request's deadline "    \
       "(a predicted miss).")                                                                       \
    XX(METRIC, book, GAUGE, NULL, "datahelix_coordinator_book_requests",                            \
       "Requests in the book: received and not yet delivered.")                                     \
    XX(METRIC, late, GAUGE, NULL, "datahelix_coordinator_late_reports_requests",                    \
       "Delivered requests waiting for their executor's report (at most 1024).")                    \
    XX(METRIC, heartbeat_gap, HISTOGRAM, NULL, "datahelix_coordinator_heartbeat_gap_seconds",       \
       "Seconds between a DataServer's heartbeat and its previous message (nominally the "          \
       "heartbeat period, 0.1 s by default; longer gaps are missed heartbeats).")                   \
    XX(METRIC, cpu_ratio, HISTOGRAM, NULL, "datahelix_coordinator_cpu_actual_over_predicted_ratio", \
       "Per executed request: measured CPU seconds / predicted C_cpu (the cost model's "            \
       "prediction x the server's speed factor at placement).")                                     \
    XX(METRIC, cpu_abs_error, HISTOGRAM, NULL,                                                      \
       "datahelix_coordinator_cpu_prediction_abs_error_seconds",                                    \
       "Per executed request: |measured CPU seconds - predicted C_cpu|.")                           \
    XX(METRIC, ready_abs_error, HISTOGRAM, NULL,                                                    \
       "datahelix_coordinator_ready_prediction_abs_error_seconds",                                  \
       "Per executed request: |actual - predicted ready time T| (DISPATCH to the executor's "       \
       "COMPLETE).")                                                                                \
    XX(METRIC, server_alive, GAUGE, "server", "datahelix_coordinator_server_alive",                 \
       "1 while the DataServer is alive, 0 once declared dead.")                                    \
    XX(METRIC, server_queue_depth, GAUGE, "server", "datahelix_coordinator_server_queue_depth",     \
       "Requests the coordinator's book holds for the server: dispatched, not yet executed "        \
       "(corrected by its heartbeats).")                                                            \
    XX(METRIC, server_queued_work, GAUGE, "server",                                                 \
       "datahelix_coordinator_server_queued_work_seconds",                                          \
       "Predicted CPU seconds (speed 1) of the requests in the server's queue.")                    \
    XX(METRIC, server_speed, GAUGE, "server", "datahelix_coordinator_server_speed_factor",          \
       "The server's learned speed factor (measured / predicted CPU).")                             \
    XX(METRIC, server_silence, GAUGE, "server", "datahelix_coordinator_server_silence_seconds",     \
       "Seconds since the server's last message.")

#define DH__DS_STATS(XX)                                                                            \
    XX(COUNTER, tasks, COUNTER, NULL, "datahelix_dataserver_tasks_total", "Requests its workers executed.") \
    XX(COUNTER, samples, COUNTER, NULL, "datahelix_dataserver_samples_total", "Samples its workers executed.") \
    XX(COUNTER, sample_errors, COUNTER, NULL, "datahelix_dataserver_sample_errors_total",           \
       "Samples that failed (decode error, a raising dataset).")                                    \
    XX(COUNTER, delivered_local, COUNTER, "source=own", "datahelix_dataserver_batches_delivered_total", \
       "Batches placed in its arena for its node's ranks, by source: its own workers (own) or "     \
       "another DataServer's forwarding (forwarded).")                                              \
    XX(COUNTER, delivered_forwarded, COUNTER, "source=forwarded",                                   \
       "datahelix_dataserver_batches_delivered_total", NULL)                                        \
    XX(COUNTER, forwarded, COUNTER, NULL, "datahelix_dataserver_forwarded_batches_total",           \
       "Batches it sent to another DataServer (a sidecar's results, tier-2 moves).")                \
    XX(COUNTER, bytes_forwarded, COUNTER, NULL, "datahelix_dataserver_forwarded_bytes_total",       \
       "Payload bytes it sent to another DataServer.")                                              \
    XX(COUNTER, bytes_received, COUNTER, NULL, "datahelix_dataserver_received_bytes_total",         \
       "Payload bytes received from other DataServers.")                                            \
    XX(COUNTER, bytes_cross_node, COUNTER, NULL, "datahelix_dataserver_cross_node_bytes_total",     \
       "Of the forwarded bytes, those sent to another node.")                                       \
    XX(COUNTER, arena_waits, COUNTER, NULL, "datahelix_dataserver_arena_waits_total",               \
       "Times a batch waited for arena space (backpressure).")                                      \
    XX(COUNTER, undeliverable, COUNTER, NULL, "datahelix_dataserver_undeliverable_total",           \
       "Batches dropped because their client was gone.")                                            \
    XX(COUNTER, arena_spills, COUNTER, NULL, "datahelix_dataserver_arena_spills_total",             \
       "Tensors sent by copy after the arena stayed full for 50 ms.")                               \
    XX(COUNTER, rebalance_sent, COUNTER, NULL, "datahelix_dataserver_rebalance_sent_total",         \
       "Tier-2 parts its clients moved to another node.")                                           \
    XX(COUNTER, output_waits, COUNTER, NULL, "datahelix_dataserver_output_waits_total",             \
       "Tasks for another node that waited for the process's output budget (DH_OUTPUT_BUDGET).")    \
    XX(SECONDS, fetch_s, COUNTER, NULL, "datahelix_dataserver_fetch_seconds_total",                \
       "Seconds its workers waited for remote bytes (http, https, s3 sources; 0 for local files).") \
    XX(COUNTER, fetch_bytes, COUNTER, NULL, "datahelix_dataserver_fetch_bytes_total",               \
       "Bytes its workers fetched from remote sources (not from the local cache).")                 \
    XX(METRIC, info, GAUGE, "server", "datahelix_dataserver_info",                                  \
       "1, labelled with the DataServer's name (node-role-pid by default).")                        \
    XX(METRIC, queue_depth, GAUGE, NULL, "datahelix_dataserver_queue_depth",                        \
       "Requests it holds whose executor COMPLETE it has not sent (queued, running, or waiting "    \
       "for their client): what its heartbeat reports.")                                            \
    XX(METRIC, queued_work, GAUGE, NULL, "datahelix_dataserver_queued_work_seconds",                \
       "Predicted CPU seconds (speed 1) of those requests.")                                        \
    XX(METRIC, workers, GAUGE, NULL, "datahelix_dataserver_workers", "Worker threads.")             \
    XX(METRIC, busy_s, COUNTER, NULL, "datahelix_dataserver_worker_busy_seconds_total",             \
       "Wall seconds workers spent executing tasks (counted as each ends).")                        \
    XX(METRIC, busy_ratio, GAUGE, NULL, "datahelix_dataserver_worker_busy_ratio",                   \
       "Fraction of the workers' time spent executing tasks since the previous scrape (0 at the "   \
       "first).")                                                                                   \
    XX(METRIC, arena_size, GAUGE, NULL, "datahelix_dataserver_arena_size_bytes",                    \
       "Its shared-memory arena's size (0 for a sidecar, which has none).")                         \
    XX(METRIC, arena_used_bytes, GAUGE, NULL, "datahelix_dataserver_arena_used_bytes",              \
       "Bytes of the arena's slabs in allocations not yet collected.")                              \
    XX(METRIC, arena_slabs_used, GAUGE, NULL, "datahelix_dataserver_arena_slabs_used",              \
       "Arena slabs in allocations not yet collected.")                                             \
    XX(METRIC, arena_slabs_total, GAUGE, NULL, "datahelix_dataserver_arena_slabs", "Slabs in the arena.") \
    XX(METRIC, arena_allocations, GAUGE, NULL, "datahelix_dataserver_arena_allocations_live",       \
       "Arena allocations still referenced (batches ranks hold).")                                  \
    XX(METRIC, cpu_ratio, HISTOGRAM, NULL, "datahelix_dataserver_cpu_actual_over_predicted_ratio",  \
       "Per executed request: measured CPU seconds / the DISPATCH's predicted CPU seconds at "      \
       "speed 1 (a server slower than speed 1 reads above 1).")
/* clang-format on */

/* The counters' struct: a dh__counter_t per COUNTER row, key_ns per SECONDS row. */
#define DH__STAT_COUNTER_FIELD(kind, key, ...) DH__STAT_CF_##kind(key)
#define DH__STAT_CF_COUNTER(key) dh__counter_t key;
#define DH__STAT_CF_SECONDS(key) dh__counter_t key##_ns;
#define DH__STAT_CF_U64(key)
#define DH__STAT_CF_F64(key)
#define DH__STAT_CF_BINDING(key)
#define DH__STAT_CF_METRIC(key)

/* In a snapshot, with `out` the public struct and `in` the counters: the counted fields
 * (the snapshot sets the U64 and F64 ones itself). */
#define DH__STAT_READ(kind, key, ...) DH__STAT_RD_##kind(key)
#define DH__STAT_RD_COUNTER(key) out->key = dh__counter_get(&in->key);
#define DH__STAT_RD_SECONDS(key) out->key = (double)dh__counter_get(&in->key##_ns) * 1e-9;
#define DH__STAT_RD_U64(key)
#define DH__STAT_RD_F64(key)
#define DH__STAT_RD_BINDING(key)
#define DH__STAT_RD_METRIC(key)

/* Row indices: DH__CLIENT_ROW_key, DH__COORD_ROW_key, DH__DS_ROW_key, and the counts. */
#define DH__STAT_ROW_CLIENT(kind, key, ...) DH__CLIENT_ROW_##key,
#define DH__STAT_ROW_COORD(kind, key, ...) DH__COORD_ROW_##key,
#define DH__STAT_ROW_DS(kind, key, ...) DH__DS_ROW_##key,
enum { DH__CLIENT_STATS(DH__STAT_ROW_CLIENT) DH__CLIENT_ROWS };
enum { DH__COORD_STATS(DH__STAT_ROW_COORD) DH__COORD_ROWS };
enum { DH__DS_STATS(DH__STAT_ROW_DS) DH__DS_ROWS };

/* A daemon's registry made from its table, in the table's order: per row its family (rows
 * sharing one share it; NULL for a row not served) and its series (a row with no label or
 * a "name=value" one; NULL for a row whose daemon makes the series by label). A histogram
 * row takes its bounds from bounds(row, &n). 0 or DH_ENOMEM (set). */
typedef const double *(*dh__stats_bounds_fn)(size_t row, size_t *n);
int dh__stats_metrics_build(dh__metrics_t *r, dh_metrics_of_t of, dh__stats_bounds_fn bounds,
                            dh__metric_t **family, dh__series_t **series);

/* Sets each series of a row with a stats field (COUNTER ... F64) to that field of `stats`
 * (the component's public stats struct). The scrape's collect callback. */
void dh__stats_metrics_mirror(dh_metrics_of_t of, const void *stats, dh__series_t *const *series);

#endif
