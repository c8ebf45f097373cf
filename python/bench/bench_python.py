#!/usr/bin/python3
"""The Python module against torch.nn.MultiheadAttention, in one process, and
the binding's own per-call overhead. A benchmark, not a test.

  1. Per-call time at (B, L, E, H) = (1,128,512,8), (8,128,512,8) and
     (1,2048,768,12): multihead.MultiheadAttention(E, H)(x, x, x,
     need_weights=False) against torch.nn.MultiheadAttention(E, H).eval()
     under torch.no_grad() (PyTorch 1.13 as shipped), float32, x of shape
     (L, B, E), 2 threads for both (OMP_NUM_THREADS before either library
     loads, torch.set_num_threads). Calls alternate between the two, after
     warm-up; medians.
  2. The binding's overhead: a tiny shape (B=1, L=1, E=8, H=1) timed from
     Python, and the same forward timed in C++ by `multihead bench` (which
     calls MultiheadAttention::forward in a loop). The difference of the
     medians is what the binding adds per call (argument parsing, array
     checks, views, releasing the GIL, wrapping the output).

Usage (after building with the Python module):
  PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_python.py \
      --multihead build/tools/multihead [--threads 2] [--seconds 1]
Prints one Markdown table and one overhead line.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--multihead", required=True, help="the multihead program (for the C++ timing)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per program and shape (at least)")
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    return p.parse_args()


ARGS = parse_args()
# Before numpy, torch or multihead load their OpenMP / BLAS runtimes.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import multihead  # noqa: E402

SHAPES = [(1, 128, 512, 8), (8, 128, 512, 8), (1, 2048, 768, 12)]


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(B, L, E, H):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, H).eval()
    ours = multihead.MultiheadAttention(E, H)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((L, B, E)).astype(np.float32)
    xt = torch.from_numpy(x)

    def run_ours():
        ours(x, x, x, need_weights=False)

    def run_theirs():
        with torch.no_grad():
            theirs(xt, xt, xt, need_weights=False)

    for _ in range(ARGS.warmup):
        run_ours()
        run_theirs()
    one = max(timed(run_ours), timed(run_theirs), 1e-6)
    calls = max(ARGS.min_calls, int(ARGS.seconds / one))
    t_ours, t_theirs = [], []
    for _ in range(calls):  # alternate, so both see the same machine load
        t_ours.append(timed(run_ours))
        t_theirs.append(timed(run_theirs))
    return statistics.median(t_ours), statistics.median(t_theirs), calls


def cpp_tiny_ms(repeat):
    cmd = [ARGS.multihead, "bench", "--batch", "1", "--seq-len", "1", "--embed-dim", "8", "--num-heads", "1",
           "--threads", str(ARGS.threads), "--repeat", str(repeat), "--warmup", "100"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(ARGS.threads))).stdout
    return float(re.search(r"median_ms=([0-9.]+)", out).group(1))


def python_tiny_ms(repeat):
    mha = multihead.MultiheadAttention(8, 1, seed=1)
    x = np.random.default_rng(3).standard_normal((1, 1, 8)).astype(np.float32)
    for _ in range(100):
        mha(x, x, x, need_weights=False)
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        mha(x, x, x, need_weights=False)
        t.append(time.perf_counter() - t0)
    return statistics.median(t) * 1e3


def main():
    torch.set_num_threads(ARGS.threads)
    load = os.getloadavg()
    print(f"multihead {multihead.__version__}, torch {torch.__version__}, {ARGS.threads} threads, "
          f"float32, eval, need_weights=False; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}")
    print()
    print("| shape (B,L,E,H) | multihead (Python) | torch.nn.MultiheadAttention | torch / multihead | calls |")
    print("|---|---|---|---|---|")
    for B, L, E, H in SHAPES:
        ours, theirs, calls = compare(B, L, E, H)
        print(f"| ({B},{L},{E},{H}) | {ours * 1e3:.2f} ms | {theirs * 1e3:.2f} ms | {theirs / ours:.2f}x | {calls} |",
              flush=True)
    repeat = 20000
    py = python_tiny_ms(repeat)
    cpp = cpp_tiny_ms(repeat)
    print()
    print(f"Binding overhead, (1,1,8,1), median of {repeat} calls: Python {py * 1e3:.1f} us, "
          f"C++ {cpp * 1e3:.1f} us, difference {(py - cpp) * 1e3:.1f} us per call")


if __name__ == "__main__":
    sys.exit(main())
