/* coordinator_rebalance.c: the coordinator's part in tier 2 (docs/rebalancing.md): it gathers
 * a round's offers from the members of a load-balance group and gives every member the same
 * round. It decides nothing: every member runs the policy on what it gets.
 *
 * A round (group, round) opens with its first OFFER, which names the group's ranks. When an
 * offer from every rank is in, each member gets one ROUND: the members (rank, client, node,
 * the node's local DataServer endpoint, learned seconds per token) and every offered part,
 * ordered by (batch, rank, slot). A round that is not gathered when a member that offered
 * is due to consume its first batch (the offer's lead, its deadline model), or within its
 * timeout (the offers carry it), ends: every member that offered gets END, and so does any
 * later offer for it (the ended rounds are remembered), so every member keeps its parts
 * and no rank waits on the round longer than it would have waited for its own batch.
 * Threads: the coordinator's loop only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "datahelix/wire.h"
#include "runtime/coordinator_internal.h"

#define ENDED_RING 256

typedef struct rb_round {
    uint32_t group;
    uint64_t round;
    uint64_t opened_ns;
    uint64_t timeout_ns;
    uint64_t due_ns; /* the earliest a member that offered consumes the round's first batch
                      * (its lead from its offer): the round ends then if not gathered */
    uint32_t due_rank;
    uint32_t n_ranks;
    uint32_t *ranks;         /* the group's ranks, as the first offer named them */
    dh_msg_t *offers;        /* n_ranks; type 0 = not yet */
    char (*peers)[NAME_CAP]; /* the offers' routing ids (a client's tier-2 socket) */
    uint64_t *recv_ns;       /* when each offer came */
} rb_round_t;

struct dh__coord_rb {
    rb_round_t *rounds;
    size_t n_rounds, cap_rounds;
    struct {
        uint32_t group;
        uint64_t round;
        bool used;
    } ended[ENDED_RING];
    size_t next_ended;
};

static void round_free(rb_round_t *r)
{
    for (uint32_t i = 0; i < r->n_ranks && r->offers; i++)
        dh_msg_clear(&r->offers[i]);
    dh_free(r->offers);
    dh_free(r->ranks);
    dh_free(r->peers);
    dh_free(r->recv_ns);
    memset(r, 0, sizeof *r);
}

void dh__coord_rb_destroy(dh_coordinator_t *c)
{
    if (!c->rb)
        return;
    for (size_t i = 0; i < c->rb->n_rounds; i++)
        round_free(&c->rb->rounds[i]);
    dh_free(c->rb->rounds);
    dh_free(c->rb);
    c->rb = NULL;
}

static bool was_ended(const struct dh__coord_rb *rb, uint32_t group, uint64_t round)
{
    for (size_t i = 0; i < ENDED_RING; i++)
        if (rb->ended[i].used && rb->ended[i].group == group && rb->ended[i].round == round)
            return true;
    return false;
}

static void send_end(dh_coordinator_t *c, const char *peer, uint32_t group, uint64_t round,
                     const char *why)
{
    dh_msg_t m = {.type = DH_MSG_REBALANCE};
    m.rebalance.kind = DH_RB_END;
    m.rebalance.group = group;
    m.rebalance.round = round;
    m.rebalance.reason = (char *)why;
    dh__coord_send_to(c, peer, &m);
}

/* Ends round i: END to each member that offered, remembered for late offers. */
static void end_round(dh_coordinator_t *c, size_t i, const char *why, bool quiet)
{
    struct dh__coord_rb *rb = c->rb;
    rb_round_t *r = &rb->rounds[i];
    if (quiet)
        dh_log_debug("coordinator: rebalance round %llu of group %u ended, every member keeps "
                     "its parts: %s",
                     (unsigned long long)r->round, r->group, why);
    else
        dh_log_warn("coordinator: rebalance round %llu of group %u ended, every member keeps its "
                    "parts: %s",
                    (unsigned long long)r->round, r->group, why);
    for (uint32_t k = 0; k < r->n_ranks; k++)
        if (r->offers[k].type)
            send_end(c, r->peers[k], r->group, r->round, why);
    rb->ended[rb->next_ended].group = r->group;
    rb->ended[rb->next_ended].round = r->round;
    rb->ended[rb->next_ended].used = true;
    rb->next_ended = (rb->next_ended + 1) % ENDED_RING;
    round_free(r);
    rb->rounds[i] = rb->rounds[--rb->n_rounds];
}

static int part_order(const void *a, const void *b)
{
    const dh_wire_rb_part_t *x = a, *y = b;
    if (x->batch != y->batch)
        return x->batch < y->batch ? -1 : 1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Every offer of round i is in: the ROUND to every member, then the round is done. */
static void complete_round(dh_coordinator_t *c, size_t i)
{
    rb_round_t *r = &c->rb->rounds[i];
    size_t n_parts = 0;
    for (uint32_t k = 0; k < r->n_ranks; k++)
        n_parts += r->offers[k].rebalance.n_parts;
    dh_wire_rb_member_t *members = dh_calloc(r->n_ranks, sizeof *members);
    dh_wire_rb_part_t *parts = dh_calloc(n_parts ? n_parts : 1, sizeof *parts);
    if (!members || !parts) {
        dh_free(members);
        dh_free(parts);
        end_round(c, i, "the coordinator ran out of memory gathering it", false);
        return;
    }
    size_t at = 0;
    char reason[512] = ""; /* a member's features failed: every member keeps */
    for (uint32_t k = 0; k < r->n_ranks; k++) {
        const dh_msg_rebalance_t *o = &r->offers[k].rebalance;
        client_t *cl = dh__coord_find_client(c, o->client_id, NULL);
        int32_t ds = cl ? dh__coord_local_server_of(c, cl->node) : -1;
        members[k].rank = r->ranks[k];
        members[k].client_id = o->client_id;
        if (o->reason && o->reason[0] && !reason[0])
            snprintf(reason, sizeof reason, "rank %u: %s", o->rank, o->reason);
        members[k].node = cl ? c->nodes[cl->node] : (char *)"";
        members[k].endpoint = ds >= 0 ? c->servers[ds].endpoint : (char *)"";
        double since = (double)(dh_clock_now_ns() - r->recv_ns[k]) / 1e9;
        for (uint32_t j = 0; j < o->n_members; j++)
            if (o->members[j].rank == r->ranks[k]) {
                members[k].s_per_token = o->members[j].s_per_token;
                double left = o->members[j].lead_s - since; /* the lead it has left */
                members[k].lead_s = left > 0 ? left : 0;
            }
        for (uint32_t j = 0; j < o->n_parts; j++)
            parts[at++] = o->parts[j]; /* borrowed: the offers own them */
    }
    qsort(parts, at, sizeof *parts, part_order);
    dh_msg_t m = {.type = DH_MSG_REBALANCE};
    m.rebalance.kind = DH_RB_ROUND;
    m.rebalance.group = r->group;
    m.rebalance.round = r->round;
    m.rebalance.reason = reason;
    m.rebalance.n_members = r->n_ranks;
    m.rebalance.members = members;
    m.rebalance.n_parts = (uint32_t)at;
    m.rebalance.parts = parts;
    for (uint32_t k = 0; k < r->n_ranks; k++)
        dh__coord_send_to(c, r->peers[k], &m);
    dh__count(&c->counters.rebalance_rounds, 1);
    dh_log_debug("coordinator: rebalance round %llu of group %u gathered: %u ranks, %zu parts",
                 (unsigned long long)r->round, r->group, r->n_ranks, at);
    dh_free(members);
    dh_free(parts);
    round_free(r);
    c->rb->rounds[i] = c->rb->rounds[--c->rb->n_rounds];
}

/* Ends round i if a member that offered is about to consume its first batch (the round
 * must add no wait to the training loop): returns whether it did. */
static bool end_if_due(dh_coordinator_t *c, size_t i, uint64_t now)
{
    rb_round_t *r = &c->rb->rounds[i];
    if (!r->due_ns || now < r->due_ns)
        return false;
    char why[160];
    snprintf(why, sizeof why, "not gathered before rank %u needs its first batch", r->due_rank);
    end_round(c, i, why, true);
    return true;
}

void dh__coord_on_rebalance(dh_coordinator_t *c, const char *peer, dh_wire_received_t *in)
{
    dh_msg_rebalance_t *o = &in->msg.rebalance;
    if (o->kind != DH_RB_OFFER) {
        dh_log_warn("coordinator: unexpected REBALANCE kind %u from '%s' ignored", o->kind, peer);
        return;
    }
    client_t *cl = o->client_id ? dh__coord_find_client(c, o->client_id, NULL) : NULL;
    if (!cl || cl->rank != o->rank) {
        dh_log_warn("coordinator: REBALANCE offer from '%s' (rank %u) ignored: %s", peer, o->rank,
                    cl ? "it registered another rank" : "it has not sent HELLO");
        send_end(c, peer, o->group, o->round, "the coordinator does not know this client");
        return;
    }
    if (!c->rb && !(c->rb = dh_calloc(1, sizeof *c->rb))) {
        send_end(c, peer, o->group, o->round, "the coordinator is out of memory");
        return;
    }
    struct dh__coord_rb *rb = c->rb;
    if (was_ended(rb, o->group, o->round)) {
        send_end(c, peer, o->group, o->round, "the round ended before this offer came");
        return;
    }
    size_t i = 0;
    while (i < rb->n_rounds &&
           !(rb->rounds[i].group == o->group && rb->rounds[i].round == o->round))
        i++;
    if (i == rb->n_rounds) {
        if (o->n_members == 0 || o->n_members > 4096 ||
            dh__coord_grow((void **)&rb->rounds, &rb->cap_rounds, rb->n_rounds + 1,
                           sizeof *rb->rounds)) {
            send_end(c, peer, o->group, o->round,
                     o->n_members ? "the coordinator is out of memory"
                                  : "the offer names no ranks");
            return;
        }
        rb_round_t *r = &rb->rounds[rb->n_rounds];
        memset(r, 0, sizeof *r);
        r->group = o->group;
        r->round = o->round;
        r->opened_ns = dh_clock_now_ns();
        r->timeout_ns = (o->seq ? o->seq : 10000) * 1000000ull;
        r->n_ranks = o->n_members;
        r->ranks = dh_calloc(o->n_members, sizeof *r->ranks);
        r->offers = dh_calloc(o->n_members, sizeof *r->offers);
        r->peers = dh_calloc(o->n_members, sizeof *r->peers);
        r->recv_ns = dh_calloc(o->n_members, sizeof *r->recv_ns);
        if (!r->ranks || !r->offers || !r->peers || !r->recv_ns) {
            round_free(r);
            send_end(c, peer, o->group, o->round, "the coordinator is out of memory");
            return;
        }
        for (uint32_t k = 0; k < o->n_members; k++)
            r->ranks[k] = o->members[k].rank;
        rb->n_rounds++;
    }
    rb_round_t *r = &rb->rounds[i];
    uint32_t k = 0;
    while (k < r->n_ranks && r->ranks[k] != o->rank)
        k++;
    bool same = o->n_members == r->n_ranks;
    for (uint32_t j = 0; same && j < r->n_ranks; j++)
        same = o->members[j].rank == r->ranks[j];
    if (k == r->n_ranks || !same || r->offers[k].type) {
        char why[192];
        snprintf(why, sizeof why, "rank %u's offer %s (client '%s')", o->rank,
                 k == r->n_ranks || !same ? "names another group than the first offer's"
                                          : "came twice",
                 peer);
        end_round(c, i, why, false);
        send_end(c, peer, o->group, o->round, why);
        return;
    }
    r->offers[k] = in->msg; /* taken */
    memset(&in->msg, 0, sizeof in->msg);
    snprintf(r->peers[k], NAME_CAP, "%s", peer);
    r->recv_ns[k] = dh_clock_now_ns();
    const dh_msg_rebalance_t *mine = &r->offers[k].rebalance;
    for (uint32_t j = 0; j < mine->n_members; j++)
        if (mine->members[j].rank == mine->rank) {
            uint64_t due = r->recv_ns[k] + (uint64_t)(mine->members[j].lead_s * 1e9);
            if (!r->due_ns || due < r->due_ns) {
                r->due_ns = due;
                r->due_rank = mine->rank;
            }
        }
    for (uint32_t j = 0; j < r->n_ranks; j++)
        if (!r->offers[j].type) {
            end_if_due(c, i, r->recv_ns[k]);
            return;
        }
    complete_round(c, i);
}

void dh__coord_rb_tick(dh_coordinator_t *c)
{
    if (!c->rb)
        return;
    uint64_t now = dh_clock_now_ns();
    for (size_t i = 0; i < c->rb->n_rounds;) {
        rb_round_t *r = &c->rb->rounds[i];
        if (end_if_due(c, i, now))
            continue;
        if (now - r->opened_ns <= r->timeout_ns) {
            i++;
            continue;
        }
        char why[256];
        int len = snprintf(why, sizeof why, "no offer within %.0f ms from rank",
                           (double)r->timeout_ns / 1e6);
        for (uint32_t k = 0; k < r->n_ranks && len > 0 && (size_t)len < sizeof why; k++)
            if (!r->offers[k].type)
                len += snprintf(why + len, sizeof why - (size_t)len, " %u", r->ranks[k]);
        end_round(c, i, why, false);
    }
}
