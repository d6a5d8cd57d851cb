"""Models, pipes and training in one process: pippin/onnx.h, exec.h, pipe.h,
schedule.h, runner.h, trainer.h and optim.h.

    g = pippin.load("model.onnx")             # Graph
    out = g.run({"x": x})                      # {name: ndarray}
    pipe = g.split(before=["/fc2/"])          # Pipe: stages, edges
    r = pippin.Runner(pipe, optimizer="adamw", lr=0.01)
    out = r.train_step({"x": x, "y": y}, microbatches=2, schedule="1f1b")
"""
import ctypes
from collections import namedtuple
from ctypes import byref, c_float, c_int, c_int64, c_void_p

import numpy as np

from . import _tensor
from ._lib import Closing, GraphP, OptimConfig, PipeP, PippinError, SplitSpec, check, enc, lib, libc, strings
from ._lib import Schedule as _Schedule

ValueInfo = namedtuple("ValueInfo", "name dtype shape")
ValueInfo.__doc__ = """A graph input or output: dtype a numpy dtype (None when unknown or
bfloat16), shape a tuple whose dynamic dims are their names (str) or None,
or None when even the rank is unknown."""
NodeInfo = namedtuple("NodeInfo", "name op_type domain")
Edge = namedtuple("Edge", "value producer consumers dtype dims bytes_per_sample")
Edge.__doc__ = """A value crossing stages: producer -1 for a model input; dims the
symbolic dims ("batch", "4") after Pipe.probe_shapes, else None."""
StageInfo = namedtuple("StageInfo", "index inputs outputs params has_loss")

PARAM, CONST = 1, 2
_TRAINED = "trainer"  # Graph._owner of a graph a Trainer took over


def _str(b):
    return None if b is None else b.decode(errors="replace")


def optim_config(optimizer="adamw", lr=None, weight_decay=None, betas=None, eps=None, momentum=None,
                 dampening=None, nesterov=None, maximize=None):
    """A pp_optim_config: torch's defaults for the kind ("adamw" or "sgd"),
    then the settings given."""
    kind = c_int()
    check(lib.pp_optim_kind_parse(enc(optimizer), byref(kind)))
    c = OptimConfig()
    lib.pp_optim_config_init(byref(c), kind.value)
    for k, v in (("lr", lr), ("weight_decay", weight_decay), ("eps", eps), ("momentum", momentum),
                 ("dampening", dampening), ("nesterov", nesterov), ("maximize", maximize)):
        if v is not None:
            setattr(c, k, type(getattr(c, k))(v))
    if betas is not None:
        c.beta1, c.beta2 = betas
    return c


def _value_info(v):
    dt = _tensor.numpy_dtype(v.dtype)
    if v.ndim < 0:
        return ValueInfo(_str(v.name), dt, None)
    shape = tuple(int(v.shape[d]) if v.shape[d] >= 0 else _str(v.dim_names[d]) for d in range(v.ndim))
    return ValueInfo(_str(v.name), dt, shape)


class Graph(Closing):
    """A model (pp_graph): what pippin.load returns, or a stage of a Pipe
    (then borrowed: it lives as long as the pipe)."""

    def __init__(self, ptr, owner=None, index=-1):
        self._g = ptr
        self._owner = owner  # a Pipe for its stage graph `index` (borrowed); _TRAINED once a Trainer took it
        self._index = index
        self._exec = None

    @property
    def _ptr(self):
        if not self._g:
            raise PippinError(-10, "the graph is closed", "wrong state")
        if isinstance(self._owner, Pipe):  # borrowed: still the pipe's?
            stages = self._owner._ptr.contents.stages
            if ctypes.cast(stages[self._index], c_void_p).value != ctypes.cast(self._g, c_void_p).value:
                raise PippinError(-10, "stage graph %d went to a Runner" % self._index, "wrong state")
        return self._g

    def close(self):
        if self._exec:
            lib.pp_exec_free(self._exec)
            self._exec = None
        if self._g and self._owner is None:
            lib.pp_graph_free(self._g)
        self._g = None

    # ---- inspecting ----
    @property
    def name(self):
        return _str(self._ptr.contents.name)

    @property
    def opset(self):
        return self._ptr.contents.opset

    def _values(self, ids, n):
        g = self._ptr.contents
        return [_value_info(g.values[ids[i]]) for i in range(n)]

    @property
    def inputs(self):
        """The inputs fed at run time, in order (ValueInfo)."""
        g = self._ptr.contents
        return self._values(g.inputs, g.n_inputs)

    @property
    def outputs(self):
        g = self._ptr.contents
        return self._values(g.outputs, g.n_outputs)

    @property
    def nodes(self):
        g = self._ptr.contents
        return [NodeInfo(_str(n.name), _str(n.op_type), _str(n.domain))
                for n in (g.nodes[i] for i in range(g.n_nodes))]

    def _kind_names(self, kind):
        g = self._ptr.contents
        return [_str(g.values[i].name) for i in range(g.n_values) if g.values[i].kind == kind]

    @property
    def param_names(self):
        """The trainable parameters, in graph order."""
        return self._kind_names(PARAM)

    @property
    def constant_names(self):
        return [n for n in self._kind_names(CONST) if self._ptr.contents.values[self._find(n)].data]

    def _find(self, name):
        v = lib.pp_graph_find_value(self._ptr, enc(name))
        if v < 0:
            raise KeyError("no value '%s' in the graph" % name)
        return v

    def initializer(self, name):
        """A copy of a parameter's or constant's value."""
        t = self._ptr.contents.values[self._find(name)].data
        if not t:
            raise KeyError("'%s' holds no data (not a parameter or constant)" % name)
        return _tensor.borrowed_to_numpy(t)

    def parameters(self):
        """{name: copy of the value} of every trainable parameter."""
        return {n: self.initializer(n) for n in self.param_names}

    def param_stats(self):
        """(count of parameter elements, bytes)."""
        n, b = c_int64(), c_int64()
        lib.pp_graph_param_stats(self._ptr, byref(n), byref(b))
        return n.value, b.value

    def freeze(self, pattern):
        """Makes the parameters matching the shell pattern constants; how many."""
        self._mutating()
        return lib.pp_graph_freeze(self._ptr, enc(pattern))

    def save(self, path):
        """Writes the graph as an ONNX model (pp_onnx_save)."""
        check(lib.pp_onnx_save(self._ptr, enc(path)))

    def _mutating(self):
        if self._owner is _TRAINED:
            raise PippinError(-10, "the graph belongs to a Trainer now", "wrong state")
        if self._exec:
            lib.pp_exec_free(self._exec)
            self._exec = None

    # ---- running ----
    def _feeds(self, inputs):
        ins = self.inputs
        if isinstance(inputs, dict):
            missing = [i.name for i in ins if i.name not in inputs]
            extra = set(inputs) - {i.name for i in ins}
            if missing or extra:
                raise ValueError("inputs: missing %s, unknown %s (the model's: %s)"
                                 % (missing or "none", sorted(extra) or "none", [i.name for i in ins]))
            arrays = [inputs[i.name] for i in ins]
        elif isinstance(inputs, (list, tuple)):
            arrays = list(inputs)
        else:
            arrays = [inputs]
        if len(arrays) != len(ins):
            raise ValueError("%d inputs given, the model has %d" % (len(arrays), len(ins)))
        return arrays, [i.name for i in ins], [i.dtype for i in ins]

    def run(self, inputs, copy=None):
        """Runs the graph (pp_exec_run; the executor is kept for the next run):
        inputs a dict {name: array}, a list in input order, or one array.
        Returns {output name: ndarray}."""
        if self._owner is _TRAINED:
            raise PippinError(-10, "the graph belongs to a Trainer now (it holds the backward)", "wrong state")
        arrays, names, dtypes = self._feeds(inputs)
        if not self._exec:
            ex = c_void_p()
            check(lib.pp_exec_new(self._ptr, byref(ex)))
            self._exec = ex
        outs = self.outputs
        res = (_tensor.TensorP * max(len(outs), 1))()
        with _tensor.Inputs(arrays, names, dtypes) as ptrs:
            check(lib.pp_exec_run(self._exec, ptrs, res))
        return {o.name: _tensor.to_numpy(res[i], copy) for i, o in enumerate(outs)}

    __call__ = run

    def split(self, before=(), after=(), transmit_shared=False, ignore_markers=False, loss=None):
        """Cuts the model into stages (pp_pipe_split): at its PipeSplit
        markers, and before / after the nodes whose names start with the
        given prefixes. The graph is left as it is."""
        s = SplitSpec()
        lib.pp_split_spec_init(byref(s))
        b, kb = strings(before)
        a, ka = strings(after)
        s.n_before, s.before, s.n_after, s.after = len(before), b, len(after), a
        s.transmit_shared, s.ignore_markers = int(transmit_shared), int(ignore_markers)
        s.loss = enc(loss)
        p = PipeP()
        check(lib.pp_pipe_split(self._ptr, byref(s), byref(p)))
        return Pipe(p)

    def __repr__(self):
        return "<pippin.Graph %r: %d nodes, inputs %s, outputs %s>" % (
            self.name, len(self.nodes), [i.name for i in self.inputs], [o.name for o in self.outputs])


def load(path):
    """Loads an ONNX model (pp_onnx_load): a Graph."""
    g = GraphP()
    check(lib.pp_onnx_load(enc(path), byref(g)))
    return Graph(g)


def parse(data, name="model"):
    """The same from the bytes of a model (pp_onnx_parse)."""
    g = GraphP()
    check(lib.pp_onnx_parse(data, len(data), enc(name), byref(g)))
    return Graph(g)


class Pipe:
    """A model cut into stages (pp_pipe): Graph.split or load_pipe."""

    def __init__(self, ptr):
        self._p = ptr
        self._in_runner = False  # a Runner holds the stage graphs: freed after it

    @property
    def _ptr(self):
        if not self._p:
            raise PippinError(-10, "the pipe is closed", "wrong state")
        return self._p

    def close(self):
        if self._in_runner:
            raise PippinError(-10, "a Runner uses the pipe: close the Runner", "wrong state")
        if self._p:
            lib.pp_pipe_free(self._p)
        self._p = None

    def __del__(self):
        if not self._in_runner:
            self.close()

    @property
    def n_stages(self):
        return self._ptr.contents.n_stages

    def __len__(self):
        return self.n_stages

    @property
    def stages(self):
        """The stage graphs (borrowed Graph objects; None once a Runner took them)."""
        p = self._ptr.contents
        return [Graph(p.stages[k], owner=self, index=k) if p.stages[k] else None for k in range(p.n_stages)]

    @property
    def edges(self):
        p = self._ptr.contents
        out = []
        for e in (p.edges[i] for i in range(p.n_edges)):
            dims = None if e.ndim < 0 or not any(e.dims[:max(e.ndim, 0)]) else \
                tuple(_str(e.dims[d]) for d in range(e.ndim))
            out.append(Edge(_str(e.value), e.producer, [e.consumers[j] for j in range(e.n_consumers)],
                            _tensor.numpy_dtype(e.dtype), dims, e.bytes_per_sample))
        return out

    @property
    def shared(self):
        """{parameter name: [stages]} of the parameters replicated in several stages."""
        p = self._ptr.contents
        return {_str(s.name): [s.stages[j] for j in range(s.n_stages)]
                for s in (p.shared[i] for i in range(p.n_shared))}

    @property
    def outputs(self):
        """{model output: the stage computing it}."""
        p = self._ptr.contents
        return {_str(p.outputs[i]): p.output_stage[i] for i in range(p.n_outputs)}

    @property
    def loss(self):
        return _str(self._ptr.contents.loss)

    @property
    def loss_stage(self):
        return self._ptr.contents.loss_stage

    @property
    def cuts(self):
        """What made each cut (marker node name or prefix)."""
        p = self._ptr.contents
        return [_str(p.cut_names[i]) for i in range(p.n_stages - 1)] if p.cut_names else []

    def probe_shapes(self, **dims):
        """Fills the edges' dtypes and symbolic shapes by a run on small
        made-up inputs; dims sizes symbolic input dims (batch=4, seq=64)."""
        arr, keep = strings(["%s=%d" % (k, v) for k, v in dims.items()])
        check(lib.pp_pipe_probe_shapes(self._ptr, len(dims), arr if dims else None))
        return self

    def to_json(self):
        """The pipe.json text."""
        p = lib.pp_pipe_to_json(self._ptr)
        if not p:
            raise MemoryError("pp_pipe_to_json")
        try:
            return ctypes.string_at(p).decode()
        finally:
            libc.free(p)

    def save(self, directory):
        """Writes DIR/stage_K.onnx and DIR/pipe.json (what `pippin split` writes)."""
        check(lib.pp_pipe_save(self._ptr, enc(directory)))

    def __repr__(self):
        return "<pippin.Pipe: %d stages, loss %r>" % (self.n_stages, self.loss)


def load_pipe(directory):
    """A pipe saved by Pipe.save or `pippin split` (DIR/pipe.json)."""
    p = PipeP()
    check(lib.pp_pipe_load(enc(directory), byref(p)))
    return Pipe(p)


class Schedule:
    """A pipeline schedule as users name it (pp_schedule_from_spec): a kind
    ("gpipe", "1f1b", "zbv", ...) for n_stages stages and m microbatches,
    or "csv:FILE"."""

    def __init__(self, spec, n_stages, microbatches):
        s = ctypes.POINTER(_Schedule)()
        check(lib.pp_schedule_from_spec(enc(spec), n_stages, microbatches, byref(s)))
        self._s = s
        self.spec = spec

    @property
    def nranks(self):
        return self._s.contents.nranks

    @property
    def nstages(self):
        return self._s.contents.nstages

    @property
    def microbatches(self):
        return self._s.contents.nmb

    def table(self):
        """torch's grid: one row per step, one column per rank."""
        out = c_void_p()
        check(lib.pp_schedule_format_table(self._s, -1, byref(out)))
        try:
            return ctypes.string_at(out.value).decode()
        finally:
            libc.free(out.value)

    def __del__(self):
        if getattr(self, "_s", None):
            lib.pp_schedule_free(self._s)
            self._s = None


def _stage_info(st):
    return StageInfo(lib.pp_stage_index(st),
                     [_str(lib.pp_stage_input_name(st, i)) for i in range(lib.pp_stage_n_inputs(st))],
                     [_str(lib.pp_stage_output_name(st, i)) for i in range(lib.pp_stage_n_outputs(st))],
                     [_str(lib.pp_stage_param_name(st, i)) for i in range(lib.pp_stage_n_params(st))],
                     bool(lib.pp_stage_has_loss(st)))


class Runner(Closing):
    """Every stage of a pipe in this process (pp_runner): any schedule's
    action lists, activations and gradients routed in memory. Takes the
    pipe's stage graphs (the Pipe stays alive with the runner).
    optimizer: "adamw" or "sgd" with optim_config's settings, or None."""

    def __init__(self, pipe, training=True, optimizer=None, **optim):
        r = c_void_p()
        check(lib.pp_runner_new(pipe._ptr, int(training), byref(r)))
        self._r, self.pipe, self.training = r, pipe, training
        pipe._in_runner = True
        self._scheds = {}
        self.step_index = 0
        if optimizer:
            self.set_optimizer(optimizer, **optim)

    @property
    def _ptr(self):
        if not self._r:
            raise PippinError(-10, "the runner is closed", "wrong state")
        return self._r

    def close(self):
        if self._r:
            lib.pp_runner_free(self._r)
            self._r = None
            self.pipe._in_runner = False

    @property
    def n_stages(self):
        return lib.pp_runner_n_stages(self._ptr)

    def _stage(self, i):
        return lib.pp_runner_stage(self._ptr, i)

    @property
    def stages(self):
        """StageInfo (index, inputs, outputs, params, has_loss) per stage."""
        return [_stage_info(self._stage(i)) for i in range(self.n_stages)]

    @property
    def output_names(self):
        return [_str(lib.pp_runner_output_name(self._ptr, o)) for o in range(lib.pp_runner_n_outputs(self._ptr))]

    @property
    def loss_name(self):
        o = lib.pp_runner_loss_output(self._ptr)
        return None if o < 0 else self.output_names[o]

    def _schedule(self, schedule, m):
        if schedule is None or isinstance(schedule, Schedule):
            return schedule
        key = (schedule, m)
        if key not in self._scheds:
            self._scheds[key] = Schedule(schedule, self.n_stages, m)
        return self._scheds[key]

    def step(self, inputs, microbatches=1, schedule=None, copy=None):
        """One step over a batch ({name: array}, split along dim 0 into
        microbatches): forward (and, when training, backward: gradients
        accumulate). schedule: a Schedule, a spec ("1f1b", ...) or None
        (GPipe order). Returns {output: ndarray} merged over microbatches
        (the loss: their mean)."""
        names = list(inputs)
        arr, keep = strings(names)
        sched = self._schedule(schedule, microbatches)
        n_out = lib.pp_runner_n_outputs(self._ptr)
        res = (_tensor.TensorP * max(n_out, 1))()
        with _tensor.Inputs([inputs[n] for n in names], names) as ptrs:
            check(lib.pp_runner_step(self._ptr, microbatches, sched._s if sched else None, len(names), arr,
                                     ptrs, res))
        self.step_index += 1
        return {n: _tensor.to_numpy(res[o], copy) for o, n in enumerate(self.output_names)}

    def set_step(self, step):
        """The step index the next step runs as (Dropout's masks depend on it)."""
        lib.pp_runner_set_step(self._ptr, step)
        self.step_index = step

    def zero_grad(self):
        lib.pp_runner_zero_grad(self._ptr)

    def set_optimizer(self, optimizer="adamw", **settings):
        """One optimizer per stage (optim_config's arguments)."""
        c = optim_config(optimizer, **settings)
        check(lib.pp_runner_set_optimizer(self._ptr, byref(c)))

    def set_lr(self, lr):
        for i in range(self.n_stages):
            o = lib.pp_runner_optimizer(self._ptr, i)
            if o:
                lib.pp_optim_set_lr(o, lr)

    def optimizer_step(self):
        check(lib.pp_runner_optimizer_step(self._ptr))

    def train_step(self, inputs, microbatches=1, schedule=None):
        """zero_grad, step, optimizer_step: one training step; the outputs."""
        self.zero_grad()
        out = self.step(inputs, microbatches, schedule)
        self.optimizer_step()
        return out

    def param(self, name):
        """A copy of a parameter's value (from its first stage)."""
        t = _tensor.TensorP()
        check(lib.pp_runner_param(self._ptr, enc(name), byref(t)))
        return _tensor.to_numpy(t)

    def grad(self, name):
        """A copy of a parameter's gradient, or None when no stage trains it."""
        t = _tensor.TensorP()
        check(lib.pp_runner_param_grad(self._ptr, enc(name), byref(t)))
        return _tensor.to_numpy(t)

    # ---- checkpoints (pippin/checkpoint.h) ----
    def save_checkpoint(self, directory, step=None):
        """Writes DIR/step_N/stage_K.safetensors for every stage and commits
        step N (default: the last step run)."""
        step = self.step_index - 1 if step is None else step
        for i in range(self.n_stages):
            check(lib.pp_checkpoint_save_stage(enc(directory), step, self._stage(i),
                                               lib.pp_runner_optimizer(self._ptr, i)))
        check(lib.pp_checkpoint_commit(enc(directory), step, self.n_stages))
        return step

    def load_checkpoint(self, directory, step=None):
        """Restores every stage (and its optimizer) from step N (default: the
        newest committed); the next step runs as N + 1. Returns N."""
        if step is None:
            s = c_int64()
            check(lib.pp_checkpoint_latest(enc(directory), byref(s)))
            step = s.value
        for i in range(self.n_stages):
            check(lib.pp_checkpoint_load_stage(enc(directory), step, self._stage(i),
                                               lib.pp_runner_optimizer(self._ptr, i)))
        self.set_step(step + 1)
        return step


class Trainer(Closing):
    """Training of a whole model in one graph (pp_trainer: autodiff, flat
    parameters, one executor). Takes the graph over (it gains the backward:
    Graph.run refuses it afterwards). params and grads are numpy views of
    the flat buffers, without a copy: they change as training runs, and
    writing a param sets it."""

    def __init__(self, graph, loss=None, optimizer="adamw", **optim):
        if isinstance(graph, (str, bytes)) or hasattr(graph, "__fspath__"):
            graph = load(graph)
        if graph._owner is not None:
            raise PippinError(-10, "the graph is a pipe's stage or another trainer's", "wrong state")
        self.graph = graph
        self.input_names = [i.name for i in graph.inputs]
        self._input_dtypes = [i.dtype for i in graph.inputs]
        graph._mutating()
        t = c_void_p()
        check(lib.pp_trainer_new(graph._ptr, enc(loss), byref(t)))
        self._t = t
        graph._owner = _TRAINED
        self._fp = lib.pp_trainer_params(t).contents
        self._opt = None
        self.step_index = 0
        self.params = self._views(self._fp.data)
        self.grads = self._views(self._fp.grad)
        if optimizer:
            self.set_optimizer(optimizer, **optim)

    def _views(self, base):
        fp = self._fp
        flat = np.ctypeslib.as_array(base, shape=(fp.total,))
        flat.flags.writeable = True
        out = {}
        for i in range(fp.n):
            shape = tuple(fp.shapes[i * 8 + d] for d in range(fp.ndims[i]))
            out[_str(fp.names[i])] = flat[fp.offset[i]:fp.offset[i] + fp.numel[i]].reshape(shape)
        return out

    def close(self):
        if getattr(self, "_opt", None):
            lib.pp_optim_free(self._opt)
            self._opt = None
        if getattr(self, "_t", None):
            lib.pp_trainer_free(self._t)
            self._t = None
            self.graph._owner = None
            self.graph.close()

    def set_optimizer(self, optimizer="adamw", **settings):
        c = optim_config(optimizer, **settings)
        o = c_void_p()
        check(lib.pp_optim_new(byref(c), self._fp.total, byref(o)))
        if self._opt:
            lib.pp_optim_free(self._opt)
        self._opt = o

    def set_lr(self, lr):
        lib.pp_optim_set_lr(self._opt, lr)

    def zero_grad(self):
        lib.pp_flat_params_zero_grad(ctypes.pointer(self._fp))

    def backward(self, inputs, loss_scale=1.0, microbatch=0):
        """Forward and backward on one (micro)batch ({name: array} or a list
        in input order); gradients are added to grads. Returns the loss."""
        arrays = [inputs[n] for n in self.input_names] if isinstance(inputs, dict) else list(inputs)
        if len(arrays) != len(self.input_names):
            raise ValueError("%d inputs given, the model has %d (%s)"
                             % (len(arrays), len(self.input_names), self.input_names))
        lib.pp_trainer_set_step(self._t, self.step_index, microbatch)
        loss = c_float()
        with _tensor.Inputs(arrays, self.input_names, self._input_dtypes) as ptrs:
            check(lib.pp_trainer_backward(self._t, ptrs, loss_scale, byref(loss)))
        return loss.value

    def optimizer_step(self):
        if not self._opt:
            raise PippinError(-10, "no optimizer (set_optimizer)", "wrong state")
        fp = self._fp
        check(lib.pp_flat_params_check_grads(byref(fp), b"trainer"))  # no step on a part sum
        check(lib.pp_optim_step(self._opt, fp.data, fp.grad, fp.total))
        self.step_index += 1

    def train_step(self, inputs, microbatches=1):
        """One training step: zero_grad, backward over the microbatches (the
        batch split along dim 0, as torch.tensor_split), optimizer_step.
        Returns the mean loss."""
        self.zero_grad()
        if isinstance(inputs, dict):
            inputs = [inputs[n] for n in self.input_names]
        parts = [np.array_split(np.asarray(a), microbatches) for a in inputs]
        lib.pp_trainer_hold_params(self._t, 1)  # unchanged until the update: weights packed once
        try:
            losses = [self.backward([p[m] for p in parts], 1.0 / microbatches, m) for m in range(microbatches)]
        finally:
            lib.pp_trainer_hold_params(self._t, 0)
        self.optimizer_step()
        return float(np.mean(losses))

    def save(self, directory):
        """Writes <name>.npy per parameter (what a config's params: loads)."""
        import os
        os.makedirs(directory, exist_ok=True)
        for n, a in self.params.items():
            np.save(os.path.join(directory, n + ".npy"), a)


def set_blas_threads(n):
    """The BLAS's own thread count (pp_set_blas_threads); False when the BLAS has none."""
    return bool(lib.pp_set_blas_threads(n))

