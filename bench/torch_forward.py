#!/usr/bin/python3
"""PyTorch 1.13 reference timings for pippin's GPT benchmarks.

Rebuilds the GPT of test/fixtures/gen_fixtures.py (config from the model
directory's meta.json or vocab.json), loads its weights from the model.onnx
initializers, and times on CPU

  forward_ms     one forward pass (loss + logits) under torch.no_grad()
  train_step_ms  one training step's forward + backward (gradients of all
                 parameters; no optimizer update)

at --batch sequences of the model's full block_size, after --warmup runs;
each number is the median of --iters runs.  Prints one JSON line:

  {"forward_ms": x, "train_step_ms": y, "peak_rss_mb": z, ...}

peak_rss_mb is the process's peak resident set (ru_maxrss), torch included.

    /usr/bin/python3 bench/torch_forward.py --threads 4
    /usr/bin/python3 bench/torch_forward.py --model examples/gpt --batch 8
"""

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_config(model_dir):
    for name in ("meta.json", "vocab.json"):
        p = model_dir / name
        if p.exists():
            cfg = json.loads(p.read_text()).get("config")
            if cfg:
                return cfg
    sys.exit("no config in %s/meta.json or vocab.json" % model_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "test" / "fixtures" / "gpt"),
                    help="directory with model.onnx and meta.json/vocab.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=0,
                    help="sequence length (default: block_size)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()

    import numpy as np
    import onnx
    from onnx import numpy_helper
    import torch
    sys.path.insert(0, str(ROOT / "test" / "fixtures"))
    from gen_fixtures import GPT

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model)
    cfg = load_config(model_dir)
    model = GPT(split=False, **cfg)
    m = onnx.load(str(model_dir / "model.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    state = model.state_dict()
    with torch.no_grad():
        for name, t in state.items():
            if name == "head.weight":            # tied to tok_emb.weight
                continue
            t.copy_(torch.from_numpy(np.array(inits[name])))
    assert model.head.weight is model.tok_emb.weight
    model.train()   # no dropout/batchnorm: same math as eval

    T = args.seq or cfg["block_size"]
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg["vocab_size"], (args.batch, T), generator=g)
    tgt = torch.randint(0, cfg["vocab_size"], (args.batch, T), generator=g)

    def fwd():
        with torch.no_grad():
            model(idx, tgt)

    def train_step():
        model.zero_grad(set_to_none=True)
        loss, _ = model(idx, tgt)
        loss.backward()

    def timed(fn):
        for _ in range(args.warmup):
            fn()
        ts = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    out = dict(
        forward_ms=round(timed(fwd), 4),
        train_step_ms=round(timed(train_step), 4),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                          / 1024.0, 1),
        threads=args.threads, batch=args.batch, seq=T,
        iters=args.iters, warmup=args.warmup,
        model=str(model_dir), torch=torch.__version__,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
