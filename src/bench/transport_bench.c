/* transport_bench.c: see transport_bench.h. */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/cluster.h"
#include "datahelix/error.h"
#include "datahelix/runtime.h"
#include "datahelix/stats.h"
#include "datahelix/wire.h"
#include "bench/transport_bench.h"

#define SYNTH_NONE "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":1}"

/* A profile file of `count` samples of `bytes` output each, no CPU cost. */
static int write_profiles(const char *path, size_t count, uint64_t bytes)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return dh__set_error(-errno, "transport-bench: cannot write %s: %s", path, strerror(errno));
    for (size_t i = 0; i < count; i++)
        fprintf(f,
                "{\"id\":\"t%zu\",\"uri\":\"synthetic\",\"profile_key\":\"bench\",\"frames\":1,"
                "\"height\":1,\"width\":1,\"tokens_est\":1,\"cpu_s_est\":0,\"in_bytes\":0,"
                "\"out_bytes\":%llu}\n",
                i, (unsigned long long)bytes);
    if (fclose(f) != 0)
        return dh__set_error(-errno, "transport-bench: cannot write %s", path);
    return 0;
}

typedef struct stack {
    dh_cluster_t *cluster; /* its coordinator, the local DataServer, the sidecar */
} stack_t_;

static void stack_stop(stack_t_ *s)
{
    dh_cluster_destroy(&s->cluster);
}

/* keys_dir: CURVE on every tcp:// socket of the stack and the client (NULL: plaintext). */
static int stack_start(stack_t_ *s, bool with_remote, uint64_t arena_bytes, const char *keys_dir)
{
    memset(s, 0, sizeof *s);
    dh_cluster_server_t servers[2] = {
        /* delivery only when the sidecar executes */
        {.role = DH_DS_LOCAL,
         .node = "bench-node",
         .name = "bench-local",
         .workers = with_remote ? 0 : 1,
         .arena_bytes = arena_bytes},
        {.role = DH_DS_REMOTE,
         .node = "bench-sidecar",
         .name = "bench-remote",
         .workers = 2,
         .arena_bytes = arena_bytes},
    };
    dh_cluster_config_t cc;
    dh_cluster_config_default(&cc);
    cc.listen = "tcp://127.0.0.1:*";
    cc.policy = DH_POLICY_LEAST_REQUEST;
    cc.keys_dir = keys_dir;
    cc.pipeline_json = SYNTH_NONE;
    cc.servers = servers;
    cc.n_servers = with_remote ? 2 : 1;
    int rc = dh_cluster_new(&s->cluster, &cc);
    if (rc || (rc = dh_cluster_start(s->cluster)))
        stack_stop(s);
    return rc;
}

static int open_client(stack_t_ *s, const char *profiles, uint32_t prefetch, const char *keys_dir,
                       dh_client_t **c)
{
    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    cfg.keys_dir = keys_dir;
    cfg.coordinator = dh_cluster_endpoint(s->cluster);
    cfg.profiles = profiles;
    cfg.node = "bench-node";
    cfg.batch = 1;
    cfg.prefetch = prefetch;
    cfg.shuffle = 0;
    cfg.next_timeout_ms = 60000;
    cfg.connect_timeout_ms = 10000;
    return dh_client_new(c, &cfg);
}

static int local_point(uint64_t bytes, size_t batches, const char *dir,
                       dh_transport_local_point_t *pt)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/transport-local.jsonl", dir);
    int rc = write_profiles(path, batches + 1, bytes);
    if (rc)
        return rc;
    stack_t_ s;
    /* room for two batches: the one next() holds and the one being made */
    uint64_t arena = 2 * bytes + ((uint64_t)16 << 20);
    if ((rc = stack_start(&s, false, arena, NULL)))
        return rc;
    dh_client_t *c = NULL;
    dh_stats_t *st = NULL;
    if ((rc = open_client(&s, path, 1, NULL, &c)) || (rc = dh_stats_new(&st)))
        goto done;
    for (size_t i = 0; i < batches + 1; i++) {
        dh_client_batch_t *b = NULL;
        if ((rc = dh_client_next(c, &b)))
            goto done;
        uint64_t now = dh_clock_now_ns();
        if (i > 0) /* the first includes connection set-up */
            dh_stats_add(st, dh_clock_elapsed_s(b->ready_ns, now) * 1e6);
        dh_client_batch_release(&b);
    }
    pt->bytes = bytes;
    pt->batches = batches;
    pt->overhead_p50_us = dh_stats_percentile(st, 50);
    pt->overhead_p99_us = dh_stats_percentile(st, 99);
done:
    dh_stats_destroy(&st);
    dh_client_destroy(&c);
    stack_stop(&s);
    unlink(path);
    return rc;
}

static double remote_run(uint64_t bytes, size_t batches, const char *dir, const char *keys_dir,
                         int *rc_out)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/transport-remote.jsonl", dir);
    int rc = write_profiles(path, batches + 2, bytes);
    double gbps = 0;
    stack_t_ s;
    if (rc || (rc = stack_start(&s, true, 6 * bytes + ((uint64_t)16 << 20), keys_dir))) {
        *rc_out = rc;
        return 0;
    }
    dh_client_t *c = NULL;
    if ((rc = open_client(&s, path, 4, keys_dir, &c)))
        goto done;
    dh_client_batch_t *b = NULL;
    /* the first two batches warm up the connections and the arena's pages */
    for (int i = 0; i < 2 && rc == 0; i++) {
        rc = dh_client_next(c, &b);
        dh_client_batch_release(&b);
    }
    uint64_t t0 = dh_clock_now_ns();
    for (size_t i = 0; i < batches && rc == 0; i++) {
        rc = dh_client_next(c, &b);
        if (rc == 0 && (b->n_tensors < 2 || strcmp(b->server, "bench-remote") != 0))
            rc = dh__set_error(DH_EINVAL,
                               "transport-bench: batch %zu did not come from the "
                               "sidecar ('%s')",
                               i, b->server);
        dh_client_batch_release(&b);
    }
    double secs = dh_clock_elapsed_s(t0, dh_clock_now_ns());
    if (rc == 0 && secs > 0)
        gbps = (double)bytes * (double)batches * 8 / secs / 1e9;
done:
    dh_client_destroy(&c);
    stack_stop(&s);
    unlink(path);
    *rc_out = rc;
    return gbps;
}

typedef struct raw_rx {
    int fd;
    uint64_t total;
    int rc;
} raw_rx_t;

static void *raw_receiver(void *arg)
{
    raw_rx_t *rx = arg;
    size_t cap = (size_t)1 << 20;
    char *buf = malloc(cap);
    uint64_t got = 0;
    while (buf && got < rx->total) {
        ssize_t n = recv(rx->fd, buf, cap, 0);
        if (n <= 0) {
            rx->rc = -1;
            break;
        }
        got += (uint64_t)n;
    }
    free(buf);
    return NULL;
}

/* A plain TCP stream of batches x bytes over 127.0.0.1 from one thread to another. */
static double raw_tcp_run(uint64_t bytes, size_t batches, int *rc_out)
{
    *rc_out = 0;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &len) != 0) {
        *rc_out = dh__set_error(-errno, "transport-bench: raw TCP listen: %s", strerror(errno));
        if (ls >= 0)
            close(ls);
        return 0;
    }
    int tx = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (tx < 0 || connect(tx, (struct sockaddr *)&a, sizeof a) != 0) {
        *rc_out = dh__set_error(-errno, "transport-bench: raw TCP connect: %s", strerror(errno));
        close(ls);
        if (tx >= 0)
            close(tx);
        return 0;
    }
    int rxfd = accept(ls, NULL, NULL);
    close(ls);
    char *buf = malloc(bytes);
    if (!buf || rxfd < 0) {
        free(buf);
        close(tx);
        if (rxfd >= 0)
            close(rxfd);
        *rc_out = dh__set_error(DH_ENOMEM, "transport-bench: raw TCP set-up failed");
        return 0;
    }
    memset(buf, 0x5a, bytes);
    raw_rx_t rx = {rxfd, bytes * batches, 0};
    pthread_t th;
    uint64_t t0 = dh_clock_now_ns();
    pthread_create(&th, NULL, raw_receiver, &rx);
    for (size_t i = 0; i < batches; i++) {
        size_t sent = 0;
        while (sent < bytes) {
            ssize_t n = send(tx, buf + sent, bytes - sent, MSG_NOSIGNAL);
            if (n <= 0)
                break;
            sent += (size_t)n;
        }
    }
    pthread_join(th, NULL);
    double secs = dh_clock_elapsed_s(t0, dh_clock_now_ns());
    close(tx);
    close(rxfd);
    free(buf);
    return rx.rc == 0 && secs > 0 ? (double)bytes * (double)batches * 8 / secs / 1e9 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int dh_transport_bench(const dh_transport_options_t *opt, dh_transport_report_t *out)
{
    memset(out, 0, sizeof *out);
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    char line[256];
    for (size_t i = 0; i < opt->n_sizes && i < 16; i++) {
        dh_transport_local_point_t *pt = &out->local[out->n_local];
        int rc = local_point(opt->sizes[i], opt->batches, dir, pt);
        if (rc)
            return rc;
        out->n_local++;
        snprintf(line, sizeof line,
                 "local %8.1f MB: overhead p50 %7.1f us, p99 %7.1f us (%zu batches)",
                 (double)pt->bytes / 1e6, pt->overhead_p50_us, pt->overhead_p99_us, pt->batches);
        if (opt->progress)
            opt->progress(line, opt->ctx);
    }
    int runs = opt->runs > 0 ? opt->runs : 3;
    double remote[32], raw[32], ratio[32], curve[32], curve_ratio[32];
    if (runs > 32)
        runs = 32;
    char keys[1100] = "", key_prefix[1200];
    if (opt->curve) { /* a key directory of this run: the server key, which every peer uses */
        snprintf(keys, sizeof keys, "%s/datahelix-transport-keys-XXXXXX", dir);
        if (!mkdtemp(keys))
            return dh__set_error(-errno, "transport-bench: mkdtemp %s: %s", keys, strerror(errno));
        snprintf(key_prefix, sizeof key_prefix, "%s/server", keys);
        int rc = dh_wire_keygen(key_prefix, NULL);
        if (rc) {
            rmdir(keys);
            return rc;
        }
    }
    int rc = 0;
    for (int r = 0; r < runs && rc == 0; r++) {
        remote[r] = remote_run(opt->remote_bytes, opt->remote_batches, dir, NULL, &rc);
        if (rc)
            break;
        raw[r] = raw_tcp_run(opt->remote_bytes, opt->remote_batches, &rc);
        if (rc)
            break;
        ratio[r] = raw[r] > 0 ? remote[r] / raw[r] : 0;
        curve[r] = curve_ratio[r] = 0;
        if (opt->curve) {
            curve[r] = remote_run(opt->remote_bytes, opt->remote_batches, dir, keys, &rc);
            if (rc)
                break;
            curve_ratio[r] = remote[r] > 0 ? curve[r] / remote[r] : 0;
            snprintf(line, sizeof line,
                     "remote run %d: DataHelix %.2f Gb/s, with CURVE %.2f Gb/s (%.2fx), raw TCP "
                     "%.2f Gb/s, ratio %.2f",
                     r + 1, remote[r], curve[r], curve_ratio[r], raw[r], ratio[r]);
        } else {
            snprintf(line, sizeof line,
                     "remote run %d: DataHelix %.2f Gb/s, raw TCP %.2f Gb/s, ratio %.2f", r + 1,
                     remote[r], raw[r], ratio[r]);
        }
        if (opt->progress)
            opt->progress(line, opt->ctx);
    }
    if (opt->curve) {
        for (const char *ext = ".secret"; ext; ext = ext[1] == 's' ? ".pub" : NULL) {
            char path[1300];
            snprintf(path, sizeof path, "%s%s", key_prefix, ext);
            unlink(path);
        }
        rmdir(keys);
    }
    if (rc)
        return rc;
    qsort(remote, (size_t)runs, sizeof *remote, cmp_double);
    qsort(raw, (size_t)runs, sizeof *raw, cmp_double);
    qsort(ratio, (size_t)runs, sizeof *ratio, cmp_double);
    qsort(curve, (size_t)runs, sizeof *curve, cmp_double);
    qsort(curve_ratio, (size_t)runs, sizeof *curve_ratio, cmp_double);
    out->remote_gbps = remote[runs / 2];
    out->raw_tcp_gbps = raw[runs / 2];
    out->remote_ratio = ratio[runs / 2];
    out->remote_bytes = opt->remote_bytes;
    out->curve_gbps = curve[runs / 2];
    out->curve_ratio = curve_ratio[runs / 2];
    return 0;
}
