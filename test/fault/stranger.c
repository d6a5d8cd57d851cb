/* A stranger against a running pipeline (test/fault/attack.sh): for the
 * given number of seconds it connects to every rank's endpoint and sends
 * what would change or end a run if it were accepted -- activations and
 * gradients forged for the coming steps under the names the example GPT
 * uses, ABORTs, goodbyes, message-ring announcements, shared-memory
 * envelopes -- plus a flood of 64 KiB messages for future steps, each with
 * the run's real run id (the attacker read the config), no run id and a
 * random one. It claims to be the rank each message would come from.
 *
 *   pippin-test-stranger SECONDS RUN_ID ENDPOINT...
 *
 * RUN_ID is the config's run_id text (hashed as the worker does) or "-".
 * Prints how many messages it sent. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "envelope.h"
#include "hash.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long sent;

/* Sends one data frame of `bytes` zeros for a FRAMES tensor, then env (a
 * message's last frame). */
static void send_env(void *s, const pp_envelope *env, size_t bytes) {
    static uint8_t buf[PP_ENVELOPE_MAX_BYTES];
    static uint8_t data[1 << 16];
    size_t len;
    if (pp_envelope_pack(env, buf, sizeof buf, &len) != PP_OK) return;
    int more = env->ntensors && env->tensors[0].placement == PP_PLACE_FRAMES;
    if (more && zmq_send(s, data, bytes, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) return;
    if (zmq_send(s, buf, len, ZMQ_DONTWAIT) < 0) return;
    sent++;
}

/* A message to rank r claiming to come from the rank before it (or after,
 * for gradients), tensor of `bytes` bytes. */
static void forge(void *s, int r, int nranks, uint64_t run, pp_msg_kind kind, int64_t step, int mb, size_t bytes,
                  const char *name) {
    pp_wire_tensor wt = {0};
    wt.name = name;
    wt.dtype = PP_F32;
    wt.ndim = 1;
    wt.shape[0] = (int64_t)(bytes / 4);
    wt.nbytes = bytes;
    wt.nframes = 1;
    wt.placement = PP_PLACE_FRAMES;
    int from = kind == PP_MSG_ACTIVATION ? (r + nranks - 1) % nranks : (r + 1) % nranks;
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = kind;
    env.run_id = run;
    env.step = step;
    env.microbatch = mb;
    env.src_stage = from;
    env.dst_stage = r;
    env.src_rank = from;
    env.seq = (uint64_t)sent + 1;
    env.ntensors = 1;
    env.tensors = &wt;
    env.text = "";
    env.shm_name = "";
    send_env(s, &env, bytes);
}

static void control(void *s, int from, uint64_t run, pp_msg_kind kind, const char *text) {
    pp_envelope env = {0};
    env.version = PP_PROTOCOL_VERSION;
    env.kind = kind;
    env.run_id = run;
    env.src_rank = from;
    env.seq = (uint64_t)sent + 1;
    env.text = text;
    env.shm_name = "";
    send_env(s, &env, 0);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s SECONDS RUN_ID ENDPOINT...\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    uint64_t real = strcmp(argv[2], "-") == 0 ? 0 : pp_hash64(PP_HASH64_SEED, argv[2], strlen(argv[2])) | 1;
    int n = argc - 3;
    void *ctx = zmq_ctx_new();
    void **socks = calloc((size_t)n, sizeof *socks);
    int zero = 0, hwm = 1000;
    for (int r = 0; r < n; r++) {
        socks[r] = zmq_socket(ctx, ZMQ_PUSH);
        zmq_setsockopt(socks[r], ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(socks[r], ZMQ_SNDHWM, &hwm, sizeof hwm);
        if (zmq_connect(socks[r], argv[3 + r]) != 0) {
            fprintf(stderr, "stranger: connect %s: %s\n", argv[3 + r], zmq_strerror(zmq_errno()));
            return 1;
        }
    }
    srand((unsigned)time(NULL));
    uint64_t runs[3] = {real, 0, ((uint64_t)rand() << 32 | (uint64_t)rand()) | 1};
    double end = now_s() + seconds;
    long flood = 0; /* 64 KiB messages, 3000 per rank in all (192 MiB each if they were kept) */
    for (int64_t round = 0; now_s() < end; round++) {
        for (int r = 0; r < n; r++) {
            void *s = socks[r];
            char name[64];
            for (int k = 0; k < 3; k++) {
                uint64_t run = runs[k];
                int64_t step = round % 40;
                snprintf(name, sizeof name, "/blocks.%d/Add_1_output_0", (r + n - 1) % n);
                for (int mb = 0; mb < 2; mb++) {
                    forge(s, r, n, run, PP_MSG_ACTIVATION, step, mb, 24, name);
                    forge(s, r, n, run, PP_MSG_ACTIVATION, step + 1, mb, 24, name);
                    snprintf(name, sizeof name, "/blocks.%d/Add_1_output_0", r);
                    forge(s, r, n, run, PP_MSG_GRADIENT, step, mb, 24, name);
                }
                control(s, (r + 1) % n, run, PP_MSG_ABORT, "stop: forged by a stranger");
                control(s, (r + 1) % n, run, PP_MSG_CONTROL, "bye");
                control(s, (r + 1) % n, run, PP_MSG_CONTROL, "msgring /pippin-0-1-1");
                for (int f = 0; f < 20 && flood < 3000L * n; f++, flood++) /* up to 100 steps ahead */
                    forge(s, r, n, run, PP_MSG_ACTIVATION, step + 1 + f * 5, 7, 1 << 16, "flood");
            }
        }
        struct timespec nap = {0, 2 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    for (int r = 0; r < n; r++) zmq_close(socks[r]);
    zmq_ctx_term(ctx);
    free(socks);
    printf("stranger: sent %ld messages\n", sent);
    return 0;
}
