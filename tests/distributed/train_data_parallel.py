#!/usr/bin/python3
"""`mpirun -np P multihead train --parallel data` from the outside.

Bit-identity (each row a named case; losses compared as the printed strings,
checkpoints byte for byte):
  - P = 1 (no mpirun: the one-process run), 2 and 4 print the same
    "step=K loss=… accuracy=… lr=… grad_norm=…" lines, once (rank 0), and
    write the same --checkpoint-out bytes; dropout 0.1 is on;
  - 3 steps at P = 2, then --resume to 6 steps at P = 4 and at P = 1: the
    losses of steps 4-6 and the final checkpoint of the uninterrupted run.
Faults (exit code, the program's stderr lines, no checkpoint, no temporary):
  - --batch 4 at P = 3: exit 2, one line naming 4 and the 3 ranks;
  - a bad flag value (--lr -1) at P = 2: exit 2, one line (rank 0's);
  - bad input on one rank only (MPMD: rank 1 alone gets a --resume file that
    does not exist): exit 2, one line (from rank 0) naming that file;
  - rank 1 killed by SIGKILL after the first step: mpirun exits non-zero
    within 60 s, no checkpoint file.

Usage: /usr/bin/python3 tests/distributed/train_data_parallel.py --multihead CLI --mpiexec MPIEXEC --workdir DIR
(ctest sets OMPI_ALLOW_RUN_AS_ROOT*, OMPI_MCA_plm=isolated, OMP_NUM_THREADS=1 for this test only.)
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

FAILURES, PASSED = [], []
SMALL = ["--task", "reverse", "--symbols", "6", "--length", "5", "--layers", "1", "--d-model", "16", "--heads", "2",
         "--ff", "16", "--dropout", "0.1", "--batch", "4", "--warmup", "2", "--threads", "1", "--progress", "lines",
         "--log-interval", "1", "--parallel", "data"]
LINE = re.compile(r"^(step=\d+ loss=\S+ accuracy=\S+ lr=\S+ grad_norm=\S+) tokens_per_s=\S+ elapsed_s=\S+$")


def check(name, ok, detail=""):
    (PASSED if ok else FAILURES).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def command(a, ranks, args):
    cli = [a.multihead, "train", *args]
    return cli if ranks == 0 else [a.mpiexec, "-np", str(ranks), "--oversubscribe", *cli]


def run(cmd, timeout=120):
    r = subprocess.run(cmd, capture_output=True, timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def losses(out):
    return [m.group(1) for m in (LINE.match(l) for l in out.splitlines()) if m]


def program_lines(err):
    # The program's own lines (mpirun adds its notes on a failed job).
    return [l for l in err.splitlines() if l.startswith("multihead:")]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def no_file(path):
    return not os.path.exists(path) and not glob.glob(path + ".tmp*")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--multihead", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--workdir", required=True)
    a = p.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    ck = lambda name: os.path.join(a.workdir, name + ".safetensors")  # noqa: E731

    # ---- P = 1 (no launcher), 2, 4: the same losses and checkpoint ----
    want_lines, want_ck = None, None
    for ranks in (0, 2, 4):
        label = "P=1 (no mpirun)" if ranks == 0 else f"P={ranks}"
        rc, out, err = run(command(a, ranks, SMALL + ["--steps", "6", "--checkpoint-out", ck(f"whole{ranks}")]))
        lines = losses(out)
        if rc != 0 or len(lines) != 6:
            check(f"train_6_steps_{label}", False, f"exit {rc}, {len(lines)} loss lines (want 6), stderr {err!r}")
            continue
        if want_lines is None:
            want_lines, want_ck = lines, read(ck("whole0"))
            check(f"train_6_steps_{label}_runs_and_moves", lines[0] != lines[-1], f"{lines}")
            continue
        check(f"train_6_steps_{label}_losses_equal_P=1", lines == want_lines, f"{lines} vs {want_lines}")
        check(f"train_6_steps_{label}_checkpoint_bytes_equal_P=1", read(ck(f"whole{ranks}")) == want_ck)
    if want_lines is None:
        return finish()

    # ---- 3 steps at P = 2, resumed to 6 at P = 4 and at P = 1 ----
    rc, out, err = run(command(a, 2, SMALL + ["--steps", "3", "--checkpoint-out", ck("half")]))
    check("resume_first_3_steps_P=2", rc == 0 and losses(out) == want_lines[:3], f"exit {rc}, {losses(out)}, {err!r}")
    for ranks in (4, 0):
        label = "P=1" if ranks == 0 else f"P={ranks}"
        out_ck = ck(f"resumed{ranks}")
        rc, out, err = run(command(a, ranks, ["--resume", ck("half"), "--steps", "6", "--progress", "lines",
                                              "--log-interval", "1", "--threads", "1", "--parallel", "data",
                                              "--checkpoint-out", out_ck]))
        check(f"resume_P=2_to_{label}_losses_of_the_uninterrupted_run", rc == 0 and losses(out) == want_lines[3:],
              f"exit {rc}, {losses(out)} vs {want_lines[3:]}, {err!r}")
        check(f"resume_P=2_to_{label}_checkpoint_bytes_of_the_uninterrupted_run",
              os.path.exists(out_ck) and read(out_ck) == want_ck)

    # ---- faults ----
    out_ck = ck("fault-batch")
    rc, out, err = run(command(a, 3, SMALL + ["--steps", "2", "--checkpoint-out", out_ck]))
    want = "multihead: error: --batch: expected a multiple of the 3 ranks (each takes batch/ranks examples), got 4"
    check("fault_batch_4_at_P=3_one_line_exit_2_no_file", rc == 2 and program_lines(err) == [want] and no_file(out_ck),
          f"exit {rc}, lines {program_lines(err)}")

    out_ck = ck("fault-flag")
    rc, out, err = run(command(a, 2, SMALL + ["--steps", "2", "--lr", "-1", "--checkpoint-out", out_ck]))
    want = "multihead: error: --lr: expected a finite number > 0, got '-1' (run 'multihead train --help')"
    check("fault_bad_flag_on_every_rank_at_P=2_one_line_exit_2_no_file",
          rc == 2 and program_lines(err) == [want] and no_file(out_ck), f"exit {rc}, lines {program_lines(err)}")

    out_ck, missing = ck("fault-one-rank"), os.path.join(a.workdir, "only-rank-1-asks-for-this.safetensors")
    mpmd = [a.mpiexec, "--oversubscribe", "-np", "1", a.multihead, "train", *SMALL, "--steps", "2",
            "--checkpoint-out", out_ck, ":", "-np", "1", a.multihead, "train", *SMALL, "--steps", "2",
            "--checkpoint-out", out_ck, "--resume", missing]
    rc, out, err = run(mpmd)
    lines = program_lines(err)
    check("fault_bad_resume_on_rank_1_only_one_line_from_rank_0_exit_2_no_file",
          rc == 2 and len(lines) == 1 and missing in lines[0] and "--resume" in lines[0] and no_file(out_ck),
          f"exit {rc}, lines {lines}")

    out_ck, marker = ck("fault-kill"), uuid.uuid4().hex
    env = dict(os.environ, MULTIHEAD_TRAIN_TEST_RUN=marker)
    proc = subprocess.Popen(command(a, 2, SMALL + ["--steps", "100000", "--checkpoint-out", out_ck]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.readline()  # the first step is done
    victim = rank_pid(marker, 1)
    start = time.monotonic()
    if victim is not None:
        os.kill(victim, signal.SIGKILL)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    took = time.monotonic() - start
    proc.stdout.close()
    proc.stderr.close()
    print(f"     (rank 1 killed: mpirun exited {rc} after {took:.1f} s)")
    check("fault_rank_1_SIGKILL_others_exit_nonzero_within_60s_no_checkpoint",
          victim is not None and rc not in (None, 0) and no_file(out_ck),
          f"victim {victim}, exit {rc} after {took:.1f} s, checkpoint {os.path.exists(out_ck)}")
    return finish()


def rank_pid(marker, rank):
    """The pid of the process of our job with OMPI_COMM_WORLD_RANK = rank."""
    want = {f"MULTIHEAD_TRAIN_TEST_RUN={marker}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()}
    for _ in range(100):
        for env_file in glob.glob("/proc/[0-9]*/environ"):
            try:
                env = set(read(env_file).split(b"\0"))
            except OSError:
                continue
            if want <= env:
                return int(env_file.split("/")[2])
        time.sleep(0.05)
    return None


def finish():
    print(f"{len(PASSED)} passed, {len(FAILURES)} failed")
    if FAILURES:
        print("failed: " + ", ".join(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
