/* Character-level training data from a text file: the text mapped through
 * a vocabulary (vocab.json: {"chars": [...]} or {"stoi": {...}}), cut into
 * windows of seq+1 characters; inputs are a window's first seq characters,
 * targets the same shifted by one. */
#ifndef PIPPIN_RUNTIME_TEXT_DATA_H
#define PIPPIN_RUNTIME_TEXT_DATA_H

#include "pippin/tensor.h"

/* *inputs and *targets: int64 [windows, seq], windows in a fixed shuffled
 * order. Characters missing from the vocabulary are errors naming the
 * character and its line. */
pp_status pp_text_windows(const char *text_path, const char *vocab_path, int seq, pp_tensor **inputs,
                          pp_tensor **targets);

/* A character vocabulary: ids[byte] = token id, -1 for bytes it lacks. */
pp_status pp_text_vocab(const char *path, int64_t ids[256]);

#endif
