#!/usr/bin/python3
"""Decoding throughput with a KV cache: multihead vs PyTorch 1.13 vs ONNX Runtime.

One run, every program in its own subprocess, the same shapes (issue 19's:
context 16,384, so the cache dominates, E = 4096, H = 32, D = 128, K/V heads
32, 8 and 1, batch 1, float32 weights (ours also 16-bit with --dtypes), no
biases, no RoPE, causal), T threads
(default 2):
  * the machine's read bandwidth and L3 size, measured first in this run by
    bench/fma_peak.cpp (multihead_fma_peak, built with
    -DMULTIHEAD_BUILD_BENCHMARKS=ON): all T threads reading a buffer of at
    least 4 x the last-level cache (all L3 instances summed), best of 5
    passes; the L3 size is printed beside the table (a cache that fits in L3
    would read faster than memory, and "% of the limit" would pass 100%);
  * ours, once per module weights dtype (--dtypes, default f32 only) and
    cache dtype (--cache-dtypes, default f32 bf16 f16 int8):
    `multihead decode --embed-dim E --num-heads H --num-kv-heads K
    --prompt-len C --tokens N --threads T --dtype W --cache-dtype X` (prefill
    of C tokens, then N steps of one token; it prints batch / the median
    step time); a row "ours X" has float32 weights, "ours W weights, X
    cache" the 16-bit module's (--dtype bf16 or f16: the weights rounded
    once, read in 16 bits by each step's projections);
  * PyTorch 1.13, written as a user would: four nn.Linear(bias=False), the
    cache a preallocated (B, Hkv, max, D) tensor filled by slice assignment
    ("torch prealloc"), or grown with torch.cat ("torch cat"), K/V repeated
    to H heads with repeat_interleave (Hugging Face's repeat_kv copies too),
    then matmul / softmax / matmul; the cache starts filled with C random
    positions (the prefill's cost is not what is measured);
  * ONNX Runtime's com.microsoft GroupQueryAttention (CPU) through the npm
    package onnxruntime-node, installed by this script into a cache folder
    (--ort-cache, `npm install` with install scripts off: the CPU binaries
    ship inside the package). The model file (MatMul q/k/v, GroupQueryAttention,
    MatMul o) is built here with the onnx Python package (Debian's
    python3-onnx: `apt-get install python3-onnx`); past K/V go in, present
    K/V come out: "shared buffer" binds past and present to one max-length
    buffer per K and V, written in place (onnxruntime-genai's
    past_present_share_buffer), "past+present" feeds present (past + 1
    positions, a copy) back as the next past.
Each program: W warm-up steps, then N timed steps; the median step. The
programs of one K/V setting alternate round by round (bench_common.alternated:
each round in a rotated order), and each row is the median of --rounds
rounds (default 3; each round's ms is printed too): the host is shared and
one pass can be 30% off.

Bytes read per token: the four projection weights, w·E·(2·H·D + 2·Hkv·D)
bytes with w the weights' own bytes (4 for f32, 2 for bf16 and f16), plus the K/V cache at context C in the row's own dtype,
2·Hkv·C·row_bytes: row_bytes = 4·D (f32), 2·D (bf16, f16), D + 4·ceil(D/32)
(int8 and its scales). The bandwidth limit is bandwidth / those bytes; it is
printed beside each row with the fraction of it the row reaches, and "x f32"
is the row's tokens/s over ours with float32 weights and the float32 cache.

A second table sets ours against issue 19's targets: tokens/s x f32 of at
least 1.7 with the bf16 cache and 2.8 with int8, each at >= 70% of its own
limit, against ours with float32 weights and the float32 cache; beside
each, "bytes allow" is that row's bytes over this row's, the most its fewer
bytes can give: with float32 weights, read every token, little (at E 4096
they are 256 MiB at 32 K/V heads, and most of the bytes at 8 and 1); with
--dtypes bf16, half of those bytes too.

Usage:
  /usr/bin/python3 bench/bench_decode.py --multihead build/tools/multihead [--threads 2]
      [--context 16384] [--tokens 32] [--warmup 4] [--cache-dtypes f32 bf16 f16 int8] [--dtypes f32 bf16]
      [--rounds 3] [--fma-peak build/bench/multihead_fma_peak] [--ort-cache ~/.cache/multihead-bench-ort]
  /usr/bin/python3 bench/bench_decode.py --multihead build/tools/multihead --quick
      (seconds: context 256, E 512, H 8, K/V heads 8, 2, 1, a 64 MiB bandwidth buffer; a smoke run,
      not a measurement)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import alternated, ensure_ort, machine_probe, onnx_missing, run_node  # noqa: E402


# ---- the machine ---------------------------------------------------------------
def machine(fma_peak, threads, quick):
    """(read bandwidth B/s, buffer bytes, L3 bytes, L3 instances, the probe's lines) from multihead_fma_peak."""
    f, lines = machine_probe(fma_peak, threads, ["--buffer-mib", "64"] if quick else [])
    return f["read_bandwidth_gbs"] * 1e9, int(f["buffer_bytes"]), int(f["l3_bytes"]), int(f["l3_instances"]), lines


# Bytes of one head's K (or V) row of one token, per cache dtype (KVCache::row_bytes).
ROW_BYTES = {"f32": lambda D: 4 * D, "bf16": lambda D: 2 * D, "f16": lambda D: 2 * D,
             "int8": lambda D: D + 4 * ((D + 31) // 32)}


# Bytes of one weight, per module weights dtype (multihead decode --dtype).
WEIGHT_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def bytes_per_token(E, H, Hkv, D, context, dtype="f32", weights_dtype="f32"):
    weights = WEIGHT_BYTES[weights_dtype] * E * (2 * H * D + 2 * Hkv * D)
    cache = 2 * Hkv * context * ROW_BYTES[dtype](D)
    return weights, cache


# ---- ours --------------------------------------------------------------------------
def run_ours(cli, E, H, Hkv, context, tokens, warmup, threads, dtype="f32", weights_dtype="f32"):
    n = tokens + warmup  # the median over all steps; warm-up steps sit at its far end
    argv = [cli, "decode", "--embed-dim", str(E), "--num-heads", str(H), "--num-kv-heads", str(Hkv),
            "--prompt-len", str(context), "--tokens", str(n), "--threads", str(threads), "--kernel", "auto",
            "--cache-dtype", dtype, "--dtype", weights_dtype]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    m = re.search(r"([0-9.]+) tokens/s \(median step ([0-9.]+) ms.*KV cache (\d+) bytes", r.stdout)
    if not m:
        raise RuntimeError(f"unexpected report: {r.stdout}")
    return float(m.group(2)), int(m.group(3))


def ours_name(weights_dtype, cache_dtype):
    """A row's name: "ours X" with float32 weights (the name of every run before --dtypes), else both dtypes."""
    if weights_dtype == "f32":
        return f"ours {cache_dtype}"
    return f"ours {weights_dtype} weights, {cache_dtype} cache"


# ---- PyTorch 1.13, as a user writes it ----------------------------------------------
TORCH_CODE = r"""
import json, math, statistics, sys, time, torch
E, H, Hkv, C, N, W, T, mode = sys.argv[1:9]
E, H, Hkv, C, N, W, T = map(int, (E, H, Hkv, C, N, W, T))
torch.set_num_threads(T)
torch.manual_seed(0)
D, B = E // H, 1
q_proj = torch.nn.Linear(E, H * D, bias=False)
k_proj = torch.nn.Linear(E, Hkv * D, bias=False)
v_proj = torch.nn.Linear(E, Hkv * D, bias=False)
o_proj = torch.nn.Linear(H * D, E, bias=False)
max_len = C + N + W
if mode == "prealloc":
    cache_k = torch.empty(B, Hkv, max_len, D); cache_v = torch.empty(B, Hkv, max_len, D)
    cache_k[:, :, :C].normal_(); cache_v[:, :, :C].normal_()
else:
    cache_k = torch.randn(B, Hkv, C, D); cache_v = torch.randn(B, Hkv, C, D)
pos = C

def step(x):
    global cache_k, cache_v, pos
    q = q_proj(x).view(B, 1, H, D).transpose(1, 2)
    k = k_proj(x).view(B, 1, Hkv, D).transpose(1, 2)
    v = v_proj(x).view(B, 1, Hkv, D).transpose(1, 2)
    if mode == "prealloc":
        cache_k[:, :, pos:pos + 1] = k; cache_v[:, :, pos:pos + 1] = v
        K, V = cache_k[:, :, :pos + 1], cache_v[:, :, :pos + 1]
    else:
        cache_k = torch.cat([cache_k, k], dim=2); cache_v = torch.cat([cache_v, v], dim=2)
        K, V = cache_k, cache_v
    pos += 1
    if Hkv != H:
        K = K.repeat_interleave(H // Hkv, dim=1); V = V.repeat_interleave(H // Hkv, dim=1)
    s = torch.matmul(q, K.transpose(-1, -2)) / math.sqrt(D)   # the new token sees every cached one
    o = torch.matmul(torch.softmax(s, dim=-1), V)
    return o_proj(o.transpose(1, 2).reshape(B, 1, H * D))

x = torch.randn(B, 1, E)
times = []
with torch.no_grad():
    for i in range(W + N):
        t = time.perf_counter(); x = step(x); dt = time.perf_counter() - t
        if i >= W: times.append(dt)
print(json.dumps({"median_s": statistics.median(times),
                  "cache_bytes": cache_k.element_size() * (cache_k.numel() + cache_v.numel())}))
"""


def run_torch(mode, E, H, Hkv, context, tokens, warmup, threads):
    r = subprocess.run([sys.executable, "-c", TORCH_CODE, str(E), str(H), str(Hkv), str(context), str(tokens),
                        str(warmup), str(threads), mode], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1])
    res = json.loads(r.stdout)
    return res["median_s"] * 1e3, res["cache_bytes"]


# ---- ONNX Runtime's GroupQueryAttention via onnxruntime-node -------------------------
def build_ort_model(path, E, H, Hkv):
    """MatMul q/k/v -> com.microsoft GroupQueryAttention -> MatMul o, weights as initializers."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    D = E // H
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(E)

    def w(name, rows, cols):  # stored (in, out) for x @ W
        return numpy_helper.from_array(rng.uniform(-bound, bound, (cols, rows)).astype(np.float32), name)

    inits = [w("Wq", H * D, E), w("Wk", Hkv * D, E), w("Wv", Hkv * D, E), w("Wo", E, H * D)]
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"]),
        helper.make_node("MatMul", ["x", "Wk"], ["k"]),
        helper.make_node("MatMul", ["x", "Wv"], ["v"]),
        helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", "seqlens_k",
                                                 "total_sequence_length"],
                         ["attn", "present_key", "present_value"], domain="com.microsoft",
                         num_heads=H, kv_num_heads=Hkv),
        helper.make_node("MatMul", ["attn", "Wo"], ["y"]),
    ]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", f, ["B", "L", E]),
              helper.make_tensor_value_info("past_key", f, ["B", Hkv, "P", D]),
              helper.make_tensor_value_info("past_value", f, ["B", Hkv, "P", D]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("y", f, ["B", "L", E]),
               helper.make_tensor_value_info("present_key", f, ["B", Hkv, "T", D]),
               helper.make_tensor_value_info("present_value", f, ["B", Hkv, "T", D])]
    graph = helper.make_graph(nodes, "gqa_decode", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, path)


ORT_CODE = r"""
const ort = require('onnxruntime-node');
const [model, E, H, Hkv, C, N, W, T, mode] = process.argv.slice(2);
const e = +E, h = +H, hkv = +Hkv, c = +C, n = +N, w = +W, D = e / h;
(async () => {
  const s = await ort.InferenceSession.create(model, {intraOpNumThreads: +T, interOpNumThreads: 1,
                                                        graphOptimizationLevel: 'all'});
  const rand = (k) => { const a = new Float32Array(k); for (let i = 0; i < k; ++i) a[i] = Math.random() - 0.5; return a; };
  // shared: past and present are one (1, Hkv, max, D) buffer each, written
  // in place (onnxruntime-genai's past_present_share_buffer); otherwise the
  // past has exactly the filled positions and present (past + 1) replaces it.
  const shared = mode === 'shared', max = c + w + n;
  let pk = new ort.Tensor('float32', rand(hkv * (shared ? max : c) * D), [1, hkv, shared ? max : c, D]);
  let pv = new ort.Tensor('float32', rand(hkv * (shared ? max : c) * D), [1, hkv, shared ? max : c, D]);
  const ys = [new ort.Tensor('float32', rand(e), [1, 1, e]), new ort.Tensor('float32', new Float32Array(e), [1, 1, e])];
  const times = [];
  for (let i = 0; i < w + n; ++i) {
    const past = c + i;  // filled positions
    const feeds = {x: ys[i % 2], past_key: pk, past_value: pv,
                   seqlens_k: new ort.Tensor('int32', Int32Array.from([past]), [1]),
                   total_sequence_length: new ort.Tensor('int32', Int32Array.from([past + 1]), [])};
    const t = process.hrtime.bigint();
    if (shared) {
      await s.run(feeds, {y: ys[(i + 1) % 2], present_key: pk, present_value: pv});
    } else {
      const r = await s.run(feeds);
      ys[(i + 1) % 2] = r.y; pk = r.present_key; pv = r.present_value;
    }
    const dt = Number(process.hrtime.bigint() - t) / 1e9;
    if (i >= w) times.push(dt);
  }
  times.sort((a, b) => a - b);
  const m = times.length % 2 ? times[(times.length - 1) / 2] : (times[times.length / 2 - 1] + times[times.length / 2]) / 2;
  console.log(JSON.stringify({median_s: m, cache_bytes: 2 * 4 * pk.dims.reduce((a, b) => a * b, 1)}));
})().catch((err) => { console.error(String(err).split('\n')[0]); process.exit(1); });
"""


def run_ort(mode, cache, workdir, E, H, Hkv, context, tokens, warmup, threads):
    model = os.path.join(workdir, f"gqa_E{E}_H{H}_kv{Hkv}.onnx")
    if not os.path.exists(model):
        build_ort_model(model, E, H, Hkv)
    out = run_node(ORT_CODE, [model, E, H, Hkv, context, tokens, warmup, threads, mode], cache, workdir,
                   "ort_decode.js")
    res = json.loads(out)
    return res["median_s"] * 1e3, res["cache_bytes"]


# Issue 19's decode targets: tokens/s over ours with the float32 cache, and
# the fraction of the row's own bandwidth limit.
TARGETS = {"bf16": 1.7, "int8": 2.8}
TARGET_OF_LIMIT = 0.70


def median_ms(results):
    """(median ms of the rounds that ran, cache bytes, the rounds' ms) or the first failure."""
    ok = [r for r in results if not isinstance(r, Exception)]
    if not ok:
        raise results[0]
    ms = [r[0] for r in ok]
    return statistics.median(ms), ok[0][1], ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--multihead", required=True, help="the multihead program")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--embed-dim", type=int, default=4096)
    ap.add_argument("--num-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, nargs="+", default=[32, 8, 1])
    ap.add_argument("--tokens", type=int, default=32, help="timed steps")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds, the programs of one K/V setting alternated in each (median of the rounds)")
    ap.add_argument("--cache-dtypes", nargs="+", default=["f32", "bf16", "f16", "int8"], choices=list(ROW_BYTES))
    ap.add_argument("--dtypes", nargs="+", default=["f32"], choices=list(WEIGHT_BYTES),
                    help="module weights dtypes of ours (multihead decode --dtype); default f32 only")
    ap.add_argument("--fma-peak", help="multihead_fma_peak (default: bench/ of --multihead's build folder)")
    ap.add_argument("--ort-cache", default=os.path.expanduser("~/.cache/multihead-bench-ort"))
    ap.add_argument("--skip", nargs="*", default=[], choices=["ours", "torch-prealloc", "torch-cat", "ort"])
    ap.add_argument("--quick", action="store_true", help="a seconds-long smoke run on small shapes")
    a = ap.parse_args()
    if a.quick:
        a.context, a.embed_dim, a.num_heads, a.kv_heads, a.tokens, a.warmup = 256, 512, 8, [8, 2, 1], 4, 1
        a.rounds = min(a.rounds, 2)
    E, H = a.embed_dim, a.num_heads
    D = E // H
    cli = os.path.abspath(a.multihead)
    workdir = tempfile.mkdtemp(prefix="bench_decode_")

    fma_peak = a.fma_peak or os.path.join(os.path.dirname(os.path.dirname(cli)), "bench", "multihead_fma_peak")
    bw, buffer_bytes, l3, l3_instances, peak_lines = machine(fma_peak, a.threads, a.quick)
    for line in peak_lines:
        print("  " + line)
    print(f"read bandwidth: {bw / 1e9:.1f} GB/s ({a.threads} threads, a {buffer_bytes / 2**20:.0f} MiB buffer); "
          f"L3 {l3 / 2**20:.0f} MiB ({l3_instances} instance{'s' if l3_instances != 1 else ''})"
          + ("" if buffer_bytes >= 4 * l3 else " -- the buffer is under 4 x L3: the limit is not memory's"))
    print(f"context {a.context}, E {E}, H {H}, D {D}, batch 1, ours' weights {' '.join(a.dtypes)} (the others "
          f"float32), {a.threads} threads; "
          f"{a.warmup} warm-up + {a.tokens} timed steps, median; the programs of each K/V setting alternated "
          f"round by round, the median of {a.rounds} rounds"
          + ("; QUICK SMOKE RUN, not a measurement" if a.quick else ""))
    ort_note = ""
    try:
        ort_cache = ensure_ort(a.ort_cache) if "ort" not in a.skip else None
        ort_note = onnx_missing() or ""
        if ort_note:
            ort_cache = None
    except Exception as e:  # the row says why it is missing
        ort_cache, ort_note = None, str(e)

    print()
    print(f"| K/V heads | program | ms/token | tokens/s | x f32 | cache MiB | bytes/token MiB | "
          f"bandwidth limit tokens/s | % of limit | rounds ms | (L3 {l3 / 2**20:.0f} MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for Hkv in a.kv_heads:
        def ort(mode, Hkv=Hkv):
            if not ort_cache:
                raise RuntimeError(ort_note or "skipped")
            return run_ort(mode, ort_cache, workdir, E, H, Hkv, a.context, a.tokens, a.warmup, a.threads)

        # name -> (run, the row's cache dtype and weights dtype for its bytes)
        programs = {ours_name(wdt, dt): (lambda dt=dt, wdt=wdt: run_ours(cli, E, H, Hkv, a.context, a.tokens,
                                                                          a.warmup, a.threads, dt, wdt), dt, wdt)
                    for wdt in ([] if "ours" in a.skip else a.dtypes) for dt in a.cache_dtypes}
        others = [("torch prealloc", "torch-prealloc",
                   lambda: run_torch("prealloc", E, H, Hkv, a.context, a.tokens, a.warmup, a.threads)),
                  ("torch cat", "torch-cat", lambda: run_torch("cat", E, H, Hkv, a.context, a.tokens, a.warmup,
                                                                a.threads)),
                  ("ORT GQA shared buffer", "ort", lambda: ort("shared")),
                  ("ORT GQA past+present", "ort", lambda: ort("copy"))]
        programs.update({name: (run, "f32", "f32") for name, skip, run in others if skip not in a.skip})
        results = alternated(list(programs), a.rounds, lambda name: programs[name][0]())
        tps_of, limit_of = {}, {}
        for name, (_, dtype, wdt) in programs.items():
            w_b, c_b = bytes_per_token(E, H, Hkv, D, a.context, dtype, wdt)
            own_limit = bw / (w_b + c_b)
            try:
                ms, cache, rounds_ms = median_ms(results[name])
                tps = 1e3 / ms
                tps_of[name], limit_of[name] = tps, own_limit
                ours_f32 = tps_of.get("ours f32")
                ratio = f"{tps / ours_f32:.2f}" if ours_f32 else ""
                print(f"| {Hkv} | {name} | {ms:.3f} | {tps:.1f} | {ratio} | {cache / 2**20:.1f} | "
                      f"{(w_b + c_b) / 2**20:.1f} | {own_limit:.1f} | {100 * tps / own_limit:.0f}% | "
                      f"{' '.join(f'{x:.2f}' for x in rounds_ms)} | |")
            except Exception as e:
                print(f"| {Hkv} | {name} | failed: {str(e)[:200]} | | | | {(w_b + c_b) / 2**20:.1f} | "
                      f"{own_limit:.1f} | | | |")
            sys.stdout.flush()
        summary.append((Hkv, tps_of, limit_of))

    print("\nAgainst issue 19's targets (ours, x ours with float32 weights and the float32 cache; \"bytes "
          "allow\" is bytes per token of that row over this row's, the most its fewer bytes can give):\n")
    print("| K/V heads | weights | cache | x f32 | target | bytes allow | % of its own limit (target >= 70%) |")
    print("|---|---|---|---|---|---|---|")
    for Hkv, tps_of, limit_of in summary:
        f32 = tps_of.get("ours f32")
        for wdt, dt in ((wdt, dt) for wdt in a.dtypes for dt in a.cache_dtypes):
            name = ours_name(wdt, dt)
            if name not in tps_of:
                continue
            allow = sum(bytes_per_token(E, H, Hkv, D, a.context, "f32")) / sum(
                bytes_per_token(E, H, Hkv, D, a.context, dt, wdt))
            target = TARGETS.get(dt)
            x = tps_of[name] / f32 if f32 else None
            verdict = "" if target is None or x is None else (" met" if x >= target else " missed")
            of_limit = tps_of[name] / limit_of[name]
            print(f"| {Hkv} | {wdt} | {dt} | {f'{x:.2f}' if x else '–'} |"
                  f" {f'>= {target}{verdict}' if target else '–'} | {allow:.2f} | "
                  f"{100 * of_limit:.0f}%{' met' if of_limit >= TARGET_OF_LIMIT else ' missed'} |")


if __name__ == "__main__":
    main()
