#!/usr/bin/python3
"""Side by side: multihead vs PyTorch 1.13 nn.MultiheadAttention, one run.

In one run, on the same shapes, every measurement in its own subprocess:
  * the machine's ceilings: FMA peak (bench/fma_peak.cpp) and OpenBLAS sgemm
    throughput (numpy matmul, with OPENBLAS_CORETYPE unset in that
    subprocess only);
  * ours: `multihead bench --batch B --seq-len L --embed-dim E --num-heads H
    [--causal] --threads T`, which warms up and prints the median;
  * PyTorch 1.13 nn.MultiheadAttention, eval, need_weights=False, as shipped
    (this environment untouched) and tuned (the best setup we found: OPENBLAS_CORETYPE
    and OPENBLAS_L2_SIZE unset, GLIBC_TUNABLES=glibc.malloc.mmap_max=0:
    glibc.malloc.trim_threshold=68719476736, OMP_WAIT_POLICY=PASSIVE,
    ATEN_CPU_CAPABILITY=avx512), warm-up then the median of the timed calls;
    causal through a boolean upper-triangular attn_mask (1.13's MHA has no
    is_causal);
  * every program gets the same number of calls for a shape: --repeat timed
    after --warmup, raised for short calls to about 1 s of timed calls
    (calls_for);
  * the peak RSS of each subprocess (os.wait4).
Inputs are (L, B, E) float32 standard-normal in both programs (seeded), so
both compute the same-sized problem; the timings do not depend on the values.
FLOPs counted as the README does: projections 8·B·L·E², attention 4·B·L·L·E
(the full square, also when causal).

Prints one Markdown table (times, ratios, our GFLOP/s and % of the FMA peak,
peak RSS), then the memory-only rows for our largest shapes.

With --before-build-dir OLD, a second build of ours (say, the commit before
a change) is timed in the same run, shape by shape next to the first, and
two more columns give its time and before / after.

Usage:
  /usr/bin/python3 bench/bench_vs_pytorch.py --build-dir build [--threads 2]
      [--repeat 5] [--shapes quick|issue] [--skip-shipped-above L]
      [--before-build-dir OLD]
The build directory must have been configured with
-DMULTIHEAD_BUILD_BENCHMARKS=ON (for the FMA probe).
"""
import argparse
import os
import re
import sys

from bench_common import TUNED_ENV, TUNED_UNSET, field, run_child

# (B, L, E, H, causal): short and long sequences, two widths, and causal.
ISSUE_SHAPES = [
    (1, 128, 512, 8, False),
    (8, 128, 512, 8, False),
    (4, 512, 768, 12, False),
    (1, 1024, 768, 12, False),
    (1, 2048, 768, 12, False),
    (1, 4096, 1024, 16, False),
    (1, 8192, 1024, 16, False),
    (1, 2048, 768, 12, True),
    (1, 4096, 1024, 16, True),
]
QUICK_SHAPES = [
    (1, 128, 512, 8, False),
    (1, 1024, 768, 12, False),
    (1, 2048, 768, 12, False),
    (1, 2048, 768, 12, True),
]
# Ours alone: memory.
MEMORY_SHAPES = [
    (1, 32768, 1024, 16, False),
    (1, 65536, 1024, 16, True),
]


# argv: B L E H causal threads repeat warmup [dtype]; dtype float32 (the
# default) or bfloat16 (bench_precision.py: the module and input cast with
# .to(torch.bfloat16)).
TORCH_CHILD = r"""
import sys, time, statistics, torch
B, L, E, H, causal, threads, repeat, warmup = (int(a) for a in sys.argv[1:9])
dtype = getattr(torch, sys.argv[9]) if len(sys.argv) > 9 else torch.float32
torch.set_num_threads(threads)
torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(E, H).to(dtype).eval()
x = torch.randn(L, B, E).to(dtype)
mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
times = []
with torch.no_grad():
    for i in range(warmup + repeat):
        t0 = time.perf_counter()
        out, _ = mha(x, x, x, need_weights=False, attn_mask=mask)
        t1 = time.perf_counter()
        if i >= warmup:
            times.append((t1 - t0) * 1e3)
assert out.dtype == dtype
print("median_ms=%.4f min_ms=%.4f torch=%s" % (statistics.median(times), min(times), torch.__version__))
"""

SGEMM_CHILD = r"""
import sys, time, numpy as np
n, repeat = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
a @ b
best = 1e9
for _ in range(repeat):
    t0 = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t0)
print("sgemm_gflops=%.1f" % (2.0 * n ** 3 / best * 1e-9))
"""




def flops(B, L, E):
    return 8.0 * B * L * E * E + 4.0 * B * L * L * E


def ours(cli, shape, threads, repeat, warmup, dtype="f32"):
    """(median ms, peak RSS MiB, first output line) of `multihead bench`; dtype
    bf16 / f16 adds --dtype (a float32 run leaves it out, so that builds from
    before the flag still run)."""
    B, L, E, H, causal = shape
    cmd = [cli, "bench", "--batch", str(B), "--seq-len", str(L), "--embed-dim", str(E),
           "--num-heads", str(H), "--threads", str(threads), "--repeat", str(repeat),
           "--warmup", str(warmup)] + (["--causal"] if causal else []) + (["--dtype", dtype] if dtype != "f32" else [])
    out, rss, _ = run_child(cmd)
    return field(out, "median_ms"), rss, out.strip().splitlines()[0]


def torch_mha(shape, threads, repeat, warmup, tuned):
    B, L, E, H, causal = shape
    cmd = ["/usr/bin/python3", "-c", TORCH_CHILD] + [str(v) for v in (B, L, E, H, int(causal), threads, repeat, warmup)]
    env = {"OMP_NUM_THREADS": str(threads)}
    if tuned:
        env.update(TUNED_ENV)
        out, rss, _ = run_child(cmd, env, TUNED_UNSET)
    else:
        out, rss, _ = run_child(cmd, env)
    return field(out, "median_ms"), rss


def calls_for(shape, repeat, warmup):
    """Timed and warm-up calls for one shape, the same for every program.

    A call of a few milliseconds is at the mercy of one scheduler hiccup on a
    shared 2-core machine, and its first calls pay one-time costs (oneDNN's
    JIT, thread start, first touch of pages). So short calls are repeated
    until the timed ones add up to about 1 s (estimated at 100 GFLOP/s),
    at most 200, with a fifth as many warm-up calls; long ones use the
    command-line values."""
    B, L, E, _, _ = shape
    estimate_s = flops(B, L, E) / 100e9
    n = max(repeat, min(200, int(1.0 / estimate_s)))
    return n, max(warmup, n // 5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", required=True, help="CMake build dir (MULTIHEAD_BUILD_BENCHMARKS=ON)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="timed calls per measurement (median)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", choices=["issue", "quick"], default="issue")
    ap.add_argument("--skip-shipped-above", type=int, default=1 << 30,
                    help="skip PyTorch-as-shipped for L above this (it takes ~14 s per call at L=8192)")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory-only rows")
    ap.add_argument("--before-build-dir", help="another build of ours, timed beside --build-dir")
    args = ap.parse_args()

    cli = os.path.join(args.build_dir, "tools", "multihead")
    probe = os.path.join(args.build_dir, "bench", "multihead_fma_peak")
    before_cli = os.path.join(args.before_build_dir, "tools", "multihead") if args.before_build_dir else None
    for path in (cli, probe) + ((before_cli,) if before_cli else ()):
        if not os.access(path, os.X_OK):
            sys.exit("missing %s (build with -DMULTIHEAD_BUILD_BENCHMARKS=ON)" % path)

    # Ceilings, measured in this run.
    out, _, _ = run_child([probe, "--threads", str(args.threads)])
    peak = field(out, "fma_peak_gflops")
    target = re.search(r"target=(\S+)", out).group(1)
    out, _, _ = run_child(["/usr/bin/python3", "-c", SGEMM_CHILD, "4096", "5"],
                    {"OPENBLAS_NUM_THREADS": str(args.threads)}, ["OPENBLAS_CORETYPE"])
    sgemm = field(out, "sgemm_gflops")
    print("Machine: FMA peak %.0f GFLOP/s (%d threads, %s), OpenBLAS sgemm %.0f GFLOP/s "
          "(4096², %d threads, OPENBLAS_CORETYPE unset)." % (peak, args.threads, target, sgemm, args.threads))
    print("Medians of at least %d calls after at least %d warm-up (more for short calls: see "
          "calls_for), each program in its own process, %d threads.\n"
          % (args.repeat, args.warmup, args.threads))

    shapes = ISSUE_SHAPES if args.shapes == "issue" else QUICK_SHAPES
    before_head = " ours before | before / ours |" if before_cli else ""
    print("| shape (B,L,E,H) | ours | tuned PyTorch | PyTorch as shipped | tuned / ours | shipped / ours "
          "| ours GFLOP/s | % of FMA peak | peak RSS ours / tuned / shipped (MiB) |" + before_head)
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if before_cli else ""))
    for shape in shapes:
        B, L, E, H, causal = shape
        name = ("causal " if causal else "") + "(%d,%d,%d,%d)" % (B, L, E, H)
        repeat, warmup = calls_for(shape, args.repeat, args.warmup)
        our_ms, our_rss, _ = ours(cli, shape, args.threads, repeat, warmup)
        tuned_ms, tuned_rss = torch_mha(shape, args.threads, repeat, warmup, tuned=True)
        if L <= args.skip_shipped_above:
            shipped_ms, shipped_rss = torch_mha(shape, args.threads, repeat, warmup, tuned=False)
            shipped = "%.1f ms" % shipped_ms
            shipped_ratio = "%.1f×" % (shipped_ms / our_ms)
            shipped_rss_s = "%.0f" % shipped_rss
        else:
            shipped, shipped_ratio, shipped_rss_s = "skipped", "–", "–"
        before = ""
        if before_cli:
            before_ms, _, _ = ours(before_cli, shape, args.threads, repeat, warmup)
            before = " %.2f ms | %.2f× |" % (before_ms, before_ms / our_ms)
        gflops = flops(B, L, E) / (our_ms * 1e6)
        print("| %s | %.2f ms | %.2f ms | %s | %.2f× | %s | %.0f | %.0f%% | %.0f / %.0f / %s |%s"
              % (name, our_ms, tuned_ms, shipped, tuned_ms / our_ms, shipped_ratio, gflops,
                 100 * gflops / peak, our_rss, tuned_rss, shipped_rss_s, before))
        sys.stdout.flush()

    if not args.no_memory:
        print("\nOurs alone, memory (1 timed call after 1 warm-up):\n")
        print("| shape (B,L,E,H) | ours | ours GFLOP/s | peak RSS (MiB) |")
        print("|---|---|---|---|")
        for shape in MEMORY_SHAPES:
            B, L, E, H, causal = shape
            name = ("causal " if causal else "") + "(%d,%d,%d,%d)" % (B, L, E, H)
            our_ms, our_rss, _ = ours(cli, shape, args.threads, 1, 1)
            print("| %s | %.0f ms | %.0f | %.0f |" % (name, our_ms, flops(B, L, E) / (our_ms * 1e6), our_rss))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
