"""The model file: reproducible bytes, and a file that describes itself.

  - reproducible: `multihead experiment --save-model` twice, to two folders
    and two file names (one absolute, one relative), gives the same bytes,
    and neither path is in them (the recorded command names
    run.safetensors);
  - self-described: the metadata holds the vocabulary (token_ids, word ->
    id, a bijection onto 0 … V − 1), layer_norm_eps, norm_placement,
    positional_encoding and activation (docs/model-format.md);
  - rebuilt from the file alone: a float64 numpy forward written here from
    docs/model-format.md reads ONLY the safetensors file and its metadata
    (no constant of our source: eps, the positional encoding, the
    activation, the pre-LN order, the vocabulary and the padding id all come
    from the metadata) and reproduces `multihead explain`'s per-head weights
    (every layer, the words' rows, all 16 keys) and its answer at "it" with
    its probability, to 1e-5 (float32 model vs float64 rebuild), on the
    shipped model and on a two-layer model with a feed-forward trained here,
    for three sentences each;
  - a file stating what the program does not compute (activation 'gelu') is
    refused in one line naming the key, expected and actual (exit 2).

Usage: /usr/bin/python3 tests/cli/model_file.py --multihead PATH --workdir DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_model import FileModel, read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FAILURES, PASSED = [], []
SENTENCES = ["the animal didn't cross the street because it was too tired",
             "the animal didn't cross the street because it was too wide",
             "the dog didn't cross the road because it was too wide"]
TINY = ["--tasks", "lesson", "--heads", "2", "--layers", "2", "--steps", "40", "--d-model", "16", "--ff", "16",
        "--warmup", "5"]
BOUND = 1e-5  # float32 arithmetic against float64: observed 2.8e-7 (weights), 3e-8 (confidence)


def check(name, ok, detail=""):
    (PASSED if ok else FAILURES).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def run(cli, *args, cwd):
    r = subprocess.run([cli, *args], capture_output=True, timeout=120, cwd=cwd)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", "replace")


def page_data(html):
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1)) if m else None


def test_reproducible(cli, work):
    a, b = os.path.join(work, "first"), os.path.join(work, "second", "deeper")
    os.makedirs(a)
    os.makedirs(b)
    pa = os.path.join(a, "m.safetensors")  # absolute
    code1, _, e1 = run(cli, "experiment", "--save-model", pa, *TINY, cwd=work)
    code2, _, e2 = run(cli, "experiment", "--save-model", "another-name.safetensors", *TINY, cwd=b)  # relative
    same = code1 == 0 and code2 == 0 and open(pa, "rb").read() == open(os.path.join(b, "another-name.safetensors"),
                                                                       "rb").read()
    check("reproducible: --save-model to two folders and names gives the same bytes", same,
          f"exits {code1} {code2} {e1.strip()!r} {e2.strip()!r}")
    raw = open(pa, "rb").read() if code1 == 0 else b""
    check("reproducible: no output path in the file", code1 == 0 and work.encode() not in raw and
          b"m.safetensors" not in raw and b"--save-model run.safetensors" in raw)
    return pa


def test_self_described(path):
    _, m = read_safetensors(path)
    want = {"layer_norm_eps", "norm_placement", "positional_encoding", "activation", "token_ids"}
    check("self-described: the metadata has " + ", ".join(sorted(want)), want <= set(m), sorted(want - set(m)))
    ids = json.loads(m.get("token_ids", "{}"))
    check(f"self-described: token_ids maps {m.get('vocabulary')} words onto 0 … V − 1, <pad> among them",
          sorted(ids.values()) == list(range(int(m["vocabulary"]))) and "<pad>" in ids, str(ids)[:200])
    check("self-described: the values this program computes", (m.get("norm_placement"), m.get("positional_encoding"),
          m.get("activation"), float(m.get("layer_norm_eps", "nan"))) == ("pre", "sinusoidal", "relu", 1e-5),
          str({k: m.get(k) for k in want - {"token_ids"}}))


def test_rebuild(cli, work, name, path, model_flag):
    model = FileModel(path)
    worst_w = worst_c = 0.0
    problems = []
    for k, sentence in enumerate(SENTENCES):
        html = os.path.join(work, f"rebuild-{name}-{k}.html")
        code, _, err = run(cli, "explain", sentence, *model_flag, "--out", html, cwd=work)
        if code != 0:
            problems.append(f"explain exit {code}: {err.strip()}")
            continue
        data = page_data(open(html, encoding="utf-8").read())
        words = sentence.split()
        logits, attention = model.forward(words)
        n = len(words)
        for layer, P in zip(data["layers"], attention):
            worst_w = max(worst_w, float(np.max(np.abs(np.array(layer["weights"]) - P[:, :n, :]))))
        if len(data["layers"]) != len(attention):
            problems.append(f"{len(data['layers'])} layers in the report, {len(attention)} in the file")
        it = words.index("it")
        z = logits[it] - logits[it].max()
        prob = np.exp(z) / np.exp(z).sum()
        best = int(np.argmax(logits[it]))
        if data["answer"]["answer"] != model.words[best]:
            problems.append(f"{sentence!r}: explain answers {data['answer']['answer']}, the rebuild {model.words[best]}")
        worst_c = max(worst_c, abs(data["answer"]["confidence"] - prob[best]))
    print(f"     {name}: worst |weight difference| {worst_w:.2e}, worst |confidence difference| {worst_c:.2e} "
          f"(bound {BOUND:g})")
    check(f"rebuild from the file alone, {name}: explain's weights, answers and confidences, {len(SENTENCES)} "
          f"sentences, to {BOUND:g}", not problems and worst_w <= BOUND and worst_c <= BOUND,
          f"{problems} weights {worst_w:.3g} confidence {worst_c:.3g}")


def test_refuses_another_activation(cli, work, path):
    p, m = read_safetensors(path)
    m = dict(m, activation="gelu")
    bad = os.path.join(work, "gelu.safetensors")
    write_safetensors(bad, p, m)
    code, _, err = run(cli, "explain", "--model", bad, "--out", "gelu.html", cwd=work)
    ok = code == 2 and len(err.strip().split("\n")) == 1 and all(w in err for w in ("'activation'", "'relu'", "'gelu'"))
    check("a file stating activation 'gelu' is refused: one line naming key, expected and actual, exit 2",
          ok and not os.path.exists(os.path.join(work, "gelu.html")), f"exit {code} {err.strip()!r}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--multihead", required=True)
    p.add_argument("--workdir", required=True)
    a = p.parse_args()
    cli, work = os.path.abspath(a.multihead), os.path.abspath(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tiny = test_reproducible(cli, work)
    shipped = os.path.join(ROOT, "models", "lesson-heads.safetensors")
    for path in (shipped, tiny):
        test_self_described(path)
    test_rebuild(cli, work, "the shipped model (compiled in)", shipped, [])
    test_rebuild(cli, work, "2 layers, ff 16, trained here", tiny, ["--model", tiny])
    test_refuses_another_activation(cli, work, tiny)
    print(f"{len(PASSED)} passed, {len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
