/* Internal: sessions' model state on the ranks that own it (serve.h,
 * docs/serving.md). A model with state (a decoder's KV cache) has outputs
 * that feed inputs on the session's next request (present.X ->
 * past_key_values.X); both ends live on one rank, so the state never
 * crosses the network. Each rank keeps its part of every session's state
 * here, bounded in bytes: past the bound the least recently used sessions
 * are dropped, and their next request is told "session lost". */
#ifndef PIPPIN_RUNTIME_SERVE_STATE_H
#define PIPPIN_RUNTIME_SERVE_STATE_H

#include <stdint.h>

#include "pippin/config.h"
#include "pippin/pipe.h"
#include "pippin/schedule.h"

typedef struct pp_state_pair {
    int in;       /* index into the model inputs (the caller's in_edge order) */
    int out;      /* model output index */
    int rank;     /* the rank that computes the output and reads the input */
    int grow_dim; /* the input's dim that grows (0 at a session's start) */
} pp_state_pair;

/* The model's state pairs: the config's serve.state mapping, else every
 * output present<X> with an input past_key_values<X>. Errors name a pair
 * whose two ends are on different ranks, or an input whose dims are not
 * the batch, one growing dim and fixed ones (so it can start empty). */
pp_status pp_state_pairs(const pp_config *c, const pp_pipe *p, const pp_schedule *sched, int n_in, const int *in_edge,
                         pp_state_pair **pairs, int *n);

typedef struct pp_state_store pp_state_store;

pp_status pp_state_store_new(const pp_pipe *p, const int *in_edge, const pp_state_pair *pairs, int n_pairs, int rank,
                             int64_t max_bytes, pp_state_store **out);
void pp_state_store_free(pp_state_store *st);

/* ins[k] for each pair k on this rank (others NULL): session h's state, or
 * empty tensors of rows rows when fresh (a new session, or h 0: a one-off).
 * PP_ERR_NOT_FOUND ("session lost ...") when h is not held here, or was held
 * with another number of rows. The tensors are the caller's to free. */
pp_status pp_state_inputs(pp_state_store *st, int64_t h, int fresh, int64_t rows, pp_tensor **ins);

/* Takes outs[o] of every pair on this rank (setting them NULL) as session
 * h's state; h 0 frees them. Then drops the least recently used other
 * sessions while past the byte bound; if h alone is past it, h too. */
void pp_state_keep(pp_state_store *st, int64_t h, pp_tensor **outs);

void pp_state_drop(pp_state_store *st, int64_t h);
/* The length of session h's growing dim on this rank (the tokens it has
 * seen), or -1 when this rank holds none of its state. */
int64_t pp_state_length(pp_state_store *st, int64_t h);
int pp_state_count(const pp_state_store *st);
int64_t pp_state_bytes(const pp_state_store *st);

#endif
