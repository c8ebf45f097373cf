"""The grouped-query module's backward against PyTorch autograd in float64.

For each case this builds the module's computation from torch ops written
here (nn.Linear's x Wᵀ + b, the rotary formula in both conventions,
repeat_interleave of the K/V heads, scores with soft-cap, ALiBi, causal and
window masks, softmax, the weighted sum, the out-projection), runs
ℓ = Σ out ⊙ G backward in float64 and writes one safetensors file per case
(weights, x, G, the ALiBi slopes and torch's gradients "grad.<name>", the
configuration in the metadata). Then it runs the gtest
GqaBackwardTorch.MatchesAutogradFloat64 (tests/test_gqa_backward.cpp) with
MULTIHEAD_GQA_BACKWARD_TORCH_DIR pointing at the files.

Usage: gqa_backward_torch.py --tests path/to/multihead_tests --workdir DIR
"""
import argparse
import math
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

CASES = [
    # B, L, E, H, Hkv, D, bias, causal, rope, theta, window, softcap, alibi
    dict(B=2, L=5, E=8, H=4, Hkv=2, D=4, bias=False, causal=True, rope="half-split", theta=10000.0, window=0,
         softcap=0.0, alibi=False),
    dict(B=2, L=6, E=8, H=4, Hkv=1, D=4, bias=True, causal=True, rope="interleaved", theta=10000.0, window=3,
         softcap=2.0, alibi=True),
    dict(B=1, L=7, E=12, H=6, Hkv=3, D=2, bias=True, causal=False, rope="interleaved", theta=500000.0, window=0,
         softcap=0.0, alibi=True),
    dict(B=1, L=4, E=8, H=4, Hkv=4, D=4, bias=False, causal=False, rope="none", theta=10000.0, window=2,
         softcap=3.0, alibi=False),
]


def alibi_slopes(heads):
    # The paper's slopes (Press et al. 2022), as multihead::alibi_slopes.
    def power_of_two(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    closest = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(closest)
    if closest != heads:
        slopes += power_of_two(2 * closest)[0::2][: heads - closest]
    return slopes


def rope(x, conv, theta):
    # x (B, heads, L, D); positions 0 … L − 1.
    D, L = x.shape[-1], x.shape[-2]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = torch.arange(L, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (L, D/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if conv == "half-split":  # Hugging Face: x·cos + rotate_half(x)·sin
        cos2, sin2 = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        rotated = torch.cat([-x[..., D // 2:], x[..., : D // 2]], -1)
        return x * cos2 + rotated * sin2
    a, c = x[..., 0::2], x[..., 1::2]  # Meta's pairs (2i, 2i + 1)
    return torch.stack([a * cos - c * sin, a * sin + c * cos], -1).flatten(-2)


def forward(c, w, x):
    B, L, H, Hkv, D = c["B"], c["L"], c["H"], c["Hkv"], c["D"]
    lin = lambda t, name: t @ w[name + ".weight"].T + (w[name + ".bias"] if c["bias"] else 0)  # noqa: E731
    q = lin(x, "q_proj").view(B, L, H, D).transpose(1, 2)
    k = lin(x, "k_proj").view(B, L, Hkv, D).transpose(1, 2)
    v = lin(x, "v_proj").view(B, L, Hkv, D).transpose(1, 2)
    if c["rope"] != "none":
        q, k = rope(q, c["rope"], c["theta"]), rope(k, c["rope"], c["theta"])
    k = torch.repeat_interleave(k, H // Hkv, dim=1)  # Llama's repeat_kv order
    v = torch.repeat_interleave(v, H // Hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if c["softcap"] > 0:
        s = c["softcap"] * torch.tanh(s / c["softcap"])
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    if c["alibi"]:
        slopes = torch.tensor(alibi_slopes(H), dtype=torch.float64)[:, None, None]
        s = s - slopes * (i - j).abs().to(torch.float64)
    visible = torch.ones(L, L, dtype=torch.bool)
    if c["causal"]:
        visible &= j <= i
    if c["window"] > 0:
        visible &= (j > i - c["window"]) if c["causal"] else ((i - j).abs() < c["window"])
    s = s.masked_fill(~visible, float("-inf"))
    a = torch.softmax(s, -1) @ v
    return lin(a.transpose(1, 2).reshape(B, L, H * D), "o_proj")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    for old in os.listdir(args.workdir):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(args.workdir, old))
    gen = torch.Generator().manual_seed(5)
    for n, c in enumerate(CASES):
        E, H, Hkv, D = c["E"], c["H"], c["Hkv"], c["D"]
        shapes = {"q_proj": (H * D, E), "k_proj": (Hkv * D, E), "v_proj": (Hkv * D, E), "o_proj": (E, H * D)}
        w = {}
        for name, shape in shapes.items():
            w[name + ".weight"] = (torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1]))
            if c["bias"]:
                w[name + ".bias"] = torch.randn(shape[0], generator=gen, dtype=torch.float64) * 0.1
        x = torch.randn(c["B"], c["L"], E, generator=gen, dtype=torch.float64)
        G = torch.randn(c["B"], c["L"], E, generator=gen, dtype=torch.float64)
        for t in list(w.values()) + [x]:
            t.requires_grad_(True)
        (forward(c, w, x) * G).sum().backward()
        tensors = {name: (t.detach().numpy(), "F64") for name, t in w.items()}
        tensors.update({"grad." + name: (t.grad.numpy(), "F64") for name, t in w.items()})
        tensors["x"] = (x.detach().numpy(), "F64")
        tensors["G"] = (G.numpy(), "F64")
        tensors["grad.x"] = (x.grad.numpy(), "F64")
        tensors["alibi_slopes"] = (np.array(alibi_slopes(H)), "F64")
        meta = {key: str(value) for key, value in c.items()}
        safetensors_io.write(os.path.join(args.workdir, "case%d.safetensors" % n), tensors, meta)
    env = dict(os.environ, MULTIHEAD_GQA_BACKWARD_TORCH_DIR=args.workdir)
    r = subprocess.run([args.tests, "--gtest_filter=GqaBackwardTorch.*"], env=env)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
