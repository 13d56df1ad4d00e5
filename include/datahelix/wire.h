/* wire.h: the message schema of the runtime and the ZeroMQ helpers that carry it (docs/design.md
 * §2, §5; docs/wire-protocol.md is the normative description of the bytes).
 *
 * Every message is one ZeroMQ multipart message:
 *
 *   frame 0      header, 20 bytes, little-endian:
 *                  magic "DHX1" (4) | u16 version | u16 type | u32 body length | u64 sender seq
 *   frame 1      body: packed little-endian fields, u32 counts, u32-length-prefixed strings
 *   frames 2..N  raw tensor payloads (DELIVER only), one per tensor whose location is FRAME;
 *                sent zero-copy (zmq_msg_init_data), never copied on send
 *
 * (A ROUTER socket adds the peer's routing id in front; the helpers below add and strip it.)
 *
 * Decoding validates everything before use: magic, version (another version is refused with
 * a message naming both), type, body length, every count and string against the remaining
 * bytes, ndim, dtypes, shape products against payload frame sizes, finite non-negative
 * numbers, and no trailing bytes. Errors are DH_EPARSE with a message naming the message
 * type and the field at fault.
 *
 * Ownership: a decoded dh_msg_t owns its strings and arrays (dh_malloc; release with
 * dh_msg_clear). The one exception is dh_wire_tensor_t.tensor.data of a decoded DELIVER, which
 * is borrowed (read-only) from the payload frame it was decoded from (the caller's buffer, or
 * the frames held by a dh_wire_received_t) and is valid as long as that is.
 *
 * Threads: the codec is pure and reentrant. A dh_wire_socket_t belongs to one thread, like the
 * ZeroMQ socket inside it.
 */
#ifndef DATAHELIX_WIRE_H
#define DATAHELIX_WIRE_H

#include "datahelix/export.h"
#include "datahelix/tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DH_WIRE_MAGIC "DHX1"
#define DH_WIRE_VERSION 6
#define DH_WIRE_HEADER_SIZE 20
#define DH_WIRE_MAX_NDIM DH_TENSOR_MAX_DIMS
/* Most payload frames one message may carry; a peer sending more is refused (DH_EPARSE). */
#define DH_WIRE_MAX_PAYLOADS 1024
/* Default ZMQ_MAXMSGSIZE of the sockets made here (per frame; see docs/wire-protocol.md). */
#define DH_WIRE_DEFAULT_MAX_MSG_SIZE ((int64_t)1 << 30)

typedef enum {
    DH_MSG_HELLO = 1,     /* a process registers with the coordinator */
    DH_MSG_HEARTBEAT = 2, /* a DataServer's load and link estimates */
    DH_MSG_REQUEST = 3,   /* client -> coordinator: a batch to prepare */
    DH_MSG_DISPATCH = 4,  /* coordinator -> DataServer: the request and where it runs */
    DH_MSG_COMPLETE = 5,  /* DataServer -> coordinator: a request finished, measured costs */
    DH_MSG_DELIVER = 6,   /* DataServer -> client / local DataServer: the batch's tensors */
    DH_MSG_ERROR = 7,     /* either way: a refusal or failure, code and message */
    DH_MSG_GOODBYE = 8,   /* a process leaves cleanly */
    DH_MSG_REBALANCE = 9, /* tier 2: a round's offer, the gathered round, its end, a move */
} dh_msg_type_t;

#define DH_MSG_TYPE_MAX 9

typedef enum {
    DH_WIRE_ROLE_LOCAL = 0,  /* a training node's local DataServer */
    DH_WIRE_ROLE_REMOTE = 1, /* a remote sidecar DataServer */
    DH_WIRE_ROLE_CLIENT = 2, /* a client (one per training rank) */
} dh_wire_role_t;

typedef enum {
    DH_WIRE_LOC_FRAME = 0, /* the bytes are the next payload frame of the message */
    DH_WIRE_LOC_SHM = 1,   /* the bytes are in a shared-memory arena: {arena, offset, length} */
} dh_wire_location_t;

/* Fixed header (frame 0). */
typedef struct dh_wire_header {
    uint16_t version;
    uint16_t type;       /* dh_msg_type_t */
    uint32_t body_len;   /* bytes of frame 1 */
    uint64_t sender_seq; /* the sender's message counter (per socket), for tracing and dedup */
} dh_wire_header_t;

typedef struct dh_msg_hello {
    uint8_t role;         /* dh_wire_role_t */
    char *node;           /* node name */
    uint32_t workers;     /* worker slots (0 for a client) */
    uint64_t arena_bytes; /* shared-memory arena size (0 if none) */
    char *name;           /* the peer's name: a DataServer's or a client's (= its routing id) */
    char *endpoint;       /* a local DataServer's data endpoint; "" otherwise */
    char *shm_socket;     /* a local DataServer's abstract AF_UNIX socket handing out its
                           * arena fd; "" otherwise */
    uint32_t pid;         /* the sender's process id */
    uint32_t rank;        /* a client's rank (0 otherwise) */
    uint64_t incarnation; /* the coordinator's: a random id of its process, in the HELLOs
                           * it sends (0 from anyone else); a client that sees it change
                           * knows the coordinator restarted and sends again what is
                           * outstanding (docs/runtime.md, "Failures") */
} dh_msg_hello_t;

typedef struct dh_wire_link_bw {
    char *node;         /* the peer node of the link */
    double bytes_per_s; /* estimated bandwidth to it */
    double latency_s;   /* estimated latency to it (seconds, >= 0; 0 = not measured) */
} dh_wire_link_bw_t;

typedef struct dh_msg_heartbeat {
    uint32_t workers;
    uint32_t queue_depth;    /* requests it holds whose executor COMPLETE it has not sent
                              * (queued, running, or done and waiting to go out): what the
                              * coordinator's book should count for it */
    double queue_work_s;     /* their predicted CPU seconds (speed 1; the DISPATCHes'
                              * pred_cpu_s, else the descriptors' estimates) */
    double speed_factor;     /* observed / predicted CPU time */
    double recent_latency_s; /* recent task latency (e.g. a moving median) */
    /* Online feedback (docs/design.md §4.1): */
    uint64_t dispatches_seen; /* DISPATCH messages received since its last HELLO (the
                               * coordinator subtracts it from what it sent since: the
                               * dispatches still in flight, which queue_depth cannot count) */
    double read_bytes_per_s;  /* observed input read bandwidth (EWMA); 0 = not measured */
    uint32_t n_links;
    dh_wire_link_bw_t *links;
} dh_msg_heartbeat_t;

typedef struct dh_wire_sample {
    char *id;
    uint32_t frames, height, width; /* per-sample overrides; 0 = the pipeline's default */
    char *uri;                      /* where the encoded sample is (a path) */
    char *key;                      /* profile key ("f16x224x224"), may be "" */
    double cpu_s;                   /* predicted CPU seconds (speed 1) */
    uint64_t in_bytes, out_bytes;   /* encoded bytes to read, decoded bytes to deliver */
    int64_t tokens;                 /* predicted tokens (>= 0) */
    uint64_t seed; /* the base seed of the sample's pass (the loader's seed mixed with its
                    * epoch, dh_client_epoch_seed): a Python dataset's worker seeds its
                    * generators from it (docs/datasets.md, "Randomness") */
} dh_wire_sample_t;

typedef struct dh_msg_request {
    char *client_id;
    uint64_t seq; /* the client's request sequence number; (client_id, seq) names a request */
    uint32_t rank;
    int64_t deadline_ns; /* duration relative to the sender's clock at send time (may be < 0) */
    char *delivery_node; /* node of the rank's local DataServer */
    uint32_t n_samples;
    dh_wire_sample_t *samples;
} dh_msg_request_t;

typedef struct dh_msg_dispatch {
    dh_msg_request_t request;
    char *server;          /* the DataServer chosen to execute it */
    char *target;          /* the local DataServer that delivers to the rank */
    char *target_endpoint; /* its data endpoint (a sidecar forwards there) */
    double pred_cpu_s;     /* the coordinator's predicted CPU seconds of the request (speed 1);
                            * the server sums these into its heartbeat's queue_work_s */
} dh_msg_dispatch_t;

typedef struct dh_wire_sample_status {
    int32_t status;       /* 0 or a negative DH_E* code */
    char *error;          /* "" when status is 0 */
    double cpu_s;         /* measured CPU seconds of this sample on the executor (0 = not measured:
                           * a delivery-only COMPLETE); the coordinator's cost model learns from it */
    double fetch_s;       /* seconds the executor waited for this sample's remote bytes (0 for a
                           * local file); the coordinator's fetch model learns from it */
    uint64_t fetch_bytes; /* remote bytes it fetched for this sample (0 for a local file) */
} dh_wire_sample_status_t;

typedef struct dh_msg_complete {
    char *client_id;
    uint64_t seq;
    uint32_t n_samples;
    dh_wire_sample_status_t *samples;
    double cpu_s;      /* measured CPU seconds of the whole request (samples, collate, copy) */
    uint64_t bytes;    /* bytes produced */
    double queue_s;    /* seconds queued before a worker took it */
    uint8_t delivered; /* 1: from the delivering local DataServer, the client has the batch;
                        * 0: from the executor (measurements only) */
} dh_msg_complete_t;

/* A tensor of a DELIVER: the shared tensor (tensor.h) and where its bytes are. On the wire a
 * tensor is its name, dtype (the dh_dtype_t code), ndim, shape and strides IN BYTES (the
 * codec converts to and from the struct's element strides), and its location. */
typedef struct dh_wire_tensor {
    /* Decoded: name, dtype, ndim, shape, strides (elements) and nbytes (the shape's bytes);
     * data is borrowed from the payload frame for FRAME (see the top), NULL for SHM. */
    dh_tensor_t tensor;
    uint8_t location; /* dh_wire_location_t */
    /* DH_WIRE_LOC_SHM: the handle; length >= the tensor's bytes. */
    uint64_t arena_id, offset, length, generation;
} dh_wire_tensor_t;

/* One sample's outcome in a DELIVER, in request order. */
typedef struct dh_wire_sample_result {
    char *id;
    int64_t tokens; /* tokens produced (>= 0) */
    int32_t status; /* 0 or a negative DH_E* code */
    char *error;    /* "" when status is 0; else names the sample, path and cause */
    double cpu_s;   /* measured decode seconds on the executor (0 = not measured) */
    double fetch_s; /* seconds the executor waited for its remote bytes (0 for a local file) */
    uint64_t fetch_bytes; /* remote bytes fetched for it (0 for a local file) */
} dh_wire_sample_result_t;

typedef struct dh_msg_deliver {
    char *client_id;
    uint64_t seq;
    uint32_t n_tensors;
    dh_wire_tensor_t *tensors;
    uint32_t n_samples;
    dh_wire_sample_result_t *samples;
    uint64_t ready_ns; /* sender's dh_clock_now_ns() when the batch was ready (same host only) */
    char *server;      /* the DataServer that executed the request */
} dh_msg_deliver_t;

/* Tier 2 (docs/rebalancing.md). A REBALANCE's kind: */
typedef enum {
    DH_RB_OFFER = 0, /* client -> coordinator: its parts of a round, with their features */
    DH_RB_ROUND = 1, /* coordinator -> each member: every member's offer, the same for all */
    DH_RB_END = 2,   /* coordinator -> members: the round ended without every offer (keep) */
    DH_RB_SEND = 3,  /* client -> its local DataServer: forward these parts to another node's
                      * DataServer, for client_id under seq (parts[i] goes as seq + i) */
} dh_rb_kind_t;

/* A member of a round's group (ROUND). */
typedef struct dh_wire_rb_member {
    uint32_t rank;
    char *client_id;
    char *node;         /* its node */
    char *endpoint;     /* its local DataServer's data endpoint */
    double s_per_token; /* its learned compute seconds per token (0 = none yet) */
    double lead_s;      /* OFFER: seconds until it consumes the round's first batch (its
                         * deadline model); ROUND: what is left of it when the round is
                         * gathered (the coordinator's clock) */
} dh_wire_rb_member_t;

/* A real number of a feature vector (any sign, finite). */
typedef struct dh_wire_real {
    double v;
} dh_wire_real_t;

/* A materialized part of a round: where it is (its tensors' handles in its node's arena)
 * and what it is (its samples, features). */
typedef struct dh_wire_rb_part {
    uint32_t rank;  /* its holder */
    uint64_t batch; /* its batch index */
    uint32_t slot;  /* its part index in the batch */
    double tokens, bytes, cpu_s;
    uint32_t n_features;
    dh_wire_real_t *features;
    uint32_t n_tensors;
    dh_wire_tensor_t *tensors; /* DH_WIRE_LOC_SHM only */
    uint32_t n_samples;
    dh_wire_sample_result_t *samples;
    char *server;      /* the DataServer that executed it */
    uint64_t ready_ns; /* when it was ready in its arena (same host only) */
} dh_wire_rb_part_t;

typedef struct dh_msg_rebalance {
    uint8_t kind;    /* dh_rb_kind_t */
    uint32_t group;  /* the group's id */
    uint64_t round;  /* the round number */
    uint32_t rank;   /* OFFER: the sender's rank */
    char *client_id; /* OFFER: the sender; SEND: the receiving client */
    char *node;      /* SEND: the receiving client's node */
    char *endpoint;  /* SEND: the receiving node's DataServer data endpoint */
    uint64_t seq;    /* SEND: the receiver files parts[i] as seq + i */
    char *reason;    /* END: why the round ended; "" otherwise */
    uint32_t n_members;
    dh_wire_rb_member_t *members; /* OFFER: the group's ranks (rank only); ROUND: all */
    uint32_t n_parts;
    dh_wire_rb_part_t *parts; /* OFFER, SEND: the sender's; ROUND: every member's, by
                               * (batch, rank, slot) */
} dh_msg_rebalance_t;

typedef struct dh_msg_error {
    int32_t code; /* a negative DH_E* code */
    char *message;
} dh_msg_error_t;

/* One message. `type` selects the union member; GOODBYE has no body. */
typedef struct dh_msg {
    uint16_t type;       /* dh_msg_type_t */
    uint64_t sender_seq; /* header field */
    union {
        dh_msg_hello_t hello;
        dh_msg_heartbeat_t heartbeat;
        dh_msg_request_t request;
        dh_msg_dispatch_t dispatch;
        dh_msg_complete_t complete;
        dh_msg_deliver_t deliver;
        dh_msg_error_t error;
        dh_msg_rebalance_t rebalance;
    };
} dh_msg_t;

/* A borrowed byte range (a frame). */
typedef struct dh_wire_frame {
    const void *data;
    size_t size;
} dh_wire_frame_t;

/* "HELLO", "HEARTBEAT", ... or "type?" for an unknown value. Static storage. */
DH_EXTERN const char *dh_msg_type_name(unsigned type);

/* Frees what a decoded message owns (strings, arrays) and zeroes it. Safe on a zeroed or
 * partly decoded message. Only for messages whose members came from dh_malloc (a decoded
 * message does); never for a message the caller built from its own storage. */
DH_EXTERN void dh_msg_clear(dh_msg_t *msg);

/* Encodes msg: fills header[] and returns the body in *body (the caller's, dh_free) and its
 * size in *body_len. NULL strings encode as "". Payload frames are not part of the encoding;
 * dh_wire_send sends them. Returns 0, DH_ENOMEM, or DH_ERANGE if the body would exceed
 * UINT32_MAX bytes. Misuse (unknown type, ndim outside 0..6) is an assertion. Reentrant. */
DH_EXTERN int dh_wire_encode(const dh_msg_t *msg, uint8_t header[DH_WIRE_HEADER_SIZE],
                             uint8_t **body, size_t *body_len);

/* Decodes and validates a header frame. Returns 0 or DH_EPARSE (wrong size, bad magic, another
 * version - the message names both -, unknown type). */
DH_EXTERN int dh_wire_decode_header(const void *data, size_t size, dh_wire_header_t *out);

/* Decodes a whole message from its frames: header, body, and the payload frames (n_payloads
 * may be 0; payloads may be NULL then). Validates everything (see the top and
 * docs/wire-protocol.md). On success *out owns its strings and arrays (dh_msg_clear) and the
 * DELIVER tensors' data point into payloads[]. On failure *out is zeroed and nothing is owned.
 * Returns 0, DH_EPARSE (message names the type and field), or DH_ENOMEM. Reentrant. */
DH_EXTERN int dh_wire_decode(const void *header, size_t header_size, const void *body,
                             size_t body_size, const dh_wire_frame_t *payloads, size_t n_payloads,
                             dh_msg_t *out);

/* Packet form, for a local SOCK_SEQPACKET channel (the DataServer's notice of a batch in the
 * arena to a client on its node): one buffer holding the 20-byte header then the body, and no
 * payload frames (a DELIVER whose tensors include FRAME ones cannot travel this way).
 * dh_wire_encode_packet allocates *buf (dh_free it); returns 0, DH_EINVAL (a FRAME tensor),
 * DH_ERANGE or DH_ENOMEM. dh_wire_decode_packet validates like dh_wire_decode (a short buffer
 * or a body length that disagrees with the packet is DH_EPARSE); *out owns what it holds. */
DH_EXTERN int dh_wire_encode_packet(const dh_msg_t *msg, uint8_t **buf, size_t *len);
DH_EXTERN int dh_wire_decode_packet(const void *buf, size_t len, dh_msg_t *out);

/* ---- ZeroMQ helpers (src/wire/zmq.c) ---- */

typedef struct dh_wire_socket dh_wire_socket_t;

/* ---- Authentication (src/wire/auth.c; docs/security.md) ----
 *
 * A key directory holds CURVE keys in Z85 text, one per file, as `datahelix keygen -o
 * DIR/NAME` writes them: NAME.pub (public) and NAME.secret (secret, mode 0600; a secret
 * readable by group or others is refused). server.pub is the job's server key: every socket
 * that binds tcp:// is a CURVE server with server.secret (needed only where a coordinator or
 * DataServer runs); every socket that connects to tcp:// is a CURVE client with server.pub
 * and this process's identity key (NAME.secret; default "server"). A ZAP handler on the
 * binding side admits a client only when its public key is one of the directory's *.pub
 * files, and logs each refusal with the key and the peer's address. ipc:// and inproc://
 * sockets use no CURVE (they do not leave the machine). */

typedef struct dh_wire_keys dh_wire_keys_t;
typedef struct dh_wire_auth dh_wire_auth_t;

/* Loads the key directory dir with identity NAME (NULL or "": "server"). Returns 0 or a
 * negative code with a message naming the file: -ENOENT (no such directory, no server.pub,
 * no NAME.secret), DH_EACCES (a secret readable by others), DH_EPARSE (not a Z85 key),
 * DH_EINVAL (libzmq without CURVE), DH_ENOMEM. *out is the caller's (dh_wire_keys_destroy);
 * it is read-only after loading, so any thread may use it. */
DH_EXTERN int dh_wire_keys_load(dh_wire_keys_t **out, const char *dir, const char *identity);
DH_EXTERN void dh_wire_keys_destroy(dh_wire_keys_t **k);
/* The directory, this process's key name and its public key (Z85); borrowed from k. */
DH_EXTERN const char *dh_wire_keys_dir(const dh_wire_keys_t *k);
DH_EXTERN const char *dh_wire_keys_name(const dh_wire_keys_t *k);
DH_EXTERN const char *dh_wire_keys_public(const dh_wire_keys_t *k);

/* Makes a new key pair: PREFIX.secret (mode 0600) and PREFIX.pub (0644), never overwriting
 * (-EEXIST names the file). Copies the public key (41 bytes with the NUL) to public_out
 * unless NULL. Returns 0 or a negative code with a message. */
DH_EXTERN int dh_wire_keygen(const char *prefix, char public_out[41]);

/* Starts the ZAP handler of zmq_ctx (a thread; one per context) that admits the public keys
 * of keys, which must outlive it. Stop it (dh_wire_auth_stop) before zmq_ctx_term. Returns 0,
 * -EADDRINUSE (the context has one), or a negative code with a message. */
DH_EXTERN int dh_wire_auth_start(dh_wire_auth_t **out, void *zmq_ctx, const dh_wire_keys_t *keys);
DH_EXTERN void dh_wire_auth_stop(dh_wire_auth_t **a);
/* CURVE handshakes refused so far (unlisted keys, other mechanisms). Thread-safe. */
DH_EXTERN uint64_t dh_wire_auth_refused(const dh_wire_auth_t *a);

typedef struct dh_wire_socket_opts {
    int64_t max_msg_size;       /* ZMQ_MAXMSGSIZE (per frame); 0 = DH_WIRE_DEFAULT_MAX_MSG_SIZE,
                                 * -1 = no limit */
    const dh_wire_keys_t *keys; /* CURVE on tcp:// endpoints (borrowed; must outlive the
                                 * socket); NULL = plaintext */
} dh_wire_socket_opts_t;

/* Makes a socket of ZeroMQ type zmq_type (ZMQ_DEALER, ZMQ_ROUTER, ZMQ_PUSH, ZMQ_PULL ...) on
 * the caller's context, with ZMQ_MAXMSGSIZE from opts (NULL = defaults), ZMQ_LINGER 0, and on a
 * ROUTER ZMQ_ROUTER_MANDATORY (so a send to an unknown peer fails instead of vanishing).
 * Returns 0, DH_ENOMEM, or a negative errno with a message. *out is the caller's
 * (dh_wire_socket_destroy, before the context is terminated). */
DH_EXTERN int dh_wire_socket_new(dh_wire_socket_t **out, void *zmq_ctx, int zmq_type,
                                 const dh_wire_socket_opts_t *opts);

/* Closes the socket (pending messages are dropped: linger 0), frees it, sets *s = NULL. */
DH_EXTERN void dh_wire_socket_destroy(dh_wire_socket_t **s);

/* Bind / connect to an endpoint ("inproc://x", "ipc:///path", "tcp://host:port"). The last
 * endpoint is remembered to name the socket in error messages. With keys in the socket's opts
 * and a tcp:// endpoint, the socket is a CURVE server (bind) or client (connect) first.
 * Returns 0 or a negative errno with a message naming the endpoint (DH_EAUTH: binding tcp://
 * with keys but no server.secret). */
DH_EXTERN int dh_wire_socket_bind(dh_wire_socket_t *s, const char *endpoint);
DH_EXTERN int dh_wire_socket_connect(dh_wire_socket_t *s, const char *endpoint);

/* The underlying ZeroMQ socket (borrowed), for zmq_poll or extra options. */
DH_EXTERN void *dh_wire_socket_handle(dh_wire_socket_t *s);

/* Same signature as zmq_free_fn: releases a payload once ZeroMQ is done with it (possibly on a
 * ZeroMQ I/O thread, so it must be thread-safe). */
typedef void dh_wire_free_fn(void *data, void *hint);

typedef struct dh_wire_payload {
    void *data;
    size_t size;
    dh_wire_free_fn *free_fn; /* NULL: data outlives the socket (static), nothing to free */
    void *hint;
} dh_wire_payload_t;

/* Sends msg (header, body, then payloads[0..n_payloads) zero-copy). The header's sender_seq is
 * the socket's counter, not msg->sender_seq. On a ROUTER socket routing_id names the peer
 * (required); elsewhere it must be NULL. Waits up to timeout_ms (-1: forever) for the socket
 * to accept the message. For DELIVER the payloads must match the tensors whose location is
 * FRAME, in order, with sizes equal to their bytes (else DH_EINVAL, nothing sent).
 * Ownership: the payloads are taken in every case, success or failure: each free_fn is called
 * exactly once, by ZeroMQ after the send or here on failure. Returns 0, DH_EAGAIN (timed out),
 * DH_EINVAL, DH_ENOMEM, DH_ERANGE, -EHOSTUNREACH (ROUTER: no such peer) or another negative
 * errno, with a message naming the endpoint and peer. */
DH_EXTERN int dh_wire_send(dh_wire_socket_t *s, const void *routing_id, size_t routing_id_size,
                           const dh_msg_t *msg, dh_wire_payload_t *payloads, size_t n_payloads,
                           int timeout_ms);

/* A received message: the decoded message, the ROUTER routing id, and the ZeroMQ frames it
 * borrows from (the DELIVER tensors' data). Zero it before first use; release it with
 * dh_wire_received_release (it may be reused after that). */
typedef struct dh_wire_received {
    dh_msg_t msg;
    uint8_t routing_id[256]; /* ROUTER sockets: the peer's id (ZeroMQ caps it at 255 bytes) */
    size_t routing_id_size;
    /* private: the zmq_msg_t frames held */
    void *frames_;
    size_t n_frames_, cap_frames_;
} dh_wire_received_t;

/* Waits up to timeout_ms (-1: forever, 0: poll) for a message, receives all of its frames and
 * decodes them (dh_wire_decode) into *out, which must be zeroed or released. A malformed
 * message is consumed whole, so the next call starts at the next message. Returns 0,
 * DH_EAGAIN (timed out), DH_EPARSE (message names the endpoint, the type and the field),
 * DH_ENOMEM, or another negative errno. On error *out holds nothing but, on a ROUTER socket,
 * the sender's routing_id when its frame was read (so that the caller can answer a message it
 * could not read); it still needs no release. */
DH_EXTERN int dh_wire_recv(dh_wire_socket_t *s, int timeout_ms, dh_wire_received_t *out);

/* Frees the decoded message and closes the frames it borrowed from; zeroes *r. Safe on a
 * zeroed struct. */
DH_EXTERN void dh_wire_received_release(dh_wire_received_t *r);

#ifdef __cplusplus
}
#endif
#endif
