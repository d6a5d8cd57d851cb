#include "tt_craft.h"

#include <string.h>

#include "envelope.h"
#include "pippin/tensor.h"

void tt_craft(tt_crafted *c, uint64_t run_id, int64_t step, int32_t microbatch) {
    static const char *const names[4] = {"x", "y", "z", "w"};
    memset(c, 0, sizeof *c);
    pippin__envelope__init(&c->env);
    c->env.version = PP_PROTOCOL_VERSION;
    c->env.sender_nonce = TT_RAW_NONCE;
    c->env.kind = PIPPIN__KIND__KIND_ACTIVATION;
    c->env.run_id = run_id;
    c->env.step = step;
    c->env.microbatch = microbatch;
    c->env.src_stage = 0;
    c->env.dst_stage = 1;
    c->env.src_rank = 0;
    c->env.seq = 1;
    for (int i = 0; i < 4; i++) {
        pippin__tensor_meta__init(&c->meta[i]);
        c->ptrs[i] = &c->meta[i];
        c->meta[i].shape = c->shape[i];
        c->meta[i].name = (char *)names[i];
        c->meta[i].dtype = PP_F32;
        c->meta[i].n_shape = 2;
        c->shape[i][0] = 2;
        c->shape[i][1] = 3;
        c->meta[i].nbytes = 24;
        c->meta[i].nframes = 1;
    }
    c->env.n_tensors = 1;
    c->env.tensors = c->ptrs;
}
