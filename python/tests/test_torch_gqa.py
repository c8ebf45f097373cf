"""multihead.torch.GroupedQueryAttention and scaled_dot_product_attention.

GroupedQueryAttention: gradcheck in float64 (RoPE in both conventions, MQA,
biases, non-causal, dropout with a fixed seed), and float32 outputs and
gradients against an independent formula written here in plain torch
(repeat the K/V heads, rotate q and k, causal softmax), differentiated by
torch's autograd. Bound as test_torch_mha.py's: 1e-5 * max(1, max|ref|).
"""
import math

import pytest
import torch

import multihead.torch as mt

B, L, E = 2, 6, 16

# name: constructor kwargs
GQA_CASES = {
    "H4-Hkv2": dict(num_heads=4, num_kv_heads=2),
    "H4-Hkv2-rope-half-split": dict(num_heads=4, num_kv_heads=2, rope="half-split"),
    "H4-Hkv1-rope-interleaved-mqa": dict(num_heads=4, num_kv_heads=1, rope="interleaved", rope_theta=500.0),
    "H4-Hkv4-bias-noncausal": dict(num_heads=4, bias=True, causal=False),
    "H2-Hkv1-head_dim6-rope": dict(num_heads=2, num_kv_heads=1, head_dim=6, rope="half-split"),
}


def rope(x, convention, theta):
    """x (B, H, L, D) rotated by position: pairs (i, i + D/2) for half-split
    (Hugging Face Llama), (2i, 2i + 1) for interleaved (RoFormer)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * inv[None, :]  # (L, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    if convention == "half-split":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def reference(m, x):
    H, Hkv, D = m.num_heads, m.num_kv_heads, m.head_dim

    def heads(lin, n):
        return lin(x).view(B, L, n, D).transpose(1, 2)

    q, k, v = heads(m.q_proj, H), heads(m.k_proj, Hkv), heads(m.v_proj, Hkv)
    if m.rope:
        q, k = rope(q, m.rope, m.rope_theta), rope(k, m.rope, m.rope_theta)
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if m.causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * D)
    return m.o_proj(o)


def module(kw, dtype):
    torch.manual_seed(0)
    m = mt.GroupedQueryAttention(E, dtype=dtype, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(2.0)  # larger scores than nn.Linear's init, so softmax is not near uniform
    return m


@pytest.mark.parametrize("name", list(GQA_CASES))
def test_gqa_gradcheck_float64(name):
    m = module(GQA_CASES[name], torch.float64)
    x = torch.randn(B, L, E, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *p: m(x), (x, *m.parameters()), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gqa_gradcheck_float64_dropout():
    m = module(dict(num_heads=4, num_kv_heads=2, dropout=0.25, rope="half-split"), torch.float64).train()
    x = torch.randn(B, L, E, dtype=torch.float64, requires_grad=True)
    assert not torch.allclose(m(x, dropout_seed=3), m.eval()(x))
    m.train()
    assert torch.autograd.gradcheck(lambda x, *p: m(x, dropout_seed=3), (x, *m.parameters()), eps=1e-6,
                                    atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("name", list(GQA_CASES))
def test_gqa_float32_equals_a_torch_formula(name):
    m = module(GQA_CASES[name], torch.float32)
    x = torch.randn(B, L, E, requires_grad=True)
    w = torch.randn(B, L, E)
    results = []
    for f in (lambda: m(x), lambda: reference(m, x)):
        out = f()
        results.append((out, torch.autograd.grad((out * w).sum(), [x, *m.parameters()])))
    (oo, og), (ro, rg) = results
    names = ["output", "x"] + [n for n, _ in m.named_parameters()]
    for n, a, b in zip(names, [oo, *og], [ro, *rg]):
        err = (a - b).abs().max().item()
        assert err <= 1e-5 * max(1.0, b.abs().max().item()), f"{name} {n}: max |ours - formula| = {err:.3g}"


def test_gqa_optimizer_steps_reload_nothing_and_match_the_formula():
    """The library module reads the nn.Linear Parameters' memory: SGD steps
    (in place) are followed with no share_parameters call, the output after
    each equals the formula's on the new values."""
    m = module(GQA_CASES["H4-Hkv2-rope-half-split"], torch.float32)
    x = torch.randn(B, L, E)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    m(x)
    core = m._pools[torch.float32]
    shares = []
    share = core.module.share_parameters
    core.module = type("Counting", (), {"share_parameters": lambda self, a: (shares.append(1), share(a)),
                                        "__getattr__": lambda self, n: getattr(share.__self__, n)})()
    for step in range(3):
        x.requires_grad_(True)
        out, ref = m(x), reference(m, x)
        err = (out - ref).abs().max().item()
        assert err <= 1e-5 * max(1.0, ref.abs().max().item()), f"step {step}: {err:.3g}"
        out.square().sum().backward()
        opt.step()
        opt.zero_grad()
    assert not shares
    m.q_proj.weight.data = m.q_proj.weight.data.clone()  # another tensor: shared anew
    ref = reference(m, x)
    assert (m(x) - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())
    assert len(shares) == 1


def test_gqa_decoding_with_a_cache_equals_the_full_forward():
    m = module(GQA_CASES["H4-Hkv2-rope-half-split"], torch.float32).eval()
    x = torch.randn(B, L, E)
    with torch.no_grad():
        full = m(x)
        cache = m.make_cache(B, L)
        steps = [m(x[:, t:t + 1], cache=cache) for t in range(L)]
    err = (torch.cat(steps, dim=1) - full).abs().max().item()
    assert err <= 1e-5, err
    with pytest.raises(ValueError, match="cache"):
        m(x.requires_grad_(), cache=m.make_cache(B, L))


def test_gqa_state_dict_names_and_hostile_input():
    m = module(GQA_CASES["H4-Hkv4-bias-noncausal"], torch.float32)
    assert list(m.state_dict())[:2] == ["q_proj.weight", "q_proj.bias"]
    with pytest.raises(TypeError, match="x"):
        m(torch.randn(B, L, E, dtype=torch.float64))
    with pytest.raises(ValueError, match="x"):
        m(torch.randn(B, L, E + 1))
    with pytest.raises(ValueError, match="x"):
        m(torch.empty(B, L, E, device="meta"))
    with pytest.raises(TypeError, match="bogus"):
        m(torch.randn(B, L, E), bogus=1)
    with pytest.raises(ValueError, match="num_kv_heads"):
        mt.GroupedQueryAttention(E, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="device"):
        mt.GroupedQueryAttention(E, 4, device="meta")
    x = torch.randn(B, L, E, requires_grad=True)
    out = m(x)
    out.sum().backward()
    with pytest.raises(ValueError, match="context"):
        out.sum().backward()


# ---- scaled_dot_product_attention -----------------------------------------------
def sdpa_formula(q, k, v, mask=None, causal=False, scale=None):
    s = (q.double() @ k.double().transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return s.softmax(-1) @ v.double()


@pytest.mark.parametrize("kw", [
    {}, dict(is_causal=True), dict(scale=0.3),
    dict(attn_mask=torch.rand(5, 7) < 0.7), dict(attn_mask=torch.randn(2, 3, 5, 7)),
], ids=["plain", "causal", "scale", "bool-mask-2d", "float-mask-4d"])
def test_sdpa_equals_the_formula(kw):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g) for n in (5, 7, 7))
    if "attn_mask" in kw and kw["attn_mask"].dtype == torch.bool:
        kw["attn_mask"][:, 0] = True  # no fully masked row
    causal = kw.get("is_causal", False)
    out = mt.scaled_dot_product_attention(q, k, v, **kw)
    ref = sdpa_formula(q, k, v, kw.get("attn_mask"), causal, kw.get("scale"))
    assert (out.double() - ref).abs().max().item() <= 1e-6


# The gradient cases: (name, kwargs); masks leave every row a key.
def sdpa_grad_cases():
    g = torch.Generator().manual_seed(3)
    bool2d = torch.rand(5, 7, generator=g) < 0.6
    bool2d[:, 0] = True
    return [
        ("plain", {}),
        ("causal", dict(is_causal=True)),
        ("scale", dict(scale=0.3)),
        ("bool-mask-2d", dict(attn_mask=bool2d)),
        ("float-mask-4d", dict(attn_mask=torch.randn(2, 3, 5, 7, generator=g))),
        ("causal-bool-mask-scale", dict(attn_mask=bool2d, is_causal=True, scale=1.7)),
    ]


@pytest.mark.parametrize("case", range(6), ids=[n for n, _ in sdpa_grad_cases()])
def test_sdpa_gradcheck_float64(case):
    _, kw = sdpa_grad_cases()[case]
    kw = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kw.items()}
    g = torch.Generator().manual_seed(case)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64, requires_grad=True) for n in (5, 7, 7))
    assert torch.autograd.gradcheck(lambda q, k, v: mt.scaled_dot_product_attention(q, k, v, **kw), (q, k, v))


def test_sdpa_gradcheck_float64_self_attention_and_dropout():
    """One tensor as query, key and value (three gradients summed by
    autograd), and dropout with a fixed seed (the backward drops the same
    elements)."""
    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: mt.scaled_dot_product_attention(x, x, x, is_causal=True), (x,))
    q, k, v = (torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True) for n in (5, 7, 7))
    assert torch.autograd.gradcheck(
        lambda q, k, v: mt.scaled_dot_product_attention(q, k, v, dropout_p=0.3, dropout_seed=11), (q, k, v))


@pytest.mark.parametrize("case", range(6), ids=[n for n, _ in sdpa_grad_cases()])
def test_sdpa_float32_gradients_equal_the_formula(case):
    """float32 gradients within 1e-5 of float64 autograd through the plain-torch formula."""
    _, kw = sdpa_grad_cases()[case]
    g = torch.Generator().manual_seed(10 + case)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, requires_grad=True) for n in (5, 7, 7))
    d = torch.randn(2, 3, 5, 4, generator=g)
    out = mt.scaled_dot_product_attention(q, k, v, **kw)
    ours = torch.autograd.grad(out, (q, k, v), d)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = sdpa_formula(*ref_in, kw.get("attn_mask"), kw.get("is_causal", False), kw.get("scale"))
    refs = torch.autograd.grad(ref, ref_in, d.double())
    for name, a, b in zip(("query", "key", "value"), ours, refs):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert (a.double() - b).abs().max().item() <= 1e-5, name


def test_sdpa_hostile_gradients():
    q = torch.randn(2, 5, 4, requires_grad=True)
    mask = torch.ones(5, 5, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask: requires_grad"):
        mt.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    out = mt.scaled_dot_product_attention(q, q, q)
    out.sum().backward()
    with pytest.raises(ValueError, match="context"):
        out.sum().backward()
    out, w = mt.scaled_dot_product_attention(q, q, q, need_weights=True)
    assert w.shape == (2, 5, 5)
    with pytest.raises(ValueError, match="weights: no gradient flows through it"):
        (out.sum() + w.sum()).backward()
    with torch.no_grad():
        assert mt.scaled_dot_product_attention(q, q, q).shape == (2, 5, 4)
    with pytest.raises(TypeError, match="key"):
        mt.scaled_dot_product_attention(q.detach(), q.detach().double(), q.detach())


def test_sdpa_binding_backward_refuses_other_contexts():
    import multihead
    with pytest.raises(TypeError, match="context: expected a multihead.SdpaContext"):
        multihead.scaled_dot_product_attention_backward(None, torch.zeros(1).numpy())
    x = torch.randn(2, 5, 4).numpy()
    out, w, ctx = multihead.scaled_dot_product_attention_with_context(x, x, x)
    assert w is None and ctx.dtype == "float32"
    with pytest.raises(ValueError, match="d_output"):
        multihead.scaled_dot_product_attention_backward(ctx, x[:, :4])
