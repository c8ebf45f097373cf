#!/usr/bin/python3
"""Plots and a table of a `multihead ablate --json` file, drawn with matplotlib.

  /usr/bin/python3 tools/plot_ablation.py ablation.json --out-dir DIR [--markdown FILE]

writes DIR/ablation_pruning.png (held-out test accuracy as heads are
pruned least important first, against the fraction of heads pruned; one
panel per task and layer count, one line per head count, the mean over
seeds with the band min–max; the no-attention accuracy where every line
ends) and DIR/ablation_masked_alone.png (per head count, the accuracy lost
by masking each head alone, every head of every seed a dot: one head that
matters shows as a dot far below zero). --markdown writes the table of
means (accuracy, no attention, worst and median head masked alone, and the
accuracy with ⌊K/2⌋ of the K = layers·h heads pruned). Needs Debian's python3-matplotlib
(scripts/install-deps.sh).
"""
import argparse
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def groups(report):
    """{(task, layers): {heads: [model, ...]}} in first-seen order."""
    out = {}
    for m in report["models"]:
        out.setdefault((m["task"], m["layers"]), {}).setdefault(m["heads"], []).append(m)
    return out


def plot_pruning(report, path):
    g = groups(report)
    fig, axes = plt.subplots(1, len(g), figsize=(4.0 * len(g), 3.3), squeeze=False)
    for ax, ((task, layers), by_heads) in zip(axes[0], g.items()):
        for heads in sorted(by_heads):
            ms = by_heads[heads]
            K = len(ms[0]["pruned_accuracy"]) - 1
            x = [k / K for k in range(K + 1)]
            curves = [[100 * a for a in m["pruned_accuracy"]] for m in ms]
            mean = [statistics.mean(c[k] for c in curves) for k in range(K + 1)]
            line, = ax.plot(x, mean, marker="o", markersize=3, label=f"h = {heads}")
            ax.fill_between(x, [min(c[k] for c in curves) for k in range(K + 1)],
                            [max(c[k] for c in curves) for k in range(K + 1)], color=line.get_color(), alpha=0.15)
        ax.set_xlabel("fraction of heads pruned (least important first)")
        ax.set_ylabel("held-out test accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"{task}, {layers} layer{'s' if layers > 1 else ''}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    n = max(len(v) for by in g.values() for v in by.values())
    fig.suptitle(f"pruning by importance E|dL/d\u03be_h| (Michel et al. 2019); mean over {n} seed(s), band min\u2013max; "
                 "at 1.0 every head is masked (no attention)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_masked_alone(report, path):
    g = groups(report)
    fig, axes = plt.subplots(1, len(g), figsize=(4.0 * len(g), 3.3), squeeze=False)
    for ax, ((task, layers), by_heads) in zip(axes[0], g.items()):
        hs = sorted(by_heads)
        for i, heads in enumerate(hs):
            drops = [100 * (a - m["accuracy"]) for m in by_heads[heads] for a in m["masked_alone"]]
            ax.scatter([i + (j % 7 - 3) * 0.03 for j in range(len(drops))], drops, s=8, alpha=0.6)
        ax.axhline(0, color="gray", linewidth=1)
        ax.set_xticks(range(len(hs)))
        ax.set_xticklabels([str(h) for h in hs])
        ax.set_xlabel("heads per layer")
        ax.set_ylabel("accuracy change, one head masked (points)")
        ax.set_title(f"{task}, {layers} layer{'s' if layers > 1 else ''}")
        ax.grid(alpha=0.3)
    fig.suptitle("each dot: one head of one seed, masked alone (\u03be_h = 0)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(report):
    rows = ["| task | layers | h | seeds | accuracy | no attention | worst head masked alone | median head masked "
            "alone | ⌊K/2⌋ of the K heads pruned |", "|---|---|---|---|---|---|---|---|---|"]
    pct = lambda v: f"{100 * v:.1f}"
    for (task, layers), by_heads in groups(report).items():
        for heads in sorted(by_heads):
            ms = by_heads[heads]
            K = len(ms[0]["pruned_accuracy"]) - 1
            mean = lambda f: statistics.mean(f(m) for m in ms)
            rows.append(f"| {task} | {layers} | {heads} | {len(ms)} | {pct(mean(lambda m: m['accuracy']))} | "
                        f"{pct(mean(lambda m: m['no_attention_accuracy']))} | "
                        f"{pct(mean(lambda m: min(m['masked_alone'])))} | "
                        f"{pct(mean(lambda m: statistics.median(m['masked_alone'])))} | "
                        f"{pct(mean(lambda m: m['pruned_accuracy'][K // 2]))} |")
    return "\n".join(rows) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--markdown")
    a = p.parse_args()
    with open(a.json) as f:
        report = json.load(f)
    os.makedirs(a.out_dir, exist_ok=True)
    plot_pruning(report, os.path.join(a.out_dir, "ablation_pruning.png"))
    plot_masked_alone(report, os.path.join(a.out_dir, "ablation_masked_alone.png"))
    table = markdown(report)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(f"`{report['command']}`\n\n" + table)
    print(table, end="")


if __name__ == "__main__":
    main()
