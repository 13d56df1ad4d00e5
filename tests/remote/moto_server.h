/* moto_server.h: moto's S3 server (`python -m moto.server`) on a free loopback port for a
 * test case, with IAM authentication on (it recomputes every request's SigV4 signature and
 * refuses a wrong one), filled by s3_server_setup.py: a bucket `dh-test`, its objects, a user
 * and key (server.key_id, server.secret), and the files a case uploads ("KEY=PATH"). A setup
 * and a teardown for cmocka: start_server / start_server_with(uploads), stop_server.
 * Included by one test file each (static functions). */
#ifndef DH_TEST_MOTO_SERVER_H
#define DH_TEST_MOTO_SERVER_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dh_test.h"

typedef struct {
    pid_t pid;
    char endpoint[64];
    char key_id[128], secret[128];
    char log[1024];
} server_t;

static server_t server;

static inline const char *python(void)
{
    const char *p = getenv("DH_PYTHON_EXE");
    return p && *p ? p : "python3";
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A port the kernel says is free now (another process may take it before moto binds it; the
 * start then fails with moto's message in the log, not a wrong result). */
static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static inline bool port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)port)};
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* Starts argv with stdout and stderr to `log`; the child is killed if this process dies
 * (a crashed test leaves no server behind). */
static inline pid_t spawn(char *const argv[], const char *log)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(127);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static inline void print_log(void)
{
    FILE *f = fopen(server.log, "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f))
        fprintf(stderr, "  | %s", line);
    if (f)
        fclose(f);
}

static inline int stop_server(void **state);

/* Starts moto on a free port and fills it (s3_server_setup.py). A failure stops the server
 * here: cmocka runs no teardown after a failed setup. */
static inline int start_server_with(const char *const *uploads)
{
    memset(&server, 0, sizeof(server));
    int port = free_port();
    snprintf(server.endpoint, sizeof(server.endpoint), "http://127.0.0.1:%d", port);
    snprintf(server.log, sizeof(server.log), "%s", dh_test_path("moto.log"));
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    char *argv[] = {(char *)python(), "-m", "moto.server", "-H", "127.0.0.1", "-p", port_s, NULL};
    server.pid = spawn(argv, server.log);
    /* Wait for the port (moto imports for a few seconds), or for the process to die. */
    double deadline = now_s() + 120;
    while (!port_open(port)) {
        int status;
        if (waitpid(server.pid, &status, WNOHANG) == server.pid) {
            server.pid = 0;
            print_log();
            fail_msg("moto exited before listening on %d (is moto[server] installed in %s?)", port,
                     python());
        }
        if (now_s() > deadline) {
            print_log();
            fail_msg("moto did not listen on port %d within 120 s", port);
        }
        usleep(50 * 1000);
    }
    char out[1024];
    snprintf(out, sizeof(out), "%s", dh_test_path("s3-key"));
    char *setup[40] = {(char *)python(), DH_SOURCE_DIR "/tests/remote/s3_server_setup.py",
                       server.endpoint, out};
    for (int i = 0; uploads && uploads[i] && i < 35; i++)
        setup[4 + i] = (char *)uploads[i];
    int status = 0;
    pid_t p = spawn(setup, server.log);
    assert_int_equal(waitpid(p, &status, 0), p);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        print_log();
        stop_server(NULL);
        fail_msg("s3_server_setup.py failed (status %d)", status);
    }
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%127s %127s", server.key_id, server.secret), 2);
    fclose(f);
    return 0;
}

static inline int stop_server(void **state)
{
    (void)state;
    if (server.pid <= 0)
        return 0;
    kill(server.pid, SIGTERM);
    double deadline = now_s() + 20;
    int status;
    while (waitpid(server.pid, &status, WNOHANG) == 0) {
        if (now_s() > deadline) {
            kill(server.pid, SIGKILL);
            waitpid(server.pid, &status, 0);
            break;
        }
        usleep(20 * 1000);
    }
    server.pid = 0;
    return 0;
}

static inline int start_server(void **state)
{
    (void)state;
    return start_server_with(NULL);
}

#endif
