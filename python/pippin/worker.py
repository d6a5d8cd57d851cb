"""Pipelines from config files: pippin/config.h and pippin/worker.h.

    cfg = pippin.Config("examples/gpt/pipeline.yaml")
    w = pippin.Worker(cfg, rank=0, progress=lambda p: print(p.step, p.loss))
    w.run()

Every rank of a config runs one Worker (a process each, or a thread each:
`pippin.run_ranks` and `pippin.Ranks` open them all in this
process). A progress callback
runs on the worker's thread after each step with a Progress (rank, step,
steps, loss or None, step_ms); an exception it raises stops the run (every
rank stops after the same step) and is raised again by run() or step().
"""
import os
import threading
import weakref
from collections import namedtuple
from ctypes import byref, c_int, c_void_p

from . import _lib
from ._lib import Closing, ConfigP, PippinError, WorkerOptions, check, enc, lib

Progress = namedtuple("Progress", "rank step steps loss step_ms")
Progress.__doc__ = """After each step: loss is None on ranks that do not compute it."""


def _str(b):
    return None if b is None else b.decode(errors="replace")


class Config:
    """A parsed pipeline config (pp_config_load; docs/config.md). Config(path)
    reads a file; Config.parse(text, directory) YAML text, relative paths
    resolved against directory."""

    def __init__(self, path=None, _ptr=None):
        if _ptr is None:
            _ptr = ConfigP()
            check(lib.pp_config_load(enc(path), byref(_ptr)))
        self._c = _ptr

    @classmethod
    def parse(cls, text, directory=".", name="config"):
        data = enc(text)
        c = ConfigP()
        check(lib.pp_config_parse(data, len(data), enc(name), enc(directory), byref(c)))
        return cls(_ptr=c)

    def close(self):
        if self._c:
            lib.pp_config_free(self._c)
            self._c = None

    def __del__(self):
        self.close()

    @property
    def _s(self):
        if not self._c:
            raise PippinError(-10, "the config is closed", "wrong state")
        return self._c.contents

    path = property(lambda self: _str(self._s.path))
    model = property(lambda self: _str(self._s.model), doc="the model file (resolved); None with stages:")
    stages = property(lambda self: _str(self._s.stages), doc="a `pippin split` directory, or None")
    mode = property(lambda self: "serve" if self._s.serving else "train" if self._s.training else "infer")
    schedule = property(lambda self: _str(self._s.schedule))
    microbatches = property(lambda self: self._s.microbatches)
    batch_size = property(lambda self: self._s.batch_size)
    steps = property(lambda self: self._s.steps)
    loss = property(lambda self: _str(self._s.loss))
    ranks = property(lambda self: [_str(self._s.ranks[i]) for i in range(self._s.n_ranks)])
    output_dir = property(lambda self: _str(self._s.output_dir))
    checkpoint_dir = property(lambda self: _str(self._s.checkpoint_dir))
    serve_endpoint = property(lambda self: _str(self._s.serve_endpoint))
    data = property(lambda self: {_str(e.key): _str(e.value) for e in self._s.data[0:self._s.n_data]})
    dims = property(lambda self: {_str(e.key): int(e.value) for e in self._s.dims[0:self._s.n_dims]})

    @property
    def optimizer(self):
        o = self._s.optim
        return {"kind": "adamw" if o.kind == 1 else "sgd", "lr": o.lr, "weight_decay": o.weight_decay,
                "betas": (o.beta1, o.beta2), "eps": o.eps, "momentum": o.momentum}

    def __repr__(self):
        return "<pippin.Config %s: mode %s, %d ranks>" % (self.path, self.mode, len(self.ranks))


RESUME, RESUME_IF_ANY = 1, 2
PEER = -9  # PP_ERR_PEER


class Worker(Closing):
    """One rank of a pipeline (pp_worker). config: a path or a Config (kept
    alive with the worker). rank None: PIPPIN_RANK and the launchers'
    variables. resume: True (fail without a checkpoint), "if_any" or False.
    Use it as a context manager or call close()."""

    def __init__(self, config, rank=None, progress=None, checkpoint_dir=None, checkpoint_every=0, resume=False,
                 blas_threads=0, checkpoint_keep=0, rejoin_timeout_ms=0, threads=0):
        o = WorkerOptions()
        lib.pp_worker_options_init(byref(o))
        o.rank = -1 if rank is None else rank
        self._user_progress = progress
        self._error = None
        self._w = None
        if progress is not None:
            me = weakref.ref(self)  # no cycle: the worker is freed when the last reference goes
            self._cb = _lib.progress_fn(lambda p, user: me() and me()._on_progress(p, user))  # kept: C holds it
            o.progress = self._cb
        self._ckpt = enc(checkpoint_dir)  # borrowed by the worker: kept alive here
        o.checkpoint_dir = self._ckpt
        o.checkpoint_every = checkpoint_every
        o.resume = RESUME_IF_ANY if resume == "if_any" else RESUME if resume else 0
        o.blas_threads, o.checkpoint_keep, o.rejoin_timeout_ms = blas_threads, checkpoint_keep, rejoin_timeout_ms
        o.threads = threads  # compute threads (pool and BLAS); 0: the config's, PIPPIN_THREADS or the default
        self._opts = o
        w = c_void_p()
        if isinstance(config, Config):
            self.config = config
            check(lib.pp_worker_open_config(config._c, byref(o), byref(w)))
        else:
            self.config = None
            check(lib.pp_worker_open(enc(os.fspath(config)), byref(o), byref(w)))
        self._w = w

    def _on_progress(self, p, user):
        p = p.contents
        try:
            self._user_progress(Progress(p.rank, p.step, p.steps, p.loss if p.has_loss else None, p.step_ms))
        except BaseException as e:  # noqa: B902 - handed to run()/step(), which raise it
            if self._error is None:
                self._error = e
            lib.pp_worker_stop(self._w)

    @property
    def _ptr(self):
        if not self._w:
            raise PippinError(-10, "the worker is closed", "wrong state")
        return self._w

    def _raise_callback_error(self):
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def step(self):
        """Runs the next step (every rank together); True when the run is done."""
        done = c_int()
        st = lib.pp_worker_step(self._ptr, byref(done))
        self._raise_callback_error()
        check(st)
        return bool(done.value)

    def run(self):
        """Runs the remaining steps (or until some rank's stop())."""
        st = lib.pp_worker_run(self._ptr)
        self._raise_callback_error()
        check(st)

    def stop(self):
        """Asks the run to stop after the step in progress (any thread)."""
        lib.pp_worker_stop(self._ptr)

    @property
    def stopped(self):
        return bool(lib.pp_worker_stopped(self._ptr))

    def checkpoint(self, directory):
        """A checkpoint of the last finished step (collective: every rank calls it)."""
        check(lib.pp_worker_checkpoint(self._ptr, enc(directory)))

    rank = property(lambda self: lib.pp_worker_rank(self._ptr))
    next_step = property(lambda self: lib.pp_worker_next_step(self._ptr))
    steps = property(lambda self: lib.pp_worker_steps(self._ptr))
    rejoins = property(lambda self: lib.pp_worker_rejoins(self._ptr))
    endpoint = property(lambda self: _str(lib.pp_worker_endpoint(self._ptr)))

    @property
    def stages(self):
        """The global indices of this rank's stages."""
        return [lib.pp_worker_stage_index(self._ptr, i) for i in range(lib.pp_worker_n_stages(self._ptr))]

    def close(self):
        """Closes the transport (peers see a goodbye) and frees the worker."""
        if self._w:
            lib.pp_worker_close(self._w)
            self._w = None


class Ranks:
    """Every rank of a config (or the given ones) as Workers on threads of
    this process, started at once; endpoints may be inproc://, ipc:// or
    loopback tcp://. options go to Worker (checkpoint_dir, resume, ...).
    wait() joins them; stop() asks them to stop after the step in progress
    (a service: mode serve runs until then). As a context manager, leaving
    the block stops what still runs, waits and closes.

        with pippin.Ranks("examples/gpt/serve.yaml") as service:
            print(pippin.Client(service.config.serve_endpoint).stats())
    """

    def __init__(self, config, ranks=None, progress=None, **options):
        self.config = config if isinstance(config, Config) else Config(config)
        ranks = list(range(len(self.config.ranks))) if ranks is None else list(ranks)
        self._losses, self._lock, self._progress = {}, threading.Lock(), progress
        self.workers, self.errors, self._threads = [], {}, []
        try:
            for r in ranks:  # opened in order: the transports connect lazily
                self.workers.append(Worker(self.config, rank=r, progress=self._on_step, **options))
        except BaseException:
            self.close()
            raise
        for w, r in zip(self.workers, ranks):
            t = threading.Thread(target=self._body, args=(w, r), name="pippin-rank-%d" % r, daemon=True)
            t.start()
            self._threads.append(t)

    def _on_step(self, p):
        if p.loss is not None:
            with self._lock:
                self._losses[p.step] = p.loss
        if self._progress is not None:
            self._progress(p)

    def _body(self, w, r):
        try:
            w.run()
        except BaseException as e:  # noqa: B902 - raised by wait() on the caller's thread
            self.errors[r] = e

    @property
    def losses(self):
        """The losses so far, by step (of the rank that computes the loss)."""
        with self._lock:
            return [self._losses[s] for s in sorted(self._losses)]

    def stop(self):
        for w in self.workers:
            if w._w:
                w.stop()

    def wait(self):
        """Joins every rank (Ctrl-C stops them all first); raises the first
        rank's own failure; returns the losses."""
        try:
            for t in self._threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            self.stop()
            for t in self._threads:
                t.join()
            raise
        if self.errors:  # a rank's own failure rather than its peers' "peer failed"
            own = [r for r in sorted(self.errors) if getattr(self.errors[r], "status", None) != PEER]
            raise self.errors[(own or sorted(self.errors))[0]]
        return self.losses

    def close(self):
        for w in self.workers:
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.stop()
            if exc[0] is None:
                self.wait()
            else:
                for t in self._threads:
                    t.join()
        finally:
            self.close()


def run_ranks(config, ranks=None, progress=None, **options):
    """Runs every rank of a config (or the given ones) as workers on threads
    of this process until they finish (Ranks, then wait); Ctrl-C stops them
    all after the step in progress. Returns the losses per step."""
    r = Ranks(config, ranks, progress, **options)
    try:
        return r.wait()
    finally:
        r.close()
