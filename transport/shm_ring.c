/* Shared-memory rings between ranks on one host. See shm_ring.h. */
#include "shm_ring.h"

#include "envelope.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "status_internal.h"
/* R2: the sender may fill a lap after a skip and start again at 0 when
 * drained; the receiver follows the header's skip_from. R3: the object's
 * pages are allocated as the sender first writes them (the header's
 * `allocated`), where R2 allocated them all at creation and refused a
 * sparse ring. A peer of another format would misread that, so rings are
 * not opened across formats (magic), and the format is part of the host id
 * (pp_shm_host_id): mixed builds use sockets. */
#define RING_MAGIC "pippinR3"
#define RING_FORMAT "R3"
/* The header takes one page, so the data starts page-aligned. */
#define HEADER_BYTES ((size_t)4096)
/* A ring larger than this in a peer's header is not believed. */
#define MAX_RING_BYTES ((uint64_t)1 << 40)
/* The sender allocates the ring's /dev/shm pages in steps this big, ahead
 * of its first write into them. */
#define ALLOC_STEP ((uint64_t)256 << 10)

/* The first page of the shared object. After creation the receiver writes
 * `opened` once and `consumed` as it goes (a cache line of its own). */
typedef struct ring_header {
    char magic[8];
    uint64_t data_bytes;
    uint64_t header_bytes;
    _Atomic uint32_t opened;     /* the receiver has mapped it (the name may go) */
    char pad[64 - 28];
    _Atomic uint64_t consumed;   /* written by the receiver */
    char pad2[64 - 8];
    _Atomic uint64_t head;       /* message rings: end of the last record published */
    _Atomic uint64_t skip_from;  /* the sender's last skip to the next lap started here (0: none) */
    _Atomic uint64_t allocated;  /* data bytes from offset 0 the sender has allocated; none beyond is read */
    char pad3[64 - 24];
    _Atomic uint32_t waiting;    /* message rings: the receiver is (about to be) asleep */
} ring_header;

#define SKIP_MARK UINT32_MAX
#define RECORD_HEADER 8

/* A receiver's range lent out as a tensor's storage, until the tensor is freed. */
typedef struct loan {
    uint64_t start;
    int returned;
} loan;

struct pp_shm_ring {
    char name[PP_ENVELOPE_MAX_SHM_NAME + 1];
    int owner;           /* created here (the sender) */
    int fd;              /* sender: the shared object, to allocate more of it (-1: none) */
    uint64_t alloc;      /* sender: data bytes allocated (a multiple of ALLOC_STEP, or size) */
    ring_header *hdr;
    unsigned char *data;
    uint64_t size;       /* data bytes */
    size_t map_bytes;
    uint64_t align;      /* sender: records start at multiples of this */
    uint64_t head;       /* sender: end of the last record written */
    uint64_t skip_from, skip_to; /* sender: its last skip to the next lap (none: equal) */
    uint64_t settled;    /* receiver: everything before this is processed */
    /* Receiver: loans in order (ids base_id, base_id+1, ...); the sender may
     * reuse only what lies before the oldest loan still out. Tensors are
     * freed on any thread, hence the lock; the mapping lives until the ring
     * is closed and every loan is back. */
    pthread_mutex_t lock;
    int refs;
    loan *loans;
    size_t lfirst, nloans, lcap;
    uint64_t base_id;
};

typedef struct loan_ticket {
    pp_shm_ring *ring;
    uint64_t id;
} loan_ticket;

/* Appends the first line of a file (without the newline) to buf. */
static int append_line(char *buf, size_t cap, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t len = strlen(buf);
    int ok = len + 1 < cap && fgets(buf + len, (int)(cap - len), f) != NULL;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return ok;
}

/* Appends the target of the namespace link /proc/self/ns/NAME ("user:[N]"). */
static int append_ns(char *buf, size_t cap, const char *name) {
    char path[64], ns[128];
    snprintf(path, sizeof path, "/proc/self/ns/%s", name);
    ssize_t n = readlink(path, ns, sizeof ns - 1);
    if (n <= 0) return 0;
    ns[n] = 0;
    size_t len = strlen(buf);
    int w = snprintf(buf + len, cap - len, "/%s", ns);
    return w > 0 && (size_t)w < cap - len;
}

/* What decides whether two processes can share a ring: the same kernel
 * (boot id), the same tmpfs at /dev/shm, where shm_open creates its objects
 * (device and inode: a private tmpfs, a mount namespace with another one,
 * a chroot or a container's own /dev/shm differ), and the same user: rings
 * and doorbells are 0600. A user is an euid within a user namespace, so the
 * namespace is part of it: root in a namespace mapped to uid 100000 has
 * euid 0 too, but cannot open root's rings. The IPC namespace is kept
 * (conservative: POSIX shared memory does not depend on it). The network
 * and mount namespaces are not part of it: `ip netns exec` gives each
 * process a mount namespace of its own with the same /dev/shm, and those
 * processes do share memory. */
void pp_shm_host_id(char *buf, size_t cap) {
    if (!cap) return;
    buf[0] = 0;
    struct stat st;
    if (stat("/dev/shm", &st) != 0 || !append_line(buf, cap, "/proc/sys/kernel/random/boot_id") ||
        !append_ns(buf, cap, "ipc") || !append_ns(buf, cap, "user")) {
        buf[0] = 0;
        return;
    }
    size_t len = strlen(buf);
    int w = snprintf(buf + len, cap - len, "/%llx:%llx/%u/%s", (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino, (unsigned)geteuid(), RING_FORMAT);
    if (w < 0 || (size_t)w >= cap - len) buf[0] = 0;
    /* the id travels in an envelope text: keep it printable */
    for (char *p = buf; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == ' ') *p = '_';
}

/* pp_shm_ring_fail_alloc_after's setting: allocations left before they fail (-1: off) */
static atomic_int alloc_fail_after = -1;

int pp_shm_ring_fail_alloc_after(int n) {
    return atomic_exchange(&alloc_fail_after, n < 0 ? -1 : n);
}

/* The test hook's verdict on the next allocation: 1 fails it. */
static int injected_failure(void) {
    int left = atomic_load(&alloc_fail_after);
    while (left > 0 && !atomic_compare_exchange_weak(&alloc_fail_after, &left, left - 1)) {
    }
    return left == 0;
}

/* Maps the ring without MAP_POPULATE: its pages enter this process's page
 * tables, and its RSS, only when first touched, and a sender whose
 * receiver has consumed everything starts again at offset 0
 * (pp_shm_ring_reserve), so a ring costs the pages its traffic in flight
 * needs, not its size (4 MiB message rings to each peer, prefaulted on
 * both sides, were 0.45x of the medium GPT's file in a worker's peak). The
 * same holds for /dev/shm: the sender allocates pages (grow), a step at a
 * time, only as far as it writes. A page faults once, on its first use: the ring in
 * use stays mapped, so the steady state has no faults. */
static pp_status map_ring(pp_shm_ring *r, int fd, size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return pp_error(PP_ERR_NOMEM, "shared-memory ring %s: mmap of %zu bytes: %s", r->name, bytes,
                        strerror(errno));
    r->hdr = p;
    r->data = (unsigned char *)p + HEADER_BYTES;
    r->map_bytes = bytes;
    return PP_OK;
}

pp_status pp_shm_ring_create(size_t data_bytes, pp_shm_ring **out) {
    static atomic_uint counter;
    *out = NULL;
    size_t page = HEADER_BYTES;
    if (data_bytes == 0 || data_bytes > MAX_RING_BYTES)
        return pp_error(PP_ERR_INVALID, "shared-memory ring of %zu bytes", data_bytes);
    data_bytes = (data_bytes + page - 1) / page * page;
    pp_shm_ring *r = calloc(1, sizeof *r);
    if (!r) return pp_error(PP_ERR_NOMEM, "out of memory");
    r->owner = 1;
    r->refs = 1;
    r->align = 1;
    r->fd = -1;
    pthread_mutex_init(&r->lock, NULL);
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(r->name, sizeof r->name, "/pippin-%llx-%ld-%u", pp_shm_pid_ns(), (long)getpid(),
                 atomic_fetch_add(&counter, 1) + 1);
        fd = shm_open(r->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        pp_status s = pp_error(PP_ERR_IO, "shared-memory ring %s: shm_open: %s", r->name, strerror(errno));
        free(r);
        return s;
    }
    /* the object is the ring's size but sparse; only the header is
     * allocated now (both sides write it), the data as the sender first
     * writes it (grow): a ring costs /dev/shm (and the memory cgroup it
     * is charged to) what its traffic uses, and a full /dev/shm fails an
     * allocation, which sends over the socket, never a write with SIGBUS */
    pp_status s = PP_OK;
    int e = ftruncate(fd, (off_t)(HEADER_BYTES + data_bytes)) != 0 ? errno
            : injected_failure()                                    ? ENOSPC
                                                                    : posix_fallocate(fd, 0, (off_t)HEADER_BYTES);
    if (e != 0)
        s = pp_error(PP_ERR_NOMEM, "shared-memory ring %s: cannot allocate its header: %s", r->name, strerror(e));
    if (s == PP_OK) s = map_ring(r, fd, HEADER_BYTES + data_bytes);
    if (s != PP_OK) {
        close(fd);
        shm_unlink(r->name);
        free(r);
        return s;
    }
    r->fd = fd;
    memcpy(r->hdr->magic, RING_MAGIC, 8);
    r->hdr->data_bytes = data_bytes;
    r->hdr->header_bytes = HEADER_BYTES;
    atomic_store_explicit(&r->hdr->consumed, 0, memory_order_release);
    r->size = data_bytes;
    *out = r;
    return PP_OK;
}

int pp_shm_ring_name_ok(const char *name) {
    static const char prefix[] = "/pippin-";
    size_t n = sizeof prefix - 1;
    if (strncmp(name, prefix, n) != 0 || !name[n]) return 0;
    for (; name[n]; n++) {
        char c = name[n];
        if (n >= PP_ENVELOPE_MAX_SHM_NAME || !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                         c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

pp_status pp_shm_ring_open(const char *name, pp_shm_ring **out) {
    *out = NULL;
    if (!pp_shm_ring_name_ok(name))
        return pp_error(PP_ERR_PARSE, "'%s' is not a pippin shared-memory ring name", name);
    if (strlen(name) >= sizeof ((pp_shm_ring *)0)->name)
        return pp_error(PP_ERR_PARSE, "shared-memory ring name too long");
    pp_shm_ring *r = calloc(1, sizeof *r);
    if (!r) return pp_error(PP_ERR_NOMEM, "out of memory");
    snprintf(r->name, sizeof r->name, "%s", name);
    r->refs = 1;
    r->align = 1;
    r->fd = -1;
    pthread_mutex_init(&r->lock, NULL);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        pp_status s = pp_error(PP_ERR_IO, "shared-memory ring %s: %s (is the peer on another host "
                               "or in another container?)", name, strerror(errno));
        free(r);
        return s;
    }
    struct stat st, now;
    ring_header h;
    pp_status s = PP_OK;
    if (fstat(fd, &st) != 0)
        s = pp_error(PP_ERR_IO, "shared-memory ring %s: fstat: %s", name, strerror(errno));
    else if (st.st_uid != geteuid())
        s = pp_error(PP_ERR_PARSE, "shared-memory ring %s belongs to another user", name);
    else if ((uint64_t)st.st_size <= HEADER_BYTES || (uint64_t)st.st_size > MAX_RING_BYTES + HEADER_BYTES ||
             (uint64_t)st.st_size % HEADER_BYTES)
        s = pp_error(PP_ERR_PARSE, "shared-memory ring %s has %lld bytes", name, (long long)st.st_size);
    /* the header is read, not mapped, first: read(2) of a hole gives zeros
     * (a bad header), where touching it through the mapping would allocate
     * it, or fault with SIGBUS on a full /dev/shm */
    else if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, RING_MAGIC, 8) != 0 ||
             h.header_bytes != HEADER_BYTES || h.data_bytes != (uint64_t)st.st_size - HEADER_BYTES ||
             h.allocated > h.data_bytes)
        s = pp_error(PP_ERR_PARSE, "shared-memory ring %s: bad header", name);
    /* the receiver reads only what the header says is allocated: an object
     * that has fewer pages (not made by pp_shm_ring_create) could fault
     * with SIGBUS when /dev/shm is full. Checked after the read: the
     * sender allocates before it says so */
    else if (fstat(fd, &now) != 0 || (uint64_t)now.st_blocks * 512 < HEADER_BYTES + h.allocated)
        s = pp_error(PP_ERR_PARSE, "shared-memory ring %s has fewer pages allocated than its header says", name);
    if (s == PP_OK) s = map_ring(r, fd, (size_t)st.st_size);
    close(fd);
    if (s != PP_OK) {
        if (r->hdr) munmap(r->hdr, r->map_bytes);
        free(r);
        return s;
    }
    r->size = (uint64_t)st.st_size - HEADER_BYTES; /* what is mapped, whatever the header says now */
    r->settled = atomic_load_explicit(&r->hdr->consumed, memory_order_acquire);
    atomic_store_explicit(&r->hdr->opened, 1, memory_order_release);
    shm_unlink(name); /* both sides have it mapped now */
    *out = r;
    return PP_OK;
}

const char *pp_shm_ring_name(const pp_shm_ring *r) { return r->name; }

size_t pp_shm_ring_bytes(const pp_shm_ring *r) { return (size_t)r->size; }

/* Where the receiver stands once the gap a skip left is counted as read:
 * settled at the start of the sender's last skip means nothing is left in
 * that lap (the receiver checks the same, so a skip costs no room). */
static uint64_t past_skip(const pp_shm_ring *r, uint64_t settled) {
    if (settled % r->size && atomic_load_explicit(&r->hdr->skip_from, memory_order_acquire) == settled)
        return settled - settled % r->size + r->size;
    return settled;
}

/* Sender: allocates the data area's pages up to past end (the byte after
 * a record too: a message ring's next skip writes its mark there), in
 * steps of ALLOC_STEP. 0: /dev/shm is full (the error says so). */
/* Allocates the data pages up to end (rounded up to a step). */
static int grow(pp_shm_ring *r, uint64_t end) {
    uint64_t want = (end + ALLOC_STEP - 1) / ALLOC_STEP * ALLOC_STEP;
    if (want > r->size) want = r->size;
    if (want <= r->alloc) return 1;
    int e;
    do /* tmpfs gives up with EINTR when a signal is pending: not a full /dev/shm */
        e = injected_failure() ? ENOSPC
                               : posix_fallocate(r->fd, (off_t)(HEADER_BYTES + r->alloc), (off_t)(want - r->alloc));
    while (e == EINTR);
    if (e != 0) {
        pp_error(PP_ERR_NOMEM, "shared-memory ring %s: cannot allocate %llu more bytes in /dev/shm: %s", r->name,
                 (unsigned long long)(want - r->alloc), strerror(e));
        return 0;
    }
    r->alloc = want;
    /* before any record in the new pages is named to the receiver */
    atomic_store_explicit(&r->hdr->allocated, want, memory_order_release);
    return 1;
}

/* extra: bytes after the record that must be allocated too (a message
 * ring's next skip mark goes where the next record would start) */
static int reserve(pp_shm_ring *r, size_t n, size_t extra, uint64_t *pos, void **dst) {
    if (n == 0 || n > r->size) return 0;
    uint64_t consumed = atomic_load_explicit(&r->hdr->consumed, memory_order_acquire);
    if (consumed > r->head) return 0; /* the receiver wrote nonsense: stop using the ring */
    int drained = consumed == r->head;
    if (r->skip_to != r->skip_from && consumed == r->skip_from) consumed = r->skip_to;
    uint64_t start = (r->head + r->align - 1) / r->align * r->align, off = start % r->size;
    /* no straddling the end; and, with everything consumed, back to offset
     * 0: the ring then reuses the pages it has touched (in cache, in RSS)
     * instead of walking all of them, at no cost in room */
    if (off && (off + n > r->size || drained)) {
        start += r->size - off;
        if (drained) consumed = start; /* nothing left before it */
    }
    if (start + n - consumed > r->size) return 0;
    /* pages not yet allocated: allocate them first (the common case is
     * this one compare); failing that, nothing has changed */
    uint64_t end = start % r->size + n + extra;
    if (end > r->alloc && r->alloc < r->size && !grow(r, end)) return -1;
    if (start % r->size == 0 && start > r->head && r->head % r->size) { /* skipped the rest of a lap */
        r->skip_from = r->head;
        r->skip_to = start;
        atomic_store_explicit(&r->hdr->skip_from, r->head, memory_order_release);
    }
    *pos = start;
    *dst = r->data + start % r->size;
    return 1;
}

int pp_shm_ring_reserve(pp_shm_ring *r, size_t n, uint64_t *pos, void **dst) { return reserve(r, n, 0, pos, dst); }

int pp_shm_ring_prealloc(pp_shm_ring *r, size_t n) {
    if (!r->owner || r->fd < 0) return 0;
    return grow(r, n < r->size ? n : r->size);
}

int pp_shm_ring_drained(const pp_shm_ring *r) {
    return atomic_load_explicit(&r->hdr->consumed, memory_order_acquire) == r->head;
}

int pp_shm_ring_opened(const pp_shm_ring *r) {
    return atomic_load_explicit(&r->hdr->opened, memory_order_acquire) != 0;
}

void pp_shm_ring_commit(pp_shm_ring *r, uint64_t pos, size_t n) {
    /* the bytes are visible before the envelope that names them can be */
    atomic_thread_fence(memory_order_release);
    r->head = pos + n;
}

/* Receiver: 1 if the data bytes [off, end) are allocated (the sender said
 * so before naming anything in them). Nothing else is ever read: touching
 * a page the sender never allocated would allocate it here, or fault with
 * SIGBUS when /dev/shm is full. */
static int allocated_to(const pp_shm_ring *r, uint64_t end) {
    return end <= atomic_load_explicit(&r->hdr->allocated, memory_order_acquire);
}

pp_status pp_shm_ring_locate(const pp_shm_ring *r, uint64_t pos, uint64_t n, const void **src) {
    if (n == 0 || n > r->size || pos > UINT64_MAX - n)
        return pp_error(PP_ERR_PARSE, "shared-memory record of %llu bytes in a ring of %llu",
                        (unsigned long long)n, (unsigned long long)r->size);
    uint64_t settled = past_skip(r, r->settled);
    if (pos < settled)
        return pp_error(PP_ERR_PARSE, "shared-memory record at %llu, before the consumed mark %llu",
                        (unsigned long long)pos, (unsigned long long)settled);
    if (pos + n - settled > r->size)
        return pp_error(PP_ERR_PARSE, "shared-memory record at %llu runs more than a lap past the "
                        "consumed mark %llu", (unsigned long long)pos, (unsigned long long)settled);
    if (pos % r->size + n > r->size)
        return pp_error(PP_ERR_PARSE, "shared-memory record at %llu straddles the end of the ring",
                        (unsigned long long)pos);
    if (!allocated_to(r, pos % r->size + n))
        return pp_error(PP_ERR_PARSE, "shared-memory record at %llu lies past what its sender allocated",
                        (unsigned long long)pos);
    atomic_thread_fence(memory_order_acquire); /* pairs with the sender's commit */
    *src = r->data + pos % r->size;
    return PP_OK;
}

/* With the lock held: the sender may reuse everything before the oldest
 * loan still out, or everything settled if none is. */
static void publish_consumed(pp_shm_ring *r) {
    while (r->nloans && r->loans[r->lfirst].returned) {
        r->lfirst++;
        r->nloans--;
        r->base_id++;
    }
    if (!r->nloans) r->lfirst = 0;
    uint64_t c = r->nloans ? r->loans[r->lfirst].start : r->settled;
    if (c > atomic_load_explicit(&r->hdr->consumed, memory_order_relaxed))
        atomic_store_explicit(&r->hdr->consumed, c, memory_order_release);
}

void pp_shm_ring_release(pp_shm_ring *r, uint64_t end) {
    if (end <= r->settled) return;
    pthread_mutex_lock(&r->lock);
    r->settled = end;
    publish_consumed(r);
    pthread_mutex_unlock(&r->lock);
}

void pp_shm_ring_set_align(pp_shm_ring *r, size_t align) { r->align = align ? align : 1; }

static void unmap_free(pp_shm_ring *r) {
    if (r->hdr) munmap(r->hdr, r->map_bytes);
    if (r->owner) shm_unlink(r->name); /* ENOENT once the receiver unlinked it */
    if (r->fd >= 0) close(r->fd);
    pthread_mutex_destroy(&r->lock);
    free(r->loans);
    free(r);
}

/* Drops one reference (the ring's owner or a loan); the last unmaps. */
static void unref(pp_shm_ring *r) {
    pthread_mutex_lock(&r->lock);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->lock);
    if (last) unmap_free(r);
}

static void return_loan(void *data, void *hint) {
    (void)data;
    loan_ticket *tk = hint;
    pp_shm_ring *r = tk->ring;
    pthread_mutex_lock(&r->lock);
    r->loans[r->lfirst + (tk->id - r->base_id)].returned = 1;
    publish_consumed(r);
    pthread_mutex_unlock(&r->lock);
    free(tk);
    unref(r);
}

pp_status pp_shm_ring_lend(pp_shm_ring *r, uint64_t pos, uint64_t n, pp_dtype dt, int ndim,
                           const int64_t *shape, pp_tensor **out) {
    const void *src;
    PP_TRY(pp_shm_ring_locate(r, pos, n, &src));
    if ((uintptr_t)src % 64) return pp_error(PP_ERR_UNSUPPORTED, "ring record at %llu is not aligned",
                                             (unsigned long long)pos);
    loan_ticket *tk = malloc(sizeof *tk);
    if (!tk) return pp_error(PP_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&r->lock);
    if (r->lfirst + r->nloans == r->lcap) { /* compact, or grow */
        if (r->lfirst) {
            memmove(r->loans, r->loans + r->lfirst, r->nloans * sizeof *r->loans);
            r->lfirst = 0;
        } else {
            size_t cap = r->lcap ? 2 * r->lcap : 16;
            loan *l = realloc(r->loans, cap * sizeof *l);
            if (!l) {
                pthread_mutex_unlock(&r->lock);
                free(tk);
                return pp_error(PP_ERR_NOMEM, "out of memory");
            }
            r->loans = l;
            r->lcap = cap;
        }
    }
    tk->ring = r;
    tk->id = r->base_id + r->nloans;
    r->loans[r->lfirst + r->nloans++] = (loan){pos, 0};
    r->refs++;
    pthread_mutex_unlock(&r->lock);
    pp_status s = pp_tensor_wrap(dt, ndim, shape, (void *)src, return_loan, tk, out);
    if (s != PP_OK) return_loan(NULL, tk);
    return s;
}

static uint64_t round8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

int pp_shm_ring_msg_reserve(pp_shm_ring *r, size_t len, uint64_t *pos, void **dst) {
    if (len > UINT32_MAX - 16) return 0;
    uint64_t n = round8(RECORD_HEADER + len);
    uint64_t before = r->head;
    void *at;
    int got = reserve(r, (size_t)n, sizeof(uint64_t), pos, &at);
    if (got <= 0) return got;
    if (*pos != before) { /* skipped the end of the lap: say so where a record would start */
        uint32_t mark = SKIP_MARK;
        memcpy(r->data + before % r->size, &mark, sizeof mark);
    }
    uint32_t hdr[2] = {(uint32_t)len, 0};
    memcpy(at, hdr, sizeof hdr);
    *dst = (unsigned char *)at + RECORD_HEADER;
    return 1;
}

int pp_shm_ring_msg_commit(pp_shm_ring *r, uint64_t pos, size_t len) {
    r->head = pos + round8(RECORD_HEADER + len);
    /* publish, then look at the waiting flag: with the receiver's store of
     * the flag before its load of head (both seq_cst), one of the two sees
     * the other, so a record is never left with nobody awake to read it */
    atomic_store_explicit(&r->hdr->head, r->head, memory_order_seq_cst);
    return atomic_load_explicit(&r->hdr->waiting, memory_order_seq_cst) != 0;
}

int pp_shm_ring_msg_next(pp_shm_ring *r, const void **data, size_t *len, uint64_t *end) {
    uint64_t head = atomic_load_explicit(&r->hdr->head, memory_order_seq_cst);
    /* at the sender's last skip: the rest of that lap is empty (its skip
     * mark may be overwritten already: the lap after it has the room) */
    uint64_t c = past_skip(r, r->settled);
    if (c == head || r->settled == head) return 0;
    if (head < c || head - c > r->size || c % 8) {
        pp_error(PP_ERR_PARSE, "message ring %s: head %llu, consumed %llu", r->name,
                 (unsigned long long)head, (unsigned long long)c);
        return -1;
    }
    uint32_t hdr[2];
    if (!allocated_to(r, c % r->size + RECORD_HEADER)) goto unallocated;
    memcpy(hdr, r->data + c % r->size, sizeof hdr);
    if (hdr[0] == SKIP_MARK) { /* the rest of this lap is empty */
        c += r->size - c % r->size;
        if (c == head) return 0;
        if (c > head) {
            pp_error(PP_ERR_PARSE, "message ring %s: skip past the head", r->name);
            return -1;
        }
        if (!allocated_to(r, RECORD_HEADER)) goto unallocated;
        memcpy(hdr, r->data, sizeof hdr);
    }
    uint64_t n = round8(RECORD_HEADER + (uint64_t)hdr[0]);
    if (hdr[0] == SKIP_MARK || c % r->size + n > r->size || c + n > head) {
        pp_error(PP_ERR_PARSE, "message ring %s: record of %u bytes at %llu does not fit", r->name,
                 hdr[0], (unsigned long long)c);
        return -1;
    }
    if (!allocated_to(r, c % r->size + n)) goto unallocated;
    *data = r->data + c % r->size + RECORD_HEADER;
    *len = hdr[0];
    *end = c + n;
    return 1;
unallocated:
    pp_error(PP_ERR_PARSE, "message ring %s: record at %llu lies past what its sender allocated", r->name,
             (unsigned long long)c);
    return -1;
}

void pp_shm_ring_set_waiting(pp_shm_ring *r, int waiting) {
    atomic_store_explicit(&r->hdr->waiting, waiting ? 1u : 0u, memory_order_seq_cst);
}

static unsigned long long pid_ns;

static void read_pid_ns(void) {
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (n <= 0) return;
    link[n] = 0;
    const char *open = strchr(link, '[');
    if (open) pid_ns = strtoull(open + 1, NULL, 10);
}

unsigned long long pp_shm_pid_ns(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_pid_ns);
    return pid_ns;
}

static int swept;

static void sweep(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *rest = NULL;
        if (strncmp(e->d_name, "pippin-bell-", 12) == 0) rest = e->d_name + 12;
        else if (strncmp(e->d_name, "pippin-", 7) == 0) rest = e->d_name + 7;
        if (!rest) continue;
        char *end;
        unsigned long long ns = strtoull(rest, &end, 16);
        if (end == rest || *end != '-' || ns != pp_shm_pid_ns()) continue; /* pids we cannot see */
        rest = end + 1;
        long pid = strtol(rest, &end, 10);
        if (end == rest || *end != '-' || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
        char path[512];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && st.st_uid == geteuid() && unlink(path) == 0) swept++;
    }
    closedir(d);
}

int pp_shm_sweep_stale(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, sweep);
    return swept;
}

void pp_shm_ring_close(pp_shm_ring *r) {
    if (r) unref(r);
}
