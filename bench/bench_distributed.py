#!/usr/bin/python3
"""The distributed modes, measured and modelled (issue 18's benchmark).

One run: P = 1, 2 and 4 on this machine, one thread per rank, for head, ring
and Ulysses parallel at (B, L, E, H) = (1, 4096, 1024, 16) and
(1, 16384, 1024, 16), causal, via `mpirun -np P multihead bench --parallel MODE`.
It prints
  - per forward and per forward + backward: compute and communication time
    (the median over ranks of each rank's median), bytes sent per rank,
    measured, beside the formula:
      head:    the all-reduce of B·L·E values: 2·(P − 1)/P·B·L·E values
               (reduce-scatter + all-gather); the backward three more
               (d query, d key, d value of self-attention)
      ring:    (P − 1)/P of the K/V, 2·B·S·E values; the backward the same
               again for K/V, P sends of a block's dK/dV accumulator, and
               the all-reduce of the parameter gradients
      Ulysses: four all-to-alls (q, k, v in; out back) of (P − 1)/P of the
               rank's B·(L/P)·E values each; the backward four more and the
               parameter gradients' all-reduce
    (a forward + backward row counts its forward too)
  - a model for P = 8 … 64 on a stated network (--bandwidth GB/s, --latency µs
    per message) from the measured compute at P = 1 (compute / P per rank) and
    the formula bytes; for the ring, whether a block's transfer hides behind
    its compute (block compute = compute / P², block transfer = latency +
    2·B·(S/P)·E·4 bytes / bandwidth);
  - the longest context ring attention could hold at P ranks of 24 GiB each,
    from the measured peak memory per token per rank (two lengths, the slope
    of peak RSS).

--quick (or --smoke) runs a tiny shape (seconds) to check the script;
numbers are then meaningless. The machine must be quiet for real numbers:
the full run takes over an hour on 2 cores (measured 2026-12-02 on an AMD
EPYC host: the L = 4096 shape alone, 5 timed passes, 13 minutes; L = 16384
is about ten times the work). --lengths, --ranks and --repeat run a part of
it (P = 4 oversubscribes 2 cores: its times are no speed-up there, its
bytes are still exact).

Usage: bench_distributed.py --multihead BUILD/tools/multihead [--mpirun mpirun]
       [--bandwidth 25] [--latency 5] [--lengths 4096,16384] [--ranks 1,2,4]
       [--repeat 5] [--quick]
As root, with no ssh: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI_MCA_plm=isolated in the environment.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"parallel=(\w+) pass=(\S+) rank=(\d+) ranks=(\d+) compute_ms=([\d.]+) comm_ms=([\d.]+) "
                  r"bytes_sent=(\d+)")


def run_bench(a, mode, P, B, L, E, H, repeat, warmup):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = [a.mpirun, "--oversubscribe", "-q", "-np", str(P), "/usr/bin/time", "-f", "maxrss_kb=%M", a.multihead,
            "bench", "--parallel", mode, "--batch", str(B), "--seq-len", str(L), "--embed-dim", str(E),
            "--num-heads", str(H), "--causal", "--threads", "1", "--repeat", str(repeat), "--warmup", str(warmup)]
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    passes = {}
    for m in LINE.finditer(r.stdout):
        passes.setdefault(m.group(2), []).append(
            (float(m.group(5)), float(m.group(6)), int(m.group(7))))
    rss = [int(x) for x in re.findall(r"maxrss_kb=(\d+)", r.stderr)]
    out = {}
    for name, ranks in passes.items():
        out[name] = (statistics.median(c for c, _, _ in ranks), statistics.median(m for _, m, _ in ranks),
                     max(b for _, _, b in ranks))
    return out, max(rss) * 1024 if rss else None


def formula_bytes(mode, P, B, L, E, backward):
    """Bytes one rank sends in a forward (or a forward + backward), float32,
    self-attention (the backward's three input gradients: query, key, value)."""
    n = B * L * E
    params = 4 * E * E + 4 * E  # in_proj (3E, E) + (3E), out_proj (E, E) + (E)
    if P == 1:
        return 0
    if mode == "heads":
        f = 2 * (P - 1) / P * n
        return 4 * (f + 3 * f if backward else f)
    grads = 2 * (P - 1) / P * params  # sequence modes: the parameter gradients, all-reduced
    if mode == "ring":
        f = (P - 1) / P * 2 * n
        return 4 * (f + f + P * 2 * n / P + grads if backward else f)  # K/V again, then P sends of dK/dV
    f = 4 * (P - 1) / P * n / P
    return 4 * (f + f + grads if backward else f)


def model(mode, P, c1_ms, B, L, E, bw, lat_us):
    """(time per forward ms, ring: hidden?) at P ranks from the P = 1 compute."""
    bw_bytes_per_ms = bw * 1e9 / 1e3
    lat = lat_us / 1e3
    compute = c1_ms / P
    if mode == "heads":
        comm = 2 * (P - 1) * lat + formula_bytes(mode, P, B, L, E, False) / bw_bytes_per_ms
        return compute + comm, None
    if mode == "ring":
        block_compute = c1_ms / (P * P)
        block_transfer = lat + 4 * 2 * B * (L / P) * E / bw_bytes_per_ms
        exposed = max(0.0, block_transfer - block_compute) * (P - 1)
        return compute + exposed, block_compute >= block_transfer
    comm = 4 * (P - 1) * lat + formula_bytes(mode, P, B, L, E, False) / bw_bytes_per_ms
    return compute + comm, None


def positive_list(ap, flag, text):
    """A flag's comma-separated positive integers, or the parser's one-line error naming it."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        ap.error(f"{flag}: expected comma-separated positive integers, got '{text}'")
    if any(x < 1 for x in values):
        ap.error(f"{flag}: expected comma-separated positive integers, got '{text}'")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--bandwidth", type=float, default=25.0, help="GB/s per link, for the model")
    ap.add_argument("--latency", type=float, default=5.0, help="µs per message, for the model")
    ap.add_argument("--smoke", "--quick", action="store_true", dest="smoke",
                    help="tiny shapes (seconds): checks the script, not the machine")
    ap.add_argument("--lengths", help="comma-separated L = S to run (default 4096,16384; the memory per token "
                    "needs two); the full run takes over an hour on 2 cores")
    ap.add_argument("--ranks", help="comma-separated P to run (default 1,2,4)")
    ap.add_argument("--repeat", type=int, help="timed passes per configuration (default 5; the median is shown)")
    a = ap.parse_args()
    if a.smoke:
        shapes, ranks, repeat, warmup = [(1, 256, 64, 4), (1, 512, 64, 4)], [1, 2], 2, 1
    else:
        shapes, ranks, repeat, warmup = [(1, 4096, 1024, 16), (1, 16384, 1024, 16)], [1, 2, 4], 5, 1
    if a.lengths:
        B, _, E, H = shapes[0]
        shapes = [(B, x, E, H) for x in positive_list(ap, "--lengths", a.lengths)]
    if a.ranks:
        ranks = positive_list(ap, "--ranks", a.ranks)
    if a.repeat is not None:
        if a.repeat < 1:
            ap.error(f"--repeat: expected a positive integer, got {a.repeat}")
        repeat = a.repeat
    print(f"# bench_distributed: one thread per rank, causal; model network {a.bandwidth:g} GB/s, "
          f"{a.latency:g} µs per message")
    print("| shape (B,L,E,H) | mode | P | pass | compute ms | comm ms | bytes/rank measured | formula |")
    print("|---|---|---|---|---|---|---|---|")
    c1 = {}
    rss = {}
    for B, L, E, H in shapes:
        for mode in ("heads", "ring", "ulysses"):
            for P in ranks:
                if mode == "ulysses" and H % P:
                    continue
                passes, peak = run_bench(a, mode, P, B, L, E, H, repeat, warmup)
                rss[(mode, P, L)] = peak
                for name in ("forward", "forward+backward"):
                    c, m, b = passes[name]
                    if P == 1:
                        c1[(mode, L, name)] = c
                    f = formula_bytes(mode, P, B, L, E, name != "forward")
                    print(f"| ({B},{L},{E},{H}) | {mode} | {P} | {name} | {c:.2f} | {m:.2f} | {b} | {f:.0f} |")
    print()
    print(f"## Model for P = 8 … 64 ({a.bandwidth:g} GB/s, {a.latency:g} µs), forward, from the P = 1 compute")
    print("| shape | mode | P | modelled ms | ring block compute >= transfer |")
    print("|---|---|---|---|---|")
    for B, L, E, H in shapes:
        for mode in ("heads", "ring", "ulysses"):
            base = c1.get((mode, L, "forward"))
            if base is None:
                continue
            for P in (8, 16, 32, 64):
                if mode == "heads" and P > H:
                    print(f"| ({B},{L},{E},{H}) | heads | {P} | more ranks than heads | |")
                    continue
                if mode == "ulysses" and H % P:
                    print(f"| ({B},{L},{E},{H}) | ulysses | {P} | P does not divide H | |")
                    continue
                t, hidden = model(mode, P, base, B, L, E, a.bandwidth, a.latency)
                print(f"| ({B},{L},{E},{H}) | {mode} | {P} | {t:.2f} | {'' if hidden is None else hidden} |")
    print()
    # Ring memory per token per rank: the slope of peak RSS between the two lengths at the largest P.
    P = max(ranks)
    lengths = sorted({L for _, L, _, _ in shapes})
    if len(lengths) >= 2 and rss.get(("ring", P, lengths[0])) and rss.get(("ring", P, lengths[-1])):
        slope = (rss[("ring", P, lengths[-1])] - rss[("ring", P, lengths[0])]) / ((lengths[-1] - lengths[0]) / P)
        # `multihead bench` gives every rank the whole input x (B·L·E float32) to cut its rows from: 4·E·P
        # bytes per local token that a real ring run (each rank reading only its rows) does not hold.
        E = shapes[0][2]
        per_token = slope - 4 * E * P
        print(f"ring at P = {P}: {per_token:.0f} bytes of peak memory per token per rank (forward + backward; "
              f"measured slope {slope:.0f} minus the bench's whole-input copy, {4 * E * P} bytes)")
        for Pm in (1, 2, 4, 8, 16, 32, 64):
            print(f"  P = {Pm}: longest context at 24 GiB per rank ≈ {int(Pm * 24 * 2**30 / per_token):,} tokens")
    else:
        print("ring memory per token: needs two lengths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
