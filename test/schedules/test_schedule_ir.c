/* Action IR: text form, CSV, table, lowering and validation. */
#include <unistd.h>

#include "sched_test_util.h"

#include "test_filter.h"
static void roundtrip(const char *in, const char *out) {
    pp_action a, sub[PP_OVERLAP_MAX];
    int nsub;
    if (pp_action_parse(in, strlen(in), &a, sub, &nsub) != PP_OK)
        fail_msg("parse '%s': %s", in, pp_last_error());
    pp_schedule *s;
    assert_int_equal(pp_schedule_new(1, 0, 0, &s), PP_OK);
    if (a.kind == PP_ACT_OVERLAP_F_B)
        assert_int_equal(pp_schedule_append_overlap(s, 0, sub, nsub), PP_OK);
    else
        assert_int_equal(pp_schedule_append(s, 0, a), PP_OK);
    char buf[PP_ACTION_STR_MAX];
    pp_action_format(s, &s->acts[0][0], buf, sizeof buf);
    assert_string_equal(buf, out);
    pp_schedule_free(s);
}

static void test_action_text(void **state) {
    (void)state;
    static const char *same[] = {"0F1",      "2I0",         "1W3",     "0B2",
                                 "2SEND_B2", "1RECV_F1",    "3SEND_F0", "4RECV_B7",
                                 "0REDUCE_GRAD", "1UNSHARD", "3RESHARD", "12F345",
                                 "(4F4;3B0)OVERLAP_F_B", "(0F7;7B3)OVERLAP_F_B", "(1I2)OVERLAP_F_B"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) roundtrip(same[i], same[i]);
    roundtrip("  0F1\t", "0F1");
    roundtrip("( 4F4 ; 3B0 ;)OVERLAP_F_B", "(4F4;3B0)OVERLAP_F_B");
    pp_action a, sub[PP_OVERLAP_MAX];
    int nsub;
    assert_int_equal(pp_action_parse("  ", 2, &a, sub, &nsub), PP_OK);
    assert_int_equal(a.kind, PP_ACT_IDLE);
    assert_int_equal(pp_action_parse("3B12", 4, &a, sub, &nsub), PP_OK);
    assert_int_equal(a.kind, PP_ACT_B);
    assert_int_equal(a.stage, 3);
    assert_int_equal(a.mb, 12);
    assert_int_equal(pp_action_parse("(4F4;3B0)OVERLAP_F_B", 20, &a, sub, &nsub), PP_OK);
    assert_int_equal(nsub, 2);
    assert_int_equal(sub[1].kind, PP_ACT_B);
    assert_int_equal(sub[1].stage, 3);
    assert_string_equal(pp_act_kind_name(PP_ACT_SEND_F), "SEND_F");
    assert_true(pp_act_is_compute(PP_ACT_W));
    assert_false(pp_act_is_compute(PP_ACT_RECV_B));
}

static void test_action_errors(void **state) {
    (void)state;
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"F1", "expected [stage][kind][microbatch]"},
        {"0X1", "unknown kind"},
        {"0F", "F needs a microbatch number"},
        {"0REDUCE_GRAD3", "REDUCE_GRAD takes no microbatch"},
        {"0F1x", "unexpected 'x'"},
        {"(0F1;1B0)", "must end in OVERLAP_F_B"},
        {"(0F1;1B0", "missing ')'"},
        {"()OVERLAP_F_B", "without sub-actions"},
        {"99999999999F0", "stage number above"},
        {"0F99999999999", "microbatch number above"},
        {"((0F1))OVERLAP_F_B", "nested compound"},
        {"(0F1;0F2;0F3;0F4;0F5;0F6;0F7;0F8;0F9)OVERLAP_F_B", "more than 8 sub-actions"},
        {"-1F0", "expected [stage]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pp_action a, sub[PP_OVERLAP_MAX];
        int nsub;
        assert_int_equal(pp_action_parse(bad[i].text, strlen(bad[i].text), &a, sub, &nsub),
                         PP_ERR_PARSE);
        assert_contains(pp_last_error(), bad[i].msg);
    }
}

static void test_csv_roundtrip(void **state) {
    (void)state;
    /* torch writes \r\n and leaves idle cells empty. */
    const char *text = "0F0,0F1,,0B0,0B1\r\n"
                       ",1F0,1B0,1F1,1B1\r\n"
                       "\"2F0\",(2F1;2B0)OVERLAP_F_B,2B1\r\n";
    pp_schedule *s = parse_csv(text);
    assert_int_equal(s->nranks, 3);
    assert_int_equal(s->nstages, 3);
    assert_int_equal(s->nmb, 2);
    assert_int_equal(s->len[0], 5);
    assert_int_equal(s->acts[0][2].kind, PP_ACT_IDLE);
    assert_int_equal(s->acts[1][0].kind, PP_ACT_IDLE);
    assert_int_equal(s->acts[2][1].kind, PP_ACT_OVERLAP_F_B);
    assert_int_equal(s->stage_rank[2], 2);
    char path[] = "/tmp/pippin_sched_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(pp_schedule_save_csv(s, path), PP_OK);
    pp_schedule *t;
    assert_int_equal(pp_schedule_load_csv(path, &t), PP_OK);
    char a[1024], b[1024];
    for (int r = 0; r < 3; r++) {
        assert_int_equal(s->len[r], t->len[r]);
        rank_str(s, r, 0, a, sizeof a);
        rank_str(t, r, 0, b, sizeof b);
        assert_string_equal(a, b);
    }
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "0F0,0F1,,0B0,0B1\n");
    fclose(f);
    unlink(path);
    pp_schedule_free(s);
    pp_schedule_free(t);
    /* A generated schedule survives the trip too. */
    s = gen(PP_SCHED_DUALPIPEV, 3, 8, 2);
    FILE *mem = tmpfile();
    assert_non_null(mem);
    assert_int_equal(pp_schedule_write_csv(s, mem), PP_OK);
    long n = ftell(mem);
    rewind(mem);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, mem), (size_t)n);
    fclose(mem);
    t = parse_csv((buf[n] = '\0', buf));
    assert_int_equal(pp_schedule_validate(t, NULL), PP_OK);
    for (int r = 0; r < 3; r++) {
        rank_str(s, r, 0, a, sizeof a);
        rank_str(t, r, 0, b, sizeof b);
        assert_string_equal(a, b);
    }
    free(buf);
    pp_schedule_free(s);
    pp_schedule_free(t);
}

static void expect_csv_error(const char *text, const char *msg) {
    pp_schedule *s = (pp_schedule *)1;
    assert_int_not_equal(pp_schedule_parse_csv(text, strlen(text), "bad.csv", &s), PP_OK);
    assert_null(s);
    assert_contains(pp_last_error(), msg);
}

static void test_csv_errors(void **state) {
    (void)state;
    expect_csv_error("0F0,0B0\n1F0,1Q0,1B0\n", "bad.csv:2: cell 2: invalid action '1Q0'");
    expect_csv_error("0F0,\"0B0\n", "bad.csv:1: cell 2: unterminated quote");
    expect_csv_error("0F0,\"0B0\"x\n", "bad.csv:1: cell 2: text after closing quote");
    expect_csv_error("", "bad.csv: no rows");
    expect_csv_error("\n\n  \n", "bad.csv: no rows");
    expect_csv_error("0F0,0F99999999\n", "bad.csv:1: cell 2");
    char big[1200];
    memset(big, '1', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    expect_csv_error(big, "longer than 1024 bytes");
    pp_schedule *s;
    assert_int_equal(pp_schedule_load_csv("/nonexistent/x.csv", &s), PP_ERR_IO);
    assert_contains(pp_last_error(), "/nonexistent/x.csv");
}

static void test_table(void **state) {
    (void)state;
    pp_schedule *s = gen(PP_SCHED_1F1B, 2, 2, 0);
    char *t;
    assert_int_equal(pp_schedule_format_table(s, 2, &t), PP_OK);
    assert_string_equal(t, "        Rank 0 Rank 1\n"
                           "Step 0: 0F0    1F0\n"
                           "Step 1: 0F1    1B0\n"
                           "Step 2: 0B0    1F1 <-- ERROR HERE\n"
                           "Step 3: 0B1    1B1\n");
    free(t);
    pp_schedule_free(s);
}

/* The hand-written formatter against snprintf, the one it replaced:
 * extreme numbers, every kind, and snprintf's truncation contract. */
static void test_action_format_like_snprintf(void **state) {
    (void)state;
    static const int32_t nums[] = {0,          1,  9,  10, 99, 100, 12345,
                                   2147483647, -1, -7, -2147483647 - 1};
    for (int kind = 0; kind <= PP_ACT_KIND_COUNT; kind++)
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
            for (size_t j = 0; j < sizeof nums / sizeof nums[0]; j++) {
                pp_action a = pp_act(kind == PP_ACT_OVERLAP_F_B ? PP_ACT_F : kind, nums[i],
                                     nums[j]);
                if (kind == PP_ACT_KIND_COUNT) a.kind = 200; /* unknown: "?" */
                char want[64], got[64];
                int wn;
                if (a.kind == PP_ACT_IDLE)
                    wn = snprintf(want, sizeof want, "%s", "");
                else if (a.mb >= 0 && a.kind != PP_ACT_UNSHARD && a.kind != PP_ACT_RESHARD &&
                         a.kind != PP_ACT_REDUCE_GRAD)
                    wn = snprintf(want, sizeof want, "%d%s%d", (int)a.stage,
                                  pp_act_kind_name(a.kind), (int)a.mb);
                else
                    wn = snprintf(want, sizeof want, "%d%s", (int)a.stage,
                                  pp_act_kind_name(a.kind));
                assert_int_equal(pp_action_format(NULL, &a, got, sizeof got), wn);
                assert_string_equal(got, want);
                for (size_t n = 0; n < 6; n++) {
                    char small[8] = "xxxxxxx";
                    assert_int_equal(pp_action_format(NULL, &a, small, n), wn);
                    if (n) assert_int_equal(strncmp(small, want, n - 1), 0);
                    if (n) assert_int_equal(small[n - 1 < (size_t)wn ? n - 1 : (size_t)wn], 0);
                    if (n == 0) assert_int_equal(small[0], 'x');
                }
            }
    /* A compound with the most sub-actions, truncated like snprintf too. */
    pp_schedule *s;
    assert_int_equal(pp_schedule_new(1, 0, 0, &s), PP_OK);
    pp_action sub[PP_OVERLAP_MAX];
    for (int k = 0; k < PP_OVERLAP_MAX; k++)
        sub[k] = pp_act(k % 2 ? PP_ACT_B : PP_ACT_F, 4000000 + k, 16000000 + k);
    assert_int_equal(pp_schedule_append_overlap(s, 0, sub, PP_OVERLAP_MAX), PP_OK);
    char want[PP_ACTION_STR_MAX + 16] = "(", got[PP_ACTION_STR_MAX + 16];
    for (int k = 0; k < PP_OVERLAP_MAX; k++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d%s%d", k ? ";" : "",
                 4000000 + k, k % 2 ? "B" : "F", 16000000 + k);
    strcat(want, ")OVERLAP_F_B");
    assert_int_equal(pp_action_format(s, &s->acts[0][0], got, sizeof got), (int)strlen(want));
    assert_string_equal(got, want);
    assert_int_equal(pp_action_format(s, &s->acts[0][0], got, 10), (int)strlen(want));
    assert_int_equal(strncmp(got, want, 9), 0);
    assert_int_equal(got[9], 0);
    pp_schedule_free(s);
}

/* The streamed table is the string table, byte for byte. */
static void test_table_streamed(void **state) {
    (void)state;
    pp_schedule *s = gen(PP_SCHED_ZBV, 3, 5, 0);
    char *t, *u = NULL;
    size_t n;
    assert_int_equal(pp_schedule_format_table(s, -1, &t), PP_OK);
    FILE *f = open_memstream(&u, &n);
    assert_non_null(f);
    assert_int_equal(pp_schedule_write_table(s, f), PP_OK);
    assert_int_equal(fclose(f), 0);
    assert_string_equal(u, t);
    assert_non_null(strstr(t, "Step 00: 0F0    1F0    2F0\n"));
    assert_null(strstr(t, "ERROR"));
    free(t);
    free(u);
    pp_schedule_free(s);
}

static void expect_invalid(const char *csv, const char *msg, const char *marked_row) {
    pp_schedule *s = parse_csv(csv);
    char *table = NULL;
    assert_int_equal(pp_schedule_validate(s, &table), PP_ERR_INVALID);
    assert_contains(pp_last_error(), msg);
    if (marked_row) {
        assert_non_null(table);
        assert_contains(table, marked_row);
    }
    free(table);
    pp_schedule_free(s);
}

static void test_validate(void **state) {
    (void)state;
    expect_invalid("0F0,0B1,0F1,0B0\n1F0,1B0,1F1,1B1\n",
                   "rank 0 step 1 action 0B1: Running Full Backward for stage 0, microbatch 1 "
                   "without first running Forward",
                   "Step 1: 0B1    1B0 <-- ERROR HERE");
    expect_invalid("0F0,0W0,0I0\n", "Running Backward Weight for stage 0, microbatch 0",
                   "Step 1: 0W0 <-- ERROR HERE");
    expect_invalid("0F0,0I0,0F0\n", "second forward", "<-- ERROR HERE");
    expect_invalid("0F0,0I0\n", "backward input without backward weight", NULL);
    expect_invalid("0F0,0F1,0B0,0UNSHARD\n", "microbatch 1: no backward", NULL);
    expect_invalid("0F0,0F1,0B0\n", "3 actions cannot cover 1 stages x 2 microbatches", NULL);
    expect_invalid("0F0,0B0,1F0\n1B0\n", "stage 1 is assigned to both rank 0 and rank 1",
                   "<-- ERROR HERE");
    expect_invalid("0F0,0B0,0W0\n", "after a full backward", "<-- ERROR HERE");
    expect_invalid("0F0,0B0,0B0\n", "second backward", NULL);
    /* Deadlock: rank 1 wants microbatch 1 first, rank 0 waits for 1B0. */
    expect_invalid("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n",
                   "deadlock: rank 0 step 1 action 0B0 waits for 1I0 (or 1B0) on rank 1, which "
                   "is itself stuck at step 0 (1F1)",
                   "Step 1: 0B0    1B1 <-- ERROR HERE");
    /* REDUCE_GRAD before the last backward. */
    expect_invalid("0F0,0F1,0B0,0REDUCE_GRAD,0B1\n", "REDUCE_GRAD of stage 0 after only 1 of 2",
                   "<-- ERROR HERE");
    /* Lowered schedules: receives before use, sends matched. */
    expect_invalid("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n",
                   "forward of stage 1 microbatch 0 without a RECV_F", "<-- ERROR HERE");
    expect_invalid("0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
                   "RECV_F without a matching SEND_F", NULL);
    expect_invalid("0F0,0SEND_F0,0SEND_F0\n", "SEND_F from stage 0, whose next stage is not on "
                   "another rank", NULL);
    expect_invalid("0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
                   "SEND_F of stage 0 microbatch 0 before its forward", NULL);
    /* A RECV that waits for a send the other rank only makes later. */
    expect_invalid("0F0,0RECV_B0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "deadlock", NULL);
    /* Valid lowered schedule. */
    pp_schedule *s = parse_csv("0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD\n"
                               "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD\n");
    assert_int_equal(pp_schedule_validate(s, NULL), PP_OK);
    pp_schedule_free(s);
}

static void test_lower(void **state) {
    (void)state;
    char a[2048];
    pp_schedule *s = gen(PP_SCHED_1F1B, 2, 2, 0), *l;
    assert_int_equal(pp_schedule_lower(s, PP_LOWER_COMMS | PP_LOWER_REDUCE_GRAD, &l), PP_OK);
    rank_str(l, 0, 0, a, sizeof a);
    assert_string_equal(a, "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD");
    rank_str(l, 1, 0, a, sizeof a);
    assert_string_equal(a, "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD");
    assert_int_equal(pp_schedule_validate(l, NULL), PP_OK);
    assert_true(pp_schedule_has_comms(l));
    /* Lowering twice is refused. */
    pp_schedule *l2;
    assert_int_equal(pp_schedule_lower(l, PP_LOWER_COMMS, &l2), PP_ERR_INVALID);
    assert_contains(pp_last_error(), "already has communication actions");
    pp_schedule_free(l);
    pp_schedule_free(s);

    /* I directly followed by its W becomes B. */
    s = gen(PP_SCHED_ZB_H1, 2, 3, 0);
    assert_int_equal(pp_schedule_lower(s, PP_LOWER_MERGE_BW, &l), PP_OK);
    rank_str(l, 0, 0, a, sizeof a);
    assert_string_equal(a, "0F0 0F1 0B0 0F2 0B1 0B2");
    rank_str(l, 1, 0, a, sizeof a);
    assert_string_equal(a, "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2");
    assert_int_equal(pp_schedule_validate(l, NULL), PP_OK);
    pp_schedule_free(l);
    pp_schedule_free(s);

    /* V placement: stages p-1 and p share a rank, so nothing is sent there. */
    s = gen(PP_SCHED_ZBV, 2, 4, 2);
    assert_int_equal(pp_schedule_lower(s, PP_LOWER_COMMS, &l), PP_OK);
    for (int r = 0; r < 2; r++)
        for (size_t k = 0; k < l->len[r]; k++) {
            const pp_action *x = &l->acts[r][k];
            assert_false(x->kind == PP_ACT_SEND_F && x->stage == 1);
            assert_false(x->kind == PP_ACT_SEND_B && x->stage == 2);
        }
    assert_int_equal(pp_schedule_validate(l, NULL), PP_OK);
    pp_schedule_free(l);
    pp_schedule_free(s);

    /* Compounds get receives before and sends after. */
    s = gen(PP_SCHED_DUALPIPEV, 2, 4, 2);
    assert_int_equal(pp_schedule_lower(s, PP_LOWER_COMMS, &l), PP_OK);
    rank_str(l, 0, 0, a, sizeof a);
    assert_contains(a, "(0F3;3B1)OVERLAP_F_B 0SEND_F3 3SEND_B1 3RECV_F2 0RECV_B0 "
                       "(3F2;0B0)OVERLAP_F_B");
    assert_int_equal(pp_schedule_validate(l, NULL), PP_OK);
    pp_schedule_free(l);
    pp_schedule_free(s);
}

static void test_infer_and_limits(void **state) {
    (void)state;
    pp_schedule *s;
    assert_int_equal(pp_schedule_new(0, 0, 0, &s), PP_ERR_INVALID);
    assert_int_equal(pp_schedule_new(2, 4, 3, &s), PP_OK);
    assert_int_equal(pp_schedule_place(s, PP_PLACE_V), PP_OK);
    assert_int_equal(s->stage_rank[0], 0);
    assert_int_equal(s->stage_rank[1], 1);
    assert_int_equal(s->stage_rank[2], 1);
    assert_int_equal(s->stage_rank[3], 0);
    assert_int_equal(pp_schedule_append(s, 5, pp_act(PP_ACT_F, 0, 0)), PP_ERR_INVALID);
    pp_action many[9];
    for (int i = 0; i < 9; i++) many[i] = pp_act(PP_ACT_F, 0, i);
    assert_int_equal(pp_schedule_append_overlap(s, 0, many, 9), PP_ERR_INVALID);
    /* An empty schedule does not validate. */
    assert_int_equal(pp_schedule_validate(s, NULL), PP_ERR_INVALID);
    pp_schedule_free(s);
    assert_int_equal(pp_schedule_new(3, 4, 1, &s), PP_OK);
    assert_int_equal(pp_schedule_place(s, PP_PLACE_LOOP), PP_ERR_INVALID);
    pp_schedule_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_action_text),  cmocka_unit_test(test_action_errors),
        cmocka_unit_test(test_csv_roundtrip), cmocka_unit_test(test_csv_errors),
        cmocka_unit_test(test_table),        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_action_format_like_snprintf),
        cmocka_unit_test(test_table_streamed),
        cmocka_unit_test(test_lower),        cmocka_unit_test(test_infer_and_limits),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
