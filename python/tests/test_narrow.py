"""dtype='bfloat16' / 'float16': MultiheadAttention and scaled_dot_product_attention
in 16-bit storage from Python (python/src/arrays.hpp's narrow_tensor, module.cpp).

- The rounding on the way in (float32 -> 16 bits) is bit for bit torch's
  .to(torch.bfloat16) / .to(torch.float16) on hostile values: ties, subnormals,
  the largest finite value and just beyond it, inf; NaN stays NaN (torch 1.13
  writes 0xffff for every NaN, ours keeps the sign: both NaN).
- Forward outputs against a float64 reference (numpy, written here) on the same
  rounded numbers, within the first-order bound docs/precision.md derives
  ("The error bound"; evaluated here by `mha_bound` / `sdpa_bound` on the
  float64 intermediates, times 1.05 for the second-order terms, as
  tests/precision/test_precision.cpp does). bf16 also against PyTorch 1.13's
  own bf16 nn.MultiheadAttention: our RMS error at most 1.5x its (issue 19).
- The output is the query's kind: uint16 bits, float16, or float32 (widened).
- state_dict / load_state_dict / save_weights / load_weights in the 16-bit type.
- Hostile input: one ValueError (or TypeError for a dtype= no call knows) each,
  naming the argument, inputs unchanged.
"""
import math
import os
import tempfile

import numpy as np
import pytest

import multihead

torch = pytest.importorskip("torch")

U = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
U32 = 2.0 ** -24
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def gamma(n):
    return n * U32 / (1 - n * U32)


def product_gamma(n, dtype):
    """The bound of a projection's float32 sum of n products: gamma(n), or for
    float16 on the bf16x3 way (f16_gemm_current; docs/precision.md, "f16
    products on a bf16 matmul") gamma(3n) (1 + 2^-7)^2 + 2^-16."""
    if dtype == "float16" and multihead.f16_gemm_current().startswith("bf16x3"):
        return gamma(3 * n) * (1 + 2.0 ** -7) ** 2 + 2.0 ** -16
    return gamma(n)


def test_f16_gemm_switch():
    """f16_gemm_force chooses the way f16_gemm_current reports; a bad name is
    a ValueError naming the accepted ones."""
    try:
        multihead.f16_gemm_force("widen")
        assert multihead.f16_gemm_current() == "widen (forced)"
        multihead.f16_gemm_force("bf16x3")
        assert multihead.f16_gemm_current().startswith(("bf16x3 (forced", "widen (bf16x3 forced, but"))
        with pytest.raises(ValueError, match="expected one of auto, widen, bf16x3"):
            multihead.f16_gemm_force("fp16")
    finally:
        multihead.f16_gemm_force("")


def bits(x, dtype):
    """float32 -> the 16-bit type's bits (uint16), rounded by torch."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(TORCH[dtype]).view(torch.int16).numpy().view(np.uint16)


def widen(b, dtype):
    """16-bit bits (uint16) -> float64, exact."""
    return torch.from_numpy(np.ascontiguousarray(b).view(np.int16)).view(TORCH[dtype]).double().numpy()


def rounded(x, dtype):
    return widen(bits(x, dtype), dtype)


# ---- the rounding ------------------------------------------------------------------
def hostile_floats():
    f32 = np.float32
    bf_ulp1 = 2.0 ** -7  # bf16's ulp at 1
    h_ulp1 = 2.0 ** -10
    v = [0.0, -0.0, 1.0, -1.0,
         # bf16 ties: halfway between 1 and 1+ulp (to even: 1), between 1+ulp and 1+2ulp (to 1+2ulp)
         1 + bf_ulp1 / 2, 1 + 1.5 * bf_ulp1, -(1 + bf_ulp1 / 2), 1 + bf_ulp1 / 2 + 2.0 ** -23,
         # f16 ties
         1 + h_ulp1 / 2, 1 + 1.5 * h_ulp1, 2048 + 1, 2048 + 3,
         # largest finite and beyond: bf16 max 0x7f7f = 3.3895e38, f32 max; f16 max 65504, tie 65520
         3.3895313892515355e38, 3.3961e38, float(np.finfo(f32).max), -float(np.finfo(f32).max),
         65504.0, 65519.99, 65520.0, -65520.0, 70000.0,
         # subnormals: float32's (bf16 keeps them), f16's, and ties below f16's smallest
         1e-40, -1e-40, 1.4e-45, 9.2e-41, 5.9e-39, float(np.finfo(f32).tiny),
         2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 3 * 2.0 ** -25, 6e-5, 6.1e-5, 1e-7,
         math.inf, -math.inf, math.nan, -math.nan]
    rng = np.random.default_rng(7)
    r = rng.standard_normal(200) * np.exp(rng.uniform(-30, 30, 200))
    return np.concatenate([np.array(v, np.float32), r.astype(np.float32)])


def same_bits(ours, ref, dtype):
    """Bitwise equal, except that every NaN equals every NaN."""
    nan = np.isnan(widen(ref, dtype))
    assert np.array_equal(np.isnan(widen(ours, dtype)), nan)
    bad = np.nonzero((ours != ref) & ~nan)[0]
    assert bad.size == 0, [(hex(ours[i]), hex(ref[i])) for i in bad[:5]]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rounding_is_torchs_bit_for_bit(dtype):
    f = hostile_floats()
    ref = bits(f, dtype)
    # Through load_state_dict (a float32 parameter rounded) and state_dict (its bits).
    n = f.size
    m2 = multihead.MultiheadAttention(n, 1, dtype=dtype)
    sd = m2.state_dict()
    sd["out_proj.bias"] = f
    m2.load_state_dict(sd)
    same_bits(m2.state_dict()["out_proj.bias"], ref, dtype)
    # Through a forward input: one key, so the output is round(value) exactly
    # (p = 1), except that the float32 sum 1*(-0) + 0 is +0.
    # bf16 through the float way: the pair way (vdpbf16ps) flushes subnormal
    # operands to zero, checked below.
    z = np.zeros((n, 1, 1), np.uint16)
    multihead.bf16_dot_force("fma")
    try:
        out = multihead.scaled_dot_product_attention(z, z, f.reshape(n, 1, 1), dtype=dtype).reshape(n)
    finally:
        multihead.bf16_dot_force("")
    nonzero = widen(ref, dtype) != 0
    same_bits(out[nonzero], ref[nonzero], dtype)
    assert np.all(out[~nonzero] == 0)
    if dtype == "bfloat16":
        # The pair way: the same bits, except that a subnormal value (below
        # 2^-126) comes out as zero where vdpbf16ps runs (docs/precision.md).
        multihead.bf16_dot_force("dpbf16")
        try:
            pair = multihead.scaled_dot_product_attention(z, z, f.reshape(n, 1, 1), dtype=dtype).reshape(n)
        finally:
            multihead.bf16_dot_force("")
        normal = nonzero & ~(np.abs(widen(ref, dtype)) < 2.0 ** -126)
        same_bits(pair[normal], ref[normal], dtype)
        sub = nonzero & ~normal
        assert np.all((pair[sub] == ref[sub]) | (widen(pair[sub], dtype) == 0))


# ---- float64 references and the bound (docs/precision.md) -----------------------------
def softmax_rows(s):
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def pair_way(dtype):
    """Whether bf16 attention may round P to bf16 before PV now: the flash kernel's pair way
    (bf16_dot_current), or the matmul way (narrow_attention_current: forced, or auto on AMX for
    calls of at least 128 query rows), whose weights round the same way."""
    return dtype == "bfloat16" and (multihead.bf16_dot_current().startswith("dpbf16")
                                    or multihead.narrow_attention_current().startswith("matmul"))


def attention_with_bound(q, k, v, eq, ek, ev, u, causal, scale, pair_way=False):
    """o = softmax(scale q k^T [+ causal]) v in float64 and the bound e_o
    (docs/precision.md: scores, attention output), per (..., L, Dv)."""
    L, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    s = scale * q @ np.swapaxes(k, -1, -2)
    mask = np.zeros((L, S))
    if causal:
        mask[np.triu_indices(L, 1, S)] = -np.inf
    s = s + mask
    p = softmax_rows(s)
    o = p @ v
    aq, ak = np.abs(q), np.abs(k)
    es = scale * (aq @ np.swapaxes(ek, -1, -2) + eq @ np.swapaxes(ak, -1, -2) + eq @ np.swapaxes(ek, -1, -2))
    es = es + gamma(D + 2) * (scale * aq @ np.swapaxes(ak, -1, -2))
    if pair_way:
        es = es + scale * D * 2.0 ** -126  # vdpbf16ps flushes a subnormal product
    es = np.where(np.isinf(mask), 0.0, es)
    grow = np.exp(2 * es.max(axis=-1, keepdims=True))  # (..., L, 1)
    # sum_j p_ij e_s,ij |V_j - o_i|, per output column d
    dv = np.abs(v[..., None, :, :] - o[..., :, None, :])  # (..., L, S, Dv)
    term1 = grow * np.einsum("...ij,...ijd->...id", p * es, dv)
    eo = term1 + p @ ev + gamma(2 * S + 8) * (p @ np.abs(v)) + u * np.abs(o)
    if pair_way:
        # The bf16 pair way (docs/precision.md): P rounded to bf16 before PV,
        # + u·Σ_j p_ij |V_j|, and flushed subnormals, + 2^-126·Σ_j |V_j|
        # (the scores' flush term, scale·D·2^-126, is in es above).
        eo = eo + u * (p @ np.abs(v)) + 2.0 ** -126 * np.abs(v).sum(axis=-2, keepdims=True)
    return o, eo


def sdpa_bound(q, k, v, dtype, causal):
    D = q.shape[-1]
    z = np.zeros_like
    return attention_with_bound(q, k, v, z(q), z(k), z(v), U[dtype], causal, 1 / math.sqrt(D), pair_way(dtype))


def mha_bound(x, w_in, b_in, w_out, b_out, H, dtype, causal):
    """Self-attention (L, N, E) seq-first: the output and 1.05 e_y."""
    u = U[dtype]
    L, N, E = x.shape
    D = E // H
    xs = np.transpose(x, (1, 0, 2))  # (N, L, E)
    proj, err = [], []
    for i in range(3):
        w, b = w_in[i * E:(i + 1) * E], b_in[i * E:(i + 1) * E]
        y = xs @ w.T + b
        proj.append(y)
        err.append(u * np.abs(y) + product_gamma(E + 1, dtype) * (np.abs(xs) @ np.abs(w).T + np.abs(b)))

    def heads(t):  # (N, L, E) -> (N, H, L, D)
        return t.reshape(N, L, H, D).transpose(0, 2, 1, 3)

    o, eo = attention_with_bound(*[heads(t) for t in proj], *[heads(t) for t in err], u, causal, 1 / math.sqrt(D),
                                 pair_way(dtype))
    o = o.transpose(0, 2, 1, 3).reshape(N, L, E)
    eo = eo.transpose(0, 2, 1, 3).reshape(N, L, E)
    y = o @ w_out.T + b_out
    ey = eo @ np.abs(w_out).T + product_gamma(E + 1, dtype) * (np.abs(o) @ np.abs(w_out).T + np.abs(b_out)) + u * np.abs(y)
    return np.transpose(y, (1, 0, 2)), 1.05 * np.transpose(ey, (1, 0, 2))


# (E, H, L, N, causal, seed): around the flash kernel's tiles, 1..4 heads.
MHA_CASES = [(8, 1, 5, 2, False, 1), (16, 2, 17, 1, True, 2), (24, 3, 33, 2, False, 3),
             (32, 4, 40, 1, True, 4), (64, 4, 16, 3, False, 5), (48, 2, 65, 1, True, 6)]


def module_and_input(dtype, E, H, L, N, seed):
    rng = np.random.default_rng(seed)
    m = multihead.MultiheadAttention(E, H, dtype=dtype)
    sd = {"in_proj_weight": rng.standard_normal((3 * E, E)) / math.sqrt(E),
          "in_proj_bias": rng.standard_normal(3 * E) * 0.5,
          "out_proj.weight": rng.standard_normal((E, E)) / math.sqrt(E),
          "out_proj.bias": rng.standard_normal(E) * 0.5}
    m.load_state_dict({k: v.astype(np.float32) for k, v in sd.items()})
    x = rng.standard_normal((L, N, E)).astype(np.float32)
    return m, x


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", MHA_CASES, ids=lambda c: "E%d-H%d-L%d-N%d-%s" % (c[:4] + ("causal" if c[4] else "full",)))
def test_mha_forward_within_the_derived_bound(dtype, case):
    E, H, L, N, causal, seed = case
    m, x = module_and_input(dtype, E, H, L, N, seed)
    xb = bits(x, dtype)
    out, w = m(xb, xb, xb, need_weights=False, is_causal=causal)
    assert w is None and out.dtype == np.uint16 and out.shape == x.shape
    p = {k: widen(v, dtype) for k, v in m.state_dict().items()}
    ref, bound = mha_bound(widen(xb, dtype), p["in_proj_weight"], p["in_proj_bias"], p["out_proj.weight"],
                           p["out_proj.bias"], H, dtype, causal)
    err = np.abs(widen(out, dtype) - ref)
    assert np.all(err <= bound), (err / bound).max()
    print(f"narrow mha {dtype} {case}: max error {err.max():.3g}, max error/bound {(err / bound).max():.3f}")
    if dtype == "bfloat16":
        tm = torch.nn.MultiheadAttention(E, H).to(torch.bfloat16)
        tm.load_state_dict({k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) for k, v in m.state_dict().items()})
        xt = torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16)
        mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
        with torch.no_grad():
            t_out, _ = tm(xt, xt, xt, need_weights=False, attn_mask=mask)
        t_err = np.abs(t_out.double().numpy() - ref)
        rms = lambda e: math.sqrt(float(np.mean(e ** 2)))  # noqa: E731
        assert rms(err) <= 1.5 * rms(t_err), (rms(err), rms(t_err))


def test_narrow_attention_switch_and_the_matmul_way():
    """narrow_attention_force chooses the way narrow_attention_current reports; the matmul way,
    forced (on every CPU), stays within the pair way's bound across its blocks of 256 query rows
    and chunks of 512 keys, causal or not; a bad name is a ValueError naming the accepted ones."""
    try:
        multihead.narrow_attention_force("flash")
        assert multihead.narrow_attention_current() == "flash (forced)"
        multihead.narrow_attention_force("matmul")
        assert multihead.narrow_attention_current().startswith("matmul (forced")
        assert pair_way("bfloat16")
        rng = np.random.default_rng(5)
        for shape, causal in (((2, 600, 16), True), ((1, 300, 8), False)):
            q, k, v = (rng.standard_normal(shape).astype(np.float32) * 2 for _ in range(3))
            out = multihead.scaled_dot_product_attention(q, k, v, is_causal=causal, dtype="bfloat16")
            ref, eo = sdpa_bound(*(rounded(t, "bfloat16") for t in (q, k, v)), "bfloat16", causal)
            err = np.abs(out - ref)
            assert np.all(err <= 1.05 * eo), (err / eo).max()
        with pytest.raises(ValueError, match="expected one of auto, flash, matmul; got 'amx'"):
            multihead.narrow_attention_force("amx")
    finally:
        multihead.narrow_attention_force("")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape,causal", [((2, 3, 7, 16), False), ((1, 2, 33, 8), True), ((4, 17, 4), False),
                                          ((65, 32), True)])
def test_sdpa_within_the_derived_bound(dtype, shape, causal):
    rng = np.random.default_rng(sum(shape))
    q, k, v = (rng.standard_normal(shape).astype(np.float32) * 2 for _ in range(3))
    out = multihead.scaled_dot_product_attention(q, k, v, is_causal=causal, dtype=dtype)
    assert out.dtype == np.float32 and out.shape == shape
    assert np.array_equal(rounded(out, dtype), out.astype(np.float64))  # widened 16-bit values
    ref, eo = sdpa_bound(rounded(q, dtype), rounded(k, dtype), rounded(v, dtype), dtype, causal)
    err = np.abs(out - ref)
    assert np.all(err <= 1.05 * eo), (err / eo).max()
    print(f"narrow sdpa {dtype} {shape}: max error {err.max():.3g}, max error/bound {(err / (1.05 * eo)).max():.3f}")


# ---- the output's kind, and the module's parameters -----------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_output_is_the_querys_kind(dtype):
    m, x = module_and_input(dtype, 16, 2, 6, 2, 11)
    assert m.dtype == dtype and ("dtype=" + dtype) in repr(m)
    xb = bits(x, dtype)
    x_before = x.copy()
    o32, _ = m(x, x, x, need_weights=False)          # float32 in: rounded, float32 out (widened)
    ob, _ = m(xb, xb, xb, need_weights=False)        # bits in, bits out
    assert o32.dtype == np.float32 and ob.dtype == np.uint16
    assert np.array_equal(widen(ob, dtype), o32.astype(np.float64))
    assert np.array_equal(x, x_before)
    if dtype == "float16":                          # numpy's float16 is IEEE binary16: float16 out
        oh, _ = m(x.astype(np.float16), x.astype(np.float16), x.astype(np.float16), need_weights=False)
        assert oh.dtype == np.float16 and np.array_equal(oh.view(np.uint16), ob)
    # The bits are read in place (C-contiguous uint16): no copy.
    m(xb, xb, xb, need_weights=False)
    assert multihead._debug_last_call()["query"] == xb.__array_interface__["data"][0]
    # Mixed kinds: the key as float32, the value as bits; the output follows the query.
    om, _ = m(xb, x, xb, need_weights=False)
    assert om.dtype == np.uint16 and np.array_equal(om, ob)
    s = multihead.scaled_dot_product_attention(xb, xb, xb, dtype=dtype)
    assert s.dtype == np.uint16


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_parameters_stay_in_the_narrow_type(dtype):
    m, x = module_and_input(dtype, 16, 4, 5, 1, 3)
    sd = m.state_dict()
    assert all(v.dtype == np.uint16 for v in sd.values())
    out, _ = m(x, x, x, need_weights=False)
    # torch's .to(dtype) of a float32 module holds exactly these bits.
    tm = torch.nn.MultiheadAttention(16, 4)
    m32 = multihead.MultiheadAttention(16, 4)
    m32.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    mn = multihead.MultiheadAttention(16, 4, dtype=dtype)
    mn.load_state_dict(m32.state_dict())
    for k, v in tm.to(TORCH[dtype]).state_dict().items():
        assert np.array_equal(mn.state_dict()[k], v.view(torch.int16).numpy().view(np.uint16)), k
    # update_parameters: a uint16 copy in, uint16 or float32 (rounded) back.
    seen = []

    def update(name, a):
        seen.append(a.dtype)
        return widen(a, dtype).astype(np.float32) * 2  # exact: doubling a 16-bit value
    m.update_parameters(update)
    assert set(seen) == {np.dtype(np.uint16)}
    for k, v in m.state_dict().items():
        assert np.array_equal(widen(v, dtype), 2 * widen(sd[k], dtype)), k
    m.load_state_dict(sd)
    assert np.array_equal(m(x, x, x, need_weights=False)[0], out)
    # save_weights writes the 16-bit type; load_weights reads it back exactly.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.safetensors")
        multihead.save_weights(path, m)
        info = multihead.inspect(path)
        assert {t["dtype"] for t in info["tensors"].values()} == {dtype}
        back = multihead.load_weights(path, dtype=dtype)
        assert back.dtype == dtype and back.num_heads == 4
        assert np.array_equal(back(x, x, x, need_weights=False)[0], out)
        m32b = multihead.load_weights(path)  # float32 module from the 16-bit file: exact values
        for k, v in m32b.state_dict().items():
            assert np.array_equal(v.astype(np.float64), widen(sd[k], dtype)), k


# ---- the backward ------------------------------------------------------------------------
def rms(e):
    return math.sqrt(float(np.mean(np.asarray(e, np.float64) ** 2)))


def torch_grads(sd, dtype, q, k, v, d, tdtype, H):
    """Gradients of <d, MHA(q, k, v)> by torch autograd in tdtype (float64: the
    reference), the parameters sd (bits of `dtype`)."""
    E = q.shape[-1]
    m = torch.nn.MultiheadAttention(E, H).to(tdtype)
    m.load_state_dict({n: torch.from_numpy(widen(a, dtype)).to(tdtype) for n, a in sd.items()})
    ts = [torch.from_numpy(t).to(tdtype).requires_grad_() for t in (q, k, v)]
    out, _ = m(*ts, need_weights=False)
    out.backward(torch.from_numpy(d).to(tdtype))
    g = {"query": ts[0].grad, "key": ts[1].grad, "value": ts[2].grad}
    g.update({n: p.grad for n, p in m.named_parameters()})
    return {n: t.double().numpy() for n, t in g.items()}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", MHA_CASES[:4], ids=lambda c: "E%d-H%d-L%d-N%d" % c[:4])
def test_mha_backward_against_float64_and_torch_bf16(dtype, case):
    """Every gradient against float64 autograd on the same 16-bit numbers:
    our RMS error at most 1.5x torch 1.13's bf16 module's (issue 19's bar;
    for float16, 1.5x torch's bf16 error scaled by u_f16 / u_bf16 = 1/8, as
    torch 1.13 has no float16 matmul on CPUs). The library's own test
    (tests/precision/test_precision_backward.cpp) checks the derived bound
    per element; this one checks what reaches Python."""
    E, H, L, N, causal, seed = case
    m, x = module_and_input(dtype, E, H, L, N, seed)
    rng = np.random.default_rng(seed + 100)
    q, k, v, d = (rounded(t, dtype).astype(np.float32) for t in
                  (x, rng.standard_normal(x.shape), rng.standard_normal(x.shape), rng.standard_normal(x.shape)))
    qb, kb, vb, db = (bits(t, dtype) for t in (q, k, v, d))
    out, w, ctx = m.forward_with_context(qb, kb, vb, need_weights=False)
    assert ctx.dtype == dtype and not ctx.empty and w is None
    assert np.array_equal(out, m(qb, kb, vb, need_weights=False)[0])  # the training forward's bits
    g = m.backward(ctx, db)
    assert all(a.dtype == np.uint16 for a in g.values())
    g32 = m.backward(ctx, d)  # float32 d_output: float32 gradients, the same values widened
    assert all(a.dtype == np.float32 and np.array_equal(a, widen(g[n], dtype)) for n, a in g32.items())
    sd = m.state_dict()
    ref = torch_grads(sd, dtype, q, k, v, d, torch.float64, H)
    tb = torch_grads(sd, dtype, q, k, v, d, torch.bfloat16, H) if dtype == "bfloat16" else None
    if tb is None:  # torch's bf16 error on the bf16-rounded problem, the bar scaled to float16
        mb, _ = module_and_input("bfloat16", E, H, L, N, seed)
        qr, kr, vr, dr = (rounded(t, "bfloat16").astype(np.float32) for t in (q, k, v, d))
        ref_b = torch_grads(mb.state_dict(), "bfloat16", qr, kr, vr, dr, torch.float64, H)
        tb_b = torch_grads(mb.state_dict(), "bfloat16", qr, kr, vr, dr, torch.bfloat16, H)
        bar = {n: 1.5 * rms(tb_b[n] - ref_b[n]) * U["float16"] / U["bfloat16"] for n in ref}
    else:
        bar = {n: 1.5 * rms(tb[n] - ref[n]) for n in ref}
    for n in ref:
        err = rms(widen(g[n], dtype) - ref[n])
        assert err <= bar[n], (n, err, bar[n])
    print(f"narrow backward {dtype} {case[:4]}: worst RMS error / bar "
          f"{max(rms(widen(g[n], dtype) - ref[n]) / bar[n] for n in ref):.2f}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape,causal", [((2, 3, 7, 16), False), ((1, 2, 33, 8), True)])
def test_sdpa_backward_against_float64_and_torch_bf16(dtype, shape, causal):
    """d_query, d_key, d_value against float64 autograd of softmax(q k^T s) v on
    the same numbers; RMS error at most 1.5x torch's bf16 autograd of the same
    composed ops (1.13 has no fused SDPA), scaled by u_f16 / u_bf16 for float16."""
    rng = np.random.default_rng(sum(shape) + 1)
    q, k, v, d = (rounded(rng.standard_normal(shape), "bfloat16").astype(np.float32) for _ in range(4))
    out, w, ctx = multihead.scaled_dot_product_attention_with_context(
        bits(q, dtype), bits(k, dtype), bits(v, dtype), is_causal=causal, dtype=dtype)
    assert ctx.dtype == dtype and w is None and out.dtype == np.uint16
    g = multihead.scaled_dot_product_attention_backward(ctx, bits(d, dtype))

    def composed(tdtype):
        ts = [torch.from_numpy(t).to(tdtype).requires_grad_() for t in (q, k, v)]
        s = ts[0] @ ts[1].transpose(-1, -2) / math.sqrt(shape[-1])
        if causal:
            s = s.masked_fill(torch.ones(shape[-2], shape[-2], dtype=torch.bool).triu(1), -math.inf)
        (torch.softmax(s, -1) @ ts[2]).backward(torch.from_numpy(d).to(tdtype))
        return [t.grad.double().numpy() for t in ts]
    ref, tb = composed(torch.float64), composed(torch.bfloat16)
    scale = 1.0 if dtype == "bfloat16" else U["float16"] / U["bfloat16"]
    for name, a, r, t in zip(("d_query", "d_key", "d_value"), g, ref, tb):
        assert a.dtype == np.uint16
        assert rms(widen(a, dtype) - r) <= 1.5 * scale * rms(t - r), name


# ---- hostile input ---------------------------------------------------------------------
X = np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float32)
XB = bits(X, "bfloat16")


def bf16():
    return multihead.MultiheadAttention(8, 2, dtype="bfloat16")


def fresh_context_backward(d_output):
    m = bf16()
    return m.backward(m.forward_with_context(XB, XB, XB, need_weights=False)[2], d_output)


def stale_context_backward():
    m = bf16()
    ctx = m.forward_with_context(XB, XB, XB, need_weights=False)[2]
    m.load_state_dict(m.state_dict())  # new parameters (the same values): earlier contexts are refused
    return m.backward(ctx, XB)


SDPA = multihead.scaled_dot_product_attention
HOSTILE = [
    ("float64-query", lambda: bf16()(X.astype(np.float64), X, X, need_weights=False), ValueError,
     ["query", "bfloat16", "uint16", "float32", "got float64"]),
    ("float64-sdpa", lambda: SDPA(X, X.astype(np.float64), X, dtype="bfloat16"), ValueError, ["key", "got float64"]),
    ("float16-into-bf16", lambda: bf16()(X, X, X.astype(np.float16), need_weights=False), ValueError,
     ["value", "bfloat16", "got float16"]),
    ("int8-query", lambda: bf16()(X.astype(np.int8), X, X, need_weights=False), ValueError, ["query", "got int8"]),
    ("uint16-no-dtype-sdpa", lambda: SDPA(XB, XB, XB), ValueError, ["query", "uint16", "dtype='bfloat16'"]),
    ("uint16-float-module", lambda: multihead.MultiheadAttention(8, 2)(XB, XB, XB), ValueError,
     ["query", "uint16", "dtype='bfloat16'"]),
    ("wrong-E", lambda: bf16()(XB[:, :, :4], XB, XB, need_weights=False), ValueError, ["query", "(3, 2, 4)"]),
    ("key-rank", lambda: bf16()(XB, XB[0], XB, need_weights=False), ValueError, ["key", "(2, 8)"]),
    ("sdpa-shape", lambda: SDPA(XB, XB[:, :, :4], XB, dtype="bfloat16"), ValueError, ["key", "(3, 2, 4)"]),
    ("need-weights", lambda: bf16()(XB, XB, XB), ValueError, ["need_weights", "false"]),
    ("sdpa-need-weights", lambda: SDPA(XB, XB, XB, dtype="bfloat16", need_weights=True), ValueError, ["need_weights"]),
    ("textbook", lambda: bf16()(XB, XB, XB, need_weights=False, form="textbook"), ValueError, ["form", "textbook"]),
    ("context-of-a-float-module", lambda: bf16().backward(
        multihead.MultiheadAttention(8, 2).forward_with_context(X, X, X)[2], XB), ValueError,
     ["context", "float32", "bfloat16"]),
    ("context-stale", lambda: stale_context_backward(), ValueError, ["context:", "update_parameters"]),
    ("d_output-float64", lambda: fresh_context_backward(X.astype(np.float64)), ValueError,
     ["d_output", "got float64"]),
    ("d_output-shape", lambda: fresh_context_backward(XB[:2]), ValueError, ["d_output"]),
    ("sdpa-d_output-float64", lambda: multihead.scaled_dot_product_attention_backward(
        multihead.scaled_dot_product_attention_with_context(XB, XB, XB, dtype="bfloat16")[2], X.astype(np.float64)),
     ValueError, ["d_output", "got float64"]),
    ("share", lambda: bf16().share_parameters(bf16().state_dict()), ValueError, ["share_parameters", "bfloat16"]),
    ("state-float64", lambda: bf16().load_state_dict({k: v.astype(np.float64) for k, v in
                                                      multihead.MultiheadAttention(8, 2).state_dict().items()}),
     ValueError, ["in_proj_weight", "got float64"]),
    ("state-shape", lambda: bf16().load_state_dict({**bf16().state_dict(), "out_proj.bias": np.zeros(3, np.uint16)}),
     ValueError, ["out_proj.bias", "(3)"]),
    ("explain", lambda: multihead.explain(bf16(), X[:, 0], format="text"), ValueError, ["module", "bfloat16"]),
    ("dtype-name", lambda: SDPA(X, X, X, dtype="bfloat17"), TypeError, ["dtype", "bfloat17"]),
    ("module-dtype-name", lambda: multihead.MultiheadAttention(8, 2, dtype="int8"), TypeError, ["dtype", "int8"]),
    ("gqa-bf16", lambda: multihead.GroupedQueryAttention(8, 2, dtype="bfloat16"), TypeError,
     ["dtype", "bfloat16", "float32 or float64"]),
]


@pytest.mark.parametrize("name,call,exc,parts", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_one_clear_error(name, call, exc, parts):
    before = (X.copy(), XB.copy())
    with pytest.raises(exc) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, (p, msg)
    assert np.array_equal(X, before[0]) and np.array_equal(XB, before[1])
