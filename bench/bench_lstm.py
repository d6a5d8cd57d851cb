#!/usr/bin/python3
"""LSTM training step: pippin against PyTorch 1.13, same model, same threads.

Builds x[B,T,I] -> nn.LSTM(I, H, batch_first) (nn.GRU with --cell gru)
-> loss = mean(y * y), exports
it with python/pippin_torch.py, and times one training step (forward and
backward, the gradients of every parameter; no optimizer update) in both,
in this one process: torch on torch.set_num_threads(N), pippin through
libpippin.so (ctypes: pp_onnx_load, pp_autodiff_model, pp_graph_run) with
pp_set_threads(N) (kernel pool and BLAS). Each number is the median of --iters steps after
--warmup. Prints a table and the ratio pippin / torch (below 1: pippin is
faster); with --cpu-time the times are this thread's CPU time
(time.thread_time) rather than wall time, steadier on a busy machine (with
1 thread all the work runs on the calling thread in both).

    /usr/bin/python3 bench/bench_lstm.py                     # build/ or $PIPPIN_LIB
    /usr/bin/python3 bench/bench_lstm.py --lib build-rnn/libpippin.so --threads 1 2
"""

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import pippin_torch  # noqa: E402


class Model(nn.Module):
    def __init__(self, i, h, layers, cell="lstm"):
        super().__init__()
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        self.lstm = rnn(i, h, num_layers=layers, batch_first=True)

    def forward(self, x):
        y, _ = self.lstm(x)
        return (y * y).mean()


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
    lib.pp_set_threads.argtypes = [ctypes.c_int]
    lib.pp_last_error.restype = ctypes.c_char_p
    return lib


def check(lib, status, what):
    if status != 0:
        sys.exit("%s failed: %s" % (what, lib.pp_last_error().decode()))


def time_pippin(lib, model_path, x_path, warmup, iters, clock=time.perf_counter):
    g = ctypes.POINTER(Graph)()
    check(lib, lib.pp_onnx_load(str(model_path).encode(), ctypes.byref(g)), "pp_onnx_load")
    back = ctypes.c_void_p()
    check(lib, lib.pp_autodiff_model(g, None, 0, ctypes.byref(back)), "pp_autodiff_model")
    n_in, n_out = g.contents.n_inputs, g.contents.n_outputs
    ins = (ctypes.c_void_p * n_in)()
    check(lib, lib.pp_npy_load(str(x_path).encode(), ctypes.byref(ctypes.c_void_p.from_buffer(ins, 0))),
          "pp_npy_load")
    for k in range(1, n_in):  # the loss seed
        check(lib, lib.pp_tensor_scalar_f32(1.0, ctypes.byref(ctypes.c_void_p.from_buffer(
            ins, k * ctypes.sizeof(ctypes.c_void_p)))), "seed")
    outs = (ctypes.c_void_p * n_out)()
    times = []
    for i in range(warmup + iters):
        t0 = clock()
        check(lib, lib.pp_graph_run(g, ins, outs), "pp_graph_run")
        dt = clock() - t0
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


def time_torch(model, x, warmup, iters, clock=time.perf_counter):
    times = []
    for i in range(warmup + iters):
        model.zero_grad(set_to_none=True)
        t0 = clock()
        model(x).backward()
        dt = clock() - t0
        if i >= warmup:
            times.append(dt * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.environ.get("PIPPIN_LIB", str(ROOT / "build" / "libpippin.so")))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sizes", nargs="+", default=["32,64,128,256,1", "16,32,64,128,1", "8,32,64,64,2"],
                    help="B,T,I,H,layers")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the calling thread's CPU time, not wall time")
    a = ap.parse_args()
    lib = load_lib(a.lib)
    clock = time.thread_time if a.cpu_time else time.perf_counter
    print("%s training step (forward + backward, all parameter gradients), median of %d, %s ms"
          % (a.cell.upper(), a.iters, "thread CPU" if a.cpu_time else "wall"))
    print("%-26s %8s %10s %10s %8s" % ("B,T,I,H,layers", "threads", "pippin", "torch", "ratio"))
    with tempfile.TemporaryDirectory() as tmp:
        for spec in a.sizes:
            B, T, I, H, L = (int(v) for v in spec.split(","))
            torch.manual_seed(0)
            model = Model(I, H, L, a.cell)
            x = torch.randn(B, T, I)
            path = Path(tmp) / ("%s_%s.onnx" % (a.cell, spec.replace(",", "_")))
            pippin_torch.export(model, (x,), str(path), input_names=["x"], output_names=["loss"])
            xp = Path(tmp) / "x.npy"
            np.save(xp, x.numpy())
            for n in a.threads:
                torch.set_num_threads(n)
                lib.pp_set_threads(n)  # pippin's kernel pool and the BLAS
                tt = time_torch(model, x, a.warmup, a.iters, clock)
                tp = time_pippin(lib, path, xp, a.warmup, a.iters, clock)
                print("%-26s %8d %10.2f %10.2f %7.2fx" % (spec, n, tp, tt, tp / tt))


if __name__ == "__main__":
    main()
