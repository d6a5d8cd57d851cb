/* `pippin keygen`: files, permissions, refusal to overwrite, usage errors.
 * argv[1] is the pippin executable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tt_util.h"

#include "test_filter.h"
static const char *exe;

static int run(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' keygen %s >/dev/null 2>&1", exe, args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_keygen_writes_pair(void **state) {
    (void)state;
    const char *dir = tt_tmpdir();
    char args[512], key[512], pubf[512];
    snprintf(args, sizeof args, "-o '%s/rank0'", dir);
    snprintf(key, sizeof key, "%s/rank0.key", dir);
    snprintf(pubf, sizeof pubf, "%s/rank0.pub", dir);
    assert_int_equal(run(args), 0);
    struct stat st;
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    char secret[PP_CURVE_KEY_CHARS + 1], pub[PP_CURVE_KEY_CHARS + 1], derived[PP_CURVE_KEY_CHARS + 1];
    TT_OK(pp_curve_read_key(key, secret));
    TT_OK(pp_curve_read_key(pubf, pub));
    TT_OK(pp_curve_public_key(secret, derived));
    assert_string_equal(pub, derived);
    /* existing files are kept unless --force */
    assert_int_equal(run(args), 1);
    char again[PP_CURVE_KEY_CHARS + 1];
    TT_OK(pp_curve_read_key(pubf, again));
    assert_string_equal(again, pub);
    snprintf(args, sizeof args, "--force -o '%s/rank0'", dir);
    assert_int_equal(run(args), 0);
    TT_OK(pp_curve_read_key(pubf, again));
    assert_string_not_equal(again, pub);
    tt_rmdir_all(dir);
}

static void test_keygen_usage(void **state) {
    (void)state;
    assert_int_equal(run(""), 2);
    assert_int_equal(run("-o"), 2);
    assert_int_equal(run("--bogus"), 2);
    assert_int_equal(run("--help"), 0);
    assert_int_equal(run("-o /nonexistent-dir/x"), 1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PIPPIN_EXE\n", argv[0]);
        return 2;
    }
    exe = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keygen_writes_pair),
        cmocka_unit_test(test_keygen_usage),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
