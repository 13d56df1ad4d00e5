/* progress.c: a benchmark's progress line (progress.h). */
#include <stdarg.h>
#include <stdio.h>

#include "bench/progress.h"

void dh__bench_progress(dh__bench_progress_fn fn, void *ctx, const char *fmt, ...)
{
    if (!fn)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fn(line, ctx);
}
