/* Schedule benchmark (not a test):
 *  1. scale: generate, validate and simulate 1024 ranks x 4096 microbatches
 *     x 2 stages per rank, with wall times and memory per action;
 *  2. linearity: what `pippin schedule` does (generate, validate, print the
 *     table) for the zero-bubble and V kinds at growing ranks x microbatches,
 *     each in its own process for its peak RSS, CPU ns per action, and for
 *     zbv the same against the former printer (snprintf cells, the whole
 *     table in one string) with the ratio;
 *  3. quality: the auto scheduler's bubble against 1F1B, ZB-H1 and ZB-H2 at
 *     the zero-bubble paper's setting (p=8, m=24, F=18522, I=18086, W=9337,
 *     c=601), next to the paper's published rates and their ratio.
 * Usage: bench_schedule [ranks microbatches] (defaults 1024 4096)
 *        bench_schedule --linear [PxM ...] (defaults 64x256 256x1024 1024x4096) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pippin/sched_sim.h"
#include "pippin/schedule.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

static int die(const char *what) {
    fprintf(stderr, "bench_schedule: %s: %s\n", what, pp_last_error());
    return 1;
}

static int scale(pp_sched_kind kind, int p, int m) {
    pp_sched_params pr = {0};
    pr.kind = kind;
    pr.nranks = p;
    pr.nmb = m;
    pr.stages_per_rank = 2;
    pp_schedule *s;
    pp_cost_model *c;
    pp_sim_result *r;
    double t0 = now(), c0 = cpu();
    if (pp_schedule_generate(&pr, &s) != PP_OK) return die("generate");
    double t1 = now(), c1 = cpu();
    if (pp_schedule_validate(s, NULL) != PP_OK) return die("validate");
    double t2 = now(), c2 = cpu();
    if (pp_cost_model_new(s->nstages, &c) != PP_OK) return die("costs");
    c->latency = 0.1;
    if (pp_simulate(s, c, NULL, &r) != PP_OK) return die("simulate");
    double t3 = now(), c3 = cpu();
    size_t n = pp_schedule_count(s);
    printf("%-16s %dx%dx2: %8zu actions (%zu B each), peak RSS %ld MiB, makespan %g\n"
           "    wall: generate %.3f s, validate %.3f s, simulate %.3f s, total %.3f s %s\n"
           "    cpu:  generate %.3f s, validate %.3f s, simulate %.3f s, total %.3f s %s\n",
           pp_sched_kind_name(kind), p, m, n, sizeof(pp_action), peak_rss_mib(), r->makespan,
           t1 - t0, t2 - t1, t3 - t2, t3 - t0, t3 - t0 < 2.0 ? "(under 2 s)" : "(OVER 2 s)",
           c1 - c0, c2 - c1, c3 - c2, c3 - c0, c3 - c0 < 2.0 ? "(under 2 s)" : "(OVER 2 s)");
    pp_sim_result_free(r);
    pp_cost_model_free(c);
    pp_schedule_free(s);
    return 0;
}

/* Bubble as the paper measures it: (T - m(F+I+W)) / T, T the global
 * makespan for 1F1B and ZB-H1 and the longest per-rank span for ZB-H2 and
 * ZB-2p (its zb.py and iclr_bubble_rates). */
typedef struct setting {
    int p, m;
    double F, I, W, c, h, a; /* h, a: the model's hidden size and heads */
    double zb2p;             /* the paper's published ZB-2p bubble */
} setting;

/* W keeps 32h of the 34h+5as bytes an activation holds (the paper's
 * memory model, s = 1024). */
static double w_frac_of(const setting *st) {
    return 32.0 * st->h / (34.0 * st->h + 5.0 * st->a * 1024);
}

static pp_cost_model *costs_of(const setting *st) {
    pp_cost_model *cm;
    if (pp_cost_model_new(st->p, &cm) != PP_OK) return NULL;
    for (int j = 0; j < st->p; j++) {
        cm->f[j] = st->F;
        cm->i[j] = st->I;
        cm->w[j] = st->W;
    }
    cm->latency = st->c;
    return cm;
}

/* Runs one schedule; returns its bubble (span or makespan based). */
static int run(const setting *st, pp_sched_kind kind, unsigned search, pp_sched_objective obj,
               int use_span, double *bubble, double *T, int *peak, double *secs) {
    pp_cost_model *cm = costs_of(st);
    if (!cm) return die("costs");
    pp_sched_params pr = {0};
    pr.kind = kind;
    pr.nranks = st->p;
    pr.nmb = st->m;
    pr.costs = cm;
    pr.mem_cap = 2 * st->p;
    pr.w_frac = w_frac_of(st);
    pr.objective = obj;
    pr.auto_search = search;
    pp_schedule *s;
    pp_sim_result *r;
    double t0 = now();
    if (pp_schedule_generate(&pr, &s) != PP_OK) return die(pp_sched_kind_name(kind));
    if (secs) *secs = now() - t0;
    if (pp_simulate(s, cm, NULL, &r) != PP_OK) return die(pp_sched_kind_name(kind));
    double expected = st->m * (st->F + st->I + st->W);
    *T = use_span ? pp_sim_result_span(r) : r->makespan;
    *bubble = (*T - expected) / *T;
    if (peak) {
        *peak = 0;
        for (int j = 0; j < st->p; j++)
            if (r->peak_act[j] > *peak) *peak = r->peak_act[j];
    }
    pp_sim_result_free(r);
    pp_schedule_free(s);
    pp_cost_model_free(cm);
    return 0;
}

/* Lower bounds for one stage per rank and uniform costs: rank 0 cannot end
 * before the last rank has run every F and I and the last gradient has
 * climbed back (span); the last rank cannot start before p-1 forwards and
 * then has all its work to do (makespan). */
static double lb_span(const setting *st) {
    double work = st->m * (st->F + st->I + st->W);
    double chain = (st->p - 1) * (st->F + st->I + 2 * st->c) + st->m * (st->F + st->I) + st->W;
    return work > chain ? work : chain;
}

static double lb_makespan(const setting *st) {
    double a = st->m * (st->F + st->I + st->W);
    double b = st->m * (st->F + st->I) + (st->p - 1) * (st->I + st->c) + st->W;
    return (st->p - 1) * (st->F + st->c) + (a > b ? a : b);
}

static int quality(void) {
    const setting paper = {8, 24, 18522, 18086, 9337, 601, 2304, 24, 0.0433};
    static const struct {
        pp_sched_kind kind;
        const char *label;
        double paper;
        int span;
    } rows[] = {{PP_SCHED_1F1B, "1F1B", 0.2431, 0},
                {PP_SCHED_ZB_H1, "ZB-H1", 0.1585, 0},
                {PP_SCHED_ZB_H2, "ZB-H2", 0.1083, 1},
                {PP_SCHED_AUTO, "auto (ZB-2p)", 0.0433, 1}};
    const setting *st = &paper;
    double expected = st->m * (st->F + st->I + st->W);
    printf("\nzero-bubble paper setting: p=%d m=%d F=%g I=%g W=%g c=%g; auto with a cap of 2p=%d "
           "activations, W keeping %.3f of one\n",
           st->p, st->m, st->F, st->I, st->W, st->c, 2 * st->p, w_frac_of(st));
    printf("bubble = (T - m(F+I+W)) / T with T the makespan (1F1B, ZB-H1) or the longest "
           "per-rank span (ZB-H2, ZB-2p), as the paper measures\n");
    printf("%-14s %12s %10s %10s %8s %8s\n", "schedule", "T", "bubble", "paper", "ratio",
           "peak_act");
    double auto_b = 0, h2_b = 0, secs = 0;
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        double b, T;
        int peak;
        if (run(st, rows[k].kind, 0, PP_OBJ_SPAN, rows[k].span, &b, &T, &peak,
                rows[k].kind == PP_SCHED_AUTO ? &secs : NULL))
            return 1;
        printf("%-14s %12.0f %10.4f %10.4f %8.3f %8d\n", rows[k].label, T, b, rows[k].paper,
               b / rows[k].paper, peak);
        if (rows[k].kind == PP_SCHED_AUTO) auto_b = b;
        if (rows[k].kind == PP_SCHED_ZB_H2) h2_b = b;
    }
    double lbs = lb_span(st);
    printf("lower bound on the span: %.0f (bubble %.4f), so no schedule beats %.4f here\n", lbs,
           (lbs - expected) / lbs, (lbs - expected) / lbs);
    printf("auto / paper ZB-2p bubble = %.4f / %.4f = %.3f; auto / ZB-H2 = %.3f; search %.3f s\n",
           auto_b, st->zb2p, auto_b / st->zb2p, h2_b > 0 ? auto_b / h2_b : 0, secs);
    double bm, Tm;
    if (run(st, PP_SCHED_AUTO, 0, PP_OBJ_MAKESPAN, 0, &bm, &Tm, NULL, NULL)) return 1;
    printf("auto minimising the makespan instead: %.0f (bubble %.4f), lower bound %.0f\n", Tm,
           bm, lb_makespan(st));

    /* The paper's other rows: its heuristic (ported) against the full search. */
    static const setting more[] = {
        {8, 32, 18513, 18086, 9331, 626, 2304, 24, 0.0039},
        {8, 64, 18546, 18097, 9321, 762, 2304, 24, 0.0026},
        {8, 24, 29718, 29444, 19927, 527, 4096, 32, 0.0029},
        {8, 32, 29802, 29428, 19530, 577, 4096, 32, 0.0022},
        {16, 48, 11347, 11248, 8132, 377, 5120, 40, 0.0066},
        {16, 64, 11307, 11254, 8101, 379, 5120, 40, 0.0054},
    };
    printf("\nspan bubble at the paper's other settings (cap 2p):\n");
    printf("%4s %4s %12s %12s %12s %12s %8s %8s\n", "p", "m", "paper pub.", "heuristic",
           "auto", "lower bnd", "auto/pub", "auto/heur");
    for (size_t k = 0; k < sizeof more / sizeof more[0]; k++) {
        const setting *q = &more[k];
        double bh, ba, T;
        if (run(q, PP_SCHED_AUTO, PP_AUTO_PAPER, PP_OBJ_SPAN, 1, &bh, &T, NULL, NULL)) return 1;
        if (run(q, PP_SCHED_AUTO, 0, PP_OBJ_SPAN, 1, &ba, &T, NULL, NULL)) return 1;
        double lb = lb_span(q), e = q->m * (q->F + q->I + q->W);
        printf("%4d %4d %12.4f %12.4f %12.4f %12.4f %8.3f %8.3f\n", q->p, q->m, q->zb2p, bh, ba,
               (lb - e) / lb, ba / q->zb2p, bh > 0 ? ba / bh : 0);
    }
    return 0;
}

/* The printer `pippin schedule` had before: every cell through snprintf and
 * the grid built in one string before it is written (kept as the peer). */
static int legacy_cell(const pp_schedule *s, const pp_action *a, char *buf, size_t n) {
    if (a->kind == PP_ACT_IDLE) return n ? (buf[0] = 0) : 0;
    if (a->kind == PP_ACT_OVERLAP_F_B) return pp_action_format(s, a, buf, n);
    if (a->mb >= 0 && a->kind != PP_ACT_UNSHARD && a->kind != PP_ACT_RESHARD &&
        a->kind != PP_ACT_REDUCE_GRAD)
        return snprintf(buf, n, "%d%s%d", a->stage, pp_act_kind_name(a->kind), a->mb);
    return snprintf(buf, n, "%d%s", a->stage, pp_act_kind_name(a->kind));
}

static int legacy_table(const pp_schedule *s, FILE *f) {
    size_t steps = 0, cap = 256, len = 0;
    for (int r = 0; r < s->nranks; r++)
        if (s->len[r] > steps) steps = s->len[r];
    size_t *width = calloc((size_t)s->nranks, sizeof *width);
    char *out = malloc(cap), cell[PP_ACTION_STR_MAX + 16];
    if (!width || !out) return 1;
    for (int r = 0; r < s->nranks; r++) {
        width[r] = (size_t)snprintf(cell, sizeof cell, "Rank %d", r);
        for (size_t k = 0; k < s->len[r]; k++) {
            size_t w = (size_t)legacy_cell(s, &s->acts[r][k], cell, sizeof cell);
            if (w > width[r]) width[r] = w;
        }
    }
    for (size_t k = 0; k < steps; k++) {
        for (int r = 0; r < s->nranks; r++) {
            int w = k < s->len[r] ? legacy_cell(s, &s->acts[r][k], cell, sizeof cell) : 0;
            if (len + width[r] + 32 > cap) {
                while (len + width[r] + 32 > cap) cap *= 2;
                char *q = realloc(out, cap);
                if (!q) return 1;
                out = q;
            }
            len += (size_t)snprintf(out + len, cap - len, "%s%-*.*s", r ? " " : "",
                                    (int)width[r], w, cell);
        }
        while (len && out[len - 1] == ' ') len--;
        out[len++] = '\n';
    }
    int rc = fwrite(out, 1, len, f) != len;
    free(out);
    free(width);
    return rc;
}

typedef struct lin_result {
    double gen, val, print; /* CPU seconds */
    size_t actions;
    int ok;
} lin_result;

/* In a child: generate, validate and print to /dev/null; the parent reads
 * the times from a pipe and the child's own peak RSS from wait4. */
static int linear_one(pp_sched_kind kind, int p, int m, int legacy, lin_result *res,
                      long *rss_kib) {
    int fd[2];
    if (pipe(fd)) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        close(fd[0]);
        lin_result r = {0};
        pp_sched_params pr = {0};
        pr.kind = kind;
        pr.nranks = p;
        pr.nmb = m;
        pp_schedule *s;
        FILE *null = fopen("/dev/null", "w");
        double c0 = cpu();
        if (null && pp_schedule_generate(&pr, &s) == PP_OK) {
            double c1 = cpu();
            if (pp_schedule_validate(s, NULL) == PP_OK) {
                double c2 = cpu();
                r.ok = legacy ? !legacy_table(s, null) : pp_schedule_write_table(s, null) == PP_OK;
                r.ok = r.ok && fflush(null) == 0;
                r.gen = c1 - c0;
                r.val = c2 - c1;
                r.print = cpu() - c2;
                r.actions = pp_schedule_count(s);
            }
        }
        if (write(fd[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], res, sizeof *res);
    close(fd[0]);
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid || got != (ssize_t)sizeof *res || !res->ok) return 1;
    *rss_kib = ru.ru_maxrss;
    return 0;
}

static int linearity(int nsizes, const int *ps, const int *ms) {
    static const pp_sched_kind kinds[] = {PP_SCHED_ZBV,  PP_SCHED_DUALPIPEV,
                                          PP_SCHED_ZB_H1, PP_SCHED_ZB_H2,
                                          PP_SCHED_INTERLEAVED_ZB, PP_SCHED_INTERLEAVED_1F1B};
    printf("\nlinearity: generate + validate + print the table to /dev/null, as `pippin "
           "schedule` does (one process each, one thread; CPU times)\n");
    printf("%-16s %11s %10s %8s %8s %8s %9s %9s %8s\n", "kind", "PxM", "actions", "gen s",
           "valid s", "print s", "ns/action", "peak MiB", "B/action");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int i = 0; i < nsizes; i++) {
            lin_result r;
            long rss;
            char pm[32];
            snprintf(pm, sizeof pm, "%dx%d", ps[i], ms[i]);
            if (linear_one(kinds[k], ps[i], ms[i], 0, &r, &rss)) {
                printf("%-16s %11s failed\n", pp_sched_kind_name(kinds[k]), pm);
                continue;
            }
            double t = r.gen + r.val + r.print;
            printf("%-16s %11s %10zu %8.3f %8.3f %8.3f %9.1f %9.1f %8.1f\n",
                   pp_sched_kind_name(kinds[k]), pm, r.actions, r.gen, r.val, r.print,
                   1e9 * t / (double)r.actions, rss / 1024.0, 1024.0 * rss / (double)r.actions);
        }
    printf("\nzbv printing against the former printer (snprintf cells, whole table in one "
           "string):\n%11s %10s %10s %8s %10s %10s %8s\n", "PxM", "print s", "former s", "ratio",
           "peak MiB", "former", "ratio");
    for (int i = 0; i < nsizes; i++) {
        lin_result a, b;
        long ra, rb;
        if (linear_one(PP_SCHED_ZBV, ps[i], ms[i], 0, &a, &ra) ||
            linear_one(PP_SCHED_ZBV, ps[i], ms[i], 1, &b, &rb))
            return die("linearity");
        printf("%5dx%-5d %10.3f %10.3f %8.2f %10.1f %10.1f %8.2f\n", ps[i], ms[i], a.print,
               b.print, b.print / a.print, ra / 1024.0, rb / 1024.0, (double)rb / (double)ra);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--linear")) {
        int ps[16] = {64, 256, 1024}, ms[16] = {256, 1024, 4096}, n = 3;
        if (argc > 2) n = 0;
        for (int i = 2; i < argc && n < 16; i++)
            if (sscanf(argv[i], "%dx%d", &ps[n], &ms[n]) == 2 && ps[n] > 0 && ms[n] > 0) n++;
        return linearity(n, ps, ms);
    }
    int p = argc > 2 ? atoi(argv[1]) : 1024, m = argc > 2 ? atoi(argv[2]) : 4096;
    if (p < 1 || m < 1) {
        fprintf(stderr, "usage: bench_schedule [ranks microbatches]\n");
        return 2;
    }
    static const pp_sched_kind kinds[] = {PP_SCHED_ZBV, PP_SCHED_DUALPIPEV,
                                          PP_SCHED_INTERLEAVED_1F1B, PP_SCHED_LOOPED_BFS};
    double l0 = 0;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &l0) != 1) l0 = 0;
        fclose(la);
    }
    printf("scale (load average %.2f when started; wall times suffer from other work, cpu "
           "times less):\n", l0);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (scale(kinds[k], p, m)) return 1;
    int lp[] = {64, 256, 1024}, lm[] = {256, 1024, 4096};
    if (linearity(3, lp, lm)) return 1;
    return quality();
}
