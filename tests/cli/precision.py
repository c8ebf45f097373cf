#!/usr/bin/python3
"""`--dtype` on the command line (docs/precision.md, "Command line").

  - `--dtype` unknown (forward, bench, init): exit 2, one stderr line naming
    the flag and the value;
  - `forward --dtype f16` on a CPU without AVX512_FP16 (this test's host,
    AMD Zen 4): exactly one note naming AVX512_FP16 and the widening path
    (on a CPU with it, the note says no fp16-FMA kernel is built);
  - `init --dtype bf16` / `f16` writes every tensor as BF16 / F16, equal to
    the f32 file's values rounded to nearest even (torch's rounding);
  - `forward --dtype bf16` on that file against PyTorch 1.13's bf16 module
    (`.to(torch.bfloat16)`) on the same numbers, both against float64: ours
    at most 1.5x PyTorch's RMS error; f16 against float64 within 8 u_f16 of
    the output's size;
  - a bf16 checkpoint without --dtype: computed in float32 from the exact
    values (1e-5 of float64), and one note saying so;
  - an f32 checkpoint with --dtype bf16: one note that it was rounded once,
    and the output bit-identical to the bf16 checkpoint's (the same values
    rounded by init); a bf16 checkpoint with --dtype f16: one note;
  - MULTIHEAD_BF16_DOT=dpbf16 and =fma: `--verbose` names the way, and each
    is at most 1.5x PyTorch's bf16 RMS error; an unknown value: exit 2, one
    line naming the variable;
  - --attn-weights-out with --dtype bf16: refused in one line;
  - `bench --dtype bf16` runs and reports dtype=bf16.

Usage: /usr/bin/python3 tests/cli/precision.py --multihead PATH --workdir DIR
Prints one line per check and `N passed, M failed`; exit 1 on any failure.
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
import safetensors_io  # noqa: E402

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


def run(cli, *args):
    return subprocess.run([cli, *args], capture_output=True, text=True)


def torch_module(tensors, E, H, dtype):
    m = torch.nn.MultiheadAttention(E, H)
    m.load_state_dict({k: torch.from_numpy(v) for k, (v, _) in tensors.items()})
    return m.to(dtype).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    cli, d = a.multihead, a.workdir
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name)  # noqa: E731
    E, H, L, B = 32, 4, 9, 2

    # unknown --dtype, in each command that takes it
    for cmd in (["forward", "--weights", "/dev/null", "--query", "/dev/null", "--out", p("x.npy")],
                ["bench", "--seq-len", "8", "--embed-dim", "8", "--num-heads", "2"],
                ["init", "--embed-dim", "8", "--num-heads", "2", "--out", p("x.safetensors")]):
        r = run(cli, *cmd, "--dtype", "f8")
        lines = r.stderr.strip().splitlines()
        check(f"{cmd[0]} --dtype f8: exit 2, one line", r.returncode == 2 and len(lines) == 1 and "--dtype" in lines[0]
              and "'f8'" in lines[0], f"rc {r.returncode}, stderr {r.stderr!r}")

    # init in each dtype: the same initialisation, rounded
    for dt in ("f32", "bf16", "f16"):
        r = run(cli, "init", "--embed-dim", str(E), "--num-heads", str(H), "--seed", "3", "--dtype", dt,
                "--out", p(f"w_{dt}.safetensors"))
        check(f"init --dtype {dt}", r.returncode == 0, r.stderr)
    f32, _ = safetensors_io.read(p("w_f32.safetensors"))
    for dt, tag in (("bf16", "BF16"), ("f16", "F16")):
        t, meta = safetensors_io.read(p(f"w_{dt}.safetensors"))
        same = all(t[k][1] == tag for k in t) and set(t) == set(f32)
        rounded = all(np.array_equal(t[k][0], safetensors_io.round_to_dtype(f32[k][0], tag)) for k in t)
        check(f"init --dtype {dt}: every tensor {tag}, the f32 values rounded to nearest even", same and rounded,
              f"dtypes {[t[k][1] for k in t]}")

    rng = np.random.RandomState(0)
    x = rng.randn(L, B, E).astype(np.float32)
    np.save(p("q.npy"), x)
    t16, _ = safetensors_io.read(p("w_bf16.safetensors"))
    x_bf = torch.from_numpy(x).to(torch.bfloat16)
    with torch.no_grad():
        m64 = torch_module(t16, E, H, torch.float64)
        ref = m64(x_bf.double(), x_bf.double(), x_bf.double(), need_weights=False)[0].numpy()
        m_bf = torch_module(t16, E, H, torch.bfloat16)
        theirs = m_bf(x_bf, x_bf, x_bf, need_weights=False)[0].float().numpy()

    r = run(cli, "forward", "--weights", p("w_bf16.safetensors"), "--query", p("q.npy"), "--out", p("o_bf16.npy"),
            "--dtype", "bf16")
    check("forward --dtype bf16 runs, no note", r.returncode == 0 and r.stderr == "", r.stderr)
    rms = lambda e: float(np.sqrt(np.mean(e ** 2)))  # noqa: E731
    e_torch = rms(theirs - ref)
    if r.returncode == 0:
        ours = np.load(p("o_bf16.npy"))
        e_ours = rms(ours - ref)
        check(f"forward --dtype bf16: rms error {e_ours:.2e} <= 1.5 x PyTorch bf16's {e_torch:.2e}",
              ours.dtype == np.float32 and e_ours <= 1.5 * e_torch)

    t_f16, _ = safetensors_io.read(p("w_f16.safetensors"))
    x_h = torch.from_numpy(x).half().double()
    with torch.no_grad():
        ref16 = torch_module(t_f16, E, H, torch.float64)(x_h, x_h, x_h, need_weights=False)[0].numpy()
    r = run(cli, "forward", "--weights", p("w_f16.safetensors"), "--query", p("q.npy"), "--out", p("o_f16.npy"),
            "--dtype", "f16")
    notes = [line for line in r.stderr.splitlines() if line.startswith("multihead: note:")]
    has_fp16 = "avx512_fp16" in open("/proc/cpuinfo").read()
    want = "no fp16-FMA kernel is built" if has_fp16 else "this CPU has no AVX512_FP16"
    check("forward --dtype f16: one note, naming AVX512_FP16 and the widening path",
          r.returncode == 0 and len(r.stderr.splitlines()) == 1 and len(notes) == 1 and want in notes[0]
          and "widening path" in notes[0], r.stderr)
    if r.returncode == 0:
        err = float(np.abs(np.load(p("o_f16.npy")) - ref16).max())
        bound = 8 * 2.0 ** -11 * float(np.abs(ref16).max())
        check(f"forward --dtype f16: max error {err:.2e} <= 8 u_f16 max|y| = {bound:.2e}", err <= bound)

    # a bf16 checkpoint in float32: exact values, one note
    r = run(cli, "forward", "--weights", p("w_bf16.safetensors"), "--query", p("q.npy"), "--out", p("o_32.npy"))
    lines = r.stderr.splitlines()
    check("bf16 checkpoint without --dtype: one note that it runs in float32",
          r.returncode == 0 and len(lines) == 1 and "bfloat16 parameters" in lines[0] and "float32" in lines[0], r.stderr)
    if r.returncode == 0:
        with torch.no_grad():
            xd = torch.from_numpy(x).double()
            ref32 = m64(xd, xd, xd, need_weights=False)[0].numpy()
        err = float(np.abs(np.load(p("o_32.npy")) - ref32).max())
        check(f"bf16 checkpoint in float32: max error {err:.1e} <= 1e-5", err <= 1e-5)

    # an f32 checkpoint into the bf16 module: rounded once, said once
    r = run(cli, "forward", "--weights", p("w_f32.safetensors"), "--query", p("q.npy"), "--out", p("o_f32bf.npy"),
            "--dtype", "bf16")
    lines = r.stderr.splitlines()
    check("f32 checkpoint with --dtype bf16: one note that it was rounded once",
          r.returncode == 0 and len(lines) == 1 and "float32 parameters; rounded once to bfloat16" in lines[0], r.stderr)
    if r.returncode == 0 and os.path.exists(p("o_bf16.npy")):
        check("f32 checkpoint with --dtype bf16: output bit-identical to the bf16 checkpoint's",
              np.array_equal(np.load(p("o_f32bf.npy")), np.load(p("o_bf16.npy"))))
    r = run(cli, "forward", "--weights", p("w_bf16.safetensors"), "--query", p("q.npy"), "--out", p("o_bf16h.npy"),
            "--dtype", "f16")
    notes = [line for line in r.stderr.splitlines() if "rounded once" in line]
    check("bf16 checkpoint with --dtype f16: one note that it was rounded once to float16",
          r.returncode == 0 and len(notes) == 1 and "bfloat16 parameters; rounded once to float16" in notes[0], r.stderr)

    # a finite weight float16 cannot hold (|x| > 65504) is refused for --dtype f16, naming the tensor and the
    # file, with no output written; bf16 (float32's range) and f32 run it
    big, meta = safetensors_io.read(p("w_bf16.safetensors"))
    bias = big["out_proj.bias"][0].copy()
    bias[3] = 1.0e6
    big["out_proj.bias"] = (bias, "BF16")
    safetensors_io.write(p("w_big.safetensors"), big, meta)
    r = run(cli, "forward", "--weights", p("w_big.safetensors"), "--query", p("q.npy"), "--out", p("o_big.npy"),
            "--dtype", "f16")
    lines = r.stderr.strip().splitlines()
    check("a bf16 weight of 1e6 with --dtype f16: exit 2, one line naming the tensor, index, 65504 and the file",
          r.returncode == 2 and len(lines) == 1 and "out_proj.bias" in lines[0] and "65504" in lines[0]
          and "index (3)" in lines[0] and "w_big.safetensors" in lines[0] and not os.path.exists(p("o_big.npy")),
          f"rc {r.returncode}, stderr {r.stderr!r}")
    for dt in ("bf16", "f32"):
        r = run(cli, "forward", "--weights", p("w_big.safetensors"), "--query", p("q.npy"), "--out",
                p(f"o_big_{dt}.npy"), "--dtype", dt)
        check(f"a bf16 weight of 1e6 with --dtype {dt}: runs, finite output",
              r.returncode == 0 and np.isfinite(np.load(p(f"o_big_{dt}.npy"))).all(), r.stderr)

    # the grouped-query module (forward --num-kv-heads, decode) says the same notes: a bf16 file computed in
    # float32, the compute path of --dtype f16, a file of another dtype rounded into the 16-bit module; none
    # when the file holds the module's own dtype. Each note once, after a successful run.
    r = run(cli, "init", "--embed-dim", "16", "--num-heads", "4", "--num-kv-heads", "2", "--seed", "5",
            "--out", p("g_f32.safetensors"))
    check("init --num-kv-heads (f32)", r.returncode == 0, r.stderr)
    g32, gmeta = safetensors_io.read(p("g_f32.safetensors"))
    for dt, tag in (("bf16", "BF16"), ("f16", "F16")):
        r = run(cli, "init", "--embed-dim", "16", "--num-heads", "4", "--num-kv-heads", "2", "--seed", "5",
                "--dtype", dt, "--out", p(f"g_{dt}.safetensors"))
        t, meta = (safetensors_io.read(p(f"g_{dt}.safetensors")) if r.returncode == 0 else ({}, {}))
        check(f"init --num-kv-heads --dtype {dt}: every tensor {tag}, the f32 values rounded, the same metadata",
              r.returncode == 0 and set(t) == set(g32) and all(t[k][1] == tag for k in t) and meta == gmeta
              and all(np.array_equal(t[k][0], safetensors_io.round_to_dtype(g32[k][0], tag)) for k in t), r.stderr)
    np.save(p("gq.npy"), rng.randn(2, 5, 16).astype(np.float32))
    widened = "--weights holds bfloat16 parameters; computed in float32 from their exact values"
    compute = "this CPU has no AVX512_FP16" if not has_fp16 else "no fp16-FMA kernel is built"
    for name, args, want in (
            ("forward --num-kv-heads, bf16 file", ["forward", "--weights", p("g_bf16.safetensors"), "--num-kv-heads",
                                                  "2", "--query", p("gq.npy"), "--out", p("go.npy")], [widened]),
            ("decode, bf16 file", ["decode", "--weights", p("g_bf16.safetensors")], [widened]),
            ("decode --dtype bf16, bf16 file", ["decode", "--weights", p("g_bf16.safetensors"), "--dtype", "bf16"], []),
            ("decode --dtype bf16, f32 file", ["decode", "--weights", p("g_f32.safetensors"), "--dtype", "bf16"],
             ["--weights holds float32 parameters; rounded once to bfloat16 (nearest even) for --dtype bf16"]),
            ("decode --dtype f16, bf16 file", ["decode", "--weights", p("g_bf16.safetensors"), "--dtype", "f16"],
             [compute, "--weights holds bfloat16 parameters; rounded once to float16 (nearest even) for --dtype f16"]),
    ):
        if args[0] == "decode":
            args = args + ["--prompt-len", "4", "--tokens", "2"]
        r = run(cli, *args)
        notes = [line for line in r.stderr.splitlines() if line.startswith("multihead: note: ")]
        check(f"{name}: notes {len(want)}", r.returncode == 0 and len(notes) == len(want)
              and len(r.stderr.splitlines()) == len(want) and all(w in n for w, n in zip(want, notes)),
              f"rc {r.returncode}, stderr {r.stderr!r}")
    # forward --num-kv-heads --dtype bf16|f16: the 16-bit grouped-query module, against a float64 NumPy
    # grouped-query attention (written here: projections, half-split RoPE, causal window of 3, K/V heads shared
    # by query-head groups) on the file's values rounded to the dtype and the query rounded the same way. The
    # reference is first checked against our float32 run (1e-5: float32 sums over E = 16 terms). Bound: the
    # 16-bit module rounds q/k/v, the rotated q/k, the merged heads and the output, each within u of its value,
    # and every product and sum is float32; 8 u · max|y| holds those few roundings with room (the library's
    # derived per-case bounds are tests/precision/test_precision_gqa.cpp's).
    def gqa_reference(t, xq, H, Hkv, window):
        W = {k: v[0] for k, v in t.items()}
        Bq, Lq, Eq = xq.shape
        D = W["q_proj.weight"].shape[0] // H
        proj = lambda name: xq @ W[name + ".weight"].T + W[name + ".bias"]  # noqa: E731
        q = proj("q_proj").reshape(Bq, Lq, H, D)
        k = proj("k_proj").reshape(Bq, Lq, Hkv, D)
        v = proj("v_proj").reshape(Bq, Lq, Hkv, D)
        inv = 10000.0 ** (-np.arange(0, D // 2) * 2.0 / D)
        ang = np.arange(Lq)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
        rot = lambda a: np.concatenate([a[..., :D // 2] * cos - a[..., D // 2:] * sin,  # noqa: E731
                                        a[..., D // 2:] * cos + a[..., :D // 2] * sin], axis=-1)
        q, k = rot(q), rot(k)
        i, j = np.arange(Lq)[:, None], np.arange(Lq)[None, :]
        visible = (j <= i) & (i - j < window)
        out = np.zeros((Bq, Lq, H, D))
        for h in range(H):
            g = h // (H // Hkv)
            sc = np.einsum("bid,bjd->bij", q[:, :, h], k[:, :, g]) / np.sqrt(D)
            sc = np.where(visible[None], sc, -np.inf)
            pr = np.exp(sc - sc.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            out[:, :, h] = np.einsum("bij,bjd->bid", pr, v[:, :, g])
        return out.reshape(Bq, Lq, H * D) @ W["o_proj.weight"].T + W["o_proj.bias"]

    xg = np.load(p("gq.npy")).astype(np.float64)
    gflags = ["--num-kv-heads", "2", "--query", p("gq.npy"), "--is-causal", "--window", "3", "--rope", "half-split"]
    r = run(cli, "forward", "--weights", p("g_f32.safetensors"), *gflags, "--out", p("gref32.npy"))
    ref32 = gqa_reference(g32, xg, 4, 2, 3)
    err32 = float(np.abs(np.load(p("gref32.npy")) - ref32).max()) if r.returncode == 0 else float("inf")
    check(f"the NumPy grouped-query reference against our float32 forward: {err32:.1e} <= 1e-5", err32 <= 1e-5,
          r.stderr)
    for dt, tag, u in (("bf16", "BF16", 2.0 ** -8), ("f16", "F16", 2.0 ** -11)):
        t16, _ = safetensors_io.read(p(f"g_{dt}.safetensors"))
        r = run(cli, "forward", "--weights", p(f"g_{dt}.safetensors"), *gflags, "--out", p(f"g16_{dt}.npy"),
                "--dtype", dt)
        gref = gqa_reference(t16, safetensors_io.round_to_dtype(xg, tag), 4, 2, 3)
        gerr = float(np.abs(np.load(p(f"g16_{dt}.npy")) - gref).max()) if r.returncode == 0 else float("inf")
        gbound = 8 * u * float(np.abs(gref).max())
        check(f"forward --num-kv-heads --dtype {dt}: max error {gerr:.2e} <= 8 u max|y| = {gbound:.2e}",
              gerr <= gbound, r.stderr)
        far = float(np.abs(np.load(p(f"g16_{dt}.npy")) - gqa_reference(t16, xg, 4, 2, 6)).max()) \
            if r.returncode == 0 else 0.0
        check(f"forward --num-kv-heads --dtype {dt}: the window matters ({far:.2e} from a window of 6)",
              far > 10 * gbound)

    # a failed run prints its error alone
    r = run(cli, "decode", "--weights", p("g_bf16.safetensors"), "--dtype", "f16", "--prompt", p("q.npy"),
            "--tokens", "2")
    check("decode --dtype f16 with a bad prompt: one line, the error", r.returncode == 2
          and len(r.stderr.strip().splitlines()) == 1 and "prompt" in r.stderr, f"rc {r.returncode}, {r.stderr!r}")

    # the two bf16 dot ways, forced by the environment
    for way in ("dpbf16", "fma"):
        env = dict(os.environ, MULTIHEAD_BF16_DOT=way)
        r = subprocess.run([cli, "forward", "--weights", p("w_bf16.safetensors"), "--query", p("q.npy"), "--out",
                            p(f"o_{way}.npy"), "--dtype", "bf16", "--verbose"], capture_output=True, text=True, env=env)
        check(f"MULTIHEAD_BF16_DOT={way}: --verbose names the way",
              r.returncode == 0 and f"bf16 dot {way} (" in r.stderr, r.stderr)
        if r.returncode == 0:
            e_way = rms(np.load(p(f"o_{way}.npy")) - ref)
            check(f"MULTIHEAD_BF16_DOT={way}: rms error {e_way:.2e} <= 1.5 x PyTorch bf16's {e_torch:.2e}",
                  e_way <= 1.5 * e_torch)
    env = dict(os.environ, MULTIHEAD_BF16_DOT="vnni")
    r = subprocess.run([cli, "forward", "--weights", p("w_bf16.safetensors"), "--query", p("q.npy"), "--out",
                        p("o_bad.npy"), "--dtype", "bf16"], capture_output=True, text=True, env=env)
    lines = r.stderr.strip().splitlines()
    check("MULTIHEAD_BF16_DOT=vnni: exit 2, one line naming the variable and the accepted ways",
          r.returncode == 2 and len(lines) == 1 and "MULTIHEAD_BF16_DOT" in lines[0] and "auto, fma, dpbf16, measure" in lines[0]
          and not os.path.exists(p("o_bad.npy")), r.stderr)

    r = run(cli, "forward", "--weights", p("w_bf16.safetensors"), "--query", p("q.npy"), "--out", p("o.npy"),
            "--dtype", "bf16", "--attn-weights-out", p("a.npy"))
    check("--attn-weights-out with --dtype bf16: refused in one line",
          r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--attn-weights-out" in r.stderr, r.stderr)

    r = run(cli, "bench", "--seq-len", "16", "--embed-dim", "32", "--num-heads", "4", "--repeat", "1", "--warmup", "0",
            "--dtype", "bf16")
    check("bench --dtype bf16 reports dtype=bf16", r.returncode == 0 and "dtype=bf16" in r.stdout, r.stdout + r.stderr)

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
