/* Cores lent between the ranks of one host (lib/core_share.c): two
 * processes meet in the segment; a waiting rank's threads go to the busy
 * one and come back when it computes again; a rank that rejoins resets
 * its slot; the last one out removes the segment; a GEMM on borrowed
 * threads gives the bits it gives on its own. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "pippin/exec.h"

#include "core_share.h"
#include "gemm.h"
#include "test_filter.h"
#include "thread_pool.h"

static char key[128];

static void make_key(const char *what) {
    snprintf(key, sizeof key, "test_core_share %s %d", what, (int)getpid());
}

/* Whether the segment of the current key exists. */
static int segment_exists(void) {
    char name[64], path[80];
    pp_share_cores_segment_name(key, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* One byte each way between the test and its child rank. */
typedef struct link2 {
    int to_child[2], to_parent[2];
} link2;

static void say(int fd, char c) { assert_int_equal(write(fd, &c, 1), 1); }

static char hear(int fd) {
    char c = 0;
    return read(fd, &c, 1) == 1 ? c : 0;
}

/* A child rank of n ranks, one own thread, up to 2. Waits (lends) on 'i',
 * computes on 'b', claims on 'c' (answering with the count as a digit, and
 * releasing), leaves and ends on 'q'; answers the others with 'k'. 'x': dies
 * without leaving. */
static void child_rank(link2 *l, int slot, int n) {
    if (pp_share_cores_join(key, slot, n, 1, 2) != PP_OK) _exit(2);
    say(l->to_parent[1], 'k');
    for (;;) {
        char c = hear(l->to_child[0]), answer = 'k';
        if (c == 'i') pp_share_cores_idle(1);
        else if (c == 'b') pp_share_cores_idle(0);
        else if (c == 'c') {
            int t = pp_share_cores_claim(2);
            pp_share_cores_release(t);
            answer = (char)('0' + t);
        } else if (c == 'x') _exit(0);
        else break;
        say(l->to_parent[1], answer);
    }
    pp_share_cores_leave();
    say(l->to_parent[1], 'k');
    _exit(0);
}

static pid_t start_child(link2 *l, int slot, int n) {
    assert_int_equal(pipe(l->to_child), 0);
    assert_int_equal(pipe(l->to_parent), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(l->to_child[1]);
        close(l->to_parent[0]);
        child_rank(l, slot, n);
    }
    close(l->to_child[0]);
    close(l->to_parent[1]);
    assert_int_equal(hear(l->to_parent[0]), 'k');
    return pid;
}

static void tell(link2 *l, char c) {
    say(l->to_child[1], c);
    assert_int_equal(hear(l->to_parent[0]), 'k');
}

static void end_child(link2 *l, pid_t pid, char how) {
    if (how == 'x') say(l->to_child[1], 'x');
    else tell(l, 'q');
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(l->to_child[1]);
    close(l->to_parent[0]);
}

static void test_lent_threads_come_and_go(void **state) {
    (void)state;
    make_key("lend");
    link2 l;
    pid_t pid = start_child(&l, 1, 2);
    assert_int_equal(pp_share_cores_join(key, 0, 2, 1, 2), PP_OK);
    assert_true(pp_share_cores_joined());
    assert_int_equal(pp_get_threads(), 2); /* the pool can hold what is lent */
    /* the child computes: nothing to borrow */
    assert_int_equal(pp_share_cores_claim(2), 1);
    pp_share_cores_release(1);
    /* the child waits: its thread is ours, one claim at a time */
    tell(&l, 'i');
    int64_t calls = pp_share_cores_borrowed_calls(), host = pp_share_cores_borrows();
    int t = pp_share_cores_claim(2);
    assert_int_equal(t, 2);
    assert_true(pp_share_cores_borrowing() == 0); /* our own borrowing: not another rank's */
    pp_share_cores_release(t);
    assert_int_equal(pp_share_cores_borrowed_calls(), calls + 1);
    assert_int_equal(pp_share_cores_borrows(), host + 1); /* the host's count a spinner watches */
    /* asking for fewer than our own never borrows */
    assert_int_equal(pp_share_cores_claim(1), 1);
    pp_share_cores_release(1);
    /* the child computes again: it is back to us alone */
    tell(&l, 'b');
    assert_int_equal(pp_share_cores_claim(2), 1);
    pp_share_cores_release(1);
    end_child(&l, pid, 'q');
    pp_share_cores_leave();
    assert_false(pp_share_cores_joined());
    assert_int_equal(pp_get_threads(), 1);
    assert_int_equal(pp_share_cores_claim(3), 3); /* not joined: the pool's size */
    assert_false(segment_exists()); /* the last one out removed it */
}

/* Two borrowers never take one lent thread twice: rank 1 lends, rank 0
 * holds it, so rank 2 gets only its own until rank 0 releases. */
static void test_one_lent_thread_is_borrowed_once(void **state) {
    (void)state;
    make_key("once");
    link2 a, b;
    pid_t pa = start_child(&a, 1, 3), pb = start_child(&b, 2, 3);
    assert_int_equal(pp_share_cores_join(key, 0, 3, 1, 2), PP_OK);
    say(b.to_child[1], 'c');
    assert_int_equal(hear(b.to_parent[0]), '1'); /* nobody lends yet */
    tell(&a, 'i');
    int t = pp_share_cores_claim(2);
    assert_int_equal(t, 2);
    say(b.to_child[1], 'c');
    assert_int_equal(hear(b.to_parent[0]), '1'); /* rank 0 holds it */
    pp_share_cores_release(t);
    say(b.to_child[1], 'c');
    assert_int_equal(hear(b.to_parent[0]), '2'); /* free again */
    end_child(&a, pa, 'q');
    end_child(&b, pb, 'q');
    pp_share_cores_leave();
}

/* A rank that died while lending (its slot still says so) is replaced by
 * its restart, which starts from a clean slot. */
static void test_rejoin_resets_a_dead_ranks_slot(void **state) {
    (void)state;
    make_key("rejoin");
    assert_int_equal(pp_share_cores_join(key, 0, 2, 1, 2), PP_OK);
    link2 l;
    pid_t pid = start_child(&l, 1, 2);
    tell(&l, 'i');
    end_child(&l, pid, 'x'); /* gone, its slot still lending */
    /* a dead rank's core is free indeed: borrowing it is right */
    int t = pp_share_cores_claim(2);
    assert_int_equal(t, 2);
    pp_share_cores_release(t);
    pid = start_child(&l, 1, 2); /* the restart computes: nothing lent */
    assert_int_equal(pp_share_cores_claim(2), 1);
    pp_share_cores_release(1);
    end_child(&l, pid, 'q');
    pp_share_cores_leave();
}

static void test_bad_arguments(void **state) {
    (void)state;
    make_key("bad");
    assert_int_not_equal(pp_share_cores_join(key, 2, 2, 1, 2), PP_OK);
    assert_non_null(strstr(pp_last_error(), "rank 2 of 2"));
    assert_int_not_equal(pp_share_cores_join(key, 0, 2, 3, 2), PP_OK);
    assert_non_null(strstr(pp_last_error(), "3 own threads"));
    assert_int_not_equal(pp_share_cores_join("", 0, 2, 1, 2), PP_OK);
    assert_false(pp_share_cores_joined());
    pp_share_cores_idle(1); /* no-op when not joined */
}

/* A GEMM cut into panels over borrowed threads gives the bits of the GEMM
 * on one thread, and did run in pieces. */
static void test_gemm_on_borrowed_threads(void **state) {
    (void)state;
    make_key("gemm");
    enum { M = 150, N = 200, K = 130 }; /* above 2 x PP_PAR_MIN_MACS: worth two threads */
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *c1 = malloc(sizeof(float) * M * N), *c2 = malloc(sizeof(float) * M * N);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c1);
    assert_non_null(c2);
    uint32_t x = 12345;
    for (int i = 0; i < M * K; i++) a[i] = (float)((x = x * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < K * N; i++) b[i] = (float)((x = x * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    pp_set_threads(1);
    pp_gemm_f32(0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c1, N);
    link2 l;
    pid_t pid = start_child(&l, 1, 2);
    assert_int_equal(pp_share_cores_join(key, 0, 2, 1, 2), PP_OK);
    tell(&l, 'i');
    int64_t calls = pp_share_cores_borrowed_calls(), par = pp_pool_parallel_calls();
    pp_gemm_f32(0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c2, N);
    assert_true(pp_share_cores_borrowed_calls() > calls);
    assert_true(pp_pool_parallel_calls() > par);
    assert_memory_equal(c1, c2, sizeof(float) * M * N);
    end_child(&l, pid, 'q');
    pp_share_cores_leave();
    free(a);
    free(b);
    free(c1);
    free(c2);
}

/* A kernel inside a piece, or while another thread's call holds the
 * workers, borrows nothing (it runs on its own thread); two claims of one
 * rank never take one lent thread twice; releases give back what was
 * taken. */
static atomic_int inner_claims;

static void claim_in_piece(void *arg, int64_t lo, int64_t hi) {
    (void)arg, (void)lo, (void)hi;
    int t = pp_pool_threads_claim();
    if (t != 1) atomic_fetch_add(&inner_claims, 1);
    pp_pool_threads_release(t);
}

static void test_claims_inside_pieces_and_twice(void **state) {
    (void)state;
    make_key("nested");
    link2 l;
    pid_t pid = start_child(&l, 1, 2);
    assert_int_equal(pp_share_cores_join(key, 0, 2, 1, 2), PP_OK);
    tell(&l, 'i');
    atomic_store(&inner_claims, 0);
    pp_parallel_for(64, 1, claim_in_piece, NULL);
    assert_int_equal(atomic_load(&inner_claims), 0);
    int a = pp_share_cores_claim(2), b = pp_share_cores_claim(2);
    assert_int_equal(a, 2);
    assert_int_equal(b, 1); /* the one lent thread is held by a */
    pp_share_cores_release(b);
    pp_share_cores_release(a);
    a = pp_share_cores_claim(2);
    assert_int_equal(a, 2); /* given back */
    pp_share_cores_release(a);
    end_child(&l, pid, 'q');
    pp_share_cores_leave();
}

/* A segment another user could write (here: mode 0644) is refused. */
static void test_refuses_a_segment_others_can_write(void **state) {
    (void)state;
    make_key("mode");
    char name[64];
    pp_share_cores_segment_name(key, name, sizeof name);
    int fd = shm_open(name, O_CREAT | O_RDWR, 0644);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, 0644), 0);
    close(fd);
    assert_int_not_equal(pp_share_cores_join(key, 0, 2, 1, 2), PP_OK);
    assert_non_null(strstr(pp_last_error(), "not to this user alone"));
    assert_false(pp_share_cores_joined());
    shm_unlink(name);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lent_threads_come_and_go),
        cmocka_unit_test(test_one_lent_thread_is_borrowed_once),
        cmocka_unit_test(test_rejoin_resets_a_dead_ranks_slot),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_gemm_on_borrowed_threads),
        cmocka_unit_test(test_claims_inside_pieces_and_twice),
        cmocka_unit_test(test_refuses_a_segment_others_can_write),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
