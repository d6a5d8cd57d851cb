/* .npy reading and writing, including every malformed-file error path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "test_filter.h"
static char tmpdir[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pippin-npy-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

/* Builds a v1 .npy image with the given header dict and payload. */
static size_t make_npy(unsigned char *buf, int major, const char *dict, const void *data, size_t n) {
    size_t pre = major == 1 ? 10 : 12;
    size_t dlen = strlen(dict);
    size_t hlen = (pre + dlen + 1 + 63) / 64 * 64 - pre;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    buf[8] = hlen & 0xff;
    buf[9] = (hlen >> 8) & 0xff;
    if (major > 1) buf[10] = buf[11] = 0;
    memcpy(buf + pre, dict, dlen);
    memset(buf + pre + dlen, ' ', hlen - dlen - 1);
    buf[pre + hlen - 1] = '\n';
    memcpy(buf + pre + hlen, data, n);
    return pre + hlen + n;
}

static void test_round_trip_all_dtypes(void **state) {
    (void)state;
    pp_dtype dts[] = {PP_F32, PP_F64, PP_F16, PP_I64, PP_I32, PP_I8, PP_U8, PP_BOOL};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        int64_t shape[] = {2, 3, 1};
        pp_tensor *t, *back;
        TU_OK(pp_tensor_new(dts[k], 3, shape, &t));
        for (int i = 0; i < 6; i++) pp_tensor_set_f64(t, i, i % 2);
        char path[400];
        snprintf(path, sizeof path, "%s/t%zu.npy", tmpdir, k);
        TU_OK(pp_npy_save(path, t));
        TU_OK(pp_npy_load(path, &back));
        tu_assert_close(back, t, 0, 0, pp_dtype_name(dts[k]));
        pp_tensor_free(t);
        pp_tensor_free(back);
    }
}

static void test_scalar_and_1d(void **state) {
    (void)state;
    pp_tensor *s, *back;
    TU_OK(pp_tensor_scalar_f32(3.5f, &s));
    char path[400];
    snprintf(path, sizeof path, "%s/s.npy", tmpdir);
    TU_OK(pp_npy_save(path, s));
    TU_OK(pp_npy_load(path, &back));
    assert_int_equal(back->ndim, 0);
    assert_true(*(float *)back->data == 3.5f);
    pp_tensor_free(s);
    pp_tensor_free(back);
}

static void test_versions_2_and_3(void **state) {
    (void)state;
    unsigned char buf[512];
    float data[2] = {1, 2};
    for (int major = 2; major <= 3; major++) {
        size_t n = make_npy(buf, major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data, 8);
        pp_tensor *t;
        TU_OK(pp_npy_parse(buf, n, "v2", &t));
        assert_int_equal(pp_tensor_numel(t), 2);
        assert_true(((float *)t->data)[1] == 2.0f);
        pp_tensor_free(t);
    }
}

static void expect_error(const char *dict, size_t data_len, pp_status code, const char *needle) {
    unsigned char buf[512];
    unsigned char data[64] = {0};
    size_t n = make_npy(buf, 1, dict, data, data_len);
    pp_tensor *t = NULL;
    pp_status s = pp_npy_parse(buf, n, "bad.npy", &t);
    assert_null(t);
    if (s != code) fail_msg("%s: expected %d got %d (%s)", dict, code, s, pp_last_error());
    if (!strstr(pp_last_error(), needle)) fail_msg("'%s' lacks '%s'", pp_last_error(), needle);
    assert_non_null(strstr(pp_last_error(), "bad.npy"));
}

static void test_errors(void **state) {
    (void)state;
    expect_error("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, PP_ERR_UNSUPPORTED, "Fortran");
    expect_error("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, PP_ERR_UNSUPPORTED, "big-endian");
    expect_error("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16, PP_ERR_UNSUPPORTED, "object");
    expect_error("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, PP_ERR_UNSUPPORTED, "dtype");
    expect_error("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 8, PP_ERR_PARSE, "truncated");
    expect_error("{'descr': '<f4', 'shape': (4,), }", 16, PP_ERR_PARSE, "lacks");
    expect_error("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", 16, PP_ERR_PARSE, "shape");
    expect_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
                 PP_ERR_UNSUPPORTED, "dims");
    expect_error("[1, 2]", 0, PP_ERR_PARSE, "dict");
}

static void test_bad_magic_and_truncation(void **state) {
    (void)state;
    pp_tensor *t = NULL;
    assert_int_equal(pp_npy_parse("hello world", 11, "x.npy", &t), PP_ERR_PARSE);
    assert_non_null(strstr(pp_last_error(), "magic"));
    unsigned char buf[512];
    float data[2] = {1, 2};
    size_t n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data, 8);
    for (size_t cut = 0; cut < n; cut++) assert_int_not_equal(pp_npy_parse(buf, cut, "cut.npy", &t), PP_OK);
    assert_int_equal(pp_npy_load("/nonexistent/x.npy", &t), PP_ERR_IO);
    assert_int_equal(pp_npy_load("/tmp", &t), PP_ERR_IO); /* a directory */
}

/* Regression (fuzz_npy): a header ending in blanks inside the shape tuple
 * made the parser read past the header. */
static void test_unterminated_shape(void **state) {
    (void)state;
    unsigned char buf[256];
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,      \t \t\t";
    size_t dlen = strlen(dict);
    buf[8] = (unsigned char)dlen;
    buf[9] = 0;
    memcpy(buf + 10, dict, dlen);
    memset(buf + 10 + dlen, '7', 40); /* data bytes that look like digits */
    pp_tensor *t = NULL;
    assert_int_equal(pp_npy_parse(buf, 10 + dlen + 40, "blank.npy", &t), PP_ERR_PARSE);
    assert_null(t);
}

static int exists(const char *dir, const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void touch(const char *dir, const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
}

static void age(const char *dir, const char *name, int seconds) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct timeval tv[2];
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= seconds;
    tv[1] = tv[0];
    assert_int_equal(utimes(p, tv), 0);
}

/* A writer killed between open and commit leaves PATH.tmp.* (CI's
 * worker_kill once counted one as a differing parameter file). The next
 * commit of PATH removes those nobody holds locked that are over a minute
 * old, and keeps a locked one (a live writer, here a child process:
 * flock works across processes and pid namespaces), a fresh one (a writer
 * between creating and locking its file) and another file's. */
static void test_commit_sweeps_dead_writers_temporaries(void **state) {
    (void)state;
    const char *stale = "w.npy.tmp.00000000deadbeef", *old_format = "w.npy.tmp.12345.0",
               *live = "w.npy.tmp.00000000000a11fe", *fresh = "w.npy.tmp.0000000000f4e540",
               *other_file = "v.npy.tmp.00000000deadbeef";
    const char *names[5] = {stale, old_format, live, fresh, other_file};
    for (int i = 0; i < 5; i++) {
        touch(tmpdir, names[i]);
        if (names[i] != fresh) age(tmpdir, names[i], 600);
    }
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t writer = fork();
    if (writer == 0) { /* holds the live one locked until told */
        char p[700];
        snprintf(p, sizeof p, "%s/%s", tmpdir, live);
        int fd = open(p, O_RDWR);
        char c = fd >= 0 && flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1) _exit(1);
        if (read(done[0], &c, 1) < 0) _exit(1);
        _exit(0);
    }
    assert_true(writer > 0);
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    pp_tensor *t;
    TU_OK(pp_tensor_new(PP_F32, 1, (int64_t[]){3}, &t));
    char path[400];
    snprintf(path, sizeof path, "%s/w.npy", tmpdir);
    TU_OK(pp_npy_save(path, t));
    pp_tensor_free(t);
    assert_int_equal(write(done[1], "x", 1), 1);
    assert_int_equal(waitpid(writer, NULL, 0), writer);
    for (int i = 0; i < 2; i++) close(ready[i]), close(done[i]);
    assert_false(exists(tmpdir, stale));
    assert_false(exists(tmpdir, old_format));
    assert_true(exists(tmpdir, live));
    assert_true(exists(tmpdir, fresh));
    assert_true(exists(tmpdir, other_file));
    assert_true(exists(tmpdir, "w.npy"));
    /* the save's own temporary is gone too (renamed): live and fresh are all */
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    int left = 0;
    for (struct dirent *e; (e = readdir(d));) left += strncmp(e->d_name, "w.npy.tmp.", 10) == 0;
    closedir(d);
    assert_int_equal(left, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_all_dtypes),
        cmocka_unit_test(test_scalar_and_1d),
        cmocka_unit_test(test_versions_2_and_3),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_bad_magic_and_truncation),
        cmocka_unit_test(test_unterminated_shape),
        cmocka_unit_test(test_commit_sweeps_dead_writers_temporaries),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
