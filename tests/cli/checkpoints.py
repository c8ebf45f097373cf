#!/usr/bin/python3
"""PyTorch checkpoints as they are, through `multihead inspect` and `forward`.

The checkpoints are written by the script in README.md's "Coming from
PyTorch" section, taken from the README's text, so that the documented
script and the documented commands are the ones tested:
  - the README's own example (an nn.Transformer, run as-is in the work
    folder): `inspect` lists its four attention modules, and the README's
    `multihead forward --prefix …` line runs to parity with PyTorch;
  - a small model holding two nn.MultiheadAttention of different
    configurations, one batch_first, one with kdim/vdim and bias_k/v, in
    float64, and int64 and uint8 buffers: `inspect` shows each module and
    lists the buffers with their dtypes, `--prefix` runs each module to
    parity (1e-12, as tests/parity for float64 queries: docs/parity.md);
  - without --prefix the file is refused with the prefixes that would work;
  - a batch_first state_dict without metadata: the stderr note (exact text),
    and none for a field given by a flag;
  - the layout hint for shapes that fit only the other layout, and not for a
    plain wrong shape;
  - each reader given another format names it (.npy, safetensors, the
    torch.save zip and the legacy pickle);
  - a 10 GiB file with a bad header (or a good header and 10 GiB of
    padding) is refused in seconds and a bounded peak by every reader:
    train --resume, inspect, explain --model, forward, decode, and Python's
    load_weights (peak resident set from wait4).

Usage: /usr/bin/python3 tests/cli/checkpoints.py --multihead PATH --workdir DIR [--readme README.md]
Prints one line per check and `N passed, M failed`; exit 1 on any failure.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
import compare  # noqa: E402
import reference  # noqa: E402
import safetensors_io  # noqa: E402

TOL64, TOL32 = 1e-12, 1e-5  # docs/parity.md, "Criterion and tolerance"


# ---- the README's text ------------------------------------------------------------
def readme_blocks(readme):
    """The fenced blocks of the "Coming from PyTorch" section: {language: [text, …]}."""
    text = open(readme, encoding="utf-8").read()
    start = text.index("## Coming from PyTorch")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else None]
    blocks = {}
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S):
        blocks.setdefault(lang, []).append(body)
    return blocks


class Env:
    def __init__(self, cli, workdir, readme):
        self.cli, self.dir = cli, workdir
        blocks = readme_blocks(readme)
        self.script = blocks["python"][0]
        self.commands = [line for line in blocks["sh"][0].splitlines() if line.startswith("multihead ")]
        self.note_example = blocks[""][0].strip()
        # Runs the README's script where its output file is to be written:
        # it defines save_safetensors and builds and saves its example model.
        self.ns = {}
        cwd = os.getcwd()
        os.chdir(workdir)
        try:
            torch.manual_seed(0)
            exec(compile(self.script, "README.md (Coming from PyTorch)", "exec"), self.ns)
        finally:
            os.chdir(cwd)
        self.save = self.ns["save_safetensors"]

    def path(self, name):
        return os.path.join(self.dir, name)

    def run(self, *args):
        r = subprocess.run([self.cli, *args], capture_output=True, text=True, cwd=self.dir, timeout=120)
        return r.returncode, r.stdout, r.stderr


# ---- references -------------------------------------------------------------------
def module_params(mha):
    return {k: v.detach().to(torch.float64).numpy() for k, v in mha.state_dict().items()}


def torch_reference(mha, q, k, v):
    """F.multi_head_attention_forward in float64 on the module's parameters;
    inputs and output in the module's layout."""
    t = [torch.from_numpy(np.asarray(x, dtype=np.float64)) for x in (q, k, v)]
    if mha.batch_first:
        t = [x.transpose(0, 1) for x in t]
    out, _ = reference.torch_forward(*t, module_params(mha), mha.num_heads, mha.add_zero_attn, None,
                                     need_weights=False)
    return (out.transpose(0, 1) if mha.batch_first else out).numpy()


def expect_one_error_line(code, stderr, what):
    problems = []
    if code != 2:
        problems.append(f"{what}: exit {code}, expected 2 ({stderr.strip()!r})")
    if stderr.count("\n") != 1:
        problems.append(f"{what}: stderr has {stderr.count(chr(10))} lines, expected 1: {stderr!r}")
    return problems


# ---- the two-module model -----------------------------------------------------------
class TwoAttentions(torch.nn.Module):
    """Two attention modules of different configurations in one model."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        self.b = torch.nn.MultiheadAttention(12, 3, kdim=5, vdim=7, add_bias_kv=True)
        self.head = torch.nn.Linear(16, 2)
        self.register_buffer("steps", torch.tensor(3))  # int64, as BatchNorm's num_batches_tracked
        self.register_buffer("keep", torch.ones(2, 3, dtype=torch.uint8))  # a uint8 mask buffer


def two_attentions(env):
    path = env.path("two.safetensors")
    if not hasattr(env, "two"):
        torch.manual_seed(1)
        model = TwoAttentions().double().eval()
        env.save(model, path)
        env.two = model
    return env.two, path


# ---- checks -------------------------------------------------------------------------
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def module_block(stdout, prefix):
    """The lines `inspect` prints for the module at `prefix`."""
    lines = stdout.splitlines()
    i = lines.index("  " + prefix)
    block = []
    for line in lines[i + 1:]:
        if not line.startswith("    "):
            break
        block.append(line.split())
    return {row[0]: row[1:] for row in block}


@check
def readme_example_inspect(env):
    """inspect lists the README model's attention modules, prefixes and sizes."""
    args = shlex.split(env.commands[0])[1:]
    code, out, err = env.run(*args)
    if code != 0:
        return [f"`{env.commands[0]}`: exit {code}: {err.strip()}"]
    want = ["decoder.layers.0.multihead_attn.", "decoder.layers.0.self_attn.",
            "encoder.layers.0.self_attn.", "encoder.layers.1.self_attn."]
    listed = re.search(r"MultiheadAttention modules \((\d+)\):", out)
    problems = [] if listed and int(listed.group(1)) == 4 else [f"module count line wrong:\n{out}"]
    for prefix in want:
        try:
            rows = module_block(out, prefix)
        except ValueError:
            problems.append(f"module {prefix} not listed")
            continue
        for key, value in (("embed_dim", "64"), ("num_heads", "8"), ("batch_first", "true"), ("bias", "true")):
            if rows.get(key, [None])[0] != value:
                problems.append(f"{prefix}: {key} {rows.get(key)}, expected {value}")
    if "encoder.layers.0.linear1.weight" not in out:
        problems.append("tensor list lacks encoder.layers.0.linear1.weight")
    return problems


@check
def readme_example_forward(env):
    """The README's forward line runs encoder.layers.0.self_attn to parity (float32)."""
    model = env.ns["model"]
    x = np.random.default_rng(2).standard_normal((2, 5, 64)).astype(np.float32)
    np.save(env.path("x.npy"), x)
    code, _, err = env.run(*shlex.split(env.commands[1])[1:])
    if code != 0:
        return [f"`{env.commands[1]}`: exit {code}: {err.strip()}"]
    ours = np.load(env.path("y.npy"))
    ok, rel, detail = compare.compare(ours, torch_reference(model.encoder.layers[0].self_attn, x, x, x), TOL32)
    return [] if ok else [f"output: {detail}"]


@check
def two_modules_inspect(env):
    """inspect shows each module of the two-module model with its own configuration."""
    _, path = two_attentions(env)
    code, out, err = env.run("inspect", path)
    if code != 0:
        return [f"inspect: exit {code}: {err.strip()}"]
    problems = []
    want = {"a.": {"embed_dim": "16", "kdim": "16", "vdim": "16", "num_heads": "4", "batch_first": "true",
                   "add_bias_kv": "false"},
            "b.": {"embed_dim": "12", "kdim": "5", "vdim": "7", "num_heads": "3", "batch_first": "false",
                   "add_bias_kv": "true"}}
    for prefix, fields in want.items():
        rows = module_block(out, prefix)
        for key, value in fields.items():
            if rows.get(key, [None])[0] != value:
                problems.append(f"{prefix}: {key} {rows.get(key)}, expected {value}")
    if "MultiheadAttention modules (2):" not in out:
        problems.append(f"expected 2 modules:\n{out}")
    # The README's script writes the integer buffers with their own dtypes,
    # and inspect lists them in the one table of tensors.
    for name, dtype, shape in (("steps", "int64", "()"), ("keep", "uint8", "(2, 3)")):
        if not re.search(rf"^  {name} +{dtype} +{re.escape(shape)}$", out, flags=re.M):
            problems.append(f"tensor list lacks `{name}  {dtype}  {shape}`:\n{out}")
    return problems


@check
def two_modules_forward_parity(env):
    """--prefix a. (batch_first, self-attention) and --prefix b. (kdim/vdim, bias_k/v) match PyTorch in float64."""
    model, path = two_attentions(env)
    rng = np.random.default_rng(3)
    problems = []
    qa = rng.standard_normal((2, 4, 16))  # (B, L, E): a is batch_first
    qb, kb, vb = rng.standard_normal((4, 2, 12)), rng.standard_normal((6, 2, 5)), rng.standard_normal((6, 2, 7))
    cases = (("a.", model.a, ["--query", "qa.npy"], (qa, qa, qa)),
             ("b.", model.b, ["--query", "qb.npy", "--key", "kb.npy", "--value", "vb.npy"], (qb, kb, vb)))
    for name, array in (("qa", qa), ("qb", qb), ("kb", kb), ("vb", vb)):
        np.save(env.path(name + ".npy"), array)
    for prefix, mha, inputs, (q, k, v) in cases:
        code, _, err = env.run("forward", "--weights", path, "--prefix", prefix, *inputs, "--out", "o.npy")
        if code != 0 or err:
            problems.append(f"--prefix {prefix}: exit {code}, stderr {err.strip()!r} (expected 0 and nothing)")
        if code != 0:
            continue
        ok, rel, detail = compare.compare(np.load(env.path("o.npy")), torch_reference(mha, q, k, v), TOL64)
        if not ok:
            problems.append(f"--prefix {prefix}: {detail}")
    return problems


@check
def prefix_required_for_many_modules(env):
    """Without --prefix (or with a wrong one) the error lists the prefixes that would work."""
    _, path = two_attentions(env)
    np.save(env.path("q16.npy"), np.zeros((2, 4, 16)))
    problems = []
    want_tail = "; this file holds MultiheadAttention modules at prefixes a., b. (pass one as --prefix)\n"
    code, _, err = env.run("forward", "--weights", path, "--query", "q16.npy", "--out", "o.npy")
    problems += expect_one_error_line(code, err, "no --prefix")
    if not (err.startswith("multihead: error: a.in_proj_bias: unexpected tensor") and err.endswith(want_tail)):
        problems.append(f"no --prefix: message {err!r} does not end with {want_tail!r}")
    code, _, err = env.run("forward", "--weights", path, "--prefix", "c", "--query", "q16.npy", "--out", "o.npy")
    problems += expect_one_error_line(code, err, "--prefix c")
    want = f"multihead: error: --prefix: expected the start of a tensor name (in '{path}'), got 'c.'" + want_tail
    if err != want:
        problems.append(f"--prefix c: message {err!r}, expected {want!r}")
    return problems


def bare_batch_first(env):
    """A batch_first module's state_dict with no metadata at all, as a plain
    torch -> safetensors export writes it."""
    path = env.path("bare.safetensors")
    torch.manual_seed(4)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    safetensors_io.write(path, {k: (v, "F64") for k, v in module_params(mha).items()})
    return mha, path


def note(path, fields):
    flags = {"batch_first": "--batch-first", "add_zero_attn": "--add-zero-attn", "dropout": "--dropout"}
    values = {"batch_first": "false", "add_zero_attn": "false", "dropout": "0"}
    return ("multihead: note: assumed " + ", ".join(f"{f}={values[f]}" for f in fields) +
            f" (not in {path}'s __metadata__; set them with " + ", ".join(flags[f] for f in fields) + ")\n")


@check
def assumed_settings_note(env):
    """No metadata: the note names every assumed value, once; a flag removes its field."""
    mha, path = bare_batch_first(env)
    q = np.random.default_rng(5).standard_normal((3, 4, 8))  # (B, L, E)
    np.save(env.path("qbare.npy"), q)
    base = ["forward", "--weights", path, "--num-heads", "2", "--query", "qbare.npy", "--out", "o.npy"]
    problems = []
    code, _, err = env.run(*base)
    want = note(path, ["batch_first", "add_zero_attn", "dropout"])
    if code != 0 or err != want:
        problems.append(f"no flags: exit {code}, stderr {err!r}, expected 0 and {want!r}")
    code, _, err = env.run(*base, "--batch-first")
    want = note(path, ["add_zero_attn", "dropout"])
    if code != 0 or err != want:
        problems.append(f"--batch-first: exit {code}, stderr {err!r}, expected 0 and {want!r}")
    else:
        ok, _, detail = compare.compare(np.load(env.path("o.npy")), torch_reference(mha, q, q, q), TOL64)
        if not ok:
            problems.append(f"--batch-first output: {detail}")
    code, _, err = env.run(*base, "--batch-first", "--no-add-zero-attn", "--dropout", "0")
    if code != 0 or err:
        problems.append(f"every field given: exit {code}, stderr {err!r}, expected 0 and nothing")
    if env.note_example != note("mha.safetensors", ["batch_first", "add_zero_attn", "dropout"]).strip():
        problems.append(f"README's note example {env.note_example!r} is not what forward prints")
    return problems


@check
def layout_hint(env):
    """Shapes that fit only the other layout get the hint; a plain wrong shape does not."""
    _, path = bare_batch_first(env)
    rng = np.random.default_rng(6)
    files = {"q238": (2, 3, 8), "k258": (2, 5, 8), "q237": (2, 3, 7), "q328": (3, 2, 8)}
    for name, shape in files.items():
        np.save(env.path(name + ".npy"), rng.standard_normal(shape))
    np.save(env.path("kpm23.npy"), np.zeros((2, 3), dtype=bool))
    hint_bf = "; these shapes fit the batch-first layout (B, L, E): pass --batch-first\n"
    hint_sf = "; these shapes fit the sequence-first layout (L, B, E): pass --no-batch-first\n"
    w = ["forward", "--weights", path, "--num-heads", "2", "--out", "o.npy"]
    cases = [
        # (B, L, E) query with a (B, S) key_padding_mask, read as (L, B, E).
        ("key_padding_mask (B, S)", w + ["--query", "q238.npy", "--key-padding-mask", "kpm23.npy"],
         "multihead: error: key_padding_mask: expected shape (3, 2) = (B, S), got (2, 3)" + hint_bf),
        # A key whose batch matches only if the query is (B, L, E).
        ("key batch", w + ["--query", "q238.npy", "--key", "k258.npy", "--value", "k258.npy"],
         "multihead: error: key: expected shape (2, 3, 8), got (2, 5, 8)" + hint_bf),
        # Fits neither layout: key batch 2 is neither query dimension 3 nor
        # a batch of 5 for the sequence-first reading.
        ("fits neither", w + ["--batch-first", "--query", "q328.npy", "--key", "k258.npy", "--value", "k258.npy"],
         None),
        ("plain wrong width", w + ["--query", "q237.npy"], None),
    ]
    problems = []
    for what, argv, want in cases:
        code, _, err = env.run(*argv)
        problems += expect_one_error_line(code, err, what)
        if want is not None and err != want:
            problems.append(f"{what}: message {err!r}, expected {want!r}")
        if want is None and "batch_first=" in err:
            problems.append(f"{what}: hint given for a shape that fits no layout: {err!r}")
    # The reverse hint: key (5, 2, 8) seq-first, query (3, 2, 8) seq-first,
    # module told batch_first.
    np.save(env.path("k528.npy"), rng.standard_normal((5, 2, 8)))
    code, _, err = env.run(*w, "--batch-first", "--query", "q328.npy", "--key", "k528.npy", "--value", "k528.npy")
    problems += expect_one_error_line(code, err, "--no-batch-first hint")
    if not err.endswith(hint_sf):
        problems.append(f"--no-batch-first hint: message {err!r} does not end with {hint_sf!r}")
    return problems


@check
def other_formats_named(env):
    """Each reader, given another format, says what the file is."""
    torch.manual_seed(7)
    sd = torch.nn.MultiheadAttention(8, 2).state_dict()
    torch.save(sd, env.path("zip.pt"))
    torch.save(sd, env.path("pickle.pt"), _use_new_zipfile_serialization=False)
    np.save(env.path("arr.npy"), np.zeros((3, 2, 8), dtype=np.float32))
    env.save(torch.nn.MultiheadAttention(8, 2), env.path("one.safetensors"))
    fwd = ["forward", "--out", "o.npy"]
    cases = [
        (fwd + ["--weights", "arr.npy", "--query", "arr.npy"],
         "multihead: error: arr.npy: this is a .npy array, not a safetensors file\n"),
        (fwd + ["--weights", "zip.pt", "--query", "arr.npy"],
         "multihead: error: zip.pt: this is a PyTorch torch.save zip archive, not a safetensors file "
         "(save its state_dict as safetensors: README.md, 'Coming from PyTorch')\n"),
        (fwd + ["--weights", "pickle.pt", "--query", "arr.npy"],
         "multihead: error: pickle.pt: this is a Python pickle (legacy torch.save), not a safetensors file "
         "(save its state_dict as safetensors: README.md, 'Coming from PyTorch')\n"),
        (fwd + ["--weights", "one.safetensors", "--query", "one.safetensors"],
         "multihead: error: query (one.safetensors): this is a safetensors file, not a .npy array\n"),
        (fwd + ["--weights", "one.safetensors", "--query", "zip.pt"],
         "multihead: error: query (zip.pt): this is a PyTorch torch.save zip archive, not a .npy array\n"),
        (["inspect", "pickle.pt"],
         "multihead: error: pickle.pt: this is a Python pickle (legacy torch.save); "
         "inspect reads safetensors and .npy files\n"),
    ]
    problems = []
    for argv, want in cases:
        code, _, err = env.run(*argv)
        problems += expect_one_error_line(code, err, " ".join(argv))
        if err != want:
            problems.append(f"{' '.join(argv)}: message {err!r}, expected {want!r}")
    code, out, err = env.run("inspect", "arr.npy")
    if code != 0 or out != "arr.npy: .npy array\n  dtype  float32\n  shape  (3, 2, 8)\n":
        problems.append(f"inspect arr.npy: exit {code}, stdout {out!r}, stderr {err!r}")
    return problems


@check
def inspect_hostile_names(env):
    """inspect prints control bytes in names, metadata and the path as \\xNN: one table row per tensor."""
    names = ["clear\x1b[2J", "two\nlines", "nul\x00cut", "plain"]
    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    header["__metadata__"] = {"key\nline": "value\rback"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path = env.path("hostile\nname.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"\0" * (4 * len(names)))
    code, out, err = env.run("inspect", path)
    problems = []
    if code != 0:
        return [f"inspect: exit {code}: {err.strip()}"]
    controls = sorted({c for c in out if (ord(c) < 0x20 and c != "\n") or ord(c) == 0x7f})
    if controls:
        problems.append(f"stdout holds control bytes {controls!r}")
    for want in ("clear\\x1b[2J", "two\\x0alines", "nul\\x00cut", "key\\x0aline = value\\x0dback",
                 "hostile\\x0aname.safetensors: safetensors"):
        if want not in out:
            problems.append(f"stdout lacks {want!r}")
    rows = [line for line in out.splitlines() if line.startswith("  ") and "float32" in line]
    if len(rows) != len(names):
        problems.append(f"{len(rows)} tensor rows, expected {len(names)}: {out!r}")
    return problems


def run_measured(argv, cwd, env=None):
    """(exit code, stderr, seconds, peak resident KiB) of one child, the peak from wait4."""
    import time
    start = time.monotonic()
    with open(os.path.join(cwd, "measured.err"), "w+b") as err:
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            p.returncode = 0  # reaped by wait4: keep Popen from waiting again
        seconds = time.monotonic() - start
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    return os.waitstatus_to_exitcode(status), stderr, seconds, usage.ru_maxrss


@check
def huge_files_judged_by_header(env):
    """A 10 GiB file is refused by its header in bounded time and memory, by every reader (issue 22, defect 1)."""
    # Two sparse files (truncate -s: no disk blocks): header length 0, and a
    # valid one-tensor header followed by 10 GiB of zeros. Before the fix each
    # reader read the whole file first: ~20 s and ~10.5 GB peak. Bounds: 10 s
    # on a loaded machine, 300 MiB peak (the CLI itself needs ~12 MiB).
    ten_gib = 10 << 30
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    files = {"z.bin": struct.pack("<Q", 0), "padded.safetensors": struct.pack("<Q", len(header)) + header + bytes(4)}
    # What each says (inspect looks at the format first: a header length of 0
    # is no safetensors it knows).
    words = {"z.bin": ("header is not valid JSON", "file of unknown format"), "padded.safetensors": ("trailing data",)}
    np.save(env.path("q_huge.npy"), np.zeros((3, 2, 8), dtype=np.float32))
    py_env = dict(os.environ, PYTHONPATH=env.python_path)
    have_python = os.path.isdir(os.path.join(env.python_path, "multihead"))
    problems = []
    try:
        for name, head in files.items():
            path = env.path(name)
            with open(path, "wb") as f:
                f.write(head)
            os.truncate(path, ten_gib)
            runs = [
                [env.cli, "train", "--resume", name, "--steps", "3"],
                [env.cli, "inspect", name],
                [env.cli, "explain", "--model", name],
                [env.cli, "forward", "--weights", name, "--query", "q_huge.npy", "--out", "o_huge.npy"],
                [env.cli, "decode", "--weights", name, "--prompt-len", "1", "--tokens", "1"],
            ]
            if have_python:
                runs.append(["/usr/bin/python3", "-c", f"import multihead; multihead.load_weights({name!r})"])
            else:
                print(f"     (skipped Python's load_weights: no module under {env.python_path})")
            for argv in runs:
                what = f"{' '.join(os.path.basename(a) for a in argv[:3])} on {name}"
                code, err, seconds, peak_kib = run_measured(argv, env.dir, py_env)
                if argv[0] == "/usr/bin/python3":
                    # One exception, naming the file and the reason.
                    if code != 1 or f"{name}: " not in err or not any(w in err for w in words[name]):
                        problems.append(f"{what}: exit {code}, stderr {err[-300:]!r}")
                else:
                    problems += expect_one_error_line(code, err, what)
                    if name not in err or not any(w in err for w in words[name]):
                        problems.append(f"{what}: message {err!r} lacks {name!r} or {words[name]!r}")
                if seconds > 10 or peak_kib > 300 * 1024:
                    problems.append(f"{what}: {seconds:.1f} s, {peak_kib} KiB peak (bounds 10 s, 300 MiB)")
    finally:
        for name in files:
            if os.path.exists(env.path(name)):
                os.remove(env.path(name))
    return problems


@check
def one_module_of_a_huge_file(env):
    """A valid 3.3 GiB file costs the module it is asked for: inspect, forward --prefix and forward --num-kv-heads read names and that module only."""
    # One sparse file (its big tensors in a hole: no disk blocks): an MHA
    # module "enc.", a module nested under it ("enc.sub.", 256 MiB), a grouped-
    # query module "layers.1." (read as "--prefix layers.1") and a sibling
    # "layers.10." (1 GiB), and a
    # 2 GiB "big". Each command must succeed within 10 s and a 300 MiB peak
    # (decoding either big module, or the big tensor, to float64 would cost
    # 512 MiB or more).
    E, giant = 8, 16384  # a 16384 x 16384 float32 weight is 1 GiB
    rng = np.random.default_rng(4)
    header, blobs, offset = {"__metadata__": {"num_heads": "2"}}, [], 0

    def add(name, shape, values=None):
        nonlocal offset
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        if values is not None:
            blobs.append(values.astype("<f4").tobytes())
        offset += n

    add("enc.in_proj_weight", [3 * E, E], rng.standard_normal((3 * E, E)))
    add("enc.in_proj_bias", [3 * E], rng.standard_normal(3 * E))
    add("enc.out_proj.weight", [E, E], rng.standard_normal((E, E)))
    add("enc.out_proj.bias", [E], rng.standard_normal(E))
    for name, rows in (("q_proj", E), ("k_proj", E // 2), ("v_proj", E // 2), ("o_proj", E)):
        add(f"layers.1.{name}.weight", [rows, E], rng.standard_normal((rows, E)))
    small = offset  # everything after this lies in the hole
    add("enc.sub.in_proj_weight", [3 * giant // 4, giant // 4])  # E 4096: 192 MiB
    add("enc.sub.out_proj.weight", [giant // 4, giant // 4])
    add("layers.10.q_proj.weight", [giant, giant])
    add("big", [2 * giant, giant])
    body = json.dumps(header).encode()
    path = env.path("huge_model.safetensors")
    problems = []
    try:
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(body)) + body + b"".join(blobs))
            assert f.tell() == 8 + len(body) + small
        os.truncate(path, 8 + len(body) + offset)
        np.save(env.path("q_huge_model.npy"), rng.standard_normal((3, 1, E)).astype(np.float32))
        problems += run_one_module_commands(env)
    finally:
        if os.path.exists(path):
            os.remove(path)
    return problems


def run_one_module_commands(env):
    """one_module_of_a_huge_file's commands on its file: problems, or []."""
    runs = {
        "inspect": [env.cli, "inspect", "huge_model.safetensors"],
        "forward --prefix enc": [env.cli, "forward", "--weights", "huge_model.safetensors", "--prefix", "enc",
                                 "--query", "q_huge_model.npy", "--out", "o_huge_model.npy"],
        "forward --num-kv-heads --prefix layers.1": [
            env.cli, "forward", "--weights", "huge_model.safetensors", "--prefix", "layers.1", "--num-kv-heads", "1",
            "--query", "q_huge_model.npy", "--out", "o_huge_gqa.npy"],
    }
    problems = []
    for what, argv in runs.items():
        code, err, seconds, peak_kib = run_measured(argv, env.dir)
        if code != 0:
            problems.append(f"{what}: exit {code}: {err.strip()[-300:]}")
        if seconds > 10 or peak_kib > 300 * 1024:
            problems.append(f"{what}: {seconds:.1f} s, {peak_kib} KiB peak (bounds 10 s, 300 MiB)")
    out = subprocess.run(runs["inspect"], cwd=env.dir, capture_output=True, text=True, timeout=60).stdout
    for want in ("big", "layers.10.q_proj.weight", "enc.sub."):
        if want not in out:
            problems.append(f"inspect lacks {want!r}")
    return problems


def main():
    ap = argparse.ArgumentParser(description="PyTorch checkpoints through `multihead inspect` / `forward`")
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--readme", default=os.path.join(HERE, "..", "..", "README.md"))
    ap.add_argument("--only", nargs="*", help="check names (substring match)")
    ap.add_argument("--python-path", help="folder holding the built multihead Python package "
                    "(default: the build's python/ beside tools/)")
    args = ap.parse_args()
    workdir = os.path.abspath(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    env = Env(os.path.abspath(args.multihead), workdir, args.readme)
    env.python_path = os.path.abspath(args.python_path or os.path.join(
        os.path.dirname(os.path.abspath(args.multihead)), "..", "python"))
    passed = failed = 0
    for fn in CHECKS:
        if args.only and not any(o in fn.__name__ for o in args.only):
            continue
        try:
            problems = fn(env)
        except Exception as e:  # a crash in a check is a failure of that check
            problems = [f"{type(e).__name__}: {e}"]
        if problems:
            failed += 1
            print(f"FAIL {fn.__name__}: {fn.__doc__.strip()}")
            for p in problems:
                print(f"    {p}")
        else:
            passed += 1
            print(f"ok   {fn.__name__}: {fn.__doc__.strip()}")
    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
