/* clock.c: monotonic clock helpers. */
#include <time.h>

#include "dh_config.h"
#include "datahelix/clock.h"

uint64_t dh_clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t dh_clock_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double dh_clock_elapsed_s(uint64_t start_ns, uint64_t end_ns)
{
    if (end_ns >= start_ns)
        return (double)(end_ns - start_ns) * 1e-9;
    return -(double)(start_ns - end_ns) * 1e-9;
}
