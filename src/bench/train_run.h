/* bench/train_run.h: the state of one `bench` system's run, shared by train_bench.c (the
 * ranks' threads and the run) and train_metrics.c (what is measured from it: the trace,
 * the prediction errors, the balance bound, the memory sampler). Internal to src/bench.
 */
#ifndef DH_BENCH_TRAIN_RUN_H
#define DH_BENCH_TRAIN_RUN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "datahelix/client.h"
#include "datahelix/runtime.h"
#include "bench/train_bench.h"
#include "bench/train_cluster.h"
#include "bench/train_prefetch.h"

/* ---- sample lookups (id -> row) ---- */

typedef struct row_ref {
    const char *id;
    double cpu_s; /* actual (emulated: the estimate x the synthetic pipeline's noise) */
} row_ref_t;

/* ---- one system's run ---- */

typedef struct step_rec {
    double wait_s, compute_s, barrier_s, ready_s, cpu_s;
    uint32_t samples;
    double *tok;       /* the batch's samples' actual tokens (samples of them), for the bound */
    uint64_t start_ns; /* next() called */
    uint64_t ready_ns; /* batch ready in the arena */
    uint64_t req_ns;   /* requests sent */
    int server;        /* index into run_t.server_names, or -1 */
} step_rec_t;

typedef struct run run_t;

typedef struct rank_ctx {
    run_t *run;
    uint32_t rank;
    dh_client_t *client;
    dh_bench_prefetch_t *stage; /* pool: its copy stage, which alone calls next() */
    step_rec_t *steps;          /* warmup + steps */
    double copy_bytes;          /* emulated bytes of pool's copies */
    uint64_t window_in_ns;      /* arrived at the barrier that opens the measured window */
    uint64_t window_out_ns;     /* left the barrier that closes it */
    int rc;
    char error[512];
} rank_ctx_t;

struct run {
    const dh_bench_options_t *opt;
    const dh_bench_system_t *spec;
    const row_ref_t *refs;
    size_t n_refs;
    double a, b; /* seconds (already time-scaled) */
    pthread_barrier_t barrier;
    /* The measured window: while running, rank 0's clock after the barriers (its progress
     * lines); after the run, from the last rank's arrival at the opening barrier to the
     * first rank's exit from the closing one, so it holds the barriers' releases whichever
     * rank the scheduler wakes late */
    uint64_t t_begin, t_end;
    /* the process's CPU seconds (user, system) and minor page faults at t_begin and t_end
     * (getrusage, taken by rank 0 just after the barrier) */
    double user_s[2], sys_s[2], minflt[2];
    char server_names[DH_BENCH_MAX_SERVERS][64];
    size_t n_server_names;
    pthread_mutex_t names_lock;
};

/* The memory the process holds while a system runs: its proportional set size (Pss, where a
 * page of an arena mapped by both its DataServer and a client counts once; RSS counts it
 * twice), sampled from /proc/self/smaps_rollup by a thread of its own. 0 where the file
 * cannot be read. A reading walks every page table entry of the process, so its cost grows
 * with the memory mapped: with helix's 5 GB of arena on the large-samples run, reading every
 * 100 ms took a quarter of the process's CPU time, on the cores its decoders needed
 * (docs/benchmarks.md, "Large samples"). So after each reading the sampler pauses 100 ms, or
 * long enough that its readings take at most DH__TRAIN_MEM_DUTY of one core if longer
 * (dh__train_mem_pause_s of the reading's CPU seconds). */
typedef struct mem_sampler {
    pthread_t thread;
    atomic_int stop;
    bool started;
    double peak_mb;
    double (*read_mb)(void); /* the reading (MB): Pss from smaps_rollup, or a test's */
    atomic_uint readings;    /* taken so far */
    double cpu_s;            /* CPU seconds its readings took (read after stop) */
} mem_sampler_t;

#define DH__TRAIN_MEM_DUTY 0.02
#define DH__TRAIN_MEM_PAUSE_MIN_S 0.1

/* The sampler's pause after a reading that cost read_cpu_s CPU seconds (of its thread):
 * max(DH__TRAIN_MEM_PAUSE_MIN_S, read_cpu_s x (1 / DH__TRAIN_MEM_DUTY - 1)). */
double dh__train_mem_pause_s(double read_cpu_s);

/* ---- train_metrics.c ---- */

void dh__train_trace_system(FILE *f, int *first, size_t sys, const run_t *run,
                            const rank_ctx_t *ranks, uint64_t t0);
int dh__train_prediction_metrics(const dh_bench_options_t *opt, const dh_coordinator_t *coord,
                                 const rank_ctx_t *ranks, uint32_t fanout, double threshold,
                                 dh_bench_system_result_t *res);
int dh__train_balance_bound(const dh_bench_options_t *opt, const rank_ctx_t *ranks, double a,
                            double b, double mean_sum, dh_bench_system_result_t *res);
void dh__train_mem_sampler_start(mem_sampler_t *m);
/* The same with another reading in place of the Pss (tests). */
void dh__train_mem_sampler_start_with(mem_sampler_t *m, double (*read_mb)(void));
/* Stops it: returns the peak (MB) of its readings and a last one; m->cpu_s is then set. */
double dh__train_mem_sampler_stop(mem_sampler_t *m);

#endif
