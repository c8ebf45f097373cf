#!/usr/bin/python3
"""multihead.torch's cost of following an optimizer step, per training
step: the library module reading the torch Parameters in place (now:
share_parameters, nothing to do after an in-place step) against holding
copies of them (before: _CorePool, which compares every parameter with its
snapshot, reloads the library module's copy and rebuilds it, then clones a
new snapshot). A benchmark, not a test; the same extension for both sides
(the copying side is the same module with MultiheadAttention._shares off).

For each side, `--steps` training steps of one multihead.torch
MultiheadAttention layer (self-attention, (L, B, E) = (128, 8, 512), H = 8,
float32, AdamW), timed in CPU time (time.process_time, both threads'
seconds: meaningful on a loaded machine, with OMP_WAIT_POLICY=passive so
that idle threads do not spin) split into
  sync   the parameter bookkeeping before the library's forward
         (pool.get / _SharedCore.get), and
  step   the whole step (forward + backward + AdamW), which includes it.
Rows are medians over the steps after one warm-up step.

Usage (after building the Python module):
  PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_param_sync.py [--steps 20] [--threads 2]
  ... --smoke    (L, B, E) = (16, 2, 64), 3 steps: checks that it runs
"""
import argparse
import os
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    # Idle OpenMP threads sleep rather than spin, so that CPU time counts work.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    import torch
    import multihead
    import multihead.torch as mt
    torch.set_num_threads(a.threads)
    multihead.set_threads(a.threads)
    L, B, E, H = (16, 2, 64, 4) if a.smoke else (128, 8, 512, 8)
    steps = 3 if a.smoke else a.steps

    timings = {}
    for shares in (False, True):
        torch.manual_seed(0)
        mt.MultiheadAttention._shares = shares
        m = mt.MultiheadAttention(E, H)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x = torch.randn(L, B, E, requires_grad=True)
        sync = []
        pool_type = mt._SharedCore if shares else mt._CorePool
        original_get = pool_type.get

        def timed_get(self, names, params):
            t = time.process_time()
            r = original_get(self, names, params)
            sync.append(time.process_time() - t)
            return r
        pool_type.get = timed_get
        total = []
        try:
            for _ in range(steps + 1):
                t = time.process_time()
                out, _ = m(x, x, x, need_weights=False)
                out.square().mean().backward()
                opt.step()
                opt.zero_grad()
                total.append(time.process_time() - t)
        finally:
            pool_type.get = original_get
        timings["reads in place (now)" if shares else "copies (before)"] = (
            statistics.median(sync[1:]), statistics.median(total[1:]))
    mt.MultiheadAttention._shares = True
    print(f"(L, B, E, H) = ({L}, {B}, {E}, {H}), float32, {a.threads} threads, CPU ms per step, median of {steps}")
    print("| parameters | sync | whole step |\n|---|---:|---:|")
    for k, (s, t) in timings.items():
        print(f"| {k} | {s * 1e3:.2f} | {t * 1e3:.1f} |")


if __name__ == "__main__":
    main()
