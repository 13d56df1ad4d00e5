/* sim/event.h: the simulator's event queue: a binary min-heap of timed events in virtual
 * seconds (docs/simulator.md, "Time"). Ties break on insertion order, so a run is
 * deterministic. One thread.
 */
#ifndef DH_SIM_EVENT_H
#define DH_SIM_EVENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct dh_sim_event {
    double t_s;   /* virtual time */
    uint64_t seq; /* insertion order: the tie-break */
    uint32_t type;
    uint32_t a; /* the event's subject (a rank, a server) */
    uint64_t b; /* and its object (a request, a batch) */
} dh_sim_event_t;

typedef struct dh_sim_events {
    dh_sim_event_t *heap;
    size_t n, cap;
    uint64_t next_seq;
} dh_sim_events_t;

/* Adds an event. O(log n). Returns 0 or DH_ENOMEM (the queue is unchanged). */
int dh__sim_events_push(dh_sim_events_t *q, double t_s, uint32_t type, uint32_t a, uint64_t b);

/* Removes the earliest event into *out. Returns 1, or 0 when empty. O(log n). */
int dh__sim_events_pop(dh_sim_events_t *q, dh_sim_event_t *out);

void dh__sim_events_clear(dh_sim_events_t *q);

#endif
