// Runs an ONNX model in ONNX Runtime (npm's onnxruntime-node, found under
// $ORT_DIR/node_modules) and writes each output as OUT_DIR/<name>.npy, with
// '/' and ':' in names turned into '_' as `pippin infer` does.
//   node ort_run.js MODEL.onnx OUT_DIR NAME=FILE.npy ...
// float32 and int64 tensors only (what the fixtures use). ORT_OPT, if set, is
// the session's graphOptimizationLevel ('disabled', 'basic', 'extended', 'all').
const path = require('path');
const fs = require('fs');
const ort = require(path.join(process.env.ORT_DIR, 'node_modules', 'onnxruntime-node'));

function readNpy(file) {
  const b = fs.readFileSync(file);
  const hlen = b.readUInt16LE(8);
  const header = b.slice(10, 10 + hlen).toString('latin1');
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map(s => s.trim()).filter(s => s).map(Number);
  const data = b.slice(10 + hlen);
  const ab = data.buffer.slice(data.byteOffset, data.byteOffset + data.length);
  if (descr === '<f4') return new ort.Tensor('float32', new Float32Array(ab), shape);
  if (descr === '<i8') return new ort.Tensor('int64', new BigInt64Array(ab), shape);
  throw new Error(file + ': dtype ' + descr + ' not handled');
}

function writeNpy(file, t) {
  const descr = t.type === 'float32' ? '<f4' : t.type === 'int64' ? '<i8' : null;
  if (!descr) throw new Error('output dtype ' + t.type + ' not handled');
  const shape = t.dims.length === 1 ? '(' + t.dims[0] + ',)' : '(' + t.dims.join(', ') + ')';
  let h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ', }';
  while ((10 + h.length + 1) % 64) h += ' ';
  h += '\n';
  const head = Buffer.alloc(10);
  head.write('\x93NUMPY', 0, 'latin1');
  head[6] = 1; head[7] = 0;
  head.writeUInt16LE(h.length, 8);
  const body = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(h, 'latin1'), body]));
}

(async () => {
  const [model, outDir, ...ins] = process.argv.slice(2);
  const opts = process.env.ORT_OPT ? { graphOptimizationLevel: process.env.ORT_OPT } : {};
  const session = await ort.InferenceSession.create(model, opts);
  const feeds = {};
  for (const a of ins) {
    const i = a.indexOf('=');
    feeds[a.slice(0, i)] = readNpy(a.slice(i + 1));
  }
  const out = await session.run(feeds);
  fs.mkdirSync(outDir, { recursive: true });
  for (const [name, t] of Object.entries(out)) writeNpy(path.join(outDir, name.replace(/[/:]/g, '_') + '.npy'), t);
})().catch(e => { console.error('ort_run: ' + e.message); process.exit(1); });
