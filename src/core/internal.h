/* core/internal.h: cross-file internals of the core module (dh__ prefix). */
#ifndef DH_CORE_INTERNAL_H
#define DH_CORE_INTERNAL_H

#include <stddef.h>

/* Records a formatted message as this thread's last error and returns err, so callers can
 * write `return dh__set_error(DH_EPARSE, "%s:%zu: ...", path, line);`. */
int dh__set_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Routes jansson's allocations through dh_malloc/dh_free (idempotent, call before parsing). */
void dh__json_use_allocator(void);

#define DH_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
