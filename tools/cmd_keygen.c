/* cmd_keygen.c: `datahelix keygen -o DIR/NAME`, a CURVE key pair for the job's key directory
 * (wire.h "Authentication", docs/security.md). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "datahelix/wire.h"
#include "cli.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: datahelix keygen -o DIR/NAME\n"
                 "\n"
                 "Makes a CURVE key pair for authenticated, encrypted transport: DIR/NAME.secret\n"
                 "(mode 0600; keep it on the hosts that use it) and DIR/NAME.pub (share it).\n"
                 "A process started with --keys DIR (or $DATAHELIX_KEYS=DIR) admits a peer only\n"
                 "when the peer's public key is one of DIR/*.pub. Every job needs the server key:\n"
                 "  datahelix keygen -o DIR/server     the key of every socket that binds tcp://\n"
                 "                                     (coordinator, local DataServers)\n"
                 "and may give each host or rank its own identity (--key NAME / $DATAHELIX_KEY):\n"
                 "  datahelix keygen -o DIR/node-a     then copy node-a.pub to every host's DIR\n"
                 "Existing files are never overwritten. Prints the public key.\n"
                 "\n"
                 "options:\n"
                 "  -o, --output DIR/NAME   where to write NAME.secret and NAME.pub (required)\n"
                 "  -h, --help              show this help\n"
                 "\n"
                 "Exit status: 0 written, 1 failure, 2 usage error.\n");
}

int dh_cmd_keygen(int argc, char **argv)
{
    static const struct option options[] = {{"output", required_argument, NULL, 'o'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    const char *prefix = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        switch (opt) {
        case 'o':
            prefix = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (dh_cli_no_extra_args("keygen", argc, argv, optind))
        return 2;
    if (!prefix || !prefix[0] || prefix[strlen(prefix) - 1] == '/') {
        fprintf(stderr, "datahelix keygen: -o DIR/NAME is required (see --help)\n");
        return 2;
    }
    char pub[41];
    int rc = dh_wire_keygen(prefix, pub);
    if (rc)
        return dh_cli_fail("keygen", rc, "cannot write the key pair");
    printf("%s\n", pub);
    fprintf(stderr, "datahelix keygen: wrote %s.secret and %s.pub\n", prefix, prefix);
    return 0;
}
