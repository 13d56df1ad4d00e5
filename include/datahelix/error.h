/* error.h: the one error table of DataHelix.
 *
 * Every fallible function returns 0 or a negative code. System errors are -errno; our own
 * codes live below DH__ERR_BASE so they never collide. DH_ERRNO_MAP(XX) generates the enum,
 * dh_strerror() and dh_err_name(); the Python binding maps the same table to exceptions.
 *
 * Besides the code, the failing function records a human message naming the thing at fault
 * (file:line and field, the peer, the sample) in a thread-local buffer: dh_last_error().
 */
#ifndef DATAHELIX_ERROR_H
#define DATAHELIX_ERROR_H

#include "datahelix/export.h"

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DH__ERR_BASE (-30000)

/* XX(NAME, code, message) */
#define DH_ERRNO_MAP(XX)                                                                           \
    XX(NOMEM, -ENOMEM, "out of memory")                                                            \
    XX(INVAL, -EINVAL, "invalid argument")                                                         \
    XX(NOENT, -ENOENT, "no such file or directory")                                                \
    XX(ACCES, -EACCES, "permission denied")                                                        \
    XX(IO, -EIO, "input/output error")                                                             \
    XX(RANGE, -ERANGE, "value out of range")                                                       \
    XX(AGAIN, -EAGAIN, "resource temporarily unavailable (backpressure)")                          \
    XX(PARSE, DH__ERR_BASE - 1, "malformed input")                                                 \
    XX(SCHEMA, DH__ERR_BASE - 2, "a field is missing or has the wrong type")                       \
    XX(NOSERVER, DH__ERR_BASE - 3, "no live DataServer can take the request")                      \
    XX(INFEASIBLE, DH__ERR_BASE - 4, "no plan satisfies the constraints")                          \
    XX(TOOBIG, DH__ERR_BASE - 5, "instance too large for the exact solver")                        \
    XX(UNKNOWN, DH__ERR_BASE - 6, "unknown name")                                                  \
    XX(EOF, DH__ERR_BASE - 7, "end of input")                                                      \
    XX(DATASET, DH__ERR_BASE - 8, "the user's dataset code failed")                                \
    XX(AUTH, DH__ERR_BASE - 9, "authentication refused, or keys unusable")

typedef enum {
#define DH__ERR_ENUM(name, code, msg) DH_E##name = (code),
    DH_ERRNO_MAP(DH__ERR_ENUM)
#undef DH__ERR_ENUM
} dh_errno_t;

/* Message for an error code ("out of memory"). Never NULL; static storage. Thread-safe. */
DH_EXTERN const char *dh_strerror(int err);

/* Symbolic name of an error code ("DH_ENOMEM"), or "DH_E?" for an unknown one. Thread-safe. */
DH_EXTERN const char *dh_err_name(int err);

/* The detailed message of the last error recorded on this thread (names the file, line,
 * field, peer or sample at fault), or "" if none. Borrowed; valid until the next error on
 * this thread. Thread-safe (thread-local). */
DH_EXTERN const char *dh_last_error(void);

/* Clears this thread's last error message. */
DH_EXTERN void dh_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
