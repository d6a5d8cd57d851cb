"""A 2-rank pipeline driven from Python: the MLP fixture cut into 2 stages,
one pp_worker per rank on threads of this process (inproc endpoints), then
as two processes over ipc: torch's losses, progress callbacks, a stop from
the callback and a resume with the uninterrupted run's losses bit for bit,
an exception in the callback, collective checkpoints, the config's
fields, and open errors."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

from pippin_testutil import MLP, SRC, TORCH_ADAMW, main, np, pippin

STEPS = 3


def config_text(endpoints, steps=STEPS, extra=""):
    return ("model: %s/model_nosplit.onnx\nsplit: {before: [\"/fc3/\"]}\nschedule: 1f1b\nmicrobatches: 2\n"
            "batch_size: 4\nsteps: %d\noptimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}\n"
            "data: {x: %s/train_x.npy, y: %s/train_y.npy}\nranks: [%s]\ntimeout_ms: 20000\n%s"
            % (MLP, steps, MLP, MLP, ", ".join(endpoints), extra))


_runs = iter(range(1 << 30))


def inproc_config(**kw):
    n = next(_runs)
    eps = ["inproc://py-%d-%d-%d" % (os.getpid(), n, r) for r in range(2)]
    return pippin.Config.parse(config_text(eps, **kw), directory=MLP, name="test.yaml")


def run_threads(workers):
    """Runs each worker's run() on a thread of its own; the exceptions by rank."""
    errors = {}

    def body(r, w):
        try:
            w.run()
        except BaseException as e:  # noqa: B902
            errors[r] = e

    th = [threading.Thread(target=body, args=(r, w)) for r, w in enumerate(workers)]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
        assert not t.is_alive(), "a worker hangs"
    return errors


class Pipeline(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_config_fields(self):
        c = inproc_config()
        self.assertEqual(c.mode, "train")
        self.assertEqual(c.schedule, "1f1b")
        self.assertEqual((c.microbatches, c.batch_size, c.steps), (2, 4, STEPS))
        self.assertEqual(len(c.ranks), 2)
        self.assertTrue(c.model.endswith("model_nosplit.onnx"))
        self.assertEqual(sorted(c.data), ["x", "y"])
        self.assertEqual(c.optimizer["kind"], "adamw")
        self.assertAlmostEqual(c.optimizer["lr"], 0.01)
        with self.assertRaises(pippin.PippinError) as cm:
            pippin.Config.parse("model: m.onnx\nbatch_size: 4\nno_such_key: 1\n", name="bad.yaml")
        self.assertIn("no_such_key", cm.exception.message)
        self.assertIn("bad.yaml", cm.exception.message)

    def test_two_ranks_on_threads_match_torch(self):
        c = inproc_config()
        seen = {0: [], 1: []}
        workers = [pippin.Worker(c, rank=r, progress=lambda p: seen[p.rank].append(p)) for r in range(2)]
        self.assertEqual([w.rank for w in workers], [0, 1])
        self.assertEqual([w.stages for w in workers], [[0], [1]])
        self.assertEqual(workers[0].steps, STEPS)
        self.assertEqual(workers[0].next_step, 0)
        self.assertTrue(workers[1].endpoint.startswith("inproc://"))
        self.assertEqual(run_threads(workers), {})
        for w in workers:
            self.assertEqual(w.next_step, STEPS)
            w.close()
        self.assertEqual([p.step for p in seen[0]], [0, 1, 2])
        self.assertTrue(all(p.loss is None and p.steps == STEPS for p in seen[0]))
        np.testing.assert_allclose([p.loss for p in seen[1]], TORCH_ADAMW, atol=1e-4)
        self.assertTrue(all(p.step_ms > 0 for p in seen[1]))

    def test_step_by_step(self):
        c = inproc_config()
        workers = [pippin.Worker(c, rank=r) for r in range(2)]
        done = [[], []]

        def body(r):
            while True:
                d = workers[r].step()
                done[r].append(d)
                if d:
                    return

        th = [threading.Thread(target=body, args=(r,)) for r in range(2)]
        for t in th:
            t.start()
        for t in th:
            t.join(120)
        self.assertEqual(done, [[False, False, True]] * 2)
        for w in workers:
            w.close()
        with self.assertRaises(pippin.PippinError):
            workers[0].step()  # closed

    def test_run_ranks_helper_and_output_dir(self):
        out = os.path.join(self.tmp, "out")
        c = pippin.Config.parse(config_text(["inproc://py-rr-%d-%d" % (os.getpid(), r) for r in range(2)],
                                            extra="output_dir: %s\n" % out), directory=MLP)
        steps = []
        losses = pippin.run_ranks(c, progress=lambda p: steps.append((p.rank, p.step)))
        np.testing.assert_allclose(losses, TORCH_ADAMW, atol=1e-4)
        self.assertEqual(sorted(steps), [(r, s) for r in range(2) for s in range(STEPS)])
        np.testing.assert_allclose(np.load(os.path.join(out, "fc1.bias.npy")),
                                   np.load(os.path.join(MLP, "after_adamw_fc1.bias.npy")), atol=1e-4)

    def test_stop_from_callback_then_resume(self):
        ck = os.path.join(self.tmp, "ckpt")
        full = pippin.run_ranks(inproc_config())
        c = inproc_config()
        workers = []

        def stop_after_0(p):
            if p.step == 0:
                workers[p.rank].stop()

        workers.extend(pippin.Worker(c, rank=r, progress=stop_after_0, checkpoint_dir=ck) for r in range(2))
        self.assertEqual(run_threads(workers), {})
        self.assertTrue(all(w.stopped for w in workers))
        for w in workers:
            w.close()
        self.assertEqual(pippin.checkpoint.latest(ck), 0)
        self.assertEqual([s.n_stages for s in pippin.checkpoint.list(ck)], [2])
        rest = pippin.run_ranks(inproc_config(), checkpoint_dir=ck, checkpoint_every=1, resume=True)
        self.assertEqual(rest, full[1:])
        self.assertEqual(pippin.checkpoint.latest(ck), STEPS - 1)
        with self.assertRaises(pippin.PippinError):  # resume without a checkpoint: an error naming the dir
            pippin.Worker(inproc_config(), rank=0, resume=True, checkpoint_dir=os.path.join(self.tmp, "none"))

    def test_callback_exception_stops_and_raises(self):
        c = inproc_config()

        def boom(p):
            if p.rank == 1 and p.step == 1:
                raise RuntimeError("from the callback")

        workers = [pippin.Worker(c, rank=r, progress=boom) for r in range(2)]
        errors = run_threads(workers)
        self.assertEqual(list(errors), [1])
        self.assertIsInstance(errors[1], RuntimeError)
        self.assertEqual([w.next_step for w in workers], [2, 2])  # every rank stopped after step 1
        for w in workers:
            w.close()

    def test_collective_checkpoint(self):
        ck = os.path.join(self.tmp, "manual")
        c = inproc_config()
        workers = [pippin.Worker(c, rank=r) for r in range(2)]

        def body(w):
            w.step()
            w.checkpoint(ck)

        th = [threading.Thread(target=body, args=(w,)) for w in workers]
        for t in th:
            t.start()
        for t in th:
            t.join(120)
        for w in workers:
            w.close()
        self.assertEqual([(s.step, s.committed) for s in pippin.checkpoint.list(ck)], [(0, True)])
        _, meta = pippin.checkpoint.read(pippin.checkpoint.stage_path(ck, 0, 1))
        self.assertEqual(meta["pippin.stage"], "1")

    def test_open_errors(self):
        with self.assertRaises(pippin.PippinError) as cm:
            pippin.Worker(inproc_config(), rank=5)
        self.assertIn("5", cm.exception.message)
        with self.assertRaises(pippin.PippinError):
            pippin.Worker(os.path.join(self.tmp, "missing.yaml"), rank=0)

    def test_two_processes_over_ipc(self):
        cfg = os.path.join(self.tmp, "p.yaml")
        with open(cfg, "w") as f:
            f.write(config_text(["ipc://%s/r%d" % (self.tmp, r) for r in range(2)]))
        code = ("import sys; sys.path.insert(0, %r); import pippin\n"
                "w = pippin.Worker(sys.argv[1], progress=lambda p: p.loss is not None and print(repr(p.loss)))\n"
                "w.run(); w.close()\n" % os.path.join(SRC, "python"))
        procs = [subprocess.Popen([sys.executable, "-c", code, cfg], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PIPPIN_RANK=str(r))) for r in range(2)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0])
        self.assertEqual(outs[0], "")
        np.testing.assert_allclose([float(x) for x in outs[1].split()], TORCH_ADAMW, atol=1e-4)


if __name__ == "__main__":
    main()
