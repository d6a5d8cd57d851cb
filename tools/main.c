/* pippin: the command-line front end; dispatches to a subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "pippin/exec.h"
#include "pippin/status.h"
#include "pippin/version.h"

static const pp_command commands[] = {
    {"inspect", cmd_inspect, "show a model's inputs, outputs, ops, parameters and stages"},
    {"infer", cmd_infer, "run a model on .npy inputs and write its outputs"},
    {"schedule", cmd_schedule, "print a pipeline schedule's per-rank action lists"},
    {"simulate", cmd_simulate, "simulate a schedule: makespan, bubble, peak memory"},
    {"keygen", cmd_keygen, "make a CURVE key pair for encrypted links"},
    {"split", cmd_split, "cut a model into stage files and pipe.json"},
    {"grad", cmd_grad, "loss and parameter gradients of a model on one batch"},
    {"train", cmd_train, "train a model on .npy data with SGD or AdamW (one process)"},
    {"worker", cmd_worker, "run one rank of a pipeline from a YAML config"},
    {"run", cmd_run, "run every rank of a YAML config as local worker processes"},
    {"checkpoint", cmd_checkpoint, "list, inspect and export training checkpoints"},
    {"request", cmd_request, "send one request to a serving pipeline (mode: serve)"},
    {"generate", cmd_generate, "generate text or tokens with a serving pipeline (mode: serve)"},
    {NULL, NULL, NULL},
};

int pp_cli_fail(const char *cmd) {
    fprintf(stderr, "pippin %s: %s\n", cmd, pp_last_error());
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: pippin COMMAND [ARGS...]\n\ncommands:\n");
    for (const pp_command *c = commands; c->name; c++)
        fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "\n'pippin COMMAND --help' describes one command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("pippin %s\n", pp_version());
        return 0;
    }
    /* pippin's kernel pool and the BLAS start with the same count
     * (PIPPIN_THREADS, else the CPUs this process may use); worker, run and
     * train --transport then give each rank its share. */
    pp_set_threads(pp_default_threads(1));
    pp_tune_allocator(); /* glibc's thresholds for a rank (pippin/exec.h) */
    for (const pp_command *c = commands; c->name; c++)
        if (strcmp(argv[1], c->name) == 0) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "pippin: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
