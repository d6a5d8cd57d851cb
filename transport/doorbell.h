/* Doorbells: how a rank wakes a same-host peer that sleeps waiting for a
 * message ring (internal to the transport).
 *
 * A doorbell is a named FIFO in /dev/shm that its owner keeps open and
 * waits on, together with its ZeroMQ socket (zmq_poll takes plain file
 * descriptors). A peer that writes a record into a ring whose receiver said
 * it is waiting writes one byte to the receiver's doorbell: one system call
 * and one wake-up, where a ZeroMQ message costs a hand-off to the sender's
 * I/O thread, a socket write, the receiver's I/O thread and a hand-off back. */
#ifndef PIPPIN_TRANSPORT_DOORBELL_H
#define PIPPIN_TRANSPORT_DOORBELL_H

#include "pippin/status.h"

typedef struct pp_doorbell pp_doorbell;

/* Makes this rank's doorbell "/dev/shm/pippin-bell-NS-PID-N" (mode 0600;
 * NS: the PID namespace, see pp_shm_pid_ns). */
pp_status pp_doorbell_create(pp_doorbell **out);
const char *pp_doorbell_path(const pp_doorbell *b);
/* Readable when rung. */
int pp_doorbell_fd(const pp_doorbell *b);
/* Swallows the rings so far. */
void pp_doorbell_clear(pp_doorbell *b);
/* Closes and removes it. NULL is ignored. */
void pp_doorbell_close(pp_doorbell *b);

/* 1 if path is a doorbell name this module makes (a peer sent it). */
int pp_doorbell_path_ok(const char *path);
/* A peer's doorbell, for ringing: a file descriptor, or -1. */
int pp_doorbell_open_peer(const char *path);
/* Rings it (a full FIFO is rung already). */
void pp_doorbell_ring(int fd);

#endif
