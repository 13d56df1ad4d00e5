/* cli_experiment.c: the command-line side of the experiment's option table
 * (bench/experiment.h), shared by `bench` and `simulate`: getopt_long entries for the
 * command's options, and setting one from its argument, with the same checks and messages
 * in both commands. */
#include <getopt.h>
#include <stdio.h>

#include "datahelix/error.h"
#include "bench/experiment.h"
#include "cli.h"

size_t dh_cli_experiment_longopts(unsigned command, struct option *opts, size_t n, size_t cap)
{
    size_t count;
    const dh_experiment_option_t *table = dh_experiment_options(&count);
    for (size_t i = 0; i < count; i++) {
        if (!(table[i].commands & command))
            continue;
        if (n + 1 >= cap) /* room for the terminating entry */
            break;
        opts[n].name = table[i].name;
        opts[n].has_arg = table[i].arg ? required_argument : no_argument;
        opts[n].flag = NULL;
        opts[n].val = DH_CLI_EXPERIMENT_VAL + (int)i;
        n++;
    }
    opts[n] = (struct option){0, 0, 0, 0};
    return n;
}

int dh_cli_experiment_option(const char *cmd, unsigned command, int val, const char *arg,
                             struct dh_bench_options *opt)
{
    size_t count;
    dh_experiment_options(&count);
    if (val < DH_CLI_EXPERIMENT_VAL || (size_t)(val - DH_CLI_EXPERIMENT_VAL) >= count)
        return 0;
    if (dh_experiment_option_set(opt, (size_t)(val - DH_CLI_EXPERIMENT_VAL), arg, command)) {
        fprintf(stderr, "datahelix %s: %s\n", cmd, dh_last_error());
        return -1;
    }
    return 1;
}
