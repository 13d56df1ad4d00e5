/* pyworker.c: the "python" pipeline (docs/datasets.md, "Your own Dataset"). Each DataServer
 * worker thread drives one Python worker process (`python -m datahelix._worker`), as each of
 * torch's DataLoader workers is a process: real parallelism for Python code.
 *
 * The two talk over an AF_UNIX SOCK_SEQPACKET socket pair (the child's end is its fd 3) in
 * small JSON messages; array bytes never cross it:
 *   -> init   {dataset, worker_id, num_workers, seed}        <- ready | fatal {error}
 *   -> task   {samples: [{id, uri, seed}]}                       <- alloc {tensors: [{name,
 *             dtype, shape}], samples: [{tokens, cpu_s, error}]}
 *   -> write  {tensors: [{in: "arena"|"scratch", offset}], fds, scratch_bytes}
 *                                                            <- done [{samples}] | error {error}
 * (a dataset that loads straight into its slabs, sample_spec + load_into, reports its samples'
 * results with done: they are known only once the bytes are written).
 * Between alloc and write this thread takes the output buffers from the caller's allocator
 * (arena slabs for a local target): the process collates each array straight into its slab
 * through its own mapping of the arena memfd (passed once, SCM_RIGHTS), so a sample's bytes are
 * copied once, from the dataset's arrays into shared memory. Outputs the allocator gives as
 * heap memory (a sidecar's, or a spill) go through this worker's scratch memfd and are copied
 * here.
 *
 * A process that dies (a crash, kill -9) is seen as the socket's end of file: it is reaped,
 * a new one started, and the task run again from the start, once; its samples are not lost
 * and, the first run having delivered nothing, not duplicated. A second death fails the
 * task's samples, naming them and how the process ended. A dataset that cannot be loaded
 * (init answered "fatal") fails every task with the traceback, without restarting.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/log.h"
#include "runtime/pyworker.h"

extern char **environ;

#define WORKER_FD 3                 /* the child's end of the socket pair */
#define MSG_CAP ((size_t)256 << 10) /* the largest message the child sends (it trims to fit) */
#define MAX_BYTES ((uint64_t)1 << 40)

struct dh__py_worker {
    dh__rt_pipeline_t spec;
    uint32_t index, n;
    int arena_fd; /* not owned */
    const atomic_int *stop;
    pid_t pid; /* 0 = no process */
    int sock;  /* -1 = none */
    bool ready, arena_sent, scratch_sent;
    char *fatal; /* the dataset cannot be loaded: every task fails with this */
    int scratch_fd;
    uint8_t *scratch;
    size_t scratch_len;
    char *buf; /* MSG_CAP + 1 */
};

/* The process went away (end of file, a reset or a broken pipe): the caller restarts it. */
#define DIED 1
/* The batch as a whole cannot be carried (its samples failed, in the result): the process,
 * waiting for its buffers, is told to skip it. */
#define BATCH_FAILED 2

int dh__py_worker_new(dh__py_worker_t **out, const dh__rt_pipeline_t *pipeline)
{
    dh__py_worker_t *w = dh_calloc(1, sizeof *w);
    if (!w || !(w->buf = dh_malloc(MSG_CAP + 1))) {
        dh_free(w);
        return dh__set_error(DH_ENOMEM, "out of memory for a Python worker");
    }
    dh__json_use_allocator();
    w->spec = *pipeline;
    w->n = 1;
    w->arena_fd = -1;
    w->sock = -1;
    w->scratch_fd = -1;
    *out = w;
    return 0;
}

static const char *python_exe(const dh__py_worker_t *w)
{
    if (w->spec.py_exe[0])
        return w->spec.py_exe;
    const char *env = getenv("DH_PYTHON_EXE");
    return env && env[0] ? env : "python3";
}

/* The child's environment: ours, with PYTHONPATH prefixed by the pipeline's path and the
 * socket's fd named. Returns a dh_malloc'd NULL-terminated array (strings inside it too). */
static char **child_env(const dh__py_worker_t *w)
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
    size_t len = strlen(w->spec.py_path) + (old_path ? strlen(old_path) : 0) + 16;
    char *pp = dh_malloc(len);
    char *fd = dh_malloc(32);
    if (!pp || !fd) {
        dh_free(pp);
        dh_free(fd);
        dh_free(env);
        return NULL;
    }
    snprintf(pp, len, "PYTHONPATH=%s%s%s", w->spec.py_path,
             w->spec.py_path[0] && old_path && old_path[0] ? ":" : "", old_path ? old_path : "");
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

static int send_json(dh__py_worker_t *w, json_t *msg, const int *fds, int nfds)
{
    char *text = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    if (!text)
        return dh__set_error(DH_ENOMEM, "out of memory for a message to a Python worker");
    struct iovec iov = {text, strlen(text)};
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        memset(&control, 0, sizeof control);
        mh.msg_control = control.buf;
        mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
    }
    ssize_t sent;
    do
        sent = sendmsg(w->sock, &mh, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    int e = errno;
    dh_free(text); /* jansson allocates with dh_malloc (dh__json_use_allocator) */
    if (sent >= 0)
        return 0;
    if (e == EPIPE || e == ECONNRESET)
        return DIED;
    return dh__set_error(-e, "Python worker %u (pid %d): send: %s", w->index, (int)w->pid,
                         strerror(e));
}

/* The next message, parsed; waits (checking `stop` every 100 ms). */
static int recv_json(dh__py_worker_t *w, json_t **out)
{
    *out = NULL;
    for (;;) {
        struct pollfd p = {.fd = w->sock, .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (r < 0 && errno != EINTR)
            return dh__set_error(-errno, "Python worker %u: poll: %s", w->index, strerror(errno));
        if (r <= 0) {
            if (w->stop && atomic_load(w->stop))
                return dh__set_error(DH_EAGAIN, "Python worker %u: the DataServer is stopping",
                                     w->index);
            continue;
        }
        ssize_t got = recv(w->sock, w->buf, MSG_CAP + 1, MSG_TRUNC);
        if (got < 0 && errno == EINTR)
            continue;
        if (got == 0 || (got < 0 && errno == ECONNRESET))
            return DIED;
        if (got < 0)
            return dh__set_error(-errno, "Python worker %u: recv: %s", w->index, strerror(errno));
        if ((size_t)got > MSG_CAP)
            return dh__set_error(DH_EPARSE,
                                 "Python worker %u (pid %d): a message of %zd bytes (the limit "
                                 "is %zu)",
                                 w->index, (int)w->pid, got, MSG_CAP);
        w->buf[got] = '\0';
        return dh__py_msg_parse(w->buf, (size_t)got, w->index, (int)w->pid, out);
    }
}

int dh__py_msg_parse(const char *buf, size_t len, uint32_t index, int pid, json_t **out)
{
    *out = NULL;
    dh__json_use_allocator();
    json_error_t jerr;
    json_t *msg = json_loadb(buf, len, 0, &jerr);
    if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "op"))) {
        json_decref(msg);
        return dh__set_error(DH_EPARSE, "Python worker %u (pid %d): malformed message: %s", index,
                             pid, msg ? "not an object with a string \"op\"" : jerr.text);
    }
    *out = msg;
    return 0;
}

static const char *op_of(json_t *msg)
{
    return json_string_value(json_object_get(msg, "op"));
}

/* How the process ended, for messages: "killed by signal 9", "exited with status 1". Reaps
 * it (SIGKILL after 0.5 s if it is still running) and closes the socket. */
static void reap(dh__py_worker_t *w, char *how, size_t cap)
{
    snprintf(how, cap, "ended");
    if (w->sock >= 0)
        close(w->sock);
    w->sock = -1;
    if (w->pid > 0) {
        int status = 0;
        pid_t r = 0;
        for (int i = 0; i < 50 && (r = waitpid(w->pid, &status, WNOHANG)) == 0; i++) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        if (r == 0) {
            kill(w->pid, SIGKILL);
            r = waitpid(w->pid, &status, 0);
        }
        if (r == w->pid && WIFSIGNALED(status))
            snprintf(how, cap, "killed by signal %d", WTERMSIG(status));
        else if (r == w->pid && WIFEXITED(status))
            snprintf(how, cap, "exited with status %d", WEXITSTATUS(status));
    }
    w->pid = 0;
    w->ready = false;
    w->arena_sent = false;
    w->scratch_sent = false;
}

static int start(dh__py_worker_t *w)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return dh__set_error(-errno, "Python worker %u: socketpair: %s", w->index, strerror(errno));
    int child = sv[1];
    if (child == WORKER_FD) { /* dup2 onto itself would keep FD_CLOEXEC */
        child = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
        close(sv[1]);
        if (child < 0) {
            close(sv[0]);
            return dh__set_error(-errno, "Python worker %u: fcntl: %s", w->index, strerror(errno));
        }
    }
    char **env = child_env(w);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, child, WORKER_FD);
    const char *exe = python_exe(w);
    char *argv[] = {(char *)exe, "-m", "datahelix._worker", NULL};
    pid_t pid = 0;
    int e = env ? posix_spawnp(&pid, exe, &fa, NULL, argv, env) : ENOMEM;
    posix_spawn_file_actions_destroy(&fa);
    free_env(env);
    close(child);
    if (e) {
        close(sv[0]);
        return dh__set_error(-e,
                             "cannot start the Python worker process '%s -m datahelix._worker': %s",
                             exe, strerror(e));
    }
    w->pid = pid;
    w->sock = sv[0];
    json_t *init = json_pack("{s:s,s:s,s:I,s:I,s:I}", "op", "init", "dataset", w->spec.py_dataset,
                             "worker_id", (json_int_t)w->index, "num_workers", (json_int_t)w->n,
                             "seed", (json_int_t)((w->spec.py_seed + w->index) & INT64_MAX));
    if (!init)
        return dh__set_error(DH_ENOMEM, "out of memory for a message to a Python worker");
    int rc = send_json(w, init, NULL, 0);
    return rc < 0 ? rc : 0; /* a death is found by the first recv */
}

void dh__py_worker_bind(dh__py_worker_t *w, uint32_t index, uint32_t n, int arena_fd,
                        const atomic_int *stop)
{
    w->index = index;
    w->n = n ? n : 1;
    w->arena_fd = arena_fd;
    w->stop = stop;
    if (!w->pid && start(w))
        dh_log_warn("Python worker %u: %s (tried again at the first task)", index, dh_last_error());
}

/* Waits for the process's answer to init. 0 ready, DIED, or a code (w->fatal set when the
 * dataset cannot be loaded). */
static int ensure_ready(dh__py_worker_t *w)
{
    if (w->ready)
        return 0;
    int rc;
    if (!w->pid && (rc = start(w)))
        return rc;
    json_t *msg;
    if ((rc = recv_json(w, &msg)))
        return rc;
    const char *op = op_of(msg);
    if (strcmp(op, "ready") == 0) {
        w->ready = true;
    } else {
        const char *err = json_string_value(json_object_get(msg, "error"));
        char text[8192];
        snprintf(text, sizeof text, "the dataset '%s' cannot be loaded in a worker process: %s",
                 w->spec.py_dataset, err ? err : "(no reason given)");
        dh_free(w->fatal);
        w->fatal = dh_strdup(text);
        dh_log_error("Python worker %u: %s", w->index, text);
        rc = dh__set_error(DH_EDATASET, "%s", text);
    }
    json_decref(msg);
    return rc;
}

static int dtype_of(const char *name)
{
    for (unsigned code = 1; code < 64; code++) {
        const char *n = dh_dtype_name(code);
        if (n && strcmp(n, name) == 0 && dh_dtype_size(code) > 0)
            return (int)code;
    }
    return -1;
}

static int fail_samples(dh__rt_result_t *out, int code, const char *why)
{
    for (uint32_t i = 0; i < out->n_samples; i++) {
        dh_wire_sample_result_t *r = &out->samples[i];
        dh_free(r->error);
        char msg[8192];
        snprintf(msg, sizeof msg, "sample '%s': %s", r->id, why);
        r->status = code;
        r->tokens = 0;
        r->error = dh_strdup(msg);
        if (!r->error)
            return dh__set_error(DH_ENOMEM, "out of memory for an error message");
    }
    out->failed = out->n_samples;
    return 0;
}

/* The per-sample part of an alloc (or done) message into the result. */
int dh__py_take_samples(json_t *list, uint32_t index, dh__rt_result_t *out)
{
    if (!json_is_array(list) || json_array_size(list) != out->n_samples)
        return dh__set_error(DH_EPARSE,
                             "Python worker %u: alloc: %zu sample results for %u samples", index,
                             json_array_size(list), out->n_samples);
    for (uint32_t i = 0; i < out->n_samples; i++) {
        json_t *s = json_array_get(list, i);
        dh_wire_sample_result_t *r = &out->samples[i];
        json_t *tokens = json_object_get(s, "tokens");
        json_t *cpu = json_object_get(s, "cpu_s");
        const char *err = json_string_value(json_object_get(s, "error"));
        r->tokens = json_is_integer(tokens) && json_integer_value(tokens) > 0
                        ? (int64_t)json_integer_value(tokens)
                        : 0;
        out->sample_cpu_s[i] =
            json_is_number(cpu) && json_number_value(cpu) > 0 ? json_number_value(cpu) : 0;
        out->cpu_s += out->sample_cpu_s[i];
        if (err) {
            r->status = DH_EDATASET;
            r->tokens = 0;
            if (!(r->error = dh_strdup(err)))
                return dh__set_error(DH_ENOMEM, "out of memory for an error message");
            out->failed++;
        }
    }
    return 0;
}

/* The tensors of an alloc message, shapes checked (no buffers yet). */
static int take_tensors(json_t *list, dh__rt_result_t *out)
{
    if (!json_is_array(list) || json_array_size(list) > DH__RT_MAX_TENSORS)
        return dh__set_error(DH_EDATASET,
                             "the batch has %zu arrays; a batch holds at most %d (the sample "
                             "dict's arrays, masks of padded ones, and one for its other values)",
                             json_array_size(list), DH__RT_MAX_TENSORS);
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t)
    {
        dh_tensor_t *x = &out->tensors[i].tensor;
        memset(&out->tensors[i], 0, sizeof out->tensors[i]);
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        json_t *shape = json_object_get(t, "shape");
        int code = dt ? dtype_of(dt) : -1;
        if (!name || !name[0] || strlen(name) >= DH_TENSOR_NAME_MAX)
            return dh__set_error(DH_EDATASET, "an array's name must be 1 to %d bytes: '%s'",
                                 DH_TENSOR_NAME_MAX - 1, name ? name : "");
        if (code < 0)
            return dh__set_error(DH_EDATASET,
                                 "array '%s': dtype '%s' is not one DataHelix carries (uint8, "
                                 "int8, int16, uint16, int32, uint32, int64, uint64, float16, "
                                 "float32, float64, bool)",
                                 name, dt ? dt : "?");
        if (!json_is_array(shape) || json_array_size(shape) > DH_TENSOR_MAX_DIMS)
            return dh__set_error(DH_EDATASET, "array '%s': a shape of at most %d dimensions", name,
                                 DH_TENSOR_MAX_DIMS);
        dh_tensor_set_name(x, name);
        x->dtype = (dh_dtype_t)code;
        x->ndim = (int32_t)json_array_size(shape);
        uint64_t elems = 1;
        for (int32_t d = 0; d < x->ndim; d++) {
            json_t *v = json_array_get(shape, d);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                (uint64_t)json_integer_value(v) > MAX_BYTES)
                return dh__set_error(DH_EDATASET, "array '%s': dimension %d is not a size", name,
                                     d);
            x->shape[d] = (int64_t)json_integer_value(v);
            elems *= (uint64_t)x->shape[d];
            if (elems > MAX_BYTES)
                return dh__set_error(DH_EDATASET, "array '%s' is over %llu bytes", name,
                                     (unsigned long long)MAX_BYTES);
        }
        dh_tensor_set_contiguous(x);
        out->n_tensors = i + 1;
    }
    return 0;
}

int dh__py_take_alloc(json_t *msg, uint32_t index, dh__rt_result_t *out)
{
    out->cpu_s = 0;
    int rc = dh__py_take_samples(json_object_get(msg, "samples"), index, out);
    if (rc == 0)
        rc = take_tensors(json_object_get(msg, "tensors"), out);
    return rc;
}

static void release_all(dh__rt_result_t *out, dh__rt_free_fn *release, void *ctx)
{
    for (size_t t = 0; t < out->n_tensors; t++)
        if (out->tensors[t].tensor.data)
            release(ctx, out->tensors[t].tensor.data, &out->tensors[t].handle);
    memset(out->tensors, 0, sizeof out->tensors);
    out->n_tensors = 0;
}

static int ensure_scratch(dh__py_worker_t *w, size_t need)
{
    if (need <= w->scratch_len)
        return 0;
    size_t len = need + need / 4;
    if (w->scratch_fd < 0) {
        w->scratch_fd = memfd_create("datahelix-pyworker-scratch", MFD_CLOEXEC);
        if (w->scratch_fd < 0)
            return dh__set_error(-errno, "Python worker %u: memfd_create: %s", w->index,
                                 strerror(errno));
    }
    if (w->scratch)
        munmap(w->scratch, w->scratch_len);
    w->scratch = NULL;
    w->scratch_len = 0;
    if (ftruncate(w->scratch_fd, (off_t)len) != 0)
        return dh__set_error(-errno, "Python worker %u: scratch of %zu bytes: %s", w->index, len,
                             strerror(errno));
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, w->scratch_fd, 0);
    if (p == MAP_FAILED)
        return dh__set_error(-errno, "Python worker %u: mmap of its scratch: %s", w->index,
                             strerror(errno));
    w->scratch = p;
    w->scratch_len = len;
    return 0;
}

/* One run of the task. DIED when the process went away (buffers given back), a code for a
 * failure of this side, else 0 (the samples' own failures are in the result). */
static int run_once(dh__py_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                    dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx,
                    dh__rt_result_t *out)
{
    int rc = ensure_ready(w);
    if (rc)
        return rc;
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, json_pack("{s:s,s:s,s:I}", "id",
                                                  samples[i].id ? samples[i].id : "", "uri",
                                                  samples[i].uri ? samples[i].uri : "", "seed",
                                                  (json_int_t)(samples[i].seed & INT64_MAX))))
            break;
    json_t *task = list && json_array_size(list) == n
                       ? json_pack("{s:s,s:o}", "op", "task", "samples", list)
                       : (json_decref(list), NULL);
    if (!task)
        return dh__set_error(DH_ENOMEM, "out of memory for a task message");
    if ((rc = send_json(w, task, NULL, 0)))
        return rc;
    json_t *msg;
    if ((rc = recv_json(w, &msg)))
        return rc;
    if (strcmp(op_of(msg), "alloc") != 0) {
        rc = dh__set_error(DH_EPARSE, "Python worker %u: expected 'alloc', got '%s'", w->index,
                           op_of(msg));
        json_decref(msg);
        return rc;
    }
    rc = dh__py_take_alloc(msg, w->index, out);
    json_decref(msg);
    if (rc == DH_EDATASET) { /* the batch as a whole is not carried: every sample fails */
        char why[1024];
        snprintf(why, sizeof why, "%s", dh_last_error());
        memset(out->tensors, 0, sizeof out->tensors);
        out->n_tensors = 0;
        rc = fail_samples(out, DH_EDATASET, why);
        return rc ? rc : BATCH_FAILED;
    }
    if (rc)
        return rc;
    /* the buffers: arena slabs (or whatever the allocator gives), in the process's view */
    json_t *where = json_array();
    size_t scratch_need = 0;
    uint64_t bytes = 0;
    for (size_t t = 0; where && t < out->n_tensors && rc == 0; t++) {
        dh__rt_tensor_t *o = &out->tensors[t];
        size_t nb = o->tensor.nbytes;
        json_t *at;
        if (nb == 0) {
            at = json_pack("{s:s,s:I}", "in", "none", "offset", (json_int_t)0);
        } else if ((rc = alloc(ctx, nb, &o->tensor.data, &o->handle))) {
            break;
        } else if (o->handle.arena_id && w->arena_fd >= 0) {
            at = json_pack("{s:s,s:I}", "in", "arena", "offset", (json_int_t)o->handle.offset);
        } else {
            scratch_need = (scratch_need + 63) & ~(size_t)63;
            at = json_pack("{s:s,s:I}", "in", "scratch", "offset", (json_int_t)scratch_need);
            o->handle.offset = scratch_need; /* remembered until the copy below */
            scratch_need += nb;
        }
        bytes += nb;
        if (!at || json_array_append_new(where, at))
            rc = dh__set_error(DH_ENOMEM, "out of memory for a write message");
    }
    if (!where && rc == 0)
        rc = dh__set_error(DH_ENOMEM, "out of memory for a write message");
    if (rc == 0 && scratch_need)
        rc = ensure_scratch(w, scratch_need);
    if (rc) {
        json_decref(where);
        release_all(out, release, ctx);
        return rc;
    }
    int fds[2], nfds = 0;
    json_t *fd_names = json_array();
    if (w->arena_fd >= 0 && !w->arena_sent) {
        fds[nfds++] = w->arena_fd;
        json_array_append_new(fd_names, json_string("arena"));
    }
    if (w->scratch_fd >= 0 && !w->scratch_sent) {
        fds[nfds++] = w->scratch_fd;
        json_array_append_new(fd_names, json_string("scratch"));
    }
    json_t *write = json_pack("{s:s,s:o,s:o,s:I}", "op", "write", "tensors", where, "fds", fd_names,
                              "scratch_bytes", (json_int_t)w->scratch_len);
    if (!write) {
        release_all(out, release, ctx);
        return dh__set_error(DH_ENOMEM, "out of memory for a write message");
    }
    if ((rc = send_json(w, write, fds, nfds)) == 0) {
        w->arena_sent = w->arena_sent || w->arena_fd >= 0;
        w->scratch_sent = w->scratch_sent || w->scratch_fd >= 0;
        rc = recv_json(w, &msg);
    }
    if (rc) {
        release_all(out, release, ctx);
        return rc;
    }
    const char *op = op_of(msg);
    if (strcmp(op, "done") != 0) {
        const char *err = json_string_value(json_object_get(msg, "error"));
        char why[4096];
        snprintf(why, sizeof why, "writing the batch failed in the worker process: %s",
                 err ? err : op);
        json_decref(msg);
        release_all(out, release, ctx);
        return fail_samples(out, DH_EDATASET, why);
    }
    json_t *final = json_object_get(msg, "samples");
    if (final) { /* a dataset that loads into its slabs: the samples' results come now */
        for (uint32_t i = 0; i < out->n_samples; i++) {
            dh_free(out->samples[i].error);
            out->samples[i].error = NULL;
            out->samples[i].status = 0;
        }
        out->failed = 0;
        out->cpu_s = 0;
        rc = dh__py_take_samples(final, w->index, out);
    }
    json_decref(msg);
    if (rc) {
        release_all(out, release, ctx);
        return rc;
    }
    for (size_t t = 0; t < out->n_tensors; t++) {
        dh__rt_tensor_t *o = &out->tensors[t];
        if (o->tensor.nbytes && !(o->handle.arena_id && w->arena_fd >= 0)) {
            memcpy(o->tensor.data, w->scratch + o->handle.offset, o->tensor.nbytes);
            if (!o->handle.arena_id)
                memset(&o->handle, 0, sizeof o->handle);
        }
    }
    /* arrays of no bytes are not carried (nothing to map), as the video pipeline's */
    size_t k = 0;
    for (size_t t = 0; t < out->n_tensors; t++)
        if (out->tensors[t].tensor.nbytes)
            out->tensors[k++] = out->tensors[t];
    out->n_tensors = k;
    out->bytes = bytes;
    return 0;
}

int dh__py_execute(dh__py_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                   dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx, dh__rt_result_t *out)
{
    if (w->fatal)
        return fail_samples(out, DH_EDATASET, w->fatal);
    char how[64] = "";
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = run_once(w, samples, n, alloc, release, ctx, out);
        if (rc == BATCH_FAILED) {
            json_t *skip = json_pack("{s:s,s:o,s:o,s:I}", "op", "write", "tensors", json_array(),
                                     "fds", json_array(), "scratch_bytes", (json_int_t)0);
            json_t *msg = NULL;
            if (skip && send_json(w, skip, NULL, 0) == 0 && recv_json(w, &msg) == 0)
                json_decref(msg);
            return 0;
        }
        if (rc == DH_EDATASET && w->fatal)
            return fail_samples(out, DH_EDATASET, w->fatal);
        if (rc != DIED)
            return rc;
        int pid = (int)w->pid;
        reap(w, how, sizeof how);
        for (uint32_t i = 0; i < out->n_samples; i++) { /* the first run's partial results */
            dh_free(out->samples[i].error);
            out->samples[i].error = NULL;
            out->samples[i].status = 0;
            out->samples[i].tokens = 0;
            out->sample_cpu_s[i] = 0;
        }
        out->failed = 0;
        dh_log_warn("Python worker %u: its process %d %s while running %u samples (the first "
                    "'%s'); %s",
                    w->index, pid, how, n, n ? samples[0].id : "",
                    attempt == 0 ? "started a new one, running them again" : "giving up on them");
    }
    char why[256];
    snprintf(why, sizeof why,
             "the Python worker process running this batch died twice (the last %s); the "
             "dataset's code crashes on it",
             how);
    return fail_samples(out, DH_EDATASET, why);
}

void dh__py_worker_destroy(dh__py_worker_t **pw)
{
    if (!pw || !*pw)
        return;
    dh__py_worker_t *w = *pw;
    char how[64];
    reap(w, how, sizeof how); /* closing the socket tells the process to exit */
    if (w->scratch)
        munmap(w->scratch, w->scratch_len);
    if (w->scratch_fd >= 0)
        close(w->scratch_fd);
    dh_free(w->fatal);
    dh_free(w->buf);
    dh_free(w);
    *pw = NULL;
}
