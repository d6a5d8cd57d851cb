#!/usr/bin/python3
"""Small ONNX models, one per pippin::MatMulAdd form the optimizer's matmul
pass makes (lib/opt_matmul.c), for ort_optimized.sh.

Each case OUT/<name>/ holds model.onnx, its inputs (x.npy, and r.npy for
the residual cases), inputs.txt (their names) and expect.txt: the
MatMulAdd the optimized graph must hold, as "attr=value" words
(activation, n_in: its input count, n_out, packed: 1 if packed_n is set,
trans_b). The optimized graph is exported with its function bodies and
ONNX Runtime runs them; pippin runs the fused kernel. Needs onnx and
numpy only.

    /usr/bin/python3 test/tools/ort_matmul_forms.py OUT
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(20)
K = 24
LEAD = [2, 3]


def f32(*shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


class Case:
    def __init__(self, name):
        self.name = name
        self.nodes = []
        self.inits = []
        self.inputs = [('x', LEAD + [K])]
        self.outputs = []
        self.k = 0

    def const(self, v):
        """A scalar Constant node (what the gelu pass matches)."""
        self.k += 1
        name = 'k%d' % self.k
        self.nodes.append(helper.make_node('Constant', [], [name],
                                           value=numpy_helper.from_array(np.array(v, np.float32), name)))
        return name

    def init(self, name, arr):
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op, ins, out, **attrs):
        self.nodes.append(helper.make_node(op, ins, [out] if isinstance(out, str) else out, **attrs))
        return out

    def linear(self, x, n, bias=True, transposed=True):
        """x @ W^T (+ b), as torch exports nn.Linear; or x @ W."""
        if transposed:
            w = self.init('W', f32(n, K))
            wt = self.node('Transpose', [w], 'Wt', perm=[1, 0])
        else:
            wt = self.init('W', f32(K, n))
        y = self.node('MatMul', [x, wt], 'mm')
        if bias:
            y = self.node('Add', [y, self.init('b', f32(n))], 'biased')
        return y

    def gelu(self, x, tanh):
        """PyTorch 1.13's decomposition (opset 17 has no Gelu)."""
        if tanh:
            xx = self.node('Mul', [x, x], 'g_xx')
            x3 = self.node('Mul', [xx, x], 'g_x3')
            c = self.node('Mul', [x3, self.const(0.044715)], 'g_c')
            s = self.node('Add', [x, c], 'g_s')
            u = self.node('Mul', [s, self.const(0.7978845608028654)], 'g_u')
            f = self.node('Tanh', [u], 'g_f')
        else:
            d = self.node('Div', [x, self.const(1.4142135623730951)], 'g_d')
            f = self.node('Erf', [d], 'g_f')
        a1 = self.node('Add', [f, self.const(1.0)], 'g_a1')
        m = self.node('Mul', [x, a1], 'g_m')
        return self.node('Mul', [m, self.const(0.5)], 'g_y')

    def residual(self, y, shape):
        self.inputs.append(('r', shape))
        return self.node('Add', [y, 'r'], 'res')

    def save(self, out, expect, opset=17):
        outs = self.outputs or ['y']
        g = helper.make_graph(self.nodes, self.name,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in self.inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid('', opset)])
        m.ir_version = 8
        # the outputs' shapes as inference gives them (onnx.checker wants one):
        # as values a probe node reads
        probe = onnx.ModelProto()
        probe.CopyFrom(m)
        probe.graph.node.extend([helper.make_node('Identity', [o], [o + '_probe']) for o in outs])
        del probe.graph.output[:]
        probe.graph.output.extend([helper.make_tensor_value_info(o + '_probe', TensorProto.FLOAT, None)
                                   for o in outs])
        typed = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
        for o in m.graph.output:
            o.CopyFrom(typed[o.name])
        d = os.path.join(out, self.name)
        os.makedirs(d, exist_ok=True)
        onnx.save(m, os.path.join(d, 'model.onnx'))
        for n, s in self.inputs:
            np.save(os.path.join(d, n + '.npy'), f32(*s))
        with open(os.path.join(d, 'inputs.txt'), 'w') as f:
            f.write(' '.join(n for n, _ in self.inputs) + '\n')
        with open(os.path.join(d, 'expect.txt'), 'w') as f:
            f.write(expect + '\n')


def main(out):
    N = 40
    for act in ('relu', 'gelu', 'gelu_tanh'):
        c = Case(act)
        y = c.linear('x', N)
        y = c.node('Relu', [y], 'y') if act == 'relu' else c.gelu(y, act == 'gelu_tanh')
        c.outputs = [y]
        c.save(out, 'activation=%s n_in=3 n_out=1 packed=1' % act)
    # without a bias: written with zeros for it
    c = Case('relu_nobias')
    c.outputs = [c.node('Relu', [c.linear('x', N, bias=False)], 'y')]
    c.save(out, 'activation=relu n_in=2 n_out=1 packed=1')
    # W as is (no transpose): not packed
    c = Case('gelu_plain')
    c.outputs = [c.gelu(c.linear('x', N, transposed=False), False)]
    c.save(out, 'activation=gelu n_in=3 n_out=1 packed=0 trans_b=0')
    # the residual, added after the bias; after the activation
    c = Case('residual')
    c.outputs = [c.residual(c.linear('x', N), LEAD + [N])]
    c.save(out, 'activation= n_in=4 n_out=1 packed=1')
    c = Case('residual_nobias')
    c.outputs = [c.residual(c.linear('x', N, bias=False), LEAD + [N])]
    c.save(out, 'activation= n_in=4 n_out=1 packed=1 bias=absent')
    c = Case('residual_broadcast')
    c.outputs = [c.residual(c.linear('x', N), [1, N])]
    c.save(out, 'activation= n_in=4 n_out=1 packed=1')
    for act in ('relu', 'gelu', 'gelu_tanh'):
        c = Case('%s_residual' % act)
        y = c.linear('x', N)
        y = c.node('Relu', [y], 'act') if act == 'relu' else c.gelu(y, act == 'gelu_tanh')
        c.outputs = [c.residual(y, LEAD + [N])]
        c.save(out, 'activation=%s n_in=4 n_out=1 packed=1' % act)
    # the Split taken in: at panel multiples (tiles stored in the parts)
    # and not (the Split kernel's cut), by an input and by the attribute
    for name, sizes, axis, opset in (('split_panels', [16, 32, 16], -1, 17), ('split_cut', [5, 20, 15], 2, 17),
                                     ('split_rows', [1, 2], 1, 17)):
        n = sum(sizes) if axis != 1 else N
        c = Case(name)
        y = c.linear('x', n)
        c.outputs = ['y%d' % k for k in range(len(sizes))]
        c.node('Split', [y, c.init('sizes', np.array(sizes, np.int64))], c.outputs, axis=axis)
        c.save(out, 'activation= n_in=3 n_out=%d packed=1' % len(sizes), opset)
    c = Case('split_nobias')
    y = c.linear('x', 48, bias=False)
    c.outputs = ['y0', 'y1']
    c.node('Split', [y, c.init('sizes', np.array([32, 16], np.int64))], c.outputs, axis=-1)
    c.save(out, 'activation= n_in=2 n_out=2 packed=1')
    # Gemm(x, W, b) then Relu: the Gemm's transB kept, not packed
    c = Case('gemm_relu')
    c.inputs = [('x', [5, K])]
    g = c.node('Gemm', ['x', c.init('W', f32(N, K)), c.init('b', f32(N))], 'gemm', transB=1)
    c.outputs = [c.node('Relu', [g], 'y')]
    c.save(out, 'activation=relu n_in=3 n_out=1 packed=0 trans_b=1')
    c = Case('gemm_gelu_tanh')
    c.inputs = [('x', [5, K])]
    g = c.node('Gemm', ['x', c.init('W', f32(K, N))], 'gemm')
    c.outputs = [c.gelu(g, True)]
    c.save(out, 'activation=gelu_tanh n_in=2 n_out=1 packed=0 trans_b=0')


if __name__ == '__main__':
    main(sys.argv[1])
