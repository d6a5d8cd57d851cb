#!/usr/bin/python3
"""PyTorch on the GPU: the example GPT's training step (forward + backward,
every parameter's gradient, no optimizer update), the peer of
pippin-bench-gpu.

Builds the GPT of test/fixtures/gen_fixtures.py (config from the model
directory's meta.json; random weights: the step's time does not depend on
them) on cuda, float32 without TF32, at --batch sequences of block_size
tokens, and prints one JSON line {"train_step_ms": median, ...} after
--warmup steps, each step timed to a torch.cuda.synchronize().

    python3 bench/torch_gpu_step.py --model test/fixtures/gpt --batch 32
"""

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_gpt_class(fixtures_dir):
    # gen_fixtures imports the exporter's helpers; the model class needs
    # neither (no pipe-split markers with split=False), so stand-ins do.
    for name in ("pippin_torch", "onnx_ref"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.path.insert(0, str(fixtures_dir))
    from gen_fixtures import GPT
    return GPT


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(HERE.parent / "test" / "fixtures" / "gpt"))
    ap.add_argument("--fixtures", default=None, help="folder with gen_fixtures.py (default: the model's parent)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        sys.exit("torch_gpu_step: no CUDA device for torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = Path(args.model)
    cfg = json.loads((model_dir / "meta.json").read_text())["config"]
    GPT = load_gpt_class(Path(args.fixtures) if args.fixtures else model_dir.parent)
    torch.manual_seed(0)
    model = GPT(split=False, **cfg).cuda().train()
    T = cfg["block_size"]
    idx = torch.randint(0, cfg["vocab_size"], (args.batch, T), device="cuda")
    tgt = torch.randint(0, cfg["vocab_size"], (args.batch, T), device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        loss, _ = model(idx, tgt)
        loss.backward()
        torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    ts = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps(dict(train_step_ms=round(statistics.median(ts), 4), batch=args.batch, seq=T,
                          iters=args.iters, torch=torch.__version__, gpu=torch.cuda.get_device_name(0))))


if __name__ == "__main__":
    main()
