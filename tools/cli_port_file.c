/* cli_port_file.c: `--metrics-port-file FILE` of the daemons: the port a daemon bound, written
 * once it serves, so a script or a test that started it with `--metrics-listen HOST:0` waits
 * for the file instead of parsing the log or sleeping. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

int dh_cli_write_port_file(const char *cmd, const char *path, unsigned port)
{
    /* Written beside it and renamed into place: a reader sees no file or the whole line. */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        fprintf(stderr, "datahelix %s: --metrics-port-file: path too long\n", cmd);
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "datahelix %s: --metrics-port-file %s: %s\n", cmd, path, strerror(errno));
        return -1;
    }
    return 0;
}
