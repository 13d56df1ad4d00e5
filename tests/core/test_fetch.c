/* Tests of core/fetch.c: a sample's source key (docs/remote.md, "The fetch tally") and the
 * per-thread tally the remote reader adds to. */
#include <pthread.h>
#include <string.h>

#include "dh_test.h"
#include "core/internal.h"

static void expect_key(const char *uri, const char *want)
{
    char key[DH__FETCH_SOURCE_MAX];
    size_t n = dh__fetch_source_key(uri, key);
    if (strcmp(key, want) != 0)
        fail_msg("source key of '%s': '%s', want '%s'", uri ? uri : "(null)", key, want);
    assert_int_equal(n, strlen(want));
}

static void fetch_source_key_is_scheme_and_host(void **state)
{
    expect_key("/data/kinetics/abc.mp4", "local");
    expect_key("clips/abc.mp4", "local");
    expect_key("/data/shard-000.tar#1024+2048", "local");
    expect_key("file:///data/abc.mp4", "local");
    expect_key("FILE:///data/abc.mp4", "local");
    expect_key("", "local");
    expect_key(NULL, "local");
    expect_key("synthetic://s0.mp4", "local"); /* the emulation's: read nowhere */
    expect_key("gs://bucket/x.mp4", "local");  /* not a remote source (yet) */
    expect_key("https://data.example.org/webvid/000/1.mp4", "https://data.example.org");
    expect_key("HTTPS://Data.Example.ORG:8443/x.mp4?sig=abc", "https://data.example.org:8443");
    expect_key("http://10.0.0.7:8080", "http://10.0.0.7:8080");
    expect_key("http://[::1]:9000/b/k", "http://[::1]:9000");
    expect_key("s3://my-bucket/shards/000.tar", "s3://my-bucket");
    expect_key("s3://my-bucket", "s3://my-bucket");
    expect_key("https://host.example#frag", "https://host.example");
    /* user information (a password) never reaches the key */
    expect_key("https://user:s3cret@host.example/x.mp4", "https://host.example");
    expect_key("https://a@b:c@host.example/x", "https://host.example");
    /* not a URL: no "://", or a scheme that does not start with a letter */
    expect_key("c:/data/x.mp4", "local");
    expect_key("1http://x/y", "local");
    expect_key("pipe:curl -s https://x/y", "local");
}

static void fetch_source_key_is_cut_at_its_bound(void **state)
{
    char uri[600] = "https://";
    memset(uri + 8, 'a', 500);
    strcpy(uri + 508, "/x.mp4");
    char key[DH__FETCH_SOURCE_MAX];
    assert_int_equal(dh__fetch_source_key(uri, key), DH__FETCH_SOURCE_MAX - 1);
    assert_int_equal(strlen(key), DH__FETCH_SOURCE_MAX - 1);
    assert_memory_equal(key, "https://aaaa", 12);
}

static void *note_unbound(void *arg)
{
    (void)arg;
    dh__fetch_note(5, 5); /* no tally on this thread: nothing, no crash */
    return NULL;
}

static void fetch_tally_counts_what_its_thread_notes(void **state)
{
    dh__fetch_note(1000, 10); /* nothing bound yet */
    dh__fetch_tally_t a = {0}, b = {0};
    assert_null(dh__fetch_tally_bind(&a));
    dh__fetch_note(1500000, 4096);
    dh__fetch_note(500000, 1024);
    /* another thread's notes do not reach this thread's tally */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, note_unbound, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.wait_ns, 2000000);
    assert_int_equal(a.bytes, 5120);
    assert_ptr_equal(dh__fetch_tally_bind(&b), &a); /* nested: the outer one comes back */
    dh__fetch_note(7, 0);                           /* a cache hit: waited, fetched nothing */
    assert_ptr_equal(dh__fetch_tally_bind(&a), &b);
    assert_int_equal(b.wait_ns, 7);
    assert_int_equal(b.bytes, 0);
    assert_int_equal(a.wait_ns, 2000000);
    assert_ptr_equal(dh__fetch_tally_bind(NULL), &a);
    dh__fetch_note(1, 1);
    assert_int_equal(a.wait_ns, 2000000);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(fetch_source_key_is_scheme_and_host),
    cmocka_unit_test(fetch_source_key_is_cut_at_its_bound),
    cmocka_unit_test(fetch_tally_counts_what_its_thread_notes),
};
DH_TEST_MAIN(tests)
