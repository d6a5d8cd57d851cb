#!/usr/bin/python3
"""Real against simulated: the step time `pippin simulate` predicts from the
costs `pippin train --trace` measured, next to the measured step time.

For each schedule: `pippin train` on the example GPT (4 stages, each rank a
thread with its own ZeroMQ transport, --transport ipc), --trace FILE.json of
the last step. From that trace:

  measured   the step's makespan: first action start to last action end,
             over every rank (the optimizer step and the step's bookkeeping
             outside the action lists are not in it; the wall time of the
             whole step is printed beside it, as `wall`);
  costs      per stage, the mean duration of its F, I, W (or B) actions as
             traced (from the moment the inputs were there: a wait for
             another rank is traced apart, as RECV on the comm lane), and c,
             the median time from a sender's action end to the moment a
             waiting receiver had the tensor;
  predicted  `pippin simulate --kind K --ranks P --microbatches M
             --cost F=..,I=..,W=..,c=..` (B= for schedules with B) makespan.

Costs and measured step come from the same step of the same run, so what
the machine did then (load, contention between the rank threads) is in
both. The 4-rank runs want 4 free cores; with fewer, ranks share cores and
an action's duration depends on how many others run beside it, which the
per-stage mean averages away. The 2-rank runs (zbv, interleaved-1f1b: two
stages per rank) want 2. `recompute` rows: costs from the plain 1F1B run,
predicted with `pippin simulate --recompute`, measured with
`pippin train --recompute` right after that plain run (same load).

`pred_c0` is the prediction with free transfers (c=0), to show how much
of the figure is c.

Prints one row per run and the mean per configuration, with the ratio
predicted / measured.

  bench/bench_sim_vs_real.py [--pippin build/tools/pippin] [--runs 3]
      [--steps 5] [--batch 32] [--microbatches 8] [--transport ipc]
      [--only 1f1b,zb-h1,...] [--keep DIR]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name, schedule kind, ranks, stages per rank, recompute
CONFIGS = [
    ("1f1b", "1f1b", 4, 1, False),
    ("zb-h1", "zb-h1", 4, 1, False),
    ("1f1b+recompute", "1f1b", 4, 1, True),
    ("zbv", "zbv", 2, 2, False),
    ("interleaved-1f1b", "interleaved-1f1b", 2, 2, False),
]
STEP_RE = re.compile(r"^step (\d+): loss \S+\s+\(([0-9.]+) ms")


def train(args, kind, recompute, trace):
    cmd = [args.pippin, "train", os.path.join(ROOT, "examples/gpt/model.onnx"),
           "--text", os.path.join(ROOT, "examples/data/tiny.txt"),
           "--vocab", os.path.join(ROOT, "examples/gpt/vocab.json"), "--seq", "64",
           "--batch-size", str(args.batch), "--microbatches", str(args.microbatches),
           "--steps", str(args.steps), "--schedule", kind, "--transport", args.transport,
           "--trace", trace]
    if recompute:
        cmd.append("--recompute")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("bench_sim_vs_real: %s failed (exit %d):\n%s" %
                 (" ".join(cmd), out.returncode, out.stderr[-2000:]))
    wall = None
    for line in out.stdout.splitlines():
        m = STEP_RE.match(line)
        if m and int(m.group(1)) == args.steps - 1:
            wall = float(m.group(2))
    return wall


def read_trace(path):
    """Compute events {(kind, stage, mb): (rank, start, end)} in ms, and the
    receive waits [(kind, stage, mb, start, end)]."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    acts, waits = {}, []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        name, a = e["name"], e.get("args", {})
        t0, t1 = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
        kind = re.sub(r"^\d+", "", name)
        kind = re.sub(r"\d+$", "", kind)
        if e["tid"] == 0:
            acts[(kind, a["stage"], a["mb"])] = (e["pid"], t0, t1)
        else:
            waits.append((kind, a["stage"], a["mb"], t0, t1))
    return acts, waits


def costs_of(acts, waits, nstages):
    per = {k: [[] for _ in range(nstages)] for k in ("F", "I", "W", "B")}
    for (kind, s, _), (_, t0, t1) in acts.items():
        if kind in per:
            per[kind][s].append(t1 - t0)
    mean = {k: [statistics.mean(v) if v else 0.0 for v in per[k]] for k in per}
    # c: a waiting receiver had the tensor this long after its sender's
    # action (which includes the send) ended
    lat = []
    for kind, s, mb, _, ready in waits:
        if kind == "RECV_F":
            src = acts.get(("F", s - 1, mb))
        else:
            src = acts.get(("I", s + 1, mb)) or acts.get(("B", s + 1, mb))
        if src:
            lat.append(max(0.0, ready - src[2]))
    c = statistics.median(lat) if lat else 0.0
    return mean, c, len(lat)


def cost_spec(mean, c, has_b):
    def col(v):
        return ":".join("%.6g" % x for x in v)
    if has_b:  # B actions: the split between I and W does not matter
        return "F=%s,B=%s,c=%.6g" % (col(mean["F"]), col(mean["B"]), c)
    return "F=%s,I=%s,W=%s,c=%.6g" % (col(mean["F"]), col(mean["I"]), col(mean["W"]), c)


def simulate(args, kind, ranks, spr, spec, recompute):
    cmd = [args.pippin, "simulate", "--kind", kind, "--ranks", str(ranks),
           "--microbatches", str(args.microbatches), "--stages-per-rank", str(spr),
           "--cost", spec, "--json"]
    if recompute:
        cmd.append("--recompute")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("bench_sim_vs_real: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    return json.loads(out.stdout)["makespan"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pippin", default=os.path.join(ROOT, "build/tools/pippin"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--transport", default="ipc")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", help="keep the traces in this directory")
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core per rank
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PIPPIN_LOG", "error")
    only = set(x for x in args.only.split(",") if x)
    tmp = args.keep or tempfile.mkdtemp(prefix="pippin_simreal.")
    os.makedirs(tmp, exist_ok=True)
    print("# example GPT, 4 stages, batch %d in %d microbatches, seq 64, --transport %s, "
          "%d cores, the last of %d steps traced" %
          (args.batch, args.microbatches, args.transport, os.cpu_count(), args.steps))
    print("%-17s %5s %3s %4s %12s %12s %7s %9s %10s   costs (ms)" %
          ("schedule", "ranks", "M", "run", "measured_ms", "predicted_ms", "ratio", "pred_c0",
           "wall_ms"))
    summary = []
    try:
        for name, kind, ranks, spr, rc in CONFIGS:
            if only and name not in only:
                continue
            meas, pred = [], []
            for run in range(args.runs):
                base = os.path.join(tmp, "%s_%d" % (name.replace("+", "_"), run))
                if rc:  # costs from a plain run just before
                    train(args, kind, False, base + "_plain.json")
                    acts, waits = read_trace(base + "_plain.json")
                    nst = 1 + max(s for (_, s, _) in acts)
                    mean, c, nlat = costs_of(acts, waits, nst)
                wall = train(args, kind, rc, base + ".json")
                acts2, waits2 = read_trace(base + ".json")
                if not rc:
                    acts, waits = acts2, waits2
                    nst = 1 + max(s for (_, s, _) in acts)
                    mean, c, nlat = costs_of(acts, waits, nst)
                measured = max(t1 for (_, _, t1) in acts2.values()) - \
                    min(t0 for (_, t0, _) in acts2.values())
                has_b = any(k == "B" for (k, _, _) in acts)
                spec = cost_spec(mean, c, has_b)
                predicted = simulate(args, kind, ranks, spr, spec, rc)
                pred_c0 = simulate(args, kind, ranks, spr, cost_spec(mean, 0.0, has_b), rc)
                meas.append(measured)
                pred.append(predicted)
                print("%-17s %5d %3d %4d %12.3f %12.3f %7.3f %9.3f %10s   %s (c from %d waits)" %
                      (name, ranks, args.microbatches, run, measured, predicted,
                       predicted / measured, pred_c0 / measured,
                       "%.1f" % wall if wall else "?", spec, nlat), flush=True)
            mm, mp = statistics.mean(meas), statistics.mean(pred)
            summary.append((name, ranks, mm, mp))
            print("%-17s %5d %3d %4s %12.3f %12.3f %7.3f" %
                  (name, ranks, args.microbatches, "mean", mm, mp, mp / mm), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print("# ratio = predicted / measured; within 10% when 0.9 <= ratio <= 1.1")
    for name, ranks, mm, mp in summary:
        r = mp / mm
        print("%-17s ranks %d: measured %.3f ms, predicted %.3f ms, ratio %.3f %s" %
              (name, ranks, mm, mp, r, "(within 10%)" if 0.9 <= r <= 1.1 else "(OFF by more than 10%)"))


if __name__ == "__main__":
    main()
