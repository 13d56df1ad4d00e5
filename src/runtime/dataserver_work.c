/* dataserver_work.c: the DataServer's workers: the task and result queues they share with
 * the event loop, the worker threads that run the pipeline on each task (dh__rt_execute),
 * and where a task's output goes: arena slabs for a local target (waiting for space, then
 * spilling to the heap), heap buffers for a sidecar's. Threads: see dataserver.c.
 *
 * Deadlines (sample_timeout, video pipeline). A read blocked in the kernel (a hung NFS
 * server, a FIFO nobody writes) cannot be interrupted, and a thread cannot be killed safely,
 * so a worker stuck past the deadline is abandoned:
 *   - the video pipeline brackets each sample's blocking part (the timed read's open and
 *     reads, FFmpeg's open, demux and decode) with its watch (dh__rt_watch_enter/_leave);
 *     inside, the thread reads only its own copies of the sample's id and path and writes
 *     only its worker and the result it builds, which is its own (a local of the worker
 *     loop, moved into the task only after the run);
 *   - the loop (dh__ds_watch_workers, each wake-up: at least every heartbeat) finds a thread
 *     inside past the deadline, marks its watch abandoned under the watch's lock, takes the
 *     task from the slot, records the sample's failure in task->stalled and queues the task
 *     again (its other samples are decoded by another thread; the stalled one is not opened
 *     again), detaches the thread and starts a new one in the slot;
 *   - the abandoned thread, if its read ever returns, finds itself abandoned on leaving
 *     (dh__rt_watch_leave), returns DH__RT_ABANDONED up to its start routine, frees its
 *     worker and its watch reference and exits, touching nothing of the server's;
 *   - at most DH__DS_MAX_ABANDONED threads of the process are abandoned and not yet returned:
 *     past it a stuck thread's sample still fails on time, but its slot stays empty (the
 *     server runs with one worker fewer, logged) until an abandoned thread returns.
 * FFmpeg's own waits (network protocols) also stop at the deadline by its interrupt callback
 * (decode.c, dh__decode_set_deadline); a failure from it is named as the timeout.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/runtime.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/dataserver_internal.h"
#include "media/media_lib.h"
#include "remote/remote_lib.h"
#include "runtime/rt.h"

/* The nice value of worker threads (setpriority on the thread): see dh__ds_worker_main. */
#define WORKER_NICE 5

/* ---- the queues (under s->lock) ---- */

void dh__ds_push(queue_t *q, task_t *t)
{
    t->next = NULL;
    if (q->tail)
        q->tail->next = t;
    else
        q->head = t;
    q->tail = t;
    q->len++;
}

task_t *dh__ds_pop(queue_t *q)
{
    task_t *t = q->head;
    if (t) {
        q->head = t->next;
        if (!q->head)
            q->tail = NULL;
        q->len--;
    }
    return t;
}

void dh__ds_readahead(dh_dataserver_t *s, task_t *t)
{
    const dh_msg_dispatch_t *d = &t->msg.dispatch;
    for (uint32_t i = 0; i < d->request.n_samples; i++) {
        const char *uri = d->request.samples[i].uri;
        if (!uri || !uri[0])
            continue;
        long long start, end; /* a tar member's range, else start -1 */
        const char *file = dh__subfile_range(uri, &start, &end);
        if (!file || dh__url_scheme(file) == DH_URL_NONE)
            continue;
        if (dh__remote_readahead(file, start < 0 ? 0 : start, start < 0 ? -1 : end,
                                 (uint64_t)(uintptr_t)t))
            dh_log_warn("DataServer '%s': no read-ahead for %s: %s", s->name,
                        d->request.samples[i].id ? d->request.samples[i].id : "a sample",
                        dh_last_error());
    }
}

void dh__ds_task_free(task_t *t)
{
    if (!t)
        return;
    dh__remote_readahead_cancel((uint64_t)(uintptr_t)t); /* (none queued: a no-op) */
    for (uint32_t i = 0; t->stalled && i < t->msg.dispatch.request.n_samples; i++)
        dh_free(t->stalled[i]);
    dh_free(t->stalled);
    dh_msg_clear(&t->msg);
    dh__rt_result_clear(&t->result);
    dh__out_release(t->charge); /* its outputs are freed by now (or were never made) */
    dh_free(t);
}

static void wake_loop(dh_dataserver_t *s)
{
    uint64_t one = 1;
    ssize_t n = write(s->wake_fd, &one, sizeof one);
    (void)n;
}

/* ---- output allocation (workers and loop) ---- */

void dh__ds_count_spill(dh_dataserver_t *s, size_t bytes, uint64_t since_ns)
{
    if (atomic_fetch_add_explicit(&s->counters.arena_spills, 1, memory_order_relaxed) != 0)
        return;
    /* once: why a spill happened is what a stop line's count cannot say (a full arena, or
     * memory the machine would not give for a new high-water mark) */
    uint64_t now = dh_clock_now_ns();
    dh_log_warn("DataServer '%s': first spill: a %zu-byte tensor goes to the client by copy "
                "after %.0f ms without arena space (%s); later spills are only counted",
                s->name, bytes, now > since_ns ? (double)(now - since_ns) / 1e6 : 0.0,
                dh_last_error());
}

static int arena_alloc(void *ctx, size_t nbytes, void **data, dh_shm_handle_t *handle)
{
    dh_dataserver_t *s = ctx;
    bool waited = false;
    uint64_t since = dh_clock_now_ns();
    for (;;) {
        pthread_mutex_lock(&s->arena_lock);
        int rc = dh_shm_arena_alloc(s->arena, nbytes, 0, handle, data);
        pthread_mutex_unlock(&s->arena_lock);
        if (rc != DH_EAGAIN)
            return rc;
        if (atomic_load(&s->stop))
            return dh__set_error(DH_EAGAIN, "DataServer '%s' stopping", s->name);
        if (!waited) {
            waited = true;
            dh__count(&s->counters.arena_waits, 1);
        }
        if (dh_clock_now_ns() - since > SPILL_AFTER_NS) {
            memset(handle, 0, sizeof *handle);
            *data = dh_malloc(nbytes); /* (dh_last_error() still says why the arena refused) */
            if (!*data)
                return dh__set_error(DH_ENOMEM, "out of memory for %zu bytes of output", nbytes);
            dh__ds_count_spill(s, nbytes, since);
            return 0;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static void arena_release(void *ctx, void *data, const dh_shm_handle_t *handle)
{
    dh_dataserver_t *s = ctx;
    if (handle->arena_id)
        dh_shm_arena_unref(s->arena, handle);
    else
        dh_free(data);
}

static int heap_alloc(void *ctx, size_t nbytes, void **data, dh_shm_handle_t *handle)
{
    memset(handle, 0, sizeof *handle);
    *data = dh_malloc(nbytes);
    return *data ? 0 : dh__set_error(DH_ENOMEM, "out of memory for %zu bytes of output", nbytes);
}

static void heap_release(void *ctx, void *data, const dh_shm_handle_t *handle)
{
    dh_free(data);
}

/* ---- deadlines: the watch (see the top) ---- */

enum { WATCH_IDLE = 0, WATCH_INSIDE = 1, WATCH_ABANDONED = 2 };

struct dh__rt_watch {
    pthread_mutex_t mu;
    atomic_int refs;
    int state;         /* WATCH_*, under mu */
    uint64_t since_ns; /* the sample's start */
    uint32_t index;    /* the sample's, in its task */
    char id[256], path[1024], op[32];
};

/* Abandoned threads not yet returned: the process's (an abandoned thread may outlive its
 * server), with a condition for dh__ds_abandoned_wait. */
static pthread_mutex_t g_abandoned_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_abandoned_cond = PTHREAD_COND_INITIALIZER;
static unsigned g_abandoned;

unsigned dh__ds_abandoned(void)
{
    pthread_mutex_lock(&g_abandoned_lock);
    unsigned n = g_abandoned;
    pthread_mutex_unlock(&g_abandoned_lock);
    return n;
}

void dh__ds_count_abandoned_at_stop(void)
{
    pthread_mutex_lock(&g_abandoned_lock);
    g_abandoned++;
    pthread_mutex_unlock(&g_abandoned_lock);
}

unsigned dh__ds_abandoned_wait(long timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&g_abandoned_lock);
    while (g_abandoned &&
           pthread_cond_timedwait(&g_abandoned_cond, &g_abandoned_lock, &until) != ETIMEDOUT) {
    }
    unsigned n = g_abandoned;
    pthread_mutex_unlock(&g_abandoned_lock);
    return n;
}

dh__rt_watch_t *dh__rt_watch_new(void)
{
    dh__rt_watch_t *w = dh_calloc(1, sizeof *w);
    if (!w)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
    atomic_init(&w->refs, 2);
    return w;
}

void dh__rt_watch_unref(dh__rt_watch_t *w)
{
    if (w && atomic_fetch_sub(&w->refs, 1) == 1) {
        pthread_mutex_destroy(&w->mu);
        dh_free(w);
    }
}

void dh__rt_watch_enter(dh__rt_watch_t *w, uint32_t index, const char *id, const char *path,
                        const char *op, uint64_t since_ns)
{
    pthread_mutex_lock(&w->mu);
    w->state = WATCH_INSIDE;
    w->index = index;
    w->since_ns = since_ns;
    snprintf(w->id, sizeof w->id, "%s", id);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->op, sizeof w->op, "%s", op);
    pthread_mutex_unlock(&w->mu);
}

bool dh__rt_watch_leave(dh__rt_watch_t *w)
{
    pthread_mutex_lock(&w->mu);
    bool abandoned = w->state == WATCH_ABANDONED;
    if (!abandoned)
        w->state = WATCH_IDLE;
    pthread_mutex_unlock(&w->mu);
    return abandoned;
}

bool dh__rt_watch_expire(dh__rt_watch_t *w, uint64_t now, uint64_t timeout_ns, uint32_t *index,
                         char *id, size_t id_cap, char *msg, size_t msg_cap)
{
    pthread_mutex_lock(&w->mu);
    bool expired = w->state == WATCH_INSIDE && now > w->since_ns && now - w->since_ns > timeout_ns;
    if (expired) {
        w->state = WATCH_ABANDONED;
        *index = w->index;
        snprintf(id, id_cap, "%s", w->id);
        snprintf(msg, msg_cap,
                 "sample '%s' (%s): %s ran past sample_timeout %g s (no answer after %.1f s); "
                 "its worker thread was abandoned and a new one takes its place",
                 w->id, w->path, w->op, (double)timeout_ns / 1e9,
                 (double)(now - w->since_ns) / 1e9);
    }
    pthread_mutex_unlock(&w->mu);
    return expired;
}

uint32_t dh__ds_live_workers(dh_dataserver_t *s)
{
    pthread_mutex_lock(&s->lock);
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_threads; i++)
        n += s->slots[i].live;
    pthread_mutex_unlock(&s->lock);
    return n;
}

int dh__ds_start_worker(dh_dataserver_t *s, uint32_t i)
{
    ds_slot_t *slot = &s->slots[i];
    worker_arg_t *a = dh_malloc(sizeof *a);
    dh__rt_watch_t *watch = dh__rt_watch_new();
    if (!a || !watch) {
        dh_free(a);
        dh_free(watch);
        return dh__set_error(DH_ENOMEM, "out of memory for a worker thread");
    }
    a->s = s;
    a->index = i;
    a->watch = watch;
    int e = pthread_create(&slot->thread, NULL, dh__ds_worker_main, a);
    if (e) {
        dh_free(a);
        dh__rt_watch_unref(watch);
        dh__rt_watch_unref(watch);
        return dh__set_error(-e, "DataServer: pthread_create: %s", strerror(e));
    }
    slot->live = true;
    slot->watch = watch;
    slot->task = NULL;
    return 0;
}

/* Records sample k's failure on the task and queues it again (under s->lock). */
static void requeue_stalled(dh_dataserver_t *s, task_t *t, uint32_t k, const char *msg)
{
    dh_msg_request_t *q = &t->msg.dispatch.request;
    if (k < q->n_samples && !t->stalled)
        t->stalled = dh_calloc(q->n_samples, sizeof *t->stalled);
    if (k < q->n_samples && t->stalled) {
        dh_free(t->stalled[k]);
        t->stalled[k] = dh_strdup(msg);
    }
    /* the stuck thread's reservation: it will never settle it */
    dh__out_release(t->charge);
    t->charge = NULL;
    t->next = s->tasks.head; /* first: it has waited long enough */
    s->tasks.head = t;
    if (!s->tasks.tail)
        s->tasks.tail = t;
    s->tasks.len++;
    pthread_cond_signal(&s->task_cond);
}

void dh__ds_watch_workers(dh_dataserver_t *s)
{
    double timeout_s = s->pipeline.sample_timeout_s;
    if (s->pipeline.python || s->pipeline.synthetic || !(timeout_s > 0) || !s->slots)
        return;
    uint64_t now = dh_clock_now_ns();
    if (now - s->last_watch_ns < 20000000ull) /* at most every 20 ms */
        return;
    s->last_watch_ns = now;
    uint64_t timeout_ns = (uint64_t)(timeout_s * 1e9);
    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < s->n_threads; i++) {
        ds_slot_t *slot = &s->slots[i];
        char id[256], msg[1600];
        uint32_t k = 0;
        if (slot->live && slot->watch &&
            dh__rt_watch_expire(slot->watch, now, timeout_ns, &k, id, sizeof id, msg, sizeof msg)) {
            /* from here the thread touches nothing of ours, and we nothing of its */
            dh_log_error("DataServer '%s': %s", s->name, msg);
            pthread_detach(slot->thread);
            dh__rt_watch_unref(slot->watch);
            slot->watch = NULL;
            slot->live = false;
            s->running--;
            pthread_mutex_lock(&g_abandoned_lock);
            g_abandoned++;
            pthread_mutex_unlock(&g_abandoned_lock);
            if (slot->task)
                requeue_stalled(s, slot->task, k, msg);
            slot->task = NULL;
        }
        if (!slot->live && !atomic_load(&s->stop)) {
            if (dh__ds_abandoned() >= DH__DS_MAX_ABANDONED) {
                if (!s->said_bound)
                    dh_log_error("DataServer '%s': %u worker threads of this process are stuck "
                                 "past sample_timeout (the bound); a stuck worker is not "
                                 "replaced until one returns",
                                 s->name, DH__DS_MAX_ABANDONED);
                s->said_bound = true;
            } else if (dh__ds_start_worker(s, i) != 0) {
                dh_log_error("DataServer '%s': cannot start a worker in place of a stuck one: %s",
                             s->name, dh_last_error());
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
}

/* The abandoned thread's end: its own memory only. */
static void *abandoned_exit(dh__rt_worker_t *w, dh__rt_watch_t *watch)
{
    dh__rt_worker_destroy(&w);
    dh__rt_watch_unref(watch);
    pthread_mutex_lock(&g_abandoned_lock);
    g_abandoned--;
    pthread_cond_broadcast(&g_abandoned_cond);
    pthread_mutex_unlock(&g_abandoned_lock);
    return NULL;
}

/* ---- workers ---- */

static void fail_all_samples(task_t *t, int rc)
{
    const dh_msg_request_t *q = &t->msg.dispatch.request;
    dh__rt_result_t *r = &t->result;
    memset(r, 0, sizeof *r);
    r->samples = dh_calloc(q->n_samples ? q->n_samples : 1, sizeof *r->samples);
    if (!r->samples)
        return;
    r->n_samples = q->n_samples;
    for (uint32_t i = 0; i < q->n_samples; i++) {
        char msg[512];
        snprintf(msg, sizeof msg, "sample '%s': task failed: %s", q->samples[i].id,
                 dh_last_error()[0] ? dh_last_error() : dh_strerror(rc));
        r->samples[i].id = dh_strdup(q->samples[i].id);
        r->samples[i].status = rc;
        r->samples[i].error = dh_strdup(msg);
    }
    r->failed = q->n_samples;
}

void *dh__ds_worker_main(void *arg)
{
    dh_dataserver_t *s = ((worker_arg_t *)arg)->s;
    uint32_t index = ((worker_arg_t *)arg)->index;
    dh__rt_watch_t *watch = ((worker_arg_t *)arg)->watch;
    dh_free(arg);
    /* Below the loop and everything else of the process: many workers on few cores must not
     * starve the thread that sends heartbeats and delivers (a live server declared dead:
     * docs/runtime.md, "Failures"), nor, embedded, the training loop. A Python worker
     * process inherits it. */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), WORKER_NICE) != 0)
        dh_log_debug("DataServer '%s': cannot lower a worker's priority: %s", s->name,
                     strerror(errno));
    if (s->cfg.worker_cpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < 64 && i < CPU_SETSIZE; i++)
            if (s->cfg.worker_cpus >> i & 1)
                CPU_SET(i, &set);
        int e = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
        if (e)
            dh_log_warn("DataServer '%s': cannot pin a worker to CPUs 0x%llx: %s", s->name,
                        (unsigned long long)s->cfg.worker_cpus, strerror(e));
    }
    dh__rt_worker_t *w = NULL;
    int wrc = dh__rt_worker_new(&w, &s->pipeline);
    if (wrc)
        dh_log_error("DataServer '%s': worker cannot start: %s", s->name, dh_last_error());
    else /* the python pipeline starts its worker process here */
        dh__rt_worker_bind(w, index, s->cfg.workers, s->arena ? dh_shm_arena_fd(s->arena) : -1,
                           &s->stop);
    dh__rt_worker_watch(w, watch, s->pipeline.sample_timeout_s);
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->tasks.head && !atomic_load(&s->stop))
            pthread_cond_wait(&s->task_cond, &s->lock);
        if (atomic_load(&s->stop)) {
            pthread_mutex_unlock(&s->lock);
            break;
        }
        task_t *t = dh__ds_pop(&s->tasks);
        s->running++;
        s->slots[index].task = t;
        pthread_mutex_unlock(&s->lock);

        uint64_t start = dh_clock_now_ns();
        t->queue_s = dh_clock_elapsed_s(t->enqueued_ns, start);
        const dh_msg_dispatch_t *d = &t->msg.dispatch;
        t->local_target = s->cfg.role == DH_DS_LOCAL && strcmp(d->target, s->name) == 0;
        if (w) { /* its heap memory: within the process's budget (dataserver_output_budget.c) */
            uint64_t transient = 0, output = 0;
            dh__rt_task_memory(&s->pipeline, d->request.samples, d->request.n_samples, &transient,
                               &output);
            bool waited = false;
            t->charge = dh__out_reserve(transient + output, &s->stop, &waited);
            if (waited)
                dh__count(&s->counters.output_waits, 1);
        }
        if (t->stalled) /* its stalled samples are not opened again */
            for (uint32_t k = 0; k < d->request.n_samples; k++)
                if (t->stalled[k]) {
                    dh_free(d->request.samples[k].uri);
                    d->request.samples[k].uri = dh_strdup("");
                }
        /* The result is built here, ours, and moved into the task only if this thread was
         * not abandoned meanwhile (the task is then someone else's). */
        dh__rt_result_t result = {0};
        int rc = wrc;
        if (w)
            rc = dh__rt_execute(w, d->request.samples, d->request.n_samples,
                                t->local_target ? arena_alloc : heap_alloc,
                                t->local_target ? arena_release : heap_release, s, &result);
        if (rc == DH__RT_ABANDONED)
            return abandoned_exit(w, watch);
        t->rc = rc;
        t->result = result;
        for (uint32_t k = 0; t->rc == 0 && t->stalled && k < t->result.n_samples; k++)
            if (t->stalled[k]) {
                dh_wire_sample_result_t *r = &t->result.samples[k];
                if (!r->status)
                    t->result.failed++;
                r->status = DH_EIO;
                r->tokens = 0;
                dh_free(r->error);
                r->error = t->stalled[k];
                t->stalled[k] = NULL;
            }
        /* what it still holds on the heap: its outputs for another node, or a spill */
        uint64_t held = 0;
        for (size_t k = 0; t->rc == 0 && k < t->result.n_tensors; k++)
            if (!t->result.tensors[k].handle.arena_id)
                held += t->result.tensors[k].tensor.nbytes;
        dh__out_settle(&t->charge, held);
        if (t->rc)
            fail_all_samples(t, t->rc);
        t->ready_ns = dh_clock_now_ns();
        dh__count(&s->busy_ns, t->ready_ns - start);

        pthread_mutex_lock(&s->lock);
        s->running--;
        s->slots[index].task = NULL;
        dh__count(&s->counters.tasks, 1);
        dh__count(&s->counters.samples, t->result.n_samples);
        dh__count(&s->counters.sample_errors, t->result.failed);
        uint64_t fetch_ns = 0, fetch_bytes = 0;
        for (uint32_t i = 0; i < t->result.n_samples; i++) {
            fetch_ns += (uint64_t)(t->result.samples[i].fetch_s * 1e9);
            fetch_bytes += t->result.samples[i].fetch_bytes;
        }
        dh__count(&s->counters.fetch_s_ns, fetch_ns);
        dh__count(&s->counters.fetch_bytes, fetch_bytes);
        if (t->result.read_s > 0 && t->result.read_bytes > 0) {
            double bw = (double)t->result.read_bytes / t->result.read_s;
            s->read_bytes_per_s =
                s->read_bytes_per_s > 0 ? dh_cost_ewma(s->read_bytes_per_s, bw, 0.2) : bw;
        }
        double latency = dh_clock_elapsed_s(t->enqueued_ns, t->ready_ns);
        s->latency_ewma_s =
            s->latency_ewma_s ? dh_cost_ewma(s->latency_ewma_s, latency, 0.2) : latency;
        dh__ds_push(&s->results, t);
        pthread_mutex_unlock(&s->lock);
        wake_loop(s);
    }
    dh__rt_worker_destroy(&w);
    dh__rt_watch_unref(watch);
    return NULL;
}
