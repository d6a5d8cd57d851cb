"""A client of a pippin serving pipeline (`mode: serve`, docs/serving.md),
for services written in Python. Needs Debian's python3-zmq and numpy.

    from pippin_client import Client
    c = Client("tcp://127.0.0.1:5600")
    out = c.request({"idx": tokens, "targets": targets}, outputs=["logits"])
    print(out["logits"].shape)

`submit` sends without waiting and returns the request id; `wait` takes the
response to one id (or any); responses that arrive for other ids are kept.
A response that is not "ok" raises ServeError with the service's message.
The wire format is transport/serve.proto, written and read here directly
(a few varints and length-delimited fields), so no protobuf package is
needed.
"""
import itertools
import json
import os
import time

import numpy as np
import zmq

CODES = {0: "ok", 1: "bad request", 2: "busy", 3: "timeout", 4: "failed", 5: "unavailable"}
# numpy dtype <-> ONNX TensorProto.DataType
DTYPES = {np.dtype("float32"): 1, np.dtype("uint8"): 2, np.dtype("int8"): 3, np.dtype("int32"): 6,
          np.dtype("int64"): 7, np.dtype("bool"): 9, np.dtype("float16"): 10, np.dtype("float64"): 11}
NUMPY = {v: k for k, v in DTYPES.items()}


class ServeError(Exception):
    """A response that is not ok: .code (0-5), .kind ("busy", ...), message."""

    def __init__(self, code, message):
        self.code = code
        self.kind = CODES.get(code, "unknown")
        super().__init__("%s: %s" % (self.kind, message))


# ---- protobuf wire (varints and length-delimited fields) ----

def _varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num, wire, payload):
    return _varint(num << 3 | wire) + payload


def _bytes(num, data):
    return _field(num, 2, _varint(len(data)) + data)


def _tensor(name, a):
    a = np.ascontiguousarray(a)
    if a.dtype not in DTYPES:
        raise TypeError("input '%s': dtype %s is not one pippin serves" % (name, a.dtype))
    shape = b"".join(_varint(d) for d in a.shape)
    msg = _bytes(1, name.encode()) + _field(2, 0, _varint(DTYPES[a.dtype]))
    if a.ndim:
        msg += _bytes(3, shape)
    return msg + _bytes(4, a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


def _read_varint(buf, i):
    v = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("malformed response (varint)")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _fields(buf):
    """(field number, wire type, value) for each field of a message."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
        elif wire == 2:
            n, i = _read_varint(buf, i)
            if i + n > len(buf):
                raise ValueError("malformed response (length)")
            v, i = buf[i:i + n], i + n
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("malformed response (wire type %d)" % wire)
        yield num, wire, v


def _read_tensor(buf):
    name, dtype, shape, data = "", 0, [], b""
    for num, wire, v in _fields(buf):
        if num == 1:
            name = bytes(v).decode()
        elif num == 2:
            dtype = v
        elif num == 3 and wire == 2:  # packed
            j = 0
            while j < len(v):
                d, j = _read_varint(v, j)
                shape.append(d)
        elif num == 3:
            shape.append(v)
        elif num == 4:
            data = bytes(v)
    if dtype not in NUMPY:
        raise ValueError("output '%s': unknown dtype %d" % (name, dtype))
    dt = NUMPY[dtype].newbyteorder("<")
    if len(data) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
        raise ValueError("output '%s': %d bytes for shape %s" % (name, len(data), shape))
    return name, np.frombuffer(data, dtype=dt).reshape(shape).astype(NUMPY[dtype], copy=False)


class Response:
    def __init__(self, buf):
        self.id, self.code, self.error, self.outputs, self.stats = 0, 0, "", {}, None
        for num, _, v in _fields(buf):
            if num == 1:
                self.id = v
            elif num == 2:
                self.code = v
            elif num == 3:
                self.error = bytes(v).decode(errors="replace")
            elif num == 4:
                name, a = _read_tensor(v)
                self.outputs[name] = a
            elif num == 5:
                self.stats = bytes(v).decode(errors="replace")


class Client:
    def __init__(self, endpoint, context=None):
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError("'%s' is not a tcp:// or ipc:// endpoint" % endpoint)
        self.endpoint = endpoint
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._ids = itertools.count((int(time.time() * 1e6) ^ os.getpid() << 40) & ((1 << 63) - 1) or 1)
        self._kept = {}

    def submit(self, inputs, outputs=None, timeout_ms=0, kind=0):
        """Sends a request ({name: array}); returns its id at once."""
        rid = next(self._ids)
        msg = _field(1, 0, _varint(rid))
        if kind:
            msg += _field(2, 0, _varint(kind))
        for name, a in (inputs or {}).items():
            msg += _bytes(3, _tensor(name, a))
        for name in outputs or []:
            msg += _bytes(4, name.encode())
        if timeout_ms:
            msg += _field(5, 0, _varint(timeout_ms))
        self._sock.send(msg)
        return rid

    def wait(self, rid=None, timeout_ms=10000):
        """The response to request rid (None: to any), a Response; raises
        TimeoutError when none came in time."""
        if rid in self._kept or (rid is None and self._kept):
            return self._kept.pop(rid if rid is not None else next(iter(self._kept)))
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000) + 1):
                if time.monotonic() >= deadline:
                    raise TimeoutError("no response from %s within %d ms" % (self.endpoint, timeout_ms))
                continue
            r = Response(self._sock.recv())
            if rid is None or r.id == rid:
                return r
            self._kept[r.id] = r

    def request(self, inputs, outputs=None, timeout_ms=10000):
        """Sends a request and waits: {output name: array}, or ServeError."""
        r = self.wait(self.submit(inputs, outputs, timeout_ms), timeout_ms + 1000)
        if r.code != 0:
            raise ServeError(r.code, r.error)
        return r.outputs

    def stats(self, timeout_ms=5000):
        """The service's counters (a dict)."""
        r = self.wait(self.submit(None, kind=1), timeout_ms)
        if r.code != 0:
            raise ServeError(r.code, r.error)
        return json.loads(r.stats or "{}")

    def close(self):
        self._sock.close()
