"""pippin from Python: a ctypes binding of libpippin's C API with numpy
arrays, the PyTorch export helper and the serving client (docs/python.md).

    import pippin
    g = pippin.load("model.onnx")                       # infer
    print(g.run({"x": x})["logits"])
    r = pippin.Runner(g.split(), optimizer="adamw", lr=1e-3)   # train the stages here
    out = r.train_step({"x": x, "y": y}, microbatches=4, schedule="1f1b")
    losses = pippin.run_ranks("pipeline.yaml", progress=print)  # every rank of a config
    c = pippin.Client("ipc:///tmp/front")              # a running service

Pieces:
  load, parse, Graph            models (pippin/onnx.h, exec.h)
  Pipe, load_pipe, Schedule     stages (pippin/pipe.h, schedule.h)
  Runner, Trainer, optim_config training in this process (runner.h, trainer.h)
  Config, Worker, Ranks, run_ranks   pipelines from config files (config.h, worker.h)
  checkpoint                    checkpoint directories, safetensors
  log                           pippin's log into Python's logging
  PippinError                   every failure: .status, .status_name, .message
  export, export_decoder, pipe_split, ...   pippin_torch (needs torch; imported on first use)
  Client, ServeError, read_key  pippin_client (needs python3-zmq; imported on first use)
"""
from . import checkpoint, log
from ._lib import PippinError
from ._lib import lib as _clib
from ._lib import path as library_path
from .model import (Edge, Graph, NodeInfo, Pipe, Runner, Schedule, StageInfo, Trainer, ValueInfo, load, load_pipe,
                    optim_config, parse, set_blas_threads)
from .worker import Config, Progress, Ranks, Worker, run_ranks

__version__ = _clib.pp_version().decode()

_TORCH = ("pipe_split", "register_onnx", "export", "export_decoder", "decoder_io_names", "trainable_names")
_CLIENT = ("Client", "ServeError", "read_key")

__all__ = ["PippinError", "library_path", "load", "parse", "Graph", "ValueInfo", "NodeInfo", "Pipe", "Edge",
           "load_pipe", "Schedule", "Runner", "StageInfo", "Trainer", "optim_config", "set_blas_threads",
           "Config", "Worker", "Progress", "Ranks", "run_ranks", "checkpoint", "log", *_TORCH, *_CLIENT]


def __getattr__(name):
    # pippin_torch and pippin_client sit next to this package (python/ in the
    # source tree, the same site directory once installed); torch and zmq
    # are imported only when used.
    if name in _TORCH:
        import pippin_torch
        return getattr(pippin_torch, name)
    if name in _CLIENT:
        import pippin_client
        return getattr(pippin_client, name)
    raise AttributeError("module 'pippin' has no attribute '%s'" % name)
