/* Tests of src/remote/reader.c over a fetch function of the test's own (an object in memory):
 * every fetch is block-aligned, sequential reads fetch more each time up to the read-ahead's
 * cap, a seek drops back to one block, a byte range (a tar member) never fetches past its
 * last block, and the sizes and counts are right. */
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "dh_test.h"
#include "remote/remote_internal.h"

#define BLOCK ((int64_t)DH_REMOTE_BLOCK)
#define OBJECT_BYTES (700 * BLOCK + 1234) /* over the 4 MiB a file holds */

static uint8_t object[OBJECT_BYTES];
static struct {
    int64_t offset;
    size_t len;
} calls[256];
static int n_calls;
static bool give_total = true;

static int fake_fetch(void *ctx, const char *url, int64_t offset, size_t len, void *buf,
                      size_t *got, int64_t *total, const dh__remote_interrupt_t *interrupt)
{
    (void)interrupt;
    assert_ptr_equal(ctx, object);
    assert_string_equal(url, "https://h/o.tar");
    assert_int_equal(offset % BLOCK, 0);
    assert_int_equal(len % (size_t)BLOCK, 0);
    assert_true(n_calls < 256);
    calls[n_calls].offset = offset;
    calls[n_calls].len = len;
    n_calls++;
    *got = offset >= OBJECT_BYTES                 ? 0
           : (int64_t)len > OBJECT_BYTES - offset ? (size_t)(OBJECT_BYTES - offset)
                                                  : len;
    memcpy(buf, object + offset, *got);
    *total = give_total ? OBJECT_BYTES : -1;
    return 0;
}

static int setup(void **state)
{
    (void)state;
    for (int64_t i = 0; i < OBJECT_BYTES; i++)
        object[i] = (uint8_t)(i * 7 + (i >> 10));
    n_calls = 0;
    give_total = true;
    dh__remote_set_fetch(fake_fetch, object);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dh__remote_set_fetch(NULL, NULL);
    return 0;
}

static void read_at(dh__remote_file_t *f, int64_t start, int64_t pos, size_t len, size_t want)
{
    static uint8_t buf[4 << 20];
    size_t got = 0;
    assert_int_equal(dh__remote_file_read(f, pos, buf, len, &got), 0);
    assert_int_equal(got, want);
    if (got)
        assert_memory_equal(buf, object + start + pos, got);
}

static void sequential_reads_fetch_more_each_time(void **state)
{
    (void)state;
    dh__remote_file_t *f = NULL;
    assert_int_equal(dh__remote_file_open(&f, "https://h/o.tar", 0, -1), 0);
    /* the demuxer's 32 KiB reads from the start, to the end */
    for (int64_t pos = 0; pos < OBJECT_BYTES; pos += 32768)
        read_at(f, 0, pos, 32768,
                pos + 32768 <= OBJECT_BYTES ? 32768 : (size_t)(OBJECT_BYTES - pos));
    read_at(f, 0, OBJECT_BYTES, 10, 0);
    assert_int_equal(dh__remote_file_size(f), OBJECT_BYTES);
    /* the read-ahead doubles from one block (1, 2, 4, ... blocks), capped at
     * DH_REMOTE_READAHEAD_MAX; a fetch is never shorter than the read (32 KiB) */
    int k = 0;
    for (size_t len = (size_t)BLOCK; len < DH_REMOTE_READAHEAD_MAX; len *= 2, k++)
        assert_int_equal(calls[k].len, len < 32768 ? 32768 : len);
    assert_int_equal(calls[k].len, DH_REMOTE_READAHEAD_MAX);
    for (int i = 1; i < n_calls; i++)
        assert_int_equal(calls[i].offset, calls[i - 1].offset + (int64_t)calls[i - 1].len);
    assert_true(n_calls <= k + 1 + OBJECT_BYTES / (int64_t)DH_REMOTE_READAHEAD_MAX + 1);
    /* the last fetch stops at the object's last block: nothing fetched twice or past it */
    assert_int_equal(dh__remote_file_bytes_fetched(f), OBJECT_BYTES);
    assert_int_equal(dh__remote_file_bytes_read(f), OBJECT_BYTES);
    /* the file held its last 4 MiB, not the start */
    int before = n_calls;
    read_at(f, 0, OBJECT_BYTES - (3 << 20), 1000, 1000);
    assert_int_equal(n_calls, before);
    read_at(f, 0, 0, 1000, 1000);
    assert_int_equal(n_calls, before + 1);
    dh__remote_file_close(&f);
    assert_null(f);
}

static void a_seek_fetches_one_block_and_keeps_the_windows(void **state)
{
    (void)state;
    dh__remote_file_t *f = NULL;
    assert_int_equal(dh__remote_file_open(&f, "https://h/o.tar", 0, -1), 0);
    read_at(f, 0, 0, 100, 100);
    read_at(f, 0, BLOCK, 100, 100);          /* runs on: 2 blocks */
    read_at(f, 0, 30 * BLOCK + 5, 100, 100); /* a seek: 1 block */
    assert_int_equal(n_calls, 3);
    assert_int_equal(calls[1].offset, BLOCK);
    assert_int_equal(calls[1].len, 2 * BLOCK);
    assert_int_equal(calls[2].offset, 30 * BLOCK);
    assert_int_equal(calls[2].len, BLOCK);
    /* back to the start (an MP4 whose index is at its end): the windows still hold it */
    read_at(f, 0, 50, 3 * BLOCK - 100, 3 * BLOCK - 100);
    assert_int_equal(n_calls, 3);
    /* on from the second window: the read-ahead doubles again from the seek's one block */
    read_at(f, 0, 3 * BLOCK, 100, 100);
    assert_int_equal(n_calls, 4);
    assert_int_equal(calls[3].offset, 3 * BLOCK);
    assert_int_equal(calls[3].len, 2 * BLOCK);
    read_at(f, 0, 20 * BLOCK, 100, 100);
    read_at(f, 0, 0, 100, 100); /* five windows held: no fetch */
    read_at(f, 0, 30 * BLOCK, 100, 100);
    assert_int_equal(n_calls, 5);
    dh__remote_file_close(&f);

    /* a fetch stops where a window already held begins */
    n_calls = 0;
    assert_int_equal(dh__remote_file_open(&f, "https://h/o.tar", 0, -1), 0);
    read_at(f, 0, 2 * BLOCK, 100, 100);
    read_at(f, 0, 0, BLOCK, BLOCK);
    read_at(f, 0, BLOCK, 2 * BLOCK, 2 * BLOCK); /* runs on, into the held window */
    assert_int_equal(n_calls, 3);
    assert_int_equal(calls[2].offset, BLOCK);
    assert_int_equal(calls[2].len, BLOCK);
    assert_int_equal(dh__remote_file_bytes_fetched(f), 3 * BLOCK);
    dh__remote_file_close(&f);
}

static void a_range_reads_only_its_blocks(void **state)
{
    (void)state;
    int64_t start = 3 * BLOCK + 512, end = 9 * BLOCK + 1000; /* a tar member */
    dh__remote_file_t *f = NULL;
    assert_int_equal(dh__remote_file_open(&f, "https://h/o.tar", start, end), 0);
    assert_int_equal(dh__remote_file_size(f), end - start);
    for (int64_t pos = 0; pos < end - start; pos += 32768)
        read_at(f, start, pos, 32768,
                pos + 32768 <= end - start ? 32768 : (size_t)(end - start - pos));
    read_at(f, start, end - start, 100, 0);
    read_at(f, start, end - start - 3, 100, 3);
    for (int i = 0; i < n_calls; i++) {
        assert_true(calls[i].offset >= 3 * BLOCK);
        assert_true(calls[i].offset + (int64_t)calls[i].len <= 10 * BLOCK);
    }
    assert_true(dh__remote_file_bytes_fetched(f) <= (uint64_t)(7 * BLOCK));
    dh__remote_file_close(&f);
}

static void a_range_past_the_object_is_erange(void **state)
{
    (void)state;
    dh__remote_file_t *f = NULL;
    assert_int_equal(dh__remote_file_open(&f, "https://h/o.tar?sig=s3cr3t", 0, -1), 0);
    dh__remote_file_close(&f);
    assert_int_equal(
        dh__remote_file_open(&f, "https://h/o.tar", OBJECT_BYTES - 10, OBJECT_BYTES + 10), 0);
    uint8_t buf[64];
    size_t got;
    assert_int_equal(dh__remote_file_read(f, 0, buf, sizeof buf, &got), DH_ERANGE);
    assert_non_null(strstr(dh_last_error(), "https://h/o.tar: bytes"));
    assert_non_null(strstr(dh_last_error(), "lie outside the object"));
    dh__remote_file_close(&f);
    assert_int_equal(dh__remote_file_open(&f, "https://h/o.tar", 10, 10), DH_EINVAL);
    assert_int_equal(dh__remote_file_open(&f, "/local/o.tar", 0, -1), DH_EINVAL);
    assert_null(f);
}

static void the_size_comes_from_a_short_fetch_without_total(void **state)
{
    (void)state;
    give_total = false; /* a server that says no size: the end is where a fetch came short */
    dh__remote_file_t *f = NULL;
    assert_int_equal(dh__remote_file_open(&f, "https://h/o.tar", 0, -1), 0);
    read_at(f, 0, OBJECT_BYTES - 100, 1000, 100);
    assert_int_equal(dh__remote_file_size(f), OBJECT_BYTES);
    dh__remote_file_close(&f);
}

static int open_read_close(void *ctx)
{
    (void)ctx;
    dh__remote_file_t *f = NULL;
    int rc = dh__remote_file_open(&f, "https://h/o.tar", 0, -1);
    if (rc)
        return rc;
    uint8_t buf[100];
    size_t got;
    rc = dh__remote_file_read(f, 5, buf, sizeof buf, &got);
    dh__remote_file_close(&f);
    return rc;
}

static void reader_survives_allocation_failure(void **state)
{
    (void)state;
    assert_true(dh_test_each_allocation_failure(open_read_close, NULL) >= 3);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(sequential_reads_fetch_more_each_time, setup, teardown),
    cmocka_unit_test_setup_teardown(a_seek_fetches_one_block_and_keeps_the_windows, setup,
                                    teardown),
    cmocka_unit_test_setup_teardown(a_range_reads_only_its_blocks, setup, teardown),
    cmocka_unit_test_setup_teardown(a_range_past_the_object_is_erange, setup, teardown),
    cmocka_unit_test_setup_teardown(the_size_comes_from_a_short_fetch_without_total, setup,
                                    teardown),
    cmocka_unit_test_setup_teardown(reader_survives_allocation_failure, setup, teardown),
};
DH_TEST_MAIN(tests)
