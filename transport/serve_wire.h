/* Internal: the serving wire format (transport/serve.proto): requests and
 * responses as one protobuf frame each, checked field by field before any
 * tensor is built. */
#ifndef PIPPIN_SERVE_WIRE_H
#define PIPPIN_SERVE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/client.h"
#include "pippin/status.h"
#include "pippin/tensor.h"

#define PP_SERVE_MAX_TENSORS 64
#define PP_SERVE_MAX_NAME 255

#define PP_SERVE_MAX_STOP 64
#define PP_SERVE_MAX_TOKENS (1 << 20) /* max_tokens of a generation */

enum {
    PP_SERVE_KIND_INFER = 0,
    PP_SERVE_KIND_STATS = 1,
    PP_SERVE_KIND_GENERATE = 2,
    PP_SERVE_KIND_CANCEL = 3,
    PP_SERVE_KIND_END_SESSION = 4
};

typedef struct pp_serve_request {
    uint64_t id;
    int kind;
    int n_inputs;
    char **names;
    pp_tensor **inputs;
    int n_outputs;
    char **outputs;
    uint32_t timeout_ms;
    char *session; /* "" : none */
    /* generation */
    char *text;    /* "" : the prompt is inputs[0] */
    uint32_t max_tokens;
    float temperature;
    uint32_t top_k;
    uint64_t seed;
    int n_stop;
    int64_t *stop;
} pp_serve_request;

/* Decodes and checks a request: at most PP_SERVE_MAX_TENSORS inputs and
 * outputs, names printable, unique and at most PP_SERVE_MAX_NAME bytes,
 * known dtypes, at most PP_MAX_DIMS dims, data exactly the shape's bytes,
 * all data at most max_bytes; a session name printable and at most
 * PP_SERVE_MAX_NAME bytes; a generation's max_tokens 1..PP_SERVE_MAX_TOKENS,
 * a finite temperature >= 0, at most PP_SERVE_MAX_STOP stop tokens. Errors (PP_ERR_PARSE) say what is wrong; *out
 * is then empty. */
pp_status pp_serve_request_decode(const void *buf, size_t n, size_t max_bytes, pp_serve_request *out);
void pp_serve_request_clear(pp_serve_request *r);
/* Packs into a malloc'd buffer. */
pp_status pp_serve_request_encode(const pp_serve_request *r, void **buf, size_t *n);

pp_status pp_serve_response_encode(const pp_response *r, void **buf, size_t *n);
/* The same checks as requests; *out is a new response. */
pp_status pp_serve_response_decode(const void *buf, size_t n, size_t max_bytes, pp_response **out);

#endif
