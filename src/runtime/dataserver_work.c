/* dataserver_work.c: the DataServer's workers: the task and result queues they share with
 * the event loop, the worker threads that run the pipeline on each task (dh__rt_execute),
 * and where a task's output goes: arena slabs for a local target (waiting for space, then
 * spilling to the heap), heap buffers for a sidecar's. Threads: see dataserver.c.
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

void dh__ds_task_free(task_t *t)
{
    if (!t)
        return;
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

void dh__ds_count_spill(dh_dataserver_t *s)
{
    dh__count(&s->counters.arena_spills, 1);
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
            *data = dh_malloc(nbytes);
            if (!*data)
                return dh__set_error(DH_ENOMEM, "out of memory for %zu bytes of output", nbytes);
            dh__ds_count_spill(s);
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
        if (!w) {
            t->rc = wrc;
        } else if (t->local_target) {
            t->rc = dh__rt_execute(w, d->request.samples, d->request.n_samples, arena_alloc,
                                   arena_release, s, &t->result);
        } else {
            t->rc = dh__rt_execute(w, d->request.samples, d->request.n_samples, heap_alloc,
                                   heap_release, s, &t->result);
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
        dh__count(&s->counters.tasks, 1);
        dh__count(&s->counters.samples, t->result.n_samples);
        dh__count(&s->counters.sample_errors, t->result.failed);
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
    return NULL;
}
