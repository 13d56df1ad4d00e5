/* bench/rebalance_bench_internal.h: what the files of rebalance-bench share, internal to
 * src/bench: the protocol's constants, the clips' helpers (rebalance_clips.c), the on-node
 * coordinator's state, clip_book_t and onnode_t, and the entry of each part: the forked
 * rank (rebalance_rank.c), the coordinator's set-up and end (rebalance_coord.c), its rounds
 * (rebalance_rounds.c) and the cross-node part (rebalance_cross.c). rebalance_bench.c runs
 * them in that order (see rebalance_bench.h).
 */
#ifndef DH_BENCH_REBALANCE_BENCH_INTERNAL_H
#define DH_BENCH_REBALANCE_BENCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "bench/progress.h"
#include "bench/rebalance_bench.h"

#define CHANNELS 3
#define STEP_TIMEOUT_MS 60000 /* longest wait for one reply: a stuck peer fails the run */
#define SLICE_MS 200          /* receive slice between liveness checks */
#define ENDPOINT_CAP 256

#define KIND_ASSIGN "assign"     /* coordinator -> rank: clips allocated for it (set-up) */
#define KIND_HOLDINGS "holdings" /* rank -> coordinator: the clips it holds (the gather) */
#define KIND_HANDOFF "handoff"   /* coordinator -> rank: clips it takes over / gives away */
#define KIND_TAKEN "taken"       /* rank -> coordinator: the clips it took, as resolved */

/* ---- the clips and shared helpers (rebalance_clips.c) ---- */

/* A clip's bytes: frames x height x width x CHANNELS. */
uint64_t dh__rebalance_clip_bytes(const dh_rebalance_bench_options_t *opt);
/* Bytes of an arena holding every clip in slabs of the default size, header included. */
uint64_t dh__rebalance_arena_bytes(const dh_rebalance_bench_options_t *opt);
/* Sets rc's message to "<context>: <the current message>"; returns rc. */
int dh__rebalance_with_context(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A progress line to opt->progress, when set (bench/progress.h). */
#define dh__rebalance_progress(opt, ...)                                                           \
    dh__bench_progress((opt)->progress, (opt)->ctx, __VA_ARGS__)
/* A clip's stamp, how it is written into its bytes, and whether its bytes carry it. */
uint64_t dh__rebalance_clip_tag(uint64_t seed, uint32_t clip);
void dh__rebalance_clip_fill(uint8_t *p, size_t len, uint64_t tag);
bool dh__rebalance_clip_intact(const uint8_t *p, size_t len, uint64_t tag);
/* A clip's tensor "clip<index>": with handle h in shared memory, or a payload frame (h NULL). */
void dh__rebalance_clip_tensor(dh_wire_tensor_t *w, const dh_rebalance_bench_options_t *opt,
                               uint32_t clip, const dh_shm_handle_t *h);
dh_shm_handle_t dh__rebalance_handle_of(const dh_wire_tensor_t *w);
/* The clip index a name "clip<index>" names, or -1 when it names none of the run's clips. */
long dh__rebalance_clip_index(const char *name, uint32_t clips);
/* A received clip tensor of the run's shape and dtype, in `location`: its index or -1. */
long dh__rebalance_clip_of_tensor(const dh_wire_tensor_t *w,
                                  const dh_rebalance_bench_options_t *opt, uint8_t location);
/* All of len bytes from / to a file descriptor: 0, DH_EEOF (read), or -errno. */
int dh__rebalance_read_exact(int fd, void *buf, size_t len);
int dh__rebalance_send_exact(int fd, const void *buf, size_t len);

/* ---- a rank (rebalance_rank.c) ---- */

/* A forked rank's whole life, never returns: attaches to the arena over arena_fd, reads the
 * coordinator's endpoint from setup_fd, serves it, and exits 0 when it left cleanly. */
void dh__rebalance_rank_main(const dh_rebalance_bench_options_t *opt, uint32_t rank, pid_t parent,
                             int arena_fd, int setup_fd) __attribute__((noreturn));

/* ---- the coordinator of the on-node part (rebalance_coord.c, rebalance_rounds.c) ---- */

typedef struct clip_book {
    dh_shm_handle_t handle;    /* as allocated */
    uint32_t owner;            /* the rank holding it, as this book says */
    uint32_t next_owner;       /* this round's decision */
    uint32_t seen_round;       /* round number of the last gather or ack that named it */
    dh_wire_tensor_t gathered; /* the tensor its holder sent in this round's gather */
} clip_book_t;

typedef struct onnode {
    const dh_rebalance_bench_options_t *opt;
    dh_rebalance_bench_report_t *out;
    size_t clip_bytes;
    dh_shm_arena_t *arena;
    pid_t pid[DH_REBALANCE_BENCH_MAX_RANKS];         /* 0: not started or reaped */
    int setup_w[DH_REBALANCE_BENCH_MAX_RANKS];       /* our end of each rank's set-up socket */
    uint32_t expected[DH_REBALANCE_BENCH_MAX_RANKS]; /* clips per rank (kept by every move) */
    void *ctx;
    dh_wire_socket_t *router;
    clip_book_t *book;
    uint32_t *order, *scratch;     /* clips each, for the moves */
    dh_wire_tensor_t *tensors;     /* clips, for messages */
    dh_wire_sample_result_t *gone; /* clips, for messages */
    char (*gone_ids)[16];
    bool coordinator_refs; /* this process took a reference on every clip */
} onnode_t;

/* The next message from a rank, within STEP_TIMEOUT_MS; fails when a rank exits, sends an
 * ERROR, or is not one of ours. `what` names the wait in messages. */
int dh__rebalance_coord_recv(onnode_t *o, dh_wire_received_t *r, uint32_t *rank, const char *what);
int dh__rebalance_send_to_rank(onnode_t *o, uint32_t rank, const dh_msg_t *m);
/* A DELIVER of `kind` to a rank: o->tensors[0..n_tensors) and o->gone[0..n_gone). */
int dh__rebalance_send_deliver(onnode_t *o, uint32_t rank, const char *kind, uint64_t seq,
                               uint32_t n_tensors, uint32_t n_gone);
/* The set-up, in this order: fork the ranks (before any ZeroMQ context or thread), connect
 * them, place the clips. */
int dh__rebalance_start_ranks(onnode_t *o);
int dh__rebalance_connect_ranks(onnode_t *o);
int dh__rebalance_place_clips(onnode_t *o);
/* The timed rounds: ms[rounds] each round's milliseconds, *moved_min the fewest clips
 * that changed owner in a round (rebalance_rounds.c). */
int dh__rebalance_onnode_rounds(onnode_t *o, double *ms, uint32_t *moved_min);
/* The ranks leave; each clip must then hold exactly the coordinator's reference. */
int dh__rebalance_release_ranks(onnode_t *o);
/* Kills and reaps every rank still running, closes the router and its context. */
void dh__rebalance_onnode_stop(onnode_t *o);

/* ---- the cross-node part (rebalance_cross.c) ---- */

/* The clips of o's arena to a second arena across a loopback "node" boundary, through
 * ZeroMQ and through a plain socket; fills o->out's cross fields. */
int dh__rebalance_cross_part(onnode_t *o);

#endif
