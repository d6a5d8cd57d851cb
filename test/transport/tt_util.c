/* Shared helpers for the transport tests. */
#include "tt_util.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void tt_assert_mentions(const char *msg, ...) {
    va_list ap;
    va_start(ap, msg);
    const char *want;
    while ((want = va_arg(ap, const char *)))
        if (!strstr(msg, want)) fail_msg("error message '%s' does not mention '%s'", msg, want);
    va_end(ap);
}

int64_t tt_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *tt_tmpdir(void) {
    static char dir[256];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/pippin-tt-XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(dir)) fail_msg("mkdtemp failed");
    return dir;
}

void tt_rmdir_all(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static atomic_int inproc_counter;
static char ipc_dir[256];

static void remove_ipc_dir(void) { tt_rmdir_all(ipc_dir); }

void tt_endpoint(const char *kind, int r, char *buf, size_t cap) {
    if (!strcmp(kind, "inproc")) {
        snprintf(buf, cap, "inproc://tt-%d-%d-%d", (int)getpid(), atomic_fetch_add(&inproc_counter, 1), r);
    } else if (!strcmp(kind, "ipc")) {
        if (!ipc_dir[0]) {
            snprintf(ipc_dir, sizeof ipc_dir, "%s", tt_tmpdir());
            atexit(remove_ipc_dir);
        }
        snprintf(buf, cap, "ipc://%s/r%d-%d", ipc_dir, atomic_fetch_add(&inproc_counter, 1), r);
    } else {
        snprintf(buf, cap, "tcp://127.0.0.1:*");
    }
}

void tt_make_ranks(const char *kind, int n, const pp_transport_options *tmpl, pp_transport **out) {
    char eps[8][256];
    const char *list[8];
    assert_true(n <= 8);
    for (int r = 0; r < n; r++) {
        pp_transport_options o = *tmpl;
        for (int k = 0; k < n; k++) list[k] = NULL;
        tt_endpoint(kind, r, eps[r], sizeof eps[r]);
        list[r] = eps[r];
        o.rank = r;
        o.nranks = n;
        o.endpoints = list;
        TT_OK(pp_transport_create(&o, &out[r]));
    }
    for (int r = 0; r < n; r++)
        for (int k = 0; k < n; k++)
            if (k != r) TT_OK(pp_transport_connect_peer(out[r], k, pp_transport_endpoint(out[k])));
    tt_handshake(n, out);
}

void tt_make_pair_reached_at(pp_transport_options o[2], const char *listed1, const char *bind1, const char *reach1,
                             pp_transport **t) {
    const char *list0[2] = {"tcp://127.0.0.1:*", NULL}, *list1[2] = {NULL, listed1};
    o[0].rank = 0, o[0].nranks = 2, o[0].endpoints = list0;
    o[1].rank = 1, o[1].nranks = 2, o[1].endpoints = list1;
    o[1].bind_endpoint = bind1;
    TT_OK(pp_transport_create(&o[0], &t[0]));
    TT_OK(pp_transport_create(&o[1], &t[1]));
    char at[256];
    snprintf(at, sizeof at, "tcp://%s:%s", reach1, strrchr(pp_transport_endpoint(t[1]), ':') + 1);
    TT_OK(pp_transport_connect_peer(t[0], 1, at));
    TT_OK(pp_transport_connect_peer(t[1], 0, pp_transport_endpoint(t[0])));
    tt_handshake(2, t);
    o[0].endpoints = o[1].endpoints = NULL; /* the lists were this call's */
}

void tt_handshake(int n, pp_transport **t) {
    int64_t deadline = tt_now_ms() + 5000;
    for (;;) {
        int ready = 1;
        for (int r = 0; r < n; r++) {
            TT_OK(pp_transport_poll(t[r], 0));
            for (int k = 0; k < n; k++)
                if (k != r && !pp_transport_peer_ready(t[r], k)) ready = 0;
        }
        if (ready) return;
        if (tt_now_ms() > deadline) fail_msg("the ranks did not complete their hello handshakes in 5 s");
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
}

void tt_close_ranks(int n, pp_transport **t) {
    for (int r = 0; r < n; r++) {
        pp_transport_close(t[r]);
        t[r] = NULL;
    }
}

pp_tensor *tt_f32_seq(int ndim, const int64_t *shape, float base) {
    pp_tensor *t;
    if (pp_tensor_empty(PP_F32, ndim, shape, &t) != PP_OK) fail_msg("%s", pp_last_error());
    float *d = t->data;
    int64_t n = pp_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) d[i] = base + (float)(i % 100003);
    return t;
}

void tt_assert_same(const pp_tensor *got, const pp_tensor *want) {
    assert_non_null(got);
    assert_int_equal(got->dtype, want->dtype);
    assert_int_equal(got->ndim, want->ndim);
    for (int i = 0; i < want->ndim; i++) assert_int_equal(got->shape[i], want->shape[i]);
    assert_int_equal(got->nbytes, want->nbytes);
    if (want->nbytes) assert_memory_equal(got->data, want->data, want->nbytes);
}

pp_transport_key tt_key(pp_msg_kind kind, int64_t step, int mb, int src, int dst, const char *name) {
    pp_transport_key k = {kind, step, mb, src, dst, name};
    return k;
}
