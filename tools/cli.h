/* cli.h: the subcommands of the `datahelix` command. Each is thin: it parses its arguments
 * (getopt_long), calls the library, prints. Each returns the process exit status:
 * 0 success, 1 failure (message already printed), 2 usage error. */
#ifndef DH_TOOLS_CLI_H
#define DH_TOOLS_CLI_H

#include <stddef.h>

int dh_cmd_plan(int argc, char **argv);
int dh_cmd_place_bench(int argc, char **argv);
int dh_cmd_gen_profiles(int argc, char **argv);
int dh_cmd_synth(int argc, char **argv);
int dh_cmd_manifest(int argc, char **argv);
int dh_cmd_probe(int argc, char **argv);
int dh_cmd_decode_bench(int argc, char **argv);
int dh_cmd_coordinator(int argc, char **argv);
int dh_cmd_server(int argc, char **argv);
int dh_cmd_consume(int argc, char **argv);
int dh_cmd_transport_bench(int argc, char **argv);
int dh_cmd_rebalance_bench(int argc, char **argv);
int dh_cmd_bench(int argc, char **argv);
int dh_cmd_simulate(int argc, char **argv);
int dh_cmd_keygen(int argc, char **argv);

/* Prints "datahelix CMD: MESSAGE: dh_last_error()" for a library error and returns 1. */
int dh_cli_fail(const char *cmd, int err, const char *what);

/* Fails with a usage error naming the first argument left after option parsing, if any.
 * Returns 0, or -1 after printing "datahelix CMD: unexpected argument 'X'". */
int dh_cli_no_extra_args(const char *cmd, int argc, char **argv, int first);

/* The CURVE key directory and key name from $DATAHELIX_KEYS and $DATAHELIX_KEY (each left
 * as is when unset or empty), the defaults of --keys and --key. */
void dh_cli_keys_from_env(const char **keys_dir, const char **key_name);

/* Parses a positive/non-negative integer option value; prints a usage error naming the
 * option and returns -1 on bad input. */
int dh_cli_parse_u64(const char *cmd, const char *option, const char *text, unsigned long long min,
                     unsigned long long max, unsigned long long *out);

/* The experiment's shared options (bench/experiment.h; cli_experiment.c): getopt_long values
 * from DH_CLI_EXPERIMENT_VAL up are rows of its table. */
#define DH_CLI_EXPERIMENT_VAL 1000
struct option;
struct dh_bench_options;

/* Appends the options of `command` (DH_EXPERIMENT_BENCH or _SIMULATE) to opts[0, n) and
 * terminates the list; cap counts the terminating entry. Returns the new count. */
size_t dh_cli_experiment_longopts(unsigned command, struct option *opts, size_t n, size_t cap);

/* Applies getopt_long's `val` when it is an experiment option: returns 1 when it set the
 * field, 0 when val is not one, -1 after printing "datahelix CMD: MESSAGE" (a usage error). */
int dh_cli_experiment_option(const char *cmd, unsigned command, int val, const char *arg,
                             struct dh_bench_options *opt);

/* Writes "PORT\n" to path (through a rename, so a reader sees all or nothing). Returns 0, or
 * -1 after printing "datahelix CMD: --metrics-port-file PATH: ERROR" (cli_port_file.c). */
int dh_cli_write_port_file(const char *cmd, const char *path, unsigned port);

/* The S3 options of the commands that read data (cli_s3.c): put DH_CLI_S3_LONGOPTS in the
 * option table, pass each getopt_long value to dh_cli_s3_option (1: it was one), then call
 * dh_cli_s3_apply before reading. */
enum { DH_CLI_OPT_S3_ENDPOINT = 0x300, DH_CLI_OPT_S3_PROFILE, DH_CLI_OPT_S3_ANONYMOUS };
#define DH_CLI_S3_LONGOPTS                                                                         \
    {"s3-endpoint", required_argument, NULL, DH_CLI_OPT_S3_ENDPOINT},                              \
        {"s3-profile", required_argument, NULL, DH_CLI_OPT_S3_PROFILE},                            \
    {                                                                                              \
        "s3-anonymous", no_argument, NULL, DH_CLI_OPT_S3_ANONYMOUS                                 \
    }
#define DH_CLI_S3_USAGE                                                                            \
    "      --s3-endpoint URL       the endpoint of s3:// URLs, http(s)://HOST[:PORT]\n"            \
    "                              (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the\n"       \
    "                              profile's endpoint_url, else AWS)\n"                            \
    "      --s3-profile NAME       the AWS profile of the keys and settings (default:\n"           \
    "                              $AWS_PROFILE, else the keys of the environment, else\n"         \
    "                              'default')\n"                                                   \
    "      --s3-anonymous          send s3:// requests unsigned (public buckets)\n"
typedef struct dh_cli_s3 {
    const char *endpoint, *profile;
    int anonymous, given;
} dh_cli_s3_t;
int dh_cli_s3_option(dh_cli_s3_t *s, int val, const char *arg);
/* Resolves the S3 settings now when an option was given: 0, or -1 after printing
 * "datahelix CMD: S3 settings: MESSAGE". */
int dh_cli_s3_apply(const char *cmd, const dh_cli_s3_t *s);

#endif
