#!/usr/bin/python3
"""Attention weights from the fused path: what one head's or one query row's
weights cost, against the full materialized weights and PyTorch 1.13.

At (B, L, E, H) = (1, 8192, 1024, 16) by default (self-attention, float32,
eval), every measurement in its own subprocess:
  * ours, MultiheadAttention.forward (the Python binding):
      - need_weights=False (flash): the floor;
      - weights_heads=[0], per head: flash, then one head's (L, S) weights
        recomputed from the saved row log-sum-exps;
      - weights_rows=[L // 2], per head: flash, then one query row of every
        head (H·S floats);
      - every head's weights, flash + the recompute (kernel='auto');
      - every head's weights, kernel='materialized' (the old fallback: all
        (H, L, S) scores materialised);
  * PyTorch 1.13 nn.MultiheadAttention, need_weights=True, per head
    (average_attn_weights=False) and averaged (its default).
Each subprocess builds its inputs, runs --warmup calls, then --repeat timed
calls, and reports the median; its peak RSS comes from os.wait4 (the whole
process), and "over setup" is that peak minus the peak before the first call
(the interpreter, the libraries, the inputs and the module).

Prints one Markdown table. This is a benchmark, not a test: run it on a quiet
machine. --quick runs a seconds-long smoke at (1, 256, 64, 4).

Usage:
  PYTHONPATH=build/python /usr/bin/python3 bench/bench_weights.py [--threads 2]
      [--repeat 3] [--warmup 1] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(spec):
    """One measurement, in this process; prints a JSON line."""
    import resource

    import numpy as np

    B, L, E, H, threads = spec["B"], spec["L"], spec["E"], spec["H"], spec["threads"]
    x = np.random.default_rng(0).standard_normal((L, B, E)).astype(np.float32)
    if spec["program"] == "torch":
        import torch

        torch.set_num_threads(threads)
        m = torch.nn.MultiheadAttention(E, H).eval()
        xt = torch.from_numpy(x)

        def call():
            with torch.no_grad():
                _, w = m(xt, xt, xt, need_weights=True, average_attn_weights=spec["average"])
            return tuple(w.shape)
    else:
        import multihead

        multihead.set_threads(threads)
        m = multihead.MultiheadAttention(E, H, seed=1)
        kw = dict(spec["kwargs"])

        def call():
            _, w = m(x, x, x, **kw)
            return None if w is None else tuple(w.shape)
    setup_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(spec["warmup"]):
        call()
    times, shape = [], None
    for _ in range(spec["repeat"]):
        t0 = time.perf_counter()
        shape = call()
        times.append((time.perf_counter() - t0) * 1e3)
    extra = {}
    if spec["program"] == "ours":
        import multihead

        extra["target"] = multihead.simd_target_current()
    print(json.dumps({"ms": statistics.median(times), "setup_kib": setup_kib, "shape": shape, **extra}))


def measure(spec):
    """Runs child(spec) in a subprocess: its result and its peak RSS (KiB)."""
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        return {"error": (err.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_kib"] = usage.ru_maxrss
    return r


def mib(kib):
    return "%.0f MiB" % (kib / 1024.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a seconds-long smoke at (1, 256, 64, 4)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    a = ap.parse_args()
    if a.child:
        return child(json.loads(a.child))

    B, L, E, H = (1, 256, 64, 4) if a.quick else (1, 8192, 1024, 16)
    repeat, warmup = (1, 1) if a.quick else (a.repeat, a.warmup)
    base = dict(B=B, L=L, E=E, H=H, threads=a.threads, repeat=repeat, warmup=warmup)
    rows = [
        ("ours: need_weights=False (flash, no weights)", dict(program="ours", kwargs=dict(need_weights=False))),
        ("ours: one head, weights_heads=[0] (flash + recompute)",
         dict(program="ours", kwargs=dict(average_attn_weights=False, weights_heads=[0]))),
        ("ours: one query row, weights_rows=[L/2] (flash + recompute)",
         dict(program="ours", kwargs=dict(average_attn_weights=False, weights_rows=[L // 2]))),
        ("ours: all heads (flash + recompute)", dict(program="ours", kwargs=dict(average_attn_weights=False))),
        ("ours: all heads, kernel='materialized'",
         dict(program="ours", kwargs=dict(average_attn_weights=False, kernel="materialized"))),
    ]
    if not a.no_torch:
        rows += [
            ("PyTorch 1.13: need_weights=True, per head", dict(program="torch", average=False)),
            ("PyTorch 1.13: need_weights=True, averaged", dict(program="torch", average=True)),
        ]
    results = [(name, measure({**base, **spec})) for name, spec in rows]
    target = next((r.get("target") for _, r in results if r.get("target")), "?")
    print(f"(B, L, E, H) = ({B}, {L}, {E}, {H}), float32, self-attention, eval; threads {a.threads}; "
          f"our SIMD target {target}; median of {repeat} after {warmup} warm-up; peak RSS by os.wait4\n")
    print("| call | weights shape | time (ms) | peak RSS | RSS over setup |")
    print("|---|---|---:|---:|---:|")
    for name, r in results:
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | |")
            continue
        shape = "none" if r["shape"] is None else "(" + ", ".join(str(s) for s in r["shape"]) + ")"
        print(f"| {name} | {shape} | {r['ms']:.1f} | {mib(r['peak_kib'])} | {mib(r['peak_kib'] - r['setup_kib'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
