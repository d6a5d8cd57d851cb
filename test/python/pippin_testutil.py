"""Shared setup of the Python tests (suite python): numpy or skip (exit 77),
the package from the source tree, the library from the build tree, the MLP
fixture (test/fixtures/mlp: 3 Gemm layers, torch's losses and gradients)."""
import os
import sys

SKIP = 77
try:
    import numpy as np  # noqa: F401
except ImportError:
    print("skipped: numpy is missing (Debian: apt-get install python3-numpy)")
    sys.exit(SKIP)

SRC = os.environ.get("PIPPIN_SOURCE_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
os.environ.setdefault("PIPPIN_LOG", "error")

import pippin  # noqa: E402

MLP = os.path.join(SRC, "test", "fixtures", "mlp")
GPT = os.path.join(SRC, "examples", "gpt")
# torch's trajectory on train_x/train_y, batch 4 (test/fixtures/mlp/train_ref.json)
TORCH_ADAMW = [2.263859510421753, 2.3356568813323975, 2.143181800842285]
TORCH_SGD = [2.263859510421753, 2.3307886123657227, 2.255173921585083]


def mlp(name):
    return np.load(os.path.join(MLP, name))


def batch(step, b=4):
    """Rows (step*b + j) mod N of the training data: step's batch."""
    x, y = mlp("train_x.npy"), mlp("train_y.npy")
    rows = [(step * b + j) % len(x) for j in range(b)]
    return {"x": x[rows], "y": y[rows]}


def main():
    import unittest
    unittest.main(verbosity=2)


__all__ = ["np", "pippin", "SRC", "MLP", "GPT", "TORCH_ADAMW", "TORCH_SGD", "mlp", "batch", "main", "SKIP"]
