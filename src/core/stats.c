/* stats.c: percentile statistics (see stats.h). */
#include <stdlib.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/stats.h"

struct dh_stats {
    double *values;
    size_t count, cap;
    double sum, max;
    int sorted;
};

int dh_stats_new(dh_stats_t **out)
{
    *out = dh_calloc(1, sizeof **out);
    return *out ? 0 : DH_ENOMEM;
}

void dh_stats_destroy(dh_stats_t **stats)
{
    if (!stats || !*stats)
        return;
    dh_free((*stats)->values);
    dh_free(*stats);
    *stats = NULL;
}

int dh_stats_add(dh_stats_t *stats, double value)
{
    if (stats->count == stats->cap) {
        size_t cap = stats->cap ? stats->cap * 2 : 64;
        double *v = dh_reallocarray(stats->values, cap, sizeof *v);
        if (!v)
            return DH_ENOMEM;
        stats->values = v;
        stats->cap = cap;
    }
    if (stats->count == 0 || value > stats->max)
        stats->max = value;
    stats->values[stats->count++] = value;
    stats->sum += value;
    stats->sorted = 0;
    return 0;
}

size_t dh_stats_count(const dh_stats_t *stats)
{
    return stats->count;
}

double dh_stats_mean(const dh_stats_t *stats)
{
    return stats->count ? stats->sum / (double)stats->count : 0.0;
}

double dh_stats_max(const dh_stats_t *stats)
{
    return stats->count ? stats->max : 0.0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile_of_sorted(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    if (p <= 0)
        return v[0];
    if (p >= 100)
        return v[n - 1];
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)rank;
    double frac = rank - (double)lo;
    if (lo + 1 >= n)
        return v[n - 1];
    return v[lo] + (v[lo + 1] - v[lo]) * frac;
}

double dh_stats_percentile(dh_stats_t *stats, double p)
{
    if (!stats->sorted && stats->count > 0) { /* qsort(NULL, 0) is undefined */
        qsort(stats->values, stats->count, sizeof(double), cmp_double);
        stats->sorted = 1;
    }
    return percentile_of_sorted(stats->values, stats->count, p);
}

double dh_percentile_sorted_inplace(double *values, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    qsort(values, n, sizeof(double), cmp_double);
    return percentile_of_sorted(values, n, p);
}
