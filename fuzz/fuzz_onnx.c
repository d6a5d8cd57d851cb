/* libFuzzer target: ONNX model decoding, graph building and checking. Any
 * input must give a graph or an error, never a crash or a leak. Bytes
 * parsed from memory have no directory, so an initializer with external
 * data is refused (after its entries are checked) before any file is
 * opened: no input reaches the file system (seed external.onnx). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "pippin/log.h"
#include "pippin/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_log_set_level(PP_LOG_OFF);
    pp_graph *g = NULL;
    if (pp_onnx_parse(data, size, "fuzz.onnx", &g) == PP_OK) pp_graph_free(g);
    pp_tensor *t = NULL;
    char *name = NULL;
    if (pp_onnx_tensor_parse(data, size, "fuzz.pb", &t, &name) == PP_OK) pp_tensor_free(t);
    free(name);
    return 0;
}
