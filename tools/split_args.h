/* The split-spec options shared by split, inspect, infer, grad and train:
 * --split-before PREFIX, --split-after PREFIX (repeatable),
 * --transmit-shared, --dim NAME=N, --freeze PATTERN (repeatable) and
 * --marker-identity PATTERN (Identity nodes matching it are stage markers),
 * which apply to the model loaded with pp_split_args_load; --auto N (balanced
 * stages from measured node costs) and --split-even N (as many compute
 * nodes per stage), which pp_split_args_load turns into cut positions
 * (tools/split_balance.c), with --auto-memory-cap BYTES, --auto-batch B,
 * --auto-cost time|flops and --auto-bandwidth GBPS. */
#ifndef PIPPIN_TOOLS_SPLIT_ARGS_H
#define PIPPIN_TOOLS_SPLIT_ARGS_H

#include <stdio.h>

#include "pippin/onnx.h"
#include "pippin/pipe.h"

typedef struct pp_split_args {
    int n_before, n_after, n_dims, n_freeze;
    const char *before[64], *after[64], *dims[16], *freeze[64];
    int transmit_shared;
    const char *loss; /* --loss, set by the command */
    int auto_stages;         /* --auto N */
    int even_stages;         /* --split-even N */
    double auto_memory_cap;  /* --auto-memory-cap BYTES; 0: none */
    int auto_batch;          /* --auto-batch B; 0: the command's microbatch size, else 8 */
    int auto_flops;          /* --auto-cost flops */
    double auto_gbps;        /* --auto-bandwidth GB/s for the cut term; default 10 */
    int microbatches;        /* set by the command: M for the memory term and the simulation */
    FILE *report;            /* set by the command: where the chosen cuts are printed (NULL: nowhere) */
    const char *marker_identity; /* --marker-identity PATTERN; NULL: none */
    int n_cut_at;            /* the cuts pp_split_args_load chose */
    int *cut_at;
} pp_split_args;

/* getopt_long option codes used by these flags. */
enum {
    PP_OPT_SPLIT_BEFORE = 1000,
    PP_OPT_SPLIT_AFTER,
    PP_OPT_TRANSMIT,
    PP_OPT_DIM,
    PP_OPT_FREEZE,
    PP_OPT_AUTO,
    PP_OPT_EVEN,
    PP_OPT_AUTO_MEM,
    PP_OPT_AUTO_BATCH,
    PP_OPT_AUTO_COST,
    PP_OPT_AUTO_BW,
    PP_OPT_MARKER_IDENTITY
};

#define PP_SPLIT_LONG_OPTIONS                                              \
    {"split-before", required_argument, NULL, PP_OPT_SPLIT_BEFORE},        \
    {"split-after", required_argument, NULL, PP_OPT_SPLIT_AFTER},          \
    {"transmit-shared", no_argument, NULL, PP_OPT_TRANSMIT},               \
    {"dim", required_argument, NULL, PP_OPT_DIM},                          \
    {"freeze", required_argument, NULL, PP_OPT_FREEZE},                    \
    {"auto", required_argument, NULL, PP_OPT_AUTO},                        \
    {"split-even", required_argument, NULL, PP_OPT_EVEN},                  \
    {"auto-memory-cap", required_argument, NULL, PP_OPT_AUTO_MEM},         \
    {"auto-batch", required_argument, NULL, PP_OPT_AUTO_BATCH},            \
    {"auto-cost", required_argument, NULL, PP_OPT_AUTO_COST},              \
    {"auto-bandwidth", required_argument, NULL, PP_OPT_AUTO_BW},          \
    {"marker-identity", required_argument, NULL, PP_OPT_MARKER_IDENTITY}

/* Handles one getopt code; returns 1 if it was a split flag, 0 if not, -1
 * on an error (message printed). */
int pp_split_args_handle(pp_split_args *a, int code, const char *arg, const char *cmd);
/* The spec the args describe (pointers into a). */
pp_split_spec pp_split_args_spec(const pp_split_args *a);
/* 1 if the args ask for a split (a prefix given) */
int pp_split_args_any(const pp_split_args *a);
/* Loads the model and freezes the --freeze patterns; a pattern that matches
 * no trainable initializer is an error naming it. With --auto or
 * --split-even, chooses the cuts (a->cut_at; pp_split_args_spec hands them
 * on) and prints them to a->report. */
pp_status pp_split_args_load(pp_split_args *a, const char *path, pp_graph **out);
/* The same with the large weights left unread (pp_onnx_load_deferred;
 * *deferred NULL when they were read: --auto times the nodes, --freeze
 * makes constants of parameters). */
pp_status pp_split_args_load_deferred(pp_split_args *a, const char *path, pp_graph **out,
                                      pp_onnx_deferred **deferred);
/* --auto / --split-even: measures node costs of g, picks the cuts into
 * a->cut_at and prints the plan with the simulated comparison
 * (tools/split_balance.c). */
pp_status pp_split_args_balance(pp_split_args *a, const pp_graph *g);
/* Frees what pp_split_args_load allocated. */
void pp_split_args_free(pp_split_args *a);

#endif
