/* --auto N and --split-even N for the commands that split: measures the
 * model's node costs, chooses the cuts (stages/balance.c) and prints each
 * stage's cost and memory with the simulated 1F1B step of the balanced
 * split against an even one (and the model's markers, if any). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/balance.h"
#include "pippin/sched_sim.h"
#include "pippin/schedule.h"
#include "split_args.h"
#include "status_internal.h"

/* Simulated 1F1B step time of a plan with M microbatches (0 on failure:
 * the comparison is informative only). */
static double simulate_plan(const pp_balance_plan *p, int m, double bytes_per_ms) {
    pp_cost_model *cm = NULL;
    pp_schedule *s = NULL;
    pp_sim_result *r = NULL;
    double t = 0;
    if (pp_cost_model_new(p->n_stages, &cm) == PP_OK &&
        pp_schedule_from_spec(p->n_stages > 1 ? "1f1b" : "gpipe", p->n_stages, m, &s) == PP_OK) {
        cm->bandwidth = bytes_per_ms;
        for (int k = 0; k < p->n_stages; k++) {
            cm->f[k] = p->fwd_ms[k];
            cm->i[k] = p->bwd_ms[k];
            cm->w[k] = 0;
            cm->edge_bytes[k] = k + 1 < p->n_stages ? (double)p->cut_bytes[k] : 0;
            cm->stash_bytes[k] = (double)p->stash_bytes[k];
        }
        if (pp_simulate(s, cm, NULL, &r) == PP_OK) t = r->makespan;
    }
    pp_sim_result_free(r);
    pp_schedule_free(s);
    pp_cost_model_free(cm);
    return t;
}

static void print_plan(FILE *f, const pp_graph *g, const pp_balance_plan *p, const char *unit) {
    fprintf(f, "  stage  first node                                  fwd %-4s  bwd %-4s  comm %-3s  params MB  stash MB/mb\n",
            unit, unit, unit);
    for (int k = 0; k < p->n_stages; k++) {
        int first = -1;
        if (k > 0) first = p->cut_at[k - 1];
        const char *nm = first >= 0 ? g->nodes[first].name : "(start)";
        if (!nm || !nm[0]) nm = g->nodes[first].op_type;
        fprintf(f, "  %5d  %-42.42s %9.3f %9.3f %9.3f %10.3f %12.3f\n", k, nm, p->fwd_ms[k], p->bwd_ms[k],
                p->comm_ms[k], (double)p->param_bytes[k] / 1e6, (double)p->stash_bytes[k] / 1e6);
    }
}

/* The model's marker positions (cut before each PipeSplit node); their count. */
static int marker_cuts(const pp_graph *g, int *cuts) {
    int n = 0;
    for (int i = 1; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i].op_type, "PipeSplit") == 0 && strcmp(g->nodes[i].domain, "pippin") == 0) cuts[n++] = i;
    return n;
}

pp_status pp_split_args_balance(pp_split_args *a, const pp_graph *g) {
    int n_stages = a->auto_stages ? a->auto_stages : a->even_stages;
    int m = a->microbatches > 0 ? a->microbatches : 1;
    pp_node_costs_options co;
    pp_node_costs_options_init(&co);
    if (a->auto_batch > 0) co.batch = a->auto_batch;
    co.n_dims = a->n_dims;
    co.dims = a->dims;
    co.loss = a->loss;
    co.source = a->auto_flops ? PP_COST_FLOPS : PP_COST_MEASURED;
    pp_balance_options bo;
    pp_balance_options_init(&bo, n_stages);
    bo.microbatches = m;
    bo.memory_cap = a->auto_memory_cap;
    double gbps = a->auto_gbps > 0 ? a->auto_gbps : 10;
    /* GB/s -> bytes per ms; with counted costs the cut term has no unit to share */
    bo.bytes_per_ms = a->auto_flops ? 0 : gbps * 1e6;
    pp_node_costs *c = NULL;
    pp_balance_plan *chosen = NULL, *even = NULL, *marks = NULL;
    int *mc = malloc(sizeof(int) * ((size_t)g->n_nodes + 1));
    pp_status s = mc ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK) s = pp_node_costs_measure(g, &co, &c);
    if (s == PP_OK) s = pp_balance_plan_even(c, &bo, &even);
    if (s == PP_OK && a->auto_stages) s = pp_balance_plan_auto(c, &bo, &chosen);
    if (s == PP_OK) {
        int nm = marker_cuts(g, mc);
        /* the markers are compared when they make as many stages */
        if (nm == n_stages - 1 && pp_balance_plan_eval(c, &bo, nm, mc, &marks) != PP_OK) marks = NULL;
        const pp_balance_plan *p = chosen ? chosen : even;
        free(a->cut_at);
        a->cut_at = malloc(sizeof(int) * (size_t)n_stages);
        if (!a->cut_at) s = pp_error(PP_ERR_NOMEM, "out of memory");
        else {
            a->n_cut_at = n_stages - 1;
            memcpy(a->cut_at, p->cut_at, sizeof(int) * (size_t)(n_stages - 1));
        }
    }
    if (s == PP_OK && a->report) {
        FILE *f = a->report;
        const char *unit = a->auto_flops ? "Mop" : "ms";
        fprintf(f, "%s split into %d stages (%s per node, training step at batch %d; memory for 1F1B, M=%d%s):\n",
                a->auto_stages ? "balanced" : "even", n_stages,
                a->auto_flops ? "counted operations" : "measured time", c->batch, m,
                a->auto_memory_cap > 0 ? ", capped" : "");
        print_plan(f, g, chosen ? chosen : even, unit);
        double t_even = simulate_plan(even, m, bo.bytes_per_ms);
        if (chosen) {
            double t_auto = simulate_plan(chosen, m, bo.bytes_per_ms);
            fprintf(f, "slowest stage: balanced %.3f %s, even %.3f %s", chosen->max_ms, unit, even->max_ms, unit);
            if (marks) fprintf(f, ", markers %.3f %s", marks->max_ms, unit);
            fprintf(f, "\nsimulated 1F1B step (M=%d): balanced %.3f %s, even %.3f %s (even/balanced %.2fx)", m, t_auto,
                    unit, t_even, unit, t_auto > 0 ? t_even / t_auto : 0.0);
            if (marks) {
                double t_marks = simulate_plan(marks, m, bo.bytes_per_ms);
                fprintf(f, ", markers %.3f %s (%.2fx)", t_marks, unit, t_auto > 0 ? t_marks / t_auto : 0.0);
            }
            fprintf(f, "\n");
        } else {
            fprintf(f, "slowest stage %.3f %s; simulated 1F1B step (M=%d) %.3f %s\n", even->max_ms, unit, m, t_even,
                    unit);
        }
    }
    pp_balance_plan_free(chosen);
    pp_balance_plan_free(even);
    pp_balance_plan_free(marks);
    pp_node_costs_free(c);
    free(mc);
    return s;
}
