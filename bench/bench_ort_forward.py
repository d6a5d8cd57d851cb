#!/usr/bin/python3
"""Forward pass against ONNX Runtime, with the inference optimizer's passes
added one group at a time, at 1 and 2 threads, in one run.

Models: the example GPT (examples/gpt/model.onnx, its PipeSplit markers made
Identity so ONNX Runtime loads it; idx and targets -> loss and logits) and
GPTs of realistic sizes exported as idx -> logits with test/fixtures/
gen_fixtures.py's GPT (random weights, seed 0; bench/bench_gpt.py's sizes),
cached in --cache. ONNX Runtime is npm's onnxruntime-node (its install script
skipped), run by bench/ort_forward.js at graph optimization level "all";
pippin by build/bench/pippin-bench-opt-forward with the passes:

    none                      the graph as loaded
    fold,identity,dead        constants folded, markers and dead nodes gone
    + gelu                    the decomposed GELU as one Gelu node
    + matmul                  Linear layers as one pippin::MatMulAdd
    + attention               causal attention as one pippin::CausalAttention
    all (+ layernorm,         decomposed LayerNorms fused, Transpose pairs
         transpose)           and Reshape chains folded

Each point is the median of --iters timed runs; the whole sweep is repeated
--repeat times and the median of the medians printed, with the load average
before and after (the machine is shared). Wall time and the process's CPU
time per run are both printed: on a loaded machine the wall time mostly
measures the other processes, and at 1 thread the CPU time is the fairer
figure (at 2 threads it counts spinning threads too, OpenBLAS's and ORT's).
Ratios are ORT / pippin (> 1: pippin faster).

    /usr/bin/python3 bench/bench_ort_forward.py                    # example + medium
    /usr/bin/python3 bench/bench_ort_forward.py --size large --repeat 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_serve  # noqa: E402  (ort_model, ort_dir)

SIZES = {
    "medium": dict(vocab_size=65, block_size=128, n_embd=384, n_head=6, n_layer=6),
    "large": dict(vocab_size=65, block_size=256, n_embd=768, n_head=12, n_layer=4),
}
PASSES = [("none", "none"), ("fold,identity,dead", "fold"), ("fold,identity,dead,gelu", "+gelu"),
          ("fold,identity,dead,gelu,matmul", "+matmul"), ("fold,identity,dead,gelu,matmul,attention", "+attention"),
          ("all", "all")]


def export(cache, name):
    cfg = SIZES[name]
    path = os.path.join(cache, "gpt_logits_{n_embd}_l{n_layer}_t{block_size}.onnx".format(**cfg))
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "test", "fixtures"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import gen_fixtures as gf
    torch.manual_seed(0)
    model = gf.GPT(**cfg).eval()
    tmp = path + ".tmp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gf.export_gpt_logits(model, tmp)
    os.replace(tmp, path)
    return path


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def run_json(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-600:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/pippin-bench-ort-forward"))
    ap.add_argument("--ort-cache", default=os.path.expanduser("~/.cache/pippin-bench-ort"))
    ap.add_argument("--size", action="append", help="example, medium, large (default: example, medium)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--passes", help="only these columns, e.g. none,all (default: every step of the table above)")
    a = ap.parse_args()
    passes_run = [p for p in PASSES if not a.passes or p[1] in a.passes.split(",")]
    if not passes_run:
        ap.error("--passes: none of " + ", ".join(k for _, k in PASSES))
    sizes = a.size or ["example", "medium"]
    threads = [int(t) for t in a.threads.split(",")]
    ort = bench_serve.ort_dir(a.ort_cache)
    exe = os.path.join(a.build, "bench", "pippin-bench-opt-forward")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PIPPIN_LOG="error", ORT_DIR=ort)
    load0 = loadavg()
    print(f"load average {load0:.1f} on {os.cpu_count()} CPUs; batch {a.batch}; median of {a.iters} runs, "
          f"median over {a.repeat} sweeps")
    for size in sizes:
        if size == "example":
            os.makedirs(a.cache, exist_ok=True)
            model = os.path.join(a.cache, "example_gpt_identity.onnx")
            bench_serve.ort_model(os.path.join(ROOT, "examples", "gpt", "model.onnx"), model)
            seq = 64
            import onnx
            m = onnx.load(model)
            inits = {t.name: t for t in m.graph.initializer}
            vocab, d = inits["tok_emb.weight"].dims
            label = f"example GPT: d {d}, vocab {vocab}, T {seq}"
        else:
            cfg = SIZES[size]
            model = export(a.cache, size)
            seq, vocab = cfg["block_size"], cfg["vocab_size"]
            label = f"{size} GPT: d {cfg['n_embd']}, {cfg['n_layer']} layers, T {seq}"
        res = {}  # (threads, key) -> [ms]
        for _ in range(a.repeat):
            for t in threads:
                for passes, key in passes_run:
                    out = run_json([exe, model, "--batch", str(a.batch), "--seq", str(seq), "--vocab", str(vocab),
                                    "--threads", str(t), "--passes", passes, "--iters", str(a.iters)], env)[0]
                    res.setdefault((t, key), []).append(out["median_ms"])
                    res.setdefault((t, "cpu " + key), []).append(out["cpu_ms"])
                    res[(t, "nodes " + key)] = [out["nodes"]]
            for out in run_json(["node", os.path.join(ROOT, "bench", "ort_forward.js"), model, str(a.batch), str(seq),
                                 str(vocab), str(a.iters)] + [str(t) for t in threads], env):
                res.setdefault((out["threads"], "ort"), []).append(out["median_ms"])
                res.setdefault((out["threads"], "cpu ort"), []).append(out["cpu_ms"])
        print(f"\n{label}, batch {a.batch}: forward ms (median; wall, and CPU time of the process)")
        print("  %-12s %10s" % ("threads", "ORT") + "".join("%12s" % k for _, k in passes_run)
              + "   ORT/pippin: first -> last column")
        for t in threads:
            for kind in ("", "cpu "):
                ort_ms = statistics.median(res[(t, kind + "ort")])
                row = [statistics.median(res[(t, kind + k)]) for _, k in passes_run]
                print("  %-12s %10.2f" % (f"{t} {kind or 'wall'}", ort_ms) + "".join("%12.2f" % v for v in row)
                      + "   %.2fx -> %.2fx" % (ort_ms / row[0], ort_ms / row[-1]))
        print("  nodes: " + ", ".join(f"{k} {res[(threads[0], 'nodes ' + k)][0]}" for _, k in passes_run))
        for t in threads:
            for kind in ("", "cpu "):
                row = [statistics.median(res[(t, kind + k)]) for _, k in passes_run]
                gains = ", ".join(f"{passes_run[i][1]} {row[i - 1] / row[i]:.2f}x" for i in range(1, len(passes_run)))
                print(f"  {t} thread{'s' if t > 1 else ''} {kind or 'wall'}: each step's speed-up: {gains}; "
                      f"all {row[0] / row[-1]:.2f}x")
    print(f"\nload average {load0:.1f} before, {loadavg():.1f} after")


if __name__ == "__main__":
    main()
