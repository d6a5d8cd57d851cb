#!/usr/bin/python3
"""Serving benchmark: pippin's standing pipeline against ONNX Runtime.

Starts the shipped GPT (examples/gpt, 4 stages) as a local service
(`pippin run`, mode: serve, 4 worker processes, one BLAS thread each) and
drives it with closed-loop clients (pippin-bench-serve: 1, 4, 16 clients,
each request 1 x 64 tokens). The peer, in the same run: ONNX Runtime's CPU
runtime (npm's onnxruntime-node, its install script skipped) on the same
model with the pipe-split markers made Identity, answering the same requests
one at a time as a plain server would, and batched (16 per run), on 1 and 2
threads (its best is compared). Prints a table and the ratios:

  throughput at 16 clients / ORT one at a time   (target >= 1)
  latency (p50) at 1 client / ORT one at a time  (target <= 1.5)
  throughput at 16 clients / ORT batched 16      (the gap, stated)

    /usr/bin/python3 bench/bench_serve.py [--build build] [--seconds 5]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ort_model(src, dst):
    import onnx
    m = onnx.load(src)
    for n in m.graph.node:
        if n.op_type == "PipeSplit":
            n.op_type, n.domain = "Identity", ""
            del n.attribute[:]
    keep = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
    del m.opset_import[:]
    m.opset_import.extend(keep)
    onnx.save(m, dst)


def ort_dir(cache):
    """A directory with node_modules/onnxruntime-node (installed once)."""
    if os.path.isdir(os.path.join(cache, "node_modules", "onnxruntime-node")):
        return cache
    os.makedirs(cache, exist_ok=True)
    env = dict(os.environ, ONNXRUNTIME_NODE_INSTALL="skip")
    subprocess.run(["npm", "install", "--silent", "--prefix", cache, "onnxruntime-node"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--npm-cache", default=os.path.expanduser("~/.cache/pippin-bench-ort"))
    a = ap.parse_args()
    pippin = os.path.join(a.build, "tools", "pippin")
    client = os.path.join(a.build, "bench", "pippin-bench-serve")
    tmp = tempfile.mkdtemp(prefix="pippin-bench-serve-")
    try:
        model = os.path.join(ROOT, "examples", "gpt", "model.onnx")
        ortm = os.path.join(tmp, "model_ort.onnx")
        ort_model(model, ortm)
        nodedir = ort_dir(a.npm_cache)
        env = dict(os.environ, NODE_PATH=os.path.join(nodedir, "node_modules"))
        out = subprocess.run(["node", os.path.join(ROOT, "bench", "ort_serve.js"), ortm, str(a.seconds), "64", "58",
                              "16", "1", "2"], check=True, capture_output=True, text=True, env=env).stdout
        ort = [json.loads(l) for l in out.splitlines() if l.startswith("{")]

        cfg = os.path.join(tmp, "serve.yaml")
        with open(cfg, "w") as f:
            f.write(f"""model: {model}
mode: serve
dims: {{batch: 4, seq: 64}}
ranks: [ipc://{tmp}/r0, ipc://{tmp}/r1, ipc://{tmp}/r2, ipc://{tmp}/r3]
timeout_ms: 10000
serve: {{endpoint: ipc://{tmp}/front, max_batch: 16, max_wait_us: 500}}
""")
        senv = dict(os.environ, OPENBLAS_NUM_THREADS="1", PIPPIN_LOG="error")
        svc = subprocess.Popen([pippin, "run", cfg], env=senv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ep = f"ipc://{tmp}/front"
        for _ in range(200):
            if subprocess.run([pippin, "request", ep, "--stats", "--timeout-ms", "300"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        rows = []
        for n in (1, 4, 16):
            r = subprocess.run([client, ep, "--clients", str(n), "--seconds", str(a.seconds)], capture_output=True,
                               text=True)
            rows.append(json.loads(r.stdout))
        svc.send_signal(signal.SIGTERM)
        svc.wait(timeout=60)

        print("GPT of examples/gpt (4 stages, d 64), requests of 1 x 64 tokens, 2 cores")
        print("pippin: 4 worker processes (one per stage), 1 BLAS thread each, max_batch 16, max_wait_us 500")
        print(f"{'':28}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
        for r in rows:
            print(f"pippin, {r['clients']:>2} clients{'':11}{r['rps']:>10.1f}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}")
        for o in ort:
            one, bat = o["one_at_a_time"], o["batched"]
            print(f"ORT {o['threads']} thr, one at a time{'':6}{one['rps']:>10.1f}{one['p50_ms']:>10.2f}{one['p99_ms']:>10.2f}")
            print(f"ORT {o['threads']} thr, batched 16{'':9}{bat['rps']:>10.1f}{bat['p50_ms']:>10.2f}{bat['p99_ms']:>10.2f}")
        best_one = max(ort, key=lambda o: o["one_at_a_time"]["rps"])["one_at_a_time"]
        best_lat = min(o["one_at_a_time"]["p50_ms"] for o in ort)
        best_bat = max(o["batched"]["rps"] for o in ort)
        r16, r1 = rows[-1], rows[0]
        t = r16["rps"] / best_one["rps"]
        l = r1["p50_ms"] / best_lat
        print(f"throughput at 16 clients / ORT one at a time: {t:.2f}x (target >= 1) {'ok' if t >= 1 else 'MISSED'}")
        print(f"latency p50 at 1 client / ORT one at a time:  {l:.2f}x (target <= 1.5) {'ok' if l <= 1.5 else 'MISSED'}")
        print(f"throughput at 16 clients / ORT batched 16:    {r16['rps'] / best_bat:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
