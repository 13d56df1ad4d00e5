/* progress.h: one progress line of a benchmark, formatted and handed to the caller's
 * callback (the `progress` field of the bench, rebalance-bench and transport-bench
 * options; NULL is silent). Lines longer than 511 bytes are cut. */
#ifndef DH_BENCH_PROGRESS_H
#define DH_BENCH_PROGRESS_H

typedef void (*dh__bench_progress_fn)(const char *line, void *ctx);

void dh__bench_progress(dh__bench_progress_fn fn, void *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
