/* test_cache_shared.c: the local cache shared (src/remote/cache.c, cache_space.c): forked
 * processes and threads inserting into one small directory never exceed its bound and never
 * read a wrong block; the fault sites of a block's write and rename fail cleanly at every
 * hit. Runs under ASan (make test-asan) and TSan (make test-tsan). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "dh_test.h"
#include "cache_test_util.h"
#include "core/internal.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"

#define BLOCK 4096
#define KEYS 24
#define INDEXES 4

static char *fresh_dir(const char *name)
{
    char *dir = strdup(dh_test_path(name));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    return dir;
}

static size_t longest_key(void)
{
    char key[128];
    block_key(KEYS - 1, key, sizeof key);
    return strlen(key);
}

typedef struct worker {
    dh__cache_t *c;
    const char *dir;
    uint64_t bound;
    uint64_t seed;
    int ops;
    /* results */
    int hits, puts, full, wrong, over, errors;
    char error[256];
} worker_t;

/* Gets random blocks, checks each hit against the key's contents, puts each miss; after
 * each put, the directory's total under its lock is within the bound. */
static void *work(void *arg)
{
    worker_t *w = arg;
    unsigned char data[BLOCK], buf[BLOCK];
    char key[128];
    uint64_t rng = w->seed;
    for (int n = 0; n < w->ops; n++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        unsigned k = (unsigned)(rng >> 33) % KEYS, i = (unsigned)(rng >> 50) % INDEXES;
        block_key(k, key, sizeof key);
        size_t len = block_fill(k, i, BLOCK, data), got = 0;
        int rc = dh__cache_get(w->c, key, i, buf, &got);
        if (rc == 1) {
            w->hits++;
            if (got != len || memcmp(buf, data, len) != 0)
                w->wrong++;
            continue;
        }
        if (rc == 0)
            rc = dh__cache_put(w->c, key, i, data, len);
        if (rc == DH_EAGAIN) {
            w->full++;
        } else if (rc) {
            if (!w->errors++)
                snprintf(w->error, sizeof w->error, "%s", dh_last_error());
        } else {
            w->puts++;
            if (dir_total_locked(w->dir) > w->bound)
                w->over++;
        }
    }
    return NULL;
}

/* Every block in the directory is whole and right, the record matches the files, and no
 * temporary file is left. */
static void check_dir(const char *dir, uint64_t bound)
{
    int tmps = -1;
    uint64_t total = dir_total(dir, &tmps);
    assert_true(total <= bound);
    assert_int_equal(tmps, 0);
    dh__cache_t *c = NULL;
    assert_int_equal(dh__cache_open(&c, dir, bound, BLOCK), 0);
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_int_equal(st.bytes, total);
    unsigned char data[BLOCK], buf[BLOCK];
    char key[128];
    int present = 0;
    for (unsigned k = 0; k < KEYS; k++)
        for (unsigned i = 0; i < INDEXES; i++) {
            block_key(k, key, sizeof key);
            size_t len = block_fill(k, i, BLOCK, data), got = 0;
            int rc = dh__cache_get(c, key, i, buf, &got);
            assert_true(rc == 0 || rc == 1);
            if (rc == 1) {
                assert_int_equal(got, len);
                assert_memory_equal(buf, data, len);
                present++;
            }
        }
    assert_true(present > 0);
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_int_equal(st.corrupt, 0);
    dh__cache_close(&c);
}

/* 4 processes x 3 rounds x 400 operations on room for 5 full blocks of 96 */
static void cache_processes_share_the_bound(void **state)
{
    (void)state;
    enum { PROCS = 4, ROUNDS = 3 };
    char *dir = fresh_dir("procs");
    uint64_t bound = bound_for(5, BLOCK, longest_key());
    for (int round = 0; round < ROUNDS; round++) {
        pid_t pids[PROCS];
        for (int p = 0; p < PROCS; p++) {
            pids[p] = fork();
            assert_true(pids[p] >= 0);
            if (pids[p] == 0) {
                worker_t w = {.dir = dir, .bound = bound, .seed = 1000u * round + p, .ops = 400};
                if (dh__cache_open(&w.c, dir, bound, BLOCK)) {
                    fprintf(stderr, "child %d: %s\n", p, dh_last_error());
                    _exit(12);
                }
                work(&w);
                dh__cache_close(&w.c);
                fprintf(stderr, "round %d child %d: %d hits, %d puts, %d full, %d errors %s\n",
                        round, p, w.hits, w.puts, w.full, w.errors, w.error);
                _exit(w.wrong ? 10 : w.over ? 11 : w.errors ? 12 : 0);
            }
        }
        for (int p = 0; p < PROCS; p++) {
            int status = 0;
            assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
            assert_true(WIFEXITED(status));
            assert_int_equal(WEXITSTATUS(status), 0);
        }
        check_dir(dir, bound);
    }
    free(dir);
}

/* 4 threads, two on each of two objects of one directory (flock is per open file: the two
 * objects exclude each other through it, the threads of one through its mutex). */
static void cache_threads_share_the_bound(void **state)
{
    (void)state;
    enum { THREADS = 4 };
    char *dir = fresh_dir("threads");
    uint64_t bound = bound_for(5, BLOCK, longest_key());
    dh__cache_t *c[2] = {NULL, NULL};
    assert_int_equal(dh__cache_open(&c[0], dir, bound, BLOCK), 0);
    assert_int_equal(dh__cache_open(&c[1], dir, bound, BLOCK), 0);
    worker_t w[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker_t){.c = c[i % 2], .dir = dir, .bound = bound, .seed = 77u + i, .ops = 400};
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    int hits = 0, puts = 0;
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        if (w[i].errors)
            fail_msg("thread %d: %s", i, w[i].error);
        assert_int_equal(w[i].wrong, 0);
        assert_int_equal(w[i].over, 0);
        hits += w[i].hits;
        puts += w[i].puts;
    }
    assert_true(hits > 0 && puts > 0);
    dh__cache_close(&c[0]);
    dh__cache_close(&c[1]);
    check_dir(dir, bound);
    free(dir);
}

typedef struct fault_ctx {
    char base[1024];
    int run;
} fault_ctx_t;

/* Three puts into a fresh cache with room for two (the third evicts): whatever fails,
 * nothing half-written is left, the record matches the files, and what is there is right. */
static int fault_body(void *arg)
{
    fault_ctx_t *f = arg;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/run%d", f->base, f->run++);
    uint64_t bound = bound_for(2, BLOCK, longest_key());
    dh__cache_t *c = NULL;
    int rc = dh__cache_open(&c, dir, bound, BLOCK);
    assert_int_equal(rc, 0);
    unsigned char data[BLOCK], buf[BLOCK];
    char key[128];
    for (unsigned k = 0; k < 3 && rc == 0; k++) {
        block_key(k, key, sizeof key);
        rc = dh__cache_put(c, key, 0, data, block_fill(k, 0, BLOCK, data));
    }
    int tmps = -1;
    uint64_t total = dir_total(dir, &tmps);
    assert_int_equal(tmps, 0);
    assert_true(total <= bound);
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_int_equal(st.bytes, total);
    for (unsigned k = 0; k < 3; k++) {
        block_key(k, key, sizeof key);
        size_t len = block_fill(k, 0, BLOCK, data), got = 0;
        if (dh__cache_get(c, key, 0, buf, &got) == 1) {
            assert_int_equal(got, len);
            assert_memory_equal(buf, data, len);
        }
    }
    dh__cache_close(&c);
    return rc;
}

static void cache_write_fault_fails_cleanly_at_every_hit(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    fault_ctx_t f = {.run = 0};
    char *dir = fresh_dir("fault-write");
    snprintf(f.base, sizeof f.base, "%s", dir);
    char what[1200];
    snprintf(what, sizeof what, "cannot write %s/run", dir);
    /* 3 writes (header, key, data) for each of 3 blocks */
    assert_int_equal(dh_test_each_fault(DH_FAULT_CACHE_WRITE, what, fault_body, &f), 9);
    free(dir);
}

static void cache_rename_fault_fails_cleanly_at_every_hit(void **state)
{
    (void)state;
    if (!dh_fault_enabled())
        skip();
    fault_ctx_t f = {.run = 0};
    char *dir = fresh_dir("fault-rename");
    snprintf(f.base, sizeof f.base, "%s", dir);
    char what[1200];
    snprintf(what, sizeof what, "cannot rename %s/run", dir);
    assert_int_equal(dh_test_each_fault(DH_FAULT_CACHE_RENAME, what, fault_body, &f), 3);
    free(dir);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(cache_processes_share_the_bound),
    cmocka_unit_test(cache_threads_share_the_bound),
    cmocka_unit_test(cache_write_fault_fails_cleanly_at_every_hit),
    cmocka_unit_test(cache_rename_fault_fails_cleanly_at_every_hit),
};

DH_TEST_MAIN(tests)
