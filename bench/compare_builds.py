#!/usr/bin/python3
"""Two builds of ours side by side: is a change free of cost?

For a refactor (say, the commit before it against the commit after), in one
run and on one machine, every measurement in its own subprocess:
  * forward: `multihead bench` (need_weights=False, the default kernel) at
    bench_vs_pytorch.py's shapes;
  * training step: forward_with_context + backward through each build's
    Python module, at bench_train_vs_pytorch.py's shapes (its child script);
  * decoding: `multihead decode` (bench_decode.py's E = 4096, H = 32 setting,
    after a context of --context tokens) at 32, 8 and 1 K/V heads;
  * the FMA peak (bench/fma_peak.cpp, from whichever build has it) at the start and
    at the end, so the report shows the ceiling of this run.
The host is shared and noisy, so the builds alternate round by round
(bench_common.alternated: before then after in even rounds, after then
before in odd ones, so that neither always runs on a warmer or a busier
machine) and each row reports the median
of --rounds rounds, each round itself a median of --repeat calls (at least;
short calls are repeated to about 1 s, as bench_vs_pytorch.py does; a
decoding round is the median of 32 steps). The ratio is
before / after: above 1 the change is faster.

Usage:
  /usr/bin/python3 bench/compare_builds.py --before OLD_BUILD_DIR --after NEW_BUILD_DIR
      [--threads 2] [--rounds 5] [--repeat 5] [--quick] [--only forward,train,decode]
Both build directories need the command-line program and the Python module;
one of them -DMULTIHEAD_BUILD_BENCHMARKS=ON for the FMA probe.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import alternated, field, run_child  # noqa: E402
import bench_decode  # noqa: E402
import bench_train_vs_pytorch as train_bench  # noqa: E402
import bench_vs_pytorch as forward_bench  # noqa: E402

DECODE_SETTING = (4096, 32, (32, 8, 1))  # E, H, K/V heads


def fma_peak(build_dirs, threads):
    """The machine's FMA peak, from the first build that has the probe."""
    for build_dir in build_dirs:
        peak, _target = train_bench.fma_peak(build_dir, threads)
        if peak is not None:
            return peak
    return None


def forward_ms(build_dir, shape, threads, repeat):
    cli = os.path.join(build_dir, "tools", "multihead")
    n, warmup = forward_bench.calls_for(shape, repeat, 2)  # short calls: about 1 s of them
    return forward_bench.ours(cli, shape, threads, n, warmup)[0]


def train_ms(build_dir, shape, threads, repeat):
    B, L, E, H, causal = shape
    env = {"PYTHONPATH": os.path.join(build_dir, "python"), "OMP_NUM_THREADS": str(threads)}
    # Short steps: about 1 s of them (estimated at 100 GFLOP/s), as for the forward.
    n = max(repeat, min(200, int(100e9 / train_bench.step_flops(B, L, E))))
    out, _, _ = run_child([sys.executable, "-c", train_bench.OURS_CHILD, str(B), str(L), str(E), str(H),
                           str(int(causal)), str(threads), str(n), str(max(2, n // 5))], env_set=env)
    return field(out, "median_ms")


def decode_ms(build_dir, setting, threads, repeat, context):
    E, H, Hkv = setting
    cli = os.path.join(build_dir, "tools", "multihead")
    return bench_decode.run_ours(cli, E, H, Hkv, context, 32, 4, threads)[0]  # bench_decode.py's steps


def label(kind, shape):
    if kind == "decode":
        E, H, Hkv = shape
        return f"decode E={E} H={H} kv={Hkv}"
    B, L, E, H, causal = shape
    return f"{kind} ({B},{L},{E},{H}){' causal' if causal else ''}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="build directory of the earlier commit")
    ap.add_argument("--after", required=True, help="build directory of the later commit")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5, help="calls per measurement (its median)")
    ap.add_argument("--context", type=int, default=4096, help="decode: tokens already in the cache")
    ap.add_argument("--only", default="forward,train,decode")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test of the script")
    args = ap.parse_args()
    kinds = args.only.split(",")
    rows = []
    if "forward" in kinds:
        shapes = forward_bench.QUICK_SHAPES if args.quick else forward_bench.ISSUE_SHAPES
        rows += [("forward", s, forward_ms) for s in shapes]
    if "train" in kinds:
        shapes = train_bench.QUICK_SHAPES if args.quick else train_bench.SHAPES
        rows += [("train", s, train_ms) for s in shapes]
    if "decode" in kinds:
        E, H, kvs = (256, 8, (8, 1)) if args.quick else DECODE_SETTING
        context = 64 if args.quick else args.context
        rows += [("decode", (E, H, kv), lambda b, s, t, r, c=context: decode_ms(b, s, t, r, c)) for kv in kvs]

    peaks = [fma_peak((args.after, args.before), args.threads)]
    print(f"threads {args.threads}, {args.rounds} rounds alternated, each the median of {args.repeat} calls")
    print()
    print("| measurement | before ms | after ms | before / after | after min..max of rounds |")
    print("|---|---:|---:|---:|---|")
    for kind, shape, measure in rows:
        times = alternated(["before", "after"], args.rounds,
                           lambda side: measure(args.before if side == "before" else args.after, shape,
                                                args.threads, args.repeat))
        for side_times in times.values():
            for t in side_times:
                if isinstance(t, Exception):
                    raise t
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"| {label(kind, shape)} | {b:.3f} | {a:.3f} | {b / a:.3f} | "
              f"{min(times['after']):.3f}..{max(times['after']):.3f} |", flush=True)
    peaks.append(fma_peak((args.after, args.before), args.threads))
    if all(p is not None for p in peaks):
        print(f"\nFMA peak at the start and the end of the run: {peaks[0]:.0f} and {peaks[1]:.0f} GFLOP/s "
              f"({args.threads} threads)")


if __name__ == "__main__":
    main()
