/* bench/train_prefetch.h: pool's object-store hop off the training thread, a background
 * prefetch stage per rank (Ray Data's iter_torch_batches(prefetch_batches=...) model;
 * docs/benchmarks.md, "Systems").
 *
 * One thread per rank takes the rank's batches from its client in order, as soon as each is
 * ready and the stage has room, copies every tensor into memory of its own (the real
 * memcpy), releases the arena batch, pays the emulated copy (sleeping copy_s_per_B per
 * payload byte: the one transfer cost, the same charge as the fanout join on a client's
 * fetcher) and queues the copy for the training loop. The stage holds at most `ahead`
 * batches (queued, or being copied), so a copy overlaps the steps the training loop
 * computes meanwhile; the client is given the rest of the system's in-flight depth
 * (dh_bench_copy_ahead), so the rank's depth in all stays the same. The copy thread is a
 * thread of the training process, not one of the system's (virtual) cores: emulated, its
 * charge is a sleep, as the join's is; in dataset mode the memcpy is its only cost and it
 * runs on the real cores beside the decode workers.
 *
 * Threading: _new starts the thread, which alone calls dh_client_next on that client until
 * it has taken `count` batches; _next and dh_bench_copied_release belong to the training
 * thread; _destroy (any one thread) stops and joins it, after which the client is the
 * caller's again.
 */
#ifndef DH_BENCH_TRAIN_PREFETCH_H
#define DH_BENCH_TRAIN_PREFETCH_H

#include <stdint.h>

#include "datahelix/client.h"

/* A batch copied out of the arena: `batch` has the client batch's fields (tensors pointing
 * into the copy, samples' ids copied); valid until released. */
typedef struct dh_bench_copied {
    dh_client_batch_t batch;
    double bytes; /* payload bytes copied */
} dh_bench_copied_t;

typedef struct dh_bench_prefetch dh_bench_prefetch_t;

/* Batches the stage copies ahead within an in-flight depth of `depth` batches (at least 2):
 * min(2, depth - 1). Ray Data's default prefetch_batches is 1; 2 gives pool more slack for
 * a large batch's copy. The client then keeps depth - this in flight. */
uint32_t dh_bench_copy_ahead(uint32_t depth);

/* Starts the stage on `client` (borrowed; its dh_client_next belongs to the stage until
 * _destroy): `count` batches, `ahead` (>= 1) held at most, copy_s_per_B seconds slept per
 * payload byte copied (0 = the memcpy alone). Returns 0, DH_ENOMEM, or -errno (the thread);
 * *out is the caller's (dh_bench_prefetch_destroy). */
int dh_bench_prefetch_new(dh_bench_prefetch_t **out, dh_client_t *client, uint64_t count,
                          uint32_t ahead, double copy_s_per_B);

/* The next copied batch in order, blocking until the stage has it. Returns 0 and *out (the
 * caller's: dh_bench_copied_release); the client's error for that batch (the message, from
 * the stage's thread, in dh_last_error()); DH_EEOF past `count`. */
int dh_bench_prefetch_next(dh_bench_prefetch_t *p, dh_bench_copied_t **out);

/* Frees a copied batch. Safe on NULL; sets *b = NULL. */
void dh_bench_copied_release(dh_bench_copied_t **b);

/* Stops the stage (a dh_client_next in progress returns within the client's
 * next_timeout_ms), joins the thread and frees what it still holds. Safe on NULL. */
void dh_bench_prefetch_destroy(dh_bench_prefetch_t **p);

#endif
