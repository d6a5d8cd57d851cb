/* Shared-memory rings for ranks on one host (internal to the transport).
 *
 * Between two ranks on the same host a large tensor need not cross a socket
 * (user -> kernel -> user, plus TCP or unix-socket bookkeeping): the sender
 * copies it into a ring of shared memory it owns, one per destination rank,
 * and sends only the envelope, which names the ring and the position; the
 * receiver copies the bytes out when the envelope arrives and hands the
 * space back. Positions grow without wrapping (byte offset = position mod
 * ring size); a record never straddles the end of the ring, so the sender
 * skips the remainder when one would not fit; it also goes back to the
 * start whenever the receiver has consumed everything, so the pages in use
 * (mapped on first touch, not up front) follow the bytes in flight rather
 * than the ring's size. The header names the sender's last skip
 * (skip_from): a receiver that has consumed up to it counts the rest of
 * that lap as read, so a skip costs no room. Its pages in /dev/shm are
 * allocated likewise: the sender allocates them (in steps) before it first
 * writes into them and says how far in the header; the receiver reads
 * nothing beyond.
 *
 * Single producer, single consumer, in order: messages of one link arrive
 * in the order they were sent, so handing back "everything before position
 * P" is all the consumer needs to say. The sender never waits for room:
 * when the ring is full (a slow or dead receiver) or /dev/shm has no pages
 * left for it, the tensor goes over the socket instead.
 *
 * The ring is a POSIX shared-memory object "/pippin-<pid>-<n>" of mode 0600.
 * The receiver unlinks the name as soon as it has mapped the ring, so
 * nothing is left in /dev/shm once both sides have it; the sender unlinks
 * it on close in case the receiver never did. */
#ifndef PIPPIN_TRANSPORT_SHM_RING_H
#define PIPPIN_TRANSPORT_SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

typedef struct pp_shm_ring pp_shm_ring;

/* A string that is equal for two processes only when they can share
 * memory through shm_open: same boot of the same machine, same IPC
 * namespace, same /dev/shm (device and inode), same user namespace and
 * euid. Network and mount namespaces do not count (processes in them share
 * /dev/shm all the same), and the same ring format (builds whose rings
 * differ use sockets). Empty when it cannot be told (no /proc): then
 * rings are not used. */
void pp_shm_host_id(char *buf, size_t cap);

/* 1 if name is one pp_shm_ring_create makes: "/pippin-" then letters,
 * digits, '.', '_' or '-' (a peer sends it; it must not name anything else). */
int pp_shm_ring_name_ok(const char *name);

/* Sender: creates a ring with data_bytes of room (rounded up to pages),
 * mapped; only its header page is allocated in /dev/shm now, the rest as
 * reserve first needs it. Pages enter RSS when first touched. */
pp_status pp_shm_ring_create(size_t data_bytes, pp_shm_ring **out);

/* Receiver: maps the ring the sender named, checks its header, and unlinks
 * the name. */
pp_status pp_shm_ring_open(const char *name, pp_shm_ring **out);

const char *pp_shm_ring_name(const pp_shm_ring *r);
size_t pp_shm_ring_bytes(const pp_shm_ring *r);

/* Sender: room for n contiguous bytes. Returns 1 and sets *pos and *dst
 * (where to write), 0 when the ring has no room now, or -1 when its pages
 * could not be allocated in /dev/shm (full; the error says so; nothing
 * changed, a later call tries again). A reservation
 * that returned 1 must be committed before the next one, even when the
 * send then fails: a skip to the next lap is recorded here, and an
 * abandoned one would let the receiver jump over what comes next. */
int pp_shm_ring_reserve(pp_shm_ring *r, size_t n, uint64_t *pos, void **dst);
/* Sender: allocates the ring's first n data bytes now (a fresh ring that
 * must hold a record before it replaces one that works); 1 done, 0 not
 * (no room in /dev/shm; pp_last_error says). */
int pp_shm_ring_prealloc(pp_shm_ring *r, size_t n);
/* Sender: the n bytes at pos are written (call before sending the
 * envelope that names them). */
void pp_shm_ring_commit(pp_shm_ring *r, uint64_t pos, size_t n);

/* Sender: the receiver has consumed everything written (so it has mapped
 * the ring, if anything was written). */
int pp_shm_ring_drained(const pp_shm_ring *r);
/* Sender: the receiver has mapped the ring (closing it here loses nothing
 * the receiver could still want). */
int pp_shm_ring_opened(const pp_shm_ring *r);

/* Receiver: the n bytes at pos, checked against what the sender may have
 * written (after everything already handed back, inside one lap, not
 * straddling the end). PP_ERR_PARSE says what is wrong. */
pp_status pp_shm_ring_locate(const pp_shm_ring *r, uint64_t pos, uint64_t n, const void **src);
/* Receiver: everything before end is processed; the sender may reuse it,
 * except what is lent out. */
void pp_shm_ring_release(pp_shm_ring *r, uint64_t end);

/* Receiver: the n bytes at pos (checked as by locate) as a tensor's storage,
 * without a copy. The sender gets the space back when the tensor is freed
 * (on any thread), in order: nothing after the oldest loan still out is
 * reused before it. The mapping outlives pp_shm_ring_close until every
 * loan is back. PP_ERR_UNSUPPORTED: not 64-byte aligned (copy instead). */
pp_status pp_shm_ring_lend(pp_shm_ring *r, uint64_t pos, uint64_t n, pp_dtype dt, int ndim,
                           const int64_t *shape, pp_tensor **out);

/* Sender: records start at multiples of align (1 by default; 64 for
 * tensors that the receiver lends out as they are). */
void pp_shm_ring_set_align(pp_shm_ring *r, size_t align);

/* ---- message rings ----
 *
 * The same ring can carry whole messages (a packed envelope with its small
 * tensors inline) instead of tensor bytes named by envelopes: records of
 * [u32 length][u32 0][bytes], 8-aligned, published through a head position
 * in the header, so the receiver finds them without any socket. A waiting
 * flag in the header tells the sender when the receiver is asleep and
 * needs its doorbell rung (see transport.c). */

/* Sender: room for a record of len bytes; *dst is where to write them. 0:
 * no room now; -1: no pages (as pp_shm_ring_reserve). Like
 * pp_shm_ring_reserve, a reservation that succeeded must be committed
 * before the next. */
int pp_shm_ring_msg_reserve(pp_shm_ring *r, size_t len, uint64_t *pos, void **dst);
/* Sender: publishes the record reserved at pos. Returns 1 if the receiver
 * said it is waiting (ring its doorbell). */
int pp_shm_ring_msg_commit(pp_shm_ring *r, uint64_t pos, size_t len);
/* Receiver: the next record, if any: its bytes, length and end (release(end)
 * when done with it). 0: none; -1: a record that cannot be valid (the
 * ring is unusable; PP_ERR_PARSE says why). */
int pp_shm_ring_msg_next(pp_shm_ring *r, const void **data, size_t *len, uint64_t *end);
/* Receiver: says it is going to sleep (1) or awake (0). After saying 1,
 * check msg_next once more before sleeping. */
void pp_shm_ring_set_waiting(pp_shm_ring *r, int waiting);

/* This process's PID namespace (the inode of /proc/self/ns/pid; 0 if
 * unknown). Ring and doorbell names carry it with the pid, as
 * "NS-PID" (NS in hex), so that the sweep below only ever judges processes
 * it can see. */
unsigned long long pp_shm_pid_ns(void);

/* Removes the rings and doorbells ("/dev/shm/pippin-NS-PID-*",
 * "pippin-bell-NS-PID-*") of this user's processes of this PID namespace
 * that no longer exist: a process killed before it could clean up leaves
 * them. Once per process; returns how many it removed. */
int pp_shm_sweep_stale(void);

/* Test hook (fault injection), process-wide: after the next n allocations
 * of ring pages in /dev/shm (a header at creation, or a step of data)
 * succeed, every one fails as if /dev/shm were full, until n < 0 turns it
 * off. Returns the previous setting (-1: off). */
int pp_shm_ring_fail_alloc_after(int n);

/* Unmaps (once every loan is back); the sender also unlinks the name. NULL
 * is ignored. */
void pp_shm_ring_close(pp_shm_ring *r);

#endif
