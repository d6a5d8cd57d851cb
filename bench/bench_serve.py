#!/usr/bin/python3
"""Serving benchmark: pippin's standing pipeline against ONNX Runtime.

Two GPTs (idx -> logits): the shipped example (examples/gpt/model.onnx, d
64, 4 layers, 4 stages; its inputs idx and targets) and a larger one
exported here with test/fixtures/gen_fixtures.py's GPT in mode "logits" (d
256, 8 heads, 4 layers, block 256, vocab 58, random weights from seed 0, a
PipeSplit after each block but the last; input idx; cached under --cache).
Each is served by `pippin run` (mode: serve, one worker process per rank,
--threads compute threads each, default 1, max_batch 16, max_wait_us 500) as 4 ranks (its
PipeSplit markers) and as 2 ranks (the markers made Identity, `split:
{before: ["/blocks.2/"]}`), and driven by closed-loop clients
(pippin-bench-serve: 1, 4, 16, 64 clients, each request 1 x 64 random
tokens, after a 1-second warm-up): requests/s, p50/p99 latency, and from
the service's stats the mean rows per batch and the kernels' time per
request per rank (compute_ms) and summed over the ranks. The peer, in the same run: ONNX Runtime's CPU runtime (npm's
onnxruntime-node, its install script skipped; bench/ort_serve.js) on the
same model with the markers made Identity, answering the same requests one
at a time as a plain server would, and batched (16 per run), on 1 and 2
threads (its best is compared). Prints per model a table and, per layout,
the ratios:

  throughput at 16 clients / ORT one at a time   (target >= 1)
  latency (p50) at 1 client / ORT one at a time  (target <= 1.5)
  throughput at 16 clients / ORT batched 16      (the gap, stated)

About 2 minutes with the default 4 seconds per point (plus the export, once).

    /usr/bin/python3 bench/bench_serve.py [--build build] [--seconds 4]
        [--clients 1,4,16,64] [--models example,large] [--threads N]
        [--share-cores on|off|both]
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

LARGE = dict(vocab_size=58, block_size=256, n_embd=256, n_head=8, n_layer=4)
SEQ = 64
THREADS = 1  # each worker's compute threads (--threads)


def ort_model(src, dst):
    """The model with its PipeSplit markers made Identity (for ORT, and for
    a pippin split by config)."""
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


def export_large(cache, kind="logits"):
    """The larger GPT (random weights, seed 0), exported once: kind "logits"
    (idx -> logits) or "decoder" (with a KV cache, bench_generate.py)."""
    prefix = "gpt_logits" if kind == "logits" else "gpt"
    name = prefix + "_v{vocab_size}_b{block_size}_d{n_embd}_h{n_head}_l{n_layer}.onnx".format(**LARGE)
    path = os.path.join(cache, name)
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "test", "fixtures"))
    import torch
    import warnings
    import gen_fixtures as gf
    torch.manual_seed(0)
    model = gf.GPT(**LARGE).eval()
    tmp = path + ".tmp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (gf.export_gpt_logits if kind == "logits" else gf.export_gpt_decoder)(model, tmp)
    os.replace(tmp, path)
    return path


def describe(path):
    """inputs, d, layers, vocab, block, parameters, stages of a GPT export."""
    import numpy as np
    import onnx
    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    vocab, d = inits["tok_emb.weight"].dims
    names = {i.name for i in m.graph.input} - set(inits)
    trainable = json.loads({p.key: p.value for p in m.metadata_props}["pippin.trainable"])
    params = sum(int(np.prod(inits[n].dims)) for n in trainable if n in inits)
    layers = len({n.split(".")[1] for n in inits if n.startswith("blocks.")})
    return dict(inputs=[i.name for i in m.graph.input if i.name in names], vocab=vocab, d=d, layers=layers,
                block=inits["pos_emb.weight"].dims[0], params=params,
                stages=1 + sum(n.op_type == "PipeSplit" for n in m.graph.node))


def stats(pippin, ep):
    r = subprocess.run([pippin, "request", ep, "--stats", "--timeout-ms", "2000"], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None


class Service:
    def __init__(self, pippin, tmp, name, model, ranks, split=None, share=True):
        self.pippin, self.ep = pippin, f"ipc://{tmp}/{name}-front"
        cfg = os.path.join(tmp, name + ".yaml")
        eps = ", ".join(f"ipc://{tmp}/{name}-{r}" for r in range(ranks))
        with open(cfg, "w") as f:
            f.write(f"model: {model}\nmode: serve\ndims: {{batch: 4, seq: {SEQ}}}\nranks: [{eps}]\n"
                    f"timeout_ms: 10000\nserve: {{endpoint: {self.ep}, max_batch: 16, max_wait_us: 500}}\n")
            if split:
                f.write(f"split: {{before: {json.dumps(split)}}}\n")
            if not share:
                f.write("share_cores: false\n")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PIPPIN_LOG="error",
                   PIPPIN_THREADS=str(THREADS))
        self.err = os.path.join(tmp, name + ".err")
        self.p = subprocess.Popen([pippin, "run", cfg], env=env, stdout=subprocess.DEVNULL,
                                  stderr=open(self.err, "w"))
        for _ in range(300):
            if self.p.poll() is not None:
                break
            if subprocess.run([pippin, "request", self.ep, "--stats", "--timeout-ms", "300"],
                              capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"pippin run ({name}) did not come up: {open(self.err).read()[-600:]}")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def settled_stats(pippin, ep):
    """The stats once every rank has reported the batches the front has run
    (ranks report every 500 ms while busy, and when idle)."""
    s = None
    for _ in range(30):
        s = stats(pippin, ep)
        if s and all(r["batches"] >= s["batches"] for r in s["ranks"]):
            return s
        time.sleep(0.1)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--models", default="example,large")
    ap.add_argument("--threads", type=int, default=1,
                    help="each worker's compute threads (kernels and GEMMs on pippin's pool)")
    ap.add_argument("--share-cores", choices=["on", "off", "both"], default="on",
                    help="ranks lend their threads to a busy rank while they wait (share_cores:); both: "
                         "each layout with and without")
    ap.add_argument("--npm-cache", default=os.path.expanduser("~/.cache/pippin-bench-ort"))
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/pippin-bench-serve"))
    a = ap.parse_args()
    global THREADS
    THREADS = a.threads
    pippin = os.path.join(a.build, "tools", "pippin")
    client = os.path.join(a.build, "bench", "pippin-bench-serve")
    clients = [int(c) for c in a.clients.split(",")]
    nodedir = ort_dir(a.npm_cache)
    nenv = dict(os.environ, NODE_PATH=os.path.join(nodedir, "node_modules"))
    tmp = tempfile.mkdtemp(prefix="pippin-bench-serve-")
    results = []
    try:
        models = {"example": os.path.join(ROOT, "examples", "gpt", "model.onnx")}
        if "large" in a.models:
            models["large"] = export_large(a.cache)
        for key in a.models.split(","):
            model = models[key]
            info = describe(model)
            plain = os.path.join(tmp, key + "_plain.onnx")
            ort_model(model, plain)
            out = subprocess.run(["node", os.path.join(ROOT, "bench", "ort_serve.js"), plain, str(a.seconds),
                                  str(SEQ), str(info["vocab"]), "16", "1", "2"],
                                 capture_output=True, text=True, env=nenv)
            if out.returncode:
                raise RuntimeError("ort_serve.js: " + out.stderr)
            ort = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]

            layouts = []
            for share in {"on": [True], "off": [False], "both": [True, False]}[a.share_cores]:
                tag = "" if a.share_cores != "both" else (", shared" if share else ", own")
                layouts += [("4 ranks" + tag, dict(model=model, ranks=info["stages"], share=share)),
                            ("2 ranks" + tag, dict(model=plain, ranks=2, split=[f"/blocks.{info['layers'] // 2}/"],
                                                   share=share))]
            rows = []
            for lname, kw in layouts:
                svc = Service(pippin, tmp, f"{key}-{len(rows)}", **kw)
                try:
                    def drive(n, seconds):
                        r = subprocess.run([client, svc.ep, "--clients", str(n), "--seconds", str(seconds),
                                            "--seq", str(SEQ), "--vocab", str(info["vocab"]),
                                            "--inputs", ",".join(info["inputs"])], capture_output=True, text=True)
                        if r.returncode:
                            raise RuntimeError("pippin-bench-serve: " + r.stderr)
                        return json.loads(r.stdout)
                    drive(16, 1)  # warm-up (as ORT's 3 runs): batches of every size the runs will see
                    before = settled_stats(pippin, svc.ep)
                    for n in clients:
                        row = drive(n, a.seconds)
                        after = settled_stats(pippin, svc.ep)
                        if before and after:
                            nb = after["batches"] - before["batches"]
                            nreq = after["ok"] - before["ok"]
                            row["rows_per_batch"] = nreq / nb if nb else 0.0
                            ms = [ra["compute_ms"] - rb["compute_ms"] for ra, rb in zip(after["ranks"], before["ranks"])]
                            row["compute_ms_per_req"] = sum(ms) / nreq if nreq else 0.0
                            row["compute_ms_ranks"] = [m / nreq if nreq else 0.0 for m in ms]
                        before = after
                        rows.append((lname, row))
                finally:
                    svc.stop()
            results.append((key, info, rows, ort))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"serving: closed-loop clients, requests of 1 x {SEQ} random tokens -> logits, 2 cores; pippin: one "
          f"worker process per rank, {THREADS} compute thread(s) each (share_cores: {a.share_cores}: a waiting "
          f"rank lends them to a busy one), max_batch 16, max_wait_us 500")
    for key, info, rows, ort in results:
        print(f"\n{key}: d {info['d']}, {info['layers']} layers, block {info['block']}, vocab {info['vocab']}, "
              f"{info['params'] / 1e6:.2f}M parameters, inputs {', '.join(info['inputs'])}")
        print(f"{'':38}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'rows/b':>8}  compute ms/req (per rank)")
        for lname, r in rows:
            extra = ""
            if "compute_ms_per_req" in r:
                extra = (f"{r['rows_per_batch']:>8.1f}  {r['compute_ms_per_req']:.2f} ("
                         + " ".join(f"{m:.2f}" for m in r["compute_ms_ranks"]) + ")")
            print(f"{'pippin ' + lname + ', ' + str(r['clients']) + ' clients':38}{r['rps']:>9.1f}"
                  f"{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{extra}")
        for o in ort:
            one, bat = o["one_at_a_time"], o["batched"]
            print(f"{'ORT ' + str(o['threads']) + ' thr, one at a time':38}{one['rps']:>9.1f}{one['p50_ms']:>9.2f}"
                  f"{one['p99_ms']:>9.2f}")
            print(f"{'ORT ' + str(o['threads']) + ' thr, batched ' + str(bat['batch']):38}{bat['rps']:>9.1f}"
                  f"{bat['p50_ms']:>9.2f}{bat['p99_ms']:>9.2f}")
        best_one = max(o["one_at_a_time"]["rps"] for o in ort)
        best_lat = min(o["one_at_a_time"]["p50_ms"] for o in ort)
        best_bat = max(o["batched"]["rps"] for o in ort)
        for lname in dict(rows):
            mine = {r["clients"]: r for l, r in rows if l == lname}
            top = mine.get(16, mine[max(mine)])
            one = mine[min(mine)]
            t = top["rps"] / best_one
            lat = one["p50_ms"] / best_lat
            print(f"{key}, pippin {lname}: throughput at {top['clients']} clients / ORT one at a time: {t:.2f}x "
                  f"(target >= 1) {'ok' if t >= 1 else 'MISSED'}; p50 at {one['clients']} client / ORT's: "
                  f"{lat:.2f}x (target <= 1.5) {'ok' if lat <= 1.5 else 'MISSED'}; throughput at {top['clients']} "
                  f"clients / ORT batched 16: {top['rps'] / best_bat:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
