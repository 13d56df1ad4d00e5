/* test_cache.c: the local cache of remote blocks in one process (src/remote/cache.c,
 * cache_space.c): hits and misses, LRU order by bytes, the bound under many inserts, reopen,
 * a crashed writer's file, corrupt and foreign blocks, open's errors. Processes, threads and
 * the fault sites: test_cache_shared.c. */
#include <errno.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "dh_test.h"
#include "cache_test_util.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"

#define BLOCK 4096

static char *fresh_dir(const char *name)
{
    char *dir = strdup(dh_test_path(name));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    return dir;
}

static void put_full(dh__cache_t *c, unsigned k, uint64_t i)
{
    char key[128];
    unsigned char data[BLOCK];
    block_key(k, key, sizeof key);
    memset(data, (int)(k * 31 + i), sizeof data);
    int rc = dh__cache_put(c, key, i, data, sizeof data);
    assert_int_equal(rc, 0);
}

/* 1 if block (k, i) is there (and whole), else 0. */
static int has_full(dh__cache_t *c, unsigned k, uint64_t i)
{
    char key[128];
    unsigned char buf[BLOCK];
    size_t len = 0;
    block_key(k, key, sizeof key);
    int rc = dh__cache_get(c, key, i, buf, &len);
    assert_true(rc == 0 || rc == 1);
    if (rc == 1) {
        assert_int_equal(len, BLOCK);
        for (size_t j = 0; j < len; j++)
            assert_int_equal(buf[j], (unsigned char)(k * 31 + i));
    }
    return rc;
}

static size_t key_len_of(unsigned k)
{
    char key[128];
    block_key(k, key, sizeof key);
    return strlen(key);
}

static void cache_put_then_get(void **state)
{
    (void)state;
    char *dir = fresh_dir("roundtrip");
    dh__cache_t *c = NULL;
    assert_int_equal(dh__cache_open(&c, dir, 1 << 20, BLOCK), 0);
    unsigned char data[BLOCK], buf[BLOCK];
    char key[128];
    block_key(3, key, sizeof key);
    size_t len = block_fill(3, 5, BLOCK, data), got = 99;
    assert_int_equal(dh__cache_get(c, key, 5, buf, &got), 0);
    assert_int_equal(got, 0);
    assert_int_equal(dh__cache_put(c, key, 5, data, len), 0);
    assert_int_equal(dh__cache_get(c, key, 5, buf, &got), 1);
    assert_int_equal(got, len);
    assert_memory_equal(buf, data, len);
    assert_int_equal(dh__cache_get(c, key, 6, buf, &got), 0); /* another block */
    block_key(4, key, sizeof key);
    assert_int_equal(dh__cache_get(c, key, 5, buf, &got), 0); /* another object */
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 3);
    assert_int_equal(st.inserts, 1);
    assert_int_equal(st.bytes, dir_total(dir, NULL));
    assert_int_equal(st.bytes, DH__CACHE_LOCK_BYTES + DH__CACHE_HEADER_BYTES + key_len_of(3) + len);
    dh__cache_close(&c);
    assert_null(c);
    free(dir);
}

/* Room for 4 blocks: the fifth evicts the least recently used, which a get refreshes. */
static void cache_evicts_least_recently_used(void **state)
{
    (void)state;
    char *dir = fresh_dir("lru");
    dh__cache_t *c = NULL;
    assert_int_equal(dh__cache_open(&c, dir, bound_for(4, BLOCK, key_len_of(0)), BLOCK), 0);
    for (unsigned k = 0; k < 4; k++)
        put_full(c, k, 0);
    assert_int_equal(has_full(c, 0, 0), 1); /* 0 is now the newest; 1 the oldest */
    put_full(c, 4, 0);
    assert_int_equal(has_full(c, 1, 0), 0);
    assert_int_equal(has_full(c, 2, 0), 1); /* order now: 3 0 4 2 */
    put_full(c, 5, 0);
    assert_int_equal(has_full(c, 3, 0), 0);
    put_full(c, 6, 0); /* evicts 0 */
    assert_int_equal(has_full(c, 0, 0), 0);
    assert_int_equal(has_full(c, 4, 0), 1);
    assert_int_equal(has_full(c, 2, 0), 1);
    assert_int_equal(has_full(c, 5, 0), 1);
    assert_int_equal(has_full(c, 6, 0), 1); /* order: 4 2 5 6 */
    put_full(c, 7, 0);
    assert_int_equal(has_full(c, 4, 0), 0);
    assert_int_equal(has_full(c, 2, 0), 1); /* order: 5 6 7 2 */
    put_full(c, 8, 0);
    assert_int_equal(has_full(c, 5, 0), 0);
    assert_int_equal(has_full(c, 6, 0), 1);
    assert_int_equal(has_full(c, 7, 0), 1);
    assert_int_equal(has_full(c, 2, 0), 1);
    assert_int_equal(has_full(c, 8, 0), 1);
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_int_equal(st.evictions, 5);
    assert_true(st.bytes <= st.bytes_max);
    assert_int_equal(st.bytes, dir_total(dir, NULL));
    dh__cache_close(&c);
    free(dir);
}

/* 2,000 gets of 32 blocks of every length, each missed one put, into room for about 6
 * full blocks: after each one the directory is within the bound and the record matches
 * it. */
static void cache_bound_holds_under_many_inserts(void **state)
{
    (void)state;
    char *dir = fresh_dir("bound");
    uint64_t bound = bound_for(6, BLOCK, key_len_of(0)) + 1000;
    dh__cache_t *c = NULL;
    assert_int_equal(dh__cache_open(&c, dir, bound, BLOCK), 0);
    unsigned char data[BLOCK], buf[BLOCK];
    char key[128];
    uint64_t rng = 12345;
    for (unsigned n = 0; n < 2000; n++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        unsigned k = (unsigned)(rng >> 33) % 16, i = (unsigned)(rng >> 50) % 2;
        block_key(k, key, sizeof key);
        size_t len = block_fill(k, i, BLOCK, data), got;
        int rc = dh__cache_get(c, key, i, buf, &got);
        if (rc == 1) {
            assert_int_equal(got, len);
            assert_memory_equal(buf, data, len);
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(dh__cache_put(c, key, i, data, len), 0);
        }
        int tmps = -1;
        uint64_t total = dir_total(dir, &tmps);
        assert_true(total <= bound);
        assert_int_equal(tmps, 0);
        if (n % 100 == 0) {
            dh__cache_stats_t st;
            assert_int_equal(dh__cache_stats(c, &st), 0);
            assert_int_equal(st.bytes, total);
        }
    }
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_true(st.evictions > 100);
    assert_true(st.hits > 0);
    dh__cache_close(&c);
    free(dir);
}

/* Closed and opened again (a restart): the blocks are there and keep their order. */
static void cache_reopen_keeps_contents_and_recency(void **state)
{
    (void)state;
    char *dir = fresh_dir("reopen");
    uint64_t bound = bound_for(3, BLOCK, key_len_of(0));
    dh__cache_t *c = NULL;
    assert_int_equal(dh__cache_open(&c, dir, bound, BLOCK), 0);
    put_full(c, 0, 0);
    put_full(c, 1, 0);
    put_full(c, 2, 0);
    assert_int_equal(has_full(c, 0, 0), 1); /* order: 1 2 0 */
    dh__cache_close(&c);
    assert_int_equal(dh__cache_open(&c, dir, bound, BLOCK), 0);
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_int_equal(st.bytes, dir_total(dir, NULL));
    put_full(c, 3, 0); /* evicts 1, the least recently used before the restart */
    assert_int_equal(has_full(c, 1, 0), 0);
    assert_int_equal(has_full(c, 2, 0), 1);
    assert_int_equal(has_full(c, 0, 0), 1);
    assert_int_equal(has_full(c, 3, 0), 1);
    dh__cache_close(&c);
    /* A smaller bound at the next start evicts down to it, oldest first (order: 2 0 3). */
    assert_int_equal(dh__cache_open(&c, dir, bound_for(2, BLOCK, key_len_of(0)), BLOCK), 0);
    assert_int_equal(has_full(c, 2, 0), 0);
    assert_int_equal(has_full(c, 0, 0), 1);
    assert_int_equal(has_full(c, 3, 0), 1);
    assert_true(dir_total(dir, NULL) <= bound_for(2, BLOCK, key_len_of(0)));
    dh__cache_close(&c);
    free(dir);
}

/* A writer that dies between its reservation and its rename leaves a temporary file and
 * a reservation: the next open deletes the file and recounts. A live writer's file stays. */
static void cache_crashed_writer_is_cleaned(void **state)
{
    (void)state;
    char *dir = fresh_dir("crash");
    uint64_t bound = bound_for(3, BLOCK, key_len_of(0));
    dh__cache_t *c = NULL;
    assert_int_equal(dh__cache_open(&c, dir, bound, BLOCK), 0);
    put_full(c, 0, 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dh__cache_t *cc = NULL;
        dh__cache_write_t w;
        char key[128];
        block_key(1, key, sizeof key);
        if (dh__cache_open(&cc, dir, bound, BLOCK) || dh__cache_reserve(cc, key, 0, BLOCK, &w))
            _exit(3);
        if (write(w.fd, "DHCBLK1\nhalf", 12) != 12)
            _exit(4);
        _exit(0); /* dies holding the file and its reservation */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    int tmps = 0;
    dir_total(dir, &tmps);
    assert_int_equal(tmps, 1);
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(c, &st), 0);
    assert_true(st.bytes > dir_total(dir, NULL)); /* the dead writer's reservation */
    assert_int_equal(has_full(c, 1, 0), 0);       /* nothing visible of it */

    /* This process's own write in flight survives another object's open. */
    dh__cache_write_t w;
    char key[128];
    unsigned char data[BLOCK];
    block_key(2, key, sizeof key);
    memset(data, 2 * 31, sizeof data);
    assert_int_equal(dh__cache_reserve(c, key, 0, BLOCK, &w), 0);
    dh__cache_t *c2 = NULL;
    assert_int_equal(dh__cache_open(&c2, dir, bound, BLOCK), 0);
    assert_int_equal(dh__cache_stats(c2, &st), 0);
    assert_int_equal(st.swept, 1);
    dir_total(dir, &tmps);
    assert_int_equal(tmps, 1); /* ours, still being written */
    assert_int_equal(dh__cache_commit(c, key, 0, data, &w), 0);
    assert_int_equal(has_full(c2, 2, 0), 1);
    assert_int_equal(has_full(c2, 0, 0), 1);
    assert_int_equal(dh__cache_stats(c2, &st), 0);
    assert_int_equal(st.bytes, dir_total(dir, &tmps));
    assert_int_equal(tmps, 0);
    dh__cache_close(&c2);
    dh__cache_close(&c);
    free(dir);
}

/* Two objects of one process (or two processes) writing the same block at once: both
 * reserve (their temporary files have distinct names), the first rename places it, the
 * second finds it there, drops its copy and gives its reservation back. */
static void cache_same_block_written_twice_at_once(void **state)
{
    (void)state;
    char *dir = fresh_dir("twice");
    dh__cache_t *a = NULL, *b = NULL;
    assert_int_equal(dh__cache_open(&a, dir, 1 << 20, BLOCK), 0);
    assert_int_equal(dh__cache_open(&b, dir, 1 << 20, BLOCK), 0);
    char key[128];
    unsigned char data[BLOCK], other[BLOCK], buf[BLOCK];
    block_key(1, key, sizeof key);
    size_t len = block_fill(1, 0, BLOCK, data);
    memset(other, 0xAB, len);
    dh__cache_write_t wa, wb;
    assert_int_equal(dh__cache_reserve(a, key, 0, len, &wa), 0);
    assert_int_equal(dh__cache_reserve(b, key, 0, len, &wb), 0);
    assert_string_not_equal(wa.tmp_name, wb.tmp_name);
    int tmps = 0;
    dir_total(dir, &tmps);
    assert_int_equal(tmps, 2);
    assert_int_equal(dh__cache_commit(a, key, 0, data, &wa), 0);
    assert_int_equal(dh__cache_commit(b, key, 0, other, &wb), 0); /* kept a's */
    size_t got = 0;
    assert_int_equal(dh__cache_get(b, key, 0, buf, &got), 1);
    assert_int_equal(got, len);
    assert_memory_equal(buf, data, len);
    dh__cache_stats_t st;
    assert_int_equal(dh__cache_stats(b, &st), 0);
    assert_int_equal(st.bytes, dir_total(dir, &tmps));
    assert_int_equal(tmps, 0);
    assert_int_equal(st.bytes, DH__CACHE_LOCK_BYTES + DH__CACHE_HEADER_BYTES + strlen(key) + len);
    dh__cache_close(&a);
    dh__cache_close(&b);
    free(dir);
}

static void corrupt_file(const char *dir, const char *name, long offset, int truncate_to)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    if (truncate_to >= 0) {
        assert_int_equal(ftruncate(fd, truncate_to), 0);
    } else {
        unsigned char b;
        assert_int_equal(pread(fd, &b, 1, offset), 1);
        b ^= 0x40;
        assert_int_equal(pwrite(fd, &b, 1, offset), 1);
    }
    close(fd);
}

/* The name of the only block file in dir. */
static void only_block(const char *dir, char *name, size_t cap)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "b-", 2) == 0) {
            snprintf(name, cap, "%s", e->d_name);
            n++;
        }
    closedir(d);
    assert_int_equal(n, 1);
}

/* A block with a flipped data byte, a flipped header byte, or cut short is a miss, and is
 * deleted with its bytes taken off the record. */
static void cache_corrupt_block_is_a_miss_and_deleted(void **state)
{
    (void)state;
    static const struct {
        long offset;
        int truncate_to;
    } damage[] = {{-1, 100},                               /* cut short */
                  {DH__CACHE_HEADER_BYTES + 60 + 100, -1}, /* a data byte */
                  {20, -1},                                /* the index */
                  {2, -1},                                 /* the magic */
                  {-1, 10}};                               /* not even a header */
    for (size_t i = 0; i < DH_ARRAY_LEN(damage); i++) {
        char *dir = fresh_dir("corrupt");
        dh__cache_t *c = NULL;
        assert_int_equal(dh__cache_open(&c, dir, 1 << 20, BLOCK), 0);
        put_full(c, 0, 0);
        char name[256];
        only_block(dir, name, sizeof name);
        corrupt_file(dir, name, damage[i].offset, damage[i].truncate_to);
        assert_int_equal(has_full(c, 0, 0), 0);
        int tmps;
        assert_int_equal(dir_total(dir, &tmps), DH__CACHE_LOCK_BYTES); /* deleted */
        dh__cache_stats_t st;
        assert_int_equal(dh__cache_stats(c, &st), 0);
        assert_int_equal(st.corrupt, 1);
        assert_int_equal(st.bytes, DH__CACHE_LOCK_BYTES);
        put_full(c, 0, 0); /* and can be stored again */
        assert_int_equal(has_full(c, 0, 0), 1);
        dh__cache_close(&c);
        free(dir);
    }
}

/* A whole block of another key under this key's name (as a hash collision would put it) is
 * never returned, and is not deleted. */
static void cache_never_returns_another_keys_block(void **state)
{
    (void)state;
    char *dir = fresh_dir("foreign");
    dh__cache_t *c = NULL;
    assert_int_equal(dh__cache_open(&c, dir, 1 << 20, BLOCK), 0);
    put_full(c, 0, 0);
    char a[256], b[256] = "", pa[1024], pb[1024];
    only_block(dir, a, sizeof a);
    put_full(c, 1, 0);
    dh__cache_close(&c);
    /* The name of key 1's block: the file that is not key 0's. */
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "b-", 2) == 0 && strcmp(e->d_name, a) != 0)
            snprintf(b, sizeof b, "%s", e->d_name);
    closedir(d);
    snprintf(pa, sizeof pa, "%s/%s", dir, a);
    snprintf(pb, sizeof pb, "%s/%s", dir, b);
    assert_int_equal(rename(pa, pb), 0); /* key 0's block where key 1's belongs */
    assert_int_equal(dh__cache_open(&c, dir, 1 << 20, BLOCK), 0);
    assert_int_equal(has_full(c, 1, 0), 0);
    struct stat st;
    assert_int_equal(stat(pb, &st), 0);
    dh__cache_stats_t s;
    assert_int_equal(dh__cache_stats(c, &s), 0);
    assert_int_equal(s.corrupt, 0);
    dh__cache_close(&c);
    free(dir);
}

typedef struct alloc_ctx {
    const char *base;
    int run;
} alloc_ctx_t;

/* open, 4 puts into room for 3, gets, close, open again (its scan), a get, close. */
static int alloc_body(void *arg)
{
    alloc_ctx_t *a = arg;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/run%d", a->base, a->run++);
    uint64_t bound = bound_for(3, BLOCK, key_len_of(0));
    dh__cache_t *c = NULL;
    int rc = dh__cache_open(&c, dir, bound, BLOCK);
    for (unsigned k = 0; rc == 0 && k < 4; k++) {
        char key[128];
        unsigned char data[BLOCK];
        block_key(k, key, sizeof key);
        memset(data, (int)(k * 31), sizeof data);
        rc = dh__cache_put(c, key, 0, data, sizeof data);
    }
    for (unsigned k = 0; rc == 0 && k < 4; k++)
        assert_int_equal(has_full(c, k, 0), k > 0);
    dh__cache_close(&c);
    if (rc == 0)
        rc = dh__cache_open(&c, dir, bound, BLOCK);
    if (rc == 0)
        assert_int_equal(has_full(c, 3, 0), 1);
    dh__cache_close(&c);
    int tmps = -1;
    assert_true(dir_total(dir, &tmps) <= bound);
    assert_int_equal(tmps, 0);
    return rc;
}

/* Each allocation of open, put (the candidates' room, kept at reserve) and the scan failing
 * in turn: DH_ENOMEM, nothing leaked, no temporary file left. */
static void cache_survives_each_allocation_failure(void **state)
{
    (void)state;
    char *dir = fresh_dir("alloc");
    alloc_ctx_t a = {.base = dir, .run = 0};
    long made = dh_test_each_allocation_failure(alloc_body, &a);
    assert_true(made >= 5); /* 2 at each open, the candidates' first room */
    free(dir);
}

static void cache_open_errors_name_the_directory(void **state)
{
    (void)state;
    char *file = strdup(dh_test_path("a-file"));
    dh_test_write_file(file, "not a directory\n");
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/cache", file);
    dh__cache_t *c = NULL;
    int rc = dh__cache_open(&c, dir, 1 << 20, BLOCK);
    assert_true(rc < 0);
    assert_null(c);
    assert_non_null(strstr(dh_last_error(), file));
    rc = dh__cache_open(&c, dh_test_path("small"), 5000, BLOCK);
    assert_int_equal(rc, DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "small"));
    assert_non_null(strstr(dh_last_error(), "below one block"));
    rc = dh__cache_open(&c, dh_test_path("small"), 1 << 20, 0);
    assert_int_equal(rc, DH_EINVAL);
    free(file);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(cache_put_then_get),
    cmocka_unit_test(cache_evicts_least_recently_used),
    cmocka_unit_test(cache_bound_holds_under_many_inserts),
    cmocka_unit_test(cache_reopen_keeps_contents_and_recency),
    cmocka_unit_test(cache_crashed_writer_is_cleaned),
    cmocka_unit_test(cache_same_block_written_twice_at_once),
    cmocka_unit_test(cache_corrupt_block_is_a_miss_and_deleted),
    cmocka_unit_test(cache_never_returns_another_keys_block),
    cmocka_unit_test(cache_survives_each_allocation_failure),
    cmocka_unit_test(cache_open_errors_name_the_directory),
};

DH_TEST_MAIN(tests)
