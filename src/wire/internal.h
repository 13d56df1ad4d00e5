/* wire/internal.h: cross-file internals of the wire module (dh__ prefix), private to
 * src/wire (and its tests). What other modules use is in wire/wire_lib.h. */
#ifndef DH_WIRE_INTERNAL_H
#define DH_WIRE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/wire.h"
#include "wire/wire_lib.h"

/* Bytes a tensor occupies (product of shape x dtype size) in *nbytes, and checks that its
 * element strides stay inside those bytes (or inside `limit` when larger, for a
 * shared-memory slab). Returns NULL when valid, else a static description of the fault
 * ("dtype", "ndim", "shape", "strides"). Cost: O(ndim). */
const char *dh__wire_tensor_check(const dh_tensor_t *t, uint64_t limit, uint64_t *nbytes);

/* Makes sock a CURVE server (bind) or client (connect) with keys when endpoint is tcp://;
 * nothing for NULL keys or another transport. Before bind/connect. Returns 0 or DH_EAUTH with
 * a message (auth.c). */
int dh__wire_keys_apply(const dh_wire_keys_t *keys, void *sock, const char *endpoint, int bind);

/* Handshakes refused so far by ctx's handler (0 without one). */
uint64_t dh__wire_secure_refused(void *ctx);

/* What dh__wire_probe found at an endpoint. */
typedef enum {
    DH__WIRE_PROBE_ZMTP,        /* it sent a ZMTP 3 signature: a ZeroMQ peer */
    DH__WIRE_PROBE_FOREIGN,     /* it accepted, then sent other bytes, closed, or stayed silent */
    DH__WIRE_PROBE_UNREACHABLE, /* refused, no route, host not found, no answer */
    DH__WIRE_PROBE_SKIPPED      /* not tcp:// or ipc:// */
} dh__wire_probe_t;

/* Connects a plain socket to a tcp:// or ipc:// endpoint within timeout_ms and reads its first
 * bytes (probe.c): what answers there. why (cap bytes) gets the detail ("connection refused",
 * "host not found: Name or service not known", "it closed the connection without a ZeroMQ
 * greeting"). Sends nothing. Blocks up to timeout_ms plus the resolver's time. */
dh__wire_probe_t dh__wire_probe(const char *endpoint, int timeout_ms, char *why, size_t cap);

/* The messages sent on this socket so far (the next sender_seq is this + 1). For tests. */
uint64_t dh__wire_socket_sent(const dh_wire_socket_t *s);

#endif
