/* Shared helpers for the transport tests. */
#ifndef PIPPIN_TEST_TRANSPORT_UTIL_H
#define PIPPIN_TEST_TRANSPORT_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "envelope.h"
#include "pippin/log.h"
#include "pippin/status.h"
#include "pippin/tensor.h"
#include "pippin/transport.h"

#define TT_OK(expr)                                                              \
    do {                                                                         \
        pp_status tt_s_ = (expr);                                                \
        if (tt_s_ != PP_OK) fail_msg("%s failed: %s", #expr, pp_last_error());   \
    } while (0)

/* Asserts that expr returns code and that the error message contains every
 * non-NULL string given. */
#define TT_FAILS(code, expr, ...)                                                \
    do {                                                                         \
        pp_status tt_s_ = (expr);                                                \
        if (tt_s_ != (code))                                                     \
            fail_msg("%s returned %d (%s), expected %d", #expr, tt_s_,           \
                     pp_last_error(), (code));                                   \
        tt_assert_mentions(pp_last_error(), __VA_ARGS__, NULL);                  \
    } while (0)

void tt_assert_mentions(const char *msg, ...);

/* Monotonic milliseconds. */
int64_t tt_now_ms(void);

/* A fresh directory under $TMPDIR (removed by tt_rmdir_all). */
const char *tt_tmpdir(void);
void tt_rmdir_all(const char *dir);

/* Endpoint pattern for rank r of a pair: "inproc", "ipc" or "tcp". The
 * endpoint is bindable (tcp uses port *, ipc a file in a fresh temp dir). */
void tt_endpoint(const char *kind, int r, char *buf, size_t cap);

/* Creates ranks 0..n-1 (n <= 8) on one kind of endpoint with opts as a
 * template (rank, nranks and endpoints are filled in) and connects them all
 * to each other. */
void tt_make_ranks(const char *kind, int n, const pp_transport_options *tmpl, pp_transport **out);
void tt_close_ranks(int n, pp_transport **t);
/* Polls ranks 0..n-1 in turn until every pair completed the hello
 * handshake (pp_transport_peer_ready), so that crafted messages from
 * strangers meet ranks that know each other. */
void tt_handshake(int n, pp_transport **t);
/* Ranks 0 and 1 over tcp (options o[0], o[1]; rank, nranks, endpoints
 * filled in): rank 0 at 127.0.0.1, rank 1 listed as `listed1` (its own
 * idea of its address, a port "*"), bound at bind1 (NULL: listed1), and
 * reached by rank 0 at host `reach1` on the port it bound. Handshaken. */
void tt_make_pair_reached_at(pp_transport_options o[2], const char *listed1, const char *bind1, const char *reach1,
                             pp_transport **t);

/* f32 tensor [n] with values base + i. */
pp_tensor *tt_f32_seq(int ndim, const int64_t *shape, float base);
void tt_assert_same(const pp_tensor *got, const pp_tensor *want);

/* Key helper. */
pp_transport_key tt_key(pp_msg_kind kind, int64_t step, int mb, int src, int dst, const char *name);

#endif
