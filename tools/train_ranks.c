/* pippin train --transport: every rank a thread with its own ZeroMQ
 * transport and executor, as separate worker processes would run. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipe_cli.h"
#include "pippin/exec.h"
#include "pippin/executor.h"
#include "pippin/trainer.h"
#include "train_args.h"

#include "status_internal.h"
/* Inference: the outputs this rank computes, as DIR/<name>.npy (step 0)
 * or DIR/<name>_<step>.npy. */
static pp_status save_rank_outputs(rank_job *j, long long step, pp_tensor **outs) {
    for (int o = 0; o < j->p->n_outputs; o++) {
        if (!outs[o]) continue;
        char prefix[64] = "";
        if (step > 0) snprintf(prefix, sizeof prefix, "step%lld_", step);
        PP_TRY(pp_save_named_npy(j->a->save, prefix, j->p->outputs[o], outs[o]));
    }
    return PP_OK;
}

void *train_rank_main(void *arg) {
    rank_job *j = arg;
    const train_args *a = j->a;
    int n = j->n_inputs, n_out = j->p->n_outputs;
    pp_tensor **batch = calloc((size_t)n + 1, sizeof *batch), **outs = calloc((size_t)n_out + 1, sizeof *outs);
    const char *const *names = j->input_names;
    pp_status s = batch && outs ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    int ns = pp_executor_n_stages(j->ex);
    pp_stage *stages[64];
    pp_optim *optims[64];
    if (ns > 64) s = pp_error(PP_ERR_UNSUPPORTED, "rank %d: more than 64 stages", j->rank);
    for (int i = 0; i < ns && s == PP_OK; i++) {
        stages[i] = pp_executor_stage(j->ex, i);
        optims[i] = pp_executor_optimizer(j->ex, i);
    }
    long long first = 0;
    pp_ckpt_sync ck;
    train_ckpt_init(a, j->t, j->sched, j->rank, j->p->n_stages, ns, stages, optims, &ck);
    if (s == PP_OK && a->training) s = train_resume(&ck, a, &first);
    for (long long step = first; step < a->steps && s == PP_OK; step++) {
        double t0 = pp_cli_now_ms();
        for (int i = 0; i < n && s == PP_OK; i++) {
            pp_tensor_free(batch[i]);
            batch[i] = NULL;
            s = pp_data_batch(j->data[i], step, a->batch, &batch[i]);
        }
        pp_executor_zero_grad(j->ex);
        if (j->trace && step == a->steps - 1) pp_executor_trace(j->ex, j->trace, j->trace_origin_ms);
        if (s == PP_OK) s = pp_executor_step(j->ex, step, a->microbatches, n, names, batch, outs);
        if (s == PP_OK && a->training) s = pp_executor_optimizer_step(j->ex);
        if (s == PP_OK && a->training) s = train_checkpoint(&ck, a, step);
        if (s == PP_OK && j->loss_output >= 0 && outs[j->loss_output]) /* the rank with the loss reports */
            train_print_progress(step, a, (float)pp_tensor_get_f64(outs[j->loss_output], 0), pp_cli_now_ms() - t0);
        if (s == PP_OK && !a->training && a->save) s = save_rank_outputs(j, step, outs);
        for (int o = 0; o < n_out; o++) {
            pp_tensor_free(outs[o]);
            outs[o] = NULL;
        }
    }
    if (s == PP_OK && a->training && a->save) s = pp_save_stage_params(j->p, ns, stages, a->save, "", 0, NULL);
    if (s != PP_OK) {
        snprintf(j->error, sizeof j->error, "%s", pp_last_error());
        pp_transport_abort(j->t, j->error); /* peers fail at once instead of timing out */
    }
    j->status = s;
    for (int i = 0; batch && i < n; i++) pp_tensor_free(batch[i]);
    free(batch);
    free(outs);
    pp_executor_free(j->ex);
    j->ex = NULL;
    pp_transport_close(j->t); /* the owning thread closes it */
    j->t = NULL;
    return NULL;
}

/* Creates every rank's transport (in this thread; each is then handed to
 * its rank's thread). tcp binds loopback on a free port, so endpoints are
 * exchanged after binding. */
static pp_status open_transports(const pp_schedule *sched, const char *kind, int training, rank_job *jobs) {
    int nr = sched->nranks;
    char (*eps)[128] = calloc((size_t)nr, sizeof *eps);
    const char **endpoints = calloc((size_t)nr, sizeof *endpoints);
    pp_status s = eps && endpoints ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int r = 0; r < nr && s == PP_OK; r++) {
        if (strcmp(kind, "inproc") == 0) snprintf(eps[r], sizeof eps[r], "inproc://pippin-train-%d", r);
        else if (strcmp(kind, "ipc") == 0) snprintf(eps[r], sizeof eps[r], "ipc:///tmp/pippin-train-%d-%d", (int)getpid(), r);
        else snprintf(eps[r], sizeof eps[r], "tcp://127.0.0.1:*");
        endpoints[r] = strcmp(kind, "tcp") == 0 ? NULL : eps[r];
    }
    for (int r = 0; r < nr && s == PP_OK; r++) {
        pp_transport_options o;
        pp_transport_options_init(&o);
        o.rank = r;
        o.nranks = nr;
        const char *mine = endpoints[r];
        endpoints[r] = eps[r];
        o.endpoints = endpoints;
        o.nstages = sched->nstages;
        o.stage_ranks = sched->stage_rank;
        /* inference has no per-step exchange to keep ranks within the step
         * window: rank 0 may run many steps ahead */
        if (!training) o.step_window = -1;
        s = pp_transport_create(&o, &jobs[r].t);
        endpoints[r] = mine;
    }
    for (int r = 0; r < nr && s == PP_OK && strcmp(kind, "tcp") == 0; r++)
        for (int q = 0; q < nr && s == PP_OK; q++)
            if (q != r) s = pp_transport_connect_peer(jobs[r].t, q, pp_transport_endpoint(jobs[q].t));
    free(eps);
    free(endpoints);
    return s;
}

/* The ranks' traces (times on one clock) as one timeline. */
static int save_merged_trace(const train_args *a, rank_job *jobs, int nr) {
    pp_trace *all;
    if (pp_trace_new(nr, &all) != PP_OK) return 1;
    pp_status s = PP_OK;
    for (int r = 0; r < nr && s == PP_OK; r++)
        for (size_t i = 0; i < jobs[r].trace->n && s == PP_OK; i++) s = pp_trace_add(all, &jobs[r].trace->ev[i]);
    if (s == PP_OK) s = train_save_trace(a, all);
    pp_trace_free(all);
    return s == PP_OK ? 0 : 1;
}

int pp_cli_loss_output(const pp_pipe *p) {
    for (int o = 0; p->loss && o < p->n_outputs; o++)
        if (strcmp(p->outputs[o], p->loss) == 0) return o;
    return -1;
}

int train_over_transport(pp_graph *g, pp_tensor *const *data, const train_args *a) {
    pp_split_spec spec = pp_split_args_spec(&a->split);
    pp_pipe *p = NULL;
    pp_schedule *sched = NULL;
    rank_job *jobs = NULL;
    pthread_t *th = NULL;
    const char **names = NULL;
    int rc = 1, nr = 0, started = 0;
    if (pp_pipe_split_take(g, &spec, &p) != PP_OK || pp_pipe_probe_shapes(p, a->split.n_dims, a->split.dims) != PP_OK)
        goto done;
    if (a->training && !p->loss) {
        pp_error(PP_ERR_NOT_FOUND, "the model has no loss output to train on");
        goto done;
    }
    if (pp_schedule_from_spec(a->schedule, p->n_stages, a->microbatches, &sched) != PP_OK) goto done;
    if (a->save && pp_mkdirs(a->save) != PP_OK) goto done;
    nr = sched->nranks;
    /* The ranks are threads of this process: each gets its share of the
     * CPUs (pippin's pool, shared by the rank threads, and the BLAS);
     * more would only spin against the other ranks for the same cores. */
    pp_set_threads(pp_default_threads(nr));
    jobs = calloc((size_t)nr, sizeof *jobs);
    th = calloc((size_t)nr, sizeof *th);
    if (!jobs || !th) goto done;
    names = calloc((size_t)g->n_inputs + 1, sizeof *names);
    if (!names) goto done;
    for (int i = 0; i < g->n_inputs; i++) names[i] = g->values[g->inputs[i]].name;
    for (int r = 0; r < nr; r++)
        jobs[r] = (rank_job){r, a, g->n_inputs, names, data, p, NULL, sched, NULL, pp_cli_loss_output(p), NULL, 0, PP_OK, ""};
    for (int r = 0; r < nr && (a->trace || a->svg); r++) /* one per rank: no sharing between threads */
        if (pp_trace_new(nr, &jobs[r].trace) != PP_OK) goto done;
    if (open_transports(sched, a->transport, a->training, jobs) != PP_OK) goto done;
    for (int r = 0; r < nr; r++) {
        if (pp_executor_new(p, sched, r, 1, jobs[r].t, &jobs[r].ex) != PP_OK) goto done;
        if (pp_executor_set_optimizer(jobs[r].ex, &a->opt) != PP_OK) goto done;
        int ns = pp_executor_n_stages(jobs[r].ex);
        pp_stage **mine = calloc((size_t)ns + 1, sizeof *mine); /* every stage of the rank, however many */
        if (!mine) {
            pp_error(PP_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < ns; i++) mine[i] = pp_executor_stage(jobs[r].ex, i);
        pp_status rs = train_set_recompute(a, p->n_stages, mine, ns);
        free(mine);
        if (rs != PP_OK) goto done;
    }
    if (!a->json)
        printf("training %d stages on %d ranks (a thread each, %s transport), %d microbatches of %lld, schedule %s\n",
               p->n_stages, nr, a->transport, a->microbatches, a->batch, sched->name);
    fflush(stdout);
    double t0 = pp_cli_now_ms();
    for (int r = 0; r < nr; r++) jobs[r].trace_origin_ms = t0;
    for (started = 0; started < nr; started++)
        if (pthread_create(&th[started], NULL, train_rank_main, &jobs[started]) != 0) {
            pp_error(PP_ERR_STATE, "cannot start the thread of rank %d", started);
            break;
        }
    for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
    if (started < nr) goto done;
    rc = 0;
    for (int r = 0; r < nr && rc == 0; r++)
        if (jobs[r].status != PP_OK) {
            pp_error(jobs[r].status, "%s", jobs[r].error);
            rc = 1;
        }
    if (!rc && !a->json) printf("%lld steps in %.2f s\n", a->steps, (pp_cli_now_ms() - t0) / 1000.0);
    if (!rc && (a->trace || a->svg)) rc = save_merged_trace(a, jobs, nr);
done:
    for (int r = 0; jobs && r < nr; r++) pp_trace_free(jobs[r].trace);
    for (int r = started; jobs && r < nr; r++) { /* ranks whose thread never ran */
        pp_executor_free(jobs[r].ex);
        pp_transport_close(jobs[r].t);
    }
    free(jobs);
    free(th);
    free(names);
    pp_schedule_free(sched);
    pp_pipe_free(p);
    return rc;
}
