/* pippin train's settings, shared by the local-runner path (cmd_train.c)
 * and the path with a thread and a transport per rank (train_ranks.c). */
#ifndef PIPPIN_TOOLS_TRAIN_ARGS_H
#define PIPPIN_TOOLS_TRAIN_ARGS_H

#include "cli_util.h"
#include "pippin/optim.h"
#include "split_args.h"

typedef struct train_args {
    pp_named_tensors data;
    const char *loss, *save, *schedule, *text, *vocab;
    const char *transport; /* NULL: local runner; inproc, ipc or tcp: a thread per rank */
    int seq;
    int no_split;
    pp_split_args split;
    long long batch, steps;
    int microbatches, json;
    pp_optim_config opt;
} train_args;

/* Milliseconds on a monotonic clock. */
double pp_cli_now_ms(void);
/* "step 3: loss 2.14 (12.5 ms, 320 samples/s)", or the --json line. */
void train_print_progress(long long step, const train_args *a, float loss, double ms);
/* Trains with every rank a thread owning a transport of kind a->transport
 * and an executor; returns the exit code (message set on failure). */
int train_over_transport(const pp_graph *g, pp_tensor *const *data, const train_args *a);

#endif
