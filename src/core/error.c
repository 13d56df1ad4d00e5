/* error.c: the error table (DH_ERRNO_MAP) and the thread-local "last error" message that
 * names the file, field, peer or sample at fault. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dh_config.h"
#include "datahelix/error.h"
#include "core/internal.h"

static _Thread_local char last_error[1024];

const char *dh_strerror(int err)
{
    switch (err) {
#define DH__ERR_MSG(name, code, msg)                                                               \
    case (code):                                                                                   \
        return msg;
        DH_ERRNO_MAP(DH__ERR_MSG)
#undef DH__ERR_MSG
    case 0:
        return "success";
    default:
        /* A system error outside the table: strerror's text for it. */
        if (err < 0 && err > DH__ERR_BASE)
            return strerror(-err);
        return "unknown error";
    }
}

const char *dh_err_name(int err)
{
    switch (err) {
#define DH__ERR_NAME(name, code, msg)                                                              \
    case (code):                                                                                   \
        return "DH_E" #name;
        DH_ERRNO_MAP(DH__ERR_NAME)
#undef DH__ERR_NAME
    case 0:
        return "DH_OK";
    default:
#ifdef HAVE_STRERRORNAME_NP
        /* A system error outside the table: its errno name ("ENOTDIR"). */
        if (err < 0 && err > DH__ERR_BASE && strerrorname_np(-err))
            return strerrorname_np(-err);
#endif
        return "DH_E?";
    }
}

const char *dh_last_error(void)
{
    return last_error;
}

void dh_clear_error(void)
{
    last_error[0] = '\0';
}

int dh__set_error(int err, const char *fmt, ...)
{
    /* Formatted aside first: a caller may pass dh_last_error() itself as an argument (to add
     * context to the previous message), which vsnprintf must not write over as it reads. */
    char text[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(last_error, text, sizeof last_error);
    return err;
}
