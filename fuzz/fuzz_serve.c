/* libFuzzer target: the serving front end's request decoder and the
 * client's response decoder (transport/serve_wire.c), as they run on every
 * frame a client or a service sends. A request that decodes must encode
 * and decode again to the same request. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/log.h"
#include "serve_wire.h"

static void check(int cond) {
    if (!cond) __builtin_trap();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

static void write_seed(const char *dir, const char *name, const void *buf, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(buf, 1, n, f);
    fclose(f);
}

/* Seeds in $PIPPIN_FUZZ_SEEDS: a request with two inputs and an output
 * list, a stats request, a response with an output. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("PIPPIN_FUZZ_SEEDS");
    if (!dir || !dir[0]) return 0;
    pp_tensor *a, *b;
    if (pp_tensor_new(PP_I64, 2, (int64_t[]){2, 3}, &a) != PP_OK) return 0;
    if (pp_tensor_new(PP_F32, 1, (int64_t[]){4}, &b) != PP_OK) return 0;
    pp_tensor *ins[2] = {a, b};
    char *names[2] = {"idx", "mask"}, *outs[1] = {"logits"};
    pp_serve_request r = {7, PP_SERVE_KIND_INFER, 2, names, ins, 1, outs, 100};
    void *buf;
    size_t n;
    if (pp_serve_request_encode(&r, &buf, &n) == PP_OK) write_seed(dir, "request", buf, n), free(buf);
    pp_serve_request st = {8, PP_SERVE_KIND_STATS, 0, NULL, NULL, 0, NULL, 0};
    if (pp_serve_request_encode(&st, &buf, &n) == PP_OK) write_seed(dir, "stats", buf, n), free(buf);
    pp_response resp = {7, PP_SERVE_OK, "", 1, outs, &b, NULL};
    if (pp_serve_response_encode(&resp, &buf, &n) == PP_OK) write_seed(dir, "response", buf, n), free(buf);
    pp_tensor_free(a);
    pp_tensor_free(b);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_log_set_level(PP_LOG_OFF);
    pp_serve_request r;
    if (pp_serve_request_decode(data, size, 1 << 20, &r) == PP_OK) {
        void *buf;
        size_t n;
        check(pp_serve_request_encode(&r, &buf, &n) == PP_OK);
        pp_serve_request again;
        check(pp_serve_request_decode(buf, n, 1 << 20, &again) == PP_OK);
        check(again.id == r.id && again.kind == r.kind && again.n_inputs == r.n_inputs &&
              again.n_outputs == r.n_outputs && again.timeout_ms == r.timeout_ms);
        for (int i = 0; i < r.n_inputs; i++) {
            check(strcmp(again.names[i], r.names[i]) == 0);
            check(again.inputs[i]->dtype == r.inputs[i]->dtype && again.inputs[i]->nbytes == r.inputs[i]->nbytes);
            check(r.inputs[i]->nbytes == 0 || memcmp(again.inputs[i]->data, r.inputs[i]->data, r.inputs[i]->nbytes) == 0);
        }
        pp_serve_request_clear(&again);
        free(buf);
        pp_serve_request_clear(&r);
    }
    pp_response *resp;
    if (pp_serve_response_decode(data, size, 1 << 20, &resp) == PP_OK) {
        void *buf;
        size_t n;
        check(pp_serve_response_encode(resp, &buf, &n) == PP_OK);
        free(buf);
        pp_response_free(resp);
    }
    return 0;
}
