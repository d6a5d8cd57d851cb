/* Placeholder until the matmul kernels land. */
#include "pippin/op.h"
const pp_op pp_ops_matmul[] = {{NULL}};
