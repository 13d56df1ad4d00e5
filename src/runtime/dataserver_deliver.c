/* dataserver_deliver.c: a local DataServer's delivery to the clients of its node
 * (docs/runtime.md): the clients connected (and those that said GOODBYE), a batch's DELIVER
 * of arena handles to its client, each slab's reference handed over in the client's pid
 * (on the notice channel when no tensor spilled and the channel takes it, else over ZeroMQ
 * with spilled tensors copied into payload frames), and what is given back when it cannot go: a
 * client not connected yet waits UNREACHABLE_GRACE_NS in the pending list, one that left is
 * dropped. Loop thread (dataserver_loop.c).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/shm.h"
#include "datahelix/wire.h"
#include "runtime/dataserver_internal.h"
#include "runtime/notice.h"
#include "runtime/rt.h"
#include "wire/wire_lib.h"

bool dh__ds_client_left(const dh_dataserver_t *s, const char *name)
{
    for (size_t i = 0; i < s->n_left; i++)
        if (strcmp(s->left[i], name) == 0)
            return true;
    return false;
}

void dh__ds_set_left(dh_dataserver_t *s, const char *name, bool left)
{
    for (size_t i = 0; i < s->n_left; i++)
        if (strcmp(s->left[i], name) == 0) {
            memmove(s->left[i], s->left[i + 1], (s->n_left - i - 1) * sizeof s->left[0]);
            s->n_left--;
            break;
        }
    if (!left)
        return;
    if (s->n_left == LEFT_CAP) {
        memmove(s->left[0], s->left[1], (LEFT_CAP - 1) * sizeof s->left[0]);
        s->n_left--;
    }
    snprintf(s->left[s->n_left++], NAME_CAP, "%s", name);
}

known_client_t *dh__ds_find_client(dh_dataserver_t *s, const char *name)
{
    for (size_t i = 0; i < s->n_clients; i++)
        if (strcmp(s->clients[i].name, name) == 0)
            return &s->clients[i];
    return NULL;
}

void dh__ds_free_payload(void *data, void *hint)
{
    dh__wire_tsan_acquire(); /* maybe on a ZeroMQ I/O thread */
    dh_free(data);
}

/* Sends a client the DELIVER of handles for a batch in the arena. Returns 0, or
 * -EHOSTUNREACH when the client is not connected (the caller decides to wait or drop). */
int dh__ds_deliver_to_client(dh_dataserver_t *s, const char *client_id, uint64_t seq,
                             const dh__rt_tensor_t *tensors, size_t n_tensors,
                             const dh_wire_sample_result_t *samples, uint32_t n_samples,
                             uint64_t ready_ns, const char *executor)
{
    known_client_t *kc = dh__ds_find_client(s, client_id);
    if (kc && kc->pid)
        for (size_t i = 0; i < n_tensors; i++)
            if (tensors[i].handle.arena_id &&
                dh_shm_arena_ref_for(s->arena, &tensors[i].handle, (pid_t)kc->pid) == 0)
                dh_shm_arena_unref(s->arena, &tensors[i].handle);
    dh_wire_tensor_t wire[DH__RT_MAX_TENSORS];
    dh__rt_wire_tensors(tensors, n_tensors, wire);
    dh_wire_payload_t frames[DH__RT_MAX_TENSORS];
    size_t n_frames = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        if (tensors[i].handle.arena_id)
            continue;
        /* a spilled tensor: a copy goes as a payload frame (the caller keeps its buffer) */
        const dh_tensor_t *t = &tensors[i].tensor;
        void *copy = dh_malloc(t->nbytes ? t->nbytes : 1);
        if (!copy) {
            for (size_t k = 0; k < n_frames; k++)
                dh_free(frames[k].data);
            return dh__set_error(DH_ENOMEM, "out of memory for a %zu-byte payload frame",
                                 t->nbytes);
        }
        if (t->nbytes)
            memcpy(copy, t->data, t->nbytes);
        frames[n_frames++] = (dh_wire_payload_t){copy, t->nbytes, dh__ds_free_payload, NULL};
    }
    dh_msg_t m = {.type = DH_MSG_DELIVER};
    m.deliver.client_id = (char *)client_id;
    m.deliver.seq = seq;
    m.deliver.n_tensors = (uint32_t)n_tensors;
    m.deliver.tensors = wire;
    m.deliver.n_samples = n_samples;
    m.deliver.samples = (dh_wire_sample_result_t *)samples;
    m.deliver.ready_ns = ready_ns;
    m.deliver.server = (char *)executor;
    if (n_frames == 0 && dh__notice_server_send(&s->notice, client_id, &m))
        return 0;
    return dh_wire_send(s->data, client_id, strlen(client_id), &m, frames, n_frames, 0);
}

/* Gives back a local task's outputs: slabs are unreferenced, spilled buffers freed. */
void dh__ds_free_outputs(dh_dataserver_t *s, const dh__rt_tensor_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].handle.arena_id)
            dh_shm_arena_unref(s->arena, &t[i].handle);
        else
            dh_free(t[i].tensor.data);
    }
}

void dh__ds_unref_tensors(dh_dataserver_t *s, const dh__rt_tensor_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].handle.arena_id)
            dh_shm_arena_unref(s->arena, &t[i].handle);
}

/* Returns true when the task is done with (delivered or dropped), false to keep it pending. */
bool dh__ds_finish_local(dh_dataserver_t *s, task_t *t, uint64_t since_ns)
{
    const dh_msg_dispatch_t *d = &t->msg.dispatch;
    dh__rt_result_t *r = &t->result;
    bool left = dh__ds_client_left(s, d->request.client_id);
    int rc = left ? -EHOSTUNREACH
                  : dh__ds_deliver_to_client(s, d->request.client_id, d->request.seq, r->tensors,
                                             r->n_tensors, r->samples, r->n_samples, t->ready_ns,
                                             s->name);
    bool stopping = atomic_load(&s->stop) != 0;
    if (rc == -EHOSTUNREACH && !left && dh_clock_now_ns() - since_ns < UNREACHABLE_GRACE_NS &&
        !stopping)
        return false;
    if (rc) {
        dh__ds_free_outputs(s, r->tensors, r->n_tensors);
        dh__count(&s->counters.undeliverable, 1);
        /* prefetched past what the client consumed, or unsent as we stop (the stop line
         * counts them as undeliverable): expected, not a loss */
        if (left || (stopping && rc == -EHOSTUNREACH))
            dh_log_debug("DataServer '%s': dropped batch %s/%llu: %s", s->name,
                         d->request.client_id, (unsigned long long)d->request.seq,
                         left ? "the client has left" : "stopping, the client is gone");
        else
            dh_log_warn("DataServer '%s': dropped batch %s/%llu: %s", s->name, d->request.client_id,
                        (unsigned long long)d->request.seq, dh_last_error());
    } else {
        for (size_t i = 0; i < r->n_tensors; i++)
            if (!r->tensors[i].handle.arena_id) { /* spilled: the frame was a copy */
                dh_free(r->tensors[i].tensor.data);
                r->tensors[i].tensor.data = NULL;
            }
        dh__count(&s->counters.delivered_local, 1);
    }
    dh__ds_unbook(s, t);
    dh__ds_send_complete(s, d->request.client_id, d->request.seq, r, r->cpu_s, t->queue_s, 1, NULL,
                         NULL);
    return true;
}
