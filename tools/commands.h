/* The pippin command's subcommands. Each takes argc/argv with argv[0] the
 * subcommand name and returns the process exit code (0 ok, 1 failure,
 * 2 usage error). */
#ifndef PIPPIN_TOOLS_COMMANDS_H
#define PIPPIN_TOOLS_COMMANDS_H

typedef int (*pp_command_fn)(int argc, char **argv);

typedef struct pp_command {
    const char *name;
    pp_command_fn run;
    const char *summary;
} pp_command;

/* Prints "pippin NAME: <last error>" to stderr and returns 1. */
int pp_cli_fail(const char *cmd);

int cmd_inspect(int argc, char **argv);
int cmd_infer(int argc, char **argv);
int cmd_schedule(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_split(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_checkpoint(int argc, char **argv);
int cmd_request(int argc, char **argv);
int cmd_generate(int argc, char **argv);

#endif
