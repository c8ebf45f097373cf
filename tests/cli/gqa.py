#!/usr/bin/python3
"""`multihead forward --num-kv-heads` and `multihead decode` against float64 numpy.

The grouped-query module is computed here as the same model with its K/V
heads repeated (Llama's repeat_kv: query head h uses K/V head h // (H // Hkv)),
in numpy float64, sharing no code with the library:
  q = x Wq^T, k = x Wk^T, v = x Wv^T (then RoPE on q and k, position p:
  pairs (2i, 2i+1) interleaved or (i, i + D/2) half-split rotated by
  p * theta^(-2i/D)), softmax(q k^T / sqrt(D) + causal/window) v, then Wo.
Weights come from `multihead init --num-kv-heads`, read back here.
  - forward: a table of K/V heads x RoPE x causal/window x kernel.
  - decode: the N generated vectors equal the full causal forward over the
    sequence the command fed itself (prompt, then each output as the next
    input), rows P .. P + N - 1. One run gives no --num-kv-heads: the
    count comes from the file's metadata.
  - decode --dtype bf16 / f16: the same on the file's weights rounded to
    16 bits here (bound below, in units of the type's rounding).
Bounds: float32 end to end, 2e-5 relative to the output's largest
magnitude (a few hundred roundings of 2^-24 over E = 32 terms, a softmax of
at most 20 keys and three products); float64 inputs run in float64: 1e-12.

Usage: /usr/bin/python3 tests/cli/gqa.py --multihead PATH --workdir DIR
"""
import argparse
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import safetensors_io  # noqa: E402

E, H, B, L = 32, 4, 2, 9
D = E // H


def rope(x, positions, convention, theta):
    """x (..., L, heads, D) rotated for positions (L,)."""
    y = x.copy()
    i = np.arange(D // 2)
    angle = positions[:, None] * theta ** (-2.0 * i / D)  # (L, D/2)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    if convention == "interleaved":
        a, c = x[..., 0::2], x[..., 1::2]
        y[..., 0::2], y[..., 1::2] = a * cos - c * sin, a * sin + c * cos
    else:
        a, c = x[..., : D // 2], x[..., D // 2:]
        y[..., : D // 2], y[..., D // 2:] = a * cos - c * sin, a * sin + c * cos
    return y


def reference(x, w, kv_heads, rope_conv, theta, causal, window):
    """The grouped-query module on x (B, L, E) as multi-head attention with repeated K/V, float64."""
    b_, l_ = x.shape[:2]
    q = (x @ w["q_proj.weight"].T).reshape(b_, l_, H, D)
    k = (x @ w["k_proj.weight"].T).reshape(b_, l_, kv_heads, D)
    v = (x @ w["v_proj.weight"].T).reshape(b_, l_, kv_heads, D)
    if rope_conv:
        pos = np.arange(l_, dtype=np.float64)
        q, k = rope(q, pos, rope_conv, theta), rope(k, pos, rope_conv, theta)
    group = H // kv_heads
    k = np.repeat(k, group, axis=2)  # head h <- K/V head h // group
    v = np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(D)
    i, j = np.arange(l_)[:, None], np.arange(l_)[None, :]
    visible = np.ones((l_, l_), bool)
    if causal:
        visible &= j <= i
    if window:
        visible &= (i - j < window) if causal else (np.abs(i - j) < window)
    s = np.where(visible, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p, v).reshape(b_, l_, H * D)
    return o @ w["o_proj.weight"].T


def round_to(x, dtype):
    """float32 x rounded to nearest even bf16 or f16, as float64 (exact)."""
    x = np.asarray(x, np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float64)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16  # finite values only (these are)
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def run(argv):
    r = subprocess.run(argv, capture_output=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.decode().strip()}")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    cli = os.path.abspath(a.multihead)
    os.makedirs(a.workdir, exist_ok=True)
    rng = np.random.default_rng(20261201)
    failed = passed = 0
    x = rng.standard_normal((B, L, E)).astype(np.float32)
    xp = os.path.join(a.workdir, "x.npy")
    np.save(xp, x)
    np.save(os.path.join(a.workdir, "x64.npy"), x.astype(np.float64))
    rows = []
    for kv in (1, 2, 4):
        wp = os.path.join(a.workdir, f"w{kv}.safetensors")
        run([cli, "init", "--embed-dim", str(E), "--num-heads", str(H), "--num-kv-heads", str(kv), "--no-bias",
             "--seed", str(kv), "--out", wp])
        w = {k: t[0] for k, t in safetensors_io.read(wp)[0].items()}
        for rope_conv, theta in ((None, 0), ("interleaved", 10000.0), ("half-split", 500000.0)):
            for causal, window in ((True, None), (False, None), (True, 3), (False, 2)):
                for kernel, dtype in (("flash", "x.npy"), ("materialized", "x.npy"), ("reference", "x64.npy")):
                    rows.append((kv, rope_conv, theta, causal, window, kernel, dtype, wp, w))
    for kv, rope_conv, theta, causal, window, kernel, xin, wp, w in rows:
        out = os.path.join(a.workdir, "y.npy")
        argv = [cli, "forward", "--weights", wp, "--num-kv-heads", str(kv), "--query", os.path.join(a.workdir, xin),
                "--kernel", kernel, "--out", out]
        if rope_conv:
            argv += ["--rope", rope_conv, "--rope-theta", str(theta)]
        if causal:
            argv += ["--is-causal"]
        if window:
            argv += ["--window", str(window)]
        name = f"forward kv={kv} rope={rope_conv} causal={causal} window={window} kernel={kernel} {xin}"
        try:
            run(argv)
            got = np.load(out)
            want = reference(x.astype(np.float64), w, kv, rope_conv, theta, causal, window)
            err = np.abs(got - want).max() / np.abs(want).max()
            bound = 1e-12 if xin == "x64.npy" else 2e-5
            ok = err <= bound
        except RuntimeError as e:
            ok, err, bound = False, float("nan"), 0
            print(e)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max error / max |out| = {err:.3g} (bound {bound:g})")
        passed, failed = passed + ok, failed + (not ok)

    # decode: prompt P, N tokens, each output fed back as the next input.
    for kv, rope_conv, window, prompt_len in ((2, "half-split", None, 5), (1, "interleaved", 4, 1), (4, None, None, 9)):
        wp = os.path.join(a.workdir, f"w{kv}.safetensors")
        w = {k: t[0] for k, t in safetensors_io.read(wp)[0].items()}
        prompt = rng.standard_normal((B, prompt_len, E)).astype(np.float32)
        pp, out = os.path.join(a.workdir, "prompt.npy"), os.path.join(a.workdir, "gen.npy")
        np.save(pp, prompt)
        n = 6
        # kv=2 without --num-kv-heads: the file's num_kv_heads, as `multihead init`
        # wrote it (issue 22, defect 6: decode used num_heads K/V heads instead).
        kv_flag = [] if kv == 2 else ["--num-kv-heads", str(kv)]
        argv = [cli, "decode", "--weights", wp, *kv_flag, "--prompt", pp, "--tokens", str(n), "--out", out]
        if rope_conv:
            argv += ["--rope", rope_conv]
        if window:
            argv += ["--window", str(window)]
        name = (f"decode kv={kv}{'' if kv_flag else ' (from the file)'} rope={rope_conv} window={window} "
                f"prompt={prompt_len} tokens={n}")
        try:
            report = run(argv).stdout.decode()
            gen = np.load(out)
            # The inputs the command fed itself: the prompt, then the
            # prompt's last output, then each generated vector but the last.
            first = reference(prompt.astype(np.float64), w, kv, rope_conv, 10000.0, True, window)[:, -1:]
            seq = np.concatenate([prompt, first.astype(np.float32), gen[:, :-1]], axis=1).astype(np.float64)
            want = reference(seq, w, kv, rope_conv, 10000.0, True, window)[:, prompt_len:]
            err = np.abs(gen - want).max() / np.abs(want).max()
            # The fed-back inputs are the command's own float32 values, so
            # errors do not compound beyond one step's rounding, except
            # through the first input (the prompt's last output), computed here
            # in float64: its float32 rounding enters every later step.
            ok = err <= 2e-5 and "tokens/s" in report and "KV cache" in report
            expected_bytes = 2 * B * kv * (prompt_len + n) * D * 4
            ok = ok and f"KV cache {expected_bytes} bytes" in report
        except RuntimeError as e:
            ok, err = False, float("nan")
            print(e)
            report = ""
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max error / max |out| = {err:.3g} (bound 2e-05); {report.strip()}")
        passed, failed = passed + ok, failed + (not ok)
    # decode --dtype bf16 / f16: the 16-bit module on the same file's weights
    # rounded once to E, against float64 numpy on those rounded weights and
    # the rounded prompt, with no other rounding. The command rounds q, k, v,
    # each head's attention output and the output to E (each within u_E of
    # its value: 2^-8 bf16, 2^-11 f16), and its fed-back inputs are its own
    # outputs (rounded; read back from --out), so the error is one step's:
    # those roundings carried through the softmax and W_o, a few u_E
    # relative to max |out| (measured 2026-12-03: 1.05 u_E bf16, 0.68 u_E
    # f16), plus the first input's (the prompt's last output, computed here in
    # float64: its rounding enters every step), so the bound is 8 u_E.
    for dtype, unit in (("bf16", 2.0 ** -8), ("f16", 2.0 ** -11)):
        kv, prompt_len, n = 2, 5, 6
        wp = os.path.join(a.workdir, f"w{kv}.safetensors")
        w = {k: round_to(t[0].astype(np.float32), dtype) for k, t in safetensors_io.read(wp)[0].items()}
        prompt = rng.standard_normal((B, prompt_len, E)).astype(np.float32)
        pp, out = os.path.join(a.workdir, "prompt.npy"), os.path.join(a.workdir, "gen.npy")
        np.save(pp, prompt)
        argv = [cli, "decode", "--weights", wp, "--prompt", pp, "--tokens", str(n), "--rope", "half-split",
                "--dtype", dtype, "--out", out]
        name = f"decode --dtype {dtype} kv={kv} rope=half-split prompt={prompt_len} tokens={n}"
        bound = 8 * unit
        try:
            report = run(argv).stdout.decode()
            gen = np.load(out)
            rounded_prompt = round_to(prompt, dtype)
            first = round_to(reference(rounded_prompt, w, kv, "half-split", 10000.0, True, None)[:, -1:]
                             .astype(np.float32), dtype)
            seq = np.concatenate([rounded_prompt, first, gen[:, :-1]], axis=1)
            want = reference(seq, w, kv, "half-split", 10000.0, True, None)[:, prompt_len:]
            err = np.abs(gen - want).max() / np.abs(want).max()
            weight_bytes = 2 * (2 * E * H * D + 2 * E * kv * D)
            ok = (err <= bound and gen.dtype == np.float32 and np.array_equal(round_to(gen, dtype), gen)
                  and f"weights {dtype}, {weight_bytes} bytes" in report)
        except RuntimeError as e:
            ok, err = False, float("nan")
            print(e)
            report = ""
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max error / max |out| = {err:.3g} = {err / unit:.2f} u_E "
              f"(bound {bound:.3g}); {report.strip()}")
        passed, failed = passed + ok, failed + (not ok)
    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
