/* log.c: one-line log records on stderr, threshold from DATAHELIX_LOG_LEVEL / DH_LOG_LEVEL. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "datahelix/error.h"
#include "datahelix/log.h"

static atomic_int level_set = -1;

static const char *level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

void dh_log_set_level(dh_log_level_t level)
{
    atomic_store(&level_set, (int)level);
}

int dh_log_level_parse(const char *name, dh_log_level_t *out)
{
    for (int i = 0; name && i < 4; i++)
        if (strcasecmp(name, level_names[i]) == 0) {
            *out = (dh_log_level_t)i;
            return 0;
        }
    if (name && strcasecmp(name, "warning") == 0) {
        *out = DH_LOG_WARN;
        return 0;
    }
    return DH_EINVAL;
}

dh_log_level_t dh_log_level(void)
{
    int level = atomic_load(&level_set);
    if (level >= 0)
        return (dh_log_level_t)level;
    dh_log_level_t parsed = DH_LOG_INFO;
    const char *env = getenv("DATAHELIX_LOG_LEVEL");
    if (!env || !env[0])
        env = getenv("DH_LOG_LEVEL");
    if (env)
        dh_log_level_parse(env, &parsed); /* an unknown name keeps the default */
    level = (int)parsed;
    atomic_store(&level_set, level);
    return (dh_log_level_t)level;
}

void dh_log_write(dh_log_level_t level, const char *fmt, ...)
{
    if ((int)level > (int)dh_log_level())
        return;
    char buf[2048];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ datahelix[%d] %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), (int)getpid(), level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    /* One write(2) per record so concurrent threads do not interleave within a line. */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}
