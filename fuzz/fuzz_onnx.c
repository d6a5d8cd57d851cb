/* libFuzzer target: ONNX model decoding, graph building and checking. Any
 * input must give a graph or an error, never a crash or a leak. Bytes
 * parsed from memory have no directory, so an initializer with external
 * data is refused (after its entries are checked) before any file is
 * opened: no input reaches the file system (seed external.onnx).
 *
 * The same bytes also go through the file path with deferred weights
 * (pp_onnx_load_deferred, then the fill): written to model.onnx in a
 * private directory of its own, so external data named by an input can
 * only resolve inside that directory, which holds one side file,
 * model.data (256 KiB of floats, the location the seed names: large
 * enough for a parameter of 64 KiB and up to be deferred from it; seed
 * external_deferred.onnx holds a 128 KiB parameter there). When
 * the deferred load and its fill succeed, an eager load must give the same
 * bits. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/graph.h"
#include "pippin/log.h"
#include "pippin/onnx.h"

#define SIDE_FLOATS (64 * 1024)

static char model_dir[64], model_path[256], side_path[256];

static void remove_model(void) {
    remove(model_path);
    remove(side_path);
    remove(model_dir);
}

static int write_side_file(void) {
    FILE *f = fopen(side_path, "wb");
    if (!f) return 0;
    int ok = 1;
    for (int i = 0; i < SIDE_FLOATS && ok; i++) {
        float v = (float)(i % 251) * 0.25f - 31.0f;
        ok = fwrite(&v, sizeof v, 1, f) == 1;
    }
    return fclose(f) == 0 && ok;
}

static int write_model(const uint8_t *data, size_t size) {
    if (!model_path[0]) {
        snprintf(model_dir, sizeof model_dir, "/tmp/pippin-fuzz-onnx-XXXXXX");
        if (!mkdtemp(model_dir)) return 0;
        snprintf(model_path, sizeof model_path, "%s/model.onnx", model_dir);
        snprintf(side_path, sizeof side_path, "%s/model.data", model_dir);
        atexit(remove_model);
        if (!write_side_file()) return 0;
    }
    FILE *f = fopen(model_path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

/* A deferred load, filled, holds what an eager load of the same file
 * reads: anything else is a bug (abort, so libFuzzer keeps the input). */
static void same_as_eager(const pp_graph *filled) {
    pp_graph *g = NULL;
    if (pp_onnx_load(model_path, &g) != PP_OK) abort(); /* the deferred load and fill took it */
    if (g->n_values != filled->n_values) abort();
    for (int v = 0; v < g->n_values; v++) {
        const pp_tensor *a = g->values[v].data, *b = filled->values[v].data;
        if (!a != !b) abort();
        if (a && (a->nbytes != b->nbytes || (a->nbytes && memcmp(a->data, b->data, a->nbytes) != 0))) abort();
    }
    pp_graph_free(g);
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
        if (pp_onnx_deferred_fill(d, g) == PP_OK) same_as_eager(g);
        pp_onnx_deferred_free(d);
        pp_graph_free(g);
    }
    return 0;
}
