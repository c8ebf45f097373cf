#!/usr/bin/python3
"""`multihead experiment --quick`, the CI run of the heads experiment.

Checks no exact accuracy (the runs are deterministic, but a change to the
trainer may move them a little); it checks that
  - every run's training lowers the loss: the mean of the last tenth of the
    steps is below 0.9 × the first step's loss (a one-head lookup2 run may
    learn little more than the answers' prior: 4.87 -> 4.14 at seed 1);
  - accuracy on the held-out test set beats chance by a stated margin, on
    average over the task's runs: lesson (chance 50%, a guess between
    subject and object) by 15 points; lookup2 (chance 1/64) by 3 points;
  - the JSON has every cell and run, the head counts of a task and layer
    count have the same parameter count, p-values are in [0, 1];
  - every statistic recomputes from the JSON's per-seed numbers
    (tests/cli/experiment_stats.py, scipy), and a deliberately broken one
    fails that check: a copy of the JSON with one p, one Holm p, one CI
    bound, one TOST p or one per-seed value perturbed must be refused;
  - the untrained and label-permuted baselines are shown beside the head
    measures in the Markdown table;
  - the command printed first ("reproduce: ...") is a multihead experiment
    command, and the Markdown table was written;
  - tools/plot_experiment.py draws the three plots from the JSON (PNG files);
  - the whole run takes under --max-seconds (180 s here; 240 under the
    sanitizers): a guard against a runaway, not a benchmark. The Release
    run takes under a minute on an idle 2-core machine and 54 s was seen
    beside the rest of the suite on a slow host, so 60 s would be a timed
    test that fails on load.

Under the sanitizers (--sanitized) `experiment --quick` (16 runs of 600
steps) takes past 300 s on 2 cores, so a smaller experiment runs instead
(SANITIZED_FLAGS: the same two tasks, heads 1 and 2, 3 seeds of 60 steps at
d_model 16): the same code paths (training, evaluation, head measures,
baselines, statistics, Markdown, JSON, plots) under ASan and UBSan, with
every check above but the two about learning (the loss and accuracy
margins), which need the full run's steps and run in the Release suite.

Usage: /usr/bin/python3 tests/cli/experiment_quick.py --multihead PATH --plot-script PATH --workdir DIR [--sanitized]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

MARGIN = {"lesson": 0.15, "lookup2": 0.03}
FAILURES = []
SANITIZED_FLAGS = ["--tasks", "lesson,lookup2", "--heads", "1,2", "--layers", "1", "--seeds", "3", "--steps", "60",
                   "--warmup", "10", "--curve-points", "2", "--d-model", "16", "--ff", "16", "--batch", "16"]


def check(name, ok, detail=""):
    if not ok:
        FAILURES.append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--plot-script", required=True)
    ap.add_argument("--stats-script", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--max-seconds", type=float, default=180.0)
    ap.add_argument("--sanitized", action="store_true")
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    js, md = os.path.join(args.workdir, "quick.json"), os.path.join(args.workdir, "quick.md")

    start = time.monotonic()
    size = SANITIZED_FLAGS if args.sanitized else ["--quick"]
    r = subprocess.run([args.multihead, "experiment", *size, "--json", js, "--markdown", md],
                       capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    check("experiment --quick exits 0", r.returncode == 0, r.stderr.strip())
    if r.returncode != 0:
        return 1
    check(f"experiment {'(smaller, --sanitized)' if args.sanitized else '--quick'} under {args.max_seconds:.0f} s", seconds < args.max_seconds, f"{seconds:.1f} s")
    first = r.stdout.splitlines()[0]
    if args.sanitized:
        print("skip the learning checks (loss and accuracy margins): --sanitized runs 60 steps, not --quick's 600")
    check("first line is the reproducing command", first.startswith("reproduce: multihead experiment --tasks "), first)

    with open(js) as f:
        rep = json.load(f)
    o = rep["options"]
    n_cells = len(o["tasks"]) * len(o["heads"]) * len(o["layers"])
    check("a cell per (task, heads, layers)", len(rep["cells"]) == n_cells, f"{len(rep['cells'])} vs {n_cells}")
    check("a run per (cell, seed)", len(rep["runs"]) == n_cells * o["seeds"], f"{len(rep['runs'])}")
    learning = not args.sanitized  # the learning checks need --quick's 600 steps
    for run in rep["runs"] if learning else []:
        name = f"{run['task']} layers={run['layers']} heads={run['heads']} seed={run['seed']}"
        check(f"training lowers the loss: {name}", run["final_loss"] < 0.9 * run["first_loss"],
              f"{run['first_loss']:.4f} -> {run['final_loss']:.4f}")
    for task in o["tasks"]:
        runs = [x for x in rep["runs"] if x["task"] == task]
        mean = sum(x["test_accuracy"] for x in runs) / len(runs)
        chance = rep["chance"][task]["accuracy"]
        if learning:
            check(f"{task}: mean test accuracy beats chance {chance:.3f} by {MARGIN[task]}",
                  mean >= chance + MARGIN[task], f"mean {mean:.4f}")
        for layers in o["layers"]:
            params = {c["parameters"] for c in rep["cells"] if c["task"] == task and c["layers"] == layers}
            check(f"{task}, {layers} layers: one parameter count for every h", len(params) == 1, f"{params}")
    for c in rep["comparisons"]:
        check(f"p-value in [0, 1]: {c['task']} layers={c['layers']}", 0 <= c["p"] <= 1, f"{c['p']}")
    with open(md) as f:
        table = f.read()
    check("Markdown table written", "| layers | heads |" in table and "Holm" in table, table[:200])
    check("Markdown shows the baselines beside the head measures",
          "referent selectivity (untrained, permuted)" in table and "untrained %" in table, table[:400])

    # Every statistic recomputed; a broken one refused.
    def stats_ok(path):
        return subprocess.run(["/usr/bin/python3", args.stats_script, path], capture_output=True, text=True,
                              timeout=300)
    s = stats_ok(js)
    check("every statistic recomputes from the per-seed numbers", s.returncode == 0, s.stdout[-800:])
    lesson = next(i for i, c in enumerate(rep["comparisons"]) if c["family"] == "final_accuracy")
    for what, key, change in (("p", "p", lambda v: v * 1.01 + 1e-6), ("Holm p", "p_holm", lambda v: v * 0.5),
                              ("CI bound", "ci_lower", lambda v: v - 1e-9), ("TOST p", "tost_p", lambda v: v * 0.9),
                              ("per-seed value", "a_values", lambda v: [v[0] + 1e-3] + v[1:])):
        broken = json.loads(json.dumps(rep))
        c = broken["comparisons"][lesson]
        c[key] = change(c[key])
        path = os.path.join(args.workdir, f"broken_{key}.json")
        with open(path, "w") as f:
            json.dump(broken, f)
        b = stats_ok(path)
        check(f"a perturbed {what} fails the statistics check", b.returncode == 1 and "FAIL" in b.stdout,
              f"exit {b.returncode}: {b.stdout[-300:]}")

    plots = os.path.join(args.workdir, "plots")
    p = subprocess.run(["/usr/bin/python3", args.plot_script, js, "--out-dir", plots], capture_output=True, text=True,
                       timeout=300)
    check("plot_experiment.py exits 0", p.returncode == 0, p.stderr.strip()[-500:])
    for name in ("accuracy_vs_heads.png", "training_curves.png", "test_accuracy_curves.png"):
        path = os.path.join(plots, name)
        ok = os.path.exists(path) and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
        check(f"plot {name} is a PNG", ok, path)
    print(f"experiment: {seconds:.1f} s; {len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
