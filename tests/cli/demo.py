"""`multihead demo`: the lesson's sentence, then the same heads on "…because
it was too wide" (where "it" is the street), so a reader sees whether a head
tracks the referent or stays on the subject.

  - the contrast block is printed after the lesson's table, names the
    sentence, and has one row per head (layer.head) with the attention from
    "it" to the subject and to the object in both sentences;
  - every printed percentage equals a float64 numpy rebuild of the shipped
    model from its file alone (tests/cli/model_file.py's FileModel) to the
    printed rounding (|printed − 100·p| <= 0.5 + 1e-3);
  - the answer for "too wide" is the rebuild's argmax at "it" ("street");
  - --sentence and --focus other than "it" print no contrast block.

Usage: /usr/bin/python3 tests/cli/demo.py --multihead PATH
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_model import FileModel  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TIRED = "the animal didn't cross the street because it was too tired".split()
WIDE = TIRED[:-1] + ["wide"]
FAILURES, PASSED = [], []


def check(name, ok, detail=""):
    (PASSED if ok else FAILURES).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--multihead", required=True)
    cli = p.parse_args().multihead
    out = subprocess.run([cli, "demo"], capture_output=True, text=True, timeout=60).stdout
    start = out.find("the same heads when \"it\" is the street: " + " ".join(WIDE))
    check("demo: the contrast sentence follows the lesson's table", start > out.find("animal (99%)") > 0, out)
    rows = re.findall(r"^  (\d+)\.(\d+) +(\d+) +(\d+) +(\d+) +(\d+)   (\S+)$", out[start:], re.M)
    model = FileModel(os.path.join(ROOT, "models", "lesson-heads.safetensors"))
    check(f"demo: one contrast row per head ({model.layers * model.H})", len(rows) == model.layers * model.H, out[start:])
    it, subject, obj = TIRED.index("it"), TIRED.index("animal"), TIRED.index("street")
    _, att_tired = model.forward(TIRED)
    logits, att_wide = model.forward(WIDE)
    worst = 0.0
    for layer, head, *values in rows:
        l, h = int(layer) - 1, int(head) - 1
        want = [att_tired[l][h, it, subject], att_tired[l][h, it, obj], att_wide[l][h, it, subject],
                att_wide[l][h, it, obj]]
        worst = max(worst, max(abs(float(v) - 100 * w) for v, w in zip(values[:4], want)))
        if values[4] != WIDE[int(np.argmax(att_wide[l][h, it, :len(WIDE)]))]:
            worst = float("inf")
    check(f"demo: contrast percentages = numpy rebuild from the file, worst {worst:.3f} points (<= 0.501)",
          rows and worst <= 0.501)
    answer = re.search(r'the model\'s answer for "it" \(too wide\): (\S+) \((\d+)%\)', out)
    best = model.words[int(np.argmax(logits[it]))]
    check(f"demo: the answer for 'too wide' is the rebuild's argmax ({best})", answer and answer.group(1) == best
          and best == "street", answer.group(0) if answer else out[start:])
    for extra in (["--sentence", " ".join(WIDE)], ["--focus", "animal"]):
        o = subprocess.run([cli, "demo", *extra], capture_output=True, text=True, timeout=60).stdout
        check(f"demo {' '.join(extra)}: no contrast block", "the same heads when" not in o and "answer" in o, o)
    print(f"{len(PASSED)} passed, {len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
