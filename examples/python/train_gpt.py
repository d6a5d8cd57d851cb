#!/usr/bin/env python3
"""Train the example GPT (examples/gpt) as a 2-rank pipeline from Python,
then serve the trained weights as a 4-rank pipeline and generate text.

    PYTHONPATH=python PIPPIN_BUILD_ROOT=build python3 examples/python/train_gpt.py
    # installed (meson install): python3 examples/python/train_gpt.py

Both configs are the example's own (pipeline.yaml: zero-bubble V schedule,
60 steps, parameters written to out/gpt-pipeline; serve.yaml: decoder.onnx
with those parameters, a KV cache per session). Every rank runs on a thread
of this process (their ipc endpoints work the same between processes:
`pippin run`, or one `pippin.Worker` per process). The client needs
python3-zmq. Other configs: train_gpt.py TRAIN.yaml SERVE.yaml.
"""
import os
import sys

import pippin

here = os.path.dirname(os.path.abspath(__file__))
train_cfg = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "gpt", "pipeline.yaml")
serve_cfg = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "gpt", "serve.yaml")

# Train: every rank of the pipeline, a progress line per step.
losses = pippin.run_ranks(train_cfg, progress=lambda p: p.loss is not None and
                          print("step %3d/%d  loss %.4f  (%.0f ms)" % (p.step + 1, p.steps, p.loss, p.step_ms)))
print("loss %.4f -> %.4f; parameters in %s" % (losses[0], losses[-1], pippin.Config(train_cfg).output_dir))

# Serve what training wrote, and ask the service for text.
with pippin.Ranks(serve_cfg) as service:
    client = pippin.Client(service.config.serve_endpoint)
    print("ROMEO:", end="", flush=True)
    for piece in client.generate(text="ROMEO:", max_tokens=58, timeout_ms=30000):  # 64 positions in all
        print(piece.text, end="", flush=True)
    print()
    client.close()
