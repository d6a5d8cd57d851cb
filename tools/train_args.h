/* pippin train's settings, shared by the local-runner path (cmd_train.c)
 * and the path with a thread and a transport per rank (train_ranks.c). */
#ifndef PIPPIN_TOOLS_TRAIN_ARGS_H
#define PIPPIN_TOOLS_TRAIN_ARGS_H

#include "cli_util.h"
#include "pippin/executor.h"
#include "pippin/sched_trace.h"
#include "pippin/optim.h"
#include "split_args.h"
#include "checkpoint_sync.h"

typedef struct train_args {
    pp_named_tensors data;
    const char *loss, *save, *schedule, *text, *vocab;
    const char *transport; /* NULL: local runner; inproc, ipc or tcp: a thread per rank */
    int seq;
    int no_split;
    pp_split_args split;
    long long batch, steps;
    int microbatches, json;
    int quiet;             /* no informational lines (workers other than rank 0) */
    const char *trace, *svg; /* timeline of the last step: Chrome trace JSON, SVG */
    const char *checkpoint;  /* directory for checkpoints, NULL: none */
    long long checkpoint_every; /* steps between checkpoints (and one at the end); 0: end only */
    int resume;              /* start from the newest committed checkpoint in `checkpoint` */
    int checkpoint_keep;     /* committed checkpoints kept; 0: 2 */
    int training;          /* 0: forward only (pippin worker in infer mode) */
    pp_optim_config opt;
    int recompute;         /* --recompute: every stage recomputes its forward before I */
    int n_recompute_stages;
    int recompute_stages[64]; /* --recompute-stages 0,2: these stages only */
} train_args;

/* One rank of a run over a transport (train_ranks.c). */
typedef struct rank_job {
    int rank;
    const train_args *a;
    int n_inputs;
    const char *const *input_names; /* the model inputs, in data's order */
    pp_tensor *const *data;  /* per model input */
    pp_pipe *p;
    pp_transport *t;         /* owned by the rank's thread once it runs */
    const pp_schedule *sched;
    pp_executor *ex;
    int loss_output;         /* index of the loss among the model outputs, -1 if none */
    struct pp_trace *trace;  /* records the last step when not NULL */
    double trace_origin_ms;
    pp_status status;
    char error[1024];
} rank_job;

/* Runs a->steps steps on one rank (a thread's body: arg is a rank_job);
 * closes the job's transport and executor. */
void *train_rank_main(void *arg);
/* Index of the pipe's loss among its outputs, -1 if none. */
int pp_cli_loss_output(const pp_pipe *p);

/* --text: windows of a->text become a->data for the model's first two
 * int64 inputs (tokens, next tokens). */
pp_status train_text_inputs(const pp_graph *g, train_args *a);
/* The same for named inputs; model_seq is used unless a->seq is set. */
pp_status train_text_data(train_args *a, const char *tokens, const char *targets, int model_seq);

/* The checkpoint protocol for this rank's n stages (t NULL: this process
 * holds all n_total stages). */
void train_ckpt_init(const train_args *a, pp_transport *t, const pp_schedule *sched, int rank, int n_total, int n,
                     pp_stage *const *stages, pp_optim *const *optims, pp_ckpt_sync *ck);
/* Starts the checkpoints: resumes from a->checkpoint's newest committed
 * step (when a->resume; *first_step gets the step after it), or checks that
 * the directory holds no committed step of another run. Collective. */
pp_status train_resume(pp_ckpt_sync *ck, const train_args *a, long long *first_step);
/* Saves and commits `step` when the checkpoint settings ask. Collective. */
pp_status train_checkpoint(pp_ckpt_sync *ck, const train_args *a, long long step);

/* --recompute / --recompute-stages for this process's n stages (n_total in
 * the pipe): checks the indices, turns recomputation on. */
pp_status train_set_recompute(const train_args *a, int n_total, pp_stage *const *stages, int n);

/* Writes a->trace / a->svg from a recorded trace (nothing if neither). */
pp_status train_save_trace(const train_args *a, const struct pp_trace *t);

/* Milliseconds on a monotonic clock. */
double pp_cli_now_ms(void);
/* "step 3: loss 2.14 (12.5 ms, 320 samples/s)", or the --json line. */
void train_print_progress(long long step, const train_args *a, float loss, double ms);
/* Trains with every rank a thread owning a transport of kind a->transport
 * and an executor; returns the exit code (message set on failure). The
 * stages take g's parameters (pp_pipe_split_take). */
int train_over_transport(pp_graph *g, pp_tensor *const *data, const train_args *a);

#endif
