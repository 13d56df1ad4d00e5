/* datahelix.c: entry point of the `datahelix` command; dispatches to subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "cli.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command_t;

static const command_t commands[] = {
    {"gen-profiles", dh_cmd_gen_profiles, "write a synthetic profile set drawn from a mix"},
    {"plan", dh_cmd_plan, "run the tier-1 planner over a profile file and report balance"},
    {"place-bench", dh_cmd_place_bench, "benchmark the deadline placement policy"},
    {"synth", dh_cmd_synth, "write a synthetic video data set (H.264 clips and a manifest)"},
    {"manifest", dh_cmd_manifest,
     "write a manifest from a folder of clips, a CSV/TSV/JSONL table or tar shards"},
    {"probe", dh_cmd_probe, "profile a data set from container metadata, calibrated costs"},
    {"decode-bench", dh_cmd_decode_bench, "decode throughput per core against ffmpeg and PyAV"},
    {"coordinator", dh_cmd_coordinator, "run the coordinator (registry, liveness, placement)"},
    {"server", dh_cmd_server, "run a DataServer (local, or a remote sidecar)"},
    {"consume", dh_cmd_consume, "run one rank's data loop (a client) and write a ledger"},
    {"transport-bench", dh_cmd_transport_bench, "local delivery overhead and remote throughput"},
    {"rebalance-bench", dh_cmd_rebalance_bench, "cost of moving decoded clips between ranks"},
    {"bench", dh_cmd_bench, "the emulated training loop: native vs pool vs helix"},
    {"simulate", dh_cmd_simulate, "the training loop in virtual time (discrete-event simulator)"},
    {"keygen", dh_cmd_keygen, "make a CURVE key pair for authenticated, encrypted transport"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: datahelix COMMAND [OPTIONS]\n\n"
                 "DataHelix: a cluster-level data plane for video and multimodal training.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'datahelix COMMAND --help' describes a command's options.\n");
}

int dh_cli_fail(const char *cmd, int err, const char *what)
{
    const char *detail = dh_last_error();
    if (detail && detail[0])
        fprintf(stderr, "datahelix %s: %s: %s (%s)\n", cmd, what, detail, dh_err_name(err));
    else
        fprintf(stderr, "datahelix %s: %s: %s (%s)\n", cmd, what, dh_strerror(err),
                dh_err_name(err));
    return 1;
}

void dh_cli_keys_from_env(const char **keys_dir, const char **key_name)
{
    const char *dir = getenv("DATAHELIX_KEYS"), *name = getenv("DATAHELIX_KEY");
    if (dir && dir[0])
        *keys_dir = dir;
    if (name && name[0])
        *key_name = name;
}

int dh_cli_no_extra_args(const char *cmd, int argc, char **argv, int first)
{
    if (first >= argc)
        return 0;
    fprintf(stderr, "datahelix %s: unexpected argument '%s'\n", cmd, argv[first]);
    return -1;
}

int dh_cli_parse_u64(const char *cmd, const char *option, const char *text, unsigned long long min,
                     unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    errno = 0;
    if (!text || !*text || *text == '-')
        goto bad;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end != '\0' || v < min || v > max)
        goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "datahelix %s: %s expects an integer in [%llu, %llu], got '%s'\n", cmd, option,
            min, max, text ? text : "");
    return -1;
}

/* A faults build (tests only) arms a site from DH_FAULT_ARM=SITE:SKIP, so that a test can
 * sweep a site of the CLI run as a process (docs/testing.md, "Fault injection"). */
static void arm_fault_from_env(void)
{
    const char *arm = getenv("DH_FAULT_ARM");
    long site, skip;
    if (dh_fault_enabled() && arm && sscanf(arm, "%ld:%ld", &site, &skip) == 2)
        dh_fault_arm((dh_fault_site_t)site, skip);
}

int main(int argc, char **argv)
{
    arm_fault_from_env();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "datahelix: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
