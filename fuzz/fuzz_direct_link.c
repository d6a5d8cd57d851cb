/* libFuzzer target: what the replicas' direct TCP links read from a socket
 * (transport/direct_tcp.c, runtime/grad_tcp.c): the offer text that comes
 * over the transport, the hello a connecting peer sends, and the ring's
 * messages (header + float32 chunk) from the previous replica.
 *
 * Input: byte 0 and 1 give the element counts of the two phases this
 * replica receives (mod 64: a reduce-scatter phase added into place, then
 * an all-gather phase copied); the rest is what the previous replica
 * "sends", written into one end of a socket pair whose other end the ring
 * reads, then closed. The whole input is also tried as an offer and as a
 * hello. Whatever the bytes, the ring must finish or fail with an error,
 * never crash, hang or write outside its buffer (ASan). Seeds (a valid
 * pair of messages) are written to PIPPIN_FUZZ_SEEDS when it is set. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "direct_tcp.h"
#include "grad_tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* grad_tcp.c's header, as the peer writes it */
typedef struct wire_header {
    uint32_t tag;
    int32_t phase;
    int64_t seq;
    int64_t count;
    int32_t bucket;
    int32_t pad;
} wire_header;

static void check(int cond) {
    if (!cond) __builtin_trap();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("PIPPIN_FUZZ_SEEDS");
    if (!dir) return 0;
    char path[512];
    snprintf(path, sizeof path, "%s/seed-two-phases", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    uint8_t counts[2] = {3, 2};
    fwrite(counts, 1, 2, f);
    for (int p = 0; p < 2; p++) {
        wire_header h = {0x31545050u, p, 0, counts[p], 0, 0};
        fwrite(&h, sizeof h, 1, f);
        for (int i = 0; i < counts[p]; i++) {
            float v = (float)(i + 1) * (p ? -1.0f : 0.5f);
            fwrite(&v, sizeof v, 1, f);
        }
    }
    fclose(f);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char text[256];
    size_t n = size < sizeof text - 1 ? size : sizeof text - 1;
    memcpy(text, data, n);
    text[n] = 0;
    (void)pp_direct_offer_valid(text);
    static const unsigned char nonce[16] = {1, 2, 3};
    (void)pp_direct_hello_check(data, size, nonce, 7, 0x47000000u, 1);
    if (size < 2) return 0;

    int64_t n0 = data[0] % 64, n1 = data[1] % 64;
    float buf[128] = {0}, mine[64];
    for (int i = 0; i < 64; i++) mine[i] = (float)i;
    int to_ring[2], from_ring[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, to_ring) != 0) return 0;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, from_ring) != 0) {
        close(to_ring[0]), close(to_ring[1]);
        return 0;
    }
    /* what the previous replica sent, then its end closed: the ring sees
     * the bytes and then end of stream, never waits for more */
    size_t left = size - 2;
    const uint8_t *p = data + 2;
    while (left > 0) { /* what the socket buffer holds; the rest is cut */
        ssize_t k = send(to_ring[1], p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k <= 0) break;
        p += k, left -= (size_t)k;
    }
    close(to_ring[1]);
    pp_grad_tcp_options o = {NULL, 2, 0, 1, 0, 1};
    pp_grad_tcp *g = NULL;
    if (pp_grad_tcp_new_connected(&o, from_ring[0], to_ring[0], &g) != PP_OK) {
        close(from_ring[1]);
        return 0;
    }
    pp_grad_tcp_phase ph[2] = {{mine, 8, buf, n0, 1}, {buf, n0, buf + 64, n1, 0}};
    int done = 0;
    pp_status s = pp_grad_tcp_run(g, ph, 2, 0, 1, 1000, &done);
    check(s == PP_OK ? done : !done);
    if (s != PP_OK) check(pp_grad_tcp_broken(g));
    pp_grad_tcp_free(g);
    close(from_ring[1]);
    return 0;
}
