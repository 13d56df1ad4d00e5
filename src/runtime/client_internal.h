/* runtime/client_internal.h: a client's state and the internals its files share: client.c
 * (life cycle, next() and batches), client_plan.c (planning calls), client_send.c (the sender
 * thread), client_fetch.c (the fetcher thread) and tier 2's client_rebalance*.c (on the
 * fetcher thread). Threads and locking: see client.c.
 */
#ifndef DH_RUNTIME_CLIENT_INTERNAL_H
#define DH_RUNTIME_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "datahelix/client.h"
#include "datahelix/cluster.h"
#include "datahelix/profile.h"
#include "datahelix/runtime.h"
#include "datahelix/sampler.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/awake.h"
#include "runtime/counters.h"
#include "runtime/rt.h"
#include "runtime/stats_table.h"

#define NAME_CAP 128
#define ENDPOINT_CAP 256
#define MAX_ARENAS 8

/* The client's counters (counters.h): one per COUNTER or SECONDS row of its table
 * (stats_table.h; wait_s_ns is wait_s). */
typedef struct dh__client_counters {
    DH__CLIENT_STATS(DH__STAT_COUNTER_FIELD)
} dh__client_counters_t;

typedef struct arena_ref {
    dh_shm_arena_t *arena;
    uint64_t id;
    atomic_int refs;
} arena_ref_t;

typedef struct part {
    bool ready;
    uint64_t seq;
    size_t n_tensors;
    dh_tensor_t tensors[DH__RT_MAX_TENSORS];
    dh_shm_handle_t handles[DH__RT_MAX_TENSORS];
    void *copies[DH__RT_MAX_TENSORS]; /* tensors that came as payload frames (spilled) */
    arena_ref_t *arena;
    uint32_t n_samples;
    dh_wire_sample_result_t *samples; /* owned (moved from the decoded message) */
    char server[NAME_CAP];
    uint64_t ready_ns, received_ns;
    /* fanout > 1, in the batch's first part: its tensors are the joined batch (copies in
     * copies[]; the other parts keep only their samples), or join_rc says why not */
    bool joined;
    int join_rc;
    char join_error[256];
    /* tier 2 on, in the batch's first part: its round is applied (and the batch joined):
     * next() may take it */
    bool final;
} part_t;

/* Tier 2's state (client_rebalance.c). The fetcher thread owns it; the fields marked
 * "lock" are also read by next() and dh_client_stats under c->lock. */
#define RB_WINDOW 8 /* rounds offered and not yet applied, at most */
#define RB_DURATIONS 512

typedef struct rb_expect {
    uint64_t seq; /* the DELIVER seq the part comes under (RB_SEQ_BIT set) */
    size_t slot;  /* its ring slot */
    bool done;
} rb_expect_t;

typedef struct rb_state {
    bool on;
    uint32_t group;  /* this rank's group id */
    uint32_t *ranks; /* the group's ranks, ascending */
    uint32_t n_ranks;
    uint32_t steps;               /* batches per round */
    char *args;                   /* the config's args (owned copy) */
    dh_wire_socket_t *sock;       /* DEALER "<id>/rb" to the coordinator */
    uint64_t offered;             /* rounds below it have been offered */
    uint64_t applied;             /* rounds below it are applied (lock) */
    dh_msg_t got[RB_WINDOW];      /* the ROUND or END of round r at r % RB_WINDOW (type 0: none) */
    uint64_t ready_ns[RB_WINDOW]; /* when round r's last part was ready in an arena */
    uint64_t got_ns[RB_WINDOW];   /* when its ROUND or END came */
    /* the round being applied: the parts still to come from other nodes */
    bool applying;
    uint64_t applying_since_ns;
    rb_expect_t *expect;
    size_t n_expect, cap_expect;
    part_t *early; /* parts from other nodes that came before their round was applied */
    size_t n_early, cap_early;
    uint64_t last_ready_ns; /* the latest part materialized in the rounds started */
    /* the joiner thread (fanout > 1): joins batches [join_next, join_until) (lock) */
    pthread_t joiner;
    bool joiner_started, join_cond_made, join_stop;
    pthread_cond_t join_cond;
    uint64_t join_next, join_until;
    double durations[RB_DURATIONS]; /* lock: the last rounds' decision times */
    size_t n_durations;
    double duration_max;                  /* lock */
    double final_durations[RB_DURATIONS]; /* lock: the last rounds' times to final batches */
    size_t n_final;
    double transfer_durations[RB_DURATIONS]; /* lock: the last cross-node transfers' times */
    size_t n_transfer;
    double transfer_total; /* lock */
    int err;               /* lock: a round's error for next() (0: none) */
    uint64_t err_batch;    /* lock: the batch next() reports it at */
    char err_msg[768];     /* lock */
} rb_state_t;

/* A DELIVER seq of a part moved to this rank from another node: the bit, the round in the
 * bits above 24, the part's index in the round below. */
#define RB_SEQ_BIT (1ull << 63)

/* The default features of an offered part (no feature_fn): tokens, bytes, measured decode
 * seconds. */
#define RB_DEFAULT_FEATURES 3

/* What a member's policy made of a ROUND (client_rebalance_decide.c). */
typedef struct rb_decision {
    uint32_t *new_rank; /* per part of the ROUND */
    bool apply;
    bool gate_kept;
    double gain_s, cost_s, transfer_s, max_before_s;
    uint32_t moved;
    int err;
    char why[512];
} rb_decision_t;

typedef struct ds_info {
    char name[NAME_CAP];
    char endpoint[ENDPOINT_CAP];
    char shm_socket[NAME_CAP];
    uint64_t generation;
} ds_info_t;

struct dh_client {
    dh_client_config_t cfg;
    char id[NAME_CAP];
    char node[NAME_CAP];
    char coord_endpoint[ENDPOINT_CAP];
    dh_profile_set_t *profiles;
    dh_sampler_t *sampler;      /* sender thread */
    dh_sampler_t *plan_sampler; /* dh_client_plan_rank_step */
    pthread_mutex_t plan_lock;
    size_t steps_per_epoch;
    uint64_t step0; /* global step of batch 0: first_epoch's first step + first_step */
    uint64_t total;

    void *ctx;
    dh_wire_keys_t *keys; /* CURVE (cfg.keys_dir), or NULL */
    dh_cluster_t
        *embedded; /* no coordinator given: its own (include/datahelix/cluster.h), or NULL */
    dh_wire_socket_t *coord; /* sender thread after start */
    dh_wire_socket_t *data;  /* fetcher thread after start */
    int notice_fd;           /* fetcher thread after start; -1: none */
    arena_ref_t *arenas[MAX_ARENAS];
    size_t n_arenas; /* fetcher thread after start */

    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t consumed; /* batches returned by next() */
    uint64_t planned;  /* batches requested */
    uint64_t delivered_parts_inflight;
    part_t *ring;      /* max(prefetch, prefetch_max) x fanout parts */
    uint32_t horizon;  /* batches requested ahead of next(): prefetch, deepened up to
                        * prefetch_max when next() waits */
    double arena_used; /* adaptive prefetch: share of the local arena's slabs in use, as
                        * of the last delivery (the horizon deepens only below half) */
    size_t ring_size;
    int64_t *tokens_of; /* ring of planned batches' tokens */
    size_t tokens_ring;
    uint64_t *requested_of; /* send time of each batch's requests, ring like tokens_of */
    ds_info_t ds;           /* the local DataServer, from the coordinator */
    /* Prefetch in bytes (client_send.c; lock held): */
    double *bytes_of;       /* ring like tokens_of: each planned batch's estimated bytes
                             * (descriptors' out_bytes, padded as collated) */
    double *bytes_scratch;  /* tokens_ring entries for dh_deadline_byte_horizon */
    double bytes_ratio;     /* learned decoded / estimated bytes (1 until learned) */
    bool bytes_learned;     /* bytes_ratio measured on a delivered batch */
    double held_bytes;      /* arena bytes of the batch last returned (fanout 1) */
    double slab_bytes;      /* the arena's slab size (each tensor rounds up to slabs) */
    uint32_t batch_tensors; /* tensors per batch (2 until a batch is seen) */
    double byte_budget;     /* this rank's share of the local arena; 0 = none known */
    double largest_batch;   /* batch x the largest sample's out_bytes (the profiles) */
    double bytes_outstanding, bytes_outstanding_peak;
    double s_per_token, mean_window_s;
    uint64_t last_return_ns;
    dh__client_counters_t counters; /* any thread (counters.h) */
    /* A request the coordinator dropped: its ERROR's code (0: none) and message, with which
     * next() fails rather than wait for a batch that will not come. */
    int refused;
    char refused_msg[2 * NAME_CAP];
    /* The coordinator's liveness (sender thread): the incarnation of its HELLOs (wire.h; a
     * change means it restarted: the requests of every batch not received go out again),
     * when it was last heard from, when the last HELLO went to it, and whether to send one
     * now (it answered a REQUEST with "unknown client"). */
    uint64_t coord_incarnation;
    uint64_t coord_heard_ns, coord_pinged_ns;
    uint64_t no_local_since_ns; /* the coordinator has said since then that this node has no
                                 * live local DataServer (0: it has one) */
    bool coord_rehello, coord_resend;
    dh__awake_t awake; /* the sender thread's own absence: not the coordinator's silence */

    rb_state_t rb; /* tier 2 */

    atomic_int stop;
    pthread_t sender, fetcher;
    bool threads_started;
};

/* ---- client.c ---- */

/* Whether a batch is `fanout` one-sample slots (tier 2 with packing, fanout > batch): the
 * rows planned fill the first slots, the others are empty and never requested. */
bool dh__client_slots(const dh_client_t *c);

/* Drops one reference to an arena mapping; the last one unmaps it. Thread-safe. */
void dh__client_arena_ref_drop(arena_ref_t *a);

/* Gives back a part's slabs and copies, keeping its samples (a joined batch's parts). */
void dh__client_part_release_tensors(part_t *p);

/* Gives back everything a part holds and zeroes it. */
void dh__client_part_release(part_t *p);

/* ---- client_plan.c ---- */

/* The profile rows `rank` gets at `step`, in window order (dh_plan_rank_share under the
 * client's config), from `sampler`. Returns the count or < 0. */
int dh__client_plan_rank_step(dh_client_t *c, dh_sampler_t *sampler, uint64_t step, uint32_t rank,
                              uint32_t *rows, size_t cap);

/* Marks the pads of an epoch's last step (keep_tail) among a batch's n samples (takes
 * plan_lock). Returns 0 or DH_ENOMEM. */
int dh__client_mark_pads(dh_client_t *c, uint64_t step, dh_client_sample_t *samples, size_t n);

/* ---- client_send.c ---- */

/* docs/design.md §4.2: D(b), the seconds until the rank calls next() for batch b (lock
 * held). */
double dh__client_deadline_s(const dh_client_t *c, uint64_t b);

/* The sender thread (pthread_create's start routine; arg is the client). */
void *dh__client_sender_main(void *arg);

/* The estimated decoded bytes of a batch of `n` profile rows: n x the largest frames x
 * height x width x 3 x element size among them (collation pads to the largest), or the sum
 * of their out_bytes when a row lacks a shape. */
double dh__client_batch_bytes(const dh_client_t *c, const uint32_t *rows, int n);

/* Learns the decoded / estimated byte ratio from batch b's `actual` bytes (lock held). */
void dh__client_learn_bytes(dh_client_t *c, uint64_t b, double actual);

/* The HELLO this client sends (to the coordinator, and to its local DataServer): role,
 * node, id, pid, rank. The strings are borrowed from c. */
dh_msg_t dh__client_hello(dh_client_t *c);

/* ---- client_fetch.c ---- */

/* Connects the data socket and maps the arena of the DataServer in `ds` (the caller copies
 * c->ds under the lock). Returns 0 or a negative code with a message. */
int dh__client_connect_local(dh_client_t *c, const ds_info_t *ds);

/* The fetcher thread (pthread_create's start routine; arg is the client). */
void *dh__client_fetcher_main(void *arg);

/* Files a DELIVER that came on the notice channel or the data socket (fetcher thread): its
 * handles resolved into a part, filed in the ring by seq; a seq outside the window
 * [consumed, planned) x fanout, or one already filled, is a duplicate: dropped, its slabs
 * given back at once, counted in duplicates_dropped. With fanout > 1 the batch's last part
 * joins the batch. r->msg's samples may be taken; the caller still releases r.
 * tests/runtime/test_client_fetch.c drives it with a client made by hand. */
void dh__client_on_deliver(dh_client_t *c, dh_wire_received_t *r);
/* After the client's GOODBYE on its data socket (the fetcher stopped): drops, giving their
 * slabs back, the DELIVERs the DataServer sent before it read the GOODBYE, until the
 * DataServer's GOODBYE answers it (at most 1 s: a server that is gone never answers). */
void dh__client_drain_after_goodbye(dh_client_t *c);

/* Joins a batch's parts into parts[0] (fanout > 1; see client_fetch.c). 0 or a code, with
 * the reason in why. */
int dh__client_join_parts(part_t *parts, size_t n_parts, uint64_t batch, char *why, size_t why_cap);

/* Joins a batch's held parts (dh__client_join_parts), counts the bytes of the joined batch
 * in copy_bytes and spends the emulated copy of them (emulate_copy_s_per_B per byte) on the
 * calling thread, so the batch counts as ready after it. The one place the fetcher
 * (fanout > 1) and tier 2's joiner join a batch. 0 or dh__client_join_parts's code, with the
 * reason in why. */
int dh__client_join(dh_client_t *c, part_t *parts, uint32_t n_parts, uint64_t batch, char *why,
                    size_t why_cap);

/* The arena mapping with this id, or NULL (fetcher thread). */
arena_ref_t *dh__client_arena_by_id(dh_client_t *c, uint64_t id);

/* Builds a part from a DELIVER's tensors and samples (resolving handles in the mapped
 * arenas, copying spilled frames; the samples are moved out of m). 0, or a negative code
 * with every slab of m given back. */
int dh__client_part_from_deliver(dh_client_t *c, dh_msg_deliver_t *m, part_t *p, uint64_t *copied);

/* ---- client_rebalance.c ---- */

/* Sets up tier 2 from the config (group, steps per round). 0 or DH_EINVAL / DH_ENOMEM. */
int dh__client_rb_init(dh_client_t *c, const dh_client_config_t *cfg);

/* Fills the rebalance_s_* stats (lock held). */
void dh__client_rb_stats(const dh_client_t *c, dh_client_stats_t *out);

/* Stops tier 2's joiner thread (before the ring is released). */
void dh__client_rb_stop(dh_client_t *c);

/* Frees tier 2's state (after the threads stopped). */
void dh__client_rb_destroy(dh_client_t *c);

/* The fetcher's tier-2 work: offers rounds whose parts are all here, applies rounds that
 * came back, finishes rounds whose parts from other nodes arrived. */
void dh__client_rb_progress(dh_client_t *c);

/* A REBALANCE from the coordinator on the tier-2 socket (fetcher thread; r->msg may be
 * taken). */
void dh__client_rb_on_message(dh_client_t *c, dh_wire_received_t *r);

/* Whether batch b is in the round of the batch next() waits for (its requests go out
 * whatever the byte budget, or the round could never complete). Lock held. */
bool dh__client_rb_must_request(const dh_client_t *c, uint64_t b);

/* Sets round r's error for next() (the first one only: code, and "rebalance round R (group
 * G): what"), and wakes next(). Takes the lock. */
void dh__client_rb_set_error(dh_client_t *c, uint64_t r, int code, const char *what);

/* Records a cross-node transfer's time (rebalance_transfer_s_*). Takes the lock. */
void dh__client_rb_record_transfer(dh_client_t *c, double s);

/* ---- client_rebalance_decide.c ---- */

/* The index of `rank` among the ROUND's members, or -1. */
int dh__client_rb_member_of(const dh_msg_rebalance_t *m, uint32_t rank);

/* Runs this client's policy on the ROUND m into d (d->new_rank holds m->n_parts entries):
 * every part's new rank (each part's own when the round keeps), whether to apply, the
 * verdict's figures, or d->err with d->why (a failed policy, a bad assignment). */
void dh__client_rb_decide(dh_client_t *c, const dh_msg_rebalance_t *m, rb_decision_t *d);

/* ---- client_rebalance_move.c ---- */

/* Applies the ROUND m's assignment (new_rank, per part) to this rank's ring: parts that
 * leave are handed over or given back, parts that come are taken over, taken from
 * exchange_fn's bytes or expected as DELIVERs (c->rb.expect). An error is set for next()
 * (dh__client_rb_set_error). */
void dh__client_rb_apply(dh_client_t *c, const dh_msg_rebalance_t *m, const uint32_t *new_rank);

/* A DELIVER of a part moved here from another node (seq has RB_SEQ_BIT): takes the part. */
void dh__client_rb_on_moved(dh_client_t *c, part_t *p);

#endif
