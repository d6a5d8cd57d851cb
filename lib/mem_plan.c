/* The executor's memory plan: liveness-based reuse of buffers in one arena.
 *
 * Kernels allocate their outputs and scratch themselves (lib/op.h), so the
 * plan is learned, not derived: the first run of a node list with a given
 * input signature is recorded. Each tensor buffer allocated on the running
 * thread gets a free function that notes when it died (an event clock over
 * allocations and frees), so views, cached values and anything retained
 * past the run are seen as they are. Buffers freed before the run ends
 * become the plan's slots; those still alive at its end (outputs, the
 * stash, the shape cache) stay with the tensor pool. Slots get offsets,
 * largest first, at the lowest place free of every slot alive at the same
 * time, so the arena holds the run's peak, not the sum of its buffers.
 * Runs on one thread follow each other, so each thread has one arena, as
 * large as the largest plan it ran: the stages a thread runs share it.
 *
 * Later runs with the same key take each slot for the allocation of the
 * same size at the same node. A slot is handed out only if no arena buffer
 * still alive overlaps it, so a run that allocates otherwise than its
 * recording (a data-dependent shape, a kernel that kept a reference) gets
 * pool buffers instead of a clobbered one. */
#include "mem_plan.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "log_internal.h"
#include "status_internal.h"
#include "tensor_pool.h"

#define SLOT_ALIGN 64
#define MAX_PLANS 16        /* per executor: regions x microbatch sizes */
#define MAX_RECORDED 16384  /* allocations per run; placement is quadratic */
#define RECORD_MAP_MIN ((size_t)1 << 62) /* recorded buffers this large are mapped alone */

/* The memory slots are cut from; one per thread. */
typedef struct arena {
    pthread_mutex_t mu;
    int refs; /* its thread's hold, plus one per buffer handed out */
    char *base;
    size_t size;
    size_t *live_off, *live_size; /* buffers handed out and not yet freed */
    int n_live, cap_live;
} arena;

typedef struct slot {
    size_t off, size;
} slot;

typedef struct plan {
    uint64_t key;
    const int *nodes;
    int n_nodes;
    slot *slots;     /* by position, then allocation order */
    int *first;      /* per position: its first slot; first[n_nodes] = n_slots */
    int n_slots;
    size_t peak, total;
} plan;

enum { REC_RUNNING, REC_FREED };

/* One allocation of a recorded run. A buffer still alive when the run
 * ends gets its own free function back (tensors made in a run are freed on
 * its thread until it ends: the executor hands them out only then). */
typedef struct rec {
    pp_free_fn inner;
    void *inner_hint;
    pp_tensor *tensor;
    int state;
    pp_mem_plans *owner;
    int pos;
    size_t size;
    int64_t born, died;
} rec;

struct pp_mem_plans {
    plan plans[MAX_PLANS];
    int n_plans, next_victim;
    int n_made; /* plans made so far */
    /* the run in progress */
    arena *ar;           /* the running thread's, for a planned run */
    pp_mem_plans *outer; /* the run this one nests in */
    int position;
    plan *cur;           /* NULL while recording */
    unsigned char *taken;
    int cap_taken;
    uint64_t rec_key;
    const int *rec_nodes;
    int rec_n_nodes;
    rec **recs;
    int n_recs, cap_recs;
    int64_t clock; /* allocations and frees of the recorded run so far */
};

static _Thread_local pp_mem_plans *current_run;
static _Thread_local arena *thread_arena;
static pthread_key_t arena_key; /* its destructor releases a thread's arena when the thread ends */
static pthread_once_t arena_key_once = PTHREAD_ONCE_INIT;

static size_t round_up(size_t n) { return (n + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN; }

/* ---- arena ---- */

static arena *arena_new(size_t size) {
    arena *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->size = round_up(size ? size : 1);
    /* mapped: pages the plan never touches cost nothing, and it goes back
     * to the system whole */
    void *base = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || pthread_mutex_init(&a->mu, NULL) != 0) {
        if (base != MAP_FAILED) munmap(base, a->size);
        free(a);
        return NULL;
    }
    a->base = base;
    a->refs = 1;
    return a;
}

static void arena_release(arena *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    int left = --a->refs;
    pthread_mutex_unlock(&a->mu);
    if (left) return;
    pthread_mutex_destroy(&a->mu);
    free(a->live_off);
    free(a->live_size);
    munmap(a->base, a->size);
    free(a);
}

static void arena_free(void *data, void *hint) {
    arena *a = hint;
    size_t off = (size_t)((char *)data - a->base);
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < a->n_live; i++)
        if (a->live_off[i] == off) {
            a->live_off[i] = a->live_off[--a->n_live];
            a->live_size[i] = a->live_size[a->n_live];
            break;
        }
    pthread_mutex_unlock(&a->mu);
    arena_release(a);
}

/* Hands out [off, off+size) unless an arena buffer still alive overlaps it. */
static int arena_take(arena *a, size_t off, size_t size) {
    int ok = 1;
    pthread_mutex_lock(&a->mu);
    for (int i = 0; ok && i < a->n_live; i++)
        if (off < a->live_off[i] + a->live_size[i] && a->live_off[i] < off + size) ok = 0;
    if (ok && a->n_live == a->cap_live) {
        int cap = a->cap_live ? a->cap_live * 2 : 64;
        size_t *o = realloc(a->live_off, sizeof *o * (size_t)cap);
        if (o) a->live_off = o;
        size_t *s = o ? realloc(a->live_size, sizeof *s * (size_t)cap) : NULL;
        if (s) {
            a->live_size = s;
            a->cap_live = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) {
        a->live_off[a->n_live] = off;
        a->live_size[a->n_live++] = size;
        a->refs++;
    }
    pthread_mutex_unlock(&a->mu);
    return ok;
}

/* ---- the thread's arena ---- */

static void release_at_thread_end(void *a) { arena_release(a); }

static void make_arena_key(void) {
    if (pthread_key_create(&arena_key, release_at_thread_end) != 0) arena_key_once = PTHREAD_ONCE_INIT;
}

/* This thread's arena, at least size bytes (plans made for a smaller one
 * fit); NULL when out of memory. */
static arena *thread_arena_of(size_t size) {
    if (thread_arena && thread_arena->size >= size) return thread_arena;
    pthread_once(&arena_key_once, make_arena_key);
    arena *a = arena_new(size);
    if (!a) return NULL;
    pp_mem_plan_release_thread(); /* buffers still out keep the old one */
    thread_arena = a;
    pthread_setspecific(arena_key, a);
    return a;
}

void pp_mem_plan_release_thread(void) {
    if (!thread_arena) return;
    pthread_setspecific(arena_key, NULL);
    arena_release(thread_arena);
    thread_arena = NULL;
}

/* ---- recording ---- */

static void rec_free(void *data, void *hint) {
    rec *r = hint;
    r->inner(data, r->inner_hint);
    r->died = r->owner->clock++;
    r->state = REC_FREED;
}

static void *recorded_alloc(pp_mem_plans *mp, pp_tensor *t, size_t nbytes) {
    if (mp->n_recs == MAX_RECORDED) return NULL;
    if (mp->n_recs == mp->cap_recs) {
        int cap = mp->cap_recs ? mp->cap_recs * 2 : 256;
        rec **rs = realloc(mp->recs, sizeof *rs * (size_t)cap);
        if (!rs) return NULL;
        mp->recs = rs;
        mp->cap_recs = cap;
    }
    rec *r = malloc(sizeof *r);
    if (!r) return NULL;
    void *p = pp_pool_alloc(nbytes, &r->inner, &r->inner_hint);
    if (!p) {
        free(r);
        return NULL;
    }
    r->tensor = t;
    r->state = REC_RUNNING;
    r->owner = mp;
    r->pos = mp->position;
    r->size = round_up(nbytes);
    r->born = mp->clock++;
    r->died = -1;
    mp->recs[mp->n_recs++] = r;
    t->free_fn = rec_free;
    t->free_hint = r;
    return p;
}

/* ---- planning ---- */

typedef struct span {
    int64_t born, died;
    size_t size;
    int slot;
} span;

static int by_size_desc(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->born < y->born ? -1 : x->born > y->born;
}

static int by_off(const void *a, const void *b) {
    const slot *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Offsets for spans[0..n) (sorted largest first): each at the lowest place
 * clear of the spans placed before it that are alive at the same time. */
static pp_status place(const span *spans, int n, slot *slots, size_t *peak) {
    slot *busy = malloc(sizeof *busy * (size_t)(n ? n : 1));
    if (!busy) return pp_error(PP_ERR_NOMEM, "out of memory planning buffers");
    *peak = 0;
    for (int j = 0; j < n; j++) {
        int nb = 0;
        for (int k = 0; k < j; k++)
            if (spans[k].born < spans[j].died && spans[j].born < spans[k].died)
                busy[nb++] = slots[spans[k].slot];
        qsort(busy, (size_t)nb, sizeof *busy, by_off);
        size_t off = 0;
        for (int k = 0; k < nb; k++) {
            if (off + spans[j].size <= busy[k].off) break;
            if (busy[k].off + busy[k].size > off) off = busy[k].off + busy[k].size;
        }
        slots[spans[j].slot] = (slot){off, spans[j].size};
        if (off + spans[j].size > *peak) *peak = off + spans[j].size;
    }
    free(busy);
    return PP_OK;
}

static void plan_clear(plan *p) {
    free(p->slots);
    free(p->first);
    memset(p, 0, sizeof *p);
}

/* The recording's buffers that died in the run, placed; the others let go. */
static pp_status make_plan(pp_mem_plans *mp, plan *p) {
    span *spans = malloc(sizeof *spans * (size_t)(mp->n_recs ? mp->n_recs : 1));
    p->first = calloc((size_t)mp->rec_n_nodes + 1, sizeof *p->first);
    pp_status s = spans && p->first ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory planning buffers");
    int n = 0;
    for (int i = 0; i < mp->n_recs; i++) {
        rec *r = mp->recs[i];
        if (r->state == REC_RUNNING) { /* alive after the run: not planned */
            r->tensor->free_fn = r->inner;
            r->tensor->free_hint = r->inner_hint;
        } else if (s == PP_OK && r->pos >= 0 && r->pos < mp->rec_n_nodes) {
            spans[n] = (span){r->born, r->died, r->size, n};
            p->first[r->pos + 1]++;
            n++;
        }
        free(r);
    }
    mp->n_recs = 0;
    p->key = mp->rec_key;
    p->nodes = mp->rec_nodes;
    p->n_nodes = mp->rec_n_nodes;
    if (s == PP_OK) {
        for (int i = 0; i < p->n_nodes; i++) p->first[i + 1] += p->first[i];
        p->slots = malloc(sizeof *p->slots * (size_t)(n ? n : 1));
        if (!p->slots) s = pp_error(PP_ERR_NOMEM, "out of memory planning buffers");
    }
    if (s == PP_OK) {
        /* spans are in allocation order, so span k is slot k */
        for (int i = 0; i < n; i++) p->total += spans[i].size;
        qsort(spans, (size_t)n, sizeof *spans, by_size_desc);
        s = place(spans, n, p->slots, &p->peak);
        p->n_slots = n;
    }
    free(spans);
    return s;
}

/* ---- runs ---- */

pp_status pp_mem_plans_new(pp_mem_plans **out) {
    pp_mem_plans *mp = calloc(1, sizeof *mp);
    if (!mp) return pp_error(PP_ERR_NOMEM, "out of memory");
    *out = mp;
    return PP_OK;
}

void pp_mem_plans_free(pp_mem_plans *mp) {
    if (!mp) return;
    for (int i = 0; i < mp->n_plans; i++) plan_clear(&mp->plans[i]);
    free(mp->taken);
    free(mp->recs);
    free(mp);
}

static plan *find_plan(pp_mem_plans *mp, const int *nodes, int n_nodes, uint64_t key) {
    for (int i = 0; i < mp->n_plans; i++) {
        plan *p = &mp->plans[i];
        if (p->key == key && p->nodes == nodes && p->n_nodes == n_nodes) return p;
    }
    return NULL;
}

pp_status pp_mem_run_begin(pp_mem_plans *mp, const int *nodes, int n_nodes, uint64_t key) {
    mp->cur = find_plan(mp, nodes, n_nodes, key);
    mp->position = -1;
    if (mp->cur && mp->cur->n_slots > mp->cap_taken) {
        unsigned char *t = realloc(mp->taken, (size_t)mp->cur->n_slots);
        if (!t) return pp_error(PP_ERR_NOMEM, "out of memory");
        mp->taken = t;
        mp->cap_taken = mp->cur->n_slots;
    }
    if (mp->cur && mp->cur->n_slots) memset(mp->taken, 0, (size_t)mp->cur->n_slots); /* a run may place none */
    mp->ar = mp->cur && mp->cur->n_slots ? thread_arena_of(mp->cur->peak) : NULL; /* none: the pool */
    if (mp->ar) { /* the run holds its arena: a nested run or a cache release may let the thread's go */
        pthread_mutex_lock(&mp->ar->mu);
        mp->ar->refs++;
        pthread_mutex_unlock(&mp->ar->mu);
    }
    mp->rec_key = key;
    mp->rec_nodes = nodes;
    mp->rec_n_nodes = n_nodes;
    mp->n_recs = 0;
    mp->outer = current_run;
    current_run = mp;
    return PP_OK;
}

void pp_mem_run_node(pp_mem_plans *mp, int position) { mp->position = position; }


/* A recording whose run failed: every tensor it made gets its own free
 * function back and no plan is made, so the next run records again
 * (a plan cut short at the failing node would serve every later run). */
static void drop_recording(pp_mem_plans *mp) {
    for (int i = 0; i < mp->n_recs; i++) {
        rec *r = mp->recs[i];
        if (r->state == REC_RUNNING) {
            r->tensor->free_fn = r->inner;
            r->tensor->free_hint = r->inner_hint;
        }
        free(r);
    }
    mp->n_recs = 0;
}

pp_status pp_mem_run_end(pp_mem_plans *mp, int ok) {
    current_run = mp->outer;
    mp->outer = NULL;
    arena_release(mp->ar);
    mp->ar = NULL;
    if (mp->cur) {
        mp->cur = NULL;
        return PP_OK;
    }
    if (!ok) {
        drop_recording(mp);
        return PP_OK;
    }
    plan *p = &mp->plans[mp->n_plans < MAX_PLANS ? mp->n_plans++ : mp->next_victim++ % MAX_PLANS];
    plan_clear(p);
    pp_status s = make_plan(mp, p);
    if (s == PP_OK && p->n_slots && !thread_arena_of(p->peak))
        s = pp_error(PP_ERR_NOMEM, "out of memory allocating a %zu-byte buffer arena", p->peak);
    /* The recorded buffers went back to the pool's cache; the arena serves
     * them from now on, so keeping both would hold them twice. Only for an
     * executor's first plans: one whose signatures keep changing (a
     * generation step's growing past) must not empty the pool every run. */
    if (s == PP_OK && p->n_slots && mp->n_made++ < MAX_PLANS) pp_pool_release();
    if (s == PP_OK)
        pp_debug("memory plan for %d nodes: %d buffers, %zu bytes, placed in %zu", p->n_nodes, p->n_slots,
                 p->total, p->peak);
    if (s != PP_OK) { /* keep the key, plan nothing: runs then use the pool */
        free(p->slots);
        p->slots = NULL;
        p->n_slots = 0;
        for (int i = 0; p->first && i <= p->n_nodes; i++) p->first[i] = 0;
        if (!p->first) p->n_nodes = 0;
    }
    return s;
}

static void *planned_alloc(pp_mem_plans *mp, pp_tensor *t, size_t nbytes) {
    const plan *p = mp->cur;
    int pos = mp->position;
    if (!mp->ar || pos < 0 || pos >= p->n_nodes || !p->first) return NULL;
    size_t size = round_up(nbytes);
    for (int i = p->first[pos]; i < p->first[pos + 1]; i++) {
        if (mp->taken[i] || p->slots[i].size != size) continue;
        mp->taken[i] = 1;
        if (!arena_take(mp->ar, p->slots[i].off, size)) return NULL;
        t->free_fn = arena_free;
        t->free_hint = mp->ar;
        return mp->ar->base + p->slots[i].off;
    }
    return NULL;
}

void *pp_mem_plan_alloc(pp_tensor *t, size_t nbytes) {
    pp_mem_plans *mp = current_run;
    if (!mp || nbytes == 0) return NULL;
    return mp->cur ? planned_alloc(mp, t, nbytes) : recorded_alloc(mp, t, nbytes);
}

int pp_mem_plan_owns(pp_free_fn free_fn) { return free_fn == rec_free || free_fn == arena_free; }

void pp_mem_plans_peak(const pp_mem_plans *mp, int64_t *arena_bytes, int64_t *unplanned_bytes) {
    int64_t peak = 0, total = 0;
    for (int i = 0; i < mp->n_plans; i++) {
        if ((int64_t)mp->plans[i].peak > peak) peak = (int64_t)mp->plans[i].peak;
        if ((int64_t)mp->plans[i].total > total) total = (int64_t)mp->plans[i].total;
    }
    if (arena_bytes) *arena_bytes = peak;
    if (unplanned_bytes) *unplanned_bytes = total;
}
