"""multihead.torch in bfloat16 / float16: MultiheadAttention(...).to(torch.bfloat16),
replace_attention on a bf16 model, and scaled_dot_product_attention on bf16/f16
tensors run the library's 16-bit forward and backward (python/multihead/torch.py).

Checked against torch 1.13's own bf16 nn.MultiheadAttention on the same
weights: both against a float64 reference on the same (rounded) numbers, ours
within docs/precision.md's bound (test_narrow.mha_bound) and our RMS error at
most 1.5x torch's (issue 19's bar). That our path really ran is checked by
data pointers (the library read the tensor's memory in place).
"""
import math

import numpy as np
import pytest
import torch
from torch import nn

import multihead
import multihead.torch as mt
from test_narrow import mha_bound, sdpa_bound

E, H, L, N = 32, 4, 19, 2


def rms(e):
    return math.sqrt(float(np.mean(np.asarray(e, np.float64) ** 2)))


def pair(seed, dtype):
    """(torch's module, ours) with the same 16-bit weights."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(E, H).to(dtype)
    ours = mt.MultiheadAttention(E, H).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_module_matches_the_bound_and_torch(causal):
    torch_m, ours = pair(1, torch.bfloat16)
    x = torch.randn(L, N, E, generator=torch.Generator().manual_seed(2)).bfloat16()
    mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
    with torch.no_grad():
        out, w = ours(x, x, x, need_weights=False, attn_mask=mask)
        t_out, _ = torch_m(x, x, x, need_weights=False, attn_mask=mask)
    assert out.dtype == torch.bfloat16 and out.shape == (L, N, E) and w is None
    # Our path ran: the library read x's memory in place.
    assert multihead._debug_last_call()["query"] == x.data_ptr()
    p = {k: v.double().numpy() for k, v in ours.state_dict().items()}
    ref, bound = mha_bound(x.double().numpy(), p["in_proj_weight"], p["in_proj_bias"], p["out_proj.weight"],
                           p["out_proj.bias"], H, "bfloat16", causal)
    err = np.abs(out.double().numpy() - ref)
    t_err = np.abs(t_out.double().numpy() - ref)
    assert np.all(err <= bound), (err / bound).max()
    assert rms(err) <= 1.5 * rms(t_err), (rms(err), rms(t_err))
    print(f"torch bf16 {'causal' if causal else 'full'}: RMS error ours {rms(err):.3g}, torch {rms(t_err):.3g}")


def test_float16_module_within_the_bound():
    _, ours = pair(3, torch.float16)
    x = torch.randn(L, N, E, generator=torch.Generator().manual_seed(4)).half()
    with torch.no_grad():
        out, _ = ours(x, x, x, need_weights=False)
    assert out.dtype == torch.float16
    p = {k: v.double().numpy() for k, v in ours.state_dict().items()}
    ref, bound = mha_bound(x.double().numpy(), p["in_proj_weight"], p["in_proj_bias"], p["out_proj.weight"],
                           p["out_proj.bias"], H, "float16", False)
    assert np.all(np.abs(out.double().numpy() - ref) <= bound)


def test_replace_attention_in_a_bf16_encoder_layer():
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, dropout=0.0).to(torch.bfloat16).eval()
    x = torch.randn(L, N, E, generator=torch.Generator().manual_seed(6)).bfloat16()
    ref64 = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, dropout=0.0).double().eval()
    ref64.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    with torch.no_grad():
        t_out = layer(x)
        exact = ref64(x.double())
        mt.replace_attention(layer)
        assert isinstance(layer.self_attn, mt.MultiheadAttention)
        out = layer(x)
    assert out.dtype == torch.bfloat16
    err, t_err = (out.double() - exact).numpy(), (t_out.double() - exact).numpy()
    assert rms(err) <= 1.5 * rms(t_err), (rms(err), rms(t_err))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_sdpa_on_16_bit_tensors(dtype):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=g).to(dtype) for _ in range(3))
    with torch.no_grad():
        out = mt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == dtype and out.shape == (2, 3, 17, 8)
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    ref, eo = sdpa_bound(q.double().numpy(), k.double().numpy(), v.double().numpy(), name, True)
    assert np.all(np.abs(out.double().numpy() - ref) <= 1.05 * eo)


def grads_of(module, q, k, v, d):
    ts = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, _ = module(*ts, need_weights=False)
    module.zero_grad()
    out.backward(d)
    g = {"query": ts[0].grad, "key": ts[1].grad, "value": ts[2].grad}
    g.update({n: p.grad for n, p in module.named_parameters()})
    return out, g


def test_bf16_training_step_against_float64_and_torch():
    """Gradients of every input and parameter through autograd (our
    _LibraryFunction on the library's 16-bit backward) against torch's float64
    autograd on the same numbers: RMS error at most 1.5x torch's own bf16."""
    torch_m, ours = pair(9, torch.bfloat16)
    g = torch.Generator().manual_seed(10)
    q, k, v, d = (torch.randn(L, N, E, generator=g).bfloat16() for _ in range(4))
    out, ours_g = grads_of(ours, q, k, v, d)
    assert out.dtype == torch.bfloat16 and all(t.dtype == torch.bfloat16 for t in ours_g.values())
    _, torch_g = grads_of(torch_m, q, k, v, d)
    m64 = nn.MultiheadAttention(E, H).double()
    m64.load_state_dict({n: t.double() for n, t in torch_m.state_dict().items()})
    _, ref = grads_of(m64, q.double(), k.double(), v.double(), d.double())
    for n in ref:
        e, t = rms((ours_g[n].double() - ref[n]).numpy()), rms((torch_g[n].double() - ref[n]).numpy())
        assert e <= 1.5 * t, (n, e, t)
    # An optimizer step runs on the bf16 Parameters; the next forward sees it.
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt.step()
    with torch.no_grad():
        after, _ = ours(q, k, v, need_weights=False)
    assert not torch.equal(after, out.detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_sdpa_backward_on_16_bit_tensors(dtype):
    g = torch.Generator().manual_seed(11)
    q, k, v, d = (torch.randn(2, 3, 9, 8, generator=g).to(dtype) for _ in range(4))
    ts = [t.clone().requires_grad_() for t in (q, k, v)]
    out = mt.scaled_dot_product_attention(*ts, is_causal=True)
    out.backward(d)
    assert out.dtype == dtype and all(t.grad.dtype == dtype for t in ts)
    # The same bits as the extension's own backward (the glue adds nothing).
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    bits = [t.view(torch.int16).numpy().view(np.uint16) for t in (q, k, v, d)]
    _, _, ctx = multihead.scaled_dot_product_attention_with_context(*bits[:3], is_causal=True, dtype=name)
    for a, t in zip(multihead.scaled_dot_product_attention_backward(ctx, bits[3]), ts):
        assert np.array_equal(a, t.grad.view(torch.int16).numpy().view(np.uint16))


def test_replace_attention_trains_a_bf16_encoder_layer():
    torch.manual_seed(12)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, dropout=0.0).to(torch.bfloat16)
    x = torch.randn(L, N, E, generator=torch.Generator().manual_seed(13)).bfloat16()
    ref64 = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, dropout=0.0).double()
    ref64.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})

    def attention_grads(model, xin):
        model.zero_grad()
        model(xin).float().square().sum().backward() if xin.dtype != torch.float64 else \
            model(xin).square().sum().backward()
        return {n: p.grad.double() for n, p in model.self_attn.named_parameters()}
    t_g = attention_grads(layer, x)
    ref = attention_grads(ref64, x.double())
    mt.replace_attention(layer)
    o_g = attention_grads(layer, x)
    for n in ref:
        e, t = rms((o_g[n] - ref[n]).numpy()), rms((t_g[n] - ref[n]).numpy())
        assert e <= 1.5 * t, (n, e, t)


def test_16_bit_refusals_name_the_argument():
    _, ours = pair(8, torch.bfloat16)
    x = torch.randn(L, N, E).bfloat16()
    with torch.no_grad():
        with pytest.raises(ValueError, match="need_weights"):
            ours(x, x, x)
        with pytest.raises(TypeError, match="query"):
            ours(x.float(), x, x, need_weights=False)
    with pytest.raises(ValueError, match="need_weights"):  # with autograd too
        ours(x, x, x)
    q = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="dtype"):
        mt.scaled_dot_product_attention(q, q, q, dtype="float32")
