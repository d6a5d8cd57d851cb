/* The transport's wire envelope: encoding, decoding and validation.
 *
 * A transport message is multipart. Its last frame is a packed protobuf
 * `Envelope` (lib/proto/pippin.proto). Each tensor's bytes are placed one
 * way: PP_PLACE_FRAMES, as raw frames before the envelope, tensor after
 * tensor, `nframes` frames per tensor; PP_PLACE_INLINE, in the envelope's inline
 * data (the inline tensors' bytes back to back, in tensor order), which
 * saves a frame per small message; PP_PLACE_SHM, in the sender's
 * shared-memory ring `shm_name` at `shm_pos` (ranks on one host; the ring
 * itself is transport/shm_ring.h). This module is pure: it
 * knows nothing of sockets, so the fuzzer (fuzz/fuzz_envelope.c) and the
 * transport share exactly the same checks.
 *
 * Decoding validates every field before anything else looks at it: protocol
 * version, kind, dtype codes, ranks of 0..8 with dims >= 0, shape product x
 * dtype size == nbytes without overflow, the total size limit, frame counts,
 * stage and rank ranges, names (printable, bounded), inline data size ==
 * the inline tensors' nbytes. A message that passes
 * pp_envelope_decode and pp_envelope_check_frames can be turned into tensors
 * without further checks. */
#ifndef PIPPIN_ENVELOPE_H
#define PIPPIN_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"
#include "pippin/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PP_PROTOCOL_VERSION 3u /* 3: the envelope is a message's last frame */
/* Largest envelope frame a receiver accepts. */
#define PP_ENVELOPE_MAX_BYTES 65536u
/* Longest value name (bytes, without the terminating NUL). */
#define PP_ENVELOPE_MAX_NAME 255u
/* Largest inline data a sender puts in an envelope (a receiver accepts
 * whatever fits in PP_ENVELOPE_MAX_BYTES). */
#define PP_ENVELOPE_INLINE_MAX 16384u
/* Longest shared-memory ring name; names are "/pippin-" then [A-Za-z0-9._-]. */
#define PP_ENVELOPE_MAX_SHM_NAME 63u
/* Longest abort reason / control text. */
#define PP_ENVELOPE_MAX_TEXT 1024u
/* Limits a receiver applies where pp_envelope_limits leaves them 0. */
#define PP_ENVELOPE_DEFAULT_MAX_MESSAGE_BYTES (UINT64_C(2) << 30)
#define PP_ENVELOPE_DEFAULT_MAX_TENSORS 256u
#define PP_ENVELOPE_DEFAULT_MAX_FRAMES 65536u

/* Message kinds: pp_msg_kind (values equal the protobuf enum pippin.Kind),
 * and on the wire only: */
#define PP_WIRE_KIND_BATCH 6 /* pippin.KIND_BATCH: several messages in one */
/* Most entries in one batch. */
#define PP_ENVELOPE_MAX_BATCH 64u

/* One entry of a batch: a packed envelope. */
typedef struct pp_envelope_part {
    const void *data;
    size_t len;
} pp_envelope_part;


/* Where a tensor's bytes travel; values equal the protobuf enum
 * pippin.Placement. */
typedef enum pp_wire_placement {
    PP_PLACE_FRAMES = 0,
    PP_PLACE_INLINE = 1,
    PP_PLACE_SHM = 2,
    PP_PLACE_BULK = 3 /* on the sender's bulk lane (transport/bulk_lane.h) */
} pp_wire_placement;

/* One tensor's metadata. */
typedef struct pp_wire_tensor {
    const char *name;   /* owned by the envelope (decode) or the caller (encode) */
    pp_dtype dtype;
    int ndim;
    int64_t shape[PP_MAX_DIMS];
    uint64_t nbytes;
    uint32_t nframes;   /* PP_PLACE_FRAMES: data frames (before the envelope); else 0 */
    pp_wire_placement placement;
    uint64_t shm_pos;   /* PP_PLACE_SHM: ring position of the first byte */
} pp_wire_tensor;

typedef struct pp_envelope {
    uint32_t version;
    pp_msg_kind kind;
    uint64_t run_id;
    int64_t step;
    int32_t microbatch;
    int32_t src_stage;
    int32_t dst_stage;
    int32_t src_rank;
    uint64_t seq;
    int ntensors;
    pp_wire_tensor *tensors;
    const char *text;   /* "" when absent */
    /* The bytes of the PP_PLACE_INLINE tensors, back to back in tensor
     * order (encode: the caller's; decode: inside the decoded frame, which
     * must outlive the envelope's use). */
    const void *inline_data;
    size_t inline_bytes;
    /* The sender's ring for PP_PLACE_SHM tensors; "" when there are none. */
    const char *shm_name;
    /* The sender's handshake nonce (transport-internal: see pippin.proto). */
    uint64_t sender_nonce;
    /* PP_WIRE_KIND_BATCH: the entries (encode: the caller's; decode: inside
     * the decoded frame), each to be decoded with pp_envelope_decode_entry. */
    int nbatch;
    const pp_envelope_part *batch;
    /* private: decoded storage, released by pp_envelope_clear */
    void *priv_;
} pp_envelope;

/* What a receiver accepts. Zero fields take the defaults noted. */
typedef struct pp_envelope_limits {
    uint64_t max_message_bytes; /* sum of tensor bytes; 0: 2 GiB */
    uint32_t max_tensors;       /* 0: 256 */
    uint32_t max_frames;        /* data frames per message; 0: 65536 */
    int nstages;                /* src/dst stage must be < nstages; 0: unchecked */
    int nranks;                 /* src_rank must be < nranks; 0: unchecked */
} pp_envelope_limits;

/* Size of the packed envelope, and packing into buf (cap >= that size).
 * The envelope is not validated here; the receiver does that. */
size_t pp_envelope_packed_size(const pp_envelope *env);
pp_status pp_envelope_pack(const pp_envelope *env, void *buf, size_t cap, size_t *len);
/* Packs into memory alloc(ctx, n) provides for the n bytes it needs (NULL:
 * none, PP_ERR_NOMEM); one pass where packed_size + pack take two. */
pp_status pp_envelope_pack_into(const pp_envelope *env, void *(*alloc)(void *ctx, size_t n), void *ctx,
                                size_t *len);

/* Decodes an envelope frame and validates every field against lim (NULL: defaults).
 * On success *out holds the envelope; release it with pp_envelope_clear.
 * On failure nothing needs releasing and the error message says which check
 * failed. A batch (kind PP_WIRE_KIND_BATCH) has 1..PP_ENVELOPE_MAX_BATCH
 * non-empty entries and nothing else but the version, run id, source rank,
 * sequence number and nonce; any other kind has no entries. */
pp_status pp_envelope_decode(const void *data, size_t len, const pp_envelope_limits *lim,
                             pp_envelope *out);

/* Decodes one entry of a batch: pp_envelope_decode, and then it must be an
 * activation or a gradient whose tensors are all inline (or empty), so that
 * it needs no data frame and no ring. */
pp_status pp_envelope_decode_entry(const void *data, size_t len, const pp_envelope_limits *lim,
                                   pp_envelope *out);

/* Checks the data frames against a decoded envelope: their count equals the
 * sum of nframes, no frame is empty, and each tensor's frames add up to its
 * nbytes (inline and shared-memory tensors have no frames; decode checked
 * the inline sizes, the transport checks ring positions). */
pp_status pp_envelope_check_frames(const pp_envelope *env, size_t nframes,
                                   const size_t *frame_sizes);

/* Builds tensor i of a checked message by copying its frames (frames and
 * sizes point at that tensor's nframes frames). */
pp_status pp_envelope_tensor_copy(const pp_wire_tensor *wt, const void *const *frames,
                                  const size_t *sizes, pp_tensor **out);

/* Builds tensor i (PP_PLACE_INLINE) of a decoded envelope by copying its
 * bytes out of the inline data. */
pp_status pp_envelope_tensor_inline(const pp_envelope *env, int i, pp_tensor **out);

/* Releases what pp_envelope_decode allocated; safe on a zeroed envelope. */
void pp_envelope_clear(pp_envelope *env);

#ifdef __cplusplus
}
#endif
#endif
