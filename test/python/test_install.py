"""`meson install` puts the package next to the library (issue 18): this
build installed into a temporary DESTDIR gives a site directory holding
pippin/, pippin_torch.py and pippin_client.py, whose _paths.py names the
libdir the library went to; a fresh interpreter on that site directory
alone (no source tree, no build tree) imports it, loads the installed
library and runs the MLP fixture with pippin's outputs."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from pippin_testutil import MLP, main

BUILD = os.environ.get("PIPPIN_BUILD_ROOT")
MESON = os.environ.get("MESON")

CHILD = r"""
import os, sys
import numpy as np
import pippin
dest = sys.argv[1]
assert pippin.__file__.startswith(dest), pippin.__file__
assert os.path.realpath(pippin.library_path).startswith(os.path.realpath(dest)), pippin.library_path
g = pippin.load(os.path.join(sys.argv[2], "model.onnx"))
out = g.run({"x": np.load(os.path.join(sys.argv[2], "x.npy")), "y": np.load(os.path.join(sys.argv[2], "y.npy"))})
assert np.isfinite(out["loss"]).all()
print(float(out["loss"]))
"""


class Install(unittest.TestCase):
    @unittest.skipUnless(BUILD and MESON, "PIPPIN_BUILD_ROOT and MESON are set by meson test")
    def test_installed_package_runs(self):
        dest = tempfile.mkdtemp()
        try:
            subprocess.run([MESON, "install", "-C", BUILD, "--destdir", dest, "--no-rebuild", "--quiet"],
                           check=True, capture_output=True)
            inits = glob.glob(os.path.join(dest, "**", "pippin", "__init__.py"), recursive=True)
            self.assertEqual(len(inits), 1, inits)
            site = os.path.dirname(os.path.dirname(inits[0]))
            for f in ("pippin_torch.py", "pippin_client.py", "pippin/_paths.py"):
                self.assertTrue(os.path.exists(os.path.join(site, f)), f)
            paths = {}
            with open(os.path.join(site, "pippin", "_paths.py")) as f:
                exec(f.read(), paths)
            libdir = dest + paths["LIBDIR"]
            self.assertTrue(glob.glob(os.path.join(libdir, "libpippin.so.*")), libdir)
            # the library as _paths.py names it, read under DESTDIR: PIPPIN_LIB stands in for the prefix
            lib = sorted(glob.glob(os.path.join(libdir, "libpippin.so.[0-9]")))[0]
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIPPIN_BUILD_ROOT")}
            env.update(PYTHONPATH=site, PIPPIN_LIB=lib)
            r = subprocess.run([sys.executable, "-c", CHILD, dest, MLP], env=env, capture_output=True,
                               text=True, cwd=dest)
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            want = float(__import__("numpy").load(os.path.join(MLP, "out_loss.npy")))
            self.assertAlmostEqual(float(r.stdout.split()[-1]), want, places=4)
        finally:
            shutil.rmtree(dest, ignore_errors=True)


if __name__ == "__main__":
    main()
