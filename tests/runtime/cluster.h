/* cluster.h: helpers for the runtime tests that start real processes (the `datahelix` CLI
 * named by $DH_CLI): spawn with a log file, wait for a log line or an exit with a timeout
 * (never a fixed sleep), signal, and check that nothing of ours is left: no process carrying
 * this test's tag, no memfd arena held by one, nothing of ours in /dev/shm.
 * Header-only (static functions), included by the tests of tests/runtime. */
#ifndef DH_TESTS_RUNTIME_CLUSTER_H
#define DH_TESTS_RUNTIME_CLUSTER_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dh_test.h"
#include "datahelix/clock.h"
#include "datahelix/mix.h"
#include "datahelix/profile.h"

typedef struct cl_proc {
    char name[64];
    char log[512];
    pid_t pid;
    bool reaped;
    int status; /* exit code, or 128 + signal */
} cl_proc_t;

static __attribute__((unused)) char cl_tag[64];

static __attribute__((unused)) const char *cl_cli(void)
{
    const char *cli = getenv("DH_CLI");
    assert_non_null(cli);
    return cli;
}

static __attribute__((unused)) void cl_nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Writes `count` profile rows generated from the kinetics-mixed mix (seed 5) to the test's
 * file `name`; returns its path (static storage: the next call overwrites it). */
static __attribute__((unused)) const char *cl_write_profiles(const char *name, size_t count)
{
    static char path[512];
    snprintf(path, sizeof path, "%s", dh_test_path(name));
    dh_mix_t *mix = NULL;
    assert_int_equal(dh_mix_load("kinetics-mixed", &mix), 0);
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profiles_generate(mix, count, 5, set), 0);
    assert_int_equal(dh_profile_set_write(set, path), 0);
    dh_profile_set_destroy(&set);
    dh_mix_destroy(&mix);
    return path;
}

/* A tag unique to this test process, put in every child's environment. */
static __attribute__((unused)) const char *cl_test_tag(void)
{
    if (!cl_tag[0])
        snprintf(cl_tag, sizeof cl_tag, "dhtest-%d-%ld", (int)getpid(), (long)time(NULL));
    return cl_tag;
}

/* Starts `datahelix ARGS...` (argv[0] is ignored) with stdout+stderr to DIR/name.log. */
static __attribute__((unused)) void cl_spawn(cl_proc_t *p, const char *name, char *const argv[])
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->log, sizeof p->log, "%s", dh_test_path(name));
    strncat(p->log, ".log", sizeof p->log - strlen(p->log) - 1);
    const char *tag = cl_test_tag();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setenv("DH_TEST_TAG", tag, 1);
        char *args[64];
        int n = 0;
        args[n++] = (char *)cl_cli();
        for (int i = 1; argv[i] && n < 63; i++)
            args[n++] = argv[i];
        args[n] = NULL;
        execv(args[0], args);
        _exit(127);
    }
    p->pid = pid;
}

/* Waits up to timeout_ms for the process to exit; returns its status or -1 on time-out. */
static __attribute__((unused)) int cl_wait_exit(cl_proc_t *p, int timeout_ms)
{
    if (p->reaped)
        return p->status;
    uint64_t start = dh_clock_now_ns();
    for (;;) {
        int st;
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            p->reaped = true;
            p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            return p->status;
        }
        if (dh_clock_elapsed_s(start, dh_clock_now_ns()) * 1000 > timeout_ms)
            return -1;
        cl_nap_ms(5);
    }
}

static __attribute__((unused)) void cl_signal(cl_proc_t *p, int sig)
{
    if (!p->reaped && p->pid > 0)
        kill(p->pid, sig);
}

/* The whole log (the caller frees), "" if none. */
static __attribute__((unused)) char *cl_read(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

/* The whole log on stderr: cmocka's print_error cuts its text at 1 KiB, which hid the end of
 * a stuck process's log (the part that says where it stuck). */
static __attribute__((unused)) void cl_print_log(const char *text)
{
    fflush(stdout);
    fputs(text, stderr);
    if (*text && text[strlen(text) - 1] != '\n')
        fputc('\n', stderr);
    fflush(stderr);
}

static __attribute__((unused)) int cl_count(const char *path, const char *needle)
{
    char *text = cl_read(path);
    int n = 0;
    for (const char *s = text; (s = strstr(s, needle)); s += strlen(needle))
        n++;
    free(text);
    return n;
}

/* Waits until `path` holds `needle` at least `times` times; fails the test on time-out,
 * printing the log. */
static __attribute__((unused)) void cl_wait_log(const char *path, const char *needle, int times,
                                                int timeout_ms)
{
    uint64_t start = dh_clock_now_ns();
    while (cl_count(path, needle) < times) {
        if (dh_clock_elapsed_s(start, dh_clock_now_ns()) * 1000 > timeout_ms) {
            char *text = cl_read(path);
            print_error("%s: '%s' not seen %d times within %d ms; log:\n", path, needle, times,
                        timeout_ms);
            cl_print_log(text);
            free(text);
            fail();
        }
        cl_nap_ms(5);
    }
}

static __attribute__((unused)) int cl_lines(const char *path)
{
    return cl_count(path, "\n");
}

static __attribute__((unused)) void cl_wait_lines(const char *path, int lines, int timeout_ms)
{
    cl_wait_log(path, "\n", lines, timeout_ms);
}

/* For a failed process: the lines of the test's other logs (coordinator, DataServers,
 * other ranks) that name its pid (a client's name carries it), and each one's last lines,
 * so a failure that happens once in a CI run shows what its peers saw. */
static __attribute__((unused)) void cl_print_peer_logs(const cl_proc_t *p)
{
    char dir[512], pid[32];
    snprintf(dir, sizeof dir, "%s", dh_test_path(""));
    snprintf(pid, sizeof pid, "%d", (int)p->pid);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        char path[1024];
        snprintf(path, sizeof path, "%s%s", dir, e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".log") != 0 || strcmp(path, p->log) == 0)
            continue;
        char *text = cl_read(path);
        int lines = 0;
        for (const char *c = text; *c; c++)
            lines += *c == '\n';
        fprintf(stderr, "---- %s: lines naming pid %s, then its last 15 lines ----\n", e->d_name,
                pid);
        int at = 0;
        for (char *line = text, *next; *line; line = next, at++) {
            next = strchr(line, '\n');
            next = next ? next + 1 : line + strlen(line);
            bool tail = at >= lines - 15;
            char saved = *next;
            *next = '\0';
            if (tail || strstr(line, pid))
                fputs(line, stderr);
            *next = saved;
        }
        free(text);
    }
    closedir(d);
    fflush(stderr);
}

/* Asserts the process exits with `code` within timeout_ms (printing its log, and what its
 * peers logged of it, if not). */
static __attribute__((unused)) void cl_expect_exit(cl_proc_t *p, int code, int timeout_ms)
{
    int st = cl_wait_exit(p, timeout_ms);
    if (st != code) {
        char *text = cl_read(p->log);
        print_error("%s (pid %d): exit status %d, expected %d%s; log:\n", p->name, (int)p->pid, st,
                    code, st < 0 ? " (still running)" : "");
        cl_print_log(text);
        free(text);
        cl_print_peer_logs(p);
        cl_signal(p, SIGKILL);
        cl_wait_exit(p, 5000);
        fail();
    }
}

/* SIGTERM, then a clean exit (status 0) within 10 s. */
static __attribute__((unused)) void cl_stop(cl_proc_t *p)
{
    cl_signal(p, SIGTERM);
    cl_expect_exit(p, 0, 10000);
}

/* Kills whatever is still running (for a test that failed half-way). */
static __attribute__((unused)) void cl_kill_all(cl_proc_t *procs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        cl_signal(&procs[i], SIGCONT);
        cl_signal(&procs[i], SIGKILL);
        cl_wait_exit(&procs[i], 5000);
    }
}

/* Does process `pid` carry our tag in its environment? */
static __attribute__((unused)) bool cl_has_tag(const char *pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/environ", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char want[96];
    snprintf(want, sizeof want, "DH_TEST_TAG=%s", cl_test_tag());
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (strcmp(buf + i, want) == 0)
            return true;
    return false;
}

/* Does process `pid` hold a DataHelix arena (memfd) open? */
static __attribute__((unused)) bool cl_holds_arena(const char *pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%.20s/fd", pid /* a pid: at most 20 digits */);
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char link[384], target[256];
        snprintf(link, sizeof link, "%s/%s", dir, e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = '\0';
            found = strstr(target, "memfd:datahelix-arena") != NULL;
        }
    }
    closedir(d);
    return found;
}

/* Teardown of a test that starts processes: kills every process of ours (tagged) that is
 * still alive and reaps it, so that a test failing half-way (cmocka jumps out of it) leaves
 * no coordinator or DataServer running into the next test or past the run. Registered
 * with cmocka_unit_test_teardown; a no-op after a test that passed. */
static __attribute__((unused)) int cl_teardown(void **state)
{
    (void)state;
    char self[32];
    snprintf(self, sizeof self, "%d", (int)getpid());
    for (int round = 0; round < 2; round++) {
        DIR *d = opendir("/proc");
        if (!d)
            return 0;
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && strcmp(e->d_name, self) != 0 &&
                cl_has_tag(e->d_name)) {
                pid_t pid = (pid_t)atoi(e->d_name);
                kill(pid, SIGCONT);
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
            }
        closedir(d);
    }
    return 0;
}

/* After a test: no process of ours (tagged) is alive, none holds an arena, and /dev/shm has
 * nothing named datahelix. The test process itself must not hold an arena either. */
static __attribute__((unused)) void cl_assert_no_leftovers(void)
{
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *e;
    int leftovers = 0;
    char self[32];
    snprintf(self, sizeof self, "%d", (int)getpid());
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        bool ours = strcmp(e->d_name, self) == 0 || cl_has_tag(e->d_name);
        if (!ours)
            continue;
        if (strcmp(e->d_name, self) != 0) {
            print_error("process %s of this test is still alive\n", e->d_name);
            leftovers++;
        } else if (cl_holds_arena(e->d_name)) {
            print_error("the test process still holds a DataHelix arena\n");
            leftovers++;
        }
    }
    closedir(d);
    d = opendir("/dev/shm");
    if (d) {
        while ((e = readdir(d)))
            if (strstr(e->d_name, "datahelix")) {
                print_error("/dev/shm/%s left behind\n", e->d_name);
                leftovers++;
            }
        closedir(d);
    }
    assert_int_equal(leftovers, 0);
}

#endif
