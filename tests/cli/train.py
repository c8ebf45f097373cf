#!/usr/bin/python3
"""`multihead train` from the outside.

Bad input (each: exit 2, exactly one line on stderr naming the flag or the
file and what was wrong, and no --checkpoint-out file written):
  bad flag values, '-' as an output, an output that is the --resume input,
  and hostile --resume files: missing, empty, truncated, random bytes, a
  weights file that is no checkpoint, a checkpoint whose settings disagree
  with a given flag, one with a tensor missing or of the wrong shape, and
  metadata that breaks the one metadata rule (src/io/metadata.hpp): "12abc",
  " 12", "1e3", "+1", int64 and uint64 overflow, "nan", "inf", "True", "1".
Good runs (stdout is a pipe here, so never a terminal):
  - plain log lines "step=K loss=… accuracy=… lr=… grad_norm=… tokens_per_s=…
    elapsed_s=…" every --log-interval steps and at the last, then one "done:"
    summary, and no carriage return or escape byte;
  - --threads 1 and --threads 2 print the same losses;
  - 5 steps, checkpoint, --resume to 10 prints the losses of 10 steps in one go
    (constant schedule: with cosine, a longer --steps reshapes the rest);
  - the loss of a 100-step run falls below a quarter of its first value;
  - on a (pseudo-)terminal, and with --progress bar, a bar drawn with carriage
    returns; --help names every option.
Interrupts: `train --checkpoint-every 1` (a 4.8 MB checkpoint written every
step) stopped 20 times by SIGINT, 10 times by SIGTERM, 6 by SIGHUP and 3 by SIGUSR1 at delays from 0.1
to 0.5 s: killed by that signal each time, no out.safetensors.tmp.* left
behind, and the checkpoint, when one was written, complete (inspect reads it).
Before the fix about one run in five left a temporary.

Usage: /usr/bin/python3 tests/cli/train.py --multihead PATH --workdir DIR
"""
import glob
import os
import pty
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import safetensors_io  # noqa: E402
from train_harness import SMALL, check, main, run  # noqa: E402

LINE = re.compile(r"^step=(\d+) loss=(\S+) accuracy=(\S+) lr=(\S+) grad_norm=(\S+) tokens_per_s=(\S+) "
                  r"elapsed_s=(\S+)$")


def losses(out):
    return [(int(m.group(1)), m.group(2)) for m in (LINE.match(l) for l in out.splitlines()) if m]


def bad_cases(cli, work):
    good = os.path.join(work, "good.safetensors")
    code, _, err = run(cli, *SMALL, "--steps", "2", "--checkpoint-out", good)
    assert code == 0, err
    data = open(good, "rb").read()

    def raw(name, content):
        p = os.path.join(work, name)
        with open(p, "wb") as f:
            f.write(content)
        return p

    tensors, meta = safetensors_io.read(good)
    weights = os.path.join(work, "weights.safetensors")
    subprocess.run([cli, "init", "--embed-dim", "16", "--num-heads", "2", "--out", weights], check=True)

    def rewritten(name, drop=None, reshape=None, metadata=None, poke=None):
        t = {k: (v, "F32") for k, (v, _) in tensors.items() if k != drop}
        if reshape:
            t[reshape] = (t[reshape][0][:-1], "F32")
        if poke:  # (tensor, value): its first element changed
            v = t[poke[0]][0].copy()
            v.flat[0] = poke[1]
            t[poke[0]] = (v, "F32")
        p = os.path.join(work, name)
        safetensors_io.write(p, t, {**meta, **(metadata or {})})
        return p

    # The one metadata rule (src/io/metadata.hpp): the whole string, finite
    # numbers, exactly true/false; each refusal names the key and the value.
    def bad_metadata(key, value, expected):
        path = rewritten(f"meta-{key}-{len(value)}.safetensors", metadata={key: value})
        return (f"--resume with metadata {key}={value!r}", ["--resume", path],
                ["--resume", f"checkpoint metadata '{key}': expected {expected}, got '{value}'"])

    missing = rewritten("missing-tensor.safetensors", drop="readout.bias")
    # Values no run saves: training on them blamed the learning rate.
    nan_weight = rewritten("nan-weight.safetensors", poke=("readout.bias", float("nan")))
    negative_sq = rewritten("negative-moment.safetensors", poke=("optimizer.exp_avg_sq.readout.bias", -1.0))
    short = rewritten("short-tensor.safetensors", reshape="embedding.weight")
    out = os.path.join(work, "out", "ck.safetensors")
    return [
        ("--steps -1", ["--steps", "-1"], ["--steps", "-1"]),
        ("--lr 0", ["--lr", "0"], ["--lr", "'0'"]),
        ("--lr abc", ["--lr", "abc"], ["--lr", "'abc'"]),
        ("--task sort", ["--task", "sort"], ["--task", "copy, reverse", "'sort'"]),
        ("--heads 5 for d_model 64", ["--heads", "5"], ["--heads", "--d-model 64", "got 5"]),
        ("--dropout 1", ["--dropout", "1"], ["--dropout", "'1'"]),
        ("--symbols 1", ["--symbols", "1"], ["--symbols", "'1'"]),
        ("--schedule linear", ["--schedule", "linear"], ["--schedule", "constant, cosine", "'linear'"]),
        ("--threads 100000", ["--threads", "100000"], ["--threads", "100000"]),
        ("unknown flag", ["--stepz", "3"], ["'--stepz'", "did you mean '--steps'?"]),
        ("--checkpoint-out -", ["--checkpoint-out", "-"], ["--checkpoint-out", "'-'"]),
        ("--resume '' (unset variable)", ["--resume", ""], ["--resume", "''"]),
        ("--resume missing", ["--resume", os.path.join(work, "nope.safetensors")],
         ["--resume", "nope.safetensors", "No such file"]),
        ("--resume empty", ["--resume", raw("empty.safetensors", b"")], ["--resume", "empty.safetensors"]),
        ("--resume truncated", ["--resume", raw("truncated.safetensors", data[: len(data) // 2])],
         ["--resume", "truncated.safetensors"]),
        ("--resume random bytes", ["--resume", raw("random.safetensors", os.urandom(4096))],
         ["--resume", "random.safetensors"]),
        ("--resume a weights file", ["--resume", weights],
         ["--resume", "weights.safetensors", "not a multihead train checkpoint"]),
        ("--resume with another --d-model", ["--resume", good, "--d-model", "32"],
         ["--resume", "--d-model is 16 in the checkpoint, got 32"]),
        ("--resume with another --task", ["--resume", good, "--task", "copy"],
         ["--resume", "task is reverse in the checkpoint, got copy"]),
        ("--resume with fewer --steps", ["--resume", good, "--steps", "1"],
         ["--resume", "steps", "2", "got 1"]),
        ("--resume tensor missing", ["--resume", missing], ["--resume", "'readout.bias' is missing"]),
        ("--resume a NaN weight", ["--resume", nan_weight],
         ["--resume", "tensor 'readout.bias' holds nan at index (0), expected a finite value"]),
        ("--resume a negative second moment", ["--resume", negative_sq],
         ["--resume", "'optimizer.exp_avg_sq.readout.bias' holds -1", "expected a finite value >= 0"]),
        ("--resume tensor of the wrong shape", ["--resume", short],
         ["--resume", "'embedding.weight'", "expected shape (6, 16)"]),
        ("--checkpoint-out is the --resume input", ["--resume", good, "--checkpoint-out", good],
         ["--checkpoint-out", "--resume input"]),
        bad_metadata("step", "12abc", "an integer"),
        bad_metadata("steps", " 12", "an integer"),
        bad_metadata("batch", "1e3", "an integer"),
        bad_metadata("warmup", "+1", "an integer"),
        bad_metadata("step", "9223372036854775808", "an integer in [-9223372036854775808, 9223372036854775807]"),
        bad_metadata("seed", "18446744073709551616", "an unsigned integer below 2^64"),
        bad_metadata("lr", "nan", "a finite number"),
        bad_metadata("clip", "inf", "a finite number"),
        bad_metadata("eps", "1e-8x", "a finite number"),
        bad_metadata("causal", "True", "true or false"),
        bad_metadata("causal", "1", "true or false"),
    ], out


def test_bad_input(cli, work):
    cases, out = bad_cases(cli, work)
    for name, args, words in cases:
        shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        os.makedirs(os.path.dirname(out))
        extra = [] if "--checkpoint-out" in args else ["--checkpoint-out", out]
        code, stdout, err = run(cli, *args, *extra)
        lines = err.rstrip("\n").split("\n")
        problem = ""
        if code != 2:
            problem = f"exit {code}, expected 2 ({err.strip()!r})"
        elif len(lines) != 1 or not lines[0]:
            problem = f"expected one line on stderr, got {err!r}"
        elif any(w not in err for w in words):
            problem = f"lacks {[w for w in words if w not in err]} in {err.strip()!r}"
        elif os.listdir(os.path.dirname(out)):
            problem = f"left files behind: {os.listdir(os.path.dirname(out))}"
        check(f"bad input: {name}", not problem, problem)
        if not problem:
            print(f"       {err.strip()}")


def test_plain_lines(cli, work):
    code, out, err = run(cli, *SMALL, "--steps", "12", "--log-interval", "5")
    got = [s for s, _ in losses(out)]
    rest = [l for l in out.splitlines() if not LINE.match(l)]
    problem = ""
    if code != 0:
        problem = f"exit {code}: {err.strip()}"
    elif got != [5, 10, 12]:
        problem = f"log lines at steps {got}, expected [5, 10, 12]; stdout {out!r}"
    elif len(rest) != 1 or not rest[0].startswith("done: "):
        problem = f"expected one 'done:' summary after the lines, got {rest!r}"
    elif "\r" in out or "\x1b" in out:
        problem = "carriage return or escape byte in a non-terminal log"
    check("not a terminal: key=value lines every --log-interval steps, then 'done:'", not problem, problem)


def test_threads_and_resume(cli, work):
    _, one, _ = run(cli, *SMALL, "--steps", "10", "--log-interval", "1", "--threads", "1", "--dropout", "0.1")
    _, two, _ = run(cli, *SMALL, "--steps", "10", "--log-interval", "1", "--threads", "2", "--dropout", "0.1")
    check("--threads 1 and 2 print the same losses", losses(one) == losses(two) and len(losses(one)) == 10,
          f"{losses(one)} vs {losses(two)}")
    # A constant schedule: the first run plans 5 steps, the resumed one 10,
    # and only the warm-up (2 steps) and lr then shape the learning rate.
    sched = ["--schedule", "constant", "--warmup", "2", "--log-interval", "1", "--dropout", "0.1"]
    _, whole, _ = run(cli, *SMALL, *sched, "--steps", "10")
    ck = os.path.join(work, "half.safetensors")
    run(cli, *SMALL, *sched, "--steps", "5", "--checkpoint-out", ck)
    code, second, err = run(cli, "--resume", ck, "--steps", "10", "--log-interval", "1")
    resumed = losses(second)
    one = whole
    check("5 steps, checkpoint, --resume to 10 == 10 steps", code == 0 and resumed == losses(one)[5:],
          f"exit {code} {err.strip()}: {resumed} vs {losses(one)[5:]}")
    check("the resumed summary names the steps", "steps 5-10" in second, second.strip().splitlines()[-1:])


def test_learns_and_bar(cli, work):
    code, out, err = run(cli, "--symbols", "6", "--length", "6", "--layers", "2", "--d-model", "32", "--ff", "64",
                         "--batch", "16", "--steps", "100", "--log-interval", "100", "--lr", "3e-3", "--warmup", "5",
                         "--schedule", "constant", "--seed", "42")
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+)", out)
    ok = code == 0 and m and float(m.group(2)) < 0.25 * float(m.group(1))
    check("a 100-step run lowers the loss below a quarter", ok, out.strip())
    code, out, _ = run(cli, *SMALL, "--steps", "3", "--progress", "bar")
    check("--progress bar redraws with carriage returns", code == 0 and "\r" in out and "tok/s" in out
          and "left" in out, repr(out))
    # --progress auto on a terminal (a pseudo-terminal here): the bar.
    master, slave = pty.openpty()
    r = subprocess.run([cli, "train", *SMALL, "--steps", "3"], stdout=slave, stderr=subprocess.PIPE, timeout=120)
    os.close(slave)
    tty = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        tty += chunk
    os.close(master)
    text = tty.decode("utf-8", "replace")
    check("on a terminal the bar is drawn, not log lines", r.returncode == 0 and "\r" in text and "step=" not in text
          and "done: " in text, repr(text))
    code, out, _ = run(cli, "--help")
    flags = ["--task", "--symbols", "--length", "--layers", "--d-model", "--heads", "--ff", "--dropout", "--causal",
             "--steps", "--batch", "--lr", "--warmup", "--schedule", "--weight-decay", "--beta1", "--beta2",
             "--adam-eps", "--clip", "--seed", "--threads", "--checkpoint-out", "--checkpoint-every", "--resume",
             "--dump-gradients", "--log-interval", "--progress"]
    missing = [f for f in flags if f not in out]
    check("--help documents every option", code == 0 and not missing, f"missing {missing}")


def test_interrupts(cli, work):
    import glob
    import signal
    import time
    folder = os.path.join(work, "interrupts")
    os.makedirs(folder)
    ck, out = os.path.join(folder, "ck.safetensors"), os.path.join(folder, "out.safetensors")
    code, _, err = run(cli, "--steps", "5", "--d-model", "128", "--heads", "4", "--layers", "2", "--ff", "512",
                       "--batch", "2", "--checkpoint-out", ck)
    assert code == 0, err
    for sig, runs in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGHUP, 6), (signal.SIGUSR1, 3)):
        problems = []
        for i in range(runs):
            for f in glob.glob(out + "*"):
                os.unlink(f)
            p = subprocess.Popen([cli, "train", "--resume", ck, "--steps", "1000000", "--checkpoint-every", "1",
                                  "--checkpoint-out", out, "--progress", "none"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
            delay = 0.1 + 0.05 * (i % 9)
            time.sleep(delay)
            p.send_signal(sig)
            _, err = p.communicate(timeout=60)
            forget_openmp_registration(p.pid)
            left = glob.glob(out + ".tmp.*")
            if p.returncode != -sig or left:
                problems.append(f"run {i} (after {delay:.2f} s): status {p.returncode}, left {left}, stderr {err!r}")
            elif os.path.exists(out):
                r = subprocess.run([cli, "inspect", out], capture_output=True)
                if r.returncode != 0:
                    problems.append(f"run {i}: the checkpoint does not read back: {r.stderr!r}")
        check(f"{sig.name} x{runs} during --checkpoint-every 1: killed by it, no temporary left, checkpoint whole",
              not problems, "; ".join(problems[:3]) + f" ({len(problems)} of {runs} runs)")


def test_failed_run_keeps_old_outputs(cli, work):
    """A run that diverges leaves --checkpoint-out and --dump-gradients as they were (the gradients file was
    written before training, so a failed run replaced it); a run that ends well writes both."""
    ck, grads = os.path.join(work, "old_ck.safetensors"), os.path.join(work, "old_grads.safetensors")
    for path in (ck, grads):
        with open(path, "w") as f:
            f.write("OLD")
    code, _, err = run(cli, *SMALL, "--steps", "3", "--lr", "1e308", "--checkpoint-out", ck, "--dump-gradients",
                       grads, "--progress", "none")
    kept = [open(p).read() == "OLD" for p in (ck, grads)]
    check("a diverged run: exit 2, 'training diverged', both old files kept",
          code == 2 and "training diverged" in err and all(kept), f"exit {code} {err.strip()!r}, kept {kept}")
    code, _, err = run(cli, *SMALL, "--steps", "2", "--checkpoint-out", ck, "--dump-gradients", grads,
                       "--progress", "none")
    written = [subprocess.run([cli, "inspect", p], capture_output=True).returncode == 0 for p in (ck, grads)]
    check("a run that ends well writes both", code == 0 and all(written), f"exit {code} {err.strip()!r} {written}")


def forget_openmp_registration(pid):
    """Removes what LLVM's OpenMP runtime (the clang builds: ASan, TSan) left of a process this test killed.

    libomp registers each process in /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> and removes the file at exit; a
    process killed by a signal leaves it. An empty one (killed between its creation and its first write) makes the
    next libomp process that gets the same pid (pid_max is 32768 here: they come round) die of SIGBUS reading it.
    """
    for path in glob.glob(f"/dev/shm/__KMP_REGISTERED_LIB_{pid}_*"):
        try:
            os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main(test_bad_input, test_plain_lines, test_threads_and_resume, test_learns_and_bar,
                  test_failed_run_keeps_old_outputs, test_interrupts))
