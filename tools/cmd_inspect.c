/* pippin inspect: a model's inputs, outputs, op counts, parameters and
 * pipe-split markers, as text or JSON. */
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "pipe_cli.h"
#include "pippin/autodiff.h"
#include "pippin/pippin.h"
#include "pippin/stage.h"

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

static json_object *model_json(const pp_graph *g, const op_count *ops, int n_ops) {
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
    return root;
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

/* The size given to dynamic dims other than the batch when measuring
 * stashes (e.g. --dim seq=16): the largest --dim not naming the batch
 * (the first dim of the first input, as shape probing takes it). */
static int64_t other_dim_size(const pp_graph *g, const pp_split_args *sa) {
    const char *batch = g->n_inputs && g->values[g->inputs[0]].ndim > 0 ? g->values[g->inputs[0]].dim_names[0] : NULL;
    int64_t best = 1;
    for (int i = 0; i < sa->n_dims; i++) {
        const char *eq = strchr(sa->dims[i], '=');
        if (batch && strlen(batch) == (size_t)(eq - sa->dims[i]) && strncmp(batch, sa->dims[i], strlen(batch)) == 0)
            continue;
        long long v = atoll(eq + 1);
        if (v > best) best = v;
    }
    return best;
}

static void human_bytes(int64_t b, char *buf, size_t cap) {
    if (b < 0) snprintf(buf, cap, "?");
    else if (b < 10 * 1024) snprintf(buf, cap, "%lld B", (long long)b);
    else if (b < 10 * 1024 * 1024) snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
    else snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
}

/* The stage table: nodes, parameters, stash per sample, edges. */
static int print_stages(const pp_graph *g, const pp_split_args *sa, json_object *json) {
    pp_pipe *p = NULL;
    pp_split_spec spec = pp_split_args_spec(sa);
    if (pp_pipe_split(g, &spec, &p) != PP_OK || pp_pipe_probe_shapes(p, sa->n_dims, sa->dims) != PP_OK) {
        pp_pipe_free(p);
        return 1;
    }
    int n = p->n_stages, rc = 0;
    char *pipe_text = json ? pp_pipe_to_json(p) : NULL; /* before the stages take the graphs */
    int64_t *nodes = calloc((size_t)n, sizeof *nodes), *pbytes = calloc((size_t)n, sizeof *pbytes);
    int64_t *stash = calloc((size_t)n, sizeof *stash);
    for (int s = 0; s < n; s++) {
        nodes[s] = p->stages[s]->n_nodes;
        pp_graph_param_stats(p->stages[s], NULL, &pbytes[s]);
        pp_stage *st = NULL;
        stash[s] = -1;
        /* Training stages need a loss downstream; without one, no stash. */
        if (p->loss && pp_stage_from_pipe(p, s, 1, &st) == PP_OK) {
            if (pp_stage_stash_per_sample(st, other_dim_size(g, sa), &stash[s]) != PP_OK) stash[s] = -1;
        }
        pp_stage_free(st);
    }
    if (json) {
        json_object *root = json, *arr = json_object_new_array();
        for (int s = 0; s < n; s++) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "stage", json_object_new_int(s));
            json_object_object_add(o, "nodes", json_object_new_int64(nodes[s]));
            json_object_object_add(o, "parameter_bytes", json_object_new_int64(pbytes[s]));
            json_object_object_add(o, "stash_bytes_per_sample", stash[s] >= 0 ? json_object_new_int64(stash[s]) : NULL);
            json_object_array_add(arr, o);
        }
        json_object_object_add(root, "stages", arr);
        /* Edges and shared parameters exactly as pipe.json writes them. */
        json_object *pj = pipe_text ? json_tokener_parse(pipe_text) : NULL, *v;
        if (!pj) {
            pp_error(PP_ERR_NOMEM, "out of memory");
            rc = 1;
        }
        const char *keys[] = {"edges", "shared_parameters"};
        for (int k = 0; pj && k < 2; k++)
            if (json_object_object_get_ex(pj, keys[k], &v))
                json_object_object_add(root, keys[k], json_object_get(v));
        json_object_put(pj);
    } else {
        char a[32], b[32];
        printf("stages: %d\n  %-6s %6s %12s %16s\n", n, "stage", "nodes", "parameters", "stash/sample");
        for (int s = 0; s < n; s++) {
            human_bytes(pbytes[s], a, sizeof a);
            human_bytes(stash[s], b, sizeof b);
            printf("  %-6d %6lld %12s %16s\n", s, (long long)nodes[s], a, b);
        }
        printf("edges (bytes per sample):\n");
        for (int e = 0; e < p->n_edges; e++) {
            const pp_pipe_edge *ed = &p->edges[e];
            char from[16], to[128];
            size_t k = 0;
            if (ed->producer >= 0) snprintf(from, sizeof from, "%d", ed->producer);
            else snprintf(from, sizeof from, "input");
            to[0] = '\0';
            for (int c = 0; c < ed->n_consumers && k < sizeof to; c++)
                k += (size_t)snprintf(to + k, sizeof to - k, "%s%d", c ? "," : "", ed->consumers[c]);
            human_bytes(ed->bytes_per_sample, a, sizeof a);
            printf("  %-5s -> %-8s %10s  %s\n", from, to, a, ed->value);
        }
        for (int i = 0; i < p->n_shared; i++) {
            printf("  shared parameter %s in stages", p->shared[i].name);
            for (int k = 0; k < p->shared[i].n_stages; k++) printf(" %d", p->shared[i].stages[k]);
            printf(" (replicated; gradients summed)\n");
        }
    }
    free(pipe_text);
    free(nodes);
    free(pbytes);
    free(stash);
    pp_pipe_free(p);
    return rc;
}

/* The whole model's training graph: stash per sample, and the graph
 * written as ONNX when asked. */
static int print_backward(pp_graph *g, const pp_split_args *sa, const char *out_path) {
    pp_backward *b = NULL;
    if (pp_autodiff_model(g, NULL, 0, &b) != PP_OK) return 1;
    int64_t per = 0;
    int rc = 0;
    if (pp_backward_stash_per_sample(g, b, other_dim_size(g, sa), &per, NULL) == PP_OK) {
        char a[32];
        human_bytes(per, a, sizeof a);
        printf("training graph: %d forward (F), %d backward-input (I), %d backward-weight (W) nodes; "
               "%d trainable parameters; stash %s per sample\n",
               b->n_forward, b->n_i, b->n_w, b->n_params, a);
    }
    if (out_path) {
        if (pp_onnx_save(g, out_path) != PP_OK) rc = 1;
        else printf("training graph written to %s\n", out_path);
    }
    pp_backward_free(b);
    return rc;
}

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: pippin inspect MODEL.onnx [--json] [--backward [-o OUT.onnx]]\n"
               "                      [--split-before PREFIX]... [--split-after PREFIX]... [--dim NAME=N]...\n"
               "Shows inputs and outputs (dtype, shape), op counts, parameter count and bytes,\n"
               "and the pipe-split markers found. With markers (or a split spec): a stage table\n"
               "(nodes, parameter bytes, stashed bytes per sample) and the values crossing\n"
               "stages with their bytes per sample. --backward derives the training graph and\n"
               "reports its stash per sample; -o writes it as ONNX (regions in doc_string).\n"
               "--dim NAME=N sizes a dynamic dim (e.g. seq=16) for the byte counts.\n");
}

int cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {
        PP_SPLIT_LONG_OPTIONS,
        {"json", no_argument, NULL, 'j'},
        {"backward", no_argument, NULL, 'b'},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, json = 0, backward = 0;
    const char *out_path = NULL;
    pp_split_args sa = {0};
    optind = 1;
    while ((c = getopt_long(argc, argv, "jbo:h", opts, NULL)) != -1) {
        int handled = pp_split_args_handle(&sa, c, optarg, "inspect");
        if (handled < 0) return 2;
        if (handled) continue;
        switch (c) {
        case 'j': json = 1; break;
        case 'b': backward = 1; break;
        case 'o': out_path = optarg; break;
        case 'h': inspect_usage(stdout); return 0;
        default: inspect_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || (out_path && !backward)) {
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
    int n_ops = count_ops(g, ops), rc = 0;
    json_object *root = json ? model_json(g, ops, n_ops) : NULL; /* one document for everything */
    if (!json) print_text(g, ops, n_ops);
    if (pp_cli_has_markers(g) || pp_split_args_any(&sa)) rc = print_stages(g, &sa, root);
    if (root && !rc)
        printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(root);
    if (!rc && backward) rc = print_backward(g, &sa, out_path);
    if (rc) pp_cli_fail("inspect");
    free(ops);
    pp_graph_free(g);
    return rc;
}
