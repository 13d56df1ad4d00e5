/* rebalance_rounds.c: the timed rounds of rebalance-bench's on-node part, run by the
 * coordinator (rebalance_coord.c): each gathers every rank's clips, decides a seeded move
 * that keeps every rank's count, hands it off, and checks every invariant from the ranks'
 * replies (each clip held once, by its owner, taken over at its original slab).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/clock.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/wire.h"
#include "bench/rebalance_bench_internal.h"

/* This round's decision, the same for every run of a seed: a share of the clips, chosen at
 * random, move among the slots they free, so every rank keeps its count. The moving clips
 * are grouped by owner (ranks in a random order, clips in a random order within), and each
 * takes the slot `largest group` places further on: when no rank holds more than half the
 * moving clips, every one of them changes owner. Returns the clips that change owner.
 * Cost: O(clips + ranks). */
static uint32_t plan_moves(onnode_t *o, uint32_t round)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    const uint32_t n = opt->clips, ranks = opt->ranks;
    dh_rng_t rng;
    dh_rng_seed(&rng, dh_rng_mix(opt->seed, (uint64_t)round));
    for (uint32_t i = 0; i < n; i++) {
        o->book[i].next_owner = o->book[i].owner;
        o->order[i] = i;
    }
    uint32_t m = (uint32_t)(opt->move_fraction * n + 0.5);
    for (uint32_t j = 0; j < m; j++) { /* a random m-subset, in random order */
        uint32_t k = j + (uint32_t)dh_rng_below(&rng, n - j), t = o->order[j];
        o->order[j] = o->order[k];
        o->order[k] = t;
    }
    uint32_t rank_order[DH_REBALANCE_BENCH_MAX_RANKS], start[DH_REBALANCE_BENCH_MAX_RANKS + 1];
    uint32_t group[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t r = 0; r < ranks; r++)
        rank_order[r] = r;
    for (uint32_t r = ranks; r > 1; r--) {
        uint32_t k = (uint32_t)dh_rng_below(&rng, r), t = rank_order[r - 1];
        rank_order[r - 1] = rank_order[k];
        rank_order[k] = t;
    }
    /* stable counting sort of the moving clips by their owner's place in rank_order */
    uint32_t place[DH_REBALANCE_BENCH_MAX_RANKS];
    for (uint32_t r = 0; r < ranks; r++)
        place[rank_order[r]] = r;
    for (uint32_t j = 0; j < m; j++)
        group[place[o->book[o->order[j]].owner]]++;
    uint32_t largest = 0;
    start[0] = 0;
    for (uint32_t r = 0; r < ranks; r++) {
        start[r + 1] = start[r] + group[r];
        if (group[r] > largest)
            largest = group[r];
    }
    for (uint32_t j = 0; j < m; j++)
        o->scratch[start[place[o->book[o->order[j]].owner]]++] = o->order[j];
    uint32_t moved = 0;
    for (uint32_t j = 0; j < m; j++) {
        clip_book_t *c = &o->book[o->scratch[j]];
        c->next_owner = o->book[o->scratch[(j + largest) % m]].owner;
        moved += c->next_owner != c->owner;
    }
    for (uint32_t i = 0; i < n; i++)
        o->out->moves_digest =
            dh_rng_mix(o->out->moves_digest, ((uint64_t)i << 32) | o->book[i].next_owner);
    return moved;
}

/* The gather: every rank reports its clips; each must be named once, by the rank this
 * book says holds it, with the handle it was allocated with; and every rank keeps its
 * count. */
static int gather(onnode_t *o, uint32_t round)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    dh_msg_t req = {.type = DH_MSG_REQUEST};
    req.request.client_id = (char *)"coordinator";
    req.request.seq = round;
    req.request.delivery_node = (char *)"bench-node";
    int rc;
    for (uint32_t r = 0; r < opt->ranks; r++) {
        req.request.rank = r;
        if ((rc = dh__rebalance_send_to_rank(o, r, &req)))
            return rc;
    }
    bool seen[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t got = 0; got < opt->ranks; got++) {
        dh_wire_received_t m;
        uint32_t r;
        if ((rc = dh__rebalance_coord_recv(o, &m, &r, "gathering the ranks' clips")))
            return rc;
        const dh_msg_deliver_t *d = &m.msg.deliver;
        if (m.msg.type != DH_MSG_DELIVER || strcmp(d->client_id, KIND_HOLDINGS) != 0 ||
            d->seq != round || seen[r])
            rc = dh__set_error(-EPROTO,
                               "on-node: round %" PRIu32 ": rank %" PRIu32
                               " sent an unexpected %s in the gather",
                               round, r, dh_msg_type_name(m.msg.type));
        else if (d->n_tensors != o->expected[r])
            rc = dh__set_error(-EPROTO,
                               "on-node: round %" PRIu32 ": rank %" PRIu32 " holds %" PRIu32
                               " clips, it should hold %" PRIu32,
                               round, r, d->n_tensors, o->expected[r]);
        seen[r] = true;
        for (uint32_t i = 0; i < d->n_tensors && rc == 0; i++) {
            const dh_wire_tensor_t *w = &d->tensors[i];
            long k = dh__rebalance_clip_of_tensor(w, opt, DH_WIRE_LOC_SHM);
            clip_book_t *c = k >= 0 ? &o->book[k] : NULL;
            dh_shm_handle_t h = dh__rebalance_handle_of(w);
            if (!c || c->seen_round == round || c->owner != r ||
                memcmp(&h, &c->handle, sizeof h) != 0)
                rc = dh__set_error(-EPROTO,
                                   "on-node: round %" PRIu32 ": rank %" PRIu32
                                   " reports '%s', which is not its own (held by rank %ld)",
                                   round, r, w->tensor.name, c ? (long)c->owner : -1L);
            else {
                c->seen_round = round;
                c->gathered = *w;
            }
        }
        dh_wire_received_release(&m);
        if (rc)
            return rc;
    }
    return 0;
}

/* The handoff of one round's decision and the receivers' reports. Counts, in the report,
 * the moved clips verified and those not found at their original slab. */
static int handoff(onnode_t *o, uint32_t round, uint32_t *verified, uint32_t *copies)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    uint32_t takes[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    int rc;
    for (uint32_t r = 0; r < opt->ranks; r++) {
        uint32_t nt = 0, ng = 0;
        for (uint32_t i = 0; i < opt->clips; i++) {
            const clip_book_t *c = &o->book[i];
            if (c->owner == c->next_owner)
                continue;
            if (c->next_owner == r)
                o->tensors[nt++] = c->gathered; /* the handle as its holder sent it */
            if (c->owner == r) {
                o->gone[ng] = (dh_wire_sample_result_t){.id = o->gone_ids[i], .error = ""};
                ng++;
            }
        }
        takes[r] = nt;
        if ((rc = dh__rebalance_send_deliver(o, r, KIND_HANDOFF, round, nt, ng)))
            return rc;
    }
    bool seen[DH_REBALANCE_BENCH_MAX_RANKS] = {0};
    for (uint32_t got = 0; got < opt->ranks; got++) {
        dh_wire_received_t m;
        uint32_t r;
        if ((rc = dh__rebalance_coord_recv(o, &m, &r, "waiting for the handoff")))
            return rc;
        const dh_msg_deliver_t *d = &m.msg.deliver;
        if (m.msg.type != DH_MSG_DELIVER || strcmp(d->client_id, KIND_TAKEN) != 0 ||
            d->seq != round || seen[r] || d->n_tensors != takes[r])
            rc = dh__set_error(-EPROTO,
                               "on-node: round %" PRIu32 ": rank %" PRIu32
                               " sent an unexpected %s after the handoff",
                               round, r, dh_msg_type_name(m.msg.type));
        seen[r] = true;
        for (uint32_t i = 0; i < d->n_tensors && rc == 0; i++) {
            const dh_wire_tensor_t *w = &d->tensors[i];
            long k = dh__rebalance_clip_of_tensor(w, opt, DH_WIRE_LOC_SHM);
            clip_book_t *c = k >= 0 ? &o->book[k] : NULL;
            if (!c || c->next_owner != r || c->owner == r)
                rc = dh__set_error(-EPROTO,
                                   "on-node: round %" PRIu32 ": rank %" PRIu32
                                   " took '%s', which was not for it",
                                   round, r, w->tensor.name);
            else {
                (*verified)++;
                /* the receiver resolved it where it was allocated: same bytes, no copy */
                if (w->offset != c->handle.offset || w->generation != c->handle.generation ||
                    w->arena_id != c->handle.arena_id)
                    (*copies)++;
            }
        }
        dh_wire_received_release(&m);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < opt->clips; i++)
        o->book[i].owner = o->book[i].next_owner;
    return 0;
}

/* One round: the gather, the decision, the handoff; timed end to end. round 0 is the
 * untimed warm-up; round rounds + 1 only gathers (it checks the last handoff). */
int dh__rebalance_onnode_rounds(onnode_t *o, double *ms, uint32_t *moved_min)
{
    const dh_rebalance_bench_options_t *opt = o->opt;
    int rc;
    *moved_min = UINT32_MAX;
    for (uint32_t round = 1; round <= opt->rounds + 1; round++) {
        uint64_t t0 = dh_clock_now_ns();
        if ((rc = gather(o, round)))
            return rc;
        uint32_t moved = plan_moves(o, round), verified = 0, copies = 0;
        if ((rc = handoff(o, round, &verified, &copies)))
            return rc;
        double dt = dh_clock_elapsed_s(t0, dh_clock_now_ns()) * 1e3;
        if (verified != moved)
            return dh__set_error(-EPROTO,
                                 "on-node: round %" PRIu32 ": %" PRIu32 " clips moved, %" PRIu32
                                 " reported taken",
                                 round, moved, verified);
        if (round == 1)
            continue; /* the warm-up: first touches of pages and connections */
        ms[round - 2] = dt;
        o->out->onnode_handoffs_verified += verified;
        o->out->onnode_pixel_copies += copies;
        if (moved < *moved_min)
            *moved_min = moved;
    }
    return gather(o, opt->rounds + 2); /* checks the last round's result */
}
