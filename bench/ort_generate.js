// ONNX Runtime (npm's onnxruntime-node, CPU) generating as a plain server
// would: one greedy generation at a time with its own KV cache (the prompt
// with an empty past [1, H, 0, Dh], then one token at a time, the presents
// fed back as the next pasts). Prints the first generation's tokens (for the
// prompt PROMPT, comma-separated ids), then one JSON line per thread count.
// Used by bench/bench_generate.py.
//   node bench/ort_generate.js MODEL.onnx SECONDS PROMPT MAX_TOKENS VOCAB HEADS HEAD_DIM THREADS...
const ort = require('onnxruntime-node');

function argmaxLast(logits) {
    const [, t, v] = logits.dims;
    const d = logits.data, off = (t - 1) * v;
    let best = 0;
    for (let i = 1; i < v; i++) if (d[off + i] > d[off + best]) best = i;
    return best;
}

// One greedy generation: the tokens, the time to the first token and the
// time of every later token (ms).
async function generate(session, pasts, prompt, maxTokens) {
    let feeds = {idx: new ort.Tensor('int64', BigInt64Array.from(prompt, BigInt), [1, prompt.length])};
    for (const p of pasts) feeds[p.name] = new ort.Tensor('float32', new Float32Array(0), [1, p.heads, 0, p.dim]);
    const toks = [], gaps = [];
    let t0 = performance.now(), first = 0;
    for (let i = 0; i < maxTokens; i++) {
        const out = await session.run(feeds);
        const tok = argmaxLast(out.logits);
        const t = performance.now();
        if (i === 0) first = t - t0;
        else gaps.push(t - t0);
        t0 = t;
        toks.push(tok);
        feeds = {idx: new ort.Tensor('int64', BigInt64Array.from([BigInt(tok)]), [1, 1])};
        for (const p of pasts) feeds[p.name] = out[p.present];
    }
    return {toks, first, gaps};
}

function randomPrompt(n, vocab, state) {
    const a = [];
    for (let i = 0; i < n; i++) {
        state.s = (state.s * 1103515245 + 12345) % 2147483648;
        a.push(state.s % vocab);
    }
    return a;
}

(async () => {
    const [model, seconds, promptArg, maxTokens, vocab, heads, headDim, ...threads] = process.argv.slice(2);
    const prompt = promptArg.split(',').map(Number);
    for (const t of threads) {
        const session = await ort.InferenceSession.create(model, {intraOpNumThreads: +t, interOpNumThreads: 1});
        // past_key_values.{i}.key/value [1, HEADS, past, HEAD_DIM] -> present.{i}.key/value
        const pasts = session.inputNames.filter((n) => n.startsWith('past_key_values.')).map((name) => (
            {name, present: 'present.' + name.slice('past_key_values.'.length), heads: +heads, dim: +headDim}));
        const ref = await generate(session, pasts, prompt, +maxTokens);
        if (t === threads[0]) console.log('tokens ' + ref.toks.join(','));
        for (let i = 0; i < 2; i++) await generate(session, pasts, randomPrompt(prompt.length, +vocab, {s: i}), +maxTokens);
        const gaps = [], firsts = [];
        let tokens = 0, gens = 0;
        const state = {s: 42};
        const start = performance.now(), end = start + seconds * 1000;
        while (performance.now() < end) {
            const g = await generate(session, pasts, randomPrompt(prompt.length, +vocab, state), +maxTokens);
            gaps.push(...g.gaps);
            firsts.push(g.first);
            tokens += g.toks.length;
            gens++;
        }
        const wall = (performance.now() - start) / 1000;
        gaps.sort((a, b) => a - b);
        firsts.sort((a, b) => a - b);
        console.log(JSON.stringify({threads: +t, generations: gens, tokens, gen_per_s: gens / wall,
                                    tokens_per_s: tokens / wall, first_p50_ms: firsts[firsts.length >> 1],
                                    token_p50_ms: gaps[gaps.length >> 1],
                                    token_p99_ms: gaps[Math.min(gaps.length - 1, Math.floor(gaps.length * 0.99))]}));
    }
})().catch((e) => { console.error(String(e && e.stack || e)); process.exit(1); });
