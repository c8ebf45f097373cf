#!/usr/bin/python3
"""The cost of `train --parallel data` per step (not a test).

Rows, alternated round by round (STYLE.md §18), median of the rounds:
  batched    multihead train ...                      (one batched pass)
  P=1        multihead train --parallel data ...      (one pass per example, no mpirun)
  P=2, P=4   mpirun -np P multihead train --parallel data ...
Each rank runs one thread (OMP_NUM_THREADS=1, --threads 1). The time is the
program's own "steps 0-N in T s" (training only: no start-up, no MPI_Init).
The per-example rows pay B passes of one example instead of one pass of B
(smaller matrix products) plus, across ranks, the chain of gradient folds
and one broadcast of every gradient per step (multihead/data_parallel.hpp).

  /usr/bin/python3 bench/bench_train_data_parallel.py --multihead build/tools/multihead [--rounds 5] [--steps 50]
  --smoke: 1 round of 5 steps (checks that the script runs; the numbers mean nothing)
"""
import argparse
import os
import re
import statistics
import subprocess

DONE = re.compile(r"steps \d+-(\d+) in ([0-9.]+) s")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--multihead", required=True)
    p.add_argument("--mpiexec", default="/usr/bin/mpiexec")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    if a.smoke:
        a.rounds, a.steps = 1, 5
    # The README's example model: d_model 64, 2 layers, 4 heads, ff 128, batch 32, L 8.
    args = ["train", "--steps", str(a.steps), "--threads", "1", "--progress", "none"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_plm="isolated", OMPI_MCA_rmaps_base_oversubscribe="1")
    rows = {
        "batched": [a.multihead, *args],
        "P=1": [a.multihead, *args, "--parallel", "data"],
        "P=2": [a.mpiexec, "-np", "2", "--oversubscribe", a.multihead, *args, "--parallel", "data"],
        "P=4": [a.mpiexec, "-np", "4", "--oversubscribe", a.multihead, *args, "--parallel", "data"],
    }
    times = {name: [] for name in rows}
    for _ in range(a.rounds):
        for name, cmd in rows.items():
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
            m = DONE.search(out)
            times[name].append(float(m.group(2)) / a.steps * 1e3)
    base = statistics.median(times["batched"])
    print(f"{'row':8} {'ms/step (median of ' + str(a.rounds) + ')':>24} {'vs batched':>11}")
    for name, t in times.items():
        print(f"{name:8} {statistics.median(t):24.2f} {statistics.median(t) / base:11.2f}")


if __name__ == "__main__":
    main()
