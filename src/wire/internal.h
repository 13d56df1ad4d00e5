/* wire/internal.h: cross-file internals of the wire module (dh__ prefix). */
#ifndef DH_WIRE_INTERNAL_H
#define DH_WIRE_INTERNAL_H

#include <stdint.h>

#include "datahelix/wire.h"

/* Bytes a tensor occupies (product of shape x dtype size) in *nbytes, and checks that its
 * element strides stay inside those bytes (or inside `limit` when larger, for a
 * shared-memory slab). Returns NULL when valid, else a static description of the fault
 * ("dtype", "ndim", "shape", "strides"). Cost: O(ndim). */
const char *dh__wire_tensor_check(const dh_tensor_t *t, uint64_t limit, uint64_t *nbytes);

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
