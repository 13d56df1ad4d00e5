/* servers.h: the real servers of the tests of src/remote (header-only, like
 * tests/runtime/cluster.h): nginx over HTTP and HTTPS with a CA and a server certificate the
 * openssl CLI makes for the test, and fault_server.py (stdlib Python) for the faults. Each
 * listens on loopback; the test waits until its port accepts, never a fixed sleep. The
 * teardown stops both, whatever the test did. */
#ifndef DH_TEST_REMOTE_SERVERS_H
#define DH_TEST_REMOTE_SERVERS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "datahelix/clock.h"
#include "dh_test.h"

extern char **environ;

typedef struct servers {
    char dir[512]; /* scratch: configs, certificates, logs */
    char www[600]; /* what both servers serve */
    char ca[600];  /* the test CA's certificate (PEM) */
    char nginx_log[600];
    char fault_log[600];
    int http_port, https_port, fault_port;
    pid_t nginx, fault;
} servers_t;

static servers_t servers;

static inline void sh(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0)
        print_error("command failed (%d): %s\n", rc, cmd);
    assert_int_equal(rc, 0);
}

static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static inline int port_accepts(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Polls cond until it holds; fails the test after 60 s (a loaded machine starts slowly), or
 * at once when the process pid has exited. */
static inline void wait_for(int (*cond)(int), int arg, pid_t pid, const char *what)
{
    uint64_t t0 = dh_clock_now_ns();
    while (!cond(arg)) {
        int status;
        if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
            print_error("%s exited (status %d) before it was ready\n", what, status);
            fail();
        }
        if (dh_clock_elapsed_s(t0, dh_clock_now_ns()) > 60) {
            print_error("%s not ready after 60 s\n", what);
            fail();
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

static inline pid_t spawn(char *const argv[])
{
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
    if (rc != 0)
        print_error("cannot start %s: %s\n", argv[0], strerror(rc));
    assert_int_equal(rc, 0);
    return pid;
}

static inline void stop(pid_t *pid)
{
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
    }
    *pid = 0;
}

static char port_file[700];
static inline int port_file_written(int unused)
{
    (void)unused;
    return access(port_file, F_OK) == 0;
}

static inline void start_fault_server(void)
{
    const char *py = getenv("DH_PYTHON_EXE") ? getenv("DH_PYTHON_EXE") : "python3";
    snprintf(port_file, sizeof port_file, "%s/fault.port", servers.dir);
    unlink(port_file);
    char script[] = DH_SOURCE_DIR "/tests/remote/fault_server.py";
    char *argv[] = {(char *)py, script, servers.www, port_file, servers.fault_log, NULL};
    servers.fault = spawn(argv);
    wait_for(port_file_written, 0, servers.fault, "fault_server.py");
    FILE *f = fopen(port_file, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%d", &servers.fault_port), 1);
    fclose(f);
    wait_for(port_accepts, servers.fault_port, servers.fault, "fault_server.py's port");
}

/* The CA, and a server certificate for 127.0.0.1 and localhost signed by it. */
static inline void make_certificates(void)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
             "-nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=datahelix-test-ca "
             "2>/dev/null && "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null && "
             "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && "
             "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
             "-out server.crt -days 2 -extfile san.ext 2>/dev/null",
             servers.dir);
    sh(cmd);
    snprintf(servers.ca, sizeof servers.ca, "%s/ca.crt", servers.dir);
}

static inline void start_nginx(void)
{
    make_certificates();
    servers.http_port = free_port();
    servers.https_port = free_port();
    char conf[700], text[8192];
    snprintf(conf, sizeof conf, "%s/nginx.conf", servers.dir);
    snprintf(text, sizeof text,
             "daemon off;\nmaster_process off;\nworker_processes 1;\npid %1$s/nginx.pid;\n"
             "error_log %1$s/error.log;\nevents { worker_connections 64; }\n"
             "http {\n"
             "  log_format conn '$connection $connection_requests $status $http_range';\n"
             "  access_log %2$s conn;\n"
             "  client_body_temp_path %1$s/t1; proxy_temp_path %1$s/t2;\n"
             "  fastcgi_temp_path %1$s/t3; uwsgi_temp_path %1$s/t4; scgi_temp_path %1$s/t5;\n"
             "  keepalive_requests 100000; keepalive_timeout 120s;\n"
             "  types { video/mp4 mp4; application/x-tar tar; }\n"
             "  server { listen 127.0.0.1:%3$d; root %4$s; }\n"
             "  server { listen 127.0.0.1:%5$d ssl; root %4$s;\n"
             "    ssl_certificate %1$s/server.crt; ssl_certificate_key %1$s/server.key; }\n"
             "}\n",
             servers.dir, servers.nginx_log, servers.http_port, servers.www, servers.https_port);
    dh_test_write_file(conf, text);
    char err[700];
    snprintf(err, sizeof err, "%s/error.log", servers.dir);
    char *argv[] = {"nginx", "-p", servers.dir, "-c", conf, "-e", err, NULL};
    servers.nginx = spawn(argv);
    wait_for(port_accepts, servers.http_port, servers.nginx, "nginx (http)");
    wait_for(port_accepts, servers.https_port, servers.nginx, "nginx (https)");
}

static inline int servers_setup(void **state)
{
    (void)state;
    memset(&servers, 0, sizeof servers);
    snprintf(servers.dir, sizeof servers.dir, "%s", dh_test_path("servers"));
    snprintf(servers.www, sizeof servers.www, "%s/www", servers.dir);
    snprintf(servers.nginx_log, sizeof servers.nginx_log, "%s/access.log", servers.dir);
    snprintf(servers.fault_log, sizeof servers.fault_log, "%s/fault.log", servers.dir);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", servers.dir, servers.www);
    sh(cmd);
    return 0;
}

static inline int servers_teardown(void **state)
{
    (void)state;
    stop(&servers.nginx);
    stop(&servers.fault);
    return 0;
}

/* The lines of a log file that contain `needle` (NULL: all). */
static inline int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += !needle || strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static const char *lines_path;
static int lines_wanted;
static inline int enough_lines(int unused)
{
    (void)unused;
    return count_lines(lines_path, NULL) >= lines_wanted;
}

/* Waits until a log holds n lines: nginx writes a request's line after its response, so a
 * client can be done before the line is there. */
static inline void wait_lines(const char *path, int n)
{
    lines_path = path;
    lines_wanted = n;
    wait_for(enough_lines, 0, 0, path);
}

#endif
