/* Cores lent between the ranks of one host (pippin/exec.h,
 * pp_share_cores_join).
 *
 * Why: ranks on one host each get their share of the cores, but a
 * pipeline is rarely busy everywhere at once. At one request in flight,
 * or in a schedule's bubbles, one rank computes while the others wait for
 * its activations; with the cores split evenly the busy rank runs on its
 * share alone and the rest idle. Here a rank that waits lends its threads,
 * and a rank that computes borrows what is lent, one parallel loop (one
 * GEMM, one softmax) at a time, so a borrowed core goes back within one
 * kernel once its owner has work again.
 *
 * The ranks meet in a small shared-memory segment named from the run's
 * key: one slot per rank (its pid, the threads it lends while it waits,
 * the threads it has borrowed now). A claim takes the segment's lock with
 * a try-lock and borrows nothing when another rank holds it, so nothing
 * ever waits here, and a rank that dies holding the lock costs the others
 * their borrowing, never their progress (and a join that finds no other
 * rank alive drops it). A slot left by a rank that died is cleared when
 * any rank joins.
 *
 * Results never depend on it: every parallel kernel gives the same bits at
 * any thread count (lib/thread_pool.h). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pippin/exec.h"

#include "core_share.h"
#include "hash.h"
#include "log_internal.h"
#include "status_internal.h"
#include "thread_pool.h"

#define SHARE_MAGIC 0x32736370u /* "pcs2" */
#define SHARE_SLOTS 256

typedef struct share_slot {
    atomic_int pid;      /* 0: no rank here */
    atomic_int lent;     /* threads lent while this rank waits (0 while it computes) */
    atomic_int borrowed; /* threads borrowed by the call in flight */
    int pad;
} share_slot;

typedef struct share_segment {
    _Atomic uint32_t magic; /* 0 in a new segment (ftruncate fills zeros) */
    atomic_int lock;
    share_slot slot[SHARE_SLOTS];
    atomic_llong borrows; /* claims that took lent threads, ever: a spinning rank's sign to sleep instead */
} share_segment;

/* The process's join. `active` is written last on join and first on
 * leave, and read first by every call, so a kernel on another thread never
 * reads the other fields half-written. A mapping is never unmapped while
 * the process runs (a thread may have just read `seg`); a later join of
 * another segment keeps the old one mapped: a page per join. */
static struct {
    atomic_int active;
    share_segment *seg;
    char name[64];
    int me, n_slots, own, cap;
    _Atomic int64_t borrowed_calls;
} share;

void pp_share_cores_segment_name(const char *key, char *out, size_t cap) {
    uint64_t h = pp_hash64(PP_HASH64_SEED, key, strlen(key));
    uid_t uid = getuid();
    h = pp_hash64(h, &uid, sizeof uid);
    snprintf(out, cap, "/pippin-cores-%016llx", (unsigned long long)h);
}

/* A child forked from a joined process is not a rank of the host's
 * sharing (the slot is its parent's): it stops sharing and computes on
 * its own threads. */
static void after_fork_child(void) {
    if (!atomic_exchange(&share.active, 0)) return;
    pp_pool_reset_size(share.own);
}

static void install_atfork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* Opens (or makes) the segment: ours alone (this user's, mode 0600), so
 * no other user can make a run lend or borrow, or shrink it under us. */
static pp_status open_segment(const char *name, share_segment **out) {
    int fd = shm_open(name, O_CREAT | O_RDWR | O_NOFOLLOW, 0600);
    if (fd < 0) return pp_error(PP_ERR_IO, "sharing cores: shm_open %s: %s", name, strerror(errno));
    struct stat sb;
    pp_status s = PP_OK;
    if (fstat(fd, &sb) != 0) s = pp_error(PP_ERR_IO, "sharing cores: fstat %s: %s", name, strerror(errno));
    else if (sb.st_uid != geteuid() || (sb.st_mode & 077))
        s = pp_error(PP_ERR_INVALID, "sharing cores: %s belongs to uid %u with mode %03o, not to this user alone", name,
                     (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777));
    else if ((size_t)sb.st_size < sizeof(share_segment) && ftruncate(fd, sizeof(share_segment)) != 0)
        s = pp_error(PP_ERR_IO, "sharing cores: ftruncate %s: %s", name, strerror(errno));
    void *m = MAP_FAILED;
    if (s == PP_OK) {
        m = mmap(NULL, sizeof(share_segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) s = pp_error(PP_ERR_IO, "sharing cores: mmap %s: %s", name, strerror(errno));
    }
    close(fd);
    if (s != PP_OK) return s;
    share_segment *seg = m;
    uint32_t zero = 0;
    if (!atomic_compare_exchange_strong(&seg->magic, &zero, SHARE_MAGIC) && zero != SHARE_MAGIC) {
        munmap(m, sizeof(share_segment));
        return pp_error(PP_ERR_INVALID, "sharing cores: %s holds something else (magic %08x)", name, zero);
    }
    *out = seg;
    return PP_OK;
}

pp_status pp_share_cores_join(const char *key, int slot, int n_slots, int own_threads, int cap) {
    pp_share_cores_leave();
    if (!key || !*key) return pp_error(PP_ERR_INVALID, "sharing cores: no key");
    if (n_slots < 1 || n_slots > SHARE_SLOTS || slot < 0 || slot >= n_slots)
        return pp_error(PP_ERR_INVALID, "sharing cores: rank %d of %d (at most %d ranks)", slot, n_slots,
                        SHARE_SLOTS);
    if (own_threads < 1 || cap < own_threads)
        return pp_error(PP_ERR_INVALID, "sharing cores: %d own threads, at most %d", own_threads, cap);
    char name[64];
    pp_share_cores_segment_name(key, name, sizeof name);
    share_segment *seg = share.seg;
    if (!seg || strcmp(name, share.name) != 0) PP_TRY(open_segment(name, &seg));
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    pthread_once(&atfork_once, install_atfork);
    /* slots of ranks that died (a crash, a kill) are cleared: what they
     * lent is free indeed, what they held is not held; with no one else
     * alive, a lock a dying rank held is dropped too */
    int alive = 0;
    for (int r = 0; r < SHARE_SLOTS; r++) {
        int pid = atomic_load(&seg->slot[r].pid);
        if (r == slot || !pid) continue;
        if (kill(pid, 0) != 0 && errno == ESRCH) {
            atomic_store(&seg->slot[r].lent, 0);
            atomic_store(&seg->slot[r].borrowed, 0);
            atomic_store(&seg->slot[r].pid, 0);
        } else {
            alive++;
        }
    }
    if (!alive) atomic_store(&seg->lock, 0);
    share_slot *me = &seg->slot[slot];
    atomic_store(&me->lent, 0);
    atomic_store(&me->borrowed, 0);
    atomic_store(&me->pid, (int)getpid());
    snprintf(share.name, sizeof share.name, "%s", name);
    share.seg = seg;
    share.me = slot, share.n_slots = n_slots, share.own = own_threads, share.cap = cap;
    pp_pool_set_size(cap);
    atomic_store(&share.active, 1);
    pp_debug("sharing cores: rank %d of %d, %d own threads, up to %d (%s)", slot, n_slots, own_threads, cap, name);
    return PP_OK;
}

void pp_share_cores_leave(void) {
    if (!atomic_exchange(&share.active, 0)) return;
    share_segment *seg = share.seg;
    share_slot *me = &seg->slot[share.me];
    atomic_store(&me->lent, 0);
    atomic_store(&me->borrowed, 0);
    atomic_store(&me->pid, 0);
    int anyone = 0;
    for (int r = 0; r < share.n_slots; r++) anyone |= atomic_load(&seg->slot[r].pid) != 0;
    /* the last one out removes the segment's name; one joining meanwhile
     * keeps its mapping and lends to no one until the others join again */
    if (!anyone) shm_unlink(share.name);
    pp_pool_set_size(share.own);
}

void pp_share_cores_idle(int idle) {
    if (!atomic_load_explicit(&share.active, memory_order_acquire)) return;
    atomic_store_explicit(&share.seg->slot[share.me].lent, idle ? share.own : 0, memory_order_release);
}

int pp_share_cores_joined(void) { return atomic_load(&share.active); }

int pp_share_cores_borrowing(void) {
    if (!atomic_load_explicit(&share.active, memory_order_acquire)) return 0;
    for (int r = 0; r < share.n_slots; r++)
        if (r != share.me && atomic_load_explicit(&share.seg->slot[r].borrowed, memory_order_relaxed) > 0) return 1;
    return 0;
}

int64_t pp_share_cores_borrows(void) {
    if (!atomic_load_explicit(&share.active, memory_order_acquire)) return 0;
    return atomic_load_explicit(&share.seg->borrows, memory_order_relaxed);
}

int64_t pp_share_cores_borrowed_calls(void) { return atomic_load(&share.borrowed_calls); }

int pp_share_cores_claim(int threads) {
    if (!atomic_load_explicit(&share.active, memory_order_acquire)) return threads;
    share_segment *seg = share.seg;
    int want = (threads < share.cap ? threads : share.cap) - share.own;
    if (want <= 0) return threads < share.own ? threads : share.own;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&seg->lock, &expected, 1)) return share.own;
    /* lent by the others, less what anyone (this rank's other threads too)
     * holds now */
    int spare = 0;
    for (int r = 0; r < share.n_slots; r++) {
        if (r != share.me) spare += atomic_load(&seg->slot[r].lent);
        spare -= atomic_load(&seg->slot[r].borrowed);
    }
    int take = spare < want ? spare : want;
    if (take > 0) atomic_fetch_add(&seg->slot[share.me].borrowed, take);
    if (take > 0) atomic_fetch_add_explicit(&seg->borrows, 1, memory_order_relaxed);
    atomic_store(&seg->lock, 0);
    if (take <= 0) return share.own;
    atomic_fetch_add(&share.borrowed_calls, 1);
    return share.own + take;
}

void pp_share_cores_release(int threads) {
    if (!atomic_load_explicit(&share.active, memory_order_acquire) || threads <= share.own) return;
    atomic_fetch_sub(&share.seg->slot[share.me].borrowed, threads - share.own);
}
