/* rebalance_bench.c: see rebalance_bench.h. The run of rebalance-bench, its options and its
 * report: it checks the options, sets up the on-node part's arena and book, forks the ranks
 * (rebalance_rank.c) before any ZeroMQ context or thread exists in this process, serves
 * them as the coordinator (rebalance_coord.c, rebalance_rounds.c), then runs the cross part
 * (rebalance_cross.c) on the same clips. Nothing waits on a fixed sleep: every wait is a
 * receive with a deadline that also notices a dead rank or receiver.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/shm.h"
#include "datahelix/stats.h"
#include "bench/rebalance_bench_internal.h"

#define MAX_ARENA_BYTES ((uint64_t)8 << 30)

void dh_rebalance_bench_options_default(dh_rebalance_bench_options_t *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->clips = 64;
    opt->ranks = 8;
    opt->frames = 16;
    opt->height = 224;
    opt->width = 224;
    opt->rounds = 20;
    opt->move_fraction = 1.0;
    opt->seed = 1;
}

int dh_rebalance_bench_check(const dh_rebalance_bench_options_t *o)
{
    if (o->clips < 1 || o->clips > DH_REBALANCE_BENCH_MAX_CLIPS)
        return dh__set_error(DH_EINVAL, "--clips must be 1..%d, got %" PRIu32,
                             DH_REBALANCE_BENCH_MAX_CLIPS, o->clips);
    if (o->ranks < 2 || o->ranks > DH_REBALANCE_BENCH_MAX_RANKS)
        return dh__set_error(DH_EINVAL, "--ranks must be 2..%d, got %" PRIu32,
                             DH_REBALANCE_BENCH_MAX_RANKS, o->ranks);
    if (o->frames < 1 || o->frames > 4096)
        return dh__set_error(DH_EINVAL, "--frames must be 1..4096, got %" PRIu32, o->frames);
    if (o->height < 1 || o->height > 8192)
        return dh__set_error(DH_EINVAL, "--height must be 1..8192, got %" PRIu32, o->height);
    if (o->width < 1 || o->width > 8192)
        return dh__set_error(DH_EINVAL, "--width must be 1..8192, got %" PRIu32, o->width);
    if (o->rounds < 1 || o->rounds > 10000)
        return dh__set_error(DH_EINVAL, "--rounds must be 1..10000, got %" PRIu32, o->rounds);
    if (!(o->move_fraction >= 0 && o->move_fraction <= 1))
        return dh__set_error(DH_EINVAL, "--move-fraction must be in [0, 1], got %g",
                             o->move_fraction);
    uint64_t clip = dh__rebalance_clip_bytes(o);
    if (clip < 64)
        return dh__set_error(DH_EINVAL,
                             "--frames x --height x --width x 3 is %" PRIu64
                             " bytes; a clip needs at least 64 (its stamps)",
                             clip);
    if (clip > ((uint64_t)1 << 30))
        return dh__set_error(
            DH_EINVAL,
            "--frames x --height x --width x 3 is %" PRIu64 " bytes; at most 1 GiB per clip", clip);
    if (dh__rebalance_arena_bytes(o) > MAX_ARENA_BYTES)
        return dh__set_error(DH_EINVAL,
                             "--clips %" PRIu32 " of %" PRIu64
                             " bytes need an arena of %.1f GB; at most %.1f GB",
                             o->clips, clip, (double)dh__rebalance_arena_bytes(o) / 1e9,
                             (double)MAX_ARENA_BYTES / 1e9);
    return 0;
}

int dh_rebalance_bench_run(const dh_rebalance_bench_options_t *opt,
                           dh_rebalance_bench_report_t *out)
{
    memset(out, 0, sizeof *out);
    int rc = dh_rebalance_bench_check(opt);
    if (rc)
        return rc;
    out->clips = opt->clips;
    out->ranks = opt->ranks;
    out->rounds = opt->rounds;
    out->clip_bytes = dh__rebalance_clip_bytes(opt);
    out->move_fraction = opt->move_fraction;
    out->seed = opt->seed;
    onnode_t o;
    memset(&o, 0, sizeof o);
    o.opt = opt;
    o.out = out;
    o.clip_bytes = (size_t)out->clip_bytes;
    for (uint32_t r = 0; r < DH_REBALANCE_BENCH_MAX_RANKS; r++)
        o.setup_w[r] = -1;
    const uint32_t n = opt->clips;
    o.book = dh_calloc(n, sizeof *o.book);
    o.order = dh_calloc(n, sizeof *o.order);
    o.scratch = dh_calloc(n, sizeof *o.scratch);
    o.tensors = dh_calloc(n, sizeof *o.tensors);
    o.gone = dh_calloc(n, sizeof *o.gone);
    o.gone_ids = dh_calloc(n, sizeof *o.gone_ids);
    double *ms = dh_calloc(opt->rounds, sizeof *ms);
    if (!o.book || !o.order || !o.scratch || !o.tensors || !o.gone || !o.gone_ids || !ms) {
        rc = dh__set_error(DH_ENOMEM, "rebalance-bench: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < n; i++)
        snprintf(o.gone_ids[i], sizeof o.gone_ids[i], "clip%" PRIu32, i);
    if ((rc = dh_shm_arena_new(&o.arena, dh__rebalance_arena_bytes(opt), 0))) {
        rc = dh__rebalance_with_context(rc, "on-node: arena of %.1f MB",
                                        (double)dh__rebalance_arena_bytes(opt) / 1e6);
        goto done;
    }
    if ((rc = dh__rebalance_start_ranks(&o)) || (rc = dh__rebalance_connect_ranks(&o)) ||
        (rc = dh__rebalance_place_clips(&o)))
        goto done;
    dh__rebalance_progress(opt,
                           "on-node: %" PRIu32 " ranks (processes) attached, %" PRIu32
                           " clips of %.1f MB in one arena; %" PRIu32 " rounds after a warm-up",
                           opt->ranks, n, (double)o.clip_bytes / 1e6, opt->rounds);
    uint32_t moved = 0;
    if ((rc = dh__rebalance_onnode_rounds(&o, ms, &moved)) ||
        (rc = dh__rebalance_release_ranks(&o)))
        goto done;
    for (uint32_t i = 0; i < n; i++)
        out->rank_clips[o.book[i].owner]++;
    out->onnode_moved = moved;
    out->onnode_p50_ms = dh_percentile_sorted_inplace(ms, opt->rounds, 50);
    out->onnode_p95_ms = dh_percentile_sorted_inplace(ms, opt->rounds, 95);
    dh__rebalance_progress(opt,
                           "on-node: %" PRIu32
                           " clips changed owner per round: p50 %.3f ms, p95 %.3f ms; "
                           "pixel copies %" PRIu64,
                           moved, out->onnode_p50_ms, out->onnode_p95_ms, out->onnode_pixel_copies);
    if (!opt->skip_cross)
        rc = dh__rebalance_cross_part(&o);
done:
    dh__rebalance_onnode_stop(&o);
    if (o.arena && o.coordinator_refs) {
        for (uint32_t i = 0; i < n; i++)
            dh_shm_arena_unref(o.arena, &o.book[i].handle);
        dh_shm_arena_collect(o.arena);
        dh_shm_arena_stats_t st;
        dh_shm_arena_stats(o.arena, &st);
        if (rc == 0 && st.allocations_live != 0)
            rc = dh__set_error(-EPROTO, "on-node: %" PRIu64 " clips still referenced at the end",
                               st.allocations_live);
    }
    dh_shm_arena_destroy(&o.arena);
    dh_free(ms);
    dh_free(o.gone_ids);
    dh_free(o.gone);
    dh_free(o.tensors);
    dh_free(o.scratch);
    dh_free(o.order);
    dh_free(o.book);
    return rc;
}

int dh_rebalance_bench_write_json(FILE *f, const dh_rebalance_bench_report_t *r)
{
    int n = fprintf(f,
                    "{\"clips\":%" PRIu32 ",\"clip_bytes\":%" PRIu64 ",\"ranks\":%" PRIu32
                    ",\"rounds\":%" PRIu32 ",\"move_fraction\":%.3f,\"seed\":%" PRIu64
                    ",\"onnode_p50_ms\":%.4f,\"onnode_p95_ms\":%.4f,\"onnode_moved\":%" PRIu32
                    ",\"onnode_pixel_copies\":%" PRIu64 ",\"onnode_handoffs_verified\":%" PRIu64
                    ",\"cross_gbps_p50\":%.4f,\"raw_tcp_gbps_p50\":%.4f,\"cross_vs_raw\":%.4f"
                    ",\"cross_p50_ms\":%.3f,\"raw_tcp_p50_ms\":%.3f}\n",
                    r->clips, r->clip_bytes, r->ranks, r->rounds, r->move_fraction, r->seed,
                    r->onnode_p50_ms, r->onnode_p95_ms, r->onnode_moved, r->onnode_pixel_copies,
                    r->onnode_handoffs_verified, r->cross_gbps_p50, r->raw_tcp_gbps_p50,
                    r->cross_vs_raw, r->cross_p50_ms, r->raw_tcp_p50_ms);
    return n < 0 ? -EIO : 0;
}
