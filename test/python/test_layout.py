"""The ctypes structs of python/pippin/_lib.py against the C headers: the
offsets (and sizes) that test/python/layout.c prints, compiled against
include/pippin (its path is the first argument). A field added to a
header that the binding reads past fails here, not as wrong numbers."""
import ctypes
import subprocess
import sys
import unittest

from pippin_testutil import main
from pippin import _lib

LAYOUT_EXE = sys.argv.pop(1) if len(sys.argv) > 1 else "layout"
C_NAMES = dict(Tensor="pp_tensor", Value="pp_value", Node="pp_node", Graph="pp_graph", SplitSpec="pp_split_spec",
               PipeEdge="pp_pipe_edge", PipeShared="pp_pipe_shared", Pipe="pp_pipe", OptimConfig="pp_optim_config",
               FlatParams="pp_flat_params", ConfigEntry="pp_config_entry", Config="pp_config",
               WorkerProgress="pp_worker_progress", WorkerOptions="pp_worker_options",
               CheckpointStep="pp_checkpoint_step", Safetensors="pp_safetensors", Schedule="pp_schedule")
PREFIX = {"Config", "Schedule"}  # ctypes classes of a leading part of their C struct only


class Layout(unittest.TestCase):
    def test_offsets_match_the_headers(self):
        c = {}
        out = subprocess.run([LAYOUT_EXE], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            struct, field, value = line.split()
            c[(struct, field)] = int(value)
        structs = {n: getattr(_lib, n) for n in dir(_lib)
                   if isinstance(getattr(_lib, n), type) and issubclass(getattr(_lib, n), ctypes.Structure)
                   and getattr(_lib, n) is not ctypes.Structure}
        self.assertEqual(sorted(structs), sorted(C_NAMES))
        for name, cls in structs.items():
            cname = C_NAMES[name]
            for field, _ in cls._fields_:
                key = (cname, "in" if field == "in_" else field)
                self.assertIn(key, c, "layout.c lacks %s.%s: regenerate it" % key)
                self.assertEqual(getattr(cls, field).offset, c[key], "%s.%s" % key)
            if name not in PREFIX:
                self.assertEqual(ctypes.sizeof(cls), c[(cname, "size")], "sizeof(%s)" % cname)


if __name__ == "__main__":
    main()
