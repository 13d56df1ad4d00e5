/* calibrate.c: the per-machine CPU cost model of `probe` (see calibrate.h).
 *
 * Fitting: weighted least squares with weights 1/measured^2, so the fit minimises relative
 * error (what the probe is judged on) rather than letting the slowest clips dominate.
 * Non-negativity: each of the 15 non-empty subsets of the four features is solved
 * (normal equations, at most 4x4), and the subset with the smallest residual among those
 * whose coefficients are all >= 0 wins. O(15 x n) plus constant-size solves.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "datahelix/alloc.h"
#include "datahelix/calibrate.h"
#include "datahelix/error.h"
#include "core/internal.h"

void dh_calibration_bucket_key(const dh_media_info_t *info, char *key, size_t size)
{
    static const int classes[] = {240, 360, 480, 720, 1080, 2160};
    int short_side = info->height < info->width ? info->height : info->width;
    int cls = classes[DH_ARRAY_LEN(classes) - 1];
    /* The nearest class (so 400p is 360p, 448p is 480p). */
    for (size_t i = 0; i + 1 < DH_ARRAY_LEN(classes); i++)
        if (short_side < (classes[i] + classes[i + 1]) / 2) {
            cls = classes[i];
            break;
        }
    snprintf(key, size, "%s-%dp", info->codec[0] ? info->codec : "unknown", cls);
}

static const dh_calibration_bucket_t *find_bucket(const dh_calibration_t *cal, const char *key)
{
    for (size_t i = 0; i < cal->n_buckets; i++)
        if (strcmp(cal->buckets[i].key, key) == 0)
            return &cal->buckets[i];
    return NULL;
}

int dh_calibration_has_bucket(const dh_calibration_t *cal, const char *bucket)
{
    return find_bucket(cal, bucket) != NULL;
}

static double model(const dh_calibration_t *cal, const dh_decode_features_t *f)
{
    return cal->fixed_s + cal->s_per_decoded_px * f->decoded_px +
           cal->s_per_output_px * f->output_px + cal->s_per_byte * f->decoded_bytes;
}

double dh_calibration_predict(const dh_calibration_t *cal, const char *bucket,
                              const dh_decode_features_t *features)
{
    const dh_calibration_bucket_t *b = bucket ? find_bucket(cal, bucket) : NULL;
    return model(cal, features) * (b ? b->ratio : 1.0);
}

/* Solves the k x k system a x = b in place (Gaussian elimination with partial pivoting).
 * Returns 0, or -1 when singular. */
static int solve(double a[4][4], double b[4], int k, double x[4])
{
    for (int col = 0; col < k; col++) {
        int pivot = col;
        for (int r = col + 1; r < k; r++)
            if (fabs(a[r][col]) > fabs(a[pivot][col]))
                pivot = r;
        if (fabs(a[pivot][col]) < 1e-300)
            return -1;
        for (int c = 0; c < k; c++) {
            double t = a[col][c];
            a[col][c] = a[pivot][c];
            a[pivot][c] = t;
        }
        double t = b[col];
        b[col] = b[pivot];
        b[pivot] = t;
        for (int r = col + 1; r < k; r++) {
            double m = a[r][col] / a[col][col];
            for (int c = col; c < k; c++)
                a[r][c] -= m * a[col][c];
            b[r] -= m * b[col];
        }
    }
    for (int r = k - 1; r >= 0; r--) {
        double s = b[r];
        for (int c = r + 1; c < k; c++)
            s -= a[r][c] * x[c];
        x[r] = s / a[r][r];
    }
    return 0;
}

static double feature(const dh_decode_features_t *f, int which)
{
    return which == 0   ? 1.0
           : which == 1 ? f->decoded_px
           : which == 2 ? f->output_px
                        : f->decoded_bytes;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sets the ratio of every bucket among the n samples (new ones appended; with
 * keep_existing, buckets already in cal are left alone). */
static int set_ratios(const dh_decode_features_t *features, const char *const *buckets,
                      const double *measured_s, size_t n, dh_calibration_t *cal, int keep_existing)
{
    double *ratios = dh_calloc(n, sizeof *ratios);
    if (!ratios)
        return DH_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int seen = 0; /* handled with an earlier sample of the same bucket */
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(buckets[j], buckets[i]) == 0;
        if (seen || (keep_existing && find_bucket(cal, buckets[i])))
            continue;
        size_t m = 0;
        for (size_t j = i; j < n; j++)
            if (strcmp(buckets[j], buckets[i]) == 0) {
                double predicted = model(cal, &features[j]);
                ratios[m++] = predicted > 0 ? measured_s[j] / predicted : 1.0;
            }
        qsort(ratios, m, sizeof *ratios, cmp_double);
        double median = m % 2 ? ratios[m / 2] : 0.5 * (ratios[m / 2 - 1] + ratios[m / 2]);
        dh_calibration_bucket_t *b = (dh_calibration_bucket_t *)find_bucket(cal, buckets[i]);
        if (!b) {
            if (cal->n_buckets == DH_CALIBRATION_MAX_BUCKETS) {
                rc = dh__set_error(DH_ERANGE, "calibration: more than %d resolution buckets",
                                   DH_CALIBRATION_MAX_BUCKETS);
                break;
            }
            b = &cal->buckets[cal->n_buckets++];
            snprintf(b->key, sizeof b->key, "%s", buckets[i]);
        }
        b->ratio = median;
        b->samples = (unsigned)m;
    }
    dh_free(ratios);
    return rc;
}

static int check_samples(const double *measured_s, size_t n)
{
    if (n == 0)
        return dh__set_error(DH_EINVAL, "calibration: no timed samples");
    for (size_t i = 0; i < n; i++)
        if (!(measured_s[i] > 0) || !isfinite(measured_s[i]))
            return dh__set_error(DH_EINVAL, "calibration: sample %zu has a bad time %g s", i,
                                 measured_s[i]);
    return 0;
}

int dh_calibration_fit(const dh_decode_features_t *features, const char *const *buckets,
                       const double *measured_s, size_t n, dh_calibration_t *cal)
{
    int rc = check_samples(measured_s, n);
    if (rc)
        return rc;
    double best_err = INFINITY, best[4] = {0, 0, 0, 0};
    for (int subset = 1; subset < 16; subset++) {
        int cols[4], k = 0;
        for (int f = 0; f < 4; f++)
            if (subset & (1 << f))
                cols[k++] = f;
        double a[4][4] = {{0}}, b[4] = {0}, x[4] = {0};
        for (size_t i = 0; i < n; i++) {
            double w = 1.0 / (measured_s[i] * measured_s[i]);
            for (int r = 0; r < k; r++) {
                double fr = feature(&features[i], cols[r]);
                b[r] += w * fr * measured_s[i];
                for (int c = 0; c < k; c++)
                    a[r][c] += w * fr * feature(&features[i], cols[c]);
            }
        }
        if (solve(a, b, k, x) != 0)
            continue;
        double coef[4] = {0, 0, 0, 0};
        int ok = 1;
        for (int r = 0; r < k; r++) {
            ok &= x[r] >= 0 && isfinite(x[r]);
            coef[cols[r]] = x[r];
        }
        if (!ok)
            continue;
        double err = 0;
        for (size_t i = 0; i < n; i++) {
            double p = coef[0] + coef[1] * features[i].decoded_px +
                       coef[2] * features[i].output_px + coef[3] * features[i].decoded_bytes;
            double rel = (p - measured_s[i]) / measured_s[i];
            err += rel * rel;
        }
        if (err < best_err) {
            best_err = err;
            memcpy(best, coef, sizeof best);
        }
    }
    if (!isfinite(best_err)) /* every subset singular: fall back to a constant */
        for (size_t i = 0; i < n; i++)
            best[0] += measured_s[i] / (double)n;
    cal->fixed_s = best[0];
    cal->s_per_decoded_px = best[1];
    cal->s_per_output_px = best[2];
    cal->s_per_byte = best[3];
    /* The coefficients changed: every bucket timed now gets a fresh ratio. */
    return set_ratios(features, buckets, measured_s, n, cal, 0);
}

int dh_calibration_add_buckets(const dh_decode_features_t *features, const char *const *buckets,
                               const double *measured_s, size_t n, dh_calibration_t *cal)
{
    int rc = check_samples(measured_s, n);
    return rc ? rc : set_ratios(features, buckets, measured_s, n, cal, 1);
}

/* ---- the cache file --------------------------------------------------------------- */

void dh_calibration_default_path(char *buf, size_t size)
{
    const char *explicit_path = getenv("DH_CALIBRATION_CACHE");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (explicit_path && *explicit_path)
        snprintf(buf, size, "%s", explicit_path);
    else if (xdg && *xdg)
        snprintf(buf, size, "%s/datahelix/calibration.json", xdg);
    else
        snprintf(buf, size, "%s/.cache/datahelix/calibration.json", home && *home ? home : "/tmp");
}

/* The whole cache file as a JSON object (a new empty one if there is no file). */
static int read_cache(const char *path, json_t **out)
{
    dh__json_use_allocator();
    json_error_t jerr;
    *out = NULL;
    if (access(path, F_OK) != 0) {
        *out = json_object();
        return *out ? 0 : DH_ENOMEM;
    }
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return dh__set_error(DH_EPARSE, "%s:%d: not a calibration cache: %s", path, jerr.line,
                             root ? "not an object" : jerr.text);
    }
    *out = root;
    return 0;
}

int dh_calibration_load(const char *path, const char *machine_key, dh_calibration_t *cal)
{
    json_t *root;
    int rc = read_cache(path, &root);
    if (rc)
        return rc;
    json_t *e = json_object_get(json_object_get(root, "entries"), machine_key);
    if (!e) {
        json_decref(root);
        return DH_ENOENT;
    }
    memset(cal, 0, sizeof *cal);
    json_t *buckets = json_object_get(e, "buckets");
    if (!json_is_number(json_object_get(e, "fixed_s")) ||
        !json_is_number(json_object_get(e, "s_per_decoded_px")) ||
        !json_is_number(json_object_get(e, "s_per_output_px")) || !json_is_object(buckets)) {
        json_decref(root);
        return dh__set_error(DH_EPARSE, "%s: entry '%s' lacks a coefficient or its buckets", path,
                             machine_key);
    }
    cal->fixed_s = json_number_value(json_object_get(e, "fixed_s"));
    cal->s_per_decoded_px = json_number_value(json_object_get(e, "s_per_decoded_px"));
    cal->s_per_output_px = json_number_value(json_object_get(e, "s_per_output_px"));
    cal->s_per_byte = json_number_value(json_object_get(e, "s_per_byte")); /* 0 if absent */
    const char *key;
    json_t *b;
    json_object_foreach(buckets, key, b)
    {
        if (cal->n_buckets == DH_CALIBRATION_MAX_BUCKETS)
            break;
        dh_calibration_bucket_t *cb = &cal->buckets[cal->n_buckets];
        json_t *ratio = json_object_get(b, "ratio");
        if (!json_is_number(ratio) || !(json_number_value(ratio) > 0))
            continue;
        snprintf(cb->key, sizeof cb->key, "%s", key);
        cb->ratio = json_number_value(ratio);
        cb->samples = (unsigned)json_integer_value(json_object_get(b, "samples"));
        cal->n_buckets++;
    }
    json_decref(root);
    return 0;
}

int dh_calibration_save(const char *path, const char *machine_key, const dh_calibration_t *cal)
{
    json_t *root = NULL;
    int rc = dh__make_parent_dirs(path);
    if (rc == 0 && read_cache(path, &root) != 0) {
        root = json_object(); /* an unreadable cache is replaced, not fatal */
        if (!root)
            rc = DH_ENOMEM;
    }
    if (rc)
        return rc;
    json_t *entries = json_object_get(root, "entries");
    if (!json_is_object(entries)) {
        entries = json_object();
        json_object_set_new(root, "entries", entries);
    }
    json_t *buckets = json_object();
    for (size_t i = 0; i < cal->n_buckets; i++)
        json_object_set_new(buckets, cal->buckets[i].key,
                            json_pack("{s:f,s:i}", "ratio", cal->buckets[i].ratio, "samples",
                                      (int)cal->buckets[i].samples));
    json_t *e = json_pack("{s:f,s:f,s:f,s:f,s:o}", "fixed_s", cal->fixed_s, "s_per_decoded_px",
                          cal->s_per_decoded_px, "s_per_output_px", cal->s_per_output_px,
                          "s_per_byte", cal->s_per_byte, "buckets", buckets);
    json_object_set_new(root, "version", json_integer(1));
    if (!e || json_object_set_new(entries, machine_key, e) != 0) {
        json_decref(root);
        return dh__set_error(DH_ENOMEM, "%s: out of memory", path);
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (json_dump_file(root, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || rename(tmp, path) != 0) {
        int err = errno ? errno : EIO;
        unlink(tmp);
        json_decref(root);
        return dh__set_error(-err, "%s: cannot write the calibration cache: %s", path,
                             strerror(err));
    }
    json_decref(root);
    return 0;
}
