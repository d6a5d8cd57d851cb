/* Import-time conversion of default-domain op versions (opsets 7 to 21) to
 * the forms pippin's kernels run; see onnx_upgrade.c. */
#ifndef PP_ONNX_UPGRADE_H
#define PP_ONNX_UPGRADE_H

#include "pippin/graph.h"

#define PP_OPSET_MIN 7
#define PP_OPSET_MAX 21
#define PP_IR_VERSION_MAX 10

/* Rewrites or refuses (PP_ERR_UNSUPPORTED, naming the node, the opset and
 * what differs) the nodes of g, read from file at the given opset, whose op
 * version differs from what pippin runs. Called before pp_graph_resolve. */
pp_status pp_onnx_upgrade(pp_graph *g, int opset, const char *file);

#endif
