/* Tests of src/remote/cache_fetch.c and readahead.c against nginx (servers.h): remote files
 * read through the local cache (a second read makes no request), its bound held while an
 * object larger than it is read, a directory shared by two processes (one fills it, the
 * other reads with no request), and read-ahead (a range fetched in the background is there
 * when the reader opens it; cancelled by its tag; dropped over the byte bound). Counters,
 * never timing. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/remote_internal.h"
#include "remote/servers.h"

#define SMALL_BYTES 300007           /* not a multiple of anything */
#define BIG_BYTES ((6u << 20) + 123) /* larger than the bounded cache */

static uint8_t *expected;

static void write_object(const char *name, size_t n)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", servers.www, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(expected, 1, n, f), n);
    fclose(f);
}

static int setup(void **state)
{
    servers_setup(state);
    expected = dh_malloc(BIG_BYTES);
    for (size_t i = 0; i < BIG_BYTES; i++)
        expected[i] = (uint8_t)(i * 131u + (i >> 9));
    write_object("small.bin", SMALL_BYTES);
    write_object("big.bin", BIG_BYTES);
    start_nginx();
    return 0;
}

static int teardown(void **state)
{
    dh__remote_cache_release();
    dh_free(expected);
    expected = NULL;
    return servers_teardown(state);
}

static char url_buf[1024];
static const char *url(const char *name)
{
    snprintf(url_buf, sizeof url_buf, "http://127.0.0.1:%d/%s", servers.http_port, name);
    return url_buf;
}

static char dir_buf[700];
static const char *cache_dir(const char *name)
{
    snprintf(dir_buf, sizeof dir_buf, "%s/%s", servers.dir, name);
    return dir_buf;
}

static uint64_t requests(void)
{
    dh__remote_stats_t st;
    dh__remote_stats(&st);
    return st.requests;
}

/* Reads bytes [start, end) of u through a remote file, in FFmpeg's 32 KiB reads, and checks
 * them against expected[]. */
static void read_range(const char *u, int64_t start, int64_t end, size_t object_bytes)
{
    dh__remote_file_t *f;
    assert_int_equal(dh__remote_file_open(&f, u, start, end), 0);
    size_t n = (size_t)((end < 0 ? (int64_t)object_bytes : end) - start);
    uint8_t *buf = dh_malloc(32768);
    size_t pos = 0;
    for (;;) {
        size_t got;
        int rc = dh__remote_file_read(f, (int64_t)pos, buf, 32768, &got);
        if (rc)
            print_error("read at %zu: %s\n", pos, dh_last_error());
        assert_int_equal(rc, 0);
        if (got == 0)
            break;
        assert_memory_equal(buf, expected + start + pos, got);
        pos += got;
    }
    assert_int_equal(pos, n);
    dh_free(buf);
    dh__remote_file_close(&f);
}

static void a_second_read_makes_no_request(void **state)
{
    (void)state;
    assert_int_equal(dh__remote_cache_use(cache_dir("c1"), 64u << 20), 0);
    assert_true(dh__remote_cache_active());
    uint64_t r0 = requests();
    read_range(url("small.bin"), 0, -1, SMALL_BYTES);
    uint64_t r1 = requests();
    assert_true(r1 > r0);
    dh__remote_cache_stats_t a, b;
    dh__remote_cache_stats(&a);
    read_range(url("small.bin"), 0, -1, SMALL_BYTES);
    read_range(url("small.bin?sig=other"), 1000, 200000, SMALL_BYTES); /* the query ignored */
    assert_int_equal(requests(), r1);
    dh__remote_cache_stats(&b);
    assert_true(b.hits > a.hits);
    assert_int_equal(b.misses, a.misses);
    assert_int_equal(b.bytes_network, a.bytes_network);
    /* nginx logged only the first read's requests */
    wait_lines(servers.nginx_log, (int)(r1 - r0));
    assert_int_equal(count_lines(servers.nginx_log, NULL), (int)(r1 - r0));
    /* the same directory again shares the cache; another is refused */
    assert_int_equal(dh__remote_cache_use(cache_dir("c1"), 64u << 20), 0);
    dh__remote_cache_release();
    assert_int_equal(dh__remote_cache_use(cache_dir("other"), 64u << 20), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "one cache per process"));
    dh__remote_cache_release();
    assert_false(dh__remote_cache_active());
    /* without the cache the reads are requests again */
    read_range(url("small.bin"), 0, 70000, SMALL_BYTES);
    assert_true(requests() > r1);
}

/* The files under dir, in bytes. */
static uint64_t dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    uint64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[1400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
            n += (uint64_t)st.st_size;
    }
    closedir(d);
    return n;
}

static void the_bound_holds_for_an_object_larger_than_it(void **state)
{
    (void)state;
    const uint64_t bound = 3u << 20;
    assert_int_equal(dh__remote_cache_use(cache_dir("c2"), bound), 0);
    read_range(url("big.bin"), 0, -1, BIG_BYTES);
    dh__remote_cache_stats_t st;
    dh__remote_cache_stats(&st);
    assert_true(st.bytes_held <= bound);
    assert_true(st.evictions > 0);
    assert_true(dir_bytes(cache_dir("c2")) <= bound);
    /* a member near the end is still held whole: read again with no request */
    uint64_t r = requests();
    read_range(url("big.bin"), BIG_BYTES - 300000, BIG_BYTES, BIG_BYTES);
    assert_int_equal(requests(), r);
    assert_true(dir_bytes(cache_dir("c2")) <= bound);
}

static void two_processes_share_the_directory(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* fills the cache, reports its requests */
        int rc = dh__remote_cache_use(cache_dir("c3"), 64u << 20);
        uint64_t r = requests();
        if (rc == 0)
            read_range(url("small.bin"), 0, -1, SMALL_BYTES);
        dh__remote_cache_release();
        _exit(rc == 0 && requests() > r ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(dh__remote_cache_use(cache_dir("c3"), 64u << 20), 0);
    uint64_t r = requests();
    read_range(url("small.bin"), 0, -1, SMALL_BYTES);
    assert_int_equal(requests(), r); /* every block (and the size) from the child's */
}

static void read_ahead_fetches_the_next_range_before_it_is_read(void **state)
{
    (void)state;
    assert_int_equal(dh__remote_cache_use(cache_dir("c4"), 64u << 20), 0);
    const int64_t start = 3 * 65536 + 100, end = start + 700000; /* a tar member */
    dh__remote_cache_stats_t a, b;
    dh__remote_cache_stats(&a);
    assert_int_equal(dh__remote_readahead(url("big.bin"), start, end, 7), 0);
    dh__remote_readahead_wait_idle();
    dh__remote_cache_stats(&b);
    assert_int_equal(b.ra_queued - a.ra_queued, 1);
    assert_int_equal(b.ra_done - a.ra_done, 1);
    assert_true(b.ra_bytes - a.ra_bytes >= (uint64_t)(end - start));
    /* the decode's reads: the member's first bytes, and all the rest, are there */
    uint64_t r = requests();
    read_range(url("big.bin"), start, end, BIG_BYTES);
    assert_int_equal(requests(), r);
    /* a clip at a URL: its head */
    assert_int_equal(dh__remote_readahead(url("small.bin"), 0, -1, 8), 0);
    dh__remote_readahead_wait_idle();
    r = requests();
    read_range(url("small.bin"), 0, -1, SMALL_BYTES);
    assert_int_equal(requests(), r);
}

static void read_ahead_is_cancelled_with_its_task(void **state)
{
    (void)state;
    assert_int_equal(dh__remote_cache_use(cache_dir("c5"), 64u << 20), 0);
    dh__remote_cache_stats_t a, b;
    dh__remote_cache_stats(&a);
    for (int i = 0; i < 40; i++)
        assert_int_equal(dh__remote_readahead(url("big.bin"), i * 131072, (i + 1) * 131072, 9), 0);
    dh__remote_readahead_cancel(9); /* the task dropped: its queued ranges go */
    dh__remote_readahead_wait_idle();
    dh__remote_cache_stats(&b);
    assert_int_equal(b.ra_queued - a.ra_queued, 40);
    assert_int_equal((b.ra_done - a.ra_done) + (b.ra_cancelled - a.ra_cancelled), 40);
    assert_true(b.ra_cancelled - a.ra_cancelled >= 1);
    assert_true(b.ra_bytes - a.ra_bytes < 40u * 131072);
}

static void read_ahead_is_bounded_and_needs_a_cache(void **state)
{
    (void)state;
    /* no cache: nothing queued */
    dh__remote_cache_stats_t a, b;
    dh__remote_cache_stats(&a);
    assert_int_equal(dh__remote_readahead(url("big.bin"), 0, 65536, 1), 0);
    dh__remote_cache_stats(&b);
    assert_int_equal(b.ra_queued, a.ra_queued);
    setenv("DH_READAHEAD_BYTES", "1048576", 1);
    assert_int_equal(dh__remote_cache_use(cache_dir("c6"), 64u << 20), 0);
    assert_int_equal(dh__remote_readahead(url("big.bin"), 0, 2 << 20, 1), 0); /* over 1 MiB */
    dh__remote_cache_stats(&b);
    assert_int_equal(b.ra_dropped - a.ra_dropped, 1);
    assert_int_equal(b.ra_queued, a.ra_queued);
    dh__remote_cache_release();
    setenv("DH_READAHEAD_BYTES", "0", 1); /* off */
    assert_int_equal(dh__remote_cache_use(cache_dir("c6"), 64u << 20), 0);
    assert_int_equal(dh__remote_readahead(url("big.bin"), 0, 65536, 1), 0);
    dh__remote_cache_stats(&b);
    assert_int_equal(b.ra_queued, a.ra_queued);
    unsetenv("DH_READAHEAD_BYTES");
}

/* The read-ahead of a range and a decode of it at once: whichever claims a block first
 * fetches it, the other waits and finds it, so the range is fetched once in all. */
static void a_read_racing_its_read_ahead_fetches_once(void **state)
{
    (void)state;
    assert_int_equal(dh__remote_cache_use(cache_dir("c7"), 64u << 20), 0);
    const int64_t start = 65536, end = start + (3 << 20);
    dh__remote_cache_stats_t a, b;
    dh__remote_cache_stats(&a);
    assert_int_equal(dh__remote_readahead(url("big.bin"), start, end, 11), 0);
    read_range(url("big.bin"), start, end, BIG_BYTES);
    dh__remote_readahead_wait_idle();
    dh__remote_cache_stats(&b);
    /* the reader's last fetch may run past the range's end by its read-ahead, a block */
    assert_true(b.bytes_network - a.bytes_network <= (uint64_t)(end - start) + (1u << 20));
    assert_int_equal(b.put_errors, a.put_errors);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(a_second_read_makes_no_request, setup, teardown),
    cmocka_unit_test_setup_teardown(the_bound_holds_for_an_object_larger_than_it, setup, teardown),
    cmocka_unit_test_setup_teardown(two_processes_share_the_directory, setup, teardown),
    cmocka_unit_test_setup_teardown(read_ahead_fetches_the_next_range_before_it_is_read, setup,
                                    teardown),
    cmocka_unit_test_setup_teardown(read_ahead_is_cancelled_with_its_task, setup, teardown),
    cmocka_unit_test_setup_teardown(a_read_racing_its_read_ahead_fetches_once, setup, teardown),
    cmocka_unit_test_setup_teardown(read_ahead_is_bounded_and_needs_a_cache, setup, teardown),
};
DH_TEST_MAIN(tests)
