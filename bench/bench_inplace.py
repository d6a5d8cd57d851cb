#!/usr/bin/python3
"""In-place elementwise ops (or another executor pass: --pass pack) on and
off, in the same build and the same run.

Forward: pippin-bench-opt-forward on MODEL with every optimizer pass
("all") against every pass but "inplace", interleaved ROUNDS times; prints
each side's median CPU time per forward (the process's CPU time: what a
shared, loaded machine disturbs least) with its range, and the ratio.

Training (--train-data DIR with idx.npy and targets.npy): `pippin train`
pipelined as the README's memory row runs it (--split-even 2 --schedule
1f1b --microbatches 4 --batch-size 8 --steps 3, 1 thread), with
PIPPIN_OPTIMIZE saying all passes or all but "inplace", interleaved; prints
each run's peak RSS (wait4's ru_maxrss of that child), its largest memory
plan (from the debug log), the last loss, which must be the same, and its
user CPU time. --pass pack compares training weights packed once per step
(pp_exec_set_pack_weights) against not, training only (inference never
reads that bit), and --microbatches changes the 4.

    /usr/bin/python3 bench/bench_inplace.py MODEL [--rounds 5] [--threads 1]
        [--train-data DIR] [--build build] [--pass inplace|pack] [--microbatches 4]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSES = ["fold", "identity", "layernorm", "gelu", "attention", "transpose", "matmul", "dead", "inplace", "pack"]


def forward(build, model, passes, threads, iters):
    out = subprocess.run([os.path.join(build, "bench", "pippin-bench-opt-forward"), model, "--threads", str(threads),
                          "--passes", passes, "--iters", str(iters)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def train(build, model, data, passes, microbatches):
    env = dict(os.environ, PIPPIN_OPTIMIZE=passes, PIPPIN_THREADS="1", OPENBLAS_NUM_THREADS="1", PIPPIN_LOG="debug")
    cmd = [os.path.join(build, "tools", "pippin"), "train", model, "--data", "idx=" + os.path.join(data, "idx.npy"),
           "--data", "targets=" + os.path.join(data, "targets.npy"), "--split-even", "2", "--schedule", "1f1b",
           "--microbatches", str(microbatches), "--batch-size", "8", "--steps", "3"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit("pippin train failed:\n" + text[-2000:])
    plans = [int(x) for x in re.findall(r"placed in (\d+)", text)]
    loss = re.findall(r"step \d+: loss ([0-9.]+)", text)
    return ru.ru_maxrss / 1024.0, max(plans) / 2**20 if plans else 0.0, loss[-1] if loss else "?", ru.ru_utime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--train-data")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--pass", dest="pass_name", choices=["inplace", "pack"], default="inplace")
    ap.add_argument("--microbatches", type=int, default=4)
    a = ap.parse_args()
    name, without = a.pass_name, ",".join(p for p in PASSES if p != a.pass_name)
    cpu = {"on": [], "off": []}
    for _ in range(a.rounds if name == "inplace" else 0):
        for side, passes in (("on", "all"), ("off", without)):
            cpu[side].append(forward(a.build, a.model, passes, a.threads, a.iters)["cpu_ms"])
    if name == "inplace":
        for side in ("on", "off"):
            v = cpu[side]
            print(f"forward, in place {side:3}: CPU ms per run median {statistics.median(v):.1f} "
                  f"(range {min(v):.1f}-{max(v):.1f}, {a.rounds} rounds x {a.iters} runs, {a.threads} thread(s))")
        print(f"forward CPU time in place / not: {statistics.median(cpu['on']) / statistics.median(cpu['off']):.3f}x")
    if a.train_data:
        rss, user_s = {"on": [], "off": []}, {"on": [], "off": []}
        for _ in range(a.rounds):
            for side, passes in (("on", "all"), ("off", without)):
                r, plan, loss, user = train(a.build, a.model, a.train_data, passes, a.microbatches)
                rss[side].append(r)
                user_s[side].append(user)
                print(f"train, {name} {side:3}: peak RSS {r:.1f} MiB, largest plan {plan:.2f} MiB, last loss {loss}, "
                      f"user CPU {user:.2f} s")
        print(f"train peak RSS {name} on / off: {statistics.median(rss['on']) / statistics.median(rss['off']):.3f}x; "
              f"user CPU {statistics.median(user_s['on']) / statistics.median(user_s['off']):.3f}x")


if __name__ == "__main__":
    main()
