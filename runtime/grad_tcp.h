/* Internal: the gradient ring of one stage's replicas over direct TCP
 * links (transport/direct_tcp.h) instead of through the transport, used by
 * the gradient ring (grad_ring.h) when the replicas cannot share memory
 * (other hosts, or shared memory turned off) and the transport is plain
 * tcp. The ring's phases, chunks and summation order are grad_ring.c's, so
 * the bits are the same; what changes is the path: each phase's chunk is
 * written to the next replica's socket straight from the flat buffer and
 * read by this thread from the previous one's, with no libzmq I/O thread
 * between (whose two hand-offs per message were most of the wake-ups).
 *
 * Agreement. Once the stage's shared-memory agreement said no, every
 * replica listens beside its transport endpoint and offers every other
 * replica its address and a nonce over the transport ("-" when it cannot:
 * CURVE, ipc/inproc, a wildcard address, the ring told not to). Links are
 * used only when every replica offered one (every replica decides alike);
 * then replica k connects to replica k+1's offer and accepts replica k-1's
 * connection (direct_tcp.h checks its hello), and the stage's buckets go
 * over them one at a time in bucket order.
 *
 * Wire. Each phase is one message: a 32-byte header (tag, the group's
 * collective number, phase, element count) and the float32 values. A
 * header that does not match what this replica expects (a replica with
 * other buckets or options) stops the sum with an error naming the
 * replica; so does a closed connection, at once, or silence past the
 * timeout. After an error the group is broken (pp_grad_tcp_broken) and the
 * ring agrees a new one at the next step. */
#ifndef PIPPIN_RUNTIME_GRAD_TCP_H
#define PIPPIN_RUNTIME_GRAD_TCP_H

#include <stdint.h>

#include "pippin/transport.h"

typedef struct pp_grad_tcp_options {
    pp_transport *t;
    int replicas, replica;
    int n_stages, stage; /* world stage of replica k: k * n_stages + stage */
    int offer;           /* 0: offer "-" (never use direct links) */
} pp_grad_tcp_options;

typedef struct pp_grad_tcp pp_grad_tcp;

/* Listens (if it can) and sends this replica's offer to every other
 * replica of the stage, for step's agreement; never waits. */
pp_status pp_grad_tcp_new(const pp_grad_tcp_options *o, int64_t step, pp_grad_tcp **out);
void pp_grad_tcp_free(pp_grad_tcp *s);

/* Takes the peers' offers (wait 0: those that arrived). *decided is 1 once
 * every offer is in; then pp_grad_tcp_in_use says whether the links are
 * used (and this replica has connected to the next one). */
pp_status pp_grad_tcp_agree(pp_grad_tcp *s, int wait, int timeout_ms, int *decided);
int pp_grad_tcp_in_use(const pp_grad_tcp *s);

/* One phase of a collective: send nsend floats from send to the next
 * replica, and receive nrecv floats from the previous one into recv,
 * added to what is there (add) or copied over it. A phase's send starts
 * only once the previous phase's receive is complete (its chunk is the
 * one just received). */
typedef struct pp_grad_tcp_phase {
    const float *send;
    int64_t nsend;
    float *recv;
    int64_t nrecv;
    int add;
} pp_grad_tcp_phase;

/* Runs the phases of one collective (bucket names it in errors). Call
 * again with the same arguments until *done; wait 0 never waits. */
pp_status pp_grad_tcp_run(pp_grad_tcp *s, const pp_grad_tcp_phase *ph, int nphases, int bucket, int wait,
                          int timeout_ms, int *done);
/* A group in use over the given connected sockets (taken over: closed by
 * pp_grad_tcp_free), without agreement; o->t may be NULL. For tests and
 * fuzzing of the wire. */
pp_status pp_grad_tcp_new_connected(const pp_grad_tcp_options *o, int send_fd, int recv_fd, pp_grad_tcp **out);

/* 1 if the group cannot be used again (an error, a collective half done,
 * an agreement not finished): it must be dropped and agreed again. */
int pp_grad_tcp_broken(const pp_grad_tcp *s);

#endif
