/* Internal: the two ends of a bulk lane, a plain TCP connection from one
 * rank to another beside the transport that carries the bytes of large
 * tensors (transport_bulk.c sets lanes up and decides what takes them).
 * Each tensor goes as a header (bulk_wire.h) and its bytes; the envelope
 * that names it still goes through ZeroMQ, so every check of the envelope
 * stays as it was.
 *
 * The sending end is a thread that writes queued tensors (held by a
 * reference, never copied) in order; what the socket takes at once when
 * nothing is queued the pushing thread writes itself. A send returns once
 * its tensor is queued, as a ZeroMQ send does, and the bytes move while
 * the sender computes. The receiving end is read by the receiving rank's own thread,
 * straight into the tensor it hands out: no I/O thread in between, no
 * fresh buffer per message. */
#ifndef PIPPIN_TRANSPORT_BULK_LANE_H
#define PIPPIN_TRANSPORT_BULK_LANE_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

#include "bulk_wire.h"

/* ---- sending ---- */

typedef struct pp_bulk_tx pp_bulk_tx;

/* Starts the writer on fd (connected, non-blocking; the lane's from now
 * on), queueing at most max_queue tensors. */
pp_status pp_bulk_tx_start(int fd, size_t max_queue, pp_bulk_tx **out);
/* Queues tensor x under header h (what the socket takes at once is
 * written now; for the rest a reference is held until the writer is done
 * with it): 1 queued, 0 the queue is full, -1 the lane failed
 * (pp_bulk_tx_error says why). */
int pp_bulk_tx_push(pp_bulk_tx *tx, const pp_bulk_header *h, pp_tensor *x);
/* Readable when the writer finished a tensor or failed (poll it while the
 * queue is full); pp_bulk_tx_clear empties it. */
int pp_bulk_tx_event_fd(const pp_bulk_tx *tx);
void pp_bulk_tx_clear(pp_bulk_tx *tx);
/* Tensors queued and not yet written. */
size_t pp_bulk_tx_queued(pp_bulk_tx *tx);
/* "" while the lane works, else why it failed (a copy, valid until the
 * next call; for the pushing thread). */
const char *pp_bulk_tx_error(pp_bulk_tx *tx);
/* Test hook: while held (on 1) the lane writes nothing (queued tensors
 * wait), so a receiver sees an envelope whose bytes have not come. */
void pp_bulk_tx_hold(pp_bulk_tx *tx, int on);
/* Lets the writer finish the queue for up to linger_ms, then stops it,
 * drops what is left (returns how many tensors) and closes the lane. */
size_t pp_bulk_tx_close(pp_bulk_tx *tx, int linger_ms);

/* ---- receiving ---- */

typedef struct pp_bulk_rx {
    int fd;              /* non-blocking; -1: no lane */
    int have;            /* hdr was read, its bytes (body of them so far) not yet */
    pp_bulk_header hdr;
    uint64_t skipped;    /* bytes of messages the receiver dropped, read past */
    char why[160];       /* why the last read failed */
    int lowat;           /* the socket's SO_RCVLOWAT as last set (0: its default) */
    /* where a read that found the lane empty stopped, so the next goes on
     * from there (pp_bulk_rx_step) */
    uint8_t hbuf[PP_BULK_HEADER_BYTES]; /* a header being read */
    uint32_t hgot;       /* bytes of it in hbuf */
    uint64_t body;       /* bytes of hdr's tensor read (or read past) */
    const char *what;    /* what the last read waits for, for messages */
    uint64_t received;   /* bytes taken off the socket so far (progress, for timeouts) */
} pp_bulk_rx;

/* Reads what the lane holds now of tensor `index` of message `seq`
 * (nbytes bytes) into dst, never waiting, first reading past the bytes of
 * earlier messages (ones the receiver dropped before their bytes were
 * read). 2: not all there yet; call again with the same arguments (and
 * dst) once the fd is readable: it goes on where it stopped (the socket
 * is told to wake its reader only once the rest of the piece it waits for
 * is there, SO_RCVLOWAT). 1: done; 0: the lane's next tensor belongs to a
 * later message, so this one's bytes never came (its header is kept for
 * that message); -1: the lane is broken (closed or out of step: why says
 * which) and must be closed. */
int pp_bulk_rx_step(pp_bulk_rx *rx, uint64_t seq, uint32_t index, void *dst, uint64_t nbytes);
/* The same, waiting until deadline_ms (monotonic) at most: never 2 (a
 * deadline passed is -1, why says "did not come in time"). */
int pp_bulk_rx_read(pp_bulk_rx *rx, uint64_t seq, uint32_t index, void *dst, uint64_t nbytes,
                    int64_t deadline_ms);

#endif
