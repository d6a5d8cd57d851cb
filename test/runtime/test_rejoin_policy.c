/* When a failed step is worth a rejoin (runtime/rejoin_policy.h): a peer's
 * failure without an abort is recoverable whatever its state shows now
 * (regression: a peer reopening its transport in its own rejoin was seen
 * up again, and run_signals' --restart gave up on it under ASan), except
 * when a peer refused this rank's key; a peer's rollback abort is, this
 * rank's own and a peer's other aborts are not; nor are errors of this
 * rank's own. */
#include "rejoin_policy.h"
#include "test_util.h"

#include "test_filter.h"

static void test_peer_failure_whatever_the_state_now(void **state) {
    (void)state;
    const pp_peer_state up[3] = {PP_PEER_UP, PP_PEER_UP, PP_PEER_UP};
    const pp_peer_state down[3] = {PP_PEER_UP, PP_PEER_DOWN, PP_PEER_UP};
    const pp_peer_state closed[3] = {PP_PEER_UP, PP_PEER_UP, PP_PEER_CLOSED};
    /* every peer up again by the time the failure is looked at */
    assert_true(pp_rejoin_recoverable(PP_ERR_PEER, NULL, -1, 0, up, 3));
    assert_true(pp_rejoin_recoverable(PP_ERR_TIMEOUT, NULL, -1, 0, up, 3));
    assert_true(pp_rejoin_recoverable(PP_ERR_PEER, NULL, -1, 0, down, 3));
    assert_true(pp_rejoin_recoverable(PP_ERR_PEER, NULL, -1, 1, closed, 3));
}

static void test_rejected_key_is_not_waited_for(void **state) {
    (void)state;
    const pp_peer_state rejected[3] = {PP_PEER_UP, PP_PEER_REJECTED, PP_PEER_UP};
    assert_false(pp_rejoin_recoverable(PP_ERR_PEER, NULL, -1, 0, rejected, 3));
    assert_false(pp_rejoin_recoverable(PP_ERR_TIMEOUT, NULL, -1, 2, rejected, 3));
    /* this rank's own slot is not looked at */
    assert_true(pp_rejoin_recoverable(PP_ERR_PEER, NULL, -1, 1, rejected, 3));
}

static void test_aborts(void **state) {
    (void)state;
    const pp_peer_state up[2] = {PP_PEER_UP, PP_PEER_UP};
    assert_true(pp_rejoin_recoverable(PP_ERR_PEER, PP_REJOIN_PREFIX "rank 1 rolls back: x", 1, 0, up, 2));
    assert_false(pp_rejoin_recoverable(PP_ERR_PEER, PP_REJOIN_PREFIX "rank 0 rolls back: x", 0, 0, up, 2));
    assert_false(pp_rejoin_recoverable(PP_ERR_PEER, "rank 1: stage 1: node /fc: shape mismatch", 1, 0, up, 2));
    assert_false(pp_rejoin_recoverable(PP_ERR_PEER, "rejoin", 1, 0, up, 2));
}

static void test_own_errors_end_the_run(void **state) {
    (void)state;
    const pp_peer_state up[2] = {PP_PEER_UP, PP_PEER_UP};
    const pp_status own[] = {PP_ERR_SHAPE, PP_ERR_INVALID, PP_ERR_IO, PP_ERR_NOMEM, PP_ERR_STATE, PP_OK};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        assert_false(pp_rejoin_recoverable(own[i], NULL, -1, 0, up, 2));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_failure_whatever_the_state_now),
        cmocka_unit_test(test_rejected_key_is_not_waited_for),
        cmocka_unit_test(test_aborts),
        cmocka_unit_test(test_own_errors_end_the_run),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
