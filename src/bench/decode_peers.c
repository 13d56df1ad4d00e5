/* decode_peers.c: decode-bench's Python sides (see decode_peers.h). A peer column holds a
 * number or a reason, never both and never neither: the check or a round that fails gives
 * the reason (the peer script's, e.g. "not installed: pip install -r
 * bench/decode/requirements.txt" or the import error's first line), and the clips/s of
 * such a peer is 0. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "bench/decode_peers.h"

static const char *const peer_names[DH_DECODE_BENCH_PEERS] = {"decord", "spdl", "torchcodec"};

double dh__decode_script_run(const char *python, const char *script, const char *plan_path,
                             const char *extra, char *err, size_t err_size)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' %s 2>&1", python ? python : "python3", script,
             plan_path, extra);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(err, err_size, "cannot run %.200s", script);
        return -1;
    }
    char out[8192] = "";
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    int status = pclose(p);
    /* The report is the last line that is a JSON object (warnings may come before it). */
    char *report = NULL;
    for (char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (*line == '{')
            report = line;
    json_error_t jerr;
    json_t *j = report ? json_loadb(report, strcspn(report, "\n"), 0, &jerr) : NULL;
    json_t *v = j ? json_object_get(j, "clips_per_s") : NULL;
    double cps = status == 0 && v && json_is_number(v) ? json_number_value(v) : -1;
    if (cps <= 0) {
        json_t *why = j ? json_object_get(j, "reason") : NULL;
        if (why && json_is_string(why))
            snprintf(err, err_size, "%s", json_string_value(why));
        else
            snprintf(err, err_size, "%s",
                     out[0] ? strtok(out, "\n") : "the script failed with no output");
    }
    json_decref(j);
    return cps;
}

void dh__decode_peers_init(const dh_decode_bench_config_t *cfg, dh_decode_bench_result_t *out)
{
    int have = cfg->peer_script && access(cfg->peer_script, R_OK) == 0;
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++) {
        dh_decode_bench_peer_t *peer = &out->peers[p];
        snprintf(peer->name, sizeof peer->name, "%s", peer_names[p]);
        peer->clips_per_s = 0;
        peer->mad_vs_pyav = -1;
        peer->reason[0] = '\0';
        if (!have)
            snprintf(peer->reason, sizeof peer->reason, "no peer script at %s",
                     cfg->peer_script ? cfg->peer_script : "(none)");
    }
}

/* Mean |a - b| over two files of RGB24 frames, or -1 with the reason when their sizes
 * differ or either cannot be read. */
static double file_mad(const char *a_path, const char *b_path, char *err, size_t err_size)
{
    FILE *a = fopen(a_path, "rb"), *b = fopen(b_path, "rb");
    double mad = -1;
    if (!a || !b) {
        snprintf(err, err_size, "cannot read %s", a ? b_path : a_path);
        goto out;
    }
    unsigned char x[1 << 16], y[1 << 16];
    unsigned long long sum = 0, total = 0;
    for (;;) {
        size_t n = fread(x, 1, sizeof x, a), m = fread(y, 1, sizeof y, b);
        if (n != m) {
            snprintf(err, err_size, "produced other frames than PyAV (bytes differ at %llu)",
                     total + (n < m ? n : m));
            goto out;
        }
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++)
            sum += (unsigned long long)abs((int)x[i] - (int)y[i]);
        total += n;
    }
    mad = total ? (double)sum / (double)total : 0.0;
out:
    if (a)
        fclose(a);
    if (b)
        fclose(b);
    return mad;
}

void dh__decode_peers_check(const dh_decode_bench_config_t *cfg, const char *check_plan,
                            const char *ref_path, dh_decode_bench_result_t *out)
{
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++) {
        dh_decode_bench_peer_t *peer = &out->peers[p];
        if (peer->reason[0])
            continue;
        char dump[1500], extra[1700];
        snprintf(dump, sizeof dump, "%s.check-%s.rgb", check_plan, peer->name);
        snprintf(extra, sizeof extra, "--peer %s --dump '%s'", peer->name, dump);
        if (dh__decode_script_run(cfg->python, cfg->peer_script, check_plan, extra, peer->reason,
                                  sizeof peer->reason) > 0) {
            peer->reason[0] = '\0';
            if (ref_path)
                peer->mad_vs_pyav = file_mad(dump, ref_path, peer->reason, sizeof peer->reason);
        }
        unlink(dump);
    }
}

void dh__decode_peers_round(const dh_decode_bench_config_t *cfg, const char *plan_path,
                            dh_decode_bench_result_t *out, double *samples, unsigned round,
                            unsigned runs)
{
    for (size_t p = 0; p < DH_DECODE_BENCH_PEERS; p++) {
        dh_decode_bench_peer_t *peer = &out->peers[p];
        if (peer->reason[0])
            continue;
        char extra[64];
        snprintf(extra, sizeof extra, "--peer %s", peer->name);
        double cps = dh__decode_script_run(cfg->python, cfg->peer_script, plan_path, extra,
                                           peer->reason, sizeof peer->reason);
        samples[p * runs + round] = cps > 0 ? cps : 0;
        if (cps > 0)
            peer->reason[0] = '\0';
    }
}
