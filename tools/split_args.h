/* The split-spec options shared by split, inspect, infer, grad and train:
 * --split-before PREFIX, --split-after PREFIX (repeatable),
 * --transmit-shared, --dim NAME=N, and --freeze PATTERN (repeatable), which
 * applies to the model loaded with pp_split_args_load. */
#ifndef PIPPIN_TOOLS_SPLIT_ARGS_H
#define PIPPIN_TOOLS_SPLIT_ARGS_H

#include "pippin/pipe.h"

typedef struct pp_split_args {
    int n_before, n_after, n_dims, n_freeze;
    const char *before[64], *after[64], *dims[16], *freeze[64];
    int transmit_shared;
    const char *loss; /* --loss, set by the command */
} pp_split_args;

/* getopt_long option codes used by these flags. */
enum { PP_OPT_SPLIT_BEFORE = 1000, PP_OPT_SPLIT_AFTER, PP_OPT_TRANSMIT, PP_OPT_DIM, PP_OPT_FREEZE };

#define PP_SPLIT_LONG_OPTIONS                                              \
    {"split-before", required_argument, NULL, PP_OPT_SPLIT_BEFORE},        \
    {"split-after", required_argument, NULL, PP_OPT_SPLIT_AFTER},          \
    {"transmit-shared", no_argument, NULL, PP_OPT_TRANSMIT},               \
    {"dim", required_argument, NULL, PP_OPT_DIM},                          \
    {"freeze", required_argument, NULL, PP_OPT_FREEZE}

/* Handles one getopt code; returns 1 if it was a split flag, 0 if not, -1
 * on an error (message printed). */
int pp_split_args_handle(pp_split_args *a, int code, const char *arg, const char *cmd);
/* The spec the args describe (pointers into a). */
pp_split_spec pp_split_args_spec(const pp_split_args *a);
/* 1 if the args ask for a split (a prefix given) */
int pp_split_args_any(const pp_split_args *a);
/* Loads the model and freezes the --freeze patterns; a pattern that matches
 * no trainable initializer is an error naming it. */
pp_status pp_split_args_load(const pp_split_args *a, const char *path, pp_graph **out);

#endif
