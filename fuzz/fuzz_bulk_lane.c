/* libFuzzer target: what a bulk lane's receiving end reads from its socket
 * (transport/bulk_lane.c, bulk_wire.c): tensor headers and bytes, read for
 * the messages whose envelopes came, past those of dropped messages.
 *
 * Input: byte 0 says how many tensors the receiver asks for (mod 8), bytes
 * 1.. are that many requests of (sequence byte, index byte, size byte: the
 * tensor's bytes, 1..256), and the rest is what the sending rank "wrote",
 * into one end of a socket pair that is then closed. Whatever the bytes,
 * every read must finish (the end of the stream ends it), fail with a
 * reason, or say the tensor is not there; never crash, hang or write past
 * the tensor's buffer (ASan). The whole input is also parsed as a header.
 * A seed (two tensors, one of a dropped message) is written to
 * PIPPIN_FUZZ_SEEDS when it is set. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bulk_lane.h"
#include "bulk_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static void check(int cond) {
    if (!cond) __builtin_trap();
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("PIPPIN_FUZZ_SEEDS");
    if (!dir) return 0;
    char path[512];
    snprintf(path, sizeof path, "%s/seed-bulk-two", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    uint8_t req[4] = {1, 2, 0, 15}; /* one read: message 2, tensor 0, 16 bytes */
    fwrite(req, 1, sizeof req, f);
    uint8_t head[PP_BULK_HEADER_BYTES], bytes[16] = {1, 2, 3};
    pp_bulk_header h1 = {0, 1, 8}, h2 = {0, 2, 16};
    pp_bulk_header_pack(&h1, head); /* message 1: dropped, read past */
    fwrite(head, 1, sizeof head, f);
    fwrite(bytes, 1, 8, f);
    pp_bulk_header_pack(&h2, head);
    fwrite(head, 1, sizeof head, f);
    fwrite(bytes, 1, 16, f);
    fclose(f);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_bulk_header h;
    const char *why = pp_bulk_header_parse(data, size, &h);
    check(why != NULL);
    if (size < 1) return 0;
    size_t nreq = data[0] % 8, off = 1;
    if (size < off + 3 * nreq) return 0;
    const uint8_t *req = data + off;
    off += 3 * nreq;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return 0;
    size_t left = size - off;
    const uint8_t *p = data + off;
    while (left > 0) { /* what the socket buffer holds; the rest is cut */
        ssize_t k = send(sv[1], p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k <= 0) break;
        p += k, left -= (size_t)k;
    }
    close(sv[1]);
    pp_bulk_rx rx = {sv[0], 0, {0, 0, 0}, 0, ""};
    uint8_t *buf = malloc(256);
    for (size_t i = 0; i < nreq && buf; i++) {
        uint64_t nbytes = (uint64_t)req[3 * i + 2] + 1;
        /* the stream is closed: a read can only finish, fail or decline */
        int rc = pp_bulk_rx_read(&rx, req[3 * i], req[3 * i + 1], buf, nbytes, mono_ms() + 5000);
        check(rc >= -1 && rc <= 1);
        if (rc < 0) {
            check(rx.why[0] != 0);
            break;
        }
    }
    free(buf);
    close(sv[0]);
    return 0;
}
