/* safetensors: round trip, files built byte by byte as the format's spec
 * describes them (what safetensors.torch writes), and every malformed-file
 * error path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pippin/log.h"

#include "pippin/safetensors.h"
#include "test_util.h"

#include "test_filter.h"

static char tmpdir[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pippin-st-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

/* A file image: 8-byte little-endian header length, the header padded
 * with spaces to a multiple of 8, then the data. */
static size_t make_file(unsigned char *buf, const char *header, const void *data, size_t n) {
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    memcpy(buf + 8, header, len);
    memset(buf + 8 + len, ' ', padded - len);
    if (n) memcpy(buf + 8 + padded, data, n);
    return 8 + padded + n;
}

static void test_round_trip(void **state) {
    (void)state;
    pp_tensor *a, *b, *c;
    assert_int_equal(pp_tensor_new(PP_F32, 2, (int64_t[]){2, 3}, &a), PP_OK);
    assert_int_equal(pp_tensor_new(PP_I64, 1, (int64_t[]){2}, &b), PP_OK);
    assert_int_equal(pp_tensor_new(PP_U8, 0, NULL, &c), PP_OK);
    for (int i = 0; i < 6; i++) ((float *)a->data)[i] = (float)i * 0.5f - 1.0f;
    ((int64_t *)b->data)[0] = -7;
    ((int64_t *)b->data)[1] = 1LL << 40;
    ((uint8_t *)c->data)[0] = 200;
    char path[300];
    snprintf(path, sizeof path, "%s/x.safetensors", tmpdir);
    const char *names[] = {"layer/weight", "steps", "flag"};
    pp_tensor *ts[] = {a, b, c};
    const char *keys[] = {"pippin.step", "note"}, *vals[] = {"12", "a \"quoted\" text"};
    assert_int_equal(pp_safetensors_save(path, 3, names, ts, 2, keys, vals), PP_OK);
    pp_safetensors *st;
    assert_int_equal(pp_safetensors_load(path, &st), PP_OK);
    assert_int_equal(st->n, 3);
    for (int i = 0; i < 3; i++) { /* file order is the order written */
        assert_string_equal(st->names[i], names[i]);
        assert_int_equal(st->tensors[i]->dtype, ts[i]->dtype);
        assert_int_equal(st->tensors[i]->ndim, ts[i]->ndim);
        assert_memory_equal(st->tensors[i]->data, ts[i]->data, ts[i]->nbytes);
    }
    assert_int_equal(st->tensors[0]->shape[1], 3);
    assert_ptr_equal(pp_safetensors_find(st, "steps"), st->tensors[1]);
    assert_null(pp_safetensors_find(st, "nope"));
    assert_string_equal(pp_safetensors_meta(st, "pippin.step"), "12");
    assert_string_equal(pp_safetensors_meta(st, "note"), "a \"quoted\" text");
    assert_null(pp_safetensors_meta(st, "missing"));
    pp_safetensors_free(st);
    /* the data starts 8-aligned and nothing is left beside the file */
    FILE *f = fopen(path, "rb");
    unsigned char head[8];
    assert_int_equal(fread(head, 1, 8, f), 8);
    fclose(f);
    assert_int_equal(head[0] % 8, 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) -eq 1", tmpdir);
    assert_int_equal(system(cmd), 0);
    /* duplicate names are refused, and the old file stays */
    const char *dup[] = {"steps", "steps"};
    pp_tensor *two[] = {b, b};
    assert_int_equal(pp_safetensors_save(path, 2, dup, two, 0, NULL, NULL), PP_ERR_INVALID);
    assert_int_equal(pp_safetensors_load(path, &st), PP_OK);
    assert_int_equal(st->n, 3);
    pp_safetensors_free(st);
    pp_tensor_free(a);
    pp_tensor_free(b);
    pp_tensor_free(c);
}

/* A file laid out by hand as the spec describes (tensors out of offset
 * order in the header; the reader lists them by offset). */
static void test_spec_layout(void **state) {
    (void)state;
    unsigned char buf[512];
    float w[2] = {1.5f, -2.0f};
    unsigned char data[10];
    memcpy(data, w, 8);
    data[8] = 0x80, data[9] = 0x3f; /* bf16 1.0 */
    size_t n = make_file(buf,
                         "{\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[8,10]},"
                         "\"__metadata__\":{\"format\":\"pt\"},"
                         "\"w\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[0,8]}}",
                         data, sizeof data);
    pp_safetensors *st;
    assert_int_equal(pp_safetensors_parse(buf, n, "spec", &st), PP_OK);
    assert_int_equal(st->n, 2);
    assert_string_equal(st->names[0], "w");
    assert_string_equal(st->names[1], "b");
    assert_int_equal(st->tensors[1]->dtype, PP_BF16);
    assert_int_equal(st->tensors[1]->ndim, 0);
    assert_true(((float *)st->tensors[0]->data)[1] == -2.0f);
    assert_string_equal(pp_safetensors_meta(st, "format"), "pt");
    pp_safetensors_free(st);
    /* an empty file (no tensors) is valid */
    n = make_file(buf, "{}", NULL, 0);
    assert_int_equal(pp_safetensors_parse(buf, n, "empty", &st), PP_OK);
    assert_int_equal(st->n, 0);
    pp_safetensors_free(st);
}

static void expect_bad(const char *header, const void *data, size_t n, const char *what) {
    unsigned char buf[1024];
    size_t len = make_file(buf, header, data, n);
    pp_safetensors *st = (pp_safetensors *)1;
    pp_status s = pp_safetensors_parse(buf, len, "bad.safetensors", &st);
    if (s == PP_OK) fail_msg("accepted: %s", header);
    assert_null(st);
    if (!strstr(pp_last_error(), what)) fail_msg("'%s': error '%s' lacks '%s'", header, pp_last_error(), what);
    assert_non_null(strstr(pp_last_error(), "bad.safetensors"));
}

static void test_malformed(void **state) {
    (void)state;
    unsigned char d[16] = {0};
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", d, 16, "bytes for a F32");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d, 16, "the tensors cover 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8, "a hole or an overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8, "a hole or an overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,24]}}", d, 16, "within the 16 data bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", d, 16, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", d, 8, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", d, 8,
               "overflows");
    expect_bad("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],\"data_offsets\":[0,8]}}", d, 8, "not supported");
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", d, 8, "no dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", d, 8, "no shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", d, 8, "dims");
    expect_bad("{\"a\":[1,2]}", d, 0, "not an object");
    expect_bad("[1,2]", d, 0, "does not start with");
    expect_bad("{\"a\":", d, 0, "not JSON");
    expect_bad("{}x", d, 0, "not JSON");
    expect_bad("{\"__metadata__\":{\"k\":3}}", d, 0, "not a string");
    expect_bad("{\"__metadata__\":[]}", d, 0, "not an object");
    /* what json-c alone would take (review findings) */
    expect_bad(" {}", d, 0, "does not start with '{'");
    expect_bad("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", d, 0, "escaped NUL");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,18446744073709551615],\"data_offsets\":[0,0]}}", d, 0,
               "shape[1]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,99999999999999999999999],\"data_offsets\":[0,0]}}", d, 0,
               "shape[1]");
    expect_bad("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", d, 0, "not JSON");
    /* header length beyond the file, and a file too short for the length */
    unsigned char buf[64];
    size_t n = make_file(buf, "{}", NULL, 0);
    buf[0] = 0xf0;
    pp_safetensors *st;
    assert_int_equal(pp_safetensors_parse(buf, n, "long", &st), PP_ERR_PARSE);
    assert_int_equal(pp_safetensors_parse(buf, 5, "short", &st), PP_ERR_PARSE);
    memset(buf, 0xff, 8);
    assert_int_equal(pp_safetensors_parse(buf, n, "huge", &st), PP_ERR_PARSE);
    /* deep nesting stops at the JSON depth limit instead of the stack */
    char deep[700];
    size_t k = 0;
    for (int i = 0; i < 300; i++) deep[k++] = '[';
    deep[k] = '\0';
    unsigned char big[1024];
    size_t m = make_file(big, deep, NULL, 0);
    assert_int_equal(pp_safetensors_parse(big, m, "deep", &st), PP_ERR_PARSE);
    assert_int_equal(pp_safetensors_load("/nonexistent/x.safetensors", &st), PP_ERR_IO);
}

/* Another process cutting the file once its header has been read (the
 * loader logs that at debug level): each tensor is read with pread into
 * its own tensor, so the one past the new end comes back short, an error
 * naming the file and the tensor. */
static void truncate_after_header(pp_log_level level, const char *msg, void *user) {
    (void)level;
    if (!strstr(msg, "header read")) return;
    struct stat st;
    if (stat(user, &st) == 0 && truncate(user, st.st_size - 4) != 0) fail_msg("truncate %s", (const char *)user);
}

static void test_truncated_while_loading(void **state) {
    (void)state;
    pp_tensor *a, *b;
    assert_int_equal(pp_tensor_new(PP_F32, 1, (int64_t[]){4}, &a), PP_OK);
    assert_int_equal(pp_tensor_new(PP_F32, 1, (int64_t[]){4}, &b), PP_OK);
    char path[300];
    snprintf(path, sizeof path, "%s/cut.safetensors", tmpdir);
    const char *names[] = {"a", "b"};
    pp_tensor *ts[] = {a, b};
    assert_int_equal(pp_safetensors_save(path, 2, names, ts, 0, NULL, NULL), PP_OK);
    pp_log_set_level(PP_LOG_DEBUG);
    pp_log_set_handler(truncate_after_header, path);
    pp_safetensors *st = (pp_safetensors *)1;
    pp_status s = pp_safetensors_load(path, &st);
    pp_log_set_handler(NULL, NULL);
    pp_log_set_level(PP_LOG_ERROR);
    assert_int_equal(s, PP_ERR_IO);
    assert_null(st);
    if (!strstr(pp_last_error(), path) || !strstr(pp_last_error(), "tensor 'b': expected 16 bytes at offset") ||
        !strstr(pp_last_error(), "got 12"))
        fail_msg("unexpected error: %s", pp_last_error());
    /* cut before the load: b's offsets pass the end of the data */
    assert_int_equal(pp_safetensors_load(path, &st), PP_ERR_PARSE);
    if (!strstr(pp_last_error(), path) || !strstr(pp_last_error(), "tensor 'b'"))
        fail_msg("unexpected error: %s", pp_last_error());
    pp_tensor_free(a);
    pp_tensor_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_spec_layout),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncated_while_loading),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
