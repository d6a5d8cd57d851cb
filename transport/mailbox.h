/* Mailbox: received tensors filed by (kind, step, microbatch, source stage,
 * destination stage, value name), so the order of arrival never matters.
 * Internal to the transport; used by one thread (the transport's owner). */
#ifndef PIPPIN_TRANSPORT_MAILBOX_H
#define PIPPIN_TRANSPORT_MAILBOX_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

typedef struct pp_mbox_key {
    int kind;
    int64_t step;
    int32_t microbatch;
    int32_t src_stage;
    int32_t dst_stage;
    const char *name;
} pp_mbox_key;

typedef struct pp_mailbox pp_mailbox;

pp_status pp_mailbox_new(pp_mailbox **out);
/* Frees the mailbox and drops every tensor still in it. NULL is ignored. */
void pp_mailbox_free(pp_mailbox *mb);
/* Files t under key (the key is copied). Takes ownership of the caller's
 * reference to t, also on failure. Entries with equal keys are kept and
 * taken first in, first out. */
pp_status pp_mailbox_put(pp_mailbox *mb, const pp_mbox_key *key, pp_tensor *t);
/* The same, counting t's bytes against owner (0 <= owner < the count given
 * to pp_mailbox_set_owners; -1: nobody) until the entry leaves. */
pp_status pp_mailbox_put_from(pp_mailbox *mb, const pp_mbox_key *key, int owner, pp_tensor *t);
/* Owners 0..n-1 get byte counters (call before the first put). */
pp_status pp_mailbox_set_owners(pp_mailbox *mb, int n);
/* Tensor bytes held that owner filed. */
uint64_t pp_mailbox_owner_bytes(const pp_mailbox *mb, int owner);
/* Removes and returns the oldest tensor filed under key (the caller owns
 * the reference), or NULL if there is none. */
pp_tensor *pp_mailbox_take(pp_mailbox *mb, const pp_mbox_key *key);
/* Entries and tensor bytes held. */
size_t pp_mailbox_count(const pp_mailbox *mb);
uint64_t pp_mailbox_bytes(const pp_mailbox *mb);
/* Drops every entry of a step < step; returns how many. The first one's
 * key is written to first (cap bytes; may be NULL), for the warning. */
size_t pp_mailbox_drop_before(pp_mailbox *mb, int64_t step, char *first, size_t cap);
/* Key as text for messages: "activation step 3 microbatch 1 stage 0->1 'x'". */
const char *pp_mbox_key_str(const pp_mbox_key *key, char *buf, size_t cap);

#endif
