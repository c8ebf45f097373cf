"""The trained model rebuilt in float64 numpy, written here (no library code).

Shared by tests/cli/explain.py, model_file.py and demo.py: the model file's
safetensors layout (read and write) and the pre-LN encoder of
include/multihead/train.hpp and docs/model-format.md (sinusoidal positions,
norm1 -> attention -> residual, norm2 -> feed-forward -> residual).
"""
import json
import struct

import numpy as np


def read_safetensors(path):
    """(name -> float64 array, metadata): the model file is float32 little-endian safetensors."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", name
        s, e = t["data_offsets"]
        out[name] = np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(t["shape"]).astype(np.float64)
    return out, meta


def write_safetensors(path, tensors, meta):
    """float32 safetensors with __metadata__ (the model file format, include/multihead/trained_model.hpp)."""
    header, blobs, offset = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def layer_norm(x, p, name, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]


def relu(x):
    return np.maximum(x, 0.0)


def encoder(p, ids, E, H, layers, *, eps=1e-5, causal=False, ff=True, act=relu):
    """The blocks on token ids, float64.

    Returns (x after the last block (L, E), per layer its (H, L, L) attention
    weights softmax(Q Kᵀ/√D), per layer its attention input norm1(x))."""
    L = len(ids)
    D = E // H
    pos, c = np.arange(L)[:, None], np.arange(E)[None, :]
    angle = pos / np.power(10000.0, (c - c % 2) / E)
    x = p["embedding.weight"][ids] + np.where(c % 2 == 0, np.sin(angle), np.cos(angle))
    attention, inputs = [], []
    for i in range(layers):
        def g(n):
            return p[f"blocks.{i}.{n}"]
        a = layer_norm(x, p, f"blocks.{i}.norm1", eps)
        inputs.append(a)
        W, b = g("attn.in_proj_weight"), g("attn.in_proj_bias")
        q, k, v = [(a @ W[j * E:(j + 1) * E].T + b[j * E:(j + 1) * E]).reshape(L, H, D).transpose(1, 0, 2)
                   for j in range(3)]
        s = q @ k.transpose(0, 2, 1) / np.sqrt(D)
        if causal:
            s = np.where(np.triu(np.ones((L, L), bool), 1), -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        P = s / s.sum(-1, keepdims=True)
        attention.append(P)
        o = (P @ v).transpose(1, 0, 2).reshape(L, E)
        x = x + o @ g("attn.out_proj.weight").T + g("attn.out_proj.bias")
        if ff:
            h = layer_norm(x, p, f"blocks.{i}.norm2", eps)
            x = x + act(h @ g("ff.0.weight").T + g("ff.0.bias")) @ g("ff.2.weight").T + g("ff.2.bias")
    return x, attention, inputs


class FileModel:
    """The forward from docs/model-format.md and the file's metadata only: eps, the
    positional encoding, the activation, the pre-LN order, the vocabulary and
    the padding id all come from the metadata, no constant of our source."""

    def __init__(self, path):
        self.p, m = read_safetensors(path)
        self.E, self.H, self.layers = int(m["d_model"]), int(m["heads"]), int(m["layers"])
        self.F, self.L, self.causal = int(m["ff"]), int(m["sequence_length"]), m["causal"] == "true"
        self.eps = float(m["layer_norm_eps"])
        self.ids = json.loads(m["token_ids"])
        self.words = {i: w for w, i in self.ids.items()}
        if m["norm_placement"] != "pre" or m["positional_encoding"] != "sinusoidal" or m["activation"] != "relu":
            raise ValueError(f"this rebuild knows pre / sinusoidal / relu, the file says {m['norm_placement']} / "
                             f"{m['positional_encoding']} / {m['activation']}")
        self.act = relu

    def forward(self, words):
        """(logits (L, V), per layer (H, L, L) attention) for the words padded with <pad>."""
        ids = [self.ids[w] for w in words] + [self.ids["<pad>"]] * (self.L - len(words))
        x, attention, _ = encoder(self.p, ids, self.E, self.H, self.layers, eps=self.eps, causal=self.causal,
                                  ff=self.F > 0, act=self.act)
        logits = layer_norm(x, self.p, "norm_f", self.eps) @ self.p["readout.weight"].T + self.p["readout.bias"]
        return logits, attention
