#!/usr/bin/python3
"""GPT training step and forward at realistic sizes, pippin against PyTorch
1.13 in the same run, at 1 and 2 threads, with and without pippin's kernel
pool.

Exports test/fixtures/gen_fixtures.py's GPT (random weights, seed 0, no
pipeline markers) once into --cache, then runs build/bench/pippin-bench-train
(which runs bench/torch_forward.py on the same model and batch) for each
thread count twice: with the pool at the thread count (pippin's kernels and
its GEMMs, cut into panels, on N threads) and with the pool at 1 (only
OpenBLAS's own threads, N, inside whole GEMMs: pippin before the pool). Prints, per size and thread count, the times, the
torch/pippin ratios (> 1: pippin faster) and the 1 -> 2 thread speed-ups.

    /usr/bin/python3 bench/bench_gpt.py                  # medium: d 384, 6 layers, T 128, batch 8
    /usr/bin/python3 bench/bench_gpt.py --size small --size large --iters 10

The train step is forward + backward (every parameter's gradient), no
optimizer update, as torch_forward.py's train_step.
"""

import argparse
import json
import os
import subprocess
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {
    "small": dict(vocab_size=65, block_size=64, n_embd=128, n_head=4, n_layer=4),
    "medium": dict(vocab_size=65, block_size=128, n_embd=384, n_head=6, n_layer=6),
    "large": dict(vocab_size=65, block_size=256, n_embd=768, n_head=12, n_layer=4),
}


def export(cache, name):
    cfg = SIZES[name]
    d = os.path.join(cache, "gpt_{n_embd}_l{n_layer}_t{block_size}".format(**cfg))
    if os.path.exists(os.path.join(d, "model.onnx")):
        return d
    os.makedirs(d, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "test", "fixtures"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import gen_fixtures as gf
    import pippin_torch as pp
    torch.manual_seed(0)
    model = gf.GPT(split=False, **cfg)
    T = cfg["block_size"]
    idx = torch.randint(0, cfg["vocab_size"], (2, T))
    tmp = os.path.join(d, "model.onnx.tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pp.export(model, (idx, idx), tmp, input_names=["idx", "targets"], output_names=["loss", "logits"],
                  dynamic_axes=dict(idx={0: "batch"}, targets={0: "batch"}, logits={0: "batch"}))
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(dict(config=cfg), f)
    os.replace(tmp, os.path.join(d, "model.onnx"))
    return d


def run(exe, model, threads, pool, batch, iters, torch):
    cmd = [exe, "--model", model, "--threads", str(threads), "--pool-threads", str(pool), "--batch", str(batch),
           "--iters", str(iters), "--json"] + ([] if torch else ["--no-torch"])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", action="append", choices=sorted(SIZES), help="default: medium")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--cache", default="/tmp/pippin-bench-gpt")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "pippin-bench-train")
    counts = [int(t) for t in a.threads.split(",")]
    for name in a.size or ["medium"]:
        cfg = SIZES[name]
        model = export(a.cache, name)
        print("%s GPT: d %d, %d layers, %d heads, T %d, vocab %d; batch %d; median of %d" %
              (name, cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["block_size"], cfg["vocab_size"], a.batch,
               a.iters))
        res = {}
        for n in counts:
            res[(n, "pool")] = r = run(exe, model, n, n, a.batch, a.iters, True)
            res[(n, "nopool")] = q = run(exe, model, n, 1, a.batch, a.iters, False)
            print("  %d thread%s: pippin train %7.1f ms, forward %6.1f ms (kernels on 1 thread: %7.1f / %6.1f) | "
                  "torch train %7.1f ms, forward %6.1f ms | torch/pippin train %.2fx, forward %.2fx" %
                  (n, "" if n == 1 else "s", r["train_ms"], r["forward_ms"], q["train_ms"], q["forward_ms"],
                   r["torch_train_ms"], r["torch_forward_ms"], r["torch_train_ms"] / r["train_ms"],
                   r["torch_forward_ms"] / r["forward_ms"]))
        for n in counts[1:]:
            b = counts[0]
            def up(kind, key):
                return res[(b, kind)][key] / res[(n, kind)][key]
            tb, tn = res[(b, "pool")], res[(n, "pool")]
            print("  %d -> %d threads: pippin train %.2fx, forward %.2fx (BLAS alone on %d: %.2fx, %.2fx); "
                  "torch train %.2fx, forward %.2fx" %
                  (b, n, up("pool", "train_ms"), up("pool", "forward_ms"), n, up("nopool", "train_ms"),
                   up("nopool", "forward_ms"), tb["torch_train_ms"] / tn["torch_train_ms"],
                   tb["torch_forward_ms"] / tn["torch_forward_ms"]))
        best_t = min(res[(n, "pool")]["torch_train_ms"] for n in counts)
        best_f = min(res[(n, "pool")]["torch_forward_ms"] for n in counts)
        best_pt = min(res[(n, "pool")]["train_ms"] for n in counts)
        best_pf = min(res[(n, "pool")]["forward_ms"] for n in counts)
        print("  best of each: pippin/torch time train %.2fx, forward %.2fx (target <= 0.8x)" %
              (best_pt / best_t, best_pf / best_f))


if __name__ == "__main__":
    main()
