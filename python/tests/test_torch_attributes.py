"""multihead.torch follows what torch's modules follow, or refuses it by name:
attributes changed after the first forward (nn.MultiheadAttention reads
batch_first, dropout, add_zero_attn at every call), parameters updated
through .data (which bumps no version counter), and a double backward
(create_graph=True), which the library's first-order backward cannot give:
the gradient's backward raises instead of silently adding nothing."""
import copy

import pytest
import torch
from torch import nn

import multihead.torch as mt

E, H, L, S, N = 8, 2, 5, 7, 3


def close(name, ours, ref):
    bound = 1e-5 * max(1.0, ref.abs().max().item())
    err = (ours - ref).abs().max().item()
    assert err <= bound, f"{name}: max |ours - torch| = {err:.3g} > bound {bound:.3g}"


def pair(dtype=torch.float32, **kw):
    """torch's module and ours holding copies of the same parameters."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, dtype=dtype, **kw)
    with torch.no_grad():  # xavier leaves biases at 0: give them values
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=dtype))
    return ref, mt.MultiheadAttention.from_torch(copy.deepcopy(ref))


def qkv(dtype=torch.float32, batch_first=False, grad=False, length=L, batch=N):
    g = torch.Generator().manual_seed(1)

    def make(n):
        shape = (batch, n, E) if batch_first else (n, batch, E)
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)
    return make(length), make(S), make(S)


def outputs_and_grads(m, q, k, v, **kw):
    out, w = m(q, k, v, **kw)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v, *m.parameters()])
    return out, w, grads


# --- 1. double backward ----------------------------------------------------------------------------------------

FIRST_ORDER = r"first-order only"


def mha_call():
    torch.manual_seed(0)
    m = mt.MultiheadAttention(E, H, dtype=torch.float64)
    x = torch.randn(L, N, E, dtype=torch.float64, requires_grad=True)
    return x, lambda x: m(x, x, x, need_weights=False)[0]


def sdpa_call():
    x = torch.randn(2, L, E, dtype=torch.float64, requires_grad=True)
    return x, lambda x: mt.scaled_dot_product_attention(x, x, x)


def gqa_call():
    torch.manual_seed(0)
    m = mt.GroupedQueryAttention(E, H, dtype=torch.float64)
    x = torch.randn(2, L, E, dtype=torch.float64, requires_grad=True)
    return x, m


def mha_bf16_call():
    torch.manual_seed(0)
    m = mt.MultiheadAttention(E, H).to(torch.bfloat16)
    x = torch.randn(L, N, E, dtype=torch.bfloat16, requires_grad=True)
    return x, lambda x: m(x, x, x, need_weights=False)[0]


DOUBLE_BACKWARD = {"MultiheadAttention": mha_call, "scaled_dot_product_attention": sdpa_call,
                   "GroupedQueryAttention": gqa_call, "MultiheadAttention-bfloat16": mha_bf16_call}


@pytest.mark.parametrize("name", list(DOUBLE_BACKWARD))
def test_double_backward_raises_naming_first_order(name):
    """A gradient penalty through the library: the gradient taken with
    create_graph=True has a graph whose backward raises (it used to have
    none, so the penalty silently added 0). The gradient itself is the
    first-order one, and plain backward is unchanged."""
    x, f = DOUBLE_BACKWARD[name]()
    g_plain, = torch.autograd.grad(f(x).sum(), x)
    g, = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    assert g.requires_grad and g.grad_fn is not None
    assert torch.equal(g.detach(), g_plain)
    penalty = (g.float() ** 2).sum() + (x.float() ** 2).sum()
    with pytest.raises(RuntimeError, match=FIRST_ORDER):
        penalty.backward()
    # autograd.grad reaches the error too (not "x unused", nor, with allow_unused, the other term's gradient alone).
    with pytest.raises(RuntimeError, match=FIRST_ORDER):
        torch.autograd.grad(g.sum(), x)
    g, = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=FIRST_ORDER):
        torch.autograd.grad((g.float() ** 2).sum() + (x.float() ** 2).sum(), x, allow_unused=True)
    # Plain training still works.
    x.grad = None
    f(x).sum().backward()
    assert torch.equal(x.grad, g_plain)


def test_double_backward_names_the_module_in_a_model():
    """Through a model (replace_attention), the error names multihead's attention."""
    torch.manual_seed(0)
    model = mt.replace_attention(nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0))
    x = torch.randn(L, N, E, requires_grad=True)
    g, = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"MultiheadAttention: multihead's backward is " + FIRST_ORDER):
        (g ** 2).sum().backward()


# --- 2. attributes changed after the first forward -------------------------------------------------------------

@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_batch_first_changed_after_the_first_forward_matches_torch(grad):
    ref, ours = pair()
    for m in (ref, ours):
        m.eval()
    q, k, v = qkv(grad=grad)
    with torch.set_grad_enabled(grad):
        close("batch_first=False", ours(q, k, v)[0], ref(q, k, v)[0])
        for flip in (True, False, True):
            for m in (ref, ours):
                m.batch_first = flip
            q, k, v = qkv(batch_first=flip, grad=grad)
            o, w = ours(q, k, v)
            o_ref, w_ref = ref(q, k, v)
            assert o.shape == o_ref.shape
            close(f"batch_first={flip} output", o, o_ref)
            close(f"batch_first={flip} weights", w, w_ref)
    if grad:
        (o, _, g), (o_ref, _, g_ref) = outputs_and_grads(ours, q, k, v), outputs_and_grads(ref, q, k, v)
        for i, (a, b) in enumerate(zip(g, g_ref)):
            close(f"gradient {i}", a, b)


def test_add_zero_attn_changed_after_the_first_forward_matches_torch():
    ref, ours = pair()
    q, k, v = qkv(grad=True)
    outputs_and_grads(ours, q, k, v)
    for flag in (True, False):
        for m in (ref, ours):
            m.add_zero_attn = flag
        (o, w, g), (o_ref, w_ref, g_ref) = outputs_and_grads(ours, q, k, v), outputs_and_grads(ref, q, k, v)
        close(f"add_zero_attn={flag} output", o, o_ref)
        assert w.shape == w_ref.shape
        close(f"add_zero_attn={flag} weights", w, w_ref)
        for i, (a, b) in enumerate(zip(g, g_ref)):
            close(f"add_zero_attn={flag} gradient {i}", a, b)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_dropout_changed_after_the_first_forward_applies(grad):
    """A dropout schedule: dropout set to 0 in training mode gives torch's
    (deterministic) result; raised or lowered, the library drops weights at
    the new rate (its random bits are not torch's, so the rate is compared)."""
    ref, ours = pair(dropout=0.5)
    for m in (ref, ours):
        m.train()
    q, k, v = qkv(grad=grad, length=64, batch=4)
    with torch.set_grad_enabled(grad):
        ours(q, k, v)
        for m in (ref, ours):
            m.dropout = 0.0
        close("dropout 0.5 -> 0 output", ours(q, k, v)[0], ref(q, k, v)[0])
        for p in (0.1, 0.8, 0.5):
            ours.dropout = p
            _, w = ours(q, k, v, average_attn_weights=False)
            rate = (w == 0).double().mean().item()
            assert abs(rate - p) < 0.04, f"dropout={p}: observed drop rate {rate:.3f}"
        ours.eval()  # eval mode: no dropout whatever the attribute says, as torch
        ref.eval()
        ref.dropout = 0.5
        close("eval with dropout=0.5", ours(q, k, v)[0], ref(q, k, v)[0])


def test_attribute_change_keeps_a_live_graph_valid():
    """The module built for the old settings stays with the graph of its forward."""
    ref, ours = pair()
    q, k, v = qkv(grad=True)
    out_old, _ = ours(q, k, v)
    ours.batch_first = True
    qb, kb, vb = (t.detach().transpose(0, 1).requires_grad_() for t in (q, k, v))
    out_new, _ = ours(qb, kb, vb)
    close("same computation", out_new.transpose(0, 1), out_old)
    g_old = torch.autograd.grad(out_old.square().sum(), [q, k, v])
    g_new = torch.autograd.grad(out_new.square().sum(), [qb, kb, vb])
    for a, b in zip(g_old, g_new):
        close("gradients", b.transpose(0, 1), a)


def test_batch_first_changed_on_a_bfloat16_module():
    """The 16-bit path (a pool of copies) follows the attribute too."""
    torch.manual_seed(0)
    m = mt.MultiheadAttention(E, H).to(torch.bfloat16).eval()
    q, k, v = qkv(dtype=torch.bfloat16)
    with torch.no_grad():
        o = m(q, k, v, need_weights=False)[0]
        m.batch_first = True
        ob = m(*(t.transpose(0, 1) for t in (q, k, v)), need_weights=False)[0]
    assert torch.equal(ob.transpose(0, 1), o)


def test_gqa_dropout_changed_after_the_first_forward_applies():
    torch.manual_seed(0)
    x = torch.randn(2, L, E, requires_grad=True)
    g = mt.GroupedQueryAttention(E, H, dropout=0.5)
    ref = g.eval()(x).detach()
    g.train()
    assert not torch.allclose(g(x), ref)  # dropout 0.5 in training mode
    g.dropout = 0.0
    assert torch.equal(g(x), ref)  # a dropout schedule's end: training mode now equals eval mode
    with torch.no_grad():
        assert torch.equal(g(x), ref)
    g.dropout = 0.5
    assert not torch.allclose(g(x), ref)
    with torch.no_grad():
        assert not torch.allclose(g(x), ref)
    g2 = mt.GroupedQueryAttention(E, H).train()
    y = g2(x).detach()
    g2.dropout = 0.5
    assert not torch.allclose(g2(x), y)
    assert "dropout=0.5" in repr(g2)


def test_gqa_causal_changed_after_the_first_forward_applies():
    x = torch.randn(2, L, E)
    torch.manual_seed(0)
    g = mt.GroupedQueryAttention(E, H, causal=True)
    torch.manual_seed(0)
    g_off = mt.GroupedQueryAttention(E, H, causal=False)
    with torch.no_grad():
        g(x)
        g.causal = False
        assert torch.equal(g(x), g_off(x))


# --- 3. parameters updated through .data ------------------------------------------------------------------------

def non_contiguous(m, name):
    mod, _, attr = name.rpartition(".")
    p = getattr(m.get_submodule(mod) if mod else m, attr)
    p.data = p.data.t().contiguous().t()  # same values, not contiguous
    assert not p.is_contiguous()
    return p


@pytest.mark.parametrize("name", ["out_proj.weight", "in_proj_weight"])
def test_data_updates_of_a_non_contiguous_parameter_are_seen(name):
    ref, ours = pair()
    for m in (ref, ours):
        non_contiguous(m, name)
    q, k, v = qkv(grad=True)
    close("before", ours(q, k, v)[0], ref(q, k, v)[0])
    updates = (lambda d: d.mul_(3.0), lambda d: d.clamp_(-0.1, 0.1), lambda d: d.add_(0.5))
    for i, update in enumerate(updates):
        for m in (ref, ours):
            p = non_contiguous(m, name) if i == 2 else m.get_parameter(name)  # i == 2: a new non-contiguous tensor
            version = p._version
            update(p.data)
            assert p._version == version  # what the version check cannot see
        with torch.no_grad():
            close(f"update {i}, no grad", ours(q, k, v)[0], ref(q, k, v)[0])
        (o, _, g), (o_ref, _, g_ref) = outputs_and_grads(ours, q, k, v), outputs_and_grads(ref, q, k, v)
        close(f"update {i}, output", o, o_ref)
        for j, (a, b) in enumerate(zip(g, g_ref)):
            close(f"update {i}, gradient {j}", a, b)


def test_data_update_between_forward_and_backward_is_read_as_torch_reads_it():
    """torch's backward reads the saved parameter's memory as it is then (a .data
    update is not tracked); so does ours, for a non-contiguous one as for a contiguous one."""
    ref, ours = pair()
    for m in (ref, ours):
        non_contiguous(m, "out_proj.weight")
    q, k, v = qkv(grad=True)
    outs = [m(q, k, v)[0] for m in (ref, ours)]
    for m in (ref, ours):
        m.out_proj.weight.data.mul_(2.0)
    g_ref, g = (torch.autograd.grad(o.square().sum(), [q, k, v, m.out_proj.weight])
                for o, m in zip(outs, (ref, ours)))
    for j, (a, b) in enumerate(zip(g, g_ref)):
        close(f"gradient {j}", a, b)


def test_gradcheck_with_a_non_contiguous_parameter():
    """gradcheck perturbs the parameters through .data: the finite differences
    see them, and the backward reads the restored values."""
    _, ours = pair(torch.float64)
    non_contiguous(ours, "out_proj.weight")
    non_contiguous(ours, "in_proj_weight")
    q, k, v = qkv(torch.float64, grad=True)
    assert torch.autograd.gradcheck(lambda *a: ours(*a[:3])[0], (q, k, v, *ours.parameters()),
                                    eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gqa_data_updates_of_a_non_contiguous_parameter_are_seen():
    torch.manual_seed(0)
    g = mt.GroupedQueryAttention(E, H, causal=False)
    x = torch.randn(2, L, E)
    with torch.no_grad():
        before = g(x)
        g.o_proj.weight.data = g.o_proj.weight.data.t().contiguous().t()
        assert torch.equal(g(x), before)
        g.o_proj.weight.data.mul_(3.0)  # (bias=False: the output triples)
        assert torch.allclose(g(x), 3 * before, rtol=1e-5, atol=1e-6)
