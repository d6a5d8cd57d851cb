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
 * list, a stats request, a response with an output; a generation (text,
 * session, sampling, stop tokens), a cancel, an end of session, a streamed
 * response. */
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
    pp_response resp = {7, PP_SERVE_OK, "", 1, outs, &b, NULL, 0, NULL, NULL, 0};
    if (pp_serve_response_encode(&resp, &buf, &n) == PP_OK) write_seed(dir, "response", buf, n), free(buf);
    int64_t stop[2] = {0, 57};
    pp_serve_request g = {9, PP_SERVE_KIND_GENERATE, 0, NULL, NULL, 0, NULL, 500, "chat-1", "ROMEO:", 32, 0.8f, 5, 1234,
                          2, stop};
    if (pp_serve_request_encode(&g, &buf, &n) == PP_OK) write_seed(dir, "generate", buf, n), free(buf);
    pp_serve_request cancel = {9, PP_SERVE_KIND_CANCEL, 0, NULL, NULL, 0, NULL, 0};
    if (pp_serve_request_encode(&cancel, &buf, &n) == PP_OK) write_seed(dir, "cancel", buf, n), free(buf);
    pp_serve_request end = {10, PP_SERVE_KIND_END_SESSION, 0, NULL, NULL, 0, NULL, 0, "chat-1"};
    if (pp_serve_request_encode(&end, &buf, &n) == PP_OK) write_seed(dir, "end_session", buf, n), free(buf);
    int64_t toks[1] = {42};
    pp_response part = {9, PP_SERVE_OK, "", 0, NULL, NULL, NULL, 1, toks, "x", 1};
    if (pp_serve_response_encode(&part, &buf, &n) == PP_OK) write_seed(dir, "stream", buf, n), free(buf);
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
        check(strcmp(again.session, r.session) == 0 && strcmp(again.text, r.text) == 0);
        check(again.max_tokens == r.max_tokens && again.top_k == r.top_k && again.seed == r.seed &&
              again.n_stop == r.n_stop && memcmp(&again.temperature, &r.temperature, sizeof r.temperature) == 0);
        for (int i = 0; i < r.n_stop; i++) check(again.stop[i] == r.stop[i]);
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
        pp_response *again;
        check(pp_serve_response_decode(buf, n, 1 << 20, &again) == PP_OK);
        check(again->id == resp->id && again->code == resp->code && again->more == resp->more &&
              again->n_tokens == resp->n_tokens && again->n_outputs == resp->n_outputs);
        for (int i = 0; i < resp->n_tokens; i++) check(again->tokens[i] == resp->tokens[i]);
        check(!resp->text == !again->text && (!resp->text || strcmp(resp->text, again->text) == 0));
        check(strcmp(resp->error, again->error) == 0);
        pp_response_free(again);
        free(buf);
        pp_response_free(resp);
    }
    return 0;
}
