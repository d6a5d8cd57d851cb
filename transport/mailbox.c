/* Mailbox: a chained hash table of received tensors keyed by message key. */
#include "mailbox.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"

#include "status_internal.h"
typedef struct entry {
    struct entry *next;     /* bucket chain, oldest first */
    uint64_t hash;
    pp_mbox_key key;        /* key.name points at name_buf */
    pp_tensor *tensor;
    int owner;              /* whose bytes these are (-1: nobody's) */
    char name_buf[];
} entry;

struct pp_mailbox {
    entry **buckets;
    size_t nbuckets;        /* power of two */
    size_t count;
    uint64_t bytes;
    uint64_t *owner_bytes;  /* per owner */
    int nowners;
};

static void account(pp_mailbox *mb, const entry *e, int sign) {
    uint64_t n = e->tensor ? e->tensor->nbytes : 0;
    mb->bytes = sign > 0 ? mb->bytes + n : mb->bytes - n;
    if (e->owner >= 0 && e->owner < mb->nowners)
        mb->owner_bytes[e->owner] = sign > 0 ? mb->owner_bytes[e->owner] + n : mb->owner_bytes[e->owner] - n;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t key_hash(const pp_mbox_key *k) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the name, then the numbers */
    for (const unsigned char *p = (const unsigned char *)(k->name ? k->name : ""); *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    h = mix(h, (uint64_t)k->kind);
    h = mix(h, (uint64_t)k->step);
    h = mix(h, (uint64_t)(uint32_t)k->microbatch);
    h = mix(h, (uint64_t)(uint32_t)k->src_stage);
    h = mix(h, (uint64_t)(uint32_t)k->dst_stage);
    return h;
}

static int key_equal(const pp_mbox_key *a, const pp_mbox_key *b) {
    return a->kind == b->kind && a->step == b->step && a->microbatch == b->microbatch &&
           a->src_stage == b->src_stage && a->dst_stage == b->dst_stage &&
           strcmp(a->name ? a->name : "", b->name ? b->name : "") == 0;
}

pp_status pp_mailbox_new(pp_mailbox **out) {
    pp_mailbox *mb = calloc(1, sizeof *mb);
    if (!mb) return pp_error(PP_ERR_NOMEM, "out of memory allocating a mailbox");
    mb->nbuckets = 64;
    mb->buckets = calloc(mb->nbuckets, sizeof *mb->buckets);
    if (!mb->buckets) {
        free(mb);
        return pp_error(PP_ERR_NOMEM, "out of memory allocating a mailbox");
    }
    *out = mb;
    return PP_OK;
}

void pp_mailbox_free(pp_mailbox *mb) {
    if (!mb) return;
    for (size_t b = 0; b < mb->nbuckets; b++) {
        entry *e = mb->buckets[b];
        while (e) {
            entry *next = e->next;
            pp_tensor_free(e->tensor);
            free(e);
            e = next;
        }
    }
    free(mb->buckets);
    free(mb->owner_bytes);
    free(mb);
}

pp_status pp_mailbox_set_owners(pp_mailbox *mb, int n) {
    if (n <= mb->nowners) return PP_OK;
    uint64_t *ob = realloc(mb->owner_bytes, (size_t)n * sizeof *ob);
    if (!ob) return pp_error(PP_ERR_NOMEM, "out of memory allocating a mailbox");
    memset(ob + mb->nowners, 0, (size_t)(n - mb->nowners) * sizeof *ob);
    mb->owner_bytes = ob;
    mb->nowners = n;
    return PP_OK;
}

uint64_t pp_mailbox_owner_bytes(const pp_mailbox *mb, int owner) {
    return owner >= 0 && owner < mb->nowners ? mb->owner_bytes[owner] : 0;
}

/* Doubles the table; chains keep their relative order. */
static void grow(pp_mailbox *mb) {
    size_t n = mb->nbuckets * 2;
    entry **nb = calloc(n, sizeof *nb);
    if (!nb) return; /* keep the longer chains */
    entry **tails = calloc(n, sizeof *tails);
    if (!tails) {
        free(nb);
        return;
    }
    for (size_t b = 0; b < mb->nbuckets; b++) {
        entry *e = mb->buckets[b];
        while (e) {
            entry *next = e->next;
            size_t i = e->hash & (n - 1);
            e->next = NULL;
            if (tails[i]) tails[i]->next = e;
            else nb[i] = e;
            tails[i] = e;
            e = next;
        }
    }
    free(tails);
    free(mb->buckets);
    mb->buckets = nb;
    mb->nbuckets = n;
}

pp_status pp_mailbox_put(pp_mailbox *mb, const pp_mbox_key *key, pp_tensor *t) {
    return pp_mailbox_put_from(mb, key, -1, t);
}

pp_status pp_mailbox_put_from(pp_mailbox *mb, const pp_mbox_key *key, int owner, pp_tensor *t) {
    const char *name = key->name ? key->name : "";
    size_t len = strlen(name);
    entry *e = malloc(sizeof *e + len + 1);
    if (!e) {
        pp_tensor_free(t);
        return pp_error(PP_ERR_NOMEM, "out of memory filing a message");
    }
    memcpy(e->name_buf, name, len + 1);
    e->key = *key;
    e->key.name = e->name_buf;
    e->hash = key_hash(key);
    e->tensor = t;
    e->owner = owner;
    e->next = NULL;
    if (mb->count + 1 > mb->nbuckets) grow(mb);
    entry **p = &mb->buckets[e->hash & (mb->nbuckets - 1)];
    while (*p) p = &(*p)->next;
    *p = e;
    mb->count++;
    account(mb, e, 1);
    return PP_OK;
}

pp_tensor *pp_mailbox_take(pp_mailbox *mb, const pp_mbox_key *key) {
    uint64_t h = key_hash(key);
    for (entry **p = &mb->buckets[h & (mb->nbuckets - 1)]; *p; p = &(*p)->next) {
        entry *e = *p;
        if (e->hash != h || !key_equal(&e->key, key)) continue;
        *p = e->next;
        pp_tensor *t = e->tensor;
        mb->count--;
        account(mb, e, -1);
        free(e);
        return t;
    }
    return NULL;
}

size_t pp_mailbox_count(const pp_mailbox *mb) { return mb->count; }

uint64_t pp_mailbox_bytes(const pp_mailbox *mb) { return mb->bytes; }

size_t pp_mailbox_drop_before(pp_mailbox *mb, int64_t step, char *first, size_t cap) {
    size_t dropped = 0;
    if (first && cap) first[0] = 0;
    for (size_t b = 0; b < mb->nbuckets; b++) {
        entry **p = &mb->buckets[b];
        while (*p) {
            entry *e = *p;
            if (e->key.step >= step) {
                p = &e->next;
                continue;
            }
            *p = e->next;
            if (!dropped && first && cap) pp_mbox_key_str(&e->key, first, cap);
            mb->count--;
            account(mb, e, -1);
            pp_tensor_free(e->tensor);
            free(e);
            dropped++;
        }
    }
    return dropped;
}

const char *pp_mbox_key_str(const pp_mbox_key *k, char *buf, size_t cap) {
    snprintf(buf, cap, "%s step %" PRId64 " microbatch %" PRId32 " stage %" PRId32 "->%" PRId32 " '%s'",
             pp_msg_kind_name(k->kind), k->step, k->microbatch, k->src_stage, k->dst_stage,
             k->name ? k->name : "");
    return buf;
}
