#!/usr/bin/python3
"""Runs each stage file of a split (`pippin split -o DIR`) in pippin and in
ONNX Runtime and compares their outputs (issue 18). Stages run in order;
each is fed by name from the model's inputs and the outputs pippin gave
for the stages before it, so skip edges and shared parameters sent
between stages work as in the pipeline. Prints the count of outputs
compared; fails naming the stage and output that differ.

pippin's inference runs a training-mode BatchNormalization in eval mode
(the running statistics, docs/architecture.md); ONNX Runtime runs the file
as written. So ONNX Runtime gets a copy of each stage file with every
BatchNormalization in eval mode, what pippin runs.

    ort_stages.py PIPPIN ORT_RUN_JS DIR NAME=FILE.npy ...
"""

import glob
import os
import subprocess
import sys

import numpy as np
import onnx


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit('%s: %s' % (' '.join(cmd[:2]), (p.stderr or p.stdout)[-400:]))


def eval_mode(m):
    """m with its BatchNormalization nodes in eval mode; True if any changed."""
    changed = False
    for n in m.graph.node:
        if n.op_type != 'BatchNormalization' or n.domain not in ('', 'ai.onnx'):
            continue
        for a in n.attribute:
            if a.name == 'training_mode' and a.i:
                a.i = 0
                del n.output[1:]
                changed = True
    return changed


def main(pippin, ort_run, d, feeds):
    pool = dict(f.split('=', 1) for f in feeds)
    files = sorted(glob.glob(d + '/stage_*.onnx'), key=lambda f: int(f.rsplit('_', 1)[1][:-5]))
    assert files, 'no stage files in ' + d
    compared = 0
    for k, f in enumerate(files):
        m = onnx.load(f)
        names = [i.name for i in m.graph.input]
        missing = [n for n in names if n not in pool]
        assert not missing, 'stage %d: no value for inputs %s' % (k, missing)
        ins = ['%s=%s' % (n, pool[n]) for n in names]
        pp, ort = '%s/pp%d' % (d, k), '%s/ort%d' % (d, k)
        run([pippin, 'infer', f, '--output-dir', pp, '--no-split'] + sum((['--input', i] for i in ins), []))
        ort_file = f
        if eval_mode(m):
            ort_file = '%s/ort_stage_%d.onnx' % (d, k)
            onnx.save(m, ort_file)
        run(['node', ort_run, ort_file, ort] + ins)
        for o in m.graph.output:
            file = o.name.replace('/', '_').replace(':', '_') + '.npy'
            a, b = np.load(os.path.join(pp, file)), np.load(os.path.join(ort, file))
            assert a.shape == b.shape, ('stage %d' % k, o.name, a.shape, b.shape)
            assert np.allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(a).max()))), \
                ('stage %d' % k, o.name, float(np.abs(a - b).max()))
            pool[o.name] = os.path.join(pp, file)
            compared += 1
    print(compared)


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
