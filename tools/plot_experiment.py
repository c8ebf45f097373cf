#!/usr/bin/python3
"""Plots of a `multihead experiment --json` file, drawn with matplotlib.

  /usr/bin/python3 tools/plot_experiment.py experiment.json --out-dir DIR

writes DIR/accuracy_vs_heads.png (held-out test accuracy against the head
count, mean with sample-std error bars, one line per layer count, chance
dashed), DIR/training_curves.png (mean training loss against steps, one
panel per task and layer count, one line per head count, the band one std
over seeds) and DIR/test_accuracy_curves.png (the same for the held-out
test accuracy, measured --curve-points times per run), and for the lesson
task DIR/selectivity.png (the best head's referent and adjective
selectivity, trained beside its untrained and label-permuted baselines,
mean ± std over seeds). With several --positions, each encoding is its own
line (and accuracy_vs_positions.png draws accuracy per encoding). Needs Debian's python3-matplotlib (scripts/install-deps.sh).
"""
import argparse
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def cells(report, task):
    return [c for c in report["cells"] if c["task"] == task]


def plot_accuracy(report, path):
    tasks = report["options"]["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        several = len(report["options"]["positions"]) > 1
        for layers in report["options"]["layers"]:
            for pos in report["options"]["positions"]:
                cs = sorted((c for c in cells(report, task) if c["layers"] == layers and c["positions"] == pos),
                            key=lambda c: c["heads"])
                ax.errorbar([c["heads"] for c in cs], [100 * c["accuracy_mean"] for c in cs],
                            yerr=[100 * c["accuracy_std"] for c in cs], marker="o", capsize=3,
                            label=f"{layers} layer{'s' if layers > 1 else ''}" + (f", {pos}" if several else ""))
        ax.axhline(100 * report["chance"][task]["accuracy"], color="gray", linestyle="--", linewidth=1,
                   label="chance")
        ax.set_xscale("log", base=2)
        ax.set_xticks(report["options"]["heads"])
        ax.set_xticklabels([str(h) for h in report["options"]["heads"]])
        ax.set_xlabel(f"heads (d_model {report['options']['d_model']} for all)")
        ax.set_ylabel("held-out test accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    n = report["options"]["seeds"]
    fig.suptitle(f"mean ± std over {n} seeds, {report['options']['steps']} steps each", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_curves(report, path, key="train_loss", ylabel="training loss", percent=False):
    tasks, layer_counts = report["options"]["tasks"], report["options"]["layers"]
    fig, axes = plt.subplots(len(tasks), len(layer_counts), figsize=(4.2 * len(layer_counts), 2.8 * len(tasks)),
                             squeeze=False)
    for i, task in enumerate(tasks):
        for j, layers in enumerate(layer_counts):
            ax = axes[i][j]
            several = len(report["options"]["positions"]) > 1
            for pos, h in ((p, h) for p in report["options"]["positions"] for h in report["options"]["heads"]):
                runs = [r for r in report["runs"] if r["task"] == task and r["layers"] == layers and r["heads"] == h
                        and r["positions"] == pos]
                if not runs:
                    continue
                steps = runs[0]["curve"]["step"]
                scale = 100.0 if percent else 1.0
                per_point = list(zip(*([scale * v for v in r["curve"][key]] for r in runs)))
                mean = [statistics.mean(p) for p in per_point]
                sd = [statistics.stdev(p) if len(p) > 1 else 0.0 for p in per_point]
                (line,) = ax.plot(steps, mean, label=(f"{pos} " if several else "") + f"h={h}")
                ax.fill_between(steps, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                                color=line.get_color(), alpha=0.15)
            ax.set_title(f"{task}, {layers} layer{'s' if layers > 1 else ''}", fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            if percent:
                ax.set_ylim(0, 100)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_positions(report, path):
    tasks, positions = report["options"]["tasks"], report["options"]["positions"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        keys = sorted({(c["layers"], c["heads"]) for c in cells(report, task)})
        width = 0.8 / len(keys)
        for k, (layers, h) in enumerate(keys):
            cs = [next(c for c in cells(report, task) if c["layers"] == layers and c["heads"] == h and
                       c["positions"] == p) for p in positions]
            ax.bar([i + k * width for i in range(len(positions))], [100 * c["accuracy_mean"] for c in cs], width,
                   yerr=[100 * c["accuracy_std"] for c in cs], capsize=2, label=f"{layers} layer, h={h}")
        ax.axhline(100 * report["chance"][task]["accuracy"], color="gray", linestyle="--", linewidth=1, label="chance")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(positions))])
        ax.set_xticklabels(positions)
        ax.set_ylabel("held-out test accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title(task)
        ax.legend(fontsize=7)
    fig.suptitle(f"mean ± std over {report['options']['seeds']} seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_selectivity(report, path):
    cs = [c for c in report["cells"] if "referent_mean" in c]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), squeeze=False)
    for ax, kind in zip(axes[0], ("referent", "adjective")):
        labels = [f"L{c['layers']} h{c['heads']}" + ("" if c["positions"] == "sinusoidal" else f" {c['positions']}")
                  for c in cs]
        for k, which in enumerate(("trained", "untrained", "permuted")):
            vals = []
            for c in cs:
                rs = [r for r in report["runs"] if r["task"] == c["task"] and r["layers"] == c["layers"] and
                      r["heads"] == c["heads"] and r["positions"] == c["positions"]]
                vals.append([r["heads_measures"][which]["roles"][kind] for r in rs])
            ax.bar([i + k * 0.27 for i in range(len(cs))], [statistics.mean(v) for v in vals], 0.27,
                   yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in vals], capsize=2, label=which)
        ax.axhline(report["statistics"]["role_threshold"], color="gray", linestyle="--", linewidth=1,
                   label="role threshold")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xticks([i + 0.27 for i in range(len(cs))])
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel(f"best head's {kind} selectivity")
        ax.legend(fontsize=7)
    fig.suptitle("lesson task: head selectivity beside its baselines (mean ± std over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    with open(args.json) as f:
        report = json.load(f)
    if report.get("format") != "multihead-experiment-2":
        raise SystemExit(f"plot_experiment: {args.json}: not a multihead experiment file "
                         f"(format {report.get('format')!r})")
    os.makedirs(args.out_dir, exist_ok=True)
    plot_accuracy(report, os.path.join(args.out_dir, "accuracy_vs_heads.png"))
    plot_curves(report, os.path.join(args.out_dir, "training_curves.png"))
    plot_curves(report, os.path.join(args.out_dir, "test_accuracy_curves.png"), key="test_accuracy",
                ylabel="held-out test accuracy (%)", percent=True)
    written = ["accuracy_vs_heads.png", "training_curves.png", "test_accuracy_curves.png"]
    if any("referent_mean" in c for c in report["cells"]):
        plot_selectivity(report, os.path.join(args.out_dir, "selectivity.png"))
        written.append("selectivity.png")
    if len(report["options"]["positions"]) > 1:
        plot_positions(report, os.path.join(args.out_dir, "accuracy_vs_positions.png"))
        written.append("accuracy_vs_positions.png")
    print(f"plot_experiment: wrote {', '.join(written)} in {args.out_dir}")


if __name__ == "__main__":
    main()
