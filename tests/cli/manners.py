#!/usr/bin/python3
"""A command line with good manners: what a new user meets in the first hour.

Checks, each with its exit code and message text:
  - `multihead --version` prints "multihead <version>" with the version of
    project(multihead VERSION ...) in CMakeLists.txt;
  - every subcommand's --help shows the default of each listed option, and
    no default for required options;
  - an unknown flag or subcommand gets "did you mean" and a pointer to the
    help of the subcommand it was typed in;
  - enum values are accepted in any case, and mean the same as lower case;
  - `multihead` alone prints a short usage and exits 0 (it is not the demo);
  - `--verbose` prints one summary line on stderr, and only with --verbose;
  - a MULTIHEAD_* tuning variable with an unknown value fails every command
    the same way (one line naming it), whatever path the command takes;
  - an input file truncated in place while multihead reads it (mapped) ends
    the run with one line and status 2, never SIGBUS;
  - a real-valued flag reads as strtod does: an underflow to a subnormal
    (1e-320) is a number, an overflow (1e999), nan or inf is refused.

Usage: /usr/bin/python3 tests/cli/manners.py --multihead PATH --cmakelists PATH --workdir DIR
"""
import argparse
import io
import os
import re
import shutil
import subprocess
import sys

import numpy as np

FAILURES = []
PASSED = []


def check(name, ok, detail=""):
    (PASSED if ok else FAILURES).append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))


def run(cli, *args, cwd=None):
    r = subprocess.run([cli, *args], capture_output=True, timeout=120, cwd=cwd)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def one_error_line(code, err, *words):
    """Exit 2, one line on stderr, every word in it. Returns a problem or ""."""
    if code != 2:
        return f"exit {code}, expected 2 ({err.strip()!r})"
    if len(err.rstrip("\n").split("\n")) != 1:
        return f"expected one line, got {err!r}"
    missing = [w for w in words if w not in err]
    return f"lacks {missing} in {err.strip()!r}" if missing else ""


def help_defaults(text):
    """{option: default or None} from a --help text (descriptions may wrap)."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s+(-\w,)?(--[\w-]+)", line)
        if m:
            current = m.group(2)
            out[current] = None
        if current:
            d = re.search(r"\[default: ([^\]]*)\]", line)
            if d:
                out[current] = d.group(1)
    return out


EXPECTED_DEFAULTS = {
    "init": {"--seed": "0", "--dropout": "0", "--kdim": "embed_dim", "--vdim": "embed_dim"},
    "bench": {"--batch": "1", "--seq-len": "1024", "--embed-dim": "768", "--num-heads": "12", "--threads": "0",
              "--repeat": "7", "--warmup": "2", "--kernel": "auto"},
    "demo": {"--embed-dim": "64", "--num-heads": "8", "--seed": "7", "--focus": "it"},
    "forward": {"--masked-rows": "zeros", "--form": "fused", "--kernel": "auto", "--threads": "0",
                "--repeat": "1", "--dropout-seed": "0"},
    "train": {"--task": "reverse", "--steps": "200", "--lr": "0.001", "--warmup": "20", "--schedule": "cosine",
              "--seed": "0", "--threads": "0", "--log-interval": "10", "--progress": "auto"},
}
REQUIRED = {"init": ["--embed-dim", "--num-heads", "--out"], "forward": ["--weights", "--query", "--out"]}


def test_version(cli, cmakelists):
    with open(cmakelists) as f:
        version = re.search(r"project\(multihead VERSION ([0-9.]+)", f.read()).group(1)
    code, out, err = run(cli, "--version")
    check("--version prints 'multihead <version>'", code == 0 and out == f"multihead {version}\n",
          f"exit {code}, stdout {out!r}, expected 'multihead {version}'")


def test_help_defaults(cli):
    for sub, expected in EXPECTED_DEFAULTS.items():
        code, out, _ = run(cli, sub, "--help")
        shown = help_defaults(out)
        wrong = {o: shown.get(o, "option missing") for o, d in expected.items() if shown.get(o) != d}
        check(f"{sub} --help shows defaults", code == 0 and not wrong, f"exit {code}; shown instead: {wrong}")
        placeholders = [o for o in REQUIRED.get(sub, []) if shown.get(o) is not None]
        check(f"{sub} --help shows no default for required options", not placeholders, f"{placeholders}")


def test_did_you_mean(cli):
    cases = [
        (("forward", "--is-casual"), ["'--is-casual'", "did you mean '--is-causal'?", "(run 'multihead forward --help')"]),
        (("forward", "--querry", "q.npy"), ["'--querry'", "did you mean '--query'?", "(run 'multihead forward --help')"]),
        (("forwrd", "--weights", "w.safetensors"), ["'forwrd'", "did you mean 'forward'?", "(run 'multihead --help')"]),
        (("init", "--seeed", "3"), ["did you mean '--seed'?", "(run 'multihead init --help')"]),
        (("bench", "--kernal", "flash"), ["did you mean '--kernel'?", "(run 'multihead bench --help')"]),
        (("demo", "--focsu", "it"), ["did you mean '--focus'?", "(run 'multihead demo --help')"]),
        (("train", "--stpes", "3"), ["did you mean '--steps'?", "(run 'multihead train --help')"]),
        (("--num-heads", "2"), ["'--num-heads'", "it is an option of forward, demo, init, bench, decode: put it after the command",
                                "(run 'multihead --help')"]),
    ]
    for argv, words in cases:
        code, _, err = run(cli, *argv)
        problem = one_error_line(code, err, *words)
        check(f"did you mean: {' '.join(argv)}", not problem, problem)
    code, _, err = run(cli, "forward", "--bogus")
    problem = one_error_line(code, err, "'--bogus'", "(run 'multihead forward --help')")
    if not problem and "did you mean" in err:
        problem = f"suggests something for a word that is no typo: {err.strip()!r}"
    check("no suggestion for --bogus", not problem, problem)


def test_hints(cli):
    cases = [
        (("init", "--embed-dim", "0", "--num-heads", "2", "--out", "w.safetensors"), "init", "--embed-dim"),
        (("bench", "--repeat", "0"), "bench", "--repeat"),
        (("demo", "--num-heads", "0"), "demo", "--num-heads"),
        (("forward", "--weights", "w.safetensors", "--query", "q.npy"), "forward", "--out is required"),
    ]
    for argv, sub, word in cases:
        code, _, err = run(cli, *argv)
        problem = one_error_line(code, err, word, f"(run 'multihead {sub} --help')")
        check(f"hint names the subcommand: {' '.join(argv)}", not problem, problem)


def make_inputs(cli, work):
    w = os.path.join(work, "W.safetensors")
    subprocess.run([cli, "init", "--embed-dim", "8", "--num-heads", "2", "--seed", "1", "--out", w], check=True)
    rng = np.random.default_rng(0)
    q = os.path.join(work, "q.npy")
    np.save(q, rng.standard_normal((3, 2, 8)).astype(np.float32))
    kpm = os.path.join(work, "kpm.npy")
    mask = np.zeros((2, 3), dtype=bool)
    mask[0, :] = True  # batch 0 may attend to nothing: the masked-rows policy decides
    np.save(kpm, mask)
    return w, q, kpm


def forward_bytes(cli, w, q, *extra):
    code, out, err = run(cli, "forward", "--weights", w, "--query", q, "--out", "-", *extra)
    return code, err, out


def test_enum_case(cli, work):
    w, q, kpm = make_inputs(cli, work)
    outs = {}
    for value in ("NaN", "nan", "zeros"):
        r = subprocess.run([cli, "forward", "--weights", w, "--query", q, "--key-padding-mask", kpm,
                            "--masked-rows", value, "--out", "-"], capture_output=True, timeout=120)
        outs[value] = (r.returncode, r.stdout, r.stderr.decode())
    ok = outs["NaN"][0] == 0 and outs["NaN"][1] == outs["nan"][1] and outs["nan"][1] != outs["zeros"][1]
    nan_rows = np.isnan(np.load(io.BytesIO(outs["NaN"][1]))).any() if outs["NaN"][0] == 0 else False
    check("--masked-rows NaN is accepted and equals nan (and differs from zeros)", ok and nan_rows,
          f"exit {outs['NaN'][0]} {outs['NaN'][2].strip()!r}; equal to nan: {outs['NaN'][1] == outs['nan'][1]}; "
          f"NaN in output: {nan_rows}")
    for flag, value in (("--kernel", "Flash"), ("--kernel", "MATERIALIZED"), ("--form", "TEXTBOOK")):
        code = subprocess.run([cli, "forward", "--weights", w, "--query", q, flag, value, "--out", "-"],
                              capture_output=True, timeout=120)
        check(f"forward {flag} {value} is accepted", code.returncode == 0, code.stderr.decode().strip())
    code, out, err = run(cli, "bench", "--batch", "1", "--seq-len", "4", "--embed-dim", "8", "--num-heads", "2",
                         "--repeat", "1", "--warmup", "0", "--kernel", "Reference")
    check("bench --kernel Reference is accepted as reference", code == 0 and "kernel=reference" in out,
          f"exit {code}: {err.strip()!r} {out.strip()!r}")
    code, _, err = run(cli, "forward", "--weights", w, "--query", q, "--out", "-", "--kernel", "fast")
    problem = one_error_line(code, err, "--kernel: expected one of auto, reference, materialized, flash; got 'fast'")
    check("an unknown enum value lists the accepted ones", not problem, problem)


def test_real_numbers(cli, work):
    w = os.path.join(work, "tiny.safetensors")
    code, _, err = run(cli, "init", "--embed-dim", "8", "--num-heads", "2", "--dropout", "1e-320", "--out", w)
    check("init --dropout 1e-320 (a subnormal) is accepted", code == 0, err.strip())
    code, out, err = run(cli, "inspect", w)
    check("... and stored as the subnormal", code == 0 and "e-321" in out, f"{err.strip()!r} {out!r}")
    code, _, err = run(cli, "train", "--steps", "1", "--dropout", "1e-320", "--weight-decay", "4e-324",
                       "--checkpoint-out", os.path.join(work, "sub.safetensors"))
    check("train --dropout 1e-320 --weight-decay 4e-324 are accepted", code == 0, err.strip())
    for argv, words in (
            (["init", "--embed-dim", "8", "--num-heads", "2", "--dropout", "1e999", "--out", w + ".x"],
             "--dropout: expected a probability in [0, 1], got '1e999'"),
            (["init", "--embed-dim", "8", "--num-heads", "2", "--dropout", "nan", "--out", w + ".x"],
             "--dropout: expected a probability in [0, 1], got 'nan'"),
            (["train", "--weight-decay", "inf", "--steps", "1"], "--weight-decay: expected a finite number >= 0, got 'inf'"),
            (["train", "--beta1", "1", "--steps", "1"], "--beta1: expected beta1 in [0, 1), got '1'"),
            (["forward", "--softcap", "1e-400"], "--softcap: expected a finite number > 0, got '1e-400'")):
        code, _, err = run(cli, *argv)
        problem = one_error_line(code, err, words)
        check(f"{' '.join(argv[:1] + argv[-4:])}: refused", not problem, problem)


def test_no_args(cli):
    code, out, err = run(cli)
    lines = out.splitlines()
    listed = all(any(re.match(rf"\s+{sub}\s+\S", line) for line in lines) for sub in EXPECTED_DEFAULTS)
    ok = (code == 0 and listed and "multihead demo" in out and "--help" in out and "attention of" not in out
          and not err and len(lines) <= 20)
    check("multihead alone prints a short usage and exits 0", ok, f"exit {code}, stderr {err!r}, stdout {out!r}")


def test_verbose(cli, work):
    w, q, _ = make_inputs(cli, work)
    code, err, out = forward_bytes(cli, w, q, "--verbose")
    line_ok = (code == 0 and len(err.strip().split("\n")) == 1 and err.startswith("multihead forward:")
               and all(word in err for word in ("(3, 2, 8)", "float32", "kernel auto", "form fused", " ms")))
    check("forward --verbose: one summary line on stderr", line_ok, f"exit {code}, stderr {err!r}")
    _, err_quiet, out_quiet = forward_bytes(cli, w, q)
    check("forward without --verbose: stderr empty, same bytes", err_quiet == "" and out_quiet == out,
          f"stderr {err_quiet!r}")
    code, out, err = run(cli, "init", "--embed-dim", "8", "--num-heads", "2", "--verbose", "--out",
                         os.path.join(work, "v.safetensors"))
    ok = (code == 0 and out == "" and err.startswith("multihead init:") and len(err.strip().split("\n")) == 1
          and "embed_dim 8" in err and "num_heads 2" in err)
    check("init --verbose: one summary line on stderr", ok, f"exit {code}, stderr {err!r}")


def test_full_stdout(cli, work):
    """Text on a standard output that cannot take it (> /dev/full) is an
    error, exit 2 with one line, never a silent exit 0."""
    w, _, _ = make_inputs(cli, work)
    for args in (["inspect", w], ["--version"], ["forward", "--help"], [], ["demo"]):
        with open("/dev/full", "wb") as full:
            r = subprocess.run([cli, *args], stdout=full, stderr=subprocess.PIPE, timeout=120)
        err = r.stderr.decode("utf-8", "replace")
        problem = one_error_line(r.returncode, err, "standard output", "No space left on device")
        check(f"multihead {' '.join(args) or '(no arguments)'} > /dev/full: exit 2", not problem, problem)


def test_environment(cli, work):
    w, q, _ = make_inputs(cli, work)
    commands = {
        "forward f32": ["forward", "--weights", w, "--query", q, "--out", os.path.join(work, "e.npy")],
        "forward bf16": ["forward", "--weights", w, "--query", q, "--out", os.path.join(work, "e.npy"), "--dtype", "bf16"],
        "decode": ["decode", "--embed-dim", "8", "--num-heads", "2", "--prompt-len", "2", "--tokens", "1"],
        "bench": ["bench", "--seq-len", "4", "--embed-dim", "8", "--num-heads", "2", "--repeat", "1", "--warmup", "0"],
    }
    for var, values in (("MULTIHEAD_NARROW_GEMV", "auto, gemm"), ("MULTIHEAD_FUSED_PATHS", "auto, plain"),
                        ("MULTIHEAD_KERNEL", "flash"), ("MULTIHEAD_SIMD_TARGET", "garbage"),
                        ("MULTIHEAD_BF16_DOT", "dpbf16"), ("MULTIHEAD_BACKWARD_HEADS", "auto, views"),
                        ("MULTIHEAD_BF16_BACKWARD", "auto, copies"), ("MULTIHEAD_F16_GEMM", "auto, widen, bf16x3"),
                        ("MULTIHEAD_NARROW_ATTENTION", "auto, flash, matmul")):
        env = dict(os.environ, **{var: "garbage"})
        for name, argv in commands.items():
            r = subprocess.run([cli, *argv], capture_output=True, text=True, timeout=120, env=env)
            problem = one_error_line(r.returncode, r.stderr, var, "garbage")
            check(f"{var}=garbage fails {name} in one line naming it", not problem, problem)
        # A hostile value: its newline and the quote that could close it escaped.
        env = dict(os.environ, **{var: "gar' bage\n"})
        r = subprocess.run([cli, *commands["forward bf16"]], capture_output=True, text=True, timeout=120, env=env)
        problem = one_error_line(r.returncode, r.stderr, var, "gar\\x27 bage\\x0a")
        check(f"{var} with a quote and a newline fails in one line, escaped", not problem, problem)


def test_truncated_while_read(cli, work):
    """A 40 MB weights file truncated 0.05 s after `decode` starts reading it: status 0 (it finished first) or 2
    with one line, never a signal (the mapped pages vanish: SIGBUS, which the CLI turns into an error)."""
    import time
    big = os.path.join(work, "big.safetensors")
    subprocess.run([cli, "init", "--embed-dim", "2048", "--num-heads", "16", "--num-kv-heads", "16", "--out", big],
                   check=True)
    data = open(big, "rb").read()
    outcomes = []
    for delay in (0.02, 0.05, 0.1):
        victim = os.path.join(work, "victim.safetensors")
        with open(victim, "wb") as f:
            f.write(data)
        p = subprocess.Popen([cli, "decode", "--weights", victim, "--prompt-len", "2", "--tokens", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        os.truncate(victim, 1000000)
        _, err = p.communicate(timeout=120)
        outcomes.append((p.returncode, err.strip()))
    bad = [o for o in outcomes if not (o[0] == 0 or (o[0] == 2 and len(o[1].splitlines()) == 1 and (
        "became shorter while it was read" in o[1] or "victim.safetensors" in o[1])))]
    check("an input truncated while read: status 0 or one line and status 2, never a signal", not bad,
          f"{bad} (all: {outcomes})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--cmakelists", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    cli = os.path.abspath(args.multihead)
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    test_version(cli, args.cmakelists)
    test_help_defaults(cli)
    test_did_you_mean(cli)
    test_hints(cli)
    test_enum_case(cli, work)
    test_real_numbers(cli, work)
    test_no_args(cli)
    test_verbose(cli, work)
    test_full_stdout(cli, work)
    test_environment(cli, work)
    test_truncated_while_read(cli, work)
    print(f"\n{len(PASSED)} passed, {len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
