/* test_dataserver.c: the local DataServer's reclaim of dead clients' slabs (dataserver_loop.c:
 * the loop calls dh_shm_arena_reclaim_dead every 200 ms; docs/runtime.md "Failures"), seen
 * from a client that stays alive. The coordinator and the DataServer are processes (the
 * `datahelix` CLI), so the DataServer's pid is neither client's: the rank that dies is a
 * `datahelix consume` process, killed with SIGKILL while it holds batches; the rank that
 * lives is a client in this process, holding its first batch. The test reads the holders
 * and counts from the arena's records through the live client's own mapping
 * (shm/shm_internal.h) and waits on them, never on a fixed sleep. Also: a server whose
 * arena cannot be had (more than the machine's memory, or over RLIMIT_FSIZE) or whose
 * --shm-allow-uid is malformed exits 1 at start with a message that says why. */
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "datahelix/client.h"
#include "datahelix/error.h"
#include "datahelix/shm.h"
#include "remote/remote_lib.h"
#include "runtime/dataserver_internal.h"
#include "shm/shm_internal.h"

#define SEED 11
#define T_MS 30000

/* The arena's records through a mapping (the header at its start). */
typedef struct arena_view {
    const uint8_t *base;
    const dh__shm_header_t *header;
    dh__shm_record_t *records;
} arena_view_t;

static arena_view_t view_of(const dh_client_batch_t *b)
{
    const void *base = NULL;
    size_t size = 0;
    assert_int_equal(dh_client_tensor_arena(b, 0, &base, &size), 1); /* fanout 1: zero-copy */
    arena_view_t v = {base, base, NULL};
    assert_true(v.header->magic == DH__SHM_MAGIC);
    v.records = (dh__shm_record_t *)(v.base + v.header->records_offset);
    return v;
}

/* Live allocations (count > 0) whose holder is `pid`. */
static int held_by(const arena_view_t *v, pid_t pid)
{
    int n = 0;
    for (uint64_t i = 0; i < v->header->slab_count; i++) {
        dh__shm_record_t *r = &v->records[i];
        if (atomic_load(&r->state) == DH__SHM_LIVE &&
            DH__SHM_REFWORD_COUNT(atomic_load(&r->refword)) > 0 &&
            atomic_load(&r->holder_pid) == (int32_t)pid)
            n++;
    }
    return n;
}

/* The record of the allocation a tensor's data starts. */
static dh__shm_record_t *record_of(const arena_view_t *v, const dh_tensor_t *t)
{
    uint64_t offset = (uint64_t)((const uint8_t *)t->data - v->base);
    assert_true(offset >= v->header->data_offset);
    uint64_t slab = (offset - v->header->data_offset) / v->header->slab_size;
    assert_true(slab < v->header->slab_count);
    return &v->records[slab];
}

/* Waits until `pid` holds (want_some) or no longer holds (!want_some) an allocation. */
static void wait_held(const arena_view_t *v, pid_t pid, bool want_some, int timeout_ms)
{
    uint64_t start = dh_clock_now_ns();
    while ((held_by(v, pid) > 0) != want_some) {
        if (dh_clock_elapsed_s(start, dh_clock_now_ns()) * 1000 > timeout_ms)
            fail_msg("pid %d still %s an allocation after %d ms (it holds %d)", (int)pid,
                     want_some ? "does not hold" : "holds", timeout_ms, held_by(v, pid));
        cl_nap_ms(5);
    }
}

/* Each synthetic sample's bytes start with its id. */
static void check_synthetic(const dh_client_batch_t *b)
{
    const dh_tensor_t *sizes = NULL, *payload = NULL;
    for (size_t i = 0; i < b->n_tensors; i++) {
        if (strcmp(b->tensors[i].name, "sizes") == 0)
            sizes = &b->tensors[i];
        if (strcmp(b->tensors[i].name, "payload") == 0)
            payload = &b->tensors[i];
    }
    assert_non_null(sizes);
    assert_non_null(payload);
    const int64_t *sz = sizes->data;
    size_t at = 0;
    for (size_t i = 0; i < b->n_samples; i++) {
        size_t n = strlen(b->samples[i].id);
        assert_true((size_t)sz[i] >= n && at + (size_t)sz[i] <= payload->nbytes);
        assert_memory_equal((const char *)payload->data + at, b->samples[i].id, n);
        at += (size_t)sz[i];
    }
    assert_int_equal(at, payload->nbytes);
}

/* Two ranks of one node share its DataServer. Rank 1 (a process) is killed while it holds
 * batches; rank 0 (this process) holds its first batch all along. Once the DataServer has
 * reclaimed the dead rank's allocations, rank 0's batch is still held (same allocation,
 * count, holder) with its bytes, and rank 0 finishes its epoch, the dead rank's slabs
 * serving its later batches, its first batch's bytes unchanged at the end. A reclaim that
 * freed live holders' slabs (issue 17) fails here, where the cluster test, which looks for
 * the reclaim's log line, passed. */
static void dataserver_reclaims_dead_client_not_live_one(void **state)
{
    const char *profiles = cl_write_profiles("p.jsonl", 48); /* 12 steps of 2 ranks x 2 */
    char coord_ep[600], pipeline[512], ledger[512];
    snprintf(coord_ep, sizeof coord_ep, "ipc://%s", dh_test_path("coord.ipc"));
    snprintf(pipeline, sizeof pipeline, "%s", dh_test_path("synthetic.json"));
    snprintf(ledger, sizeof ledger, "%s", dh_test_path("rank-1.jsonl"));
    dh_test_write_file(pipeline,
                       "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":0.002}");
    cl_proc_t coord, server, doomed;
    char *cargv[] = {"datahelix",       "coordinator", "--listen", coord_ep,
                     "--dead-after-ms", "10000",       NULL};
    cl_spawn(&coord, "coordinator", cargv);
    cl_wait_log(coord.log, "coordinator: listening on", 1, T_MS);
    char *sargv[] = {
        "datahelix",  "server", "--coordinator",  coord_ep,    "--role", "local",      "--node",
        "test-node",  "--name", "local",          "--workers", "1",      "--pipeline", pipeline,
        "--arena-mb", "32",     "--heartbeat-ms", "50",        NULL};
    cl_spawn(&server, "server", sargv);
    cl_wait_log(coord.log, "DataServer 'local' registered", 1, T_MS);

    /* rank 0: this process; it keeps batch 0 */
    dh_client_config_t cfg;
    dh_client_config_default(&cfg);
    cfg.coordinator = coord_ep;
    cfg.profiles = profiles;
    cfg.ranks = 2;
    cfg.rank = 0;
    cfg.batch = 2;
    cfg.seed = SEED;
    cfg.node = "test-node";
    cfg.next_timeout_ms = T_MS;
    cfg.connect_timeout_ms = T_MS;
    dh_client_t *c = NULL;
    int rc = dh_client_new(&c, &cfg);
    if (rc)
        print_error("dh_client_new: %s\n", dh_last_error());
    assert_int_equal(rc, 0);
    dh_client_batch_t *first = NULL;
    assert_int_equal(dh_client_next(c, &first), 0);
    check_synthetic(first);
    arena_view_t v = view_of(first);
    /* its allocations: this pid holds them; remember each one's generation and bytes */
    size_t n_held = first->n_tensors;
    uint64_t generation[8];
    void *bytes[8];
    assert_true(n_held <= 8);
    for (size_t t = 0; t < n_held; t++) {
        dh__shm_record_t *r = record_of(&v, &first->tensors[t]);
        assert_int_equal(atomic_load(&r->holder_pid), (int32_t)getpid());
        assert_true(DH__SHM_REFWORD_COUNT(atomic_load(&r->refword)) > 0);
        generation[t] = atomic_load(&r->generation);
        bytes[t] = malloc(first->tensors[t].nbytes ? first->tensors[t].nbytes : 1);
        assert_non_null(bytes[t]);
        memcpy(bytes[t], first->tensors[t].data, first->tensors[t].nbytes);
    }

    /* rank 1: a process that takes a batch and computes "forever" with its prefetch held */
    char seed[16];
    snprintf(seed, sizeof seed, "%d", SEED);
    char *dargv[] = {"datahelix",
                     "consume",
                     "--coordinator",
                     coord_ep,
                     "--profiles",
                     (char *)profiles,
                     "--rank",
                     "1",
                     "--ranks",
                     "2",
                     "--batch",
                     "2",
                     "--seed",
                     seed,
                     "--node",
                     "test-node",
                     "--ledger",
                     ledger,
                     "--compute-ms",
                     "3600000",
                     NULL};
    cl_spawn(&doomed, "rank-1", dargv);
    wait_held(&v, doomed.pid, true, T_MS);
    assert_int_equal(cl_wait_exit(&doomed, 0), -1); /* still running */
    cl_signal(&doomed, SIGKILL);
    assert_int_equal(cl_wait_exit(&doomed, 5000), 128 + SIGKILL); /* reaped: no zombie */

    /* the reclaim ran: nothing is held by the dead rank any more */
    wait_held(&v, doomed.pid, false, T_MS);
    /* and rank 0's batch is still its own: same allocations, counted, held by this pid */
    for (size_t t = 0; t < n_held; t++) {
        dh__shm_record_t *r = record_of(&v, &first->tensors[t]);
        if (DH__SHM_REFWORD_COUNT(atomic_load(&r->refword)) == 0 ||
            atomic_load(&r->generation) != generation[t] ||
            atomic_load(&r->holder_pid) != (int32_t)getpid())
            fail_msg("rank 0's batch 0 tensor '%s' lost its allocation to the reclaim: count %u, "
                     "generation %llu (was %llu), holder %d (this pid %d)",
                     first->tensors[t].name, DH__SHM_REFWORD_COUNT(atomic_load(&r->refword)),
                     (unsigned long long)atomic_load(&r->generation),
                     (unsigned long long)generation[t], (int)atomic_load(&r->holder_pid),
                     (int)getpid());
    }
    assert_true(held_by(&v, getpid()) >= (int)n_held);

    /* rank 0 finishes its epoch; the dead rank's slabs serve its later batches */
    dh_client_batch_t *b = NULL;
    uint64_t batches = 1;
    while ((rc = dh_client_next(c, &b)) == 0) {
        check_synthetic(b);
        dh_client_batch_release(&b);
        batches++;
    }
    if (rc != DH_EEOF)
        print_error("next: %s\n", dh_last_error());
    assert_int_equal(rc, DH_EEOF);
    assert_int_equal(batches, 12);
    /* batch 0, held all along, still has its bytes */
    check_synthetic(first);
    for (size_t t = 0; t < n_held; t++) {
        assert_memory_equal(first->tensors[t].data, bytes[t], first->tensors[t].nbytes);
        free(bytes[t]);
    }
    dh_client_batch_release(&first);
    dh_client_destroy(&c);
    cl_stop(&server);
    cl_stop(&coord);
    cl_assert_no_leftovers();
}

/* Expects `server` to exit 1 at start with each of `needles` in its log. */
static void expect_exit_saying(cl_proc_t *server, int code, const char *const *needles, size_t n)
{
    cl_expect_exit(server, code, T_MS);
    char *log = cl_read(server->log);
    for (size_t i = 0; i < n; i++)
        if (!strstr(log, needles[i])) {
            print_error("%s: log lacks '%s':\n", server->name, needles[i]);
            cl_print_log(log);
            free(log);
            fail();
        }
    free(log);
}

static void expect_start_failure(cl_proc_t *server, const char *const *needles, size_t n)
{
    expect_exit_saying(server, 1, needles, n);
}

static void dataserver_arena_that_cannot_be_had_fails_at_start(void **state)
{
    (void)state;
    dh__shm_memory_t mem;
    dh__shm_memory_probe(NULL, &mem);
    if (mem.available_bytes > ((uint64_t)1 << 40) && mem.cgroup_limit_bytes > ((uint64_t)1 << 40))
        skip(); /* a machine that could hold the 1 TiB arena */
    cl_proc_t huge, limited;
    char *huge_args[] = {"datahelix", "server", "--coordinator", "tcp://127.0.0.1:1",
                         "--role",    "local",  "--node",        "n0",
                         "--workers", "1",      "--arena-mb",    "1048576",
                         NULL};
    cl_spawn(&huge, "server-huge", huge_args);
    const char *huge_says[] = {"cannot start", "1099511627776 bytes", "exceed the memory"};
    expect_start_failure(&huge, huge_says, 3);

    /* Under RLIMIT_FSIZE (inherited by the child; set here only around the fork). Before
     * the check, ftruncate killed the server with SIGXFSZ (exit 153). */
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)16 << 20;
    char *limited_args[] = {"datahelix", "server", "--coordinator", "tcp://127.0.0.1:1",
                            "--role",    "local",  "--node",        "n0",
                            "--workers", "1",      "--arena-mb",    "64",
                            NULL};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
    cl_spawn(&limited, "server-fsize", limited_args);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    const char *limited_says[] = {"cannot start", "67108864 bytes",
                                  "RLIMIT_FSIZE of 16777216 bytes"};
    expect_start_failure(&limited, limited_says, 3);
    cl_assert_no_leftovers();
}

static void dataserver_bad_shm_allow_uid_fails_at_start(void **state)
{
    (void)state;
    cl_proc_t server;
    char *args[] = {"datahelix",
                    "server",
                    "--coordinator",
                    "tcp://127.0.0.1:1",
                    "--role",
                    "local",
                    "--node",
                    "n0",
                    "--workers",
                    "1",
                    "--arena-mb",
                    "4",
                    "--shm-allow-uid",
                    "1000,nobody",
                    NULL};
    cl_spawn(&server, "server-bad-uid", args);
    const char *says[] = {"cannot start", "--shm-allow-uid", "'1000,nobody'"};
    expect_start_failure(&server, says, 3);
    cl_assert_no_leftovers();
}

/* --cache-dir and --cache-bytes (docs/remote.md, "The local cache"): a directory that cannot
 * be made fails at start naming it (exit 1); a size that is not one, or one option without
 * the other, is a usage error (exit 2). */
static void dataserver_bad_cache_settings_fail_at_start(void **state)
{
    (void)state;
    char file[1024], dir[1100];
    snprintf(file, sizeof file, "%s", dh_test_path("cache-is-a-file"));
    dh_test_write_file(file, "a file, not a folder\n");
    snprintf(dir, sizeof dir, "%s/cache", file);
    static const struct {
        const char *dir, *bytes;
        int code;
        const char *says[3];
    } cases[] = {
        {NULL, "64M", 1, {"cannot start", "--cache-dir", NULL}},
        {NULL, "12junk", 2, {"--cache-bytes", "'12junk'", "byte count"}},
        {NULL, NULL, 2, {"--cache-dir needs --cache-bytes", NULL, NULL}},
        {"ok", "1M", 1, {"cannot start", "below 2 MiB", "cache-ok"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char ok[1024];
        snprintf(ok, sizeof ok, "%s", dh_test_path("cache-ok"));
        char *args[20] = {"datahelix",     "server",
                          "--coordinator", "tcp://127.0.0.1:1",
                          "--role",        "local",
                          "--node",        "n0",
                          "--workers",     "1",
                          "--arena-mb",    "4",
                          "--cache-dir",   cases[i].dir ? ok : dir};
        int n = 14;
        if (cases[i].bytes) {
            args[n++] = "--cache-bytes";
            args[n++] = (char *)cases[i].bytes;
        }
        args[n] = NULL;
        cl_proc_t server;
        cl_spawn(&server, "server-bad-cache", args);
        const char *says[3];
        size_t k = 0;
        for (size_t j = 0; j < 3; j++)
            if (cases[i].says[j])
                says[k++] = cases[i].says[j];
        if (i == 0)
            says[k++] = file; /* the folder that could not be made is named */
        expect_exit_saying(&server, cases[i].code, says, k);
    }
    cl_assert_no_leftovers();
}

/* In process: a DataServer given a cache directory that does not exist yet makes it (its
 * parents too), leaves no probe file, opens the cache there for the process's remote reads
 * (released with the server), and keeps its own copy of the settings; the settings
 * are both or neither. */
static void dataserver_keeps_cache_settings(void **state)
{
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", dh_test_path("ds-cache/a/b"));
    dh_dataserver_config_t cfg;
    dh_dataserver_config_default(&cfg);
    cfg.coordinator = "inproc://ds-cache-coordinator-nobody";
    cfg.role = DH_DS_REMOTE;
    cfg.node = "n0";
    cfg.workers = 1;
    cfg.pipeline_json = "{\"type\":\"synthetic\",\"cost\":\"none\",\"bytes_scale\":1}";
    cfg.cache_bytes = (uint64_t)64 << 20;
    dh_dataserver_t *s = NULL;
    cfg.cache_dir = NULL;
    assert_int_equal(dh_dataserver_new(&s, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "--cache-bytes without --cache-dir"));
    cfg.cache_dir = dir;
    cfg.cache_bytes = 0;
    assert_int_equal(dh_dataserver_new(&s, &cfg), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), dir));
    cfg.cache_bytes = (uint64_t)64 << 20;
    assert_int_equal(dh_dataserver_new(&s, &cfg), 0);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    DIR *d = opendir(dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            files++;
            assert_string_equal(e->d_name, "cache.lock"); /* the cache's record */
        }
    closedir(d);
    assert_int_equal(files, 1);             /* the probe removed, the cache opened */
    assert_true(dh__remote_cache_active()); /* remote reads go through it */
    assert_string_equal(s->cfg.cache_dir, dir);
    assert_ptr_not_equal(s->cfg.cache_dir, dir); /* its own copy */
    assert_int_equal(s->cfg.cache_bytes, (uint64_t)64 << 20);
    dh_dataserver_destroy(&s);
    assert_null(s);
    assert_false(dh__remote_cache_active()); /* released with its server */
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(dataserver_reclaims_dead_client_not_live_one, cl_teardown),
        cmocka_unit_test_teardown(dataserver_arena_that_cannot_be_had_fails_at_start, cl_teardown),
        cmocka_unit_test_teardown(dataserver_bad_shm_allow_uid_fails_at_start, cl_teardown),
        cmocka_unit_test_teardown(dataserver_bad_cache_settings_fail_at_start, cl_teardown),
        cmocka_unit_test(dataserver_keeps_cache_settings),
    };
    return dh_test_main(argc, argv, tests, sizeof tests / sizeof tests[0], __FILE__);
}
