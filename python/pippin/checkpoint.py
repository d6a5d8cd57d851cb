"""Checkpoint directories and safetensors files: pippin/checkpoint.h and
pippin/safetensors.h.

    for s in pippin.checkpoint.list("ckpt/"):      # Step(step, committed, ...)
        print(s.step, s.committed, s.bytes)
    tensors, meta = pippin.checkpoint.read(pippin.checkpoint.stage_path("ckpt/", 9, 0))

Writing a checkpoint is the job of a run (Worker: checkpoint_dir=, or
Worker.checkpoint; Runner.save_checkpoint); these read, list and prune.
"""
import ctypes
from collections import namedtuple
from ctypes import POINTER, byref, c_int, c_int64

from . import _tensor
from ._lib import CheckpointStep, Safetensors, check, enc, lib, libc, strings

Step = namedtuple("Step", "step committed n_stages n_files bytes")


def list(directory):  # noqa: A001 - the module's verb, as `pippin checkpoint list`
    """The step directories of a checkpoint directory, ascending (Step)."""
    p, n = POINTER(CheckpointStep)(), c_int()
    check(lib.pp_checkpoint_list(enc(directory), byref(p), byref(n)))
    try:
        return [Step(s.step, bool(s.committed), s.n_stages, s.n_files, s.bytes) for s in p[0:n.value]]
    finally:
        libc.free(p)


def latest(directory):
    """The newest committed step; PippinError (not found) when there is none."""
    s = c_int64()
    check(lib.pp_checkpoint_latest(enc(directory), byref(s)))
    return s.value


def prune(directory, keep=None, before=None):
    """Removes the step directories below step `before`, or all but the
    `keep` newest committed steps."""
    if (keep is None) == (before is None):
        raise ValueError("give keep or before, one of them")
    if keep is not None:
        b = c_int64()
        check(lib.pp_checkpoint_keep_from(enc(directory), keep, byref(b)))
        before = b.value
    check(lib.pp_checkpoint_prune(enc(directory), before))


def stage_path(directory, step, stage):
    """DIR/step_<step>/stage_<stage>.safetensors."""
    buf = ctypes.create_string_buffer(4096 + len(enc(directory)))
    lib.pp_checkpoint_stage_path(enc(directory), step, stage, buf, len(buf))
    return buf.value.decode()


def _take(p):
    try:
        st = p.contents
        tensors = {st.names[i].decode(): _tensor.borrowed_to_numpy(st.tensors[i]) for i in range(st.n)}
        meta = {st.meta_keys[i].decode(): st.meta_values[i].decode() for i in range(st.n_meta)}
        return tensors, meta
    finally:
        lib.pp_safetensors_free(p)


def read(path):
    """A checkpoint's stage file, its hash checked: ({name: ndarray},
    {metadata key: value}). Parameters under their names, optimizer state
    as "pippin.optim.<buffer>" (flat, the stage's layout)."""
    p = POINTER(Safetensors)()
    check(lib.pp_checkpoint_read_file(enc(path), byref(p)))
    return _take(p)


def load_safetensors(path):
    """Any safetensors file: ({name: ndarray}, {metadata})."""
    p = POINTER(Safetensors)()
    check(lib.pp_safetensors_load(enc(path), byref(p)))
    return _take(p)


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: array} (and metadata strings) durably as safetensors."""
    names = [*tensors]
    metadata = metadata or {}
    n, keep_n = strings(names)
    k, keep_k = strings([*metadata])
    v, keep_v = strings([str(x) for x in metadata.values()])
    with _tensor.Inputs([tensors[x] for x in names], names) as ptrs:
        check(lib.pp_safetensors_save(enc(path), len(names), n, ptrs, len(metadata), k, v))
