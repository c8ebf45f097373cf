"""`multihead init` must write a file PyTorch can load.

For each configuration: run `multihead init`, read the safetensors file by
hand, build torch.nn.MultiheadAttention from its metadata and shapes,
load_state_dict(strict=True), then compare the module's forward with
`multihead forward` on the same file. Also checks that the file is F32, that
the same seed gives the same bytes and another seed different ones, and that
the values follow PyTorch's _reset_parameters (zero biases, xavier_uniform_
bounds on the input projections, kaiming_uniform_(a=√5) on out_proj.weight).
"""
import math
import os
import shlex
import subprocess

import numpy as np
import torch

import safetensors_io
from compare import compare

INIT_CONFIGS = [
    dict(E=8, H=2),
    dict(E=6, H=3, kdim=5, vdim=7, batch_first=True),
    dict(E=5, H=1, bias=False, add_bias_kv=True),
    dict(E=12, H=4, kdim=12, vdim=3, add_bias_kv=True, add_zero_attn=True),
    dict(E=16, H=8, batch_first=True, bias=False),
    dict(E=1, H=1, add_zero_attn=True),
]


def _init_cmd(cli, cfg, seed, out):
    cmd = [cli, "init", "--embed-dim", str(cfg["E"]), "--num-heads", str(cfg["H"])]
    if "kdim" in cfg:
        cmd += ["--kdim", str(cfg["kdim"]), "--vdim", str(cfg["vdim"])]
    if not cfg.get("bias", True):
        cmd.append("--no-bias")
    if cfg.get("add_bias_kv"):
        cmd.append("--add-bias-kv")
    if cfg.get("add_zero_attn"):
        cmd.append("--add-zero-attn")
    if cfg.get("batch_first"):
        cmd.append("--batch-first")
    return cmd + ["--seed", str(seed), "--out", out]


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _meta_bool(meta, key):
    return meta.get(key, "false").strip().lower() == "true"


def _distribution_problems(tensors, E):
    problems = []
    for name in ("in_proj_bias", "out_proj.bias"):
        if name in tensors and np.any(tensors[name][0] != 0):
            problems.append(f"{name} not zero (PyTorch initialises biases to 0)")
    bounds = {"out_proj.weight": 1 / math.sqrt(E)}  # kaiming_uniform_(a=√5): 1/√fan_in
    if "in_proj_weight" in tensors:
        bounds["in_proj_weight"] = math.sqrt(6 / (E + 3 * E))  # xavier_uniform_ on (3E, E)
    for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
        if name in tensors:
            fan_out, fan_in = tensors[name][0].shape
            bounds[name] = math.sqrt(6 / (fan_in + fan_out))
    for name, bound in bounds.items():
        w = tensors[name][0]
        if np.max(np.abs(w)) > bound * (1 + 1e-6):
            problems.append(f"{name}: max |w| {np.max(np.abs(w)):.4g} exceeds the init bound {bound:.4g}")
        if w.size >= 64 and not (0.7 < np.std(w) / (bound / math.sqrt(3)) < 1.3):
            problems.append(f"{name}: std {np.std(w):.4g}, uniform(±{bound:.4g}) has {bound / math.sqrt(3):.4g}")
    for name in ("bias_k", "bias_v"):
        if name in tensors and not np.any(tensors[name][0] != 0):
            problems.append(f"{name} is all zero (PyTorch uses xavier_normal_)")
    return problems


def check_one(cli, workdir, i, cfg, tol):
    """Returns a list of problems (empty = pass) and the commands run."""
    d = os.path.join(workdir, f"init{i}")
    os.makedirs(d, exist_ok=True)
    wpath = os.path.join(d, "W.safetensors")
    cmd = _init_cmd(cli, cfg, 1000 + i, wpath)
    r = _run(cmd)
    if r.returncode != 0:
        return [f"init exited {r.returncode}: {r.stderr.strip()}"], [cmd]
    problems = []
    tensors, meta = safetensors_io.read(wpath)
    bad = [f"{k}:{dt}" for k, (_, dt) in tensors.items() if dt != "F32"]
    if bad:
        problems.append(f"tensors not F32: {bad}")
    for key in ("num_heads", "batch_first", "add_zero_attn"):
        if key not in meta:
            problems.append(f"metadata lacks {key!r} (has {sorted(meta)})")
    # Same seed -> same bytes; another seed -> other values.
    again, other = os.path.join(d, "W_again.safetensors"), os.path.join(d, "W_other.safetensors")
    _run(_init_cmd(cli, cfg, 1000 + i, again))
    _run(_init_cmd(cli, cfg, 2000 + i, other))
    with open(wpath, "rb") as f1, open(again, "rb") as f2:
        if f1.read() != f2.read():
            problems.append("same --seed gave different files")
    if os.path.exists(other) and cfg["E"] > 1 and \
            safetensors_io.read(other)[0]["out_proj.weight"][0].tolist() == tensors["out_proj.weight"][0].tolist():
        problems.append("different --seed gave the same out_proj.weight")
    problems += _distribution_problems(tensors, cfg["E"])

    E = tensors["out_proj.weight"][0].shape[0]
    H = int(meta.get("num_heads", cfg["H"]))
    batch_first = _meta_bool(meta, "batch_first")
    add_zero_attn = _meta_bool(meta, "add_zero_attn")
    kdim = tensors["k_proj_weight"][0].shape[1] if "k_proj_weight" in tensors else E
    vdim = tensors["v_proj_weight"][0].shape[1] if "v_proj_weight" in tensors else E
    if (E, H, kdim, vdim, batch_first, add_zero_attn) != (
            cfg["E"], cfg["H"], cfg.get("kdim", cfg["E"]), cfg.get("vdim", cfg["E"]),
            cfg.get("batch_first", False), cfg.get("add_zero_attn", False)):
        problems.append(f"file describes E={E} H={H} kdim={kdim} vdim={vdim} batch_first={batch_first} "
                        f"add_zero_attn={add_zero_attn}, asked for {cfg}")
    module = torch.nn.MultiheadAttention(
        E, H, dropout=float(meta.get("dropout", "0")), bias="out_proj.bias" in tensors,
        add_bias_kv="bias_k" in tensors, add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
        batch_first=batch_first)
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, (v, _) in tensors.items()}
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        return problems + [f"load_state_dict(strict=True) failed: {' '.join(str(e).split())}"], [cmd]
    module = module.double().eval()

    rng = np.random.default_rng(i)
    L, S, B = 3, 4, 2
    lay = (lambda n, w: (B, n, w)) if batch_first else (lambda n, w: (n, B, w))
    q, k, v = (rng.standard_normal(lay(L, E)), rng.standard_normal(lay(S, kdim)),
               rng.standard_normal(lay(S, vdim)))
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(os.path.join(d, f"{name}.npy"), x)
    out, aw = os.path.join(d, "out.npy"), os.path.join(d, "attn_weights.npy")
    fwd = [cli, "forward", "--weights", wpath, "--query", os.path.join(d, "q.npy"),
           "--key", os.path.join(d, "k.npy"), "--value", os.path.join(d, "v.npy"),
           "--need-weights", "--out", out, "--attn-weights-out", aw]
    r = _run(fwd)
    if r.returncode != 0:
        return problems + [f"forward exited {r.returncode}: {r.stderr.strip()}"], [cmd, fwd]
    with torch.no_grad():
        t_out, t_w = module(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), need_weights=True)
    for label, ours, ref in (("output", np.load(out), t_out.numpy()), ("weights", np.load(aw), t_w.numpy())):
        ok, rel, detail = compare(ours, ref, tol)
        if not ok:
            problems.append(f"{label} vs torch module: {detail}")
    return problems, [cmd, fwd]


def run_all(cli, workdir, tol, log):
    failures = 0
    for i, cfg in enumerate(INIT_CONFIGS):
        problems, cmds = check_one(cli, workdir, i, cfg, tol)
        name = "INIT(" + ",".join(f"{k}={v}" for k, v in cfg.items()) + ")"
        if problems:
            failures += 1
            for p in problems:
                log(f"FAIL {name}: {p}")
            for c in cmds:
                log(f"  rerun: {shlex.join(c)}")
        else:
            log(f"ok   {name}: loads into torch.nn.MultiheadAttention (strict), forward matches")
    return len(INIT_CONFIGS), failures
