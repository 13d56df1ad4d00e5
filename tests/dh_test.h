/* dh_test.h: shared helpers for the cmocka tests. Each test file ends with
 * DH_TEST_MAIN(tests): argv[1], when given, runs only the case of that name (CTest runs
 * each case as its own test; see tests/CMakeLists.txt). */
#ifndef DH_TEST_H
#define DH_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

int dh_test_main(int argc, char **argv, const struct CMUnitTest *tests, size_t count,
                 const char *group);

#define DH_TEST_MAIN(tests)                                                                        \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        return dh_test_main(argc, argv, tests, sizeof(tests) / sizeof((tests)[0]), __FILE__);      \
    }

/* Asserts |a - b| <= tol, printing both values. */
#define assert_close(a, b, tol)                                                                    \
    dh_test_assert_close((double)(a), (double)(b), (double)(tol), #a, #b, __FILE__, __LINE__)
void dh_test_assert_close(double a, double b, double tol, const char *an, const char *bn,
                          const char *file, int line);

/* A fresh scratch directory for this process (under DH_TEST_TMP or /tmp), created on first
 * use; returns a path "DIR/name" in a static buffer. */
const char *dh_test_path(const char *name);

/* The allocation-failure run of docs/conventions.md "Tests": runs body(ctx) with allocation 0, then
 * 1, 2, ... failing, until a run makes no more allocations than the one that was to fail
 * (it completed). Each run must free what it made (the live count is checked) and return
 * DH_ENOMEM, or 0 for the run that completed; anything else fails the test with the run's
 * number and dh_last_error(). Returns the number of allocations of the complete run. */
long dh_test_each_allocation_failure(int (*body)(void *ctx), void *ctx);

/* The sweep of a numbered I/O fault site (include/datahelix/fault.h; call it only when
 * dh_fault_enabled()): runs body(ctx) with the site's hit 0 of the run failing, then hit 1,
 * 2, ..., until a run hits the site no further than the hit that was to fail (it completed).
 * Each run that failed must return a negative code with a message (dh_last_error) containing
 * `what` (NULL `what`: a fault the code recovers from, every run must return 0); every run
 * must give back what it took: allocations (dh_alloc_live) and open fds
 * (/proc/self/fd) are counted before and after. The complete run must return 0 (so the same
 * objects work once the fault is gone, where body reuses them). Disarms every site before
 * returning. Returns the site's hits in the complete run, asserted >= 1. */
long dh_test_each_fault(int site, const char *what, int (*body)(void *ctx), void *ctx);

/* The open fds of this process (entries of /proc/self/fd, the directory's own included). */
long dh_test_open_fds(void);

/* Writes text to a file; fails the test on error. */
void dh_test_write_file(const char *path, const char *text);

#endif
