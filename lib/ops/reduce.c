/* Placeholder until the reduce kernels land. */
#include "pippin/op.h"
const pp_op pp_ops_reduce[] = {{NULL}};
