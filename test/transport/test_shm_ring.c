/* Shared-memory rings: reserve/commit on one side, locate/release on the
 * other, wrapping, full rings, hostile positions, bad objects, clean-up. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "doorbell.h"
#include "shm_ring.h"
#include "tt_util.h"

#include "test_filter.h"
#define MIB ((size_t)1 << 20)

static int name_exists(const char *name) {
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

static void test_host_id(void **state) {
    (void)state;
    char a[256], b[256];
    pp_shm_host_id(a, sizeof a);
    pp_shm_host_id(b, sizeof b);
    assert_true(a[0] != 0); /* Linux with /proc */
    assert_string_equal(a, b);
    for (const char *p = a; *p; p++) assert_true(*p > 0x20 && *p < 0x7f);
    /* the ring format is part of it: a build whose rings differ uses sockets */
    assert_true(strlen(a) > 3 && strcmp(a + strlen(a) - 3, "/R3") == 0);
    char tiny[8];
    pp_shm_host_id(tiny, sizeof tiny); /* does not fit: empty, never truncated */
    assert_string_equal(tiny, "");
}

/* Writes TEXT to /proc/self/FILE; 0 on success. */
static int write_proc_self(const char *file, const char *text) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/%s", file);
    int fd = open(path, O_WRONLY);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

enum { NS_USER, NS_NET_MOUNT, NS_PRIVATE_SHM };

/* The host id a child computes after entering new namespaces (how): "" with
 * *skipped = 1 where the kernel or our privileges refuse them. */
static void host_id_in_child(int how, char *out, size_t cap, int *skipped) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        char id[256] = "";
        int ok = 0;
        if (how == NS_USER) {
            /* the same euid inside as outside (mapped onto itself): only the
             * namespace differs */
            char map[64];
            unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
            if (unshare(CLONE_NEWUSER) == 0) {
                (void)write_proc_self("setgroups", "deny");
                snprintf(map, sizeof map, "%u %u 1\n", uid, uid);
                ok = write_proc_self("uid_map", map) == 0;
                snprintf(map, sizeof map, "%u %u 1\n", gid, gid);
                ok = ok && write_proc_self("gid_map", map) == 0 && geteuid() == uid;
            }
        } else if (unshare(CLONE_NEWNS | CLONE_NEWNET) == 0 &&
                   mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0) {
            /* what `ip netns exec` does; then, for NS_PRIVATE_SHM, what a
             * container with a /dev/shm of its own does */
            ok = how == NS_NET_MOUNT || mount("pippin-test-shm", "/dev/shm", "tmpfs", 0, "size=1m") == 0;
        }
        if (ok) pp_shm_host_id(id, sizeof id);
        else snprintf(id, sizeof id, "SKIP %s", strerror(errno));
        ssize_t w = write(fds[1], id, strlen(id) + 1);
        _exit(w > 0 ? 0 : 1);
    }
    close(fds[1]);
    char buf[300];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof buf - 1 && (n = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)n;
    buf[got] = 0;
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    *skipped = strncmp(buf, "SKIP", 4) == 0;
    if (*skipped) printf("# host id in new namespaces (%d): cannot make them: %s\n", how, buf + 5);
    snprintf(out, cap, "%s", buf);
}

/* Two processes with the same host id must be able to open each other's
 * rings. Root of another user namespace has the same euid but cannot open a
 * ring of root's (0600, another uid outside): the id used to be the same. */
static void test_host_id_user_namespace(void **state) {
    (void)state;
    char mine[256], child[300];
    int skipped;
    pp_shm_host_id(mine, sizeof mine);
    host_id_in_child(NS_USER, child, sizeof child, &skipped);
    if (skipped) skip();
    assert_true(child[0] != 0);
    assert_string_not_equal(mine, child);
}

/* A network namespace (with the mount namespace `ip netns exec` adds) still
 * shares /dev/shm: the same id, so the rings are used. A private tmpfs on
 * /dev/shm does not: another id. */
static void test_host_id_mount_namespace(void **state) {
    (void)state;
    char mine[256], child[300];
    int skipped;
    pp_shm_host_id(mine, sizeof mine);
    host_id_in_child(NS_NET_MOUNT, child, sizeof child, &skipped);
    if (skipped) skip();
    assert_string_equal(mine, child);
    host_id_in_child(NS_PRIVATE_SHM, child, sizeof child, &skipped);
    if (skipped) skip();
    assert_true(child[0] != 0);
    assert_string_not_equal(mine, child);
}

static void test_write_read_wrap(void **state) {
    (void)state;
    pp_shm_ring *tx, *rx;
    TT_OK(pp_shm_ring_create(MIB, &tx));
    assert_int_equal(pp_shm_ring_bytes(tx), MIB);
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    assert_false(name_exists(pp_shm_ring_name(tx))); /* the receiver unlinked it */
    assert_true(pp_shm_ring_drained(tx));

    /* 400 KiB records: two fit, the third waits for the first to be released,
     * then skips the 224 KiB left at the end and starts at offset 0 */
    size_t n = 400 << 10;
    uint64_t pos[4];
    void *dst;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pp_shm_ring_reserve(tx, n, &pos[i], &dst), 1);
        memset(dst, 'a' + i, n);
        pp_shm_ring_commit(tx, pos[i], n);
    }
    assert_int_equal(pos[0], 0);
    assert_int_equal(pos[1], n);
    assert_int_equal(pp_shm_ring_reserve(tx, n, &pos[2], &dst), 0); /* full */
    assert_false(pp_shm_ring_drained(tx));

    const void *src;
    TT_OK(pp_shm_ring_locate(rx, pos[0], n, &src));
    assert_int_equal(((const char *)src)[n - 1], 'a');
    pp_shm_ring_release(rx, pos[0] + n);
    assert_int_equal(pp_shm_ring_reserve(tx, n, &pos[2], &dst), 1);
    assert_int_equal(pos[2], MIB); /* wrapped: offset 0 of the second lap */
    memset(dst, 'c', n);
    pp_shm_ring_commit(tx, pos[2], n);

    TT_OK(pp_shm_ring_locate(rx, pos[1], n, &src));
    assert_int_equal(((const char *)src)[0], 'b');
    TT_OK(pp_shm_ring_locate(rx, pos[2], n, &src));
    assert_int_equal(((const char *)src)[n - 1], 'c');
    pp_shm_ring_release(rx, pos[2] + n);
    assert_true(pp_shm_ring_drained(tx));

    /* too big for the ring at all */
    assert_int_equal(pp_shm_ring_reserve(tx, MIB + 1, &pos[3], &dst), 0);
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
}

/* Positions a hostile or broken sender could name are refused. */
static void test_locate_refuses(void **state) {
    (void)state;
    pp_shm_ring *tx, *rx;
    TT_OK(pp_shm_ring_create(MIB, &tx));
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    const void *src;
    /* nothing written: its pages are not even allocated, and never read */
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, 0, 10, &src), "past what its sender allocated");
    uint64_t pos;
    void *dst;
    assert_int_equal(pp_shm_ring_reserve(tx, MIB, &pos, &dst), 1); /* allocates it all */
    pp_shm_ring_commit(tx, pos, MIB);
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, 0, 0, &src), "0 bytes");
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, 0, MIB + 1, &src), "in a ring of");
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, MIB, 10, &src), "more than a lap");
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, UINT64_MAX - 4, 10, &src), "bytes");
    pp_shm_ring_release(rx, 4096);
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, MIB - 10, 20, &src), "straddles");
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, 0, 10, &src), "before the consumed mark");
    TT_OK(pp_shm_ring_locate(rx, 4096, MIB - 4096, &src));
    pp_shm_ring_release(rx, 100); /* going backwards is ignored */
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, 200, 10, &src), "before the consumed mark");
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
}

/* A receiver that releases nonsense makes the sender stop using the ring
 * (it falls back to the socket) rather than overwrite unread data. */
static void test_bogus_release(void **state) {
    (void)state;
    pp_shm_ring *tx, *rx;
    TT_OK(pp_shm_ring_create(MIB, &tx));
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    pp_shm_ring_release(rx, 10 * MIB);
    uint64_t pos;
    void *dst;
    assert_int_equal(pp_shm_ring_reserve(tx, 100, &pos, &dst), 0);
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
}

static void test_open_errors(void **state) {
    (void)state;
    pp_shm_ring *r;
    /* names a peer may send: only pippin's own kind */
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open("/etc-passwd", &r), "not a pippin shared-memory ring name");
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open("/pippin-a/b", &r), "not a pippin");
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open("/pippin-", &r), "not a pippin");
    assert_true(pp_shm_ring_name_ok("/pippin-123-4"));
    TT_FAILS(PP_ERR_IO, pp_shm_ring_open("/pippin-does-not-exist-42", &r), "/pippin-does-not-exist-42",
             "another host");
    /* an object that is not a ring */
    char name[64];
    snprintf(name, sizeof name, "/pippin-test-%ld", (long)getpid());
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(posix_fallocate(fd, 0, 3 * 4096), 0);
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open(name, &r), "bad header");
    assert_int_equal(ftruncate(fd, 100), 0);
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open(name, &r), "100 bytes");
    close(fd);
    shm_unlink(name);
    TT_FAILS(PP_ERR_INVALID, pp_shm_ring_create(0, &r), "0 bytes");
}

/* A shared object with a ring's header, of size bytes, allocated or sparse,
 * whose header says `claims` data bytes are allocated (-1: no header at
 * all, a hole). */
static const char *fake_magic = "pippinR3";

static void fake_ring(const char *name, size_t size, int allocate, long long claims) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(allocate ? posix_fallocate(fd, 0, (off_t)size) : ftruncate(fd, (off_t)size), 0);
    uint64_t hdr[19] = {0, size - 4096, 4096}; /* the allocated mark is at byte 144 */
    memcpy(hdr, fake_magic, 8);
    hdr[18] = claims < 0 ? 0 : (uint64_t)claims;
    if (claims >= 0) assert_int_equal(pwrite(fd, hdr, sizeof hdr, 0), (ssize_t)sizeof hdr);
    close(fd);
}

/* A peer's object that could fault later is refused up front: a data size
 * that is not whole pages (records could end past the mapping), a header
 * that is a hole, or fewer pages than its header says are allocated
 * (SIGBUS on first touch once /dev/shm is full). */
static void test_open_refuses_odd_objects(void **state) {
    (void)state;
    pp_shm_ring *r;
    char name[64];
    snprintf(name, sizeof name, "/pippin-test-odd-%ld", (long)getpid());
    fake_ring(name, 4096 + 4095, 1, 0);
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open(name, &r), "8191 bytes");
    shm_unlink(name);
    fake_ring(name, 4096 + MIB, 0, (long long)MIB);
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open(name, &r), "fewer pages allocated than its header says");
    shm_unlink(name);
    fake_ring(name, 4096 + MIB, 0, -1); /* read, not mapped: no page is allocated for it */
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open(name, &r), "bad header");
    shm_unlink(name);
    fake_ring(name, 4096 + MIB, 0, (long long)MIB + 1);
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open(name, &r), "bad header");
    shm_unlink(name);
    fake_ring(name, 4096 + MIB, 0, 0); /* as pp_shm_ring_create makes it: header only */
    TT_OK(pp_shm_ring_open(name, &r));
    assert_false(name_exists(name));
    pp_shm_ring_close(r);
    fake_ring(name, 4096 + MIB, 1, (long long)MIB); /* all allocated */
    TT_OK(pp_shm_ring_open(name, &r));
    pp_shm_ring_close(r);
    const char *older[2] = {"pippinR1", "pippinR2"}; /* their laps or pages are read otherwise */
    for (int i = 0; i < 2; i++) {
        fake_magic = older[i];
        fake_ring(name, 4096 + MIB, 1, 0);
        TT_FAILS(PP_ERR_PARSE, pp_shm_ring_open(name, &r), "bad header");
        shm_unlink(name);
    }
    fake_magic = "pippinR3";
}

/* The sender unlinks a ring nobody opened; nothing is left behind. */
static void test_close_unlinks(void **state) {
    (void)state;
    pp_shm_ring *tx;
    TT_OK(pp_shm_ring_create(MIB, &tx));
    char name[64];
    snprintf(name, sizeof name, "%s", pp_shm_ring_name(tx));
    assert_true(name_exists(name));
    pp_shm_ring_close(tx);
    assert_false(name_exists(name));
    pp_shm_ring_close(NULL);
}

/* Tensors lent out of the ring in place: the sender gets space back only
 * up to the oldest tensor still alive, whatever order they are freed in,
 * and the mapping outlives the ring's close. */
static void test_lend(void **state) {
    (void)state;
    pp_shm_ring *tx, *rx;
    TT_OK(pp_shm_ring_create(MIB, &tx));
    pp_shm_ring_set_align(tx, 64);
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    uint64_t pos[3];
    void *dst;
    int64_t shape[1] = {100};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pp_shm_ring_reserve(tx, 400, &pos[i], &dst), 1);
        assert_int_equal(pos[i] % 64, 0);
        memset(dst, 'a' + i, 400);
        pp_shm_ring_commit(tx, pos[i], 400);
    }
    pp_tensor *t0, *t1;
    TT_OK(pp_shm_ring_lend(rx, pos[0], 400, PP_F32, 1, shape, &t0));
    TT_OK(pp_shm_ring_lend(rx, pos[1], 400, PP_F32, 1, shape, &t1));
    assert_int_equal(((char *)t1->data)[399], 'b');
    pp_shm_ring_release(rx, pos[2] + 400); /* the third was copied and is done */
    assert_false(pp_shm_ring_drained(tx));
    pp_tensor_free(t1); /* out of order: t0 still holds everything after it */
    assert_false(pp_shm_ring_drained(tx));
    pp_tensor_free(t0);
    assert_true(pp_shm_ring_drained(tx));
    /* a loan outlives the receiver's close */
    assert_int_equal(pp_shm_ring_reserve(tx, 400, &pos[0], &dst), 1);
    memset(dst, 'z', 400);
    pp_shm_ring_commit(tx, pos[0], 400);
    TT_OK(pp_shm_ring_lend(rx, pos[0], 400, PP_F32, 1, shape, &t0));
    pp_shm_ring_release(rx, pos[0] + 400); /* processed; the loan still holds it */
    assert_false(pp_shm_ring_drained(tx));
    pp_shm_ring_close(rx);
    assert_int_equal(((char *)t0->data)[0], 'z');
    pp_tensor_free(t0);
    assert_true(pp_shm_ring_drained(tx));
    pp_shm_ring_close(tx);
    /* an unaligned record is not lent (the caller copies) */
    TT_OK(pp_shm_ring_create(MIB, &tx));
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    assert_int_equal(pp_shm_ring_reserve(tx, 3, &pos[0], &dst), 1);
    pp_shm_ring_commit(tx, pos[0], 3);
    assert_int_equal(pp_shm_ring_reserve(tx, 400, &pos[1], &dst), 1);
    pp_shm_ring_commit(tx, pos[1], 400);
    assert_int_equal(pos[1], 3);
    TT_FAILS(PP_ERR_UNSUPPORTED, pp_shm_ring_lend(rx, pos[1], 400, PP_F32, 1, shape, &t0), "aligned");
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
}

/* Message records: in order, wrapping with skip marks, the waiting flag
 * reported to the sender, nonsense in the ring detected. */
static void test_msg_records(void **state) {
    (void)state;
    pp_shm_ring *tx, *rx;
    TT_OK(pp_shm_ring_create(MIB, &tx));
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    const void *data;
    size_t len;
    uint64_t end, pos;
    void *dst;
    assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 0);
    /* records of 1..3000 bytes, read as they come: several laps */
    unsigned seen = 0;
    for (unsigned i = 1; i <= 3000; i++) {
        size_t n = 1 + (i * 7919u) % 3000;
        assert_int_equal(pp_shm_ring_msg_reserve(tx, n, &pos, &dst), 1);
        memset(dst, (int)(i & 0xff), n);
        assert_int_equal(pp_shm_ring_msg_commit(tx, pos, n), 0); /* nobody waiting */
        if (i % 3 == 0) /* the receiver lags a little */
            while (pp_shm_ring_msg_next(rx, &data, &len, &end) == 1) {
                seen++;
                assert_int_equal(len, 1 + (seen * 7919u) % 3000);
                assert_int_equal(((const unsigned char *)data)[len - 1], seen & 0xff);
                pp_shm_ring_release(rx, end);
            }
    }
    assert_int_equal(seen, 3000);
    /* a full ring refuses, never overwrites */
    unsigned fit = 0;
    while (pp_shm_ring_msg_reserve(tx, 60000, &pos, &dst) == 1) {
        pp_shm_ring_msg_commit(tx, pos, 60000);
        fit++;
    }
    assert_true(fit >= 15 && fit <= 17);
    while (pp_shm_ring_msg_next(rx, &data, &len, &end) == 1) pp_shm_ring_release(rx, end);
    /* the waiting flag reaches the sender */
    pp_shm_ring_set_waiting(rx, 1);
    assert_int_equal(pp_shm_ring_msg_reserve(tx, 10, &pos, &dst), 1);
    assert_int_equal(pp_shm_ring_msg_commit(tx, pos, 10), 1);
    pp_shm_ring_set_waiting(rx, 0);
    assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 1);
    /* a record header that cannot be valid makes the ring unusable */
    pp_shm_ring_release(rx, end);
    assert_int_equal(pp_shm_ring_msg_reserve(tx, 10, &pos, &dst), 1);
    uint32_t bogus = 5000000; /* longer than the ring */
    memcpy((char *)dst - 8, &bogus, sizeof bogus);
    pp_shm_ring_msg_commit(tx, pos, 10);
    assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), -1);
    tt_assert_mentions(pp_last_error(), "does not fit", NULL);
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
}

/* This process's shared pages in its page tables (RssShmem), in KiB. */
static long rss_shmem_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssShmem: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* A ring costs the pages its traffic in flight touches, not its size: it
 * is mapped without prefaulting (4 MiB message rings to each peer,
 * prefaulted by sender and receiver, were 0.45x of the medium GPT's file
 * in a worker's peak RSS), and a sender whose receiver has consumed
 * everything goes back to offset 0, so a receiver that keeps up keeps the
 * sender on the first pages; going back costs no room (regression,
 * issue 14). */
static void test_pages_follow_use(void **state) {
    (void)state;
    long before = rss_shmem_kib();
    if (before < 0) skip(); /* no RssShmem line (an old kernel) */
    pp_shm_ring *tx, *rx;
    TT_OK(pp_shm_ring_create(4 * MIB, &tx));
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    long mapped = rss_shmem_kib() - before;
    print_message("# 4 MiB ring, sender and receiver mapped: %ld KiB in RSS\n", mapped);
    assert_true(mapped <= 64); /* the header pages at most; was 8 MiB */

    /* message records of 6000 bytes, each read before the next: every one
     * after the first lands at offset 0 again */
    const void *data;
    size_t len;
    uint64_t end, pos;
    void *dst;
    for (unsigned i = 0; i < 2000; i++) {
        assert_int_equal(pp_shm_ring_msg_reserve(tx, 6000, &pos, &dst), 1);
        if (i) assert_int_equal(pos % (4 * MIB), 0);
        memset(dst, (int)(i & 0xff), 6000);
        pp_shm_ring_msg_commit(tx, pos, 6000);
        assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 1);
        assert_int_equal(len, 6000);
        assert_int_equal(((const unsigned char *)data)[5999], i & 0xff);
        pp_shm_ring_release(rx, end);
    }
    long used = rss_shmem_kib() - before;
    print_message("# after 2000 records of 6000 bytes (12 MB, 3 laps' worth) read as sent: %ld KiB in RSS\n",
                  used);
    assert_true(used <= 256); /* a few pages on each side; was 8 MiB */
    /* a receiver that lags: the sender goes on after the unread records,
     * and the lap it left at offset 6008 costs no room: the whole ring
     * holds unread records (4 MiB / 60008 bytes: 69 of them) */
    uint64_t first = 0;
    unsigned fit = 0;
    while (pp_shm_ring_msg_reserve(tx, 60000, &pos, &dst) == 1) {
        if (!fit) first = pos;
        memset(dst, (int)(fit & 0xff), 60000);
        pp_shm_ring_msg_commit(tx, pos, 60000);
        assert_int_equal(pos, first + (uint64_t)fit * 60008);
        fit++;
    }
    assert_int_equal(first % (4 * MIB), 0);
    assert_int_equal(fit, 4 * MIB / 60008);
    for (unsigned i = 0; i < fit; i++) {
        assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 1);
        assert_int_equal(len, 60000);
        assert_int_equal(((const unsigned char *)data)[59999], i & 0xff);
        pp_shm_ring_release(rx, end);
    }
    assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 0);
    /* then back to offset 0: drained */
    assert_int_equal(pp_shm_ring_msg_reserve(tx, 6000, &pos, &dst), 1);
    assert_int_equal(pos % (4 * MIB), 0);
    pp_shm_ring_msg_commit(tx, pos, 6000);
    assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 1);
    pp_shm_ring_release(rx, end);
    used = rss_shmem_kib() - before;
    print_message("# then a full ring: %ld KiB in RSS\n", used);
    assert_true(used >= 4 * 1024); /* the full ring was touched, by both sides */
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);

    /* a tensor ring likewise, each tensor freed before the next is sent */
    TT_OK(pp_shm_ring_create(4 * MIB, &tx));
    pp_shm_ring_set_align(tx, 64);
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    size_t n = 400 << 10;
    for (int i = 0; i < 100; i++) {
        uint64_t q;
        assert_int_equal(pp_shm_ring_reserve(tx, n, &q, &dst), 1);
        assert_int_equal(q % (4 * MIB), 0);
        memset(dst, 'a' + i % 26, n);
        pp_shm_ring_commit(tx, q, n);
        const void *src;
        TT_OK(pp_shm_ring_locate(rx, q, n, &src));
        assert_int_equal(((const char *)src)[n - 1], 'a' + i % 26);
        pp_shm_ring_release(rx, q + n);
    }
    /* two in flight, then a gap the receiver skips: the ring's room is
     * whole (three 1.3 MiB records, each the first of a new lap's room) */
    uint64_t q[3];
    size_t big = 1300 << 10;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pp_shm_ring_reserve(tx, big, &q[i], &dst), 1);
        pp_shm_ring_commit(tx, q[i], big);
    }
    assert_int_equal(q[0] % (4 * MIB), 0);
    assert_int_equal(q[2], q[0] + 2 * big);
    for (int i = 0; i < 3; i++) {
        const void *src;
        TT_OK(pp_shm_ring_locate(rx, q[i], big, &src));
        pp_shm_ring_release(rx, q[i] + big);
    }
    assert_true(pp_shm_ring_drained(tx));
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
}

/* Bytes the shared object behind fd holds in /dev/shm (what a memory
 * cgroup is charged for the ring), whatever is mapped. */
static long long shm_allocated(int fd) {
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    return (long long)st.st_blocks * 512;
}

/* A ring's /dev/shm pages are allocated as the sender first writes them,
 * in 256 KiB steps: a fresh ring holds its header page alone, one whose
 * receiver keeps up a step, and a lagging receiver makes it grow with the
 * traffic, across the ring's wrap-around, up to its size (issue 14: the
 * 4 MiB message rings to each peer were allocated whole at creation). */
static void test_pages_allocated_on_demand(void **state) {
    (void)state;
    const long long step = 256 << 10;
    pp_shm_ring *tx, *rx;
    TT_OK(pp_shm_ring_create(4 * MIB, &tx));
    int fd = shm_open(pp_shm_ring_name(tx), O_RDONLY, 0); /* stays valid once the receiver unlinks it */
    assert_true(fd >= 0);
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    print_message("# 4 MiB message ring, created and opened: %lld KiB in /dev/shm\n", shm_allocated(fd) >> 10);
    assert_int_equal(shm_allocated(fd), 4096); /* the header: was 4 MiB + 4 KiB */
    const void *data;
    size_t len;
    uint64_t end, pos;
    void *dst;
    for (unsigned i = 0; i < 2000; i++) { /* 12 MB of 6000-byte records, each read before the next */
        assert_int_equal(pp_shm_ring_msg_reserve(tx, 6000, &pos, &dst), 1);
        memset(dst, (int)(i & 0xff), 6000);
        pp_shm_ring_msg_commit(tx, pos, 6000);
        assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 1);
        assert_int_equal(((const unsigned char *)data)[5999], i & 0xff);
        pp_shm_ring_release(rx, end);
    }
    print_message("# after 12 MB read as sent: %lld KiB\n", shm_allocated(fd) >> 10);
    assert_int_equal(shm_allocated(fd), 4096 + step);
    /* a receiver three records of 100000 bytes behind: the sender walks the
     * ring, allocating a step at a time, then wraps around into pages it
     * has; every record reads back as written */
    long long last = shm_allocated(fd);
    int grew = 0;
    unsigned sent = 0, got = 0;
    for (int lap = 0; lap < 3 * 4 * 42; lap++) { /* about twelve laps */
        assert_int_equal(pp_shm_ring_msg_reserve(tx, 100000, &pos, &dst), 1);
        memset(dst, (int)(sent & 0xff), 100000);
        pp_shm_ring_msg_commit(tx, pos, 100000);
        sent++;
        long long now = shm_allocated(fd);
        assert_true(now >= last && now <= 4096 + 4 * (long long)MIB);
        grew += now > last;
        last = now;
        while (sent - got > 3) {
            assert_int_equal(pp_shm_ring_msg_next(rx, &data, &len, &end), 1);
            assert_int_equal(len, 100000);
            assert_int_equal(((const unsigned char *)data)[0], got & 0xff);
            assert_int_equal(((const unsigned char *)data)[99999], got & 0xff);
            pp_shm_ring_release(rx, end);
            got++;
        }
    }
    print_message("# after %u records of 100000 bytes, three in flight: %lld KiB, grown %d times\n", sent,
                  last >> 10, grew);
    assert_true(last <= 4096 + 4 * (long long)MIB);
    assert_true(last >= 4096 + 4 * (long long)MIB - step); /* the whole lap walked */
    assert_true(grew >= 10);
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
    close(fd);

    /* a tensor ring: the first tensor allocates what it covers (a
     * tensor ring has no skip marks after it), not the ring */
    TT_OK(pp_shm_ring_create(64 * MIB, &tx));
    pp_shm_ring_set_align(tx, 64);
    fd = shm_open(pp_shm_ring_name(tx), O_RDONLY, 0);
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    assert_int_equal(pp_shm_ring_reserve(tx, MIB, &pos, &dst), 1);
    memset(dst, 'x', MIB);
    pp_shm_ring_commit(tx, pos, MIB);
    assert_int_equal(shm_allocated(fd), 4096 + (long long)MIB);
    const void *src;
    TT_OK(pp_shm_ring_locate(rx, pos, MIB, &src));
    assert_int_equal(((const char *)src)[MIB - 1], 'x');
    pp_shm_ring_release(rx, pos + MIB);
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
    close(fd);
}

static int hook_off(void **state) {
    (void)state;
    pp_shm_ring_fail_alloc_after(-1); /* whether the test got that far or not */
    return 0;
}

/* No pages left in /dev/shm (simulated): creating a ring fails, and a
 * reservation that needs new pages says so (-1) and changes nothing, so the
 * transport sends over the socket; once there is room again the ring goes
 * on where it was, and what was written before reads back. */
static void test_alloc_failure(void **state) {
    (void)state;
    pp_shm_ring *tx, *rx;
    assert_int_equal(pp_shm_ring_fail_alloc_after(0), -1);
    TT_FAILS(PP_ERR_NOMEM, pp_shm_ring_create(MIB, &tx), "cannot allocate its header", "No space left");
    assert_int_equal(pp_shm_ring_fail_alloc_after(-1), 0);
    TT_OK(pp_shm_ring_create(MIB, &tx));
    pp_shm_ring_set_align(tx, 64);
    TT_OK(pp_shm_ring_open(pp_shm_ring_name(tx), &rx));
    uint64_t pos[3];
    void *dst;
    size_t n = 200 << 10;
    assert_int_equal(pp_shm_ring_reserve(tx, n, &pos[0], &dst), 1); /* allocates 256 KiB */
    memset(dst, 'a', n);
    pp_shm_ring_commit(tx, pos[0], n);
    pp_shm_ring_fail_alloc_after(0);
    assert_int_equal(pp_shm_ring_reserve(tx, 1000, &pos[1], &dst), 1); /* within the pages it has */
    memset(dst, 'b', 1000);
    pp_shm_ring_commit(tx, pos[1], 1000);
    uint64_t at;
    assert_int_equal(pp_shm_ring_reserve(tx, n, &at, &dst), -1); /* needs the next step */
    tt_assert_mentions(pp_last_error(), pp_shm_ring_name(tx), "cannot allocate", "/dev/shm", NULL);
    const void *src;
    TT_FAILS(PP_ERR_PARSE, pp_shm_ring_locate(rx, 256 << 10, 10, &src), "past what its sender allocated");
    /* a message ring likewise */
    pp_shm_ring *mtx;
    pp_shm_ring_fail_alloc_after(1); /* its header, then no more */
    TT_OK(pp_shm_ring_create(MIB, &mtx));
    assert_int_equal(pp_shm_ring_msg_reserve(mtx, 10, &at, &dst), -1);
    pp_shm_ring_close(mtx);
    /* room again: the next reservation starts where the failed one would
     * have, and both earlier records are intact */
    assert_int_equal(pp_shm_ring_fail_alloc_after(-1), 0);
    assert_int_equal(pp_shm_ring_reserve(tx, n, &pos[2], &dst), 1);
    assert_int_equal(pos[2], (pos[1] + 1000 + 63) / 64 * 64);
    memset(dst, 'c', n);
    pp_shm_ring_commit(tx, pos[2], n);
    const char want[3] = {'a', 'b', 'c'};
    size_t len[3] = {n, 1000, n};
    for (int i = 0; i < 3; i++) {
        TT_OK(pp_shm_ring_locate(rx, pos[i], len[i], &src));
        assert_int_equal(((const char *)src)[len[i] - 1], want[i]);
        pp_shm_ring_release(rx, pos[i] + len[i]);
    }
    assert_true(pp_shm_ring_drained(tx));
    pp_shm_ring_close(rx);
    pp_shm_ring_close(tx);
}

static int readable(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
}

static void test_doorbell(void **state) {
    (void)state;
    pp_doorbell *b;
    TT_OK(pp_doorbell_create(&b));
    assert_true(pp_doorbell_path_ok(pp_doorbell_path(b)));
    int fd = pp_doorbell_open_peer(pp_doorbell_path(b));
    assert_true(fd >= 0);
    assert_false(readable(pp_doorbell_fd(b)));
    for (int i = 0; i < 100000; i++) pp_doorbell_ring(fd); /* more than a FIFO holds: never blocks */
    assert_true(readable(pp_doorbell_fd(b)));
    pp_doorbell_clear(b);
    assert_false(readable(pp_doorbell_fd(b)));
    char path[128];
    snprintf(path, sizeof path, "%s", pp_doorbell_path(b));
    pp_doorbell_close(b);
    /* the peer died (no reader left): ringing must not raise SIGPIPE, which
     * would end this process (regression: a worker died silently when its
     * peer was killed), nor leave one pending */
    pp_doorbell_ring(fd);
    pp_doorbell_ring(fd);
    sigset_t pending;
    assert_int_equal(sigpending(&pending), 0);
    assert_false(sigismember(&pending, SIGPIPE));
    close(fd);
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0); /* removed */
    /* names a peer may send */
    assert_false(pp_doorbell_path_ok("/etc/passwd"));
    assert_false(pp_doorbell_path_ok("/dev/shm/pippin-bell-../x"));
    assert_false(pp_doorbell_path_ok("/dev/shm/pippin-bell-"));
    assert_int_equal(pp_doorbell_open_peer("/dev/shm/pippin-bell-1-999999"), -1);
    /* a regular file under a doorbell's name is not a doorbell */
    snprintf(path, sizeof path, "/dev/shm/pippin-bell-%ld-77777", (long)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(pp_doorbell_open_peer(path), -1);
    unlink(path);
}

/* Rings and doorbells of a process that died are removed; those of live
 * processes are not, nor those of another PID namespace (a pid there means
 * nothing here: containers sharing /dev/shm). */
static void test_sweep_stale(void **state) {
    (void)state;
    pid_t child = fork();
    if (child == 0) _exit(0);
    assert_true(child > 0);
    waitpid(child, NULL, 0); /* dead now */
    char dead_ring[128], dead_bell[128], live_ring[128], other_ns[128];
    unsigned long long ns = pp_shm_pid_ns();
    snprintf(dead_ring, sizeof dead_ring, "/dev/shm/pippin-%llx-%ld-1", ns, (long)child);
    snprintf(dead_bell, sizeof dead_bell, "/dev/shm/pippin-bell-%llx-%ld-1", ns, (long)child);
    snprintf(live_ring, sizeof live_ring, "/dev/shm/pippin-%llx-%ld-1", ns, (long)getppid());
    snprintf(other_ns, sizeof other_ns, "/dev/shm/pippin-%llx-%ld-1", ns + 1, (long)child);
    const char *paths[4] = {dead_ring, dead_bell, live_ring, other_ns};
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(paths[i], "w");
        assert_non_null(f);
        fclose(f);
    }
    assert_true(pp_shm_sweep_stale() >= 2);
    struct stat st;
    assert_int_not_equal(stat(dead_ring, &st), 0);
    assert_int_not_equal(stat(dead_bell, &st), 0);
    assert_int_equal(stat(live_ring, &st), 0);
    assert_int_equal(stat(other_ns, &st), 0);
    unlink(live_ring);
    unlink(other_ns);
}

int main(void) {
    pp_log_set_level(PP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_id),
        cmocka_unit_test(test_host_id_user_namespace),
        cmocka_unit_test(test_host_id_mount_namespace),
        cmocka_unit_test(test_write_read_wrap),
        cmocka_unit_test(test_locate_refuses),
        cmocka_unit_test(test_bogus_release),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_open_refuses_odd_objects),
        cmocka_unit_test(test_close_unlinks),
        cmocka_unit_test(test_lend),
        cmocka_unit_test(test_msg_records),
        cmocka_unit_test(test_pages_follow_use),
        cmocka_unit_test(test_pages_allocated_on_demand),
        cmocka_unit_test_teardown(test_alloc_failure, hook_off),
        cmocka_unit_test(test_doorbell),
        cmocka_unit_test(test_sweep_stale),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
