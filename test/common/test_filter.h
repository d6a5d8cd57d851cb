/* One test case by name: PIPPIN_TEST_CASE=<pattern> runs only the cmocka
 * cases whose names match (cmocka's * and ? wildcards), e.g.
 *   PIPPIN_TEST_CASE=test_buffer_matches_torch meson test -C build autodiff -v */
#ifndef PIPPIN_TEST_FILTER_H
#define PIPPIN_TEST_FILTER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

static inline void tu_filter_from_env(void) {
    const char *f = getenv("PIPPIN_TEST_CASE");
    if (f && *f) cmocka_set_test_filter(f);
}

#endif
