/* wire/internal.h: cross-file internals of the wire module (dh__ prefix). */
#ifndef DH_WIRE_INTERNAL_H
#define DH_WIRE_INTERNAL_H

#include <stdint.h>

#include "datahelix/wire.h"

/* Bytes a tensor occupies (product of shape x dtype size) in *nbytes, and checks that its
 * strides stay inside those bytes (or inside `limit` when larger, for a shared-memory slab).
 * Returns NULL when valid, else a static description of the fault ("dtype", "shape",
 * "strides"). Cost: O(ndim). */
const char *dh__wire_tensor_check(const dh_wire_tensor_t *t, uint64_t limit, uint64_t *nbytes);

#endif
