#!/usr/bin/python3
"""One training step of a multi-head attention layer: multihead vs PyTorch 1.13 autograd.

A step is the forward and the backward with every gradient (query, key,
value and all parameters) of self-attention on x of shape (L, B, E), float32,
for d_output = a fixed random array:
  * ours: multihead.MultiheadAttention (the Python module of --build-dir),
    forward_with_context(x, x, x, need_weights=False, kernel='flash'),
    then backward(context, d_output); the context is reused between steps,
    as a training loop does;
  * PyTorch: nn.MultiheadAttention(E, H) in training mode (dropout 0),
    out = mha(x, x, x, need_weights=False, attn_mask=mask)[0],
    out.backward(d_output) with x.requires_grad; gradients reset to None
    each step. Causal goes through a boolean upper-triangular attn_mask
    (1.13's MHA has no is_causal); ours uses is_causal=True.
Both run with 2 threads (--threads): torch.set_num_threads and
multihead.set_threads (our loops and our BLAS), OMP_NUM_THREADS too. PyTorch
runs in the environment bench_vs_pytorch.py found best (TUNED_ENV), unless
--torch-env shipped.

Each (side, shape) runs in its own subprocess: warm-up steps, then the
median of N timed steps; its peak RSS comes from os.wait4 (ru_maxrss). It
is the whole process's, interpreter and imports included (importing torch
alone costs ~200 MiB; ours imports numpy only).

FLOPs of one step (the algorithmic count, no recomputation; causal counted
as the full square, as bench_vs_pytorch.py does):
  forward   8·B·L·E² (four projections) + 4·B·L²·E (QKᵀ and PV)
  backward 16·B·L·E² (d_input and d_W of each projection)
         + 8·B·L²·E (dV, dP, dQ, dK)
  step     24·B·L·E² + 12·B·L²·E

Longest L in 24 GiB: one step per side at a small baseline L0 and at two
lengths L1 < L2 (batch 1, the widest shape's E and H); growth g(L) =
RSS(L) − RSS(L0) is fitted as c·L^k through the two points, and the max L
solves RSS(L0) + c·L^k = 24 GiB. It is a fit, reported with its exponent k
(≈1 for a backward that stores O(L) per head, ≈2 for one that stores the
L×L weights); --confirm-max-l runs one step at the predicted L (ours only,
if it fits this machine's memory).

Usage:
  /usr/bin/python3 bench/bench_train_vs_pytorch.py --build-dir build [--threads 2]
      [--repeat 5] [--warmup 2] [--torch-env tuned|shipped] [--quick] [--no-memory-fit]
--quick runs tiny shapes only (a seconds-long smoke of the script itself).
"""
import argparse
import math
import os
import re
import sys

from bench_common import TUNED_ENV, TUNED_UNSET, field, run_child

# (B, L, E, H, causal)
SHAPES = [
    (8, 128, 512, 8, False),
    (1, 1024, 768, 12, False),
    (1, 2048, 768, 12, False),
    (1, 4096, 1024, 16, False),
    (1, 2048, 768, 12, True),
]
QUICK_SHAPES = [
    (2, 64, 64, 4, False),
    (1, 128, 64, 4, True),
]
# (E, H, L0, L1, L2) for the memory fit.
MEMORY_FIT = (1024, 16, 256, 2048, 4096)
QUICK_MEMORY_FIT = (64, 4, 32, 128, 256)
BUDGET_BYTES = 24 * 2**30


OURS_CHILD = r"""
import sys, time, statistics
import numpy as np
import multihead
B, L, E, H, causal, threads, repeat, warmup = (int(a) for a in sys.argv[1:9])
multihead.set_threads(threads)
rng = np.random.default_rng(0)
mha = multihead.MultiheadAttention(E, H, dtype=np.float32)
mha.train()
x = rng.standard_normal((L, B, E), dtype=np.float32)
d_out = rng.standard_normal((L, B, E), dtype=np.float32)
ctx = None
times = []
for i in range(warmup + repeat):
    t0 = time.perf_counter()
    out, _, ctx = mha.forward_with_context(x, x, x, need_weights=False, is_causal=bool(causal),
                                           kernel="flash", context=ctx)
    g = mha.backward(ctx, d_out)
    t1 = time.perf_counter()
    if i >= warmup:
        times.append((t1 - t0) * 1e3)
    del g
print("median_ms=%.4f min_ms=%.4f" % (statistics.median(times), min(times)))
"""

TORCH_CHILD = r"""
import sys, time, statistics, torch
B, L, E, H, causal, threads, repeat, warmup = (int(a) for a in sys.argv[1:9])
torch.set_num_threads(threads)
torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(E, H).train()
x = torch.randn(L, B, E, requires_grad=True)
d_out = torch.randn(L, B, E)
mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
times = []
for i in range(warmup + repeat):
    for p in mha.parameters():
        p.grad = None
    x.grad = None
    t0 = time.perf_counter()
    out, _ = mha(x, x, x, need_weights=False, attn_mask=mask)
    out.backward(d_out)
    t1 = time.perf_counter()
    if i >= warmup:
        times.append((t1 - t0) * 1e3)
print("median_ms=%.4f min_ms=%.4f torch=%s" % (statistics.median(times), min(times), torch.__version__))
"""




def step_flops(B, L, E):
    return 24.0 * B * L * E * E + 12.0 * B * L * L * E


class Sides:
    def __init__(self, build_dir, threads, torch_env):
        self.pythonpath = os.path.join(os.path.abspath(build_dir), "python")
        self.threads = threads
        self.torch_env = torch_env

    def step(self, side, shape, repeat, warmup):
        """(median ms, peak RSS MiB) of one side on one shape, in a fresh process."""
        B, L, E, H, causal = shape
        argv = [str(v) for v in (B, L, E, H, int(causal), self.threads, repeat, warmup)]
        env = {"OMP_NUM_THREADS": str(self.threads)}
        if side == "ours":
            env["PYTHONPATH"] = self.pythonpath
            out, rss, _ = run_child(["/usr/bin/python3", "-c", OURS_CHILD] + argv, env)
        else:
            unset = ()
            if self.torch_env == "tuned":
                env.update(TUNED_ENV)
                unset = TUNED_UNSET
            out, rss, _ = run_child(["/usr/bin/python3", "-c", TORCH_CHILD] + argv, env, unset)
        return field(out, "median_ms"), rss


def fma_peak(build_dir, threads):
    probe = os.path.join(build_dir, "bench", "multihead_fma_peak")
    if not os.access(probe, os.X_OK):
        return None, None
    out, _, _ = run_child([probe, "--threads", str(threads)])
    return field(out, "fma_peak_gflops"), re.search(r"target=(\S+)", out).group(1)


def max_length(sides, side, fit, confirm):
    """The fitted longest L of one training step within BUDGET_BYTES."""
    E, H, L0, L1, L2 = fit
    rss = {}
    for L in (L0, L1, L2):
        _, rss[L] = sides.step(side, (1, L, E, H, False), 1, 0)
    base, g1, g2 = rss[L0], rss[L1] - rss[L0], rss[L2] - rss[L0]
    if g1 <= 0 or g2 <= g1:
        return rss, float("nan"), float("nan"), None
    k = math.log(g2 / g1) / math.log(L2 / L1)
    c = g2 / L2**k
    budget_mib = BUDGET_BYTES / 2**20
    L_max = ((budget_mib - base) / c) ** (1.0 / k)
    confirmed = None
    if confirm:
        L_try = int(L_max * 0.9) // 64 * 64
        _, confirmed = sides.step(side, (1, L_try, E, H, False), 1, 0)
        confirmed = (L_try, confirmed)
    return rss, k, L_max, confirmed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", required=True, help="CMake build dir with MULTIHEAD_BUILD_PYTHON=ON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="timed steps per measurement (median)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--torch-env", choices=["tuned", "shipped"], default="tuned")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test of this script")
    ap.add_argument("--no-memory-fit", action="store_true", help="skip the longest-L fit")
    ap.add_argument("--confirm-max-l", action="store_true", help="run ours once at 90%% of its fitted max L")
    args = ap.parse_args()

    if not os.path.exists(os.path.join(args.build_dir, "python", "multihead")):
        sys.exit("missing %s/python/multihead (configure with -DMULTIHEAD_BUILD_PYTHON=ON)" % args.build_dir)
    sides = Sides(args.build_dir, args.threads, args.torch_env)
    peak, target = fma_peak(args.build_dir, args.threads)
    if peak:
        print("Machine: FMA peak %.0f GFLOP/s (%d threads, %s)." % (peak, args.threads, target))
    else:
        print("Machine: FMA peak not measured (configure with -DMULTIHEAD_BUILD_BENCHMARKS=ON).")
    print("One training step (forward + backward, all gradients), float32, self-attention, %d threads; "
          "median of %d steps after %d warm-up, each (side, shape) in its own process; PyTorch %s.\n"
          % (args.threads, args.repeat, args.warmup, args.torch_env))
    print("FLOPs per step: 24·B·L·E² + 12·B·L²·E.\n")
    print("| shape (B,L,E,H) | ours | PyTorch | PyTorch / ours | ours GFLOP/s | PyTorch GFLOP/s"
          + (" | ours % of FMA peak" if peak else "") + " | peak RSS ours / PyTorch (MiB) |")
    print("|---|---|---|---|---|---" + ("|---" if peak else "") + "|---|")
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        B, L, E, H, causal = shape
        name = ("causal " if causal else "") + "(%d,%d,%d,%d)" % (B, L, E, H)
        our_ms, our_rss = sides.step("ours", shape, args.repeat, args.warmup)
        torch_ms, torch_rss = sides.step("torch", shape, args.repeat, args.warmup)
        f = step_flops(B, L, E)
        ours_gf, torch_gf = f / (our_ms * 1e6), f / (torch_ms * 1e6)
        print("| %s | %.2f ms | %.2f ms | %.2f× | %.0f | %.0f%s | %.0f / %.0f |"
              % (name, our_ms, torch_ms, torch_ms / our_ms, ours_gf, torch_gf,
                 (" | %.0f%%" % (100 * ours_gf / peak)) if peak else "", our_rss, torch_rss))
        sys.stdout.flush()

    if not args.no_memory_fit:
        fit = QUICK_MEMORY_FIT if args.quick else MEMORY_FIT
        E, H, L0, L1, L2 = fit
        print("\nLongest L of one training step in 24 GiB (B=1, E=%d, H=%d): a FIT, RSS(L) = RSS(%d) + c·L^k "
              "through L = %d and %d, not a measurement at that L.\n" % (E, H, L0, L1, L2))
        print("| side | RSS at L=%d / %d / %d (MiB) | fitted k | predicted max L | confirmed |" % (L0, L1, L2))
        print("|---|---|---|---|---|")
        for side in ("ours", "torch"):
            rss, k, L_max, confirmed = max_length(sides, side, fit, args.confirm_max_l and side == "ours")
            conf = "L=%d: %.0f MiB" % confirmed if confirmed else "–"
            print("| %s | %.0f / %.0f / %.0f | %.2f | %s | %s |"
                  % ("ours" if side == "ours" else "PyTorch", rss[L0], rss[L1], rss[L2], k,
                     "%.0f" % L_max if L_max == L_max else "n/a", conf))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
