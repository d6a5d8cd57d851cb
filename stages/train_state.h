/* Internal: state a stage's forward updates when it trains, and the
 * rewrites that make a graph exported in training mode run as inference.
 *
 * Training: a BatchNormalization with training_mode=1 whose running mean
 * and variance are initializers gets outputs 1 and 2 (PyTorch's export
 * leaves them dangling), and after each microbatch's forward their values
 * replace those initializers: microbatches update the running statistics
 * one after another in microbatch order, as PyTorch's module does when it
 * runs them one after another. The running variance takes the unbiased
 * batch variance (PyTorch's rule; ONNX's reference takes the biased one).
 * Those initializers are state, never trained, even when a model without a
 * trainable list made them parameters.
 * Inference: such a BatchNormalization uses the running statistics
 * (training_mode=0), and a training-mode Dropout passes values through. */
#ifndef PIPPIN_STAGES_TRAIN_STATE_H
#define PIPPIN_STAGES_TRAIN_STATE_H

#include <stdint.h>

#include "pippin/graph.h"

typedef struct pp_train_state {
    int n;
    int *src;          /* per state: the value the forward computes */
    int *dst;          /* per state: the initializer it replaces (its own copy) */
    pp_tensor **snap;  /* per state: its value when the step began */
} pp_train_state;

/* Rewrites g for training (training != 0) or inference, before autodiff. */
pp_status pp_train_state_prepare(pp_graph *g, int training, pp_train_state *ts);
/* Marks the values the update reads as kept by the forward. */
void pp_train_state_keep(const pp_train_state *ts, uint8_t *keep);
/* After a forward over env: copies each computed value into its initializer. */
pp_status pp_train_state_update(const pp_train_state *ts, pp_graph *g, pp_tensor *const *env);
/* The same from computed[i], the value of state i (NULL: not computed). */
pp_status pp_train_state_update_from(const pp_train_state *ts, pp_graph *g, pp_tensor *const *computed);
/* Remembers the state (a step begins); puts the remembered state back (the
 * step failed: a retry must not apply its microbatches twice). */
pp_status pp_train_state_snapshot(pp_train_state *ts, const pp_graph *g);
void pp_train_state_restore(const pp_train_state *ts, pp_graph *g);
void pp_train_state_clear(pp_train_state *ts);

#endif
