/* decode_peers.h (internal to decode-bench): running a Python side over a plan and reading
 * its report, and the peer columns (decord, SPDL, torchcodec, by
 * bench/decode/peer_decode.py): their pixel check against PyAV's frames and their timed
 * rounds. */
#ifndef DH_BENCH_DECODE_PEERS_H
#define DH_BENCH_DECODE_PEERS_H

#include <stddef.h>

#include "bench/decode_bench.h"

/* Runs `python script plan_path extra` (extra may be ""); returns the clips/s it reports,
 * or -1 with the reason in err: the report's "reason", else its output's first line. */
double dh__decode_script_run(const char *python, const char *script, const char *plan_path,
                             const char *extra, char *err, size_t err_size);

/* Names the peer columns in out->peers (clips/s 0, MAD -1, no reason), or, when there is no
 * peer script, gives each the reason. */
void dh__decode_peers_init(const dh_decode_bench_config_t *cfg, dh_decode_bench_result_t *out);

/* The peers' pixel check (untimed): each peer without a reason produces the frames of
 * check_plan; its MAD against ref_path (PyAV's frames of that plan, plan order; NULL: no
 * reference, the MAD stays -1). A peer that fails gets the reason. */
void dh__decode_peers_check(const dh_decode_bench_config_t *cfg, const char *check_plan,
                            const char *ref_path, dh_decode_bench_result_t *out);

/* One timed round of each peer without a reason: samples[p * runs + round] = clips/s. A
 * peer that fails gets the reason and is left out of later rounds. */
void dh__decode_peers_round(const dh_decode_bench_config_t *cfg, const char *plan_path,
                            dh_decode_bench_result_t *out, double *samples, unsigned round,
                            unsigned runs);

#endif
