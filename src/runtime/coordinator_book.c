/* coordinator_book.c: the coordinator's book of requests (docs/runtime.md, "Failures"): a
 * REQUEST enters it with its predicted cost, and leaves it when its delivering local
 * DataServer's COMPLETE says delivered; an executor's COMPLETE takes the request off that
 * server's queue and is learned from (coordinator_learn.c), also when the delivery overtook
 * it (the late list). The book is an array searched linearly: O(requests in flight) per
 * completion, a few hundred in practice; a hash would be the fix if clusters grew past
 * thousands of ranks. Loop thread (coordinator.c).
 */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/profile.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"
#include "runtime/descriptor.h"

static entry_t *find_entry(dh_coordinator_t *c, const char *client, uint64_t seq, size_t *pos)
{
    for (size_t i = 0; i < c->n_book; i++) {
        entry_t *e = &c->book[i];
        if (e->msg.request.seq == seq && strcmp(e->msg.request.client_id, client) == 0) {
            if (pos)
                *pos = i;
            return e;
        }
    }
    return NULL;
}

void dh__coord_book_remove(dh_coordinator_t *c, size_t pos)
{
    dh_msg_clear(&c->book[pos].msg);
    memmove(&c->book[pos], &c->book[pos + 1], (c->n_book - pos - 1) * sizeof *c->book);
    c->n_book--;
}

static void remove_late(dh_coordinator_t *c, size_t pos)
{
    dh_msg_clear(&c->late[pos].msg);
    memmove(&c->late[pos], &c->late[pos + 1], (c->n_late - pos - 1) * sizeof *c->late);
    c->n_late--;
}

/* The book's entry at pos was delivered before its executor reported: it moves to the late
 * list (the REQUEST with it), to be learned from when the report comes. Without memory (or
 * at the bound, the oldest making room) the request simply goes unlearned, as before. */
static void keep_for_executor(dh_coordinator_t *c, size_t pos)
{
    if (c->n_late == DH__COORD_LATE_MAX)
        remove_late(c, 0);
    if (dh__coord_grow((void **)&c->late, &c->cap_late, c->n_late + 1, sizeof *c->late) != 0) {
        dh__coord_book_remove(c, pos);
        return;
    }
    c->late[c->n_late++] = c->book[pos];
    memmove(&c->book[pos], &c->book[pos + 1], (c->n_book - pos - 1) * sizeof *c->book);
    c->n_book--;
}

/* Drops the late entries of executor `server` (>= 0) or of client `client` (>= 0). */
void dh__coord_drop_late(dh_coordinator_t *c, int32_t server, int32_t client)
{
    for (size_t i = 0; i < c->n_late;)
        if ((server >= 0 && c->late[i].server == server) ||
            (client >= 0 && c->late[i].client == client))
            remove_late(c, i);
        else
            i++;
}

void dh__coord_on_request(dh_coordinator_t *c, const char *peer, dh_wire_received_t *r)
{
    dh_msg_request_t *q = &r->msg.request;
    int32_t ci;
    if (!dh__coord_find_client(c, q->client_id, &ci) || strcmp(peer, q->client_id) != 0) {
        /* DH_EUNKNOWN: the client registers again and sends what is outstanding (after a
         * coordinator restart, which forgot every client) instead of failing */
        dh__coord_send_error(c, peer, DH_EUNKNOWN,
                             "REQUEST from a client this coordinator does not know: send HELLO");
        return;
    }
    if (find_entry(c, q->client_id, q->seq, NULL))
        return; /* a repeated request: already in the book */
    int rc = DH_FAULT(DH_FAULT_COORD_BOOK)
                 ? dh__set_error(DH_ENOMEM, "coordinator: out of memory (injected)")
                 : dh__coord_grow((void **)&c->book, &c->cap_book, c->n_book + 1, sizeof *c->book);
    if (rc) {
        char what[64];
        snprintf(what, sizeof what, "request %llu", (unsigned long long)q->seq);
        dh__coord_refuse(c, peer, rc, what);
        return;
    }
    entry_t *e = &c->book[c->n_book++];
    memset(e, 0, sizeof *e);
    e->msg = r->msg; /* ownership moves to the book */
    memset(&r->msg, 0, sizeof r->msg);
    e->client = ci;
    e->server = -1;
    e->arrival_ns = dh_clock_now_ns();
    for (uint32_t i = 0; i < e->msg.request.n_samples; i++) {
        dh_profile_row_t row;
        dh__rt_row_of_sample(&e->msg.request.samples[i], &row);
        e->pred_cpu_s += dh_cost_model_predict(c->model, &row, NULL);
        /* A remote sample's bytes are fetched, not read from the server's storage: its C_io
         * is the fetch model's (coordinator_place.c), not in_bytes x storage_s_per_B. */
        if (dh__coord_is_remote(e->msg.request.samples[i].uri))
            e->n_remote++;
        else
            e->in_bytes += (double)e->msg.request.samples[i].in_bytes;
        e->out_bytes += (double)e->msg.request.samples[i].out_bytes;
    }
    dh__count(&c->counters.requests, 1);
    c->pending_work = true;
}

void dh__coord_on_complete(dh_coordinator_t *c, const char *peer, const dh_msg_complete_t *m)
{
    int32_t si = -1;
    server_t *s = dh__coord_find_server(c, peer, &si);
    if (s)
        s->last_seen_ns = dh_clock_now_ns();
    dh__count(&c->counters.completes, 1);
    size_t pos;
    entry_t *e = find_entry(c, m->client_id, m->seq, &pos);
    if (!e) {
        /* delivered already: the executor's report that the delivery overtook, or a
         * duplicate, or its client left */
        for (size_t i = 0; s && !m->delivered && i < c->n_late; i++) {
            entry_t *l = &c->late[i];
            if (l->server == si && l->msg.request.seq == m->seq &&
                strcmp(l->msg.request.client_id, m->client_id) == 0) {
                dh__coord_learn(c, si, l, m);
                remove_late(c, i);
                break;
            }
        }
        return;
    }
    bool from_executor = s && e->server == si && !e->executed;
    if (from_executor) {
        e->executed = true;
        dh__coord_unqueue(c, si, e);
        dh__coord_learn(c, si, e, m);
    }
    if (m->delivered) {
        bool unreported = e->server >= 0 && !e->executed;
        if (unreported)
            dh__coord_unqueue(c, e->server, e);
        /* delivered before its executor reported (another peer's pipe read first): keep it
         * for the report, which carries the measurements */
        if (unreported && e->server != si && c->servers[e->server].alive)
            keep_for_executor(c, pos);
        else
            dh__coord_book_remove(c, pos);
        dh__count(&c->counters.delivered, 1);
    }
    c->pending_work = true;
}
