/* cost.c: the cost model of docs/design.md §4.1 (see cost.h) and its online refinement.
 *
 * Refinement keeps, per profile key, a windowed mean of the ratio measured / cpu_s_est (so
 * rows of one key that differ in duration or jitter keep their relative order) with a drift
 * detector that restarts it after a step change (learn_key), a global ratio for keys with
 * too few observations, and a weighted least squares fit of measured seconds on frames x
 * output pixels with a forgetting factor, for keys never seen.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "core/internal.h"

double dh_cost_ewma(double value, double sample, double alpha)
{
    return value + alpha * (sample - value);
}

double dh_cost_speed_learn(double speed, double measured_s, double predicted_s)
{
    if (!(measured_s > 0) || !(predicted_s > 0) || !isfinite(measured_s) || !isfinite(predicted_s))
        return speed;
    double residual = measured_s / predicted_s;
    residual = residual < 0.5 ? 0.5 : residual > 2 ? 2 : residual;
    speed = dh_cost_ewma(speed, residual * speed, 0.05);
    return speed < 0.05 ? 0.05 : speed > 20 ? 20 : speed;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dh_cost_speed_anchor(double *speeds, size_t n)
{
    if (n == 0)
        return 1.0;
    double *copy = dh_malloc(n * sizeof *copy);
    if (!copy)
        return 1.0;
    memcpy(copy, speeds, n * sizeof *copy);
    qsort(copy, n, sizeof *copy, cmp_double);
    double median = n % 2 ? copy[n / 2] : 0.5 * (copy[n / 2 - 1] + copy[n / 2]);
    dh_free(copy);
    if (!(median > 0) || !isfinite(median))
        return 1.0;
    for (size_t i = 0; i < n; i++)
        speeds[i] /= median;
    return median;
}

/* ---- Online refinement ------------------------------------------------------------- */

typedef struct key_slot {
    char *key; /* NULL = empty slot */
    uint64_t hash;
    double ratio;    /* mean of measured / cpu_s_est over the last key_window observations */
    uint64_t obs;    /* observations since the key was first seen or last restarted */
    double fast_log; /* EWMA (key_alpha) of log ratio: the drift detector's quick view */
    double var_log;  /* EWMA of the squared log deviation from `ratio`: the per-sample noise */
    uint64_t drift_restarts;
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
    cfg->key_window = 50;
    cfg->key_drift_sd = 4;
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

/* One observation of a key's ratio (see cost.h, key_window): a running mean over the last
 * key_window observations (plain 1/n at first), and a drift detector: a quick EWMA of the
 * log ratio (key_alpha) against the mean, in units of the noise that EWMA keeps (the
 * per-sample deviation's EWMA variance x alpha / (2 - alpha)). A gap past key_drift_sd of
 * them restarts the mean from this observation, so a step change is followed in a few
 * observations while steady noise is averaged over the whole window. O(1). */
static void learn_key(const dh_cost_model_config_t *cfg, key_slot_t *s, double ratio)
{
    if (s->obs == 0 || !(s->ratio > 0) || !(ratio > 0)) {
        /* first observation (or a zero: no logarithm) */
        double a = 1.0 / (double)(s->obs + 1);
        s->ratio = s->obs == 0 ? ratio : dh_cost_ewma(s->ratio, ratio, a);
        if (ratio > 0 && s->obs == 0) {
            s->fast_log = log(ratio);
            s->var_log = 0;
        }
        s->obs++;
        return;
    }
    double lx = log(ratio);
    double dev = lx - log(s->ratio);
    uint64_t n = s->obs;
    double fa = cfg->key_alpha > 0 && cfg->key_alpha <= 1 ? cfg->key_alpha : 0.2;
    uint64_t settle = (uint64_t)(1.0 / fa); /* observations before the detector trusts itself */
    /* the noise: plain mean of dev^2 at first, then EWMA, each sample clipped at 3 sd so a
     * step change does not hide itself by inflating the noise it is measured against */
    double d2 = dev * dev;
    if (n > 20 && d2 > 9 * s->var_log)
        d2 = 9 * s->var_log;
    s->var_log = dh_cost_ewma(s->var_log, d2, n > 20 ? 0.05 : 1.0 / (double)n);
    s->fast_log = dh_cost_ewma(s->fast_log, lx, n < settle ? 1.0 / (double)(n + 1) : fa);
    double window = cfg->key_window >= 1 ? (double)cfg->key_window : 1.0;
    double a = 1.0 / (double)(n + 1);
    if (a < 1.0 / window)
        a = 1.0 / window;
    s->ratio = dh_cost_ewma(s->ratio, ratio, a);
    s->obs++;
    double var = s->var_log > 1e-6 ? s->var_log : 1e-6;
    double fast_sd = sqrt(var * fa / (2 - fa));
    if (cfg->key_drift_sd > 0 && s->obs >= settle &&
        fabs(s->fast_log - log(s->ratio)) > cfg->key_drift_sd * fast_sd) {
        s->ratio = ratio; /* restart from the new regime */
        s->fast_log = lx;
        s->obs = 1;
        s->drift_restarts++;
    }
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
                s->obs = 0;
                m->used++;
            }
            learn_key(&m->cfg, s, ratio);
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

void dh_cost_model_scale(dh_cost_model_t *m, double factor)
{
    if (!(factor > 0) || !isfinite(factor))
        return;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key) {
            m->slots[i].ratio *= factor;
            m->slots[i].fast_log += log(factor);
        }
    m->global_ratio *= factor;
    m->wy *= factor;
    m->wxy *= factor;
}

double dh_cost_model_key_ratio(const dh_cost_model_t *model, const char *profile_key, uint64_t *obs)
{
    const key_slot_t *k = lookup(model, profile_key);
    if (obs)
        *obs = k ? k->obs : 0;
    return k ? k->ratio : NAN;
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
