/* The pipe: a graph cut into stages at pipe-split markers or at a split
 * spec, with the values that cross between stages (docs/architecture.md).
 *
 * Each stage is a graph of its own: its inputs are the values it receives
 * (from other stages or the data loader), its outputs the values it sends on
 * plus the model outputs it computes. A value used by a later stage than the
 * next goes straight from its producer to every consumer (no hops). Constant
 * sub-graphs used by several stages are copied into each. A parameter used by
 * several stages is replicated (each holds a copy; gradients are summed
 * across them before the optimizer step) or transmitted (the first user
 * sends it as an activation).
 *
 * Thread safety: splitting and loading are reentrant; a pipe is used by one thread at a time. */
#ifndef PIPPIN_PIPE_H
#define PIPPIN_PIPE_H

#include "pippin/export.h"

#include "pippin/graph.h"
#include "pippin/onnx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_split_spec {
    int n_before;
    const char *const *before; /* cut before the first node whose name starts with each */
    int n_after;
    const char *const *after;  /* cut after the last node whose name starts with each */
    int transmit_shared;       /* 0: replicate shared parameters (default); 1: transmit */
    int ignore_markers;        /* 1: do not cut at PipeSplit nodes */
    const char *loss;          /* the loss output; NULL: "loss", else the only float scalar */
    int n_cut_at;
    const int *cut_at;         /* cut before each of these node indices (pp_balance_plan_auto) */
} pp_split_spec;

/* Defaults: cut at the markers only, replicate shared parameters, the
 * automatic loss. */
PP_API void pp_split_spec_init(pp_split_spec *s);

/* A value crossing stages. */
typedef struct pp_pipe_edge {
    char *value;        /* value name (the same in producer and consumer graphs) */
    int producer;       /* stage index; -1 for a model input fed by the data loader */
    int n_consumers;
    int *consumers;     /* stage indices, ascending */
    pp_dtype dtype;     /* PP_DTYPE_UNDEFINED until shapes are probed */
    int ndim;           /* -1 if unknown */
    char *dims[PP_MAX_DIMS]; /* "batch", "4", "batch*seq", ... (NULL: unknown) */
    int64_t bytes_per_sample; /* -1 if unknown */
} pp_pipe_edge;

/* A parameter replicated in several stages. */
typedef struct pp_pipe_shared {
    char *name;
    int n_stages;
    int *stages;
} pp_pipe_shared;

typedef struct pp_pipe {
    int n_stages;
    pp_graph **stages;   /* owned */
    int n_edges;
    pp_pipe_edge *edges;
    int n_shared;
    pp_pipe_shared *shared;
    int n_outputs;       /* model outputs, in the model's order */
    char **outputs;
    int *output_stage;   /* stage computing each model output */
    char *loss;          /* name of the scalar loss output, NULL if none */
    int loss_stage;      /* -1 if none */
    char **cut_names;    /* what made each cut (marker node or prefix), n_stages-1 */
    char **stage_files;  /* a loaded pipe's stage file names (pipe.json), else NULL */
    int n_dims;          /* after pp_pipe_probe_shapes: the symbolic input dims */
    char **dims;         /* and the sizes the probe ran them at, "name=N"; the
                          * batch first (bytes_per_sample divides by it) */
} pp_pipe;

/* Cuts g. g is not modified; stage graphs copy what they need. Errors name
 * the marker or prefix (an empty stage, a prefix that matches nothing). */
PP_API pp_status pp_pipe_split(const pp_graph *g, const pp_split_spec *spec, pp_pipe **out);
/* The same, but the stages take g's parameter tensors instead of copying
 * them (a parameter in several stages is copied for the others), so a
 * model is not held twice: g may afterwards only be freed, as writing a
 * stage's parameters writes g's. */
PP_API pp_status pp_pipe_split_take(pp_graph *g, const pp_split_spec *spec, pp_pipe **out);
PP_API void pp_pipe_free(pp_pipe *p);

/* Edge lookup by value name; -1 if absent. */
PP_API int pp_pipe_find_edge(const pp_pipe *p, const char *value);

/* Fills edge dtypes, symbolic shapes and bytes per sample by running the
 * whole pipe on small made-up inputs. dims_given lists "name=N" settings for
 * symbolic input dims (may be NULL); others default to small values. The
 * sizes used are left in p->dims, so that other byte counts can assume the
 * same ones. */
PP_API pp_status pp_pipe_probe_shapes(pp_pipe *p, int n_dims_given, const char *const *dims_given);

/* The pipe.json text describing p (malloc'd; caller frees; NULL when out of
 * memory). */
PP_API char *pp_pipe_to_json(const pp_pipe *p);
/* Writes DIR/stage_K.onnx for every stage and DIR/pipe.json. */
PP_API pp_status pp_pipe_save(const pp_pipe *p, const char *dir);
/* The same, each stage file written with o (NULL: the defaults): with
 * external data a stage's initializers go to DIR/stage_K.onnx.data. */
PP_API pp_status pp_pipe_save_with(const pp_pipe *p, const char *dir, const pp_onnx_save_options *o);
/* Reads DIR/pipe.json and the stage files. */
PP_API pp_status pp_pipe_load(const char *dir, pp_pipe **out);
/* Reads DIR/pipe.json and only DIR/stage_<index>.onnx (other stages' graphs
 * stay NULL): what a worker for one stage needs (pp_stage_from_pipe). */
PP_API pp_status pp_pipe_load_stage(const char *dir, int index, pp_pipe **out);
/* Reads DIR/pipe.json alone (every p->stages[k] NULL): a worker learns the
 * stage count first, then loads its own stages with pp_pipe_load_graph. */
PP_API pp_status pp_pipe_load_meta(const char *dir, pp_pipe **out);
/* Loads stage k's graph (the file pipe.json names) into p->stages[k]. */
PP_API pp_status pp_pipe_load_graph(pp_pipe *p, const char *dir, int k);

#ifdef __cplusplus
}
#endif
#endif
