#!/usr/bin/python3
"""multihead.torch against torch's own attention, in one process. A
benchmark, not a test (python/tests/test_torch_*.py check correctness).

  1. Training: the reverse task (python/tests/test_torch_replace.py's, with
     E = 512, H = 8, one nn.TransformerEncoderLayer, feed-forward 2048,
     AdamW), steps per second with nn.MultiheadAttention against the same
     model after multihead.torch.replace_attention, at L = 128, 512, 2048
     (batch 8, 2, 1: 1024 to 2048 tokens a step).
  2. One attention layer, forward + backward (every gradient: input and
     parameters), self-attention, float32, at README's training-step shapes:
     nn.MultiheadAttention under autograd against multihead.torch's.
  3. The overhead of multihead.torch per call: at (1,1,8,1), forward +
     backward through multihead.torch against the same calls on the
     extension directly (forward_with_context + backward on NumPy arrays),
     and the no-grad forward against the extension's forward.

Both sides alternate round by round (one round: a few steps of each, in
turn, after warm-up); each row is the median over rounds. float32, the
same thread count for both (OMP_NUM_THREADS set before either library
loads, torch.set_num_threads, multihead.set_threads).

Usage (after building the Python module):
  PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_torch.py [--threads 2] [--rounds 7]
  ... --smoke      tiny shapes, 1 round: checks that the script runs (no meaningful numbers)
Prints three Markdown tables.
"""
import argparse
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds (the median is over these)")
    p.add_argument("--steps", type=int, default=3, help="training steps or calls per side and round")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one round: only checks that it runs")
    return p.parse_args()


ARGS = parse_args()
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)  # before torch or multihead load OpenMP / BLAS

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import multihead  # noqa: E402
import multihead.torch as mt  # noqa: E402

torch.set_num_threads(ARGS.threads)
multihead.set_threads(ARGS.threads)
if ARGS.smoke:
    ARGS.rounds, ARGS.steps = 1, 1

TRAIN_E, TRAIN_H = (32, 4) if ARGS.smoke else (512, 8)
TRAIN_SHAPES = [(2, 16)] if ARGS.smoke else [(8, 128), (2, 512), (1, 2048)]  # (batch, L)
LAYER_SHAPES = [(2, 16, 32, 4, False)] if ARGS.smoke else [
    (8, 128, 512, 8, False), (1, 1024, 768, 12, False), (1, 2048, 768, 12, False), (1, 4096, 1024, 16, False),
    (1, 2048, 768, 12, True)]
VOCAB = 16


def alternate(sides):
    """{name: fn() -> seconds of one unit}: round by round, each side in
    turn (the order flips every round); medians per side."""
    times = {n: [] for n in sides}
    for fn in sides.values():  # warm-up
        fn()
    for r in range(ARGS.rounds):
        order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
        for n, fn in order:
            times[n].append(fn())
    return {n: statistics.median(t) for n, t in times.items()}


# ---- 1. training steps --------------------------------------------------------------
class Reverser(nn.Module):
    def __init__(self, length):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, TRAIN_E)
        self.pos = nn.Embedding(length, TRAIN_E)
        self.layer = nn.TransformerEncoderLayer(TRAIN_E, TRAIN_H, dim_feedforward=4 * TRAIN_E, dropout=0.0,
                                                batch_first=True)
        self.out = nn.Linear(TRAIN_E, VOCAB)

    def forward(self, x):
        return self.out(self.layer(self.tok(x) + self.pos(torch.arange(x.shape[1]))))


def trainer(batch, length, replace):
    torch.manual_seed(0)
    model = Reverser(length)
    if replace:
        mt.replace_attention(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def steps():
        t0 = time.perf_counter()
        for _ in range(ARGS.steps):
            x = torch.randint(0, VOCAB, (batch, length), generator=gen)
            loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), x.flip(1).reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.perf_counter() - t0) / ARGS.steps

    return steps


def bench_training():
    print(f"\n### Training the reverse task (E = {TRAIN_E}, H = {TRAIN_H}, AdamW), steps per second\n")
    print("| batch, L | nn.MultiheadAttention | replace_attention | ours / torch |")
    print("|---|---|---|---|")
    for batch, length in TRAIN_SHAPES:
        t = alternate({"torch": trainer(batch, length, False), "ours": trainer(batch, length, True)})
        print(f"| {batch}, {length} | {1 / t['torch']:.2f} | {1 / t['ours']:.2f} | {t['torch'] / t['ours']:.2f}× |")


# ---- 2. one attention layer ---------------------------------------------------------
def layer_step(module, x, causal_mask, causal):
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))

    def step():
        t0 = time.perf_counter()
        for _ in range(ARGS.steps):
            module.zero_grad()
            x.grad = None
            if isinstance(module, mt.MultiheadAttention):
                out = module(x, x, x, need_weights=False, is_causal=causal)[0]
            else:
                out = module(x, x, x, need_weights=False, attn_mask=causal_mask)[0]
            (out * w).sum().backward()
        return (time.perf_counter() - t0) / ARGS.steps

    return step


def bench_layer():
    print("\n### One attention layer, forward + backward (float32, self-attention)\n")
    print("| shape (B,L,E,H) | nn.MultiheadAttention | multihead.torch | torch / ours |")
    print("|---|---|---|---|")
    for B, L, E, H, causal in LAYER_SHAPES:
        torch.manual_seed(0)
        ref = nn.MultiheadAttention(E, H, batch_first=True)
        ours = mt.replace_attention(nn.MultiheadAttention(E, H, batch_first=True))
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(B, L, E, requires_grad=True)
        mask = torch.ones(L, L, dtype=torch.bool).triu(1) if causal else None
        t = alternate({"torch": layer_step(ref, x, mask, causal), "ours": layer_step(ours, x, mask, causal)})
        name = ("causal " if causal else "") + f"({B},{L},{E},{H})"
        print(f"| {name} | {t['torch'] * 1e3:.2f} ms | {t['ours'] * 1e3:.2f} ms | {t['torch'] / t['ours']:.2f}× |")


# ---- 3. overhead per call -----------------------------------------------------------
def bench_overhead():
    calls = 200 if ARGS.smoke else 5000
    calls = int(os.environ.get("CALLS", calls))
    E, H = 8, 1
    ours = mt.MultiheadAttention(E, H)
    core = multihead.MultiheadAttention(E, H)
    core.load_state_dict({k: v.detach().numpy() for k, v in ours.state_dict().items()})
    x = torch.randn(1, 1, E, requires_grad=True)
    xn = x.detach().numpy()
    d = np.ones((1, 1, E), np.float32)

    def per_call(fn):
        def run():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - t0) / calls
        return run

    def torch_train():
        ours(x, x, x, need_weights=False)[0].backward(torch.ones(1, 1, E))

    def core_train():
        _, _, ctx = core.forward_with_context(xn, xn, xn, need_weights=False)
        core.backward(ctx, d)

    def torch_infer():
        with torch.no_grad():
            ours(x, x, x, need_weights=False)

    def core_infer():
        core(xn, xn, xn, need_weights=False)

    t = alternate({"torch_train": per_call(torch_train), "core_train": per_call(core_train),
                   "torch_infer": per_call(torch_infer), "core_infer": per_call(core_infer)})
    print(f"\n### multihead.torch's own cost per call, (B,L,E,H) = (1,1,{E},{H}), median of rounds of {calls} calls\n")
    print("| call | multihead.torch | extension directly | multihead.torch adds |")
    print("|---|---|---|---|")
    for what, a, b in (("forward + backward", "torch_train", "core_train"),
                       ("forward, no grad", "torch_infer", "core_infer")):
        print(f"| {what} | {t[a] * 1e6:.1f} µs | {t[b] * 1e6:.1f} µs | {(t[a] - t[b]) * 1e6:.1f} µs |")


if __name__ == "__main__":
    print(f"multihead.torch benchmark: torch {torch.__version__}, {ARGS.threads} threads, "
          f"SIMD {multihead.simd_target_current()}, {ARGS.rounds} rounds of {ARGS.steps}"
          + (" (SMOKE: tiny shapes, numbers meaningless)" if ARGS.smoke else ""))
    bench_training()
    bench_layer()
    bench_overhead()
    sys.stdout.flush()
