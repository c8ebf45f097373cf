#!/usr/bin/python3
"""Writes the explain fixtures: a small MultiheadAttention and an input for
the lesson's sentence, and the text view's golden outputs.

  w.safetensors   multihead init --embed-dim 16 --num-heads 4 --seed 3
  x.npy           (11, 16) float32, numpy.random.default_rng(5).standard_normal * 3
                  (one row per token of "The animal didn't cross the street
                  because it was too tired"; scaled so the heads' weights are
                  far from uniform)
  text_it.txt           `explain --format text --token it`, standard output a pipe (ASCII)
  text_it_terminal.txt  the same with standard output a terminal (Unicode shading, ANSI colour)

The weights are seeded, not trained: the pattern shows the mechanics, not
linguistics. tests/cli/explain.py compares against these files. Rerun after
a deliberate change of the text view, and check the diff by eye:
    /usr/bin/python3 tests/data/explain/make_fixtures.py --multihead build/tools/multihead
"""
import argparse
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "cli"))
from explain_common import SENTENCE, run_in_terminal  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--multihead", required=True)
    cli = os.path.abspath(p.parse_args().multihead)
    subprocess.run([cli, "init", "--embed-dim", "16", "--num-heads", "4", "--seed", "3", "--out",
                    "w.safetensors"], cwd=HERE, check=True)
    x = (np.random.default_rng(5).standard_normal((11, 16)) * 3).astype(np.float32)
    np.save(os.path.join(HERE, "x.npy"), x)
    argv = [cli, "explain", "--weights", "w.safetensors", "--input", "x.npy", "--format", "text",
            "--tokens", SENTENCE, "--token", "it"]
    piped = subprocess.run(argv, cwd=HERE, check=True, capture_output=True).stdout
    with open(os.path.join(HERE, "text_it.txt"), "wb") as f:
        f.write(piped)
    code, terminal = run_in_terminal(argv, cwd=HERE, env={k: v for k, v in os.environ.items() if k != "NO_COLOR"})
    assert code == 0, code
    with open(os.path.join(HERE, "text_it_terminal.txt"), "wb") as f:
        f.write(terminal)


if __name__ == "__main__":
    main()
