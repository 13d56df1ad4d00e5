/* clock.h: monotonic time. Never wall-clock: deadlines travel as durations (docs/design.md §3). */
#ifndef DATAHELIX_CLOCK_H
#define DATAHELIX_CLOCK_H

#include "datahelix/export.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic nanoseconds since an arbitrary origin. Thread-safe; about 20 ns per call (vDSO). */
DH_EXTERN uint64_t dh_clock_now_ns(void);

/* CPU time consumed by the calling thread, in nanoseconds (CLOCK_THREAD_CPUTIME_ID). What a
 * benchmark on a shared machine divides by, so other processes do not count against it. */
DH_EXTERN uint64_t dh_clock_thread_cpu_ns(void);

/* Seconds between two dh_clock_now_ns() readings (end - start; negative if end < start). */
DH_EXTERN double dh_clock_elapsed_s(uint64_t start_ns, uint64_t end_ns);

#ifdef __cplusplus
}
#endif
#endif
