/* pippin worker: one rank of a pipeline described by a YAML config; and
 * pippin run: one worker process per rank of that config, on this machine. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "pipe_cli.h"
#include "pippin/config.h"
#include "pippin/pippin.h"
#include "train_args.h"

#include "status_internal.h"
/* The train_args a config describes (pointers into c; dims strings owned
 * by dims_buf). */
static pp_status args_from_config(const pp_config *c, train_args *a, char (*dims_buf)[128]) {
    memset(a, 0, sizeof *a);
    a->loss = c->loss;
    a->save = c->output_dir;
    a->schedule = c->schedule;
    a->text = c->text_file;
    a->vocab = c->text_vocab;
    a->seq = c->text_seq;
    a->batch = c->batch_size;
    a->steps = c->steps;
    a->microbatches = c->microbatches;
    a->training = c->training;
    a->opt = c->optim;
    a->split.transmit_shared = c->transmit_shared;
    a->split.loss = c->loss;
    if (c->n_split_before > 64 || c->n_split_after > 64 || c->n_dims > 16 || c->n_freeze > 64)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: too many split points, freeze patterns or dims", c->path);
    for (int i = 0; i < c->n_split_before; i++) a->split.before[a->split.n_before++] = c->split_before[i];
    for (int i = 0; i < c->n_split_after; i++) a->split.after[a->split.n_after++] = c->split_after[i];
    for (int i = 0; i < c->n_freeze; i++) a->split.freeze[a->split.n_freeze++] = c->freeze[i];
    for (int i = 0; i < c->n_dims; i++) {
        snprintf(dims_buf[i], 128, "%s=%s", c->dims[i].key, c->dims[i].value);
        a->split.dims[a->split.n_dims++] = dims_buf[i];
    }
    for (int i = 0; i < c->n_data; i++) {
        char arg[4600];
        snprintf(arg, sizeof arg, "%s=%s", c->data[i].key, c->data[i].value);
        PP_TRY(pp_cli_add_named_npy(&a->data, arg));
    }
    return PP_OK;
}

/* This rank's transport, with CURVE keys when the config has them. */
static pp_status open_transport(const pp_config *c, int rank, int nstages, const int *stage_ranks,
                                pp_transport **out) {
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.rank = rank;
    o.nranks = c->n_ranks;
    o.endpoints = (const char *const *)c->ranks;
    o.bind_endpoint = c->bind;
    o.nstages = nstages;
    o.stage_ranks = stage_ranks;
    o.timeout_ms = c->timeout_ms;
    if (!c->shared_memory) o.shm_bytes = -1;
    char secret[PP_CURVE_KEY_CHARS + 1];
    char(*pub)[PP_CURVE_KEY_CHARS + 1] = NULL;
    const char **pubs = NULL;
    pp_status s = PP_OK;
    if (c->n_secret_keys) {
        pub = calloc((size_t)c->n_ranks, sizeof *pub);
        pubs = calloc((size_t)c->n_ranks, sizeof *pubs);
        if (!pub || !pubs) s = pp_error(PP_ERR_NOMEM, "out of memory");
        if (s == PP_OK) s = pp_curve_read_key(c->secret_keys[rank], secret);
        for (int r = 0; r < c->n_ranks && s == PP_OK; r++) {
            s = pp_curve_read_key(c->public_keys[r], pub[r]);
            pubs[r] = pub[r];
        }
        o.curve_secret_key = secret;
        o.curve_rank_keys = pubs;
    }
    if (s == PP_OK) s = pp_transport_create(&o, out);
    free(pub);
    free(pubs);
    return s;
}

/* The pipe and schedule: from the whole model (split here), or from a
 * `pippin split` directory, loading only this rank's stage files. */
static pp_status open_pipe(const pp_config *c, const train_args *a, int rank, pp_graph **g, pp_pipe **p,
                           pp_schedule **sched) {
    if (c->model) {
        PP_TRY(pp_split_args_load(&a->split, c->model, g));
        pp_split_spec spec = pp_split_args_spec(&a->split);
        PP_TRY(pp_pipe_split(*g, &spec, p));
        PP_TRY(pp_pipe_probe_shapes(*p, a->split.n_dims, a->split.dims));
    } else {
        PP_TRY(pp_pipe_load_meta(c->stages, p));
        if (a->loss && (!(*p)->loss || strcmp((*p)->loss, a->loss) != 0))
            return pp_error(PP_ERR_INVALID, "%s: the split in %s has loss '%s', the config asks for '%s'", c->path,
                            c->stages, (*p)->loss ? (*p)->loss : "(none)", a->loss);
    }
    PP_TRY(pp_cli_schedule(a->schedule, (*p)->n_stages, a->microbatches, sched));
    if ((*sched)->nranks != c->n_ranks)
        return pp_error(PP_ERR_INVALID, "%s: schedule '%s' over %d stages needs %d ranks; the config lists %d",
                        c->path, a->schedule, (*p)->n_stages, (*sched)->nranks, c->n_ranks);
    for (int s = 0; !c->model && s < (*p)->n_stages; s++)
        if ((*sched)->stage_rank[s] == rank) PP_TRY(pp_pipe_load_graph(*p, c->stages, s));
    return PP_OK;
}

/* --text with a pipe: the first two int64 model inputs. */
static pp_status text_data(train_args *a, const pp_pipe *p) {
    const pp_pipe_edge *e[2];
    int k = 0;
    for (int i = 0; i < p->n_edges && k < 2; i++)
        if (p->edges[i].producer < 0 && p->edges[i].dtype == PP_I64) e[k++] = &p->edges[i];
    if (k < 2) return pp_error(PP_ERR_INVALID, "text data needs a model with two int64 inputs (tokens, targets)");
    int seq = 64;
    if (e[0]->ndim == 2 && e[0]->dims[1] && atoi(e[0]->dims[1]) > 0) seq = atoi(e[0]->dims[1]);
    return train_text_data(a, e[0]->value, e[1]->value, seq);
}

/* data[i] = the config's data for model input names[i] (borrowed). */
static pp_status match_data(const pp_named_tensors *nt, int n, const char *const *names, pp_tensor **data,
                            const char *path) {
    for (int k = 0; k < nt->n; k++) {
        int found = 0;
        for (int i = 0; i < n; i++) found |= strcmp(names[i], nt->names[k]) == 0;
        if (!found) return pp_error(PP_ERR_NOT_FOUND, "%s: data for '%s', which is no model input", path, nt->names[k]);
    }
    for (int i = 0; i < n; i++) {
        data[i] = NULL;
        for (int k = 0; k < nt->n; k++)
            if (strcmp(names[i], nt->names[k]) == 0) data[i] = nt->tensors[k];
        if (!data[i]) return pp_error(PP_ERR_INVALID, "%s: no data for model input '%s'", path, names[i]);
    }
    return PP_OK;
}

static void worker_usage(FILE *f) {
    fprintf(f, "usage: pippin worker CONFIG.yaml [--rank R]\n"
               "Runs one rank of the pipeline the config describes (docs/config.md): builds the\n"
               "stages the schedule puts on this rank, connects to the other ranks' endpoints,\n"
               "and trains (or infers) for the configured steps. The rank comes from --rank,\n"
               "else PIPPIN_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK.\n");
}

int cmd_worker(int argc, char **argv) {
    static const struct option opts[] = {
        {"rank", required_argument, NULL, 'r'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c, rank_arg = -1, rank = -1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:h", opts, NULL)) != -1) {
        if (c == 'r') {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 0 || v > 1 << 20) {
                fprintf(stderr, "pippin worker: --rank '%s': need a non-negative number\n", optarg);
                return 2;
            }
            rank_arg = (int)v;
        } else if (c == 'h') {
            worker_usage(stdout);
            return 0;
        } else {
            worker_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        worker_usage(stderr);
        return 2;
    }
    pp_config *cfg = NULL;
    pp_graph *g = NULL;
    pp_pipe *p = NULL;
    pp_schedule *sched = NULL;
    pp_tensor **data = NULL;
    const char **names = NULL;
    int n_names = 0;
    train_args a;
    char dims_buf[16][128];
    memset(&a, 0, sizeof a);
    rank_job job = {0};
    int rc = 1;
    if (pp_config_load(argv[optind], &cfg) != PP_OK) goto done;
    if (pp_config_rank(rank_arg, cfg->n_ranks, &rank) != PP_OK) goto done;
    if (args_from_config(cfg, &a, dims_buf) != PP_OK) goto done;
    if (open_pipe(cfg, &a, rank, &g, &p, &sched) != PP_OK) goto done;
    /* The model's inputs: the values the data loader feeds (edges from no stage). */
    names = calloc((size_t)p->n_edges + 1, sizeof *names);
    data = calloc((size_t)p->n_edges + 1, sizeof *data);
    if (!names || !data) goto done;
    for (int e = 0; e < p->n_edges; e++)
        if (p->edges[e].producer < 0) names[n_names++] = p->edges[e].value;
    if (a.text && text_data(&a, p) != PP_OK) goto done;
    if (match_data(&a.data, n_names, names, data, cfg->path) != PP_OK) goto done;
    if (a.save && pp_cli_mkdirs(a.save) != PP_OK) goto done;
    job = (rank_job){rank, &a, n_names, names, data, p, NULL, NULL, pp_cli_loss_output(p), NULL, 0, PP_OK, ""};
    if (open_transport(cfg, rank, sched->nstages, sched->stage_rank, &job.t) != PP_OK) goto done;
    if (pp_executor_new(p, sched, rank, a.training, job.t, &job.ex) != PP_OK) goto done;
    if (a.training && pp_executor_set_optimizer(job.ex, &a.opt) != PP_OK) goto done;
    char line[512], *w = line; /* one write, so workers' lines do not interleave */
    w += snprintf(w, 64, "pippin worker: rank %d of %d, stages", rank, cfg->n_ranks);
    for (int i = 0; i < pp_executor_n_stages(job.ex) && w < line + 400; i++)
        w += snprintf(w, 16, " %d", pp_stage_index(pp_executor_stage(job.ex, i)));
    fprintf(stderr, "%s, endpoint %.80s\n", line, pp_transport_endpoint(job.t));
    train_rank_main(&job); /* closes the transport and the executor */
    if (job.status != PP_OK) {
        pp_error(job.status, "%s", job.error);
        goto done;
    }
    rc = 0;
done:
    if (rc) {
        if (rank >= 0) fprintf(stderr, "pippin worker (rank %d): %s\n", rank, pp_last_error());
        else pp_cli_fail("worker");
    }
    pp_executor_free(job.ex);
    pp_transport_close(job.t);
    free(data);
    free(names);
    pp_schedule_free(sched);
    pp_pipe_free(p);
    pp_graph_free(g);
    pp_cli_named_free(&a.data);
    pp_config_free(cfg);
    return rc;
}

/* ---- pippin run ---- */

static void run_usage(FILE *f) {
    fprintf(f, "usage: pippin run CONFIG.yaml\n"
               "Starts one `pippin worker CONFIG.yaml --rank R` process per rank of the config on\n"
               "this machine and waits for them. If a worker fails, the others are stopped and the\n"
               "failed ranks are named.\n");
}

int cmd_run(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        int help = argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
        run_usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    pp_config *cfg;
    if (pp_config_load(argv[1], &cfg) != PP_OK) return pp_cli_fail("run");
    int n = cfg->n_ranks, rc = 0;
    pp_config_free(cfg);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!pids) return 1;
    fflush(stdout);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            execl("/proc/self/exe", "pippin", "worker", argv[1], "--rank", rank, (char *)NULL);
            fprintf(stderr, "pippin run: cannot start rank %d: %s\n", r, strerror(errno));
            _exit(127);
        }
        if (pids[r] < 0) {
            fprintf(stderr, "pippin run: fork for rank %d: %s\n", r, strerror(errno));
            rc = 1;
            n = r;
            break;
        }
    }
    /* Wait for all; the first failure stops the rest (they would only time out). */
    for (int left = n; left > 0; left--) {
        int status;
        pid_t pid = wait(&status);
        if (pid < 0) break;
        int r = 0;
        while (r < n && pids[r] != pid) r++;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (r < n) pids[r] = 0;
        if (!ok) {
            if (WIFSIGNALED(status)) fprintf(stderr, "pippin run: rank %d killed by signal %d\n", r, WTERMSIG(status));
            else fprintf(stderr, "pippin run: rank %d failed (exit %d)\n", r, WEXITSTATUS(status));
            if (!rc)
                for (int k = 0; k < n; k++)
                    if (pids[k] > 0) kill(pids[k], SIGTERM);
            rc = 1;
        }
    }
    free(pids);
    return rc;
}
