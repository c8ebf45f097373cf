#!/usr/bin/python3
"""The whole training model against a PyTorch copy of it, on one batch.

For each configuration in CASES:
  1. `multihead train --steps 0 --checkpoint-out ck --dump-gradients g`
     writes the initial checkpoint and, for the first batch, the tokens,
     targets, mask, our loss and every parameter gradient (float32 model).
  2. The same model is built here from nn.Embedding, nn.MultiheadAttention
     (batch_first), nn.LayerNorm, nn.Sequential(nn.Linear, nn.ReLU,
     nn.Linear) and nn.Linear, in float64; it loads the checkpoint's
     parameters with load_state_dict(strict=True) (the optimizer.* state
     left out), which also checks that our names are PyTorch's.
  3. Loss by F.cross_entropy over the masked positions; autograd gradients.
Checks: |loss_ours - loss_torch| / loss_torch < 1e-5 and, for every
parameter, ||g_ours - g_torch|| / ||g_torch|| < 1e-4 (norm-wise: single
tiny elements carry no meaning at float32). Both bounds are float32's:
ours runs in float32 (~6e-8 per rounding, a few hundred roundings deep),
PyTorch in float64 from the same float32 parameters.
The positional encoding is written here from Vaswani et al. §3.5, not read
from the library.

Usage: /usr/bin/python3 tests/train/torch_model.py --multihead PATH --workdir DIR
Prints each case's worst errors and `N cases, worst loss error …, worst gradient error …`.
"""
import argparse
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import safetensors_io  # noqa: E402

LOSS_BOUND = 1e-5
GRAD_BOUND = 1e-4

# (name, flags): each a different shape of the model.
CASES = [
    ("reverse-2layers-ff", ["--task", "reverse", "--symbols", "7", "--length", "9", "--layers", "2",
                            "--d-model", "16", "--heads", "4", "--ff", "24", "--batch", "5", "--seed", "3"]),
    ("copy-1layer-noff-causal", ["--task", "copy", "--symbols", "11", "--length", "6", "--layers", "1",
                                 "--d-model", "12", "--heads", "3", "--ff", "0", "--causal", "--batch", "4",
                                 "--seed", "8"]),
    ("reverse-3layers-1head", ["--task", "reverse", "--symbols", "5", "--length", "13", "--layers", "3",
                               "--d-model", "8", "--heads", "1", "--ff", "16", "--batch", "3", "--seed", "21"]),
]


def sinusoidal(length, width):
    pe = np.zeros((length, width))
    for p in range(length):
        for i in range(0, width, 2):
            angle = p / 10000 ** (i / width)
            pe[p, i] = math.sin(angle)
            if i + 1 < width:
                pe[p, i + 1] = math.cos(angle)
    return torch.from_numpy(pe)


class Block(nn.Module):
    def __init__(self, E, H, F_):
        super().__init__()
        self.norm1 = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)
        if F_ > 0:
            self.norm2 = nn.LayerNorm(E)
            self.ff = nn.Sequential(nn.Linear(E, F_), nn.ReLU(), nn.Linear(F_, E))
        self.has_ff = F_ > 0

    def forward(self, x, attn_mask):
        a = self.norm1(x)
        x = x + self.attn(a, a, a, attn_mask=attn_mask, need_weights=False)[0]
        if self.has_ff:
            x = x + self.ff(self.norm2(x))
        return x


class Encoder(nn.Module):
    """multihead/train.hpp's model: pre-LN blocks, norm_f, read-out."""

    def __init__(self, V, L, E, H, F_, layers, causal):
        super().__init__()
        self.embedding = nn.Embedding(V, E)
        self.blocks = nn.ModuleList([Block(E, H, F_) for _ in range(layers)])
        self.norm_f = nn.LayerNorm(E)
        self.readout = nn.Linear(E, V)
        self.register_buffer("pe", sinusoidal(L, E), persistent=False)
        self.causal = causal
        self.L = L

    def forward(self, tokens):
        x = self.embedding(tokens) + self.pe
        mask = torch.triu(torch.ones(self.L, self.L, dtype=torch.bool), diagonal=1) if self.causal else None
        for b in self.blocks:
            x = b(x, mask)
        return self.readout(self.norm_f(x))


def rel(a, b):
    d = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / d) if d > 0 else float(np.linalg.norm(a))


def run_case(cli, workdir, name, flags):
    ck = os.path.join(workdir, f"{name}.ck.safetensors")
    dump = os.path.join(workdir, f"{name}.grad.safetensors")
    r = subprocess.run([cli, "train", *flags, "--steps", "0", "--checkpoint-out", ck, "--dump-gradients", dump],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return [f"multihead train exit {r.returncode}: {r.stderr.strip()}"], 0, 0, 0
    params, meta = safetensors_io.read(ck)
    grads, gmeta = safetensors_io.read(dump)
    V, L = int(meta["vocabulary"]), int(meta["sequence_length"])
    model = Encoder(V, L, int(meta["d_model"]), int(meta["heads"]), int(meta["ff"]), int(meta["layers"]),
                    meta["causal"] == "true").double()
    state = {k: torch.from_numpy(v) for k, (v, _) in params.items() if not k.startswith("optimizer.")}
    model.load_state_dict(state, strict=True)
    model.train()  # dropout 0: train and eval compute the same
    tokens = torch.from_numpy(grads["tokens"][0].astype(np.int64))
    targets = torch.from_numpy(grads["targets"][0].astype(np.int64))
    mask = torch.from_numpy(grads["mask"][0] != 0)
    logits = model(tokens)
    loss = F.cross_entropy(logits[mask], targets[mask])
    loss.backward()
    problems = []
    ours = float(gmeta["loss"])
    loss_err = abs(ours - loss.item()) / abs(loss.item())
    if not loss_err < LOSS_BOUND:
        problems.append(f"loss {ours!r} vs torch {loss.item()!r}: error {loss_err:.3g} > {LOSS_BOUND}")
    worst, worst_name, count = 0.0, "", 0
    torch_grads = {k: p.grad for k, p in model.named_parameters()}
    if set("grad." + k for k in torch_grads) != {k for k in grads if k.startswith("grad.")}:
        problems.append(f"gradient names differ: torch {sorted(torch_grads)}, ours "
                        f"{sorted(k for k in grads if k.startswith('grad.'))}")
    for k, g in torch_grads.items():
        mine = grads.get("grad." + k)
        if mine is None:
            continue
        count += 1
        e = rel(mine[0], g.numpy())
        if e > worst:
            worst, worst_name = e, k
        if not e < GRAD_BOUND:
            problems.append(f"{k}: gradient error {e:.3g} > {GRAD_BOUND}")
    print(f"{'ok  ' if not problems else 'FAIL'} {name}: loss {ours:.6f} (error {loss_err:.2g}), "
          f"{count} gradients, worst {worst:.2g} ({worst_name})")
    for p in problems:
        print(f"     {p}")
    return problems, loss_err, worst, count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multihead", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    failures, worst_loss, worst_grad, grads = 0, 0.0, 0.0, 0
    for name, flags in CASES:
        problems, le, ge, n = run_case(args.multihead, args.workdir, name, flags)
        failures += bool(problems)
        worst_loss, worst_grad, grads = max(worst_loss, le), max(worst_grad, ge), grads + n
    print(f"{len(CASES)} cases, {grads} gradients: worst loss error {worst_loss:.3g} (bound {LOSS_BOUND}), "
          f"worst gradient error {worst_grad:.3g} (bound {GRAD_BOUND}); {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
