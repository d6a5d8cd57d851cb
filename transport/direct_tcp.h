/* Internal: plain TCP connections beside the transport, for bulk data
 * between two ranks that already talk over it (the replicas' gradient
 * ring, runtime/grad_tcp.h). libzmq hands every message to its I/O thread
 * and back (two wake-ups a message on each side); a collective that moves
 * megabytes in lock step with its neighbours does better writing and
 * reading the socket from its own thread, as MPI's tcp transport does.
 *
 * Setting one up: the accepting rank listens on the address its transport
 * is bound to (an ephemeral port) and sends the connecting rank an offer
 * over the transport: "tcp HOST PORT NONCE", NONCE 16 random bytes in hex.
 * The connecting rank connects and sends a hello (magic, the nonce, the
 * run id, what it is for and who it is); the acceptor keeps only a
 * connection whose hello carries its nonce and the expected purpose and
 * sender, and closes any other (a stranger, a stale rank) with a warning.
 * The nonce travelled over the transport, so the link is as authenticated
 * as the transport, but it is never encrypted: offered only when the
 * transport is plain tcp without CURVE, bound to a concrete address. */
#ifndef PIPPIN_TRANSPORT_DIRECT_TCP_H
#define PIPPIN_TRANSPORT_DIRECT_TCP_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/transport.h"

#define PP_DIRECT_OFFER_CAP 128

typedef struct pp_direct_listener pp_direct_listener;

/* Whether t may carry direct links (plain tcp, no CURVE, a concrete bind
 * address); if not, *why says why (for the log). */
int pp_direct_possible(const pp_transport *t, const char **why);

/* Listens beside t's endpoint; offer (PP_DIRECT_OFFER_CAP) receives the
 * text to send to the rank that will connect. purpose and peer are what
 * that rank's hello must carry. */
pp_status pp_direct_listen(pp_transport *t, uint32_t purpose, int32_t peer, char *offer, pp_direct_listener **out);
void pp_direct_listener_free(pp_direct_listener *l);

/* Takes the connection whose hello matches (timeout_ms 0: one pass that
 * never blocks; else up to timeout_ms). *fd is -1 while none came.
 * Connections are taken in and their hellos read without blocking, a few
 * at a time: one whose hello does not match, or that sends none within 2
 * s, is closed (logged at 1, 2, 4, ... such) and the wait goes on. */
pp_status pp_direct_accept(pp_direct_listener *l, int timeout_ms, int *fd);
/* The listening socket (to poll for an incoming connection). */
int pp_direct_listener_fd(const pp_direct_listener *l);

/* A connection under way to an offered port of a peer. */
typedef struct pp_direct_conn pp_direct_conn;
/* Starts connecting (never waits, but for looking up a host name) to the
 * offer's port on the host this rank reaches rank `peer` at (its
 * endpoint's host; a name looked up for IPv4, as libzmq does): the
 * offer's own host is not followed, so a rank past the handshake cannot
 * point a link at another machine, and a name that each host resolves its
 * own way (Debian maps a host's own name to 127.0.1.1) cannot make the two
 * ends disagree. Only where the endpoint names no host (a wildcard, an
 * interface) is the offer's taken. purpose and me (this rank's name for
 * itself on the link) go into the hello. */
pp_status pp_direct_connect_start(pp_transport *t, const char *offer, uint32_t purpose, int32_t me, int peer,
                                  pp_direct_conn **out);
/* Waits up to timeout_ms (0: not at all) for the connection, then sends
 * the hello; *fd: the socket (non-blocking, TCP_NODELAY, the caller's to
 * close) once connected, -1 while still connecting. A refused or failed
 * connection is an error naming the address. */
pp_status pp_direct_connect_finish(pp_direct_conn *c, int timeout_ms, int *fd);
/* The socket being connected (to poll for POLLOUT), -1 once handed over. */
int pp_direct_conn_fd(const pp_direct_conn *c);
void pp_direct_conn_free(pp_direct_conn *c);
/* Test hook: every connection looks under way for ms more (a long round
 * trip on loopback); 0 turns it off. */
void pp_direct_test_connect_lag(int ms);

/* 1 when text parses as an offer (for checking a peer's before use). */
int pp_direct_offer_valid(const char *text);

/* What is wrong with n bytes received as a hello on a listener that
 * offered nonce (16 bytes) for purpose and expects peer ("" if nothing;
 * run_id 0 accepts any run). */
const char *pp_direct_hello_check(const void *buf, size_t n, const unsigned char nonce[16], uint64_t run_id,
                                  uint32_t purpose, int32_t peer);

#endif
