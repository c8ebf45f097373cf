"""Hostile input to multihead.torch: each case raises ValueError or TypeError
whose message names the argument (no crash, no silent fallback), or, where
torch accepts the input (a non-contiguous tensor), gives torch's result."""
import pytest
import torch
from torch import nn

import multihead.torch as mt

E, H, L, S, N = 8, 2, 4, 5, 2


@pytest.fixture
def mha():
    torch.manual_seed(0)
    return mt.MultiheadAttention(E, H)


def qkv(dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(L, N, E, generator=g, dtype=dtype)
    k = torch.randn(S, N, E, generator=g, dtype=dtype)
    v = torch.randn(S, N, E, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def meta(t):
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def half_in_proj(m):
    m.in_proj_weight.data = m.in_proj_weight.data.half()
    return m


# name: (exception, message fragment, call(mha, q, k, v))
FORWARD_CASES = {
    "query-float16": (TypeError, "query", lambda m, q, k, v: m(q.half(), k, v)),
    "query-int64": (TypeError, "query", lambda m, q, k, v: m(q.long(), k, v)),
    "query-float64-module-float32": (TypeError, "query", lambda m, q, k, v: m(q.double(), k, v)),
    "key-float64": (TypeError, "key", lambda m, q, k, v: m(q, k.double(), v)),
    "value-not-a-tensor": (TypeError, "value", lambda m, q, k, v: m(q, k, v.detach().numpy())),
    "query-meta-device": (ValueError, "query", lambda m, q, k, v: m(meta(q), k, v)),
    "query-wrong-embed": (ValueError, "query", lambda m, q, k, v: m(torch.randn(L, N, E + 1), k, v)),
    "query-4d": (ValueError, "query", lambda m, q, k, v: m(q[None], k[None], v[None])),
    "key-wrong-batch": (ValueError, "key", lambda m, q, k, v: m(q, k[:, :1], v[:, :1])),
    "value-wrong-length": (ValueError, "value", lambda m, q, k, v: m(q, k, v[:-1])),
    "attn_mask-wrong-shape": (ValueError, "attn_mask", lambda m, q, k, v: m(q, k, v, attn_mask=torch.zeros(L, S + 1))),
    "attn_mask-int64": (TypeError, "attn_mask",
                        lambda m, q, k, v: m(q, k, v, attn_mask=torch.zeros(L, S, dtype=torch.long))),
    "attn_mask-requires_grad": (ValueError, "attn_mask",
                                lambda m, q, k, v: m(q, k, v, attn_mask=torch.zeros(L, S, requires_grad=True))),
    "attn_mask-meta-device": (ValueError, "attn_mask",
                              lambda m, q, k, v: m(q, k, v, attn_mask=torch.zeros(L, S, device="meta"))),
    "key_padding_mask-wrong-shape": (ValueError, "key_padding_mask",
                                     lambda m, q, k, v: m(q, k, v, key_padding_mask=torch.zeros(N + 1, S,
                                                                                               dtype=torch.bool))),
    "key_padding_mask-requires_grad": (ValueError, "key_padding_mask",
                                       lambda m, q, k, v: m(q, k, v, key_padding_mask=torch.zeros(N, S,
                                                                                                 requires_grad=True))),
    "unknown-keyword": (TypeError, "form", lambda m, q, k, v: m(q, k, v, form="textbook")),
    "masked_rows-bad-value": (ValueError, "masked_rows", lambda m, q, k, v: m(q, k, v, masked_rows="ones")),
    "parameters-on-meta": (ValueError, "in_proj_weight", lambda m, q, k, v: m.to("meta")(q, k, v)),
    "parameter-half": (TypeError, "in_proj_weight", lambda m, q, k, v: half_in_proj(m)(q, k, v)),
}


@pytest.mark.parametrize("name", list(FORWARD_CASES))
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_forward_rejects_naming_the_argument(mha, name, grad):
    exc, fragment, call = FORWARD_CASES[name]
    q, k, v = qkv(grad=grad)
    with pytest.raises(exc, match=fragment):
        call(mha, q, k, v)
    # The module still works afterwards.
    mha2 = mt.MultiheadAttention(E, H)
    assert mha2(*qkv())[0].shape == (L, N, E)


@pytest.mark.parametrize("kwargs, exc, fragment", [
    (dict(device="meta"), ValueError, "device"),
    (dict(dtype=torch.complex64), TypeError, "dtype"),
    (dict(dtype=torch.int32), TypeError, "dtype"),
], ids=["device-meta", "dtype-complex64", "dtype-int32"])
def test_constructor_rejects_naming_the_argument(kwargs, exc, fragment):
    with pytest.raises(exc, match=fragment):
        mt.MultiheadAttention(E, H, **kwargs)


def test_from_torch_rejects_a_mixed_dtype_module():
    # (A whole float16 / bfloat16 module runs the 16-bit path: test_torch_narrow.py.)
    m = mt.replace_attention(nn.MultiheadAttention(E, H))
    m.in_proj_weight.data = m.in_proj_weight.data.bfloat16()
    with pytest.raises(TypeError, match="in_proj_weight"), torch.no_grad():
        m(*qkv())


def test_non_contiguous_inputs_give_the_contiguous_result(mha):
    q, k, v = qkv(grad=True)
    ref_out = mha(q, k, v)[0]
    ref_g = torch.autograd.grad(ref_out.sum(), [q, k, v])
    # The same values through transposed storage (strides (E, L*E, 1)), and a sliced mask.
    qt, kt, vt = (t.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_() for t in (q, k, v))
    assert not qt.is_contiguous()
    mask = torch.zeros(L, 2 * S, dtype=torch.bool)[:, ::2]
    out = mha(qt, kt, vt, attn_mask=mask)[0]
    g = torch.autograd.grad(out.sum(), [qt, kt, vt])
    assert torch.equal(out, ref_out)
    for a, b in zip(g, ref_g):
        assert torch.equal(a, b)


def test_backward_twice_names_the_context(mha):
    q, k, v = qkv(grad=True)
    out, _ = mha(q, k, v)
    out.sum().backward()
    with pytest.raises(ValueError, match="context"):
        out.sum().backward()
    # With retain_graph=True a second backward is allowed, as in torch.
    q.grad = None
    out, _ = mha(q, k, v)
    out.sum().backward(retain_graph=True)
    g1 = q.grad.clone()
    out.sum().backward()
    assert torch.allclose(q.grad, 2 * g1)


def test_gradient_through_the_weights_names_them(mha):
    """The library has no backward through the weights: a loss that uses
    them is refused (never a silently missing term); detached, they are fine."""
    q, k, v = qkv(grad=True)
    for loss in (lambda o, w: w.sum(), lambda o, w: o.sum() + (w * w).sum()):
        out, w = mha(q, k, v)
        with pytest.raises(ValueError, match="attn_output_weights"):
            loss(out, w).backward()
    out, w = mha(q, k, v)
    (out.sum() + w.detach().sum()).backward()
    assert q.grad is not None


def test_backward_after_a_parameter_update_is_refused_naming_it(mha):
    """The library module reads the Parameters' memory (no copy), so a
    backward after they changed in place would mix old and new values: it
    is refused naming the parameter, as torch's own module refuses it (its
    saved weights were modified in place). A forward meanwhile is fine."""
    q, k, v = qkv(grad=True)
    out, _ = mha(q, k, v)
    with torch.no_grad():
        mha.in_proj_weight.mul_(3)
        mha(q, k, v)  # a forward with the new parameters meanwhile
    with pytest.raises(ValueError, match=r"in_proj_weight: modified in place since the MultiheadAttention forward"):
        torch.autograd.grad(out.sum(), [q])
    ref = nn.MultiheadAttention(E, H)
    out_ref, _ = ref(q, k, v)
    with torch.no_grad():
        ref.in_proj_weight.mul_(3)
    with pytest.raises(RuntimeError, match="inplace"):
        torch.autograd.grad(out_ref.sum(), [q])
    out, _ = mha(q, k, v)  # a new forward reads the new values
    assert torch.autograd.grad(out.sum(), [q])[0] is not None


def test_a_parameter_the_module_was_not_built_with_is_refused_not_ignored():
    """A bias put on a projection of a bias=False module was silently left out of the output; a removed one was a
    bare KeyError. Both now name the parameter."""
    x = torch.randn(2, 5, 16)
    g = mt.GroupedQueryAttention(16, 4, num_kv_heads=2, bias=False, causal=False)
    g.o_proj = nn.Linear(16, 16, bias=True)
    with pytest.raises(ValueError, match=r"o_proj\.bias: not a parameter of this module as it was built"):
        g(x)
    m = mt.MultiheadAttention(16, 4)
    m.out_proj.bias = None
    with pytest.raises(ValueError, match=r"out_proj\.bias: expected a Parameter .* got None"):
        m(x, x, x)


def test_sdpa_names_the_querys_dtype():
    q = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"key: expected torch\.float64 \(query's dtype\), got torch\.float32"):
        mt.scaled_dot_product_attention(q.double(), q, q)
