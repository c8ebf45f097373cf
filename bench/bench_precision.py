#!/usr/bin/python3
"""The 16-bit forward (and training step) side by side: issue 19's benchmark.

One run, 2 threads (--threads), every measurement in its own subprocess:
  * the machine's three peaks, measured first in this run by
    bench/fma_peak.cpp (multihead_fma_peak, -DMULTIHEAD_BUILD_BENCHMARKS=ON):
    float32 FMA, vdpbf16ps (AVX512_BF16) and fp16 FMA (AVX512_FP16), each
    "n/a" where the CPU lacks the instruction; the ratios of the 16-bit
    peaks to the FMA peak are what the targets depend on;
  * forward, at the README's shapes (bench_vs_pytorch.py's ISSUE_SHAPES,
    its calls_for: at least --repeat timed calls after --warmup, short
    calls to about 1 s), eval, need_weights=False, self-attention:
      - ours f32 / bf16 / f16: `multihead bench --dtype f32|bf16|f16`
        (bench_vs_pytorch.ours; the 16-bit module and input rounded once,
        outside the timing);
      - PyTorch 1.13 bf16: nn.MultiheadAttention(E, H).to(torch.bfloat16),
        eval, need_weights=False, a bfloat16 input, causal as a boolean
        attn_mask; in bench_common.TUNED_ENV;
      - ONNX Runtime 1.30 fp32 and fp16: the npm package onnxruntime-node
        (bench_common.ensure_ort), a model file written here with the onnx
        Python package (Debian's python3-onnx): MatMul + Add for q, k, v,
        com.microsoft MultiHeadAttention (unidirectional=1 when causal),
        MatMul + Add for the output, (B, L, E) in and out, the weights as
        initializers in the model's type; CPU provider, graph optimisation
        'all', intra-op threads = --threads. Whether the fp16 model really
        computes in fp16 is read off ORT's own optimised graph (saved once
        per model): where the CPU provider has no fp16 kernel, ORT inserts
        Casts and runs the node in float32, and the table says so;
  * training step (--train), at bench_train_vs_pytorch.py's SHAPES: ours
    f32 (that script's child: forward_with_context + backward, flash),
    ours bf16 and f16 (the same child with the module built with
    dtype="bfloat16" / "float16" and float32 arrays rounded on the way in,
    where this build's Python module has 16-bit training: a feature check
    on a tiny step first, "not available in this build" otherwise), and
    PyTorch 1.13 float32 autograd (that script's child, TUNED_ENV).
The host is shared and noisy (one pass can be 30% off), so for each shape
the programs alternate round by round (bench_common.alternated, each round
in a rotated order) and each cell is the median of --rounds rounds, each
round itself the median of its calls.

FLOPs as bench_vs_pytorch.py and bench_train_vs_pytorch.py count them:
forward 8·B·L·E² + 4·B·L²·E, step 24·B·L·E² + 12·B·L²·E (the full square
also when causal). Ratios are speed-ups (the other time over this one).

Prints Markdown tables, then each of issue 19's targets with its measured
value (met / missed / n/a and why).

Usage:
  /usr/bin/python3 bench/bench_precision.py --build-dir build [--threads 2] [--rounds 3]
      [--repeat 5] [--warmup 2] [--train] [--no-forward] [--skip NAME ...]
      [--ort-cache ~/.cache/multihead-bench-ort]
  /usr/bin/python3 bench/bench_precision.py --build-dir build --quick [--train]
      (seconds: two small shapes, one round; a smoke run of the script, not a measurement)
The build directory needs tools/multihead, bench/multihead_fma_peak
(-DMULTIHEAD_BUILD_BENCHMARKS=ON) and, for --train, python/multihead
(-DMULTIHEAD_BUILD_PYTHON=ON).
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (TUNED_ENV, TUNED_UNSET, alternated, ensure_ort, field, machine_probe,  # noqa: E402
                          onnx_missing, run_child, run_node)
import bench_train_vs_pytorch as train_bench  # noqa: E402
import bench_vs_pytorch as forward_bench  # noqa: E402

QUICK_SHAPES = [(1, 128, 256, 4, False), (1, 256, 256, 4, True)]
QUICK_TRAIN_SHAPES = train_bench.QUICK_SHAPES

# ---- PyTorch 1.13 in bfloat16 (bench_vs_pytorch.py's child, cast to bf16) -------------


def torch_bf16_ms(shape, threads, repeat, warmup):
    B, L, E, H, causal = shape
    cmd = ["/usr/bin/python3", "-c", forward_bench.TORCH_CHILD] + [str(v) for v in (B, L, E, H, int(causal), threads,
                                                                                  repeat, warmup, "bfloat16")]
    env = dict(TUNED_ENV, OMP_NUM_THREADS=str(threads))
    out, _, _ = run_child(cmd, env, TUNED_UNSET)
    return field(out, "median_ms")


# ---- ONNX Runtime: MatMul/Add projections around com.microsoft MultiHeadAttention ---
ONNX_FLOAT = 1  # TensorProto.FLOAT
ONNX_FLOAT16 = 10  # TensorProto.FLOAT16


def build_ort_forward(path, E, H, causal, dtype):
    """The model file of one forward: y = MHA(x Wq + bq, x Wk + bk, x Wv + bv) Wo + bo,
    x and y (B, L, E), weights uniform(±1/√E) in the model's dtype ('f32' or 'f16')."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    np_dtype, onnx_dtype = (np.float16, TensorProto.FLOAT16) if dtype == "f16" else (np.float32, TensorProto.FLOAT)
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(E)
    inits, nodes = [], []
    for p in "qkvo":
        inits.append(numpy_helper.from_array(rng.uniform(-bound, bound, (E, E)).astype(np_dtype), "W" + p))
        inits.append(numpy_helper.from_array(np.zeros(E, np_dtype), "b" + p))
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["x", "W" + p], [p + "_mm"]),
                  helper.make_node("Add", [p + "_mm", "b" + p], [p])]
    attrs = {"num_heads": H}
    if causal:
        attrs["unidirectional"] = 1
    nodes += [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["attn"], domain="com.microsoft", **attrs),
              helper.make_node("MatMul", ["attn", "Wo"], ["y_mm"]),
              helper.make_node("Add", ["y_mm", "bo"], ["y"])]
    graph = helper.make_graph(nodes, "mha_forward", [helper.make_tensor_value_info("x", onnx_dtype, ["B", "L", E])],
                              [helper.make_tensor_value_info("y", onnx_dtype, ["B", "L", E])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, path)


ORT_FORWARD_CODE = r"""
const fs = require('fs');
const ort = require('onnxruntime-node');
const [model, input, dtype, B, L, E, T, repeat, warmup, optimized] = process.argv.slice(2);
(async () => {
  const opts = {intraOpNumThreads: +T, interOpNumThreads: 1, graphOptimizationLevel: 'all'};
  if (optimized) opts.optimizedModelFilePath = optimized;
  const s = await ort.InferenceSession.create(model, opts);
  const raw = fs.readFileSync(input);
  const data = dtype === 'f16' ? new Uint16Array(raw.buffer, raw.byteOffset, raw.length / 2)
                               : new Float32Array(raw.buffer, raw.byteOffset, raw.length / 4);
  const x = new ort.Tensor(dtype === 'f16' ? 'float16' : 'float32', data, [+B, +L, +E]);
  const times = [];
  for (let i = 0; i < +warmup + +repeat; ++i) {
    const t = process.hrtime.bigint();
    const r = await s.run({x});
    const ms = Number(process.hrtime.bigint() - t) / 1e6;
    if (i >= +warmup) times.push(ms);
    if (r.y.type !== (dtype === 'f16' ? 'float16' : 'float32')) throw new Error('output type ' + r.y.type);
  }
  times.sort((a, b) => a - b);
  const n = times.length, m = n % 2 ? times[(n - 1) / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  console.log('median_ms=' + m.toFixed(4));
})().catch((err) => { console.error(String(err).split('\n')[0]); process.exit(1); });
"""


class Ort:
    """ONNX Runtime's forward per (shape, dtype): model and input files in a
    temporary folder, written once; `why_not` is set when it cannot run."""

    def __init__(self, cache, workdir, threads):
        self.workdir, self.threads, self.cache, self.why_not = workdir, threads, None, None
        self.compute = {}  # (E, H, causal, dtype) -> what the optimised graph computes in
        try:
            self.why_not = onnx_missing()
            if not self.why_not:
                self.cache = ensure_ort(cache)
        except Exception as e:  # noqa: BLE001  (the rows say why)
            self.why_not = str(e)

    def _files(self, shape, dtype):
        import numpy as np
        B, L, E, H, causal = shape
        model = os.path.join(self.workdir, f"mha_E{E}_H{H}_c{int(causal)}_{dtype}.onnx")
        if not os.path.exists(model):
            build_ort_forward(model, E, H, causal, dtype)
        x = os.path.join(self.workdir, f"x_B{B}_L{L}_E{E}_{dtype}.bin")
        if not os.path.exists(x):
            np_dtype = np.float16 if dtype == "f16" else np.float32
            np.random.default_rng(1).standard_normal((B, L, E), dtype=np.float32).astype(np_dtype).tofile(x)
        return model, x

    def ms(self, shape, dtype, repeat, warmup):
        if self.why_not:
            raise RuntimeError(self.why_not)
        B, L, E, H, causal = shape
        model, x = self._files(shape, dtype)
        key = (E, H, causal, dtype)
        optimized = ""
        if key not in self.compute:
            optimized = model + ".optimized.onnx"
        out = run_node(ORT_FORWARD_CODE, [model, x, dtype, B, L, E, self.threads, repeat, warmup, optimized],
                       self.cache, self.workdir, "ort_forward.js")
        if optimized:
            self.compute[key] = compute_types(optimized)
        return field(out, "median_ms")


def compute_types(optimized_path):
    """{op type: sorted element types its inputs have} over the compute nodes
    (MatMul, MultiHeadAttention, ...) of ORT's optimised graph, e.g.
    {'MatMul': ['float32'], 'MultiHeadAttention': ['float32']} for an fp16
    model that ORT casts to float32 around every node."""
    import onnx
    from onnx import shape_inference
    model = onnx.load(optimized_path)
    try:
        inferred = shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (a contrib op onnx cannot infer: use what is known)
        inferred = model.graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    names = {ONNX_FLOAT: "float32", ONNX_FLOAT16: "float16"}
    found = {}
    for node in model.graph.node:
        if node.op_type in ("Cast", "Reshape", "Transpose", "Add", "Identity"):
            continue
        for name in node.input:
            if types.get(name) in names:
                found.setdefault(node.op_type, set()).add(names[types[name]])
    return {op: sorted(ts) for op, ts in found.items()}


def ort_fp16_note(compute):
    """One line on what ORT's fp16 models computed in, from compute_types of each."""
    f32_ops = sorted({op for c in compute.values() for op, ts in c.items() if ts == ["float32"]})
    f16_ops = sorted({op for c in compute.values() for op, ts in c.items() if "float16" in ts})
    if not compute:
        return ""
    if f32_ops and not f16_ops:
        return ("ORT fp16: the CPU provider has no fp16 kernel for " + ", ".join(f32_ops) + ": ORT inserted Casts "
                "and computed them in float32 (the fp16 model runs, but not in fp16)")
    if f32_ops:
        return ("ORT fp16: fp16 kernels for " + ", ".join(f16_ops) + "; Casts to float32 around " +
                ", ".join(f32_ops))
    return "ORT fp16: every compute node ran in fp16 (" + ", ".join(f16_ops) + ")"


# ---- the training step ------------------------------------------------------------------
# A tiny step in a 16-bit dtype: prints ok, or the reason it cannot run.
NARROW_TRAIN_PROBE = r"""
import sys
import numpy as np
import multihead
dtype = sys.argv[1]
try:
    mha = multihead.MultiheadAttention(8, 2, dtype=dtype)
    mha.train()
    x = np.random.default_rng(0).standard_normal((4, 1, 8), dtype=np.float32)
    out, _, ctx = mha.forward_with_context(x, x, x, need_weights=False, kernel="flash")
    g = mha.backward(ctx, x)
except Exception as e:
    print("unavailable=" + (type(e).__name__ + ": " + str(e)).splitlines()[0])
else:
    print("ok=1")
"""


def narrow_train_child(dtype):
    """bench_train_vs_pytorch.OURS_CHILD with the module in `dtype` ("bfloat16" / "float16")."""
    old = "mha = multihead.MultiheadAttention(E, H, dtype=np.float32)"
    if old not in train_bench.OURS_CHILD:
        raise RuntimeError("bench_train_vs_pytorch.OURS_CHILD no longer builds the module as expected")
    return train_bench.OURS_CHILD.replace(old, f"mha = multihead.MultiheadAttention(E, H, dtype={dtype!r})")


def narrow_train_available(build_dir, dtype):
    """None if this build's Python module runs a training step in dtype, else why not."""
    env = {"PYTHONPATH": os.path.join(os.path.abspath(build_dir), "python")}
    try:
        out, _, _ = run_child(["/usr/bin/python3", "-c", NARROW_TRAIN_PROBE, dtype], env)
    except RuntimeError as e:
        return str(e).splitlines()[-1]
    return None if "ok=1" in out else out.split("unavailable=", 1)[-1].strip()


# ---- the tables ---------------------------------------------------------------------------
def cell(results):
    """(median ms, text) of one program's rounds; (None, why) if none ran."""
    ok = [r for r in results if not isinstance(r, Exception)]
    if not ok:
        return None, "failed: " + str(results[0]).splitlines()[0][:120]
    m = statistics.median(ok)
    return m, "%.2f" % m


def speedup(num, den):
    return "%.2f×" % (num / den) if num and den else "–"


def shape_name(shape):
    B, L, E, H, causal = shape
    return ("causal " if causal else "") + "(%d,%d,%d,%d)" % (B, L, E, H)


def forward_part(args, cli, peaks, ort):
    shapes = QUICK_SHAPES if args.quick else forward_bench.ISSUE_SHAPES
    programs = ["ours f32", "ours bf16", "ours f16", "PyTorch bf16", "ORT fp32", "ORT fp16"]
    programs = [p for p in programs if p not in args.skip]
    print("\n### Forward (ms, median of %d rounds; ratios are speed-ups)\n" % args.rounds)
    print("| shape (B,L,E,H) | " + " | ".join(programs) +
          " | bf16 / f32 | f16 / f32 | ORT best / ours f16 | ORT best / ours bf16 | PyTorch bf16 / ours bf16 "
          "| ours f32 % of FMA peak |")
    print("|---" * (len(programs) + 7) + "|")
    rows, rounds_lines = [], []
    for shape in shapes:
        repeat, warmup = (args.repeat, args.warmup) if args.quick else forward_bench.calls_for(shape, args.repeat,
                                                                                                args.warmup)

        def measure(name, shape=shape, repeat=repeat, warmup=warmup):
            if name.startswith("ours "):
                return forward_bench.ours(cli, shape, args.threads, repeat, warmup, name[5:])[0]
            if name == "PyTorch bf16":
                return torch_bf16_ms(shape, args.threads, repeat, warmup)
            return ort.ms(shape, name[4:].replace("fp", "f"), repeat, warmup)

        results = alternated(programs, args.rounds, measure)
        ms = {}
        texts = []
        for p in programs:
            ms[p], text = cell(results[p])
            texts.append(text)
        ort_best = min([ms[p] for p in ("ORT fp32", "ORT fp16") if ms.get(p)], default=None)
        B, L, E, H, causal = shape
        f32 = ms.get("ours f32")
        pct = "%.0f%%" % (100 * forward_bench.flops(B, L, E) / (f32 * 1e6) / peaks["fma"]) if f32 else "–"
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            shape_name(shape), " | ".join(texts), speedup(f32, ms.get("ours bf16")), speedup(f32, ms.get("ours f16")),
            speedup(ort_best, ms.get("ours f16")), speedup(ort_best, ms.get("ours bf16")),
            speedup(ms.get("PyTorch bf16"), ms.get("ours bf16")), pct), flush=True)
        rows.append((shape, ms, ort_best))
        rounds_lines.append("| %s | %s |" % (shape_name(shape), " | ".join(
            " ".join("%.2f" % r if not isinstance(r, Exception) else "x" for r in results[p]) for p in programs)))
    print("\nEach round's ms (x: failed):\n")
    print("| shape | " + " | ".join(programs) + " |")
    print("|---" * (len(programs) + 1) + "|")
    print("\n".join(rounds_lines))
    note = ort_fp16_note({k: v for k, v in ort.compute.items() if k[3] == "f16"})
    if note:
        print("\n" + note + ".")
    return rows


def forward_targets(rows, peaks):
    print("\nForward against issue 19's targets:")
    fp16 = peaks.get("fp16")
    lines = []
    long_rows = [(s, ms) for s, ms, _ in rows if s[1] >= 1024]
    x = [ms["ours f32"] / ms["ours f16"] for s, ms in long_rows if ms.get("ours f32") and ms.get("ours f16")]
    if not fp16:
        lines.append("f16 >= 1.6x our f32 at L >= 1024 (on a CPU with AVX512_FP16): n/a, this CPU has no "
                     "AVX512_FP16 (f16 ran on the widening path); measured %s" %
                     ("%.2f..%.2f×" % (min(x), max(x)) if x else "–"))
    else:
        lines.append("f16 >= 1.6x our f32 at L >= 1024: %s (%s)" % (
            "%.2f..%.2f×" % (min(x), max(x)) if x else "–", "met" if x and min(x) >= 1.6 else "missed"))
    y = [ort_best / ms["ours f16"] for _, ms, ort_best in rows if ort_best and ms.get("ours f16")]
    lines.append("f16 >= 1.4x ONNX Runtime's best at every shape: %s (%s)" % (
        "%.2f..%.2f×" % (min(y), max(y)) if y else "–", "met" if y and min(y) >= 1.4 and len(y) == len(rows)
        else "missed"))
    z = [ms["ours f32"] / ms["ours bf16"] for _, ms, _ in rows if ms.get("ours f32") and ms.get("ours bf16")]
    lines.append("bf16 never slower than our f32: %s (%s)" % (
        "%.2f..%.2f×" % (min(z), max(z)) if z else "–", "met" if z and min(z) >= 1.0 else "missed"))
    bf16_rate = peaks["bf16"] / peaks["fma"] if peaks.get("bf16") else None
    if bf16_rate is None:
        lines.append("bf16 >= 1.6x f32 where vdpbf16ps >= 1.8x the FMA rate: n/a (no AVX512_BF16)")
    elif bf16_rate < 1.8:
        lines.append("bf16 >= 1.6x f32 where vdpbf16ps >= 1.8x the FMA rate: does not apply here "
                     "(vdpbf16ps %.2fx the FMA rate)" % bf16_rate)
    else:
        lines.append("bf16 >= 1.6x f32 (vdpbf16ps %.2fx the FMA rate here): %s (%s)" % (
            bf16_rate, "%.2f..%.2f×" % (min(z), max(z)) if z else "–", "met" if z and min(z) >= 1.6 else "missed"))
    for line in lines:
        print("- " + line)


def train_part(args, peaks):
    shapes = QUICK_TRAIN_SHAPES if args.quick else train_bench.SHAPES
    pythonpath = os.path.join(os.path.abspath(args.build_dir), "python")
    if not os.path.exists(os.path.join(pythonpath, "multihead")):
        print("\n### Training step: not available in this build (no %s/multihead; configure with "
              "-DMULTIHEAD_BUILD_PYTHON=ON)" % pythonpath)
        return
    narrow = {}
    for label, dtype in (("ours bf16", "bfloat16"), ("ours f16", "float16")):
        why = narrow_train_available(args.build_dir, dtype)
        narrow[label] = (dtype, why)
    programs = ["ours f32"] + [p for p, (_, why) in narrow.items() if why is None] + ["PyTorch f32"]
    programs = [p for p in programs if p not in args.skip]
    print("\n### Training step (forward + backward, every gradient; ms, median of %d rounds)\n" % args.rounds)
    for label, (dtype, why) in narrow.items():
        if why is not None:
            print("%s (dtype=%r): not available in this build (%s)" % (label, dtype, why))
    print()
    print("| shape (B,L,E,H) | " + " | ".join(programs) +
          " | PyTorch f32 / ours f32 | 16-bit best / ours f32 | ours f32 % of FMA peak |")
    print("|---" * (len(programs) + 4) + "|")
    env = {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": str(args.threads)}
    rows = []
    for shape in shapes:
        B, L, E, H, causal = shape
        # About 1 s of steps (estimated at 100 GFLOP/s), as compare_builds.py does.
        n = args.repeat if args.quick else max(args.repeat, min(200, int(100e9 / train_bench.step_flops(B, L, E))))
        argv = [str(v) for v in (B, L, E, H, int(causal), args.threads, n, max(args.warmup, n // 5))]

        def measure(name):
            if name == "PyTorch f32":
                out, _, _ = run_child(["/usr/bin/python3", "-c", train_bench.TORCH_CHILD] + argv,
                                      dict(TUNED_ENV, OMP_NUM_THREADS=str(args.threads)), TUNED_UNSET)
            else:
                code = train_bench.OURS_CHILD if name == "ours f32" else narrow_train_child(narrow[name][0])
                out, _, _ = run_child(["/usr/bin/python3", "-c", code] + argv, env)
            return field(out, "median_ms")

        results = alternated(programs, args.rounds, measure)
        ms = {p: cell(results[p])[0] for p in programs}
        f32 = ms.get("ours f32")
        best16 = min([ms[p] for p in ("ours bf16", "ours f16") if ms.get(p)], default=None)
        pct = "%.0f%%" % (100 * train_bench.step_flops(B, L, E) / (f32 * 1e6) / peaks["fma"]) if f32 else "–"
        print("| %s | %s | %s | %s | %s |" % (shape_name(shape), " | ".join(cell(results[p])[1] for p in programs),
                                             speedup(ms.get("PyTorch f32"), f32), speedup(f32, best16), pct),
              flush=True)
        rows.append((shape, f32, best16))
    print("\nTraining step against issue 19's targets:")
    x = [f32 / b for _, f32, b in rows if f32 and b]
    print("- the 16-bit step (the faster of bf16 and f16) >= 1.4x our f32 step: " +
          ("%.2f..%.2f× (%s)" % (min(x), max(x), "met" if min(x) >= 1.4 else "missed") if x
           else "not available in this build"))
    eff = [train_bench.step_flops(s[0], s[1], s[2]) / (f32 * 1e6) / peaks["fma"] for s, f32, _ in rows
           if f32 and s[1] >= 1024]
    print("- the f32 step >= 70%% of the FMA peak at L >= 1024: %s" % (
        "%.0f..%.0f%% (%s)" % (100 * min(eff), 100 * max(eff), "met" if min(eff) >= 0.7 else "missed") if eff
        else "–"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of alternated programs (the median is shown)")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls per program per round, at least")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--train", action="store_true", help="also the training step")
    ap.add_argument("--no-forward", action="store_true", help="skip the forward tables")
    ap.add_argument("--skip", nargs="*", default=[], help="programs to leave out, e.g. 'ORT fp16' 'PyTorch bf16'")
    ap.add_argument("--ort-cache", default=os.path.expanduser("~/.cache/multihead-bench-ort"))
    ap.add_argument("--quick", action="store_true", help="small shapes, one round: a smoke run of this script")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.repeat, args.warmup = 1, 2, 1

    cli = os.path.join(args.build_dir, "tools", "multihead")
    probe = os.path.join(args.build_dir, "bench", "multihead_fma_peak")
    for path in (cli, probe):
        if not os.access(path, os.X_OK):
            sys.exit("missing %s (configure with -DMULTIHEAD_BUILD_BENCHMARKS=ON and build)" % path)
    fields, lines = machine_probe(probe, args.threads, ["--buffer-mib", "64"])
    peaks = {"fma": fields["fma_peak_gflops"], "bf16": fields.get("bf16_dot_peak_gflops"),
             "fp16": fields.get("fp16_fma_peak_gflops")}
    print("Machine (bench/fma_peak.cpp, this run, %d threads):" % args.threads)
    print("- fp32 FMA peak %.0f GFLOP/s (%s)" % (peaks["fma"], fields.get("target")))
    for key, name in (("bf16", "vdpbf16ps (AVX512_BF16)"), ("fp16", "fp16 FMA (AVX512_FP16 vfmadd231ph)")):
        if peaks[key]:
            print("- %s peak %.0f GFLOP/s, %.2fx the fp32 FMA peak" % (name, peaks[key], peaks[key] / peaks["fma"]))
        else:
            print("- %s: not available on this CPU" % name)
    print("Each program in its own process; %d rounds, the programs alternated in a rotating order; each round "
          "the median of at least %d calls after %d warm-up (short calls to about 1 s)%s."
          % (args.rounds, args.repeat, args.warmup, "; QUICK SMOKE RUN, not a measurement" if args.quick else ""))
    if not args.no_forward:
        ort = Ort(args.ort_cache, tempfile.mkdtemp(prefix="bench_precision_"), args.threads)
        if ort.why_not:
            print("ONNX Runtime: not run (%s)" % ort.why_not)
        rows = forward_part(args, cli, peaks, ort)
        forward_targets(rows, peaks)
    if args.train:
        train_part(args, peaks)


if __name__ == "__main__":
    main()
