#!/usr/bin/python3
"""Small ONNX models, one per gradient helper geometry, for ort_train.sh.

Each case OUT/<name>/ holds model.onnx and x.npy: loss = sum(op(P + x) * C),
with P the trainable initializers (so the backward reaches every input and
parameter gradient helper of op) and C a fixed Constant (so dy is not
uniform). pippin and ONNX Runtime then run the model's training graph and
their gradients are compared. Needs onnx and numpy only.

    /usr/bin/python3 test/tools/ort_ops.py OUT
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(18)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def case(out, name, opset, x_shape, op_nodes, y_shape, params, consts=()):
    """op_nodes read 't' (P + x) and write 'y'; params: name -> array (the
    trainable initializers, 'P' among them); consts: name -> array (Constant
    nodes)."""
    nodes = [helper.make_node('Constant', [], [k], value=numpy_helper.from_array(v, k))
             for k, v in list(consts) + [('C', f32(*y_shape))]]
    nodes.append(helper.make_node('Add', ['P', 'x'], ['t']))
    nodes += op_nodes
    nodes += [helper.make_node('Mul', ['y', 'C'], ['yc']),
              helper.make_node('ReduceSum', ['yc'], ['loss'], keepdims=0)]
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info('x', TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info('loss', TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid('', opset)])
    m.ir_version = 8
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    onnx.save(m, os.path.join(d, 'model.onnx'))
    np.save(os.path.join(d, 'x.npy'), f32(*x_shape))


def main(out):
    # AveragePool: pads counted, ceil_mode's last window (along W) past them
    case(out, 'avgpool_ceil', 17, (2, 3, 7, 8),
         [helper.make_node('AveragePool', ['t'], ['y'], kernel_shape=[3, 3], strides=[2, 3],
                           pads=[1, 0, 1, 0], ceil_mode=1, count_include_pad=1)],
         (2, 3, 4, 3), {'P': f32(2, 3, 7, 8)})
    # AveragePool 1-D: asymmetric pads not counted, trailing rows no window reaches
    case(out, 'avgpool_1d', 17, (2, 2, 11),
         [helper.make_node('AveragePool', ['t'], ['y'], kernel_shape=[3], strides=[4], pads=[2, 1])],
         (2, 2, 3), {'P': f32(2, 2, 11)})
    # GroupNormalization (opset 18: scale and bias per group)
    case(out, 'groupnorm', 18, (2, 6, 3, 4),
         [helper.make_node('GroupNormalization', ['t', 'S', 'B'], ['y'], num_groups=3, epsilon=1e-3)],
         (2, 6, 3, 4), {'P': f32(2, 6, 3, 4), 'S': f32(3), 'B': f32(3)})
    # GroupNormalization (opset 21: scale and bias per channel)
    case(out, 'groupnorm_21', 21, (2, 6, 5),
         [helper.make_node('GroupNormalization', ['t', 'S', 'B'], ['y'], num_groups=2)],
         (2, 6, 5), {'P': f32(2, 6, 5), 'S': f32(6), 'B': f32(6)})
    # BatchNormalization in eval mode (the running statistics are constants)
    case(out, 'batchnorm_eval', 17, (3, 4, 5),
         [helper.make_node('BatchNormalization', ['t', 'S', 'B', 'M', 'V'], ['y'], epsilon=1e-3)],
         (3, 4, 5), {'P': f32(3, 4, 5), 'S': f32(4), 'B': f32(4)},
         [('M', f32(4)), ('V', np.abs(f32(4)) + 0.5)])
    # Gather on a negative axis with negative and repeated indices
    case(out, 'gather_axis', 17, (3, 4, 5),
         [helper.make_node('Gather', ['t', 'I'], ['y'], axis=-1)],
         (3, 4, 2, 3), {'P': f32(3, 4, 5)},
         [('I', np.array([[-1, 0, 4], [2, -1, 2]], np.int64))])
    # ConvTranspose 1-D: stride, dilation, asymmetric pads, output_padding, groups, bias
    case(out, 'convtranspose_1d', 17, (2, 4, 5),
         [helper.make_node('ConvTranspose', ['t', 'W', 'Bc'], ['y'], strides=[3], dilations=[2],
                           pads=[1, 2], output_padding=[2], group=2)],
         (2, 6, 16), {'P': f32(2, 4, 5), 'W': f32(4, 3, 3), 'Bc': f32(6)})
    # ConvTranspose 2-D with the defaults (no pads, dilations, group, bias)
    case(out, 'convtranspose_2d', 17, (2, 3, 5, 4),
         [helper.make_node('ConvTranspose', ['t', 'W'], ['y'], strides=[2, 1], output_padding=[1, 0])],
         (2, 2, 12, 5), {'P': f32(2, 3, 5, 4), 'W': f32(3, 2, 3, 2)})
    # Resize by sizes (roi and scales absent), nearest round_prefer_ceil, half_pixel
    case(out, 'resize_sizes', 17, (1, 2, 3, 5),
         [helper.make_node('Resize', ['t', '', '', 'Z'], ['y'], mode='nearest',
                           nearest_mode='round_prefer_ceil')],
         (1, 2, 7, 4), {'P': f32(1, 2, 3, 5)}, [('Z', np.array([1, 2, 7, 4], np.int64))])
    # Resize linear, align_corners, a fractional scale
    case(out, 'resize_linear', 17, (2, 1, 4, 3),
         [helper.make_node('Resize', ['t', '', 'Sc'], ['y'], mode='linear',
                           coordinate_transformation_mode='align_corners')],
         (2, 1, 10, 6), {'P': f32(2, 1, 4, 3)}, [('Sc', np.array([1, 1, 2.5, 2], np.float32))])
    # The recurrent bodies (lib/onnx_functions_rnn.c) in the configurations
    # the rnn fixture lacks; Y_h and Y_c join the loss so that their
    # gradients flow too. LSTM reverse, layout 1, sequence_lens, clip,
    # peepholes, initial_h without initial_c.
    b, t, i, h = 3, 4, 3, 4
    lens = ('L', np.array([4, 2, 3], np.int32))
    ax1 = ('A1', np.array([1], np.int64))
    ax0 = ('A0', np.array([0], np.int64))
    case(out, 'lstm_reverse_clip', 17, (b, t, i),
         [helper.make_node('LSTM', ['t', 'W', 'R', 'B', 'L', 'H0', '', 'Pp'], ['yy', 'yh'], hidden_size=h,
                           direction='reverse', layout=1, clip=1.5),
          helper.make_node('Unsqueeze', ['yh', 'A1'], ['yhu']),
          helper.make_node('Add', ['yy', 'yhu'], ['y'])],
         (b, t, 1, h), {'P': f32(b, t, i), 'W': f32(1, 4 * h, i), 'R': f32(1, 4 * h, h),
                        'B': f32(1, 8 * h), 'H0': f32(b, 1, h), 'Pp': f32(1, 3 * h)}, [lens, ax1])
    # LSTM bidirectional, layout 0, both initial states, Y_c in the loss
    case(out, 'lstm_bidi_states', 17, (t, b, i),
         [helper.make_node('LSTM', ['t', 'W', 'R', 'B', 'L', 'H0', 'C0'], ['yy', 'yh', 'ycell'], hidden_size=h,
                           direction='bidirectional'),
          helper.make_node('Add', ['yh', 'ycell'], ['yhc']),
          helper.make_node('Unsqueeze', ['yhc', 'A0'], ['yhu']),
          helper.make_node('Add', ['yy', 'yhu'], ['y'])],
         (t, 2, b, h), {'P': f32(t, b, i), 'W': f32(2, 4 * h, i), 'R': f32(2, 4 * h, h),
                        'B': f32(2, 8 * h), 'H0': f32(2, b, h), 'C0': f32(2, b, h)}, [lens, ax0])
    # GRU bidirectional, reset before the linear map, clip, sequence_lens
    case(out, 'gru_bidi_clip', 17, (t, b, i),
         [helper.make_node('GRU', ['t', 'W', 'R', 'B', 'L', 'H0'], ['yy', 'yh'], hidden_size=h,
                           direction='bidirectional', clip=1.2),
          helper.make_node('Unsqueeze', ['yh', 'A0'], ['yhu']),
          helper.make_node('Add', ['yy', 'yhu'], ['y'])],
         (t, 2, b, h), {'P': f32(t, b, i), 'W': f32(2, 3 * h, i), 'R': f32(2, 3 * h, h),
                        'B': f32(2, 6 * h), 'H0': f32(2, b, h)}, [lens, ax0])
    # GRU reverse, linear_before_reset with clip, layout 1, no bias, no
    # initial state; only Y_h in the loss (the sweep without dY)
    case(out, 'gru_reverse_lbr', 17, (b, t, i),
         [helper.make_node('GRU', ['t', 'W', 'R'], ['', 'y'], hidden_size=h, direction='reverse', layout=1,
                           linear_before_reset=1, clip=0.8)],
         (b, 1, h), {'P': f32(b, t, i), 'W': f32(1, 3 * h, i), 'R': f32(1, 3 * h, h)})
    # LSTM forward, no bias; only Y_c in the loss (neither dY nor dY_h)
    case(out, 'lstm_cell_only', 17, (t, b, i),
         [helper.make_node('LSTM', ['t', 'W', 'R'], ['', '', 'y'], hidden_size=h)],
         (1, b, h), {'P': f32(t, b, i), 'W': f32(1, 4 * h, i), 'R': f32(1, 4 * h, h)})


if __name__ == '__main__':
    main(sys.argv[1])
