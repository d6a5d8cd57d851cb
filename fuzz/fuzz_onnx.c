/* libFuzzer target: ONNX model decoding, graph building and checking. Any
 * input must give a graph or an error, never a crash or a leak. Bytes
 * parsed from memory have no directory, so an initializer with external
 * data is refused (after its entries are checked) before any file is
 * opened: no input reaches the file system (seed external.onnx).
 *
 * The same bytes also go through the file path with deferred weights
 * (pp_onnx_load_deferred, then the fill): written to model.onnx in a
 * private directory of its own, so external data named by an input can
 * only resolve inside that empty directory. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/log.h"
#include "pippin/onnx.h"

static char model_dir[64], model_path[256];

static void remove_model(void) {
    remove(model_path);
    remove(model_dir);
}

static int write_model(const uint8_t *data, size_t size) {
    if (!model_path[0]) {
        snprintf(model_dir, sizeof model_dir, "/tmp/pippin-fuzz-onnx-XXXXXX");
        if (!mkdtemp(model_dir)) return 0;
        snprintf(model_path, sizeof model_path, "%s/model.onnx", model_dir);
        atexit(remove_model);
    }
    FILE *f = fopen(model_path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_log_set_level(PP_LOG_OFF);
    pp_graph *g = NULL;
    if (pp_onnx_parse(data, size, "fuzz.onnx", &g) == PP_OK) pp_graph_free(g);
    pp_tensor *t = NULL;
    char *name = NULL;
    if (pp_onnx_tensor_parse(data, size, "fuzz.pb", &t, &name) == PP_OK) pp_tensor_free(t);
    free(name);
    pp_onnx_deferred *d = NULL;
    g = NULL;
    if (write_model(data, size) && pp_onnx_load_deferred(model_path, &g, &d) == PP_OK) {
        (void)pp_onnx_deferred_fill(d, g);
        pp_onnx_deferred_free(d);
        pp_graph_free(g);
    }
    return 0;
}
