/* bench/train_prefetch.c: see train_prefetch.h. One thread per rank; the queue of copied
 * batches is a list under one mutex with two condition variables (room, ready). */
#include "bench/train_prefetch.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"

typedef struct copy {
    dh_bench_copied_t pub; /* first: a dh_bench_copied_t * is a copy_t * */
    void *data;            /* every tensor's bytes, one after another */
    char *strings;         /* the samples' ids and the server's name */
    int rc;                /* the client's error for this batch, or 0 */
    char error[512];
    struct copy *next;
} copy_t;

struct dh_bench_prefetch {
    dh_client_t *client;
    uint64_t count;
    uint32_t ahead, held; /* held: queued or being copied */
    double copy_s_per_B;
    atomic_int stop;
    int finished, fatal;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t room, ready;
    copy_t *head, *tail;
};

uint32_t dh_bench_copy_ahead(uint32_t depth)
{
    return depth > 2 ? 2 : 1;
}

static void sleep_s(double s)
{
    if (!(s > 0))
        return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void copy_free(copy_t *c)
{
    if (!c)
        return;
    dh_free(c->pub.batch.tensors);
    dh_free(c->pub.batch.samples);
    dh_free(c->data);
    dh_free(c->strings);
    dh_free(c);
}

static char *put(char **at, const char *s)
{
    char *start = *at;
    size_t n = strlen(s) + 1;
    memcpy(start, s, n);
    *at += n;
    return start;
}

/* The batch copied into memory of its own (the samples' error messages are not kept), or
 * NULL when out of memory. Cost: one memcpy of the payload. */
static copy_t *copy_of(const dh_client_batch_t *b)
{
    copy_t *c = dh_calloc(1, sizeof *c);
    if (!c)
        return NULL;
    size_t data = 0, strings = strlen(b->server ? b->server : "") + 1;
    for (size_t t = 0; t < b->n_tensors; t++)
        data += b->tensors[t].nbytes;
    for (size_t i = 0; i < b->n_samples; i++)
        strings += strlen(b->samples[i].id ? b->samples[i].id : "") + 1;
    c->pub.batch = *b;
    c->pub.batch.tensors = dh_calloc(b->n_tensors ? b->n_tensors : 1, sizeof *b->tensors);
    c->pub.batch.samples = dh_calloc(b->n_samples ? b->n_samples : 1, sizeof *b->samples);
    c->data = dh_malloc(data ? data : 1);
    c->strings = dh_malloc(strings);
    if (!c->pub.batch.tensors || !c->pub.batch.samples || !c->data || !c->strings) {
        copy_free(c);
        return NULL;
    }
    char *at = c->data;
    for (size_t t = 0; t < b->n_tensors; t++) {
        dh_tensor_t *x = &c->pub.batch.tensors[t];
        *x = b->tensors[t];
        x->data = x->nbytes ? at : NULL;
        if (x->nbytes)
            memcpy(at, b->tensors[t].data, x->nbytes);
        at += x->nbytes;
    }
    c->pub.bytes = (double)data;
    char *s = c->strings;
    c->pub.batch.server = put(&s, b->server ? b->server : "");
    for (size_t i = 0; i < b->n_samples; i++) {
        c->pub.batch.samples[i] = b->samples[i];
        c->pub.batch.samples[i].id = put(&s, b->samples[i].id ? b->samples[i].id : "");
        c->pub.batch.samples[i].error_message = NULL;
    }
    return c;
}

static void *stage_main(void *arg)
{
    dh_bench_prefetch_t *p = arg;
    for (uint64_t i = 0; i < p->count; i++) {
        pthread_mutex_lock(&p->lock);
        while (!atomic_load(&p->stop) && p->held >= p->ahead)
            pthread_cond_wait(&p->room, &p->lock);
        p->held++;
        pthread_mutex_unlock(&p->lock);
        if (atomic_load(&p->stop))
            break;
        dh_client_batch_t *b = NULL;
        int e;
        do {
            e = dh_client_next(p->client, &b);
        } while (e == DH_EAGAIN && !atomic_load(&p->stop));
        if (e == DH_EAGAIN)
            break; /* stopped */
        copy_t *c = e ? NULL : copy_of(b);
        dh_client_batch_release(&b);
        if (c) {
            /* the emulated copy of the bytes the payload stands for, after the real one */
            sleep_s(c->pub.bytes * p->copy_s_per_B);
        } else {
            if (e == 0)
                e = dh__set_error(DH_ENOMEM, "bench: pool's copy: out of memory");
            if (!(c = dh_calloc(1, sizeof *c))) {
                pthread_mutex_lock(&p->lock);
                p->fatal = DH_ENOMEM;
                pthread_mutex_unlock(&p->lock);
                break;
            }
            c->rc = e;
            snprintf(c->error, sizeof c->error, "%s", dh_last_error());
        }
        pthread_mutex_lock(&p->lock);
        if (p->tail)
            p->tail->next = c;
        else
            p->head = c;
        p->tail = c;
        pthread_cond_signal(&p->ready);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_lock(&p->lock);
    p->finished = 1;
    pthread_cond_broadcast(&p->ready);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int dh_bench_prefetch_new(dh_bench_prefetch_t **out, dh_client_t *client, uint64_t count,
                          uint32_t ahead, double copy_s_per_B)
{
    *out = NULL;
    dh_bench_prefetch_t *p = dh_calloc(1, sizeof *p);
    if (!p)
        return dh__set_error(DH_ENOMEM, "bench: out of memory");
    p->client = client;
    p->count = count;
    p->ahead = ahead ? ahead : 1;
    p->copy_s_per_B = copy_s_per_B > 0 ? copy_s_per_B : 0;
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->room, NULL);
    pthread_cond_init(&p->ready, NULL);
    int e = pthread_create(&p->thread, NULL, stage_main, p);
    if (e) {
        pthread_cond_destroy(&p->ready);
        pthread_cond_destroy(&p->room);
        pthread_mutex_destroy(&p->lock);
        dh_free(p);
        return dh__set_error(-e, "bench: pool's prefetch thread: %s", strerror(e));
    }
    *out = p;
    return 0;
}

int dh_bench_prefetch_next(dh_bench_prefetch_t *p, dh_bench_copied_t **out)
{
    *out = NULL;
    pthread_mutex_lock(&p->lock);
    while (!p->head && !p->finished)
        pthread_cond_wait(&p->ready, &p->lock);
    copy_t *c = p->head;
    if (c) {
        p->head = c->next;
        if (!p->head)
            p->tail = NULL;
        p->held--;
        pthread_cond_signal(&p->room);
    }
    int fatal = p->fatal;
    pthread_mutex_unlock(&p->lock);
    if (!c)
        return fatal ? dh__set_error(fatal, "bench: pool's copy: out of memory")
                     : dh__set_error(DH_EEOF, "bench: pool's prefetch: no batch left");
    if (c->rc) {
        int rc = dh__set_error(c->rc, "%s", c->error);
        copy_free(c);
        return rc;
    }
    *out = &c->pub;
    return 0;
}

void dh_bench_copied_release(dh_bench_copied_t **b)
{
    if (!b || !*b)
        return;
    copy_free((copy_t *)*b);
    *b = NULL;
}

void dh_bench_prefetch_destroy(dh_bench_prefetch_t **pp)
{
    if (!pp || !*pp)
        return;
    dh_bench_prefetch_t *p = *pp;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    while (p->head) {
        copy_t *c = p->head;
        p->head = c->next;
        copy_free(c);
    }
    pthread_cond_destroy(&p->ready);
    pthread_cond_destroy(&p->room);
    pthread_mutex_destroy(&p->lock);
    dh_free(p);
    *pp = NULL;
}
