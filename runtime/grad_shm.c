/* The same-host gradient sum of a stage's replicas (grad_shm.h). */
#include "grad_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "grad_ring.h"
#include "group_offer.h"
#include "hash.h"
#include "log_internal.h"
#include "pippin/exec.h"
#include "shm_ring.h"
#include "status_internal.h"
#include "vec.h"

#define SEG_MAGIC "pippinG2"
#define PAGE ((size_t)4096)
/* Each slot has room for this many floats more than a round moves: its
 * data starts where its address has the low 12 bits of the caller's
 * buffer (the slot's skew), so a copy or sum between the two never has a
 * load and an earlier store 4 KiB apart (4K aliasing: a caller's buffer at
 * page + 16 bytes against page-aligned slots ran 256 KiB sums at half
 * speed). */
#define SKEW_FLOATS ((int64_t)(PAGE / sizeof(float)))
#define NAME_CAP 64
#define OFFER_CAP 512 /* "NAME HOST_ID" */
#define DEFAULT_SLOT_BYTES ((int64_t)1 << 20)
#define MAX_SLOT_BYTES ((int64_t)1 << 30)
#define SPIN_NS 200000L /* before sleeping: a peer doing the same work arrives soon, and a wake-up costs more (an idle vCPU halts) */
#define SLEEP_SLICE_NS 100000000L /* between looks at the transport for a peer that is gone */
#define OFFER_MICROBATCH (PP_GRAD_RING_MICROBATCH - 2)
#define OFFER_NAME "pippin:shm:offer"
#define DECLINE "-"

/* The first page of a replica's segment. Written once by its owner before
 * the offer, except the counter (its owner) and waiters (its peers). */
typedef struct seg_header {
    char magic[8];
    uint64_t key;                  /* random, sent with the offer: this is the object offered */
    int32_t stage, replica, replicas, pad0;
    int64_t slot_floats;
    uint64_t bytes;                /* the whole object */
    char pad1[64 - 48];
    _Atomic uint32_t seq;          /* sync points its owner passed */
    char pad2[64 - 4];
    _Atomic uint32_t waiters;      /* peers asleep (or about to be) on seq */
    char pad3[64 - 4];
    /* per buffer: the collective of the round that wrote it (op_word),
     * written with the slots, so that replicas running different ones (a
     * misconfigured rank) stop instead of mixing each other's slots */
    uint64_t op[2];
    char pad4[64 - 16];
    /* then uint32_t skew[2][R]: where in each slot its data starts (floats),
     * written by the owner before the sync point that publishes the slot */
} seg_header;

typedef struct seg {
    seg_header *h;
    uint32_t *skew; /* [2][R] */
    float *slots;   /* [2][R][slot_floats + SKEW_FLOATS] */
    size_t bytes;
} seg;

enum { OFFERING, IN_USE, DECLINED };

struct pp_grad_shm {
    pp_grad_shm_options o;
    int64_t step;               /* of the agreement */
    int64_t op_step;            /* of the collectives now (pp_grad_shm_set_step) */
    int64_t slot;               /* floats per slot */
    int state;
    char name[NAME_CAP];        /* this replica's segment ("" if none) */
    uint64_t key;               /* in its header */
    int linked;                 /* the name is still in /dev/shm */
    seg *segs;                  /* [R]; segs[replica] is this one's */
    char *offered;              /* [R]: 0 not yet, 1 a segment, 2 declined */
    uint32_t seq;               /* this replica's counter */
    uint64_t rounds;            /* rounds done in the group's life: picks the buffer */
    int broken;
    /* the bucket in progress */
    int busy;
    float *buf;
    int64_t off, len, round, nrounds;
    int phase, bucket, mode;
};

static int mod(int a, int r) { return ((a % r) + r) % r; }

static int world_rank(const pp_grad_shm *s, int k) {
    return pp_transport_stage_rank(s->o.t, k * s->o.n_stages + s->o.stage);
}

static size_t header_bytes(int replicas) {
    size_t n = sizeof(seg_header) + (size_t)2 * (size_t)replicas * sizeof(uint32_t);
    return (n + PAGE - 1) / PAGE * PAGE;
}

static size_t seg_bytes(const pp_grad_shm *s) {
    return header_bytes(s->o.replicas) +
           (size_t)2 * (size_t)s->o.replicas * (size_t)(s->slot + SKEW_FLOATS) * sizeof(float);
}

static size_t slot_index(const pp_grad_shm *s, uint64_t buffer, int c) {
    return (size_t)(buffer & 1) * (size_t)s->o.replicas + (size_t)c;
}

/* Slot c of replica k's buffer, where its data starts (the skew its owner
 * wrote: read only after the owner's sync point). */
static float *slot_of(const pp_grad_shm *s, int k, uint64_t buffer, int c) {
    size_t i = slot_index(s, buffer, c);
    uint32_t skew = atomic_load_explicit((_Atomic uint32_t *)&s->segs[k].skew[i], memory_order_relaxed);
    if (skew >= SKEW_FLOATS) skew = 0; /* same_op refused such a peer; bounds kept whatever it writes since */
    return s->segs[k].slots + i * (size_t)(s->slot + SKEW_FLOATS) + skew;
}

/* This replica's own slot c, its data placed at the address with the low
 * 12 bits of p's (the slots' addresses have the same low bits in every
 * process: segments are mapped page-aligned). */
static float *own_slot_for(pp_grad_shm *s, uint64_t buffer, int c, const float *p) {
    seg *g = &s->segs[s->o.replica];
    size_t i = slot_index(s, buffer, c);
    float *base = g->slots + i * (size_t)(s->slot + SKEW_FLOATS);
    uint32_t skew = (uint32_t)((((uintptr_t)p - (uintptr_t)base) & (PAGE - 1)) / sizeof(float));
    g->skew[i] = skew;
    return base + skew;
}

/* ---- futex ---- */

static void futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen, long ns) {
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, &ts, NULL, 0); /* shared: not FUTEX_PRIVATE */
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- segments ---- */

static void unmap(seg *g) {
    if (g->h) munmap(g->h, g->bytes);
    g->h = NULL;
}

static pp_status map_fd(seg *g, int fd, size_t bytes, size_t header, const char *name) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) return pp_error(PP_ERR_NOMEM, "shared memory %s: mmap of %zu bytes: %s", name, bytes, strerror(errno));
    g->h = p;
    g->skew = (uint32_t *)((unsigned char *)p + sizeof(seg_header));
    g->slots = (float *)((unsigned char *)p + header);
    g->bytes = bytes;
    return PP_OK;
}

/* This replica's segment; on failure nothing is left behind. */
static pp_status create_segment(pp_grad_shm *s) {
    static atomic_uint counter;
    size_t bytes = seg_bytes(s);
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        /* the transport's naming ("/pippin-PIDNS-PID-..."), so its sweep removes a dead rank's */
        snprintf(s->name, sizeof s->name, "/pippin-%llx-%ld-g%u", pp_shm_pid_ns(), (long)getpid(),
                 atomic_fetch_add(&counter, 1) + 1);
        fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        pp_status st = pp_error(PP_ERR_IO, "shared memory %s: shm_open: %s", s->name, strerror(errno));
        s->name[0] = 0;
        return st;
    }
    s->linked = 1;
    /* reserved now: a full /dev/shm fails here, not with SIGBUS later */
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    pp_status st = e ? pp_error(PP_ERR_NOMEM, "shared memory %s: cannot reserve %zu bytes: %s", s->name, bytes, strerror(e))
                     : map_fd(&s->segs[s->o.replica], fd, bytes, header_bytes(s->o.replicas), s->name);
    close(fd);
    if (st != PP_OK) {
        shm_unlink(s->name);
        s->linked = 0;
        s->name[0] = 0;
        return st;
    }
    seg_header *h = s->segs[s->o.replica].h;
    memcpy(h->magic, SEG_MAGIC, 8);
    if (getrandom(&s->key, sizeof s->key, 0) != (ssize_t)sizeof s->key) /* not secret: tells objects apart */
        s->key = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)s;
    h->key = s->key;
    h->stage = s->o.stage;
    h->replica = s->o.replica;
    h->replicas = s->o.replicas;
    h->slot_floats = s->slot;
    h->bytes = bytes;
    atomic_store(&h->seq, 0);
    atomic_store(&h->waiters, 0);
    return PP_OK;
}

static int name_ok(const char *name) {
    static const char prefix[] = "/pippin-";
    size_t n = sizeof prefix - 1;
    if (strncmp(name, prefix, n) != 0 || !name[n] || strlen(name) >= NAME_CAP) return 0;
    for (; name[n]; n++) {
        char c = name[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

/* Replica k's offered segment, checked: this user's alone, the size this
 * group's layout gives, a header with the key it offered, naming k and
 * this stage. */
static pp_status open_peer(pp_grad_shm *s, int k, const char *name, uint64_t key) {
    const char *what = "";
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        /* most likely the peer gave up on it (or sees another /dev/shm) */
        return pp_error(PP_ERR_PEER, "stage %d: shared memory %s offered by replica %d (rank %d) cannot be opened: %s",
                        s->o.stage, name, k, world_rank(s, k), strerror(errno));
    struct stat st;
    size_t bytes = seg_bytes(s);
    if (fstat(fd, &st) != 0) what = "cannot be inspected";
    else if (st.st_uid != geteuid()) what = "belongs to another user";
    else if (st.st_mode & 077) what = "is open to other users (not mode 0600)";
    else if ((uint64_t)st.st_size != bytes) what = "has another size (another slot size or replica count?)";
    else if ((uint64_t)st.st_blocks * 512 < (uint64_t)st.st_size) what = "is not fully allocated";
    pp_status r = *what ? PP_OK : map_fd(&s->segs[k], fd, bytes, header_bytes(s->o.replicas), name);
    close(fd);
    if (*what)
        return pp_error(PP_ERR_PEER, "stage %d: shared memory %s offered by replica %d (rank %d) %s", s->o.stage, name, k,
                        world_rank(s, k), what);
    PP_TRY(r);
    const seg_header *h = s->segs[k].h;
    what = memcmp(h->magic, SEG_MAGIC, 8) != 0         ? "is not a gradient segment"
           : h->key != key                            ? "is not the one offered"
           : h->stage != s->o.stage || h->replica != k ? "is another stage's or replica's"
           : h->replicas != s->o.replicas || h->slot_floats != s->slot || h->bytes != bytes
               ? "has another layout (replicas, slot size)"
               : "";
    if (*what) {
        unmap(&s->segs[k]);
        return pp_error(PP_ERR_PEER, "stage %d: shared memory %s offered by replica %d (rank %d) %s", s->o.stage, name,
                        k, world_rank(s, k), what);
    }
    return PP_OK;
}

/* ---- agreement ---- */

static pp_group_offer offer_group(const pp_grad_shm *s) {
    return (pp_group_offer){s->o.t, s->step, OFFER_MICROBATCH, OFFER_NAME, "shared memory", s->o.replicas,
                            s->o.replica, s->o.n_stages, s->o.stage};
}

pp_status pp_grad_shm_new(const pp_grad_shm_options *o, int64_t step, pp_grad_shm **out) {
    *out = NULL;
    int64_t slot_bytes = o->slot_bytes ? o->slot_bytes : DEFAULT_SLOT_BYTES;
    if (o->replicas < 2 || o->replica < 0 || o->replica >= o->replicas || slot_bytes < 64 ||
        slot_bytes > MAX_SLOT_BYTES || slot_bytes % 64)
        return pp_error(PP_ERR_INVALID, "gradient sum over shared memory: replica %d of %d, slots of %lld bytes "
                        "(a multiple of 64 up to 1 GiB)", o->replica, o->replicas, (long long)slot_bytes);
    pp_grad_shm *s = calloc(1, sizeof *s);
    if (s) s->segs = calloc((size_t)o->replicas, sizeof *s->segs);
    if (s) s->offered = calloc((size_t)o->replicas, 1);
    if (!s || !s->segs || !s->offered) {
        if (s) free(s->segs);
        free(s);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    s->o = *o;
    s->step = s->op_step = step;
    s->slot = slot_bytes / (int64_t)sizeof(float);
    s->state = OFFERING;
    const char *host = pp_transport_host_id(o->t);
    if (o->offer && host[0] && create_segment(s) != PP_OK)
        pp_debug("stage %d replica %d: no shared memory for the gradient sum (%s); summing over the transport",
                 o->stage, o->replica, pp_last_error());
    char text[OFFER_CAP];
    int len = snprintf(text, sizeof text, "%s %016llx %s", s->name, (unsigned long long)s->key, host);
    if (!s->name[0] || len < 0 || (size_t)len >= sizeof text) len = snprintf(text, sizeof text, DECLINE);
    s->offered[o->replica] = s->name[0] && strcmp(text, DECLINE) ? 1 : 2;
    pp_group_offer og = offer_group(s);
    pp_status st = pp_group_offer_send(&og, text);
    if (st != PP_OK) {
        pp_grad_shm_free(s);
        return st;
    }
    *out = s;
    return PP_OK;
}

/* Every offer is in: map the peers' segments, or give up on shared memory
 * if anyone declined. */
static pp_status decide(pp_grad_shm *s) {
    int all = 1;
    for (int k = 0; k < s->o.replicas; k++) all &= s->offered[k] == 1;
    if (!all) {
        s->state = DECLINED;
        for (int k = 0; k < s->o.replicas; k++) unmap(&s->segs[k]);
        if (s->linked) shm_unlink(s->name);
        s->linked = 0;
        pp_debug("stage %d replica %d: a replica is not on this host or has no shared memory: gradients summed "
                 "over the network", s->o.stage, s->o.replica);
        return PP_OK;
    }
    s->state = IN_USE;
    pp_debug("stage %d replica %d: the %d replicas sum gradients through shared memory", s->o.stage, s->o.replica,
             s->o.replicas);
    return PP_OK;
}

pp_status pp_grad_shm_agree(pp_grad_shm *s, int wait, int timeout_ms, int *decided) {
    *decided = s->state != OFFERING;
    if (*decided) return PP_OK;
    pp_group_offer og = offer_group(s);
    for (int k = 0; k < s->o.replicas; k++) {
        if (s->offered[k]) continue;
        char name[OFFER_CAP];
        int got;
        pp_status st = pp_group_offer_take(&og, k, wait, timeout_ms, name, sizeof name, &got);
        if (st != PP_OK) {
            s->broken = 1;
            return st;
        }
        if (!got) return PP_OK;
        /* "NAME KEY HOST_ID" */
        char *hex = strchr(name, ' '), *host = hex ? strchr(hex + 1, ' ') : NULL, *end = NULL;
        if (hex) *hex++ = 0;
        if (host) *host++ = 0;
        unsigned long long key_value = hex ? strtoull(hex, &end, 16) : 0;
        if (!end || *end) host = NULL; /* malformed: refused below */
        /* another host, container or user: its memory is not ours to share */
        if (strcmp(name, DECLINE) == 0 || (host && strcmp(host, pp_transport_host_id(s->o.t)) != 0)) {
            s->offered[k] = 2;
            continue;
        }
        if (!host || !name_ok(name)) {
            s->broken = 1;
            return pp_error(PP_ERR_PEER, "stage %d: replica %d (rank %d) offered shared memory under a name that is "
                            "not pippin's", s->o.stage, k, world_rank(s, k));
        }
        if (s->offered[s->o.replica] == 1) {
            pp_status o = open_peer(s, k, name, key_value);
            if (o != PP_OK) {
                s->broken = 1;
                return o;
            }
        }
        s->offered[k] = 1;
    }
    *decided = 1;
    return decide(s);
}

int pp_grad_shm_in_use(const pp_grad_shm *s) { return s->state == IN_USE; }
int pp_grad_shm_broken(const pp_grad_shm *s) { return s->broken || s->busy || s->state == OFFERING; }

/* ---- synchronisation ---- */

static void post(pp_grad_shm *s) {
    seg_header *h = s->segs[s->o.replica].h;
    /* seq_cst store then load, against the waiter's increment then load:
     * one of the two sees the other */
    atomic_store(&h->seq, ++s->seq);
    if (atomic_load(&h->waiters)) futex_wake(&h->seq);
}

static int arrived(const seg *g, uint32_t target) {
    return (int32_t)(atomic_load_explicit(&g->h->seq, memory_order_acquire) - target) >= 0;
}

static pp_status gone(pp_grad_shm *s, pp_status code, int k, const char *why) {
    s->broken = 1;
    return pp_error(code, "stage %d: summing gradients through shared memory (bucket %d): replica %d (rank %d) "
                    "%s", s->o.stage, s->bucket, k, world_rank(s, k), why);
}

/* Waits until replica k passed its sync point target: spin, then sleep on
 * its counter in slices, checking the transport between them. */
static pp_status wait_one(pp_grad_shm *s, int k, uint32_t target, int timeout_ms) {
    seg *g = &s->segs[k];
    int64_t start = now_ns(), spin_end = start + SPIN_NS, deadline = start + (int64_t)timeout_ms * 1000000LL;
    for (int i = 0; !arrived(g, target); i++) {
        cpu_relax();
        if ((i & 63) == 0 && now_ns() >= spin_end) break;
    }
    while (!arrived(g, target)) {
        int64_t now = now_ns();
        if (now >= deadline) {
            char why[96];
            snprintf(why, sizeof why, "did not get there within %d ms", timeout_ms);
            return gone(s, PP_ERR_TIMEOUT, k, why);
        }
        long slice = deadline - now < SLEEP_SLICE_NS ? (long)(deadline - now) : SLEEP_SLICE_NS;
        atomic_fetch_add(&g->h->waiters, 1);
        uint32_t seen = atomic_load(&g->h->seq);
        if ((int32_t)(seen - target) < 0) {
            pp_share_cores_idle(1); /* asleep: lend this rank's threads, as a blocking receive does */
            futex_wait(&g->h->seq, seen, slice);
            pp_share_cores_idle(0);
        }
        atomic_fetch_sub(&g->h->waiters, 1);
        if (arrived(g, target)) break;
        /* a peer that died never wakes us: ask the transport */
        pp_status st = pp_transport_poll(s->o.t, 0);
        if (st != PP_OK) {
            s->broken = 1;
            return pp_error_context(st, "stage %d: summing gradients through shared memory with replica %d (rank %d)",
                                    s->o.stage, k, world_rank(s, k));
        }
        pp_peer_state ps = pp_transport_peer_state(s->o.t, world_rank(s, k));
        if (ps == PP_PEER_DOWN || ps == PP_PEER_CLOSED || ps == PP_PEER_REJECTED) {
            char why[96];
            snprintf(why, sizeof why, "is gone (%s)", pp_peer_state_name(ps));
            return gone(s, PP_ERR_PEER, k, why);
        }
    }
    return PP_OK;
}

/* Every peer passed the sync point this replica just posted. */
static pp_status wait_all(pp_grad_shm *s, int wait, int timeout_ms, int *ok) {
    *ok = 0;
    for (int k = 0; k < s->o.replicas; k++) {
        if (k == s->o.replica || arrived(&s->segs[k], s->seq)) continue;
        if (!wait) return PP_OK;
        PP_TRY(wait_one(s, k, s->seq, timeout_ms));
    }
    *ok = 1;
    if (s->linked) { /* every peer has mapped it: the name can go */
        shm_unlink(s->name);
        s->linked = 0;
    }
    return PP_OK;
}

/* ---- copies ---- */

/* Backward, 32 floats at a time: a load never follows a store to the same
 * low 12 address bits (kept a loop, not turned into a memcpy call). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
PP_VEC_CLONES static void copy_back(float *restrict dst, const float *restrict src, int64_t n) {
    int64_t i = n;
    for (; i >= 32; i -= 32)
        for (int j = 0; j < 32; j++) dst[i - 32 + j] = src[i - 32 + j];
    for (; i > 0; i--) dst[i - 1] = src[i - 1];
}

void pp_grad_copy(float *dst, const float *src, int64_t n) {
    uintptr_t ahead = ((uintptr_t)dst - (uintptr_t)src) & (PAGE - 1);
    if (n >= 512 && ahead > 0 && ahead < 64) copy_back(dst, src, n);
    else if (n > 0) memcpy(dst, src, (size_t)n * sizeof(float));
}

/* ---- one bucket ---- */

/* Chunk c of the bucket (the ring's chunks), and its slice in round q. */
static void slice_of(const pp_grad_shm *s, int c, int64_t q, int64_t *lo, int64_t *n) {
    int r = s->o.replicas;
    int64_t a = s->len * c / r, z = s->len * (c + 1) / r;
    int64_t from = a + q * s->slot, to = from + s->slot < z ? from + s->slot : z;
    *lo = s->off + from;
    *n = to > from ? to - from : 0;
}

/* What a round does, as every replica of the group must agree: the
 * collective, the bucket, where it lies in the flat buffer (replicas split
 * differently can have buckets of one length at other offsets) and the
 * round, hashed into the one word the header has for it (never 0, which a
 * fresh header holds). */
static uint64_t op_word(const pp_grad_shm *s) {
    /* the step too: a replica that failed a step and went on to the next
     * must never be summed with a peer still in the failed one */
    int64_t what[6] = {s->mode, s->bucket, s->off, s->len, s->round, s->op_step};
    return pp_hash64(PP_HASH64_SEED, what, sizeof what) | 1;
}

/* After the first sync point of a round: every peer wrote this round's
 * buffer doing the same collective on the same bucket. */
static pp_status same_op(pp_grad_shm *s) {
    uint64_t mine = op_word(s);
    for (int k = 0; k < s->o.replicas; k++) {
        if (k == s->o.replica) continue;
        uint64_t theirs = s->segs[k].h->op[s->rounds & 1];
        for (int c = 0; c < s->o.replicas && theirs == mine; c++) { /* its data placements, before any is read */
            uint32_t skew = atomic_load_explicit((_Atomic uint32_t *)&s->segs[k].skew[slot_index(s, s->rounds, c)],
                                                 memory_order_relaxed);
            if (skew >= SKEW_FLOATS) return gone(s, PP_ERR_PEER, k, "wrote a slot offset out of range");
        }
        if (theirs != mine) {
            static const char *names[3] = {"sum", "reduce-scatter", "all-gather"};
            char why[200];
            snprintf(why, sizeof why, "is running another collective or step (this replica: the %s of bucket %d, round "
                     "%lld of step %lld; is the replicas' configuration the same: shard_optimizer, gradient buckets?)",
                     names[s->mode], s->bucket, (long long)s->round, (long long)s->op_step);
            return gone(s, PP_ERR_PEER, k, why);
        }
    }
    return PP_OK;
}

/* Round phase 0: into this replica's slots, the slices of the chunks
 * others own (sum, scatter), or of the one it owns (gather). */
static void publish(pp_grad_shm *s) {
    int r = s->o.replicas, me = s->o.replica, own = mod(me + 1, r);
    s->segs[me].h->op[s->rounds & 1] = op_word(s);
    for (int c = 0; c < r; c++) {
        if ((c == own) != (s->mode == PP_SHM_GATHER)) continue;
        int64_t lo, n;
        slice_of(s, c, s->round, &lo, &n);
        if (n) pp_grad_copy(own_slot_for(s, s->rounds, c, s->buf + lo), s->buf + lo, n);
    }
}

/* The owner's sums. Its own values always come last in the ring's order
 * (chunk c = owner + 1 starts at replica c and ends at c - 1, the owner),
 * so the last addition writes the sum to its slot and its gradients at
 * once. Every pointer is a different buffer: restrict holds and the loops
 * vectorize (vec.h). */
PP_VEC_CLONES static void add2(float *restrict out, const float *restrict a, const float *restrict b, int64_t n) {
    PP_VFOR(i, n, out[i] = a[i] + b[i];);
}

PP_VEC_CLONES static void add_into(float *restrict out, const float *restrict x, int64_t n) {
    PP_VFOR(i, n, out[i] += x[i];);
}

/* out = mine = acc + mine */
PP_VEC_CLONES static void add_last(float *restrict out, float *restrict mine, const float *restrict acc, int64_t n) {
    PP_VFOR(i, n, float v = acc[i] + mine[i]; out[i] = v; mine[i] = v;);
}

/* out = mine = out + mine */
PP_VEC_CLONES static void add_last_into(float *restrict out, float *restrict mine, int64_t n) {
    PP_VFOR(i, n, float v = out[i] + mine[i]; out[i] = v; mine[i] = v;);
}

/* Phase 1: this replica's chunk c summed in the ring's order (replica c
 * first, this one last), into its gradients and (sum: for the others to
 * copy; scatter: as scratch when R > 2) its own slot. acc + mine and
 * mine + acc are the same bits (IEEE addition commutes). */
static void reduce_own(pp_grad_shm *s) {
    int r = s->o.replicas, me = s->o.replica, c = mod(me + 1, r);
    int64_t lo, n;
    slice_of(s, c, s->round, &lo, &n);
    if (!n) return;
    float *mine = s->buf + lo;
    if (r == 2 && s->mode == PP_SHM_SCATTER) {
        add_into(mine, slot_of(s, c, s->rounds, c), n);
        return;
    }
    float *out = own_slot_for(s, s->rounds, c, mine);
    if (r == 2) {
        add_last(out, mine, slot_of(s, c, s->rounds, c), n);
        return;
    }
    add2(out, slot_of(s, c, s->rounds, c), slot_of(s, mod(c + 1, r), s->rounds, c), n);
    for (int j = 2; j < r - 1; j++) add_into(out, slot_of(s, mod(c + j, r), s->rounds, c), n);
    if (s->mode == PP_SHM_SCATTER) add_into(mine, out, n);
    else add_last_into(out, mine, n);
}

/* The chunks the others own, from their slots (sum: the sums; gather: the
 * values they hold). */
static void gather(pp_grad_shm *s) {
    int r = s->o.replicas, me = s->o.replica;
    for (int k = 0; k < r; k++) {
        if (k == me) continue;
        int64_t lo, n;
        slice_of(s, mod(k + 1, r), s->round, &lo, &n);
        if (n) pp_grad_copy(s->buf + lo, slot_of(s, k, s->rounds, mod(k + 1, r)), n);
    }
}

/* A round: publish and a sync point, then (sum) the owners' sums and a
 * second sync point before the copies back, (scatter) the owners' sums
 * alone, (gather) the copies alone. One sync point is enough where a round
 * writes no slot after it: the next round writes the other buffer, and the
 * one after waits at the next round's sync point, which every peer passes
 * only after its reads of this round. */
pp_status pp_grad_shm_run(pp_grad_shm *s, int mode, float *buf, int64_t off, int64_t len, int bucket, int wait,
                          int timeout_ms, int *done) {
    *done = 0;
    if (s->state != IN_USE || s->broken)
        return pp_error(PP_ERR_STATE, "stage %d: the shared-memory gradient sum is not usable%s", s->o.stage,
                        s->broken ? " after an earlier failure" : "");
    if (mode != PP_SHM_SUM && mode != PP_SHM_SCATTER && mode != PP_SHM_GATHER)
        return pp_error(PP_ERR_INVALID, "stage %d: no shared-memory collective %d", s->o.stage, mode);
    if (!s->busy) {
        int r = s->o.replicas;
        s->busy = 1;
        s->buf = buf, s->off = off, s->len = len, s->bucket = bucket, s->mode = mode;
        s->round = 0, s->phase = 0;
        int64_t longest = (len + r - 1) / r;
        s->nrounds = (longest + s->slot - 1) / s->slot;
    } else if (s->buf != buf || s->off != off || s->len != len || s->bucket != bucket || s->mode != mode) {
        /* an earlier bucket of the stage holds the group: its turn comes first */
        if (!wait) return PP_OK;
        return pp_error(PP_ERR_STATE, "stage %d: bucket %d waited for while bucket %d is being summed", s->o.stage,
                        bucket, s->bucket);
    }
    while (s->round < s->nrounds) {
        int ok = 1;
        if (s->phase == 0) {
            publish(s);
            post(s);
            s->phase = 1;
        }
        if (s->phase == 1) {
            PP_TRY(wait_all(s, wait, timeout_ms, &ok));
            if (!ok) return PP_OK;
            PP_TRY(same_op(s));
            if (s->mode == PP_SHM_GATHER) {
                gather(s);
            } else {
                reduce_own(s);
                if (s->mode == PP_SHM_SUM) post(s);
            }
            s->phase = s->mode == PP_SHM_SUM ? 2 : 3;
        }
        if (s->phase == 2) {
            PP_TRY(wait_all(s, wait, timeout_ms, &ok));
            if (!ok) return PP_OK;
            gather(s);
        }
        s->round++;
        s->rounds++;
        s->phase = 0;
    }
    s->busy = 0;
    *done = 1;
    return PP_OK;
}

pp_status pp_grad_shm_sum(pp_grad_shm *s, float *buf, int64_t off, int64_t len, int bucket, int wait,
                          int timeout_ms, int *done) {
    return pp_grad_shm_run(s, PP_SHM_SUM, buf, off, len, bucket, wait, timeout_ms, done);
}

void pp_grad_shm_set_step(pp_grad_shm *s, int64_t step) { s->op_step = step; }

void pp_grad_shm_free(pp_grad_shm *s) {
    if (!s) return;
    for (int k = 0; k < s->o.replicas; k++) unmap(&s->segs[k]);
    if (s->linked) shm_unlink(s->name);
    free(s->segs);
    free(s->offered);
    free(s);
}
