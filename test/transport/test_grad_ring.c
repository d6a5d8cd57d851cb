/* The replicas' gradient ring (runtime/grad_ring.c) over real transports,
 * one thread per replica: every replica ends with chunk c of every bucket
 * summed in the order replica c, c+1, ... (the reference below), bit for
 * bit, whether buckets go round the ring or are summed directly, over
 * inproc, the socket, or the shared-memory rings, or summed through
 * shared memory without the transport (runtime/grad_shm.c). Chunks are sent straight
 * from the gradients, so each replica scribbles over its buffer the moment
 * finish returns: a chunk the transport had not written out yet would
 * reach a peer changed. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_ring.h"
#include "test_filter.h"
#include "tt_util.h"

enum { MAX_R = 4, NP = 4, STEPS = 2 };
/* Parameters of 300k, 8k, 40k and 3 floats: buckets of 256 KiB cut them
 * into a large bucket of its own, and small ones. */
static const int64_t numel[NP] = {300000, 8000, 40000, 3};

typedef struct job {
    pp_transport *t;
    pp_grad_ring_options o;
    int64_t total;
    int64_t offset[NP];
    float *x[STEPS];   /* this replica's gradients of each step */
    float *out[STEPS]; /* what it held after finish */
    int shm_buckets, buckets; /* of the last step */
    pp_status s;
    char err[512];
} job;

static void *replica_main(void *arg) {
    job *j = arg;
    char *names[NP] = {"a", "b", "c", "d"};
    int64_t nm[NP];
    memcpy(nm, numel, sizeof nm);
    float *grad = malloc(sizeof(float) * (size_t)j->total), *data = calloc((size_t)j->total, sizeof(float));
    pp_flat_params fp = {NP, NULL, names, j->offset, nm, NULL, NULL, j->total, data, grad, NULL};
    pp_grad_ring *g = NULL;
    j->s = pp_grad_ring_new(&j->o, &g);
    for (int step = 0; step < STEPS && j->s == PP_OK; step++) {
        memcpy(grad, j->x[step], sizeof(float) * (size_t)j->total);
        pp_transport_set_step(j->t, step);
        pp_grad_ring_begin(g, step);
        j->s = pp_grad_ring_add(g, 0, &fp, 0);
        if (j->s == PP_OK) j->s = pp_grad_ring_finish(g, 10000);
        j->shm_buckets = pp_grad_ring_shm_buckets(g);
        j->buckets = pp_grad_ring_buckets(g);
        memcpy(j->out[step], grad, sizeof(float) * (size_t)j->total);
        memset(grad, 0xff, sizeof(float) * (size_t)j->total); /* NaN: the next step's work */
    }
    if (j->s != PP_OK) snprintf(j->err, sizeof j->err, "%s", pp_last_error());
    pp_grad_ring_free(g);
    free(grad);
    free(data);
    return NULL;
}

/* Values of many magnitudes, so that the order of a sum shows in its bits. */
static float value(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    int e = (int)((*seed >> 16) % 20) - 10;
    float m = (float)((*seed >> 4) & 0xfff) / 4096.0f - 0.5f;
    return ldexpf(m, e);
}

/* R replicas over kind (shm_bytes as in the transport options), buckets
 * summed directly up to direct_max_bytes; replicas below shm_from keep to
 * the transport (same_host -1: R for all), the others would use shared
 * memory with slots of slot_bytes; each replica's result checked against
 * the ring order. Returns the results of replica 0 (caller frees), and in
 * *shm how many of replica 0's buckets went through shared memory. */
static float *run_shm(const char *kind, int64_t shm_bytes, int R, int64_t direct_max_bytes, int shm_from,
                      int64_t slot_bytes, int *shm) {
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = 10000;
    o.shm_bytes = shm_bytes;
    pp_transport *t[MAX_R];
    tt_make_ranks(kind, R, &o, t);
    job jobs[MAX_R];
    int64_t offset[NP], total = 0;
    for (int i = 0; i < NP; i++) {
        offset[i] = total;
        total += (numel[i] + 15) / 16 * 16;
    }
    for (int k = 0; k < R; k++) {
        job *j = &jobs[k];
        memset(j, 0, sizeof *j);
        j->t = t[k];
        j->o = (pp_grad_ring_options){t[k], R, k, 1, 16 << 10, 256 << 10, 0, direct_max_bytes, k < shm_from ? -1 : 0,
                                      slot_bytes};
        j->total = total;
        memcpy(j->offset, offset, sizeof offset);
        unsigned seed = 77u + 1000u * (unsigned)k;
        for (int s = 0; s < STEPS; s++) {
            j->x[s] = calloc((size_t)total, sizeof(float));
            j->out[s] = calloc((size_t)total, sizeof(float));
            for (int i = 0; i < NP; i++)
                for (int64_t e = 0; e < numel[i]; e++) j->x[s][offset[i] + e] = value(&seed);
        }
    }
    pthread_t th[MAX_R];
    for (int k = 0; k < R; k++) assert_int_equal(pthread_create(&th[k], NULL, replica_main, &jobs[k]), 0);
    for (int k = 0; k < R; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < R; k++)
        if (jobs[k].s != PP_OK) fail_msg("%s, %d replicas: replica %d: %s", kind, R, k, jobs[k].err);
    /* the reference: replica k's shard is chunk k + 1 of every bucket,
     * summed from replica k + 1 on */
    float *want = calloc((size_t)total, sizeof(float));
    int order_shows = 0;
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < R; k++) {
            pp_ring_ranges rr;
            int64_t nm[NP];
            memcpy(nm, numel, sizeof nm);
            pp_flat_params fp = {NP, NULL, NULL, offset, nm, NULL, NULL, total, NULL, NULL, NULL};
            TT_OK(pp_grad_ring_shard(&jobs[k].o, k, &fp, &rr));
            int c = (k + 1) % R;
            for (int q = 0; q < rr.n; q++)
                for (int64_t e = rr.lo[q]; e < rr.lo[q] + rr.len[q]; e++) {
                    float acc = jobs[c].x[s][e], plain = jobs[0].x[s][e];
                    for (int m = 1; m < R; m++) {
                        acc += jobs[(c + m) % R].x[s][e];
                        plain += jobs[m].x[s][e];
                    }
                    want[e] = acc;
                    order_shows |= memcmp(&acc, &plain, sizeof acc) != 0;
                }
            pp_ring_ranges_free(&rr);
        }
        for (int k = 0; k < R; k++)
            for (int64_t e = 0; e < total; e++)
                if (memcmp(&jobs[k].out[s][e], &want[e], sizeof(float)))
                    fail_msg("%s, %d replicas, direct up to %lld bytes: step %d, replica %d, element %lld: %.9g, "
                             "the ring order gives %.9g", kind, R, (long long)direct_max_bytes, s, k, (long long)e,
                             jobs[k].out[s][e], want[e]);
    }
    if (R > 2) assert_true(order_shows); /* the data can tell the orders apart */
    /* all or none, and the same on every replica: all where every replica
     * would and the transports see one host */
    int expect = shm_from == 0 && shm_bytes >= 0;
    for (int k = 0; k < R; k++)
        if (jobs[k].shm_buckets != (expect ? jobs[k].buckets : 0))
            fail_msg("%s, %d replicas, shared memory from replica %d: replica %d summed %d of %d buckets through shared "
                     "memory", kind, R, shm_from, k, jobs[k].shm_buckets, jobs[k].buckets);
    if (shm) *shm = jobs[0].shm_buckets;
    float *res = malloc(sizeof(float) * (size_t)total * STEPS);
    for (int s = 0; s < STEPS; s++) memcpy(res + (size_t)s * (size_t)total, jobs[0].out[s], sizeof(float) * (size_t)total);
    for (int k = 0; k < R; k++)
        for (int s = 0; s < STEPS; s++) {
            free(jobs[k].x[s]);
            free(jobs[k].out[s]);
        }
    free(want);
    tt_close_ranks(R, t);
    return res;
}

static float *run(const char *kind, int64_t shm_bytes, int R, int64_t direct_max_bytes) {
    return run_shm(kind, shm_bytes, R, direct_max_bytes, R, 0, NULL);
}

static void check_kind(const char *kind, int64_t shm_bytes) {
    for (int R = 2; R <= 3; R++) {
        float *ring = run(kind, shm_bytes, R, -1), *direct = run(kind, shm_bytes, R, (int64_t)1 << 30),
              *mixed = run(kind, shm_bytes, R, 0);
        free(ring);
        free(direct);
        free(mixed);
    }
}

static void test_ring_inproc(void **state) {
    (void)state;
    check_kind("inproc", 0);
}

static void test_ring_socket(void **state) {
    (void)state;
    check_kind("tcp", -1);
}

static void test_ring_shm(void **state) {
    (void)state;
    check_kind("tcp", 0);
}

/* This process's shared-memory groups still in /dev/shm ("pippin-NS-PID-gN"). */
static int groups_left(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "-%ld-g", (long)getpid());
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, "pippin-", 7) == 0 && strstr(e->d_name, prefix) != NULL;
    if (d) closedir(d);
    return n;
}

/* Same-host replicas summed through shared memory (runtime/grad_shm.c)
 * give the transport ring's bits, with slots that take one round or many
 * (4 KiB: the 300k-float bucket in 147 rounds each way, alternating
 * buffers); a replica that will not use shared memory keeps every replica
 * on the transport; nothing is left in /dev/shm. */
static void test_shm_collective_same_bits(void **state) {
    (void)state;
    int total = 0;
    for (int i = 0; i < NP; i++) total += (int)((numel[i] + 15) / 16 * 16);
    for (int R = 2; R <= 4; R++) {
        int used = 0, used_small = 0, declined = -1;
        float *ring = run_shm("tcp", 0, R, -1, R, 0, NULL), *socket = run_shm("tcp", -1, R, -1, R, 0, NULL);
        float *shm = run_shm("tcp", 0, R, -1, 0, 0, &used);
        float *small = run_shm("tcp", 0, R, -1, 0, 4096, &used_small);
        float *mixed = run_shm("tcp", 0, R, 0, R - 1, 0, &declined);
        assert_true(used > 0 && used_small > 0);
        assert_int_equal(declined, 0);
        size_t bytes = sizeof(float) * (size_t)total * STEPS;
        assert_memory_equal(ring, socket, bytes);
        assert_memory_equal(ring, shm, bytes);
        assert_memory_equal(ring, small, bytes);
        assert_memory_equal(ring, mixed, bytes);
        free(ring);
        free(socket);
        free(shm);
        free(small);
        free(mixed);
    }
    assert_int_equal(groups_left(), 0);
}

/* Transports that keep off shared memory (shm_bytes -1) never sum
 * through it. (Host ids that differ: test/netns/netns.sh.) */
static void test_shm_collective_refused_without_shm(void **state) {
    (void)state;
    int used = -1;
    free(run_shm("tcp", -1, 2, -1, 0, 0, &used));
    assert_int_equal(used, 0);

}

/* A replica that stops taking part after a step through shared memory:
 * gone (its transport closed) or silent. The other's next sum fails with
 * an error naming it, never hangs. */
typedef struct quit_job {
    pp_transport **t;
    int k, close_after; /* replica 1: close its transport after step 0, or just stop */
    int timeout_ms;
    int64_t slot_bytes;
    pp_status s[2];
    char err[512];
} quit_job;

static void *quit_main(void *arg) {
    quit_job *j = arg;
    enum { N = 50000 };
    char *names[1] = {"w"};
    int64_t off[1] = {0}, nm[1] = {N};
    float *grad = calloc(N, sizeof(float));
    pp_flat_params fp = {1, NULL, names, off, nm, NULL, NULL, N, NULL, grad, NULL};
    pp_grad_ring_options o = {*j->t, 2, j->k, 1, 16 << 10, 256 << 10, 0, 0, 0, j->slot_bytes};
    pp_grad_ring *g = NULL;
    j->s[0] = j->s[1] = pp_grad_ring_new(&o, &g);
    for (int step = 0; step < 2 && j->s[0] == PP_OK; step++) {
        if (step == 1 && j->k == 1) {
            if (j->close_after) {
                pp_transport_close(*j->t);
                *j->t = NULL;
            }
            break;
        }
        for (int i = 0; i < N; i++) grad[i] = (float)(i % 7 + j->k);
        pp_transport_set_step(*j->t, step);
        pp_grad_ring_begin(g, step);
        pp_status s = pp_grad_ring_add(g, 0, &fp, 0);
        if (s == PP_OK) s = pp_grad_ring_finish(g, j->timeout_ms);
        j->s[step] = s;
        if (s != PP_OK) snprintf(j->err, sizeof j->err, "%s", pp_last_error());
        if (step == 0 && s == PP_OK && pp_grad_ring_shm_buckets(g) != pp_grad_ring_buckets(g)) j->s[0] = PP_ERR_STATE;
    }
    pp_grad_ring_free(g);
    free(grad);
    return NULL;
}

static void check_quit(int close_after, int timeout_ms, pp_status code, const char *want) {
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = 20000;
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    quit_job jobs[2] = {{&t[0], 0, close_after, timeout_ms, 0, {0}, ""}, {&t[1], 1, close_after, timeout_ms, 0, {0}, ""}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) assert_int_equal(pthread_create(&th[k], NULL, quit_main, &jobs[k]), 0);
    pthread_join(th[1], NULL);
    pthread_join(th[0], NULL);
    assert_int_equal(jobs[0].s[0], PP_OK);
    assert_int_equal(jobs[1].s[0], PP_OK);
    assert_int_equal(jobs[0].s[1], code);
    if (!strstr(jobs[0].err, "replica 1 (rank 1)") || !strstr(jobs[0].err, want))
        fail_msg("the error should name replica 1 (rank 1) and say \"%s\": %s", want, jobs[0].err);
    for (int k = 0; k < 2; k++) pp_transport_close(t[k]);
    assert_int_equal(groups_left(), 0);
}

static void test_shm_collective_peer_gone(void **state) {
    (void)state;
    check_quit(1, 20000, PP_ERR_PEER, "is gone");
}

static void test_shm_collective_peer_silent(void **state) {
    (void)state;
    check_quit(0, 300, PP_ERR_TIMEOUT, "within 300 ms");
}

/* Replicas configured with different slot sizes (a misconfigured rank):
 * each refuses the other's segment, naming it, instead of summing with a
 * layout it does not share. */
static void test_shm_collective_refuses_other_layout(void **state) {
    (void)state;
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.timeout_ms = 5000;
    pp_transport *t[2];
    tt_make_ranks("tcp", 2, &o, t);
    quit_job jobs[2] = {{&t[0], 0, 0, 5000, 4096, {0}, ""}, {&t[1], 1, 0, 5000, 8192, {0}, ""}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) assert_int_equal(pthread_create(&th[k], NULL, quit_main, &jobs[k]), 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    int said = 0; /* the second to look may find the first's segment gone already */
    for (int k = 0; k < 2; k++) {
        char who[32];
        snprintf(who, sizeof who, "replica %d (rank %d)", 1 - k, 1 - k);
        assert_int_equal(jobs[k].s[0], PP_ERR_PEER);
        if (!strstr(jobs[k].err, who) || (!strstr(jobs[k].err, "another") && !strstr(jobs[k].err, "cannot be opened")))
            fail_msg("replica %d should refuse %s's segment of another layout: %s", k, who, jobs[k].err);
        said += strstr(jobs[k].err, "has another size") != NULL;
    }
    assert_true(said >= 1);
    tt_close_ranks(2, t);
    assert_int_equal(groups_left(), 0);
}

/* Regression: finish waited at most 60 s for the transport to let go of
 * the chunks it sent, whatever timeout the transport was configured with
 * (a run configured for 5 min failed after 60 s; one for 1 s hung for 60).
 * With timeout_ms < 0 the wait is now the transport's own timeout. */
static void test_settle_follows_transport_timeout(void **state) {
    (void)state;
    const int timeouts[3] = {0 /* the default */, 300, 300000};
    const int want[3] = {10000, 300, 300000};
    for (int i = 0; i < 3; i++) {
        pp_transport_options o;
        pp_transport_options_init(&o);
        o.timeout_ms = timeouts[i];
        pp_transport *t[2];
        tt_make_ranks("inproc", 2, &o, t);
        assert_int_equal(pp_transport_timeout_ms(t[0]), want[i]);
        pp_grad_ring_options ro = {t[0], 2, 0, 1, 16 << 10, 256 << 10, 0, 0};
        pp_grad_ring *g;
        TT_OK(pp_grad_ring_new(&ro, &g));
        assert_int_equal(pp_grad_ring_settle_ms(g, -1), want[i]);
        assert_int_equal(pp_grad_ring_settle_ms(g, 1234), 1234); /* an explicit one stands */
        pp_grad_ring_free(g);
        tt_close_ranks(2, t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_inproc),
        cmocka_unit_test(test_ring_socket),
        cmocka_unit_test(test_ring_shm),
        cmocka_unit_test(test_shm_collective_same_bits),
        cmocka_unit_test(test_shm_collective_refused_without_shm),
        cmocka_unit_test(test_shm_collective_peer_gone),
        cmocka_unit_test(test_shm_collective_peer_silent),
        cmocka_unit_test(test_shm_collective_refuses_other_layout),
        cmocka_unit_test(test_settle_follows_transport_timeout),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
