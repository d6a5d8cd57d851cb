"""The ctypes binding in one process: load and inspect a model, run it
(zero-copy inputs and outputs), errors, split into a pipe, schedules, the
local runner (torch's gradients and losses), its checkpoints, the
single-graph trainer (torch's SGD trajectory), safetensors, the log hook,
and the PyTorch helper's re-export (only where torch is installed)."""
import os
import shutil
import tempfile
import unittest

from pippin_testutil import MLP, TORCH_ADAMW, TORCH_SGD, batch, main, mlp, np, pippin


class Basics(unittest.TestCase):
    def test_version_and_library(self):
        self.assertRegex(pippin.__version__, r"^\d+\.\d+\.\d+$")
        self.assertTrue(os.path.exists(pippin.library_path), pippin.library_path)

    def test_error_carries_message_and_status(self):
        with self.assertRaises(pippin.PippinError) as cm:
            pippin.load("/nonexistent/model.onnx")
        e = cm.exception
        self.assertEqual(e.status, -3)
        self.assertEqual(e.status_name, "I/O error")
        self.assertIn("/nonexistent/model.onnx", e.message)
        self.assertIn("/nonexistent/model.onnx", str(e))
        with self.assertRaises(pippin.PippinError) as cm:
            pippin.parse(b"not a model", "junk.onnx")
        self.assertIn("junk.onnx", cm.exception.message)

    def test_inspect(self):
        g = pippin.load(os.path.join(MLP, "model.onnx"))
        self.assertEqual([i.name for i in g.inputs], ["x", "y"])
        self.assertEqual(g.inputs[0].shape, ("batch", 16))
        self.assertEqual(g.inputs[0].dtype, np.float32)
        self.assertEqual(g.inputs[1].dtype, np.int64)
        self.assertEqual([o.name for o in g.outputs], ["loss", "logits"])
        self.assertEqual(g.outputs[0].shape, ())
        self.assertEqual(g.param_names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"])
        self.assertEqual(g.param_stats(), (1930, 1930 * 4))
        self.assertEqual(g.initializer("fc1.weight").shape, (32, 16))
        self.assertEqual(sum(1 for n in g.nodes if n.op_type == "PipeSplit" and n.domain == "pippin"), 2)
        self.assertEqual(g.opset, 17)
        with self.assertRaises(KeyError):
            g.initializer("nope")

    def test_run_matches_torch(self):
        g = pippin.load(os.path.join(MLP, "model_nosplit.onnx"))
        x, y = mlp("x.npy"), mlp("y.npy")
        out = g.run({"x": x, "y": y})
        np.testing.assert_allclose(out["logits"], mlp("out_logits.npy"), atol=1e-5)
        np.testing.assert_allclose(out["loss"], mlp("out_loss.npy"), atol=1e-5)
        # outputs pippin owned alone come back without a copy: the array owns the tensor
        self.assertIsNotNone(out["logits"].base)
        self.assertTrue(out["logits"].flags.writeable)
        # a list in input order, a non-contiguous input (copied), again with the kept executor
        xt = np.asfortranarray(x)
        out2 = g([xt, y])
        np.testing.assert_array_equal(out2["logits"], out["logits"])
        # wrong dtype and shape: pippin's message
        with self.assertRaises(pippin.PippinError) as cm:
            g.run({"x": x.astype(np.float64), "y": y})
        self.assertIn("x", cm.exception.message)
        with self.assertRaises(ValueError):
            g.run({"x": x})

    def test_inputs_are_wrapped_without_copy(self):
        from pippin import _tensor
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        t = _tensor.wrap(a)
        self.assertEqual(t.contents.data, a.ctypes.data)
        self.assertEqual(tuple(t.contents.shape[:2]), (3, 4))
        self.assertIn(a, [v for v in _tensor._pinned.values()])  # kept alive while pippin holds it
        before = len(_tensor._pinned)
        pippin._lib.lib.pp_tensor_free(t)
        self.assertEqual(len(_tensor._pinned), before - 1)
        with self.assertRaises(TypeError):
            _tensor.wrap(np.zeros(3, np.complex64))

    def test_freeze_and_save(self):
        d = tempfile.mkdtemp()
        try:
            g = pippin.load(os.path.join(MLP, "model_nosplit.onnx"))
            self.assertEqual(g.freeze("fc1.*"), 2)
            self.assertNotIn("fc1.weight", g.param_names)
            g.save(os.path.join(d, "m.onnx"))
            self.assertEqual(pippin.load(os.path.join(d, "m.onnx")).param_names,
                             ["fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"])
        finally:
            shutil.rmtree(d)


class Pipes(unittest.TestCase):
    def test_split_probe_save_load(self):
        g = pippin.load(os.path.join(MLP, "model_nosplit.onnx"))
        p = g.split(before=["/fc2/", "/fc3/"])
        self.assertEqual(p.n_stages, 3)
        self.assertEqual(p.cuts, ["/fc2/", "/fc3/"])
        self.assertEqual(p.loss, "loss")
        self.assertEqual(p.loss_stage, 2)
        self.assertEqual(p.outputs, {"loss": 2, "logits": 2})
        self.assertEqual([s.inputs[0].name for s in p.stages], ["x", "/Relu_output_0", "/Mul_5_output_0"])
        self.assertIsNone(p.edges[1].dims)
        p.probe_shapes(batch=4)
        e = {e.value: e for e in p.edges}
        self.assertEqual(e["/Relu_output_0"].producer, 0)
        self.assertEqual(e["/Relu_output_0"].consumers, [1])
        self.assertEqual(e["/Relu_output_0"].dims, ("batch", "32"))
        self.assertEqual(e["/Relu_output_0"].bytes_per_sample, 128)
        self.assertEqual(e["y"].producer, -1)
        self.assertIn('"pippin-pipe"', p.to_json())
        d = tempfile.mkdtemp()
        try:
            p.save(d)
            self.assertTrue(os.path.exists(os.path.join(d, "stage_2.onnx")))
            q = pippin.load_pipe(d)
            self.assertEqual(q.n_stages, 3)
            self.assertEqual(q.stages[2].param_names, ["fc3.weight", "fc3.bias"])
        finally:
            shutil.rmtree(d)
        with self.assertRaises(pippin.PippinError) as cm:
            g.split(before=["/nothing-like-this/"])
        self.assertIn("/nothing-like-this/", cm.exception.message)

    def test_markers_and_schedule(self):
        p = pippin.load(os.path.join(MLP, "model.onnx")).split()
        self.assertEqual(p.n_stages, 3)
        s = pippin.Schedule("1f1b", 3, 4)
        self.assertEqual((s.nranks, s.nstages, s.microbatches), (3, 3, 4))
        self.assertIn("Rank 2", s.table())
        with self.assertRaises(pippin.PippinError):
            pippin.Schedule("no-such-schedule", 3, 4)


class Training(unittest.TestCase):
    def test_runner_gradients_and_losses(self):
        p = pippin.load(os.path.join(MLP, "model.onnx")).split()
        stage0 = p.stages[0]
        self.assertEqual(stage0.param_names, ["fc1.weight", "fc1.bias"])
        r = pippin.Runner(p, optimizer="adamw", lr=0.01, weight_decay=0.01)
        with self.assertRaises(pippin.PippinError):  # the runner took it: no dangling read
            stage0.inputs
        self.assertEqual(r.n_stages, 3)
        self.assertEqual(r.stages[0].params, ["fc1.weight", "fc1.bias"])
        self.assertTrue(r.stages[2].has_loss)
        self.assertEqual(r.loss_name, "loss")
        self.assertIsNone(p.stages[0])  # the runner took the stage graphs
        out = r.step({"x": mlp("x.npy"), "y": mlp("y.npy")}, microbatches=2, schedule="1f1b")
        np.testing.assert_allclose(out["loss"], mlp("out_loss.npy"), atol=1e-5)
        for name in ("fc1.weight", "fc3.bias"):
            np.testing.assert_allclose(r.grad(name), mlp("grad_%s.npy" % name), atol=1e-5)
        r.set_step(0)
        losses = [float(r.train_step(batch(s), microbatches=2, schedule="gpipe")["loss"]) for s in range(3)]
        np.testing.assert_allclose(losses, TORCH_ADAMW, atol=1e-4)
        np.testing.assert_allclose(r.param("fc1.bias"), mlp("after_adamw_fc1.bias.npy"), atol=1e-4)
        with self.assertRaises(pippin.PippinError):
            r.param("nope")

    def test_runner_checkpoint_resume(self):
        d = tempfile.mkdtemp()
        try:
            def runner():
                return pippin.Runner(pippin.load(os.path.join(MLP, "model.onnx")).split(), optimizer="adamw",
                                     lr=0.01, weight_decay=0.01)

            full = runner()
            ref = [float(full.train_step(batch(s), 2, "1f1b")["loss"]) for s in range(3)]
            a = runner()
            a.train_step(batch(0), 2, "1f1b")
            self.assertEqual(a.save_checkpoint(d), 0)
            steps = pippin.checkpoint.list(d)
            self.assertEqual([(s.step, s.committed, s.n_stages, s.n_files) for s in steps], [(0, True, 3, 3)])
            self.assertGreater(steps[0].bytes, 0)
            self.assertEqual(pippin.checkpoint.latest(d), 0)
            tensors, meta = pippin.checkpoint.read(pippin.checkpoint.stage_path(d, 0, 0))
            self.assertEqual(meta["pippin.optimizer"], "adamw")
            self.assertEqual(meta["pippin.step"], "0")
            np.testing.assert_array_equal(tensors["fc1.bias"], a.param("fc1.bias"))
            self.assertIn("pippin.optim.exp_avg", tensors)
            b = runner()
            self.assertEqual(b.load_checkpoint(d), 0)
            rest = [float(b.train_step(batch(s), 2, "1f1b")["loss"]) for s in (1, 2)]
            self.assertEqual(rest, ref[1:])  # bit for bit
            b.save_checkpoint(d, 2)
            pippin.checkpoint.prune(d, keep=1)
            self.assertEqual([s.step for s in pippin.checkpoint.list(d)], [2])
            with self.assertRaises(pippin.PippinError) as cm:
                pippin.checkpoint.latest(os.path.join(d, "empty"))
            self.assertEqual(cm.exception.status, -7)
        finally:
            shutil.rmtree(d)

    def test_trainer_matches_torch_sgd(self):
        t = pippin.Trainer(os.path.join(MLP, "model_nosplit.onnx"), optimizer="sgd", lr=0.1, momentum=0.9,
                           weight_decay=0.01)
        self.assertEqual(t.input_names, ["x", "y"])
        w = t.params["fc1.weight"]
        self.assertEqual(w.shape, (32, 16))
        losses = [t.train_step(batch(s), microbatches=2 if s else 1) for s in range(3)]
        np.testing.assert_allclose(losses, TORCH_SGD, atol=1e-4)
        for name in ("fc1.weight", "fc2.bias", "fc3.weight"):
            np.testing.assert_allclose(t.params[name], mlp("after_sgd_%s.npy" % name), atol=1e-4)
        self.assertIs(t.params["fc1.weight"], w)  # a live view: no copy
        with self.assertRaises(pippin.PippinError):
            t.graph.run({"x": mlp("x.npy"), "y": mlp("y.npy")})
        t.zero_grad()
        self.assertEqual(float(np.abs(t.grads["fc1.weight"]).max()), 0.0)
        t.backward(batch(0))
        self.assertGreater(float(np.abs(t.grads["fc1.weight"]).max()), 0.0)
        # gradients a failed backward left part-added: no optimizer step
        # on them (regression: Python stepped on raw pointers unchecked)
        t._fp.grads_incomplete = 1
        before = t.params["fc1.weight"].copy()
        with self.assertRaises(pippin.PippinError) as e:
            t.optimizer_step()
        self.assertIn("part of a backward that failed", str(e.exception))
        np.testing.assert_array_equal(t.params["fc1.weight"], before)
        t.zero_grad()
        t.optimizer_step()
        d = tempfile.mkdtemp()
        try:
            t.save(d)
            np.testing.assert_array_equal(np.load(os.path.join(d, "fc3.bias.npy")), t.params["fc3.bias"])
        finally:
            shutil.rmtree(d)
        t.close()

    def test_optimizer_settings_checked(self):
        with self.assertRaises(pippin.PippinError):
            pippin.Trainer(os.path.join(MLP, "model_nosplit.onnx"), optimizer="sgd", lr=-1.0)
        with self.assertRaises(pippin.PippinError):
            pippin.optim_config("lbfgs")


class Files(unittest.TestCase):
    def test_safetensors_roundtrip(self):
        d = tempfile.mkdtemp()
        try:
            f = os.path.join(d, "t.safetensors")
            src = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], np.int64)}
            pippin.checkpoint.save_safetensors(f, src, {"k": "v"})
            got, meta = pippin.checkpoint.load_safetensors(f)
            self.assertEqual(meta, {"k": "v"})
            for k in src:
                np.testing.assert_array_equal(got[k], src[k])
                self.assertEqual(got[k].dtype, src[k].dtype)
        finally:
            shutil.rmtree(d)


class Log(unittest.TestCase):
    def test_handler_gets_messages(self):
        got = []
        level = pippin.log.get_level()
        pippin.log.set_handler(lambda lv, msg: got.append((lv, msg)))
        pippin.log.set_level("debug")
        try:
            pippin.Trainer(os.path.join(MLP, "model_nosplit.onnx")).close()
        finally:
            pippin.log.set_handler(None)
            pippin.log.set_level(level)
        self.assertTrue(any(lv == "debug" and "autodiff" in m for lv, m in got), got)

    def test_to_python_logging(self):
        import logging
        records = []

        class H(logging.Handler):
            def emit(self, r):
                records.append(r)

        logger = logging.getLogger("pippin.test")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(H())
        level = pippin.log.get_level()
        pippin.log.to_python(logger)
        try:
            pippin.Trainer(os.path.join(MLP, "model_nosplit.onnx")).close()
        finally:
            pippin.log.set_handler(None)
            pippin.log.set_level(level)
        self.assertTrue(any(r.levelno == logging.DEBUG and "autodiff" in r.getMessage() for r in records))


class Torch(unittest.TestCase):
    def test_export_reexported(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        import pippin_torch
        self.assertIs(pippin.export, pippin_torch.export)
        self.assertIs(pippin.pipe_split, pippin_torch.pipe_split)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

            def forward(self, x):
                return self.b(pippin.pipe_split(torch.relu(self.a(x))))

        net, x = Net(), torch.randn(3, 4)
        d = tempfile.mkdtemp()
        try:
            f = os.path.join(d, "net.onnx")
            pippin.export(net, (x,), f, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
            g = pippin.load(f)
            self.assertEqual(g.split().n_stages, 2)
            np.testing.assert_allclose(g.run(x.numpy())["y"], net(x).detach().numpy(), atol=1e-5)
            # the marker is a model-local function (issue 18): any ONNX tool loads the file
            import onnx
            m = onnx.load(f)
            self.assertEqual([(fn.domain, fn.name, [n.op_type for n in fn.node]) for fn in m.functions],
                             [("pippin", "PipeSplit", ["Identity"])])
            onnx.checker.check_model(m, full_check=True)
        finally:
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
