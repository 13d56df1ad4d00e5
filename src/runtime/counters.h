/* runtime/counters.h: the one stats idiom of the runtime's servers and clients.
 *
 * The coordinator, the DataServer and the client each list their stats once, in their
 * table (stats_table.h), whose keys are the fields of their public stats struct (runtime.h,
 * client.h). The table makes a struct of dh__counter_t (a uint64 that any thread adds to
 * with a relaxed atomic add, no lock), and the _stats() snapshot copies each one
 * (DH__STAT_READ). Durations are counted in nanoseconds (a SECONDS row x_s counts in x_s_ns)
 * and reported in seconds by the snapshot; gauges (servers alive) add a negative delta,
 * which wraps back exactly.
 *
 * A snapshot reads each counter on its own: two counters that move together (deliveries
 * and notices) may be a few increments apart in a snapshot taken while the process runs,
 * never once it has stopped. Relaxed order is enough: a counter publishes nothing else.
 */
#ifndef DH_RUNTIME_COUNTERS_H
#define DH_RUNTIME_COUNTERS_H

#include <stdatomic.h>
#include <stdint.h>

typedef _Atomic uint64_t dh__counter_t;

/* Adds n (may be a negative delta cast to uint64_t, for a gauge). Any thread. */
static inline void dh__count(dh__counter_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* The counter's value now. Any thread. */
static inline uint64_t dh__counter_get(const dh__counter_t *c)
{
    return atomic_load_explicit((dh__counter_t *)c, memory_order_relaxed);
}

#endif
