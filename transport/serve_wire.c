/* The serving wire format (serve_wire.h). */
#include "serve_wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve.pb-c.h"
#include "status_internal.h"

const char *pp_serve_code_name(int code) {
    switch (code) {
    case PP_SERVE_OK: return "ok";
    case PP_SERVE_BAD_REQUEST: return "bad request";
    case PP_SERVE_BUSY: return "busy";
    case PP_SERVE_TIMEOUT: return "timeout";
    case PP_SERVE_FAILED: return "failed";
    case PP_SERVE_UNAVAILABLE: return "unavailable";
    case PP_SERVE_SESSION_LOST: return "session lost";
    default: return "unknown";
    }
}

static int name_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f) return 0;
    return n > 0 && n <= PP_SERVE_MAX_NAME;
}

/* A checked tensor from the wire (copies its data). */
static pp_status tensor_in(const Pippin__Serve__Tensor *w, const char *what, size_t *budget, pp_tensor **out) {
    *out = NULL;
    if (!w->name || !name_ok(w->name)) return pp_error(PP_ERR_PARSE, "%s: a tensor name that is empty, too long or not printable", what);
    if (!pp_dtype_is_valid((pp_dtype)w->dtype))
        return pp_error(PP_ERR_PARSE, "%s '%s': unknown dtype %d", what, w->name, w->dtype);
    if (w->n_shape > PP_MAX_DIMS)
        return pp_error(PP_ERR_PARSE, "%s '%s': %zu dims, at most %d", what, w->name, w->n_shape, PP_MAX_DIMS);
    size_t bytes;
    if (pp_shape_bytes((pp_dtype)w->dtype, (int)w->n_shape, w->shape, &bytes) != PP_OK)
        return pp_error(PP_ERR_PARSE, "%s '%s': a shape with a negative or too large dim", what, w->name);
    if (bytes != w->data.len)
        return pp_error(PP_ERR_PARSE, "%s '%s': %zu data bytes, its shape needs %zu", what, w->name, w->data.len, bytes);
    if (bytes > *budget) return pp_error(PP_ERR_PARSE, "%s '%s': the request is larger than the service takes", what, w->name);
    *budget -= bytes;
    PP_TRY(pp_tensor_empty((pp_dtype)w->dtype, (int)w->n_shape, w->shape, out));
    if (bytes) memcpy((*out)->data, w->data.data, bytes);
    return PP_OK;
}

static void tensor_out(Pippin__Serve__Tensor *w, const char *name, const pp_tensor *t) {
    pippin__serve__tensor__init(w);
    w->name = (char *)name;
    w->dtype = t->dtype;
    w->n_shape = (size_t)t->ndim;
    w->shape = (int64_t *)t->shape;
    w->data.len = t->nbytes;
    w->data.data = t->data;
}

static int unique(char *const *names, int n, int i) {
    for (int k = 0; k < i; k++)
        if (strcmp(names[k], names[i]) == 0) return 0;
    return 1;
}

void pp_serve_request_clear(pp_serve_request *r) {
    for (int i = 0; i < r->n_inputs; i++) {
        if (r->names) free(r->names[i]);
        if (r->inputs) pp_tensor_free(r->inputs[i]);
    }
    for (int i = 0; r->outputs && i < r->n_outputs; i++) free(r->outputs[i]);
    free(r->names);
    free(r->inputs);
    free(r->outputs);
    free(r->session);
    free(r->text);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

pp_status pp_serve_request_decode(const void *buf, size_t n, size_t max_bytes, pp_serve_request *out) {
    memset(out, 0, sizeof *out);
    Pippin__Serve__Request *w = pippin__serve__request__unpack(NULL, n, buf);
    if (!w) return pp_error(PP_ERR_PARSE, "not a request (malformed protobuf)");
    pp_status s = PP_OK;
    if ((int)w->kind < PP_SERVE_KIND_INFER || (int)w->kind > PP_SERVE_KIND_END_SESSION)
        s = pp_error(PP_ERR_PARSE, "unknown request kind %d", (int)w->kind);
    else if (w->n_inputs > PP_SERVE_MAX_TENSORS || w->n_outputs > PP_SERVE_MAX_TENSORS)
        s = pp_error(PP_ERR_PARSE, "more than %d inputs or outputs", PP_SERVE_MAX_TENSORS);
    else if (w->session && w->session[0] && !name_ok(w->session))
        s = pp_error(PP_ERR_PARSE, "a session name that is too long (at most %d bytes) or not printable", PP_SERVE_MAX_NAME);
    else if (w->text && strlen(w->text) > max_bytes)
        s = pp_error(PP_ERR_PARSE, "a prompt text larger than the service takes");
    else if (w->n_stop > PP_SERVE_MAX_STOP)
        s = pp_error(PP_ERR_PARSE, "%zu stop tokens, at most %d", w->n_stop, PP_SERVE_MAX_STOP);
    else if (w->kind == PIPPIN__SERVE__KIND__KIND_GENERATE && (w->max_tokens < 1 || w->max_tokens > PP_SERVE_MAX_TOKENS))
        s = pp_error(PP_ERR_PARSE, "max_tokens %u: expected 1 to %d", w->max_tokens, PP_SERVE_MAX_TOKENS);
    else if (!isfinite(w->temperature) || w->temperature < 0)
        s = pp_error(PP_ERR_PARSE, "temperature %g: expected a finite number >= 0", (double)w->temperature);
    else if (w->kind == PIPPIN__SERVE__KIND__KIND_END_SESSION && !(w->session && w->session[0]))
        s = pp_error(PP_ERR_PARSE, "ending a session needs its name");
    out->id = w->id;
    out->kind = (int)w->kind;
    out->timeout_ms = w->timeout_ms;
    out->max_tokens = w->max_tokens;
    /* + 0: -0.0 reads as 0 (an encoder leaves a zero out, so -0.0 would not
     * survive a round trip) */
    out->temperature = w->temperature + 0.0f;
    out->top_k = w->top_k;
    out->seed = w->seed;
    if (s == PP_OK) {
        out->session = strdup(w->session ? w->session : "");
        out->text = strdup(w->text ? w->text : "");
        out->stop = malloc(sizeof *out->stop * (w->n_stop + 1));
        if (!out->session || !out->text || !out->stop) s = pp_error(PP_ERR_NOMEM, "out of memory");
        else {
            if (w->n_stop) memcpy(out->stop, w->stop, sizeof *out->stop * w->n_stop);
            out->n_stop = (int)w->n_stop;
        }
    }
    if (s == PP_OK) {
        out->names = calloc(w->n_inputs + 1, sizeof *out->names);
        out->inputs = calloc(w->n_inputs + 1, sizeof *out->inputs);
        out->outputs = calloc(w->n_outputs + 1, sizeof *out->outputs);
        if (!out->names || !out->inputs || !out->outputs) s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    size_t budget = max_bytes;
    for (size_t i = 0; s == PP_OK && i < w->n_inputs; i++) {
        s = tensor_in(w->inputs[i], "input", &budget, &out->inputs[i]);
        if (s == PP_OK && !(out->names[i] = strdup(w->inputs[i]->name))) s = pp_error(PP_ERR_NOMEM, "out of memory");
        if (s == PP_OK) out->n_inputs++;
        else pp_tensor_free(out->inputs[i]), out->inputs[i] = NULL;
        if (s == PP_OK && !unique(out->names, out->n_inputs, out->n_inputs - 1))
            s = pp_error(PP_ERR_PARSE, "input '%s' given twice", out->names[out->n_inputs - 1]);
    }
    for (size_t i = 0; s == PP_OK && i < w->n_outputs; i++) {
        if (!w->outputs[i] || !name_ok(w->outputs[i])) {
            s = pp_error(PP_ERR_PARSE, "an output name that is empty, too long or not printable");
            break;
        }
        if (!(out->outputs[i] = strdup(w->outputs[i]))) s = pp_error(PP_ERR_NOMEM, "out of memory");
        else out->n_outputs++;
        if (s == PP_OK && !unique(out->outputs, out->n_outputs, out->n_outputs - 1))
            s = pp_error(PP_ERR_PARSE, "output '%s' asked twice", out->outputs[out->n_outputs - 1]);
    }
    pippin__serve__request__free_unpacked(w, NULL);
    if (s != PP_OK) {
        uint64_t id = out->id;
        pp_serve_request_clear(out);
        out->id = id; /* the error can still name the request */
    }
    return s;
}

pp_status pp_serve_request_encode(const pp_serve_request *r, void **buf, size_t *n) {
    *buf = NULL;
    Pippin__Serve__Request w = PIPPIN__SERVE__REQUEST__INIT;
    w.id = r->id;
    w.kind = (Pippin__Serve__Kind)r->kind;
    w.timeout_ms = r->timeout_ms;
    w.session = r->session ? r->session : (char *)"";
    w.text = r->text ? r->text : (char *)"";
    w.max_tokens = r->max_tokens;
    w.temperature = r->temperature;
    w.top_k = r->top_k;
    w.seed = r->seed;
    w.n_stop = (size_t)r->n_stop;
    w.stop = r->stop;
    Pippin__Serve__Tensor *ts = calloc((size_t)r->n_inputs + 1, sizeof *ts);
    Pippin__Serve__Tensor **tp = calloc((size_t)r->n_inputs + 1, sizeof *tp);
    if (!ts || !tp) {
        free(ts);
        free(tp);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < r->n_inputs; i++) {
        tensor_out(&ts[i], r->names[i], r->inputs[i]);
        tp[i] = &ts[i];
    }
    w.n_inputs = (size_t)r->n_inputs;
    w.inputs = tp;
    w.n_outputs = (size_t)r->n_outputs;
    w.outputs = r->outputs;
    *n = pippin__serve__request__get_packed_size(&w);
    *buf = malloc(*n + 1);
    pp_status s = *buf ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory (%zu bytes)", *n);
    if (s == PP_OK) pippin__serve__request__pack(&w, *buf);
    free(ts);
    free(tp);
    return s;
}

pp_status pp_serve_response_encode(const pp_response *r, void **buf, size_t *n) {
    *buf = NULL;
    Pippin__Serve__Response w = PIPPIN__SERVE__RESPONSE__INIT;
    w.id = r->id;
    w.code = (Pippin__Serve__Code)r->code;
    w.error = r->error ? r->error : (char *)"";
    w.stats = r->stats ? r->stats : (char *)"";
    w.n_tokens = (size_t)r->n_tokens;
    w.tokens = r->tokens;
    w.text = r->text ? r->text : (char *)"";
    w.more = r->more;
    Pippin__Serve__Tensor *ts = calloc((size_t)r->n_outputs + 1, sizeof *ts);
    Pippin__Serve__Tensor **tp = calloc((size_t)r->n_outputs + 1, sizeof *tp);
    if (!ts || !tp) {
        free(ts);
        free(tp);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < r->n_outputs; i++) {
        tensor_out(&ts[i], r->names[i], r->outputs[i]);
        tp[i] = &ts[i];
    }
    w.n_outputs = (size_t)r->n_outputs;
    w.outputs = tp;
    *n = pippin__serve__response__get_packed_size(&w);
    *buf = malloc(*n + 1);
    pp_status s = *buf ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory (%zu bytes)", *n);
    if (s == PP_OK) pippin__serve__response__pack(&w, *buf);
    free(ts);
    free(tp);
    return s;
}

void pp_response_free(pp_response *r) {
    if (!r) return;
    for (int i = 0; i < r->n_outputs; i++) {
        if (r->names) free(r->names[i]);
        if (r->outputs) pp_tensor_free(r->outputs[i]);
    }
    free(r->names);
    free(r->outputs);
    free(r->error);
    free(r->stats);
    free(r->tokens);
    free(r->text);
    free(r);
}

pp_status pp_serve_response_decode(const void *buf, size_t n, size_t max_bytes, pp_response **out) {
    *out = NULL;
    Pippin__Serve__Response *w = pippin__serve__response__unpack(NULL, n, buf);
    if (!w) return pp_error(PP_ERR_PARSE, "not a response (malformed protobuf)");
    pp_response *r = calloc(1, sizeof *r);
    pp_status s = r ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK && w->n_outputs > PP_SERVE_MAX_TENSORS)
        s = pp_error(PP_ERR_PARSE, "more than %d outputs", PP_SERVE_MAX_TENSORS);
    if (s == PP_OK && (w->n_tokens > PP_SERVE_MAX_TOKENS || (w->text && strlen(w->text) > max_bytes)))
        s = pp_error(PP_ERR_PARSE, "more than %d tokens, or a text larger than the client takes", PP_SERVE_MAX_TOKENS);
    if (s == PP_OK) {
        r->more = w->more;
        r->tokens = malloc(sizeof *r->tokens * (w->n_tokens + 1));
        r->text = w->text && w->text[0] ? strdup(w->text) : NULL;
        if (!r->tokens || (w->text && w->text[0] && !r->text)) s = pp_error(PP_ERR_NOMEM, "out of memory");
        else {
            if (w->n_tokens) memcpy(r->tokens, w->tokens, sizeof *r->tokens * w->n_tokens);
            r->n_tokens = (int)w->n_tokens;
        }
    }
    if (s == PP_OK) {
        r->id = w->id;
        r->code = (int)w->code;
        r->error = strdup(w->error ? w->error : "");
        r->stats = w->stats && w->stats[0] ? strdup(w->stats) : NULL;
        r->names = calloc(w->n_outputs + 1, sizeof *r->names);
        r->outputs = calloc(w->n_outputs + 1, sizeof *r->outputs);
        if (!r->error || (w->stats && w->stats[0] && !r->stats) || !r->names || !r->outputs)
            s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    size_t budget = max_bytes;
    for (size_t i = 0; s == PP_OK && i < w->n_outputs; i++) {
        pp_tensor *t;
        s = tensor_in(w->outputs[i], "output", &budget, &t);
        if (s != PP_OK) break;
        r->outputs[i] = t;
        r->n_outputs++;
        if (!(r->names[i] = strdup(w->outputs[i]->name))) s = pp_error(PP_ERR_NOMEM, "out of memory");
    }
    pippin__serve__response__free_unpacked(w, NULL);
    if (s != PP_OK) {
        pp_response_free(r);
        return s;
    }
    *out = r;
    return PP_OK;
}
