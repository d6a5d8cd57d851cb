/* pippin train: trains a model on .npy data with SGD or AdamW, one process,
 * printing each step's loss (computed before that step's update). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "cli_util.h"
#include "commands.h"
#include "pipe_cli.h"
#include "text_data.h"
#include "train_args.h"
#include "pippin/microbatch.h"
#include "pippin/pippin.h"

#include "status_internal.h"
static void train_usage(FILE *f) {
    fprintf(f,
            "usage: pippin train MODEL.onnx --data NAME=FILE.npy ... --batch-size B --steps S\n"
            "                    [--optimizer sgd|adamw] [--lr X] [--momentum X] [--dampening X]\n"
            "                    [--nesterov] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X]\n"
            "                    [--microbatches M] [--loss NAME] [--save DIR] [--json]\n"
            "                    [--schedule KIND] [--split-before P]... [--split-after P]...\n"
            "                    [--transmit-shared] [--dim NAME=N]... [--no-split]\n"
            "                    [--auto N | --split-even N] (balanced stages: pippin split --help)\n"
            "                    [--freeze PATTERN]... [--recompute | --recompute-stages S,S...]\n"
            "                    [--text FILE.txt --vocab VOCAB.json [--seq T]]\n"
            "                    [--transport inproc|ipc|tcp] [--trace FILE.json] [--svg FILE.svg]\n"
            "                    [--checkpoint DIR [--checkpoint-every N] [--checkpoint-keep K]\n"
            "                     [--resume]]\n"
            "Step i trains on rows (i*B + j) mod N, j < B, of every data file (N rows along\n"
            "dim 0), and prints the loss of that batch before the update; --json prints\n"
            "{\"step\": i, \"loss\": x} per line. With --microbatches M each batch is split in\n"
            "M parts whose gradients are accumulated (same result, less memory). --save\n"
            "writes the trained parameters as DIR/<name>.npy. A model with pippin::PipeSplit\n"
            "markers, or given a split spec, trains as a pipeline: its stages run the M\n"
            "microbatches in the order of schedule KIND (gpipe, 1f1b, interleaved-1f1b,\n"
            "zb-h1, zbv, ..., csv:FILE; default gpipe), each stage with its own optimizer\n"
            "over its own parameters; with --transport every rank is a thread with its own\n"
            "ZeroMQ transport (tcp: loopback) running the schedule's action list for its\n"
            "stages, as separate workers would. --trace/--svg write the timeline of the last\n"
            "step (every rank's actions), as `pippin simulate` does for a simulation.\n"
            "--checkpoint saves every stage's parameters and optimizer state to DIR (every N\n"
            "steps and at the end) as DIR/step_N/stage_K.safetensors, committed by a manifest\n"
            "once every stage's file is on disk, keeping the K newest (default 2); --resume\n"
            "continues from the newest committed one up to --steps in all, with exactly the\n"
            "losses an uninterrupted run prints (pipelined models). `pippin checkpoint`\n"
            "lists, inspects and exports them.\n"
            "--schedule needs a model with stages; without, it is an error.\n"
            "--recompute (every stage) or --recompute-stages 0,2 (those stages): the forward\n"
            "keeps only a stage's inputs per microbatch and runs again right before the\n"
            "backward, with the same Dropout masks and without updating BatchNorm's running\n"
            "statistics twice: the same results, less memory between F and B, one more\n"
            "forward per microbatch. Needs a model with stages.\n"
            "With --json, a loss that is not finite (nan, inf) is written as null.\n"
            "Trainable: the initializers the exporter listed (pippin_torch.export records\n"
            "torch's parameters with requires_grad; buffers are constants), else every float\n"
            "initializer; --freeze PATTERN (shell pattern on names) freezes more.\n"
            "--text trains a character-level model on a text\n"
            "file instead of --data: windows of T+1 characters (T from --seq, else the\n"
            "model's fixed input length, else 64) feed the model's first two int64 inputs\n"
            "(tokens, and the tokens shifted by one). Defaults as torch.optim:\n"
            "adamw lr 1e-3, betas 0.9 0.999, eps 1e-8, weight decay 1e-2; sgd lr 1e-3.\n");
}


/* Parses a number option; 0 on success. */
static int num(const char *opt, const char *s, double *out) {
    char *end;
    *out = strtod(s, &end);
    if (end == s || *end) {
        fprintf(stderr, "pippin train: %s expects a number, got '%s'\n", opt, s);
        return -1;
    }
    return 0;
}

/* --recompute-stages "0,2": distinct stage indices, at most 64; 0 on
 * success, else -1 (printed). */
static int parse_stage_list(const char *s, train_args *a) {
    const char *p = s;
    if (a->n_recompute_stages) {
        fprintf(stderr, "pippin train: --recompute-stages given twice; list every stage once (0,2)\n");
        return -1;
    }
    while (1) {
        char *end;
        if (*p < '0' || *p > '9') break;
        long v = strtol(p, &end, 10);
        if (*end && *end != ',') break;
        if (v > 1 << 20) {
            fprintf(stderr, "pippin train: --recompute-stages '%s': stage %ld is past any pipeline (at most %d)\n", s,
                    v, 1 << 20);
            return -1;
        }
        for (int i = 0; i < a->n_recompute_stages; i++)
            if (a->recompute_stages[i] == (int)v) {
                fprintf(stderr, "pippin train: --recompute-stages '%s': stage %ld is listed twice\n", s, v);
                return -1;
            }
        if (a->n_recompute_stages == 64) {
            fprintf(stderr, "pippin train: --recompute-stages '%s': more than 64 stages\n", s);
            return -1;
        }
        a->recompute_stages[a->n_recompute_stages++] = (int)v;
        if (!*end) return 0;
        p = end + 1;
    }
    fprintf(stderr, "pippin train: --recompute-stages '%s': expected stage indices separated by commas, "
            "such as 0,2\n", s);
    a->n_recompute_stages = 0;
    return -1;
}

pp_status train_set_recompute(const train_args *a, int n_total, pp_stage *const *stages, int n) {
    for (int i = 0; i < a->n_recompute_stages; i++)
        if (a->recompute_stages[i] >= n_total)
            return pp_error(PP_ERR_INVALID, "--recompute-stages: stage %d, but the pipeline has %d stage%s (0-%d)",
                            a->recompute_stages[i], n_total, n_total == 1 ? "" : "s", n_total - 1);
    for (int k = 0; k < n; k++) {
        int on = a->recompute;
        for (int i = 0; i < a->n_recompute_stages; i++) on |= a->recompute_stages[i] == pp_stage_index(stages[k]);
        if (on) PP_TRY(pp_stage_set_recompute(stages[k], 1));
    }
    return PP_OK;
}

/* 0 ok, 1 failure (message set), 2 usage error (printed), 3 --help. */
static int parse(int argc, char **argv, train_args *a) {
    static const struct option opts[] = {
        {"data", required_argument, NULL, 'd'},   {"batch-size", required_argument, NULL, 'b'},
        {"steps", required_argument, NULL, 's'},  {"optimizer", required_argument, NULL, 'O'},
        {"lr", required_argument, NULL, 'r'},     {"momentum", required_argument, NULL, 'm'},
        {"dampening", required_argument, NULL, 'D'}, {"nesterov", no_argument, NULL, 'n'},
        {"weight-decay", required_argument, NULL, 'w'}, {"beta1", required_argument, NULL, '1'},
        {"beta2", required_argument, NULL, '2'},  {"eps", required_argument, NULL, 'e'},
        {"microbatches", required_argument, NULL, 'M'}, {"loss", required_argument, NULL, 'l'},
        {"save", required_argument, NULL, 'S'},   {"json", no_argument, NULL, 'j'},
        {"schedule", required_argument, NULL, 'K'}, {"no-split", no_argument, NULL, 'N'},
        {"text", required_argument, NULL, 'T'},   {"vocab", required_argument, NULL, 'V'},
        {"seq", required_argument, NULL, 'q'},     {"transport", required_argument, NULL, 'X'},
        {"trace", required_argument, NULL, 'R'},  {"svg", required_argument, NULL, 'G'},
        {"checkpoint", required_argument, NULL, 'C'}, {"checkpoint-every", required_argument, NULL, 'E'},
        {"resume", no_argument, NULL, 'U'},       {"checkpoint-keep", required_argument, NULL, 'k'},
        {"recompute", no_argument, NULL, 'P'},    {"recompute-stages", required_argument, NULL, 'Q'},
        PP_SPLIT_LONG_OPTIONS,
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    /* Hyperparameters are collected first: --optimizer may come last. */
    double v, lr = -1, mom = 0, damp = 0, wd = -1, b1 = 0.9, b2 = 0.999, eps = 1e-8, x;
    int nesterov = 0, c, li = -1;
    const char *opt_name = "sgd";
    a->microbatches = 1;
    a->steps = -1;
    a->training = 1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "d:b:s:h", opts, &li)) != -1) {
        double *dst = NULL;
        char opt[40];
        int handled = pp_split_args_handle(&a->split, c, optarg, "train");
        if (handled < 0) return 2;
        if (handled) {
            li = -1;
            continue;
        }
        snprintf(opt, sizeof opt, "--%s", li >= 0 ? opts[li].name : "?");
        li = -1;
        switch (c) {
        case 'd':
            if (pp_cli_add_named_npy(&a->data, optarg) != PP_OK) return 1;
            continue;
        case 'b':
        case 's':
        case 'M':
            if (num(c == 'b' ? "--batch-size" : c == 's' ? "--steps" : "--microbatches", optarg, &x) ||
                x != (long long)x || x < (c == 's' ? 0 : 1)) {
                fprintf(stderr, "pippin train: bad count '%s'\n", optarg);
                return 2;
            }
            if (c == 'b') a->batch = (long long)x;
            else if (c == 's') a->steps = (long long)x;
            else a->microbatches = (int)x;
            continue;
        case 'O': opt_name = optarg; continue;
        case 'n': nesterov = 1; continue;
        case 'l': a->loss = optarg; continue;
        case 'S': a->save = optarg; continue;
        case 'K': a->schedule = optarg; continue;
        case 'T': a->text = optarg; continue;
        case 'R': a->trace = optarg; continue;
        case 'C': a->checkpoint = optarg; continue;
        case 'U': a->resume = 1; continue;
        case 'E':
            if (num("--checkpoint-every", optarg, &x) || x != (long long)x || x < 1) {
                fprintf(stderr, "pippin train: --checkpoint-every '%s': need a positive count\n", optarg);
                return 2;
            }
            a->checkpoint_every = (long long)x;
            continue;
        case 'k':
            if (num("--checkpoint-keep", optarg, &x) || x != (int)x || x < 1) {
                fprintf(stderr, "pippin train: --checkpoint-keep '%s': need a positive count\n", optarg);
                return 2;
            }
            a->checkpoint_keep = (int)x;
            continue;
        case 'G': a->svg = optarg; continue;
        case 'P': a->recompute = 1; continue;
        case 'Q':
            if (parse_stage_list(optarg, a) != 0) return 2;
            continue;
        case 'X':
            if (strcmp(optarg, "inproc") && strcmp(optarg, "ipc") && strcmp(optarg, "tcp")) {
                fprintf(stderr, "pippin train: --transport '%s': inproc, ipc or tcp\n", optarg);
                return 2;
            }
            a->transport = optarg;
            continue;
        case 'V': a->vocab = optarg; continue;
        case 'q':
            if ((a->seq = atoi(optarg)) < 1) {
                fprintf(stderr, "pippin train: --seq '%s': need a positive number\n", optarg);
                return 2;
            }
            continue;
        case 'N': a->no_split = 1; continue;
        case 'j': a->json = 1; continue;
        case 'h': return 3;
        case 'r': dst = &lr; break;
        case 'm': dst = &mom; break;
        case 'D': dst = &damp; break;
        case 'w': dst = &wd; break;
        case '1': dst = &b1; break;
        case '2': dst = &b2; break;
        case 'e': dst = &eps; break;
        default: return 2;
        }
        if (num(opt, optarg, &v)) return 2;
        *dst = v;
    }
    if (optind != argc - 1 || a->batch < 1 || a->steps < 0 || (a->data.n == 0 && !a->text)) {
        fprintf(stderr, "pippin train: need one MODEL.onnx, --data (or --text), --batch-size and --steps\n");
        return 2;
    }
    if ((a->resume || a->checkpoint_every || a->checkpoint_keep) && !a->checkpoint) {
        fprintf(stderr, "pippin train: --resume, --checkpoint-every and --checkpoint-keep need --checkpoint DIR\n");
        return 2;
    }
    if (a->recompute && a->n_recompute_stages) {
        fprintf(stderr, "pippin train: --recompute (every stage) and --recompute-stages (some) exclude each other\n");
        return 2;
    }
    if (a->text && (!a->vocab || a->data.n)) {
        fprintf(stderr, "pippin train: --text needs --vocab and no --data\n");
        return 2;
    }
    if (a->batch < a->microbatches) {
        fprintf(stderr, "pippin train: --batch-size %lld is smaller than --microbatches %d\n", a->batch,
                a->microbatches);
        return 2;
    }
    pp_optim_kind kind;
    if (pp_optim_kind_parse(opt_name, &kind) != PP_OK) {
        fprintf(stderr, "pippin train: %s\n", pp_last_error());
        return 2;
    }
    pp_optim_config_init(&a->opt, kind);
    if (lr != -1) a->opt.lr = lr;
    if (wd != -1) a->opt.weight_decay = wd;
    a->opt.momentum = mom;
    a->opt.dampening = damp;
    a->opt.nesterov = nesterov;
    a->opt.beta1 = b1;
    a->opt.beta2 = b2;
    a->opt.eps = eps;
    pp_optim *probe; /* checks the hyperparameters as torch does */
    if (pp_optim_new(&a->opt, 0, &probe) != PP_OK) {
        fprintf(stderr, "pippin train: %s\n", pp_last_error());
        return 2;
    }
    pp_optim_free(probe);
    return 0;
}

/* One step: the batch, split in microbatches; returns the batch loss. */
static pp_status train_step(pp_trainer *t, pp_tensor *const *data, int n, const train_args *a,
                            long long step, float *loss) {
    int m = a->microbatches;
    /* batch[i]: input i's rows of this step; chunks[i * m + k]: its microbatch k */
    pp_tensor **batch = calloc((size_t)n + 1, sizeof *batch);
    pp_tensor **chunks = calloc((size_t)n * (size_t)m + 1, sizeof *chunks);
    pp_tensor **ins = calloc((size_t)n + 1, sizeof *ins);
    pp_status s = batch && chunks && ins ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && s == PP_OK; i++) {
        s = pp_data_batch(data[i], step, a->batch, &batch[i]);
        if (s == PP_OK) s = pp_microbatch_split(batch[i], m, "batch", &chunks[(size_t)i * (size_t)m]);
    }
    pp_flat_params_zero_grad(pp_trainer_params(t));
    double sum = 0;
    pp_trainer_hold_params(t, 1); /* no update until the step's end: weights packed once for all microbatches */
    for (int k = 0; k < m && s == PP_OK; k++) {
        for (int i = 0; i < n; i++) ins[i] = chunks[(size_t)i * (size_t)m + (size_t)k];
        pp_trainer_set_step(t, step, k);
        float l;
        s = pp_trainer_backward(t, ins, 1.0f / (float)m, &l);
        sum += l;
    }
    pp_trainer_hold_params(t, 0);
    if (s == PP_OK) *loss = m == 1 ? (float)sum : (float)(sum / m);
    for (int i = 0; batch && i < n; i++) pp_tensor_free(batch[i]);
    for (size_t k = 0; chunks && k < (size_t)n * (size_t)m; k++) pp_tensor_free(chunks[k]);
    free(batch);
    free(chunks);
    free(ins);
    return s;
}

static pp_status save_params(pp_trainer *tr, const char *dir) {
    pp_flat_params *fp = pp_trainer_params(tr);
    PP_TRY(pp_mkdirs(dir));
    for (int i = 0; i < fp->n; i++) {
        pp_tensor *t;
        PP_TRY(pp_flat_params_data_view(fp, i, &t));
        pp_status s = pp_save_named_npy(dir, "", fp->names[i], t);
        pp_tensor_free(t);
        PP_TRY(s);
    }
    for (int i = 0; i < pp_trainer_n_state(tr); i++) /* BatchNorm's running statistics */
        PP_TRY(pp_save_named_npy(dir, "", pp_trainer_state_name(tr, i), pp_trainer_state_tensor(tr, i)));
    return PP_OK;
}

double pp_cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* "step 3: loss 2.14 (12.5 ms, 320 samples/s)": steps count from 0, as in
 * the --json lines. */
void train_print_progress(long long step, const train_args *a, float loss, double ms) {
    if (a->json) {
        /* JSON has no nan or inf: a diverged loss is null. */
        if (isfinite(loss)) printf("{\"step\": %lld, \"loss\": %.9g}\n", step, loss);
        else printf("{\"step\": %lld, \"loss\": null}\n", step);
        fflush(stdout);
        return;
    }
    printf("step %lld: loss %.6f  (%.1f ms, %.0f samples/s)\n", step, loss, ms,
           ms > 0 ? (double)a->batch * 1000.0 / ms : 0.0);
    fflush(stdout);
}

/* Pipeline training: every stage in this process, driven by the runner in
 * the schedule's order; a progress line per step. */
pp_status train_save_trace(const train_args *a, const pp_trace *t) {
    /* The step starts at time 0, whatever clock origin the ranks shared. */
    pp_trace *shifted;
    PP_TRY(pp_trace_new(t->nranks, &shifted));
    double origin = t->n ? t->ev[0].start : 0;
    for (size_t i = 1; i < t->n; i++)
        if (t->ev[i].start < origin) origin = t->ev[i].start;
    pp_status s = PP_OK;
    for (size_t i = 0; i < t->n && s == PP_OK; i++) {
        pp_trace_event e = t->ev[i];
        e.start -= origin;
        e.end -= origin;
        s = pp_trace_add(shifted, &e);
    }
    if (s == PP_OK && a->trace) s = pp_trace_save_chrome(shifted, a->trace, 1.0);
    if (s == PP_OK && a->svg) s = pp_trace_save_svg(shifted, a->svg, "pippin train: last step (microseconds)");
    pp_trace_free(shifted);
    PP_TRY(s);
    if (!a->json && (a->trace || a->svg))
        printf("timeline of the last step:%s%s%s%s\n", a->trace ? " " : "", a->trace ? a->trace : "",
               a->svg ? " " : "", a->svg ? a->svg : "");
    return PP_OK;
}

static void human_bytes(int64_t b, char *buf, size_t cap) {
    if (b < 0) snprintf(buf, cap, "?");
    else if (b < 10 * 1024) snprintf(buf, cap, "%lld B", (long long)b);
    else if (b < 10 * 1024 * 1024) snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
    else snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
}

/* What recomputation saves: per recomputing stage, the bytes per sample
 * kept from F to I without and with it (at the sizes shape probing ran; ?
 * where a forward at batch 1 or 2 fails). */
static pp_status print_recompute(const pp_pipe *p, pp_stage *const *stages, int n) {
    const char *batch = NULL;
    char name[64] = "";
    if (p->n_dims) { /* the first probed dim is the batch */
        const char *eq = strrchr(p->dims[0], '=');
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - p->dims[0]) : 63, p->dims[0]);
        batch = name;
    }
    for (int i = 0; i < n; i++) {
        if (!pp_stage_recompute(stages[i])) continue;
        int64_t full = -1, in = -1; /* -1: not measurable (BatchNorm refuses a batch of 1) */
        if (pp_stage_stash_per_sample_dims(stages[i], batch, p->n_dims, (const char *const *)p->dims, &full) != PP_OK)
            full = -1;
        if (pp_stage_recompute_stash_per_sample_dims(stages[i], batch, p->n_dims, (const char *const *)p->dims,
                                                     &in) != PP_OK)
            in = -1;
        char a[32], b[32];
        human_bytes(full, a, sizeof a);
        human_bytes(in, b, sizeof b);
        char at[256] = "";
        size_t k = 0;
        for (int d = 1; d < p->n_dims && k < sizeof at; d++) /* dims[0] is the batch */
            k += (size_t)snprintf(at + k, sizeof at - k, "%s%s", d > 1 ? ", " : " at ", p->dims[d]);
        printf("recompute stage %d: stash %s -> %s per sample%s (its inputs), one more forward per microbatch\n",
               pp_stage_index(stages[i]), a, b, at);
    }
    return PP_OK;
}

static int train_pipelined(pp_graph *g, pp_tensor *const *data, const train_args *a) {
    pp_pipe *p = NULL;
    pp_runner *r = NULL;
    pp_trace *trace = NULL;
    pp_schedule *sched = NULL;
    int rc = 1, n = g->n_inputs, lo = -1;
    pp_tensor **batch = calloc((size_t)n + 1, sizeof *batch);
    pp_tensor **outs = NULL;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    if (!batch || !names) goto done;
    for (int i = 0; i < n; i++) names[i] = g->values[g->inputs[i]].name;
    if (pp_cli_open_pipeline(g, &a->split, 1, &p, &r) != PP_OK) goto done;
    if (pp_schedule_from_spec(a->schedule, p->n_stages, a->microbatches, &sched) != PP_OK) goto done;
    if (pp_runner_set_optimizer(r, &a->opt) != PP_OK) goto done;
    if ((a->trace || a->svg) && pp_trace_new(sched ? sched->nranks : p->n_stages, &trace) != PP_OK) goto done;
    if ((lo = pp_runner_loss_output(r)) < 0) {
        pp_error(PP_ERR_NOT_FOUND, "the model has no loss output to train on");
        goto done;
    }
    outs = calloc((size_t)pp_runner_n_outputs(r) + 1, sizeof *outs);
    if (!outs) goto done;
    if (!a->json)
        printf("training %d stages, %d microbatches of a %lld-sample batch, schedule %s, %s lr %g\n", p->n_stages,
               a->microbatches, a->batch, a->schedule ? a->schedule : "gpipe", pp_optim_kind_name(a->opt.kind),
               a->opt.lr);
    int ns = pp_runner_n_stages(r);
    if (ns > 1024) goto done;
    pp_stage *stages[1024];
    pp_optim *optims[1024];
    for (int i = 0; i < ns; i++) {
        stages[i] = pp_runner_stage(r, i);
        optims[i] = pp_runner_optimizer(r, i);
    }
    if (train_set_recompute(a, p->n_stages, stages, ns) != PP_OK) goto done;
    if ((a->recompute || a->n_recompute_stages) && !a->json && print_recompute(p, stages, ns) != PP_OK) goto done;
    long long first = 0;
    pp_ckpt_sync ck;
    train_ckpt_init(a, NULL, sched, 0, p->n_stages, ns, stages, optims, &ck);
    if (train_resume(&ck, a, &first) != PP_OK) goto done;
    if (first && !a->json) printf("resumed from %s after step %lld\n", a->checkpoint, first - 1);
    double total = 0;
    for (long long step = first; step < a->steps; step++) {
        double t0 = pp_cli_now_ms();
        for (int i = 0; i < n; i++) {
            pp_tensor_free(batch[i]);
            batch[i] = NULL;
            if (pp_data_batch(data[i], step, a->batch, &batch[i]) != PP_OK) goto done;
        }
        pp_runner_zero_grad(r);
        if (trace && step == a->steps - 1) pp_runner_trace(r, trace, t0);
        pp_runner_set_step(r, step);
        if (pp_runner_step(r, a->microbatches, sched, n, names, batch, outs) != PP_OK) goto done;
        if (pp_runner_optimizer_step(r) != PP_OK) goto done;
        if (train_checkpoint(&ck, a, step) != PP_OK) goto done;
        double ms = pp_cli_now_ms() - t0;
        total += ms;
        float loss = (float)pp_tensor_get_f64(outs[lo], 0);
        for (int o = 0; o < pp_runner_n_outputs(r); o++) {
            pp_tensor_free(outs[o]);
            outs[o] = NULL;
        }
        train_print_progress(step, a, loss, ms);
        fflush(stdout);
    }
    if (!a->json && a->steps > 0) printf("%lld steps in %.2f s\n", a->steps, total / 1000.0);
    if (trace && train_save_trace(a, trace) != PP_OK) goto done;
    if (a->save && pp_cli_save_runner_params(p, r, a->save, "", 0, NULL) != PP_OK) goto done;
    rc = 0;
done:
    for (int i = 0; batch && i < n; i++) pp_tensor_free(batch[i]);
    for (int o = 0; outs && r && o < pp_runner_n_outputs(r); o++) pp_tensor_free(outs[o]);
    free(outs);
    free(batch);
    free(names);
    pp_schedule_free(sched);
    pp_runner_free(r);
    pp_trace_free(trace);
    pp_pipe_free(p);
    return rc;
}

/* --text: windows of the text feed the model's first two int64 inputs. */
pp_status train_text_inputs(const pp_graph *g, train_args *a) {
    int ids[2], k = 0;
    for (int i = 0; i < g->n_inputs && k < 2; i++)
        if (g->values[g->inputs[i]].dtype == PP_I64) ids[k++] = g->inputs[i];
    if (k < 2) return pp_error(PP_ERR_INVALID, "--text needs a model with two int64 inputs (tokens, targets)");
    const pp_value *v = &g->values[ids[0]];
    int seq = v->ndim == 2 && v->shape[1] > 0 ? (int)v->shape[1] : 64;
    return train_text_data(a, v->name, g->values[ids[1]].name, seq);
}

pp_status train_text_data(train_args *a, const char *tokens, const char *targets, int model_seq) {
    int seq = a->seq ? a->seq : model_seq;
    pp_tensor *x, *y;
    PP_TRY(pp_text_windows(a->text, a->vocab, seq, &x, &y));
    pp_named_tensors *nt = &a->data;
    char **names = realloc(nt->names, sizeof(char *) * 2);
    if (names) nt->names = names;
    pp_tensor **ts = realloc(nt->tensors, sizeof(pp_tensor *) * 2);
    if (ts) nt->tensors = ts;
    if (!names || !ts) {
        pp_tensor_free(x);
        pp_tensor_free(y);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    nt->names[0] = strdup(tokens);
    nt->names[1] = strdup(targets);
    nt->tensors[0] = x;
    nt->tensors[1] = y;
    nt->n = 2;
    if (!a->json && !a->quiet)
        printf("%s: %lld windows of %d characters -> inputs '%s', '%s'\n", a->text, (long long)x->shape[0], seq,
               nt->names[0], nt->names[1]);
    return PP_OK;
}

int cmd_train(int argc, char **argv) {
    train_args a = {0};
    int p = parse(argc, argv, &a);
    if (p != 0) {
        if (p == 1) pp_cli_fail("train");
        else train_usage(p == 3 ? stdout : stderr);
        pp_cli_named_free(&a.data);
        return p == 3 ? 0 : p;
    }
    int rc = 1;
    pp_graph *g = NULL;
    pp_trainer *t = NULL;
    pp_optim *o = NULL;
    pp_tensor **data = NULL;
    a.split.microbatches = a.microbatches;
    a.split.report = a.json ? NULL : stdout;
    if (!a.split.auto_batch) a.split.auto_batch = (int)(a.batch / a.microbatches > 0 ? a.batch / a.microbatches : 1);
    a.split.loss = a.loss;
    if (pp_split_args_load(&a.split, argv[optind], &g) != PP_OK) goto done;
    int n = g->n_inputs;
    data = calloc((size_t)n + 1, sizeof *data);
    if (!data) {
        pp_error(PP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (a.text && train_text_inputs(g, &a) != PP_OK) goto done;
    if (pp_cli_match_inputs(g, &a.data, data) != PP_OK) goto done;
    a.split.loss = a.loss;
    int staged = !a.no_split && (pp_cli_has_markers(g) || pp_split_args_any(&a.split));
    if (pp_cli_schedule_needs_stages(a.schedule, staged, a.no_split,
                                     " (--microbatches alone accumulates gradients without stages)") != PP_OK)
        goto done;
    if ((a.recompute || a.n_recompute_stages) && !staged) {
        pp_error(PP_ERR_INVALID, "--recompute%s: the model has no stages (no pipe-split markers, no "
                 "--split-before/--split-after%s); recomputation works per stage",
                 a.recompute ? "" : "-stages", a.no_split ? ", and --no-split" : "");
        goto done;
    }
    if (staged) {
        rc = a.transport ? train_over_transport(g, data, &a) : train_pipelined(g, data, &a);
        goto done;
    }
    if (a.batch % a.microbatches != 0) {
        pp_error(PP_ERR_INVALID, "--batch-size must be a multiple of --microbatches without a pipeline");
        goto done;
    }
    if (pp_trainer_new(g, a.loss, &t) != PP_OK) goto done;
    pp_flat_params *fp = pp_trainer_params(t);
    if (pp_optim_new(&a.opt, fp->total, &o) != PP_OK) goto done;
    for (long long step = 0; step < a.steps; step++) {
        double t0 = pp_cli_now_ms();
        float loss = 0;
        if (train_step(t, data, n, &a, step, &loss) != PP_OK) goto done;
        if (pp_flat_params_check_grads(fp, "trainer") != PP_OK || pp_optim_step(o, fp->data, fp->grad, fp->total) != PP_OK)
            goto done;
        train_print_progress(step, &a, loss, pp_cli_now_ms() - t0);
        fflush(stdout);
    }
    if (a.save && save_params(t, a.save) != PP_OK) goto done;
    rc = 0;
done:
    if (rc) pp_cli_fail("train");
    pp_optim_free(o);
    pp_trainer_free(t);
    free(data);
    pp_graph_free(g);
    pp_cli_named_free(&a.data);
    pp_split_args_free(&a.split);
    return rc;
}
