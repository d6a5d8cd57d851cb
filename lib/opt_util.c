/* The optimizer's graph surgery (opt_internal.h): use counts, in-place
 * node rewrites, and the removal of dead nodes. */
#include <stdlib.h>
#include <string.h>

#include "op.h"
#include "opt_internal.h"

#include "status_internal.h"

pp_status pp_opt_ctx_init(pp_opt_ctx *c, pp_graph *g) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->uses = calloc((size_t)g->n_values + 1, sizeof *c->uses);
    c->dead = calloc((size_t)g->n_nodes + 1, 1);
    if (!c->uses || !c->dead) {
        pp_opt_ctx_clear(c);
        return pp_error(PP_ERR_NOMEM, "out of memory optimizing graph '%s'", g->name ? g->name : "");
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0) c->uses[g->nodes[i].in[k]]++;
    for (int i = 0; i < g->n_outputs; i++) c->uses[g->outputs[i]]++;
    return PP_OK;
}

void pp_opt_ctx_clear(pp_opt_ctx *c) {
    free(c->uses);
    free(c->dead);
    c->uses = NULL;
    c->dead = NULL;
}

int pp_opt_is_output(const pp_graph *g, int v) {
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return 1;
    return 0;
}

const pp_tensor *pp_opt_initializer(const pp_graph *g, int v) {
    if (v < 0 || v >= g->n_values) return NULL;
    const pp_value *val = &g->values[v];
    return (val->kind == PP_VALUE_CONST || val->kind == PP_VALUE_PARAM) ? val->data : NULL;
}

int pp_opt_is_op(const pp_node *n, const char *op_type) {
    return strcmp(n->op_type, op_type) == 0 && (!n->domain[0] || strcmp(n->domain, "ai.onnx") == 0);
}

int pp_opt_producer(const pp_opt_ctx *c, int v, const char *op_type) {
    if (v < 0 || c->g->values[v].kind != PP_VALUE_NODE) return -1;
    int p = c->g->values[v].producer;
    if (p < 0 || c->dead[p] || !pp_opt_is_op(&c->g->nodes[p], op_type)) return -1;
    return p;
}

int pp_opt_sole_reader(const pp_opt_ctx *c, int v) {
    const pp_graph *g = c->g;
    if (v < 0 || c->uses[v] != 1 || pp_opt_is_output(g, v)) return -1;
    int from = g->values[v].kind == PP_VALUE_NODE && g->values[v].producer >= 0 ? g->values[v].producer + 1 : 0;
    for (int i = from; i < g->n_nodes; i++) {
        if (c->dead[i]) continue;
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] == v) return i;
    }
    return -1;
}

void pp_opt_kill(pp_opt_ctx *c, int i) {
    if (c->dead[i]) return;
    c->dead[i] = 1;
    c->n_dead++;
    const pp_node *n = &c->g->nodes[i];
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] >= 0) c->uses[n->in[k]]--;
}

void pp_opt_drop(pp_opt_ctx *c, int v) {
    const pp_graph *g = c->g;
    if (v < 0 || c->uses[v] > 0 || g->values[v].kind != PP_VALUE_NODE) return;
    int p = g->values[v].producer;
    if (p < 0 || c->dead[p]) return;
    const pp_node *n = &g->nodes[p];
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] >= 0 && c->uses[n->out[k]] > 0) return;
    pp_opt_kill(c, p);
    for (int k = 0; k < n->n_in; k++) pp_opt_drop(c, n->in[k]);
}

pp_status pp_opt_rewrite(pp_opt_ctx *c, int i, const char *op_type, const char *domain, int n_in,
                         const int *in) {
    pp_node *n = &c->g->nodes[i];
    char *op = strdup(op_type), *dom = strdup(domain);
    int *ins = malloc(sizeof(int) * (size_t)(n_in ? n_in : 1));
    if (!op || !dom || !ins) {
        free(op);
        free(dom);
        free(ins);
        return pp_error(PP_ERR_NOMEM, "out of memory rewriting node '%s'", n->name);
    }
    for (int k = 0; k < n_in; k++) {
        ins[k] = in[k];
        if (in[k] >= 0) c->uses[in[k]]++;
    }
    int *old = n->in, n_old = n->n_in;
    for (int k = 0; k < n_old; k++)
        if (old[k] >= 0) c->uses[old[k]]--;
    free(n->op_type);
    free(n->domain);
    for (int a = 0; a < n->n_attr; a++) pp_attr_clear(&n->attrs[a]);
    free(n->attrs);
    n->attrs = NULL;
    n->n_attr = 0;
    n->op_type = op;
    n->domain = dom;
    n->in = ins;
    n->n_in = n_in;
    n->op = NULL; /* resolved again */
    for (int k = 0; k < n_old; k++) pp_opt_drop(c, old[k]);
    free(old);
    return PP_OK;
}

void pp_opt_take_output(pp_opt_ctx *c, int i, int v) {
    pp_graph *g = c->g;
    pp_node *n = &g->nodes[i];
    if (n->out[0] >= 0) g->values[n->out[0]].producer = -1;
    n->out[0] = v;
    g->values[v].producer = i;
    g->values[v].producer_output = 0;
}

pp_status pp_opt_take_outputs(pp_opt_ctx *c, int i, int n, const int *vs) {
    pp_graph *g = c->g;
    pp_node *nd = &g->nodes[i];
    int *out = malloc(sizeof *out * (size_t)(n > 0 ? n : 1));
    if (!out) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < nd->n_out; k++)
        if (nd->out[k] >= 0) g->values[nd->out[k]].producer = -1;
    for (int k = 0; k < n; k++) {
        out[k] = vs[k];
        if (vs[k] >= 0) {
            g->values[vs[k]].producer = i;
            g->values[vs[k]].producer_output = k;
        }
    }
    free(nd->out);
    nd->out = out;
    nd->n_out = n;
    return PP_OK;
}

void pp_opt_replace_uses(pp_opt_ctx *c, int from, int to) {
    pp_graph *g = c->g;
    for (int i = 0; i < g->n_nodes; i++) {
        if (c->dead[i]) continue;
        pp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == from) {
                n->in[k] = to;
                c->uses[from]--;
                c->uses[to]++;
            }
    }
}

pp_status pp_opt_compact(pp_opt_ctx *c, const char *pass) {
    pp_graph *g = c->g;
    int m = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        pp_node *n = &g->nodes[i];
        if (c->dead[i]) {
            for (int k = 0; k < n->n_out; k++)
                if (n->out[k] >= 0 && g->values[n->out[k]].producer == i) g->values[n->out[k]].producer = -1;
            pp_node_clear(n);
            continue;
        }
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0) g->values[n->out[k]].producer = m;
        if (m != i) g->nodes[m] = *n;
        m++;
    }
    g->n_nodes = m;
    memset(c->dead, 0, (size_t)m + 1);
    c->n_dead = 0;
    char label[512];
    for (int i = 0; i < g->n_nodes; i++) {
        const pp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < 0 || g->values[v].kind != PP_VALUE_NODE) continue;
            int p = g->values[v].producer;
            if (p < 0 || p >= i)
                return pp_error(PP_ERR_INTERNAL, "optimizer pass '%s' left %s reading '%s', which %s", pass,
                                pp_node_label(n, label, sizeof label), g->values[v].name,
                                p < 0 ? "no node makes" : "is made after it");
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        const pp_value *v = &g->values[g->outputs[i]];
        if (v->kind == PP_VALUE_NODE && v->producer < 0)
            return pp_error(PP_ERR_INTERNAL, "optimizer pass '%s' left graph output '%s' without a producer", pass,
                            v->name);
    }
    return PP_OK;
}
