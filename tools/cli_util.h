/* Helpers shared by the pippin subcommands. */
#ifndef PIPPIN_TOOLS_CLI_UTIL_H
#define PIPPIN_TOOLS_CLI_UTIL_H

#include "pippin/graph.h"
#include "param_files.h" /* pp_mkdirs, pp_save_named_npy, pp_file_safe_name */
#include "pippin/tensor.h"

/* A list of NAME=FILE.npy arguments, loaded. */
typedef struct pp_named_tensors {
    int n;
    char **names;
    pp_tensor **tensors;
} pp_named_tensors;

/* Parses "NAME=FILE.npy" and loads the file; errors name the argument. */
pp_status pp_cli_add_named_npy(pp_named_tensors *nt, const char *arg);
void pp_cli_named_free(pp_named_tensors *nt);
/* Orders nt to match g's inputs: out[i] feeds g->inputs[i] (borrowed).
 * Unknown names and missing inputs are errors listing the expected names. */
pp_status pp_cli_match_inputs(const pp_graph *g, const pp_named_tensors *nt, pp_tensor **out);
/* Describes a value's type, e.g. "float32[batch,16]". */
const char *pp_cli_value_type(const pp_value *v, char *buf, size_t cap);

#endif
