#!/usr/bin/python3
"""CNN training step: pippin against PyTorch 1.13, same model, same threads.

torchvision's resnet18 and mobilenet_v2 (and the narrow resnet of the
tv_resnet fixture), wrapped as (x, y) -> cross-entropy, exported in training
mode by python/pippin_torch.py (BatchNorm on batch statistics), and one
training step (forward and backward, the gradients of every parameter; no
optimizer update) timed in both, in this one process: torch on
torch.set_num_threads(N) (its convolutions go through oneDNN/mkldnn), pippin
through libpippin.so (ctypes: pp_onnx_load, pp_autodiff_model, pp_graph_run)
with pp_set_threads(N) (kernel pool and BLAS). Each number is the median of --iters steps
after --warmup. Prints a table and the ratio pippin / torch (below 1: pippin
is faster).

    /usr/bin/python3 bench/bench_cnn.py                      # build/ or $PIPPIN_LIB
    /usr/bin/python3 bench/bench_cnn.py --models resnet18 --threads 1 2 --batch 8 --size 64
"""

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "test" / "fixtures"))
import pippin_torch  # noqa: E402


class Wrapped(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, y):
        return F.cross_entropy(self.m(x), y)


def make(name):
    torch.manual_seed(0)
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10)
    if name == "mobilenet_v2":
        return torchvision.models.mobilenet_v2(num_classes=10)
    if name == "small_resnet":
        import gen_torchvision
        return gen_torchvision.SmallResNet()
    raise SystemExit("unknown model " + name)


class Graph(ctypes.Structure):
    """The head of pp_graph (include/pippin/graph.h), up to the outputs."""
    _fields_ = [("name", ctypes.c_char_p),
                ("n_values", ctypes.c_int), ("cap_values", ctypes.c_int),
                ("values", ctypes.c_void_p),
                ("n_nodes", ctypes.c_int), ("cap_nodes", ctypes.c_int),
                ("nodes", ctypes.c_void_p),
                ("n_inputs", ctypes.c_int), ("cap_inputs", ctypes.c_int),
                ("inputs", ctypes.c_void_p),
                ("n_outputs", ctypes.c_int), ("cap_outputs", ctypes.c_int),
                ("outputs", ctypes.c_void_p)]


def load_lib(path):
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    lib.pp_onnx_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(Graph))]
    lib.pp_autodiff_model.argtypes = [ctypes.POINTER(Graph), ctypes.c_char_p, ctypes.c_int,
                                      ctypes.POINTER(P)]
    lib.pp_graph_run.argtypes = [ctypes.POINTER(Graph), ctypes.POINTER(P), ctypes.POINTER(P)]
    lib.pp_npy_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
    lib.pp_tensor_scalar_f32.argtypes = [ctypes.c_float, ctypes.POINTER(P)]
    lib.pp_tensor_free.argtypes = [P]
    lib.pp_backward_free.argtypes = [P]
    lib.pp_graph_free.argtypes = [ctypes.POINTER(Graph)]
    lib.pp_set_threads.argtypes = [ctypes.c_int]
    lib.pp_last_error.restype = ctypes.c_char_p
    return lib


def check(lib, status, what):
    if status != 0:
        sys.exit("%s failed: %s" % (what, lib.pp_last_error().decode()))


def slot(arr, k):
    return ctypes.byref(ctypes.c_void_p.from_buffer(arr, k * ctypes.sizeof(ctypes.c_void_p)))


def time_pippin(lib, model_path, npys, warmup, iters):
    g = ctypes.POINTER(Graph)()
    check(lib, lib.pp_onnx_load(str(model_path).encode(), ctypes.byref(g)), "pp_onnx_load")
    back = ctypes.c_void_p()
    check(lib, lib.pp_autodiff_model(g, None, 0, ctypes.byref(back)), "pp_autodiff_model")
    n_in, n_out = g.contents.n_inputs, g.contents.n_outputs
    ins = (ctypes.c_void_p * n_in)()
    for k, p in enumerate(npys):
        check(lib, lib.pp_npy_load(str(p).encode(), slot(ins, k)), "pp_npy_load")
    for k in range(len(npys), n_in):  # the loss seed
        check(lib, lib.pp_tensor_scalar_f32(1.0, slot(ins, k)), "seed")
    outs = (ctypes.c_void_p * n_out)()
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        check(lib, lib.pp_graph_run(g, ins, outs), "pp_graph_run")
        dt = time.perf_counter() - t0
        for k in range(n_out):
            lib.pp_tensor_free(outs[k])
            outs[k] = None
        if i >= warmup:
            times.append(dt * 1e3)
    for k in range(n_in):
        lib.pp_tensor_free(ins[k])
    lib.pp_backward_free(back)
    lib.pp_graph_free(g)
    return statistics.median(times)


def time_torch(model, x, y, warmup, iters):
    times = []
    for i in range(warmup + iters):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        model(x, y).backward()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.environ.get("PIPPIN_LIB", str(ROOT / "build" / "libpippin.so")))
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "small_resnet"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=64, help="image side")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")  # the exporter's notes on num_batches_tracked, once per BatchNorm
    lib = load_lib(a.lib)
    print("CNN training step (forward + backward, all parameter gradients), batch %d, %dx%d images, "
          "median of %d, wall ms" % (a.batch, a.size, a.size, a.iters))
    print("%-14s %10s %8s %10s %10s %8s" % ("model", "params", "threads", "pippin", "torch", "ratio"))
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            model = Wrapped(make(name))
            model.train()
            g = torch.Generator().manual_seed(1)
            x = torch.randn(a.batch, 3, a.size, a.size, generator=g)
            y = torch.randint(0, 10, (a.batch,), generator=g)
            path = Path(tmp) / (name + ".onnx")
            pippin_torch.export(model, (x, y), str(path), input_names=["x", "y"], output_names=["loss"])
            npys = [Path(tmp) / "x.npy", Path(tmp) / "y.npy"]
            np.save(npys[0], x.numpy())
            np.save(npys[1], y.numpy())
            n_params = sum(p.numel() for p in model.parameters())
            for n in a.threads:
                torch.set_num_threads(n)
                lib.pp_set_threads(n)  # pippin's kernel pool and the BLAS
                tt = time_torch(model, x, y, a.warmup, a.iters)
                tp = time_pippin(lib, path, npys, a.warmup, a.iters)
                print("%-14s %9.2fM %8d %10.1f %10.1f %7.2fx" % (name, n_params / 1e6, n, tp, tt, tp / tt),
                      flush=True)


if __name__ == "__main__":
    main()
