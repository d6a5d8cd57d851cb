/* Placeholder until the elementwise kernels land. */
#include "pippin/op.h"
const pp_op pp_ops_elementwise[] = {{NULL}};
