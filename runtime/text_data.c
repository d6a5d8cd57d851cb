/* Character-level windows of a text file (pippin train --text). */
#include "text_data.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"
pp_status pp_text_vocab(const char *path, int64_t ids[256]) {
    for (int i = 0; i < 256; i++) ids[i] = -1;
    json_object *root = json_object_from_file(path), *v;
    if (!root) return pp_error(PP_ERR_PARSE, "%s: cannot read JSON (%s)", path, json_util_get_last_err());
    pp_status s = PP_OK;
    if (json_object_object_get_ex(root, "chars", &v) && json_object_is_type(v, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(v) && s == PP_OK; i++) {
            const char *c = json_object_get_string(json_object_array_get_idx(v, i));
            if (!c || strlen(c) != 1)
                s = pp_error(PP_ERR_UNSUPPORTED, "%s: chars[%zu] is not a single byte", path, i);
            else ids[(unsigned char)c[0]] = (int64_t)i;
        }
    } else if (json_object_object_get_ex(root, "stoi", &v) && json_object_is_type(v, json_type_object)) {
        json_object_object_foreach(v, key, val) {
            if (strlen(key) != 1 || !json_object_is_type(val, json_type_int)) {
                s = pp_error(PP_ERR_UNSUPPORTED, "%s: stoi entry '%s' is not byte -> int", path, key);
                break;
            }
            ids[(unsigned char)key[0]] = json_object_get_int64(val);
        }
    } else {
        s = pp_error(PP_ERR_PARSE, "%s: needs \"chars\" (a list) or \"stoi\" (an object)", path);
    }
    json_object_put(root);
    return s;
}

pp_status pp_text_windows(const char *text_path, const char *vocab_path, int seq, pp_tensor **inputs,
                          pp_tensor **targets) {
    *inputs = *targets = NULL;
    if (seq < 1) return pp_error(PP_ERR_INVALID, "sequence length %d", seq);
    int64_t ids[256];
    PP_TRY(pp_text_vocab(vocab_path, ids));
    FILE *f = fopen(text_path, "rb");
    if (!f) return pp_error(PP_ERR_IO, "%s: %s", text_path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    unsigned char *text = malloc(cap);
    int c;
    while (text && (c = fgetc(f)) != EOF) {
        if (len == cap) {
            unsigned char *t = realloc(text, cap *= 2);
            if (!t) {
                free(text);
                text = NULL;
                break;
            }
            text = t;
        }
        text[len++] = (unsigned char)c;
    }
    fclose(f);
    if (!text) return pp_error(PP_ERR_NOMEM, "%s: out of memory", text_path);
    pp_status s = PP_OK;
    for (size_t i = 0, line = 1; i < len && s == PP_OK; line += text[i] == '\n', i++)
        if (ids[text[i]] < 0)
            s = pp_error(PP_ERR_INVALID, "%s:%zu: character '%c' (byte %d) is not in %s", text_path, line,
                         text[i] >= 32 && text[i] < 127 ? text[i] : '?', text[i], vocab_path);
    int64_t n = len > (size_t)seq ? (int64_t)((len - 1) / (size_t)seq) : 0;
    if (s == PP_OK && n == 0)
        s = pp_error(PP_ERR_INVALID, "%s: %zu characters: too short for one window of %d", text_path, len, seq + 1);
    if (s == PP_OK) s = pp_tensor_empty(PP_I64, 2, (int64_t[]){n, seq}, inputs);
    if (s == PP_OK) s = pp_tensor_empty(PP_I64, 2, (int64_t[]){n, seq}, targets);
    if (s == PP_OK) {
        /* Window w starts at w*seq; rows come in a fixed shuffled order. */
        int64_t *order = malloc(sizeof *order * (size_t)n);
        if (!order) s = pp_error(PP_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; order && i < n; i++) order[i] = i;
        uint64_t state = 0x9E3779B97F4A7C15ull;
        for (int64_t i = n - 1; order && i > 0; i--) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            int64_t j = (int64_t)((state >> 33) % (uint64_t)(i + 1));
            int64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        int64_t *x = (*inputs)->data, *y = (*targets)->data;
        for (int64_t r = 0; order && r < n; r++)
            for (int k = 0; k < seq; k++) {
                size_t at = (size_t)(order[r] * seq + k);
                x[r * seq + k] = ids[text[at]];
                y[r * seq + k] = ids[text[at + 1]];
            }
        free(order);
    }
    free(text);
    if (s != PP_OK) {
        pp_tensor_free(*inputs);
        pp_tensor_free(*targets);
        *inputs = *targets = NULL;
    }
    return s;
}
