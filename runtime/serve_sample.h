/* Internal: choosing a generation's next token from the model's logits
 * (serve.h): greedy, or sampling with a temperature among the top k, from a
 * seeded generator so that the same seed gives the same tokens. */
#ifndef PIPPIN_RUNTIME_SERVE_SAMPLE_H
#define PIPPIN_RUNTIME_SERVE_SAMPLE_H

#include <stdint.h>

#include "pippin/status.h"

/* The token for one row of n logits: the first largest when temperature is
 * 0; else drawn from softmax(logits / temperature) restricted to the top_k
 * largest (0: all), advancing *rng. */
pp_status pp_sample_token(const float *logits, int64_t n, float temperature, uint32_t top_k, uint64_t *rng,
                          int64_t *token);

#endif
