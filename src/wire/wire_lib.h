/* wire/wire_lib.h: what the rest of the library (runtime, bench) uses of the wire module
 * beyond include/datahelix/wire.h: socket set-up, authentication, diagnosis of a missing
 * peer and the ThreadSanitizer tokens of messages (dh__ prefix, not exported). The wire
 * module's own internals are in wire/internal.h, which no other module includes. */
#ifndef DH_WIRE_LIB_H
#define DH_WIRE_LIB_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/wire.h"

/* Sets the routing id of a DEALER socket (before connect). Returns 0 or a negative code with
 * a message naming the id. */
int dh__wire_set_routing_id(dh_wire_socket_t *s, const char *id);

/* Turns on ZMQ_ROUTER_HANDOVER on a ROUTER (before bind): a peer that reconnects with the
 * routing id of one still known (a restarted DataServer or client) takes it over instead of
 * being refused. Returns 0 or a negative code with a message (not a ROUTER: -EINVAL). */
int dh__wire_router_handover(dh_wire_socket_t *s);

/* A socket's bound endpoint with a wildcard resolved (ZMQ_LAST_ENDPOINT) into buf. Returns 0
 * or a negative code with a message. */
int dh__wire_last_endpoint(dh_wire_socket_t *s, char *buf, size_t cap);

/* The runtime's set-up of authentication (auth.c): loads the key directory dir with identity
 * (NULL or "" dir: no keys, *keys NULL) and, when bind_endpoint is tcp://, makes sure ctx has
 * a ZAP handler admitting the directory's keys (counted per context: *auth_ref 1 means this
 * caller holds one). Returns 0 or a negative code with a message. dh__wire_secure_end drops
 * both; call it after closing the caller's sockets and before zmq_ctx_term. */
int dh__wire_secure(void *ctx, const char *dir, const char *identity, const char *bind_endpoint,
                    dh_wire_keys_t **keys, int *auth_ref);
void dh__wire_secure_end(void *ctx, dh_wire_keys_t **keys, int auth_ref);

/* A tcp:// connect socket's handshake failures so far (its monitor, drained without
 * waiting): 0; DH_EAUTH with a message naming the peer and what to fix (the peer does not list
 * this process's key; the peer runs without keys or with another server key); or -EPROTO when
 * the peer answered but does not speak ZeroMQ ("tcp://H:P answered, but it is not a DataHelix
 * coordinator": a failed handshake is told apart by dh__wire_probe). Once seen, every later
 * call reports it too. dh_wire_recv checks it when it times out. */
int dh__wire_auth_check(dh_wire_socket_t *s);

/* Names what a connect socket expects at its endpoint ("coordinator", "DataServer"), for the
 * messages above; borrowed (a string literal). Default: "peer". */
void dh__wire_set_peer_role(dh_wire_socket_t *s, const char *role);

/* Why a connect socket has no peer yet, for a caller whose wait ran out: 0 when a handshake
 * with the endpoint once succeeded (the peer is there: the cause is elsewhere); else probes
 * the endpoint (dh__wire_probe, up to probe_ms) and returns DH_EAGAIN "cannot reach the ROLE at
 * ENDPOINT (connection refused / host not found: ... / no route to host)", -EPROTO "ENDPOINT
 * answered, but it is not a DataHelix ROLE (...)", or the handshake failure recorded, each with
 * its message. Blocks up to probe_ms plus the resolver's time. */
int dh__wire_diagnose(dh_wire_socket_t *s, int probe_ms);

/* The name of this machine (gethostname), or "localhost"; always terminated. */
void dh__wire_hostname(char *buf, size_t cap);

/* ThreadSanitizer cannot see the synchronisation inside libzmq (not instrumented): a buffer
 * written before zmq_msg_send and read after zmq_msg_recv on another thread, or freed by a
 * ZeroMQ I/O thread, would look like a race. Under TSan, dh_wire_send releases one token
 * before sending, dh_wire_recv acquires it after receiving, and every free function given
 * to ZeroMQ acquires it first: the happens-before edges a message really creates. Nothing
 * in other builds. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
extern char dh__wire_tsan_token;
static inline void dh__wire_tsan_release(void)
{
    __tsan_release(&dh__wire_tsan_token);
}
static inline void dh__wire_tsan_acquire(void)
{
    __tsan_acquire(&dh__wire_tsan_token);
}
#else
static inline void dh__wire_tsan_release(void) {}
static inline void dh__wire_tsan_acquire(void) {}
#endif

#endif
