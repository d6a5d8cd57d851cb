// ONNX Runtime (npm's onnxruntime-node, CPU) running one model's forward:
// every input gets int64 [batch, seq] random tokens below VOCAB; 3 warm-up
// runs, then ITERS timed runs. Prints one JSON line per thread count: the
// median and least wall time per run, and the median CPU time of the
// process per run (cpu_ms).
// Used by bench/bench_ort_forward.py.
//   node bench/ort_forward.js MODEL BATCH SEQ VOCAB ITERS THREADS...
const path = require('path');
const ort = require(path.join(process.env.ORT_DIR, 'node_modules', 'onnxruntime-node'));

(async () => {
    const [model, batch, seq, vocab, iters, ...threads] = process.argv.slice(2);
    for (const t of threads) {
        const session = await ort.InferenceSession.create(model, {intraOpNumThreads: +t, interOpNumThreads: 1,
                                                                  graphOptimizationLevel: 'all'});
        const feeds = {};
        for (const name of session.inputNames) {
            const a = new BigInt64Array(+batch * +seq);
            for (let i = 0; i < a.length; i++) a[i] = BigInt(Math.floor(Math.random() * +vocab));
            feeds[name] = new ort.Tensor('int64', a, [+batch, +seq]);
        }
        for (let i = 0; i < 3; i++) await session.run(feeds);
        const ms = [], cpu = [];
        for (let i = 0; i < +iters; i++) {
            const s = performance.now(), c = process.cpuUsage();
            await session.run(feeds);
            ms.push(performance.now() - s);
            const d = process.cpuUsage(c);
            cpu.push((d.user + d.system) / 1000);
        }
        ms.sort((a, b) => a - b);
        cpu.sort((a, b) => a - b);
        console.log(JSON.stringify({threads: +t, median_ms: ms[ms.length >> 1], min_ms: ms[0],
                                    cpu_ms: cpu[cpu.length >> 1]}));
    }
})().catch((e) => { console.error(String(e)); process.exit(1); });
