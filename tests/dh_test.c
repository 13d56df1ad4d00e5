/* dh_test.c: shared helpers for the cmocka tests (see dh_test.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"

int dh_test_main(int argc, char **argv, const struct CMUnitTest *tests, size_t count,
                 const char *group)
{
    if (argc > 1) {
        int found = 0;
        for (size_t i = 0; i < count; i++)
            if (strcmp(tests[i].name, argv[1]) == 0)
                found = 1;
        if (!found) {
            fprintf(stderr, "%s: no test case named '%s'\n", group, argv[1]);
            return 1;
        }
        cmocka_set_test_filter(argv[1]);
    }
    return _cmocka_run_group_tests(group, tests, count, NULL, NULL);
}

void dh_test_assert_close(double a, double b, double tol, const char *an, const char *bn,
                          const char *file, int line)
{
    double d = a - b;
    if (d < 0)
        d = -d;
    if (!(d <= tol)) {
        print_error("%s = %.9g, %s = %.9g: differ by %.9g > %.9g\n", an, a, bn, b, d, tol);
        _fail(file, line);
    }
}

const char *dh_test_path(const char *name)
{
    static char dir[512];
    static char path[1024];
    if (!dir[0]) {
        const char *base = getenv("DH_TEST_TMP");
        if (!base || !*base)
            base = "/tmp";
        mkdir(base, 0755);
        snprintf(dir, sizeof dir, "%s/dh-test-%d", base, (int)getpid());
        mkdir(dir, 0755);
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

long dh_test_each_allocation_failure(int (*body)(void *ctx), void *ctx)
{
    for (long n = 0;; n++) {
        long live = dh_alloc_live();
        dh_alloc_reset_count();
        dh_alloc_fail_after(n);
        int rc = body(ctx);
        long made = dh_alloc_count();
        dh_alloc_fail_after(-1);
        if (dh_alloc_live() != live)
            print_error("allocation %ld failing: %ld allocations leaked\n", n,
                        dh_alloc_live() - live);
        assert_int_equal(dh_alloc_live(), live);
        int complete = n >= made;
        if (rc != (complete ? 0 : DH_ENOMEM))
            print_error("allocation %ld of %ld failing: %s (%s)\n", n, made, dh_err_name(rc),
                        dh_last_error());
        assert_int_equal(rc, complete ? 0 : DH_ENOMEM);
        if (complete)
            return made;
    }
}

long dh_test_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    long n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

long dh_test_each_fault(int site, const char *what, int (*body)(void *ctx), void *ctx)
{
    assert_true(dh_fault_enabled());
    for (long n = 0;; n++) {
        long live = dh_alloc_live(), fds = dh_test_open_fds();
        long before = dh_fault_hits((dh_fault_site_t)site);
        dh_fault_arm((dh_fault_site_t)site, n);
        int rc = body(ctx);
        dh_fault_disarm_all();
        long hits = dh_fault_hits((dh_fault_site_t)site) - before;
        int complete = hits <= n;
        if (dh_alloc_live() != live || dh_test_open_fds() != fds)
            print_error("fault site %d, hit %ld failing: %ld allocations, %ld fds leaked\n", site,
                        n, dh_alloc_live() - live, dh_test_open_fds() - fds);
        assert_int_equal(dh_alloc_live(), live);
        assert_int_equal(dh_test_open_fds(), fds);
        if (complete) {
            if (rc != 0)
                print_error("fault site %d: the run past its %ld hits failed: %s (%s)\n", site,
                            hits, dh_err_name(rc), dh_last_error());
            assert_int_equal(rc, 0);
            assert_true(hits >= 1); /* the sweep reached the site */
            return hits;
        }
        if (!what) { /* a fault the code recovers from: every run completes */
            if (rc != 0)
                print_error("fault site %d, hit %ld failing: %s (%s), want a recovery\n", site, n,
                            dh_err_name(rc), dh_last_error());
            assert_int_equal(rc, 0);
            continue;
        }
        if (rc >= 0 || !strstr(dh_last_error(), what))
            print_error("fault site %d, hit %ld of the run failing: got %s (%s), want an error "
                        "with '%s'\n",
                        site, n, dh_err_name(rc), dh_last_error(), what);
        assert_true(rc < 0);
        assert_non_null(strstr(dh_last_error(), what));
    }
}

void dh_test_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}
