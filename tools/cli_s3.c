/* cli_s3.c: the S3 options of the commands that read data (probe, manifest, server):
 * `--s3-endpoint URL`, `--s3-profile NAME`, `--s3-anonymous`. Given any, the settings are
 * resolved at once (an error before any work, naming the variable, file or profile); given
 * none, at the first s3:// read, from the environment and the AWS files (docs/remote.md,
 * "S3"). */
#include <stdio.h>

#include "datahelix/error.h"
#include "cli.h"
#include "remote/remote_lib.h"

int dh_cli_s3_option(dh_cli_s3_t *s, int val, const char *arg)
{
    switch (val) {
    case DH_CLI_OPT_S3_ENDPOINT:
        s->endpoint = arg;
        break;
    case DH_CLI_OPT_S3_PROFILE:
        s->profile = arg;
        break;
    case DH_CLI_OPT_S3_ANONYMOUS:
        s->anonymous = 1;
        break;
    default:
        return 0;
    }
    s->given = 1;
    return 1;
}

int dh_cli_s3_apply(const char *cmd, const dh_cli_s3_t *s)
{
    if (!s->given)
        return 0;
    dh__remote_s3_settings_t settings = {
        .endpoint_url = s->endpoint, .profile = s->profile, .anonymous = s->anonymous != 0};
    int rc = dh__remote_s3_configure(&settings);
    if (rc < 0) {
        fprintf(stderr, "datahelix %s: S3 settings: %s\n", cmd, dh_last_error());
        return -1;
    }
    return 0;
}
