"""`multihead ablate`: head importance, masking and pruning through the CLI
(multihead/head_ablation.hpp; the numbers' own checks are
tests/test_head_ablation.cpp: central differences, masking none and all).

  - the shipped model: the JSON's accuracy (nothing masked) is the one its
    file records (test_accuracy, the same double), the pruning curve starts
    there and ends at the no-attention accuracy, one importance and one
    masked-alone accuracy per head, the pruning order by importance (one
    layer: no normalisation changes the order);
  - a tiny grid (--grid, lesson, h = 1, 2, one layer, one seed) gives, for
    h = 2, exactly the numbers of `ablate --model` on the file that
    `experiment --save-model` writes with the same settings (the grid trains
    what the experiment trains);
  - tools/plot_ablation.py draws both plots and the table from the grid's JSON;
  - bad usage: grid flags without --grid, --model with --grid (one line, exit 2).

Usage: /usr/bin/python3 tests/cli/ablate.py --multihead PATH --plot-script tools/plot_ablation.py --workdir DIR
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FAILURES, PASSED = [], []
TINY = ["--d-model", "16", "--ff", "16", "--steps", "40", "--warmup", "5", "--first-seed", "3"]


def check(name, ok, detail=""):
    (PASSED if ok else FAILURES).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def run(cli, *args, cwd):
    r = subprocess.run([cli, *args], capture_output=True, text=True, timeout=300, cwd=cwd)
    return r.returncode, r.stdout, r.stderr


def metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--multihead", required=True)
    p.add_argument("--plot-script", required=True)
    p.add_argument("--workdir", required=True)
    a = p.parse_args()
    cli, work = os.path.abspath(a.multihead), os.path.abspath(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    code, out, err = run(cli, "ablate", "--json", "shipped.json", cwd=work)
    m = json.load(open(os.path.join(work, "shipped.json")))["models"][0] if code == 0 else {}
    recorded = float(metadata(os.path.join(ROOT, "models", "lesson-heads.safetensors"))["test_accuracy"])
    K = m.get("layers", 0) * m.get("heads", 0)
    check("shipped: nothing masked = the accuracy its file records", code == 0 and m["accuracy"] == recorded,
          f"exit {code} {err.strip()!r} {m.get('accuracy')} vs {recorded}")
    check("shipped: the curve runs from the accuracy to the no-attention accuracy, K + 1 points",
          m and len(m["pruned_accuracy"]) == K + 1 and m["pruned_accuracy"][0] == m["accuracy"]
          and m["pruned_accuracy"][-1] == m["no_attention_accuracy"], str(m)[:300])
    order = [m["head_names"].index(h) for h in m.get("prune_order", [])]
    check("shipped: one importance and one masked-alone accuracy per head, pruned by ascending importance",
          m and len(m["importance"]) == K == len(m["masked_alone"]) and sorted(order) == list(range(K))
          and [m["importance"][k] for k in order] == sorted(m["importance"]), str(m)[:300])
    print(f"     shipped: accuracy {m.get('accuracy')}, no attention {m.get('no_attention_accuracy')}, "
          f"masked alone {m.get('masked_alone')}")

    code, out, err = run(cli, "ablate", "--grid", "--tasks", "lesson", "--heads", "1,2", "--layers", "1", "--seeds", "1",
                         *TINY, "--json", "grid.json", cwd=work)
    grid = json.load(open(os.path.join(work, "grid.json")))["models"] if code == 0 else []
    check("grid: one model per cell and seed (2), a reproduce line first", code == 0 and len(grid) == 2
          and out.startswith("reproduce: multihead ablate --grid"), f"exit {code} {err.strip()!r}")
    # Every task experiment accepts, reverse (its held-out variant) included:
    # the grid ablated reverse with the training command's task, which has
    # no test set, and crashed after training.
    code, out, err = run(cli, "ablate", "--grid", "--tasks", "reverse", "--heads", "1", "--layers", "1", "--seeds",
                         "1", *TINY, cwd=work)
    check("grid on reverse: ablated on its held-out test set", code == 0 and "pruned, least important first" in out,
          f"exit {code} {err.strip()!r}")
    code1, _, err1 = run(cli, "experiment", "--save-model", "h2.safetensors", "--tasks", "lesson", "--heads", "2",
                         "--layers", "1", *TINY, cwd=work)
    code2, _, err2 = run(cli, "ablate", "--model", "h2.safetensors", "--json", "h2.json", cwd=work)
    one = json.load(open(os.path.join(work, "h2.json")))["models"][0] if code1 == code2 == 0 else {}
    from_grid = next((g for g in grid if g["heads"] == 2), {})
    keys = ["accuracy", "no_attention_accuracy", "importance", "masked_alone", "prune_order", "pruned_accuracy"]
    check("grid h=2 = ablate --model on experiment --save-model's file with the same settings",
          one and from_grid and all(one[k] == from_grid[k] for k in keys),
          f"exits {code1} {code2} {err1.strip()!r} {err2.strip()!r}")

    plots = os.path.join(work, "plots")
    r = subprocess.run(["/usr/bin/python3", a.plot_script, os.path.join(work, "grid.json"), "--out-dir", plots,
                        "--markdown", os.path.join(plots, "ablation.md")], capture_output=True, text=True, timeout=120)
    files = ["ablation_pruning.png", "ablation_masked_alone.png", "ablation.md"]
    check("plot_ablation.py draws both plots and the table", r.returncode == 0 and all(
        os.path.getsize(os.path.join(plots, f)) > 100 for f in files if os.path.exists(os.path.join(plots, f)))
        and all(os.path.exists(os.path.join(plots, f)) for f in files), r.stderr)

    for argv, words in ((["ablate", "--heads", "2"], ["--heads", "needs --grid"]),
                        (["ablate", "--grid", "--model", "h2.safetensors"], ["--model", "not used with --grid"]),
                        (["ablate", "--grid", "--heads", "3", "--d-model", "8"],
                         ["--heads: expected divisors of --d-model 8, got 3"]),
                        (["ablate", "--grid", "--tasks", "copy"],
                         ["--tasks: expected lesson, lookup2 or reverse", "got 'copy'"])):
        code, out, err = run(cli, *argv, cwd=work)
        check(f"bad usage: {' '.join(argv)}: one line, exit 2, nothing on stdout",
              code == 2 and len(err.strip().split("\n")) == 1 and not out.strip() and all(w in err for w in words),
              f"exit {code} {err!r} {out[:100]!r}")
    print(f"{len(PASSED)} passed, {len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
