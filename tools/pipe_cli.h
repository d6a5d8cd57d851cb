/* Running a model through the local pipeline runner from the command line:
 * shared by infer, grad and train. */
#ifndef PIPPIN_TOOLS_PIPE_CLI_H
#define PIPPIN_TOOLS_PIPE_CLI_H

#include "cli_util.h"
#include "pippin/runner.h"
#include "pippin/schedule.h"
#include "split_args.h"

/* 1 if g holds pippin::PipeSplit markers. */
int pp_cli_has_markers(const pp_graph *g);
/* A schedule orders stages: --schedule on a model run without stages is
 * refused rather than ignored. PP_OK when there is nothing to refuse. */
pp_status pp_cli_schedule_needs_stages(const char *schedule, int staged, int no_split, const char *hint);

/* Splits g (markers and/or sa's prefixes) and builds a runner. */
pp_status pp_cli_open_pipeline(const pp_graph *g, const pp_split_args *sa, int training, pp_pipe **pipe,
                               pp_runner **runner);

/* The action lists for a schedule kind ("gpipe", "1f1b", "interleaved-1f1b",
 * "zbv", "zb-h1", ... or "csv:FILE") over n_stages stages and m
 * microbatches; *out NULL for kind NULL (the runner's default, GPipe). */
pp_status pp_cli_schedule(const char *kind, int n_stages, int m, pp_schedule **out);

/* One runner step over whole-batch inputs named like the model's inputs. */
pp_status pp_cli_runner_step(pp_runner *r, int m, const pp_schedule *sched, const pp_named_tensors *in,
                             pp_tensor **outputs);

/* Writes DIR/<prefix><name>.npy for every trainable parameter of the given
 * stages of pipe p (values, or gradients when grads); a replicated
 * parameter only from the first stage holding it (the copies are equal).
 * *count (may be NULL) gets how many. */
pp_status pp_cli_save_stage_params(const pp_pipe *p, int n, pp_stage *const *stages, const char *dir,
                                   const char *prefix, int grads, int *count);
/* The same for every stage of a runner. */
pp_status pp_cli_save_runner_params(const pp_pipe *p, pp_runner *r, const char *dir, const char *prefix, int grads,
                                    int *count);

#endif
