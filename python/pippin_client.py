"""A client of a pippin serving pipeline (`mode: serve`, docs/serving.md),
for services written in Python. Needs Debian's python3-zmq and numpy.

    from pippin_client import Client
    c = Client("tcp://127.0.0.1:5600")
    out = c.request({"idx": tokens, "targets": targets}, outputs=["logits"])
    print(out["logits"].shape)
    for piece in c.generate(text="ROMEO:", max_tokens=40, session="chat-1"):
        print(piece.text, end="", flush=True)   # piece.tokens: the token ids

`generate` runs the service's generation loop (a causal language model,
greedy or sampled) and yields each message of the stream as it arrives.
With `session=` the model's state (a KV cache) stays on the stages, so the
next request or generation of that session continues from it;
`end_session` drops it.
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

CODES = {0: "ok", 1: "bad request", 2: "busy", 3: "timeout", 4: "failed", 5: "unavailable",
         6: "session lost"}
KIND_INFER, KIND_STATS, KIND_GENERATE, KIND_CANCEL, KIND_END_SESSION = 0, 1, 2, 3, 4
MAX_KEPT = 4096  # responses kept for later waits, and cancelled ids (the oldest go first), as the C client
# numpy dtype <-> ONNX TensorProto.DataType
DTYPES = {np.dtype("float32"): 1, np.dtype("uint8"): 2, np.dtype("int8"): 3, np.dtype("int32"): 6,
          np.dtype("int64"): 7, np.dtype("bool"): 9, np.dtype("float16"): 10, np.dtype("float64"): 11}
NUMPY = {v: k for k, v in DTYPES.items()}


class ServeError(Exception):
    """A response that is not ok: .code (0-6), .kind ("busy", ...), message."""

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
        self.tokens, self.text, self.more = [], "", False
        for num, wire, v in _fields(buf):
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
            elif num == 6 and wire == 2:  # packed
                j = 0
                while j < len(v):
                    t, j = _read_varint(v, j)
                    self.tokens.append(t - (1 << 64) if t >> 63 else t)
            elif num == 6:
                self.tokens.append(v - (1 << 64) if v >> 63 else v)
            elif num == 7:
                self.text = bytes(v).decode(errors="replace")
            elif num == 8:
                self.more = bool(v)


def read_key(path):
    """The Z85 key (a str of 40 characters) in a `pippin keygen` file
    (PREFIX.pub or PREFIX.key): the first line that is not blank or a
    '#' comment."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                if len(line) != 40:
                    raise ValueError("%s: not a CURVE key (expected 40 characters of Z85 text)" % path)
                return line
    raise ValueError("%s: no key in the file" % path)


class Client:
    """endpoint: the front (tcp:// or ipc://). For a service whose config has
    security: (docs/serving.md "Security"), server_key is the front rank's
    public key and public_key/secret_key this client's pair (Z85 strings,
    read_key reads them from `pippin keygen` files); all three or none. A
    front that refuses the key never answers: waits raise TimeoutError."""

    def __init__(self, endpoint, server_key=None, public_key=None, secret_key=None, context=None):
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError("'%s' is not a tcp:// or ipc:// endpoint" % endpoint)
        keys = (server_key, public_key, secret_key)
        if any(k is not None for k in keys) and not all(k is not None for k in keys):
            raise ValueError("CURVE needs server_key, public_key and secret_key (all three)")
        self.endpoint = endpoint
        self._curve = server_key is not None
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if self._curve:
            if not zmq.has("curve"):
                raise RuntimeError("CURVE requested but this libzmq lacks it")
            self._sock.curve_serverkey = server_key.encode() if isinstance(server_key, str) else server_key
            self._sock.curve_publickey = public_key.encode() if isinstance(public_key, str) else public_key
            self._sock.curve_secretkey = secret_key.encode() if isinstance(secret_key, str) else secret_key
        self._sock.connect(endpoint)
        self._ids = itertools.count((int(time.time() * 1e6) ^ os.getpid() << 40) & ((1 << 63) - 1) or 1)
        self._kept = {}
        self._cancelled = {}  # ids whose remaining messages are dropped (ordered: the oldest go first)

    def submit(self, inputs, outputs=None, timeout_ms=0, kind=KIND_INFER, session=None, extra=b"", rid=None):
        """Sends a request ({name: array}); returns its id at once."""
        rid = rid or next(self._ids)
        msg = _field(1, 0, _varint(rid))
        if kind:
            msg += _field(2, 0, _varint(kind))
        for name, a in (inputs or {}).items():
            msg += _bytes(3, _tensor(name, a))
        for name in outputs or []:
            msg += _bytes(4, name.encode())
        if timeout_ms:
            msg += _field(5, 0, _varint(timeout_ms))
        if session:
            msg += _bytes(6, session.encode())
        self._sock.send(msg + extra)
        return rid

    def wait(self, rid=None, timeout_ms=10000):
        """The response to request rid (None: to any), a Response; raises
        TimeoutError when none came in time."""
        if rid in self._kept or (rid is None and self._kept):
            key = rid if rid is not None else next(iter(self._kept))
            r = self._kept[key].pop(0)
            if not self._kept[key]:
                del self._kept[key]
            return r
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000) + 1):
                if time.monotonic() >= deadline:
                    raise TimeoutError("no response from %s within %d ms%s" % (
                        self.endpoint, timeout_ms,
                        " (CURVE: a front that refuses this client's key, or whose key is not server_key,"
                        " never answers)" if self._curve else ""))
                continue
            r = Response(self._sock.recv())
            if r.id in self._cancelled:
                if not r.more:
                    self._cancelled.pop(r.id, None)
                continue
            if rid is None or r.id == rid:
                return r
            if sum(len(v) for v in self._kept.values()) >= MAX_KEPT:  # nobody waits for these: drop the oldest
                oldest = next(iter(self._kept))
                self._kept[oldest].pop(0)
                if not self._kept[oldest]:
                    del self._kept[oldest]
            self._kept.setdefault(r.id, []).append(r)

    def request(self, inputs, outputs=None, timeout_ms=10000, session=None):
        """Sends a request and waits: {output name: array}, or ServeError."""
        r = self.wait(self.submit(inputs, outputs, timeout_ms, session=session), timeout_ms + 1000)
        if r.code != 0:
            raise ServeError(r.code, r.error)
        return r.outputs

    def generate(self, tokens=None, text=None, max_tokens=16, temperature=0.0, top_k=0, seed=0, stop=(),
                 session=None, timeout_ms=10000):
        """Yields the stream of a generation (Response objects: .tokens,
        .text); raises ServeError on an error. Give prompt tokens (int64
        [1, T] or [T]) or text (the service's serve.vocab)."""
        if (tokens is None) == (text is None):
            raise ValueError("give tokens or text, one of them")
        extra = b""
        if text is not None:
            extra += _bytes(7, text.encode())
        extra += _field(8, 0, _varint(max_tokens))
        if temperature:
            extra += _field(9, 5, np.float32(temperature).tobytes())
        if top_k:
            extra += _field(10, 0, _varint(top_k))
        if seed:
            extra += _field(11, 0, _varint(seed))
        if stop:
            extra += _bytes(12, b"".join(_varint(int(t)) for t in stop))
        inputs = None if tokens is None else {"tokens": np.asarray(tokens, dtype=np.int64).reshape(1, -1)}
        rid = self.submit(inputs, None, timeout_ms, KIND_GENERATE, session, extra)
        last = False
        try:
            while not last:
                r = self.wait(rid, timeout_ms + 1000)
                last = not r.more or r.code != 0
                if r.code != 0:
                    raise ServeError(r.code, r.error)
                yield r
        except (GeneratorExit, TimeoutError):
            if not last:  # closed or given up mid-stream: the service stops it
                self.cancel(rid)
            raise

    def cancel(self, rid):
        """Stops a generation; its remaining messages are dropped."""
        try:
            self._sock.send(_field(1, 0, _varint(rid)) + _field(2, 0, _varint(KIND_CANCEL)), zmq.NOBLOCK)
        except zmq.ZMQError:  # closed, or the service unreachable: nothing to stop there
            pass
        kept = self._kept.pop(rid, [])
        if not any(not r.more for r in kept):
            if len(self._cancelled) >= MAX_KEPT:
                self._cancelled.pop(next(iter(self._cancelled)))
            self._cancelled[rid] = True

    def end_session(self, session, timeout_ms=5000):
        """Drops a session and its state on every stage."""
        r = self.wait(self.submit(None, kind=KIND_END_SESSION, session=session), timeout_ms)
        if r.code != 0:
            raise ServeError(r.code, r.error)

    def stats(self, timeout_ms=5000):
        """The service's counters (a dict)."""
        r = self.wait(self.submit(None, kind=KIND_STATS), timeout_ms)
        if r.code != 0:
            raise ServeError(r.code, r.error)
        return json.loads(r.stats or "{}")

    def close(self):
        self._sock.close()
