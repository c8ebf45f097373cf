#!/usr/bin/python3
"""`mpirun -np P multihead forward --parallel MODE` against the one-process
command, and its fault rows. Every row prints its name and its bound; exit 1
if any failed.

Rows (P = 1 … 4, oversubscribed, one thread per rank):
  - each mode writes the file the one-process command writes: float32
    within 1e-5, float64 within 1e-12 of its largest magnitude;
  - bad input on one rank only (an MPMD launch: rank 1 gets another file):
    exit 2, one "multihead: error:" line (rank 0's), no output file;
  - P larger than the work (ranks > heads, ranks > query rows): exit 2, the
    one line naming both numbers, no file;
  - a rank killed by SIGKILL mid-run: mpirun exits non-zero within 60 s,
    no output file (Open MPI's default: a dead peer aborts the job);
  - --parallel heads reads only its slices: a rank's peak memory above the
    program's own at P = 4 is below half of that at P = 1;
  - without mpirun, --parallel runs as one rank.

Usage: cli_parallel.py --multihead BIN --mpirun MPIRUN --workdir DIR
Set OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 and
OMPI_MCA_plm=isolated in its environment (ctest does, for this test only).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import safetensors_io  # noqa: E402

failed = 0


def report(ok, name, detail=""):
    global failed
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    cli, mpirun, wd = os.path.abspath(a.multihead), a.mpirun, a.workdir
    os.makedirs(wd, exist_ok=True)
    p = lambda name: os.path.join(wd, name)
    mpi = [mpirun, "--oversubscribe", "-q"]

    def run(argv, timeout=60):
        return subprocess.run(argv, capture_output=True, timeout=timeout)

    rng = np.random.default_rng(20261202)
    E, H = 16, 4
    subprocess.run([cli, "init", "--embed-dim", str(E), "--num-heads", str(H), "--seed", "3", "--out",
                    p("w.safetensors")], check=True)
    subprocess.run([cli, "init", "--embed-dim", str(E), "--num-heads", str(H), "--kdim", "6", "--vdim", "5",
                    "--add-bias-kv", "--seed", "4", "--out", p("wkv.safetensors")], check=True)
    subprocess.run([cli, "init", "--embed-dim", str(E), "--num-heads", str(H), "--num-kv-heads", "2", "--seed", "5",
                    "--out", p("gqa.safetensors")], check=True)
    L, S, B = 9, 7, 2
    q = rng.standard_normal((L, B, E)).astype(np.float32)
    np.save(p("q.npy"), q)
    np.save(p("q64.npy"), q.astype(np.float64))
    np.save(p("k.npy"), rng.standard_normal((S, B, 6)).astype(np.float32))
    np.save(p("v.npy"), rng.standard_normal((S, B, 5)).astype(np.float32))
    np.save(p("kpm.npy"), np.arange(S)[None, :] >= np.array([[S - 1], [S - 2]]))
    np.save(p("mask.npy"), rng.random((L, L)) < 0.25)
    np.save(p("x.npy"), rng.standard_normal((B, L, E)).astype(np.float32))
    np.save(p("bad.npy"), rng.standard_normal((L, B, E + 1)).astype(np.float32))

    base = ["--weights", p("w.safetensors")]
    rows = [  # (name, flags, modes)
        ("self f32", base + ["--query", p("q.npy")], ("heads", "ring", "ulysses")),
        ("self f64 causal", base + ["--query", p("q64.npy"), "--is-causal"], ("heads", "ring", "ulysses")),
        ("mask alibi window", base + ["--query", p("q.npy"), "--attn-mask", p("mask.npy"), "--alibi", "--window", "3"],
         ("heads", "ring", "ulysses")),
        ("cross kdim vdim bias_kv kpm weights", ["--weights", p("wkv.safetensors"), "--query", p("q.npy"), "--key",
                                                 p("k.npy"), "--value", p("v.npy"), "--key-padding-mask", p("kpm.npy"),
                                                 "--attn-weights-out", p("W.npy"), "--no-average-attn-weights"],
         ("heads",)),
        ("cross causal bottom-right", ["--weights", p("wkv.safetensors"), "--query", p("q.npy"), "--key", p("k.npy"),
                                       "--value", p("v.npy"), "--is-causal", "--causal-align", "bottom-right",
                                       "--add-zero-attn"], ("heads", "ring", "ulysses")),
        ("gqa rope", ["--weights", p("gqa.safetensors"), "--num-kv-heads", "2", "--query", p("x.npy"), "--rope",
                      "half-split", "--is-causal"], ("heads", "ring", "ulysses")),
    ]
    for name, flags, modes in rows:
        want = run([cli, "forward", *flags, "--out", p("want.npy")])
        if want.returncode != 0:
            report(False, f"{name}: one process", want.stderr.decode().strip())
            continue
        ref = np.load(p("want.npy"))
        ref_w = np.load(p("W.npy")) if "--attn-weights-out" in flags else None
        bound = 1e-12 if ref.dtype == np.float64 else 1e-5
        for mode in modes:
            # Every rank count on the first row; 2 and 3 (even and uneven splits) on the others.
            for P in (1, 2, 3, 4) if name == rows[0][0] else (2, 3):
                if mode == "ulysses" and H % P:
                    continue
                if "--num-kv-heads" in flags and P > 2 and mode != "ring":  # Hkv = 2
                    continue
                out = p(f"got-{mode}-{P}.npy")
                r = run(mpi + ["-np", str(P), cli, "forward", "--parallel", mode, *flags, "--out", out])
                label = f"{name} --parallel {mode} -np {P}"
                if r.returncode != 0:
                    report(False, label, r.stderr.decode().strip())
                    continue
                got = np.load(out)
                err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
                ok = got.shape == ref.shape and got.dtype == ref.dtype and err <= bound
                if ref_w is not None:
                    werr = np.abs(np.load(p("W.npy")) - ref_w).max()
                    ok = ok and werr <= bound
                report(ok, label, f"max error / max(1, |out|) = {err:.3g} (bound {bound:g})")

    # Memory per rank falls as 1/P: each rank of --parallel heads decodes only
    # its slices of the file. Peak RSS of the largest process of the run
    # (RUSAGE_CHILDREN of a fresh wrapper: mpirun and its ranks), minus the
    # same run's on the tiny weights (the program and MPI themselves). The
    # whole-file reader measured ~the same excess at every P; slices give
    # ~1/P of the parameters (plus W^O's pages, touched by its columns).
    Ebig = 1024
    subprocess.run([cli, "init", "--embed-dim", str(Ebig), "--num-heads", "8", "--seed", "6", "--out",
                    p("big.safetensors")], check=True)
    np.save(p("qbig.npy"), rng.standard_normal((2, 1, Ebig)).astype(np.float32))
    np.save(p("qtiny.npy"), rng.standard_normal((2, 1, E)).astype(np.float32))
    peak = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)")

    def excess_kib(P):
        sizes = []
        for w, qf in (("big.safetensors", "qbig.npy"), ("w.safetensors", "qtiny.npy")):
            r = run([sys.executable, "-c", peak, *mpi, "-np", str(P), cli, "forward", "--parallel", "heads",
                     "--weights", p(w), "--query", p(qf), "--out", p("rss.npy")])
            sizes.append(int(r.stdout.decode().strip() or -1))
        return sizes[0] - sizes[1] if min(sizes) > 0 else None

    e1, e4 = excess_kib(1), excess_kib(4)
    file_kib = os.path.getsize(p("big.safetensors")) // 1024
    report(e1 is not None and e4 is not None and e4 < 0.5 * e1,
           "--parallel heads: a rank's memory for the weights falls with P",
           f"peak RSS above the tiny run: {e1} KiB at P = 1, {e4} KiB at P = 4 (file {file_kib} KiB; "
           f"bound: P = 4 below half of P = 1)")

    # Without mpirun: one rank.
    r = run([cli, "forward", "--parallel", "ring", *base, "--query", p("q.npy"), "--out", p("one.npy")])
    run([cli, "forward", *base, "--query", p("q.npy"), "--out", p("want.npy")])
    ok = r.returncode == 0 and np.abs(np.load(p("one.npy")) - np.load(p("want.npy"))).max() <= 1e-5
    report(ok, "--parallel ring without mpirun: one rank", r.stderr.decode().strip())

    def fault(name, argv, want_line, code=2):
        out = p("fault.npy")
        if os.path.exists(out):
            os.remove(out)
        t0 = time.monotonic()
        r = run(argv + ["--out", out])
        lines = [l for l in r.stderr.decode().splitlines() if l.startswith("multihead: ")]
        ok = r.returncode == code and lines == [want_line] and not os.path.exists(out)
        report(ok, name, f"exit {r.returncode} in {time.monotonic() - t0:.1f} s, lines {lines}")

    fwd = [cli, "forward", "--parallel", "heads", *base]
    fault("bad input on rank 1 only (MPMD)",
          mpi + ["-np", "1", *fwd, "--query", p("q.npy"), "--out", p("fault.npy"), ":", "-np", "1", *fwd, "--query",
                 p("bad.npy")],
          "multihead: error: query: expected shape (9, 2, 16), got (9, 2, 17)")
    fault("ranks > heads", mpi + ["-np", "5", *fwd, "--query", p("q.npy")],
          "multihead: error: ranks: expected at most num_heads = 4 ranks in head parallel (each rank needs one), "
          "got 5")
    np.save(p("q3.npy"), q[:3])
    fault("ranks > query rows", mpi + ["-np", "4", cli, "forward", "--parallel", "ring", *base, "--query", p("q3.npy")],
          "multihead: error: ranks: expected at most L = 3 ranks in sequence parallel (each rank needs a query row), "
          "got 4")
    fault("unreadable query on every rank", mpi + ["-np", "2", *fwd, "--query", p("missing.npy")],
          f"multihead: error: --query: cannot read '{p('missing.npy')}': No such file or directory")

    # --check-finite in every mode, with 2 ranks: a NaN in the query named at
    # the caller's index (heads: every rank holds the query whole; ring and
    # ulysses: the rank's rows, their positions said in the whole sequence);
    # an Inf in out_proj.weight, which the head-parallel ranks apply
    # outside the local module (it was missed), named at the whole tensor's
    # index as one process names it.
    qn = q.copy()
    qn[6, 1, 3] = np.nan
    np.save(p("qnan.npy"), qn)
    tensors, meta = safetensors_io.read(p("w.safetensors"))
    wo = tensors["out_proj.weight"][0].copy()
    wo[2, 13] = np.inf  # column 13: head 3 of 4 (width 4), rank 1's
    tensors["out_proj.weight"] = (wo, "F32")
    safetensors_io.write(p("winf.safetensors"), {k: (v, "F32") for k, (v, _) in tensors.items()}, meta)
    for mode, where in (("heads", "query: non-finite value nan at index (6, 1, 3)"),
                        ("ring", "query: non-finite value nan at index (6, 1, 3)"),
                        ("ulysses", "query: non-finite value nan at index (6, 1, 3)")):
        fault(f"--check-finite --parallel {mode}: a NaN query",
              mpi + ["-np", "2", cli, "forward", "--parallel", mode, *base, "--query", p("qnan.npy"), "--check-finite"],
              f"multihead: error: {where} (--check-finite rejects NaN and Inf)")
    fault("--check-finite --parallel heads: an Inf in out_proj.weight",
          mpi + ["-np", "2", cli, "forward", "--parallel", "heads", "--weights", p("winf.safetensors"), "--query",
                 p("q.npy"), "--check-finite"],
          "multihead: error: out_proj.weight: non-finite value inf at index (2, 13) (--check-finite rejects NaN "
          "and Inf)")

    # --parallel heads reads the file with every reader's checks (it had its
    # own parser: an int32 bias was skipped, so the run went on without
    # biases; overlapping data was accepted) and through one opening (a pipe
    # failed: the header and the slices opened it twice).
    header, blobs, at = {"__metadata__": meta}, [], 0
    for k, (v, _) in sorted(safetensors_io.read(p("w.safetensors"))[0].items()):
        blob = (v.astype("<i4") if k == "in_proj_bias" else v.astype("<f4")).tobytes()
        header[k] = {"dtype": "I32" if k == "in_proj_bias" else "F32", "shape": list(v.shape),
                     "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    with open(p("wi32.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    fault("--parallel heads: an int32 in_proj_bias",
          mpi + ["-np", "2", cli, "forward", "--parallel", "heads", "--weights", p("wi32.safetensors"), "--query",
                 p("q.npy")],
          "multihead: error: in_proj_bias: expected dtype float16, bfloat16, float32 or float64, got int32 "
          f"(in '{p('wi32.safetensors')}')")
    with open(p("w.safetensors"), "rb") as f:
        piped = subprocess.run(["/bin/sh", "-c", f"{cli} forward --parallel heads --weights /dev/stdin --query "
                                f"{p('q.npy')} --out {p('piped.npy')}"], stdin=f, capture_output=True, timeout=60)
    run([cli, "forward", *base, "--query", p("q.npy"), "--out", p("want.npy")])
    report(piped.returncode == 0 and np.abs(np.load(p("piped.npy")) - np.load(p("want.npy"))).max() <= 1e-5,
           "--parallel heads --weights from a pipe (one rank)", piped.stderr.decode().strip())

    # A rank killed mid-run: a long --repeat, SIGKILL to one rank's process.
    out = p("killed.npy")
    if os.path.exists(out):
        os.remove(out)
    proc = subprocess.Popen(mpi + ["-np", "3", cli, "forward", "--parallel", "ring", *base, "--query", p("q.npy"),
                                   "--repeat", "100000000", "--out", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    victim = None
    deadline = time.monotonic() + 20
    while victim is None and time.monotonic() < deadline:
        time.sleep(0.5)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if ppid == proc.pid and cmd and cmd[0].endswith(b"multihead") and victim is None:
                victim = int(pid)
    t0 = time.monotonic()
    if victim is not None:
        time.sleep(1.0)  # well inside the run
        os.kill(victim, signal.SIGKILL)
    try:
        proc.wait(timeout=60)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()  # the mpirun this script started
        proc.wait()
        code = None
    report(victim is not None and code not in (None, 0) and not os.path.exists(out),
           "a rank killed by SIGKILL mid-run",
           f"mpirun exit {code} {time.monotonic() - t0:.1f} s after the kill, output file "
           f"{'present' if os.path.exists(out) else 'absent'}")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
