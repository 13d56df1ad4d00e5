/* log.h: one-line log records on stderr.
 *
 * Format: "2026-12-02T17:00:00.123Z datahelix[pid] LEVEL message". The threshold comes from
 * DATAHELIX_LOG_LEVEL, else DH_LOG_LEVEL (error, warn, info, debug; default info), or
 * dh_log_set_level() (Python: log_level=, _C.set_log_level). Thread-safe:
 * each record is formatted into a local buffer and written with one write(2).
 */
#ifndef DATAHELIX_LOG_H
#define DATAHELIX_LOG_H

#include "datahelix/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DH_LOG_ERROR = 0,
    DH_LOG_WARN = 1,
    DH_LOG_INFO = 2,
    DH_LOG_DEBUG = 3
} dh_log_level_t;

/* Sets the threshold; records above it are dropped. */
DH_EXTERN void dh_log_set_level(dh_log_level_t level);

/* The level named by `name` ("error", "warn" or "warning", "info", "debug"; any case) into
 * *out. Returns 0, or DH_EINVAL for another name (*out untouched). */
DH_EXTERN int dh_log_level_parse(const char *name, dh_log_level_t *out);

/* The current threshold (read once from DATAHELIX_LOG_LEVEL, else DH_LOG_LEVEL, on first
 * use). */
DH_EXTERN dh_log_level_t dh_log_level(void);

/* Writes one record if level passes the threshold. */
DH_EXTERN void dh_log_write(dh_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define dh_log_error(...) dh_log_write(DH_LOG_ERROR, __VA_ARGS__)
#define dh_log_warn(...) dh_log_write(DH_LOG_WARN, __VA_ARGS__)
#define dh_log_info(...) dh_log_write(DH_LOG_INFO, __VA_ARGS__)
#define dh_log_debug(...) dh_log_write(DH_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
