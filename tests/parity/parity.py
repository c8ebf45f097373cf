#!/usr/bin/python3
"""Parity of `multihead forward` with torch.nn.MultiheadAttention (PyTorch 1.13).

For each of --configs seeded random configurations (configs.py: a scenario
table guarantees every option is covered, the rest is random) this script
writes the weights (safetensors, F32/F64/F16/BF16) and inputs (.npy), runs the
CLI once, and compares with a float64 reference taken from the values the
files actually hold (reference.py, validated against
torch.nn.functional.multi_head_attention_forward on every configuration).

Criterion (compare.py): NaN/Inf positions identical; ‖ours − ref‖/‖ref‖ over
finite entries < 1e-5 for the output and the attention weights when the CLI
computes in float32 (float32 query), < 1e-12 when it computes in float64.
Why these bounds hold: docs/parity.md.

Odd configurations run with MULTIHEAD_FUSED_PATHS=plain, so the table
covers the fused form's fast paths both ways.

Then: `multihead init` files load into torch (init_check.py), and the checker
is shown to catch a single perturbed element.

Usage: /usr/bin/python3 tests/parity/parity.py --multihead build/tools/multihead
           --workdir /tmp/parity --configs 240 --seed 20261129 [--only 17 42]
Exit status 1 on any failure.
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import case as case_mod  # noqa: E402
import compare as compare_mod  # noqa: E402
import configs as configs_mod  # noqa: E402
import init_check  # noqa: E402

# Per computation dtype (the query's): ~170 unit roundoffs, see docs/parity.md.
TOL = {"float32": 1e-5, "float64": 1e-12}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--multihead", required=True, help="path to the multihead CLI")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--configs", type=int, default=240)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--only", type=int, nargs="*", help="run only these configuration indices")
    ap.add_argument("--reference-only", action="store_true",
                    help="build configs and check the reference against PyTorch; do not run the CLI")
    ap.add_argument("--skip-init", action="store_true", help="skip the `multihead init` checks")
    return ap.parse_args()


def fused_paths(c):
    """The fused form's fast paths, both ways: odd configurations run with
    every plain alternative forced (MULTIHEAD_FUSED_PATHS=plain: head-major
    copies, separate projections, untransposed weights)."""
    return "plain" if c.idx % 2 else "auto"


def run_cli(case, paths):
    for p in (case.out_path, case.weights_path):
        if p and os.path.exists(p):
            os.remove(p)
    env = dict(os.environ, MULTIHEAD_FUSED_PATHS=paths)
    r = subprocess.run(case.cmd, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        return None, None, f"exit {r.returncode}: {r.stderr.strip()}"
    if not os.path.exists(case.out_path):
        return None, None, "exit 0 but no --out file"
    out = np.load(case.out_path)
    if out.dtype != case.out_dtype:
        return None, None, f"output dtype {out.dtype}, expected {case.out_dtype} (follows the query)"
    weights = None
    if case.weights_path:
        if not os.path.exists(case.weights_path):
            return None, None, "exit 0 but no --attn-weights-out file"
        weights = np.load(case.weights_path)
        if weights.dtype != case.out_dtype:
            return None, None, f"weights dtype {weights.dtype}, expected {case.out_dtype}"
    return out, weights, None


def main():
    args = parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    cli = os.path.abspath(args.multihead)
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    script = os.path.abspath(__file__)
    t0 = time.time()

    all_configs = configs_mod.generate(args.configs, args.seed)
    selected = [all_configs[i] for i in args.only] if args.only else all_configs
    if not args.reference_only and not os.access(cli, os.X_OK):
        print(f"parity: {cli} is not an executable file", file=sys.stderr)
        return 1

    passed = failed = 0
    worst = {"output": (0.0, None), "weights": (0.0, None)}
    worst_by_dtype = {}
    full_row_configs = {}  # masked-rows policy -> configs with a fully masked query row
    ref_checks = {}
    last_good = None

    def log(line):
        print(line, flush=True)

    for c in selected:
        d = os.path.join(workdir, f"c{c.idx:03d}")
        shutil.rmtree(d, ignore_errors=True)
        rerun = (f"/usr/bin/python3 {shlex.quote(script)} --multihead {shlex.quote(cli)} "
                 f"--workdir {shlex.quote(workdir)} --configs {args.configs} --seed {args.seed} "
                 f"--only {c.idx}")
        cs = case_mod.materialize(c, args.seed, d, cli)
        for chk in cs.self_checks:
            ref_checks[chk] = ref_checks.get(chk, 0) + 1
        if cs.fully_masked_rows:
            policy = c.masked_rows or "default(zeros)"
            full_row_configs[policy] = full_row_configs.get(policy, 0) + 1
        problems = [f"reference self-check: {e}" for e in cs.self_check_errors]
        if not args.reference_only and not problems:
            out, weights, err = run_cli(cs, fused_paths(c))
            if err:
                problems.append(err)
            else:
                results = [("output", out, cs.expected_out)]
                if cs.expected_weights is not None:
                    results.append(("weights", weights, cs.expected_weights))
                rels = {}
                for label, ours, ref in results:
                    ok, rel, detail = compare_mod.compare(ours, ref, TOL[c.qdtype])
                    if not ok:
                        problems.append(f"{label}: {detail}")
                    if rel > worst[label][0] or worst[label][1] is None:
                        worst[label] = (rel, c.idx)
                    rels[label] = rel
                if not problems:
                    last_good = (cs, out)
                    for label, rel in rels.items():
                        key = (c.qdtype, c.wdtype, label)
                        worst_by_dtype[key] = max(worst_by_dtype.get(key, 0.0), rel)
        if problems:
            failed += 1
            for p in problems:
                log(f"FAIL {c.name()} [{c.scenario}]: {p}")
            log(f"  cli:   MULTIHEAD_FUSED_PATHS={fused_paths(c)} {shlex.join(cs.cmd)}")
            log(f"  rerun: {rerun}")
        else:
            passed += 1

    table = configs_mod.coverage(selected)
    log("coverage (option: value=count):")
    for axis, values in table.items():
        items = sorted(values.items(), key=lambda kv: (type(kv[0]).__name__, kv[0] if isinstance(
            kv[0], int) else str(kv[0])))
        log(f"  {axis}: " + ", ".join(f"{k}={v}" for k, v in items))
    log("  configs with fully masked query rows, by --masked-rows: "
        + ", ".join(f"{k}={v}" for k, v in sorted(full_row_configs.items())))
    log("  reference self-checks run: " + ", ".join(f"{k}={v}" for k, v in ref_checks.items()))
    if not args.only and len(selected) >= len(configs_mod.SCENARIOS):
        missing = configs_mod.missing_coverage(table)
        if missing:
            failed += 1
            log(f"FAIL coverage: never drawn: {', '.join(missing)}")

    if not args.reference_only:
        if worst_by_dtype:
            log("worst relative error of the passing configurations, by (query dtype, weights dtype):")
            for (qd, wd, label), rel in sorted(worst_by_dtype.items()):
                log(f"  query={qd} weights={wd} {label}: {rel:.3e}")
        # The checker must catch a one-element perturbation (STYLE.md: test the checker).
        problems = []
        for tol in sorted(set(TOL.values())):
            problems += compare_mod.self_test(tol, np.random.default_rng(args.seed))
        if last_good is not None:
            cs, out = last_good
            bumped = out.astype(np.float64).copy()
            finite = np.argwhere(np.isfinite(bumped))
            j = tuple(finite[len(finite) // 2])
            tol = TOL[cs.config.qdtype]
            bumped[j] += 10 * tol * np.linalg.norm(np.nan_to_num(cs.expected_out))
            if compare_mod.compare(bumped, cs.expected_out, tol)[0]:
                problems.append(f"perturbing element {j} of config #{cs.config.idx}'s output went unnoticed")
        if problems:
            failed += 1
            for p in problems:
                log(f"FAIL checker self-test: {p}")
        else:
            log("checker self-test: a one-element perturbation and a misplaced NaN row are caught")
        if not args.skip_init and not args.only:
            n_init, f_init = init_check.run_all(cli, os.path.join(workdir, "init"), TOL["float64"], log)
            passed += n_init - f_init
            failed += f_init

    def fmt(label):
        rel, idx = worst[label]
        return f"{rel:.3e} (config #{idx})" if idx is not None else "n/a"

    log(f"parity: {len(selected)} configurations, worst output rel error {fmt('output')}, "
        f"worst weights rel error {fmt('weights')}  [{time.time() - t0:.1f} s]")
    plain = sum(1 for c in selected if fused_paths(c) == "plain")
    log(f"fused paths: {len(selected) - plain} configurations auto, {plain} plain (MULTIHEAD_FUSED_PATHS)")
    log(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
