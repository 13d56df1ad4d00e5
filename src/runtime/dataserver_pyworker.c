/* dataserver_pyworker.c: the "python" pipeline (docs/datasets.md, "Your own Dataset"). Each
 * DataServer worker thread drives one Python worker process (`python -m datahelix._worker`), as
 * each of torch's DataLoader workers is a process: real parallelism for Python code.
 *
 * The two talk over an AF_UNIX SOCK_SEQPACKET socket pair (the child's end is its fd 3) in
 * small JSON messages; array bytes never cross it:
 *   -> init   {dataset, worker_id, num_workers, seed}        <- ready | fatal {error}
 *   -> task   {samples: [{id, uri, seed, failed?}], begin}       <- alloc {tensors: [{name,
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
 *
 * sample_timeout (the pipeline's, default 300 s): every answer awaited is due that long after
 * the request, and the process sends <- begin {slot, what, index} as it enters the user's code
 * (__getitem__, sample_spec, load_into: slot k; collate_fn: -1; the dataset's loading and
 * worker_init_fn: -3), which pushes the deadline back: the limit is per call, not per batch.
 * Past it the process is killed (SIGKILL, reaped) and, for a sample's call, that sample fails
 * with a message naming it, the call and the time, and the task runs again in a new process
 * with that sample marked "failed" (not loaded again); for collate_fn, the dataset's loading
 * or worker_init_fn, the batch's samples fail. The slot (this thread) is free for the next
 * task either way. Cost: a message and a wake of this thread per call (a trivial dataset's
 * pass on the shared 2-core machine: 69-72 us a sample before, 78-84 after, in the two
 * quieter of several noisy runs); none with no limit (init's and task's "begin" false).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
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
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "runtime/dataserver_pyworker.h"

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
    /* sample_timeout: the answer awaited is due by deadline_ns (0: no limit), pushed back
     * by each "begin" the process sends as it enters the user's code: the slot of the
     * sample (-1 the batch's collate_fn, -2 none yet, -3 loading the dataset), what it calls
     * and the index. */
    double timeout_s;
    int64_t armed_ns, deadline_ns;
    int slot;
    char what[32], index_text[32];
};

/* The process went away (end of file, a reset or a broken pipe): the caller restarts it. */
#define DIED 1
/* The batch as a whole cannot be carried (its samples failed, in the result): the process,
 * waiting for its buffers, is told to skip it. */
#define BATCH_FAILED 2
/* No answer by the deadline: a call of the user's code ran past sample_timeout. */
#define TIMED_OUT 3
/* Seconds a new process may take to start before it reads its init (at least). */
#define START_S 60.0

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The next answer is due sample_timeout from now (none when it is 0). */
static void arm(dh__py_worker_t *w, int slot)
{
    w->armed_ns = now_ns();
    w->deadline_ns = w->timeout_s > 0 ? w->armed_ns + (int64_t)(w->timeout_s * 1e9) : 0;
    w->slot = slot;
    w->what[0] = '\0';
    w->index_text[0] = '\0';
}

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
    w->timeout_s = pipeline->sample_timeout_s;
    *out = w;
    return 0;
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
        sent =
            DH_FAULT(DH_FAULT_PY_SEND) ? (errno = EPIPE, -1) : sendmsg(w->sock, &mh, MSG_NOSIGNAL);
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

/* The next message, parsed; waits (checking `stop` every 100 ms) until the deadline
 * (TIMED_OUT). A "begin" (the process enters the user's code for a sample) is noted and
 * pushes the deadline back. */
static int recv_json(dh__py_worker_t *w, json_t **out)
{
    *out = NULL;
    for (;;) {
        struct pollfd p = {.fd = w->sock, .events = POLLIN};
        int wait_ms = 100;
        if (w->deadline_ns) {
            int64_t left_ns = w->deadline_ns - now_ns();
            if (left_ns <= 0)
                return TIMED_OUT;
            if (left_ns < 100000000)
                wait_ms = (int)(left_ns / 1000000) + 1;
        }
        int r = poll(&p, 1, wait_ms);
        if (r < 0 && errno != EINTR)
            return dh__set_error(-errno, "Python worker %u: poll: %s", w->index, strerror(errno));
        if (r <= 0) {
            if (w->stop && atomic_load(w->stop))
                return dh__set_error(DH_EAGAIN, "Python worker %u: the DataServer is stopping",
                                     w->index);
            continue;
        }
        ssize_t got = DH_FAULT(DH_FAULT_PY_RECV) ? (errno = ECONNRESET, -1)
                                                 : recv(w->sock, w->buf, MSG_CAP + 1, MSG_TRUNC);
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
        json_t *msg;
        int rc = dh__py_msg_parse(w->buf, (size_t)got, w->index, (int)w->pid, &msg);
        if (rc)
            return rc;
        if (strcmp(json_string_value(json_object_get(msg, "op")), "begin") == 0) {
            json_t *slot = json_object_get(msg, "slot");
            arm(w, json_is_integer(slot) ? (int)json_integer_value(slot) : -2);
            const char *what = json_string_value(json_object_get(msg, "what"));
            const char *index = json_string_value(json_object_get(msg, "index"));
            snprintf(w->what, sizeof w->what, "%s", what ? what : "");
            snprintf(w->index_text, sizeof w->index_text, "%s", index ? index : "");
            json_decref(msg);
            continue;
        }
        *out = msg;
        return 0;
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

/* Ends the process (reaped; SIGKILL first when kill_now, else after 0.5 s if it is still
 * running) and closes the socket; `how` it ended, for messages. */
static void reap(dh__py_worker_t *w, bool kill_now, char *how, size_t cap)
{
    if (w->sock >= 0)
        close(w->sock);
    w->sock = -1;
    dh__py_proc_end(w->pid, kill_now, how, cap);
    w->pid = 0;
    w->ready = false;
    w->arena_sent = false;
    w->scratch_sent = false;
}

static int start(dh__py_worker_t *w)
{
    int rc = dh__py_proc_spawn(w->spec.py_exe, w->spec.py_path, w->index, &w->pid, &w->sock);
    if (rc)
        return rc;
    json_t *init = json_pack(
        "{s:s,s:s,s:I,s:I,s:I,s:b}", "op", "init", "dataset", w->spec.py_dataset, "worker_id",
        (json_int_t)w->index, "num_workers", (json_int_t)w->n, "seed",
        (json_int_t)((w->spec.py_seed + w->index) & INT64_MAX), "begin", w->timeout_s > 0);
    if (!init)
        return dh__set_error(DH_ENOMEM, "out of memory for a message to a Python worker");
    rc = send_json(w, init, NULL, 0);
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
    /* The interpreter's start and its own imports are not the dataset's code: up to
     * START_S (a loaded machine); the process says "begin" (slot -3) when it starts to
     * unpickle or import the dataset, and that and worker_init_fn get sample_timeout. */
    arm(w, -3);
    if (w->deadline_ns && w->timeout_s < START_S)
        w->deadline_ns = w->armed_ns + (int64_t)(START_S * 1e9);
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
        int code = dt ? dh_dtype_from_name(dt) : -1;
        if (!name || !name[0] || strlen(name) >= DH_TENSOR_NAME_MAX)
            return dh__set_error(DH_EDATASET, "an array's name must be 1 to %d bytes: '%s'",
                                 DH_TENSOR_NAME_MAX - 1, name ? name : "");
        if (code < 0) {
            /* ", uint8, int8, ...": the names of DH_DTYPE_MAP (tensor.h) */
#define DH__DTYPE_LIST(name_, code_, str, size, dl_code, dl_bits, fmt) ", " str
            static const char carried[] = DH_DTYPE_MAP(DH__DTYPE_LIST);
#undef DH__DTYPE_LIST
            return dh__set_error(DH_EDATASET,
                                 "array '%s': dtype '%s' is not one DataHelix carries (%s)", name,
                                 dt ? dt : "?", carried + 2);
        }
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

/* One run of the task; the samples with a `failed` message (NULL: none) are not loaded, the
 * process reports them failed with it. DIED when the process went away, TIMED_OUT when it
 * did not answer in time (buffers given back), a code for a failure of this side, else 0 (the
 * samples' own failures are in the result). */
static int run_once(dh__py_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                    char *const *failed, dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx,
                    dh__rt_result_t *out)
{
    int rc = ensure_ready(w);
    if (rc)
        return rc;
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < n; i++) {
        json_t *s = json_pack("{s:s,s:s,s:I}", "id", samples[i].id ? samples[i].id : "", "uri",
                              samples[i].uri ? samples[i].uri : "", "seed",
                              (json_int_t)(samples[i].seed & INT64_MAX));
        if (s && failed && failed[i] && json_object_set_new(s, "failed", json_string(failed[i])))
            json_decref(s), s = NULL;
        if (json_array_append_new(list, s))
            break;
    }
    json_t *task =
        list && json_array_size(list) == n
            ? json_pack("{s:s,s:o,s:b}", "op", "task", "samples", list, "begin", w->timeout_s > 0)
            : (json_decref(list), NULL);
    if (!task)
        return dh__set_error(DH_ENOMEM, "out of memory for a task message");
    if ((rc = send_json(w, task, NULL, 0)))
        return rc;
    json_t *msg;
    arm(w, -2);
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
        arm(w, -2); /* the arrays written; a dataset's load_into says "begin" per sample */
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

/* Fails the samples with no message of their own in `failed` with `why`, the others with
 * theirs. */
static int fail_rest(dh__rt_result_t *out, char *const *failed, const char *why)
{
    int rc = fail_samples(out, DH_EDATASET, why);
    for (uint32_t i = 0; rc == 0 && failed && i < out->n_samples; i++)
        if (failed[i]) {
            dh_free(out->samples[i].error);
            if (!(out->samples[i].error = dh_strdup(failed[i])))
                rc = dh__set_error(DH_ENOMEM, "out of memory for an error message");
        }
    return rc;
}

/* A call of the user's code ran past sample_timeout: the process is killed. A sample's call
 * (slot >= 0, not failed before) fails that sample: its message goes to *failed and 1 is
 * returned (the task is run again without it). Else the batch's samples fail (0). */
static int timed_out(dh__py_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                     char ***failed, dh__rt_result_t *out)
{
    double waited_s = (double)(now_ns() - w->armed_ns) / 1e9;
    int pid = (int)w->pid, slot = w->slot;
    char how[64], text[1024];
    reap(w, true, how, sizeof how);
    const char *tail = "its worker process (pid %d) was killed and a new one takes its place";
    char killed[128];
    snprintf(killed, sizeof killed, tail, pid);
    if (slot >= 0 && (uint32_t)slot < n && !(*failed && (*failed)[slot])) {
        if (!*failed && !(*failed = dh_calloc(n, sizeof **failed)))
            return dh__set_error(DH_ENOMEM, "out of memory for an error message");
        snprintf(text, sizeof text,
                 "sample '%s' (dataset[%s]): %s ran past sample_timeout (%g s): no answer after "
                 "%.1f s; %s",
                 samples[slot].id ? samples[slot].id : "", w->index_text, w->what, w->timeout_s,
                 waited_s, killed);
        if (!((*failed)[slot] = dh_strdup(text)))
            return dh__set_error(DH_ENOMEM, "out of memory for an error message");
        dh_log_warn("Python worker %u: %s%s", w->index, text,
                    n > 1 ? "; the batch's other samples run again" : "");
        return 1;
    }
    if (slot == -3)
        snprintf(text, sizeof text,
                 "loading the dataset in a new worker process (unpickling or importing it, "
                 "worker_init_fn) ran past sample_timeout (%g s): no answer after %.1f s; %s",
                 w->timeout_s, waited_s, killed);
    else
        snprintf(text, sizeof text,
                 "%s ran past sample_timeout (%g s) on the batch of %u samples (the first '%s'): "
                 "no answer after %.1f s; %s",
                 slot == -1 && w->what[0] ? w->what : "the worker process", w->timeout_s, n,
                 n && samples[0].id ? samples[0].id : "", waited_s, killed);
    dh_log_warn("Python worker %u: %s", w->index, text);
    return fail_rest(out, *failed, text);
}

int dh__py_execute(dh__py_worker_t *w, const dh_wire_sample_t *samples, uint32_t n,
                   dh__rt_alloc_fn *alloc, dh__rt_free_fn *release, void *ctx, dh__rt_result_t *out)
{
    if (w->fatal)
        return fail_samples(out, DH_EDATASET, w->fatal);
    char how[64] = "";
    char **failed = NULL; /* per sample: why it is not loaded again (it ran past the limit) */
    int deaths = 0, rc;
    for (;;) {
        rc = run_once(w, samples, n, failed, alloc, release, ctx, out);
        if (rc == BATCH_FAILED) {
            json_t *skip = json_pack("{s:s,s:o,s:o,s:I}", "op", "write", "tensors", json_array(),
                                     "fds", json_array(), "scratch_bytes", (json_int_t)0);
            json_t *msg = NULL;
            arm(w, -2); /* no user code runs now: it only answers */
            if (skip && send_json(w, skip, NULL, 0) == 0 && recv_json(w, &msg) == 0)
                json_decref(msg);
            else
                reap(w, true, how, sizeof how);
            rc = 0;
            break;
        }
        if (rc == DH_EDATASET && w->fatal) {
            rc = fail_rest(out, failed, w->fatal);
            break;
        }
        if (rc != DIED && rc != TIMED_OUT)
            break;
        for (uint32_t i = 0; i < out->n_samples; i++) { /* the last run's partial results */
            dh_free(out->samples[i].error);
            out->samples[i].error = NULL;
            out->samples[i].status = 0;
            out->samples[i].tokens = 0;
            out->sample_cpu_s[i] = 0;
        }
        out->failed = 0;
        if (rc == TIMED_OUT) {
            if ((rc = timed_out(w, samples, n, &failed, out)) == 1)
                continue;
            break;
        }
        int pid = (int)w->pid;
        reap(w, false, how, sizeof how);
        dh_log_warn("Python worker %u: its process %d %s while running %u samples (the first "
                    "'%s'); %s",
                    w->index, pid, how, n, n ? samples[0].id : "",
                    deaths == 0 ? "started a new one, running them again" : "giving up on them");
        if (++deaths == 2) {
            char why[256];
            snprintf(why, sizeof why,
                     "the Python worker process running this batch died twice (the last %s); the "
                     "dataset's code crashes on it",
                     how);
            rc = fail_rest(out, failed, why);
            break;
        }
    }
    for (uint32_t i = 0; failed && i < n; i++)
        dh_free(failed[i]);
    dh_free(failed);
    return rc;
}

void dh__py_worker_destroy(dh__py_worker_t **pw)
{
    if (!pw || !*pw)
        return;
    dh__py_worker_t *w = *pw;
    char how[64];
    reap(w, false, how, sizeof how); /* closing the socket tells the process to exit */
    if (w->scratch)
        munmap(w->scratch, w->scratch_len);
    if (w->scratch_fd >= 0)
        close(w->scratch_fd);
    dh_free(w->fatal);
    dh_free(w->buf);
    dh_free(w);
    *pw = NULL;
}
