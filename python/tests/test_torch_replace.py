"""replace_attention on torch's Transformer modules: the same outputs,
gradients and training as the original model, and the library really runs
(counted), also where torch 1.13's fused fast paths would skip self_attn."""
import pytest
import torch
from torch import nn

import multihead.torch as mt


def encoder(batch_first, d=16, heads=4, layers=2):
    layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=32, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, layers)


def clone_replaced(model):
    other = encoder(model.layers[0].self_attn.batch_first)
    other.load_state_dict(model.state_dict())
    return mt.replace_attention(other)


@pytest.fixture
def calls(monkeypatch):
    """Counts the library's attention forwards (training and inference)."""
    n = {"forward": 0}
    forward = mt.MultiheadAttention.forward

    def counted(self, *a, **k):
        n["forward"] += 1
        return forward(self, *a, **k)

    monkeypatch.setattr(mt.MultiheadAttention, "forward", counted)
    return n


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq-first", "batch_first"])
def test_encoder_outputs_and_gradients_equal_torchs(batch_first, calls):
    torch.manual_seed(0)
    ref = encoder(batch_first)
    ours = clone_replaced(ref)
    assert all(isinstance(l.self_attn, mt.MultiheadAttention) for l in ours.layers)
    x = torch.randn(3, 6, 16) if batch_first else torch.randn(6, 3, 16)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    results = []
    for m in (ref, ours):
        xi = x.clone().requires_grad_()
        out = m(xi, mask=mask, src_key_padding_mask=kpm)
        loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum()
        grads = torch.autograd.grad(loss, [xi, *m.parameters()])
        results.append((out, grads))
    assert calls["forward"] == 2, calls
    (ro, rg), (oo, og) = results
    names = ["input"] + [n for n, _ in ref.named_parameters()]
    for n, a, b in [("output", oo, ro)] + list(zip(names, og, rg)):
        err = (a - b).abs().max().item()
        assert err <= 1e-5 * max(1.0, b.abs().max().item()), f"{n}: max |ours - torch| = {err:.3g}"


def test_fast_path_does_not_bypass_the_library(calls):
    """Eval mode under no_grad with batch_first: torch 1.13's
    TransformerEncoder / TransformerEncoderLayer would compute the attention
    from self_attn's weights in a fused kernel without calling self_attn;
    after replace_attention the library runs, twice per model call."""
    torch.manual_seed(0)
    ref = encoder(True).eval()
    ours = clone_replaced(ref).eval()
    x = torch.randn(3, 6, 16)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[0, 5:] = True
    with torch.no_grad():
        for kw in ({}, {"src_key_padding_mask": kpm}):
            before = calls["forward"]
            a, b = ref(x, **kw), ours(x, **kw)
            assert calls["forward"] - before == 2, kw
            if kw:  # torch's nested-tensor path returns padding rows as 0
                b = b.masked_fill(kpm.unsqueeze(-1), 0.0)
            assert (a - b).abs().max().item() <= 1e-5, kw


def test_replace_keeps_the_parameter_objects_and_mode():
    torch.manual_seed(0)
    model = encoder(False)
    model.layers[1].eval()
    before = [id(p) for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mt.replace_attention(model)
    assert [id(p) for p in model.parameters()] == before
    assert model.layers[0].self_attn.training and not model.layers[1].self_attn.training
    # The optimizer made before still trains the attention weights.
    w = model.layers[0].self_attn.in_proj_weight.detach().clone()
    model(torch.randn(5, 2, 16)).sum().backward()
    opt.step()
    assert not torch.equal(w, model.layers[0].self_attn.in_proj_weight)
    mha = nn.MultiheadAttention(8, 2)
    assert isinstance(mt.replace_attention(mha), mt.MultiheadAttention)
    with pytest.raises(TypeError, match="model"):
        mt.replace_attention("not a module")


# ---- a real training loop: the reverse task ---------------------------------------
VOCAB, LENGTH, D, HEADS, BATCH, STEPS = 12, 8, 32, 4, 32, 200


def reverse_batch(gen, batch=BATCH):
    """Random token sequences and their reversal (the target)."""
    x = torch.randint(0, VOCAB, (batch, LENGTH), generator=gen)
    return x, x.flip(1)


class Reverser(nn.Module):
    """Token and position embeddings, one nn.TransformerEncoderLayer, a linear read-out."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(LENGTH, D)
        self.enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=64, dropout=0.0, batch_first=True), 2)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        return self.out(self.enc(h))


def train(replace):
    torch.manual_seed(0)
    model = Reverser()
    if replace:
        mt.replace_attention(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        x, y = reverse_batch(gen)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    x, y = reverse_batch(torch.Generator().manual_seed(2), batch=256)
    with torch.no_grad():
        model.eval()
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    return losses, accuracy


def test_training_reverse_task_matches_torch(capsys):
    """200 AdamW steps from the same seed, once with nn.MultiheadAttention
    and once after replace_attention: losses within 1e-3 at every step, the
    same held-out accuracy (dropout 0: both are deterministic)."""
    ref_losses, ref_acc = train(replace=False)
    our_losses, our_acc = train(replace=True)
    diffs = [abs(a - b) for a, b in zip(ref_losses, our_losses)]
    growth = ", ".join(f"step {s}: {max(diffs[:s]):.2e}" for s in (1, 10, 50, 100, 200))
    with capsys.disabled():
        print(f"\nreverse task: loss {ref_losses[0]:.3f} -> {ref_losses[-1]:.4f} (torch), "
              f"{our_losses[-1]:.4f} (ours); max |loss difference| up to {growth}; "
              f"accuracy {ref_acc:.4f} (torch) {our_acc:.4f} (ours)")
    assert max(diffs) <= 1e-3, growth
    assert ref_losses[-1] < 0.5 * ref_losses[0], "the model did not learn: the comparison would say little"
    assert ref_acc > 0.9 and abs(ref_acc - our_acc) <= 1 / (256 * LENGTH), (ref_acc, our_acc)


def test_readme_drop_in_block_runs_and_trains():
    """README's multihead.torch block (the ```python block of its "## Python"
    section that calls replace_attention), run from the README's text."""
    import os
    import re

    from conftest import SOURCE_DIR
    text = open(os.path.join(SOURCE_DIR, "README.md"), encoding="utf-8").read()
    section = re.search(r"^## Python\n(.*?)^## ", text, flags=re.S | re.M).group(1)
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, flags=re.S) if "replace_attention" in b]
    assert len(blocks) == 1, f"expected one README block with replace_attention, found {len(blocks)}"
    ns = {}
    exec(compile(blocks[0], "README.md (Python: multihead.torch)", "exec"), ns)
    assert all(isinstance(l.self_attn, mt.MultiheadAttention) for l in ns["model"][1].layers)
    assert ns["loss"].item() < 2.0, ns["loss"].item()  # from ln(10) = 2.30 at the start
