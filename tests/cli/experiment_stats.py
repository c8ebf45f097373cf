#!/usr/bin/python3
"""Recompute every statistic of a `multihead experiment --json` file from its
per-seed numbers, independently of the C++ (scipy 1.10 for the t
distribution; Holm, the bootstrap and the measures written out here from
docs/experiment.md), and fail on any difference.

Checks, for every comparison:
  - a_values / b_values are the runs' own numbers (seed order) for the
    family's measure; the runs' accuracy_area and steps_to_90 are
    recomputed from their curves and untrained accuracy, and the head
    measures' maxima and roles from the per-head selectivities;
  - the paired t, df and two-sided p (scipy.stats.ttest_rel), d_z;
  - Holm's step-down p within each family (for the t-test and for TOST);
  - the 95% bootstrap CI of the mean difference: SplitMix64 from the stated
    seed, the stated resampling rule, bit for bit;
  - TOST: max(t.sf(t_lower), t.cdf(t_upper)) with the stated margin;
  - every cell shows the untrained baseline beside its measures.

Usage: experiment_stats.py FILE.json   (exit 0: all agree; 1: a difference)
"""
import json
import math
import sys

import numpy as np
from scipy import stats

MASK = (1 << 64) - 1
FAILURES = []


def check(name, ok, detail=""):
    if not ok:
        FAILURES.append(name)
        print(f"FAIL {name}: {detail}")


def close(x, y, rel=1e-9, abs_=1e-12):
    if isinstance(x, str) or isinstance(y, str):
        return x == y
    return abs(x - y) <= max(abs_, rel * max(abs(x), abs(y)))


def splitmix64(state):
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def bootstrap_ci(x, seed, resamples, level):
    n = len(x)
    rng = splitmix64(seed)
    means = []
    for _ in range(resamples):
        s = 0.0
        for _ in range(n):
            s += x[((next(rng) >> 32) * n) >> 32]
        means.append(s / n)
    means.sort()
    k = math.floor(resamples * (1 - level) / 2)
    return means[k], means[resamples - 1 - k]


def holm(p):
    order = sorted(range(len(p)), key=lambda i: p[i])  # stable: ties keep input order
    out, running = [0.0] * len(p), 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - j) * p[i]))
        out[i] = running
    return out


def curve_area(a0, steps, acc):
    area, ps, pa = 0.0, 0.0, a0
    for s, a in zip(steps, acc):
        area += (s - ps) * (pa + a) / 2
        ps, pa = s, a
    return area / steps[-1]


def steps_to(a0, steps, acc, fraction):
    target = fraction * acc[-1]
    if a0 >= target:
        return 0
    for s, a in zip(steps, acc):
        if a >= target:
            return s
    return steps[-1]


def role(f, tau):
    score = min(f["on_subject"], f["on_object"])
    pref = (f["on_subject"] - f["on_object"]) / 2
    if score >= tau:
        return "referent"
    if pref >= tau:
        return "subject"
    if -pref >= tau:
        return "object"
    return "none"


def run_value(run, family, which):
    if family.endswith("final_accuracy"):
        return run["test_accuracy"]
    if family.endswith("accuracy_area"):
        return run["accuracy_area"]
    if family == "steps_to_90":
        return float(run["steps_to_90"])
    kind = "referent" if family == "referent_selectivity" else "adjective"
    return run["heads_measures"][which]["roles"][kind]


def main():
    rep = json.load(open(sys.argv[1]))
    st = rep["statistics"]
    tau = st["role_threshold"]
    # The runs' own measures.
    for run in rep["runs"]:
        name = f"{run['task']} {run['positions']} L{run['layers']} h{run['heads']} seed {run['seed']}"
        c = run["curve"]
        check(f"accuracy_area {name}", close(run["accuracy_area"],
                                             curve_area(run["untrained_accuracy"], c["step"], c["test_accuracy"])))
        check(f"steps_to_90 {name}", run["steps_to_90"] == steps_to(run["untrained_accuracy"], c["step"],
                                                                     c["test_accuracy"], st["steps_to_fraction"]))
        for which, m in run.get("heads_measures", {}).items():
            fs = m["focus"]
            check(f"referent max {which} {name}", close(m["roles"]["referent"],
                                                         max(min(f["on_subject"], f["on_object"]) for f in fs)))
            check(f"adjective max {which} {name}", close(m["roles"]["adjective"],
                                                          max(f["adjective_selectivity"] for f in fs)))
            for f in fs:
                check(f"role {which} {name} {f['layer']}.{f['head']}", f["role"] == role(f, tau), f["role"])
    # The comparisons.
    def cell_runs(task, layers, positions, heads):
        rs = [r for r in rep["runs"] if r["task"] == task and r["layers"] == layers and r["positions"] == positions
              and r["heads"] == heads]
        return sorted(rs, key=lambda r: r["seed"])

    families = {}
    for i, c in enumerate(rep["comparisons"]):
        families.setdefault(c["family"], []).append(i)
        name = f"{c['family']} {c['task']} L{c['layers']} h{c['heads']} {c['positions']} {c['a']} vs {c['b']}"
        a, b = np.array(c["a_values"]), np.array(c["b_values"])
        # The values are the runs' own.
        fam = c["family"]
        if fam in ("referent_selectivity", "adjective_selectivity"):
            rs = cell_runs(c["task"], c["layers"], c["positions"], c["heads"])
            want_a = [run_value(r, fam, "trained") for r in rs]
            want_b = [run_value(r, fam, c["b"]) for r in rs]
        elif fam.startswith("positions_"):
            want_a = [run_value(r, fam, None) for r in cell_runs(c["task"], c["layers"], c["a"], c["heads"])]
            want_b = [run_value(r, fam, None) for r in cell_runs(c["task"], c["layers"], c["b"], c["heads"])]
        else:
            ha, hb = int(c["a"].split("h=")[1]), int(c["b"].split("h=")[1])
            want_a = [run_value(r, fam, None) for r in cell_runs(c["task"], c["layers"], c["positions"], ha)]
            want_b = [run_value(r, fam, None) for r in cell_runs(c["task"], c["layers"], c["positions"], hb)]
        check(f"a_values are the runs' {name}", list(a) == want_a and len(a) == rep["options"]["seeds"])
        check(f"b_values are the runs' {name}", list(b) == want_b)
        d = a - b
        check(f"mean difference {name}", close(c["mean_difference"], float(np.mean(d))))
        sd = float(np.std(d, ddof=1))
        if sd == 0:
            want_t = 0.0 if d[0] == 0 else ("inf" if d[0] > 0 else "-inf")
            want_p = 1.0 if d[0] == 0 else 0.0
        else:
            r = stats.ttest_rel(a, b)
            want_t, want_p = float(r.statistic), float(r.pvalue)
            check(f"d_z {name}", close(c["dz"], float(np.mean(d)) / sd))
        check(f"paired t {name}", close(c["t"], want_t), f"{c['t']} vs {want_t}")
        check(f"paired p {name}", close(c["p"], want_p), f"{c['p']} vs {want_p}")
        check(f"df {name}", c["df"] == len(d) - 1)
        lo, hi = bootstrap_ci(list(d), st["bootstrap_seed"], st["bootstrap_resamples"], st["bootstrap_level"])
        check(f"bootstrap CI {name}", c["ci_lower"] == lo and c["ci_upper"] == hi,
              f"[{c['ci_lower']}, {c['ci_upper']}] vs [{lo}, {hi}]")
        if "tost_p" in c:
            m = st["equivalence_margin"]
            check(f"tost margin {name}", c["tost_margin"] == m)
            if sd == 0:
                want = 0.0 if abs(float(np.mean(d))) < m else 1.0
            else:
                se = sd / math.sqrt(len(d))
                want = max(float(stats.t.sf((np.mean(d) + m) / se, len(d) - 1)),
                           float(stats.t.cdf((np.mean(d) - m) / se, len(d) - 1)))
            check(f"TOST p {name}", close(c["tost_p"], want), f"{c['tost_p']} vs {want}")
    for fam, members in families.items():
        hp = holm([rep["comparisons"][i]["p"] for i in members])
        for k, i in enumerate(members):
            check(f"Holm p {fam} #{k}", close(rep["comparisons"][i]["p_holm"], hp[k]),
                  f"{rep['comparisons'][i]['p_holm']} vs {hp[k]}")
        tm = [i for i in members if "tost_p" in rep["comparisons"][i]]
        ht = holm([rep["comparisons"][i]["tost_p"] for i in tm])
        for k, i in enumerate(tm):
            check(f"Holm TOST p {fam} #{k}", close(rep["comparisons"][i]["tost_p_holm"], ht[k]))
    # The untrained baseline beside each measure.
    for cell in rep["cells"]:
        check(f"untrained accuracy beside {cell['task']} h{cell['heads']}", "untrained_accuracy_mean" in cell)
        if "referent_mean" in cell:
            for k in ("referent_untrained_mean", "referent_permuted_mean", "adjective_untrained_mean",
                      "adjective_permuted_mean"):
                check(f"{k} beside {cell['task']} h{cell['heads']}", k in cell)
    print(f"experiment_stats: {len(rep['comparisons'])} comparisons, {len(rep['runs'])} runs; "
          f"{len(FAILURES)} differences")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
