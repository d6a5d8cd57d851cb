/* The executor: every rank a thread with its own transport (inproc or ipc);
 * a training step gives bit-for-bit the local runner's loss and gradients
 * under several schedules, replicated parameters included. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "test_filter.h"
#define MAX_RANKS 4

typedef struct {
    int rank, nranks, training, m;
    pp_pipe *p;
    const pp_schedule *sched;
    const char **endpoints;
    pp_tensor **inputs;
    const char *const *names;
    pp_status status;
    char error[1024];
    pp_tensor *outs[4];
    int n_grads;
    char *grad_names[64];
    pp_tensor *grads[64];
    uint64_t left_over; /* tensors sent to this rank and never taken */
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.rank = j->rank;
    o.nranks = j->nranks;
    o.endpoints = j->endpoints;
    o.nstages = j->sched->nstages;
    o.stage_ranks = j->sched->stage_rank;
    o.timeout_ms = 20000;
    pp_transport *t = NULL;
    pp_executor *ex = NULL;
    pp_status s = pp_transport_create(&o, &t);
    if (s == PP_OK) s = pp_executor_new(j->p, j->sched, j->rank, j->training, t, &ex);
    if (s == PP_OK) s = pp_executor_step(ex, 0, j->m, 2, j->names, j->inputs, j->outs);
    for (int i = 0; s == PP_OK && j->training && i < pp_executor_n_stages(ex); i++) {
        pp_flat_params *fp = pp_stage_params(pp_executor_stage(ex, i));
        for (int k = 0; k < fp->n && j->n_grads < 64; k++) {
            pp_tensor *v;
            if (pp_flat_params_grad_view(fp, k, &v) != PP_OK) break;
            j->grad_names[j->n_grads] = strdup(fp->names[k]);
            pp_tensor_clone(v, &j->grads[j->n_grads++]);
            pp_tensor_free(v);
        }
    }
    j->status = s;
    if (s != PP_OK) snprintf(j->error, sizeof j->error, "%s", pp_last_error());
    if (t) {
        pp_transport_stats st;
        pp_transport_stats_get(t, &st);
        j->left_over = st.pending + st.dropped;
    }
    pp_executor_free(ex);
    pp_transport_close(t);
    return NULL;
}

static pp_pipe *fixture_pipe(const char *fx) {
    pp_graph *g = tu_fixture_onnx(fx, "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    TU_OK(pp_pipe_probe_shapes(p, 0, NULL));
    pp_graph_free(g);
    return p;
}

/* Runs the schedule with one thread per rank and compares with the local
 * runner, bit for bit. */
static void check_against_runner(const char *fx, const char *const *names, pp_sched_kind kind, int nranks,
                                 int m, int use_ipc) {
    pp_sched_params sp = {0};
    sp.kind = kind;
    sp.nranks = nranks;
    sp.nmb = m;
    sp.stages_per_rank = pp_sched_default_stages_per_rank(kind);
    pp_schedule *sched;
    TU_OK(pp_schedule_generate(&sp, &sched));
    pp_tensor *inputs[2];
    for (int i = 0; i < 2; i++) {
        char file[64];
        snprintf(file, sizeof file, "%s.npy", names[i]);
        inputs[i] = tu_fixture_npy(fx, file);
    }
    /* reference */
    pp_pipe *rp = fixture_pipe(fx);
    pp_runner *r;
    TU_OK(pp_runner_new(rp, 1, &r));
    pp_tensor *want[4] = {0};
    TU_OK(pp_runner_step(r, m, sched, 2, names, inputs, want));
    /* the ranks */
    pp_pipe *p = fixture_pipe(fx);
    char eps[MAX_RANKS][128];
    const char *endpoints[MAX_RANKS];
    for (int k = 0; k < nranks; k++) {
        if (use_ipc) snprintf(eps[k], sizeof eps[k], "ipc:///tmp/pippin-exec-%d-%d-%d", (int)getpid(), (int)kind, k);
        else snprintf(eps[k], sizeof eps[k], "inproc://pippin-exec-%s-%d-%d", fx, (int)kind, k);
        endpoints[k] = eps[k];
    }
    rank_job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int k = 0; k < nranks; k++) {
        jobs[k] = (rank_job){k, nranks, 1, m, p, sched, endpoints, inputs, names};
        assert_int_equal(pthread_create(&th[k], NULL, rank_main, &jobs[k]), 0);
    }
    for (int k = 0; k < nranks; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < nranks; k++) {
        if (jobs[k].status != PP_OK) fail_msg("%s %s rank %d: %s", fx, sched->name, k, jobs[k].error);
        /* every tensor sent was used (a replicated parameter's delta sent to
         * a stage on the same rank used to sit in the mailbox) */
        if (jobs[k].left_over)
            fail_msg("%s %s rank %d: %llu tensors never taken", fx, sched->name, k,
                     (unsigned long long)jobs[k].left_over);
    }
    int lo = pp_runner_loss_output(r), compared = 0;
    for (int k = 0; k < nranks; k++) {
        if (jobs[k].outs[lo]) {
            tu_assert_close(jobs[k].outs[lo], want[lo], 0, 0, "loss over the transport");
            compared++;
        }
        for (int i = 0; i < jobs[k].n_grads; i++) {
            pp_tensor *ref;
            TU_OK(pp_runner_param_grad(r, jobs[k].grad_names[i], &ref));
            char what[256];
            snprintf(what, sizeof what, "%s %s grad %s (rank %d)", fx, sched->name, jobs[k].grad_names[i], k);
            tu_assert_close(jobs[k].grads[i], ref, 0, 0, what);
            pp_tensor_free(ref);
            pp_tensor_free(jobs[k].grads[i]);
            free(jobs[k].grad_names[i]);
        }
        for (int o = 0; o < 4; o++) pp_tensor_free(jobs[k].outs[o]);
    }
    assert_int_equal(compared, 1);
    for (int o = 0; o < 4; o++) pp_tensor_free(want[o]);
    for (int i = 0; i < 2; i++) pp_tensor_free(inputs[i]);
    pp_runner_free(r);
    pp_pipe_free(rp);
    pp_pipe_free(p);
    pp_schedule_free(sched);
}

static const char *gpt_names[] = {"idx", "targets"};
static const char *xy_names[] = {"x", "y"};

static void test_gpt_1f1b_four_ranks(void **state) {
    (void)state;
    check_against_runner("gpt", gpt_names, PP_SCHED_1F1B, 4, 2, 0);
}

static void test_gpt_zbv_two_ranks(void **state) {
    (void)state; /* V placement: the tied embedding's replicas share rank 0 */
    check_against_runner("gpt", gpt_names, PP_SCHED_ZBV, 2, 2, 0);
}

static void test_gpt_interleaved_two_ranks(void **state) {
    (void)state;
    check_against_runner("gpt", gpt_names, PP_SCHED_INTERLEAVED_1F1B, 2, 2, 0);
}

static void test_skip_zb_h1_over_ipc(void **state) {
    (void)state; /* a skip connection from rank 0 straight to rank 3 */
    check_against_runner("skip", xy_names, PP_SCHED_ZB_H1, 4, 4, 1);
}

static void test_mlp_gpipe(void **state) {
    (void)state;
    check_against_runner("mlp", xy_names, PP_SCHED_GPIPE, 3, 2, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_1f1b_four_ranks),
        cmocka_unit_test(test_gpt_zbv_two_ranks),
        cmocka_unit_test(test_gpt_interleaved_two_ranks),
        cmocka_unit_test(test_skip_zb_h1_over_ipc),
        cmocka_unit_test(test_mlp_gpipe),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
