"""Gradients of MultiheadAttention.backward against PyTorch autograd in float64.

Every configuration is drawn at random (seed MULTIHEAD_GRAD_SEED, default 0,
printed; MULTIHEAD_GRAD_COUNT of them, default 120; about one in seven has
lengths 17-89 and head widths 8, 16 or 33, across the kernels' tiles) from
every option the backward handles: bool and float attention
masks, 2-D and 3-D; bool and float key padding; is_causal (top-left and
bottom-right); bias on/off; add_bias_kv; add_zero_attn; kdim/vdim;
batch_first; unbatched; self-attention (one array three times); dropout in
training mode; window, softcap and ALiBi; need_weights on/off; every kernel.
Each runs through our float32 and our float64 module, and we compare the
gradients of query, key, value and every parameter with those of the same
function written here in torch float64 ops (torch_forward) and
differentiated by autograd. The loss is sum(output * R) for a random R, so
d_output = R.

torch_forward is itself checked against torch's own
F.multi_head_attention_forward on the configurations 1.13 can express
(test_formula_matches_torch_mha), so the oracle is PyTorch's.

Dropout: torch's is random, ours a hash of (seed, slice, i, j). We read our
post-dropout per-head weights p' (need_weights=True, average_attn_weights=
False) from a plain forward with the same seed: kept elements are p' != 0
(probabilities here are never 0 by underflow: O(1) scores). torch then
applies that fixed mask, scaled by 1/(1 - p).

Bounds, per tensor, rel = ||ours - torch|| / ||torch||:
  - float64: < 1e-10. Both sides compute the same function in float64 with
    O(E + S) terms per sum: rounding ~ eps64 * (E + S) * cond ~ 1e-14 here;
    1e-10 leaves room for the conditioning of softmax at these sizes.
  - float32: < 1e-4. Our float32 rounding ~ eps32 * sqrt(E + S) * cond
    ~ 1e-6 (the inputs are float32-rounded for torch too, so only our
    arithmetic differs). cond is large where a gradient is a sum that
    cancels (d_q = scale * sum_j dx_ij k_j with sum_j dx_ij = 0, at head
    width 1 and with few keys left visible): over seeds 0-15 the worst was
    5.5e-5 (seed 12, E=H=1, window 1, causal), the typical worst 2e-6.
"""
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import multihead

SEED = int(os.environ.get("MULTIHEAD_GRAD_SEED", "0"))
COUNT = int(os.environ.get("MULTIHEAD_GRAD_COUNT", "120"))
BOUND = {np.float32: 1e-4, np.float64: 1e-10}

MASKS = ["none", "bool2d", "float2d", "bool3d", "float3d"]
KPMS = ["none", "bool", "float"]


def random_config(rng):
    c = {}
    c["H"] = int(rng.choice([1, 2, 3, 4]))
    c["E"] = c["H"] * int(rng.choice([1, 2, 3, 4]))
    c["self"] = bool(rng.random() < 0.25)
    c["L"] = int(rng.integers(1, 7))
    c["S"] = c["L"] if c["self"] else int(rng.integers(1, 8))
    if rng.random() < 0.15:  # lengths across the kernels' tiles, wider heads (odd widths too)
        c["H"] = int(rng.choice([1, 2]))
        c["E"] = c["H"] * int(rng.choice([8, 16, 33]))
        c["L"] = int(rng.integers(17, 90))
        c["S"] = c["L"] if c["self"] else int(rng.integers(17, 90))
    c["B"] = int(rng.integers(1, 4))
    c["unbatched"] = bool(rng.random() < 0.2)
    if c["unbatched"]:
        c["B"] = 1
    c["batch_first"] = bool(rng.random() < 0.4)
    c["kdim"] = None if c["self"] or rng.random() < 0.7 else int(rng.integers(1, 7))
    c["vdim"] = None if c["self"] or rng.random() < 0.7 else int(rng.integers(1, 7))
    c["bias"] = bool(rng.random() < 0.8)
    c["add_bias_kv"] = bool(rng.random() < 0.3)
    c["add_zero_attn"] = bool(rng.random() < 0.3)
    c["mask"] = MASKS[int(rng.integers(0, len(MASKS)))]
    c["kpm"] = KPMS[int(rng.integers(0, len(KPMS)))]
    c["causal"] = bool(rng.random() < 0.35)
    c["bottom_right"] = bool(rng.random() < 0.3)
    c["dropout"] = float(rng.choice([0.0, 0.0, 0.2, 0.5]))
    c["window"] = int(rng.integers(1, 4)) if rng.random() < 0.2 else None
    c["softcap"] = float(rng.choice([1.0, 3.0])) if rng.random() < 0.2 else None
    c["alibi"] = bool(rng.random() < 0.2)
    c["need_weights"] = bool(rng.random() < 0.3)
    c["kernel"] = str(rng.choice(["auto", "reference", "materialized", "flash"]))
    c["dropout_seed"] = int(rng.integers(0, 2**31))
    return c


def name_of(c):
    parts = [f"E{c['E']}_H{c['H']}_B{c['B']}_L{c['L']}_S{c['S']}"]
    for k in ["kdim", "vdim", "window", "softcap"]:
        if c[k] is not None:
            parts.append(f"{k}{c[k]}")
    for k in ["self", "unbatched", "batch_first", "add_bias_kv", "add_zero_attn", "causal", "alibi", "need_weights"]:
        if c[k]:
            parts.append(k)
    if not c["bias"]:
        parts.append("nobias")
    if c["causal"] and c["bottom_right"]:
        parts.append("bottom_right")
    if c["mask"] != "none":
        parts.append("mask_" + c["mask"])
    if c["kpm"] != "none":
        parts.append("kpm_" + c["kpm"])
    if c["dropout"]:
        parts.append(f"dropout{c['dropout']}")
    parts.append(c["kernel"])
    return "_".join(parts)


def make_data(c, rng):
    """Inputs, masks and R in float64, in the caller's layout."""
    E, B, L, S, H = c["E"], c["B"], c["L"], c["S"], c["H"]
    Ek, Ev = c["kdim"] or E, c["vdim"] or E

    def shape(n, w):
        if c["unbatched"]:
            return (n, w)
        return (B, n, w) if c["batch_first"] else (n, B, w)

    d = {"query": rng.standard_normal(shape(L, E))}
    if not c["self"]:
        d["key"] = rng.standard_normal(shape(S, Ek))
        d["value"] = rng.standard_normal(shape(S, Ev))
    if c["mask"] != "none":
        ms = (L, S) if c["mask"].endswith("2d") else (B * H, L, S)
        d["attn_mask"] = rng.random(ms) < 0.3 if c["mask"].startswith("bool") else rng.standard_normal(ms)
    if c["kpm"] != "none":
        ks = (S,) if c["unbatched"] else (B, S)
        d["kpm"] = rng.random(ks) < 0.3 if c["kpm"] == "bool" else rng.standard_normal(ks)
    d["R"] = rng.standard_normal(shape(L, E))
    return d


def as_torch(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def additive(m):
    """A mask (bool: True = may not attend) as float64 additive values."""
    if m.dtype == np.bool_:
        return torch.where(torch.tensor(m), -math.inf, 0.0).double()
    return as_torch(m)


def torch_forward(P, q, k, v, c, attn_mask=None, kpm=None, keep=None):
    """Our module's function in torch float64 ops (docs/semantics.md; the
    order of operations of src/contract/attention_args.hpp)."""
    E, H = c["E"], c["H"]
    D = E // H
    if c["unbatched"]:
        q, k, v = q[:, None], k[:, None], v[:, None]
    elif c["batch_first"]:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    L, B, _ = q.shape
    S = k.shape[0]
    if "in_proj_weight" in P:
        Wq, Wk, Wv = P["in_proj_weight"].split(E)
    else:
        Wq, Wk, Wv = P["q_proj_weight"], P["k_proj_weight"], P["v_proj_weight"]
    Q, K, V = q @ Wq.T, k @ Wk.T, v @ Wv.T
    if c["bias"]:
        bq, bk, bv = P["in_proj_bias"].split(E)
        Q, K, V = Q + bq, K + bk, V + bv
    if c["add_bias_kv"]:
        K = torch.cat([K, P["bias_k"].expand(1, B, E)])
        V = torch.cat([V, P["bias_v"].expand(1, B, E)])
    N = B * H
    Qh = Q.reshape(L, N, D).transpose(0, 1)
    Kh = K.reshape(-1, N, D).transpose(0, 1)
    Vh = V.reshape(-1, N, D).transpose(0, 1)
    if c["add_zero_attn"]:
        Kh = torch.cat([Kh, torch.zeros(N, 1, D, dtype=Kh.dtype)], 1)
        Vh = torch.cat([Vh, torch.zeros(N, 1, D, dtype=Vh.dtype)], 1)
    St = Kh.shape[1]
    x = (Qh @ Kh.transpose(1, 2)) / math.sqrt(D)
    if c["softcap"] is not None:
        x = c["softcap"] * torch.tanh(x / c["softcap"])
    s = x.reshape(B, H, L, St)
    shift = S - L if c["bottom_right"] else 0
    pos = torch.arange(L)[:, None] + shift
    j = torch.arange(St)[None, :]
    real = j < S
    if c["alibi"]:
        slopes = torch.tensor(multihead.alibi_slopes(H), dtype=torch.float64)
        dist = torch.where(real, (pos - j).abs(), 0).double()
        s = s - slopes[None, :, None, None] * dist
    pad = St - S
    if attn_mask is not None:
        m = F.pad(attn_mask, (0, pad))
        s = s + (m if m.dim() == 2 else m.reshape(B, H, L, St))
    if kpm is not None:
        s = s + F.pad(kpm.reshape(B, S), (0, pad))[:, None, None, :]
    hidden = torch.zeros(L, St, dtype=torch.bool)
    if c["causal"]:
        hidden |= real & (j > pos)
    if c["window"] is not None:
        w = c["window"]
        hidden |= real & ((j <= pos - w) if c["causal"] else ((pos - j).abs() >= w))
    s = s.masked_fill(hidden, -math.inf)
    # A fully masked row gets zero weights (MaskedRowPolicy::Zeros).
    dead = torch.isinf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    if keep is not None:
        p = p * keep / (1.0 - c["dropout"])
    out = (p.reshape(N, L, St) @ Vh).transpose(0, 1).reshape(L, B, E)
    out = out @ P["out_proj.weight"].T
    if c["bias"]:
        out = out + P["out_proj.bias"]
    if c["unbatched"]:
        return out[:, 0]
    return out.transpose(0, 1) if c["batch_first"] else out


def our_module(c, dtype, seed):
    mha = multihead.MultiheadAttention(
        c["E"], c["H"], dropout=c["dropout"], bias=c["bias"], add_bias_kv=c["add_bias_kv"],
        add_zero_attn=c["add_zero_attn"], kdim=c["kdim"], vdim=c["vdim"], batch_first=c["batch_first"],
        seed=seed, dtype=dtype)
    # Non-zero biases (they start at 0), so their gradients' paths matter.
    rng = np.random.default_rng(seed)
    mha.update_parameters(lambda name, p: p + 0.3 * rng.standard_normal(p.shape) if "bias" in name else None)
    if c["dropout"]:
        mha.train()
    return mha


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / nb) if nb > 0 else float(np.linalg.norm(a))


def check_config(c, dtype, rng):
    """Returns {tensor name: rel error} for one configuration in one dtype."""
    d = make_data(c, rng)
    cast = lambda x: x.astype(dtype) if x.dtype != np.bool_ else x  # noqa: E731
    q = cast(d["query"])
    k = q if c["self"] else cast(d["key"])
    v = q if c["self"] else cast(d["value"])
    am = cast(d["attn_mask"]) if "attn_mask" in d else None
    kpm = cast(d["kpm"]) if "kpm" in d else None
    R = cast(d["R"])
    mha = our_module(c, dtype, seed=int(rng.integers(0, 2**31)))
    kernel = c["kernel"]
    if dtype == np.float64 and kernel == "flash":
        kernel = "materialized"  # flash runs in float32 only
    need_weights = c["need_weights"] and kernel != "flash"
    kw = dict(is_causal=c["causal"], causal_align="bottom-right" if c["bottom_right"] else "top-left",
              window=c["window"], softcap=c["softcap"], alibi=c["alibi"], dropout_seed=c["dropout_seed"])
    out, _, ctx = mha.forward_with_context(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights,
                                           kernel=kernel, **kw)
    grads = mha.backward(ctx, R)

    keep = None
    if c["dropout"]:
        _, w = mha.forward(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=True,
                           average_attn_weights=False, kernel="reference", **kw)
        w = torch.tensor(np.asarray(w, dtype=np.float64))
        keep = (w != 0).double().reshape(c["B"], c["H"], c["L"], -1)

    P = {n: as_torch(a).requires_grad_() for n, a in mha.state_dict().items()}
    tq = as_torch(q).requires_grad_()
    tk = as_torch(k).requires_grad_()  # separate leaves even for self-attention
    tv = as_torch(v).requires_grad_()
    tam = additive(am) if am is not None else None
    tkpm = additive(kpm) if kpm is not None else None
    t_out = torch_forward(P, tq, tk, tv, c, tam, tkpm, keep)
    t_out.backward(as_torch(R))
    errors = {"output": rel(out, t_out.detach().numpy())}
    for n, t in [("query", tq), ("key", tk), ("value", tv)]:
        errors[n] = rel(grads[n], t.grad.numpy())
    for n, t in P.items():
        errors[n] = rel(grads[n], t.grad.numpy())
    assert set(grads) == {"query", "key", "value"} | set(P), sorted(grads)
    return errors


def test_gradients_match_torch_autograd():
    rng = np.random.default_rng(SEED)
    worst = {np.float32: (0.0, ""), np.float64: (0.0, "")}
    failures = []
    options_seen = set()
    for i in range(COUNT):
        c = random_config(rng)
        options_seen |= {k for k, val in c.items() if val not in (None, False, 0, 0.0, "none")}
        options_seen |= {c["mask"], c["kpm"], c["kernel"]}
        for dtype in (np.float32, np.float64):
            errors = check_config(c, dtype, rng)
            for tensor, e in errors.items():
                label = f"#{i} {name_of(c)} {np.dtype(dtype).name} {tensor}"
                if not e < BOUND[dtype]:
                    failures.append(f"{label}: rel {e:.3g} >= {BOUND[dtype]:g}")
                if e > worst[dtype][0] or math.isnan(e):
                    worst[dtype] = (e, label)
    print(f"\n[gradients vs torch autograd] seed {SEED}: {COUNT} configurations x 2 dtypes; "
          f"worst float32 {worst[np.float32][0]:.3g} ({worst[np.float32][1]}), "
          f"worst float64 {worst[np.float64][0]:.3g} ({worst[np.float64][1]})")
    for needed in ["self", "unbatched", "batch_first", "add_bias_kv", "add_zero_attn", "causal", "alibi",
                   "window", "softcap", "dropout", "kdim", "vdim", "bottom_right", "need_weights",
                   *MASKS[1:], *KPMS[1:], "reference", "materialized", "flash", "auto"]:
        assert needed in options_seen, f"no configuration exercised {needed}; raise MULTIHEAD_GRAD_COUNT"
    assert not failures, "\n".join(failures[:20])


def test_formula_matches_torch_mha():
    """torch_forward (the oracle above) is torch's own MHA where 1.13 can say
    the same thing: no dropout/window/softcap/ALiBi, bool key padding, causal
    as an explicit mask, no fully masked row."""
    rng = np.random.default_rng(SEED + 1)
    checked = 0
    while checked < 20:
        c = random_config(rng)
        c.update(dropout=0.0, window=None, softcap=None, alibi=False, bottom_right=False)
        if c["kpm"] == "float":
            c["kpm"] = "bool"
        d = make_data(c, rng)
        E, H = c["E"], c["H"]
        mha = our_module(c, np.float64, seed=int(rng.integers(0, 2**31)))
        P = {n: as_torch(a) for n, a in mha.state_dict().items()}
        q = as_torch(d["query"])
        k = q if c["self"] else as_torch(d["key"])
        v = q if c["self"] else as_torch(d["value"])
        am = additive(d["attn_mask"]) if "attn_mask" in d else None
        if c["causal"]:
            causal = torch.triu(torch.full((c["L"], c["S"]), -math.inf, dtype=torch.float64), 1)
            am = causal if am is None else am + causal
        kpm = torch.tensor(d["kpm"]) if "kpm" in d else None
        ours = torch_forward(P, q, k, v, c, am, None if kpm is None else additive(d["kpm"]))
        if not torch.isfinite(ours).all():
            continue
        tq, tk, tv = q, k, v
        if c["unbatched"]:
            tq, tk, tv = tq[:, None], tk[:, None], tv[:, None]
            kpm = None if kpm is None else kpm[None]
        elif c["batch_first"]:
            tq, tk, tv = tq.transpose(0, 1), tk.transpose(0, 1), tv.transpose(0, 1)
        packed = "in_proj_weight" in P
        theirs, _ = F.multi_head_attention_forward(
            tq, tk, tv, E, H, P.get("in_proj_weight"), P.get("in_proj_bias"), P.get("bias_k"), P.get("bias_v"),
            c["add_zero_attn"], 0.0, P["out_proj.weight"], P.get("out_proj.bias"), training=False,
            key_padding_mask=kpm, need_weights=False, attn_mask=am, use_separate_proj_weight=not packed,
            q_proj_weight=P.get("q_proj_weight"), k_proj_weight=P.get("k_proj_weight"),
            v_proj_weight=P.get("v_proj_weight"))
        if c["unbatched"]:
            theirs = theirs[:, 0]
        elif c["batch_first"]:
            theirs = theirs.transpose(0, 1)
        if not torch.isfinite(theirs).all():
            continue  # a fully masked row: torch 1.13 gives NaN, we (and the formula) zeros
        assert rel(ours.numpy(), theirs.numpy()) < 1e-12, name_of(c)
        checked += 1


def test_checker_fails_on_a_perturbed_gradient():
    """A gradient off by 1e-3 of its norm must exceed both bounds."""
    a = np.random.default_rng(3).standard_normal(50)
    b = a.copy()
    b[7] += 1e-3 * np.linalg.norm(a)
    assert rel(b, a) > BOUND[np.float32] and rel(b, a) > BOUND[np.float64]


def test_update_parameters_and_stale_context():
    mha = multihead.MultiheadAttention(8, 2, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((3, 2, 8))
    out, w, ctx = mha.forward_with_context(x, x, x)
    assert w.shape == (2, 3, 3) and not ctx.empty and ctx.nbytes > 0 and ctx.dtype == np.float64
    g = mha.backward(ctx, np.ones_like(out))
    assert set(g) == {"query", "key", "value", "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}
    before = mha.state_dict()
    mha.update_parameters(lambda name, p: p - 0.1 * g[name])
    after = mha.state_dict()
    for n in before:
        np.testing.assert_array_equal(after[n], before[n] - 0.1 * g[n])
    with pytest.raises(ValueError, match="before update_parameters"):
        mha.backward(ctx, np.ones_like(out))
    with pytest.raises(ValueError, match="in_proj_weight"):
        mha.update_parameters(lambda name, p: np.zeros((2, 2)) if name == "in_proj_weight" else None)
    for n, t in mha.state_dict().items():  # a refused update changes nothing
        np.testing.assert_array_equal(t, after[n])
    # The context's buffers are reused when passed back.
    out2, _, ctx2 = mha.forward_with_context(x, x, x, context=ctx)
    assert ctx2 is ctx
    with pytest.raises(ValueError, match="d_output"):
        mha.backward(ctx, np.ones((3, 2, 9)))
    with pytest.raises(TypeError, match="context"):
        mha.forward_with_context(x, x, x, context=object())


def test_masks_live_in_the_context():
    """The context holds its masks: dropping the caller's arrays (and
    collecting them) before backward changes nothing."""
    import gc

    rng = np.random.default_rng(1)
    mha = multihead.MultiheadAttention(8, 2, dtype=np.float64)
    q = rng.standard_normal((3, 2, 8))
    am = rng.standard_normal((3, 3))
    kpm = rng.random((2, 3)) < 0.3
    kpm[:, 0] = False
    out, _, ctx = mha.forward_with_context(q, q, q, attn_mask=am.copy(), key_padding_mask=kpm.copy())
    gc.collect()
    g1 = mha.backward(ctx, np.ones_like(out))
    _, _, ctx_b = mha.forward_with_context(q, q, q, attn_mask=am, key_padding_mask=kpm)
    g2 = mha.backward(ctx_b, np.ones_like(out))
    for n in g1:
        np.testing.assert_array_equal(g1[n], g2[n])


if __name__ == "__main__":
    test_gradients_match_torch_autograd()
