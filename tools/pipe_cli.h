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

/* Splits g (markers and/or sa's prefixes) and builds a runner. The stages
 * take g's parameters (pp_pipe_split_take), and g lets go of its tensors:
 * the model is not held twice. g may afterwards be read for names only. */
pp_status pp_cli_open_pipeline(pp_graph *g, const pp_split_args *sa, int training, pp_pipe **pipe,
                               pp_runner **runner);

/* One runner step over whole-batch inputs named like the model's inputs. */
pp_status pp_cli_runner_step(pp_runner *r, int m, const pp_schedule *sched, const pp_named_tensors *in,
                             pp_tensor **outputs);

/* pp_save_stage_params (runtime/param_files.h) for every stage of a runner. */
pp_status pp_cli_save_runner_params(const pp_pipe *p, pp_runner *r, const char *dir, const char *prefix, int grads,
                                    int *count);

#endif
