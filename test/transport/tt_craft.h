/* Hand-built protobuf envelopes for the decoding and bad-message tests. */
#ifndef PIPPIN_TEST_TRANSPORT_CRAFT_H
#define PIPPIN_TEST_TRANSPORT_CRAFT_H

#include <stdint.h>

#include "pippin.pb-c.h"

/* A valid envelope from rank 0, stage 0 to stage 1 with one f32 [2,3]
 * tensor "x" in one frame. meta[1..3] ("y", "z", "w") are filled the same
 * way, ready for tests that raise n_tensors. */
typedef struct tt_crafted {
    Pippin__Envelope env;
    Pippin__TensorMeta meta[4];
    Pippin__TensorMeta *ptrs[4];
    int64_t shape[4][12];
} tt_crafted;

/* The nonce of the raw rank 0 of test_badmsg.c's hello: its crafted
 * messages carry it. */
#define TT_RAW_NONCE 0x5eed5eed5eedULL

void tt_craft(tt_crafted *c, uint64_t run_id, int64_t step, int32_t microbatch);

#endif
