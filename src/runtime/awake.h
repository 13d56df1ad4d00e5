/* runtime/awake.h: a loop's own absence, so that silence is judged only over time the judge
 * was awake to hear it (docs/runtime.md, "Liveness"). A thread that waits for messages in a
 * poll of at most poll_ns calls dh__awake_turn once a turn; what the turn took beyond the
 * poll's timeout and the thread's own CPU time is time it was not running: stopped
 * (SIGSTOP, a debugger), or runnable but not scheduled (a saturated CPU). Whoever times
 * peers out by their silence moves their last-heard times forward by that much, so its own
 * absence does not count against them. Blocking elsewhere in a turn counts as absence too
 * (the thread did not listen meanwhile); that only makes a verdict later, never earlier.
 * Cost: two clock reads a turn (a vDSO read and a CLOCK_THREAD_CPUTIME_ID read).
 */
#ifndef DH_RUNTIME_AWAKE_H
#define DH_RUNTIME_AWAKE_H

#include <stdint.h>

#include "datahelix/clock.h"

typedef struct dh__awake {
    uint64_t wall_ns, cpu_ns; /* at the last turn (0: none yet) */
    uint64_t absent_ns;       /* summed over every turn */
} dh__awake_t;

/* Called by the loop's thread once a turn, after its poll (of at most poll_ns) returned:
 * the nanoseconds of this turn's absence (0 on the first call). */
static inline uint64_t dh__awake_turn(dh__awake_t *a, uint64_t poll_ns)
{
    uint64_t wall = dh_clock_now_ns(), cpu = dh_clock_thread_cpu_ns();
    uint64_t away = 0;
    if (a->wall_ns && wall > a->wall_ns) {
        uint64_t spent = (wall - a->wall_ns), busy = poll_ns + (cpu - a->cpu_ns);
        away = spent > busy ? spent - busy : 0;
    }
    a->wall_ns = wall;
    a->cpu_ns = cpu;
    a->absent_ns += away;
    return away;
}

/* t (a last-heard time) moved forward by away, never past now. */
static inline uint64_t dh__awake_forgive(uint64_t t, uint64_t away, uint64_t now)
{
    if (!t)
        return t;
    return t + away < now ? t + away : now;
}

#endif
