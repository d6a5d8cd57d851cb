"""examples/python/train_gpt.py runs: the example GPT trained for 2 steps
(a copy of pipeline.yaml with fewer steps and endpoints of its own), then
served from what training wrote, and 58 characters generated (the
model's 64 positions) (needs
python3-zmq for the client, else skipped)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from pippin_testutil import GPT, SKIP, SRC, main

try:
    import zmq  # noqa: F401
except ImportError:
    print("skipped: python3-zmq is missing (the example's client needs it)")
    raise SystemExit(SKIP)


class Example(unittest.TestCase):
    def test_train_then_generate(self):
        tmp = tempfile.mkdtemp()
        try:
            train, serve = os.path.join(tmp, "train.yaml"), os.path.join(tmp, "serve.yaml")
            with open(train, "w") as f:
                f.write("model: %s/model.onnx\nschedule: zbv\nmicrobatches: 4\nbatch_size: 16\nsteps: 2\n"
                        "optimizer: {kind: adamw, lr: 0.002, weight_decay: 0.01}\n"
                        "text: {file: %s/../data/tiny.txt, vocab: %s/vocab.json, seq: 64}\n"
                        "ranks: [ipc://%s/t0, ipc://%s/t1]\ntimeout_ms: 20000\noutput_dir: %s/out\n"
                        % (GPT, GPT, GPT, tmp, tmp, tmp))
            with open(serve, "w") as f:
                f.write("model: %s/decoder.onnx\nparams: %s/out\nmode: serve\n"
                        "ranks: [%s]\ntimeout_ms: 10000\n"
                        "serve: {endpoint: ipc://%s/front, vocab: %s/vocab.json, context: 64}\n"
                        % (GPT, tmp, ", ".join("ipc://%s/s%d" % (tmp, r) for r in range(4)), tmp, GPT))
            p = subprocess.run([sys.executable, os.path.join(SRC, "examples", "python", "train_gpt.py"), train, serve],
                               capture_output=True, text=True, timeout=240)
            self.assertEqual(p.returncode, 0, p.stderr)
            lines = p.stdout.splitlines()
            self.assertTrue(lines[0].startswith("step   1/2  loss "), p.stdout)
            self.assertTrue(lines[2].startswith("loss "), p.stdout)
            self.assertGreater(len(os.listdir(os.path.join(tmp, "out"))), 10)  # the trained parameters
            self.assertTrue(lines[3].startswith("ROMEO:"), p.stdout)
            self.assertEqual(len("\n".join(lines[3:])), len("ROMEO:") + 58, p.stdout)  # the model's 64 positions
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
