/* The bucketed ring all-reduce of gradients between replicas (grad_ring.h). */
#include "grad_ring.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grad_shm.h"
#include "grad_tcp.h"
#include "status_internal.h"
#include "vec.h"

/* Buckets of at most this many bytes times R - 1 are summed directly by
 * default (pp_grad_ring_options.direct_max_bytes): the small buckets,
 * whose time is latency. */
#define DIRECT_MAX_BYTES ((int64_t)128 << 10)
#define MAX_DIRECT_REPLICAS 64
/* A ring phase's chunk may go in pieces (pp_grad_ring_options.piece_bytes
 * > 0): piece j of the next phase leaves as soon as piece j of this one is
 * in, so the sums of one piece overlap the transfer of the next. Off by
 * default: on this project's 2-core machine every core is busy copying
 * during a transfer anyway, and each piece is one more message through
 * libzmq's I/O thread, received into a buffer glibc trims and faults in
 * again (16 MiB over tcp, 2 processes, loaded machine, per round against
 * whole chunks: pieces of 512 KiB 5x the system calls, 3x the page faults,
 * 1.4x the CPU time; of 2 MiB 1.8x, 1.6x, 1.1x). */

/* How a bucket is summed: not known until the stage's replicas agreed on
 * shared memory (grad_shm.h), then direct links (grad_tcp.h); else through
 * the transport. */
enum { WAY_PENDING, WAY_TRANSPORT, WAY_SHM, WAY_TCP };

typedef struct bucket {
    int stage, id;      /* id: the stage's bucket number this step */
    pp_flat_params *fp; /* the stage's flat gradients (and, sharded, parameters) */
    int64_t off, len;   /* elements */
    int direct;         /* summed directly: phase 0 the sum, phase 1 the all-gather */
    int phase;          /* ring: 0 .. 2(R-1): reduce-scatter, then all-gather; 2(R-1): done (every phase
                           before this one sent and received whole) */
    int start;          /* ring: the run's first phase (the all-gather of the parameters starts at R - 1) */
    int sent;           /* direct: this phase's copy has left */
    int *psent, *pgot;  /* ring: [2(R-1)] pieces of each phase sent, and received and applied */
    int limit;          /* the phase it may run to now */
    int params;         /* sharded, after the update: the all-gather moves parameters */
    int full;           /* sharded: summed whole all the same (pp_grad_ring_add) */
    pp_tensor **got;    /* direct: [R] what each replica sent in this phase */
    int way;            /* WAY_* */
} bucket;

/* Chunks sent straight from the flat buffers: the transport (or libzmq's
 * I/O thread) may read them after the send returned, so they are counted
 * until it lets go, and nothing the ring sent is changed before the count
 * is back to zero. Shared with the deleters, which can run on libzmq's
 * thread after the ring is gone. */
typedef struct loans {
    atomic_int refs; /* the ring's, and one per chunk out */
    pthread_mutex_t lock;
    pthread_cond_t back; /* out reached zero */
    int out;             /* under lock */
} loans;

typedef struct loan {
    loans *l;
    pp_tensor *view; /* keeps the flat buffers alive */
} loan;

struct pp_grad_ring {
    pp_grad_ring_options o;
    int64_t step;
    bucket *b;
    int n, cap;
    int done;           /* buckets before this one are all done (they finish in order only when waited for) */
    int *next_id;       /* [n_stages]: the next bucket id per stage */
    int overlapped;     /* buckets already summed when the step waited for the rest */
    loans *loans;
    pp_grad_shm **shm;  /* [n_stages]: the stage's shared-memory group, once its first bucket came */
    pp_grad_tcp **tcp;  /* [n_stages]: its direct links, once shared memory was declined */
    char *lost;         /* [n_stages]: the agreement failed half way: both groups dropped at the next begin */
    /* [n_stages]: the id of the stage's bucket whose shared-memory (or
     * direct-link) collective comes next. A group runs one at a time, and
     * every replica must run them in the same order (their rounds are
     * matched one for one): bucket order, never the order in which
     * buckets became ready or the replicas agreed */
    int *turn;
};

static void loans_unref(loans *l) {
    if (atomic_fetch_sub(&l->refs, 1) == 1) {
        pthread_cond_destroy(&l->back);
        pthread_mutex_destroy(&l->lock);
        free(l);
    }
}

static void loan_done(void *data, void *hint) {
    (void)data;
    loan *ln = hint;
    pp_tensor_free(ln->view);
    pthread_mutex_lock(&ln->l->lock);
    if (--ln->l->out == 0) pthread_cond_broadcast(&ln->l->back);
    pthread_mutex_unlock(&ln->l->lock);
    loans_unref(ln->l);
    free(ln);
}

pp_status pp_grad_ring_new(const pp_grad_ring_options *o, pp_grad_ring **out) {
    *out = NULL;
    if (o->replicas < 2 || o->replica < 0 || o->replica >= o->replicas || o->n_stages < 1 ||
        o->first_bucket_bytes <= 0 || o->bucket_bytes <= 0)
        return pp_error(PP_ERR_INVALID, "gradient ring: replica %d of %d, %d stages, buckets of %lld and %lld bytes",
                        o->replica, o->replicas, o->n_stages, (long long)o->first_bucket_bytes,
                        (long long)o->bucket_bytes);
    pp_grad_ring *g = calloc(1, sizeof *g);
    if (g) g->next_id = calloc((size_t)o->n_stages, sizeof *g->next_id);
    if (g) g->loans = calloc(1, sizeof *g->loans);
    if (g) g->shm = calloc((size_t)o->n_stages, sizeof *g->shm);
    if (g) g->tcp = calloc((size_t)o->n_stages, sizeof *g->tcp);
    if (g) g->lost = calloc((size_t)o->n_stages, 1);
    if (g) g->turn = calloc((size_t)o->n_stages, sizeof *g->turn);
    if (!g || !g->next_id || !g->loans || !g->shm || !g->tcp || !g->lost || !g->turn) {
        if (g) free(g->next_id), free(g->loans), free(g->shm), free(g->tcp), free(g->lost), free(g->turn);
        free(g);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    atomic_init(&g->loans->refs, 1);
    pthread_mutex_init(&g->loans->lock, NULL);
    pthread_cond_init(&g->loans->back, NULL);
    g->o = *o;
    *out = g;
    return PP_OK;
}

static void drop_got(pp_grad_ring *g, bucket *b) {
    for (int j = 0; b->got && j < g->o.replicas; j++) {
        pp_tensor_free(b->got[j]);
        b->got[j] = NULL;
    }
}

static void drop_buckets(pp_grad_ring *g) {
    for (int i = 0; i < g->n; i++) {
        drop_got(g, &g->b[i]);
        free(g->b[i].got);
        free(g->b[i].psent);
    }
    g->n = 0;
}

void pp_grad_ring_free(pp_grad_ring *g) {
    if (!g) return;
    drop_buckets(g);
    loans_unref(g->loans); /* chunks still out keep it (and their buffers) until they are let go */
    for (int s = 0; s < g->o.n_stages; s++) pp_grad_shm_free(g->shm[s]), pp_grad_tcp_free(g->tcp[s]);
    free(g->shm);
    free(g->tcp);
    free(g->lost);
    free(g->turn);
    free(g->b);
    free(g->next_id);
    free(g);
}

void pp_grad_ring_begin(pp_grad_ring *g, int64_t step) {
    g->step = step;
    drop_buckets(g);
    g->done = 0;
    memset(g->next_id, 0, sizeof *g->next_id * (size_t)g->o.n_stages);
    memset(g->turn, 0, sizeof *g->turn * (size_t)g->o.n_stages);
    /* a group left mid-sum or mid-agreement by a failed step: its counters
     * no longer match the peers'; agreed again from scratch */
    for (int s = 0; s < g->o.n_stages; s++)
        if (g->lost[s] || (g->shm[s] && pp_grad_shm_broken(g->shm[s])) ||
            (g->tcp[s] && pp_grad_tcp_broken(g->tcp[s]))) {
            pp_grad_shm_free(g->shm[s]);
            pp_grad_tcp_free(g->tcp[s]);
            g->shm[s] = NULL;
            g->tcp[s] = NULL;
            g->lost[s] = 0;
        } else if (g->shm[s]) {
            pp_grad_shm_set_step(g->shm[s], step);
        }
}

void pp_grad_ring_drop_groups(pp_grad_ring *g) {
    for (int s = 0; s < g->o.n_stages; s++) {
        pp_grad_shm_free(g->shm[s]);
        pp_grad_tcp_free(g->tcp[s]);
        g->shm[s] = NULL;
        g->tcp[s] = NULL;
        g->lost[s] = 0;
    }
}

int pp_grad_ring_buckets(const pp_grad_ring *g) { return g->n; }
int pp_grad_ring_overlapped(const pp_grad_ring *g) { return g->overlapped; }

int pp_grad_ring_shm_buckets(const pp_grad_ring *g) {
    int n = 0;
    for (int i = 0; i < g->n; i++) n += g->b[i].way == WAY_SHM;
    return n;
}

int pp_grad_ring_tcp_buckets(const pp_grad_ring *g) {
    int n = 0;
    for (int i = 0; i < g->n; i++) n += g->b[i].way == WAY_TCP;
    return n;
}

/* The way the stage's replicas agreed on so far (WAY_PENDING: not yet). */
static int stage_way(const pp_grad_ring *g, int stage) {
    if (!g->shm[stage]) return WAY_TRANSPORT;
    if (pp_grad_shm_in_use(g->shm[stage])) return WAY_SHM;
    if (!g->tcp[stage]) return WAY_PENDING;
    if (pp_grad_tcp_in_use(g->tcp[stage])) return WAY_TCP;
    return pp_grad_tcp_broken(g->tcp[stage]) ? WAY_PENDING : WAY_TRANSPORT;
}

/* Direct links carry only the ring: a small bucket meant to be summed
 * directly goes round it instead (the same bits: the ring's order). */
static void use_way(pp_grad_ring *g, bucket *b, int way) {
    b->way = way;
    if (way != WAY_TCP || !b->direct) return;
    drop_got(g, b);
    free(b->got);
    b->got = NULL;
    b->direct = 0;
    b->limit = g->o.shard && !b->full ? g->o.replicas - 1 : 2 * (g->o.replicas - 1);
}

static pp_status push(pp_grad_ring *g, int stage, pp_flat_params *fp, int full, int64_t off, int64_t len) {
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        bucket *nb = realloc(g->b, sizeof *nb * (size_t)cap);
        if (!nb) return pp_error(PP_ERR_NOMEM, "out of memory");
        g->b = nb, g->cap = cap;
    }
    int r = g->o.replicas;
    int64_t dmax = g->o.direct_max_bytes ? g->o.direct_max_bytes : DIRECT_MAX_BYTES;
    int direct = r <= MAX_DIRECT_REPLICAS && (int64_t)(r - 1) * len * (int64_t)sizeof(float) <= dmax;
    bucket b = {stage, g->next_id[stage]++, fp, off, len, direct, 0, 0, 0, NULL, NULL, 0, 0, full, NULL, WAY_TRANSPORT};
    b.limit = direct ? 1 : g->o.shard && !full ? r - 1 : 2 * (r - 1);
    if (direct && !(b.got = calloc((size_t)r, sizeof *b.got))) return pp_error(PP_ERR_NOMEM, "out of memory");
    if (!(b.psent = calloc((size_t)(4 * (r - 1)), sizeof *b.psent))) {
        free(b.got);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    b.pgot = b.psent + 2 * (r - 1);
    g->b[g->n] = b;
    use_way(g, &g->b[g->n++], stage_way(g, stage));
    return PP_OK;
}

/* The buckets of fp: from the last parameter back, whole parameters until
 * the bucket is full (one larger than a bucket is a bucket of its own); the
 * padding between them rides along (it is zero everywhere). Calls
 * each(user, off, len) in that order. */
static pp_status cut(const pp_grad_ring_options *o, const pp_flat_params *fp,
                     pp_status (*each)(void *user, int64_t off, int64_t len), void *user) {
    if (!fp || fp->total == 0) return PP_OK;
    int64_t end = fp->total, cap = o->first_bucket_bytes / (int64_t)sizeof(float);
    for (int i = fp->n - 1; i >= 0; i--) {
        int64_t start = i == 0 ? 0 : fp->offset[i];
        if ((end - start) >= cap || i == 0) {
            PP_TRY(each(user, start, end - start));
            end = start;
            cap = o->bucket_bytes / (int64_t)sizeof(float);
        }
    }
    if (end > 0) PP_TRY(each(user, 0, end)); /* fp->n == 0 with padding only */
    return PP_OK;
}

typedef struct add_ctx {
    pp_grad_ring *g;
    int stage;
    pp_flat_params *fp;
    int full;
} add_ctx;

static pp_status add_one(void *user, int64_t off, int64_t len) {
    add_ctx *a = user;
    return push(a->g, a->stage, a->fp, a->full, off, len);
}

pp_status pp_grad_ring_add(pp_grad_ring *g, int stage, pp_flat_params *fp, int full) {
    if (stage < 0 || stage >= g->o.n_stages) return pp_error(PP_ERR_INVALID, "gradient ring: no stage %d", stage);
    if (!g->shm[stage] && fp && fp->total > 0) {
        /* the stage's first bucket: offer shared memory (once; "no" too, so
         * that every replica learns whether all can) */
        pp_grad_shm_options so = {g->o.t, g->o.replicas, g->o.replica, g->o.n_stages, stage, g->o.shm_slot_bytes,
                                  g->o.same_host >= 0};
        PP_TRY(pp_grad_shm_new(&so, g->step, &g->shm[stage]));
    }
    add_ctx a = {g, stage, fp, full};
    PP_TRY(cut(&g->o, fp, add_one, &a));
    return pp_grad_ring_progress(g);
}

/* ---- one bucket's ring ---- */

static int mod(int a, int r) { return ((a % r) + r) % r; }

/* The chunk this replica sends in phase p, and the one it receives. */
static void phase_chunks(const pp_grad_ring *g, int p, int *send, int *recv) {
    int r = g->o.replicas, k = g->o.replica;
    if (p < r - 1) {
        *send = mod(k - p, r);
        *recv = mod(k - p - 1, r);
    } else {
        int t = p - (r - 1);
        *send = mod(k + 1 - t, r);
        *recv = mod(k - t, r);
    }
}

static void chunk_of(int r, int64_t off, int64_t len, int c, int64_t *lo, int64_t *n) {
    int64_t a = len * c / r, z = len * (c + 1) / r;
    *lo = off + a;
    *n = z - a;
}

static void chunk_range(const pp_grad_ring *g, const bucket *b, int c, int64_t *lo, int64_t *n) {
    chunk_of(g->o.replicas, b->off, b->len, c, lo, n);
}

/* What a bucket's phase reads and writes: the gradients, or (sharded, the
 * all-gather after the update) the parameters. */
static float *phase_buf(const bucket *b) { return b->params ? b->fp->data : b->fp->grad; }

/* Elements per piece of a ring phase's chunk, and chunk c's piece j. An
 * empty chunk is one empty piece (the message still says "done"). */
static int64_t piece_elems(const pp_grad_ring *g) {
    int64_t bytes = g->o.piece_bytes;
    if (bytes <= 0) return INT64_MAX / 2;
    return bytes < (int64_t)sizeof(float) ? 1 : bytes / (int64_t)sizeof(float);
}

static int pieces_of(const pp_grad_ring *g, const bucket *b, int c) {
    int64_t lo, n, pe = piece_elems(g);
    chunk_range(g, b, c, &lo, &n);
    return n == 0 ? 1 : (int)((n + pe - 1) / pe);
}

static void piece_range(const pp_grad_ring *g, const bucket *b, int c, int j, int64_t *lo, int64_t *n) {
    int64_t pe = piece_elems(g), clo, cn;
    chunk_range(g, b, c, &clo, &cn);
    int64_t a = (int64_t)j * pe, z = a + pe < cn ? a + pe : cn;
    *lo = clo + a;
    *n = z > a ? z - a : 0;
}

/* The key of piece j of phase p, sent to the next replica or received
 * from the previous one. */
static void ring_key(const pp_grad_ring *g, const bucket *b, int p, int j, int sending, char *name, size_t cap,
                     pp_transport_key *k) {
    int r = g->o.replicas, me = g->o.replica, s = g->o.n_stages;
    int peer = sending ? mod(me + 1, r) : mod(me - 1, r);
    snprintf(name, cap, "pippin:ring:%d:%d", p, j);
    int mine = me * s + b->stage, theirs = peer * s + b->stage;
    *k = (pp_transport_key){PP_MSG_GRADIENT, g->step, PP_GRAD_RING_MICROBATCH + b->id, sending ? mine : theirs,
                            sending ? theirs : mine, name};
}

/* Elements [lo, lo + n) of the bucket's phase buffer as a tensor to send:
 * a copy (copy 1), or the buffer itself on loan (counted until the
 * transport lets go of it). */
static pp_status chunk_tensor(pp_grad_ring *g, bucket *b, int64_t lo, int64_t n, int copy, pp_tensor **out) {
    if (copy) {
        PP_TRY(pp_tensor_empty(PP_F32, 1, (int64_t[]){n}, out));
        pp_grad_copy((*out)->data, phase_buf(b) + lo, n);
        return PP_OK;
    }
    loan *ln = malloc(sizeof *ln);
    if (!ln) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = pp_flat_params_range_view(b->fp, !b->params, lo, n, &ln->view);
    if (s != PP_OK) {
        free(ln);
        return s;
    }
    ln->l = g->loans;
    atomic_fetch_add(&g->loans->refs, 1);
    pthread_mutex_lock(&g->loans->lock);
    g->loans->out++;
    pthread_mutex_unlock(&g->loans->lock);
    s = pp_tensor_wrap(PP_F32, 1, (int64_t[]){n}, ln->view->data, loan_done, ln, out);
    if (s != PP_OK) loan_done(NULL, ln);
    return s;
}

/* Sends piece j of phase p straight from the gradients: within a bucket a
 * piece is changed again only after every replica has it (the all-gather
 * brings it back summed, which needs this replica's part), and the last
 * ones are waited for before finish returns (settle). */
static pp_status send_piece(pp_grad_ring *g, bucket *b, int p, int j) {
    int c, unused;
    phase_chunks(g, p, &c, &unused);
    int64_t lo, n;
    piece_range(g, b, c, j, &lo, &n);
    pp_tensor *t;
    PP_TRY(chunk_tensor(g, b, lo, n, 0, &t));
    char name[64];
    pp_transport_key k;
    ring_key(g, b, p, j, 1, name, sizeof name, &k);
    pp_status s = pp_transport_send(g->o.t, &k, t);
    pp_tensor_free(t);
    if (s == PP_OK) b->psent[p]++;
    return s;
}

static pp_status chunk_error(const pp_grad_ring *g, const bucket *b, int from, int c, const pp_tensor *in,
                             int64_t n) {
    return pp_error(PP_ERR_PEER, "replica %d sent stage %d's gradient chunk %d of bucket %d with %lld values, "
                    "expected %lld float32 (do the replicas hold the same stage and gradient ring options?)", from,
                    b->stage, c, b->id, (long long)pp_tensor_numel(in), (long long)n);
}

static int chunk_ok(const pp_tensor *in, int64_t n) { return in->dtype == PP_F32 && in->ndim == 1 && in->shape[0] == n; }

/* dst += src: a received chunk (the transport's memory, never the
 * bucket's), so restrict holds and the loop vectorizes (vec.h). */
PP_VEC_CLONES static void add_chunk(float *restrict dst, const float *restrict src, int64_t n) {
    PP_VFOR(i, n, dst[i] += src[i];);
}

/* Adds (reduce-scatter) or copies (all-gather) piece j of phase p received,
 * reading it where the transport put it (the sender's ring, or the frame).
 * A piece's sum is the chunk's order: replica c's values first, then each
 * next replica's as the piece goes round, whatever the pieces. */
static pp_status apply_piece(pp_grad_ring *g, bucket *b, int p, int j, pp_tensor *in) {
    int unused, c;
    phase_chunks(g, p, &unused, &c);
    int64_t lo, n;
    piece_range(g, b, c, j, &lo, &n);
    if (!chunk_ok(in, n)) return chunk_error(g, b, mod(g->o.replica - 1, g->o.replicas), c, in, n);
    float *dst = phase_buf(b) + lo;
    const float *src = in->data;
    if (p < g->o.replicas - 1 && !b->params)
        add_chunk(dst, src, n);
    else
        pp_grad_copy(dst, src, n);
    b->pgot[p]++;
    return PP_OK;
}

static pp_status recv_error(const pp_grad_ring *g, const bucket *b, int from, pp_status s) {
    return pp_error_context(s, "summing stage %d's gradients with replica %d (bucket %d)", b->stage, from, b->id);
}

/* Receives piece pgot[p] of phase p (wait 0: if it arrived) and applies
 * it; *got says whether it came. */
static pp_status recv_piece(pp_grad_ring *g, bucket *b, int p, int wait, int timeout_ms, int *got) {
    char name[64];
    pp_transport_key k;
    int j = b->pgot[p];
    ring_key(g, b, p, j, 0, name, sizeof name, &k);
    pp_tensor *in = NULL;
    *got = 0;
    pp_status s = wait ? pp_transport_recv(g->o.t, &k, timeout_ms, &in) : pp_transport_try_recv(g->o.t, &k, &in);
    if (s != PP_OK) return recv_error(g, b, mod(g->o.replica - 1, g->o.replicas), s);
    if (!in) return PP_OK;
    s = apply_piece(g, b, p, j, in);
    pp_tensor_free(in);
    *got = s == PP_OK;
    return s;
}

/* Runs a ring bucket on; wait 0: only as far as what has arrived allows.
 * Every phase moves at once, piece by piece: piece j of phase p leaves
 * once piece j of phase p - 1 is in (the chunk a phase sends is the one
 * the phase before received), so the reduce-scatter and the all-gather
 * overlap and nothing waits for a whole chunk. */
static pp_status advance_ring(pp_grad_ring *g, bucket *b, int wait, int timeout_ms) {
    /* look: poll for what arrived (each look polls libzmq), when not
     * waiting; waiting, each piece is asked for directly (what arrived
     * before is in the mailbox, which a receive reads first) */
    for (int look = !wait;;) {
        int got_any = 0;
        for (int p = b->phase; p < b->limit; p++) {
            int cs, cr;
            phase_chunks(g, p, &cs, &cr);
            int ns = pieces_of(g, b, cs), nr = pieces_of(g, b, cr);
            while (b->psent[p] < ns && (p == b->start || b->pgot[p - 1] > b->psent[p]))
                PP_TRY(send_piece(g, b, p, b->psent[p]));
            /* a later phase's piece only once the piece before it came */
            for (int got = 1; look && got && b->pgot[p] < nr && (p == b->phase || b->pgot[p - 1] > b->pgot[p]);) {
                PP_TRY(recv_piece(g, b, p, 0, timeout_ms, &got));
                got_any |= got;
            }
        }
        while (b->phase < b->limit) {
            int cs, cr;
            phase_chunks(g, b->phase, &cs, &cr);
            if (b->psent[b->phase] < pieces_of(g, b, cs) || b->pgot[b->phase] < pieces_of(g, b, cr)) break;
            b->phase++;
        }
        if (b->phase == b->limit || !wait) return PP_OK;
        if (got_any) continue; /* the sends it allowed went in this pass; more may have come */
        /* nothing to do but wait: for the first piece still missing */
        int p = b->phase, cs, cr;
        for (; p < b->limit; p++) {
            phase_chunks(g, p, &cs, &cr);
            if (b->pgot[p] < pieces_of(g, b, cr)) break;
        }
        if (p == b->limit) /* never: sends wait only for receives */
            return pp_error(PP_ERR_INTERNAL, "gradient ring: stage %d bucket %d stuck in phase %d", b->stage, b->id,
                            b->phase);
        int got;
        PP_TRY(recv_piece(g, b, p, 1, timeout_ms, &got));
    }
}

/* ---- a small bucket, summed directly ---- */

static void direct_key(const pp_grad_ring *g, const bucket *b, int peer, int sending, pp_transport_key *k) {
    int s = g->o.n_stages, mine = g->o.replica * s + b->stage, theirs = peer * s + b->stage;
    *k = (pp_transport_key){PP_MSG_GRADIENT, g->step, PP_GRAD_RING_MICROBATCH + b->id, sending ? mine : theirs,
                            sending ? theirs : mine, b->phase ? "pippin:ring:gather" : "pippin:ring:sum"};
}

/* Phase 0: every replica's whole bucket to every other; phase 1
 * (sharded, the parameters after the update): each replica's shard, chunk
 * k + 1 (what the ring's reduce-scatter leaves it). A copy is sent: the
 * sum is written over the bucket while the peers may still read it. */
static pp_status direct_send(pp_grad_ring *g, bucket *b) {
    int r = g->o.replicas, me = g->o.replica;
    int64_t lo = b->off, n = b->len;
    if (b->phase) chunk_range(g, b, mod(me + 1, r), &lo, &n);
    pp_tensor *t;
    PP_TRY(chunk_tensor(g, b, lo, n, 1, &t));
    pp_status s = PP_OK;
    for (int j = 1; j < r && s == PP_OK; j++) {
        pp_transport_key k;
        direct_key(g, b, mod(me + j, r), 1, &k);
        s = pp_transport_send(g->o.t, &k, t);
    }
    pp_tensor_free(t);
    if (s == PP_OK) b->sent = 1;
    return s;
}

/* Chunk c summed in the ring's order: replica c's values, then c+1's, ...
 * (bit for bit what the ring gives), over this replica's own buffer. */
static void direct_sum(pp_grad_ring *g, bucket *b) {
    int r = g->o.replicas, me = g->o.replica;
    float *buf = phase_buf(b);
    for (int c = 0; c < r; c++) {
        int64_t lo, n;
        chunk_range(g, b, c, &lo, &n);
        const float *xs[MAX_DIRECT_REPLICAS]; /* operands in summation order */
        for (int j = 0; j < r; j++) {
            int who = mod(c + j, r);
            xs[j] = who == me ? buf + lo : (const float *)b->got[who]->data + (lo - b->off);
        }
        float *dst = buf + lo;
        for (int64_t i = 0; i < n; i++) {
            float acc = xs[0][i];
            for (int j = 1; j < r; j++) acc += xs[j][i];
            dst[i] = acc;
        }
    }
}

static pp_status advance_direct(pp_grad_ring *g, bucket *b, int wait, int timeout_ms) {
    int r = g->o.replicas, me = g->o.replica;
    while (b->phase < b->limit) {
        if (!b->sent) PP_TRY(direct_send(g, b));
        for (int j = 1; j < r; j++) {
            int from = mod(me + j, r);
            if (b->got[from]) continue;
            pp_transport_key k;
            direct_key(g, b, from, 0, &k);
            pp_tensor *in = NULL;
            pp_status s = wait ? pp_transport_recv(g->o.t, &k, timeout_ms, &in) : pp_transport_try_recv(g->o.t, &k, &in);
            if (s != PP_OK) return recv_error(g, b, from, s);
            if (!in) return PP_OK;
            int64_t lo = b->off, n = b->len;
            if (b->phase) chunk_range(g, b, mod(from + 1, r), &lo, &n);
            if (!chunk_ok(in, n)) {
                s = chunk_error(g, b, from, b->phase ? mod(from + 1, r) : -1, in, n);
                pp_tensor_free(in);
                return s;
            }
            b->got[from] = in;
        }
        if (b->phase == 0) {
            direct_sum(g, b);
        } else {
            for (int j = 1; j < r; j++) {
                int from = mod(me + j, r);
                int64_t lo, n;
                chunk_range(g, b, mod(from + 1, r), &lo, &n);
                pp_grad_copy(phase_buf(b) + lo, b->got[from]->data, n);
            }
        }
        drop_got(g, b);
        b->phase++;
        b->sent = 0;
    }
    return PP_OK;
}

/* ---- through shared memory ---- */

/* The stage's way, agreed as far as what arrived allows: shared memory
 * first; if declined, direct links (offered only then, so that replicas
 * sharing memory never open sockets). */
static pp_status agree_way(pp_grad_ring *g, bucket *b, int wait, int timeout_ms) {
    int st = b->stage, decided;
    if (g->lost[st]) return pp_error(PP_ERR_STATE, "gradient ring: stage %d's agreement failed this step", st);
    PP_TRY(pp_grad_shm_agree(g->shm[st], wait, timeout_ms, &decided));
    if (!decided) return PP_OK;
    if (!pp_grad_shm_in_use(g->shm[st])) {
        if (!g->tcp[st]) {
            pp_grad_tcp_options to = {g->o.t, g->o.replicas, g->o.replica, g->o.n_stages, st, g->o.sockets >= 0};
            pp_status s = pp_grad_tcp_new(&to, g->step, &g->tcp[st]);
            if (s != PP_OK) {
                g->lost[st] = 1; /* the peers' offers of this step go unanswered: all agree afresh */
                return s;
            }
        }
        PP_TRY(pp_grad_tcp_agree(g->tcp[st], wait, timeout_ms, &decided));
        if (!decided) return PP_OK;
    }
    int way = stage_way(g, st);
    for (int i = 0; i < g->n; i++)
        if (g->b[i].stage == st && g->b[i].way == WAY_PENDING) use_way(g, &g->b[i], way);
    return PP_OK;
}

/* The stage's buckets in order: one that is ready (or whose pass saw the
 * agreement come in) before an earlier one waits for it. */
static pp_status my_turn(pp_grad_ring *g, bucket *b, int wait, int *yes) {
    *yes = b->id == g->turn[b->stage];
    if (*yes || !wait) return PP_OK;
    return pp_error(PP_ERR_INTERNAL, "gradient ring: stage %d's bucket %d waited for before bucket %d "
                    "(shared memory and direct links take them in order)", b->stage, b->id, g->turn[b->stage]);
}

static pp_status advance_shm(pp_grad_ring *g, bucket *b, int wait, int timeout_ms) {
    pp_grad_shm *sh = g->shm[b->stage];
    int yes;
    PP_TRY(my_turn(g, b, wait, &yes));
    if (!yes) return PP_OK;
    /* sharded: the reduce-scatter (the whole sum for a bucket summed
     * whole), then after the update the all-gather of the parameters */
    int mode = b->params ? PP_SHM_GATHER : g->o.shard && !b->full ? PP_SHM_SCATTER : PP_SHM_SUM;
    int done;
    int tmo = timeout_ms < 0 ? pp_transport_timeout_ms(g->o.t) : timeout_ms;
    PP_TRY(pp_grad_shm_run(sh, mode, phase_buf(b), b->off, b->len, b->id, wait, tmo, &done));
    if (done) {
        b->phase = b->limit;
        g->turn[b->stage]++;
    }
    return PP_OK;
}

/* ---- over direct links ---- */

static pp_status advance_tcp(pp_grad_ring *g, bucket *b, int wait, int timeout_ms) {
    int yes;
    PP_TRY(my_turn(g, b, wait, &yes));
    if (!yes) return PP_OK;
    int r = g->o.replicas, n = b->limit - b->start;
    pp_grad_tcp_phase ph[2 * MAX_DIRECT_REPLICAS], *php = n <= 2 * MAX_DIRECT_REPLICAS ? ph : malloc(sizeof *php * (size_t)n);
    if (!php) return pp_error(PP_ERR_NOMEM, "out of memory");
    float *buf = phase_buf(b);
    for (int i = 0; i < n; i++) {
        int p = b->start + i, cs, cr;
        int64_t lo_s, n_s, lo_r, n_r;
        phase_chunks(g, p, &cs, &cr);
        chunk_range(g, b, cs, &lo_s, &n_s);
        chunk_range(g, b, cr, &lo_r, &n_r);
        php[i] = (pp_grad_tcp_phase){buf + lo_s, n_s, buf + lo_r, n_r, p < r - 1 && !b->params};
    }
    int done, tmo = timeout_ms < 0 ? pp_transport_timeout_ms(g->o.t) : timeout_ms;
    pp_status s = pp_grad_tcp_run(g->tcp[b->stage], php, n, b->id, wait, tmo, &done);
    if (php != ph) free(php);
    PP_TRY(s);
    if (done) {
        b->phase = b->limit;
        g->turn[b->stage]++;
    }
    return PP_OK;
}

static pp_status advance(pp_grad_ring *g, bucket *b, int wait, int timeout_ms) {
    /* done (buckets of several stages finish out of order): a shared-memory
     * or direct-link sum must not start again, its peers would wait for it */
    if (b->way != WAY_PENDING && b->phase >= b->limit) return PP_OK;
    if (b->way == WAY_PENDING) PP_TRY(agree_way(g, b, wait, timeout_ms));
    if (b->way == WAY_PENDING) return PP_OK;
    if (b->way == WAY_SHM) return advance_shm(g, b, wait, timeout_ms);
    if (b->way == WAY_TCP) return advance_tcp(g, b, wait, timeout_ms);
    return b->direct ? advance_direct(g, b, wait, timeout_ms) : advance_ring(g, b, wait, timeout_ms);
}

/* Waits until the transport has let go of every chunk sent from the flat
 * buffers (on the socket path libzmq's I/O thread may still be writing the
 * last ones; it needs nothing from this thread): one sleep, woken by the
 * last release. */
static pp_status settle(pp_grad_ring *g, int timeout_ms) {
    loans *l = g->loans;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&l->lock);
    int rc = 0;
    while (l->out > 0 && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&l->back, &l->lock, &until);
    int out = l->out;
    pthread_mutex_unlock(&l->lock);
    if (out == 0) return PP_OK;
    return pp_error(PP_ERR_TIMEOUT, "gradient ring: %d chunks sent to replica %d still not written out after %d ms",
                    out, mod(g->o.replica + 1, g->o.replicas), timeout_ms);
}

pp_status pp_grad_ring_progress(pp_grad_ring *g) {
    for (int i = g->done; i < g->n; i++) PP_TRY(advance(g, &g->b[i], 0, 0));
    while (g->done < g->n && g->b[g->done].phase == g->b[g->done].limit) g->done++;
    return PP_OK;
}

pp_status pp_grad_ring_finish(pp_grad_ring *g, int timeout_ms) {
    g->overlapped = 0;
    for (int i = 0; i < g->n; i++) g->overlapped += g->b[i].phase == g->b[i].limit;
    for (; g->done < g->n; g->done++) PP_TRY(advance(g, &g->b[g->done], 1, timeout_ms));
    return settle(g, pp_grad_ring_settle_ms(g, timeout_ms));
}

int pp_grad_ring_settle_ms(const pp_grad_ring *g, int timeout_ms) {
    return timeout_ms < 0 ? pp_transport_timeout_ms(g->o.t) : timeout_ms;
}

pp_status pp_grad_ring_gather(pp_grad_ring *g, int timeout_ms) {
    if (!g->o.shard) return PP_OK;
    /* every bucket's all-gather, now of the parameters; a bucket summed
     * whole (full) goes through its all-gather phases a second time */
    for (int i = 0; i < g->n; i++) {
        bucket *b = &g->b[i];
        b->phase = b->start = b->direct ? 1 : g->o.replicas - 1;
        b->sent = 0;
        if (b->psent)
            for (int p = b->start; p < 2 * (g->o.replicas - 1); p++) b->psent[p] = b->pgot[p] = 0;
        b->params = 1;
        b->limit = b->direct ? 2 : 2 * (g->o.replicas - 1);
    }
    g->done = 0;
    memset(g->turn, 0, sizeof *g->turn * (size_t)g->o.n_stages);
    return pp_grad_ring_finish(g, timeout_ms);
}

/* ---- the shard a replica owns (ZeRO-1) ---- */

typedef struct shard_ctx {
    const pp_grad_ring_options *o;
    int replica;
    pp_ring_ranges *out;
} shard_ctx;

/* After the reduce-scatter, replica k holds the sum of chunk k+1 (mod R) of
 * every bucket: the last chunk it received. */
static pp_status shard_one(void *user, int64_t off, int64_t len) {
    shard_ctx *c = user;
    pp_ring_ranges *r = c->out;
    int64_t lo, n;
    chunk_of(c->o->replicas, off, len, (c->replica + 1) % c->o->replicas, &lo, &n);
    if (n == 0) return PP_OK;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        int64_t *nl = realloc(r->lo, sizeof *nl * (size_t)cap);
        if (nl) r->lo = nl;
        int64_t *nn = nl ? realloc(r->len, sizeof *nn * (size_t)cap) : NULL;
        if (!nn) return pp_error(PP_ERR_NOMEM, "out of memory");
        r->len = nn, r->cap = cap;
    }
    r->lo[r->n] = lo;
    r->len[r->n++] = n;
    r->count += n;
    return PP_OK;
}

pp_status pp_grad_ring_shard(const pp_grad_ring_options *o, int replica, const pp_flat_params *fp,
                             pp_ring_ranges *out) {
    memset(out, 0, sizeof *out);
    shard_ctx c = {o, replica, out};
    pp_status s = cut(o, fp, shard_one, &c);
    if (s != PP_OK) pp_ring_ranges_free(out);
    return s;
}

void pp_ring_ranges_free(pp_ring_ranges *r) {
    free(r->lo);
    free(r->len);
    memset(r, 0, sizeof *r);
}
