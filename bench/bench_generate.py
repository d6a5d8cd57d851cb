#!/usr/bin/python3
"""Generation benchmark: pippin's serving decoder (KV cache kept on the
stages, the generation loop in the service) against ONNX Runtime.

Two decoders with a KV cache: the shipped example (examples/gpt/decoder.onnx,
d 64, 4 layers, 4 stages, block 64) and a larger one exported here with
test/fixtures/gen_fixtures.py's GPT in mode "cache" (d 256, 8 heads, 4
layers, block 256, vocab 58, random weights from a fixed seed; cached under
--cache). Each is served by `pippin run` (mode: serve, one worker process per
stage, one BLAS thread each) as 4 ranks (its PipeSplit markers) and as 2
ranks (the markers made Identity, `split: {before: ["/blocks.2/"]}`), and
driven by closed-loop generation clients (pippin-bench-generate: 1, 4, 16
clients; each generation a random 16-token prompt, 32 greedy tokens, no
session): tokens/s, time to the first token, and the per-token latency (the
time between two streamed tokens). The peer, in the same run: ONNX Runtime's
CPU runtime (npm's onnxruntime-node, its install script skipped;
bench/ort_generate.js) on the same model with the markers made Identity,
the same greedy loop with its own KV cache (the prompt with an empty past
[1, H, 0, Dh], then one token at a time, the presents fed back), one
generation at a time as a plain server would, on 1 and 2 threads (its best
is compared). Checks that pippin's and ORT's greedy tokens agree for one
prompt, prints a table and the ratios:

  tokens/s at 16 clients / ORT one at a time
  per-token latency (p50) at 1 client / ORT's

    /usr/bin/python3 bench/bench_generate.py [--build build] [--seconds 4]
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

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_serve import export_large, ort_dir  # noqa: E402

def describe(path):
    """heads, head dim, layers, vocab, block, d, parameters of a decoder."""
    import onnx
    m = onnx.load(path)
    pasts = [i for i in m.graph.input if i.name.startswith("past_key_values.")]
    dims = [d.dim_value for d in pasts[0].type.tensor_type.shape.dim]
    inits = {t.name: t for t in m.graph.initializer}
    vocab, d = inits["tok_emb.weight"].dims
    trainable = json.loads({p.key: p.value for p in m.metadata_props}["pippin.trainable"])
    params = sum(int(np.prod(inits[n].dims)) for n in trainable if n in inits)
    return dict(heads=dims[1], head_dim=dims[3], layers=len(pasts) // 2, vocab=vocab, d=d,
                block=inits["pos_emb.weight"].dims[0], params=params,
                stages=1 + sum(n.op_type == "PipeSplit" for n in m.graph.node))


def unmarked(src, dst):
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


class Service:
    def __init__(self, pippin, tmp, name, model, ranks, context, split=None):
        self.pippin, self.ep = pippin, f"ipc://{tmp}/{name}-front"
        cfg = os.path.join(tmp, name + ".yaml")
        eps = ", ".join(f"ipc://{tmp}/{name}-{r}" for r in range(ranks))
        with open(cfg, "w") as f:
            f.write(f"model: {model}\nmode: serve\nranks: [{eps}]\ntimeout_ms: 30000\n"
                    f"serve: {{endpoint: {self.ep}, context: {context}}}\n")
            if split:
                f.write(f"split: {{before: {json.dumps(split)}}}\n")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PIPPIN_LOG="error")
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

    def generate(self, prompt_npy, n):
        r = subprocess.run([self.pippin, "generate", self.ep, "--tokens", prompt_npy, "--max-tokens", str(n),
                            "--tokens-out"], capture_output=True, text=True, timeout=60)
        if r.returncode:
            raise RuntimeError("pippin generate: " + r.stderr)
        return [int(x) for x in r.stdout.split()]

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--models", default="example,large")
    ap.add_argument("--npm-cache", default=os.path.expanduser("~/.cache/pippin-bench-ort"))
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/pippin-bench-generate"))
    a = ap.parse_args()
    pippin = os.path.join(a.build, "tools", "pippin")
    client = os.path.join(a.build, "bench", "pippin-bench-generate")
    clients = [int(c) for c in a.clients.split(",")]
    nodedir = ort_dir(a.npm_cache)
    nenv = dict(os.environ, NODE_PATH=os.path.join(nodedir, "node_modules"))
    tmp = tempfile.mkdtemp(prefix="pippin-bench-gen-")
    results = []
    try:
        models = {"example": os.path.join(ROOT, "examples", "gpt", "decoder.onnx")}
        if "large" in a.models:
            models["large"] = export_large(a.cache, "decoder")
        for key in a.models.split(","):
            model = models[key]
            info = describe(model)
            plain = os.path.join(tmp, key + "_plain.onnx")
            unmarked(model, plain)
            prompt = np.random.default_rng(1).integers(0, info["vocab"], (1, a.prompt), dtype=np.int64)
            prompt_npy = os.path.join(tmp, key + "_prompt.npy")
            np.save(prompt_npy, prompt)
            assert a.prompt + a.max_tokens - 1 <= info["block"], "the generation goes past the model's positions"

            out = subprocess.run(["node", os.path.join(ROOT, "bench", "ort_generate.js"), plain, str(a.seconds),
                                  ",".join(map(str, prompt.ravel().tolist())), str(a.max_tokens), str(info["vocab"]),
                                  str(info["heads"]), str(info["head_dim"]), "1", "2"],
                                 capture_output=True, text=True, env=nenv)
            if out.returncode:
                raise RuntimeError("ort_generate.js: " + out.stderr)
            lines = out.stdout.splitlines()
            ort_toks = [int(x) for x in lines[0].split()[1].split(",")]
            ort = [json.loads(l) for l in lines[1:] if l.startswith("{")]

            layouts = [("4 ranks", dict(model=model, ranks=info["stages"])),
                       ("2 ranks", dict(model=plain, ranks=2, split=[f"/blocks.{info['layers'] // 2}/"]))]
            rows, agree = [], None
            for lname, kw in layouts:
                svc = Service(pippin, tmp, f"{key}-{len(rows)}", context=info["block"], **kw)
                try:
                    toks = svc.generate(prompt_npy, a.max_tokens)
                    if agree is None:
                        agree = toks == ort_toks
                        if not agree:
                            print(f"{key}: pippin {toks}\n{key}: ORT    {ort_toks}")
                    for n in clients:
                        r = subprocess.run([client, svc.ep, "--clients", str(n), "--seconds", str(a.seconds),
                                            "--prompt", str(a.prompt), "--max-tokens", str(a.max_tokens),
                                            "--vocab", str(info["vocab"])], capture_output=True, text=True)
                        if r.returncode:
                            raise RuntimeError("pippin-bench-generate: " + r.stderr)
                        rows.append((lname, json.loads(r.stdout)))
                finally:
                    svc.stop()
            results.append((key, info, agree, rows, ort))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"greedy generation: {a.prompt}-token prompts, {a.max_tokens} tokens each, no session, 2 cores; "
          "pippin: one worker process per rank, 1 BLAS thread each")
    for key, info, agree, rows, ort in results:
        print(f"\n{key}: d {info['d']}, {info['heads']} heads, {info['layers']} layers, block {info['block']}, "
              f"vocab {info['vocab']}, {info['params'] / 1e6:.2f}M parameters; "
              f"pippin's and ORT's greedy tokens {'agree' if agree else 'DIFFER'}")
        print(f"{'':38}{'tokens/s':>10}{'first ms':>10}{'tok p50':>10}{'tok p99':>10}")
        for lname, r in rows:
            print(f"{'pippin ' + lname + ', ' + str(r['clients']) + ' clients':38}{r['tokens_per_s']:>10.1f}{r['first_p50_ms']:>10.2f}"
                  f"{r['token_p50_ms']:>10.2f}{r['token_p99_ms']:>10.2f}")
        for o in ort:
            print(f"{'ORT ' + str(o['threads']) + ' thr, one at a time':38}{o['tokens_per_s']:>10.1f}{o['first_p50_ms']:>10.2f}"
                  f"{o['token_p50_ms']:>10.2f}{o['token_p99_ms']:>10.2f}")
        best = max(o["tokens_per_s"] for o in ort)
        best_lat = min(o["token_p50_ms"] for o in ort)
        for lname in dict(rows):
            mine = [r for l, r in rows if l == lname]
            top, one = max(mine, key=lambda r: r["clients"]), min(mine, key=lambda r: r["clients"])
            print(f"{key}, pippin {lname}: tokens/s at {top['clients']} clients / ORT one at a time: "
                  f"{top['tokens_per_s'] / best:.2f}x; per-token p50 at {one['clients']} client / ORT's: "
                  f"{one['token_p50_ms'] / best_lat:.2f}x")
    return 0 if all(r[2] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
