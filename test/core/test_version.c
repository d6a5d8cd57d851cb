/* The version API: the loaded library's version matches the header's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "pippin/version.h"
#include "test_filter.h"

static void test_version_matches_header(void **state) {
    (void)state;
    assert_string_equal(pp_version(), PIPPIN_VERSION_STRING);
    assert_int_equal(pp_version_number(), PIPPIN_VERSION_NUMBER);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", PIPPIN_VERSION_MAJOR, PIPPIN_VERSION_MINOR, PIPPIN_VERSION_PATCH);
    assert_string_equal(pp_version(), want);
    assert_true(PIPPIN_VERSION_NUMBER >= 200);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_matches_header),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
