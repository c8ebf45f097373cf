"""What the `multihead train` scripts share (tests/cli/train.py,
tests/cli/train_dtype.py): the pass/fail record, one `train` run, the small
model's flags, and the driver that runs the script's checks in a fresh
--workdir and exits non-zero on any failure."""
import argparse
import os
import shutil
import subprocess

FAILURES, PASSED = [], []
# A one-layer model small enough for a step in milliseconds.
SMALL = ["--symbols", "6", "--length", "5", "--layers", "1", "--d-model", "16", "--heads", "2", "--ff", "16",
         "--batch", "4"]


def check(name, ok, detail=""):
    (PASSED if ok else FAILURES).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def run(cli, *args, timeout=120):
    """`multihead train ARGS`: (exit code, stdout, stderr)."""
    r = subprocess.run([cli, "train", *args], capture_output=True, timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def main(*steps, release_only=()):
    """Parses --multihead, --workdir and --sanitized, empties the workdir,
    runs each step(cli, workdir), prints the tally; the exit code says
    whether all passed. With --sanitized (the sanitizer builds' ctest) the
    steps in release_only are skipped, each with a line saying so: they
    check numbers (accuracy after hundreds of steps), not memory, and the
    other steps run the same code paths for a few steps each."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--sanitized", action="store_true")
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    for step in steps:
        if a.sanitized and step in release_only:
            print(f"skip {step.__name__}: runs in the Release suite only (--sanitized)")
            continue
        step(a.multihead, a.workdir)
    print(f"{len(PASSED)} passed, {len(FAILURES)} failed")
    return 1 if FAILURES else 0
