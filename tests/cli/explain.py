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
  - bad usage: one line on stderr, exit 2, no file written;
  - README.md's commands ("See what each head attends to"), run from its text.

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
    cases = [
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
    with open(os.path.join(DATA, "text_it.txt"), "rb") as f:
        golden = f.read().split(b"\n")
    got = outputs[1].split(b"\n") if len(outputs) == 2 else []
    # Line 2 names the files, whose paths differ; the rest is the golden view.
    check("README: the text command prints the golden view (but for the file names)",
          len(got) == len(golden) and got[:1] + got[2:] == golden[:1] + golden[2:], outputs[-1].decode())


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
    test_readme_commands(cli, a.workdir, a.readme)
    print(f"{len(PASSED)} passed, {len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
