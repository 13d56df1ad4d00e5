/* fs.c: small file-system helpers shared by the modules that write files. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dh_config.h"
#include "datahelix/error.h"
#include "core/internal.h"

int dh__make_dirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return dh__set_error(DH_ERANGE, "%.64s...: path too long", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            int err = errno;
            return dh__set_error(-err, "%s: cannot create the folder: %s", path, strerror(err));
        }
        *p = saved;
        if (saved == '\0')
            return 0;
    }
}

int dh__make_parent_dirs(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path)
        return 0;
    if ((size_t)(slash - path) >= sizeof dir)
        return dh__set_error(DH_ERANGE, "%.64s...: path too long", path);
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    return dh__make_dirs(dir);
}

int dh__pin_to_current_cpu(void)
{
#ifdef HAVE_SCHED_SETAFFINITY
    int cpu = sched_getcpu();
    if (cpu < 0)
        return -errno;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof set, &set) == 0 ? 0 : -errno;
#else
    return -ENOSYS;
#endif
}
