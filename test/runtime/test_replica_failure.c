/* A failed step of data-parallel replicas driven through the C API
 * (pp_executor_set_replicas, no worker and no rejoin): R = 2 replicas of
 * the MLP fixture, every rank a thread with its own transport, each
 * replica calling every step as a service would (the optimizer step only
 * after a step that succeeded). One rank's step fails (an injected kernel
 * failure, lib/exec_fault.h), its peers' waits time out; then every
 * replica runs the next steps, which must succeed and leave the
 * parameters bit for bit those of a run where the failed step never
 * happened. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test_util.h"

#include "exec_fault.h"
#include "test_filter.h"

#define R 2
#define MAX_RANKS 3 /* pipeline ranks per replica */
#define MAX_STEPS 6
#define TIMEOUT_MS 5000 /* 6 rank threads set up and step within it of each other (a sanitizer on a loaded machine) */

typedef struct run_spec {
    int nranks;                 /* pipeline ranks per replica (the MLP's 3 stages over them) */
    int n_steps;
    int64_t steps[MAX_STEPS];   /* the step numbers called, in order */
    int fail_replica, fail_rank; /* where the fault fires (-1: nowhere) */
    int64_t fail_step;
    int fail_node;              /* pp_exec_fail_after_nodes(fail_node) before that step */
    int transport;              /* 0 inproc, 1 ipc, 2 tcp, 3 tcp without shared memory (direct links) */
    const char *fixture;        /* NULL: "mlp" (3 stages); "bn": 2 stages with BatchNorm */
    int n_stages;               /* the fixture's stages (0: 3) */
    int no_update;              /* 1: fail_replica's user skips the optimizer step after fail_step instead */
    int shard;                  /* ZeRO-1 (shard_optimizer) */
    int reset;                  /* before step reset_step every rank loads its first parameters and calls
                                   pp_executor_set_replicas and pp_executor_set_optimizer again */
    int64_t reset_step;
} run_spec;

typedef struct job {
    const run_spec *spec;
    int replica, prank;
    pp_pipe *p;
    const pp_schedule *sched;
    const char **endpoints;
    const int *world_stage_rank;
    pp_tensor *x, *y;
    pp_status st[MAX_STEPS];
    char err[MAX_STEPS][512];
    float *params;
    int64_t n_params;
    double ms[MAX_STEPS];
} job;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* This replica's rows of step's batch: x scaled per step, so steps differ. */
static void step_inputs(const job *j, int64_t step, pp_tensor **in) {
    pp_tensor *xs, *ys;
    TU_OK(pp_tensor_slice0(j->x, 2 * j->replica, 2, &xs));
    TU_OK(pp_tensor_slice0(j->y, 2 * j->replica, 2, &ys));
    TU_OK(pp_tensor_clone(xs, &in[0]));
    TU_OK(pp_tensor_clone(ys, &in[1]));
    float *d = in[0]->data;
    for (int64_t i = 0; i < pp_tensor_numel(in[0]); i++) d[i] *= 1.0f + 0.25f * (float)step;
    pp_tensor_free(xs);
    pp_tensor_free(ys);
}

static void *rank_main(void *arg) {
    job *j = arg;
    const run_spec *sp = j->spec;
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.rank = j->replica * sp->nranks + j->prank;
    o.nranks = R * sp->nranks;
    o.endpoints = j->endpoints;
    o.nstages = R * j->sched->nstages;
    o.stage_ranks = j->world_stage_rank;
    o.timeout_ms = TIMEOUT_MS;
    if (sp->transport == 3) o.shm_bytes = -1; /* the gradient sums over direct links */
    pp_transport *t = NULL;
    pp_executor *ex = NULL;
    pp_status s = pp_transport_create(&o, &t);
    if (s == PP_OK) s = pp_executor_new(j->p, j->sched, j->prank, 1, t, &ex);
    pp_replica_options ro;
    pp_replica_options_init(&ro);
    ro.replicas = R;
    ro.replica = j->replica;
    ro.shard_optimizer = sp->shard;
    if (s == PP_OK) s = pp_executor_set_replicas(ex, &ro);
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    oc.lr = 0.05;
    if (s == PP_OK) s = pp_executor_set_optimizer(ex, &oc);
    if (s != PP_OK) fail_msg("replica %d rank %d: setup: %s", j->replica, j->prank, pp_last_error());
    float *first[3] = {NULL}; /* each local stage's parameters before the first step */
    for (int i = 0; i < pp_executor_n_stages(ex); i++) {
        pp_flat_params *fp = pp_stage_params(pp_executor_stage(ex, i));
        first[i] = malloc(sizeof(float) * (size_t)fp->total + 1);
        memcpy(first[i], fp->data, sizeof(float) * (size_t)fp->total);
    }
    static const char *const names[2] = {"x", "y"};
    for (int k = 0; k < sp->n_steps; k++) {
        int64_t step = sp->steps[k];
        int here = j->replica == sp->fail_replica && j->prank == sp->fail_rank && step == sp->fail_step;
        if (sp->reset && step == sp->reset_step) {
            for (int i = 0; i < pp_executor_n_stages(ex); i++) {
                pp_flat_params *fp = pp_stage_params(pp_executor_stage(ex, i));
                memcpy(fp->data, first[i], sizeof(float) * (size_t)fp->total);
            }
            TU_OK(pp_executor_set_replicas(ex, &ro));
            TU_OK(pp_executor_set_optimizer(ex, &oc));
        }
        pp_tensor *in[2];
        step_inputs(j, step, in);
        double t0 = now_ms();
        if (here && !sp->no_update) pp_exec_fail_after_nodes(sp->fail_node);
        s = pp_executor_step(ex, step, 1, 2, names, in, NULL);
        pp_exec_fail_after_nodes(-1);
        if (s == PP_OK && !(here && sp->no_update)) s = pp_executor_optimizer_step(ex);
        j->ms[k] = now_ms() - t0;
        j->st[k] = s;
        if (s != PP_OK) snprintf(j->err[k], sizeof j->err[k], "%s", pp_last_error());
        pp_tensor_free(in[0]);
        pp_tensor_free(in[1]);
    }
    for (int i = 0; i < pp_executor_n_stages(ex); i++) {
        pp_flat_params *fp = pp_stage_params(pp_executor_stage(ex, i));
        j->params = realloc(j->params, sizeof(float) * (size_t)(j->n_params + fp->total));
        memcpy(j->params + j->n_params, fp->data, sizeof(float) * (size_t)fp->total);
        j->n_params += fp->total;
        pp_stage *st = pp_executor_stage(ex, i); /* and the forward's state: BatchNorm's running statistics */
        for (int q = 0; q < pp_stage_n_state(st); q++) {
            const pp_tensor *v = pp_stage_state_tensor(st, q);
            int64_t n = pp_tensor_numel(v);
            j->params = realloc(j->params, sizeof(float) * (size_t)(j->n_params + n));
            memcpy(j->params + j->n_params, v->data, sizeof(float) * (size_t)n);
            j->n_params += n;
        }
    }
    for (int i = 0; i < 3; i++) free(first[i]);
    pp_executor_free(ex);
    pp_transport_close(t);
    return NULL;
}

/* A tcp port on loopback that was free a moment ago. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Runs spec; jobs[replica * nranks + rank] get each rank's statuses and
 * final parameters. */
static void run(const run_spec *sp, job *jobs) {
    static int run_no;
    run_no++;
    pp_sched_params spp;
    pp_sched_params_init(&spp, sp->nranks == 1 ? PP_SCHED_LOOPED_BFS : PP_SCHED_GPIPE, sp->nranks, 1);
    spp.stages_per_rank = (sp->n_stages ? sp->n_stages : 3) / sp->nranks;
    pp_schedule *sched;
    TU_OK(pp_schedule_generate(&spp, &sched));
    int world = R * sp->nranks, wsr[R * 3];
    pp_executor_world_stage_ranks(sched, R, wsr);
    char eps[R * MAX_RANKS][128];
    const char *endpoints[R * MAX_RANKS];
    for (int k = 0; k < world; k++) {
        if (sp->transport == 0) snprintf(eps[k], sizeof eps[k], "inproc://pippin-repfail-%d-%d", run_no, k);
        else if (sp->transport == 1) snprintf(eps[k], sizeof eps[k], "ipc:///tmp/pippin-repfail-%d-%d-%d", (int)getpid(), run_no, k);
        else snprintf(eps[k], sizeof eps[k], "tcp://127.0.0.1:%d", free_port());
        endpoints[k] = eps[k];
    }
    const char *fx = sp->fixture ? sp->fixture : "mlp";
    pp_tensor *x = tu_fixture_npy(fx, "x.npy"), *y = tu_fixture_npy(fx, "y.npy");
    pp_pipe *pipes[R];
    for (int r = 0; r < R; r++) {
        pp_graph *g = tu_fixture_onnx(fx, "model.onnx");
        TU_OK(pp_pipe_split(g, NULL, &pipes[r]));
        TU_OK(pp_pipe_probe_shapes(pipes[r], 0, NULL));
        pp_graph_free(g);
    }
    pthread_t th[R * MAX_RANKS];
    for (int k = 0; k < world; k++) {
        jobs[k] = (job){sp, k / sp->nranks, k % sp->nranks, pipes[k / sp->nranks], sched, endpoints, wsr, x, y};
        assert_int_equal(pthread_create(&th[k], NULL, rank_main, &jobs[k]), 0);
    }
    for (int k = 0; k < world; k++) pthread_join(th[k], NULL);
    for (int r = 0; r < R; r++) pp_pipe_free(pipes[r]);
    pp_tensor_free(x);
    pp_tensor_free(y);
    pp_schedule_free(sched);
}

static void free_jobs(job *jobs, int n) {
    for (int k = 0; k < n; k++) free(jobs[k].params);
}

/* The failure case, then a clean run of the steps without the failed one:
 * every step succeeded on every rank or failed on every rank (the vote),
 * the failed step failed and every later one succeeded, and every replica
 * ends with the clean run's parameters, bit for bit. */
static void check_recovers(run_spec sp) {
    int world = R * sp.nranks;
    job got[R * MAX_RANKS], want[R * MAX_RANKS];
    run(&sp, got);
    for (int w = 0; w < world && getenv("PIPPIN_TEST_VERBOSE"); w++)
        for (int k = 0; k < sp.n_steps; k++)
            fprintf(stderr, "# world rank %d, step %lld (%.0f ms): %s\n", w, (long long)sp.steps[k], got[w].ms[k],
                    got[w].st[k] == PP_OK ? "ok" : got[w].err[k]);
    run_spec clean = sp;
    clean.fail_replica = -1;
    clean.n_steps = 0;
    for (int k = 0; k < sp.n_steps; k++) {
        int ok = got[0].st[k] == PP_OK;
        for (int w = 0; w < world; w++)
            if ((got[w].st[k] == PP_OK) != ok)
                fail_msg("step %lld succeeded on some ranks and failed on others (world rank %d: %s)",
                         (long long)sp.steps[k], w, ok ? got[w].err[k] : "ok");
        if (sp.steps[k] == sp.fail_step && ok) fail_msg("step %lld did not fail", (long long)sp.fail_step);
        if (sp.steps[k] > sp.fail_step && !ok)
            fail_msg("step %lld after the failed step %lld: %s", (long long)sp.steps[k], (long long)sp.fail_step,
                     got[0].err[k]);
        if (ok) clean.steps[clean.n_steps++] = sp.steps[k];
    }
    run(&clean, want);
    for (int w = 0; w < world; w++)
        for (int k = 0; k < clean.n_steps; k++)
            if (want[w].st[k] != PP_OK) fail_msg("clean run, world rank %d, step %lld: %s", w, (long long)clean.steps[k], want[w].err[k]);
    for (int w = 0; w < world; w++) {
        assert_int_equal(got[w].n_params, want[w].n_params);
        int64_t diff = 0;
        for (int64_t i = 0; i < got[w].n_params; i++) diff += memcmp(&got[w].params[i], &want[w].params[i], 4) != 0;
        if (diff)
            fail_msg("world rank %d: %lld of %lld parameters differ from the run without the failed step", w,
                     (long long)diff, (long long)got[w].n_params);
    }
    free_jobs(got, world);
    free_jobs(want, world);
}

/* Replica 1's forward fails at step 1 (before any gradient) and it goes
 * on to step 2 at once; replica 0 waits for its gradients until the
 * timeout. Before the fix replica 1's step 2 was summed through shared
 * memory with replica 0's step 1 (the rounds carried no step), replica 0's
 * step 2 with replica 1's step 3 and reported success (a wrong update on
 * one replica only), and every step after failed on one replica or the
 * other. */
static void test_forward_failure_one_rank(void **state) {
    (void)state;
    check_recovers((run_spec){.nranks = 1, .n_steps = 4, .steps = {0, 1, 2, 3}, .fail_replica = 1, .fail_rank = 0,
                              .fail_step = 1, .fail_node = 0});
}

/* Three ranks per replica over ipc; replica 0's middle rank fails in its
 * backward (after part of its weight gradients went in): its own
 * pipeline's ranks and the other replica time out. */
static void test_backward_failure_pipeline_ipc(void **state) {
    (void)state;
    check_recovers((run_spec){.nranks = 3, .n_steps = 4, .steps = {0, 1, 2, 3}, .fail_replica = 0, .fail_rank = 1,
                              .fail_step = 1, .fail_node = 12, .transport = 1});
}

/* The same over tcp on loopback, replica 1's last rank failing at its
 * first node (its peers wait for its gradients). */
static void test_last_rank_failure_tcp(void **state) {
    (void)state;
    check_recovers((run_spec){.nranks = 3, .n_steps = 5, .steps = {0, 1, 2, 3, 4}, .fail_replica = 1, .fail_rank = 2,
                              .fail_step = 2, .fail_node = 0, .transport = 2});
}

/* The same with the replicas' sums over direct TCP links (no shared
 * memory): the links are dropped with the failed step and agreed again. */
static void test_last_rank_failure_links(void **state) {
    (void)state;
    check_recovers((run_spec){.nranks = 3, .n_steps = 5, .steps = {0, 1, 2, 3, 4}, .fail_replica = 1, .fail_rank = 2,
                              .fail_step = 2, .fail_node = 0, .transport = 3});
}

/* Regression: BatchNorm's running statistics. A rank whose own part of
 * the failed step went through kept its forward's update of them (only
 * the rank that failed took it back), so the steps after differed from a
 * run without the failed step. Replica 0's second rank fails in its
 * weight gradients (node 22), after its input gradient reached the first
 * rank: the first stage's ranks (bn1, bn2) finish their part, the vote
 * fails them, and their statistics must go back too (16 values differed). */
static void test_batch_norm_state_rolled_back(void **state) {
    (void)state;
    check_recovers((run_spec){.nranks = 2, .n_steps = 4, .steps = {0, 1, 2, 3}, .fail_replica = 0, .fail_rank = 1,
                              .fail_step = 1, .fail_node = 22, .transport = 0, .fixture = "bn", .n_stages = 2});
}

/* ZeRO-1: the same failure; the parameters' all-gather after each step
 * that succeeded. */
static void test_forward_failure_sharded(void **state) {
    (void)state;
    check_recovers((run_spec){.nranks = 1, .n_steps = 4, .steps = {0, 1, 2, 3}, .fail_replica = 0, .fail_rank = 0,
                              .fail_step = 2, .fail_node = 1, .shard = 1});
}

/* A step that succeeded on one replica and not on the other (here: its
 * user skipped the optimizer step) leaves different parameters: every
 * replica's next step refuses, naming the ranks, instead of training on
 * silently; loading the same parameters everywhere and setting the
 * replicas and optimizer again (as the error says) gives a run that
 * started there. */
static void test_diverged_replicas_refused(void **state) {
    (void)state;
    run_spec sp = {.nranks = 1, .n_steps = 5, .steps = {0, 1, 2, 3, 4}, .fail_replica = 1, .fail_rank = 0,
                   .fail_step = 1, .no_update = 1, .reset = 1, .reset_step = 3};
    job got[R], want[R];
    run(&sp, got);
    run_spec clean = {.nranks = 1, .n_steps = 2, .steps = {3, 4}, .fail_replica = -1};
    run(&clean, want);
    for (int w = 0; w < R; w++) {
        assert_int_equal(got[w].st[0], PP_OK);
        assert_int_equal(got[w].st[1], PP_OK);
        assert_int_equal(got[w].st[2], PP_ERR_STATE);
        if (!strstr(got[w].err[2], "rank 1 (replica 1, stage 0) has taken 1 optimizer steps, rank 0 (replica 0, "
                                   "stage 0) 2: their parameters differ"))
            fail_msg("world rank %d: %s", w, got[w].err[2]);
        for (int k = 3; k < 5; k++)
            if (got[w].st[k] != PP_OK) fail_msg("world rank %d, step %d after the reset: %s", w, k, got[w].err[k]);
        assert_int_equal(got[w].n_params, want[w].n_params);
        assert_memory_equal(got[w].params, want[w].params, sizeof(float) * (size_t)got[w].n_params);
    }
    free_jobs(got, R);
    free_jobs(want, R);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_failure_one_rank),
        cmocka_unit_test(test_backward_failure_pipeline_ipc),
        cmocka_unit_test(test_last_rank_failure_tcp),
        cmocka_unit_test(test_last_rank_failure_links),
        cmocka_unit_test(test_batch_norm_state_rolled_back),
        cmocka_unit_test(test_forward_failure_sharded),
        cmocka_unit_test(test_diverged_replicas_refused),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
