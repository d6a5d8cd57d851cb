/* The partitioner: cuts a graph at pipe-split markers or at a split spec
 * into stage graphs, and records the values crossing between them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/log.h"
#include "grow.h"
#include "op.h"
#include "pippin/pipe.h"
#include "split_internal.h"
#include "status_internal.h"

typedef struct {
    int pos;          /* cut before node index pos */
    const char *name; /* marker node name or "--split-before PREFIX" */
} cut;

typedef struct {
    const pp_graph *g;
    const pp_split_spec *spec;
    int *alias;        /* per value: the value it stands for (PipeSplit outputs -> inputs) */
    uint8_t *marker;   /* per node: a PipeSplit we cut at */
    uint8_t *is_const; /* per node: computes from constants only (copied into each user) */
    int *stage;        /* per node: stage of a compute node, -1 for markers and constants */
    int n_stages;
    cut *cuts;
    int n_cuts;
    uint8_t *taken;    /* per value, pp_pipe_split_take: a stage holds g's tensor */
} splitter;

static int is_pipe_split(const pp_node *n) {
    return strcmp(n->op_type, "PipeSplit") == 0 && strcmp(n->domain, "pippin") == 0;
}

static int starts_with(const char *s, const char *prefix) {
    return s && strncmp(s, prefix, strlen(prefix)) == 0;
}

static int compute_node(const splitter *sp, int i) { return !sp->marker[i] && !sp->is_const[i]; }

static void mark_aliases_and_constants(splitter *sp) {
    const pp_graph *g = sp->g;
    for (int v = 0; v < g->n_values; v++) sp->alias[v] = v;
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        if (is_pipe_split(n) && !sp->spec->ignore_markers) {
            sp->marker[i] = 1;
            for (int k = 0; k < n->n_out && k < n->n_in; k++)
                if (n->out[k] >= 0 && n->in[k] >= 0) sp->alias[n->out[k]] = sp->alias[n->in[k]];
            continue;
        }
        int all_const = strncmp(n->op_type, "Random", 6) != 0 && !is_pipe_split(n);
        for (int k = 0; k < n->n_in && all_const; k++) {
            if (n->in[k] < 0) continue;
            const pp_value *v = &g->values[sp->alias[n->in[k]]];
            if (v->kind == PP_VALUE_NODE) all_const = sp->is_const[v->producer];
            else all_const = v->kind == PP_VALUE_CONST;
        }
        sp->is_const[i] = (uint8_t)all_const;
    }
}

static int cmp_cut(const void *a, const void *b) {
    const cut *x = a, *y = b;
    return x->pos - y->pos;
}

static pp_status collect_cuts(splitter *sp) {
    const pp_graph *g = sp->g;
    const pp_split_spec *spec = sp->spec;
    int cap = g->n_nodes + spec->n_before + spec->n_after + spec->n_cut_at + 1;
    sp->cuts = calloc((size_t)cap, sizeof *sp->cuts);
    if (!sp->cuts) return pp_error(PP_ERR_NOMEM, "out of memory splitting");
    for (int i = 0; i < g->n_nodes; i++)
        if (sp->marker[i]) sp->cuts[sp->n_cuts++] = (cut){i, g->nodes[i].name};
    for (int k = 0; k < spec->n_before; k++) {
        int found = -1;
        for (int i = 0; i < g->n_nodes && found < 0; i++)
            if (compute_node(sp, i) && starts_with(g->nodes[i].name, spec->before[k])) found = i;
        if (found < 0)
            return pp_error(PP_ERR_NOT_FOUND, "--split-before '%s' matches no node", spec->before[k]);
        sp->cuts[sp->n_cuts++] = (cut){found, spec->before[k]};
    }
    for (int k = 0; k < spec->n_after; k++) {
        int found = -1;
        for (int i = 0; i < g->n_nodes; i++)
            if (compute_node(sp, i) && starts_with(g->nodes[i].name, spec->after[k])) found = i;
        if (found < 0)
            return pp_error(PP_ERR_NOT_FOUND, "--split-after '%s' matches no node", spec->after[k]);
        sp->cuts[sp->n_cuts++] = (cut){found + 1, spec->after[k]};
    }
    for (int k = 0; k < spec->n_cut_at; k++) {
        int at = spec->cut_at[k];
        if (at <= 0 || at >= g->n_nodes)
            return pp_error(PP_ERR_INVALID, "cut before node %d: the model's nodes are 1..%d", at, g->n_nodes - 1);
        const char *nm = g->nodes[at].name;
        sp->cuts[sp->n_cuts++] = (cut){at, nm && nm[0] ? nm : g->nodes[at].op_type};
    }
    qsort(sp->cuts, (size_t)sp->n_cuts, sizeof *sp->cuts, cmp_cut);
    return PP_OK;
}

/* Numbers the stages. Cuts with no compute node between them collapse into
 * one; a cut with no compute node before or after it leaves a stage empty. */
static pp_status assign_stages(splitter *sp) {
    const pp_graph *g = sp->g;
    int kept = 0, c = 0, stage = 0, seen_compute = 0;
    for (int i = 0; i <= g->n_nodes; i++) {
        while (c < sp->n_cuts && sp->cuts[c].pos == i) {
            if (!seen_compute && stage == 0)
                return pp_error(PP_ERR_INVALID, "pipe split '%s' leaves stage 0 empty (no node before it)",
                                sp->cuts[c].name);
            if (seen_compute) {
                sp->cuts[kept++] = sp->cuts[c];
                stage++;
                seen_compute = 0;
            }
            c++;
        }
        if (i == g->n_nodes) break;
        sp->stage[i] = -1;
        if (compute_node(sp, i)) {
            sp->stage[i] = stage;
            seen_compute = 1;
        }
    }
    if (kept > 0 && !seen_compute)
        return pp_error(PP_ERR_INVALID, "pipe split '%s' leaves the last stage empty (no node after it)",
                        sp->cuts[kept - 1].name);
    sp->n_cuts = kept;
    sp->n_stages = kept + 1;
    return PP_OK;
}

/* Stage of the node computing value v (after aliasing); -1 for model inputs,
 * parameters, constants and constant sub-graphs. */
static int producer_stage(const splitter *sp, int v) {
    const pp_value *val = &sp->g->values[v];
    if (val->kind != PP_VALUE_NODE) return -1;
    return sp->stage[val->producer];
}

static pp_status add_consumer(pp_pipe *p, const char *name, int producer, int consumer) {
    int e = pp_pipe_find_edge(p, name);
    if (e < 0) {
        PP_TRY(PP_GROW_EXACT(p->edges, p->n_edges));
        pp_pipe_edge *edges = p->edges;
        e = p->n_edges++;
        memset(&edges[e], 0, sizeof edges[e]);
        edges[e].value = strdup(name);
        edges[e].producer = producer;
        edges[e].ndim = -1;
        edges[e].bytes_per_sample = -1;
        if (!edges[e].value) return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    pp_pipe_edge *ed = &p->edges[e];
    for (int k = 0; k < ed->n_consumers; k++)
        if (ed->consumers[k] == consumer) return PP_OK;
    PP_TRY(PP_GROW_EXACT(ed->consumers, ed->n_consumers));
    int *cs = ed->consumers;
    int k = ed->n_consumers++;
    while (k > 0 && cs[k - 1] > consumer) { /* keep ascending */
        cs[k] = cs[k - 1];
        k--;
    }
    cs[k] = consumer;
    return PP_OK;
}

/* First stage whose compute nodes read parameter v; -1 if none. */
static int param_users(const splitter *sp, int v, int *users, int *n_users) {
    const pp_graph *g = sp->g;
    *n_users = 0;
    uint8_t seen[1024] = {0};
    for (int i = 0; i < g->n_nodes; i++) {
        if (!compute_node(sp, i)) continue;
        const pp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0 && sp->alias[n->in[k]] == v && sp->stage[i] < 1024 && !seen[sp->stage[i]]) {
                seen[sp->stage[i]] = 1;
                users[(*n_users)++] = sp->stage[i];
            }
    }
    for (int a = 1; a < *n_users; a++) /* ascending */
        for (int b = a; b > 0 && users[b - 1] > users[b]; b--) {
            int t = users[b];
            users[b] = users[b - 1];
            users[b - 1] = t;
        }
    return *n_users ? users[0] : -1;
}

static pp_status find_edges_and_shared(const splitter *sp, pp_pipe *p) {
    const pp_graph *g = sp->g;
    int *users = malloc(sizeof(int) * (size_t)(sp->n_stages + 1));
    if (!users) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = PP_OK;
    for (int i = 0; i < g->n_nodes && s == PP_OK; i++) {
        if (!compute_node(sp, i)) continue;
        const pp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in && s == PP_OK; k++) {
            if (n->in[k] < 0) continue;
            int v = sp->alias[n->in[k]];
            const pp_value *val = &g->values[v];
            if (val->kind == PP_VALUE_INPUT) {
                s = add_consumer(p, val->name, -1, sp->stage[i]);
            } else if (val->kind == PP_VALUE_NODE) {
                int ps = producer_stage(sp, v);
                if (ps >= 0 && ps != sp->stage[i]) s = add_consumer(p, val->name, ps, sp->stage[i]);
            } else if (val->kind == PP_VALUE_PARAM && sp->spec->transmit_shared) {
                int n_users, first = param_users(sp, v, users, &n_users);
                if (first != sp->stage[i]) s = add_consumer(p, val->name, first, sp->stage[i]);
            }
        }
    }
    for (int v = 0; v < g->n_values && s == PP_OK && !sp->spec->transmit_shared; v++) {
        if (g->values[v].kind != PP_VALUE_PARAM) continue;
        int n_users;
        param_users(sp, v, users, &n_users);
        if (n_users < 2) continue;
        s = PP_GROW_EXACT(p->shared, p->n_shared);
        if (s != PP_OK) break;
        pp_pipe_shared *sh = &p->shared[p->n_shared++];
        sh->name = strdup(g->values[v].name);
        sh->n_stages = n_users;
        sh->stages = malloc(sizeof(int) * (size_t)n_users);
        if (!sh->name || !sh->stages) {
            s = pp_error(PP_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(sh->stages, users, sizeof(int) * (size_t)n_users);
    }
    free(users);
    return s;
}

/* Marks the constant nodes stage s needs (transitively). */
static void mark_needed_constants(const splitter *sp, int s, uint8_t *need) {
    const pp_graph *g = sp->g;
    memset(need, 0, (size_t)g->n_nodes);
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        if (!(sp->stage[i] == s && compute_node(sp, i)) && !need[i]) continue;
        const pp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] < 0) continue;
            const pp_value *v = &g->values[sp->alias[n->in[k]]];
            if (v->kind == PP_VALUE_NODE && sp->is_const[v->producer]) need[v->producer] = 1;
        }
    }
}

/* Makes graph value v of g available in stage graph sg (map: g -> sg ids). */
static pp_status import_value(const splitter *sp, pp_graph *sg, int v, int *map) {
    if (map[v] >= 0) return PP_OK;
    const pp_value *val = &sp->g->values[v];
    if (val->kind == PP_VALUE_PARAM || val->kind == PP_VALUE_CONST) {
        pp_tensor *t;
        /* Each stage owns its parameters (replicas are updated separately);
         * constants are never written, so they may share memory. Taking,
         * the first stage gets g's own tensor. */
        if (val->kind == PP_VALUE_PARAM && !(sp->taken && !sp->taken[v]++)) PP_TRY(pp_tensor_clone(val->data, &t));
        else t = pp_tensor_retain(val->data);
        return pp_graph_add_initializer(sg, val->name, val->kind, t, &map[v]);
    }
    return pp_error(PP_ERR_INTERNAL, "value '%s' has no source in stage graph '%s'", val->name, sg->name);
}

static pp_status add_stage_input(const pp_graph *g, pp_graph *sg, int v, int *map) {
    const pp_value *val = &g->values[v];
    PP_TRY(pp_graph_add_input(sg, val->name, val->dtype, val->ndim, val->shape, &map[v]));
    for (int d = 0; d < val->ndim; d++)
        if (val->dim_names[d]) sg->values[map[v]].dim_names[d] = strdup(val->dim_names[d]);
    return PP_OK;
}

static pp_status build_stage(const splitter *sp, pp_pipe *p, int s, int *map, uint8_t *need) {
    const pp_graph *g = sp->g;
    char name[64];
    snprintf(name, sizeof name, "stage_%d", s);
    pp_graph *sg;
    PP_TRY(pp_graph_new(name, &sg));
    p->stages[s] = sg;
    sg->opset = g->opset;
    for (int v = 0; v < g->n_values; v++) map[v] = -1;
    for (int e = 0; e < p->n_edges; e++) {
        const pp_pipe_edge *ed = &p->edges[e];
        for (int k = 0; k < ed->n_consumers; k++)
            if (ed->consumers[k] == s) PP_TRY(add_stage_input(g, sg, pp_graph_find_value(g, ed->value), map));
    }
    mark_needed_constants(sp, s, need);
    for (int i = 0; i < g->n_nodes; i++) {
        if (!need[i] && !(sp->stage[i] == s && compute_node(sp, i))) continue;
        const pp_node *n = &g->nodes[i];
        int in_map[64];
        if (n->n_in > 64) return pp_node_error(n, PP_ERR_UNSUPPORTED, "more than 64 inputs");
        for (int k = 0; k < n->n_in; k++) {
            in_map[k] = -1;
            if (n->in[k] < 0) continue;
            int v = sp->alias[n->in[k]];
            PP_TRY(import_value(sp, sg, v, map));
            in_map[k] = map[v];
        }
        int nid;
        PP_TRY(pp_graph_copy_node(sg, g, i, in_map, &nid));
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0) map[n->out[k]] = sg->nodes[nid].out[k];
    }
    /* Outputs: values sent on, then model outputs computed here. */
    for (int e = 0; e < p->n_edges; e++) {
        const pp_pipe_edge *ed = &p->edges[e];
        if (ed->producer != s) continue;
        int v = pp_graph_find_value(g, ed->value);
        if (map[v] < 0) PP_TRY(import_value(sp, sg, v, map)); /* a transmitted parameter */
        PP_TRY(pp_graph_add_output(sg, map[v]));
    }
    for (int o = 0; o < p->n_outputs; o++)
        if (p->output_stage[o] == s) {
            int v = sp->alias[pp_graph_find_value(g, p->outputs[o])];
            if (map[v] < 0) return pp_error(PP_ERR_INTERNAL, "output '%s' missing in stage %d", p->outputs[o], s);
            int dup = 0;
            for (int k = 0; k < sg->n_outputs; k++) dup |= sg->outputs[k] == map[v];
            if (!dup) PP_TRY(pp_graph_add_output(sg, map[v]));
        }
    return pp_graph_resolve(sg);
}

/* Model outputs: which stage computes each, and which is the loss. */
static pp_status find_outputs(const splitter *sp, pp_pipe *p) {
    const pp_graph *g = sp->g;
    p->outputs = calloc((size_t)g->n_outputs + 1, sizeof(char *));
    p->output_stage = calloc((size_t)g->n_outputs + 1, sizeof(int));
    if (!p->outputs || !p->output_stage) return pp_error(PP_ERR_NOMEM, "out of memory");
    p->loss_stage = -1;
    for (int o = 0; o < g->n_outputs; o++) {
        int v = sp->alias[g->outputs[o]];
        const pp_value *val = &g->values[v];
        /* The stage graph names the output after the aliased value. */
        p->outputs[o] = strdup(val->name);
        p->n_outputs++;
        if (!p->outputs[o]) return pp_error(PP_ERR_NOMEM, "out of memory");
        int st = producer_stage(sp, v);
        if (st < 0)
            return pp_error(PP_ERR_UNSUPPORTED, "model output '%s' is not computed by any stage", val->name);
        p->output_stage[o] = st;
    }
    /* The loss: named by the spec, else the output called "loss", else the
     * only float scalar output (pp_autodiff_find_loss's rule). */
    int loss = -1, n_scalar = 0;
    for (int o = 0; o < g->n_outputs; o++) {
        const pp_value *decl = &g->values[g->outputs[o]];
        if (sp->spec->loss ? strcmp(decl->name, sp->spec->loss) == 0 : strcmp(decl->name, "loss") == 0) loss = o;
        if (decl->ndim == 0 && pp_dtype_is_float(decl->dtype)) n_scalar++;
    }
    if (sp->spec->loss && loss < 0) return pp_error(PP_ERR_NOT_FOUND, "the model has no output '%s'", sp->spec->loss);
    for (int o = 0; loss < 0 && n_scalar == 1 && o < g->n_outputs; o++) {
        const pp_value *decl = &g->values[g->outputs[o]];
        if (decl->ndim == 0 && pp_dtype_is_float(decl->dtype)) loss = o;
    }
    if (loss >= 0) {
        if (!(p->loss = strdup(p->outputs[loss]))) return pp_error(PP_ERR_NOMEM, "out of memory");
        p->loss_stage = p->output_stage[loss];
    }
    return PP_OK;
}

void pp_split_spec_init(pp_split_spec *s) { memset(s, 0, sizeof *s); }

pp_status pp_split_compute_nodes(const pp_graph *g, int ignore_markers, uint8_t *compute) {
    pp_split_spec spec = {0};
    spec.ignore_markers = ignore_markers;
    splitter sp = {g, &spec, NULL, NULL, NULL, NULL, 0, NULL, 0};
    size_t nv = (size_t)g->n_values + 1, nn = (size_t)g->n_nodes + 1;
    sp.alias = malloc(sizeof(int) * nv);
    sp.marker = calloc(nn, 1);
    sp.is_const = calloc(nn, 1);
    pp_status s = sp.alias && sp.marker && sp.is_const ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK) {
        mark_aliases_and_constants(&sp);
        for (int i = 0; i < g->n_nodes; i++) compute[i] = (uint8_t)compute_node(&sp, i);
    }
    free(sp.alias);
    free(sp.marker);
    free(sp.is_const);
    return s;
}

static pp_status split(const pp_graph *g, const pp_split_spec *spec, int take, pp_pipe **out) {
    static const pp_split_spec default_spec = {0};
    if (!spec) spec = &default_spec;
    *out = NULL;
    splitter sp = {g, spec, NULL, NULL, NULL, NULL, 0, NULL, 0, NULL};
    if (take && !(sp.taken = calloc((size_t)g->n_values + 1, 1))) return pp_error(PP_ERR_NOMEM, "out of memory");
    size_t nv = (size_t)g->n_values + 1, nn = (size_t)g->n_nodes + 1;
    sp.alias = malloc(sizeof(int) * nv);
    sp.marker = calloc(nn, 1);
    sp.is_const = calloc(nn, 1);
    sp.stage = malloc(sizeof(int) * nn);
    int *map = malloc(sizeof(int) * nv);
    uint8_t *need = calloc(nn, 1);
    pp_pipe *p = calloc(1, sizeof *p);
    pp_status s = PP_OK;
    if (!sp.alias || !sp.marker || !sp.is_const || !sp.stage || !map || !need || !p)
        s = pp_error(PP_ERR_NOMEM, "out of memory splitting");
    if (s == PP_OK) {
        mark_aliases_and_constants(&sp);
        s = collect_cuts(&sp);
    }
    if (s == PP_OK) s = assign_stages(&sp);
    if (s == PP_OK && sp.n_stages > 1024)
        s = pp_error(PP_ERR_UNSUPPORTED, "%d stages (at most 1024)", sp.n_stages);
    if (s == PP_OK) {
        p->n_stages = sp.n_stages;
        p->stages = calloc((size_t)sp.n_stages, sizeof *p->stages);
        p->cut_names = calloc((size_t)sp.n_stages, sizeof(char *));
        if (!p->stages || !p->cut_names) s = pp_error(PP_ERR_NOMEM, "out of memory");
        for (int c = 0; s == PP_OK && c < sp.n_cuts; c++)
            if (!(p->cut_names[c] = strdup(sp.cuts[c].name))) s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    if (s == PP_OK) s = find_outputs(&sp, p);
    if (s == PP_OK) s = find_edges_and_shared(&sp, p);
    for (int st = 0; st < sp.n_stages && s == PP_OK; st++) {
        s = build_stage(&sp, p, st, map, need);
        if (s != PP_OK) s = pp_error_context(s, "stage %d", st);
    }
    free(sp.alias);
    free(sp.marker);
    free(sp.is_const);
    free(sp.stage);
    free(sp.cuts);
    free(sp.taken);
    free(map);
    free(need);
    if (s != PP_OK) {
        pp_pipe_free(p);
        return s;
    }
    *out = p;
    return PP_OK;
}

pp_status pp_pipe_split(const pp_graph *g, const pp_split_spec *spec, pp_pipe **out) {
    return split(g, spec, 0, out);
}

pp_status pp_pipe_split_take(pp_graph *g, const pp_split_spec *spec, pp_pipe **out) {
    return split(g, spec, 1, out);
}

int pp_pipe_find_edge(const pp_pipe *p, const char *value) {
    for (int e = 0; e < p->n_edges; e++)
        if (strcmp(p->edges[e].value, value) == 0) return e;
    return -1;
}

void pp_pipe_free(pp_pipe *p) {
    if (!p) return;
    for (int s = 0; s < p->n_stages; s++) {
        if (p->stages) pp_graph_free(p->stages[s]);
        if (p->cut_names) free(p->cut_names[s]);
        if (p->stage_files) free(p->stage_files[s]);
    }
    free(p->stage_files);
    free(p->stages);
    free(p->cut_names);
    for (int e = 0; e < p->n_edges; e++) {
        free(p->edges[e].value);
        free(p->edges[e].consumers);
        for (int d = 0; d < PP_MAX_DIMS; d++) free(p->edges[e].dims[d]);
    }
    free(p->edges);
    for (int i = 0; i < p->n_shared; i++) {
        free(p->shared[i].name);
        free(p->shared[i].stages);
    }
    free(p->shared);
    for (int o = 0; o < p->n_outputs; o++) free(p->outputs[o]);
    free(p->outputs);
    free(p->output_stage);
    free(p->loss);
    for (int i = 0; i < p->n_dims; i++) free(p->dims[i]);
    free(p->dims);
    free(p);
}
