// ONNX Runtime (npm's onnxruntime-node, CPU) as a plain server would answer
// the serving benchmark's requests: one at a time, and batched. Prints one
// JSON line per thread count. Every model input (idx, and targets for the
// example GPT) gets int64 [batch, seq] random tokens below VOCAB. Used by
// bench/bench_serve.py.
//   node bench/ort_serve.js MODEL.onnx SECONDS SEQ VOCAB BATCHED THREADS...
const ort = require('onnxruntime-node');

function tokens(n, vocab) {
    const a = new BigInt64Array(n);
    for (let i = 0; i < n; i++) a[i] = BigInt(Math.floor(Math.random() * vocab));
    return a;
}

async function measure(session, batch, seq, vocab, seconds) {
    const feeds = {};
    for (const name of session.inputNames)
        feeds[name] = new ort.Tensor('int64', tokens(batch * seq, vocab), [batch, seq]);
    for (let i = 0; i < 3; i++) await session.run(feeds, ['logits']);
    const lat = [];
    const end = performance.now() + seconds * 1000;
    const t0 = performance.now();
    while (performance.now() < end) {
        const s = performance.now();
        await session.run(feeds, ['logits']);
        lat.push(performance.now() - s);
    }
    const wall = (performance.now() - t0) / 1000;
    lat.sort((a, b) => a - b);
    return {runs: lat.length, rps: lat.length * batch / wall, p50_ms: lat[lat.length >> 1],
            p99_ms: lat[Math.min(lat.length - 1, Math.floor(lat.length * 0.99))]};
}

(async () => {
    const [model, seconds, seq, vocab, batched, ...threads] = process.argv.slice(2);
    for (const t of threads) {
        const session = await ort.InferenceSession.create(model, {intraOpNumThreads: +t, interOpNumThreads: 1});
        const one = await measure(session, 1, +seq, +vocab, +seconds);
        const many = await measure(session, +batched, +seq, +vocab, +seconds);
        console.log(JSON.stringify({threads: +t, one_at_a_time: one, batched: {batch: +batched, ...many}}));
    }
})().catch((e) => { console.error(String(e)); process.exit(1); });
