/* cost.c: the cost model of docs/design.md §4.1 (see cost.h) and its online refinement.
 *
 * Refinement keeps, per profile key, an exponentially weighted mean of the ratio
 * measured / cpu_s_est (so rows of one key that differ in duration or jitter keep their
 * relative order), a global ratio for keys with too few observations, and a weighted least
 * squares fit of measured seconds on frames x output pixels with a forgetting factor, for
 * keys never seen. EWMA and forgetting make the model follow a drifting workload: after a
 * step change the error shrinks by (1 - alpha) per observation of the key.
 */
#include <math.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "core/internal.h"

void dh_cost_predict(const dh_snapshot_t *snap, const dh_request_cost_t *req, uint32_t server,
                     dh_cost_breakdown_t *out)
{
    const dh_server_state_t *s = &snap->servers[server];
    out->cpu_s = req->cpu_s * s->speed_factor;
    out->io_s = req->in_bytes * s->storage_s_per_B;
    out->queue_s = (s->workers == 0)             ? INFINITY
                   : (s->queue_len < s->workers) ? 0.0
                                                 : s->queue_wait_s;
    if (s->node == req->consumer_node) {
        out->net_s = 0.0;
    } else {
        const dh_link_t *l = &snap->links[(size_t)s->node * snap->n_nodes + req->consumer_node];
        out->net_s = req->out_bytes * l->s_per_B + l->latency_s;
    }
    out->total_s = out->cpu_s + out->io_s + out->queue_s + out->net_s;
}

double dh_cost_transfer_bytes(const dh_snapshot_t *snap, const dh_request_cost_t *req,
                              uint32_t server)
{
    return snap->servers[server].node == req->consumer_node ? 0.0 : req->out_bytes;
}

double dh_cost_ewma(double value, double sample, double alpha)
{
    return value + alpha * (sample - value);
}

/* ---- Online refinement ------------------------------------------------------------- */

typedef struct key_slot {
    char *key; /* NULL = empty slot */
    uint64_t hash;
    double ratio; /* EWMA of measured / cpu_s_est */
    uint64_t obs;
} key_slot_t;

struct dh_cost_model {
    dh_cost_model_config_t cfg;
    key_slot_t *slots; /* open addressing, power-of-two capacity, load <= 1/2 */
    size_t cap, used;
    double global_ratio;
    uint64_t global_obs;
    /* Weighted sums for the fit y = a + b x, x = frames x pixels / 1e6 (kept near 1). */
    double w, wx, wxx, wy, wxy;
    uint64_t fit_obs;
};

void dh_cost_model_config_default(dh_cost_model_config_t *cfg)
{
    cfg->key_alpha = 0.2;
    cfg->key_min_obs = 3;
    cfg->fit_forget = 0.99;
    cfg->fit_min_obs = 8;
}

int dh_cost_model_new(dh_cost_model_t **out, const dh_cost_model_config_t *cfg)
{
    dh_cost_model_t *m = dh_calloc(1, sizeof *m);
    if (!m)
        return DH_ENOMEM;
    if (cfg)
        m->cfg = *cfg;
    else
        dh_cost_model_config_default(&m->cfg);
    m->cap = 16;
    m->slots = dh_calloc(m->cap, sizeof *m->slots);
    if (!m->slots) {
        dh_free(m);
        return DH_ENOMEM;
    }
    m->global_ratio = 1.0;
    *out = m;
    return 0;
}

void dh_cost_model_destroy(dh_cost_model_t **model)
{
    if (!model || !*model)
        return;
    dh_cost_model_t *m = *model;
    for (size_t i = 0; i < m->cap; i++)
        dh_free(m->slots[i].key);
    dh_free(m->slots);
    dh_free(m);
    *model = NULL;
}

static uint64_t hash_key(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Slot of key: the matching one, or the empty one where it would go. */
static key_slot_t *find_slot(key_slot_t *slots, size_t cap, const char *key, uint64_t h)
{
    for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1)) {
        key_slot_t *s = &slots[i];
        if (!s->key || (s->hash == h && strcmp(s->key, key) == 0))
            return s;
    }
}

static const key_slot_t *lookup(const dh_cost_model_t *m, const char *key)
{
    if (!key)
        return NULL;
    const key_slot_t *s = find_slot(m->slots, m->cap, key, hash_key(key));
    return s->key ? s : NULL;
}

static int grow(dh_cost_model_t *m)
{
    size_t cap = m->cap * 2;
    key_slot_t *slots = dh_calloc(cap, sizeof *slots);
    if (!slots)
        return DH_ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key)
            *find_slot(slots, cap, m->slots[i].key, m->slots[i].hash) = m->slots[i];
    dh_free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

static double fit_x(const dh_profile_row_t *row)
{
    return (double)row->frames * (double)row->height * (double)row->width * 1e-6;
}

/* The regression's prediction at x, or NAN while it is not determined. */
static double fit_predict(const dh_cost_model_t *m, double x)
{
    if (m->fit_obs < m->cfg.fit_min_obs)
        return NAN;
    double det = m->w * m->wxx - m->wx * m->wx;
    /* Needs spread in x: relative variance of x below 1e-9 means one x seen only. */
    if (!(det > 1e-9 * m->w * m->wxx))
        return NAN;
    double b = (m->w * m->wxy - m->wx * m->wy) / det;
    double a = (m->wy - b * m->wx) / m->w;
    double y = a + b * x;
    return y > 0 ? y : NAN;
}

double dh_cost_model_predict(const dh_cost_model_t *m, const dh_profile_row_t *row,
                             dh_cost_source_t *source)
{
    const key_slot_t *k = lookup(m, row->profile_key);
    if (k && k->obs >= m->cfg.key_min_obs) {
        if (source)
            *source = DH_COST_FROM_KEY;
        return row->cpu_s_est * k->ratio;
    }
    double y = fit_predict(m, fit_x(row));
    if (!isnan(y)) {
        if (source)
            *source = DH_COST_FROM_FIT;
        return y;
    }
    if (source)
        *source = DH_COST_FROM_PROFILE;
    return row->cpu_s_est * m->global_ratio;
}

int dh_cost_model_observe(dh_cost_model_t *m, const dh_profile_row_t *row, double measured_cpu_s,
                          double server_speed)
{
    if (!isfinite(measured_cpu_s) || measured_cpu_s < 0 || !(server_speed > 0) ||
        !isfinite(server_speed))
        return dh__set_error(DH_EINVAL, "cost model: sample '%s': bad measurement %g s at speed %g",
                             row->id ? row->id : "?", measured_cpu_s, server_speed);
    double y = measured_cpu_s / server_speed;
    double alpha = m->cfg.key_alpha;

    if (row->cpu_s_est > 0) {
        double ratio = y / row->cpu_s_est;
        if (row->profile_key) {
            if ((m->used + 1) * 2 > m->cap && grow(m) != 0)
                return DH_ENOMEM;
            uint64_t h = hash_key(row->profile_key);
            key_slot_t *s = find_slot(m->slots, m->cap, row->profile_key, h);
            if (!s->key) {
                s->key = dh_strdup(row->profile_key);
                if (!s->key)
                    return DH_ENOMEM;
                s->hash = h;
                s->ratio = ratio;
                s->obs = 0;
                m->used++;
            }
            /* The first observations average plainly (1/n) so a key is usable early, then
             * the EWMA takes over to follow drift. */
            double a = s->obs < (uint64_t)(1.0 / alpha) ? 1.0 / (double)(s->obs + 1) : alpha;
            s->ratio = dh_cost_ewma(s->ratio, ratio, a);
            s->obs++;
        }
        double ga = m->global_obs < 10 ? 1.0 / (double)(m->global_obs + 1) : 0.05;
        m->global_ratio = dh_cost_ewma(m->global_ratio, ratio, ga);
        m->global_obs++;
    }

    double x = fit_x(row), f = m->cfg.fit_forget;
    m->w = m->w * f + 1.0;
    m->wx = m->wx * f + x;
    m->wxx = m->wxx * f + x * x;
    m->wy = m->wy * f + y;
    m->wxy = m->wxy * f + x * y;
    m->fit_obs++;
    return 0;
}

uint64_t dh_cost_model_observations(const dh_cost_model_t *model)
{
    return model->fit_obs;
}

void dh_cost_model_request(const dh_cost_model_t *model, const dh_profile_row_t *const *rows,
                           size_t n, dh_request_cost_t *req)
{
    double cpu = 0, in = 0, out = 0;
    for (size_t i = 0; i < n; i++) {
        cpu += dh_cost_model_predict(model, rows[i], NULL);
        in += (double)rows[i]->in_bytes;
        out += (double)rows[i]->out_bytes;
    }
    req->cpu_s = cpu;
    req->in_bytes = in;
    req->out_bytes = out;
}
