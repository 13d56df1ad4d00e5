/* dataserver_output_budget.c: the process's budget for the heap memory of DataServer tasks (rt.h,
 * "Output budget"; docs/runtime.md, "Memory").
 *
 * A local DataServer's own batches go into its arena, whose size bounds them. What else a
 * task holds is heap memory: while it runs, the decoded samples it collates (the video
 * pipeline decodes each sample whole before the batch is written); after it, everything it
 * made for another node (a sidecar's batches, a local server executing for another node's
 * rank) until ZeroMQ has sent it, and a local batch that spilled out of a full arena until
 * the rank lets it go. With many workers and large samples (96 workers x 2 x 166 MB of
 * 720p frames on this 2-core machine) that took more than the machine's memory and the OOM
 * killer ended the job. So every task first reserves its predicted peak here (decoded
 * samples + its batch), waiting while the process's reservations would pass the budget
 * (one task alone always passes, however large). When it has run, the reservation is
 * settled to what it still holds on the heap (nothing, when its batch is in the arena),
 * and that is given back when the last of its payload frames is freed: sent by ZeroMQ,
 * dropped, or freed with the task. A worker waits only before it starts, holding nothing,
 * and every reservation is given back by threads that never wait here (the loop, ZeroMQ's
 * I/O threads), so waiting cannot deadlock.
 *
 * The budget: DH_OUTPUT_BUDGET (bytes, or K/M/G), else a quarter of physical memory; one
 * for the whole process, however many DataServers it runs (bench runs them all in one).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/runtime.h"
#include "runtime/rt.h"
#include "wire/wire_lib.h"

struct dh__out_charge {
    atomic_uint refs;
    uint64_t bytes;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static uint64_t g_reserved; /* bytes of every charge not yet released */
static uint64_t g_budget;   /* 0 until first use */
static uint64_t g_peak;     /* the most g_reserved has been just after a reservation */
static unsigned g_waiting;  /* threads waiting in dh__out_reserve */

uint64_t dh__out_budget(void)
{
    pthread_mutex_lock(&g_lock);
    if (!g_budget) {
        const char *env = getenv("DH_OUTPUT_BUDGET");
        uint64_t v = 0;
        if (env && env[0] && dh_arena_parse_bytes(env, "DH_OUTPUT_BUDGET", &v) != 0) {
            dh_log_warn("%s; using the default (a quarter of physical memory)", dh_last_error());
            v = 0;
        }
        if (!v) {
            long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
            v = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 4 : (uint64_t)4 << 30;
        }
        g_budget = v;
    }
    uint64_t b = g_budget;
    pthread_mutex_unlock(&g_lock);
    return b;
}

uint64_t dh__out_reserved(void)
{
    pthread_mutex_lock(&g_lock);
    uint64_t r = g_reserved;
    pthread_mutex_unlock(&g_lock);
    return r;
}

uint64_t dh__out_peak(void)
{
    pthread_mutex_lock(&g_lock);
    uint64_t p = g_peak;
    pthread_mutex_unlock(&g_lock);
    return p;
}

void dh__out_peak_reset(void)
{
    pthread_mutex_lock(&g_lock);
    g_peak = g_reserved;
    pthread_mutex_unlock(&g_lock);
}

unsigned dh__out_waiting(void)
{
    pthread_mutex_lock(&g_lock);
    unsigned w = g_waiting;
    pthread_mutex_unlock(&g_lock);
    return w;
}

dh__out_charge_t *dh__out_reserve(uint64_t bytes, atomic_int *stop, bool *waited)
{
    *waited = false;
    if (!bytes)
        return NULL;
    dh__out_charge_t *c = dh_malloc(sizeof *c);
    if (!c)
        return NULL; /* not charged: the task runs; its own allocation may fail, and says so */
    atomic_init(&c->refs, 1);
    c->bytes = bytes;
    uint64_t budget = dh__out_budget();
    pthread_mutex_lock(&g_lock);
    while (g_reserved > 0 && g_reserved + bytes > budget && !atomic_load(stop)) {
        if (!*waited)
            g_waiting++;
        *waited = true;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100000000; /* the stop flag is looked at every 100 ms */
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&g_cond, &g_lock, &until);
    }
    if (*waited)
        g_waiting--;
    g_reserved += bytes;
    if (g_reserved > g_peak)
        g_peak = g_reserved;
    pthread_mutex_unlock(&g_lock);
    return c;
}

void dh__out_settle(dh__out_charge_t **pc, uint64_t bytes)
{
    dh__out_charge_t *c = *pc;
    if (!c) {
        if (!bytes || !(c = dh_malloc(sizeof *c)))
            return; /* nothing held, or not charged (as in dh__out_reserve) */
        atomic_init(&c->refs, 1);
        c->bytes = 0;
        *pc = c;
    }
    pthread_mutex_lock(&g_lock);
    g_reserved = g_reserved >= c->bytes ? g_reserved - c->bytes : 0;
    g_reserved += bytes; /* may pass the budget: what is held is held; new tasks wait */
    if (bytes < c->bytes)
        pthread_cond_broadcast(&g_cond);
    c->bytes = bytes;
    pthread_mutex_unlock(&g_lock);
}

void dh__out_charge_add(dh__out_charge_t *c, unsigned refs)
{
    if (c)
        atomic_fetch_add(&c->refs, refs);
}

void dh__out_release(dh__out_charge_t *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    pthread_mutex_lock(&g_lock);
    g_reserved = g_reserved >= c->bytes ? g_reserved - c->bytes : 0;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    dh_free(c);
}

void dh__out_free_payload(void *data, void *hint)
{
    dh__wire_tsan_acquire(); /* maybe on a ZeroMQ I/O thread */
    dh_free(data);
    dh__out_release(hint);
}
