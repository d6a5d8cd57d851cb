/* Placeholder until the grad kernels land. */
#include "pippin/op.h"
const pp_op pp_ops_grad[] = {{NULL}};
