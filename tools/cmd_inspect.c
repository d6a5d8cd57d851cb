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

#include "status_internal.h"
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
    pp_graph_frozen_stats(g, &count, &bytes);
    json_object *frozen = json_object_new_array();
    for (int v = 0; v < g->n_values; v++)
        if (pp_graph_is_frozen(g, v)) json_object_array_add(frozen, json_object_new_string(g->values[v].name));
    json_object_object_add(root, "frozen", json_object_new_int64(count));
    json_object_object_add(root, "frozen_bytes", json_object_new_int64(bytes));
    json_object_object_add(root, "frozen_initializers", frozen);
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
    printf("parameters: %lld (%.1f KiB) trainable\n", (long long)count, (double)bytes / 1024.0);
    pp_graph_frozen_stats(g, &count, &bytes);
    if (count) {
        printf("frozen: %lld (%.1f KiB), never trained:", (long long)count, (double)bytes / 1024.0);
        int shown = 0, n = 0;
        for (int v = 0; v < g->n_values; v++) {
            if (!pp_graph_is_frozen(g, v)) continue;
            if (shown < 8) printf("%s %s", shown++ ? "," : "", g->values[v].name);
            n++;
        }
        if (n > shown) printf(", ... (%d in all)", n);
        printf("\n");
    }
    printf("ops:\n");
    for (int i = 0; i < n_ops; i++) printf("  %-24s %d\n", ops[i].op, ops[i].count);
    int n_splits = 0;
    for (int i = 0; i < g->n_nodes; i++) n_splits += is_pipe_split(&g->nodes[i]);
    printf("pipe-split markers: %d\n", n_splits);
    for (int i = 0; i < g->n_nodes; i++)
        if (is_pipe_split(&g->nodes[i])) printf("  %s (node %d)\n", g->nodes[i].name, i);
}

/* The sizes the byte counts assume for symbolic dims: shape probing's
 * ("name=N", the batch first; --dim settings included), so that stash and
 * edge bytes agree. */
typedef struct {
    int n;
    char *dims[16];
    char *batch; /* NULL: dim 0 of each input, as pp_backward_stash_per_sample takes it */
    int known;   /* 1 once a probe gave them */
} dim_sizes;

static void dim_sizes_clear(dim_sizes *ds) {
    for (int i = 0; i < ds->n; i++) free(ds->dims[i]);
    free(ds->batch);
    memset(ds, 0, sizeof *ds);
}

/* Copies what pp_pipe_probe_shapes left in p. */
static pp_status dim_sizes_from_pipe(dim_sizes *ds, const pp_pipe *p) {
    dim_sizes_clear(ds);
    for (int i = 0; i < p->n_dims && ds->n < 16; i++)
        if (!(ds->dims[ds->n++] = strdup(p->dims[i]))) return pp_error(PP_ERR_NOMEM, "out of memory");
    if (ds->n) {
        const char *eq = strrchr(ds->dims[0], '=');
        if (!(ds->batch = strndup(ds->dims[0], eq ? (size_t)(eq - ds->dims[0]) : strlen(ds->dims[0]))))
            return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    ds->known = 1;
    return PP_OK;
}

/* The model probed as one stage (no cuts), for --backward without a stage
 * table. Without a probe (an input with no declared type), the --dim
 * settings alone. */
static void dim_sizes_probe_model(dim_sizes *ds, pp_graph *g, const pp_split_args *sa) {
    pp_split_spec spec = {.ignore_markers = 1, .loss = sa->loss};
    pp_pipe *p = NULL;
    /* Nothing here writes parameters: the stages may share g's. */
    if (pp_pipe_split_take(g, &spec, &p) == PP_OK && pp_pipe_probe_shapes(p, sa->n_dims, sa->dims) == PP_OK &&
        dim_sizes_from_pipe(ds, p) == PP_OK) {
        pp_pipe_free(p);
        return;
    }
    pp_pipe_free(p);
    dim_sizes_clear(ds);
    for (int i = 0; i < sa->n_dims && i < 16; i++)
        if ((ds->dims[ds->n] = strdup(sa->dims[i]))) ds->n++;
}

/* "dims": {"seq": 3} and "batch_dim" in JSON; a line of text otherwise. */
static void print_dim_sizes(const dim_sizes *ds, json_object *json) {
    if (json) {
        json_object *o = json_object_new_object();
        for (int i = ds->batch ? 1 : 0; i < ds->n; i++) {
            const char *eq = strrchr(ds->dims[i], '=');
            char *name = eq ? strndup(ds->dims[i], (size_t)(eq - ds->dims[i])) : NULL;
            if (name) json_object_object_add(o, name, json_object_new_int64(atoll(eq + 1)));
            free(name);
        }
        json_object_object_add(json, "batch_dim", ds->batch ? json_object_new_string(ds->batch) : NULL);
        json_object_object_add(json, "dims", o);
        return;
    }
    if (!ds->n) return;
    int first = ds->batch ? 1 : 0;
    printf("symbolic dims: bytes are per sample of %s", ds->batch ? ds->batch : "dim 0");
    for (int i = first; i < ds->n; i++) printf("%s%s", i == first ? ", at " : ", ", ds->dims[i]);
    printf("%s\n", ds->n > first ? " (--dim NAME=N to change)" : "");
}

static void human_bytes(int64_t b, char *buf, size_t cap) {
    if (b < 0) snprintf(buf, cap, "?");
    else if (b < 10 * 1024) snprintf(buf, cap, "%lld B", (long long)b);
    else if (b < 10 * 1024 * 1024) snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
    else snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
}

/* The stage table: nodes, parameters, stash per sample, edges. */
static int print_stages(pp_graph *g, const pp_split_args *sa, dim_sizes *ds, json_object *json) {
    pp_pipe *p = NULL;
    pp_split_spec spec = pp_split_args_spec(sa);
    /* Nothing here writes parameters: the stages may share g's. */
    if (pp_pipe_split_take(g, &spec, &p) != PP_OK || pp_pipe_probe_shapes(p, sa->n_dims, sa->dims) != PP_OK ||
        dim_sizes_from_pipe(ds, p) != PP_OK) {
        pp_pipe_free(p);
        return 1;
    }
    int n = p->n_stages, rc = 0;
    char *pipe_text = json ? pp_pipe_to_json(p) : NULL; /* before the stages take the graphs */
    int64_t *nodes = calloc((size_t)n, sizeof *nodes), *pbytes = calloc((size_t)n, sizeof *pbytes);
    int64_t *stash = calloc((size_t)n, sizeof *stash), *rstash = calloc((size_t)n, sizeof *rstash);
    int64_t *plan = calloc((size_t)n, sizeof *plan), *plan_fixed = calloc((size_t)n, sizeof *plan_fixed);
    /* each phase's plan: per sample [s * PP_PHASES + p], fixed after them */
    int64_t *phases = calloc((size_t)n * 2 * PP_PHASES, sizeof *phases);
    int64_t *inpl = calloc((size_t)n, sizeof *inpl), *inpl_fixed = calloc((size_t)n, sizeof *inpl_fixed);
    for (int s = 0; s < n; s++) {
        nodes[s] = p->stages[s]->n_nodes;
        pp_graph_param_stats(p->stages[s], NULL, &pbytes[s]);
        pp_stage *st = NULL;
        stash[s] = rstash[s] = plan[s] = plan_fixed[s] = inpl[s] = inpl_fixed[s] = -1;
        /* Training stages need a loss downstream; without one, no stash.
         * With recompute (pippin train --recompute) F keeps the inputs. */
        if (p->loss && pp_stage_from_pipe(p, s, 1, &st) == PP_OK) {
            if (pp_stage_stash_per_sample_dims(st, ds->batch, ds->n, (const char *const *)ds->dims, &stash[s]) != PP_OK)
                stash[s] = -1;
            if (pp_stage_recompute_stash_per_sample_dims(st, ds->batch, ds->n, (const char *const *)ds->dims,
                                                         &rstash[s]) != PP_OK)
                rstash[s] = -1;
            int64_t *per = phases + (size_t)s * 2 * PP_PHASES, *fixed = per + PP_PHASES;
            if (pp_stage_plan_phases_per_sample_dims(st, ds->batch, ds->n, (const char *const *)ds->dims, per,
                                                     fixed) == PP_OK)
                pp_backward_plan_bound(per, fixed, &plan[s], &plan_fixed[s]);
            else
                plan[s] = plan_fixed[s] = -1;
            if (pp_stage_inplace_per_sample_dims(st, ds->batch, ds->n, (const char *const *)ds->dims, &inpl[s],
                                                 &inpl_fixed[s]) != PP_OK)
                inpl[s] = inpl_fixed[s] = -1;
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
            json_object_object_add(o, "recompute_stash_bytes_per_sample",
                                   rstash[s] >= 0 ? json_object_new_int64(rstash[s]) : NULL);
            json_object_object_add(o, "plan_bytes_per_sample", plan[s] >= 0 ? json_object_new_int64(plan[s]) : NULL);
            json_object_object_add(o, "plan_fixed_bytes", plan[s] >= 0 ? json_object_new_int64(plan_fixed[s]) : NULL);
            json_object *ph = plan[s] >= 0 ? json_object_new_object() : NULL;
            static const char *const phase_names[PP_PHASES] = {"F", "I", "W"};
            for (int p = 0; ph && p < PP_PHASES; p++) {
                json_object *po = json_object_new_object();
                json_object_object_add(po, "bytes_per_sample",
                                       json_object_new_int64(phases[(size_t)s * 2 * PP_PHASES + (size_t)p]));
                json_object_object_add(po, "fixed_bytes",
                                       json_object_new_int64(phases[(size_t)s * 2 * PP_PHASES + PP_PHASES + (size_t)p]));
                json_object_object_add(ph, phase_names[p], po);
            }
            json_object_object_add(o, "plan_phases", ph);
            json_object_object_add(o, "inplace_bytes_per_sample", inpl[s] >= 0 ? json_object_new_int64(inpl[s]) : NULL);
            json_object_object_add(o, "inplace_fixed_bytes", inpl[s] >= 0 ? json_object_new_int64(inpl_fixed[s]) : NULL);
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
        print_dim_sizes(ds, json);
    } else {
        char a[32], b[32], c[32], d[32], e[32], f[32];
        printf("stages: %d\n  %-6s %6s %12s %16s %18s %14s %12s %16s\n", n, "stage", "nodes", "parameters",
               "stash/sample", "recompute/sample", "plan/sample", "plan fixed", "in-place/sample");
        for (int s = 0; s < n; s++) {
            human_bytes(pbytes[s], a, sizeof a);
            human_bytes(stash[s], b, sizeof b);
            human_bytes(rstash[s], c, sizeof c);
            human_bytes(plan[s], d, sizeof d);
            human_bytes(plan[s] >= 0 ? plan_fixed[s] : -1, f, sizeof f);
            human_bytes(inpl[s], e, sizeof e);
            printf("  %-6d %6lld %12s %16s %18s %14s %12s %16s\n", s, (long long)nodes[s], a, b, c, d, f, e);
        }
        printf("plan: memory plans of a stage's F, I and W (buffers living and dying inside one run, reused by "
               "liveness; W's hold the parameter gradients): plan/sample x batch + plan fixed covers each "
               "(--json: \"plan_phases\", each apart); in-place: what elementwise ops writing into a dying "
               "input's buffer did not allocate in F, I and W (PIPPIN_OPTIMIZE without \"inplace\": none)\n");
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
        print_dim_sizes(ds, NULL);
    }
    free(pipe_text);
    free(nodes);
    free(pbytes);
    free(stash);
    free(rstash);
    free(plan);
    free(plan_fixed);
    free(phases);
    free(inpl);
    free(inpl_fixed);
    pp_pipe_free(p);
    return rc;
}

/* The whole model's training graph: stash per sample (at the dim sizes the
 * stage table assumed, or the model's own probe's), and the graph written as
 * ONNX when asked. With json, all of it goes into that document. */
static int print_backward(pp_graph *g, const pp_split_args *sa, dim_sizes *ds, const char *out_path,
                          pp_onnx_deferred *weights, json_object *json) {
    if (!ds->known) {
        dim_sizes_probe_model(ds, g, sa); /* before autodiff grows g */
        if (!json) print_dim_sizes(ds, NULL);
    }
    if (json) print_dim_sizes(ds, json);
    pp_backward *b = NULL;
    if (pp_autodiff_model(g, NULL, 0, &b) != PP_OK) return 1;
    int64_t per = 0;
    int rc = 0;
    int have = pp_backward_stash_per_sample_dims(g, b, ds->batch, ds->n, (const char *const *)ds->dims, &per,
                                                 NULL) == PP_OK;
    int64_t rper = 0; /* recompute: F keeps the inputs */
    int rhave = pp_backward_input_bytes_per_sample_dims(g, b, ds->batch, ds->n, (const char *const *)ds->dims,
                                                        &rper, NULL) == PP_OK;
    int64_t plan = 0, plan_fixed = 0; /* covers the memory plans of F, I and W */
    int phave = pp_backward_plan_per_sample_dims(g, b, ds->batch, ds->n, (const char *const *)ds->dims, &plan,
                                                 &plan_fixed) == PP_OK;
    int64_t inpl = 0, inpl_fixed = 0; /* what in-place ops did not allocate in F, I and W */
    int ihave = pp_backward_inplace_per_sample_dims(g, b, ds->batch, ds->n, (const char *const *)ds->dims, &inpl,
                                                    &inpl_fixed) == PP_OK;
    json_object *o = json ? json_object_new_object() : NULL;
    if (o) {
        json_object_object_add(o, "forward_nodes", json_object_new_int(b->n_forward));
        json_object_object_add(o, "backward_input_nodes", json_object_new_int(b->n_i));
        json_object_object_add(o, "backward_weight_nodes", json_object_new_int(b->n_w));
        json_object_object_add(o, "trainable_parameters", json_object_new_int(b->n_params));
        json_object_object_add(o, "stash_bytes_per_sample", have ? json_object_new_int64(per) : NULL);
        json_object_object_add(o, "recompute_stash_bytes_per_sample", rhave ? json_object_new_int64(rper) : NULL);
        json_object_object_add(o, "plan_bytes_per_sample", phave ? json_object_new_int64(plan) : NULL);
        json_object_object_add(o, "plan_fixed_bytes", phave ? json_object_new_int64(plan_fixed) : NULL);
        json_object_object_add(o, "inplace_bytes_per_sample", ihave ? json_object_new_int64(inpl) : NULL);
        json_object_object_add(o, "inplace_fixed_bytes", ihave ? json_object_new_int64(inpl_fixed) : NULL);
        json_object_object_add(o, "gemm_scratch_bytes_per_thread",
                               json_object_new_int64((int64_t)pp_gemm_scratch_bytes()));
        json_object_object_add(json, "training_graph", o);
    } else if (have) {
        char a[32], r[32];
        human_bytes(per, a, sizeof a);
        human_bytes(rhave ? rper : -1, r, sizeof r);
        printf("training graph: %d forward (F), %d backward-input (I), %d backward-weight (W) nodes; "
               "%d trainable parameters; stash %s per sample (%s with recompute: the inputs)\n",
               b->n_forward, b->n_i, b->n_w, b->n_params, a, r);
        if (phave) {
            char pa[32], pf[32];
            human_bytes(plan, pa, sizeof pa);
            human_bytes(plan_fixed, pf, sizeof pf);
            printf("memory plan (covers each of F, I and W): %s per sample + %s\n", pa, pf);
        }
        if (ihave) {
            char ia[32], ifx[32];
            human_bytes(inpl, ia, sizeof ia);
            human_bytes(inpl_fixed, ifx, sizeof ifx);
            printf("in place (outputs written into a dying input's buffer, not allocated, in F, I and W): "
                   "%s per sample + %s\n", ia, ifx);
        }
        if (pp_gemm_scratch_bytes()) {
            char gs[32];
            human_bytes((int64_t)pp_gemm_scratch_bytes(), gs, sizeof gs);
            printf("GEMM scratch (outside the plan): up to %s per thread that multiplies\n", gs);
        }
    }
    if (out_path) { /* the one place inspect needs the weights' values */
        if (pp_onnx_deferred_fill(weights, g) != PP_OK || pp_onnx_save(g, out_path) != PP_OK) rc = 1;
        else if (o) json_object_object_add(o, "file", json_object_new_string(out_path));
        else printf("training graph written to %s\n", out_path);
    }
    pp_backward_free(b);
    return rc;
}

/* The graph as inference runs it (pp_graph_prepare_inference: training-mode
 * ops rewritten, then the optimizer's passes): what each pass changed and
 * the op counts after; written as ONNX to out_path if given (pippin's fused
 * ops with their function bodies). Loads its own copy of the model. */
static int print_optimized(pp_split_args *sa, const char *path, const char *out_path, json_object *json) {
    pp_graph *g;
    if (pp_split_args_load(sa, path, &g) != PP_OK) return 1;
    unsigned passes = pp_optimize_default();
    pp_optimize_report r;
    pp_optimize_set_default(0); /* the inference rewrites alone; then the passes, reported */
    pp_status s = pp_graph_prepare_inference(g);
    pp_optimize_set_default(passes);
    if (s == PP_OK) s = pp_graph_optimize(g, passes, &r);
    if (s == PP_OK && out_path) s = pp_onnx_save(g, out_path);
    op_count *ops = s == PP_OK ? calloc((size_t)g->n_nodes + 1, sizeof *ops) : NULL;
    if (!ops) {
        if (s == PP_OK) pp_error(PP_ERR_NOMEM, "out of memory");
        pp_graph_free(g);
        return 1;
    }
    int n_ops = count_ops(g, ops);
    if (json) {
        json_object *o = json_object_new_object(), *jp = json_object_new_object(), *jo = json_object_new_object();
        json_object_object_add(o, "nodes_before", json_object_new_int(r.nodes_before));
        json_object_object_add(o, "nodes", json_object_new_int(r.nodes_after));
        for (int i = 0; i < r.n_passes; i++) json_object_object_add(jp, r.pass[i], json_object_new_int(r.rewrites[i]));
        json_object_object_add(o, "passes", jp);
        for (int i = 0; i < n_ops; i++) json_object_object_add(jo, ops[i].op, json_object_new_int(ops[i].count));
        json_object_object_add(o, "ops", jo);
        json_object_object_add(json, "optimized", o);
    } else {
        printf("optimized for inference: %d nodes -> %d\n", r.nodes_before, r.nodes_after);
        for (int i = 0; i < r.n_passes; i++) printf("  pass %-10s %d\n", r.pass[i], r.rewrites[i]);
        printf("optimized ops:\n");
        for (int i = 0; i < n_ops; i++) printf("  %-24s %d\n", ops[i].op, ops[i].count);
    }
    free(ops);
    pp_graph_free(g);
    return 0;
}

/* Where each node runs on a device (pippin/device.h): the nodes it claims
 * and those the CPU takes; per op type in text, per node in JSON. */
static int print_placement(pp_graph *g, const char *spec, json_object *json) {
    pp_device *dev = NULL;
    pp_exec *ex = NULL;
    pp_status s = pp_device_open(spec, &dev);
    if (s == PP_OK) s = pp_exec_new(g, &ex);
    if (s == PP_OK) s = pp_exec_set_device(ex, dev);
    op_count *on_dev = s == PP_OK ? calloc((size_t)g->n_nodes + 1, sizeof *on_dev) : NULL;
    op_count *on_cpu = on_dev ? calloc((size_t)g->n_nodes + 1, sizeof *on_cpu) : NULL;
    if (!on_cpu) {
        if (s == PP_OK) pp_error(PP_ERR_NOMEM, "out of memory");
        free(on_dev);
        pp_exec_free(ex);
        pp_device_close(dev);
        return 1;
    }
    int n_dev = 0, n_cpu = 0, placed = 0;
    json_object *nodes = json ? json_object_new_array() : NULL;
    for (int i = 0; i < g->n_nodes; i++) {
        const char *where = pp_exec_node_device(ex, i);
        int here = strcmp(where, "cpu") != 0;
        op_count *list = here ? on_dev : on_cpu;
        int *n = here ? &n_dev : &n_cpu, k = 0;
        placed += here;
        while (k < *n && strcmp(list[k].op, g->nodes[i].op_type) != 0) k++;
        if (k == *n) list[(*n)++] = (op_count){g->nodes[i].op_type, 0};
        list[k].count++;
        if (nodes) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "name", json_object_new_string(g->nodes[i].name));
            json_object_object_add(o, "op", json_object_new_string(g->nodes[i].op_type));
            json_object_object_add(o, "device", json_object_new_string(where));
            json_object_array_add(nodes, o);
        }
    }
    qsort(on_dev, (size_t)n_dev, sizeof *on_dev, cmp_count);
    qsort(on_cpu, (size_t)n_cpu, sizeof *on_cpu, cmp_count);
    if (json) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "device", json_object_new_string(pp_device_name(dev)));
        json_object_object_add(o, "on_device", json_object_new_int(placed));
        json_object_object_add(o, "on_cpu", json_object_new_int(g->n_nodes - placed));
        json_object_object_add(o, "nodes", nodes);
        json_object_object_add(json, "placement", o);
    } else {
        printf("placement on %s: %d of %d nodes on the device, %d on the CPU\n", pp_device_name(dev), placed,
               g->n_nodes, g->n_nodes - placed);
        for (int k = 0; k < n_dev; k++) printf("  %-8s %-24s %d\n", pp_device_name(dev), on_dev[k].op, on_dev[k].count);
        for (int k = 0; k < n_cpu; k++) printf("  %-8s %-24s %d\n", "cpu", on_cpu[k].op, on_cpu[k].count);
    }
    free(on_dev);
    free(on_cpu);
    pp_exec_free(ex);
    pp_device_close(dev);
    return 0;
}

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: pippin inspect MODEL.onnx [--json] [--backward [-o OUT.onnx]] [--optimized [-o OUT.onnx]]\n"
               "                      [--split-before PREFIX]... [--split-after PREFIX]... [--dim NAME=N]...\n"
               "                      [--freeze PATTERN]... [--device SPEC]\n"
               "Shows inputs and outputs (dtype, shape), op counts, parameter count and bytes\n"
               "(trainable, and frozen: buffers and --freeze'd initializers, never trained),\n"
               "and the pipe-split markers found. With markers (or a split spec): a stage table\n"
               "(nodes, parameter bytes, stashed bytes per sample, and with recomputation:\n"
               "the stage's inputs) and the values crossing\n"
               "stages with their bytes per sample. --backward derives the training graph and\n"
               "reports its stash per sample; -o writes it as ONNX (regions in doc_string).\n"
               "--dim NAME=N sizes a dynamic dim (e.g. seq=16) for the byte counts; dims not\n"
               "given get the small sizes shape probing runs at, shown after the tables (JSON:\n"
               "\"dims\", \"batch_dim\"). With --json, --backward adds \"training_graph\".\n"
               "--optimized adds the graph as inference runs it: what each optimizer pass\n"
               "changed and the op counts after (JSON: \"optimized\"; PIPPIN_OPTIMIZE picks\n"
               "the passes); -o writes that graph as ONNX.\n"
               "--device SPEC (cpu, cuda:N, fake[:ops]) says where each node runs on that\n"
               "device: the nodes it claims and those the CPU takes (with --backward, the\n"
               "training graph's; JSON: \"placement\", per node).\n");
}

int cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {
        PP_SPLIT_LONG_OPTIONS,
        {"json", no_argument, NULL, 'j'},
        {"backward", no_argument, NULL, 'b'},
        {"optimized", no_argument, NULL, 'O'},
        {"output", required_argument, NULL, 'o'},
        {"device", required_argument, NULL, 'D'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, json = 0, backward = 0, optimized = 0;
    const char *out_path = NULL, *device = NULL;
    pp_split_args sa = {0};
    optind = 1;
    while ((c = getopt_long(argc, argv, "jbo:h", opts, NULL)) != -1) {
        int handled = pp_split_args_handle(&sa, c, optarg, "inspect");
        if (handled < 0) return 2;
        if (handled) continue;
        switch (c) {
        case 'j': json = 1; break;
        case 'b': backward = 1; break;
        case 'O': optimized = 1; break;
        case 'o': out_path = optarg; break;
        case 'D': device = optarg; break;
        case 'h': inspect_usage(stdout); return 0;
        default: inspect_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || (out_path && backward == optimized)) { /* -o: one graph to write */
        inspect_usage(stderr);
        return 2;
    }
    pp_graph *g;
    /* Shapes and memory do not depend on the weights' values: they are
     * read only to be written (--backward -o). */
    pp_onnx_deferred *weights;
    if (pp_split_args_load_deferred(&sa, argv[optind], &g, &weights) != PP_OK) return pp_cli_fail("inspect");
    op_count *ops = calloc((size_t)g->n_nodes + 1, sizeof *ops);
    if (!ops) {
        pp_onnx_deferred_free(weights);
        pp_graph_free(g);
        return 1;
    }
    int n_ops = count_ops(g, ops), rc = 0;
    json_object *root = json ? model_json(g, ops, n_ops) : NULL; /* one document for everything */
    dim_sizes ds = {0};
    if (!json) print_text(g, ops, n_ops);
    if (pp_cli_has_markers(g) || pp_split_args_any(&sa)) rc = print_stages(g, &sa, &ds, root);
    if (!rc && backward) rc = print_backward(g, &sa, &ds, out_path, weights, root);
    if (!rc && optimized) rc = print_optimized(&sa, argv[optind], backward ? NULL : out_path, root);
    if (!rc && device) rc = print_placement(g, device, root);
    if (root && !rc)
        printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(root);
    dim_sizes_clear(&ds);
    if (rc) pp_cli_fail("inspect");
    free(ops);
    pp_onnx_deferred_free(weights);
    pp_graph_free(g);
    pp_split_args_free(&sa);
    return rc;
}
