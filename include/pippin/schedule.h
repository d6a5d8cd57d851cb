/* Pipeline schedules: the action IR, its text and CSV forms, generators,
 * lowering (SEND/RECV insertion) and validation.
 *
 * The text form of an action is torch.distributed.pipelining's: `0F1` is
 * stage 0 forward of microbatch 1; `2I0` backward-input, `1W3`
 * backward-weight, `0B2` full backward (I then W); `2SEND_B2`, `1RECV_F1`;
 * `0UNSHARD`, `0RESHARD` and `0REDUCE_GRAD` carry no microbatch; the compound
 * `(4F4;3B0)OVERLAP_F_B` runs its sub-actions as one step.
 *
 * A schedule is one ordered action list per rank. SEND/RECV actions name
 * their own stage: SEND_F(s) leaves stage s after F(s), RECV_F(s) arrives at
 * stage s before F(s); SEND_B(s) leaves stage s after I/B(s), RECV_B(s)
 * arrives at stage s before I/B(s). Sends are asynchronous, receives block.
 *
 * Everything here depends on libc only.
 *
 * Thread safety: reentrant; a schedule is read-only once built and may be shared by threads. */
#ifndef PIPPIN_SCHEDULE_H
#define PIPPIN_SCHEDULE_H

#include "pippin/export.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_act_kind {
    PP_ACT_IDLE = 0, /* an empty CSV cell: a deliberate idle step */
    PP_ACT_F,
    PP_ACT_I,
    PP_ACT_W,
    PP_ACT_B,
    PP_ACT_SEND_F,
    PP_ACT_RECV_F,
    PP_ACT_SEND_B,
    PP_ACT_RECV_B,
    PP_ACT_UNSHARD,
    PP_ACT_RESHARD,
    PP_ACT_REDUCE_GRAD,
    PP_ACT_OVERLAP_F_B,
    PP_ACT_KIND_COUNT
} pp_act_kind;

/* Sub-actions of one compound action, at most. */
#define PP_OVERLAP_MAX 8
/* Longest text form of an action, with its terminating NUL. */
#define PP_ACTION_STR_MAX 256
/* Limits on what a schedule may name (they bound validator memory). */
#define PP_SCHED_MAX_RANKS (1 << 20)
#define PP_SCHED_MAX_STAGES (1 << 22)
#define PP_SCHED_MAX_MB (1 << 24)

/* One action, 12 bytes so a million-action schedule stays small. */
typedef struct pp_action {
    int32_t stage; /* -1 for OVERLAP_F_B */
    int32_t mb;    /* -1 when absent; OVERLAP_F_B: index of its first
                      sub-action in pp_schedule.sub */
    uint8_t kind;  /* pp_act_kind */
    uint8_t nsub;  /* OVERLAP_F_B: number of sub-actions */
    uint16_t reserved;
} pp_action;

static inline pp_action pp_act(pp_act_kind kind, int stage, int mb) {
    pp_action a = {stage, mb, (uint8_t)kind, 0, 0};
    return a;
}

/* "F", "SEND_B", "OVERLAP_F_B", ... ("" for IDLE). */
PP_API const char *pp_act_kind_name(pp_act_kind kind);
/* F, I, W, B or OVERLAP_F_B. */
PP_API int pp_act_is_compute(pp_act_kind kind);

typedef enum pp_placement {
    PP_PLACE_CUSTOM = 0, /* whatever stage_rank says (e.g. loaded from CSV) */
    PP_PLACE_LOOP,       /* stage s on rank s % p */
    PP_PLACE_V           /* rank r holds stages r and 2p-1-r */
} pp_placement;

typedef struct pp_schedule {
    int nranks;
    int nstages;
    int nmb;
    pp_placement placement;
    int *stage_rank;     /* [nstages]: rank holding each stage, -1 unknown */
    pp_action **acts;    /* [nranks]: each rank's ordered list */
    size_t *len;         /* [nranks] */
    pp_action *sub;      /* sub-actions of compound actions */
    size_t nsub;
    char name[32];       /* generator name, for messages */
    /* private */
    size_t *cap_;
    size_t sub_cap_;
} pp_schedule;

/* Empty schedule for nranks ranks. nstages and nmb may be 0 ("not known
 * yet"; pp_schedule_infer fills them in). */
PP_API pp_status pp_schedule_new(int nranks, int nstages, int nmb, pp_schedule **out);
PP_API void pp_schedule_free(pp_schedule *s);
/* Fills stage_rank from a placement (needs nstages % nranks == 0). */
PP_API pp_status pp_schedule_place(pp_schedule *s, pp_placement placement);
PP_API pp_status pp_schedule_reserve(pp_schedule *s, int rank, size_t n);
PP_API pp_status pp_schedule_append(pp_schedule *s, int rank, pp_action a);
/* Appends an OVERLAP_F_B made of n (1..PP_OVERLAP_MAX) plain actions. */
PP_API pp_status pp_schedule_append_overlap(pp_schedule *s, int rank, const pp_action *subs, int n);
/* The sub-actions of a compound action (NULL for a plain one). */
PP_API const pp_action *pp_schedule_subs(const pp_schedule *s, const pp_action *a);
/* Derives nstages, nmb and stage_rank from the actions (for schedules read
 * from files); keeps values already set when they cover every action. */
PP_API pp_status pp_schedule_infer(pp_schedule *s);
/* Number of non-idle actions over all ranks. */
PP_API size_t pp_schedule_count(const pp_schedule *s);
/* 1 if the schedule holds SEND/RECV actions. */
PP_API int pp_schedule_has_comms(const pp_schedule *s);

/* Text form of an action into buf (always NUL-terminated when n > 0);
 * returns the length it needs, like snprintf. s may be NULL for a plain
 * action. */
PP_API int pp_action_format(const pp_schedule *s, const pp_action *a, char *buf, size_t n);
/* Parses one action's text (len bytes, surrounding blanks ignored). A plain
 * action goes to *out with *nsub = 0; a compound one sets out->kind and puts
 * its sub-actions in sub[0..*nsub). An empty text is PP_ACT_IDLE. */
PP_API pp_status pp_action_parse(const char *text, size_t len, pp_action *out,
                          pp_action sub[PP_OVERLAP_MAX], int *nsub);

/* CSV: one row per rank, one cell per step, an empty cell is idle; the
 * format torch's _dump_csv/_load_csv use. Errors name file, line and cell. */
PP_API pp_status pp_schedule_parse_csv(const char *text, size_t len, const char *filename,
                                pp_schedule **out);
PP_API pp_status pp_schedule_load_csv(const char *path, pp_schedule **out);
/* A schedule as users name it (config files, --schedule): a kind that
 * pp_sched_kind_parse knows, generated for n_stages stages (its default
 * stages per rank) and m microbatches, or "csv:FILE". Validated, and its
 * stage count checked against n_stages. spec NULL: *out NULL, PP_OK. */
PP_API pp_status pp_schedule_from_spec(const char *spec, int n_stages, int m, pp_schedule **out);
PP_API pp_status pp_schedule_write_csv(const pp_schedule *s, FILE *f);
PP_API pp_status pp_schedule_save_csv(const pp_schedule *s, const char *path);

/* torch's grid: one row per step, one column per rank; with err_step >= 0
 * that row ends in "<-- ERROR HERE". *out is malloc'd; caller frees. */
PP_API pp_status pp_schedule_format_table(const pp_schedule *s, long err_step, char **out);
/* The same grid written to f a row at a time (memory: one row). */
PP_API pp_status pp_schedule_write_table(const pp_schedule *s, FILE *f);

/* ---- generators ---- */

typedef enum pp_sched_kind {
    PP_SCHED_GPIPE,
    PP_SCHED_1F1B,
    PP_SCHED_INTERLEAVED_1F1B,
    PP_SCHED_LOOPED_BFS,
    PP_SCHED_INTERLEAVED_ZB,
    PP_SCHED_ZBV,
    PP_SCHED_DUALPIPEV,
    PP_SCHED_ZB_H1,
    PP_SCHED_ZB_H2,
    PP_SCHED_AUTO,
    PP_SCHED_KIND_COUNT
} pp_sched_kind;

/* "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb",
 * "zbv", "dualpipev", "zb-h1", "zb-h2", "auto". */
PP_API const char *pp_sched_kind_name(pp_sched_kind k);
/* Also accepts torch's class names (GPipe, Interleaved1F1B, ZBVZeroBubble,
 * ...), case-insensitively. */
PP_API pp_status pp_sched_kind_parse(const char *name, pp_sched_kind *out);
/* Stages per rank a kind uses when none is asked for (1 or 2). */
PP_API int pp_sched_default_stages_per_rank(pp_sched_kind k);

struct pp_cost_model;

typedef enum pp_sched_objective {
    PP_OBJ_MAKESPAN = 0, /* end of the last action, from time 0 */
    PP_OBJ_SPAN          /* longest per-rank span, first start to last end
                            (the zero-bubble paper's measure) */
} pp_sched_objective;

typedef struct pp_sched_params {
    pp_sched_kind kind;
    int nranks;
    int nmb;
    int stages_per_rank; /* 0: the kind's default */
    /* auto only */
    const struct pp_cost_model *costs; /* NULL: F = I = W = 1, no comm */
    double mem_cap;  /* activations in flight per rank; 0: 2 * nranks */
    double w_frac;   /* share of an activation held from I until W (0..1) */
    pp_sched_objective objective;
    unsigned auto_search; /* PP_AUTO_* bits; 0: all of them */
} pp_sched_params;

/* kind over nranks ranks and nmb microbatches, everything else default (the
 * kind's stages per rank; for auto: unit costs, the default memory cap,
 * every search). */
PP_API void pp_sched_params_init(pp_sched_params *p, pp_sched_kind kind, int nranks, int nmb);

/* What the auto scheduler tries (pp_sched_params.auto_search). */
enum {
    PP_AUTO_PAPER = 1, /* the zero-bubble paper's greedy heuristic, 8 variants */
    PP_AUTO_LIST = 2,  /* an event-driven list scheduler, 8 variants */
    PP_AUTO_HAND = 4,  /* ZB-H1 and ZB-H2 */
    PP_AUTO_CLIMB = 8, /* hill climbing from the best of the above */
    PP_AUTO_ALL = 15
};

/* Compute-only schedule (F/I/W/B and OVERLAP_F_B, no idle steps). */
PP_API pp_status pp_schedule_generate(const pp_sched_params *params, pp_schedule **out);

/* ---- lowering and validation ---- */

enum {
    PP_LOWER_COMMS = 1,       /* add SEND/RECV between stages on different ranks */
    PP_LOWER_MERGE_BW = 2,    /* adjacent I(s,m), W(s,m) -> B(s,m) */
    PP_LOWER_REDUCE_GRAD = 4  /* REDUCE_GRAD(s) after the last backward of s */
};

/* New schedule from a compute-only one. Each RECV is placed right before
 * the action that needs it and each SEND right after the action that
 * produces it, so with asynchronous sends and blocking receives the result
 * deadlocks exactly when the compute-only schedule does (never, once it
 * validates). Idle steps are dropped. */
PP_API pp_status pp_schedule_lower(const pp_schedule *in, unsigned flags, pp_schedule **out);

/* Checks: every (stage, microbatch) has one F and either one B or one I and
 * one W; F before I/B before W; each stage on one rank; SEND/RECV (if any)
 * matched and placed on the right ranks; dependencies across stages can be
 * met without deadlock. The error names rank, step and action; with
 * table != NULL a torch-style table marking the step is stored there
 * (malloc'd, caller frees; NULL when the error has no step). */
PP_API pp_status pp_schedule_validate(const pp_schedule *s, char **table);

#ifdef __cplusplus
}
#endif
#endif
