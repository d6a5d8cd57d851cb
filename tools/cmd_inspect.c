/* pippin inspect: a model's inputs, outputs, op counts, parameters and
 * pipe-split markers, as text or JSON. */
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "pippin/pippin.h"

typedef struct {
    const char *op;
    int count;
} op_count;

static int cmp_count(const void *a, const void *b) {
    const op_count *x = a, *y = b;
    if (x->count != y->count) return y->count - x->count;
    return strcmp(x->op, y->op);
}

/* Distinct op types with their counts, most frequent first. */
static int count_ops(const pp_graph *g, op_count *out) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        int k = 0;
        while (k < n && strcmp(out[k].op, g->nodes[i].op_type) != 0) k++;
        if (k == n) out[n++] = (op_count){g->nodes[i].op_type, 0};
        out[k].count++;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_count);
    return n;
}

static int is_pipe_split(const pp_node *n) {
    return strcmp(n->op_type, "PipeSplit") == 0 && strcmp(n->domain, "pippin") == 0;
}

static json_object *values_json(const pp_graph *g, const int *ids, int n) {
    json_object *arr = json_object_new_array();
    for (int i = 0; i < n; i++) {
        const pp_value *v = &g->values[ids[i]];
        json_object *o = json_object_new_object();
        json_object_object_add(o, "name", json_object_new_string(v->name));
        json_object_object_add(o, "dtype", json_object_new_string(pp_dtype_name(v->dtype)));
        json_object *shape = json_object_new_array();
        for (int d = 0; d < v->ndim; d++) {
            if (v->dim_names[d]) json_object_array_add(shape, json_object_new_string(v->dim_names[d]));
            else if (v->shape[d] < 0) json_object_array_add(shape, NULL);
            else json_object_array_add(shape, json_object_new_int64(v->shape[d]));
        }
        json_object_object_add(o, "shape", v->ndim >= 0 ? shape : (json_object_put(shape), NULL));
        json_object_array_add(arr, o);
    }
    return arr;
}

static void print_json(const pp_graph *g, const op_count *ops, int n_ops) {
    int64_t count, bytes;
    pp_graph_param_stats(g, &count, &bytes);
    json_object *root = json_object_new_object();
    json_object_object_add(root, "model", json_object_new_string(g->source ? g->source : g->name));
    json_object_object_add(root, "opset", json_object_new_int(g->opset));
    json_object_object_add(root, "inputs", values_json(g, g->inputs, g->n_inputs));
    json_object_object_add(root, "outputs", values_json(g, g->outputs, g->n_outputs));
    json_object_object_add(root, "nodes", json_object_new_int(g->n_nodes));
    json_object *jops = json_object_new_object();
    for (int i = 0; i < n_ops; i++) json_object_object_add(jops, ops[i].op, json_object_new_int(ops[i].count));
    json_object_object_add(root, "ops", jops);
    json_object_object_add(root, "parameters", json_object_new_int64(count));
    json_object_object_add(root, "parameter_bytes", json_object_new_int64(bytes));
    json_object *splits = json_object_new_array();
    for (int i = 0; i < g->n_nodes; i++)
        if (is_pipe_split(&g->nodes[i])) json_object_array_add(splits, json_object_new_string(g->nodes[i].name));
    json_object_object_add(root, "pipe_splits", splits);
    printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(root);
}

static void print_text(const pp_graph *g, const op_count *ops, int n_ops) {
    char buf[512];
    int64_t count, bytes;
    pp_graph_param_stats(g, &count, &bytes);
    printf("model: %s (opset %d, %d nodes)\n", g->source ? g->source : g->name, g->opset, g->n_nodes);
    printf("inputs:\n");
    for (int i = 0; i < g->n_inputs; i++)
        printf("  %-24s %s\n", g->values[g->inputs[i]].name,
               pp_cli_value_type(&g->values[g->inputs[i]], buf, sizeof buf));
    printf("outputs:\n");
    for (int i = 0; i < g->n_outputs; i++)
        printf("  %-24s %s\n", g->values[g->outputs[i]].name,
               pp_cli_value_type(&g->values[g->outputs[i]], buf, sizeof buf));
    printf("parameters: %lld (%.1f KiB)\n", (long long)count, (double)bytes / 1024.0);
    printf("ops:\n");
    for (int i = 0; i < n_ops; i++) printf("  %-24s %d\n", ops[i].op, ops[i].count);
    int n_splits = 0;
    for (int i = 0; i < g->n_nodes; i++) n_splits += is_pipe_split(&g->nodes[i]);
    printf("pipe-split markers: %d\n", n_splits);
    for (int i = 0; i < g->n_nodes; i++)
        if (is_pipe_split(&g->nodes[i])) printf("  %s (node %d)\n", g->nodes[i].name, i);
}

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: pippin inspect MODEL.onnx [--json]\n"
               "Shows inputs and outputs (dtype, shape), op counts, parameter count and bytes,\n"
               "and the pipe-split markers found.\n");
}

int cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, json = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': inspect_usage(stdout); return 0;
        default: inspect_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        inspect_usage(stderr);
        return 2;
    }
    pp_graph *g;
    if (pp_onnx_load(argv[optind], &g) != PP_OK) return pp_cli_fail("inspect");
    op_count *ops = calloc((size_t)g->n_nodes + 1, sizeof *ops);
    if (!ops) {
        pp_graph_free(g);
        return 1;
    }
    int n_ops = count_ops(g, ops);
    if (json) print_json(g, ops, n_ops);
    else print_text(g, ops, n_ops);
    free(ops);
    pp_graph_free(g);
    return 0;
}
