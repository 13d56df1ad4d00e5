/* auth.c: CURVE keys and the ZAP handler that admits only listed public keys (wire.h,
 * "Authentication"; docs/security.md).
 *
 * A key directory holds Z85 keys as the files `datahelix keygen -o DIR/NAME` writes:
 *   NAME.pub     the public key (40 Z85 characters and a newline), shareable
 *   NAME.secret  the secret key (same form), mode 0600: a group- or world-readable one is
 *                refused, as ssh refuses such a private key
 * Every socket that binds a tcp:// endpoint is a CURVE server with the job's server key
 * (server.secret); every socket that connects to one is a CURVE client that knows the server's
 * public key (server.pub) and authenticates with its identity key (NAME.secret, default
 * "server"). A binding socket's context runs a ZAP handler (one thread per context) that
 * admits a client only when its public key is one of the directory's *.pub files, and logs a
 * refusal with the key and the peer's address. ipc:// and inproc:// stay plaintext: they do not
 * leave the machine (the memfd side channel checks the peer's uid instead).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "datahelix/wire.h"
#include "core/internal.h"
#include "wire/internal.h"

#define Z85_KEY_LEN 40
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

struct dh_wire_keys {
    char dir[1024];
    char server_public[Z85_KEY_LEN + 1];
    char server_secret[Z85_KEY_LEN + 1]; /* "" when server.secret is absent */
    char identity_name[256];
    char identity_public[Z85_KEY_LEN + 1];
    char identity_secret[Z85_KEY_LEN + 1];
    char (*admitted)[Z85_KEY_LEN + 1]; /* Z85 public keys of every *.pub */
    char (*admitted_names)[256];       /* their file names, for the log */
    size_t n_admitted;
};

static int is_z85_key(const char *s)
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";
    if (strlen(s) != Z85_KEY_LEN)
        return 0;
    for (size_t i = 0; i < Z85_KEY_LEN; i++)
        if (!strchr(alphabet, s[i]))
            return 0;
    uint8_t raw[32];
    return zmq_z85_decode(raw, s) != NULL;
}

/* Reads one Z85 key from path into out (41 bytes). A secret file must be private to its
 * owner. Returns 0, -ENOENT, DH_EACCES (a readable secret), DH_EPARSE, or -errno. */
static int read_key(const char *path, char out[Z85_KEY_LEN + 1], int secret)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return dh__set_error(-e, "%s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dh__set_error(DH_EINVAL, "%s: not a regular file", path);
    }
    if (secret && (st.st_mode & 077)) {
        close(fd);
        return dh__set_error(DH_EACCES,
                             "%s: a secret key readable by group or others (mode %03o) is "
                             "refused; run chmod 600 '%s'",
                             path, (unsigned)(st.st_mode & 0777), path);
    }
    char buf[128];
    ssize_t n =
        DH_FAULT(DH_FAULT_WIRE_KEY_READ) ? (errno = EIO, -1) : read(fd, buf, sizeof buf - 1);
    int e = errno;
    close(fd);
    if (n < 0)
        return dh__set_error(-e, "%s: read: %s", path, strerror(e));
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    if (!is_z85_key(buf))
        return dh__set_error(DH_EPARSE,
                             "%s: not a CURVE %s key (40 Z85 characters, as `datahelix keygen` "
                             "writes)",
                             path, secret ? "secret" : "public");
    memcpy(out, buf, Z85_KEY_LEN + 1);
    return 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n > m && strcmp(s + n - m, suffix) == 0;
}

int dh_wire_keys_load(dh_wire_keys_t **out, const char *dir, const char *identity)
{
    *out = NULL;
    if (!zmq_has("curve"))
        return dh__set_error(DH_EINVAL, "keys '%s': this libzmq was built without CURVE", dir);
    if (!identity || !identity[0])
        identity = "server";
    if (strchr(identity, '/') || strlen(identity) >= 200)
        return dh__set_error(DH_EINVAL, "key name '%s': a file name in the key directory",
                             identity);
    dh_wire_keys_t *k = dh_calloc(1, sizeof *k);
    if (!k)
        return dh__set_error(DH_ENOMEM, "out of memory for keys");
    snprintf(k->dir, sizeof k->dir, "%s", dir);
    snprintf(k->identity_name, sizeof k->identity_name, "%s", identity);
    char path[1400];
    int rc = 0;
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        rc = dh__set_error(-e, "key directory '%s': %s", dir, strerror(e));
        goto fail;
    }
    size_t cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.' || !ends_with(ent->d_name, ".pub"))
            continue;
        if (k->n_admitted == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            void *a = dh_realloc(k->admitted, ncap * sizeof *k->admitted);
            if (a)
                k->admitted = a;
            void *b = a ? dh_realloc(k->admitted_names, ncap * sizeof *k->admitted_names) : NULL;
            if (!a || !b) {
                closedir(d);
                rc = dh__set_error(DH_ENOMEM, "out of memory for keys");
                goto fail;
            }
            k->admitted_names = b;
            cap = ncap;
        }
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if ((rc = read_key(path, k->admitted[k->n_admitted], 0))) {
            closedir(d);
            goto fail;
        }
        snprintf(k->admitted_names[k->n_admitted], sizeof k->admitted_names[0], "%s", ent->d_name);
        k->n_admitted++;
    }
    closedir(d);
    snprintf(path, sizeof path, "%s/server.pub", dir);
    if ((rc = read_key(path, k->server_public, 0))) {
        if (rc == -ENOENT)
            dh__set_error(rc,
                          "key directory '%s' has no server.pub (the job's server key: "
                          "`datahelix keygen -o %s/server`)",
                          dir, dir);
        goto fail;
    }
    snprintf(path, sizeof path, "%s/server.secret", dir);
    rc = read_key(path, k->server_secret, 1);
    if (rc == -ENOENT)
        k->server_secret[0] = '\0';
    else if (rc)
        goto fail;
    snprintf(path, sizeof path, "%s/%s.secret", dir, identity);
    if ((rc = read_key(path, k->identity_secret, 1))) {
        if (rc == -ENOENT)
            dh__set_error(rc,
                          "key directory '%s' has no %s.secret (this process's key: "
                          "`datahelix keygen -o %s/%s`, or name another with --key / "
                          "DATAHELIX_KEY)",
                          dir, identity, dir, identity);
        goto fail;
    }
    if (zmq_curve_public(k->identity_public, k->identity_secret) != 0) {
        rc = dh__set_error(DH_EPARSE, "%s: not a CURVE secret key", path);
        goto fail;
    }
    *out = k;
    return 0;
fail:
    dh_wire_keys_destroy(&k);
    return rc;
}

void dh_wire_keys_destroy(dh_wire_keys_t **k)
{
    if (!k || !*k)
        return;
    dh_free((*k)->admitted);
    dh_free((*k)->admitted_names);
    dh_free(*k);
    *k = NULL;
}

const char *dh_wire_keys_dir(const dh_wire_keys_t *k)
{
    return k->dir;
}

const char *dh_wire_keys_name(const dh_wire_keys_t *k)
{
    return k->identity_name;
}

const char *dh_wire_keys_public(const dh_wire_keys_t *k)
{
    return k->identity_public;
}

/* Writes text to path (created exclusively, with mode). Returns 0 or -errno with a message. */
static int write_new_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        int e = errno;
        if (e == EEXIST)
            return dh__set_error(-e, "%s exists; remove it first (keys are never overwritten)",
                                 path);
        return dh__set_error(-e, "%s: %s", path, strerror(e));
    }
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    int e = errno;
    if (n != (ssize_t)len || fsync(fd) != 0) {
        e = n < 0 ? e : EIO;
        close(fd);
        unlink(path);
        return dh__set_error(-e, "%s: %s", path, strerror(e));
    }
    close(fd);
    return 0;
}

int dh_wire_keygen(const char *prefix, char public_out[41])
{
    char pub[Z85_KEY_LEN + 1], sec[Z85_KEY_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0) {
        int e = zmq_errno();
        return dh__set_error(DH_EINVAL, "zmq_curve_keypair: %s", zmq_strerror(e));
    }
    char path[1100], text[64];
    snprintf(path, sizeof path, "%s.secret", prefix);
    snprintf(text, sizeof text, "%s\n", sec);
    int rc = write_new_file(path, text, 0600);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s.pub", prefix);
    snprintf(text, sizeof text, "%s\n", pub);
    if ((rc = write_new_file(path, text, 0644))) {
        snprintf(path, sizeof path, "%s.secret", prefix);
        unlink(path);
        return rc;
    }
    if (public_out)
        memcpy(public_out, pub, sizeof pub);
    return 0;
}

/* ---- CURVE options on a socket (called by zmq.c before bind / connect) ---- */

int dh__wire_keys_apply(const dh_wire_keys_t *k, void *sock, const char *endpoint, int bind)
{
    if (!k || strncmp(endpoint, "tcp://", 6) != 0)
        return 0;
    const char *opt = NULL;
    if (bind) {
        if (!k->server_secret[0])
            return dh__set_error(DH_EAUTH,
                                 "cannot bind %s with CURVE: key directory '%s' has no "
                                 "server.secret (only hosts that run a coordinator or a "
                                 "DataServer need it)",
                                 endpoint, k->dir);
        int on = 1;
        if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &on, sizeof on) != 0)
            opt = "ZMQ_CURVE_SERVER";
        else if (zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->server_secret, Z85_KEY_LEN) != 0)
            opt = "ZMQ_CURVE_SECRETKEY";
        else if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "datahelix", 9) != 0)
            opt = "ZMQ_ZAP_DOMAIN";
    } else {
        if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, k->server_public, Z85_KEY_LEN) != 0)
            opt = "ZMQ_CURVE_SERVERKEY";
        else if (zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k->identity_public, Z85_KEY_LEN) != 0)
            opt = "ZMQ_CURVE_PUBLICKEY";
        else if (zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->identity_secret, Z85_KEY_LEN) != 0)
            opt = "ZMQ_CURVE_SECRETKEY";
    }
    if (opt) {
        int e = zmq_errno();
        return dh__set_error(DH_EAUTH, "%s on %s: %s", opt, endpoint, zmq_strerror(e));
    }
    return 0;
}

/* ---- The ZAP handler (RFC 27) ---- */

struct dh_wire_auth {
    void *ctx;
    const dh_wire_keys_t *keys;
    void *zap;     /* REP bound to ZAP_ENDPOINT, the thread's */
    void *control; /* PAIR: stop requests (this side) */
    void *control_thread;
    char control_endpoint[64];
    pthread_t thread;
    int started;
    uint64_t admitted, refused; /* counted by the thread (atomics) */
};

/* Finds the listed name of a public key, or NULL. */
static const char *admitted_name(const dh_wire_keys_t *k, const char *z85)
{
    for (size_t i = 0; i < k->n_admitted; i++)
        if (strcmp(k->admitted[i], z85) == 0)
            return k->admitted_names[i];
    return NULL;
}

/* Receives one multipart ZAP request into frames (up to 8), returns the count or -1. */
static int recv_request(void *sock, zmq_msg_t *frames, int cap)
{
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t scratch;
        zmq_msg_t *m = n < cap ? &frames[n] : &scratch;
        zmq_msg_init(m);
        /* A signal interrupts a receive (EINTR); the request stays queued, as it would. */
        if ((n == 0 && DH_FAULT(DH_FAULT_WIRE_ZAP_IO) ? (errno = EINTR, -1)
                                                      : zmq_msg_recv(m, sock, 0)) < 0) {
            zmq_msg_close(m);
            for (int i = 0; i < n && i < cap; i++)
                zmq_msg_close(&frames[i]);
            return -1;
        }
        more = zmq_msg_more(m);
        if (m == &scratch)
            zmq_msg_close(m);
        else
            n++;
    }
    return n;
}

static int send_str(void *sock, const void *data, size_t size, int more)
{
    return zmq_send(sock, data, size, more ? ZMQ_SNDMORE : 0);
}

/* Sends a reply's first frame, again when a signal interrupts it (EINTR: nothing was sent,
 * and the REP socket still owes its reply). Returns 0, or -1 (ETERM: the context ends). */
static int send_first(void *sock)
{
    for (;;) {
        int rc = DH_FAULT(DH_FAULT_WIRE_ZAP_IO) ? (errno = EINTR, -1) : send_str(sock, "1.0", 3, 1);
        if (rc >= 0)
            return 0;
        if (zmq_errno() != EINTR)
            return -1;
    }
}

static void answer(dh_wire_auth_t *a, zmq_msg_t *f, int n)
{
    /* Frames: version, request id, domain, address, routing id, mechanism, credentials... */
    const char *status = "400", *text = "malformed ZAP request";
    char address[64] = "?", mechanism[32] = "?", key[Z85_KEY_LEN + 1] = "";
    if (n >= 6) {
        snprintf(address, sizeof address, "%.*s", (int)zmq_msg_size(&f[3]),
                 (const char *)zmq_msg_data(&f[3]));
        snprintf(mechanism, sizeof mechanism, "%.*s", (int)zmq_msg_size(&f[5]),
                 (const char *)zmq_msg_data(&f[5]));
        if (strcmp(mechanism, "CURVE") == 0 && n >= 7 && zmq_msg_size(&f[6]) == 32) {
            zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
            const char *name = admitted_name(a->keys, key);
            if (name) {
                status = "200";
                text = "OK";
                __atomic_fetch_add(&a->admitted, 1, __ATOMIC_RELAXED);
                dh_log_debug("auth: admitted key %s (%s) from %s", key, name, address);
            } else {
                text = "key not listed";
                __atomic_fetch_add(&a->refused, 1, __ATOMIC_RELAXED);
                dh_log_warn("auth: refused CURVE key %s from %s: not in %s/*.pub", key, address,
                            a->keys->dir);
            }
        } else if (strcmp(mechanism, "NULL") == 0) {
            /* Only sockets without CURVE (ipc://, inproc://) ask for NULL: they never leave
             * the machine. */
            status = "200";
            text = "OK";
        } else {
            __atomic_fetch_add(&a->refused, 1, __ATOMIC_RELAXED);
            text = "mechanism not allowed";
            dh_log_warn("auth: refused a %s handshake from %s (CURVE keys required)", mechanism,
                        address);
        }
    }
    if (n >= 2 && send_first(a->zap) == 0) {
        send_str(a->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), 1);
        send_str(a->zap, status, 3, 1);
        send_str(a->zap, text, strlen(text), 1);
        send_str(a->zap, key, strlen(key), 1);
        send_str(a->zap, "", 0, 0);
    }
}

/* The handler's thread. It leaves only when told to (or when the context ends: ETERM), and
 * it never closes the ZAP socket itself (dh_wire_auth_stop does, after the join): without a
 * bound ZAP endpoint, libzmq admits every CURVE client that knows the server key ("Stonehouse":
 * ZMQ_ZAP_ENFORCE_DOMAIN is a draft option), so a handler that gave up on a failed receive
 * would open the door. A bound handler that has stopped answering fails closed: handshakes
 * stall and time out. */
static void *auth_thread(void *arg)
{
    dh_wire_auth_t *a = arg;
    for (;;) {
        zmq_pollitem_t items[2] = {{a->zap, 0, ZMQ_POLLIN, 0},
                                   {a->control_thread, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, -1) < 0) {
            if (zmq_errno() == ETERM)
                break;
            continue; /* EINTR */
        }
        if (items[1].revents & ZMQ_POLLIN)
            break;
        if (items[0].revents & ZMQ_POLLIN) {
            zmq_msg_t frames[8];
            int n = recv_request(a->zap, frames, 8);
            if (n < 0) {
                if (zmq_errno() == ETERM)
                    break;
                dh_log_debug("auth: receiving a ZAP request on %s: %s (again)", ZAP_ENDPOINT,
                             zmq_strerror(zmq_errno()));
                continue; /* EINTR: the request is still queued (or its rest dropped) */
            }
            answer(a, frames, n);
            for (int i = 0; i < n; i++)
                zmq_msg_close(&frames[i]);
        }
    }
    return NULL;
}

int dh_wire_auth_start(dh_wire_auth_t **out, void *zmq_ctx, const dh_wire_keys_t *keys)
{
    *out = NULL;
    dh_wire_auth_t *a = dh_calloc(1, sizeof *a);
    if (!a)
        return dh__set_error(DH_ENOMEM, "out of memory for the ZAP handler");
    a->ctx = zmq_ctx;
    a->keys = keys;
    snprintf(a->control_endpoint, sizeof a->control_endpoint, "inproc://dh-zap-control-%p",
             (void *)a);
    int linger = 0, rc = 0;
    /* A step that fails (fault site DH_FAULT_WIRE_ZAP_START) fails as ZeroMQ or pthreads
     * would: EMFILE for a socket (the context's socket limit), EAGAIN for the thread. */
    a->zap =
        DH_FAULT(DH_FAULT_WIRE_ZAP_START) ? (errno = EMFILE, NULL) : zmq_socket(zmq_ctx, ZMQ_REP);
    a->control = a->zap ? zmq_socket(zmq_ctx, ZMQ_PAIR) : NULL;
    a->control_thread = a->control ? zmq_socket(zmq_ctx, ZMQ_PAIR) : NULL;
    if (!a->zap || !a->control || !a->control_thread) {
        int e = zmq_errno();
        rc = dh__set_error(e == EMFILE ? -EMFILE : DH_ENOMEM, "ZAP handler %s: zmq_socket: %s",
                           ZAP_ENDPOINT, zmq_strerror(e));
        goto fail;
    }
    zmq_setsockopt(a->zap, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(a->control, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(a->control_thread, ZMQ_LINGER, &linger, sizeof linger);
    if ((DH_FAULT(DH_FAULT_WIRE_ZAP_START) ? (errno = ENOMEM, -1)
                                           : zmq_bind(a->zap, ZAP_ENDPOINT)) != 0) {
        int e = zmq_errno();
        rc = dh__set_error(e == EADDRINUSE ? -EADDRINUSE : DH_EIO, "ZAP handler %s: bind: %s%s",
                           ZAP_ENDPOINT, zmq_strerror(e),
                           e == EADDRINUSE ? " (one handler per ZeroMQ context)" : "");
        goto fail;
    }
    if ((DH_FAULT(DH_FAULT_WIRE_ZAP_START)
             ? (errno = ENOMEM, -1)
             : zmq_bind(a->control_thread, a->control_endpoint)) != 0 ||
        zmq_connect(a->control, a->control_endpoint) != 0) {
        rc = dh__set_error(DH_EIO, "ZAP handler %s: control socket %s: %s", ZAP_ENDPOINT,
                           a->control_endpoint, zmq_strerror(zmq_errno()));
        goto fail;
    }
    if ((rc = DH_FAULT(DH_FAULT_WIRE_ZAP_START)
                  ? EAGAIN
                  : pthread_create(&a->thread, NULL, auth_thread, a))) {
        rc = dh__set_error(-rc, "ZAP handler %s: pthread_create: %s", ZAP_ENDPOINT, strerror(rc));
        goto fail;
    }
    a->started = 1;
    *out = a;
    return 0;
fail:
    if (a->zap)
        zmq_close(a->zap);
    if (a->control)
        zmq_close(a->control);
    if (a->control_thread)
        zmq_close(a->control_thread);
    dh_free(a);
    return rc;
}

void dh_wire_auth_stop(dh_wire_auth_t **pa)
{
    if (!pa || !*pa)
        return;
    dh_wire_auth_t *a = *pa;
    if (a->started) {
        zmq_send(a->control, "", 0, 0);
        pthread_join(a->thread, NULL);
    }
    zmq_close(a->zap); /* after the thread: never unbound while the handler runs */
    zmq_close(a->control_thread);
    zmq_close(a->control);
    dh_free(a);
    *pa = NULL;
}

uint64_t dh_wire_auth_refused(const dh_wire_auth_t *a)
{
    return a ? __atomic_load_n(&a->refused, __ATOMIC_RELAXED) : 0;
}

/* ---- The runtime's per-context handlers ----
 * A coordinator and a DataServer may share one ZeroMQ context (embedded mode), and a context
 * has one ZAP endpoint: the handlers are counted per context here, each with its own copy of
 * the keys, so whichever component goes first leaves the other's handler working. */

typedef struct auth_entry {
    void *ctx;
    dh_wire_keys_t *keys;
    dh_wire_auth_t *auth;
    unsigned refs;
    struct auth_entry *next;
} auth_entry_t;

static pthread_mutex_t g_auth_lock = PTHREAD_MUTEX_INITIALIZER;
static auth_entry_t *g_auth_entries;

int dh__wire_secure(void *ctx, const char *dir, const char *identity, const char *bind_endpoint,
                    dh_wire_keys_t **keys, int *auth_ref)
{
    *keys = NULL;
    *auth_ref = 0;
    if (!dir || !dir[0])
        return 0;
    int rc = dh_wire_keys_load(keys, dir, identity);
    if (rc || !bind_endpoint || strncmp(bind_endpoint, "tcp://", 6) != 0)
        return rc;
    pthread_mutex_lock(&g_auth_lock);
    auth_entry_t *e = g_auth_entries;
    while (e && e->ctx != ctx)
        e = e->next;
    if (e && strcmp(e->keys->dir, dir) != 0) {
        rc = dh__set_error(DH_EINVAL,
                           "key directory '%s': this ZeroMQ context already admits the keys of "
                           "'%s' (one directory per context)",
                           dir, e->keys->dir);
    } else if (e) {
        e->refs++;
    } else if (!(e = dh_calloc(1, sizeof *e))) {
        rc = dh__set_error(DH_ENOMEM, "out of memory for the ZAP handler");
    } else if ((rc = dh_wire_keys_load(&e->keys, dir, identity)) ||
               (rc = dh_wire_auth_start(&e->auth, ctx, e->keys))) {
        dh_wire_keys_destroy(&e->keys);
        dh_free(e);
    } else {
        e->ctx = ctx;
        e->refs = 1;
        e->next = g_auth_entries;
        g_auth_entries = e;
    }
    pthread_mutex_unlock(&g_auth_lock);
    if (rc)
        dh_wire_keys_destroy(keys);
    else
        *auth_ref = 1;
    return rc;
}

void dh__wire_secure_end(void *ctx, dh_wire_keys_t **keys, int auth_ref)
{
    if (auth_ref) {
        pthread_mutex_lock(&g_auth_lock);
        for (auth_entry_t **p = &g_auth_entries; *p; p = &(*p)->next) {
            auth_entry_t *e = *p;
            if (e->ctx != ctx)
                continue;
            if (--e->refs == 0) {
                *p = e->next;
                dh_wire_auth_stop(&e->auth);
                dh_wire_keys_destroy(&e->keys);
                dh_free(e);
            }
            break;
        }
        pthread_mutex_unlock(&g_auth_lock);
    }
    dh_wire_keys_destroy(keys);
}

uint64_t dh__wire_secure_refused(void *ctx)
{
    uint64_t n = 0;
    pthread_mutex_lock(&g_auth_lock);
    for (auth_entry_t *e = g_auth_entries; e; e = e->next)
        if (e->ctx == ctx)
            n = dh_wire_auth_refused(e->auth);
    pthread_mutex_unlock(&g_auth_lock);
    return n;
}
