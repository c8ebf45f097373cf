"""multihead.torch.MultiheadAttention against torch.nn.MultiheadAttention.

One table of cases, each named by its options: gradcheck in float64 (our
backward against finite differences of our forward, for the inputs and every
parameter), and parity in float32 with torch's module holding the same
parameters (outputs, weights, and the gradients of one loss). Float32 bound:
|ours - torch| <= 1e-5 * max(1, max|torch|) elementwise; both are float32
sums of E or S terms of magnitude ~1, whose rounding error (~S * 2^-24 * |x|,
S <= 7 here) is below 1e-6.
"""
import subprocess
import sys

import pytest
import torch
from torch import nn

import multihead
import multihead.torch as mt

E, H, L, S, N = 8, 2, 5, 7, 3


def bool_mask(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(*shape, generator=g) < 0.3
    m[..., 0] = False  # every row keeps a key: no fully masked row (torch 1.13 gives NaN there)
    return m


def float_mask(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


# name: (constructor kwargs, forward kwargs builder(dtype), self-attention, unbatched)
CASES = {
    "self": (dict(), lambda dt: {}, True, False),
    "self-batch_first": (dict(batch_first=True), lambda dt: {}, True, False),
    "cross-L5-S7": (dict(), lambda dt: {}, False, False),
    "kdim6-vdim3": (dict(kdim=6, vdim=3), lambda dt: {}, False, False),
    "bias=False": (dict(bias=False), lambda dt: {}, False, False),
    "add_bias_kv": (dict(add_bias_kv=True), lambda dt: {}, False, False),
    "add_zero_attn": (dict(add_zero_attn=True), lambda dt: {}, False, False),
    "bias_kv-zero_attn-kpm": (dict(add_bias_kv=True, add_zero_attn=True),
                              lambda dt: dict(key_padding_mask=bool_mask(N, S)), False, False),
    "attn_mask-bool-2d": (dict(), lambda dt: dict(attn_mask=bool_mask(L, S)), False, False),
    "attn_mask-float-2d": (dict(), lambda dt: dict(attn_mask=float_mask(L, S).to(dt)), False, False),
    "attn_mask-bool-3d": (dict(), lambda dt: dict(attn_mask=bool_mask(N * H, L, S)), False, False),
    "attn_mask-float-3d": (dict(), lambda dt: dict(attn_mask=float_mask(N * H, L, S).to(dt)), False, False),
    "kpm-bool": (dict(), lambda dt: dict(key_padding_mask=bool_mask(N, S)), False, False),
    "kpm-float": (dict(), lambda dt: dict(key_padding_mask=float_mask(N, S).to(dt)), False, False),
    "kpm-and-attn_mask-batch_first": (dict(batch_first=True),
                                      lambda dt: dict(key_padding_mask=bool_mask(N, S),
                                                      attn_mask=float_mask(L, S).to(dt)), False, False),
    "causal-self": (dict(), lambda dt: dict(is_causal=True), True, False),
    "unbatched": (dict(), lambda dt: dict(key_padding_mask=bool_mask(S)), False, True),
    "per-head-weights": (dict(), lambda dt: dict(average_attn_weights=False), False, False),
    "no-weights": (dict(), lambda dt: dict(need_weights=False), True, False),
}


def inputs(ctor, self_attention, unbatched, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    kdim, vdim = ctor.get("kdim", E), ctor.get("vdim", E)
    bf = ctor.get("batch_first", False) and not unbatched

    def make(length, features):
        shape = (length, features) if unbatched else (N, length, features) if bf else (length, N, features)
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    if self_attention:
        x = make(L, E)
        return x, x, x
    return make(L, E), make(S, kdim), make(S, vdim)


def modules(ctor, dtype):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, dtype=dtype, **ctor)
    torch.manual_seed(0)
    ours = mt.MultiheadAttention(E, H, dtype=dtype, **ctor)
    with torch.no_grad():  # xavier leaves biases at 0: give them values so their gradients are tested
        for (n, p), q in zip(ref.named_parameters(), ours.parameters()):
            p.add_(0.1 * torch.randn(p.shape, dtype=dtype))
            q.copy_(p)
    return ref, ours


def torch_kwargs(kw, unbatched):
    """The same call for torch 1.13 (no is_causal: the mask it stands for)."""
    kw = dict(kw)
    if kw.pop("is_causal", False):
        kw["attn_mask"] = torch.ones(L, L, dtype=torch.bool).triu(1)
    return kw


@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck_float64(name):
    ctor, fwd, self_attention, unbatched = CASES[name]
    _, ours = modules(ctor, torch.float64)
    q, k, v = inputs(ctor, self_attention, unbatched, torch.float64)
    kw = fwd(torch.float64)
    params = list(ours.parameters())
    # The module reads its own parameters, the very tensors gradcheck perturbs.
    tensors = (q,) + (() if self_attention else (k, v)) + tuple(params)

    def f(*args):
        x = args[0]
        return ours(x, x, x, **kw)[0] if self_attention else ours(args[0], args[1], args[2], **kw)[0]

    assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-7, rtol=1e-5), name


def test_gradcheck_float64_dropout():
    """Training-mode dropout (the library's): a fixed dropout_seed makes the
    forward deterministic, and the backward regenerates the same mask."""
    _, ours = modules(dict(dropout=0.3), torch.float64)
    ours.train()
    q, k, v = inputs({}, False, False, torch.float64)
    o1 = ours(q, k, v, dropout_seed=7)[0]
    o0 = ours.eval()(q, k, v)[0]
    ours.train()
    assert not torch.allclose(o1, o0), "dropout=0.3 in training mode changed nothing"
    assert torch.autograd.gradcheck(lambda *a: ours(*a[:3], dropout_seed=7)[0], (q, k, v, *ours.parameters()),
                                    eps=1e-6, atol=1e-7, rtol=1e-5)


def close(name, ours, ref):
    bound = 1e-5 * max(1.0, ref.abs().max().item())
    err = (ours - ref).abs().max().item()
    assert err <= bound, f"{name}: max |ours - torch| = {err:.3g} > bound {bound:.3g}"


@pytest.mark.parametrize("name", list(CASES))
def test_float32_equals_torch(name):
    ctor, fwd, self_attention, unbatched = CASES[name]
    ref, ours = modules(ctor, torch.float32)
    kw = fwd(torch.float32)
    outs = []
    for m, kwargs in ((ref, torch_kwargs(kw, unbatched)), (ours, kw)):
        q, k, v = inputs(ctor, self_attention, unbatched, torch.float32)
        out, w = m(q, k, v, **kwargs)
        g = torch.Generator().manual_seed(5)
        loss = (out * torch.randn(out.shape, generator=g)).sum()
        leaves = [q] + ([] if self_attention else [k, v]) + list(m.parameters())
        outs.append((out, w, torch.autograd.grad(loss, leaves)))
    (ro, rw, rg), (oo, ow, og) = outs
    close(f"{name} attn_output", oo, ro)
    if rw is None:
        assert ow is None
    else:
        close(f"{name} attn_output_weights", ow, rw)
    names = ["query"] + ([] if self_attention else ["key", "value"]) + [n for n, _ in ref.named_parameters()]
    for n, a, b in zip(names, og, rg):
        close(f"{name} d{n}", a, b)


@pytest.mark.parametrize("ctor", [dict(), dict(kdim=6, vdim=3, add_bias_kv=True), dict(bias=False)],
                         ids=["default", "kdim-vdim-bias_kv", "bias=False"])
def test_state_dict_loads_both_ways(ctor):
    torch.manual_seed(1)
    ref = nn.MultiheadAttention(E, H, **ctor)
    torch.manual_seed(2)
    ours = mt.MultiheadAttention(E, H, **ctor)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    back = nn.MultiheadAttention(E, H, **ctor)
    back.load_state_dict(ours.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_same_initialisation_as_torch_from_the_same_seed():
    torch.manual_seed(3)
    ref = nn.MultiheadAttention(E, H, add_bias_kv=True, kdim=4)
    torch.manual_seed(3)
    ours = mt.MultiheadAttention(E, H, add_bias_kv=True, kdim=4)
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    # ... and the generator is left where torch's module leaves it.
    torch.manual_seed(3)
    nn.MultiheadAttention(E, H)
    a = torch.rand(1)
    torch.manual_seed(3)
    mt.MultiheadAttention(E, H)
    assert torch.equal(torch.rand(1), a)


def test_parameters_follow_in_place_updates_and_dtype_changes():
    """The library's copy of the parameters is refreshed when they change
    (optimizer step, .data writes, .double())."""
    ref, ours = modules({}, torch.float32)
    x = torch.randn(L, N, E)
    with torch.no_grad():
        ours.in_proj_weight.data.mul_(2)  # .data: no version bump
        ref.in_proj_weight.mul_(2)
    close("after .data update", ours(x, x, x)[0], ref(x, x, x)[0])
    ref.double()
    ours.double()
    xd = x.double()
    close("after .double()", ours(xd, xd, xd)[0], ref(xd, xd, xd)[0])


class _CountingModule:
    """A library module, counting its share_parameters calls."""

    def __init__(self, module):
        self.module, self.shares = module, 0

    def share_parameters(self, arrays):
        self.shares += 1
        return self.module.share_parameters(arrays)

    def __getattr__(self, name):
        return getattr(self.module, name)


def test_optimizer_steps_reload_nothing_and_match_torch():
    """The library module reads the Parameters' memory: AdamW steps (in
    place) are seen with no share_parameters call (nothing copied or
    rebuilt), outputs and gradients equal torch's at every step; a
    Parameter replaced (.data =) or made non-contiguous is shared anew (a
    non-contiguous one as a contiguous copy, refreshed in place)."""
    ref, ours = modules({}, torch.float32)
    x = torch.randn(L, N, E)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in (ref, ours)]
    ours(x, x, x)  # makes the library module
    core = ours._pools[torch.float32]
    core.module = counting = _CountingModule(core.module)
    for step in range(3):
        outs = []
        for m, opt in zip((ref, ours), opts):
            out, _ = m(x, x, x)
            out.square().sum().backward()
            outs.append((out, {n: p.grad.clone() for n, p in m.named_parameters()}))
            opt.step()
            opt.zero_grad()
        close(f"step {step} output", outs[1][0], outs[0][0])
        for n, g in outs[0][1].items():
            close(f"step {step} {n}.grad", outs[1][1][n], g)
    assert counting.shares == 0
    with torch.no_grad():
        ref.out_proj.weight.data = ref.out_proj.weight.data.clone()  # the checker can fail: another tensor
        ours.out_proj.weight.data = ours.out_proj.weight.data.clone()
    close("after .data =", ours(x, x, x)[0], ref(x, x, x)[0])
    assert counting.shares == 1
    w = ours.in_proj_weight.data
    ours.in_proj_weight.data = w.t().contiguous().t()  # same values, not contiguous
    close("non-contiguous", ours(x, x, x)[0], ref(x, x, x)[0])
    with torch.no_grad():
        ours.in_proj_weight.mul_(2)
        ref.in_proj_weight.mul_(2)
    close("non-contiguous, changed in place", ours(x, x, x)[0], ref(x, x, x)[0])
    # (Its contiguous copy is written again in place at each forward, not
    # shared anew: share_parameters would end the live forward contexts.)
    assert counting.shares == 2


def test_zero_copy_by_data_pointers():
    """Contiguous float32 query/key/value and a bool mask are read in place,
    and attn_output / attn_output_weights are the library's own buffers."""
    _, ours = modules({}, torch.float32)
    q, k, v = (t.detach() for t in inputs({}, False, False, torch.float32))
    mask = bool_mask(L, S)
    with torch.no_grad():
        out, w = ours(q, k, v, attn_mask=mask)
    a = multihead._debug_last_call()
    assert a["query"] == q.data_ptr() and a["key"] == k.data_ptr() and a["value"] == v.data_ptr(), a
    assert a["attn_mask"] == mask.data_ptr(), a
    assert a["output"] == out.data_ptr(), a
    # The checker can fail: a non-contiguous query is converted (another address).
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    with torch.no_grad():
        ours(qt, k, v)
    assert multihead._debug_last_call()["query"] != qt.data_ptr()


def test_import_multihead_does_not_import_torch():
    code = "import sys, multihead; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_checkers_fail_on_a_wrong_gradient_and_a_wrong_output(monkeypatch):
    """gradcheck and `close` catch a 1% error in one gradient and a 2e-5 error in an output."""
    backward = mt._LibraryFunction.backward

    def wrong(ctx, d_output, *d_rest):
        g = list(backward(ctx, d_output, *d_rest))
        g[2] = g[2] * 1.01  # d key
        return tuple(g)

    _, ours = modules({}, torch.float64)
    q, k, v = inputs({}, False, False, torch.float64)
    monkeypatch.setattr(mt._LibraryFunction, "backward", staticmethod(wrong))
    assert not torch.autograd.gradcheck(lambda *a: ours(*a)[0], (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5,
                                        raise_exception=False)
    x = torch.randn(4, 4)
    with pytest.raises(AssertionError):
        close("perturbed", x + 2e-5, x)


def test_dropout_seed_comes_from_torchs_generator():
    _, ours = modules(dict(dropout=0.5), torch.float32)
    ours.train()
    q, k, v = inputs({}, False, False, torch.float32)
    torch.manual_seed(11)
    a = ours(q, k, v)[0]
    torch.manual_seed(11)
    b = ours(q, k, v)[0]
    c = ours(q, k, v)[0]
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_training_path_returns_the_librarys_arrays(monkeypatch):
    """With gradients, attn_output and every gradient are tensors over the
    arrays the library returned (torch.from_numpy, no copy): their data
    pointers are those arrays' addresses."""
    returned = set()
    from_numpy = torch.from_numpy

    def recording(a):
        returned.add(a.__array_interface__["data"][0])
        return from_numpy(a)

    monkeypatch.setattr(mt.torch, "from_numpy", recording)
    _, ours = modules({}, torch.float32)
    q, k, v = inputs({}, False, False, torch.float32)
    out, w = ours(q, k, v)
    assert out.data_ptr() in returned and w.data_ptr() in returned
    grads = torch.autograd.grad(out.sum(), [q, k, v, *ours.parameters()])
    for n, g in zip(["query", "key", "value"] + [n for n, _ in ours.named_parameters()], grads):
        assert g.data_ptr() in returned, n


def test_library_options_pass_through():
    """A library option (a causal sliding window of 2 keys) equals torch with
    the band mask it stands for, gradients included; masked_rows='nan' gives
    torch 1.13's NaN for a fully masked query."""
    ref, ours = modules({}, torch.float32)
    i = torch.arange(L)
    band = (i[None, :] > i[:, None]) | (i[None, :] <= i[:, None] - 2)
    x = torch.randn(L, N, E, requires_grad=True)
    a = ref(x, x, x, attn_mask=band)[0]
    b = ours(x, x, x, is_causal=True, window=2)[0]
    close("window=2 output", b, a)
    close("window=2 d query", torch.autograd.grad(b.sum(), x)[0], torch.autograd.grad(a.sum(), x)[0])
    kpm = torch.zeros(N, L, dtype=torch.bool)
    kpm[0] = True
    with torch.no_grad():
        assert torch.isnan(ours(x, x, x, key_padding_mask=kpm, masked_rows="nan")[0][:, 0]).all()
        assert torch.isnan(ref(x, x, x, key_padding_mask=kpm)[0][:, 0]).all()
        # 'zeros' (the default): attention output 0, so out_proj gives its bias.
        assert torch.equal(ours(x, x, x, key_padding_mask=kpm)[0][:, 0], ours.out_proj.bias.expand(L, E))
