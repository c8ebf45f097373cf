#!/usr/bin/python3
"""`multihead explain`: what it writes, checked against `multihead forward`.

  - weights: the per-head weights in the HTML report's embedded JSON and in
    the bertviz JSON equal `forward --need-weights --no-average-attn-weights`
    on the same files to 1e-6 (float32; 1e-12 for a float64 input), and
    those of `forward --kernel reference` to 1e-6 (the report's are the
    flash kernel's, recomputed from its row log-sum-exps); `forward
    --weights-heads/--weights-rows` gives exactly the slice of the full ones. Both
    runs compute in the same dtype, and the writers print the shortest
    decimal that reads back as the same float, so the only difference allowed
    is the kernel's rounding; 1e-6 is ~100 float32 ulps at 1. The head
    average equals numpy's mean over heads of forward's weights, 1e-6;
  - bertviz: exactly bertviz's layout, a list of layers each [1][H][L][S],
    and the tokens;
  - text view: golden files (tests/data/explain/) for the lesson's sentence,
    through a pipe (ASCII) and on a pseudo-terminal (Unicode shading and ANSI
    colour); --ascii and NO_COLOR on a terminal;
  - the page is self-contained: no src= or href= to anything, no <link>,
    no URL scheme in markup; tokens cannot break out of the JSON element;
  - the trained model (the default: the shipped lesson model on the
    lesson's sentence): tokens are the words (keys: the words, then the
    padding the model sees), one layer per model layer, the answer at "it",
    the specialisation measure with the heads the model file records as
    picked. Its weights are checked two ways, 1e-6 (observed ~4e-7): against
    numpy float64 written here from the checkpoint (embedding + sinusoidal
    PE, norm1, the q/k projections, softmax), TrainedModel giving no block
    input, from the ids `--verbose` prints; and against `forward --prefix
    blocks.0.attn --need-weights --no-average-attn-weights` on that numpy
    block input. Every layer: a two-layer model file written here (the
    shipped block, then a seeded variant) through --model, both layers
    against a numpy float64 encoder. `--format text` for the sentence is a golden file
    (trained_text_it.txt), its printed values checked clear of rounding
    boundaries;
  - bad usage: one line on stderr, exit 2, no file written;
  - README.md's commands ("See what each head attends to"), run from its text:
    the trained report, the trained text view (its golden file), the plain
    module's text view (its golden file but for the file names).

Usage: /usr/bin/python3 tests/cli/explain.py --multihead PATH --workdir DIR
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from explain_common import SENTENCE, run_in_terminal  # noqa: E402
from numpy_model import encoder, read_safetensors, write_safetensors  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "explain")
FAILURES, PASSED = [], []


def check(name, ok, detail=""):
    (PASSED if ok else FAILURES).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def run(cli, *args, cwd):
    r = subprocess.run([cli, *args], capture_output=True, timeout=120, cwd=cwd)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", "replace")


def forward_weights(cli, work, weights, x, extra=()):
    """(H, L, S) or (B, H, L, S) from `multihead forward`: the reference the reports must match."""
    out = os.path.join(work, "fw-out.npy")
    aw = os.path.join(work, "fw-aw.npy")
    subprocess.run([cli, "forward", "--weights", weights, "--query", x, "--out", out, "--attn-weights-out", aw,
                    "--need-weights", "--no-average-attn-weights", *extra], check=True, cwd=work)
    return np.load(aw).astype(np.float64)


def page_data(html):
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1)) if m else None


def worst(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")


def test_weights(cli, work):
    w, x = os.path.join(work, "w.safetensors"), os.path.join(work, "x.npy")
    ref = forward_weights(cli, work, w, x)
    code, _, err = run(cli, "explain", "--weights", w, "--input", x, "--tokens", SENTENCE, "--out", "r.html", cwd=work)
    with open(os.path.join(work, "r.html"), encoding="utf-8") as f:
        html = f.read()
    data = page_data(html)
    got = np.array(data["layers"][0]["weights"]) if data else None
    e = worst(got, ref) if data else float("inf")
    print(f"     html weights vs forward: worst |difference| {e:.3g} (bound 1e-6)")
    check("html: per-head weights equal forward --no-average-attn-weights to 1e-6", code == 0 and e <= 1e-6,
          f"exit {code} {err.strip()!r}, worst {e}")
    # The report's weights are the flash kernel's, recomputed from its row
    # log-sum-exps; the reference kernel's plain loops store every weight.
    em = worst(got, forward_weights(cli, work, w, x, ["--kernel", "reference"])) if data else float("inf")
    print(f"     html weights vs forward --kernel reference: worst |difference| {em:.3g} (bound 1e-6)")
    check("html: per-head weights equal the reference kernel's to 1e-6", em <= 1e-6, f"worst {em}")
    # --weights-heads / --weights-rows: the selected slice of the full weights, exactly.
    sel = forward_weights(cli, work, w, x, ["--weights-heads", "1,0", "--weights-rows", "2:5,7"])
    es = worst(sel, ref[[1, 0]][:, [2, 3, 4, 7]])
    print(f"     forward --weights-heads 1,0 --weights-rows 2:5,7 vs the slice of the full weights: worst {es:.3g} (bound 0)")
    check("forward: selected weights are the slice of the full weights", es == 0, f"worst {es}")
    ea = worst(data["layers"][0]["average"], ref.mean(axis=0)) if data else float("inf")
    print(f"     html average vs numpy mean of forward's heads: worst {ea:.3g} (bound 1e-6)")
    check("html: head average equals the mean over heads to 1e-6", ea <= 1e-6, f"worst {ea}")
    check("html: tokens are the given labels", data and data["query_tokens"] == SENTENCE.split()
          and data["key_tokens"] == SENTENCE.split(), f"{data and data['query_tokens']}")

    code, _, err = run(cli, "explain", "--weights", w, "--input", x, "--format", "bertviz", "--out", "b.json", cwd=work)
    with open(os.path.join(work, "b.json")) as f:
        b = json.load(f)
    att = b.get("attention")
    layout = (isinstance(att, list) and len(att) == 1 and isinstance(att[0], list) and len(att[0]) == 1
              and len(att[0][0]) == ref.shape[0]
              and all(len(att[0][0][h]) == ref.shape[1] for h in range(ref.shape[0]))
              and all(len(row) == ref.shape[2] for h in att[0][0] for row in h)
              and set(b) == {"tokens", "attention"} and b["tokens"] == [str(i) for i in range(ref.shape[1])])
    check("bertviz: {tokens, attention: [layer][1][H][L][S]}", code == 0 and layout,
          f"exit {code} {err.strip()!r}, keys {sorted(b)}, shape {np.array(att).shape if att else None}")
    # What bertviz's head_view does with it (bertviz/util.py format_attention,
    # then its length checks): one torch tensor per layer, 4-D, batch 1,
    # stacked over layers; rows and columns as many as the tokens.
    import torch
    layers = [torch.tensor(layer) for layer in att]
    ok = all(t.dim() == 4 and t.shape[0] == 1 for t in layers)
    stacked = torch.stack([t.squeeze(0) for t in layers]) if ok else None
    ok = ok and stacked.shape == (1, *ref.shape) and len(stacked.tolist()[0][0]) == len(b["tokens"]) \
        and len(stacked.tolist()[0][0][0]) == len(b["tokens"])
    check("bertviz: head_view's own shape checks pass on torch.tensor of each layer", ok,
          f"{[tuple(t.shape) for t in layers]}")
    eb = worst(np.array(att)[0, 0], ref) if layout else float("inf")
    print(f"     bertviz weights vs forward: worst {eb:.3g} (bound 1e-6)")
    check("bertviz: weights equal forward's to 1e-6", eb <= 1e-6, f"worst {eb}")

    # float64 input: the forward runs in float64 and the files keep float64 digits.
    x64 = os.path.join(work, "x64.npy")
    np.save(x64, np.load(x).astype(np.float64))
    ref64 = forward_weights(cli, work, w, x64)
    run(cli, "explain", "--weights", w, "--input", x64, "--format", "bertviz", "--out", "b64.json", cwd=work)
    with open(os.path.join(work, "b64.json")) as f:
        e64 = worst(np.array(json.load(f)["attention"])[0, 0], ref64)
    print(f"     float64 bertviz vs float64 forward: worst {e64:.3g} (bound 1e-12)")
    check("float64 input: weights equal forward's to 1e-12", e64 <= 1e-12, f"worst {e64}")

    # A batched input with add_zero_attn: entry 1, keys labelled with the appended key.
    wz = os.path.join(work, "wz.safetensors")
    subprocess.run([cli, "init", "--embed-dim", "8", "--num-heads", "2", "--seed", "4", "--add-zero-attn",
                    "--out", wz], check=True)
    xb = os.path.join(work, "xb.npy")
    np.save(xb, np.random.default_rng(2).standard_normal((3, 2, 8)).astype(np.float32))  # (L, B, E)
    refb = forward_weights(cli, work, wz, xb)[1]
    code, _, err = run(cli, "explain", "--weights", wz, "--input", xb, "--batch", "1", "--format", "bertviz",
                       "--out", "bz.json", cwd=work)
    with open(os.path.join(work, "bz.json")) as f:
        bz = json.load(f)
    ez = worst(np.array(bz["attention"])[0, 0], refb)
    check("batch entry 1 with add_zero_attn: weights and key labels",
          code == 0 and ez <= 1e-6 and bz["key_tokens"] == ["0", "1", "2", "zero_attn"],
          f"exit {code} {err.strip()!r}, worst {ez}, key_tokens {bz.get('key_tokens')}")


def test_page_is_self_contained(cli, work):
    hostile = "a </script><script>alert(1)</script> @JS@ http://x.test/ &amp;"
    code, _, err = run(cli, "explain", "--weights", "w.safetensors", "--input", "x.npy", "--tokens",
                       " ".join(["t"] * 6 + hostile.split()), "--out", "h.html", cwd=work)
    with open(os.path.join(work, "h.html"), encoding="utf-8") as f:
        html = f.read()
    data = page_data(html)
    check("hostile tokens stay data", code == 0 and data is not None and data["query_tokens"][6:] == hostile.split()
          and html.count("</script>") == 2, f"exit {code} {err.strip()!r}")
    markup = re.sub(r'<script type="application/json" id="report-data">.*?</script>', "", html, flags=re.S)
    # The SVG namespace is a name, not a resource: createElementNS needs it.
    markup = markup.replace('"http://www.w3.org/2000/svg"', "")
    external = re.findall(r'\b(?:src|href)\s*=|<link\b|<iframe\b|@import|url\(|https?://|\bfetch\(|XMLHttpRequest'
                          r'|\bimport\(|WebSocket|EventSource', markup)
    check("no external resource in the page", not external, f"found {external}")
    check("page has a Content-Security-Policy that allows no source", "default-src 'none'" in html)


def test_text_golden(cli, work):
    argv = ["explain", "--weights", "w.safetensors", "--input", "x.npy", "--format", "text", "--tokens", SENTENCE,
            "--token", "it"]
    ref = forward_weights(cli, work, os.path.join(work, "w.safetensors"), os.path.join(work, "x.npy"))
    shown = np.concatenate([ref[:, 7, :].ravel(), ref[:, 7, :].mean(axis=0)]) * 100
    margin = float(np.min(np.abs(shown % 1 - 0.5)))
    # A printed percentage could only change if float rounding moved a value
    # across a .5 boundary; float32's error is ~1e-5 percentage points.
    check(f"golden values sit {margin:.3g} points from a rounding boundary (> 1e-3)", margin > 1e-3)
    with open(os.path.join(DATA, "text_it.txt"), "rb") as f:
        ascii_golden = f.read()
    with open(os.path.join(DATA, "text_it_terminal.txt"), "rb") as f:
        terminal_golden = f.read()
    code, out, err = run(cli, *argv, cwd=work)
    check("text through a pipe: ASCII golden (tests/data/explain/text_it.txt)", code == 0 and out == ascii_golden,
          f"exit {code} {err.strip()!r}\n--- got\n{out.decode('utf-8', 'replace')}")
    check("ASCII view is pure ASCII", all(c < 128 for c in out) and b"\x1b" not in out)
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    code, out = run_in_terminal([cli, *argv], cwd=work, env=env)
    check("text on a terminal: Unicode + colour golden (text_it_terminal.txt)", code == 0 and out == terminal_golden,
          f"exit {code}\n--- got\n{out.decode('utf-8', 'replace')}")
    check("terminal view has shading blocks and ANSI colour",
          any(s.encode() in out for s in "░▒▓█") and b"\x1b[" in out)
    code, out = run_in_terminal([cli, *argv, "--ascii"], cwd=work, env=env)
    check("--ascii on a terminal: the ASCII golden", code == 0 and out == ascii_golden, out.decode("utf-8", "replace"))
    code, out = run_in_terminal([cli, *argv], cwd=work, env={**env, "NO_COLOR": "1"})
    stripped = re.sub(rb"\x1b\[[0-9;]*m", b"", terminal_golden)
    check("NO_COLOR on a terminal: Unicode without colour", code == 0 and out == stripped,
          out.decode("utf-8", "replace"))
    code, _, _ = run(cli, *argv, "--out", "t.txt", cwd=work)
    with open(os.path.join(work, "t.txt"), "rb") as f:
        check("text --out FILE: the ASCII golden", code == 0 and f.read() == ascii_golden)


def one_error_line(code, out, err, *words):
    if code != 2:
        return f"exit {code}, expected 2 ({err.strip()!r})"
    if len(err.rstrip("\n").split("\n")) != 1:
        return f"expected one line, got {err!r}"
    missing = [w for w in words if w not in err]
    return f"lacks {missing} in {err.strip()!r}" if missing else ""


def test_bad_usage(cli, work):
    base = ["explain", "--weights", "w.safetensors", "--input", "x.npy"]
    subprocess.run([cli, "init", "--embed-dim", "16", "--num-heads", "2", "--kdim", "4", "--out", "wk.safetensors"],
                   cwd=work, check=True)
    subprocess.run([cli, "init", "--embed-dim", "8", "--num-heads", "2", "--out", "w8.safetensors"], cwd=work, check=True)
    subprocess.run([cli, "init", "--embed-dim", "16", "--num-heads", "4", "--num-kv-heads", "2", "--out",
                    "g.safetensors"], cwd=work, check=True)
    x = np.load(os.path.join(work, "x.npy"))
    bad = x.copy()
    bad[3, 5] = np.nan
    np.save(os.path.join(work, "x_nan.npy"), bad)
    bad = x.copy()
    bad[0, 0] = 1e30  # finite, but its projections overflow float32
    np.save(os.path.join(work, "x_huge.npy"), bad)
    cases = [
        (base[:-1] + ["x_nan.npy"], ["--input x_nan.npy", "nan at index (3, 5)"]),
        (base[:-1] + ["x_huge.npy"], ["--input x_huge.npy", "not finite", "overflow float32", "1e+30"]),
        (["explain", "--weights", "g.safetensors", "--input", "x.npy"],
         ["grouped-query", "forward or decode and --num-kv-heads 2"]),
        (["explain", "--input", "x.npy"], ["--weights", "required", "--input X.npy"]),
        (["explain", "--weights", "w.safetensors"], ["--input", "required"]),
        (base + ["--tokens", "a b c"], ["--tokens", "expected 11 labels", "got 3"]),
        (base + ["--token", "11", "--format", "text"], ["--token", "0 to 10", "got 11"]),
        (base + ["--token", "zebra", "--tokens", SENTENCE], ["--token", "'zebra'"]),
        (base + ["--batch", "1"], ["--batch", "batch of 1", "got 1"]),
        (base + ["--format", "pdf"], ["--format", "html, text, bertviz", "pdf"]),
        (base + ["--out", "x.npy"], ["--out", "it is the --input input"]),
        (["explain", "--weights", "x.npy", "--input", "x.npy"], ["x.npy", "not a safetensors file"]),
        (["explain", "--weights", "wk.safetensors", "--input", "x.npy"], ["--weights", "kdim = vdim = embed_dim 16",
                                                                           "kdim 4, vdim 16"]),
        (["explain", "--weights", "w8.safetensors", "--input", "x.npy"],
         ["--input (the query, key and value of self-attention): query: expected shape (11, 8), got (11, 16)"]),
    ]
    for argv, words in cases:
        before = set(os.listdir(work))
        code, out, err = run(cli, *argv, cwd=work)
        problem = one_error_line(code, out, err, *words)
        new = set(os.listdir(work)) - before
        if not problem and new:
            problem = f"left files behind: {sorted(new)}"
        check(f"bad usage: {' '.join(argv[1:])}", not problem, problem)
    code, out, _ = run(cli, "explain", "--help", cwd=work)
    text = out.decode()
    check("explain --help lists the flags and defaults",
          code == 0 and all(f in text for f in ("--weights", "--input", "--format", "--token", "--tokens", "--ascii",
                                                "--prefix", "--out", "[default: html]")), text)
    code, _, err = run(cli, *base, "--verbose", "--out", "v.html", cwd=work)
    check("--verbose: one summary line", code == 0 and err.startswith("multihead explain: wrote v.html")
          and len(err.strip().split("\n")) == 1, err)
    code, _, err = run(cli, *base, "--out", "q.html", cwd=work)
    check("quiet without --verbose", code == 0 and err == "", err)


def test_readme_commands(cli, work, readme):
    text = open(readme, encoding="utf-8").read()
    start = text.index("### See what each head attends to")
    section = text[start:text.index("\n### ", start + 1)]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1).replace("\\\n", " ")
    commands = [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("multihead ")]
    # The README's paths are relative to the repository; here they are the fixtures.
    root = os.path.join(work, "readme")
    shutil.copytree(DATA, os.path.join(root, "tests", "data", "explain"))
    outputs = []
    for argv in commands:
        code, out, err = run(cli, *argv, cwd=root)
        outputs.append(out)
        check(f"README: multihead {' '.join(argv[:1])} ... {' '.join(argv[-2:])}", code == 0, f"exit {code} {err.strip()!r}")
    check("README: the report is written", os.path.exists(os.path.join(root, "report.html")))
    with open(os.path.join(DATA, "trained_text_it.txt"), "rb") as f:
        trained = f.read()
    check("README: the trained text command prints trained_text_it.txt", len(outputs) == 3 and outputs[1] == trained,
          outputs[1].decode() if len(outputs) > 1 else "")
    with open(os.path.join(DATA, "text_it.txt"), "rb") as f:
        golden = f.read().split(b"\n")
    got = outputs[2].split(b"\n") if len(outputs) == 3 else []
    # Line 2 names the files, whose paths differ; the rest is the golden view.
    check("README: the --weights text command prints the golden view (but for the file names)",
          len(got) == len(golden) and got[:1] + got[2:] == golden[:1] + golden[2:], outputs[-1].decode())


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LESSON_WORDS = "the animal didn't cross the street because it was too tired".split()


def test_trained(cli, work):
    """The default: the shipped model on the lesson's sentence."""
    model = os.path.join(ROOT, "models", "lesson-heads.safetensors")
    p, meta = read_safetensors(model)
    layers, H, E = int(meta["layers"]), int(meta["heads"]), int(meta["d_model"])
    code, _, err = run(cli, "explain", "--out", "t.html", "--verbose", cwd=work)
    check("trained: explain (no arguments) exits 0", code == 0, err)
    with open(os.path.join(work, "t.html"), encoding="utf-8") as f:
        data = page_data(f.read())
    n = len(LESSON_WORDS)
    check("trained: query tokens are the lesson's words",
          [t.lower() for t in data["query_tokens"]] == LESSON_WORDS, str(data["query_tokens"]))
    check("trained: keys are the words then the padding",
          [t.lower() for t in data["key_tokens"]] == LESSON_WORDS + ["<pad>"] * (16 - n), str(data["key_tokens"]))
    check(f"trained: one layer per model layer ({layers})", len(data["layers"]) == layers)
    m = re.search(r"token ids \(the model's input, padding included\): ([0-9 ]+)", err)
    ids = [int(t) for t in m.group(1).split()] if m else []
    check("trained: --verbose prints the 16 token ids", len(ids) == 16, err)
    # Block 0's attention input norm1(embedding[ids] + PE) and its weights.
    _, attention, inputs = encoder(p, ids, E, H, 1)
    h, ref = inputs[0], attention[0][:, :n, :]
    got = np.array(data["layers"][0]["weights"])
    # float32 model vs float64 numpy from the same float32 parameters: the
    # layer norm and projections round at ~1e-7 relative; 1e-6 holds.
    err_np = worst(got, ref)
    check(f"trained: layer 1 weights = numpy float64 recompute from the checkpoint, worst {err_np:.2e} <= 1e-6",
          err_np <= 1e-6)
    # The same weights through `multihead forward` on the block's weights,
    # fed the block input computed above (float32).
    block_in = os.path.join(work, "block0-in.npy")
    np.save(block_in, h.astype(np.float32))
    fw = forward_weights(cli, work, model, block_in, extra=("--prefix", "blocks.0.attn", "--num-heads", str(H)))[:, :n, :]
    err_fw = worst(got, fw)
    check(f"trained: layer 1 weights = forward --prefix blocks.0.attn --need-weights, worst {err_fw:.2e} <= 1e-6",
          err_fw <= 1e-6)
    ans = data.get("answer") or {}
    check("trained: the answer for \"it\" is animal, with a probability", ans.get("answer") == "animal"
          and 0.5 < ans.get("confidence", 0) <= 1, str(ans))
    ms = data.get("measures") or []
    check("trained: two measures per layer, H values each", len(ms) == 2 * layers and
          all(len(x["per_head"]) == H for x in ms), str(ms))
    # The picked heads are those the model file records (--save-model wrote
    # them from the same measure): layer.head from 1.
    picked = {x["name"].split(" (")[0]: (x["layer"] + 1, x["picked"] + 1) for x in ms if x.get("picked") is not None}
    # A role no head has is "none" in the file, and no head is picked.
    want = {name: tuple(int(v) for v in meta[key].split("."))
            for name, key in (("\"it\" \u2192 referent noun", "referent_head"),
                              ("\"it\" \u2192 adjective", "adjective_head")) if meta[key] != "none"}
    check("trained: the measure picks the heads the model file records", picked == want, f"{picked} vs {want}")
    for x in ms:
        if x.get("picked") is not None:
            check(f"trained: {x['name']}: the picked head has the most", x["per_head"][x["picked"]] == max(x["per_head"]))
    # Another sentence, and a word the model does not know.
    code, _, err = run(cli, "explain", "the dog didn't cross the road because it was too wide", "--format", "text",
                       cwd=work)
    check("trained: TEXT in the task's words works", code == 0, err)
    code, out, err = run(cli, "explain", "the zebra didn't cross the road because it was too wide", cwd=work)
    bad = one_error_line(code, out, err, "TEXT", "zebra", "e.g.")
    check("trained: an unknown word: one line naming it and known words, exit 2", not bad, bad)
    code, out, err = run(cli, "explain", "--model", model, "--format", "bertviz", "--out", "t.json", cwd=work)
    check("trained: --model FILE (the shipped file) gives the same weights (bertviz: the words' keys only)",
          code == 0 and worst(json.load(open(os.path.join(work, "t.json")))["attention"][0][0], got[:, :, :n]) == 0,
          err)
    for text in ("", "   "):
        out_name = f"empty{len(text)}.html"
        code, out, err = run(cli, "explain", text, "--out", out_name, cwd=work)
        bad = one_error_line(code, out, err, "TEXT", "expected 1 to 16 words", "got 0")
        check(f"trained: explain {text!r} is refused: one line, exit 2, no file", not bad and
              not os.path.exists(os.path.join(work, out_name)), bad)
    code, out, err = run(cli, "explain", "--model", model, "--weights", model, "--input", block_in, cwd=work)
    bad = one_error_line(code, out, err, "--model", "either")
    check("trained: --model with --weights: one line, exit 2", not bad, bad)


def head_view_checks(data):
    """What docs/bertviz.md's snippet does with the file, and bertviz's
    head_view checks (bertviz/head_view.py: format_attention stacks the
    layers' (1, H, L, S) tensors, then "Attention has {L} positions, while
    number of tokens is {n}" for the queries, the same for the keys). Returns
    "" when head_view would accept the file, else what it would raise."""
    import torch
    attention = [torch.tensor(layer) for layer in data["attention"]]  # each (1, H, L, S)
    if any(t.dim() != 4 or t.shape[0] != 1 for t in attention):
        return f"layers of shapes {[tuple(t.shape) for t in attention]}, expected (1, H, L, S)"
    # Self-attention: head_view(attention, data["tokens"]); keys beyond the
    # tokens: head_view(cross_attention=..., decoder_tokens=tokens, encoder_tokens=key_tokens).
    left, right = data["tokens"], data.get("key_tokens", data["tokens"])
    attn = torch.stack([t.squeeze(0) for t in attention]).tolist()
    if len(attn[0][0]) != len(left):
        return f"Attention has {len(attn[0][0])} positions, while number of tokens is {len(left)}"
    if len(attn[0][0][0]) != len(right):
        return f"Attention has {len(attn[0][0][0])} positions, while number of tokens is {len(right)}"
    return ""


def test_bertviz_shapes(cli, work):
    """bertviz export on every model kind: query and key dims equal the token lists' lengths."""
    subprocess.run([cli, "init", "--embed-dim", "16", "--num-heads", "2", "--seed", "7", "--add-bias-kv",
                    "--add-zero-attn", "--out", "wkv.safetensors"], cwd=work, check=True)
    cases = [
        ("trained (the default output)", ["explain", "--format", "bertviz"], "bertviz.json", False),
        ("trained, another sentence", ["explain", "the dog didn't cross the road because it was too wide",
                                       "--format", "bertviz", "--out", "bt.json"], "bt.json", False),
        ("plain module", ["explain", "--weights", "w.safetensors", "--input", "x.npy", "--format", "bertviz",
                          "--out", "bp.json"], "bp.json", False),
        ("cross-attention (add_bias_kv, add_zero_attn keys)",
         ["explain", "--weights", "wkv.safetensors", "--input", "x.npy", "--format", "bertviz", "--out", "bc.json"],
         "bc.json", True),
    ]
    for name, argv, out, cross in cases:
        code, _, err = run(cli, *argv, cwd=work)
        with open(os.path.join(work, out)) as f:
            data = json.load(f)
        problem = head_view_checks(data) if code == 0 else f"exit {code} {err.strip()!r}"
        if not problem and ("key_tokens" in data) != cross:
            problem = f"key_tokens {'missing' if cross else 'present'}: {data.get('key_tokens')}"
        check(f"bertviz shapes, {name}: attention's query and key dims equal the token lists", not problem, problem)


def test_trained_two_layers(cli, work):
    """--model with two layers: the shipped block, then a seeded variant of it."""
    p, meta = read_safetensors(os.path.join(ROOT, "models", "lesson-heads.safetensors"))
    E, H = int(meta["d_model"]), int(meta["heads"])
    rng = np.random.default_rng(5)
    two = dict(p)
    for name in [n for n in p if n.startswith("blocks.0.")]:
        t = p[name]
        two[name.replace("blocks.0.", "blocks.1.")] = t + 0.3 * rng.standard_normal(t.shape) * (t.std() + 1e-3)
    two = {n: t.astype(np.float32) for n, t in two.items()}
    m2 = {k: meta[k] for k in ("format", "task", "vocabulary", "sequence_length", "d_model", "heads", "ff",
                               "dropout", "causal")}
    m2["layers"] = "2"
    path = os.path.join(work, "two-layers.safetensors")
    write_safetensors(path, two, m2)
    code, _, err = run(cli, "explain", "--model", path, "--out", "two.html", "--verbose", cwd=work)
    check("trained, 2 layers: explain --model exits 0", code == 0, err)
    if code != 0:
        return
    with open(os.path.join(work, "two.html"), encoding="utf-8") as f:
        data = page_data(f.read())
    check("trained, 2 layers: two layers in the report", [l["name"] for l in data["layers"]] == ["layer 1", "layer 2"],
          str([l["name"] for l in data["layers"]]))
    ms = data["measures"]
    # Each measure picks at most one head over both layers, and one exactly
    # when some head reaches the role threshold (0.1: multihead/experiment.hpp).
    names = {x["name"] for x in ms}
    picks_ok = all(sum(x.get("picked") is not None for x in ms if x["name"] == name) ==
                   (max(v for x in ms if x["name"] == name for v in x["per_head"]) >= 0.1) for name in names)
    check("trained, 2 layers: two measures per layer, a head picked per measure exactly when one has the role",
          sorted(x["layer"] for x in ms) == [0, 0, 1, 1] and len(names) == 2 and picks_ok, str(ms))
    m = re.search(r"token ids \(the model's input, padding included\): ([0-9 ]+)", err)
    ids = [int(t) for t in m.group(1).split()]
    n = len(LESSON_WORDS)
    _, ref, _ = encoder({k: v.astype(np.float64) for k, v in two.items()}, ids, E, H, 2)
    for i in range(2):
        e = worst(np.array(data["layers"][i]["weights"]), ref[i][:, :n, :])
        check(f"trained, 2 layers: layer {i + 1} weights = numpy float64 encoder, worst {e:.2e} <= 1e-6", e <= 1e-6)


def test_trained_text_golden(cli, work):
    # The golden file prints "it"'s weights as whole percents and the
    # measures to 2 decimals; the model's float32 arithmetic differs by SIMD
    # target in its last bits, so every printed value must sit clear of a
    # rounding boundary for the file to hold on every target.
    code, _, err = run(cli, "explain", "--out", "g.html", cwd=work)
    with open(os.path.join(work, "g.html"), encoding="utf-8") as f:
        data = page_data(f.read())
    it = data["query_tokens"].index("it")
    pct = 100 * np.array(data["layers"][0]["weights"])[:, it, :]
    pct = np.concatenate([pct.ravel(), 100 * np.array(data["layers"][0]["average"])[it]])
    two = 100 * np.array([v for m in data["measures"] for v in m["per_head"]])
    margin = min(np.min(np.abs(pct - np.floor(pct) - 0.5)), np.min(np.abs(two - np.floor(two) - 0.5)),
                 abs(100 * data["answer"]["confidence"] % 1 - 0.5))
    check(f"trained golden: values sit {margin:.3g} points from a rounding boundary (> 1e-3)", margin > 1e-3)
    with open(os.path.join(DATA, "trained_text_it.txt"), "rb") as f:
        golden = f.read()
    code, out, err = run(cli, "explain", "--format", "text", cwd=work)
    check("trained: --format text (token \"it\") = golden tests/data/explain/trained_text_it.txt",
          code == 0 and out == golden, out.decode("utf-8", "replace") + err)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--multihead", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--readme", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md"))
    a = p.parse_args()
    cli = os.path.abspath(a.multihead)
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    for name in ("w.safetensors", "x.npy"):
        shutil.copy(os.path.join(DATA, name), a.workdir)
    test_weights(cli, a.workdir)
    test_page_is_self_contained(cli, a.workdir)
    test_text_golden(cli, a.workdir)
    test_bad_usage(cli, a.workdir)
    test_trained(cli, a.workdir)
    test_trained_two_layers(cli, a.workdir)
    test_bertviz_shapes(cli, a.workdir)
    test_trained_text_golden(cli, a.workdir)
    test_readme_commands(cli, a.workdir, a.readme)
    print(f"{len(PASSED)} passed, {len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
