/* client_rebalance_decide.c: the policy a member of a tier-2 group runs on a ROUND
 * (docs/rebalancing.md): the user's sort_fn, else the default per batch (dh_rebalance_plan,
 * part counts kept, its cost gate), and the check of the assignment it makes. Every member
 * runs it on the same bytes, so every member reaches the same assignment; it reads only the
 * ROUND and the client's config. Fetcher thread (client_rebalance.c).
 */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rebalance.h"
#include "datahelix/wire.h"
#include "runtime/client_internal.h"

int dh__client_rb_member_of(const dh_msg_rebalance_t *m, uint32_t rank)
{
    for (uint32_t i = 0; i < m->n_members; i++)
        if (m->members[i].rank == rank)
            return (int)i;
    return -1;
}

static bool spans_nodes(const dh_msg_rebalance_t *m)
{
    for (uint32_t i = 1; i < m->n_members; i++)
        if (strcmp(m->members[i].node, m->members[0].node) != 0)
            return true;
    return false;
}

/* Checks an assignment: a rank of the group for every part, and each rank's part count per
 * batch unchanged. 0, or DH_EINVAL with why. */
static int check_assignment(const dh_msg_rebalance_t *m, const uint32_t *new_rank, char *why,
                            size_t cap)
{
    uint32_t n = m->n_parts;
    for (uint32_t i = 0; i < n; i++)
        if (dh__client_rb_member_of(m, new_rank[i]) < 0) {
            snprintf(why, cap,
                     "part %u (batch %llu, rank %u) is given to rank %u, not in the group", i,
                     (unsigned long long)m->parts[i].batch, m->parts[i].rank, new_rank[i]);
            return DH_EINVAL;
        }
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i;
        while (j < n && m->parts[j].batch == m->parts[i].batch)
            j++;
        for (uint32_t k = 0; k < m->n_members; k++) {
            uint32_t rank = m->members[k].rank, had = 0, gets = 0;
            for (uint32_t x = i; x < j; x++) {
                had += m->parts[x].rank == rank;
                gets += new_rank[x] == rank;
            }
            if (had != gets) {
                snprintf(why, cap,
                         "the assignment gives rank %u %u parts of batch %llu; it holds %u (parts "
                         "move in exchange, within their batch)",
                         rank, gets, (unsigned long long)m->parts[i].batch, had);
                return DH_EINVAL;
            }
        }
        i = j;
    }
    return 0;
}

/* The moves' slack: the least lead any member has left before it consumes the round's first
 * batch (0 when a member has none: the whole transfer counts). */
static double slack_of(const dh_msg_rebalance_t *m)
{
    double slack = -1;
    for (uint32_t i = 0; i < m->n_members; i++)
        if (slack < 0 || m->members[i].lead_s < slack)
            slack = m->members[i].lead_s;
    return slack > 0 ? slack : 0;
}

static void decide_default(dh_client_t *c, const dh_msg_rebalance_t *m, double spt,
                           rb_decision_t *d)
{
    uint32_t n = m->n_parts;
    dh_rebalance_item_t *items = dh_calloc(n ? n : 1, sizeof *items);
    if (!items) {
        d->err = dh__set_error(DH_ENOMEM, "out of memory deciding a round");
        snprintf(d->why, sizeof d->why, "%s", dh_last_error());
        return;
    }
    dh_rebalance_params_t p;
    dh_rebalance_params_default(&p);
    p.ranks = m->n_members;
    p.keep_counts = 1;
    p.s_per_token = spt;
    p.move_s_per_B = spans_nodes(m) ? c->cfg.rebalance.move_s_per_B : 0;
    p.min_gain = c->cfg.rebalance.min_gain;
    p.slack_s = slack_of(m);
    bool proposed = false;
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i;
        while (j < n && m->parts[j].batch == m->parts[i].batch)
            j++;
        for (uint32_t x = i; x < j; x++)
            items[x - i] =
                (dh_rebalance_item_t){(uint32_t)dh__client_rb_member_of(m, m->parts[x].rank),
                                      m->parts[x].tokens, m->parts[x].bytes};
        dh_rebalance_verdict_t v;
        int rc = dh_rebalance_plan(items, j - i, &p, &d->new_rank[i], &v);
        if (rc) {
            d->err = rc;
            snprintf(d->why, sizeof d->why, "%s", dh_last_error());
            break;
        }
        for (uint32_t x = i; x < j; x++)
            d->new_rank[x] = m->members[d->new_rank[x]].rank;
        d->gain_s += v.applied ? v.gain_s : 0;
        d->cost_s += v.applied ? v.cost_s : 0;
        d->transfer_s += v.applied ? v.transfer_s : 0;
        d->max_before_s += v.max_before_s;
        d->moved += v.moved;
        proposed |= v.gain_s > 0;
        d->apply |= v.applied != 0;
        i = j;
    }
    d->gate_kept = !d->apply && proposed && d->err == 0;
    dh_free(items);
}

void dh__client_rb_decide(dh_client_t *c, const dh_msg_rebalance_t *m, rb_decision_t *d)
{
    const dh_rebalance_config_t *rc = &c->cfg.rebalance;
    uint32_t n = m->n_parts;
    for (uint32_t i = 0; i < n; i++) {
        d->new_rank[i] = m->parts[i].rank;
        if (dh__client_rb_member_of(m, m->parts[i].rank) < 0) {
            d->err = DH_EPARSE;
            snprintf(d->why, sizeof d->why, "part %u names rank %u, not in the group", i,
                     m->parts[i].rank);
            return;
        }
    }
    double spt = 0;
    uint32_t known = 0;
    for (uint32_t i = 0; i < m->n_members; i++)
        if (m->members[i].s_per_token > 0) {
            spt += m->members[i].s_per_token;
            known++;
        }
    spt = known ? spt / known : 0;
    if (!(spt > 0) && !spans_nodes(m))
        spt = 1; /* on one node a move costs nothing: the decision does not depend on it */
    if (!rc->sort_fn) {
        if (spt > 0 && n) /* else no compute rate learned yet: nothing to weigh a move
                           * against */
            decide_default(c, m, spt, d);
        return;
    }
    size_t nf = rc->feature_fn ? rc->n_features : RB_DEFAULT_FEATURES;
    dh_rebalance_part_t *views = dh_calloc(n ? n : 1, sizeof *views);
    double *f = dh_calloc((n ? n : 1) * nf, sizeof *f);
    uint32_t ranks[m->n_members ? m->n_members : 1];
    if (!views || !f) {
        dh_free(views);
        dh_free(f);
        d->err = dh__set_error(DH_ENOMEM, "out of memory for the round's views");
        snprintf(d->why, sizeof d->why, "%s", dh_last_error());
        return;
    }
    for (uint32_t i = 0; i < m->n_members; i++)
        ranks[i] = m->members[i].rank;
    for (uint32_t i = 0; i < n; i++) {
        const dh_wire_rb_part_t *p = &m->parts[i];
        for (size_t k = 0; k < nf && k < p->n_features; k++)
            f[i * nf + k] = p->features[k].v;
        views[i] = (dh_rebalance_part_t){p->rank,   p->batch, p->slot,  p->n_samples,
                                         p->tokens, p->bytes, p->cpu_s, &f[i * nf]};
    }
    dh_rebalance_round_t round = {.group = m->group,
                                  .round = m->round,
                                  .ranks = ranks,
                                  .n_ranks = m->n_members,
                                  .parts = views,
                                  .n_parts = n,
                                  .n_features = nf,
                                  .s_per_token = spt,
                                  .min_gain = rc->min_gain,
                                  .move_s_per_B = spans_nodes(m) ? rc->move_s_per_B : 0,
                                  .slack_s = slack_of(m),
                                  .args = c->rb.args};
    dh_clear_error(); /* what sort_fn sets, it says */
    int r = rc->sort_fn(rc->sort_user, &round, d->new_rank);
    if (r < 0) {
        d->err = r;
        snprintf(d->why, sizeof d->why, "sort_fn failed: %s",
                 dh_last_error()[0] ? dh_last_error() : dh_strerror(r));
    } else if (r == 0) {
        d->err = check_assignment(m, d->new_rank, d->why, sizeof d->why);
        for (uint32_t i = 0; d->err == 0 && i < n; i++)
            if (d->new_rank[i] != m->parts[i].rank) {
                d->apply = true;
                d->moved++;
            }
    }
    if (!d->apply || d->err)
        for (uint32_t i = 0; i < n; i++)
            d->new_rank[i] = m->parts[i].rank;
    dh_free(views);
    dh_free(f);
}
