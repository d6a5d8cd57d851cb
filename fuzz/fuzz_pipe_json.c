/* libFuzzer target: pipe.json loading (stage files exist; the JSON is the
 * fuzzer's). Any input must load or give an error, never crash or leak. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "pippin/log.h"
#include "pippin/pipe.h"

static char dir[64];

/* A two-stage pipe of y = (x + w) + w, saved once, for stage files. */
static int make_stage_files(void) {
    snprintf(dir, sizeof dir, "/tmp/pippin-fuzz-pipe-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    pp_graph *g;
    if (pp_graph_new("fuzz", &g) != PP_OK) return -1;
    int64_t shape[] = {-1, 2}, wshape[] = {2};
    int x, w, n1, n2, split;
    pp_tensor *wt;
    pp_tensor_new(PP_F32, 1, wshape, &wt);
    pp_graph_add_input(g, "x", PP_F32, 2, shape, &x);
    pp_graph_add_initializer(g, "w", PP_VALUE_PARAM, wt, &w);
    int in1[] = {x, w};
    pp_graph_add_node(g, "Add", "", "a1", 2, in1, 1, NULL, &n1);
    int in2[] = {g->nodes[n1].out[0]};
    pp_graph_add_node(g, "PipeSplit", "pippin", "split", 1, in2, 1, NULL, &split);
    int in3[] = {g->nodes[split].out[0], w};
    pp_graph_add_node(g, "Add", "", "a2", 2, in3, 1, NULL, &n2);
    pp_graph_add_output(g, g->nodes[n2].out[0]);
    pp_pipe *p = NULL;
    int rc = pp_pipe_split(g, NULL, &p) == PP_OK && pp_pipe_save(p, dir) == PP_OK ? 0 : -1;
    pp_pipe_free(p);
    pp_graph_free(g);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready = 0;
    if (!ready) {
        pp_log_set_level(PP_LOG_OFF);
        if (make_stage_files() != 0) return 0;
        ready = 1;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/pipe.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    pp_pipe *p = NULL;
    if (pp_pipe_load(dir, &p) == PP_OK) pp_pipe_free(p);
    return 0;
}
