/* model/fetch.c: the fetch model (docs/profiles.md, "The fetch model"; issue 34): the
 * seconds a sample from a remote source (http, https, s3) takes to fetch on each
 * DataServer, learned from the executors' COMPLETEs, for placement's C_io.
 *
 * A sample's fetch is modelled as latency + bytes x seconds per byte, a line in the sample's
 * size. Each (server, source) pair and each source (all servers together) keeps a weighted
 * least-squares fit of that line with forgetting (an exponentially weighted estimate, like
 * the cost model's regression), which starts from the prior as two pseudo-observations (at
 * 0 bytes and at ref_bytes) that fade as real ones arrive. A prediction uses the pair's fit
 * once it has min_obs observations, else the source's, else the prior. Pure: no I/O, no
 * clocks, no threads; one thread at a time (the coordinator's loop, under its learn_lock).
 * Sources are few (one per host or bucket): a list searched by name.
 */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "model/model_lib.h"

/* Sums of a weighted least-squares fit of y (seconds) on x (MiB: keeps the sums well
 * scaled), and the line they give. */
typedef struct fit {
    double w, x, y, xx, xy;
    uint64_t obs;
    double latency_s, s_per_B;
} fit_t;

typedef struct source {
    char *key;
    fit_t all;         /* every server's observations */
    fit_t *per_server; /* n_servers entries, index = the coordinator's server index */
    uint32_t n_servers;
} source_t;

struct dh__fetch_model {
    dh__fetch_config_t cfg;
    source_t *sources;
    size_t n_sources, cap_sources;
};

#define MIB 1048576.0

void dh__fetch_config_default(dh__fetch_config_t *cfg)
{
    *cfg = (dh__fetch_config_t){.prior_latency_s = 0.05,
                                .prior_bytes_per_s = 100e6,
                                .prior_weight = 2.0,
                                .ref_bytes = 4 * MIB,
                                .forget = 0.98,
                                .min_obs = 3};
}

/* The line of a fit's sums, both terms >= 0: when the free fit has a negative slope
 * (noise), the mean alone; a negative intercept, the line through 0. */
static void solve(fit_t *f)
{
    double den = f->w * f->xx - f->x * f->x;
    double slope = den > 0 ? (f->w * f->xy - f->x * f->y) / den : 0;
    double icept = f->w > 0 ? (f->y - slope * f->x) / f->w : 0;
    if (!(slope >= 0)) {
        slope = 0;
        icept = f->w > 0 ? f->y / f->w : 0;
    }
    if (!(icept >= 0)) {
        icept = 0;
        slope = f->xx > 0 ? f->xy / f->xx : 0;
    }
    f->latency_s = icept > 0 ? icept : 0;
    f->s_per_B = slope > 0 ? slope / MIB : 0;
}

static void add(fit_t *f, double weight, double x_mib, double y_s)
{
    f->w += weight;
    f->x += weight * x_mib;
    f->y += weight * y_s;
    f->xx += weight * x_mib * x_mib;
    f->xy += weight * x_mib * y_s;
}

/* A fit holding only the prior: half its weight at 0 bytes, half at ref_bytes. */
static fit_t prior_fit(const dh__fetch_config_t *cfg)
{
    fit_t f = {0};
    double ref = cfg->ref_bytes / MIB;
    add(&f, cfg->prior_weight / 2, 0, cfg->prior_latency_s);
    add(&f, cfg->prior_weight / 2, ref,
        cfg->prior_latency_s + cfg->ref_bytes / cfg->prior_bytes_per_s);
    solve(&f);
    return f;
}

int dh__fetch_model_new(dh__fetch_model_t **out, const dh__fetch_config_t *cfg)
{
    *out = NULL;
    dh__fetch_config_t c;
    if (cfg)
        c = *cfg;
    else
        dh__fetch_config_default(&c);
    if (!(c.prior_latency_s >= 0 && isfinite(c.prior_latency_s)) ||
        !(c.prior_bytes_per_s > 0 && isfinite(c.prior_bytes_per_s)) || !(c.prior_weight > 0) ||
        !(c.ref_bytes > 0) || !(c.forget > 0 && c.forget <= 1))
        return dh__set_error(DH_EINVAL,
                             "fetch model: prior latency %g s (finite, >= 0), bandwidth %g B/s "
                             "(finite, > 0), weight %g (> 0), ref_bytes %g (> 0), forget %g "
                             "(in (0, 1])",
                             c.prior_latency_s, c.prior_bytes_per_s, c.prior_weight, c.ref_bytes,
                             c.forget);
    dh__fetch_model_t *m = dh_calloc(1, sizeof *m);
    if (!m)
        return dh__set_error(DH_ENOMEM, "out of memory for the fetch model");
    m->cfg = c;
    *out = m;
    return 0;
}

void dh__fetch_model_destroy(dh__fetch_model_t **pm)
{
    dh__fetch_model_t *m = pm ? *pm : NULL;
    if (!m)
        return;
    for (size_t i = 0; i < m->n_sources; i++) {
        dh_free(m->sources[i].key);
        dh_free(m->sources[i].per_server);
    }
    dh_free(m->sources);
    dh_free(m);
    *pm = NULL;
}

int32_t dh__fetch_model_source(const dh__fetch_model_t *m, const char *source)
{
    for (size_t i = 0; i < m->n_sources; i++)
        if (strcmp(m->sources[i].key, source) == 0)
            return (int32_t)i;
    return -1;
}

/* The source's entry, made (with the prior) when new; NULL without memory. */
static source_t *source_of(dh__fetch_model_t *m, const char *key)
{
    int32_t i = dh__fetch_model_source(m, key);
    if (i >= 0)
        return &m->sources[i];
    if (m->n_sources == m->cap_sources) {
        size_t cap = m->cap_sources ? 2 * m->cap_sources : 4;
        source_t *grown = dh_reallocarray(m->sources, cap, sizeof *grown);
        if (!grown)
            return NULL;
        m->sources = grown;
        m->cap_sources = cap;
    }
    char *copy = dh_strdup(key);
    if (!copy)
        return NULL;
    source_t *s = &m->sources[m->n_sources++];
    *s = (source_t){.key = copy, .all = prior_fit(&m->cfg)};
    return s;
}

/* The pair's fit, the table grown (new entries: the prior) to hold server; NULL without
 * memory. */
static fit_t *pair_of(dh__fetch_model_t *m, source_t *s, uint32_t server)
{
    if (server >= s->n_servers) {
        uint32_t n = server + 1 > 2 * s->n_servers ? server + 1 : 2 * s->n_servers;
        fit_t *grown = dh_reallocarray(s->per_server, n, sizeof *grown);
        if (!grown)
            return NULL;
        fit_t prior = prior_fit(&m->cfg);
        for (uint32_t i = s->n_servers; i < n; i++)
            grown[i] = prior;
        s->per_server = grown;
        s->n_servers = n;
    }
    return &s->per_server[server];
}

static void observe(fit_t *f, double forget, double x_mib, double y_s)
{
    f->w *= forget;
    f->x *= forget;
    f->y *= forget;
    f->xx *= forget;
    f->xy *= forget;
    add(f, 1.0, x_mib, y_s);
    f->obs++;
    solve(f);
}

int dh__fetch_model_observe(dh__fetch_model_t *m, const char *source, uint32_t server,
                            double sample_bytes, double fetch_s)
{
    if (!(sample_bytes >= 0 && isfinite(sample_bytes)) || !(fetch_s >= 0 && isfinite(fetch_s)))
        return dh__set_error(DH_EINVAL,
                             "fetch model: source '%s', server %u: an observation of %g s for "
                             "%g bytes (both finite, >= 0)",
                             source, server, fetch_s, sample_bytes);
    source_t *s = source_of(m, source);
    fit_t *pair = s ? pair_of(m, s, server) : NULL;
    if (!pair)
        return dh__set_error(DH_ENOMEM, "out of memory for the fetch model's source '%s'", source);
    double x = sample_bytes / MIB;
    observe(pair, m->cfg.forget, x, fetch_s);
    observe(&s->all, m->cfg.forget, x, fetch_s);
    return 0;
}

/* The fit a prediction for (source, server) uses, and which it is. */
static const fit_t *choose(const dh__fetch_model_t *m, const source_t *s, uint32_t server,
                           const fit_t *prior, dh__fetch_from_t *from)
{
    if (s && server < s->n_servers && s->per_server[server].obs >= m->cfg.min_obs) {
        *from = DH__FETCH_FROM_SERVER;
        return &s->per_server[server];
    }
    if (s && s->all.obs >= m->cfg.min_obs) {
        *from = DH__FETCH_FROM_SOURCE;
        return &s->all;
    }
    *from = DH__FETCH_FROM_PRIOR;
    return prior;
}

void dh__fetch_model_estimate(const dh__fetch_model_t *m, const char *source, uint32_t server,
                              dh__fetch_estimate_t *out)
{
    int32_t i = dh__fetch_model_source(m, source);
    const source_t *s = i >= 0 ? &m->sources[i] : NULL;
    fit_t prior = prior_fit(&m->cfg);
    dh__fetch_from_t from;
    const fit_t *f = choose(m, s, server, &prior, &from);
    out->latency_s = f->latency_s;
    out->bytes_per_s = f->s_per_B > 0 ? 1.0 / f->s_per_B : INFINITY;
    out->obs = from == DH__FETCH_FROM_PRIOR ? 0 : f->obs;
    out->from = from;
}

void dh__fetch_model_add_costs(const dh__fetch_model_t *m, int32_t source, uint32_t n_samples,
                               double bytes, double *fetch_s, uint32_t n_servers)
{
    const source_t *s = source >= 0 && (size_t)source < m->n_sources ? &m->sources[source] : NULL;
    fit_t prior = prior_fit(&m->cfg);
    for (uint32_t i = 0; i < n_servers; i++) {
        dh__fetch_from_t from;
        const fit_t *f = choose(m, s, i, &prior, &from);
        fetch_s[i] += n_samples * f->latency_s + bytes * f->s_per_B;
    }
}
