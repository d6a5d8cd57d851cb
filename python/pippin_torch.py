"""pippin_torch: PyTorch (1.13) side of pippin.

Provides

* ``pipe_split(x)``   -- the custom op ``pippin::pipe_split(Tensor) -> Tensor``.
  In eager mode it is the identity (it returns a copy of ``x``; gradients pass
  through unchanged).  When a model is exported to ONNX it becomes one node
  ``PipeSplit`` in domain ``pippin`` with one input and one output; its place
  in the graph's topological order is a stage boundary for pippin.
* ``register_onnx()`` -- registers the ONNX symbolic for the op (called by
  ``export`` automatically; call it yourself if you use torch.onnx.export).
* ``export(model, args, path, ...)`` -- torch.onnx.export with the settings
  pippin expects: opset 17 (the highest PyTorch 1.13 writes), TRAINING mode
  (so equal-valued parameters are not merged into Identity nodes and
  parameters stay initializers named after their torch names), no constant
  folding, and ``custom_opsets={"pippin": 1}``.  It records which
  initializers are trainable (the model's parameters with requires_grad) in
  the metadata ``pippin.trainable``; pippin trains exactly those and keeps
  every other initializer (buffers such as causal masks, frozen parameters)
  constant.
* ``export_decoder(model, idx, past, path, n_layers, ...)`` -- ``export`` for
  a causal language model with a KV cache, under the names the serving
  layer (and HF/optimum) use.  ``model(idx, *past_flat)`` must return
  ``(logits, *presents_flat)``; ``past_flat`` is ``[k0, v0, k1, v1, ...]``,
  each ``[batch, heads, past, head_dim]``, and the presents are the
  concatenated caches ``[batch, heads, past + seq, head_dim]``.  ONNX
  inputs ``idx``, ``past_key_values.{i}.key``, ``past_key_values.{i}.value``;
  outputs ``logits``, ``present.{i}.key``, ``present.{i}.value``; dynamic
  axes ``batch``, ``seq``, ``past`` and ``total``.  Trace it with a past
  length > 0 (a 0-sized example dim would be specialised away); the graph
  then runs with an empty past too (``[batch, heads, 0, head_dim]``, the
  first step of a generation).  ``pipe_split`` markers in the model are
  kept as usual.

Usage::

    import pippin_torch as pp
    class Net(nn.Module):
        def forward(self, x):
            h = self.stage0(x)
            h = pp.pipe_split(h)       # cut here
            return self.stage1(h)
    pp.export(Net(), (x,), "model.onnx", input_names=["x"],
              output_names=["y"], dynamic_axes={"x": {0: "batch"}})
"""

import os
import warnings

import torch

__all__ = ["pipe_split", "register_onnx", "export", "export_decoder",
           "decoder_io_names", "trainable_names", "OPSET", "DOMAIN",
           "TRAINABLE_KEY"]

OPSET = 17          # highest opset torch.onnx supports in PyTorch 1.13
DOMAIN = "pippin"
DOMAIN_VERSION = 1
TRAINABLE_KEY = "pippin.trainable"   # PP_ONNX_TRAINABLE_KEY in pippin/onnx.h

_lib = None
_onnx_registered = False


def _define_op():
    """Define pippin::pipe_split once per process."""
    global _lib
    if _lib is not None:
        return
    try:
        # Already defined (e.g. this module was loaded twice under two names).
        torch.ops.pippin.pipe_split
        return
    except (AttributeError, RuntimeError):
        pass
    _lib = torch.library.Library("pippin", "DEF")
    _lib.define("pipe_split(Tensor x) -> Tensor")
    # CompositeImplicitAutograd: autograd differentiates through clone()
    # (identity gradient), and the JIT tracer (which sits above autograd in
    # the dispatcher) records a single pippin::pipe_split node, which the
    # symbolic below turns into pippin::PipeSplit.  clone() rather than
    # returning x itself because the schema declares no aliasing.
    _lib.impl("pipe_split", lambda x: x.clone(), "CompositeImplicitAutograd")


_define_op()


def pipe_split(x):
    """Pipeline stage boundary marker: identity on ``x``."""
    return torch.ops.pippin.pipe_split(x)


def _pipe_split_symbolic(g, x):
    out = g.op(DOMAIN + "::PipeSplit", x)
    out.setType(x.type())   # same dtype; torch knows no shape here anyway
    return out


def _mse_loss_symbolic(g, input, target, reduction):
    # PyTorch 1.13 has no ONNX export for aten::mse_loss; write it as
    # Sub, Mul, ReduceMean/ReduceSum (no Pow, so the backward stays simple).
    from torch.onnx import symbolic_helper as sh
    red = sh._maybe_get_const(reduction, "i")
    d = g.op("Sub", input, target)
    sq = g.op("Mul", d, d)
    if red == 0:                                  # 'none'
        return sq
    if red == 1:                                  # 'mean'
        return g.op("ReduceMean", sq, keepdims_i=0)
    if red == 2:                                  # 'sum'
        return g.op("ReduceSum", sq, keepdims_i=0)
    return sh._unimplemented("mse_loss", "reduction %r" % (red,))


def register_onnx():
    """Register pippin's ONNX symbolics (idempotent): pippin::pipe_split,
    and aten::mse_loss (missing from PyTorch 1.13's exporter)."""
    global _onnx_registered
    if _onnx_registered:
        return
    torch.onnx.register_custom_op_symbolic(
        "pippin::pipe_split", _pipe_split_symbolic, 1)
    torch.onnx.register_custom_op_symbolic(
        "::mse_loss", _mse_loss_symbolic, 9)
    _onnx_registered = True


def export(model, args, path, input_names=None, output_names=None,
           dynamic_axes=None, opset_version=OPSET, verbose=False):
    """Export ``model`` to ONNX at ``path`` the way pippin wants it.

    ``args`` is a tuple of example inputs (or a single tensor).  Parameters
    become initializers named by their torch names (``blocks.0.ln_1.weight``);
    buffers become initializers too.  The names of the trainable ones
    (``trainable_names(model)``) are written to the model's metadata
    ``pippin.trainable`` as a JSON list.  The model is put back in the
    training state it had before the call, and its buffers keep (and the file
    holds) their values from before the call: tracing in training mode runs
    the model once, which would move BatchNorm's running statistics.
    """
    register_onnx()
    was_training = model.training
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    model.train()
    try:
        with warnings.catch_warnings():
            # PyTorch cannot infer shapes through a custom-domain op and says
            # so once per PipeSplit; _fix_shapes() below repairs the result.
            warnings.filterwarnings(
                "ignore", message=".*shape inference of pippin::PipeSplit.*")
            torch.onnx.export(
                model, args, path,
                export_params=True,
                verbose=verbose,
                training=torch.onnx.TrainingMode.TRAINING,
                input_names=list(input_names) if input_names else None,
                output_names=list(output_names) if output_names else None,
                opset_version=opset_version,
                do_constant_folding=False,
                dynamic_axes=dynamic_axes,
                keep_initializers_as_inputs=False,
                custom_opsets={DOMAIN: DOMAIN_VERSION},
            )
    finally:
        model.train(was_training)
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
    if isinstance(path, (str, os.PathLike)):
        _fix_shapes(os.fspath(path))
        _record_trainable(os.fspath(path), trainable_names(model), buffers)
        add_marker_function(os.fspath(path))
    return path


def marker_function(opset_version=OPSET):
    """The FunctionProto that defines ``pippin.PipeSplit`` as Identity, so
    ONNX Runtime, onnx.checker and other tools load and run a model with
    markers unchanged (ONNX IR 8 model-local functions)."""
    from onnx import helper
    return helper.make_function(
        DOMAIN, "PipeSplit", ["x"], ["y"],
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_opsetid("", opset_version)],
        doc_string="pippin pipeline stage boundary: the identity")


def add_marker_function(path):
    """Adds the PipeSplit function (marker_function) to the model at
    ``path`` when it has markers and no definition yet; raises the IR
    version to 8 (functions) if it is below.  Idempotent."""
    import onnx
    m = onnx.load(path)
    if not any(n.domain == DOMAIN and n.op_type == "PipeSplit"
               for n in m.graph.node):
        return
    if any(f.domain == DOMAIN and f.name == "PipeSplit" for f in m.functions):
        return
    opset = max([o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] or [OPSET])
    m.functions.append(marker_function(opset))
    if m.ir_version < 8:
        m.ir_version = 8
    if not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    onnx.save(m, path)


def decoder_io_names(n_layers):
    """(input_names, output_names) of a decoder export with ``n_layers``
    layers of KV cache: ``idx``, ``past_key_values.{i}.key``,
    ``past_key_values.{i}.value`` / ``logits``, ``present.{i}.key``,
    ``present.{i}.value``, in the order of ``model(idx, *past_flat)`` and
    its results."""
    ins, outs = ["idx"], ["logits"]
    for i in range(n_layers):
        ins += ["past_key_values.%d.key" % i, "past_key_values.%d.value" % i]
        outs += ["present.%d.key" % i, "present.%d.value" % i]
    return ins, outs


def _flatten_past(past, n_layers):
    flat = []
    for p in past:
        if isinstance(p, (tuple, list)):
            flat.extend(p)
        else:
            flat.append(p)
    if len(flat) != 2 * n_layers:
        raise ValueError("export_decoder: %d past tensors for %d layers "
                         "(want 2 per layer: key, value)" % (len(flat),
                                                              n_layers))
    for t in flat:
        if not torch.is_tensor(t) or t.dim() != 4:
            raise ValueError("export_decoder: each past tensor must be "
                             "[batch, heads, past, head_dim]")
        if t.size(2) == 0:
            raise ValueError("export_decoder: trace with a past length > 0 "
                             "(an empty example past makes the tracer fix "
                             "the past dim at 0)")
    return flat


def export_decoder(model, idx, past, path, n_layers, opset_version=OPSET,
                   verbose=False, extra_dynamic_axes=None):
    """Export a causal LM with a KV cache (see the module docstring).

    ``model(idx, *past_flat)`` returns ``(logits, *presents_flat)``.
    ``idx`` is an int64 ``[batch, seq]`` example; ``past`` is either the flat
    list ``[k0, v0, k1, v1, ...]`` or ``n_layers`` (key, value) pairs, each
    ``[batch, heads, past, head_dim]`` with past > 0.  Returns ``path``.
    The usual ``export`` settings apply (opset 17, TRAINING mode so the
    initializers keep their torch names, metadata ``pippin.trainable``,
    PipeSplit markers).  ``extra_dynamic_axes`` is merged into the dynamic
    axes written for the decoder names.
    """
    flat = _flatten_past(past, n_layers)
    ins, outs = decoder_io_names(n_layers)
    dyn = {"idx": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    for n in ins[1:]:
        dyn[n] = {0: "batch", 2: "past"}
    for n in outs[1:]:
        dyn[n] = {0: "batch", 2: "total"}
    if extra_dynamic_axes:
        dyn.update(extra_dynamic_axes)
    export(model, (idx, *flat), path, input_names=ins, output_names=outs,
           dynamic_axes=dyn, opset_version=opset_version, verbose=verbose)
    if isinstance(path, (str, os.PathLike)):
        _fix_present_shapes(os.fspath(path), n_layers)
    return path


def _fix_present_shapes(path, n_layers):
    """present.{i}.* has the shape of past_key_values.{i}.* with dim 2
    'total'.  ONNX shape inference cannot follow the key/value reshapes
    behind a PipeSplit (their shapes are computed), so without this the
    presents of later stages keep PyTorch's made-up dim names."""
    import onnx
    m = onnx.load(path)
    ins = {i.name: i for i in m.graph.input}
    changed = False
    for o in m.graph.output:
        if not o.name.startswith("present."):
            continue
        src = ins.get("past_key_values." + o.name[len("present."):])
        if src is None or len(_dims(src)) != 4:
            continue
        o.type.CopyFrom(src.type)
        d = _dims(o)[2]
        d.Clear()
        d.dim_param = "total"
        changed = True
    if changed:
        onnx.save(m, path)


def trainable_names(model):
    """Every name under which a parameter with requires_grad is reachable
    (a tied parameter has several; the exporter keeps one of them)."""
    names = []
    for mod_name, mod in model.named_modules(prefix=""):
        for pn, p in mod._parameters.items():
            if p is not None and p.requires_grad:
                names.append(mod_name + "." + pn if mod_name else pn)
    return sorted(set(names))


def _record_trainable(path, names, buffers=None):
    """Writes the trainable names to the metadata, and the buffers' values
    from before the export into their initializers."""
    import json
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    inits = {i.name for i in m.graph.initializer}
    for i, init in enumerate(m.graph.initializer):
        if buffers and init.name in buffers:
            m.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(buffers[init.name].cpu().numpy(), init.name))
    for e in list(m.metadata_props):
        if e.key == TRAINABLE_KEY:
            m.metadata_props.remove(e)
    e = m.metadata_props.add()
    e.key = TRAINABLE_KEY
    e.value = json.dumps([n for n in names if n in inits])
    onnx.save(m, path)


def _dims(vi):
    return vi.type.tensor_type.shape.dim


def _fix_shapes(path):
    """Repair the shapes PyTorch writes downstream of PipeSplit.

    torch.onnx cannot see through a custom-domain op, so every PipeSplit
    output and every graph output after one gets made-up dims
    ('Gemmlogits_dim_1' where 10 is meant).  Re-infer them with ONNX's shape
    inference with PipeSplit read as Identity, keep the dynamic-axis names
    PyTorch wrote for the graph outputs, and write the PipeSplit outputs'
    value_info.  Leaves the file alone if anything goes wrong.
    """
    import copy
    import onnx
    try:
        m = onnx.load(path)
        t = copy.deepcopy(m)
        for n in t.graph.node:
            if n.domain == DOMAIN and n.op_type == "PipeSplit":
                n.domain, n.op_type = "", "Identity"
        del t.graph.value_info[:]
        for o in t.graph.output:
            o.type.tensor_type.ClearField("shape")
        t = onnx.shape_inference.infer_shapes(t, strict_mode=False,
                                              data_prop=True)
    except Exception as e:   # pragma: no cover - best effort only
        warnings.warn("pippin_torch: shape repair skipped: %s" % e)
        return
    dyn = {d.dim_param for i in m.graph.input for d in _dims(i)
           if d.HasField("dim_param")}
    rename = {}
    for o, io in zip(m.graph.output, t.graph.output):
        if not io.type.tensor_type.HasField("shape"):
            continue
        od, nd = list(_dims(o)), list(_dims(io))
        if od and len(od) != len(nd):
            continue
        for i, d in enumerate(nd):
            if d.HasField("dim_param") and od and od[i].dim_param in dyn:
                rename[d.dim_param] = od[i].dim_param
        o.type.CopyFrom(io.type)
    split_outs = {n.output[0] for n in m.graph.node
                  if n.domain == DOMAIN and n.op_type == "PipeSplit"}
    del m.graph.value_info[:]
    for v in t.graph.value_info:
        if v.name in split_outs:
            m.graph.value_info.append(v)
    for v in list(m.graph.value_info) + list(m.graph.output):
        for d in _dims(v):
            if d.HasField("dim_param") and d.dim_param in rename:
                d.dim_param = rename[d.dim_param]
    onnx.save(m, path)
