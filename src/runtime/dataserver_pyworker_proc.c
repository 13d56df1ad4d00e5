/* dataserver_pyworker_proc.c: the life of one Python worker process of the python pipeline
 * (dataserver_pyworker.c drives it): spawning `python -m datahelix._worker` with its end of a
 * socket pair as fd 3 and the pipeline's directories on its PYTHONPATH, and ending it: reaped when
 * it exits, killed (SIGKILL) when it does not or when the caller gives up on it (a call of the
 * user's code past sample_timeout), with how it ended for messages.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "runtime/dataserver_pyworker.h"

extern char **environ;

#define WORKER_FD 3 /* the child's end of the socket pair */

static const char *python_exe(const char *exe)
{
    if (exe && exe[0])
        return exe;
    const char *env = getenv("DH_PYTHON_EXE");
    return env && env[0] ? env : "python3";
}

/* The child's environment: ours, with PYTHONPATH prefixed by the pipeline's path and the
 * socket's fd named. Returns a dh_malloc'd NULL-terminated array (strings inside it too). */
static char **child_env(const char *py_path)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = dh_calloc(n + 3, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    const char *old_path = NULL;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "PYTHONPATH=", 11) == 0) {
            old_path = environ[i] + 11;
            continue;
        }
        if (strncmp(environ[i], "DATAHELIX_WORKER_FD=", 20) == 0)
            continue;
        env[k++] = environ[i];
    }
    size_t len = strlen(py_path) + (old_path ? strlen(old_path) : 0) + 16;
    char *pp = dh_malloc(len);
    char *fd = dh_malloc(32);
    if (!pp || !fd) {
        dh_free(pp);
        dh_free(fd);
        dh_free(env);
        return NULL;
    }
    snprintf(pp, len, "PYTHONPATH=%s%s%s", py_path,
             py_path[0] && old_path && old_path[0] ? ":" : "", old_path ? old_path : "");
    snprintf(fd, 32, "DATAHELIX_WORKER_FD=%d", WORKER_FD);
    env[k++] = pp;
    env[k++] = fd;
    env[k] = NULL;
    return env;
}

static void free_env(char **env)
{
    if (!env)
        return;
    size_t k = 0;
    while (env[k])
        k++;
    dh_free(env[k - 1]); /* the two strings made by child_env, last */
    dh_free(env[k - 2]);
    dh_free(env);
}

int dh__py_proc_spawn(const char *exe, const char *py_path, uint32_t index, pid_t *pid, int *sock)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return dh__set_error(-errno, "Python worker %u: socketpair: %s", index, strerror(errno));
    int child = sv[1];
    if (child == WORKER_FD) { /* dup2 onto itself would keep FD_CLOEXEC */
        child = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
        close(sv[1]);
        if (child < 0) {
            close(sv[0]);
            return dh__set_error(-errno, "Python worker %u: fcntl: %s", index, strerror(errno));
        }
    }
    char **env = child_env(py_path);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, child, WORKER_FD);
    exe = python_exe(exe);
    char *argv[] = {(char *)exe, "-m", "datahelix._worker", NULL};
    int e = !env                          ? ENOMEM
            : DH_FAULT(DH_FAULT_PY_SPAWN) ? EAGAIN /* fork's error at RLIMIT_NPROC */
                                          : posix_spawnp(pid, exe, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free_env(env);
    close(child);
    if (e) {
        close(sv[0]);
        return dh__set_error(-e,
                             "cannot start the Python worker process '%s -m datahelix._worker': %s",
                             exe, strerror(e));
    }
    *sock = sv[0];
    return 0;
}

void dh__py_proc_end(pid_t pid, bool kill_now, char *how, size_t cap)
{
    snprintf(how, cap, "ended");
    if (pid <= 0)
        return;
    if (kill_now)
        kill(pid, SIGKILL);
    int status = 0;
    pid_t r = 0;
    for (int i = 0; i < 50 && (r = waitpid(pid, &status, WNOHANG)) == 0; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (r == 0) {
        kill(pid, SIGKILL);
        r = waitpid(pid, &status, 0);
    }
    if (r == pid && WIFSIGNALED(status))
        snprintf(how, cap, "killed by signal %d", WTERMSIG(status));
    else if (r == pid && WIFEXITED(status))
        snprintf(how, cap, "exited with status %d", WEXITSTATUS(status));
}
