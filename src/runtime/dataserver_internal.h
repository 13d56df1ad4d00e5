/* runtime/dataserver_internal.h: the DataServer's state and the internals its files share:
 * dataserver.c (life cycle), dataserver_loop.c (the event loop, registration, heartbeats),
 * dataserver_deliver.c (the clients served, local delivery), dataserver_work.c (the task
 * queue, the worker threads and their output buffers) and dataserver_forward.c (links to other
 * DataServers, forwarding, pending deliveries). Threads: see dataserver.c.
 */
#ifndef DH_RUNTIME_DATASERVER_INTERNAL_H
#define DH_RUNTIME_DATASERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "datahelix/runtime.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/counters.h"
#include "runtime/notice.h"
#include "runtime/rt.h"
#include "runtime/stats_table.h"

#define NAME_CAP 128
#define ENDPOINT_CAP 256
#define MAX_LINKS 32
#define MAX_CLIENTS 256
#define UNREACHABLE_GRACE_NS 5000000000ull /* a client not yet connected gets this long */
#define LEFT_CAP 64                        /* clients remembered as gone (said GOODBYE) */

/* The DataServer's counters (counters.h): one per COUNTER row of its table (stats_table.h). */
typedef struct dh__ds_counters {
    DH__DS_STATS(DH__STAT_COUNTER_FIELD)
} dh__ds_counters_t;

typedef struct task {
    struct task *next;
    dh_msg_t msg; /* DISPATCH, owned */
    uint64_t enqueued_ns;
    /* filled by the worker */
    int rc;
    dh__rt_result_t result;
    double queue_s;
    uint64_t ready_ns;
    bool local_target;
    double booked_cpu_s;      /* its share of the server's booked work (loop thread) */
    bool booked;              /* counted in booked_tasks until its executor COMPLETE is sent */
    dh__out_charge_t *charge; /* heap outputs' reservation (dataserver_output_budget.c), or NULL:
                               * the task's reference, handed to its payload frames */
    char **stalled;           /* n_samples: a sample that ran past sample_timeout on an abandoned
                               * thread: its failure, which the next run reports instead (dh_malloc'd;
                               * NULL: none) */
} task_t;

/* A worker slot: its thread (joinable while live), the thread's watch and the task it runs
 * (under s->lock). A thread abandoned past sample_timeout is detached and leaves its slot;
 * the loop starts a new thread in it (dataserver_work.c, "Deadlines"). */
typedef struct ds_slot {
    pthread_t thread;
    bool live;
    dh__rt_watch_t *watch; /* the server's reference, or NULL */
    task_t *task;          /* running, or NULL */
} ds_slot_t;

typedef struct queue {
    task_t *head, *tail;
    size_t len;
} queue_t;

/* A forwarded delivery in its link's FIFO: encoded when it was handed to the link, sent when
 * its (emulated) transmission is over and the socket takes it without blocking
 * (dataserver_forward.c). */
typedef struct held {
    struct held *next;
    uint8_t header[DH_WIRE_HEADER_SIZE];
    uint8_t *body;
    size_t body_len;
    dh_wire_payload_t payloads[DH__RT_MAX_TENSORS];
    size_t n_payloads;
    uint64_t seq, bytes, emulated_bytes;
    uint64_t start_ns, due_ns; /* its transmission: from start (the link free) to due */
} held_t;

typedef struct link {
    char endpoint[ENDPOINT_CAP];
    char node[NAME_CAP]; /* the target's node */
    dh_wire_socket_t *sock;
    /* Estimates from the target's acks (dataserver_forward.c, link_observe): bandwidth in emulated
     * bytes per second and latency in seconds (0 = not measured), from a weighted fit of
     * ack time = latency + bytes / bandwidth; fit_* are the fit's weighted means. */
    double bytes_per_s, latency_s;
    double fit_x, fit_y, fit_xx, fit_xy;
    uint64_t fit_n;
    uint64_t busy_until_ns;    /* emulated: the link transmits until then */
    held_t *held, *held_tail;  /* deliveries not sent yet, in order (dataserver_forward.c): emulated
                                * ones in transmission, others waiting for the socket */
    uint64_t blocked_since_ns; /* the head is due but the socket would block since (0: no) */
    uint64_t sent_at_ns[64];
    uint64_t sent_seq[64];
    uint64_t sent_bytes[64]; /* emulated bytes */
} link_t;

typedef struct known_client {
    char name[NAME_CAP];
    uint32_t pid;
    uint64_t since_ns;
} known_client_t;

/* A DELIVER that could not go out yet: its client has not connected, or (forwarded) the
 * arena was full. */
typedef struct pending {
    struct pending *next;
    task_t *task;                 /* own worker's result waiting for its client, or NULL */
    dh_wire_received_t forwarded; /* a sidecar's DELIVER waiting for arena space */
    char sidecar[NAME_CAP];
    uint64_t since_ns;
    uint64_t due_ns; /* emulated network: not placed before its ingress transmission ends */
} pending_t;

struct dh_dataserver {
    dh_dataserver_config_t cfg;
    char *cache_dir; /* cfg.cache_dir's copy (cfg.cache_dir points here), or NULL */
    bool cache_used; /* remote reads go through it (dh__remote_cache_use; released at destroy) */
    char name[NAME_CAP];
    char node[NAME_CAP];
    char coord_endpoint[ENDPOINT_CAP];
    char data_endpoint[ENDPOINT_CAP];
    dh__rt_pipeline_t pipeline;
    void *ctx;
    bool own_ctx;
    dh_wire_keys_t *keys; /* CURVE (cfg.keys_dir), or NULL: every socket's, links' too */
    int auth_ref;         /* holds ctx's ZAP handler (dh__wire_secure) */
    dh_wire_socket_t *coord;
    dh_wire_socket_t *data;
    dh__notice_server_t notice; /* local role: the arena socket and the notice channels */
    int wake_fd;
    dh_shm_arena_t *arena;
    pthread_mutex_t arena_lock;

    pthread_mutex_t lock; /* tasks, results, clients */
    pthread_cond_t task_cond;
    queue_t tasks, results;
    uint32_t running;
    double read_bytes_per_s; /* EWMA of the workers' observed input reads; 0 = none yet */
    known_client_t clients[MAX_CLIENTS];
    size_t n_clients;
    /* Clients that said GOODBYE, newest last (the loop thread's): a batch still in flight
     * for one of them is dropped at once and quietly, not held UNREACHABLE_GRACE_NS and
     * reported as a loss. */
    char left[LEFT_CAP][NAME_CAP];
    size_t n_left;
    dh__ds_counters_t counters;     /* any thread (counters.h) */
    dh__counter_t busy_ns;          /* wall time workers spent executing tasks (counters.h) */
    struct dh__ds_metrics *metrics; /* --metrics-listen (dataserver_metrics.c); NULL = off */

    ds_slot_t *slots; /* cfg.workers (under lock) */
    uint32_t n_threads;
    uint64_t last_watch_ns; /* the loop's last look at the workers' deadlines */
    bool said_bound;        /* logged once: past the bound of abandoned threads */
    atomic_int stop;
    pthread_t loop_thread;
    bool started;

    link_t links[MAX_LINKS];
    size_t n_links;
    pending_t *pending;
    double latency_ewma_s;
    /* Emulated network (cfg.emulate_link_Bps): this node's ingress link, a serial resource
     * shared by everything forwarded here, is busy until then (loop thread; dataserver_forward.c).
     */
    uint64_t ingress_free_ns;
    /* What the coordinator's book holds for this server, as the heartbeat reports it (loop
     * thread): tasks received by DISPATCH whose executor COMPLETE has not been sent yet
     * (queued, running, finished, or waiting for their client), their predicted CPU seconds
     * (the DISPATCH's pred_cpu_s), and the DISPATCH messages received so far. */
    uint32_t booked_tasks;
    double booked_cpu_s;
    uint64_t dispatches_seen;
};

/* The task's executor COMPLETE is going out: it leaves the booked work (loop thread; once). */
void dh__ds_unbook(dh_dataserver_t *s, task_t *t);

/* How long a batch waits for arena space before it is sent by copy instead. The slabs of a
 * full arena may all belong to batches the client holds ahead of the one it waits for, so
 * waiting forever could deadlock the in-order fetcher; a spilled tensor goes to the client as
 * a payload frame. Spills stay bounded by the client's prefetch and the coordinator's queue
 * cap, which are the real backpressure. */
#define SPILL_AFTER_NS 50000000ull

/* ---- dataserver_work.c ---- */

/* The task and result FIFOs: append, and take the oldest (NULL when empty). Under s->lock. */
void dh__ds_push(queue_t *q, task_t *t);
task_t *dh__ds_pop(queue_t *q);

/* A queued task's remote samples (URLs, tar members at URLs) handed to the remote module's
 * read-ahead, tagged with the task (cancelled when it is freed). No-op without a cache. */
void dh__ds_readahead(dh_dataserver_t *s, task_t *t);

/* Frees a task: its message and its result's strings (not its output buffers). Safe on NULL. */
void dh__ds_task_free(task_t *t);

/* Counts one tensor of `bytes` sent by copy because the arena stayed full (arena_spills),
 * since_ns after its first try. The first spill of the server is logged (warn) with the
 * arena's refusal, dh_last_error() of the calling thread ("arena full: ... N of M used" or
 * "cannot reserve memory ...": docs/shared-memory.md, "Full arena"). */
void dh__ds_count_spill(dh_dataserver_t *s, size_t bytes, uint64_t since_ns);

/* A worker thread (pthread_create's start routine): takes its worker_arg_t (and frees it),
 * runs tasks until the server stops. */
typedef struct worker_arg {
    dh_dataserver_t *s;
    uint32_t index;
    dh__rt_watch_t *watch; /* the thread's reference */
} worker_arg_t;
void *dh__ds_worker_main(void *arg);

/* Starts slot i's worker thread (its watch made here). 0, or DH_ENOMEM / -errno. Under
 * s->lock, or before the loop and the workers run. */
int dh__ds_start_worker(dh_dataserver_t *s, uint32_t i);

/* The loop: fails the samples whose thread ran past sample_timeout (their task runs again
 * without them on another thread), abandons those threads and starts new ones in their
 * slots, within DH__DS_MAX_ABANDONED (dataserver_work.c, "Deadlines"). */
void dh__ds_watch_workers(dh_dataserver_t *s);

/* Worker threads of this process abandoned past sample_timeout that have not returned yet,
 * at most DH__DS_MAX_ABANDONED: past it a stuck thread's slot stays empty (the server runs
 * with fewer workers) until one returns. */
#define DH__DS_MAX_ABANDONED 64
unsigned dh__ds_abandoned(void);
/* Counts one thread abandoned by dh_dataserver_destroy (blocked at stop). */
void dh__ds_count_abandoned_at_stop(void);
/* Waits up to timeout_ms for that count to be 0 (tests); returns it. */
unsigned dh__ds_abandoned_wait(long timeout_ms);
/* Slots with a live thread (tests, logs). */
uint32_t dh__ds_live_workers(dh_dataserver_t *s);

/* ---- dataserver_loop.c ---- */

/* COMPLETE of a request (r may be NULL: no samples): to `to` with routing_id (a sidecar's
 * ack on the data socket), or to the coordinator when `to` is NULL. */
void dh__ds_send_complete(dh_dataserver_t *s, const char *client_id, uint64_t seq,
                          const dh__rt_result_t *r, double cpu_s, double queue_s, int delivered,
                          dh_wire_socket_t *to, const char *routing_id);

/* ---- dataserver_deliver.c ---- */

/* Whether the client said GOODBYE (the loop thread's list). */
bool dh__ds_client_left(const dh_dataserver_t *s, const char *name);

/* Puts the client on the list of those that said GOODBYE (left), or takes it off (it said
 * HELLO). The list keeps the last LEFT_CAP. Loop thread. */
void dh__ds_set_left(dh_dataserver_t *s, const char *name, bool left);

/* The connected client of that name, or NULL. Under s->lock, or on the loop thread. */
known_client_t *dh__ds_find_client(dh_dataserver_t *s, const char *name);

/* A payload's free function (dh_wire_free_fn): dh_free, on whichever thread ZeroMQ calls it. */
void dh__ds_free_payload(void *data, void *hint);

/* Sends a client the DELIVER of handles for a batch in the arena. Returns 0, or
 * -EHOSTUNREACH when the client is not connected (the caller decides to wait or drop). */
int dh__ds_deliver_to_client(dh_dataserver_t *s, const char *client_id, uint64_t seq,
                             const dh__rt_tensor_t *tensors, size_t n_tensors,
                             const dh_wire_sample_result_t *samples, uint32_t n_samples,
                             uint64_t ready_ns, const char *executor);

/* Gives back a local task's n outputs: slabs are unreferenced, spilled buffers freed. */
void dh__ds_free_outputs(dh_dataserver_t *s, const dh__rt_tensor_t *t, size_t n);

/* Unreferences the arena slabs of n output tensors (spilled ones are left alone). */
void dh__ds_unref_tensors(dh_dataserver_t *s, const dh__rt_tensor_t *t, size_t n);

/* A local task's result to its client. Returns true when the task is done with (delivered
 * or dropped), false to keep it pending. */
bool dh__ds_finish_local(dh_dataserver_t *s, task_t *t, uint64_t since_ns);

/* ---- dataserver_forward.c ---- */

/* A sidecar's finished task: the frames go to the target's DataServer over its link. */
void dh__ds_forward_result(dh_dataserver_t *s, task_t *t);

/* A client's REBALANCE SEND (tier 2): its parts go to another node's DataServer, each as a
 * DELIVER for the receiving client (dataserver_forward.c). */
void dh__ds_rebalance_send(dh_dataserver_t *s, const char *peer, const dh_msg_rebalance_t *m);

/* Emulated network: when a forwarded DELIVER that arrived now may be placed, its
 * transmission on this node's ingress link (shared by every sender) done: now when the link
 * was free, later when other senders' deliveries hold it (dataserver_forward.c, "Ingress"). */
uint64_t dh__ds_ingress_due(dh_dataserver_t *s, const dh_msg_deliver_t *m, uint64_t now);

/* A sidecar's DELIVER: copy the frames into the arena once, then notify the client.
 * Returns true when done with (delivered, dropped or refused), false to retry later (the
 * arena is full, or the client has not connected yet). */
bool dh__ds_place_forwarded(dh_dataserver_t *s, dh_wire_received_t *r, const char *sidecar,
                            uint64_t since_ns);

/* Appends a delivery that must wait; dh__ds_retry_pending tries every waiting one again. */
void dh__ds_add_pending(dh_dataserver_t *s, pending_t *p);
void dh__ds_retry_pending(dh_dataserver_t *s);

/* A message on link l (a target's COMPLETE ack): updates the link's bandwidth and latency
 * estimates. */
void dh__ds_on_link_message(dh_dataserver_t *s, link_t *l, dh_wire_received_t *r);

/* Emulated links: the poll timeout (ms) that wakes the loop for the next delivery due,
 * at most `timeout`; and sends every delivery whose transmission is over. */
long dh__ds_links_timeout_ms(const dh_dataserver_t *s, long timeout);
void dh__ds_links_send_due(dh_dataserver_t *s);
/* Whether the loop should poll link l's socket for POLLOUT (its due head is waiting). */
bool dh__ds_link_wants_out(const link_t *l);

/* Closes a link: deliveries still held are dropped (counted undeliverable), the socket
 * closed. */
void dh__ds_link_close(dh_dataserver_t *s, link_t *l);

#endif
