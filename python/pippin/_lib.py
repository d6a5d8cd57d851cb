"""libpippin.so through ctypes: finding the library, the C structs the
package reads, every function's prototype, and PippinError.

The prototypes mirror include/pippin/*.h exactly (a wrong argtype crashes,
so each is written next to its header's name). The library is looked up in
this order:

1. the environment variable PIPPIN_LIB (a path to libpippin.so);
2. PIPPIN_BUILD_ROOT/libpippin.so (a meson build directory: meson puts the
   library at the top of it);
3. the library `meson install` put next to this package (_paths.py, written
   at install time);
4. the installed soname, libpippin.so.<major>, through the dynamic loader
   (ctypes.util.find_library("pippin") first).

ctypes releases the GIL around every call, so workers on threads run in
parallel and callbacks (progress, log, buffer release) take it back.
"""
import ctypes
import ctypes.util
import os
from ctypes import CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int64, c_long, c_size_t, \
    c_void_p

SOMAJOR = 0  # the soname's major version (meson.build: soversion)
MAX_DIMS = 8

# ---- finding and loading the library ----


def _candidates():
    env = os.environ.get("PIPPIN_LIB")
    if env:
        yield env, "PIPPIN_LIB"
        return  # an explicit choice: no fallback that would hide a wrong path
    root = os.environ.get("PIPPIN_BUILD_ROOT")
    if root:
        yield os.path.join(root, "libpippin.so"), "PIPPIN_BUILD_ROOT"
    try:
        from . import _paths  # written by meson install
        yield os.path.join(_paths.LIBDIR, "libpippin.so.%d" % SOMAJOR), "the install's libdir"
    except ImportError:
        pass
    found = ctypes.util.find_library("pippin")
    if found:
        yield found, "find_library"
    yield "libpippin.so.%d" % SOMAJOR, "the dynamic loader"


def _load():
    tried = []
    for path, how in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s): %s" % (path, how, e))
    raise OSError("libpippin not found; set PIPPIN_LIB to libpippin.so or PIPPIN_BUILD_ROOT to a meson "
                  "build directory. Tried:\n  " + "\n  ".join(tried))


lib, path = _load()
# free() as the process resolves it (RTLD_DEFAULT), not libc.so.6's own: with
# a malloc preloaded (jemalloc, tcmalloc, a sanitizer's) that is the one that
# allocated what pippin hands back; libc's free would corrupt the heap.
libc = ctypes.CDLL(None)
libc.free.argtypes = [c_void_p]
libc.free.restype = None

# ---- errors ----


class Closing:
    """close() when collected and at the end of a with block."""

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PippinError(Exception):
    """A pippin call failed: .status is the pp_status code (negative),
    .status_name its name ("invalid argument", ...), .message pippin's
    message (pp_last_error(): file, node, stage, rank or peer)."""

    def __init__(self, status, message, status_name=None):
        self.status = status
        self.status_name = status_name or ("status %d" % status)
        self.message = message
        super().__init__("%s (%s)" % (message or self.status_name, self.status_name))


def check(status):
    """Raises PippinError for a status other than PP_OK (0)."""
    if status != 0:
        msg = lib.pp_last_error().decode(errors="replace")
        name = lib.pp_status_name(status).decode(errors="replace")
        lib.pp_error_clear()
        raise PippinError(status, msg, name)


def _s(b):
    return None if b is None else b.decode(errors="replace")


def enc(s):
    """str or os.PathLike -> bytes for a const char * (None stays None)."""
    if s is None:
        return None
    if isinstance(s, bytes):
        return s
    return os.fsencode(s) if isinstance(s, os.PathLike) else str(s).encode()


def strings(seq):
    """A (const char **, keepalive) pair for a list of str."""
    bs = [enc(x) for x in seq]
    arr = (c_char_p * max(len(bs), 1))(*bs)
    return arr, bs


# ---- structs (only what the package reads or fills) ----

free_fn = CFUNCTYPE(None, c_void_p, c_void_p)


class Tensor(Structure):  # pp_tensor
    _fields_ = [("dtype", c_int), ("ndim", c_int), ("shape", c_int64 * MAX_DIMS), ("data", c_void_p),
                ("nbytes", c_size_t), ("free_fn", c_void_p), ("free_hint", c_void_p), ("refcount", c_int)]


TensorP = POINTER(Tensor)


class Value(Structure):  # pp_value
    _fields_ = [("name", c_char_p), ("kind", c_int), ("dtype", c_int), ("ndim", c_int),
                ("shape", c_int64 * MAX_DIMS), ("dim_names", c_char_p * MAX_DIMS), ("data", TensorP),
                ("producer", c_int), ("producer_output", c_int)]


class Node(Structure):  # pp_node
    _fields_ = [("name", c_char_p), ("op_type", c_char_p), ("domain", c_char_p), ("n_in", c_int),
                ("in_", POINTER(c_int)), ("n_out", c_int), ("out", POINTER(c_int)), ("n_attr", c_int),
                ("attrs", c_void_p), ("op", c_void_p), ("region", c_int), ("stage", c_int)]


class Graph(Structure):  # pp_graph
    _fields_ = [("name", c_char_p), ("n_values", c_int), ("cap_values", c_int), ("values", POINTER(Value)),
                ("n_nodes", c_int), ("cap_nodes", c_int), ("nodes", POINTER(Node)),
                ("n_inputs", c_int), ("cap_inputs", c_int), ("inputs", POINTER(c_int)),
                ("n_outputs", c_int), ("cap_outputs", c_int), ("outputs", POINTER(c_int)),
                ("opset", c_int), ("source", c_char_p), ("name_index", c_void_p), ("name_counter", c_int)]


GraphP = POINTER(Graph)


class SplitSpec(Structure):  # pp_split_spec
    _fields_ = [("n_before", c_int), ("before", POINTER(c_char_p)), ("n_after", c_int),
                ("after", POINTER(c_char_p)), ("transmit_shared", c_int), ("ignore_markers", c_int),
                ("loss", c_char_p), ("n_cut_at", c_int), ("cut_at", POINTER(c_int))]


class PipeEdge(Structure):  # pp_pipe_edge
    _fields_ = [("value", c_char_p), ("producer", c_int), ("n_consumers", c_int), ("consumers", POINTER(c_int)),
                ("dtype", c_int), ("ndim", c_int), ("dims", c_char_p * MAX_DIMS), ("bytes_per_sample", c_int64)]


class PipeShared(Structure):  # pp_pipe_shared
    _fields_ = [("name", c_char_p), ("n_stages", c_int), ("stages", POINTER(c_int))]


class Pipe(Structure):  # pp_pipe
    _fields_ = [("n_stages", c_int), ("stages", POINTER(GraphP)), ("n_edges", c_int), ("edges", POINTER(PipeEdge)),
                ("n_shared", c_int), ("shared", POINTER(PipeShared)), ("n_outputs", c_int),
                ("outputs", POINTER(c_char_p)), ("output_stage", POINTER(c_int)), ("loss", c_char_p),
                ("loss_stage", c_int), ("cut_names", POINTER(c_char_p)), ("stage_files", POINTER(c_char_p)),
                ("n_dims", c_int), ("dims", POINTER(c_char_p))]


PipeP = POINTER(Pipe)


class OptimConfig(Structure):  # pp_optim_config
    _fields_ = [("kind", c_int), ("lr", c_double), ("weight_decay", c_double), ("maximize", c_int),
                ("momentum", c_double), ("dampening", c_double), ("nesterov", c_int),
                ("beta1", c_double), ("beta2", c_double), ("eps", c_double)]


class FlatParams(Structure):  # pp_flat_params
    _fields_ = [("n", c_int), ("values", POINTER(c_int)), ("names", POINTER(c_char_p)),
                ("offset", POINTER(c_int64)), ("numel", POINTER(c_int64)), ("ndims", POINTER(c_int)),
                ("shapes", POINTER(c_int64)), ("total", c_int64), ("data", POINTER(c_float)),
                ("grad", POINTER(c_float)), ("block", c_void_p), ("grads_incomplete", c_int)]


class ConfigEntry(Structure):  # pp_config_entry
    _fields_ = [("key", c_char_p), ("value", c_char_p)]


class Config(Structure):  # pp_config, up to serve_endpoint (read through a pointer only)
    _fields_ = [("path", c_char_p), ("model", c_char_p), ("stages", c_char_p),
                ("n_split_before", c_int), ("n_split_after", c_int),
                ("split_before", POINTER(c_char_p)), ("split_after", POINTER(c_char_p)),
                ("transmit_shared", c_int), ("split_auto", c_int), ("split_memory_cap", c_int64),
                ("n_freeze", c_int), ("freeze", POINTER(c_char_p)), ("n_dims", c_int), ("dims", POINTER(ConfigEntry)),
                ("training", c_int), ("schedule", c_char_p), ("microbatches", c_int), ("batch_size", c_int64),
                ("steps", c_int64), ("loss", c_char_p), ("optim", OptimConfig), ("n_data", c_int),
                ("data", POINTER(ConfigEntry)), ("text_file", c_char_p), ("text_vocab", c_char_p),
                ("text_seq", c_int), ("n_ranks", c_int), ("ranks", POINTER(c_char_p)), ("bind", c_char_p),
                ("timeout_ms", c_int), ("shared_memory", c_int), ("bulk_lanes", c_int), ("n_secret_keys", c_int),
                ("n_public_keys", c_int), ("secret_keys", POINTER(c_char_p)), ("public_keys", POINTER(c_char_p)),
                ("output_dir", c_char_p), ("checkpoint_dir", c_char_p), ("checkpoint_every", c_int64),
                ("checkpoint_keep", c_int), ("run_id", c_char_p), ("insecure", c_int),
                ("rejoin_timeout_ms", c_int), ("serving", c_int), ("serve_endpoint", c_char_p)]


ConfigP = POINTER(Config)


class WorkerProgress(Structure):  # pp_worker_progress
    _fields_ = [("rank", c_int), ("step", c_int64), ("steps", c_int64), ("has_loss", c_int), ("loss", c_float),
                ("step_ms", c_double)]


progress_fn = CFUNCTYPE(None, POINTER(WorkerProgress), c_void_p)


class WorkerOptions(Structure):  # pp_worker_options
    _fields_ = [("rank", c_int), ("progress", progress_fn), ("progress_user", c_void_p),
                ("checkpoint_dir", c_char_p), ("checkpoint_every", c_int64), ("resume", c_int),
                ("blas_threads", c_int), ("checkpoint_keep", c_int), ("rejoin_timeout_ms", c_int),
                ("threads", c_int)]


class CheckpointStep(Structure):  # pp_checkpoint_step
    _fields_ = [("step", c_int64), ("committed", c_int), ("n_stages", c_int), ("n_files", c_int),
                ("bytes", c_int64)]


class Safetensors(Structure):  # pp_safetensors
    _fields_ = [("n", c_int), ("names", POINTER(c_char_p)), ("tensors", POINTER(TensorP)), ("n_meta", c_int),
                ("meta_keys", POINTER(c_char_p)), ("meta_values", POINTER(c_char_p))]


class Schedule(Structure):  # pp_schedule, its leading counts
    _fields_ = [("nranks", c_int), ("nstages", c_int), ("nmb", c_int)]


log_handler_fn = CFUNCTYPE(None, c_int, c_char_p, c_void_p)

# ---- prototypes ----
V, P = c_void_p, POINTER
_protos = {
    # status.h, version.h, log.h
    "pp_status_name": (c_char_p, [c_int]),
    "pp_last_error": (c_char_p, []),
    "pp_error_clear": (None, []),
    "pp_version": (c_char_p, []),
    "pp_version_number": (c_int, []),
    "pp_log_set_level": (None, [c_int]),
    "pp_log_get_level": (c_int, []),
    "pp_log_set_handler": (None, [log_handler_fn, V]),
    # tensor.h
    "pp_tensor_empty": (c_int, [c_int, c_int, P(c_int64), P(TensorP)]),
    "pp_tensor_wrap": (c_int, [c_int, c_int, P(c_int64), V, free_fn, V, P(TensorP)]),
    "pp_tensor_cast": (c_int, [TensorP, c_int, P(TensorP)]),
    "pp_tensor_free": (None, [TensorP]),
    "pp_dtype_name": (c_char_p, [c_int]),
    # graph.h, onnx.h, exec.h
    "pp_graph_free": (None, [GraphP]),
    "pp_graph_find_value": (c_int, [GraphP, c_char_p]),
    "pp_graph_param_stats": (None, [GraphP, P(c_int64), P(c_int64)]),
    "pp_graph_freeze": (c_int, [GraphP, c_char_p]),
    "pp_onnx_load": (c_int, [c_char_p, P(GraphP)]),
    "pp_onnx_parse": (c_int, [V, c_size_t, c_char_p, P(GraphP)]),
    "pp_onnx_save": (c_int, [GraphP, c_char_p]),
    "pp_exec_new": (c_int, [GraphP, P(V)]),
    "pp_exec_free": (None, [V]),
    "pp_exec_run": (c_int, [V, P(TensorP), P(TensorP)]),
    "pp_set_blas_threads": (c_int, [c_int]),
    # pipe.h
    "pp_split_spec_init": (None, [P(SplitSpec)]),
    "pp_pipe_split": (c_int, [GraphP, P(SplitSpec), P(PipeP)]),
    "pp_pipe_free": (None, [PipeP]),
    "pp_pipe_probe_shapes": (c_int, [PipeP, c_int, P(c_char_p)]),
    "pp_pipe_to_json": (V, [PipeP]),  # malloc'd char *
    "pp_pipe_save": (c_int, [PipeP, c_char_p]),
    "pp_pipe_load": (c_int, [c_char_p, P(PipeP)]),
    # schedule.h
    "pp_schedule_from_spec": (c_int, [c_char_p, c_int, c_int, P(P(Schedule))]),
    "pp_schedule_free": (None, [P(Schedule)]),
    "pp_schedule_format_table": (c_int, [P(Schedule), c_long, P(V)]),
    # optim.h
    "pp_optim_config_init": (None, [P(OptimConfig), c_int]),
    "pp_optim_kind_parse": (c_int, [c_char_p, P(c_int)]),
    "pp_optim_new": (c_int, [P(OptimConfig), c_int64, P(V)]),
    "pp_optim_free": (None, [V]),
    "pp_optim_step": (c_int, [V, P(c_float), P(c_float), c_int64]),
    "pp_optim_steps": (c_int64, [V]),
    "pp_optim_set_lr": (None, [V, c_double]),
    # stage.h
    "pp_stage_index": (c_int, [V]),
    "pp_stage_n_inputs": (c_int, [V]),
    "pp_stage_input_name": (c_char_p, [V, c_int]),
    "pp_stage_n_outputs": (c_int, [V]),
    "pp_stage_output_name": (c_char_p, [V, c_int]),
    "pp_stage_n_params": (c_int, [V]),
    "pp_stage_param_name": (c_char_p, [V, c_int]),
    "pp_stage_has_loss": (c_int, [V]),
    # runner.h
    "pp_runner_new": (c_int, [PipeP, c_int, P(V)]),
    "pp_runner_free": (None, [V]),
    "pp_runner_n_stages": (c_int, [V]),
    "pp_runner_stage": (V, [V, c_int]),
    "pp_runner_step": (c_int, [V, c_int, P(Schedule), c_int, P(c_char_p), P(TensorP), P(TensorP)]),
    "pp_runner_set_step": (None, [V, c_int64]),
    "pp_runner_zero_grad": (None, [V]),
    "pp_runner_n_outputs": (c_int, [V]),
    "pp_runner_output_name": (c_char_p, [V, c_int]),
    "pp_runner_loss_output": (c_int, [V]),
    "pp_runner_set_optimizer": (c_int, [V, P(OptimConfig)]),
    "pp_runner_optimizer_step": (c_int, [V]),
    "pp_runner_optimizer": (V, [V, c_int]),
    "pp_runner_param_grad": (c_int, [V, c_char_p, P(TensorP)]),
    "pp_runner_param": (c_int, [V, c_char_p, P(TensorP)]),
    # trainer.h
    "pp_trainer_new": (c_int, [GraphP, c_char_p, P(V)]),
    "pp_trainer_free": (None, [V]),
    "pp_trainer_backward": (c_int, [V, P(TensorP), c_float, P(c_float)]),
    "pp_trainer_params": (P(FlatParams), [V]),
    "pp_trainer_set_step": (None, [V, c_int64, c_int64]),
    "pp_trainer_hold_params": (None, [V, c_int]),
    "pp_trainer_n_inputs": (c_int, [V]),
    "pp_flat_params_zero_grad": (None, [P(FlatParams)]),
    "pp_flat_params_check_grads": (c_int, [P(FlatParams), c_char_p]),
    # checkpoint.h, safetensors.h
    "pp_checkpoint_save_stage": (c_int, [c_char_p, c_int64, V, V]),
    "pp_checkpoint_commit": (c_int, [c_char_p, c_int64, c_int]),
    "pp_checkpoint_latest": (c_int, [c_char_p, P(c_int64)]),
    "pp_checkpoint_load_stage": (c_int, [c_char_p, c_int64, V, V]),
    "pp_checkpoint_prune": (c_int, [c_char_p, c_int64]),
    "pp_checkpoint_list": (c_int, [c_char_p, P(P(CheckpointStep)), P(c_int)]),
    "pp_checkpoint_keep_from": (c_int, [c_char_p, c_int, P(c_int64)]),
    "pp_checkpoint_read_file": (c_int, [c_char_p, P(P(Safetensors))]),
    "pp_checkpoint_stage_path": (None, [c_char_p, c_int64, c_int, P(c_char), c_size_t]),
    "pp_safetensors_load": (c_int, [c_char_p, P(P(Safetensors))]),
    "pp_safetensors_save": (c_int, [c_char_p, c_int, P(c_char_p), P(TensorP), c_int, P(c_char_p), P(c_char_p)]),
    "pp_safetensors_free": (None, [P(Safetensors)]),
    # config.h, worker.h
    "pp_config_load": (c_int, [c_char_p, P(ConfigP)]),
    "pp_config_parse": (c_int, [c_char_p, c_size_t, c_char_p, c_char_p, P(ConfigP)]),
    "pp_config_free": (None, [ConfigP]),
    "pp_worker_options_init": (None, [P(WorkerOptions)]),
    "pp_worker_open": (c_int, [c_char_p, P(WorkerOptions), P(V)]),
    "pp_worker_open_config": (c_int, [ConfigP, P(WorkerOptions), P(V)]),
    "pp_worker_step": (c_int, [V, P(c_int)]),
    "pp_worker_run": (c_int, [V]),
    "pp_worker_rejoins": (c_int, [V]),
    "pp_worker_stop": (None, [V]),
    "pp_worker_stopped": (c_int, [V]),
    "pp_worker_checkpoint": (c_int, [V, c_char_p]),
    "pp_worker_rank": (c_int, [V]),
    "pp_worker_next_step": (c_int64, [V]),
    "pp_worker_steps": (c_int64, [V]),
    "pp_worker_n_stages": (c_int, [V]),
    "pp_worker_stage_index": (c_int, [V, c_int]),
    "pp_worker_endpoint": (c_char_p, [V]),
    "pp_worker_close": (None, [V]),
}


def _missing(name):
    def call(*args):
        raise PippinError(-5, "%s (version %s) has no %s: an older libpippin" % (path, lib.pp_version().decode(), name),
                          "unsupported")
    return call


for _name, (_res, _args) in _protos.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:  # a library older than these headers: fails when called
        setattr(lib, _name, _missing(_name))
        continue
    _f.restype = _res
    _f.argtypes = _args
