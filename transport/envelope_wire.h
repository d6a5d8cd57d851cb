/* The envelope's protobuf wire format, written and read without protobuf-c's
 * reflection (internal to transport/envelope.c).
 *
 * protobuf-c packs and unpacks by walking field descriptors, which costs
 * about 0.7 us per envelope: as much as libzmq spends moving a small
 * message. The envelope is one flat message, so it is coded here directly
 * into and out of the same generated structs (Pippin__Envelope,
 * Pippin__TensorMeta). The bytes are exactly protobuf-c's (a test packs with
 * both), and the reader accepts what protobuf-c's unpack accepts, with the
 * same result (the fuzz target decodes every input with both). */
#ifndef PIPPIN_TRANSPORT_ENVELOPE_WIRE_H
#define PIPPIN_TRANSPORT_ENVELOPE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "pippin.pb-c.h"
#include "pippin/status.h"

#include "envelope.h"
/* Packed size of pb, and writing it (out has that many bytes). */
size_t pp_wire_size(const Pippin__Envelope *pb);
size_t pp_wire_write(const Pippin__Envelope *pb, uint8_t *out);

/* Parses data[0..len) into *out, allocated in one block (free(*out)).
 * Strings are copied and NUL-terminated; inline_data points into data. A
 * malformed message is PP_ERR_PARSE naming the field. */
pp_status pp_wire_read(const uint8_t *data, size_t len, Pippin__Envelope **out);
/* The same, with head + per_tensor * (number of tensors) bytes (16-byte
 * aligned) for the caller at the start of the block: *block is that space,
 * and free(*block) releases everything. */
pp_status pp_wire_read_with(const uint8_t *data, size_t len, size_t head, size_t per_tensor,
                            Pippin__Envelope **out, void **block);

#endif
