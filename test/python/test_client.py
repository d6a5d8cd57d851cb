"""Serving from Python: the MLP cut into 2 stages served by two Workers on
threads of this process (mode: serve, ipc endpoints), queried with
pippin.Client (pippin_client, re-exported; needs python3-zmq, else the test
is skipped): outputs equal Graph.run's, stats, a bad request's error, and
stop() ends the service."""
import os
import shutil
import tempfile
import threading
import unittest

from pippin_testutil import MLP, SKIP, main, mlp, np, pippin

try:
    import zmq  # noqa: F401
except ImportError:
    print("skipped: python3-zmq is missing (the serving client needs it)")
    raise SystemExit(SKIP)


class Serving(unittest.TestCase):
    def test_serve_and_query(self):
        tmp = tempfile.mkdtemp()
        try:
            front = "ipc://%s/front" % tmp
            cfg = pippin.Config.parse(
                "model: %s/model_nosplit.onnx\nsplit: {before: [\"/fc3/\"]}\nmode: serve\ndims: {batch: 4}\n"
                "ranks: [ipc://%s/r0, ipc://%s/r1]\ntimeout_ms: 5000\nserve: {endpoint: %s}\n"
                % (MLP, tmp, tmp, front), directory=MLP)
            self.assertEqual(cfg.mode, "serve")
            self.assertEqual(cfg.serve_endpoint, front)
            workers = [pippin.Worker(cfg, rank=r) for r in range(2)]
            errors = []

            def body(w):
                try:
                    w.run()
                except BaseException as e:  # noqa: B902
                    errors.append(e)

            th = [threading.Thread(target=body, args=(w,)) for w in workers]
            for t in th:
                t.start()
            c = pippin.Client(front)
            try:
                x, y = mlp("x.npy"), mlp("y.npy")
                out = c.request({"x": x, "y": y}, outputs=["logits"], timeout_ms=20000)
                ref = pippin.load(os.path.join(MLP, "model_nosplit.onnx")).run({"x": x, "y": y})
                np.testing.assert_allclose(out["logits"], ref["logits"], atol=1e-6)
                out1 = c.request({"x": x[:1], "y": y[:1]}, outputs=["logits"])
                np.testing.assert_allclose(out1["logits"], ref["logits"][:1], atol=1e-6)
                self.assertIn("requests", c.stats())
                with self.assertRaises(pippin.ServeError) as cm:
                    c.request({"x": x, "y": y}, outputs=["no_such_output"])
                self.assertEqual(cm.exception.kind, "bad request")
                self.assertIn("no_such_output", str(cm.exception))
            finally:
                c.close()
                for w in workers:
                    w.stop()
                for t in th:
                    t.join(60)
            self.assertFalse(any(t.is_alive() for t in th))
            self.assertEqual(errors, [])
            for w in workers:
                w.close()
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
