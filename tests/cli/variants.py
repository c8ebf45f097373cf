#!/usr/bin/python3
"""`multihead forward` with the score variants against a float64 reference.

Each good run (--window, --softcap, --alibi, --causal-align, alone and
together, with and without --is-causal) is compared with multi-head
attention computed here in numpy float64, from the definitions in
docs/semantics.md, sharing no code with the library:
  scores = softcap(q k^T / sqrt(D)) - m_h |p_i - j|, masked by causal and window
  p_i = i (top-left) or i + S - L (bottom-right)
  causal: j <= p_i; window w: p_i - w < j (causal) or |p_i - j| < w (not)
  m_h = 2^(-8h/H), h = 1..H (H a power of two here)
Bounds: float64 runs (reference and materialized kernels) 1e-12 relative to
the output's largest magnitude; float32 runs (flash kernel) 1e-5, about
100 float32 roundings of a 4-wide head, as tests/test_flash.cpp derives.

Usage: /usr/bin/python3 tests/cli/variants.py --multihead PATH --workdir DIR
"""
import argparse
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import safetensors_io  # noqa: E402

E, H, L, B, S = 8, 2, 3, 2, 5
D = E // H


def reference(x, k, v, w, causal, align, window, softcap, alibi):
    """torch.nn.MultiheadAttention.forward (eval, sequence-first) with the variants, float64."""
    wq, wk, wv = np.split(w["in_proj_weight"], 3)
    bq, bk, bv = np.split(w["in_proj_bias"], 3)
    q = x @ wq.T + bq  # (L, B, E)
    kk = k @ wk.T + bk
    vv = v @ wv.T + bv
    shift = S - L if align == "bottom-right" else 0
    out = np.zeros((L, B, E))
    for b in range(B):
        for h in range(H):
            cols = slice(h * D, (h + 1) * D)
            qh, kh, vh = q[:, b, cols], kk[:, b, cols], vv[:, b, cols]
            s = qh @ kh.T / np.sqrt(D)
            if softcap:
                s = softcap * np.tanh(s / softcap)
            for i in range(L):
                p = i + shift
                for j in range(S):
                    if alibi:
                        s[i, j] -= 2.0 ** (-8.0 * (h + 1) / H) * abs(p - j)
                    hidden = (causal and j > p) or (window and (j <= p - window if causal else abs(p - j) >= window))
                    if hidden:
                        s[i, j] = -np.inf
            for i in range(L):
                row = s[i]
                if np.all(row == -np.inf):
                    s[i] = 0.0  # --masked-rows zeros
                    continue
                e = np.exp(row - row.max())
                s[i] = e / e.sum()
            out[:, b, cols] = s @ vh
    return out @ w["out_proj.weight"].T + w["out_proj.bias"]


CASES = [
    # name, flags, (causal, align, window, softcap, alibi)
    ("window2_causal", ["--is-causal", "--window", "2"], (True, "top-left", 2, None, False)),
    ("window2", ["--window", "2"], (False, "top-left", 2, None, False)),
    ("window2_bottomright", ["--window", "2", "--causal-align", "bottom-right"], (False, "bottom-right", 2, None, False)),
    ("causal_bottomright", ["--is-causal", "--causal-align", "bottom-right"], (True, "bottom-right", None, None, False)),
    ("softcap0.5", ["--softcap", "0.5"], (False, "top-left", None, 0.5, False)),
    ("alibi", ["--alibi"], (False, "top-left", None, None, True)),
    ("alibi_causal", ["--alibi", "--is-causal"], (True, "top-left", None, None, True)),
    ("all_bottomright", ["--alibi", "--is-causal", "--causal-align", "bottom-right", "--window", "3", "--softcap", "1.5"],
     (True, "bottom-right", 3, 1.5, True)),
    # window 1 with causal and top-left: query 0 sees key 0 only, and so on.
    ("window1_causal", ["--is-causal", "--window", "1"], (True, "top-left", 1, None, False)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    rng = np.random.default_rng(20261201)
    w = {"in_proj_weight": rng.standard_normal((3 * E, E)) / 3, "in_proj_bias": rng.standard_normal(3 * E),
         "out_proj.weight": rng.standard_normal((E, E)) / 3, "out_proj.bias": rng.standard_normal(E)}
    data, _ = safetensors_io.serialize({n: (t, "F64") for n, t in w.items()}, {"num_heads": str(H)})
    wpath = os.path.join(args.workdir, "W.safetensors")
    with open(wpath, "wb") as f:
        f.write(data)
    x, k, v = rng.standard_normal((L, B, E)), rng.standard_normal((S, B, E)), rng.standard_normal((S, B, E))
    paths = {}
    for name, t in (("q64", x), ("k64", k), ("v64", v)):
        paths[name] = os.path.join(args.workdir, name + ".npy")
        np.save(paths[name], t)
    for name, t in (("q32", x), ("k32", k), ("v32", v)):
        paths[name] = os.path.join(args.workdir, name + ".npy")
        np.save(paths[name], t.astype(np.float32))
    out = os.path.join(args.workdir, "out.npy")
    failed = 0
    for name, flags, spec in CASES:
        want = reference(x, k, v, w, *spec)
        for kernel, dtype, bound in (("reference", "64", 1e-12), ("materialized", "64", 1e-12),
                                     ("flash", "32", 1e-5)):
            argv = [args.multihead, "forward", "--weights", wpath, "--query", paths["q" + dtype],
                    "--key", paths["k" + dtype], "--value", paths["v" + dtype], "--kernel", kernel,
                    "--out", out] + flags
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            label = f"{name} kernel={kernel} float{dtype}"
            if r.returncode != 0:
                failed += 1
                print(f"FAIL {label}: exit {r.returncode}: {r.stderr.strip()}\n  rerun: {' '.join(argv)}")
                continue
            got = np.load(out).astype(np.float64)
            err = np.abs(got - want).max() / np.abs(want).max()
            if not err <= bound:
                failed += 1
                idx = np.unravel_index(np.argmax(np.abs(got - want)), want.shape)
                print(f"FAIL {label}: relative error {err:.3g} > {bound:g} at {idx}: got {got[idx]!r}, "
                      f"want {want[idx]!r}\n  rerun: {' '.join(argv)}")
            else:
                print(f"ok   {label}: relative error {err:.3g} <= {bound:g}")
    print(f"\n{3 * len(CASES) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
