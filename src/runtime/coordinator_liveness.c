/* coordinator_liveness.c: when the coordinator may declare a DataServer dead by its silence
 * (docs/runtime.md, "Liveness"). The coordinator's loop (coordinator.c) asks every 20 ms, after
 * draining what its socket holds, so its own late turn is not taken for a server's silence.
 *
 * Two rules keep a busy machine from turning into a re-execution:
 *   - a DataServer whose loop runs in the coordinator's own process (the embedded mode,
 *     start_cluster: its HELLO's pid is ours and inprocess.c lists its name) is never timed
 *     out: if that process dies, the coordinator dies with it; it leaves by GOODBYE;
 *   - any other server's limit is the configured dead_after_ms or LIMIT_P99_FACTOR x the p99
 *     of its last GAP_RING heartbeat gaps, whichever is larger, capped at LIMIT_CAP_FACTOR x
 *     dead_after_ms so a killed process is still found within a bounded time. The limit
 *     rises at once, from a server's first gap on, when LIMIT_P99_FACTOR x a gap is past it
 *     (a heartbeat sender starved by a saturated CPU is late by more than a second, where
 *     the configured limit is 1 s: waiting for LIMIT_MIN_GAPS gaps first declared such a
 *     server dead in its first seconds); it comes down with the p99, every LIMIT_EVERY
 *     heartbeats once LIMIT_MIN_GAPS were seen. Gaps longer than the limit at the time (a
 *     stopped process, declared dead, that came back) are not learned, so one long stop
 *     does not stretch the next verdict.
 * Silence is counted only over time the coordinator's loop was running to hear it: every
 * turn, what the turn took beyond its poll's timeout and the thread's CPU time (the thread
 * stopped, or runnable and not scheduled: awake.h) moves every server's last-heard time
 * forward (dh__coord_liveness_turn). Without it, a coordinator that did not run for 1.7 s
 * on a saturated CPU declared every server dead at once when it woke, before its ZeroMQ
 * I/O thread had taken in the heartbeats waiting in the kernel (the drain before a verdict,
 * below, did not find them). A gap learned from a heartbeat excludes that absence too.
 * Cost: a sort of GAP_RING floats every LIMIT_EVERY heartbeats of a server; two clock reads
 * a turn.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "datahelix/clock.h"
#include "datahelix/log.h"
#include "runtime/coordinator_internal.h"
#include "runtime/inprocess.h"

#define LIMIT_P99_FACTOR 4.0
#define LIMIT_CAP_FACTOR 10
#define LIMIT_MIN_GAPS 32 /* gaps seen before the limit follows them */
#define LIMIT_EVERY 16    /* heartbeats between two computations */

static int by_value(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static uint32_t limit_of(const dh_coordinator_t *c, const server_t *s)
{
    return s->limit_ms > c->cfg.dead_after_ms ? s->limit_ms : c->cfg.dead_after_ms;
}

void dh__coord_liveness_reset(server_t *s)
{
    s->n_gaps = 0;
    s->limit_ms = 0;
}

void dh__coord_liveness_heard(dh_coordinator_t *c, server_t *s, uint64_t now)
{
    if (!s->alive || now < s->last_seen_ns)
        return;
    double gap_ms = (double)(now - s->last_seen_ns) / 1e6;
    if (gap_ms > limit_of(c, s))
        return;
    s->gap_ms[s->n_gaps % GAP_RING] = (float)gap_ms;
    s->n_gaps++;
    double cap = (double)LIMIT_CAP_FACTOR * c->cfg.dead_after_ms;
    /* Up at once: a gap whose LIMIT_P99_FACTOR multiple is past the limit raises it now, from
     * the first gap on, so a load that starts (or grows) while a server runs is followed
     * before the next gap can be longer still; down only with the p99, below. */
    double now_want = LIMIT_P99_FACTOR * gap_ms;
    if (now_want > s->limit_ms)
        s->limit_ms = (uint32_t)(now_want < cap ? now_want : cap);
    if (s->n_gaps < LIMIT_MIN_GAPS || s->n_gaps % LIMIT_EVERY)
        return;
    float sorted[GAP_RING];
    size_t n = s->n_gaps < GAP_RING ? s->n_gaps : GAP_RING;
    for (size_t i = 0; i < n; i++)
        sorted[i] = s->gap_ms[i];
    qsort(sorted, n, sizeof sorted[0], by_value);
    double p99 = sorted[(size_t)(0.99 * (double)(n - 1))];
    double want = LIMIT_P99_FACTOR * p99;
    s->limit_ms = (uint32_t)(want < cap ? want : cap);
}

/* Whether a live server has been silent past its limit (and is not in this process). Fills
 * why (cap bytes) with the silence and the limit. */
static bool overdue(dh_coordinator_t *c, const server_t *s, uint64_t now, char *why, size_t cap)
{
    if (!s->alive || now < s->last_seen_ns)
        return false;
    uint32_t limit = limit_of(c, s);
    if (now - s->last_seen_ns <= (uint64_t)limit * 1000000ull)
        return false;
    if (s->pid == (uint32_t)getpid() && dh__inprocess_has(s->name))
        return false; /* in this process: late means busy, never dead */
    if (limit > c->cfg.dead_after_ms)
        snprintf(why, cap,
                 "silent for %.0f ms (limit %u ms, learned from its heartbeat gaps; "
                 "configured %u ms)",
                 (double)(now - s->last_seen_ns) / 1e6, limit, c->cfg.dead_after_ms);
    else
        snprintf(why, cap, "silent for %.0f ms (limit %u ms)",
                 (double)(now - s->last_seen_ns) / 1e6, limit);
    return true;
}

void dh__coord_liveness_turn(dh_coordinator_t *c, uint64_t poll_ns)
{
    uint64_t away = dh__awake_turn(&c->awake, poll_ns);
    if (!away)
        return;
    uint64_t now = dh_clock_now_ns();
    for (size_t i = 0; i < c->n_servers; i++)
        c->servers[i].last_seen_ns = dh__awake_forgive(c->servers[i].last_seen_ns, away, now);
    if (away >= (uint64_t)c->cfg.dead_after_ms * 500000ull) /* half the limit, or more */
        dh_log_info("coordinator: this thread did not run for %.0f ms (stopped, or a saturated "
                    "CPU): not counted as any server's silence",
                    (double)away / 1e6);
}

void dh__coord_check_liveness(dh_coordinator_t *c)
{
    char why[160];
    for (size_t i = 0; i < c->n_servers; i++) {
        if (!overdue(c, &c->servers[i], dh_clock_now_ns(), why, sizeof why))
            continue;
        /* When this thread itself was late (a loaded machine), the heartbeats that prove the
         * server alive are waiting in the socket: take them in first. */
        dh__coord_drain(c, 4096);
        if (overdue(c, &c->servers[i], dh_clock_now_ns(), why, sizeof why))
            dh__coord_declare_dead(c, (int32_t)i, why);
    }
}
