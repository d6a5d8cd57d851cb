"""numpy arrays <-> pp_tensor.

Inputs are wrapped without a copy (pp_tensor_wrap over the array's buffer)
when the array is C-contiguous, aligned and of a dtype pippin has; the
tensor holds a reference to the array until pippin drops its last reference
(the free function releases it), so pippin may keep it as long as it likes.

Outputs: a tensor that pippin hands over with no other reference to its
buffer becomes a numpy array without a copy (the array owns the tensor and
frees it when it goes); any other (a view of a parameter, of an input, of
another output) is copied, so an array never aliases the model.
"""
import ctypes
import itertools
from ctypes import byref, c_int64

import numpy as np

from . import _lib
from ._lib import TensorP, check, lib

F32, U8, I8, I32, I64, BOOL, F16, F64, BF16 = 1, 2, 3, 6, 7, 9, 10, 11, 16
TO_NUMPY = {F32: np.float32, U8: np.uint8, I8: np.int8, I32: np.int32, I64: np.int64, BOOL: np.bool_,
            F16: np.float16, F64: np.float64}
FROM_NUMPY = {np.dtype(v): k for k, v in TO_NUMPY.items()}


def dtype_name(code):
    """pippin's name of a dtype code ("float32", ...)."""
    return lib.pp_dtype_name(code).decode()


def numpy_dtype(code):
    """The numpy dtype of a pippin dtype code (bfloat16: None)."""
    t = TO_NUMPY.get(code)
    return None if t is None else np.dtype(t)


# ---- inputs ----

_pinned = {}  # hint -> the array a wrapped tensor borrows
_keys = itertools.count(1)


@_lib.free_fn
def _release(data, hint):
    _pinned.pop(hint, None)


def wrap(a, name="input", dtype=None):
    """A new pp_tensor (caller frees it) over a's buffer, without a copy when
    the buffer allows. dtype: a numpy dtype to convert lists and scalars to."""
    if not isinstance(a, np.ndarray):
        a = np.asarray(a, dtype=dtype)
    if a.dtype not in FROM_NUMPY:
        raise TypeError("%s: numpy dtype %s has no pippin dtype (float32/64/16, int64/32/8, uint8, bool)"
                        % (name, a.dtype))
    if a.ndim > _lib.MAX_DIMS:
        raise ValueError("%s: %d dims (pippin takes at most %d)" % (name, a.ndim, _lib.MAX_DIMS))
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    a = np.require(a, requirements=["C", "A"])
    key = next(_keys)
    _pinned[key] = a
    shape = (c_int64 * max(a.ndim, 1))(*a.shape)
    out = TensorP()
    data = a.ctypes.data if a.nbytes else None
    st = lib.pp_tensor_wrap(FROM_NUMPY[a.dtype], a.ndim, shape, data, _release, key, byref(out))
    if st != 0:
        _pinned.pop(key, None)  # on failure the free function is not called
        check(st)
    return out


class Inputs:
    """The pp_tensor *array for a call, freed (the references dropped) after."""

    def __init__(self, arrays, names=None, dtypes=None):
        n = len(arrays)
        self.ptrs = (TensorP * max(n, 1))()
        try:
            for i, a in enumerate(arrays):
                self.ptrs[i] = wrap(a, names[i] if names else "input %d" % i, dtypes[i] if dtypes else None)
        except BaseException:
            self.close()
            raise

    def close(self):
        for i in range(len(self.ptrs)):
            if self.ptrs[i]:
                lib.pp_tensor_free(self.ptrs[i])
                self.ptrs[i] = TensorP()

    def __enter__(self):
        return self.ptrs

    def __exit__(self, *exc):
        self.close()


# ---- outputs ----

def _own_free_fns():
    """The free functions of buffers pippin allocates for itself (small and
    pooled): a tensor with one of them and one reference owns its buffer."""
    fns = set()
    for n in (1, 1 << 14):
        t = TensorP()
        check(lib.pp_tensor_empty(F32, 1, (c_int64 * 1)(n), byref(t)))
        fns.add(t.contents.free_fn)
        lib.pp_tensor_free(t)
    fns.discard(None)
    return fns


_OWN = _own_free_fns()


class _Owner:
    """Keeps a pp_tensor alive under the numpy array that views it."""

    def __init__(self, t, dtype, shape):
        self._t = t
        self.__array_interface__ = {"data": (t.contents.data, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}

    def __del__(self):
        if self._t:
            lib.pp_tensor_free(self._t)
            self._t = None


def to_numpy(t, copy=None):
    """A numpy array from a pp_tensor pointer whose reference the caller
    hands over (freed here, or when the array goes). copy None: without a
    copy where the tensor owns its buffer alone; True: always copy.
    bfloat16 tensors come back as float32."""
    if not t:
        return None
    if t.contents.dtype == BF16:
        f = TensorP()
        st = lib.pp_tensor_cast(t, F32, byref(f))
        lib.pp_tensor_free(t)
        check(st)
        t = f
    c = t.contents
    dt = numpy_dtype(c.dtype)
    shape = tuple(c.shape[:c.ndim])
    if dt is None:
        lib.pp_tensor_free(t)
        raise TypeError("pippin dtype %d has no numpy dtype" % c.dtype)
    if c.nbytes == 0 or not c.data:
        lib.pp_tensor_free(t)
        return np.zeros(shape, dt)
    if not copy and c.refcount == 1 and c.free_fn in _OWN:
        return np.asarray(_Owner(t, dt, shape))
    a = np.empty(shape, dt)
    ctypes.memmove(a.ctypes.data, c.data, c.nbytes)
    lib.pp_tensor_free(t)
    return a


def borrowed_to_numpy(t):
    """A copy of a tensor pippin keeps (no reference handed over)."""
    if not t:
        return None
    c = t.contents
    if c.dtype == BF16 or numpy_dtype(c.dtype) is None:
        f = TensorP()
        check(lib.pp_tensor_cast(t, F32, byref(f)))
        return to_numpy(f)
    a = np.empty(tuple(c.shape[:c.ndim]), numpy_dtype(c.dtype))
    if c.nbytes:
        ctypes.memmove(a.ctypes.data, c.data, c.nbytes)
    return a
